#!/bin/bash
# On the device, one call: how a GGUF's blocks are repacked (EngineConfig.gguf_pack: bytes, 6bit, kquant;
# kernels/pack.py W6 and KQ) checked and timed. Installs the carried wheels if needed, runs the GGUF-layout GPU tests
# (decode GEMVs + embedding vs references for every layout and KQ form, the Triton dequant / fused / split-K prefill),
# writes a random Q4_K_M GGUF of each SHAPE (llama.cpp's types: Q6_K output / attn_v / ffn_down, Q4_K elsewhere) and
# runs `deepinfer bench --runs decode` on it once per mode in its own process, twice over: A B C A B C.
# Writes $OUT/pytest_gguf_pack_<TAG>.txt, $OUT/bench_gguf_pack_<SHAPE>_<mode>_<round>.json; prints tg128 tok/s per run.
#   TAG=first [SHAPES=3b] [GGUF_TYPE=q4_k_m|q4_0|q8_0] bash engine/bench/device_gguf_pack.sh   (carry .whl; NOCHECK=1
#   skips the tests; a 3B takes ~6 minutes with the tests: one shape per call; q4_0 / q8_0: every matrix that type, so
#   kquant runs their SYM forms, kernels/pack.py)
set -u
tag=${TAG:-run}
[ -d /tmp/site/fastapi ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
if [ -z "${NOCHECK:-}" ]; then
  timeout ${PT:-240} python3 -m pytest -q -m gpu -p no:cacheprovider \
      tests/test_gpu_decode.py::test_gguf_layout_kernels_match_references \
      "tests/test_gpu_lossless.py::test_triton_dequant_and_fused_read_every_layout" \
      tests/test_gpu_lossless.py::test_the_packings_pass_their_load_check_on_this_gpu \
      tests/test_gpu_prefill.py > "$OUT/pytest_gguf_pack_$tag.txt" 2>&1
  tail -3 "$OUT/pytest_gguf_pack_$tag.txt"
fi
for shape in ${SHAPES:-3b}; do
  ty=${GGUF_TYPE:-q4_k_m}
  [ "$ty" = q4_k_m ] || shape_tag="${shape}_$ty"
  timeout 150 python3 -m engine.cli.main make-random --shape "$shape" --format gguf --gguf-type "$ty" \
      --out "/tmp/r_${shape_tag:-$shape}.gguf" > "$OUT/gguf_pack_make_${shape_tag:-$shape}.log" 2>&1 || {
    tail -5 "$OUT/gguf_pack_make_${shape_tag:-$shape}.log"; continue; }
  for round in a b; do
    for mode in ${MODES:-bytes 6bit kquant}; do
      f="$OUT/bench_gguf_pack_${shape_tag:-$shape}_${mode}_$round"
      timeout 180 python3 -m engine.cli.main bench --model "/tmp/r_${shape_tag:-$shape}.gguf" --gguf-pack "$mode" \
          --device cuda --quiet --runs decode --out "$f.json" > "$f.log" 2>&1
      python3 -m engine.bench.tg128 "$f.json" "${shape_tag:-$shape} $mode $round"
    done
  done
done
