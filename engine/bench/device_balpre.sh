#!/bin/bash
# The next call after the thirty-first session (not yet run): do the balanced gate_up's early loads delay o_proj?
# With the 3B's o in 64 blocks ~200 of gate_up's 264 blocks are resident before o starts, and o's wait returned 2.0-2.2
# us after the attention's last block (gemv_phases_o812_h100.json) against 0.96 with o in 128 blocks or on the 7B / 14B
# (few early gate_up blocks). GEMV_BAL_PRE (decode_gemv.cu): units a gate_up warp loads before its PDL wait, 2 (the
# default) / 1 / 0. And the 7B's o in 56 blocks of 64 rows (o7b412; it applies to the 7B only): its 224 blocks sit two
# per SM on 111 SMs, so 224 of gate_up's 264 start late (skew 4.2 us of 30.4, gemv_phases_late_h100.json); 112 blocks
# were level (decode_ab_o812_h100.json). One call, wheels carried (carry [".whl"]):
#   bash engine/bench/device_balpre.sh COMMIT  -> $OUT/pytest_balpre.txt, decode_ab_balpre.json,
#   gemv_phases_balpre{1,0}.json
set -u
. engine/bench/device_env.sh
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -k "loads_after_the_wait" tests/test_gpu_decode.py \
    > "$OUT/pytest_balpre.txt" 2>&1  # the knob's bits: equal to the default build's
tail -1 "$OUT/pytest_balpre.txt"
K=DEEPINFER_KERNEL_DEFINES
timeout 360 python3 -m engine.bench.decode_ab --shapes 3b:4,3b:3,7b:4,14b:4 --rounds 2 --long 16384 --commit "${1:-unknown}" \
    --variants "base:,pre1:$K=-DGEMV_BAL_PRE=1,pre0:$K=-DGEMV_BAL_PRE=0,o7b412:DEEPINFER_GEMV_PLAN=4:resid:3584:3584=4x1x2" \
    --out "$OUT/decode_ab_balpre.json" > "$OUT/decode_ab_balpre.log" 2>&1
grep "^|" "$OUT/decode_ab_balpre.log" | cut -c1-330
tail -2 "$OUT/decode_ab_balpre.log"
for v in 1 0; do
  DEEPINFER_KERNEL_DEFINES="-DGEMV_BAL_PRE=$v" timeout 60 python3 -m engine.bench.gemv_phases --shapes 3b:4 \
      --commit "${1:-unknown}" --out "$OUT/gemv_phases_balpre$v.json" > "$OUT/gemv_phases_balpre$v.log" 2>&1
  grep -E "^\| (attention|o|gate_up) " "$OUT/gemv_phases_balpre$v.log"
done
