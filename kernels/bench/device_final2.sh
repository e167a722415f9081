#!/usr/bin/env bash
# Last device run of the session: GPU tests (warm-up, host embedding, slicing included), then the full
# `deepinfer bench` of random 3B and 7B W4 checkpoints for the README table (load includes the warm-up).
# Usage there: DEEPINFER_GIT_COMMIT=<hash> bash kernels/bench/device_final2.sh   (carry .whl)
set -u
export PYTHONUNBUFFERED=1 DEEPINFER_MODELS=/tmp/dimodels
R=$OUT/final2; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
echo "=== gpu tests ($(date +%T))"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_decode.py tests/test_gpu_prefill.py \
  tests/test_gpu_step_reference.py tests/test_gpu_prefill_graph.py tests/test_server_gpu.py > $R/pytest_gpu.txt 2>&1
tail -2 $R/pytest_gpu.txt
for shape in 3b 7b; do
  echo "=== bench $shape ($(date +%T))"
  python3 -m engine make-random --shape $shape --scheme w4 --out /tmp/r$shape > /dev/null 2>&1
  runs=productivity,decode,prefill,combined,memory; [ $shape = 3b ] && runs=$runs,longctx
  timeout 200 python3 -m engine.bench.cli --model /tmp/r$shape --device cuda --quiet --runs $runs \
    --out $R/bench_gpu_${shape}_final.json --report $R/bench_gpu_${shape}_final.md > $R/bench_$shape.txt 2>&1
  python3 -c "import json,sys; t=json.load(open(sys.argv[1]))['targets'][0]; print('errors', t['errors'], 'load_s', t['load_s'])" \
    $R/bench_gpu_${shape}_final.json
done
python3 -m engine.bench.readme_table $R/bench_gpu_3b_final.json $R/bench_gpu_7b_final.json 2>&1 | grep DeepInfer | cut -c1-250
tar -czf $OUT/final2.tar.gz -C $OUT final2
echo "=== done ($(date +%T))"
