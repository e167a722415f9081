#!/bin/bash
# The decode kernels' divisions without the IEEE slow path (decode_common.cu silu_d / norm_div / att_rcp / att_div) on the
# device, wheels carried (carry [".whl"]):   bash engine/bench/device_divfast.sh COMMIT
# (1) kernels/div_check.py: the fast divisions against a / b, every fp32 input of each one-variable domain;
# (2) the decode kernels' reference checks and the GPU division test;
# (3) decode_ab: the plain divisions (-DDECODE_DIV_FAST=0) against the default (3) in one process, SHAPES (3b:4,7b:4),
#     LONG (16384) cached too, ROUNDS (2); greedy tokens must be equal (the same bits).
# Writes $OUT/div_check.json, $OUT/pytest_divfast.txt, $OUT/decode_ab_divfast.json and its log.
set -u
. engine/bench/device_env.sh
timeout 120 python3 -m kernels.div_check --commit "${1:-unknown}" --out "$OUT/div_check.json" 2>&1 | tail -8
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_div.py \
    tests/test_gpu_decode.py::test_decode_kernels_match_references \
    tests/test_gpu_decode.py::test_gguf_layout_kernels_match_references > "$OUT/pytest_divfast.txt" 2>&1
tail -1 "$OUT/pytest_divfast.txt"; grep -E "^(FAILED|E )" "$OUT/pytest_divfast.txt" | head -6
timeout ${ABT:-330} python3 -m engine.bench.decode_ab --variants "ieee:DEEPINFER_KERNEL_DEFINES=-DDECODE_DIV_FAST=0,fast:" \
    --shapes "${SHAPES:-3b:4,7b:4}" --rounds "${ROUNDS:-2}" --long "${LONG:-16384}" --commit "${1:-unknown}" \
    --out "$OUT/decode_ab_divfast.json" > "$OUT/decode_ab_divfast.log" 2>&1
grep -E "^\||rror|Traceback" "$OUT/decode_ab_divfast.log" | cut -c1-300 | head -30
