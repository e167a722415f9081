#!/bin/bash
# On the device: the verify step's timeline (tree_profile --kernels, 0.5B shape, random weights) with the tree
# attention's grid capped at 8 (the default at 8 rows), 4, 2 and 1 blocks per (token, KV head)
# (DEEPINFER_TREE_GRID), to see whether the 8-row step's attention cost comes from its block count.
for g in 0 4 2 1; do
    echo "== DEEPINFER_TREE_GRID=$g"
    DEEPINFER_TREE_GRID=$g python3 -m engine.bench.tree_profile --shapes 0.5b --steps 30 --kernels --commit "grid$g" \
        --out "$OUT/tree_profile_grid$g.json" 2>&1 | grep "verify_b[5-8] timeline\|plain replay"
done
