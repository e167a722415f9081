#!/bin/bash
# The merge launch's threads per dim on the device, one call (carry .whl):   bash engine/bench/device_merge_final.sh COMMIT
# (1) the decode kernels' GPU check (the merge launch's bits against the in-kernel merge's, up to 256 splits) at the
# other P (ALT, default 4: the default was 4 until this script's run at 45e3fca made it 8); (2) the bench's decode run,
# every #16 row (device_decode.sh); (3) device_merge.sh: the same check at the default, then decode_ab at 16k cached,
# 3B W4: the default against one thread per dim, ALT, and a head over 4 blocks (ATT_MERGE_DB = 32, P = 32).
# Writes $OUT/pytest_merge_alt.txt, $OUT/gpu_decode.json, $OUT/pytest_merge_default.txt, $OUT/decode_ab_merge.json, logs.
set -u
. engine/bench/device_env.sh
ALT=${ALT:-4}
DEEPINFER_KERNEL_DEFINES=-DATT_MERGE_P=$ALT timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_gpu_decode.py::test_decode_kernels_match_references > "$OUT/pytest_merge_alt.txt" 2>&1
tail -1 "$OUT/pytest_merge_alt.txt"
bash engine/bench/device_decode.sh "${1:-unknown}"
K=DEEPINFER_KERNEL_DEFINES
CHECK=" " NOTRACE=1 SHAPES="${SHAPES:-3b:4}" ABT=150 \
    VARIANTS="default:,p1:$K=-DATT_MERGE_P=1,p$ALT:$K=-DATT_MERGE_P=$ALT,d32p32:$K=-DATT_MERGE_P=32 -DATT_MERGE_DB=32" \
    bash engine/bench/device_merge.sh "${1:-unknown}"
