"""A lone sampling request (temperature > 0) chained on the GPU or stepped by the host (device):

    python -m engine.bench.sampled_chain --model /tmp/r3bw4 --rounds 3 --out $OUT/sampled_chain.json

Chat apps send temperature > 0 and two of the tray's templates sample (0.3, 0.2); without chain_sampler.py each of
their tokens is one host round trip (write the inputs, replay, wait, sample with ~15 eager torch ops, read the id),
where a greedy request decoding alone chains up to 16 steps with the GPU ahead of the host. Here one in-process
engine (the server's scheduler and runner, LLM.stream) decodes 128 tokens (EOS ignored) after a 16-token prompt for
each sampling setting, with GPUModel.sample_chain off and on alternating in every round: decode tok/s (tokens after
the first over the time after the first, bench-protocol), and whether the seed gave the same text both ways.
Prints a table; writes JSON.
"""
from __future__ import annotations

import argparse
import statistics
import sys

from engine.bench.envinfo import emit_json, environment
from engine.bench.protocol import synthetic_ids
from engine.config import EngineConfig
from engine.runtime.llm import LLM
from engine.runtime.sampling import SamplingParams

# (label, temperature, top_k, top_p): greedy as the chained reference, a chat app's usual setting, the tray's
# summary template, and Ollama's defaults
SETTINGS = [("greedy", 0.0, 0, 1.0), ("chat t0.7 p0.9", 0.7, 0, 0.9), ("tray summary t0.3", 0.3, 0, 1.0),
            ("ollama t0.8 k40 p0.9", 0.8, 40, 0.9)]


def one(llm: LLM, ids: list[int], temperature: float, top_k: int, top_p: float, tokens: int) -> tuple[float, str]:
    """(decode tok/s, text) of one request."""
    t: dict = {}
    p = SamplingParams(max_tokens=tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=20261026,
                       ignore_eos=True)
    text = "".join(ev.text for ev in llm.stream(list(ids), p, t))
    return (t["completion_tokens"] - 1) / t["decode_s"], text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    llm = LLM(EngineConfig(model=a.model, device="cuda", max_context=512, max_batch=1))
    m = llm.runner.model
    ids = synthetic_ids(llm.tokenizer, 16)
    rows = []
    for label, temp, k, p in SETTINGS:
        tps = {False: [], True: []}
        texts = {}
        for on in (False, True):  # warm: the sampler graph captured, every path run once
            m.sample_chain = on
            one(llm, ids, temp, k, p, 16)
        for _ in range(a.rounds):
            for on in (False, True):
                m.sample_chain = on
                r, texts[on] = one(llm, ids, temp, k, p, a.tokens)
                tps[on].append(r)
        off, on_ = statistics.median(tps[False]), statistics.median(tps[True])
        rows.append({"setting": label, "temperature": temp, "top_k": k, "top_p": p, "off_tps": tps[False],
                     "on_tps": tps[True], "off_median": round(off, 1), "on_median": round(on_, 1),
                     "speedup": round(on_ / off, 3), "same_text": texts[False] == texts[True]})
    m.sample_chain = True
    print("| setting | host-stepped tok/s | chained tok/s | speed-up | same text |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['setting']} | {r['off_median']} | {r['on_median']} | {r['speedup']}x | {r['same_text']} |")
    out = {"what": "a lone request's decode tok/s, sampled chains (GPUModel.sample_chain) off / on, medians of "
                   f"{a.rounds} alternating rounds, {a.tokens} tokens after a 16-token prompt, EOS ignored, seed "
                   "20261026", "commit": a.commit, "model": a.model, "env": environment(argv), "rows": rows,
           "sampler_graphs": [[*k, g is not None] for k, g in m.sampler.graphs.items()]  # (T, k, p, captured)
           if m._sampler is not None else []}
    emit_json(out, a.out or None)
    return 0 if all(r["same_text"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
