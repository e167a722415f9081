"""Where a speculative request's time goes: cProfile over the hot-path bench's translate texts, greedy, with
the draft heads' drafts as a tree, as a chain, and without speculation (a device run; prints the top functions by
own time and writes them to --out). --kernels: the GPU kernels instead (torch.profiler over the same requests,
CUDA-graph replays included): each kernel's total and mean time and count, and the GPU-busy share of the wall.

    python -m engine.bench.spec_profile --device cuda --out $OUT/spec_profile.txt [--kernels]
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
    p.add_argument("--kernels", action="store_true", help="GPU kernel times (torch.profiler) instead of cProfile")
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
        prof = _kernel_profiler() if a.kernels else cProfile.Profile()
        t0, toks = time.perf_counter(), 0
        prof.__enter__() if a.kernels else prof.enable()
        for q in prompts:
            c = llm.complete(q, SamplingParams(max_tokens=64, temperature=0.0, speculative=mode != "plain"))
            toks += c.completion_tokens
        prof.__exit__(None, None, None) if a.kernels else prof.disable()
        wall = time.perf_counter() - t0
        if a.kernels:
            text = _kernel_table(prof, wall, a.top)
        else:
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(a.top)
            text = s.getvalue()
        report.append(f"=== {mode}: {toks} tokens in {wall * 1000:.1f} ms (profiled) ===\n{text}")
        print(report[-1][:200], file=sys.stderr, flush=True)
    with open(a.out, "w", encoding="utf-8") as f:
        f.write("\n".join(report))
    return 0


def _kernel_profiler():
    from torch.profiler import ProfilerActivity, profile
    return profile(activities=[ProfilerActivity.CUDA])


def _kernel_table(prof, wall: float, top: int, device_type=None) -> str:
    """Per kernel name: total us, count, mean us, share of the GPU-busy time; the busy share of the wall."""
    import torch
    want = device_type or torch.autograd.DeviceType.CUDA
    rows: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type != want:
            continue
        r = rows.setdefault(e.name, [0.0, 0])
        r[0] += e.time_range.elapsed_us()
        r[1] += 1
    busy = sum(r[0] for r in rows.values())
    lines = [f"GPU busy {busy / 1000:.1f} ms of {wall * 1000:.1f} ms wall ({100 * busy / 1e6 / max(wall, 1e-9):.0f}%)",
             f"{'kernel':<60} {'total ms':>9} {'count':>7} {'mean us':>8} {'share':>6}"]
    for name, (t, n) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"{name[:60]:<60} {t / 1000:9.2f} {n:7d} {t / n:8.1f} {100 * t / max(busy, 1e-9):5.1f}%")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
