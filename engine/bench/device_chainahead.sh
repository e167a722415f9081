#!/bin/bash
# #16: the chain's GPU tests (resumed from the step run ahead too), the graph boundary between chained steps, and the
# runner's path with and without the step run ahead (carry [".whl"]):   bash engine/bench/device_chainahead.sh COMMIT
# (1) TESTS (default tests/test_gpu_chain_keys.py: the host loop's tokens, both key modes, short and merge graphs,
#     resumed chains; tests/test_server_gpu.py: the server's requests on the GPU, with the run-ahead on);
# (2) graph_steps: k chain steps captured in one graph, replayed back to back (GSHAPES, 3B / 7B W4; GSHAPES= skips);
# (3) deepinfer bench --runs decode on a random 3B W4 checkpoint, PAIRS times DEEPINFER_CHAIN_AHEAD=0 then the default.
# Writes $OUT/pytest_chain_ahead.txt, graph_steps.json, bench_3b_{off,on}_<i>.json, bench_3b_conc_{off,on}_<i>.json
# (logs in /tmp; PAIRS=1 by default: the device returns at most 8 files a call).
set -u
. engine/bench/device_env.sh
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider ${TESTS:-tests/test_gpu_chain_keys.py tests/test_server_gpu.py} \
    > "$OUT/pytest_chain_ahead.txt" 2>&1
tail -1 "$OUT/pytest_chain_ahead.txt"
if [ -n "${GSHAPES-3b:4,7b:4}" ]; then    # GSHAPES= skips it
  timeout 100 python3 -m engine.bench.graph_steps --shapes ${GSHAPES:-3b:4,7b:4} --ks 1,2,4 --rounds 3 \
      --commit "${1:-unknown}" --out "$OUT/graph_steps.json" > /tmp/graph_steps.log 2>&1
  grep -E "^\||rror|Trace" /tmp/graph_steps.log | head -12
fi
timeout 120 python3 -m engine.cli.main make-random --shape 3b --scheme w4 --out /tmp/r3bw4 > /dev/null 2>&1
for i in $(seq 1 ${PAIRS:-1}); do
  for v in off on; do
    DEEPINFER_CHAIN_AHEAD=$([ $v = off ] && echo 0 || echo 1) timeout 60 python3 -m engine.cli.main bench \
        --model /tmp/r3bw4 --device cuda --quiet --runs decode --out "$OUT/bench_3b_${v}_$i.json" > /tmp/b.log 2>&1
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); r=d['targets'][0]['runs']['decode']['points'][0]['rows']; print('deepinfer bench 3B W4 chain ahead $v:', [round(x['decode_tps'],1) for x in r])" \
        "$OUT/bench_3b_${v}_$i.json" || tail -3 /tmp/b.log
  done
done
# (4) concurrent greedy requests (deepinfer bench --runs concurrency, 4 and 8 streams: one batch per engine step) with
#     the batch's next step run ahead off / on (DEEPINFER_BATCH_AHEAD, opt-in), PAIRS times
for i in $(seq 1 ${PAIRS:-1}); do
  for v in off on; do
    DEEPINFER_BATCH_AHEAD=$([ $v = off ] && echo 0 || echo 1) timeout 90 python3 -m engine.cli.main bench \
        --model /tmp/r3bw4 --device cuda --quiet --runs concurrency --concurrency 4,8 \
        --out "$OUT/bench_3b_conc_${v}_$i.json" > /tmp/c.log 2>&1
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); ps=d['targets'][0]['runs']['concurrency']['points']; print('concurrency batch ahead $v:', [(p['label'], round(sum(r['completion_tokens'] for r in p['rows']) / max(r['wall_s'] for r in p['rows']), 1)) for p in ps])" \
        "$OUT/bench_3b_conc_${v}_$i.json" || tail -3 /tmp/c.log
  done
done
