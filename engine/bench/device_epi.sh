#!/bin/bash
# The next device session's first call (#16), wheels carried (carry [".whl"]):
#   bash engine/bench/device_epi.sh COMMIT
# (1) GEMV_SS_PAIR, GEMV_EPI_EARLY, GEMV_FENCE_AR, EMBED_TRIGGER_LATE and ATT_ROPE_PRE against the default inside
#     whole steps, one process (tokens equal, replay ms);
# (2) the GEMV chain traced block by block (engine/bench/gemv_phases.py), default build;
# (3) the GPU tests with all of them compiled in (SS_PAIR=2): the decode kernels against their references, batch vs
#     single and every mma column bit for bit, the verify rows, the L2 prefetch step bits.
# Writes $OUT/decode_ab_epi.json, $OUT/gemv_phases.json, $OUT/device_tests_epi_pytest.txt and logs.
set -u
. engine/bench/device_env.sh
D=DEEPINFER_KERNEL_DEFINES
ALL="-DGEMV_SS_PAIR=2 -DGEMV_EPI_EARLY=1 -DGEMV_FENCE_AR=1 -DEMBED_TRIGGER_LATE=1 -DATT_ROPE_PRE=1"
timeout 330 python3 -m engine.bench.decode_ab --shapes 3b:4,7b:4 --rounds 2 --commit "${1:-unknown}" \
    --variants "base:,pair:$D=-DGEMV_SS_PAIR=1,pair2:$D=-DGEMV_SS_PAIR=2,early:$D=-DGEMV_EPI_EARLY=1,both:$D=-DGEMV_SS_PAIR=2 -DGEMV_EPI_EARLY=1,fence:$D=-DGEMV_FENCE_AR=1,late:$D=-DEMBED_TRIGGER_LATE=1,rope:$D=-DATT_ROPE_PRE=1,all:$D=$ALL" \
    --out "$OUT/decode_ab_epi.json" > "$OUT/decode_ab_epi.log" 2>&1
grep "^|" "$OUT/decode_ab_epi.log"
timeout 90 python3 -m engine.bench.gemv_phases --shapes 3b:4,7b:4 --commit "${1:-unknown}" \
    --out "$OUT/gemv_phases.json" > "$OUT/gemv_phases.log" 2>&1
grep "^|\|replay" "$OUT/gemv_phases.log"
DEEPINFER_KERNEL_DEFINES="$ALL" timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_gpu_decode.py tests/test_spec_verify.py tests/test_l2_prefetch.py > "$OUT/device_tests_epi_pytest.txt" 2>&1
tail -2 "$OUT/device_tests_epi_pytest.txt"
