#!/bin/bash
# On the device (the real 0.5B in $DEEPINFER_MODELS, an earlier source tree in $BEFORE): the GPU tests (pytest -m gpu;
# $PYTEST_K narrows them with -k), the hot-path bench with the heads' drafts as a tree and as a chain, the GPU
# kernels of those requests (spec_profile --kernels), and the same-machine decode/prefill speed of the earlier
# tree vs this one on a random 3B W4. Everything lands in $OUT:
#   pytest.txt, hotpath_gpu_0.5b_tree.json (engine/bench/hotpath.py --parts spec,chain,noburst,cost),
#   spec_kernels.txt, speed_3b_h200.json (engine/bench/compare_trees.py), *.log
set -u
python -m pytest -q -m gpu ${PYTEST_K:+-k "$PYTEST_K"} tests > "$OUT/pytest.txt" 2>&1
tail -3 "$OUT/pytest.txt"
python -m engine.bench.hotpath --device cuda --texts 10 --parts spec,chain,noburst,cost \
    --out "$OUT/hotpath_gpu_0.5b_tree.json" 2> "$OUT/hotpath.log"
grep "^speculative\|^spec cost" "$OUT/hotpath.log" | cut -c1-700
python -m engine.bench.spec_profile --device cuda --kernels --top 25 --out "$OUT/spec_kernels.txt" 2> "$OUT/spec_kernels.log"
head -4 "$OUT/spec_kernels.txt"
if [ -n "${BEFORE:-}" ]; then
    python -m engine make-random --shape 3b --scheme w4 --out /tmp/r3b > "$OUT/make_random.log" 2>&1
    python -m engine.bench.compare_trees --model /tmp/r3b --tree before="$BEFORE" --tree after=. --rounds 3 \
        --work /tmp/cmp --out "$OUT/speed_3b_h200.json" 2> "$OUT/compare.log"
    tail -5 "$OUT/compare.log"
fi
