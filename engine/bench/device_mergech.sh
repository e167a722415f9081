#!/bin/bash
# The merge launch's chunk (decode_attn.cu ATT_MERGE_CH; 64 when this ran at cc8e3ed, 80 the default since): at 16k+
# rows a 3B step has 65 active splits, which with 64 take a second round trip; 80 holds them in one. One call:
#   bash engine/bench/device_mergech.sh COMMIT
# (1) the decode kernels' GPU check with -DATT_MERGE_CH=80 (the merge launch's bits against the in-kernel merge's, up
# to 256 splits); (2) decode_ab at 16k cached, 3B W4: CH = 64 against 80, each named; (3) the bench's decode run,
# every #16 row (device_decode.sh); (4) engine.bench.chain_gap: the 16k chained step against its graph's replay.
# Writes $OUT/pytest_mergech.txt, $OUT/decode_ab_mergech.json, $OUT/gpu_decode.json, $OUT/chain_gap.json and logs.
set -u
. engine/bench/device_env.sh
DEEPINFER_KERNEL_DEFINES=-DATT_MERGE_CH=80 timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_gpu_decode.py::test_decode_kernels_match_references > "$OUT/pytest_mergech.txt" 2>&1
tail -1 "$OUT/pytest_mergech.txt"
K=DEEPINFER_KERNEL_DEFINES
timeout 150 python3 -m engine.bench.decode_ab --shapes 3b:4 --rounds 2 --long 16384 \
    --variants "ch64:$K=-DATT_MERGE_CH=64,ch80:$K=-DATT_MERGE_CH=80" --commit "${1:-unknown}" \
    --out "$OUT/decode_ab_mergech.json" > "$OUT/decode_ab_mergech.log" 2>&1
grep -E "^\||rror|Traceback" "$OUT/decode_ab_mergech.log" | cut -c1-300
bash engine/bench/device_decode.sh "${1:-unknown}"
timeout 150 python3 -m engine.bench.chain_gap --shape 3b --bits 4 --lens 64,16384 --commit "${1:-unknown}" \
    --out "$OUT/chain_gap.json" > "$OUT/chain_gap.log" 2>&1
grep -E "^\||rror|Traceback" "$OUT/chain_gap.log"
