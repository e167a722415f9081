#!/usr/bin/env bash
# Long-context decode on the device machine (one `device` call, ~5 minutes): the attention kernel's checks,
# variants and timings (attn_bench), the decode benchmark with its long-context section (decode_bench),
# the GPU tests, and the end-to-end bench of a random 3B W4 checkpoint at 4k / 16k / 32k tokens.
# Usage there: DEEPINFER_GIT_COMMIT=<hash> bash kernels/bench/device_attn.sh   (carry .whl for the tests)
set -u
export PYTHONUNBUFFERED=1 DEEPINFER_MODELS=/tmp/dimodels
C=${DEEPINFER_GIT_COMMIT:-unknown}
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
echo "=== attention bench ($(date +%T))"
timeout 240 python3 -m engine.bench.attn_bench --out $OUT/gpu_attn_h200.json --commit $C > $OUT/attn_log.txt 2>&1
grep -E "BAD|registers|^\||failed|Error" $OUT/attn_log.txt | head -60
echo "=== decode bench ($(date +%T))"
timeout 150 python3 -m engine.bench.decode_bench --out $OUT/gpu_decode_h200.json --commit $C --skip timing \
  > $OUT/decode_log.txt 2>&1
grep -E "BAD|tok/s|batch 1 with|greedy|done|Error" $OUT/decode_log.txt | head -40
echo "=== gpu tests ($(date +%T))"
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_decode.py tests/test_gpu_prefill.py \
  tests/test_gpu_step_reference.py tests/test_gpu_prefill_graph.py > $OUT/pytest_gpu.txt 2>&1; tail -3 $OUT/pytest_gpu.txt
echo "=== end to end 3B long context ($(date +%T))"
python3 -m engine make-random --shape 3b --scheme w4 --out /tmp/r3b > /dev/null 2>&1
timeout 150 python3 -m engine.bench.cli --model /tmp/r3b --device cuda --quiet --runs decode,longctx,memory \
  --out $OUT/bench_gpu_3b_longctx.json --report $OUT/bench_gpu_3b_longctx.md > $OUT/bench_3b.txt 2>&1
tail -15 $OUT/bench_3b.txt
echo "=== done ($(date +%T))"
