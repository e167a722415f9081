#!/bin/bash
# The balanced gate_up (#16; decode_gemv.cu BAL, the *_silu_bal kernels, on by default) on the device, wheels carried
# (carry [".whl"]):   bash engine/bench/device_bal.sh COMMIT
# (1) whole steps, one process: DEEPINFER_GEMV_BAL=0 (the KSW schedule) against the default; 3B / 7B, W4 / W3;
# (2) the GPU tests (random weights) on the default: every decode kernel against its reference (the 3B and 7B
#     gate_up shapes take the balanced kernels), the verify rows, the L2 prefetch step;
# (3) the bench's decode run (every #16 row).
# Writes $OUT/decode_ab_bal.json, $OUT/device_tests_bal_pytest.txt, $OUT/gpu_decode.json and logs.
# (The first form, the schedule as a runtime branch of the one kernel, is this script at 0fc7e4d.)
set -u
. engine/bench/device_env.sh
timeout 200 python3 -m engine.bench.decode_ab --shapes 3b:4,7b:4,3b:3,7b:3 --rounds 2 --commit "${1:-unknown}" \
    --variants "off:DEEPINFER_GEMV_BAL=0,bal:" --out "$OUT/decode_ab_bal.json" > "$OUT/decode_ab_bal.log" 2>&1
grep "^|" "$OUT/decode_ab_bal.log"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests > "$OUT/device_tests_bal_pytest.txt" 2>&1
tail -2 "$OUT/device_tests_bal_pytest.txt"
bash engine/bench/device_decode.sh "${1:-unknown}"  # the bench's decode run, every #16 row
