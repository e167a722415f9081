"""How long a CPU runner takes to load a model file (no GPU): the weights from the file with copies into the
parameters (as before the session of 2026-12-07, forty-sixth), with the GGUF reader's fresh tensors taken whole
(Qwen2Model.load_weights owned=True, the default), and a second runner of the same file beside the first
(engine/runtime/shared_weights.py: the first one's tensors). Each in its own round, `--rounds` times, medians.

    python -m engine.bench.cpu_load --model qwen2.5-coder-0.5b --out docs/results/cpu_load_0.5b.json
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time

import torch

from engine.config import EngineConfig
from engine.formats.load import load_spec
from engine.formats.spec import expected_weight_names
from engine.model.qwen2 import Qwen2Model
from engine.runtime.cpu_runner import CPURunner


def _weights_only(spec, owned: bool) -> float:
    t0 = time.perf_counter()
    m = Qwen2Model(spec.config, torch.float32)
    m.load_weights(spec.weights(), expected_weight_names(spec.config), owned=owned)
    dt = time.perf_counter() - t0
    del m
    gc.collect()
    return dt


def _runners(spec, model: str) -> tuple[float, float]:
    """(first runner's load, a second runner's beside it), seconds; both dropped after."""
    cfg = EngineConfig(model=model, device="cpu", max_context=512, max_batch=1)
    t0 = time.perf_counter()
    a = CPURunner(spec, cfg)
    t1 = time.perf_counter()
    b = CPURunner(spec, cfg)
    t2 = time.perf_counter()
    same = all(p.data_ptr() == q.data_ptr() for p, q in zip(a.model.parameters(), b.model.parameters()))
    assert same, "the second runner did not take the first one's tensors"
    del a, b
    gc.collect()
    return t1 - t0, t2 - t1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    spec = load_spec(a.model)
    rows: dict[str, list[float]] = {"weights_copied": [], "weights_taken": [], "runner_first": [],
                                    "runner_second_shared": []}
    for _ in range(a.rounds):
        rows["weights_copied"].append(_weights_only(spec, False))
        rows["weights_taken"].append(_weights_only(spec, True))
        first, second = _runners(spec, a.model)
        rows["runner_first"].append(first)
        rows["runner_second_shared"].append(second)
    med = {k: round(statistics.median(v), 3) for k, v in rows.items()}
    res = {"model": a.model, "source": os.path.basename(spec.source), "machine": platform.machine(),
           "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "command": "python -m engine.bench.cpu_load " + " ".join(sys.argv[1:] if argv is None else argv),
           "seconds": {k: [round(x, 3) for x in v] for k, v in rows.items()}, "median_s": med}
    print("| load | median s |\n|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
