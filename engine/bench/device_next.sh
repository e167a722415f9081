#!/bin/bash
# The next device session's one call after the real 0.5B's parts (engine/bench/device_parts.sh: 17 calls carrying
# .model/pq05_NN into /tmp/parts/), carry [".whl"], wheels installed and PYTHONPATH=/tmp/site:
#   bash engine/bench/device_next.sh COMMIT [PREFIX]
# (0) #17: every GEMV layout's rows of a B-row launch against one-row launches, bit for bit, and the tree attention
#     against the default kernel (tests/test_spec_verify.py; the references are row-independent, and the GPU runner's
#     logic on them keeps text 0 identical with the cache on: `spec_diff --device ref`, docs/hotpath.md);
# (1) #17: where translate text 0's speculative answer parts from plain decoding with the prefix cache on, per drafter,
#     and the first K/V row / layer / step where the runs' caches part (engine/bench/spec_diff.py --kv);
# (2) #17: the hot-path bench on the real model (speculation vs chained plain decoding, 10 texts per template);
# (3) #16: the default 3B W4 decode run of the bench (random weights of the exact shape).
# Writes $OUT/spec_rows_pytest.txt, $OUT/spec_diff_bisect.json, $OUT/hotpath_gpu_0.5b.json, $OUT/bench_3b_w4_decode.json and their logs.
set -u
export DEEPINFER_MODELS=/tmp/store
bash engine/bench/device_join.sh qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
    1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 "${2:-q05_}" || exit 1
timeout 60 python3 -m engine.bench.defer_rows > "$OUT/defer_rows.txt" 2>&1; tail -3 "$OUT/defer_rows.txt"
timeout 150 python3 -m pytest -q -m gpu tests/test_spec_verify.py -k "one_row_launches or tree_attention_equals" \
    > "$OUT/spec_rows_pytest.txt" 2>&1
tail -3 "$OUT/spec_rows_pytest.txt"
timeout 200 python3 -m engine.bench.spec_diff --device cuda --texts 0 --kv --max-tokens 40 \
    --configs "kquant,bytes:nocache,kquant:noheads,kquant:nolookup,kquant:chain" \
    --out "$OUT/spec_diff_bisect.json" > "$OUT/spec_diff_bisect.log" 2>&1
cut -c1-700 "$OUT/spec_diff_bisect.log" | grep '^{'
timeout 200 python3 -m engine.bench.hotpath --device cuda --texts 10 --parts spec \
    --out "$OUT/hotpath_gpu_0.5b.json" 2> "$OUT/hotpath.log"
grep "^speculative" "$OUT/hotpath.log" | cut -c1-400
python3 -m engine.cli.main make-random --shape 3b --scheme w4 --out /tmp/r3bw4 > /dev/null 2>&1
timeout 150 python3 -m engine.cli.main bench --model /tmp/r3bw4 --device cuda --quiet --runs decode \
    --out "$OUT/bench_3b_w4_decode.json" > "$OUT/bench_3b.log" 2>&1
tail -3 "$OUT/bench_3b.log"
sed -i "s#\"git_commit\": \"[0-9a-f]*\"#\"git_commit\": \"${1:-unknown}\"#" "$OUT"/*.json
