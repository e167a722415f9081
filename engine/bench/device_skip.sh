#!/bin/bash
# What fusing o_proj (and the attention) away could give at most: the step with those launches left out
# (DEEPINFER_TIMING_SKIP, ops_step.py: a timing probe, wrong values, so "tokens equal" is False for those variants).
# One call, wheels carried (carry [".whl"]):
#   bash engine/bench/device_skip.sh COMMIT  -> $OUT/decode_ab_skip.json, gemv_phases_skipo.json
set -u
. engine/bench/device_env.sh
timeout 300 python3 -m engine.bench.decode_ab --shapes 3b:4,7b:4,14b:4 --rounds 2 --commit "${1:-unknown}" \
    --variants "base:,skip_o:DEEPINFER_TIMING_SKIP=o,skip_attn:DEEPINFER_TIMING_SKIP=attn,skip_both:DEEPINFER_TIMING_SKIP=o/attn" \
    --out "$OUT/decode_ab_skip.json" > "$OUT/decode_ab_skip.log" 2>&1
grep "^|" "$OUT/decode_ab_skip.log" | cut -c1-250
tail -2 "$OUT/decode_ab_skip.log"
DEEPINFER_TIMING_SKIP=o timeout 60 python3 -m engine.bench.gemv_phases --shapes 3b:4 --commit "${1:-unknown}" \
    --out "$OUT/gemv_phases_skipo.json" > "$OUT/gemv_phases_skipo.log" 2>&1
grep -E "^\| " "$OUT/gemv_phases_skipo.log"
