#!/bin/bash
# The int8-activation GEMV probe (kernels/decode_q8.cu, #16's go / no-go) in one device call (carry [".whl"]): its GPU
# test against the references, then the timing sweep against the step's GEMVs (engine/bench/q8_probe.py), then the
# GEMV trace whose longest tails split into reduction and epilogue (engine/bench/gemv_phases.py).
#   bash engine/bench/device_q8.sh COMMIT   -> $OUT/pytest_q8.txt, q8_probe.json, gemv_phases_tailsplit.json
# The next call for the q8 lead (docs/gpu.md): STEP=1 MMA=3b PHASES=0 bash engine/bench/device_q8.sh COMMIT
set -u
. engine/bench/device_env.sh
C=${1:-unknown}
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_q8_probe.py > "$OUT/pytest_q8.txt" 2>&1
echo "q8 checks: $(tail -1 "$OUT/pytest_q8.txt")"
timeout 300 python3 -m engine.bench.q8_probe --shapes ${SHAPES:-3b,7b,14b} --check "${CHECK-3b}" --variants "${VARIANTS-ptrs:-DQ8_PTRS=1,loads:-DQ8_LOADS_ONLY=1}" --mma "${MMA-}" --commit "$C" \
    --out "$OUT/q8_probe.json" 2>&1 | grep -v Warning
[ "${PHASES:-1}" = 1 ] && timeout 150 python3 -m engine.bench.gemv_phases --shapes 3b:4,14b:4 --commit "$C" \
    --out "$OUT/gemv_phases_tailsplit.json" 2>&1 | tail -30
# STEP=1: then the probe inside the step (device_q8_step.sh: base / q8 / q8quant / q8mma, one round)
[ "${STEP:-0}" = 1 ] && SHAPES=${STEP_SHAPES:-3b:4,7b:4,14b:4} ROUNDS=${ROUNDS:-1} \
    bash engine/bench/device_q8_step.sh "$C"
exit 0
