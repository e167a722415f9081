"""CPU linears at few rows: F.linear (x @ W.T) against kernels.ops_reference.linear (W @ x.T below FEW_ROWS rows),
on the 0.5B's shapes, fp32, this machine's threads. Prints a table; --out writes JSON.

    python -m engine.bench.cpu_linear --out docs/results/cpu_small_batch_linear.json
"""
from __future__ import annotations

import argparse
import json
import platform
import time

import torch
import torch.nn.functional as F

from kernels.ops_reference import linear

SHAPES = {"gate_up 9728x896": (9728, 896), "down 896x4864": (896, 4864), "tied head 151936x896": (151936, 896)}


def ms(fn, runs: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(runs):
        fn()
    return (time.perf_counter() - t) / runs * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    rows = []
    for name, (N, K) in SHAPES.items():
        w = torch.randn(N, K)
        for M in map(int, a.rows.split(",")):
            x = torch.randn(M, K)
            f, g = ms(lambda: F.linear(x, w), a.runs), ms(lambda: linear(x, w), a.runs)
            rows.append({"shape": name, "rows": M, "F.linear_ms": round(f, 2), "linear_ms": round(g, 2),
                         "speedup": round(f / g, 2), "max_abs_diff": float((F.linear(x, w) - linear(x, w)).abs().max())})
            print(f"{name:22s} {M:3d} rows  F.linear {f:8.2f} ms  linear {g:8.2f} ms  {f / g:5.2f}x")
    if a.out:
        head = {"machine": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "command": "python -m engine.bench.cpu_linear " + " ".join(argv or [])}
        with open(a.out, "w") as fh:
            json.dump({**head, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
