#!/usr/bin/env bash
# The end-to-end GPU run on the device machine (one `device` call, under 10 minutes):
# GPU tests, random-weight 3B/7B W4 checkpoints, `deepinfer bench` in-process (productivity
# protocol + speed runs + in-process concurrency through the engine worker), and the HTTP
# gateway under 1/4/16 concurrent streams. Everything lands in $OUT/final.tar.gz.
# Usage there: DEEPINFER_GIT_COMMIT=<hash> bash kernels/bench/device_final.sh
set -u
export PYTHONUNBUFFERED=1 DEEPINFER_MODELS=/tmp/dimodels
R=$OUT/final; mkdir -p $R
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $R/nvidia_smi.csv 2>&1
step() { tar -czf $OUT/final.tar.gz -C $OUT final 2>/dev/null; echo "=== $* ($(date +%T))"; }
step gpu tests
timeout 60 python3 -m pytest -q -m gpu tests/test_gpu_decode.py tests/test_gpu_prefill.py tests/test_gpu_step_reference.py \
  -p no:cacheprovider > $R/pytest_gpu.txt 2>&1; tail -3 $R/pytest_gpu.txt
step make-random 3b
python3 -m engine make-random --shape 3b --scheme w4 --out /tmp/r3b > $R/make_3b.txt 2>&1 || tail -5 $R/make_3b.txt
step bench 3b
timeout 170 python3 -m engine.bench.cli --model /tmp/r3b --device cuda --quiet \
  --runs productivity,decode,prefill,combined,longctx,memory \
  --out $R/bench_gpu_3b.json --report $R/bench_gpu_3b.md > $R/bench_3b.txt 2>&1; tail -25 $R/bench_3b.txt
step concurrency 3b in-process
timeout 75 python3 -m engine.bench.cli --model /tmp/r3b --device cuda --quiet --runs concurrency,memory \
  --out $R/bench_gpu_3b_concurrency.json --report $R/bench_gpu_3b_concurrency.md > $R/conc_3b.txt 2>&1; tail -12 $R/conc_3b.txt
step http gateway 3b
(timeout 85 python3 -m engine serve --model /tmp/r3b --device cuda --max-batch 16 --max-context 2048 --port 18000 > $R/serve_3b.txt 2>&1 &)
for i in $(seq 1 40); do curl -sf http://127.0.0.1:18000/health >/dev/null && break; sleep 1; done
timeout 40 python3 -m engine.server.loadtest --url http://127.0.0.1:18000 --streams 1,4,16 --max-tokens 64 \
  --out $R/server_loadtest_3b.json > $R/loadtest_3b.txt 2>&1; tail -8 $R/loadtest_3b.txt
pkill -f "engine serve" || true
step make-random 7b
python3 -m engine make-random --shape 7b --scheme w4 --out /tmp/r7b > $R/make_7b.txt 2>&1 || tail -5 $R/make_7b.txt
step bench 7b
timeout 120 python3 -m engine.bench.cli --model /tmp/r7b --device cuda --quiet \
  --runs productivity,decode,prefill,combined,memory \
  --out $R/bench_gpu_7b.json --report $R/bench_gpu_7b.md > $R/bench_7b.txt 2>&1; tail -20 $R/bench_7b.txt
step done
python3 -m engine.bench.readme_table $R/bench_gpu_3b.json $R/bench_gpu_7b.json 2>&1 | tail -20
tar -czf $OUT/final.tar.gz -C $OUT final
