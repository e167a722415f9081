"""Grammar-constrained decoding: a JSON schema (or any JSON object, or a forced tool call) becomes a token
mask at every step, so the output is valid by construction, not by asking the model nicely.

The library is llguidance (why: docs/api.md "Structured outputs"; measured by engine/bench/grammar_libs.py).

    HTTP thread   compile_json(tokenizer, n_vocab, schema) -> Grammar   (a bad schema is a 400 here)
    engine thread Matcher(grammar) per sequence; each step:
                    allowed(device) -> bool [vocab] on the logits' device (the sampler masks the logits with it)
                    accept(token)   after sampling (the sequence stops when the grammar is complete)

The mask is computed on the host into a pinned buffer (llguidance releases the GIL), copied to the logits'
device without a sync and expanded there: one masked fill before temperature / argmax.
"""
from __future__ import annotations

import json
import threading
import weakref
from dataclasses import dataclass

import llguidance
import torch

from engine.errors import BadRequestError

# compact JSON: the model cannot burn max_tokens on runs of whitespace, and `{"a":1}` is what parsers expect
JSON_OPTIONS = {"whitespace_flexible": False}
_tokenizers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # Tokenizer -> {n_vocab: LLTokenizer}
_lock = threading.Lock()
_shifts: dict = {}  # device -> arange(32) int32


def ll_tokenizer(tokenizer, n_vocab: int) -> llguidance.LLTokenizer:
    """The llguidance view of our Tokenizer (engine/formats/tokenizer.py), built once (~1 s for Qwen's 151k
    tokens) and cached. n_vocab is the model's logits width (151,936 for Qwen2.5; the tokenizer has 151,665)."""
    with _lock:
        by_n = _tokenizers.setdefault(tokenizer, {})
        if n_vocab not in by_n:
            by_n[n_vocab] = llguidance.LLTokenizer(tokenizer.tok.to_str(), n_vocab=n_vocab,
                                                   eos_token=list(tokenizer.eos_token_ids))
        return by_n[n_vocab]


@dataclass(frozen=True)
class Grammar:
    """A compiled, validated constraint; shared by the request's sequence(s)."""
    text: str  # llguidance grammar (its JSON form)
    tokenizer: llguidance.LLTokenizer
    n_vocab: int
    kind: str  # "json_schema" | "json_object" | "tool_call" (logs, errors)


def compile_json(tokenizer, n_vocab: int, schema: dict | None, kind: str = "json_schema") -> Grammar:
    """JSON schema (None: any JSON object) -> Grammar. Raises BadRequestError for a schema llguidance cannot
    compile (unsupported keyword, bad $ref, ...)."""
    if schema is None:
        schema = {"type": "object"}
    if not isinstance(schema, dict):
        raise BadRequestError("the JSON schema must be an object", "send a JSON Schema object")
    try:
        text = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_OPTIONS)
    except (ValueError, TypeError) as e:
        raise BadRequestError(f"invalid JSON schema: {e}", "send a valid JSON Schema") from e
    lt = ll_tokenizer(tokenizer, n_vocab)
    is_error, msgs = llguidance.LLMatcher.validate_grammar_with_warnings(text, lt)
    if is_error:
        raise BadRequestError(f"this JSON schema cannot be enforced: {msgs[0] if msgs else 'invalid'}",
                              "simplify the schema (supported: docs/api.md, Structured outputs)")
    return Grammar(text, lt, n_vocab, kind)


def tool_call_schema(tools: list[dict], name: str | None = None) -> dict:
    """The JSON a forced tool call must match: {"name": <one of the functions>, "arguments": <its parameters>}
    (Qwen2.5's call format; engine/server/tools.py parses it). name: only that function."""
    options = []
    for t in tools:
        f = t.get("function") if isinstance(t, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or (name and f["name"] != name):
            continue
        params = f.get("parameters") or {"type": "object"}
        options.append({"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": params},
                        "required": ["name", "arguments"], "additionalProperties": False})
    if not options:
        raise BadRequestError(f"tool_choice names {name!r}, which is not in tools" if name else
                              "tool_choice requires a tool call but no function tool was given",
                              "send the function in tools")
    return options[0] if len(options) == 1 else {"anyOf": options}


def _shift(device) -> torch.Tensor:
    s = _shifts.get(device)
    if s is None:
        s = _shifts[device] = torch.arange(32, dtype=torch.int32, device=device)
    return s


class Matcher:
    """One sequence's position in its grammar."""

    def __init__(self, grammar: Grammar):
        self.grammar = grammar
        self.m = llguidance.LLMatcher(grammar.tokenizer, grammar.text, log_level=0)
        self._words = torch.empty((grammar.n_vocab + 31) // 32, dtype=torch.int32,
                                  pin_memory=torch.cuda.is_available())
        self._next: torch.Tensor | None = None  # the mask of the current state, computed ahead (prefetch)

    def prefetch(self, device):
        """Compute the current state's mask now: the GPU runner calls this while its decode step runs, so the
        CPU's mask work overlaps the GPU's; allowed() then returns it."""
        self._next = self._compute(device)

    def allowed(self, device) -> torch.Tensor:
        """bool [n_vocab] on `device`: the tokens the grammar allows next (EOS only once it is complete)."""
        m, self._next = self._next, None
        return m if m is not None and m.device == torch.device(device) else self._compute(device)

    def _compute(self, device) -> torch.Tensor:
        """The previous step's copy has finished: its sampled token was read on the host before this call."""
        w = self._words
        self.m.unsafe_compute_mask_ptr(w.data_ptr(), w.numel() * 4)
        words = w.to(device, non_blocking=True)
        bits = (words.unsqueeze(1) >> _shift(words.device)) & 1  # [words, 32], bit j of word i = token 32*i+j
        return bits.view(-1)[:self.grammar.n_vocab].bool()

    def accept(self, token: int) -> bool:
        """Advance by the sampled token; False if the grammar rejects it (the matcher is then in error)."""
        self._next = None
        return self.m.consume_token(token)

    @property
    def done(self) -> bool:
        """The grammar is complete (only EOS may follow) or broken: the sequence ends here."""
        return self.m.is_stopped()

    @property
    def error(self) -> str:
        return self.m.get_error()
