#!/bin/bash
# For the next device session (#16): the 7B's gate_up in one balanced wave, and its o_proj in fewer blocks, inside
# whole steps. Wheels carried (carry [".whl"]):   bash engine/bench/device_bal7b.sh COMMIT
# The balanced gate_up measured -1.4% (W4) / +0.5% (W3) on the 7B step (decode_ab_bal_h100.json), left off there by
# BAL_GAIN; its trace (gemv_phases_bal_branch_h100.json) has the median block's K loop at the bandwidth but a skew of
# 3.2 us: the o_proj's 224 blocks (KSW 8, one tile each) hold the slots until its release, so few gate_up blocks are
# resident early to load their first weights. o112 gives o_proj 112 blocks (two tiles per warp, KSW 8: the resid_mt2
# kernel), leaving an SM's second slot to gate_up. Variants: the default, the balanced gate_up forced
# (DEEPINFER_GEMV_BAL=force), o112, both; then the GEMV trace of "both".
# Writes $OUT/decode_ab_bal7b.json, $OUT/gemv_phases_bal7b.json and logs.
set -u
. engine/bench/device_env.sh
O112="DEEPINFER_GEMV_PLAN=4:resid:3584:3584=8x1x2/3:resid:3584:3584=8x1x2"
timeout 300 python3 -m engine.bench.decode_ab --shapes 7b:4,7b:3 --rounds 2 --commit "${1:-unknown}" \
    --variants "base:,bal:DEEPINFER_GEMV_BAL=force,o112:$O112,both:DEEPINFER_GEMV_BAL=force+$O112" \
    --out "$OUT/decode_ab_bal7b.json" > "$OUT/decode_ab_bal7b.log" 2>&1
grep "^|" "$OUT/decode_ab_bal7b.log"
DEEPINFER_GEMV_BAL=force DEEPINFER_GEMV_PLAN="${O112#DEEPINFER_GEMV_PLAN=}" timeout 90 python3 -m engine.bench.gemv_phases \
    --shapes 7b:4 --commit "${1:-unknown}" --out "$OUT/gemv_phases_bal7b.json" > "$OUT/gemv_phases_bal7b.log" 2>&1
grep "^|\|replay" "$OUT/gemv_phases_bal7b.log"
