#!/usr/bin/env bash
# A 4 GB card's budget on the H200 (--gpu-memory-limit 3315 MB = the 3.237 GiB a 4 GB laptop card left free
# in the seed's measurements): the host-RAM embedding check, 7B W3 and 7B mixed loaded under the limit
# (memory plan, speed, peak memory), and the GPU tests. Usage there: DEEPINFER_GIT_COMMIT=<hash> bash ...
set -u
export PYTHONUNBUFFERED=1 DEEPINFER_MODELS=/tmp/dimodels
R=$OUT/small; mkdir -p $R
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
if [ "${SKIP_CHECKS:-0}" = 0 ]; then
echo "=== host embedding check ($(date +%T))"
timeout 120 python3 -m engine.bench.host_embed_check 2>&1 | tail -3 | tee $R/host_embed_check.txt
fi
for scheme in w3 mixed; do
  ctx=2048; [ $scheme = mixed ] && ctx=768
  echo "=== 7B $scheme under 3315 MB, context $ctx ($(date +%T))"
  python3 -m engine make-random --shape 7b --scheme $scheme --out /tmp/r7b_$scheme > /dev/null 2>&1
  timeout 200 python3 -m engine.bench.cli --model /tmp/r7b_$scheme --device cuda --quiet --gpu-memory-limit 3315 \
    --max-context $ctx --runs productivity,decode,prefill,combined,memory --prefill-lengths 48,512 \
    --out $R/bench_gpu_7b_${scheme}_4gb.json --report $R/bench_gpu_7b_${scheme}_4gb.md > $R/bench_7b_$scheme.txt 2>&1
  python3 -c "import json,sys; t=json.load(open(sys.argv[1]))['targets'][0]; print('errors', t['errors'])" \
    $R/bench_gpu_7b_${scheme}_4gb.json
  grep -A3 "^## Memory" $R/bench_gpu_7b_${scheme}_4gb.md | tail -1 | cut -c1-300
  grep -A4 "^## Decode" $R/bench_gpu_7b_${scheme}_4gb.md | tail -1
done
[ "${SKIP_CHECKS:-0}" = 0 ] || { tar -czf $OUT/small.tar.gz -C $OUT small; exit 0; }
echo "=== too small: 7B W3 with a 4096 context under the limit must refuse with the numbers"
timeout 100 python3 -m engine ask --model /tmp/r7b_w3 --device cuda --gpu-memory-limit 3315 --max-context 4096 \
  --max-tokens 4 "hi" 2>&1 | tail -2 | tee $R/refuse.txt
echo "=== gpu tests ($(date +%T))"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_decode.py tests/test_gpu_prefill.py \
  tests/test_gpu_step_reference.py tests/test_gpu_prefill_graph.py > $R/pytest_gpu.txt 2>&1; tail -2 $R/pytest_gpu.txt
tar -czf $OUT/small.tar.gz -C $OUT small
echo "=== done ($(date +%T))"
