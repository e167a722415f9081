#!/bin/bash
# The bound on a short-context attention that leaves room for o_proj's blocks (#16): -DATT_HP_ONLY=1 compiles the
# plain attention entries without the split schedule (a timing probe: wrong above ATT_SHORT rows; the bench's steps
# stay below) at 128 registers instead of 245, so a GEMV block of 128 registers fits beside each attention block.
# One call, wheels carried (carry [".whl"]):
#   bash engine/bench/device_hponly.sh COMMIT  -> $OUT/decode_ab_hponly.json, gemv_phases_14b_{base,hponly}.json
set -u
. engine/bench/device_env.sh
timeout 330 python3 -m engine.bench.decode_ab --shapes 3b:4,7b:4,14b:4 --rounds 3 --commit "${1:-unknown}" \
    --variants "base:,hponly:DEEPINFER_KERNEL_DEFINES=-DATT_HP_ONLY=1" \
    --out "$OUT/decode_ab_hponly.json" > "$OUT/decode_ab_hponly.log" 2>&1
grep "^|" "$OUT/decode_ab_hponly.log" | cut -c1-250
tail -2 "$OUT/decode_ab_hponly.log"
for v in base hponly; do
  d=""; [ $v = hponly ] && d="-DATT_HP_ONLY=1"
  DEEPINFER_KERNEL_DEFINES="$d" timeout 90 python3 -m engine.bench.gemv_phases --shapes 14b:4,3b:4 \
      --commit "${1:-unknown}" --out "$OUT/gemv_phases_$v.json" > "$OUT/gemv_phases_$v.log" 2>&1
  echo "== $v"; grep -E "^\| " "$OUT/gemv_phases_$v.log" | head -30
done
