"""Which grammar library: llguidance, xgrammar and outlines-core on the Qwen2.5 tokenizer (151,936 logits).

    python -m engine.bench.grammar_libs --out docs/results/grammar_libs_cpu.json

For each library that imports: the time to build its tokenizer view, to compile a JSON schema (and a free
JSON object where it has one), and the time per token to compute the next-token mask while it walks a
fixed valid output token by token (3 passes; mean / median / max); and what the engine adds per constrained
token on the CPU with llguidance (engine/runtime/logits.py: mask, expand, masked fill, accept). One thread (OMP_NUM_THREADS=1, xgrammar
max_threads=1) so the numbers compare. Only llguidance is a dependency; install the others to compare.
xgrammar imports transformers at load even when its tokenizer info is built from the vocabulary (as here):
without transformers installed, the bench puts an empty stand-in module in its place.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types
from pathlib import Path

import llguidance
import llguidance.torch as lt
import torch

from engine.bench.envinfo import environment
from engine.formats.tokenizer import bundled_qwen2_tokenizer
from engine.runtime import grammar
from engine.runtime.logits import process
from engine.runtime.sampling import SamplingParams
from engine.runtime.sequence import Sequence
from engine.server.structured import _BYTE_OF  # byte-level token text -> raw bytes

N_VOCAB = 151936  # Qwen2.5's logits width (the tokenizer has 151,665 tokens)
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city", "zip"], "additionalProperties": False},
    "active": {"type": "boolean"}},
    "required": ["name", "age", "email", "tags", "address", "active"], "additionalProperties": False}
TARGET = json.dumps({"name": "Alice Smith", "age": 31, "email": "alice@example.com", "tags": ["admin", "dev", "ops"],
                     "address": {"city": "Berlin", "zip": "10115"}, "active": True}, separators=(",", ":"))
PASSES = 3


def _stats(ts: list[float]) -> dict:
    return {"mean_us": round(statistics.mean(ts) * 1e6, 1), "p50_us": round(statistics.median(ts) * 1e6, 1),
            "max_us": round(max(ts) * 1e6, 1), "tokens": len(ts)}


def _allowed(words: torch.Tensor, t: int) -> bool:
    return bool((int(words.view(-1)[t // 32]) >> (t % 32)) & 1)


def _walk(make, fill, accept, ids: list[int]) -> list[float]:
    """PASSES walks of ids through a fresh matcher: the mask time before each token (checked to allow it)."""
    ts = []
    for _ in range(PASSES):
        m = make()
        for t in ids:
            a = time.perf_counter()
            words = fill(m)
            ts.append(time.perf_counter() - a)
            assert _allowed(words, t), f"token {t} masked"
            assert accept(m, t) is not False
    return ts


def bench_llguidance(tok, ids, eos) -> dict:
    t0 = time.perf_counter()
    lltok = llguidance.LLTokenizer(tok.tok.to_str(), n_vocab=N_VOCAB, eos_token=eos)
    out = {"version": llguidance.__version__ if hasattr(llguidance, "__version__") else None,
           "tokenizer_init_s": round(time.perf_counter() - t0, 3)}
    opts = {"whitespace_flexible": False}
    for name, schema in (("json_schema", SCHEMA), ("json_object", {"type": "object"})):
        g = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=opts)
        t0 = time.perf_counter()
        llguidance.LLMatcher(lltok, g)
        out[name + "_compile_s"] = round(time.perf_counter() - t0, 4)
        bm = lt.allocate_token_bitmask(1, N_VOCAB)

        def fill(m, bm=bm):
            lt.fill_next_token_bitmask(m, bm)
            return bm
        out[name + "_mask"] = _stats(_walk(lambda g=g: llguidance.LLMatcher(lltok, g), fill,
                                           lambda m, t: m.consume_token(t), ids))
    return out


def bench_xgrammar(tok, ids, eos) -> dict:
    if "transformers" not in sys.modules:
        try:
            import transformers  # noqa: F401  # optional peer: xgrammar imports it at load
        except ImportError:
            stub = types.ModuleType("transformers")
            stub.__getattr__ = lambda name: type(name, (), {})
            sys.modules["transformers"] = stub
    import xgrammar as xgr  # optional peer: compared when installed
    t0 = time.perf_counter()
    enc = [""] * N_VOCAB
    for s, i in tok.tok.get_vocab(with_added_tokens=True).items():
        enc[i] = s
    info = xgr.TokenizerInfo(enc, vocab_type=xgr.VocabType.BYTE_LEVEL, vocab_size=N_VOCAB, stop_token_ids=eos)
    comp = xgr.GrammarCompiler(info, max_threads=1)
    out = {"version": getattr(xgr, "__version__", None), "tokenizer_init_s": round(time.perf_counter() - t0, 3)}
    for name, fn in (("json_schema", lambda: comp.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False,
                                                                      separators=(",", ":"))),
                     ("json_object", comp.compile_builtin_json_grammar)):
        t0 = time.perf_counter()
        cg = fn()
        out[name + "_compile_s"] = round(time.perf_counter() - t0, 4)
        bm = xgr.allocate_token_bitmask(1, N_VOCAB)

        def fill(m, bm=bm):
            m.fill_next_token_bitmask(bm)
            return bm
        out[name + "_mask"] = _stats(_walk(lambda cg=cg: xgr.GrammarMatcher(cg), fill,
                                           lambda m, t: m.accept_token(t), ids))
    return out


def bench_outlines_core(tok, ids, eos) -> dict:
    from outlines_core import Guide, Index, Vocabulary  # optional peer: compared when installed
    from outlines_core.json_schema import build_regex_from_schema  # optional peer
    t0 = time.perf_counter()
    vocab: dict[bytes, list[int]] = {}
    for s, i in tok.tok.get_vocab(with_added_tokens=False).items():
        if i not in eos and all(c in _BYTE_OF for c in s):
            vocab.setdefault(bytes(_BYTE_OF[c] for c in s), []).append(i)
    voc = Vocabulary(eos[0], vocab)
    out = {"tokenizer_init_s": round(time.perf_counter() - t0, 3)}
    t0 = time.perf_counter()
    index = Index(build_regex_from_schema(json.dumps(SCHEMA)), voc)
    out["json_schema_compile_s"] = round(time.perf_counter() - t0, 4)
    words = torch.zeros((N_VOCAB + 31) // 32, dtype=torch.int32)

    def fill(g):
        g.write_mask_into(words.data_ptr(), words.numel(), 4)
        return words
    out["json_schema_mask"] = _stats(_walk(lambda: Guide(index), fill, lambda g, t: g.advance(t), ids))
    out["json_object"] = "none: regex-based, a free-form (recursive) JSON object has no regex"
    return out


def bench_engine_mask(tok, ids) -> dict:
    """What the engine adds per constrained token on the CPU: engine/runtime/logits.py process() (llguidance
    mask into the pinned buffer, expand to 151,936 bools, one masked fill of the fp32 logits) + the accept."""
    g = grammar.compile_json(tok, N_VOCAB, SCHEMA)
    logits = torch.randn(N_VOCAB)
    ts = []
    for _ in range(PASSES):
        seq = Sequence([1], SamplingParams(max_tokens=len(ids) + 1, grammar=g), tok)
        for t in ids:
            a = time.perf_counter()
            x = process(logits, seq)
            seq.matcher.accept(t)
            ts.append(time.perf_counter() - a)
            assert torch.isfinite(x[t])
    return {"process_and_accept": _stats(ts)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    tok = bundled_qwen2_tokenizer()
    ids = tok.encode(TARGET)
    eos = [tok.im_end_id]
    res = {}
    for name, fn in (("llguidance", bench_llguidance), ("xgrammar", bench_xgrammar),
                     ("outlines_core", bench_outlines_core)):
        try:
            res[name] = fn(tok, ids, eos)
        except ImportError as e:
            res[name] = {"not_installed": str(e)}
        print(name, json.dumps(res[name]), flush=True)
    res["engine_mask_cpu"] = bench_engine_mask(tok, ids)
    print("engine_mask_cpu", json.dumps(res["engine_mask_cpu"]), flush=True)
    doc = {"what": "grammar libraries: next-token mask time per token, Qwen2.5 tokenizer, JSON schema "
                   "(engine/bench/grammar_libs.py)", "target_tokens": len(ids), "n_vocab": N_VOCAB,
           "results": res, "environment": {**environment(), "command": "python -m engine.bench.grammar_libs " +
                                           " ".join(argv if argv is not None else sys.argv[1:])}}
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
