#!/bin/bash
# The plan A/Bs that ran the defaults before decode_ab kept a variant's env through the capture (docs/gpu.md "One wave
# for the 14B's linears"), on the 3B, with the base repeated (~1% between variants was noise in the twenty-ninth
# session's 3B A/Bs); which gate_up blocks start late (gemv_phases); the bench's decode run. The 7B's A/Bs:
# device_plans7b.sh, the next call. Wheels carried (carry [".whl"]):
#   bash engine/bench/device_plans.sh COMMIT  -> $OUT/decode_ab_plans_3b.json, gemv_phases_late.json, gpu_decode.json
# First the decode kernels' GPU check, which now includes the 14B's linears on their one-wave default plans.
# Variants: o812 o_proj in 64
# blocks of 32 rows (fewer slots held while gate_up's blocks wait to become resident: its skew of 3.4-3.9 us);
# lateq the GEMV_BAL_LATE build alone (its code's cost), late160 / late96 gate_up's blocks from 136 on (those o_proj's
# 128 blocks keep from being resident early) taking 160 / 96 of 256 of an early block's share (decode_gemv.cu bal_first);
# n1 the one-tile GEMVs (qkv, o) one group deep (GEMV_NST1=1: 78 registers instead of 104); r96 that with the one-tile
# GEMVs capped at 64 registers and the balanced gate_up at 96 (GEMV_MAXNREG1 / GEMV_BAL_MAXNREG: an SM holding one
# o_proj block then also holds two gate_up blocks, 256 x (64 + 2 x 96) = 65,536 registers; ptxas: gate_up spills 228
# bytes, o 8), r96o the same with o_proj in 64 blocks.
set -u
. engine/bench/device_env.sh
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_decode.py > "$OUT/pytest_gpu_decode.txt" 2>&1
tail -2 "$OUT/pytest_gpu_decode.txt"
P=DEEPINFER_GEMV_PLAN
KD="DEEPINFER_KERNEL_DEFINES=-DGEMV_BAL_LATE=1"
KN1="DEEPINFER_KERNEL_DEFINES=-DGEMV_NST1=1"
KR96="DEEPINFER_KERNEL_DEFINES=-DGEMV_NST1=1 -DGEMV_MAXNREG1=64 -DGEMV_BAL_MAXNREG=96"
timeout 240 python3 -m engine.bench.decode_ab --shapes 3b:4 --rounds 2 --commit "${1:-unknown}" \
    --variants "base:,base2:,o812:$P=4:resid:2048:2048=8x1x2,lateq:$KD,late160:$KD+DEEPINFER_GEMV_BAL_LATE=136:160,late96:$KD+DEEPINFER_GEMV_BAL_LATE=136:96,n1:$KN1,r96:$KR96,r96o:$KR96+$P=4:resid:2048:2048=8x1x2" \
    --out "$OUT/decode_ab_plans_3b.json" > "$OUT/decode_ab_plans_3b.log" 2>&1
grep "^|" "$OUT/decode_ab_plans_3b.log" | cut -c1-700
# which gate_up blocks start late, how long after o ended, and how long their start -> wait return takes
timeout 60 python3 -m engine.bench.gemv_phases --shapes 3b:4,7b:4 --commit "${1:-unknown}" \
    --out "$OUT/gemv_phases_late.json" > "$OUT/gemv_phases_late.log" 2>&1
grep -E "^\| (o|gate_up|down) " "$OUT/gemv_phases_late.log"
DEEPINFER_KERNEL_DEFINES="-DGEMV_NST1=1 -DGEMV_MAXNREG1=64 -DGEMV_BAL_MAXNREG=96" timeout 60 python3 -m engine.bench.gemv_phases \
    --shapes 3b:4 --commit "${1:-unknown}" --out "$OUT/gemv_phases_r96.json" > "$OUT/gemv_phases_r96.log" 2>&1
grep -E "^\| (o|gate_up|down) " "$OUT/gemv_phases_r96.log"
bash engine/bench/device_decode.sh "${1:-unknown}"
