"""Sampling on the CPU: the draw from the largest logits (sampling._pick_cpu_head, speculative.probs) against a full
sort of the vocabulary per token, on the real model (this machine, no GPU):

    python -m engine.bench.cpu_sampling --model qwen2.5-coder-0.5b --rounds 3 [--cpu-weights int4] --out FILE

One in-process CPU engine (LLM.stream) answers a chat prompt (48 tokens, EOS ignored, seed 20261026) per setting:
a chat app's temperature 0.7 / top_p 0.9, the tray's summary temperature 0.3, and 0.7 / 0.9 with prompt-lookup
speculation (speculative sampling's probabilities); the head path off (CPU_HEAD past the vocabulary: every draw
sorts) and on, alternating in each round: decode tok/s and whether the text was the same. Prints a table; writes
JSON, with one draw's time on the model's real logits (sorting vs the head first).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from engine.bench.envinfo import emit_json, environment
from engine.config import EngineConfig
from engine.runtime import sampling, speculative
from engine.runtime.llm import LLM
from engine.runtime.sampling import SamplingParams, pick_index

SETTINGS = [("chat t0.7 p0.9", 0.7, 0.9, False), ("tray summary t0.3", 0.3, 1.0, False),
            ("t0.7 p0.9, prompt lookup", 0.7, 0.9, True)]
PROMPT = ("Rewrite this more politely: We have reviewed your report and the numbers in section three are wrong, "
          "fix them by Friday and send the corrected file to the whole team.")


def set_head(on: bool):
    n = sampling.CPU_HEAD_DEFAULT if on else 1 << 30
    sampling.CPU_HEAD = speculative.CPU_HEAD = n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--cpu-weights", default="dense", choices=["dense", "int8", "int4"])
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    llm = LLM(EngineConfig(model=a.model, device="cpu", max_context=1024, max_batch=1, cpu_weights=a.cpu_weights))
    ids = llm.encode_chat([{"role": "user", "content": PROMPT}])
    # one draw alone, on the model's real next-token logits after the prompt: every draw sorting vs the head first
    row = llm.runner.logits(list(ids))[-1].float()
    u = torch.tensor([0.37], dtype=torch.float64)
    draw_ms = {}
    for label, t, p, _ in SETTINGS[:2]:
        sp = SamplingParams(temperature=t, top_p=p)
        for on in (False, True):
            set_head(on)
            pick_index(row, sp, u)
            t0 = time.perf_counter()
            for _ in range(10):
                pick_index(row, sp, u)
            draw_ms[f"{label}, {'head first' if on else 'sort'}"] = round((time.perf_counter() - t0) / 10 * 1e3, 2)
    rows = []
    for label, t, p, spec in SETTINGS:
        tps, texts = {False: [], True: []}, {}
        for r in range(a.rounds + 1):  # the first round warms up
            for on in (False, True):
                set_head(on)
                tm: dict = {}
                sp = SamplingParams(max_tokens=a.tokens, temperature=t, top_p=p, seed=20261026, ignore_eos=True,
                                    speculative=spec)
                texts[on] = "".join(ev.text for ev in llm.stream(list(ids), sp, tm))
                if r:
                    tps[on].append((tm["completion_tokens"] - 1) / tm["decode_s"])
        off, on_ = statistics.median(tps[False]), statistics.median(tps[True])
        rows.append({"setting": label, "temperature": t, "top_p": p, "speculative": spec, "sort_tps": tps[False],
                     "head_tps": tps[True], "sort_median": round(off, 2), "head_median": round(on_, 2),
                     "speedup": round(on_ / off, 3), "same_text": texts[False] == texts[True]})
    set_head(True)
    print("| setting | every draw sorts (tok/s) | the head first | speed-up | same text |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['setting']} | {r['sort_median']} | {r['head_median']} | {r['speedup']}x | {r['same_text']} |")
    print("\n| one draw on the real logits | ms |\n|---|---|")
    for k, v in draw_ms.items():
        print(f"| {k} | {v} |")
    emit_json({"draw_ms": draw_ms, "what": f"CPU decode tok/s of a sampling request on {a.model} ({a.cpu_weights} weights), {a.tokens} "
                       f"tokens, medians of "
                       f"{a.rounds} alternating rounds", "env": environment(argv), "rows": rows}, a.out or None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
