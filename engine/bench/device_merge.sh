#!/bin/bash
# #16's 16k ratio: the long-context merge launch with P threads per dim (decode_attn.cu ATT_MERGE_P: a chunk of
# ATT_MERGE_CH splits' partials in one round trip through shared memory, instead of one thread per dim in a chain of
# round trips).
# Checks its bits against the in-kernel merge (the decode kernels' GPU check), times it in whole steps at 16k cached
# (decode_ab, same process, same weights; P = 4 was the default from 0b8c613, P = 8 since the twenty-sixth session's
# run; the first run's "base" was P = 1) and traces the 16k step with the checked build.
#   bash engine/bench/device_merge.sh COMMIT      (carry .whl; CHECK="-D..." the variant checked and traced, default
#   " ": the default build; VARIANTS="name:ENV=..,..." the decode_ab variants; NOTRACE=1 no trace)
# Writes $OUT/pytest_merge_default.txt, $OUT/decode_ab_merge.json, $OUT/gemv_phases_16k_merge.json and logs.
set -u
. engine/bench/device_env.sh
DEEPINFER_KERNEL_DEFINES="${CHECK:- }" timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_gpu_decode.py::test_decode_kernels_match_references > "$OUT/pytest_merge_default.txt" 2>&1
tail -2 "$OUT/pytest_merge_default.txt"
K=DEEPINFER_KERNEL_DEFINES
timeout ${ABT:-330} python3 -m engine.bench.decode_ab --shapes "${SHAPES:-3b:4,7b:4}" --rounds 2 --long 16384 \
    --variants "${VARIANTS:-default:,p1:$K=-DATT_MERGE_P=1,p2:$K=-DATT_MERGE_P=2,p4:$K=-DATT_MERGE_P=4}" --commit "${1:-unknown}" \
    --out "$OUT/decode_ab_merge.json" > "$OUT/decode_ab_merge.log" 2>&1
grep -E "^\||rror|Traceback" "$OUT/decode_ab_merge.log" | cut -c1-400
[ -n "${NOTRACE:-}" ] && exit 0
DEEPINFER_KERNEL_DEFINES="${CHECK:- }" timeout 90 python3 -m engine.bench.gemv_phases --shapes 3b:4 --cached 16000 \
    --commit "${1:-unknown}" --out "$OUT/gemv_phases_16k_merge.json" > "$OUT/gemv_phases_16k_merge.log" 2>&1
grep "^|\|replay" "$OUT/gemv_phases_16k_merge.log"
