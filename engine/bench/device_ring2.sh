#!/bin/bash
# After device_ring.sh (the ring kernels' first call: the GPU check failed on some attention rows, and with the first
# tiles issued before the PDL wait qkv's span grew 2.6 -> 4.9 us at 16k, the attention's early loads taking its
# bandwidth: 3B 16k replay 1.379 vs 1.355 ms, 7B 2.351 vs 2.154). One call, wheels carried (carry [".whl"]):
#   bash engine/bench/device_ring2.sh COMMIT -> $OUT/attn_bits_ring*.txt, decode_ab_ring2.json, gemv_phases_16k_ringlate.json
# Which rows differ and how (engine/bench/attn_bits.py), on the ring build as it was and with the first tiles issued
# after the wait (-DATT_RING_EARLY=0: blocks resident beside qkv's, but no loads before qkv is done); then 3B / 7B W4
# at 4k / 16k cached: base, ringlate (2 tiles per warp), ring1late (1 tile).
set -u
. engine/bench/device_env.sh
DEEPINFER_KERNEL_DEFINES="-DATT_RING=2" timeout 90 python3 -m engine.bench.attn_bits > "$OUT/attn_bits_ring.txt" 2>&1
grep -A3 "^BAD" "$OUT/attn_bits_ring.txt" | cut -c1-600 | head -24
tail -1 "$OUT/attn_bits_ring.txt"
DEEPINFER_KERNEL_DEFINES="-DATT_RING=2 -DATT_RING_EARLY=0" timeout 90 python3 -m engine.bench.attn_bits \
    > "$OUT/attn_bits_ringlate.txt" 2>&1
tail -1 "$OUT/attn_bits_ringlate.txt"
K=DEEPINFER_KERNEL_DEFINES
timeout 250 python3 -m engine.bench.decode_ab --shapes 3b:4,7b:4 --rounds 2 --long 4096,16384 --commit "${1:-unknown}" \
    --variants "base:,ringlate:$K=-DATT_RING=2 -DATT_RING_EARLY=0,ring1late:$K=-DATT_RING=1 -DATT_RING_EARLY=0" \
    --out "$OUT/decode_ab_ring2.json" > "$OUT/decode_ab_ring2.log" 2>&1
grep "^|" "$OUT/decode_ab_ring2.log" | cut -c1-330
tail -2 "$OUT/decode_ab_ring2.log"
DEEPINFER_KERNEL_DEFINES="-DATT_RING=2 -DATT_RING_EARLY=0" timeout 60 python3 -m engine.bench.gemv_phases --shapes 3b:4 \
    --cached 16000 --commit "${1:-unknown}" --out "$OUT/gemv_phases_16k_ringlate.json" > "$OUT/gemv_phases_16k_ringlate.log" 2>&1
grep -E "^\| (qkv|attention|merge|o|gate_up) " "$OUT/gemv_phases_16k_ringlate.log"
