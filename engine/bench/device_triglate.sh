#!/bin/bash
# o_proj's PDL trigger after its own wait (GEMV_TRIG_O_LATE=1, decode_gemv.cu; the default SASS unchanged): gate_up's
# blocks launch only once the attention has ended. Why: GEMV_BAL_PRE=0 (decode_ab_balpre_h100.json) showed that
# gate_up's early loads while the attention still runs cost o ~1 us of wait per layer on the 3B, but moving the loads
# after gate_up's own wait cost gate_up 2.6 us. One call, wheels carried (carry [".whl"]):
#   bash engine/bench/device_triglate.sh COMMIT  -> $OUT/decode_ab_triglate.json, gemv_phases_triglate{0,1}.json
set -u
. engine/bench/device_env.sh
K=DEEPINFER_KERNEL_DEFINES
timeout 300 python3 -m engine.bench.decode_ab --shapes 3b:4,3b:3,7b:4,14b:4 --rounds 2 --long 16384 --commit "${1:-unknown}" \
    --variants "base:,trig1:$K=-DGEMV_TRIG_O_LATE=1" \
    --out "$OUT/decode_ab_triglate.json" > "$OUT/decode_ab_triglate.log" 2>&1
grep "^|" "$OUT/decode_ab_triglate.log" | cut -c1-250
tail -2 "$OUT/decode_ab_triglate.log"
for v in 0 1; do
  DEEPINFER_KERNEL_DEFINES="-DGEMV_TRIG_O_LATE=$v" timeout 60 python3 -m engine.bench.gemv_phases --shapes 3b:4 \
      --commit "${1:-unknown}" --out "$OUT/gemv_phases_triglate$v.json" > "$OUT/gemv_phases_triglate$v.log" 2>&1
  grep -E "^\| (attention|o|gate_up) " "$OUT/gemv_phases_triglate$v.log"
done
