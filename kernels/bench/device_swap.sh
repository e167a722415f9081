#!/usr/bin/env bash
# Graph capture across model swaps (swap_capture), the GPU tests, and the 7B W4 long-context bench.
# Usage there: DEEPINFER_GIT_COMMIT=<hash> bash kernels/bench/device_swap.sh   (carry .whl)
set -u
export PYTHONUNBUFFERED=1 DEEPINFER_MODELS=/tmp/dimodels
R=$OUT/swap; mkdir -p $R
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
echo "=== swap capture ($(date +%T))"
timeout 200 python3 -m engine.bench.swap_capture --out $R/swap_capture.json > $R/swap_log.txt 2>&1
grep -vE "^\s*$" $R/swap_log.txt | cut -c1-400 | tail -12
echo "=== gpu tests ($(date +%T))"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_decode.py tests/test_gpu_prefill.py \
  tests/test_gpu_step_reference.py tests/test_gpu_prefill_graph.py tests/test_server_gpu.py > $R/pytest_gpu.txt 2>&1
tail -3 $R/pytest_gpu.txt
echo "=== 7B long context ($(date +%T))"
python3 -m engine make-random --shape 7b --scheme w4 --out /tmp/r7b > /dev/null 2>&1
timeout 180 python3 -m engine.bench.cli --model /tmp/r7b --device cuda --quiet --runs decode,longctx,memory \
  --out $R/bench_gpu_7b_longctx.json --report $R/bench_gpu_7b_longctx.md > $R/bench_7b.txt 2>&1
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/swap/bench_gpu_7b_longctx.json"))
for k, v in d["targets"][0]["runs"].items():
    for p in v.get("points", []) if isinstance(v, dict) else []:
        print(k, p.get("label"), round((p.get("median") or {}).get("decode_tps", 0), 1))
PY
tar -czf $OUT/swap.tar.gz -C $OUT swap
echo "=== done ($(date +%T))"
