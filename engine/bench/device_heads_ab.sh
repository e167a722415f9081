#!/bin/bash
# On the device, the real 0.5B's parts carried into /tmp/parts/q05_* over earlier calls: join it, measure
# speculation with the bundled draft heads (A), train new heads with more data / epochs / distillation (SOURCES, EPOCHS, LR, DISTILL), and
# measure again with them (B), same lease, same texts. Everything lands in $OUT:
#   hotpath_a.json, hotpath_b.json (engine/bench/hotpath.py --parts spec), heads.safetensors,
#   draft_heads_train.json (engine/draft/train.py), *.log
set -u
export DEEPINFER_MODELS=/tmp/store
bash engine/bench/device_join.sh qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
    1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 q05_ || exit 1
spec() {  # $1: out file, then extra hotpath args
    local out=$1; shift
    python3 -m engine.bench.hotpath --device cuda --texts 10 --parts spec --out "$OUT/$out" "$@" 2> "$OUT/${out%.json}.log"
    grep "^speculative" "$OUT/${out%.json}.log" | cut -c1-300
}
spec hotpath_a.json
python3 -m engine.draft.train --device cuda --sources "${SOURCES:-4000}" --epochs "${EPOCHS:-48}" --lr "${LR:-1e-3}" --distill "${DISTILL:-0}" \
    --out "$OUT/heads.safetensors" --report "$OUT/draft_heads_train.json" 2> "$OUT/train.log" \
    || { tail -20 "$OUT/train.log"; exit 1; }
tail -2 "$OUT/train.log"
spec hotpath_b.json --draft-heads "$OUT/heads.safetensors"
