"""The productivity protocol of docs/bench/protocol.md (seed article 3.2), kept verbatim,
and the synthetic prompts of exact token counts used by the speed runs.

Every backend gets the same messages and sampling settings; each round records wall time,
time to first token (prefill), decode time, completion tokens and decode tokens/s, with the
backend's own token counts cross-checked against our tokenizer.
"""
from __future__ import annotations

import time

from engine.bench.stats import summarize

SYSTEM = "你是一个简洁、可靠的中文个人助理。只输出最终答案，不要复述任务。"
PROMPTS = [
    ("CUDA Graph", "用一句话解释 CUDA Graph。"),
    ("待办压缩", "把下面这段话压缩成一句待办：\n明天下午三点前把实验报告发给导师，并附上结果表格。"),
]
EXPECTED_PROMPT_TOKENS = [38, 58]  # with the Qwen2.5 chat template (seed article 3.2)
SAMPLING = dict(max_tokens=64, temperature=0.0, top_p=0.95, top_k=50, seed=20261026)
WARMUP = 1
REPEATS = 2

ROW_KEYS = ["wall_s", "ttft_s", "decode_s", "completion_tokens", "decode_tps"]

# Filler for synthetic prompts: mixed English/Chinese/code so the token mix is realistic.
FILLER = ("The quick brown fox jumps over the lazy dog while the GPU streams weights from memory. "
          "静态 KV 缓存让每一步解码的形状保持不变，于是整个步骤可以被 CUDA Graph 捕获并重放。 "
          "def add(a, b):\n    return a + b\n\n")


def messages(prompt: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]


def decode_tps(completion_tokens: int | None, decode_s: float | None) -> float | None:
    """Tokens after the first over the time after the first (the first comes with prefill)."""
    if not completion_tokens or completion_tokens < 2 or not decode_s or decode_s <= 0:
        return None
    return (completion_tokens - 1) / decode_s


def synthetic_ids(tokenizer, n: int, salt: int = 0) -> list[int]:
    """Exactly n token ids cut from repeated filler text. `salt` shifts the start, so repeats do
    not share a prefix (peers with a prompt cache would otherwise skip the prefill)."""
    base = tokenizer.encode(FILLER)
    start = (salt * 7) % len(base)
    reps = (n + start) // len(base) + 2
    return (base * reps)[start:start + n]


def synthetic_text(tokenizer, n: int, salt: int = 0) -> tuple[str, int]:
    """Text whose encoding is n tokens (or as close as re-encoding allows): (text, our_count)."""
    ids = synthetic_ids(tokenizer, n, salt)
    text = tokenizer.decode(ids)
    return text, len(tokenizer.encode(text))


def cross_check(row: dict, tokenizer, rendered_prompt: str | None, text: str | None,
                flag_completion: bool = True) -> None:
    """Record our tokenizer's counts beside the backend's and flag a mismatch.

    Completion: re-encoding the text may differ by one from the generated ids (an EOS token is
    counted by some backends, and BPE may merge across the cut), so a difference of 1 is tolerated;
    speed runs (synthetic, often random-weight output) only fill a missing count."""
    if rendered_prompt is not None:
        ours = len(tokenizer.encode(rendered_prompt))
        row["prompt_tokens_ours"] = ours
        if row.get("prompt_tokens") is not None and row["prompt_tokens"] != ours:
            row.setdefault("flags", []).append(f"prompt tokens: backend {row['prompt_tokens']} vs ours {ours}")
    if text is not None:
        ours = len(tokenizer.encode(text))
        row["completion_tokens_ours"] = ours
        got = row.get("completion_tokens")
        if got is None:  # no usage from the backend: count with ours, and say so
            row["completion_tokens"] = ours
            row.setdefault("flags", []).append("completion tokens counted with our tokenizer (no usage)")
        elif flag_completion and abs(got - ours) > 1:
            row.setdefault("flags", []).append(f"completion tokens: backend {got} vs ours {ours}")


def run_productivity(target, tokenizer, render, progress=print, warmup: int = WARMUP,
                     repeats: int = REPEATS, sampling: dict | None = None) -> dict:
    """Warm up, then `repeats` rounds of both prompts. render(messages) -> prompt text (our template)."""
    sp = dict(SAMPLING, **(sampling or {}))
    for w in range(warmup):
        for label, prompt in PROMPTS:
            progress(f"  [{target.name}] warmup {w} {label}")
            target.chat(messages(prompt), sp)
    rows = []
    for r in range(repeats):
        for i, (label, prompt) in enumerate(PROMPTS):
            msgs = messages(prompt)
            t0 = time.perf_counter()
            res = target.chat(msgs, sp)
            row = {"round": r, "prompt": label, **res}
            row.setdefault("wall_s", time.perf_counter() - t0)
            cross_check(row, tokenizer, render(msgs), row.get("text"))
            row["decode_tps"] = decode_tps(row.get("completion_tokens"), row.get("decode_s"))
            if row.get("prompt_tokens_ours") != EXPECTED_PROMPT_TOKENS[i]:
                row.setdefault("flags", []).append(
                    f"our prompt count {row.get('prompt_tokens_ours')} != protocol's {EXPECTED_PROMPT_TOKENS[i]}")
            rows.append(row)
            tps = row["decode_tps"]
            progress(f"  [{target.name}] round {r} {label}: wall {row['wall_s']:.3f}s ttft {row['ttft_s']:.3f}s "
                     f"{row.get('completion_tokens')} tok {tps and f'{tps:.1f}' or '-'} tok/s")
    return {"protocol": "productivity", "settings": {"system": SYSTEM, "prompts": [p for _, p in PROMPTS],
                                                     "warmup": warmup, "repeats": repeats, **sp},
            "rows": rows, "median": summarize(rows, ROW_KEYS + ["native_prefill_s", "native_decode_tps"])}
