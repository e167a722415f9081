#!/bin/bash
# One device call for #16's 16k ratio: the merge launch's variants timed in whole steps at 16k cached (decode_ab, as
# device_merge.sh), the fastest at 3B + 7B 16k (sum of median replay ms) picked, then with its defines: every GPU test
# (the merge's bits against the in-kernel merge among them) and the bench's decode run (every #16 row).
#   bash engine/bench/device_merge_pick.sh COMMIT     (carry .whl; SHAPES, VARIANTS, TESTS narrow it)
# Writes $OUT/decode_ab_merge.json, $OUT/merge_pick.txt, $OUT/pytest_gpu_merge.txt, $OUT/gpu_decode.json and logs.
set -u
. engine/bench/device_env.sh
K=DEEPINFER_KERNEL_DEFINES
V="base:,p8:$K=-DATT_MERGE_P=8,d32p32:$K=-DATT_MERGE_P=32 -DATT_MERGE_DB=32,d32p16:$K=-DATT_MERGE_P=16 -DATT_MERGE_DB=32"
timeout 200 python3 -m engine.bench.decode_ab --shapes "${SHAPES:-3b:4,7b:4}" --rounds 2 --long 16384 --variants "${VARIANTS:-$V}" \
    --commit "${1:-unknown}" --out "$OUT/decode_ab_merge.json" > "$OUT/decode_ab_merge.log" 2>&1
grep -E "^\||rror|Traceback" "$OUT/decode_ab_merge.log" | cut -c1-400
python3 - "$OUT/decode_ab_merge.json" "${VARIANTS:-$V}" > "$OUT/merge_pick.txt" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["shapes"]
env = {n: e.partition("=")[2] for n, _, e in (v.partition(":") for v in sys.argv[2].split(","))}
t = {n: sum(d[s][n]["long"]["16384"]["median_replay_ms"] for s in d) for n in env}
best = min(t, key=t.get)
print(env[best])
print(best, {n: round(x, 4) for n, x in t.items()}, file=sys.stderr)
PY
export DEEPINFER_KERNEL_DEFINES="$(head -1 "$OUT/merge_pick.txt")"
echo "picked: '$DEEPINFER_KERNEL_DEFINES'"
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider ${TESTS:-tests} > "$OUT/pytest_gpu_merge.txt" 2>&1
tail -2 "$OUT/pytest_gpu_merge.txt"
bash engine/bench/device_decode.sh "${1:-unknown} $DEEPINFER_KERNEL_DEFINES"
