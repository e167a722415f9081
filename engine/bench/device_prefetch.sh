#!/bin/bash
# On the device (wheels installed, PYTHONPATH set): the decode step's L2 prefetch (engine/model/l2_prefetch.py)
# checked and timed in one call: the GEMV kernels against their references and the step's bits with and without
# prefetching (pytest), then decode_ab over DEEPINFER_L2_PREFETCH variants. Writes $OUT/decode_ab_prefetch_<TAG>_h200.json.
#   TAG=first ABV="off:DEEPINFER_L2_PREFETCH=0,next:DEEPINFER_L2_PREFETCH=0:0.5" bash engine/bench/device_prefetch.sh COMMIT
set -u
tag=${TAG:-run}
timeout 240 python3 -m pytest -q -m gpu tests/test_l2_prefetch.py ${TESTS:-tests/test_gpu_decode.py::test_decode_kernels_match_references} \
    > "$OUT/pytest_prefetch_$tag.txt" 2>&1
tail -3 "$OUT/pytest_prefetch_$tag.txt"
timeout ${ABT:-300} python3 -m engine.bench.decode_ab \
    --variants "${ABV:-off:DEEPINFER_L2_PREFETCH=0,next:DEEPINFER_L2_PREFETCH=0:0.5,lead8:DEEPINFER_L2_PREFETCH=8:0.5}" \
    --shapes "${SHAPES:-3b:4,7b:4}" --rounds "${ROUNDS:-2}" ${LONG:+--long $LONG} --commit "${1:-unknown}" \
    --out "$OUT/decode_ab_prefetch_${tag}_h200.json" > "$OUT/decode_ab_prefetch_$tag.log" 2>&1
grep -E "^\||rror|Traceback" "$OUT/decode_ab_prefetch_$tag.log" | head -40
