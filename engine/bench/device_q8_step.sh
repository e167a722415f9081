#!/bin/bash
# The int8-activation probe inside the decode step (a timing probe, wrong values: engine/model/ops_step.py
# DEEPINFER_TIMING_Q8) in one device call (carry [".whl"]): step replay and batch-1 tok/s of the default step against
# the step with every W4 layer GEMV replaced by the probe at batch 1, without (q8) and with (q8quant) a quantize launch
# before each, and the mma form at every batch size (q8mma: batch 8 too); tokens differ by construction.
#   bash engine/bench/device_q8_step.sh COMMIT   -> $OUT/decode_ab_q8step.json and its log
set -u
. engine/bench/device_env.sh
TAG=${TAG:-q8step} ABV=${ABV:-"base:,q8:DEEPINFER_TIMING_Q8=1,q8quant:DEEPINFER_TIMING_Q8=quant,q8mma:DEEPINFER_TIMING_Q8=mma"} \
    SHAPES=${SHAPES:-3b:4,7b:4,14b:4} ROUNDS=${ROUNDS:-2} bash engine/bench/device_kernel_ab.sh "${1:-unknown}"
