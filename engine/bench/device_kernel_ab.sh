#!/bin/bash
# On the device (wheels installed, PYTHONPATH set): kernel variants compiled with -D defines (or any knobs), checked,
# timed and traced in one call. Each set of CHECKS (sets separated by ';') runs the decode kernels' reference checks
# (pytest) compiled with it; then decode_ab times the ABV variants in one process; then gemv_phases traces the TRACE
# variants (the same syntax), printing its table rows for TRACE_OPS (an ERE on the op name; all by default).
# Writes $OUT/pytest_kab_<TAG>.txt, $OUT/decode_ab_<TAG>.json and its log, $OUT/gemv_phases_<variant>.json.
#   TAG=hints CHECKS="-DGEMV_LDHINT=1;-DGEMV_SS_PAIR=2" ABV="base:,ld256:DEEPINFER_KERNEL_DEFINES=-DGEMV_LDHINT=1" \
#       SHAPES=3b:4 LONG=16384 TRACE="ld256:DEEPINFER_KERNEL_DEFINES=-DGEMV_LDHINT=1" TRACE_SHAPES=3b:4 \
#       TRACE_OPS="(o|gate_up)" bash engine/bench/device_kernel_ab.sh COMMIT
set -u
tag=${TAG:-run}
if [ -n "${CHECKS:-}" ]; then
  : > "$OUT/pytest_kab_$tag.txt"
  IFS=';' read -ra sets <<< "$CHECKS"
  for d in "${sets[@]}"; do
    echo "== DEEPINFER_KERNEL_DEFINES=$d" >> "$OUT/pytest_kab_$tag.txt"
    DEEPINFER_KERNEL_DEFINES="$d" timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider \
        tests/test_gpu_decode.py::test_decode_kernels_match_references \
        tests/test_gpu_decode.py::test_gguf_layout_kernels_match_references >> "$OUT/pytest_kab_$tag.txt" 2>&1
    echo "checks [$d]: $(tail -1 "$OUT/pytest_kab_$tag.txt")"
  done
fi
if [ -n "${ABV:-}" ]; then
  timeout ${ABT:-400} python3 -m engine.bench.decode_ab --variants "$ABV" --shapes "${SHAPES:-3b:4}" \
      --rounds "${ROUNDS:-2}" ${LONG:+--long $LONG} --commit "${1:-unknown}" \
      --out "$OUT/decode_ab_${tag}.json" > "$OUT/decode_ab_$tag.log" 2>&1
  grep -E "^\||rror|Traceback" "$OUT/decode_ab_$tag.log" | cut -c1-330 | head -40
fi
if [ -n "${TRACE:-}" ]; then
  timeout ${TRACET:-120} python3 -m engine.bench.gemv_phases --shapes "${TRACE_SHAPES:-3b:4}" --variants "$TRACE" \
      --commit "${1:-unknown}" --out "$OUT/gemv_phases.json" > "$OUT/gemv_phases_$tag.log" 2>&1
  grep -E "^== |^\| ${TRACE_OPS:-[a-z_]+} |step replay|rror|Traceback" "$OUT/gemv_phases_$tag.log" | head -80
fi
