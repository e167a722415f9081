#!/bin/bash
# On the device (wheels installed, PYTHONPATH set): a user's Ollama-format model, timed under kernel variants. Writes a
# random 3B Q4_K_M GGUF (llama.cpp's per-tensor types: Q4_K / Q6_K, repacked exactly at load), then `deepinfer bench
# --runs decode` once per variant in its own process (DEEPINFER_KERNEL_DEFINES), in the order given (repeat a name's
# defines under another name for A B A B; a variant may set variables too: "q8:DEEPINFER_DECODE_Q8=1"). Writes $OUT/bench_gguf_<SHAPE>_<name>.json and prints tg128 tok/s.
#   VARIANTS="ld0a:-DGEMV_LDHINT=0,ld5a:,ld0b:-DGEMV_LDHINT=0,ld5b:" SHAPE=3b bash engine/bench/device_gguf_ab.sh
set -u
shape=${SHAPE:-3b}
timeout 120 python3 -m engine.cli.main make-random --shape "$shape" --format gguf --out "/tmp/r_$shape.gguf" \
    > "$OUT/gguf_make_$shape.log" 2>&1 || { tail -5 "$OUT/gguf_make_$shape.log"; exit 1; }
IFS=',' read -ra vs <<< "${VARIANTS:-ld0a:-DGEMV_LDHINT=0,ld5a:,ld0b:-DGEMV_LDHINT=0,ld5b:}"
for v in "${vs[@]}"; do
  name=${v%%:*}; spec=${v#*:}
  # the spec: -D defines and NAME=VALUE variables joined by '+' (e.g. "q8:DEEPINFER_DECODE_Q8=1")
  defs=""; envs=()
  IFS='+' read -ra parts <<< "$spec"
  for p in "${parts[@]}"; do
    case "$p" in -D*) defs="$defs $p" ;; *=*) envs+=("$p") ;; esac
  done
  env "${envs[@]}" DEEPINFER_KERNEL_DEFINES="${defs# }" timeout 150 python3 -m engine.cli.main bench \
      --model "/tmp/r_$shape.gguf" --device cuda --quiet --runs decode --out "$OUT/bench_gguf_${shape}_$name.json" \
      > "$OUT/bench_gguf_$name.log" 2>&1
  python3 -m engine.bench.tg128 "$OUT/bench_gguf_${shape}_$name.json" "$name" "$spec"
done
