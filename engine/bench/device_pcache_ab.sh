#!/bin/bash
# On the device (wheels installed, PYTHONPATH set): does the prefix KV cache cost prefill speed? A random 3B W4
# checkpoint, `deepinfer bench --runs prefill` with the engine's default cache and with --prefix-cache-mb 0,
# A B A B in separate processes. Writes $OUT/bench_pcache_<name>.json and prints TTFT-based tok/s per length.
set -u
[ -d /tmp/r3b ] || timeout 200 python3 -m engine.cli.main make-random --shape 3b --scheme w4 --out /tmp/r3b > /dev/null 2>&1
for v in on_a: off_a:0 on_b: off_b:0; do
  name=${v%%:*}; mb=${v#*:}
  timeout 150 python3 -m engine.cli.main bench --model /tmp/r3b --device cuda --quiet --runs prefill \
      --prefill-lengths 16,48,512,2048 ${mb:+--prefix-cache-mb $mb} --out "$OUT/bench_pcache_$name.json" \
      > "$OUT/bench_pcache_$name.log" 2>&1
  python3 - "$OUT/bench_pcache_$name.json" "$name" <<'PY'
import json, sys
try:
    pts = json.load(open(sys.argv[1]))["targets"][0]["runs"]["prefill"]["points"]
    print(sys.argv[2], " ".join(f"{p['label']} {p['median']['prefill_tps']:.0f}" for p in pts))
except Exception as e:  # noqa: BLE001 - a failed run is reported, the next still runs
    print(sys.argv[2], "failed:", e)
PY
done
