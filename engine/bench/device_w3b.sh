#!/bin/bash
# On the device (wheels installed, PYTHONPATH set), after device_w3.sh: the GPU decode tests with the 3B down plan
# (8, 4, 2) for W4 too, the GEMV register pipeline depth for W3 (decode_ab: 2 vs 3 stages), and decode_bench for
# W4 / W3 / mixed side by side. Writes $OUT/pytest_w3b.txt, $OUT/decode_ab_nst_w3_h200.json,
# $OUT/gpu_decode_h200_w3final.json and logs.
#   bash engine/bench/device_w3b.sh COMMIT
set -u
timeout 150 python3 -m pytest -q -m gpu tests/test_gpu_decode.py tests/test_gpu_prefill.py > "$OUT/pytest_w3b.txt" 2>&1
tail -1 "$OUT/pytest_w3b.txt"
timeout 200 python3 -m engine.bench.decode_ab --shapes 7b:3 --rounds 2 --commit "${1:-unknown}" \
    --variants "nst2:,nst2_3:DEEPINFER_KERNEL_DEFINES=-DGEMV_NST2=3,nst1_3:DEEPINFER_KERNEL_DEFINES=-DGEMV_NST1=3" \
    --out "$OUT/decode_ab_nst_w3_h200.json" > "$OUT/decode_ab_nst.log" 2>&1
grep -E "^\|" "$OUT/decode_ab_nst.log"
timeout 150 python3 -m engine.bench.decode_bench --out "$OUT/gpu_decode_h200_w3final.json" --commit "${1:-unknown}" \
    --skip timing,speed_nopdl,long_context --shapes 3b:4,3b:3,7b:4,7b:3,7b:mixed > "$OUT/decode_w3final.log" 2>&1
grep -E "^\|" "$OUT/decode_w3final.log"
