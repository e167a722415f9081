#!/bin/bash
# On the device (random weights only): the attention's block order as built (ATT_SPLIT_MAJOR=1) against the order
# before (0): the tree-step profile of the 0.5B shape (verify timelines by rows), the 3B decode side by side
# (engine/bench/decode_ab.py, greedy tokens compared), then every GPU test. Lands in $OUT.
set -u
for v in 1 0; do
    echo "== ATT_SPLIT_MAJOR=$v"
    DEEPINFER_KERNEL_DEFINES="-DATT_SPLIT_MAJOR=$v" python3 -m engine.bench.tree_profile --shapes 0.5b --steps 50 \
        --kernels --no-ablate --commit "${COMMIT:-unknown} ATT_SPLIT_MAJOR=$v" --out "$OUT/tree_profile_splitmajor$v.json" \
        2>&1 | grep "plain_b[178] timeline\|verify_b[78] timeline\|plain replay\|draft timeline" | cut -c1-420
done
python3 -m engine.bench.decode_ab --variants "splitmajor:DEEPINFER_KERNEL_DEFINES=-DATT_SPLIT_MAJOR=1,blockidx:DEEPINFER_KERNEL_DEFINES=-DATT_SPLIT_MAJOR=0" \
    --shapes 3b:4 --out "$OUT/decode_ab_splitmajor_h200.json" 2>&1 | tail -4
python3 -m pytest -q -m gpu tests > "$OUT/pytest.txt" 2>&1
tail -3 "$OUT/pytest.txt"
