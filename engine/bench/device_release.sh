#!/bin/bash
# A release check on the device after a kernel default changed (#16), the real 0.5B's parts carried into
# /tmp/parts/q05_* by the calls before (wheels carried too):   bash engine/bench/device_release.sh COMMIT
# (1) the bench's decode run (every #16 row: 3B / 7B W4, W3, mixed, 14B, batch 8, long contexts);
# (2) every GPU test with the real model present (GPU answers equal CPU answers).
# Writes $OUT/gpu_decode.json, $OUT/pytest_gpu_all.txt and logs.
set -u
. engine/bench/device_env.sh
export DEEPINFER_MODELS=/tmp/store
bash engine/bench/device_join.sh qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
    1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 q05_
bash engine/bench/device_decode.sh "${1:-unknown}"  # the bench's decode run, every #16 row
timeout 400 python3 -m pytest -q -m gpu -p no:cacheprovider tests > "$OUT/pytest_gpu_all.txt" 2>&1
tail -2 "$OUT/pytest_gpu_all.txt"
