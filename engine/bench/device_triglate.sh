#!/bin/bash
# o_proj's PDL trigger after its own wait (GEMV_TRIG_O_LATE=1, decode_gemv.cu; the default SASS unchanged): gate_up's
# blocks launch only once the attention has ended. Why: GEMV_BAL_PRE=0 (decode_ab_balpre_h100.json) showed that
# gate_up's early loads while the attention still runs cost o ~1 us of wait per layer on the 3B, but moving the loads
# after gate_up's own wait cost gate_up 2.6 us. One call, wheels carried (carry [".whl"]):
#   bash engine/bench/device_triglate.sh COMMIT  -> $OUT/decode_ab_triglate.json, gemv_phases_triglate{0,1}.json
set -u
. engine/bench/device_env.sh
K=DEEPINFER_KERNEL_DEFINES
TAG=triglate SHAPES=3b:4,3b:3,7b:4,14b:4 LONG=16384 ABT=300 ABV="base:,trig1:$K=-DGEMV_TRIG_O_LATE=1" \
    TRACE="triglate0:$K=-DGEMV_TRIG_O_LATE=0,triglate1:$K=-DGEMV_TRIG_O_LATE=1" TRACE_OPS="(attention|o|gate_up)" \
    bash engine/bench/device_kernel_ab.sh "${1:-unknown}"
