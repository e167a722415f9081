"""Request body -> GenerateRequest: model id, chat template, tokenization, sampling params.

This is the HTTP layer's share of the work (llama.cpp-server style): the engine thread only
ever sees token ids and a SamplingParams. Runs in a worker thread (tokenizing a long prompt
must not block the event loop).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from engine.formats.chat import render_chat
from engine.errors import BadRequestError, ContextOverflowError
from engine.runtime.sampling import MAX_STOP, MAX_STOP_BYTES, SamplingParams
from engine.server.errors import APIError, from_engine
from engine.server import structured
from engine.server.tools import check_tools, tool_names
from engine.server.schemas import ChatCompletionRequest, CompletionRequest, SamplingFields
from engine.runtime.worker import EngineWorker
from engine.runtime.worker_types import GenerateRequest

DEFAULT_TEMPERATURE = 0.7  # OpenAI's default is 1.0; too noisy for a small coder model
FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")


@dataclass
class Prepared:
    request: GenerateRequest
    model: str  # backend id (echoed in responses)
    include_usage: bool
    echo: str = ""  # /v1/completions echo=true: prompt text put before the output
    tools: set[str] | None = None  # function names offered: parse tool calls from the output
    parallel_tools: bool = True  # parallel_tool_calls: false -> at most one call is returned
    tokenizer: object = None  # formats logprobs (engine/server/structured.py)


def _encode(tokenizer, text: str) -> list[int]:
    try:
        return tokenizer.encode(text)
    except Exception:  # lone surrogates from JSON "\ud800" escapes cannot be encoded
        return tokenizer.encode(text.encode("utf-8", "replace").decode("utf-8"))


def _refuse_unsupported(body: SamplingFields):
    if body.n is not None and body.n != 1:
        raise APIError(400, f"n={body.n} is not supported: this server returns one choice; send n=1 "
                            "(or omit it) and repeat the request for more", param="n", code="unsupported_value")
    best_of = getattr(body, "best_of", None)
    if best_of is not None and best_of != 1:
        raise APIError(400, "best_of > 1 is not supported", param="best_of", code="unsupported_value")


def _overflow(e: ContextOverflowError, param: str) -> APIError:
    err = from_engine(e)
    err.param = param
    return err


def stop_list(stop) -> list[str]:
    """The request's stop strings, bounded (each one is checked per generated token)."""
    stop = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stop) > MAX_STOP:
        raise APIError(400, f"stop holds {len(stop)} strings; at most {MAX_STOP} are accepted", param="stop",
                       code="invalid_value")
    for s in stop:
        if len(s.encode("utf-8", "surrogatepass")) > MAX_STOP_BYTES:
            raise APIError(400, f"a stop string is longer than {MAX_STOP_BYTES} bytes", param="stop",
                           code="invalid_value")
    return stop


def sampling(body: SamplingFields, n_prompt: int, max_context: int, prompt_param: str = "messages") -> SamplingParams:
    """prompt_param: what an over-long prompt is reported as ("messages" for chat, "prompt" for completions)."""
    stop = stop_list(body.stop)
    if n_prompt == 0:
        raise BadRequestError("the prompt is empty", "send some text")
    if n_prompt + 1 > max_context:
        raise _overflow(ContextOverflowError(
            f"the prompt is {n_prompt} tokens; this model's context holds {max_context}",
            "shorten the input (or start the server with a larger --max-context)"), prompt_param)
    room = max_context - n_prompt
    mt = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    if mt is None:
        mt = room
    elif mt <= 0:
        raise APIError(400, f"max_tokens must be a positive integer, got {mt}", param="max_tokens",
                       code="invalid_value")
    elif mt > room:
        raise _overflow(ContextOverflowError(
            f"prompt ({n_prompt} tokens) + max_tokens ({mt}) exceeds the context of {max_context}",
            f"lower max_tokens to at most {room}"), "max_tokens" if body.max_completion_tokens is None
            else "max_completion_tokens")
    return SamplingParams(
        max_tokens=mt,
        # tiny temperatures are greedy and a top_p that rounds to 0 keeps the top token: engine/runtime/sampling.py
        temperature=DEFAULT_TEMPERATURE if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=body.top_k or 0,
        seed=None if body.seed is None else body.seed % (1 << 63),
        stop=stop, ignore_eos=bool(body.ignore_eos), speculative=bool(body.speculative))


def _finish(worker: EngineWorker, body: SamplingFields, mid: str, ids: list[int], echo: str = "",
            prompt_param: str = "messages") -> Prepared:
    params = sampling(body, len(ids), worker.max_context(mid), prompt_param)
    spec = worker.backends.spec(mid)
    structured.apply(params, body, spec, chat=prompt_param == "messages")  # grammar, logprobs, biases
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return Prepared(GenerateRequest(ids, params, mid, worker.cfg.request_timeout_s), mid, include_usage, echo,
                    tokenizer=spec.tokenizer)


def prepare_chat(worker: EngineWorker, body: ChatCompletionRequest) -> Prepared:
    _refuse_unsupported(body)
    mid = worker.backends.resolve(body.model)
    spec = worker.backends.spec(mid)
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    for m in messages:  # newer OpenAI clients send the system prompt as role "developer"
        if m["role"] == "developer":
            m["role"] = "system"
    for m in messages:  # OpenAI sends arguments as a JSON string; Qwen's template wants the object
        for tc in m.get("tool_calls") or []:
            f = tc.get("function", {})
            if isinstance(f.get("arguments"), str):
                try:
                    f["arguments"] = json.loads(f["arguments"])
                except ValueError:
                    pass
    check_tools(body.tools)
    try:
        text = render_chat(spec.chat_template, messages, True, body.tools or None)
    except BadRequestError:
        raise
    except Exception as e:  # the model's Jinja template choked on unusual messages/tools
        raise APIError(400, f"the chat template cannot render these messages: {e}", param="messages",
                       code="invalid_value") from e
    prep = _finish(worker, body, mid, _encode(spec.tokenizer, text))
    prep.tools = tool_names(body.tools, getattr(body, "tool_choice", None))
    prep.parallel_tools = getattr(body, "parallel_tool_calls", None) is not False
    return prep


def prepare_completion(worker: EngineWorker, body: CompletionRequest) -> Prepared:
    _refuse_unsupported(body)
    mid = worker.backends.resolve(body.model)
    spec = worker.backends.spec(mid)
    p = body.prompt
    if isinstance(p, list) and p and isinstance(p[0], list):  # [[ids]]
        if len(p) != 1:
            raise APIError(400, "only one prompt per request is supported", param="prompt", code="unsupported_value")
        p = p[0]
    if isinstance(p, list) and (not p or isinstance(p[0], str)):  # [text]
        if len(p) != 1:
            raise APIError(400, "send exactly one prompt string", param="prompt", code="unsupported_value")
        p = p[0]
    if isinstance(p, str):
        text = p
        if body.suffix is not None and all(spec.tokenizer.token_to_id(t) is not None for t in FIM):
            text = f"{FIM[0]}{p}{FIM[1]}{body.suffix}{FIM[2]}"
        ids = _encode(spec.tokenizer, text)
        echo = p if body.echo else ""
    else:
        vocab = spec.config.vocab_size
        bad = [t for t in p if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})", param="prompt",
                           code="invalid_value")
        ids = list(p)
        echo = spec.tokenizer.decode(ids) if body.echo else ""
    return _finish(worker, body, mid, ids, echo, prompt_param="prompt")
