#!/bin/bash
# The bound on a short-context attention that leaves room for o_proj's blocks (#16): -DATT_HP_ONLY=1 compiles the
# plain attention entries without the split schedule (a timing probe: wrong above ATT_SHORT rows; the bench's steps
# stay below) at 128 registers instead of 245, so a GEMV block of 128 registers fits beside each attention block.
# One call, wheels carried (carry [".whl"]):
#   bash engine/bench/device_hponly.sh COMMIT  -> $OUT/decode_ab_hponly.json, gemv_phases_{base,hponly}.json
set -u
. engine/bench/device_env.sh
V="base:,hponly:DEEPINFER_KERNEL_DEFINES=-DATT_HP_ONLY=1"
TAG=hponly SHAPES=3b:4,7b:4,14b:4 ROUNDS=3 ABT=330 ABV="$V" TRACE="$V" TRACE_SHAPES=14b:4,3b:4 \
    bash engine/bench/device_kernel_ab.sh "${1:-unknown}"
