#!/bin/bash
# On the device (the real 0.5B already in $DEEPINFER_MODELS): train its draft heads, measure speculation with them
# on the tray's templates, run the GPU tests of the heads and of speculation. Everything lands in $OUT:
#   draft_heads_train_0.5b.json (engine/draft/train.py), heads.safetensors, hotpath_gpu_0.5b_heads.json
#   (engine/bench/hotpath.py --parts spec), pytest.txt, *.log
set -u
python -m engine.draft.train --device cuda --sources "${SOURCES:-1200}" --out "$OUT/heads.safetensors" \
    --report "$OUT/draft_heads_train_0.5b.json" 2> "$OUT/train.log" || { tail -20 "$OUT/train.log"; exit 1; }
tail -3 "$OUT/train.log"
python -m engine.bench.hotpath --device cuda --texts 10 --parts spec,cost --draft-heads "$OUT/heads.safetensors" \
    --out "$OUT/hotpath_gpu_0.5b_heads.json" 2> "$OUT/hotpath.log"
grep "^speculative\|^spec cost" "$OUT/hotpath.log" | cut -c1-600
mkdir -p assets/drafters && cp "$OUT/heads.safetensors" assets/drafters/qwen2.5-coder-0.5b-instruct-q4_k_m.heads.safetensors
python -m pytest -q -m gpu tests/test_gpu_draft_heads.py tests/test_spec_verify.py > "$OUT/pytest.txt" 2>&1
tail -3 "$OUT/pytest.txt"
