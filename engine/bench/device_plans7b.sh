#!/bin/bash
# The 7B's plan A/Bs that ran the defaults before (decode_ab_w3plan_h200.json, decode_ab_pdloff_h100.json, the o112
# variant of decode_ab_bal7b_h200.json), with the base repeated; device_plans.sh is the call before. Wheels carried:
#   bash engine/bench/device_plans7b.sh COMMIT   -> $OUT/decode_ab_plans_7b.json and its log
# o812: o_proj in 112 blocks (its 224 leave gate_up 40 early slots); late160: gate_up's blocks from 40 on taking 160 of
# 256 of an early block's share (decode_gemv.cu bal_first, built with -DGEMV_BAL_LATE=1); d442: down at (4, 4, 2).
set -u
. engine/bench/device_env.sh
P=DEEPINFER_GEMV_PLAN
KD="DEEPINFER_KERNEL_DEFINES=-DGEMV_BAL_LATE=1"
timeout 500 python3 -m engine.bench.decode_ab --shapes 7b:4,7b:3 --rounds 2 --commit "${1:-unknown}" \
    --variants "base:,base2:,lm2:$P=4:logits:152064:3584=2x1x2/3:logits:152064:3584=2x1x2,pdl:DEEPINFER_PDL_OFF=gemv_w4_silu_bal/gemv_w4_resid_mt2/gemv_w3_silu_bal/gemv_w3_resid_mt2,o812:$P=4:resid:3584:3584=8x1x2/3:resid:3584:3584=8x1x2,d442:$P=4:resid:3584:18944=4x4x2/3:resid:3584:18944=4x4x2,late160:$KD+DEEPINFER_GEMV_BAL_LATE=40:160" \
    --out "$OUT/decode_ab_plans_7b.json" > "$OUT/decode_ab_plans_7b.log" 2>&1
grep "^|" "$OUT/decode_ab_plans_7b.log" | cut -c1-700
