#!/bin/bash
# For the next device session (#16: 16k cached >= 0.8 of short): one batch-1 step traced block by block, GEMVs, the
# attention and its merge launch (GEMV_TRACE; engine/bench/gemv_phases.py), at 64 and 16,000 cached rows, 3B / 7B W4.
# Wheels carried (carry [".whl"]):   bash engine/bench/device_trace16k.sh COMMIT
# Writes $OUT/gemv_phases_64.json, $OUT/gemv_phases_16k.json and logs.
set -u
. engine/bench/device_env.sh
for c in 64 16000; do
  tag=$([ "$c" = 64 ] && echo 64 || echo 16k)
  timeout 150 python3 -m engine.bench.gemv_phases --shapes 3b:4,7b:4 --cached "$c" --commit "${1:-unknown}" \
      --out "$OUT/gemv_phases_$tag.json" > "$OUT/gemv_phases_$tag.log" 2>&1
  grep "^|\|replay" "$OUT/gemv_phases_$tag.log"
done
