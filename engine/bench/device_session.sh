#!/bin/bash
# On the device (wheels installed, PYTHONPATH set), after the real 0.5B's parts were carried into /tmp/parts/q05_*:
# join it, then (1) the prefill rule against dequant + cuBLAS for every linear (engine/bench/splitk_bench.py, model
# part: random 3B / 7B W4 and 0.5B / 1.5B Q4_K_M layouts), (2) the hot-path bench on the real model (prefix cache,
# chat, speculation vs plain decoding, plain now chained: decode_chain), (3) every GPU test with the real model
# present. Writes $OUT/splitk_rule_h200.json, $OUT/hotpath_gpu_0.5b.json, $OUT/pytest_all.txt and logs.
#   bash engine/bench/device_session.sh COMMIT
set -u
export DEEPINFER_MODELS=/tmp/store
bash engine/bench/device_join.sh qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
    1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 q05_ || exit 1
timeout 170 python3 -m engine.bench.splitk_bench --skip-tiles --out "$OUT/splitk_rule_h200.json" \
    --commit "${1:-unknown}" > "$OUT/splitk_rule.log" 2>&1
grep "prefill T=" "$OUT/splitk_rule.log" | cut -c1-200
timeout 200 python3 -m engine.bench.hotpath --device cuda --texts 10 --parts prefix,chat,spec \
    --out "$OUT/hotpath_gpu_0.5b.json" 2> "$OUT/hotpath.log"
grep -E "^speculative|^prefix|^chat" "$OUT/hotpath.log" | cut -c1-600
timeout 200 python3 -m pytest -q -m gpu tests > "$OUT/pytest_all.txt" 2>&1
tail -3 "$OUT/pytest_all.txt"
