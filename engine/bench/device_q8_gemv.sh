#!/bin/bash
# The step's int8-activation GEMVs (DEEPINFER_DECODE_Q8=1: decode_gemv.cu gemv_w4q8_*, kernels/q8_plan.py) in one device
# call (carry [".whl"]): their GPU tests against the references (tests/test_q8_gemv.py: our W4 g128 and the GGUF Q4
# layouts, g32 / Q4_K / Q4_0, with a random Q4_K_M model's step; and the probe's), then
# decode_ab on the same weights: the fp16 step against the q8 step at batch 1 and in every step (q8all: batch 8 on the
# int8 loop per token too; 3B, 7B, 14B W4), then on the 3B both beside the
# probe knob (DEEPINFER_TIMING_Q8=1: the probe's K loop with no epilogue, wrong values: how far the real epilogues and
# the in-kernel quantization are from it).
#   bash engine/bench/device_q8_gemv.sh COMMIT   -> $OUT/pytest_q8_gemv.txt, decode_ab_q8gemv.json and its log
set -u
. engine/bench/device_env.sh
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_q8_gemv.py tests/test_q8_probe.py \
    > "$OUT/pytest_q8_gemv.txt" 2>&1
echo "q8 checks: $(tail -1 "$OUT/pytest_q8_gemv.txt")"
grep -E "^E  |Error" "$OUT/pytest_q8_gemv.txt" | head -20
[ "${AB:-1}" = 1 ] && TAG=${TAG:-q8gemv} ABV=${ABV:-"base:,q8:DEEPINFER_DECODE_Q8=1,q8all:DEEPINFER_DECODE_Q8=all"} \
    SHAPES=${SHAPES:-3b:4,7b:4,14b:4} ROUNDS=${ROUNDS:-1} ABT=${ABT:-300} bash engine/bench/device_kernel_ab.sh "${1:-unknown}"
# then the probe knob beside them (a process of its own: a failure there costs the run above nothing)
# and the q8 step with the first build's shared memory per block (DEEPINFER_Q8_SMEM_PAD: 25.6 KB in all): what it cost;
# and with no split-K (DEEPINFER_Q8_MAXKSB=1: the plans' KSB came from a sweep that added partials atomically)
[ "${PROBE:-1}" = 1 ] && TAG=q8bound ABV="base:,q8:DEEPINFER_DECODE_Q8=1,q8pad:DEEPINFER_DECODE_Q8=1+DEEPINFER_Q8_SMEM_PAD=24576,q8ksb1:DEEPINFER_DECODE_Q8=1+DEEPINFER_Q8_MAXKSB=1,q8probe:DEEPINFER_TIMING_Q8=1" \
    SHAPES=${PROBE_SHAPES:-3b:4} ROUNDS=1 ABT=150 bash engine/bench/device_kernel_ab.sh "${1:-unknown}"
exit 0
