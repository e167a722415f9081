#!/bin/bash
# Here, in the repository root: the real Qwen2.5-Coder-0.5B GGUF (pulled into the model cache by `deepinfer pull
# qwen2.5-coder-0.5b` or the test suite) cut into 17 parts of at most 30 MB (the tree itself is ~21 MB of the 64 MiB a call carries) under .model/pq05_NN/q05_NN (git-ignored),
# since one device call carries 64 MiB with the tree (PYTHON: an interpreter with the engine's deps). Then, back to back (the machine keeps /tmp ~30 s after a call):
#   17 calls   mkdir -p /tmp/parts && cp .model/pq05_NN/q05_NN /tmp/parts/        carry [".model/pq05_NN"]
#   one call   export PYTHONPATH=/tmp/site DEEPINFER_MODELS=/tmp/store; bash engine/bench/device_join.sh \
#                  qwen2.5-coder-0.5b-instruct-q4_k_m.gguf <SHA256 printed below> q05_ && \
#              python3 -m pytest -q -m gpu -p no:cacheprovider tests                carry [".whl"]
set -eu
cd "$(dirname "$0")/../.."
src=$(${PYTHON:-python3} -c "from engine.hub import store; print(store.model_path('qwen2.5-coder-0.5b'))" 2>/dev/null || true)
[ -n "$src" ] && [ -f "$src" ] || { echo "the 0.5B is not in the model cache: run deepinfer pull qwen2.5-coder-0.5b" >&2; exit 1; }
rm -rf .model && mkdir -p .model/tmp
split -b ${PART_BYTES:-30000000} -d -a 2 "$src" .model/tmp/q05_  # PART_BYTES: up to 64 MiB less the tree
for f in .model/tmp/q05_*; do n=${f##*_}; mkdir -p ".model/pq05_$n"; mv "$f" ".model/pq05_$n/q05_$n"; done
rmdir .model/tmp
ls .model
echo "file $(basename "$src") sha256 $(sha256sum "$src" | cut -d' ' -f1)"
