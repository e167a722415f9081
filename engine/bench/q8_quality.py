"""What int8 activations would cost in answers (CPU, the real 0.5B; #16's q8 probe, kernels/decode_q8.cu):

    python -m engine.bench.q8_quality --out docs/results/q8_quality_0.5b.json

The probe's numerics (llama.cpp's for batch-1 GEMVs: every linear's input quantized per block of 32 to int8,
dx = amax / 127) emulated on the CPU runner's forward (kernels.ops_reference.RefOps with its linears' inputs, and the
head's with --head, rounded that way first). Per prompt (the protocol's two, the hot path's questions, the rewrite and
translate templates on its texts): the plain greedy answer (64 tokens), then the q8 greedy answer (identical? the
first position that differs), and teacher-forced over the plain answer: how often the q8 logits' argmax is the plain
token, and the mean KL(plain || q8) of the next-token distributions. The same for inputs rounded to fp16 (the GPU step's
activations, against the CPU runner's fp32): the scale the q8 figures are read on.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F

from engine.bench.envinfo import emit_json
from engine.model.forward import forward
from engine.model.qwen2 import KVCache
from kernels.ops_reference import RefOps

MODEL = "qwen2.5-coder-0.5b"


def q8_round(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] -> its Q8_1 values (blocks of 32 along K: dx * round(x / dx), dx = amax / 127)."""
    K = x.shape[-1]
    v = x.float().reshape(*x.shape[:-1], K // 32, 32)
    d = v.abs().amax(-1, keepdim=True) / 127.0
    q = torch.where(d > 0, torch.round(v / torch.where(d > 0, d, torch.ones_like(d))), torch.zeros_like(v))
    return (q * d).reshape(x.shape).to(x.dtype)


class Q8Ops(RefOps):
    """RefOps whose linears (and with head=True the head) see their inputs rounded to Q8_1 blocks first."""

    head = False

    def linear(self, w, x, epi: str, h=None):
        return super().linear(w, q8_round(x), epi, h)

    def logits(self, x, head):
        return super().logits(q8_round(x) if self.head else x, head)


class F16Ops(RefOps):
    """RefOps whose linears' inputs are rounded to fp16 first (as the GPU step's are): the baseline the q8 figures
    are read against (the CPU runner computes in fp32)."""

    head = False

    def linear(self, w, x, epi: str, h=None):
        return super().linear(w, x.half().to(x.dtype), epi, h)

    def logits(self, x, head):
        return super().logits(x.half().to(x.dtype), head)


def run(model, ids: list[int], n: int, ops_cls, head: bool) -> list[int]:
    """Greedy n tokens after ids (a fresh cache)."""
    cfg = model.cfg
    cache = KVCache(cfg, 1, len(ids) + n + 1)
    model.forward(torch.tensor([ids[:1]]), cache, [0], [0])  # the rotary table sized for this cache
    cache = KVCache(cfg, 1, len(ids) + n + 1)
    out, pos, cur = [], 0, ids
    with torch.inference_mode():
        for _ in range(n):
            ops = ops_cls(torch.tensor([cur]), cache.k, cache.v, model.rope, [0], [pos], cfg.num_heads, cfg.rms_eps)
            ops.head = head
            logits = forward(ops, model.weights())
            pos += len(cur)
            t = int(logits[0].argmax())
            out.append(t)
            cur = [t]
    return out


def teacher(model, ids: list[int], ans: list[int], ops_cls, head: bool) -> torch.Tensor:
    """Logits [len(ans), vocab] predicting each answer token, one prefill over ids + ans."""
    cfg = model.cfg
    seq = ids + ans
    cache = KVCache(cfg, 1, len(seq) + 1)
    with torch.inference_mode():
        ops = ops_cls(torch.tensor([seq]), cache.k, cache.v, model.rope, [0], [0], cfg.num_heads, cfg.rms_eps,
                      all_logits=True)
        ops.head = head
        lg = forward(ops, model.weights())
    return lg[0, len(ids) - 1:len(seq) - 1].float()


def prompts(llm) -> list[tuple[str, list[int]]]:
    from engine.bench.hotpath import QUESTIONS, TEXTS
    from engine.bench.protocol import PROMPTS, SYSTEM
    from engine.runtime.llm import encode_chat
    from engine.bench.hotpath import default_config, render_messages
    out = [(name, encode_chat(llm.spec, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": p}]))
           for name, p in PROMPTS]
    out += [(f"question {i}", encode_chat(llm.spec, [{"role": "user", "content": q}])) for i, q in enumerate(QUESTIONS)]
    cfg = default_config("zh")
    for tid in ("rewrite", "translate"):
        for i, text in enumerate(TEXTS[:4]):
            out.append((f"{tid} {i}", llm.spec.tokenizer.encode(llm.render(render_messages(cfg.template(tid), text,
                                                                                             cfg.lang)))))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", default="q8_quality.json")
    a = ap.parse_args(argv)
    from engine.config import EngineConfig
    from engine.runtime.llm import LLM
    torch.set_num_threads(max(1, torch.get_num_threads()))
    llm = LLM(EngineConfig(model=MODEL, device="cpu", max_context=2048, max_batch=1))
    model = llm.runner.model
    res = {"model": MODEL, "tokens": a.tokens, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "command": "python -m engine.bench.q8_quality " + " ".join(argv if argv is not None else sys.argv[1:]),
           "method": __doc__.strip().splitlines()[0], "prompts": {}}
    print("| prompt | q8 answer identical | first difference | q8 argmax = plain token | mean KL |")
    for name, ids in prompts(llm):
        plain = run(model, ids, a.tokens, RefOps, False)
        row = {"prompt_tokens": len(ids)}
        lp = teacher(model, ids, plain, RefOps, False)
        for key, cls, head in (("fp16_inputs", F16Ops, True), ("q8_linears", Q8Ops, False),
                               ("q8_with_head", Q8Ops, True)):
            q8 = run(model, ids, a.tokens, cls, head)
            lq = teacher(model, ids, plain, cls, head)
            same = next((i for i, (x, y) in enumerate(zip(plain, q8)) if x != y), None)
            kl = F.kl_div(lq.log_softmax(-1), lp.log_softmax(-1), log_target=True, reduction="none").sum(-1)
            r = {"identical": plain == q8, "first_difference": same,
                 "argmax_agree": float((lq.argmax(-1) == torch.tensor(plain)).float().mean()),
                 "teacher_plain_argmax_agree": float((lp.argmax(-1) == torch.tensor(plain)).float().mean()),
                 "mean_kl": float(kl.mean()), "max_kl": float(kl.max())}
            row[key] = r
            print(f"| {name} ({key}) | {r['identical']} | {r['first_difference']} | "
                  f"{r['argmax_agree']:.3f} | {r['mean_kl']:.2e} |", flush=True)
        res["prompts"][name] = row
    for key in ("fp16_inputs", "q8_linears", "q8_with_head"):
        rows = [r[key] for r in res["prompts"].values()]
        res[key] = {"identical": sum(r["identical"] for r in rows), "of": len(rows),
                    "argmax_agree_mean": sum(r["argmax_agree"] for r in rows) / len(rows),
                    "mean_kl_mean": sum(r["mean_kl"] for r in rows) / len(rows)}
        print(key, res[key])
    emit_json(res, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
