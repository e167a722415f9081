#!/usr/bin/env bash
# Gateway under load on the device: random 3B W4 checkpoint, `deepinfer serve` on the GPU,
# 1/4/16 concurrent streaming clients (engine/server/loadtest.py). Needs the .whl carry (fastapi...).
set -u
export PYTHONUNBUFFERED=1 DEEPINFER_MODELS=/tmp/dimodels
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
python3 -c "import fastapi, uvicorn; print('fastapi', fastapi.__version__)"
python3 -m engine make-random --shape 3b --scheme w4 --out /tmp/r3b > /dev/null 2>&1
(timeout 150 python3 -m engine serve --model /tmp/r3b --device cuda --max-batch 16 --max-context 2048 --port 18000 > $OUT/serve_3b.txt 2>&1 &)
for i in $(seq 1 90); do curl -sf http://127.0.0.1:18000/health >/dev/null && break; sleep 1; done
curl -s http://127.0.0.1:18000/health; echo
timeout 90 python3 -m engine.server.loadtest --url http://127.0.0.1:18000 --streams 1,4,16 --max-tokens 64 \
  --out $OUT/server_loadtest_h200_3b.json 2>&1 | tail -8
tail -5 $OUT/serve_3b.txt
