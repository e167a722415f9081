#!/bin/bash
# On the device, the real 0.5B's parts carried into /tmp/parts/q05_* over earlier calls: join it, then the hot-path
# speculation bench with the heads drafting over the whole vocabulary (A) and over the draft vocabulary (B,
# engine/draft/vocab.py), same lease, twice each in the order A B B A; then the vocabulary's coverage of the model's own outputs
# on 40 training texts, and the speculation / heads GPU tests.
# Everything lands in $OUT: hotpath_vocab_{off,on}_{1,2}.json, draft_vocab_coverage_0.5b.json, *.log, pytest.txt
set -u
export DEEPINFER_MODELS=/tmp/store
bash engine/bench/device_join.sh qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
    1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 q05_ || exit 1
for run in off:1 on:1 on:2 off:2; do
    v=${run%%:*}; out=hotpath_vocab_${v}_${run##*:}
    python3 -m engine.bench.hotpath --device cuda --texts 10 --parts spec --draft-vocab "$v" --out "$OUT/$out.json" \
        2> "$OUT/$out.log"
    echo "== $out"; grep "^speculative translate\|^speculative quick" "$OUT/$out.log" | cut -c1-260
done
python3 -m engine.draft.vocab --coverage --texts 40 --device cuda --report "$OUT/draft_vocab_coverage_0.5b.json" \
    2> "$OUT/coverage.log" | cut -c1-400
python3 -m pytest -q -m gpu tests/test_gpu_draft_heads.py tests/test_spec_verify.py > "$OUT/pytest.txt" 2>&1
tail -2 "$OUT/pytest.txt"
