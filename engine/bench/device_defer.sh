#!/bin/bash
# On the device (wheels installed, PYTHONPATH set): the deferred rmsnorm (kernels/decode_norm.cu) checked and timed.
# Every GPU test (the deferred norm's kernels vs their references among them, kernels/checks.py defer_checks), then
# decode_ab: separate rmsnorm launches (DEEPINFER_DEFER_NORM=0) vs deferred, the same process and random weights.
# NOTESTS=1 TESTS=FILES: only those GPU tests; VARIANTS: decode_ab's. Writes $OUT/pytest_defer.txt, $OUT/decode_ab_defer_h200.json and its log.
#   bash engine/bench/device_defer.sh COMMIT
set -u
SHAPES=${SHAPES:-3b:4,3b:3,7b:4,7b:3,7b:mixed}
[ -z "${NOTESTS:-}" ] && timeout 240 python3 -m pytest -q -m gpu tests > "$OUT/pytest_defer.txt" 2>&1
[ -z "${NOTESTS:-}" ] && { grep -E "BAD|FAIL|Error" "$OUT/pytest_defer.txt" | head -20; tail -3 "$OUT/pytest_defer.txt"; }
[ -n "${TESTS:-}" ] && { timeout 240 python3 -m pytest -q -m gpu $TESTS > "$OUT/pytest_defer.txt" 2>&1; tail -3 "$OUT/pytest_defer.txt"; }
VARIANTS=${VARIANTS:-separate:DEEPINFER_DEFER_NORM=0,deferred:}
timeout "${ABTIME:-330}" python3 -m engine.bench.decode_ab --variants "$VARIANTS" \
    --shapes "$SHAPES" --rounds "${ROUNDS:-3}" --commit "${1:-unknown}" --out "$OUT/decode_ab_defer_h200.json" \
    > "$OUT/decode_ab_defer.log" 2>&1
grep -E "^\||Error|error" "$OUT/decode_ab_defer.log" | tail -12
