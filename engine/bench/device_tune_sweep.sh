#!/bin/bash
# On the device, after the real 1.5B's parts (/tmp/parts/q15_*) and the CPU GPTQ codes of its default recipe
# (--codes-cache file, /tmp/parts/c15_*) were carried over earlier calls: join both, then tune the same codes with
# several tuning schedules on the GPU (recipe_search --device cuda --codes-cache: no GPTQ; the dense teacher and
# the tuning on the GPU, perplexity on the device's CPU in float32, as on the CPU machine).
#   device_tune_sweep.sh CODES_SHA256 VARIANT[,VARIANT...]   -> $OUT/tune_sweep_1.5b.json, tune_sweep.log
set -u
export DEEPINFER_MODELS=/tmp/store
bash engine/bench/device_join.sh qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
    cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 q15_ || exit 1
mkdir -p /tmp/codes15
[ -f /tmp/codes15/a4a5d29bd790.pt ] || cat /tmp/parts/c15_* > /tmp/codes15/a4a5d29bd790.pt
got=$(sha256sum /tmp/codes15/a4a5d29bd790.pt | cut -d' ' -f1)
[ "$got" = "$1" ] || { echo "codes sha256 mismatch: $got" >&2; exit 1; }
timeout 560 python3 -m engine.quant.recipe_search --model qwen2.5-coder-1.5b --device cuda --variants "$2" \
    --ppl-every 1 --codes-cache /tmp/codes15 --out "$OUT/tune_sweep_1.5b.json" 2> "$OUT/tune_sweep.log"
grep -E "ppl|Error|error" "$OUT/tune_sweep.log" | tr '\r' '\n' | grep -v "layer " | tail -40
