#!/bin/bash
# On the device (wheels installed, PYTHONPATH set): the prefill and decode GPU tests, the split-K rule's prefill
# timing on random 3B W4 weights, and the hot path's TTFT on a random 3B W4 checkpoint (the prefix cache: a cached
# 209-token template + 50-token selection vs the selection alone; a chat's second turn over 2,000 tokens).
# Writes $OUT/pytest_prefill.txt, $OUT/splitk_rule_3b_h200.json, $OUT/hotpath_gpu_3b_random.json and logs.
#   bash engine/bench/device_prefill_3b.sh COMMIT
set -u
timeout 150 python3 -m pytest -q -m gpu tests/test_gpu_prefill.py tests/test_gpu_decode.py > "$OUT/pytest_prefill.txt" 2>&1
tail -2 "$OUT/pytest_prefill.txt"
timeout 90 python3 -m engine.bench.splitk_bench --skip-tiles --shapes 3b --layouts "" --commit "${1:-unknown}" \
    --out "$OUT/splitk_rule_3b_h200.json" > "$OUT/splitk_rule_3b.log" 2>&1
grep "prefill T=" "$OUT/splitk_rule_3b.log" | cut -c1-200
timeout 90 python3 -m engine make-random --shape 3b --scheme w4 --out /tmp/r3b > /dev/null 2>&1
timeout 150 python3 -m engine.bench.hotpath --model /tmp/r3b --device cuda --parts prefix,chat --repeats 7 \
    --out "$OUT/hotpath_gpu_3b_random.json" 2> "$OUT/hotpath_3b.log"
grep -E "^prefix|^chat" "$OUT/hotpath_3b.log" | cut -c1-400
