"""A lone sampling request (temperature > 0) chained on the GPU or stepped by the host (device):

    python -m engine.bench.sampled_chain --model /tmp/r3bw4 --rounds 3 --out $OUT/sampled_chain.json

Chat apps send temperature > 0 and two of the tray's templates sample (0.3, 0.2); without chain_sampler.py each of
their tokens is one host round trip (write the inputs, replay, wait, sample with ~15 eager torch ops, read the id),
where a greedy request decoding alone chains up to 16 steps with the GPU ahead of the host. Here one in-process
engine (the server's scheduler and runner, LLM.stream) decodes 128 tokens (EOS ignored) after a 16-token prompt for
each sampling setting, with GPUModel.sample_chain off and on alternating in every round: decode tok/s (tokens after
the first over the time after the first, bench-protocol), and whether the seed gave the same text both ways.
Then --streams requests decoding together (batched steps) with their sampling rows drawn on the GPU behind each step
(ChainSampler.draw_rows) or by sample() after it: total tok/s and whether the tokens were the same. Prints tables;
writes JSON.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

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


def streams(llm: LLM, n: int, temperature: float, top_k: int, top_p: float, tokens: int) -> tuple[float, list]:
    """n requests decoding together through the scheduler (batched steps): (total tok/s from the first step to the
    last token, each request's output ids); every request 16 prompt tokens of its own, seed 20261026 + i."""
    seqs = [llm.new_sequence(synthetic_ids(llm.tokenizer, 16, salt=i + 1),
                             SamplingParams(max_tokens=tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                            seed=20261026 + i, ignore_eos=True)) for i in range(n)]
    sched = llm.scheduler
    for q in seqs:
        sched.add(q)
    t0 = time.perf_counter()
    while not all(q.finished for q in seqs):
        out = sched.step()
        if out.failed:
            raise out.failed[0][1]
    wall = time.perf_counter() - t0
    return sum(len(q.output_ids) for q in seqs) / wall, [list(q.output_ids) for q in seqs]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--streams", default="4,8", help="concurrent requests, batched (0 or empty: none)")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    ns = [int(v) for v in a.streams.split(",") if v.strip() and int(v) > 0]
    llm = LLM(EngineConfig(model=a.model, device="cuda", max_context=512, max_batch=max(ns + [1])))
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
    batched = []
    for n in ns:  # batched steps: sampling rows drawn behind the step (on) or by sample() after it (off)
        for label, temp, k, p in SETTINGS[:2]:
            tps, outs = {False: [], True: []}, {}
            for on in (False, True):
                m.sample_chain = on
                streams(llm, n, temp, k, p, 8)
            for _ in range(a.rounds):
                for on in (False, True):
                    m.sample_chain = on
                    r, outs[on] = streams(llm, n, temp, k, p, a.tokens // 2)
                    tps[on].append(r)
            off, on_ = statistics.median(tps[False]), statistics.median(tps[True])
            batched.append({"streams": n, "setting": label, "off_tps": tps[False], "on_tps": tps[True],
                            "off_median": round(off, 1), "on_median": round(on_, 1), "speedup": round(on_ / off, 3),
                            "same_tokens": outs[False] == outs[True]})
    m.sample_chain = True
    print("| setting | host-stepped tok/s | chained tok/s | speed-up | same text |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['setting']} | {r['off_median']} | {r['on_median']} | {r['speedup']}x | {r['same_text']} |")
    if batched:
        print("\n| streams | setting | drawn after the step (total tok/s) | drawn behind it | speed-up | same tokens |")
        print("|---|---|---|---|---|---|")
        for r in batched:
            print(f"| {r['streams']} | {r['setting']} | {r['off_median']} | {r['on_median']} | {r['speedup']}x | "
                  f"{r['same_tokens']} |")
    out = {"what": "a lone request's decode tok/s, sampled chains (GPUModel.sample_chain) off / on, medians of "
                   f"{a.rounds} alternating rounds, {a.tokens} tokens after a 16-token prompt, EOS ignored, seed "
                   "20261026; batched: STREAMS requests of TOKENS / 2 tokens decoding together, total tok/s",
           "commit": a.commit, "model": a.model, "env": environment(argv), "rows": rows, "batched": batched,
           "sampler_graph": m._sampler is not None and m.sampler.graph is not None}
    emit_json(out, a.out or None)
    return 0 if all(r["same_text"] for r in rows) and all(r["same_tokens"] for r in batched) else 1


if __name__ == "__main__":
    sys.exit(main())
