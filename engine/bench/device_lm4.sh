#!/bin/bash
# Before the lm_head's (4, 1, 2) becomes the default (docs/gpu.md, thirty-third session): the kernel checks (the 3B's
# lm_head at KSW 1 and 4 against the reference), then every GPU test and the bench's decode run with that plan for the
# 3B / 7B / 14B lm_heads (DEEPINFER_GEMV_PLAN, read at capture). Wheels carried (carry [".whl"]):
#   bash engine/bench/device_lm4.sh COMMIT  -> $OUT/pytest_lm4_checks.txt, pytest_gpu_all_lm4.txt, gpu_decode_lm4.json
set -u
. engine/bench/device_env.sh
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_decode.py::test_decode_kernels_match_references \
    > "$OUT/pytest_lm4_checks.txt" 2>&1
echo "checks: $(tail -1 "$OUT/pytest_lm4_checks.txt")"
export DEEPINFER_GEMV_PLAN="4:logits:151936:2048=4x1x2/4:logits:152064:3584=4x1x2/4:logits:152064:5120=4x1x2"
timeout 150 python3 -m engine.bench.decode_bench --skip timing,speed_nopdl --shapes 3b:4,3b:3,7b:4,7b:3,7b:mixed,14b:4 \
    --commit "${1:-unknown}" --out "$OUT/gpu_decode_lm4.json" > "$OUT/gpu_decode_lm4.log" 2>&1
grep -E "^\||cache" "$OUT/gpu_decode_lm4.log" | cut -c1-160
timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider tests > "$OUT/pytest_gpu_all_lm4.txt" 2>&1
tail -2 "$OUT/pytest_gpu_all_lm4.txt"
