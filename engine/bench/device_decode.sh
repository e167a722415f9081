#!/bin/bash
# The bench's decode run alone (every #16 row), wheels carried (carry [".whl"]):
#   bash engine/bench/device_decode.sh COMMIT      -> $OUT/gpu_decode.json, $OUT/gpu_decode.log
set -u
. engine/bench/device_env.sh
timeout 150 python3 -m engine.bench.decode_bench --skip timing,speed_nopdl --shapes 3b:4,3b:3,7b:4,7b:3,7b:mixed,14b:4 \
    --commit "${1:-unknown}" --out "$OUT/gpu_decode.json" > "$OUT/gpu_decode.log" 2>&1
grep -E "^\||cache" "$OUT/gpu_decode.log" | cut -c1-160
