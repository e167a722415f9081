#!/bin/bash
# o_proj's blocks beside the short-context attention's: the 14B's o ran 160 blocks on 92 SMs (1.96 TB/s) because its
# 40 attention blocks (245 registers x 256 threads each) held the other 40 when o launched (PDL: at the attention's
# start). A/B, 3B / 7B / 14B W4, batch 1 at short contexts: base; hpt0 the short-context blocks not triggering the next
# launch (-DATT_HP_TRIGGER=0: o is placed when they exit, on every SM); gunopdl gate_up launched without PDL (the same
# idea for the 3B's gate_up blocks that start late beside o's). Then the 14B's phases with hpt0. Wheels carried:
#   bash engine/bench/device_hptrig.sh COMMIT  -> $OUT/decode_ab_hptrig.json, gemv_phases_14b_hpt0.json
set -u
. engine/bench/device_env.sh
timeout 420 python3 -m engine.bench.decode_ab --shapes 3b:4,7b:4,14b:4 --rounds 2 --commit "${1:-unknown}" \
    --variants "base:,hpt0:DEEPINFER_KERNEL_DEFINES=-DATT_HP_TRIGGER=0,gunopdl:DEEPINFER_PDL_OFF=gemv_w4_silu_bal" \
    --out "$OUT/decode_ab_hptrig.json" > "$OUT/decode_ab_hptrig.log" 2>&1
grep "^|" "$OUT/decode_ab_hptrig.log" | cut -c1-400
tail -2 "$OUT/decode_ab_hptrig.log"
DEEPINFER_KERNEL_DEFINES="-DATT_HP_TRIGGER=0" timeout 100 python3 -m engine.bench.gemv_phases --shapes 14b:4 \
    --commit "${1:-unknown}" --out "$OUT/gemv_phases_14b_hpt0.json" > "$OUT/gemv_phases_14b_hpt0.log" 2>&1
grep -E "^\| (qkv|attention|o|gate_up|down) " "$OUT/gemv_phases_14b_hpt0.log"
tail -1 "$OUT/gemv_phases_14b_hpt0.log"
