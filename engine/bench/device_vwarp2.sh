#!/bin/bash
# After device_vwarp.sh (128-thread attention blocks in the long-context graphs: 3B 16k replay 1.414 ms vs 1.366 at
# 256; its trace: the blocks sat two per SM on free SMs, 126 on 88 SMs, loop 7.4 us instead of 5.7): the same blocks
# with unused dynamic shared memory so that two do not fit one SM (81,920 B + 42,100 static: 121 KB, two exceed the
# H100's 228 KB; one still fits beside a qkv block), with and without every decode kernel preferring the most shared
# memory (DEEPINFER_SMEM_CARVEOUT=100: no SM has to change its L1 / shared split for the attention's block). One call,
# wheels carried (carry [".whl"]):
#   bash engine/bench/device_vwarp2.sh COMMIT  -> $OUT/decode_ab_vwarp2.json, gemv_phases_16k_t128s.json
set -u
. engine/bench/device_env.sh
T=DEEPINFER_ATTN_THREADS_LONG
S=DEEPINFER_ATTN_SMEM_LONG=81920
C=DEEPINFER_SMEM_CARVEOUT=100
timeout 300 python3 -m engine.bench.decode_ab --shapes 3b:4 --rounds 2 --long 4096,16384 --commit "${1:-unknown}" \
    --variants "t256:,t128s:$T=128+$S,t128sc:$T=128+$S+$C,t256c:$C,t256s:$S" \
    --out "$OUT/decode_ab_vwarp2.json" > "$OUT/decode_ab_vwarp2.log" 2>&1
grep "^|" "$OUT/decode_ab_vwarp2.log" | cut -c1-400
tail -3 "$OUT/decode_ab_vwarp2.log"
DEEPINFER_ATTN_THREADS_LONG=128 DEEPINFER_ATTN_SMEM_LONG=81920 timeout 60 python3 -m engine.bench.gemv_phases --shapes 3b:4 \
    --cached 16000 --commit "${1:-unknown}" --out "$OUT/gemv_phases_16k_t128s.json" > "$OUT/gemv_phases_16k_t128s.log" 2>&1
grep -E "^\| (qkv|attention|merge|o|gate_up) " "$OUT/gemv_phases_16k_t128s.log"
