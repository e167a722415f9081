#!/usr/bin/env bash
# The gateway on the GPU (random 3B W4): 1/4/16 streams, and a 16k-token prompt arriving while 4 streams
# decode, with the engine's prefill slicing on (512) and off (0). Usage there: DEEPINFER_GIT_COMMIT=... bash ...
set -u
export PYTHONUNBUFFERED=1 DEEPINFER_MODELS=/tmp/dimodels
R=$OUT/inter; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
python3 -m engine make-random --shape 3b --scheme w4 --out /tmp/r3b > /dev/null 2>&1
for slice in 512 0; do
  echo "=== prefill slice $slice ($(date +%T))"
  (timeout 150 python3 -m engine serve --model /tmp/r3b --device cuda --max-batch 16 --max-context 20480 \
     --prefill-slice $slice --port 18000 > $R/serve_$slice.txt 2>&1 &)
  for i in $(seq 1 90); do curl -sf http://127.0.0.1:18000/health >/dev/null && break; sleep 1; done
  streams=1,4,16; [ $slice = 0 ] && streams=1
  timeout 100 python3 -m engine.server.loadtest --url http://127.0.0.1:18000 --streams $streams --max-tokens 64 \
    --long-prompt 16000 --long-streams 4 --long-stream-tokens 256 --out $R/server_loadtest_h200_3b_slice$slice.json 2>&1 \
    | grep -E "interference|wrote"
  grep -E "loaded|load" $R/serve_$slice.txt | tail -2
  pkill -f "engine serve"; sleep 3
done
tar -czf $OUT/inter.tar.gz -C $OUT inter
echo "=== done ($(date +%T))"
