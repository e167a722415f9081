#!/bin/bash
# On the device (wheels installed, PYTHONPATH set): the split-K prefill kernel's GPU tests, then its bench
# (engine/bench/splitk_bench.py: tile sweep per linear, then whole-model prefill through the engine's buckets,
# previous rule vs split-K). Writes $OUT/pytest_splitk.txt, $OUT/splitk_h200.json and its log.
#   bash engine/bench/device_splitk.sh COMMIT
set -u
timeout 200 python3 -m pytest -q -m gpu tests/test_gpu_prefill.py tests/test_gpu_prefill_graph.py \
    tests/test_prefill_offset.py > "$OUT/pytest_splitk.txt" 2>&1
tail -3 "$OUT/pytest_splitk.txt"
timeout 380 python3 -m engine.bench.splitk_bench --out "$OUT/splitk_h200.json" --commit "${1:-unknown}" \
    > "$OUT/splitk_bench.log" 2>&1
grep -E "chosen|prefill T=" "$OUT/splitk_bench.log" | cut -c1-240
grep -E "T= 48" "$OUT/splitk_bench.log" | cut -c1-200
