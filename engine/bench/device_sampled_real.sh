#!/bin/bash
# The draw on the real Qwen2.5-Coder-0.5B (device; its parts carried first, engine/bench/device_parts.sh, back to back):
#   bash engine/bench/device_sampled_real.sh COMMIT        carry [".whl"]
# Joins the parts into /tmp/store, runs the server's sampled-chain GPU test (a seeded chat request chained against
# the host path's text) and python -m engine.bench.sampled_chain on the real model (host path vs the draw on the
# GPU, alone and 4 / 8 streams, the same text both ways). Writes $OUT/pytest_sampled_real.txt and
# $OUT/sampled_chain_0.5b_real.json.
set -u
. engine/bench/device_env.sh
export DEEPINFER_MODELS=/tmp/store
bash engine/bench/device_join.sh qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
    1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 q05_ || exit 1
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_server_gpu.py -k sampled \
    > "$OUT/pytest_sampled_real.txt" 2>&1
tail -1 "$OUT/pytest_sampled_real.txt"; grep -E "^(FAILED|E )" "$OUT/pytest_sampled_real.txt" | head -8
timeout 240 python3 -m engine.bench.sampled_chain --model qwen2.5-coder-0.5b --rounds ${ROUNDS:-3} \
    --commit "${1:-unknown}" --out "$OUT/sampled_chain_0.5b_real.json" > /tmp/sampled_real.log 2>&1
grep -E "^\||rror|Trace" /tmp/sampled_real.log | head -14
