#!/bin/bash
# What fusing o_proj (and the attention) away could give at most: the step with those launches left out
# (DEEPINFER_TIMING_SKIP, ops_step.py: a timing probe, wrong values, so "tokens equal" is False for those variants).
# One call, wheels carried (carry [".whl"]):
#   bash engine/bench/device_skip.sh COMMIT  -> $OUT/decode_ab_skip.json, gemv_phases_skipo.json
set -u
. engine/bench/device_env.sh
S=DEEPINFER_TIMING_SKIP
TAG=skip SHAPES=3b:4,7b:4,14b:4 ABT=300 ABV="base:,skip_o:$S=o,skip_attn:$S=attn,skip_both:$S=o/attn" \
    TRACE="skipo:$S=o" bash engine/bench/device_kernel_ab.sh "${1:-unknown}"
