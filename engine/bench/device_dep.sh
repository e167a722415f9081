#!/bin/bash
# On the device, one call: GEMVs on group flags (decode_gemv.cu gemv_body DEP, DEEPINFER_GEMV_DEP=1 or 2)
# checked and timed. Installs the carried wheels if needed; the flags' GPU tests (the kernel pair against the PDL
# pair and the references, whole steps' tokens and batch bits; a hang is cut by the timeout), the verify step's
# bits with the flags on; then, only if those passed, decode_ab off / dep in one process.
# Writes $OUT/pytest_dep_<TAG>.txt, $OUT/pytest_dep_spec_<TAG>.txt, $OUT/decode_ab_dep_<TAG>_h200.json (+ .log).
#   TAG=first [SHAPES=3b:4,7b:4] [LONG=16384] bash engine/bench/device_dep.sh COMMIT   (carry .whl)
set -u
tag=${TAG:-run}
[ -d /tmp/site/fastapi ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
timeout ${PT:-180} python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemv_dep.py \
    > "$OUT/pytest_dep_$tag.txt" 2>&1
tail -3 "$OUT/pytest_dep_$tag.txt"
if ! grep -qE "^[0-9]+ passed" "$OUT/pytest_dep_$tag.txt" || grep -qE "failed|error" "$OUT/pytest_dep_$tag.txt"; then
  echo "dep checks did not pass: no timing"; exit 1
fi
DEEPINFER_GEMV_DEP=2 timeout ${PT2:-150} python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_spec_verify.py \
    > "$OUT/pytest_dep_spec_$tag.txt" 2>&1
tail -2 "$OUT/pytest_dep_spec_$tag.txt"
timeout ${ABT:-300} python3 -m engine.bench.decode_ab \
    --variants "${ABV:-off:DEEPINFER_GEMV_DEP=0,dep1:DEEPINFER_GEMV_DEP=1,dep2:DEEPINFER_GEMV_DEP=2}" --shapes "${SHAPES:-3b:4,7b:4}" \
    --rounds "${ROUNDS:-2}" ${LONG:+--long $LONG} --commit "${1:-unknown}" \
    --out "$OUT/decode_ab_dep_${tag}_h200.json" > "$OUT/decode_ab_dep_$tag.log" 2>&1
grep -E "^\||replay|rror|Traceback" "$OUT/decode_ab_dep_$tag.log" | head -40
