#!/bin/bash
# Where the down GEMV's span goes past its median block (gemv_phases' spread columns: loop and block ends by
# percentile, loops by blocks per SM), and down_proj plans and the lm_head at KSW 2 / 4 inside the step
# (DEEPINFER_GEMV_PLAN, read at capture). One call, wheels carried (carry [".whl"]):
#   bash engine/bench/device_downplan.sh COMMIT  -> $OUT/decode_ab_downplan.json, gemv_phases_spread.json
set -u
. engine/bench/device_env.sh
P3=4:resid:2048:11008 P14=4:resid:5120:13824 L3=4:logits:151936:2048 L14=4:logits:152064:5120
G=DEEPINFER_GEMV_PLAN
TAG=downplan SHAPES=3b:4,14b:4 ABT=470 \
    ABV="base:,a:$G=$P3=8x2x2/$P14=8x1x2,b:$G=$P3=8x3x2/$P14=4x2x2,c:$G=$P3=4x4x2/$P14=2x3x2,lm2:$G=$L3=2x1x2/$L14=2x1x2,lm4:$G=$L3=4x1x2/$L14=4x1x2" \
    TRACE="spread:" TRACE_SHAPES=3b:4,7b:4,14b:4 bash engine/bench/device_kernel_ab.sh "${1:-unknown}"
