#!/bin/bash
# On the device: each decode GEMV alone (engine.bench.l2_hot, cold = the step's case) on the 14B and 7B shapes, W4,
# for register-pipeline depths (GEMV_NST1/2: groups in flight per warp) and one block per SM (GEMV_MINB2=1, room
# for deeper pipelines): does a large weight's steady state gain from more bytes in flight?   device_nst.sh COMMIT
set -u
for v in "base:" "nst3:-DGEMV_NST1=3 -DGEMV_NST2=3" "nst4:-DGEMV_NST1=4 -DGEMV_NST2=4" \
         "minb1_nst4:-DGEMV_MINB2=1 -DGEMV_NST1=4 -DGEMV_NST2=4"; do
  name=${v%%:*}
  DEEPINFER_KERNEL_DEFINES="${v#*:}" python3 -m engine.bench.l2_hot --shapes 14b:4,7b:4 --commit "$1" \
    --out "$OUT/l2_hot_nst_${name}_h200.json" > "$OUT/l2_hot_nst_${name}.log" 2>&1
  echo "== $name (${v#*:})"; tail -12 "$OUT/l2_hot_nst_${name}.log"
done
