#!/bin/bash
# On the device, after the real 0.5B's parts were carried into /tmp/parts/q05_* over earlier calls: join it, then
# the hot-path bench (speculation on the tray's templates, with and without bursts) and the GPU tests with the real
# model present (the split-major A/B on random weights is engine/bench/device_ab.sh). Everything lands in $OUT:
#   hotpath_gpu_0.5b.json (engine/bench/hotpath.py --parts spec,noburst), pytest.txt, *.log
set -u
export DEEPINFER_MODELS=/tmp/store
bash engine/bench/device_join.sh qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
    1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 q05_ || exit 1
python3 -m engine.bench.hotpath --device cuda --texts 10 --parts spec,noburst --out "$OUT/hotpath_gpu_0.5b.json" \
    2> "$OUT/hotpath.log"
grep "^speculative" "$OUT/hotpath.log" | cut -c1-400
python3 -m pytest -q -m gpu tests > "$OUT/pytest.txt" 2>&1
tail -3 "$OUT/pytest.txt"
