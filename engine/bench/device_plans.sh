#!/bin/bash
# The plan A/Bs that ran the defaults before decode_ab kept a variant's env through the capture (docs/gpu.md "One wave
# for the 14B's linears"), run again with the base repeated (the first replays run slow: ~1% between variants is noise),
# then the bench's decode run on the defaults. Wheels carried (carry [".whl"]):   bash engine/bench/device_plans.sh COMMIT
# Writes $OUT/decode_ab_plans_7b.json, $OUT/gpu_decode.json and logs.
set -u
. engine/bench/device_env.sh
P=DEEPINFER_GEMV_PLAN
timeout 150 python3 -m engine.bench.decode_ab --shapes 7b:4,7b:3 --rounds 2 --commit "${1:-unknown}" \
    --variants "base:,base2:,lm2:$P=4:logits:152064:3584=2x1x2/3:logits:152064:3584=2x1x2,pdl:DEEPINFER_PDL_OFF=gemv_w4_silu_bal/gemv_w4_resid_mt2/gemv_w3_silu_bal/gemv_w3_resid_mt2,o812:$P=4:resid:3584:3584=8x1x2/3:resid:3584:3584=8x1x2,d442:$P=4:resid:3584:18944=4x4x2/3:resid:3584:18944=4x4x2" \
    --out "$OUT/decode_ab_plans_7b.json" > "$OUT/decode_ab_plans_7b.log" 2>&1
tail -3 "$OUT/decode_ab_plans_7b.log" | cut -c1-400
bash engine/bench/device_decode.sh "${1:-unknown}"
