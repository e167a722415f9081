#!/bin/bash
# The attention in smaller blocks (decode_attn.cu ATT_VWARP: 8 virtual warps run by 4 or 2 warps, the same bits) in
# the long-context graphs, so its blocks become resident beside qkv's instead of after them (at 16k rows 110 of the
# 3B's 126 started only when qkv's blocks left: gemv_phases_16k_o812_h100.json). One call, wheels carried
# (carry [".whl"]):
#   bash engine/bench/device_vwarp.sh COMMIT  -> $OUT/pytest_vwarp.txt, decode_ab_vwarp.json, gemv_phases_16k_t128.json
# First the bits: the decode kernels' GPU check (attention at 128 / 64 threads, both merges, vs 256) and the tree
# kernel's (128 / 64 vs 256 and vs one-token steps). Variants, 3B W4 at 4k / 16k cached: vw0 the build without
# virtual warps (-DATT_VWARP=0, ~the earlier kernel), t256 the new code at 256 threads (the default), t128 / t64 the
# long-context graphs' attention at 128 / 64 threads, t128q t128 with qkv at (8, 1, 2) (80 blocks: more SMs free for
# the attention's; the plan applies to the short graphs too, so only the long rows count for it).
set -u
. engine/bench/device_env.sh
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider \
    "tests/test_gpu_decode.py::test_decode_kernels_match_references" \
    "tests/test_spec_verify.py::test_tree_attention_equals_default_kernel_bitwise" > "$OUT/pytest_vwarp.txt" 2>&1
tail -3 "$OUT/pytest_vwarp.txt"
T=DEEPINFER_ATTN_THREADS_LONG
timeout 300 python3 -m engine.bench.decode_ab --shapes 3b:4 --rounds 2 --long 4096,16384 --commit "${1:-unknown}" \
    --variants "vw0:DEEPINFER_KERNEL_DEFINES=-DATT_VWARP=0,t256:,t128:$T=128,t64:$T=64,t128q:$T=128+DEEPINFER_GEMV_PLAN=4:store:2560:2048=8x1x2" \
    --out "$OUT/decode_ab_vwarp.json" > "$OUT/decode_ab_vwarp.log" 2>&1
grep "^|" "$OUT/decode_ab_vwarp.log" | cut -c1-400
tail -3 "$OUT/decode_ab_vwarp.log"
DEEPINFER_ATTN_THREADS_LONG=128 timeout 60 python3 -m engine.bench.gemv_phases --shapes 3b:4 --cached 16000 \
    --commit "${1:-unknown}" --out "$OUT/gemv_phases_16k_t128.json" > "$OUT/gemv_phases_16k_t128.log" 2>&1
grep -E "^\| (qkv|attention|merge|o|gate_up) " "$OUT/gemv_phases_16k_t128.log"
