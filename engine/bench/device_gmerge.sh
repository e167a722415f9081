#!/bin/bash
# On the device, one call: the grid merge (decode_attn.cu attn_grid_merge: the long-context attention's blocks merge
# their partials themselves after a barrier, no merge launch; compiled in with -DATT_GRID_MERGE=1) checked and timed.
# Installs the carried wheels if needed, runs the decode kernels' GPU checks (the grid merge's bits vs the merge
# launch's and the in-kernel merge's),
# then decode_ab at 4k / 16k cached (grid; the merge launch with the grid merge compiled in, i.e. its registers alone;
# the default kernel) and step_trace at 16k cached with the grid merge.
# Writes $OUT/pytest_gmerge_<TAG>.txt, $OUT/decode_ab_gmerge_<TAG>_h200.json, $OUT/step_trace_16k_<TAG>_h200.json.
#   TAG=first [BENCH=3b:4,7b:4] bash engine/bench/device_gmerge.sh COMMIT   (carry .whl; NOCHECK / NOTRACE skip steps)
set -u
tag=${TAG:-run}
[ -d /tmp/site/fastapi ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
GM=DEEPINFER_KERNEL_DEFINES=-DATT_GRID_MERGE=1
if [ -z "${NOCHECK:-}" ]; then
  DEEPINFER_KERNEL_DEFINES=-DATT_GRID_MERGE=1 timeout ${PT:-200} python3 -m pytest -q -m gpu -p no:cacheprovider \
      tests/test_gpu_decode.py::test_decode_kernels_match_references > "$OUT/pytest_gmerge_$tag.txt" 2>&1
  tail -2 "$OUT/pytest_gmerge_$tag.txt"
fi
timeout ${ABT:-300} python3 -m engine.bench.decode_ab \
    --variants "${ABV:-grid:$GM+DEEPINFER_ATTN_MERGE=grid,gmregs:$GM,default:}" --shapes "${SHAPES:-3b:4,7b:4}" \
    --rounds "${ROUNDS:-2}" --long "${LONG:-4096,16384}" --commit "${1:-unknown}" \
    --out "$OUT/decode_ab_gmerge_${tag}_h200.json" > "$OUT/decode_ab_gmerge_$tag.log" 2>&1
grep -E "replay|rror|Traceback" "$OUT/decode_ab_gmerge_$tag.log" | head -40
if [ -z "${NOTRACE:-}" ]; then
  DEEPINFER_KERNEL_DEFINES=-DATT_GRID_MERGE=1 DEEPINFER_ATTN_MERGE=grid timeout ${STT:-90} \
      python3 -m engine.bench.step_trace --shapes 3b:4 --cached 16384 --commit "${1:-unknown}" \
      --out "$OUT/step_trace_16k_${tag}_h200.json" > "$OUT/step_trace_16k_$tag.log" 2>&1
  grep -E "^\s*\||rror" "$OUT/step_trace_16k_$tag.log" | head -14
fi
# then, with BENCH=shapes, the bench's own decode run with the grid merge on (batch 1 chained, batch 8, the 16k
# ratio of the targets): $OUT/gpu_decode_h200_<TAG>.json
if [ -n "${BENCH:-}" ]; then
  DEEPINFER_KERNEL_DEFINES=-DATT_GRID_MERGE=1 DEEPINFER_ATTN_MERGE=grid timeout ${BT:-330} \
      python3 -m engine.bench.decode_bench --skip timing,speed_nopdl --shapes "$BENCH" --commit "${1:-unknown}" \
      --out "$OUT/gpu_decode_h200_$tag.json" > "$OUT/gpu_decode_h200_$tag.log" 2>&1
  grep -vE "^\s*$" "$OUT/gpu_decode_h200_$tag.log" | tail -25
fi
