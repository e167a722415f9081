#!/bin/bash
# The split-K reduction's partials in one batch of loads (-DGEMV_RED_BATCH=4: the same sums in the same order) and
# the lm_head at KSW 4, checked and timed in one call; then the traced step with the batch. Wheels carried:
#   bash engine/bench/device_redbatch.sh COMMIT  -> $OUT/pytest_kab_redbatch.txt, decode_ab_redbatch.json,
#                                                  gemv_phases_redbatch.json
set -u
. engine/bench/device_env.sh
L3=4:logits:151936:2048 L7=4:logits:152064:3584 L14=4:logits:152064:5120
TAG=redbatch CHECKS="-DGEMV_RED_BATCH=4" SHAPES=3b:4,7b:4,14b:4 ROUNDS=2 ABT=420 \
    ABV="base:,red4:DEEPINFER_KERNEL_DEFINES=-DGEMV_RED_BATCH=4,red4_lm4:DEEPINFER_KERNEL_DEFINES=-DGEMV_RED_BATCH=4+DEEPINFER_GEMV_PLAN=$L3=4x1x2/$L7=4x1x2/$L14=4x1x2" \
    TRACE="redbatch:DEEPINFER_KERNEL_DEFINES=-DGEMV_RED_BATCH=4" TRACE_SHAPES=3b:4,14b:4 TRACE_OPS="(down|o|qkv|op)" \
    bash engine/bench/device_kernel_ab.sh "${1:-unknown}"
