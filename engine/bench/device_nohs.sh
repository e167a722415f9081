#!/bin/bash
# What the split-K handshake of the step's down_proj costs at most (-DGEMV_SPLITK_NOHS=1: a timing probe, wrong
# values: partials stored, no fence / counter / reduction, the K slice 0 block runs the epilogue on its own part), the
# bound on moving that reduction into the next kernel; and the lm_head at KSW 4 again. Wheels carried:
#   bash engine/bench/device_nohs.sh COMMIT  -> $OUT/decode_ab_nohs.json, gemv_phases_nohs.json
set -u
. engine/bench/device_env.sh
L3=4:logits:151936:2048 L7=4:logits:152064:3584 L14=4:logits:152064:5120
timeout 330 python3 -m engine.bench.decode_ab --shapes 3b:4,7b:4,14b:4 --rounds 2 --commit "${1:-unknown}" \
    --variants "base:,nohs:DEEPINFER_KERNEL_DEFINES=-DGEMV_SPLITK_NOHS=1,lm4:DEEPINFER_GEMV_PLAN=$L3=4x1x2/$L7=4x1x2/$L14=4x1x2" \
    --out "$OUT/decode_ab_nohs.json" > "$OUT/decode_ab_nohs.log" 2>&1
grep "^|" "$OUT/decode_ab_nohs.log" | cut -c1-250
tail -2 "$OUT/decode_ab_nohs.log"
DEEPINFER_KERNEL_DEFINES=-DGEMV_SPLITK_NOHS=1 timeout 60 python3 -m engine.bench.gemv_phases --shapes 3b:4 \
    --commit "${1:-unknown}" --out "$OUT/gemv_phases_nohs.json" > "$OUT/gemv_phases_nohs.log" 2>&1
grep -E "^\| (down|qkv|op)" "$OUT/gemv_phases_nohs.log"
