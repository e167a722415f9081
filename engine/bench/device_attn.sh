#!/bin/bash
# On the device (wheels installed, PYTHONPATH set): the short-context attention mode (decode_attn.cu ATT_SHORT)
# checked and timed. GPU tests (attention vs its reference, verify rows = one-token steps), attn_bench with the split
# schedule (-DATT_SHORT=0) and a longer threshold beside the default, then decode_ab: split vs short on whole steps.
# Writes $OUT/pytest_attn.txt, $OUT/gpu_attn_short_h200.json, $OUT/decode_ab_attn_short_h200.json and logs.
#   bash engine/bench/device_attn.sh COMMIT
set -u
[ -z "${NOTESTS:-}" ] && { timeout 240 python3 -m pytest -q -m gpu ${TESTS:-tests} > "$OUT/pytest_attn.txt" 2>&1;
                           grep -E "BAD|FAIL|Error" "$OUT/pytest_attn.txt" | head -20; tail -2 "$OUT/pytest_attn.txt"; }
timeout 200 python3 -m engine.bench.attn_bench --out "$OUT/gpu_attn_short_h200.json" --commit "${1:-unknown}" \
    --variants "${ATTV:-split:-DATT_SHORT=0,short1024:-DATT_SHORT=1024}" --lens "${LENS:-64,128,256,512,1024,4096}" \
    > "$OUT/attn_short.log" 2>&1
grep -E "^\||failed|Error" "$OUT/attn_short.log" | tail -16
timeout 200 python3 -m engine.bench.decode_ab --variants "${VARIANTS:-split:DEEPINFER_KERNEL_DEFINES=-DATT_SHORT=0,short:}" \
    --shapes "${SHAPES:-3b:4,7b:4,0.5b:4}" --rounds "${ROUNDS:-3}" --commit "${1:-unknown}" \
    --out "$OUT/decode_ab_attn_short_h200.json" > "$OUT/decode_ab_attn_short.log" 2>&1
grep -E "^\||Error|error" "$OUT/decode_ab_attn_short.log" | tail -8
