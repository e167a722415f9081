#!/bin/bash
# The plan A/Bs that ran the defaults before decode_ab kept a variant's env through the capture (docs/gpu.md "One wave
# for the 14B's linears"), run again with the base repeated (~1% between variants was noise in the twenty-ninth
# session's 3B A/Bs), then the bench's decode run on the defaults. Wheels carried (carry [".whl"]):
#   bash engine/bench/device_plans.sh COMMIT  -> $OUT/decode_ab_plans_3b7b.json, gemv_phases_late.json, gpu_decode.json
# First the decode kernels' GPU check, which now includes the 14B's linears on their one-wave default plans.
# Variants: lm2 the lm_heads at KSW 2; pdl the big GEMVs (balanced gate_up, mt2 down) without PDL; o812 o_proj in
# N / 32 blocks of 32 rows (3B 64, 7B 112: fewer slots held while gate_up's blocks wait to become resident, the
# skew of 3.4-3.9 us in gemv_phases); d442 the 7B's down at (4, 4, 2).
set -u
. engine/bench/device_env.sh
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_decode.py > "$OUT/pytest_gpu_decode.txt" 2>&1
tail -2 "$OUT/pytest_gpu_decode.txt"
P=DEEPINFER_GEMV_PLAN
LM="$P=4:logits:151936:2048=2x1x2/4:logits:152064:3584=2x1x2/3:logits:152064:3584=2x1x2"
PDL="DEEPINFER_PDL_OFF=gemv_w4_silu_bal/gemv_w4_resid_mt2/gemv_w3_silu_bal/gemv_w3_resid_mt2"
O="$P=4:resid:2048:2048=8x1x2/4:resid:3584:3584=8x1x2/3:resid:3584:3584=8x1x2"
D="$P=4:resid:3584:18944=4x4x2/3:resid:3584:18944=4x4x2"
timeout 200 python3 -m engine.bench.decode_ab --shapes 3b:4,7b:4,7b:3 --rounds 2 --commit "${1:-unknown}" \
    --variants "base:,base2:,lm2:$LM,pdl:$PDL,o812:$O,d442:$D" \
    --out "$OUT/decode_ab_plans_3b7b.json" > "$OUT/decode_ab_plans_3b7b.log" 2>&1
grep "^|" "$OUT/decode_ab_plans_3b7b.log" | cut -c1-600
# which gate_up blocks start late, how long after o ended, and how long their start -> wait return takes
timeout 60 python3 -m engine.bench.gemv_phases --shapes 3b:4,7b:4 --commit "${1:-unknown}" \
    --out "$OUT/gemv_phases_late.json" > "$OUT/gemv_phases_late.log" 2>&1
grep -E "^\| (o|gate_up|down) " "$OUT/gemv_phases_late.log"
bash engine/bench/device_decode.sh "${1:-unknown}"
