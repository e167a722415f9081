#!/bin/bash
# On the device (wheels installed, PYTHONPATH set): the tensor-core attention (decode_attn.cu ATT_MMA) checked and
# timed in one call. attn_bench runs the attention checks for the default kernel and each variant, then times them
# beside torch's flash SDPA; decode_ab times whole 3B steps at a short context and with --long tokens cached.
# Writes $OUT/gpu_attn_mma_<TAG>_h200.json, $OUT/decode_ab_attn_mma_<TAG>_h200.json and logs.
#   TAG=mrun ATTV="mrun128:-DATT_MRUN=128,fma:-DATT_MMA=0" \
#   ABV="base:,mrun128:DEEPINFER_KERNEL_DEFINES=-DATT_MRUN=128" bash engine/bench/device_attn_mma.sh COMMIT
# (the session of 2026-12-03, seventh, ran these two commands with the variants named in docs/results/README.md)
set -u
tag=${TAG:-run}
[ -n "${TESTS:-}" ] && { timeout 200 python3 -m pytest -q -m gpu $TESTS > "$OUT/pytest_attn_mma_$tag.txt" 2>&1;
                         tail -1 "$OUT/pytest_attn_mma_$tag.txt"; }
timeout 220 python3 -m engine.bench.attn_bench --out "$OUT/gpu_attn_mma_${tag}_h200.json" --commit "${1:-unknown}" \
    --variants "${ATTV:-fma:-DATT_MMA=0}" --lens "${LENS:-512,4096,16384,32000}" > "$OUT/attn_mma_$tag.log" 2>&1
grep -E "^\||BAD|FAIL|rror" "$OUT/attn_mma_$tag.log" | head -30
timeout 240 python3 -m engine.bench.decode_ab --variants "${ABV:-fma:DEEPINFER_KERNEL_DEFINES=-DATT_MMA=0,mma:}" \
    --shapes "${SHAPES:-3b:4}" --rounds "${ROUNDS:-2}" --long "${LONG:-4096,16384}" --commit "${1:-unknown}" \
    --out "$OUT/decode_ab_attn_mma_${tag}_h200.json" > "$OUT/decode_ab_attn_mma_$tag.log" 2>&1
grep -E "^\||rror" "$OUT/decode_ab_attn_mma_$tag.log"
