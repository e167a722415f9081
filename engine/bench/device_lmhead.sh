#!/bin/bash
# The lm_head's plan inside whole steps (#16), wheels carried (carry [".whl"]):   bash engine/bench/device_lmhead.sh COMMIT
# Its 594 blocks (KSW 1: 8 tiles of 32 rows per block, every group per warp) are 2.25 waves of 264 slots: 3 waves x
# G groups per warp in sequence. KSW 2 / 4 give 5 x G/2 / 9 x G/4 (3B G = 16: 48 -> 40 / 36; 7B G = 28: 84 -> 70 / 63).
# Writes $OUT/decode_ab_lmhead.json and its log.
set -u
. engine/bench/device_env.sh
P=DEEPINFER_GEMV_PLAN
L2="4:logits:151936:2048=2x1x2/4:logits:152064:3584=2x1x2"
L4="4:logits:151936:2048=4x1x2/4:logits:152064:3584=4x1x2"
timeout 200 python3 -m engine.bench.decode_ab --shapes 3b:4,7b:4 --rounds 2 --commit "${1:-unknown}" \
    --variants "base:,ksw2:$P=$L2,ksw4:$P=$L4" --out "$OUT/decode_ab_lmhead.json" > "$OUT/decode_ab_lmhead.log" 2>&1
grep "^|" "$OUT/decode_ab_lmhead.log"
