#!/bin/bash
# The balanced GEMV schedule (#16; decode_gemv.cu GEMV_BAL) on the device, wheels carried (carry [".whl"]):
#   bash engine/bench/device_bal.sh COMMIT
# (1) whole steps, one process: the default, the balanced gate_up (GEMV_BAL compiled in, DEEPINFER_GEMV_BAL=silu),
#     and the path compiled in but unused (what its registers cost); 3B W4 / W3 and 7B W4;
# (2) the GEMV chain traced block by block with the balanced gate_up (gemv_phases);
# (3) the decode kernels against their references and the verify rows with it on.
# Writes $OUT/decode_ab_bal.json, $OUT/gemv_phases_bal.json, $OUT/device_tests_bal_pytest.txt and logs.
set -u
[ -d /tmp/site/fastapi ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:.
nvidia-smi --query-gpu=name --format=csv,noheader
D=DEEPINFER_KERNEL_DEFINES
timeout 260 python3 -m engine.bench.decode_ab --shapes 3b:4,7b:4,3b:3 --rounds 2 --commit "${1:-unknown}" \
    --variants "base:,bal:$D=-DGEMV_BAL=1+DEEPINFER_GEMV_BAL=silu,compiled:$D=-DGEMV_BAL=1" \
    --out "$OUT/decode_ab_bal.json" > "$OUT/decode_ab_bal.log" 2>&1
grep "^|" "$OUT/decode_ab_bal.log"
DEEPINFER_KERNEL_DEFINES=-DGEMV_BAL=1 DEEPINFER_GEMV_BAL=silu timeout 90 python3 -m engine.bench.gemv_phases \
    --shapes 3b:4,7b:4 --commit "${1:-unknown}" --out "$OUT/gemv_phases_bal.json" > "$OUT/gemv_phases_bal.log" 2>&1
grep "^|\|replay" "$OUT/gemv_phases_bal.log"
DEEPINFER_KERNEL_DEFINES=-DGEMV_BAL=1 DEEPINFER_GEMV_BAL=silu timeout 150 python3 -m pytest -q -m gpu \
    -p no:cacheprovider tests/test_gpu_decode.py tests/test_spec_verify.py > "$OUT/device_tests_bal_pytest.txt" 2>&1
tail -2 "$OUT/device_tests_bal_pytest.txt"
