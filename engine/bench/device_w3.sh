#!/bin/bash
# On the device (wheels installed, PYTHONPATH set): W3 layout 2 (kernels/pack.py) checked and timed. Every GPU test
# (the W3 GEMV, embedding and prefill against their references among them), then decode_bench on this tree and on
# the tree before it (git archive in .before) for W4 / W3 / mixed side by side, 3B and 7B, batch 1 (chained) and 8.
# Writes $OUT/pytest_w3.txt, $OUT/gpu_decode_h200_w3_{after,before}.json and their logs.
#   bash engine/bench/device_w3.sh COMMIT_AFTER COMMIT_BEFORE
set -u
SHAPES=${SHAPES:-3b:4,3b:3,7b:4,7b:3,7b:mixed}
[ -z "${NOTESTS:-}" ] && timeout 240 python3 -m pytest -q -m gpu tests > "$OUT/pytest_w3.txt" 2>&1
[ -z "${NOTESTS:-}" ] && tail -3 "$OUT/pytest_w3.txt"
for side in ${SIDES:-after before}; do
    [ "$side" = none ] && continue
    dir=.; commit=${1:-unknown}
    [ "$side" = before ] && { dir=.before; commit=${2:-unknown}; }
    (cd "$dir" && timeout 150 python3 -m engine.bench.decode_bench --out "$OUT/gpu_decode_h200_w3_$side.json" \
        --commit "$commit" --skip timing,speed_nopdl,long_context --shapes "$SHAPES" > "$OUT/decode_w3_$side.log" 2>&1)
    echo "== $side"; grep -E "^\|" "$OUT/decode_w3_$side.log"
done
if [ -n "${SWEEP:-}" ]; then  # (KSW, KSB, MT) per linear for W3 weights (docs/results/gpu_decode_plan_sweep_*)
    timeout 200 python3 -m engine.bench.decode_profile sweep 3 > "$OUT/plan_sweep_w3.txt" 2>&1
    cut -c1-90 "$OUT/plan_sweep_w3.txt"
fi
