#!/bin/bash
# A lone sampling request chained on the GPU (chain_sampler.py) on the device (carry [".whl"]):
#   bash engine/bench/device_sampled.sh COMMIT
# (1) GPU tests (TESTS, default tests/test_gpu_chain_keys.py tests/test_sample_kernel.py: sampled chains and batches
#     give the host path's tokens, the sampling kernel the reference's);
# (2) python -m engine.bench.sampled_chain on a random 3B W4 checkpoint (SHAPE=3b): host-stepped vs chained decode
#     tok/s for greedy and three sampling settings, ROUNDS alternating rounds, the same text both ways.
# (1b) python -m engine.bench.sampler_ops: the draw's GPU time per op and per setting;
# Writes $OUT/pytest_sampled.txt, $OUT/sampler_ops.json and $OUT/sampled_chain_$SHAPE.json (logs in /tmp).
set -u
. engine/bench/device_env.sh
if [ -n "${TESTS-tests/test_gpu_chain_keys.py tests/test_sample_kernel.py}" ]; then    # TESTS= skips them
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider ${TESTS:-tests/test_gpu_chain_keys.py tests/test_sample_kernel.py} \
      > "$OUT/pytest_sampled.txt" 2>&1
  tail -1 "$OUT/pytest_sampled.txt"; grep -E "^(FAILED|E )" "$OUT/pytest_sampled.txt" | head -8
fi
timeout 60 python3 -m engine.bench.sampler_ops --out "$OUT/sampler_ops.json" 2>&1 | grep -E "^\||rror"
s=${SHAPE:-3b}
[ -d /tmp/r${s}w4 ] || timeout 150 python3 -m engine.cli.main make-random --shape $s --scheme w4 --out /tmp/r${s}w4 \
    > /dev/null 2>&1
timeout 200 python3 -m engine.bench.sampled_chain --model /tmp/r${s}w4 --rounds ${ROUNDS:-3} --commit "${1:-unknown}" \
    --out "$OUT/sampled_chain_$s.json" > /tmp/sampled.log 2>&1
grep -E "^\||rror|Trace" /tmp/sampled.log | head -12
