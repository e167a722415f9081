"""What a verify step and a draft cost on the CPU runner (docs/hotpath.md "Drafts on the CPU"):

    python -m engine.bench.cpu_rows --weights int8,dense --out docs/results/cpu_rows_0.5b.json

Per CPU weights: ms of one forward of R tokens (R = 1..9, all-position logits, as a verify step runs it) at position
80 of a slot; the draft heads' draft (one and four heads) through the model's head over the draft vocabulary and,
for comparison, through a float32 copy of the whole head (what the CPU drafted through before); one forward over a
90-token prompt (a draft model's first catch-up without its prefix cache). Medians of --reps.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from engine.bench.envinfo import emit_json, environment
from engine.config import EngineConfig
from engine.draft import heads as H
from engine.runtime.llm import LLM
from kernels.ops_reference import linear


def ms(fn, reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return round(statistics.median(ts) * 1e3, 2)


@torch.inference_mode()
def measure(model: str, weights: str, reps: int) -> dict:
    llm = LLM(EngineConfig(model=model, device="cpu", max_context=512, max_batch=1, cpu_weights=weights,
                           draft_heads="off", prefix_cache_mb=0))
    r, m = llm.runner, llm.runner.model
    m(torch.tensor([list(range(100, 180))]), r.cache, [0], [0])
    out: dict = {"forward_ms_by_rows": {R: ms(lambda R=R: m(torch.tensor([[5] * R]), r.cache, [0], [80],
                                                              all_logits=True), reps) for R in range(1, 10)}}
    out["prompt_90_forward_ms"] = ms(lambda: m(torch.tensor([list(range(200, 290))]), r.cache, [0], [0]), reps)
    from engine.runtime.draft_heads import DraftHeads
    from engine.runtime.sequence import Sequence
    from engine.runtime.sampling import SamplingParams
    s = Sequence([1, 2, 3], SamplingParams(max_tokens=8), llm.tokenizer)
    s.output_ids.append(1000)
    s.hidden = torch.randn(m.cfg.hidden_size)
    for k in (1, 4):
        r.cfg.spec_heads_cpu = k
        h = DraftHeads.load(r, llm.spec, "on")
        if h is None:
            return out
        out[f"heads_draft_ms_{k}"] = ms(lambda: h.propose(s, k), reps)
    full = m.head_weight().float()  # the whole head in float32, as the CPU heads drafted before
    z = H.residual(s.hidden, h.embed[1000].float(), h.w, h.b)
    out["heads_draft_full_fp32_head_ms_4"] = ms(lambda: linear(z, full).argmax(-1), reps)
    out["full_fp32_head_mb"] = round(full.numel() * 4 / 2 ** 20, 1)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--weights", default="int8,dense")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    res: dict = {"env": environment(sys.argv[1:] if argv is None else argv), "model": args.model, "weights": {}}
    for w in args.weights.split(","):
        res["weights"][w] = row = measure(args.model, w, args.reps)
        print(w, row, flush=True)
    if args.out:
        emit_json(res, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
