#!/bin/bash
# One H200 call (wheels carried, carry [".whl"]):   bash engine/bench/device_h200.sh COMMIT
# (1) the bench's decode run alone (every #16 row, the defaults) -> $OUT/gpu_decode.json;
# (2) decode_ab on the 3B W4 (random weights, one process, ROUNDS rounds, 16k cached too): the default against the
#     decode step's IEEE divisions (-DDECODE_DIV_FAST=0, the default before the forty-fifth session: the -0.7% was
#     measured on an H100 only) and against the 3B's o_proj at gemv_plan's 128 blocks (the 64-block plan was chosen on
#     H100s) -> $OUT/decode_ab_h200.json; greedy tokens must be equal.
set -u
. engine/bench/device_env.sh
bash engine/bench/device_decode.sh "${1:-unknown}"
timeout ${ABT:-300} python3 -m engine.bench.decode_ab \
    --variants "default:,ieee:DEEPINFER_KERNEL_DEFINES=-DDECODE_DIV_FAST=0,o128:DEEPINFER_GEMV_PLAN=4:resid:2048:2048=8x1x1" \
    --shapes "${SHAPES:-3b:4}" --rounds "${ROUNDS:-3}" --long "${LONG:-16384}" --commit "${1:-unknown}" \
    --out "$OUT/decode_ab_h200.json" > "$OUT/decode_ab_h200.log" 2>&1
grep -E "^\||rror|Traceback" "$OUT/decode_ab_h200.log" | cut -c1-300 | head -30
