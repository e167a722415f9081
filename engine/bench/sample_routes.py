"""Which route the GPU's draw (kernels/decode_sample.cu) takes on a real model's rows, counted on the CPU: the
gathered prefix (<= 4,096 keys: the fast path) or the row-wide search, per sampling setting. The rows are the real
model's next-token logits along its own answers to a few prompts (all-position logits of prompt + greedy answer).

    python -m engine.bench.sample_routes --model qwen2.5-coder-0.5b --out FILE
"""
from __future__ import annotations

import argparse
import sys

import torch

from engine.bench.envinfo import emit_json, environment
from engine.config import EngineConfig
from engine.runtime.llm import LLM
from engine.runtime.sampling import SamplingParams
from kernels.sample_reference import draw_target, masses, top_p_need

D = [1.0, 2.0, 3.0, 5.0, 7.0, 10.0, 14.0, 20.0]  # decode_sample.cu SMP_D
CAP = 4096
SETTINGS = [("chat t0.7 p0.9", 0.7, 0, 0.9), ("t1.0 p1.0 (temperature only)", 1.0, 0, 1.0),
            ("ollama t0.8 k40 p0.9", 0.8, 40, 0.9), ("tray summary t0.3", 0.3, 0, 1.0)]
PROMPTS = ["Rewrite this more politely: We have reviewed your report and the numbers are wrong, fix them by Friday.",
           "把下面这句话翻译成英文：我们下周一上午十点在三楼会议室讨论新产品的发布计划。",
           "Write a short story opening about a lighthouse keeper.",
           "List three ideas for a weekend trip near a big city."]


def route(x: torch.Tensor, t: float, k: int, p: float, u: float) -> str:
    """smp_choose on one row: 'fast' if a threshold prefix holds every crossing with <= CAP keys, else 'search'."""
    inv = torch.full((1,), 1.0 / t, dtype=torch.float32)
    v = x * inv
    d = v - v.max()
    M = masses(v)
    Z = int(M.sum())
    kk = k if 0 < k < x.numel() else 0
    need = top_p_need(p, Z) if p < 1.0 else draw_target(u, Z) + 1
    for Dj in D:
        sel = d >= -Dj
        c, m = int(sel.sum()), int(M[sel].sum())
        if c > CAP:
            return "search"
        if (c >= kk or m == Z) if kk else m >= need:
            return "fast"
    return "search"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    llm = LLM(EngineConfig(model=a.model, device="cpu", max_context=1024, max_batch=1, cpu_weights="int4"))
    rows = []
    for prompt in PROMPTS:
        ids = list(llm.encode_chat([{"role": "user", "content": prompt}]))
        ans = llm.complete(ids, SamplingParams(max_tokens=a.tokens, temperature=0.0)).token_ids
        rows.append(llm.runner.logits(ids + list(ans))[len(ids) - 1:].float())
    x = torch.cat(rows)
    g = torch.Generator().manual_seed(1)
    us = torch.rand(x.shape[0], generator=g, dtype=torch.float64).tolist()
    table = {}
    for label, t, k, p in SETTINGS:
        n = sum(route(x[i], t, k, p, us[i]) == "fast" for i in range(x.shape[0]))
        table[label] = {"rows": x.shape[0], "fast": n, "search": x.shape[0] - n}
    print("| setting | rows | gathered prefix (fast) | row-wide search |\n|---|---|---|---|")
    for lbl, r in table.items():
        print(f"| {lbl} | {r['rows']} | {r['fast']} | {r['search']} |")
    emit_json({"what": "decode_sample.cu's route per real-model row (CPU count of smp_choose)", "env": environment(argv),
               "model": a.model, "routes": table}, a.out or None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
