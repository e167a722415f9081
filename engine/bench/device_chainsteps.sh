#!/bin/bash
# #16: what a graph boundary between chained steps costs, and the chain with k steps per graph (carry [".whl"]):
#   bash engine/bench/device_chainsteps.sh COMMIT
# (1) graph_steps: k chain steps captured in one graph, replayed back to back (3B / 7B / 14B W4);
# (2) the chain tests on the GPU with DEEPINFER_CHAIN_STEPS 1 / 2 / 4 (tokens equal to the host loop's);
# (3) the bench's decode run with DEEPINFER_CHAIN_STEPS=2, then =1 (the default), same lease;
set -u
. engine/bench/device_env.sh
timeout 150 python3 -m engine.bench.graph_steps --shapes 3b:4,7b:4,14b:4 --ks 1,2,4 --rounds 3 --commit "${1:-unknown}" \
    --out "$OUT/graph_steps.json" > "$OUT/graph_steps.log" 2>&1
grep -E "^\||rror|Trace" "$OUT/graph_steps.log" | head -12
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_chain_keys.py > "$OUT/pytest_chainsteps.txt" 2>&1
tail -1 "$OUT/pytest_chainsteps.txt"
for k in ${KS:-2 1}; do
  DEEPINFER_CHAIN_STEPS=$k timeout 150 python3 -m engine.bench.decode_bench --skip timing,speed_nopdl \
      --shapes ${SHAPES:-3b:4,7b:4,14b:4} --commit "${1:-unknown}" --out "$OUT/gpu_decode_k$k.json" > "/tmp/gpu_decode_k$k.log" 2>&1
  echo "== DEEPINFER_CHAIN_STEPS=$k"; grep -E "^\||cache" "/tmp/gpu_decode_k$k.log" | cut -c1-160
done
# (4) the product's own path (deepinfer bench: the runner, 16 tokens per engine step) on a random 3B W4 checkpoint
timeout 120 python3 -m engine.cli.main make-random --shape 3b --scheme w4 --out /tmp/r3bw4 > /dev/null 2>&1
for k in ${KS:-2 1}; do
  DEEPINFER_CHAIN_STEPS=$k timeout 100 python3 -m engine.cli.main bench --model /tmp/r3bw4 --device cuda --quiet \
      --runs decode --out "$OUT/bench_3b_k$k.json" > "/tmp/bench_3b_k$k.log" 2>&1
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); r=d['targets'][0]['runs']['decode']['points'][0]['rows']; print('deepinfer bench 3B W4 k=$k tg128 tok/s', [round(x['decode_tps'],1) for x in r])" "$OUT/bench_3b_k$k.json"
done
