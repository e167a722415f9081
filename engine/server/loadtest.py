"""Concurrent streaming load against a running gateway: TTFT p50/p95, per-stream and total tokens/s.

    python -m engine.server.loadtest --url http://127.0.0.1:18000 --streams 1,4,16 --max-tokens 64 --out FILE.json

For each concurrency level N, N clients start together, each streams one chat completion
(ignore_eos: exactly max_tokens tokens, so levels are comparable) and records the time to the
first content chunk (TTFT), the time to the last chunk, the longest gap between chunks, and the usage
the server reports. --long-prompt T adds the interference run: N streams decode, then one request with a
T-token prompt arrives; what matters is how long the running streams stall (their longest gap) while it
prefills (the engine prefills in --prefill-slice steps between decode steps, engine/runtime/worker.py).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time

import httpx

PROMPTS = ["Write a Python function that checks whether a number is prime, with a docstring.",
           "Explain what a hash map is to a new programmer.",
           "用中文写一段关于长城的介绍。",
           "List five tips for writing clean code."]


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


async def one_stream(client: httpx.AsyncClient, model: str | None, prompt: str, max_tokens: int,
                     started: asyncio.Event | None = None) -> dict:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    if model:
        body["model"] = model
    t0 = time.perf_counter()
    ttft, usage, chunks, err, last, gap = None, None, 0, None, None, 0.0
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            return {"error": f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                err = ev["error"]["message"]
            elif ev["choices"]:
                if ev["choices"][0]["delta"].get("content"):
                    chunks += 1
                    now = time.perf_counter()
                    if ttft is None:
                        ttft = now - t0
                        if started is not None:
                            started.set()
                    else:
                        gap = max(gap, now - last)
                    last = now
            else:
                usage = ev["usage"]
    total = time.perf_counter() - t0
    n = (usage or {}).get("completion_tokens", chunks)
    out = {"ttft_s": ttft, "total_s": total, "completion_tokens": n, "prompt_tokens": (usage or {}).get("prompt_tokens"),
           "max_gap_s": gap}
    if ttft is not None and n > 1 and total > ttft:
        out["decode_tps"] = (n - 1) / (total - ttft)
    if err:
        out["error"] = err
    return out


def _client(url: str, n: int, api_key: str | None) -> httpx.AsyncClient:
    """A client for n concurrent streams (+ spare connections), no keep-alive between levels."""
    return httpx.AsyncClient(base_url=url, timeout=600, headers={"Authorization": f"Bearer {api_key}"} if api_key else {},
                             limits=httpx.Limits(max_connections=n + 4, max_keepalive_connections=0))


async def level(url: str, model: str | None, n: int, max_tokens: int, api_key: str | None) -> dict:
    async with _client(url, n, api_key) as client:
        t0 = time.perf_counter()
        runs = await asyncio.gather(*[one_stream(client, model, PROMPTS[i % len(PROMPTS)], max_tokens)
                                      for i in range(n)])
        wall = time.perf_counter() - t0
    ok = [r for r in runs if "error" not in r and r.get("ttft_s") is not None]
    ttfts = [r["ttft_s"] for r in ok]
    tokens = sum(r["completion_tokens"] for r in ok)
    tps = [r["decode_tps"] for r in ok if "decode_tps" in r]
    return {"streams": n, "ok": len(ok), "errors": [r["error"] for r in runs if "error" in r],
            "ttft_p50_ms": 1000 * pct(ttfts, 50), "ttft_p95_ms": 1000 * pct(ttfts, 95),
            "ttft_max_ms": 1000 * max(ttfts, default=float("nan")),
            "per_stream_decode_tps_p50": pct(tps, 50), "total_tokens": tokens, "wall_s": wall,
            "aggregate_tps": tokens / wall if wall > 0 else 0.0, "runs": runs}


async def interference(url: str, model: str | None, n: int, max_tokens: int, long_tokens: int,
                       api_key: str | None) -> dict:
    """n streams decode; once they all stream, one request with a ~long_tokens prompt arrives."""
    doc = "Summarize the following notes in one sentence. " + \
        "The quick brown fox jumps over the lazy dog near the river bank. " * max(1, long_tokens // 14)
    async with _client(url, n, api_key) as client:
        flags = [asyncio.Event() for _ in range(n)]
        bg = [asyncio.create_task(one_stream(client, model, PROMPTS[i % len(PROMPTS)], max_tokens, flags[i]))
              for i in range(n)]
        await asyncio.gather(*[f.wait() for f in flags])
        await asyncio.sleep(0.05)
        long = await one_stream(client, model, doc, 8)
        runs = await asyncio.gather(*bg)
    gaps = [r["max_gap_s"] for r in runs if "error" not in r]
    return {"streams": n, "long_prompt_tokens": long.get("prompt_tokens"), "long_ttft_ms": 1000 * (long.get("ttft_s") or 0),
            "stream_max_gap_ms": 1000 * max(gaps, default=float("nan")),
            "stream_max_gap_p50_ms": 1000 * pct(gaps, 50), "errors": [r["error"] for r in runs + [long] if "error" in r],
            "long": long, "runs": runs}


def table(results: list[dict]) -> str:
    head = f"{'streams':>7} {'ok':>4} {'TTFT p50 ms':>12} {'TTFT p95 ms':>12} {'tok/s/stream':>13} {'agg tok/s':>10} {'wall s':>7}"
    rows = [f"{r['streams']:>7} {r['ok']:>4} {r['ttft_p50_ms']:>12.1f} {r['ttft_p95_ms']:>12.1f} "
            f"{r['per_stream_decode_tps_p50']:>13.1f} {r['aggregate_tps']:>10.1f} {r['wall_s']:>7.2f}" for r in results]
    return "\n".join([head] + rows)


async def main_async(args) -> tuple[dict, list[dict], list[dict]]:
    """-> (the server's /health, one row per concurrency level, the interference runs)."""
    async with httpx.AsyncClient(base_url=args.url, timeout=30) as c:
        health = (await c.get("/health")).json()
    if args.warmup:
        await level(args.url, args.model, 1, 4, args.api_key)
    results = []
    for n in [int(x) for x in args.streams.split(",") if x.strip()]:
        results.append(await level(args.url, args.model, n, args.max_tokens, args.api_key))
        print(table(results[-1:]).splitlines()[-1] if results[:-1] else table(results[-1:]), flush=True)
    inter: list[dict] = []
    if args.long_prompt:
        for _ in range(args.long_repeats):
            r = await interference(args.url, args.model, args.long_streams, args.long_stream_tokens, args.long_prompt,
                                   args.api_key)
            print(f"interference: {r['long_prompt_tokens']}-token prompt arrives during {r['streams']} streams: "
                  f"its TTFT {r['long_ttft_ms']:.0f} ms; the streams' longest gap {r['stream_max_gap_ms']:.0f} ms "
                  f"(median of streams {r['stream_max_gap_p50_ms']:.0f} ms)", flush=True)
            inter.append(r)
    return health, results, inter


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:18000", help="server root (without /v1)")
    p.add_argument("--streams", default="1,4,16", help="comma-separated concurrency levels")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--model", default=None, help="model id (default: the server's default)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--no-warmup", dest="warmup", action="store_false")
    p.add_argument("--long-prompt", type=int, default=0, help="interference run: prompt tokens of the late request")
    p.add_argument("--long-streams", type=int, default=4, help="interference run: streams already decoding")
    p.add_argument("--long-stream-tokens", type=int, default=256, help="interference run: tokens per stream")
    p.add_argument("--long-repeats", type=int, default=2, help="interference runs (the first may pay lazy setup)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    args.url = args.url.rstrip("/").removesuffix("/v1")
    health, results, inter = asyncio.run(main_async(args))
    print()
    print(table(results))
    if args.out:
        doc = {"tool": "engine.server.loadtest", "url": args.url, "max_tokens": args.max_tokens,
               "server": health, "host": platform.node(), "cpu_count": os.cpu_count(),
               "loadavg_after": os.getloadavg() if hasattr(os, "getloadavg") else None, "python": sys.version.split()[0],
               "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "levels": results,
               "interference": inter or None}
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2, ensure_ascii=False)
        print(f"wrote {args.out}")
    return 0 if all(r["ok"] == r["streams"] for r in results) and not any(r["errors"] for r in inter) else 1


if __name__ == "__main__":
    sys.exit(main())
