"""Where a speculative request's host time goes: cProfile over the hot-path bench's translate texts, greedy, with
the draft heads' drafts as a tree, as a chain, and without speculation (a device run; prints the top functions by
own time and writes them to --out).

    python -m engine.bench.spec_profile --device cuda --out $OUT/spec_profile.txt
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time

from engine.bench.hotpath import TEXTS
from engine.config import EngineConfig
from engine.runtime.llm import LLM
from engine.runtime.sampling import SamplingParams
from trayapp.config import default_config
from trayapp.templates import render_messages


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench.spec_profile", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    p.add_argument("--texts", type=int, default=10)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    llm = LLM(EngineConfig(model=a.model, device=a.device, max_context=4096, max_batch=2, speculative_gpu=True))
    cfg = default_config("zh")
    tpl = cfg.template("translate")
    prompts = [llm.render(render_messages(tpl, t, cfg.lang)) for t in TEXTS[:a.texts]]
    report = []
    for mode in ("tree", "chain", "plain"):
        llm.runner.cfg.draft_tree = mode == "tree"
        for q in prompts:  # prefix cached, graphs warm
            llm.complete(q, SamplingParams(max_tokens=2, temperature=0.0))
        prof = cProfile.Profile()
        t0, toks = time.perf_counter(), 0
        prof.enable()
        for q in prompts:
            c = llm.complete(q, SamplingParams(max_tokens=64, temperature=0.0, speculative=mode != "plain"))
            toks += c.completion_tokens
        prof.disable()
        wall = time.perf_counter() - t0
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(a.top)
        report.append(f"=== {mode}: {toks} tokens in {wall * 1000:.1f} ms (profiled) ===\n{s.getvalue()}")
        print(report[-1][:200], file=sys.stderr, flush=True)
    with open(a.out, "w", encoding="utf-8") as f:
        f.write("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
