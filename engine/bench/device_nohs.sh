#!/bin/bash
# What the split-K handshake of the step's down_proj costs at most (-DGEMV_SPLITK_NOHS=1: a timing probe, wrong
# values: partials stored, no fence / counter / reduction, the K slice 0 block runs the epilogue on its own part), the
# bound on moving that reduction into the next kernel; and the lm_head at KSW 4 again. Wheels carried:
#   bash engine/bench/device_nohs.sh COMMIT  -> $OUT/decode_ab_nohs.json, gemv_phases_nohs.json
set -u
. engine/bench/device_env.sh
L3=4:logits:151936:2048 L7=4:logits:152064:3584 L14=4:logits:152064:5120
TAG=nohs SHAPES=3b:4,7b:4,14b:4 ABT=330 \
    ABV="base:,nohs:DEEPINFER_KERNEL_DEFINES=-DGEMV_SPLITK_NOHS=1,lm4:DEEPINFER_GEMV_PLAN=$L3=4x1x2/$L7=4x1x2/$L14=4x1x2" \
    TRACE="nohs:DEEPINFER_KERNEL_DEFINES=-DGEMV_SPLITK_NOHS=1" TRACE_OPS="(down|qkv|op)" \
    bash engine/bench/device_kernel_ab.sh "${1:-unknown}"
