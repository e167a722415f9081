#!/bin/bash
# The merge launch at its default (decode_attn.cu ATT_MERGE_P = 4) and at P = 8 on the device, one call (carry .whl):
#   bash engine/bench/device_merge_final.sh COMMIT
# (1) the decode kernels' GPU check (the merge launch's bits against the in-kernel merge's, up to 256 splits) at P = 8;
# (2) the bench's decode run, every #16 row (device_decode.sh); (3) device_merge.sh: the same check at the default,
# then decode_ab at 16k cached, 3B W4: the default against one thread per dim, P = 8, and a head over 4 blocks
# (ATT_MERGE_DB = 32, P = 32).
# Writes $OUT/pytest_merge_p8.txt, $OUT/gpu_decode.json, $OUT/pytest_merge_p4.txt, $OUT/decode_ab_merge.json and logs.
set -u
. engine/bench/device_env.sh
DEEPINFER_KERNEL_DEFINES=-DATT_MERGE_P=8 timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_gpu_decode.py::test_decode_kernels_match_references > "$OUT/pytest_merge_p8.txt" 2>&1
tail -1 "$OUT/pytest_merge_p8.txt"
bash engine/bench/device_decode.sh "${1:-unknown}"
K=DEEPINFER_KERNEL_DEFINES
CHECK=-DATT_MERGE_P=4 NOTRACE=1 SHAPES="${SHAPES:-3b:4}" ABT=150 \
    VARIANTS="p4:,p1:$K=-DATT_MERGE_P=1,p8:$K=-DATT_MERGE_P=8,d32p32:$K=-DATT_MERGE_P=32 -DATT_MERGE_DB=32" \
    bash engine/bench/device_merge.sh "${1:-unknown}"
