"""The draft vocabulary: the tokens the draft heads may guess (a subset of the Qwen2 vocabulary, ~1/5 of it).

The heads' draft ends in the model's lm_head over K rows and a top-k (engine/runtime/draft_heads.py): on the real
0.5B (a Q4_K_M GGUF whose tied embedding loads as 8-bit groups of 32) that GEMV reads 136 MB and takes ~49 us of a
~1 ms tree step, the top-k over 151,936 logits ~11 us more. A guess outside the tokens the model writes in practice
is never accepted anyway, so the heads' lm_head runs over the rows of this subset only (EAGLE-3 drafts over a 32k
vocabulary for the same reason); the verify step is the model's own full lm_head, so outputs do not change.

The subset is a property of the tokenizer, not of a model: every Qwen2.5 size shares it. It is built once, at
development time, from word frequencies of English and Chinese (the wordfreq package's `large_en` / `large_zh`
lists: Apache-2.0 code, data CC-BY-SA 4.0, https://github.com/rspeer/wordfreq), each word's tokens weighted by the
word's frequency (English words with a leading space mostly, as running text has them), the two languages weighted
alike; plus every byte token, the special tokens, digits and punctuation of both languages. The top `size` ids are
written sorted to assets/drafters/qwen2.draft_vocab.npy (int32):

    pip install --target /tmp/wf wordfreq msgpack   # only to build the asset
    PYTHONPATH=/tmp/wf python -m engine.draft.vocab --size 32768 --out assets/drafters/qwen2.draft_vocab.npy

Coverage of what the model writes (its own greedy outputs through the tray's templates) is measured by
`python -m engine.draft.vocab --coverage --device cuda` and recorded in docs/results/draft_vocab_coverage_0.5b.json.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from engine.assets_path import asset

ASSET = "drafters/qwen2.draft_vocab.npy"
QWEN2_VOCAB = 151936  # lm_head rows of every Qwen2.5 model (the tokenizer's ids are below it)
# forms an English word takes in running text, and their shares
EN_FORMS = ((" {}", 0.75), ("{}", 0.10), (" {}", 0.10, str.capitalize), ("{}", 0.05, str.capitalize))
PUNCT = list(".,;:!?'\"()[]{}<>-_/\\|@#$%^&*+=~`") + list("，。、！？：；“”‘’（）《》【】…—·「」『』") + \
    ["\n", "\n\n", " \n", "...", " -", " (", " \"", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]


def load(vocab_size: int) -> np.ndarray | None:
    """The bundled draft vocabulary (sorted int64 ids) for a model whose lm_head has vocab_size rows, or None (another
    tokenizer: the heads then draft over the whole vocabulary)."""
    if vocab_size != QWEN2_VOCAB:
        return None
    try:
        p = Path(asset(ASSET))
    except FileNotFoundError:
        return None
    ids = np.load(p).astype(np.int64)
    if ids.ndim != 1 or not len(ids) or ids.min() < 0 or ids.max() >= vocab_size or np.any(np.diff(ids) <= 0):
        return None  # not a sorted set of ids of this vocabulary: draft over all of it
    return ids


def _cbpack(path: Path) -> list[tuple[str, float]]:
    """wordfreq's cBpack list: [header, bucket 0, bucket 1, ..]; the words of bucket i have frequency 10^(-i/100)."""
    import msgpack
    with gzip.open(path) as f:
        data = msgpack.load(f, raw=False)
    return [(w, 10 ** (-i / 100)) for i, bucket in enumerate(data[1:]) for w in bucket]


def token_weights(tok, en: list[tuple[str, float]], zh: list[tuple[str, float]]) -> Counter:
    """Expected occurrences of each token id in running text: half English, half Chinese."""
    out: Counter = Counter()
    for words, forms in ((en, EN_FORMS), (zh, (("{}", 1.0),))):
        total = sum(f for _, f in words)
        for w, f in words:
            for form in forms:
                text = form[0].format(form[2](w) if len(form) > 2 else w)
                for t in tok.encode(text):
                    out[t] += 0.5 * form[1] * f / total
    return out


def build(tok, en, zh, size: int) -> np.ndarray:
    """The `size` likeliest ids, always with the byte tokens, special tokens, digits and punctuation."""
    must = set(range(256)) | {t for p in PUNCT for t in tok.encode(p)}
    must |= {i for i in range(151643, min(QWEN2_VOCAB, 151665))}  # <|endoftext|>, <|im_start|>, <|im_end|>, ...
    w = token_weights(tok, en, zh)
    ranked = [t for t, _ in w.most_common() if t not in must]
    ids = sorted(must | set(ranked[:max(0, size - len(must))]))
    return np.asarray(ids, dtype=np.int32)


def coverage(ids: np.ndarray, outputs: list[list[int]]) -> float:
    s = set(ids.tolist())
    toks = [t for o in outputs for t in o]
    return sum(t in s for t in toks) / max(1, len(toks))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.draft.vocab", description=__doc__.splitlines()[0])
    p.add_argument("--wordfreq", help="wordfreq's data folder (default: the installed package's)")
    p.add_argument("--size", type=int, default=32768, help="ids kept (a multiple of 64: the GEMV's tile)")
    p.add_argument("--out", help="write the vocabulary here (.npy)")
    p.add_argument("--coverage", action="store_true", help="measure coverage of the 0.5B's own outputs")
    p.add_argument("--texts", type=int, default=16, help="--coverage: training texts (draft_texts, never the bench's)")
    p.add_argument("--report", help="--coverage: JSON report")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="--coverage: where the model runs")
    a = p.parse_args(argv)
    if a.size % 64:
        p.error("--size must be a multiple of 64")
    from engine.formats.tokenizer import bundled_qwen2_tokenizer
    tok = bundled_qwen2_tokenizer()
    if a.out:
        if a.wordfreq:
            data = Path(a.wordfreq)
        else:
            import importlib.util
            spec = importlib.util.find_spec("wordfreq")
            if spec is None:
                p.error("building needs wordfreq's data (pip install wordfreq msgpack, or --wordfreq DIR)")
            data = Path(spec.origin).parent / "data"
        ids = build(tok, _cbpack(data / "large_en.msgpack.gz"), _cbpack(data / "large_zh.msgpack.gz"), a.size)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        np.save(a.out, ids)
        print(f"{len(ids)} ids -> {a.out}", file=sys.stderr)
    if a.coverage:
        report = measure_coverage(a.texts, a.device)
        print(json.dumps(report, ensure_ascii=False))
        if a.report:
            Path(a.report).write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


def measure_coverage(n_texts: int, device: str = "cpu") -> dict:
    """The 0.5B's greedy outputs for the translate and rewrite templates over draft_texts' training texts:
    the share of their tokens inside the bundled draft vocabulary, and inside the first N ids for comparison."""
    from engine.bench.draft_texts import train_texts
    from engine.config import EngineConfig
    from engine.runtime.llm import LLM
    from engine.runtime.sampling import SamplingParams
    from trayapp.config import default_config
    from trayapp.templates import render_messages
    llm = LLM(EngineConfig(model="qwen2.5-coder-0.5b", device=device, max_context=1024, draft_heads=""))
    cfg = default_config("zh")
    texts = train_texts()[:n_texts]
    outs = []
    for tid in ("translate", "rewrite"):
        for t in texts:
            c = llm.complete(llm.render(render_messages(cfg.template(tid), t, cfg.lang)),
                             SamplingParams(max_tokens=64, temperature=0.0))
            outs.append(c.token_ids)
    ids = load(QWEN2_VOCAB)
    n = len(ids) if ids is not None else 0
    return {"texts": len(texts), "templates": ["translate", "rewrite"], "output_tokens": sum(map(len, outs)),
            "draft_vocab_size": n, "coverage": round(coverage(ids, outs), 4) if n else None,
            "coverage_first_ids_same_size": round(coverage(np.arange(n), outs), 4) if n else None,
            "device": device, "command": f"python -m engine.draft.vocab --coverage --texts {n_texts} --device {device}"}


if __name__ == "__main__":
    sys.exit(main())
