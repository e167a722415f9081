#!/bin/bash
# On the device (wheels installed, PYTHONPATH set): the chained greedy decode (GPUModel.decode_chain) checked and
# timed on random weights. GPU tests of the decode step, verification and heads (the chain against one-token steps:
# tests/gpu_checks.py chain_check), then the decode bench (batch 1 = the chain, the host loop beside it) with the
# long-context points. Writes $OUT/pytest_chain.txt, $OUT/gpu_decode_h200_chain.json and its log.
#   bash engine/bench/device_chain.sh COMMIT
set -u
timeout 240 python3 -m pytest -q -m gpu tests/test_gpu_decode.py tests/test_spec_verify.py tests/test_gpu_draft_heads.py \
    > "$OUT/pytest_chain.txt" 2>&1
tail -3 "$OUT/pytest_chain.txt"
timeout 330 python3 -m engine.bench.decode_bench --out "$OUT/gpu_decode_h200_chain.json" --commit "${1:-unknown}" \
    --skip timing,speed_nopdl --shapes 3b:4,3b:3,7b:4,7b:3,14b:4 > "$OUT/decode_bench_chain.log" 2>&1
grep -E "batch|tokens in the cache|\|" "$OUT/decode_bench_chain.log" | cut -c1-260
