"""Why the CPU test suite takes what it takes: this machine's fp32 GEMM and GEMV rates and the real 0.5B's prefill
and decode times, which bound the suite (its slowest tests are the real model's forward passes). Prints a table;
--out writes JSON (docs/results/cpu_suite_profile.json).

    python -m engine.bench.cpu_suite_profile --out docs/results/cpu_suite_profile.json
"""
from __future__ import annotations

import argparse
import os
import platform
import time

import torch

from engine.bench.envinfo import emit_json


def best(fn, runs: int = 3) -> float:
    fn()
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    a = ap.parse_args(argv)
    res: dict = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                 "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                 "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "command": "python -m engine.bench.cpu_suite_profile" + (f" --out {a.out}" if a.out else "")}
    g = torch.Generator().manual_seed(0)
    mm = {}
    for n, k, m in [(2048, 2048, 2048), (512, 896, 4864), (512, 4864, 896)]:
        x, w = torch.randn(n, k, generator=g), torch.randn(k, m, generator=g)
        mm[f"{n}x{k}x{m}"] = 2 * n * k * m / best(lambda: x @ w) / 1e9
    res["fp32_gemm_gflops"] = mm
    w = torch.randn(4864 * 4, 896, generator=g)
    x = torch.randn(1, 896, generator=g)
    res["fp32_gemv_gbps"] = w.numel() * 4 / best(lambda: torch.nn.functional.linear(x, w)) / 1e9
    # the real 0.5B, as the test session loads it (CPU, fp32 weights dequantized at load)
    from engine.config import EngineConfig
    from engine.formats.load import load_spec
    from engine.hub import store
    from engine.runtime.llm import LLM
    from engine.runtime.sampling import SamplingParams
    from engine.runtime.sequence import Sequence

    store.pull(a.model, quiet=True)
    spec = load_spec(a.model)
    llm = LLM(EngineConfig(model=a.model, device="cpu", max_context=2048, max_batch=4), spec=spec)
    r = llm.runner
    seq = Sequence(list(range(1000, 3000)), SamplingParams(max_tokens=1), spec.tokenizer)
    r.allocate(seq)
    try:
        res["prefill_s"] = {str(n): best(lambda n=n: r._prefill_range(seq, 0, n), 1) for n in (256, 1024, 1900)}
    finally:
        r.release(seq)
    t: dict = {}
    for _ in llm.stream("Count from one to one hundred in words.", SamplingParams(max_tokens=32), t):
        pass
    res["decode_tok_s"] = (t["completion_tokens"] - 1) / t["decode_s"]  # after the first token (prefill's)
    res["weights_bytes"] = r.memory()["weights_bytes"]
    print("| what | value |\n|---|---|")
    for k, v in res.items():
        print(f"| {k} | {v} |")
    if a.out:
        emit_json(res, a.out)


if __name__ == "__main__":
    main()
