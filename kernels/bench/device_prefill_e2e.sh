#!/usr/bin/env bash
# Device run for the engine's prefill path (engine/model/gpu_model.py fused kernels + per-bucket CUDA graphs,
# engine/model/gpu_prefill_graph.py), end to end. Usage, from the repo root on the GPU machine:
#   bash kernels/bench/device_prefill_e2e.sh <git sha>      (writes under $OUT, default /tmp/out)
# Steps, each under `timeout`: 1) GPU tests (graph == eager, chunked == at once, decode runner vs CPU),
# 2) a random 3B W4 checkpoint, 3) deepinfer bench (productivity, prefill, combined, decode),
# 4) model-level prefill times per mode (graph / fused eager / torch eager) and the capture checks.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export DEEPINFER_GIT_COMMIT=${1:-unknown} PYTHONUNBUFFERED=1 DEEPINFER_MODELS=/tmp/dimodels
mkdir -p "$DEEPINFER_MODELS"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

echo "== 1. GPU tests"
timeout 90 python3 -m pytest -q -m gpu tests/test_gpu_prefill_graph.py tests/test_gpu_decode.py -x \
    >"$OUT/pytest.log" 2>&1
echo "pytest rc=$?"
tail -n 25 "$OUT/pytest.log"

echo "== 2. random 3B W4 checkpoint"
timeout 60 python3 -m engine make-random --shape 3b --scheme w4 --out /tmp/r3b 2>&1 | tail -n 3

echo "== 3. bench"
timeout 100 python3 -m engine.bench.cli --model /tmp/r3b --device cuda --quiet \
    --runs productivity,prefill,combined,decode \
    --out "$OUT/bench_gpu_3b_prefill_graph.json" --report "$OUT/bench_gpu_3b_prefill_graph.md" \
    >"$OUT/bench.log" 2>&1
echo "bench rc=$?"
tail -n 15 "$OUT/bench.log"
grep -E "^\| deepinfer" "$OUT/bench_gpu_3b_prefill_graph.md" 2>/dev/null | head -n 12

echo "== 4. prefill per mode (model level, median of 3 after 1 warm-up, ms)"
timeout 60 python3 - "$OUT/prefill_modes_3b.json" <<'EOF'
import json, sys, time
import torch
from engine.config import EngineConfig
from engine.runtime.gpu_runner import GPURunner
from engine.formats.spec import load_spec

spec = load_spec("/tmp/r3b")
m = GPURunner(spec, EngineConfig(model="/tmp/r3b", device="cuda", max_context=4096, max_batch=1)).model
g = torch.Generator().manual_seed(0)
ms = {}
for n in (48, 512, 1024, 2048):
    ids = torch.randint(0, spec.config.vocab_size, (n,), generator=g).tolist()
    for mode in ("graph", "fused", "torch"):
        m.prefill_mode = mode
        ts = []
        for _ in range(4):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            int(m.prefill(ids, 0, 0).argmax())
            ts.append((time.perf_counter() - t0) * 1e3)
        ms[f"{mode}_{n}"] = round(sorted(ts[1:])[1], 3)
res = {"ms": ms, "checks": {str(k): v for k, v in m.prefill_graphs.checks.items()},
       "disabled": m.prefill_graphs.disabled, "memory": m.memory()}
print(json.dumps(res))
json.dump(res, open(sys.argv[1], "w"), indent=1)
EOF
echo "modes rc=$?"
ls -la "$OUT"
