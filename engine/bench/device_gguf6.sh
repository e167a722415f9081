#!/bin/bash
# On the device, one call: the 6-bit repack of a GGUF's Q6_K / Q5_K tensors (EngineConfig.gguf_6bit, kernels/pack.py
# W6) checked and timed against the byte layouts. Installs the carried wheels if needed, runs the GGUF-layout GPU
# tests (decode GEMVs + embedding vs references, the Triton dequant / fused / split-K prefill on W6), writes a random
# Q4_K_M GGUF of SHAPE (llama.cpp's types: Q6_K output / attn_v / ffn_down) and runs `deepinfer bench --runs decode`
# on it A B A B in separate processes: bytes, --gguf-6bit, bytes, --gguf-6bit.
# Writes $OUT/pytest_gguf6_<TAG>.txt, $OUT/bench_gguf6_<SHAPE>_<name>.json; prints tg128 tok/s per run.
#   TAG=first SHAPES="3b 7b" bash engine/bench/device_gguf6.sh    (carry .whl; NOCHECK=1 skips the tests)
set -u
tag=${TAG:-run}
[ -d /tmp/site/fastapi ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
if [ -z "${NOCHECK:-}" ]; then
  timeout ${PT:-240} python3 -m pytest -q -m gpu -p no:cacheprovider \
      tests/test_gpu_decode.py::test_gguf_layout_kernels_match_references \
      "tests/test_gpu_lossless.py::test_triton_dequant_and_fused_read_every_layout" \
      tests/test_gpu_prefill.py > "$OUT/pytest_gguf6_$tag.txt" 2>&1
  tail -3 "$OUT/pytest_gguf6_$tag.txt"
fi
for shape in ${SHAPES:-3b}; do
  timeout 150 python3 -m engine.cli.main make-random --shape "$shape" --format gguf --out "/tmp/r_$shape.gguf" \
      > "$OUT/gguf6_make_$shape.log" 2>&1 || { tail -5 "$OUT/gguf6_make_$shape.log"; continue; }
  for v in bytes_a: six_a:--gguf-6bit bytes_b: six_b:--gguf-6bit; do
    name=${v%%:*}; flag=${v#*:}
    timeout 180 python3 -m engine.cli.main bench --model "/tmp/r_$shape.gguf" $flag --device cuda --quiet \
        --runs decode --out "$OUT/bench_gguf6_${shape}_$name.json" > "$OUT/bench_gguf6_${shape}_$name.log" 2>&1
    python3 -m engine.bench.tg128 "$OUT/bench_gguf6_${shape}_$name.json" "$shape $name"
  done
done
