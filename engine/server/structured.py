"""Structured outputs, tool forcing, logprobs and logit biases: request fields -> SamplingParams extras, and
the engine's logprob entries -> OpenAI JSON. Every field is honoured or refused with a 400 (docs/api.md).

    response_format {"type": "json_object"}            output is one JSON object (grammar-constrained)
    response_format {"type": "json_schema", ...}       output matches the schema (strict or not: enforced)
    tool_choice "required" / {"type": "function", ...} output is a call of one offered (or the named) function
    logprobs / top_logprobs (<= 5), logit_bias, presence_penalty, frequency_penalty
"""
from __future__ import annotations

from engine.errors import BadRequestError
from engine.runtime import grammar
from engine.runtime.logits import MAX_TOP_LOGPROBS
from engine.server.errors import APIError

# GPT-2 byte-level alphabet: a token's string form -> its raw bytes (the `bytes` of a logprob entry)
_BS = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
_BYTE_OF = {chr(b): b for b in _BS}
_BYTE_OF.update({chr(256 + n): b for n, b in enumerate(b for b in range(256) if b not in _BS)})


def _bad(msg: str, param: str, code: str = "invalid_value") -> APIError:
    return APIError(400, msg, param=param, code=code)


def _compile(spec, schema, kind: str, param: str):
    try:
        return grammar.compile_json(spec.tokenizer, spec.config.vocab_size, schema, kind)
    except BadRequestError as e:
        raise _bad(f"{e.message}. Fix: {e.fix}" if e.fix else e.message, param) from e


def response_format_grammar(spec, rf) -> object | None:
    """OpenAI response_format -> Grammar (None for text)."""
    if rf is None:
        return None
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise _bad('response_format must be an object with a "type"', "response_format")
    t = rf["type"]
    if t == "text":
        return None
    if t == "json_object":
        return _compile(spec, None, "json_object", "response_format")
    if t == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict):
            raise _bad('response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}',
                       "response_format.json_schema")
        return _compile(spec, js.get("schema"), "json_schema", "response_format.json_schema.schema")
    raise _bad(f"response_format type {t!r} is not supported (text, json_object, json_schema are)",
               "response_format.type", "unsupported_value")


def tool_choice_grammar(spec, tools: list | None, tool_choice) -> object | None:
    """tool_choice "required" or a named function -> Grammar of one valid call; "auto" / "none" / None -> None."""
    if tool_choice in (None, "auto", "none"):
        return None
    name = None
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        f = tool_choice.get("function") if isinstance(tool_choice.get("function"), dict) else tool_choice
        name = f.get("name")
        if not isinstance(name, str):
            raise _bad('a named tool_choice is {"type": "function", "function": {"name": ...}}', "tool_choice")
    elif tool_choice != "required":
        raise _bad(f"tool_choice {tool_choice!r} is not supported (none, auto, required or a function)",
                   "tool_choice", "unsupported_value")
    try:
        schema = grammar.tool_call_schema(tools or [], name)
    except BadRequestError as e:
        raise _bad(e.message, "tool_choice") from e
    return _compile(spec, schema, "tool_call", "tools")


def constraint(spec, response_format, tools: list | None, tool_choice) -> object | None:
    rf = response_format_grammar(spec, response_format)
    tc = tool_choice_grammar(spec, tools, tool_choice)
    if rf is not None and tc is not None:
        raise _bad("a forced tool_choice and a JSON response_format cannot both shape the same output; send one",
                   "tool_choice")
    return rf or tc


def logprobs_count(logprobs, top_logprobs, chat: bool) -> int | None:
    """-> None (off) or the number of alternatives per token (0..5)."""
    if chat:
        if top_logprobs and not logprobs:
            raise _bad("top_logprobs needs logprobs: true", "top_logprobs")
        if not logprobs:
            return None
        n = top_logprobs or 0
        param = "top_logprobs"
    else:
        if logprobs is None or logprobs is False:
            return None
        n = 0 if logprobs is True else logprobs
        param = "logprobs"
    if not 0 <= n <= MAX_TOP_LOGPROBS:
        raise _bad(f"{param} must be between 0 and {MAX_TOP_LOGPROBS}", param)
    return n


def logit_bias(bias: dict | None, vocab: int) -> dict[int, float] | None:
    if not bias:
        return None
    out = {}
    for k, v in bias.items():
        try:
            tid = int(k)
        except ValueError:
            raise _bad(f"logit_bias keys are token ids; got {k!r}", "logit_bias") from None
        if not 0 <= tid < vocab:
            raise _bad(f"logit_bias token id {tid} is outside the vocabulary (0..{vocab - 1})", "logit_bias")
        if not -100 <= v <= 100:
            raise _bad(f"logit_bias values must be in [-100, 100]; got {v}", "logit_bias")
        out[tid] = float(v)
    return out


def penalty(value, param: str) -> float:
    if value is None:
        return 0.0
    if not -2.0 <= value <= 2.0:
        raise _bad(f"{param} must be in [-2, 2]", param)
    return float(value)


# --- engine entries -> OpenAI JSON ----------------------------------------------------------------
def token_bytes(tokenizer, tid: int) -> bytes:
    s = tokenizer.tok.id_to_token(tid) or ""
    if all(c in _BYTE_OF for c in s):
        return bytes(_BYTE_OF[c] for c in s)
    return s.encode("utf-8")  # special tokens are stored as their text


def _tok(tokenizer, tid: int) -> tuple[str, list[int]]:
    b = token_bytes(tokenizer, tid)
    return b.decode("utf-8", "replace"), list(b)


def _visible(entries: list, tokenizer) -> list:
    eos = set(tokenizer.eos_token_ids)
    return [e for e in entries or [] if e[0] not in eos]  # the EOS that ended the output is not part of it


def chat_logprobs(entries: list | None, tokenizer) -> dict | None:
    """Engine entries (id, logprob, [(id, logprob)]) -> chat `logprobs` {"content": [...]}"""
    if entries is None:
        return None
    content = []
    for tid, lp, top in _visible(entries, tokenizer):
        t, b = _tok(tokenizer, tid)
        alts = []
        for aid, alp in top:
            at, ab = _tok(tokenizer, aid)
            alts.append({"token": at, "logprob": alp, "bytes": ab})
        content.append({"token": t, "logprob": lp, "bytes": b, "top_logprobs": alts})
    return {"content": content, "refusal": None}


def completion_logprobs(entries: list | None, tokenizer, offset: int = 0) -> dict | None:
    """-> legacy completions `logprobs` {"tokens", "token_logprobs", "top_logprobs", "text_offset"}."""
    if entries is None:
        return None
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for tid, lp, top in _visible(entries, tokenizer):
        t = _tok(tokenizer, tid)[0]
        out["tokens"].append(t)
        out["token_logprobs"].append(lp)
        out["top_logprobs"].append({_tok(tokenizer, a)[0]: alp for a, alp in top})
        out["text_offset"].append(offset)
        offset += len(t)
    return out


# OpenAI chat fields this server cannot honour: refused (400) when set, never silently dropped. Fields without
# generation semantics (user, metadata, store, service_tier, safety_identifier, prompt_cache_key) are accepted.
REFUSED = {
    "audio": "audio output is not supported; omit audio",
    "prediction": "predicted outputs are not supported; omit prediction",
    "reasoning_effort": "this model does not reason; omit reasoning_effort",
    "web_search_options": "web search is not available; omit web_search_options",
    "functions": "the deprecated functions field is not supported; send tools",
    "function_call": "the deprecated function_call field is not supported; send tool_choice",
    "verbosity": "verbosity is not supported; omit it",
}


def refuse_unhonoured(body):
    extra = body.model_extra or {}
    for name, why in REFUSED.items():
        if extra.get(name) is not None:
            raise _bad(why, name, "unsupported_value")
    mods = extra.get("modalities")
    if mods is not None and mods != ["text"]:
        raise _bad('only modalities ["text"] is supported', "modalities", "unsupported_value")


def apply(params, body, spec, chat: bool):
    """Set the request's structured-output, logprob and bias fields on its SamplingParams (400 on bad values)."""
    refuse_unhonoured(body)
    tools = getattr(body, "tools", None)
    params.grammar = constraint(spec, getattr(body, "response_format", None), tools, getattr(body, "tool_choice", None))
    params.logprobs = logprobs_count(body.logprobs, getattr(body, "top_logprobs", None), chat)
    params.logit_bias = logit_bias(body.logit_bias, spec.config.vocab_size)
    params.presence_penalty = penalty(body.presence_penalty, "presence_penalty")
    params.frequency_penalty = penalty(body.frequency_penalty, "frequency_penalty")
