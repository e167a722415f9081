"""Constrained vs unconstrained decode speed: what a JSON schema (engine/runtime/grammar.py) costs per token.

    python -m engine.bench.structured_decode --model qwen2.5-coder-0.5b --device cpu \
        --out docs/results/structured_decode_cpu_0.5b.json
    python -m engine.bench.structured_decode --model <3B checkpoint> --device cuda --out ...   (the device)

Same prompt and token count both ways, greedy (the GPU's fused argmax serves the unconstrained rows; a
constrained row takes the logits path plus the mask), and once sampled at temperature 0.7. The schema is an
array of strings that cannot close before --tokens (minItems), so both runs generate exactly --tokens; the
unconstrained run uses ignore_eos. --batch B runs B sequences together: all plain, then all constrained, then
half and half (the mixed batch is what a server with both kinds of request decodes).
Decode tok/s = tokens after the first / time after the first (prefill excluded), per sequence summed over
the batch; each configuration is repeated --repeats times and the median is kept; the repeats are interleaved over the configurations.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from engine.bench.envinfo import environment
from engine.config import EngineConfig
from engine.runtime import grammar
from engine.runtime.llm import LLM
from engine.runtime.sampling import SamplingParams
from engine.runtime.sequence import Sequence

PROMPT = "List as many English words about the sea as you can, as a JSON object {\"words\": [...]}."


def schema(tokens: int) -> dict:
    return {"type": "object", "properties": {"words": {"type": "array", "items": {"type": "string"},
                                                      "minItems": tokens}},
            "required": ["words"], "additionalProperties": False}


def run_batch(llm: LLM, ids: list[int], plist: list[SamplingParams]) -> dict:
    """Generate one batch to the end; -> decode tok/s (summed over sequences) and per-step wall time."""
    seqs = [Sequence(list(ids), p, llm.tokenizer) for p in plist]
    sched = llm.scheduler
    for s in seqs:
        sched.add(s)
    first_done, t_first = 0, None
    try:
        while any(not s.finished for s in seqs):
            out = sched.step()
            first_done += len(out.first)
            if t_first is None and first_done == len(seqs):
                t_first = time.perf_counter()  # every prompt prefilled: decode timing starts
        t_end = time.perf_counter()
    finally:
        for s in seqs:
            if not s.finished:
                sched.abort(s)
    tokens = [len(s.output_ids) for s in seqs]
    dt = t_end - t_first
    return {"tokens": tokens, "decode_s": round(dt, 4),
            "decode_tok_s": round(sum(n - 1 for n in tokens) / dt, 2) if dt > 0 else None,
            "finish": sorted({s.finish_reason for s in seqs}),
            "valid_json_prefix": all(s.text.startswith('{"words":[') for s in seqs if s.params.grammar)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    cfg = EngineConfig(model=a.model, device=a.device, max_context=1024, max_batch=max(1, a.batch),
                       threads=a.threads, prefix_cache_mb=0)
    llm = LLM(cfg)
    ids = llm.encode_chat([{"role": "user", "content": PROMPT}])
    t0 = time.perf_counter()
    g = grammar.compile_json(llm.tokenizer, llm.spec.config.vocab_size, schema(a.tokens))
    compile_s = time.perf_counter() - t0  # includes the first-use tokenizer conversion (~1 s)

    def params(constrained: bool, temperature: float) -> SamplingParams:
        return SamplingParams(max_tokens=a.tokens, temperature=temperature, seed=1, ignore_eos=not constrained,
                              grammar=g if constrained else None)

    configs = []
    for temp in (0.0, 0.7):
        configs += [("batch1", temp, [False]), ("batch1", temp, [True])]
        if a.batch > 1:
            configs += [(f"batch{a.batch}", temp, [False] * a.batch), (f"batch{a.batch}", temp, [True] * a.batch),
                        (f"batch{a.batch}_mixed", temp, [i % 2 == 1 for i in range(a.batch)])]
    run_batch(llm, ids, [params(False, 0.0)])  # warm-up (first-call allocations, graphs)
    run_batch(llm, ids, [params(True, 0.0)])
    runs_of: dict[int, list] = {i: [] for i in range(len(configs))}
    for _ in range(a.repeats):  # interleaved: load from other work on the machine hits every configuration alike
        for i, (name, temp, kinds) in enumerate(configs):
            runs_of[i].append(run_batch(llm, ids, [params(k, temp) for k in kinds]))
    results = []
    for i, (name, temp, kinds) in enumerate(configs):
        runs = runs_of[i]
        med = statistics.median(r["decode_tok_s"] for r in runs)
        results.append({"config": name, "temperature": temp, "constrained": sum(kinds), "sequences": len(kinds),
                        "decode_tok_s_median": med, "runs": runs})
        print(f"{name:14s} T={temp} constrained {sum(kinds)}/{len(kinds)}: {med:8.2f} tok/s", flush=True)
    ratios = {}
    for r in results:
        if r["constrained"] == r["sequences"]:
            base = next(x for x in results if x["config"] == r["config"] and x["temperature"] == r["temperature"]
                        and x["constrained"] == 0)
            ratios[f"{r['config']}_T{r['temperature']}"] = round(r["decode_tok_s_median"] / base["decode_tok_s_median"], 3)
    doc = {"what": "decode tok/s with a JSON-schema grammar vs without (engine/bench/structured_decode.py)",
           "model": a.model, "device": a.device, "tokens": a.tokens, "batch": a.batch, "repeats": a.repeats,
           "grammar_compile_s": round(compile_s, 3), "constrained_over_plain": ratios, "results": results,
           "environment": {**environment(), "command": "python -m engine.bench.structured_decode " +
                           " ".join(argv if argv is not None else sys.argv[1:])}}
    print(json.dumps(ratios))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
