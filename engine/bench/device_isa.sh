#!/bin/bash
# On the device, one call: the GEMVs' shorter instruction stream (two-offset W4 unpack, 32-bit operand offsets,
# x zeros kept in registers; docs/gpu.md "The GEMV instruction stream") checked and timed. Installs the carried
# wheels if needed, runs the decode kernels' GPU checks, then decode_ab with the unpack alone switched back
# (-DGEMV_UNPACK2=0). Writes $OUT/pytest_isa_<TAG>.txt, $OUT/decode_ab_unpack2_<TAG>_h200.json and the log.
#   TAG=first SHAPES=3b:4,7b:4 [BENCH=3b:4,3b:3,7b:4,7b:3,7b:mixed,14b:4] bash engine/bench/device_isa.sh COMMIT
#   (carry .whl; BENCH: also decode_bench on those shapes, $OUT/gpu_decode_h200_<TAG>.json)
set -u
tag=${TAG:-run}
[ -d /tmp/site/fastapi ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
timeout ${PT:-200} python3 -m pytest -q -m gpu ${TESTS:-tests/test_gpu_decode.py} > "$OUT/pytest_isa_$tag.txt" 2>&1
tail -3 "$OUT/pytest_isa_$tag.txt"
timeout ${ABT:-300} python3 -m engine.bench.decode_ab \
    --variants "${ABV:-unpack2:,unpack1:DEEPINFER_KERNEL_DEFINES=-DGEMV_UNPACK2=0}" \
    --shapes "${SHAPES:-3b:4,7b:4}" --rounds "${ROUNDS:-2}" --commit "${1:-unknown}" \
    --out "$OUT/decode_ab_unpack2_${tag}_h200.json" > "$OUT/decode_ab_unpack2_$tag.log" 2>&1
grep -E "^\||rror|Traceback" "$OUT/decode_ab_unpack2_$tag.log" | head -40
# then the bench's own decode run (batch 1 chained, batch 8, long context; every scheme of the issue)
if [ -n "${BENCH:-}" ]; then
  timeout ${BT:-330} python3 -m engine.bench.decode_bench --skip timing,speed_nopdl --shapes "$BENCH" \
      --commit "${1:-unknown}" --out "$OUT/gpu_decode_h200_$tag.json" > "$OUT/gpu_decode_h200_$tag.log" 2>&1
  grep -vE "^\s*$" "$OUT/gpu_decode_h200_$tag.log" | tail -25
fi
