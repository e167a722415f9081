"""What the prefix KV cache costs a request that does not hit it (device; the bench's prefill gap, docs/gpu.md).

    python -m engine.bench.pcache_profile --model /tmp/r3b --lengths 48,512,2048 --out $OUT/pcache_profile.json

Per prompt length: N distinct prompts (random token ids, no shared prefix) run one after another through
LLM.complete with max_tokens 1 (prefill, first token, release: where the cache stores the prompt's blocks), with the
engine's prefix cache and without it (two LLMs on the same checkpoint, alternating rounds); ms per request, and a
cProfile of the cached LLM's requests (the functions where the difference goes).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import statistics
import sys
import time

import torch

from engine.bench.envinfo import emit_json
from engine.config import EngineConfig
from engine.runtime import prefix_cache
from engine.runtime.llm import LLM
from engine.runtime.sampling import SamplingParams


def timed(llm: LLM, prompts: list[list[int]]) -> float:
    """Mean ms per request over prompts (max_tokens 1)."""
    p = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for ids in prompts:
        llm.complete(ids, p)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / len(prompts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--lengths", default="48,512,2048")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="pcache_profile.json")
    a = ap.parse_args(argv)
    llms = {name: LLM(EngineConfig(model=a.model, device="cuda", max_context=4096, max_batch=1, prefix_cache_mb=mb))
            for name, mb in (("cache", 256), ("nocache", 0))}
    rng = random.Random(0)
    res = {"command": "python -m engine.bench.pcache_profile " + " ".join(argv if argv is not None else sys.argv[1:]),
           "lengths": {}}
    for L in map(int, a.lengths.split(",")):
        row = {name: [] for name in llms}
        for r in range(a.rounds + 1):  # round 0 warms both (graphs, allocator)
            for name, llm in llms.items():
                prompts = [[rng.randrange(1000, 30000) for _ in range(L)] for _ in range(a.n)]
                ms = timed(llm, prompts)
                if r:
                    row[name].append(ms)
        prof = cProfile.Profile()
        prompts = [[rng.randrange(1000, 30000) for _ in range(L)] for _ in range(a.n)]
        prof.enable()
        timed(llms["cache"], prompts)
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
        med = {k: statistics.median(v) for k, v in row.items()}
        res["lengths"][L] = {"ms_per_request": med, "rounds": row, "profile_cache_tottime": s.getvalue()}
        print(f"L={L}: cache {med['cache']:.3f} ms, no cache {med['nocache']:.3f} ms per request "
              f"({med['cache'] / med['nocache']:.3f}x)", flush=True)
        print(s.getvalue()[:2500], flush=True)
    # a hit: the same 2,000-token prompt twice through the cache (the second restores 1,999 rows, prefills one), and
    # the greedy tokens of both against the cacheless LLM's
    p = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    ids = [rng.randrange(1000, 30000) for _ in range(2000)]
    ref = llms["nocache"].complete(ids, p).token_ids
    t0 = time.perf_counter()
    first = llms["cache"].complete(ids, p).token_ids
    t1 = time.perf_counter()
    second = llms["cache"].complete(ids, p).token_ids
    t2 = time.perf_counter()
    res["hit_2000"] = {"tokens_equal": first == ref and second == ref, "first_ms": (t1 - t0) * 1e3,
                       "second_ms": (t2 - t1) * 1e3, "stats": prefix_cache.for_runner(llms["cache"].runner).stats()}
    print("hit, 2,000 tokens, 8 out:", res["hit_2000"], flush=True)
    emit_json(res, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
