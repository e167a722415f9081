"""Which route the GPU's draw (kernels/decode_sample.cu) takes on a real model's rows, walked on the CPU by
kernels/sample_route.py (which draws the kernels' token): the gathered prefix (<= 4,096 keys: the fast path), the
histogram's bin ranges (a flat row), or the row-wide search (one bin past 4,096 keys), per sampling setting. The
rows are the real model's next-token logits along its own answers to a few prompts (all-position logits of prompt
+ greedy answer); every walk's token is checked against the reference's.

    python -m engine.bench.sample_routes --model qwen2.5-coder-0.5b --out FILE
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter

import torch

from engine.bench.envinfo import emit_json, environment
from engine.config import EngineConfig
from engine.runtime.llm import LLM
from engine.runtime.sampling import SamplingParams
from kernels.decode_kernels import keys_to_ids
from kernels.sample_reference import sample_rows_ref
from kernels.sample_route import pick

SETTINGS = [("chat t0.7 p0.9", 0.7, 0, 0.9), ("t1.0 p1.0 (temperature only)", 1.0, 0, 1.0),
            ("ollama t0.8 k40 p0.9", 0.8, 40, 0.9), ("tray summary t0.3", 0.3, 0, 1.0)]
PROMPTS = ["Rewrite this more politely: We have reviewed your report and the numbers are wrong, fix them by Friday.",
           "把下面这句话翻译成英文：我们下周一上午十点在三楼会议室讨论新产品的发布计划。",
           "Write a short story opening about a lighthouse keeper.",
           "List three ideas for a weekend trip near a big city."]
ROUTES = {"fast": "fast", "hist": "hist", "slow": "search", "slow, keys": "search", "masked": "masked"}


def _reference(x: torch.Tensor, t: float, k: int, p: float, u: float) -> int:
    keys = torch.zeros(1, dtype=torch.int64)
    sample_rows_ref(x[None].contiguous(), torch.tensor([[t, k, p]], dtype=torch.float64),
                    torch.tensor([u], dtype=torch.float64), torch.zeros(1, dtype=torch.int32), keys, 1)
    return keys_to_ids(keys.numpy())[0]


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
        c = Counter()
        for i in range(x.shape[0]):
            tok, r = pick(x[i], t, k, p, us[i])
            assert tok == _reference(x[i], t, k, p, us[i]), (label, i, r)
            c[ROUTES[r]] += 1
        table[label] = {"rows": x.shape[0], **{n: c[n] for n in ("fast", "hist", "search", "masked")}}
    print("| setting | rows | gathered prefix (fast) | histogram | row-wide search |\n|---|---|---|---|---|")
    for lbl, r in table.items():
        print(f"| {lbl} | {r['rows']} | {r['fast']} | {r['hist']} | {r['search']} |")
    emit_json({"what": "decode_sample.cu's route per real-model row (kernels/sample_route.py on the CPU; every token equal to the reference's)", "env": environment(argv),
               "model": a.model, "routes": table}, a.out or None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
