#!/bin/bash
# Where the down GEMV's span goes past its median block (gemv_phases' new spread columns: loop and block ends by
# percentile, loops by blocks per SM), and down_proj plans and the lm_head at KSW 2 / 4 inside the step (DEEPINFER_GEMV_PLAN, read at capture).
# One call, wheels carried (carry [".whl"]):
#   bash engine/bench/device_downplan.sh COMMIT  -> $OUT/gemv_phases_spread.json, decode_ab_downplan.json
set -u
. engine/bench/device_env.sh
timeout 120 python3 -m engine.bench.gemv_phases --shapes 3b:4,7b:4,14b:4 --commit "${1:-unknown}" \
    --out "$OUT/gemv_phases_spread.json" > "$OUT/gemv_phases_spread.log" 2>&1
grep -E "^\| |step replay" "$OUT/gemv_phases_spread.log"
P3=4:resid:2048:11008 P14=4:resid:5120:13824 L3=4:logits:151936:2048 L14=4:logits:152064:5120
timeout 470 python3 -m engine.bench.decode_ab --shapes 3b:4,14b:4 --rounds 2 --commit "${1:-unknown}" \
    --variants "base:,a:DEEPINFER_GEMV_PLAN=$P3=8x2x2/$P14=8x1x2,b:DEEPINFER_GEMV_PLAN=$P3=8x3x2/$P14=4x2x2,c:DEEPINFER_GEMV_PLAN=$P3=4x4x2/$P14=2x3x2,lm2:DEEPINFER_GEMV_PLAN=$L3=2x1x2/$L14=2x1x2,lm4:DEEPINFER_GEMV_PLAN=$L3=4x1x2/$L14=4x1x2" \
    --out "$OUT/decode_ab_downplan.json" > "$OUT/decode_ab_downplan.log" 2>&1
grep "^|" "$OUT/decode_ab_downplan.log" | cut -c1-250
tail -2 "$OUT/decode_ab_downplan.log"
