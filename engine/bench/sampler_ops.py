"""Where a sampled token's draw spends its GPU time (device): torch ops on one logits row of Qwen2.5's vocab
(151,936) and the draw's kernels (DecodeKernels.sample_rows) on 1 / 4 / 8 rows of three kinds, each timed in a CUDA
graph of 20 copies (us per call).

    python -m engine.bench.sampler_ops --out $OUT/sampler_ops.json
"""
from __future__ import annotations

import argparse
import sys

import torch

from engine.bench.envinfo import emit_json, environment
from kernels.checks import graph_time

V = 151936


def graph_us(fn, reps: int = 20, rounds: int = 5) -> float:
    """us per call of fn: reps calls captured in one graph (kernels.checks.graph_time), median of `rounds` replays."""
    return graph_time([fn] * reps, rounds) * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    x = torch.randn(V, device="cuda") * 3
    u = torch.tensor([0.37], dtype=torch.float64, device="cuda")
    xs = x / 0.7
    vals, idx = torch.sort(xs, descending=True, stable=True)
    probs = torch.softmax(vals, -1)
    ops = {
        "div": lambda: x / 0.7,
        "sort stable desc": lambda: torch.sort(xs, descending=True, stable=True),
        "sort desc (not stable)": lambda: torch.sort(xs, descending=True),
        "topk 40": lambda: torch.topk(xs, 40),
        "topk 40 sorted=False": lambda: torch.topk(xs, 40, sorted=False),
        "softmax": lambda: torch.softmax(vals, -1),
        "exp(vals - vals[0]) / sum": lambda: (lambda e: e / e.sum())(torch.exp(vals - vals[:1])),
        "cumsum fp32": lambda: torch.cumsum(probs, 0),
        "cumsum fp64 (with .double())": lambda: torch.cumsum(probs.double(), 0),
        "top_p keep": lambda: (torch.cumsum(probs, 0) - probs) < 0.9,
        "searchsorted": lambda: torch.searchsorted(probs, u.float(), right=True),
        "max": lambda: torch.max(xs),
        "argmax": lambda: torch.argmax(xs),
    }
    rows = {k: round(graph_us(f), 2) for k, f in ops.items()}
    from kernels.decode_kernels import DecodeKernels  # the draw's kernels (chain_sampler.py), no sort
    kn = DecodeKernels.get("cuda")
    g = torch.Generator(device="cuda").manual_seed(1)

    def row(kind: str, B: int) -> torch.Tensor:
        r = torch.randn(B, V, device="cuda", generator=g)
        if kind == "randn*3":
            return (r * 3).contiguous()
        if kind == "real-like":  # a bulk near 0 and a dozen strong candidates (the route real rows take)
            r = r * 2.5
            r[:, torch.randint(0, V, (12,), device="cuda", generator=g)] += torch.linspace(8, 18, 12, device="cuda")
            return r.contiguous()
        return (r * 0.05).contiguous()  # flat: the nucleus past the 4,096 gathered keys (the row-wide search)

    at = torch.zeros(1, dtype=torch.int32, device="cuda")
    for B in (1, 4, 8):
        ub = torch.full((B,), 0.37, dtype=torch.float64, device="cuda")
        keys = torch.zeros(B, dtype=torch.int64, device="cuda")
        for kind in ("real-like", "randn*3", "flat"):
            xs8 = row(kind, B)
            if kind == "randn*3":
                rows[f"sort [{B}, V] (the draw before: + 49-52 us)"] = round(
                    graph_us(lambda: torch.sort(xs8, dim=-1, descending=True, stable=True)), 2)
            for label, t, k, p in [("t0.7 p0.9", 0.7, 0, 0.9), ("t1.0 p1.0", 1.0, 0, 1.0),
                                   ("t0.8 k40 p0.9", 0.8, 40, 0.9)]:
                prm = torch.tensor([[t, k, p]] * B, dtype=torch.float64, device="cuda")
                rows[f"sample_rows, {B} rows {kind} {label}"] = round(
                    graph_us(lambda: kn.sample_rows(xs8, prm, ub, at, keys, B)), 2)
    print("| op | us |\n|---|---|")
    for k, v in rows.items():
        print(f"| {k} | {v} |")
    emit_json({"what": "GPU us per op of the sampler on one 151,936-wide row (20 copies per CUDA graph, median of 5)",
               "env": environment(argv), "us": rows}, a.out or None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
