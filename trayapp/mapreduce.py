"""Long selections: map-reduce summarization so the final prompt fits the model's context.

Token counting is a char-based budget, not a tokenizer call: the tray must not import the
tokenizer/torch, and a /v1/completions usage probe would cost a full prefill of the long text.
`estimate_tokens` over-counts Qwen2.5's byte-level BPE on purpose (tests check it against the
real tokenizer): ASCII letters (and spaces before them) count 1/3 token, every other character (CJK, digits,
punctuation, code symbols) 1 token. If the text does not fit, it is cut into chunks that do, each chunk is
summarized (map), the summaries are joined (reduce) and the loop repeats until the joined text
fits; then the user's template runs on it.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable

from trayapp.templates import ZH, detect_lang

CHAT_OVERHEAD = 32  # ChatML markers + role names, per request
_WORDISH = re.compile(r"[A-Za-z]| (?=[A-Za-z])")
_SENTENCE = re.compile(r"(?<=[。！？；.!?;])\s*")


def estimate_tokens(text: str) -> int:
    """Upper bound of Qwen2.5 token count: CJK, digits (Qwen splits numbers per digit), symbols and
    other non-ASCII count 1 each; ASCII letters, and spaces before letters, 1 per 3 (English averages
    ~4.5 chars per token; a space before a digit or symbol is a token of its own)."""
    words = len(_WORDISH.findall(text))
    return len(text) - words + math.ceil(words / 3)


def fits(messages: list[dict], max_tokens: int, context_tokens: int) -> bool:
    used = sum(estimate_tokens(m["content"]) for m in messages) + CHAT_OVERHEAD
    return used + max_tokens <= context_tokens


def _units(text: str, budget: int) -> list[str]:
    """Paragraphs, then sentences, then hard character cuts: each unit fits `budget` tokens."""
    out = []
    for para in text.split("\n"):
        if estimate_tokens(para) <= budget:
            out.append(para)
            continue
        for sent in _SENTENCE.split(para):
            while estimate_tokens(sent) > budget:
                out.append(sent[:budget])  # <= budget estimated tokens: every char counts <= 1
                sent = sent[budget:]
            out.append(sent)
    return out


def split_chunks(text: str, budget: int) -> list[str]:
    """Greedy packing of units into chunks of at most `budget` estimated tokens."""
    chunks, cur, cur_tok = [], [], 0
    for u in _units(text, budget):
        t = estimate_tokens(u) + 1
        if cur and cur_tok + t > budget:
            chunks.append("\n".join(cur))
            cur, cur_tok = [], 0
        cur.append(u)
        cur_tok += t
    if cur:
        chunks.append("\n".join(cur))
    return [c for c in chunks if c.strip()]


def map_messages(chunk: str, part: int, parts: int) -> list[dict]:
    if detect_lang(chunk) == ZH:
        q = (f"下面是一篇长文的第 {part}/{parts} 部分。用中文简要概括这一部分，保留人名、数字、日期和待办事项，"
             f"只输出概括：\n\n{chunk}")
    else:
        q = (f"This is part {part}/{parts} of a longer text. Summarize this part briefly, keeping names, numbers, "
             f"dates and action items. Output only the summary:\n\n{chunk}")
    return [{"role": "user", "content": q}]


def reduce_to_fit(text: str, room: int, context_tokens: int, summarize: Callable[[list[dict], int], str],
                  progress: Callable[[int, int, int], None] | None = None, max_rounds: int = 4) -> str:
    """Shrink `text` until estimate_tokens(text) <= room.

    summarize(messages, max_tokens) runs one chat request; progress(done, total, round) after each chunk.
    """
    map_tokens = max(32, min(256, context_tokens // 8))
    chunk_budget = context_tokens - map_tokens - CHAT_OVERHEAD - estimate_tokens(map_messages("", 9, 9)[0]["content"])
    if chunk_budget < 64:
        raise ValueError(f"context of {context_tokens} tokens is too small to summarize in parts")
    for rnd in range(1, max_rounds + 1):
        if estimate_tokens(text) <= room:
            return text
        chunks = split_chunks(text, chunk_budget)
        # each summary gets its share of the room, so the joined summaries fit in one round
        per_chunk = max(16, min(map_tokens, room // len(chunks)))
        summaries = []
        for i, c in enumerate(chunks, 1):
            summaries.append(summarize(map_messages(c, i, len(chunks)), per_chunk).strip())
            if progress:
                progress(i, len(chunks), rnd)
        joined = "\n".join(s for s in summaries if s)
        if estimate_tokens(joined) >= estimate_tokens(text):  # not shrinking: stop and cut
            text = joined
            break
        text = joined
    if estimate_tokens(text) > room:  # last resort, stated in docs: keep the head that fits
        keep = split_chunks(text, room)
        text = keep[0] if keep else ""
    return text
