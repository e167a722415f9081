#!/usr/bin/env bash
# Last end-to-end device run after the prefill CUDA graphs landed: the gateway under 1/4/16 streams
# (3B W4) and the 7B W4 bench (productivity, decode, prefill, combined). Needs the .whl carry.
set -u
export PYTHONUNBUFFERED=1 DEEPINFER_MODELS=/tmp/dimodels
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
python3 -m engine make-random --shape 3b --scheme w4 --out /tmp/r3b > /dev/null 2>&1
(timeout 100 python3 -m engine serve --model /tmp/r3b --device cuda --max-batch 16 --max-context 2048 --port 18000 > $OUT/serve_3b.txt 2>&1 &)
for i in $(seq 1 60); do curl -sf http://127.0.0.1:18000/health >/dev/null && break; sleep 1; done
timeout 60 python3 -m engine.server.loadtest --url http://127.0.0.1:18000 --streams 1,4,16 --max-tokens 64 \
  --out $OUT/server_loadtest_h200_3b_graphs.json 2>&1 | tail -5
pkill -f "engine serve"
python3 -m engine make-random --shape 7b --scheme w4 --out /tmp/r7b > /dev/null 2>&1
timeout 100 python3 -m engine.bench.cli --model /tmp/r7b --device cuda --quiet --runs productivity,decode,prefill,combined,memory \
  --out $OUT/bench_gpu_7b_prefill_graph.json --report $OUT/bench_gpu_7b_prefill_graph.md > $OUT/bench_7b.txt 2>&1
tail -4 $OUT/bench_7b.txt
python3 -m engine.bench.readme_table $OUT/bench_gpu_7b_prefill_graph.json 2>&1 | sed -n 3p
