#!/bin/bash
# A release check without the real model's parts (one call; device_release.sh is the one with them): the bench's
# decode run (every #16 row) and every GPU test (the real 0.5B's few skip). Wheels carried (carry [".whl"]):
#   bash engine/bench/device_verify.sh COMMIT   -> $OUT/gpu_decode.json, $OUT/pytest_gpu_all.txt
set -u
. engine/bench/device_env.sh
bash engine/bench/device_decode.sh "${1:-unknown}"
timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider tests > "$OUT/pytest_gpu_all.txt" 2>&1
tail -2 "$OUT/pytest_gpu_all.txt"
