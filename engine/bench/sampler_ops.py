"""Where a sampled token's draw spends its GPU time (device): each op of sampling.pick_index on one logits row of
Qwen2.5's vocab (151,936), timed alone in a CUDA graph of 20 copies (us per op), and the whole draw per setting.

    python -m engine.bench.sampler_ops --out $OUT/sampler_ops.json
"""
from __future__ import annotations

import argparse
import sys

import torch

from engine.bench.envinfo import emit_json, environment
from kernels.checks import graph_time
from engine.runtime.sampling import SamplingParams, pick_index

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
    for label, t, k, p in [("t0.7 p0.9", 0.7, 0, 0.9), ("t0.3 p1.0", 0.3, 0, 1.0), ("t0.8 k40 p0.9", 0.8, 40, 0.9)]:
        sp = SamplingParams(temperature=t, top_k=k, top_p=p)
        rows["pick_index " + label] = round(graph_us(lambda: pick_index(x, sp, u)), 2)
    from kernels.decode_kernels import DecodeKernels  # the sampling kernel after one sort (chain_sampler.py)
    kn = DecodeKernels.get("cuda")
    for B in (1, 4, 8):
        xs8 = (torch.randn(B, V, device="cuda") * 3).contiguous()
        prm = torch.tensor([[0.7, 0, 0.9]] * B, dtype=torch.float64, device="cuda")
        ub = torch.full((B,), 0.37, dtype=torch.float64, device="cuda")
        at = torch.zeros(1, dtype=torch.int32, device="cuda")
        keys = torch.zeros(B, dtype=torch.int64, device="cuda")
        svals, sidx = torch.sort(xs8, dim=-1, descending=True, stable=True)
        rows[f"sort [{B}, V]"] = round(graph_us(lambda: torch.sort(xs8, dim=-1, descending=True, stable=True)), 2)
        rows[f"sample_sorted kernel, {B} rows (t0.7 p0.9)"] = round(
            graph_us(lambda: kn.sample_sorted(svals, sidx, prm, ub, at, keys, B)), 2)
        rows[f"sort + sample_sorted, {B} rows"] = round(graph_us(lambda: kn.sample_sorted(
            *torch.sort(xs8, dim=-1, descending=True, stable=True), prm, ub, at, keys, B)), 2)
    print("| op | us |\n|---|---|")
    for k, v in rows.items():
        print(f"| {k} | {v} |")
    emit_json({"what": "GPU us per op of the sampler on one 151,936-wide row (20 copies per CUDA graph, median of 5)",
               "env": environment(argv), "us": rows}, a.out or None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
