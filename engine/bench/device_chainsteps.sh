#!/bin/bash
# #16: what a graph boundary between chained steps costs, k chain steps per graph, and a chain's next step run ahead
# across engine steps (carry [".whl"]):   bash engine/bench/device_chainsteps.sh COMMIT
# (1) graph_steps: k chain steps captured in one graph, replayed back to back (3B / 7B / 14B W4);
# (2) the chain GPU tests with DEEPINFER_CHAIN_STEPS 1 / 2 / 4 and DEEPINFER_CHAIN_AHEAD=1 (the host loop's tokens);
# (3) the bench's decode run (GPUModel level) with DEEPINFER_CHAIN_STEPS=2, then 1 (the default), same lease;
# (4) the product's path (deepinfer bench: the runner, 16 tokens per engine step) on a random 3B W4 checkpoint with
#     each of VARIANTS (name:ENV=V+ENV=V, as decode_ab's).
# Writes $OUT/graph_steps.json, pytest_chainsteps.txt, gpu_decode_k{2,1}.json, bench_3b_<name>.json (logs in /tmp).
set -u
. engine/bench/device_env.sh
timeout 150 python3 -m engine.bench.graph_steps --shapes ${GSHAPES:-3b:4,7b:4,14b:4} --ks 1,2,4 --rounds 3 --commit "${1:-unknown}" \
    --out "$OUT/graph_steps.json" > /tmp/graph_steps.log 2>&1
grep -E "^\||rror|Trace" /tmp/graph_steps.log | head -12
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_chain_keys.py > "$OUT/pytest_chainsteps.txt" 2>&1
tail -1 "$OUT/pytest_chainsteps.txt"
for k in ${KS:-2 1}; do
  DEEPINFER_CHAIN_STEPS=$k timeout 150 python3 -m engine.bench.decode_bench --skip ${SKIP:-timing,speed_nopdl} \
      --shapes ${SHAPES:-3b:4,7b:4,14b:4} --commit "${1:-unknown}" --out "$OUT/gpu_decode_k$k.json" > "/tmp/gpu_decode_k$k.log" 2>&1
  echo "== DEEPINFER_CHAIN_STEPS=$k"; grep -E "^\||cache" "/tmp/gpu_decode_k$k.log" | cut -c1-160
done
timeout 120 python3 -m engine.cli.main make-random --shape 3b --scheme w4 --out /tmp/r3bw4 > /dev/null 2>&1
IFS=',' read -ra vs <<< "${VARIANTS:-base:,ahead:DEEPINFER_CHAIN_AHEAD=1,k2:DEEPINFER_CHAIN_STEPS=2,k2ahead:DEEPINFER_CHAIN_STEPS=2+DEEPINFER_CHAIN_AHEAD=1}"
for v in "${vs[@]}"; do
  name=${v%%:*}; envs=${v#*:}
  env ${envs//+/ } timeout 100 python3 -m engine.cli.main bench --model /tmp/r3bw4 --device cuda --quiet \
      --runs decode --out "$OUT/bench_3b_$name.json" > "/tmp/bench_3b_$name.log" 2>&1
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); r=d['targets'][0]['runs']['decode']['points'][0]['rows']; print('deepinfer bench 3B W4 $name tg128 tok/s', [round(x['decode_tps'],1) for x in r])" "$OUT/bench_3b_$name.json" || tail -3 "/tmp/bench_3b_$name.log"
done
