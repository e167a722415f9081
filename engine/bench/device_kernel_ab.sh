#!/bin/bash
# On the device (wheels installed, PYTHONPATH set): kernel variants compiled with -D defines, checked and timed in one
# call. Each set of CHECKS (sets separated by ';') runs the decode kernels' reference checks (pytest) compiled with it;
# then decode_ab times the ABV variants (DEEPINFER_KERNEL_DEFINES per variant) in one process.
# Writes $OUT/pytest_kab_<TAG>.txt, $OUT/decode_ab_<TAG>_h200.json and its log.
#   TAG=hints CHECKS="-DGEMV_LDHINT=1;-DGEMV_SS_PAIR=2" ABV="base:,ld256:DEEPINFER_KERNEL_DEFINES=-DGEMV_LDHINT=1" \
#       SHAPES=3b:4 LONG=16384 bash engine/bench/device_kernel_ab.sh COMMIT
set -u
tag=${TAG:-run}
: > "$OUT/pytest_kab_$tag.txt"
IFS=';' read -ra sets <<< "${CHECKS:-}"
for d in "${sets[@]}"; do
  echo "== DEEPINFER_KERNEL_DEFINES=$d" >> "$OUT/pytest_kab_$tag.txt"
  DEEPINFER_KERNEL_DEFINES="$d" timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider \
      tests/test_gpu_decode.py::test_decode_kernels_match_references \
      tests/test_gpu_decode.py::test_gguf_layout_kernels_match_references >> "$OUT/pytest_kab_$tag.txt" 2>&1
  echo "checks [$d]: $(tail -1 "$OUT/pytest_kab_$tag.txt")"
done
if [ -n "${ABV:-}" ]; then
  timeout ${ABT:-400} python3 -m engine.bench.decode_ab --variants "$ABV" --shapes "${SHAPES:-3b:4}" \
      --rounds "${ROUNDS:-2}" ${LONG:+--long $LONG} --commit "${1:-unknown}" \
      --out "$OUT/decode_ab_${tag}_h200.json" > "$OUT/decode_ab_$tag.log" 2>&1
  grep -E "^\||rror|Traceback" "$OUT/decode_ab_$tag.log" | head -40
fi
