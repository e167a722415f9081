#!/bin/bash
# On the device, after the real 0.5B's parts were carried into /tmp/parts/q05_* over earlier calls: the tree-step
# profile on random weights (0.5B shape) with the attention's block order as built (ATT_SPLIT_MAJOR=1) and as before
# (0), then join the real model, the hot-path bench (speculation on the tray's templates, with and without bursts)
# and the GPU tests with the real model present. Everything lands in $OUT:
#   tree_profile_splitmajor{1,0}.json, hotpath_gpu_0.5b.json (engine/bench/hotpath.py --parts spec,noburst),
#   pytest.txt, *.log
set -u
for v in 1 0; do
    echo "== ATT_SPLIT_MAJOR=$v"
    DEEPINFER_KERNEL_DEFINES="-DATT_SPLIT_MAJOR=$v" python3 -m engine.bench.tree_profile --shapes 0.5b --steps 50 \
        --kernels --commit "${COMMIT:-unknown} ATT_SPLIT_MAJOR=$v" --out "$OUT/tree_profile_splitmajor$v.json" 2>&1 \
        | grep "plain_b[178] timeline\|verify_b[78] timeline\|plain replay\|draft timeline" | cut -c1-420
done
export DEEPINFER_MODELS=/tmp/store
bash engine/bench/device_join.sh qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
    1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 q05_ || exit 1
python3 -m engine.bench.hotpath --device cuda --texts 10 --parts spec,noburst --out "$OUT/hotpath_gpu_0.5b.json" \
    2> "$OUT/hotpath.log"
grep "^speculative" "$OUT/hotpath.log" | cut -c1-400
python3 -m pytest -q -m gpu tests > "$OUT/pytest.txt" 2>&1
tail -3 "$OUT/pytest.txt"
