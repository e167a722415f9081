"""Speed runs of docs/bench/protocol.md on one target, with fixed token counts.

Each run returns {"protocol", "settings", "points": [{"label", "rows", "median", ...}]}.
Prompts are synthetic ids of exact length (protocol.synthetic_ids); HTTP targets get the decoded
text and report their own prompt count, which is cross-checked against ours.
"""
from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field

from engine.bench.protocol import cross_check, decode_tps, synthetic_ids
from engine.bench.stats import percentile, summarize

GREEDY = dict(temperature=0.0, top_p=1.0, top_k=0, seed=20261026)
SPEED_RUNS = ["decode", "prefill", "combined", "longctx", "concurrency", "memory"]


@dataclass
class SpeedSettings:
    repeats: int = 3
    warmup: int = 1
    decode_tokens: int = 128
    decode_prompt_tokens: int = 16  # "a short prompt"
    prefill_lengths: list[int] = field(default_factory=lambda: [48, 512, 2048])
    combined: tuple[int, int] = (48, 64)  # prompt tokens, generated tokens
    long_lengths: list[int] = field(default_factory=lambda: [4096, 16384, 32768])
    long_decode_tokens: int = 32
    concurrency: list[int] = field(default_factory=lambda: [1, 4, 16])
    concurrency_prompt_tokens: int = 48
    concurrency_max_tokens: int = 64


def _one(target, tok, n_prompt: int, max_tokens: int, salt: int, concurrent: bool = False) -> dict:
    ids = synthetic_ids(tok, n_prompt, salt)
    text = tok.decode(ids)
    gen = getattr(target, "generate_concurrent", target.generate) if concurrent else target.generate
    row = gen(ids, text, max_tokens, True, GREEDY)
    row["prompt_tokens_target"] = n_prompt
    if target.kind == "inproc":
        row["prompt_tokens_ours"] = len(ids)
    else:
        cross_check(row, tok, text, row.get("text"), flag_completion=False)
    row["decode_tps"] = decode_tps(row.get("completion_tokens"), row.get("decode_s"))
    if row.get("prompt_tokens") and row.get("ttft_s"):
        row["prefill_tps"] = row["prompt_tokens"] / row["ttft_s"]
    row.pop("text", None)  # synthetic output is noise; keep the JSON small
    return row


def _fits(target, n: int) -> bool:
    return target.max_context is None or n <= target.max_context


def _point(target, tok, s: SpeedSettings, label: str, n_prompt: int, max_tokens: int, progress,
           repeats: int | None = None, salt0: int = 0) -> dict:
    if not _fits(target, n_prompt + max_tokens):
        progress(f"  [{target.name}] {label}: skipped (context {target.max_context} < {n_prompt + max_tokens})")
        return {"label": label, "skipped": f"needs {n_prompt + max_tokens} tokens of context, "
                                          f"target has {target.max_context}"}
    rows = []
    for r in range(s.repeats if repeats is None else repeats):
        row = _one(target, tok, n_prompt, max_tokens, salt0 + r + 1)
        row["round"] = r
        rows.append(row)
        progress(f"  [{target.name}] {label} #{r}: ttft {row['ttft_s']:.3f}s wall {row['wall_s']:.3f}s "
                 f"{row.get('completion_tokens')} tok" + (f" {row['decode_tps']:.1f} tok/s" if row.get('decode_tps')
                                                          else ""))
    med = summarize(rows, ["wall_s", "ttft_s", "decode_s", "decode_tps", "prefill_tps", "completion_tokens",
                           "prompt_tokens", "native_prefill_tps", "native_decode_tps"])
    return {"label": label, "prompt_tokens": n_prompt, "max_tokens": max_tokens, "rows": rows, "median": med}


def _warm(target, tok, s: SpeedSettings, progress):
    for w in range(s.warmup):
        progress(f"  [{target.name}] warmup {w}")
        _one(target, tok, 16, 8, 999 + w)


def run_decode(target, tok, s, progress) -> dict:
    _warm(target, tok, s, progress)
    p = _point(target, tok, s, f"tg{s.decode_tokens}", s.decode_prompt_tokens, s.decode_tokens, progress)
    return {"protocol": "decode", "settings": {"batch": 1, "ignore_eos": True, **GREEDY}, "points": [p]}


def run_prefill(target, tok, s, progress) -> dict:
    _warm(target, tok, s, progress)
    pts = [_point(target, tok, s, f"pp{n}", n, 1, progress, salt0=10 * n) for n in s.prefill_lengths]
    return {"protocol": "prefill", "settings": {"max_tokens": 1, "metric": "prompt tokens / time to first token"},
            "points": pts}


def run_combined(target, tok, s, progress) -> dict:
    _warm(target, tok, s, progress)
    n_p, n_g = s.combined
    p = _point(target, tok, s, f"pp{n_p}+tg{n_g}", n_p, n_g, progress, salt0=500)
    for r in p.get("rows", []):
        r["combined_tps"] = (n_p + n_g) / r["wall_s"]
    if p.get("rows"):
        p["median"].update(summarize(p["rows"], ["combined_tps"]))
    return {"protocol": "combined", "settings": {"metric": "(prompt + generated tokens) / wall"}, "points": [p]}


def run_longctx(target, tok, s, progress) -> dict:
    pts = []
    for n in s.long_lengths:
        n_eff = n if target.max_context is None else min(n, target.max_context - s.long_decode_tokens)
        if n_eff < n // 2:
            pts.append({"label": f"ctx{n}", "skipped": f"context {target.max_context} is too small"})
            progress(f"  [{target.name}] ctx{n}: skipped (context {target.max_context})")
            continue
        pts.append(_point(target, tok, s, f"ctx{n}", n_eff, s.long_decode_tokens, progress, repeats=1, salt0=n))
    return {"protocol": "longctx", "settings": {"decode_tokens": s.long_decode_tokens, "repeats": 1},
            "points": pts}


def run_concurrency(target, tok, s, progress) -> dict:
    try:
        return _concurrency(target, tok, s, progress)
    finally:
        if hasattr(target, "end_concurrent"):
            target.end_concurrent()  # hand the model back to the direct in-process path


def _concurrency(target, tok, s, progress) -> dict:
    slots = getattr(getattr(target, "llm", None), "cfg", None)
    slots = slots.max_batch if slots is not None else None
    for w in range(s.warmup):
        progress(f"  [{target.name}] warmup {w}")
        _one(target, tok, 16, 4, 999, True)
    pts = []
    for n in s.concurrency:
        if slots is not None and n > slots:
            progress(f"  [{target.name}] {n} streams: more than the {slots} KV slots; they queue")
        rows: list[dict] = [{} for _ in range(n)]

        def stream(i: int):
            t0 = time.perf_counter()
            try:
                rows[i] = _one(target, tok, s.concurrency_prompt_tokens, s.concurrency_max_tokens, 1000 + i, True)
            except Exception as e:  # keep the other streams' numbers
                rows[i] = {"error": str(e)}
            rows[i].update(stream=i, start=t0, end=time.perf_counter())

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ok = [r for r in rows if "error" not in r]
        span = max(r["end"] for r in rows) - min(r["start"] for r in rows)
        total = sum(r.get("completion_tokens") or 0 for r in ok)
        for r in ok:
            r["stream_tps"] = (r.get("completion_tokens") or 0) / (r["end"] - r["start"])
        ttfts = [r["ttft_s"] for r in ok]
        pt = {"label": f"c{n}", "streams": n, "rows": rows, "errors": n - len(ok),
              "median": {"total_tps": total / span if span > 0 else None, "wall_s": span,
                         "ttft_p50_s": percentile(ttfts, 50), "ttft_p95_s": percentile(ttfts, 95),
                         **summarize(ok, ["stream_tps", "decode_tps"])}}
        progress(f"  [{target.name}] {n} streams: total {pt['median']['total_tps'] or 0:.1f} tok/s, "
                 f"TTFT p50 {pt['median']['ttft_p50_s'] or 0:.3f}s p95 {pt['median']['ttft_p95_s'] or 0:.3f}s")
        pts.append(pt)
    via = "EngineWorker in-process (no HTTP)" if target.kind == "inproc" else "HTTP streaming"
    return {"protocol": "concurrency", "settings": {"prompt_tokens": s.concurrency_prompt_tokens, "via": via,
                                                    "max_tokens": s.concurrency_max_tokens, "ignore_eos": True,
                                                    "kv_slots": slots},
            "points": pts}


def run_memory(target, tok, s, progress) -> dict:
    mem = target.memory()
    if mem is None:
        return {"protocol": "memory", "skipped": "the backend does not report memory to a client", "points": []}
    progress(f"  [{target.name}] memory: " + ", ".join(f"{k} {v / 2**30:.3f} GiB" for k, v in mem.items()
                                                      if k.endswith("_bytes") and isinstance(v, (int, float))))
    return {"protocol": "memory", "memory": mem, "points": []}


RUNNERS = {"decode": run_decode, "prefill": run_prefill, "combined": run_combined, "longctx": run_longctx,
           "concurrency": run_concurrency, "memory": run_memory}


def settings_dict(s: SpeedSettings) -> dict:
    return asdict(s)
