#!/bin/bash
# The chain step's keys to the host by its own kernel (GPUModel.chain_keys "kernel", decode_misc.cu keys_host; the
# default since the twenty-eighth session) on the merge launch's chunk of 80 (decode_attn.cu ATT_MERGE_CH). One call:
#   bash engine/bench/device_chainkeys.sh COMMIT
# (1) every GPU test (the real 0.5B's skip without its parts), among them the decode kernels' GPU check (the merge
# launch's bits against the in-kernel merge's, up to 256 splits) and tests/test_gpu_chain_keys.py (decode_chain's
# tokens both ways equal to the host loop's, even and odd positions);
# (2) engine.bench.chain_gap at 64 / 16k rows: the chain step with its keys copied behind it against written by
# its own kernel, replayed and through decode_chain; (3) the bench's decode run with the kernel, every #16 row
# (device_decode.sh: its chained rows check their tokens, read from the kernel's writes, against the host loop's).
# Writes $OUT/pytest_chainkeys.txt, $OUT/chain_gap.json, $OUT/gpu_decode.json and logs.
set -u
. engine/bench/device_env.sh
# TESTS narrows (1) when device time is short, e.g. TESTS="tests/test_gpu_chain_keys.py
# tests/test_gpu_decode.py::test_decode_kernels_match_references"; LENS likewise (2)
# shellcheck disable=SC2086
timeout 230 python3 -m pytest -q -m gpu -p no:cacheprovider ${TESTS:-tests} > "$OUT/pytest_chainkeys.txt" 2>&1
tail -1 "$OUT/pytest_chainkeys.txt"
timeout 160 python3 -m engine.bench.chain_gap --shape 3b --bits 4 --lens "${LENS:-64,16384}" --commit "${1:-unknown}" \
    --out "$OUT/chain_gap.json" > "$OUT/chain_gap.log" 2>&1
grep -E "^\||rror|Traceback" "$OUT/chain_gap.log"
DEEPINFER_CHAIN_KEYS=kernel bash engine/bench/device_decode.sh "${1:-unknown}"
