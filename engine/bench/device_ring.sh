#!/bin/bash
# The attention's ring kernels (decode_attn.cu ATT_RING: a warp's next K/V tiles through shared memory by cp.async,
# <= 144 registers, so a block fits an SM beside a qkv GEMV block and issues its first tiles before the PDL wait) in
# the long-context graphs' plain steps. One call, wheels carried (carry [".whl"]):
#   bash engine/bench/device_ring.sh COMMIT  -> $OUT/pytest_ring.txt, decode_ab_ring.json, gemv_phases_16k_ring.json
# First the bits: the decode kernels' GPU check on a -DATT_RING=2 build (the ring kernel, in-kernel merge and merge
# launch, against the default kernel bit for bit, every attention shape of kernels/checks.py). Then 3B / 7B W4 at
# 4k / 16k cached: base (no ring), ring2 (2 tiles per warp, 128 KB), ring2r128 (capped at 128 registers: fits beside
# the 7B's qkv blocks of 128 too), ring1 (1 tile, 64 KB). Short rows never run the ring (same kernels as base).
set -u
. engine/bench/device_env.sh
DEEPINFER_KERNEL_DEFINES="-DATT_RING=2" timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider \
    "tests/test_gpu_decode.py::test_decode_kernels_match_references" > "$OUT/pytest_ring.txt" 2>&1
tail -3 "$OUT/pytest_ring.txt"
K=DEEPINFER_KERNEL_DEFINES
timeout 330 python3 -m engine.bench.decode_ab --shapes 3b:4,7b:4 --rounds 2 --long 4096,16384 --commit "${1:-unknown}" \
    --variants "base:,ring2:$K=-DATT_RING=2,ring2r128:$K=-DATT_RING=2 -DATT_RING_MAXNREG=128,ring1:$K=-DATT_RING=1" \
    --out "$OUT/decode_ab_ring.json" > "$OUT/decode_ab_ring.log" 2>&1
grep "^|" "$OUT/decode_ab_ring.log" | cut -c1-330
tail -2 "$OUT/decode_ab_ring.log"
DEEPINFER_KERNEL_DEFINES="-DATT_RING=2" timeout 60 python3 -m engine.bench.gemv_phases --shapes 3b:4 --cached 16000 \
    --commit "${1:-unknown}" --out "$OUT/gemv_phases_16k_ring.json" > "$OUT/gemv_phases_16k_ring.log" 2>&1
grep -E "^\| (qkv|attention|merge|o|gate_up) " "$OUT/gemv_phases_16k_ring.log"
tail -2 "$OUT/gemv_phases_16k_ring.log"
