"""The endpoints: /v1/models (+ /{id}), /v1/chat/completions, /v1/completions, /health; /v1/responses is
engine/server/responses.py.

Handlers parse the body (schemas.py), turn it into token ids (prepare.py), submit to the engine
thread and format its events as OpenAI JSON or SSE chunks. A client that goes away cancels
its request, which frees the KV slot before the engine's next decode step.
"""
from __future__ import annotations

import asyncio
import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from engine.server.errors import APIError, error_body, from_engine
from engine.server.prepare import Prepared, prepare_chat, prepare_completion
from engine.server.schemas import ChatCompletionRequest, CompletionRequest
from engine.server.sse import DONE, frame, sse_response
from engine.server.structured import chat_logprobs, completion_logprobs
from engine.server.tools import may_be_tool_call, parse_tool_calls, stream_deltas
from engine.runtime.worker import EngineWorker
from engine.runtime.worker_types import Failed, Finished, RequestHandle, TextDelta

router = APIRouter()
CREATED = int(time.time())
POLL_S = 0.25  # how often a waiting handler checks whether its client is still there


class ClientGone(Exception):
    pass


def _worker(request: Request) -> EngineWorker:
    return request.app.state.worker


def _usage(f: Finished) -> dict:
    return {"prompt_tokens": f.prompt_tokens, "completion_tokens": f.completion_tokens,
            "total_tokens": f.prompt_tokens + f.completion_tokens}


def _server_info(f: Finished) -> dict:
    """Where the time went on the server: queue, time to first token (prefill), prompt tokens taken from the
    prefix cache, speculative draft tokens verified / accepted."""
    return {"queue_s": round(f.queue_s, 5), "ttft_s": round(f.ttft_s, 5), **getattr(f, "stats", {})}


def _finish_reason(f: Finished) -> str:
    return "length" if f.finish_reason == "length" else "stop"


async def _next(handle: RequestHandle, request: Request):
    """Next engine event; cancels the request if the client disconnects while we wait."""
    while True:
        try:
            return await asyncio.wait_for(handle.get(), POLL_S)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                handle.cancel()
                raise ClientGone()
        except asyncio.CancelledError:  # server shutting down: free the slot too
            handle.cancel()
            raise


@router.get("/v1/models")
@router.get("/models", include_in_schema=False)
async def list_models(request: Request):
    w = _worker(request)
    return {"object": "list", "data": [
        {"id": mid, "object": "model", "created": CREATED, "owned_by": "deepinfer",
         "loaded": mid in w.resident} for mid in w.backends.ids]}


@router.get("/v1/models/{model_id:path}")
@router.get("/models/{model_id:path}", include_in_schema=False)
async def retrieve_model(model_id: str, request: Request):
    w = _worker(request)
    if model_id not in w.backends.ids:
        raise APIError(404, f"the model {model_id!r} does not exist; GET /v1/models lists the served ones",
                       param="model", code="model_not_found")
    return {"id": model_id, "object": "model", "created": CREATED, "owned_by": "deepinfer",
            "loaded": model_id in w.resident}


@router.get("/health")
async def health(request: Request):
    w = _worker(request)
    h = w.health()
    h["status"] = "ok" if h["state"] in ("ready", "loading", "starting") else "error"
    return JSONResponse(h, status_code=200 if h["status"] == "ok" else 503)


async def _submit(request: Request, prep: Prepared) -> tuple[RequestHandle, TextDelta | Finished]:
    """Submit and wait for the first event, so early failures get a real status code."""
    handle = _worker(request).submit(prep.request)
    ev = await _next(handle, request)
    if isinstance(ev, Failed):
        raise from_engine(ev.error)
    return handle, ev


async def _run(request: Request, prep: Prepared, chat: bool, stream: bool):
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    created = int(time.time())
    try:
        handle, first = await _submit(request, prep)
    except ClientGone:
        return Response(status_code=499)
    base = {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
            "model": prep.model, "system_fingerprint": "deepinfer"}
    if not stream:
        ev = first
        try:
            while not isinstance(ev, Finished):
                ev = await _next(handle, request)
                if isinstance(ev, Failed):
                    raise from_engine(ev.error)
        except ClientGone:
            return Response(status_code=499)
        text = prep.echo + ev.text
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if chat
                  else {"index": 0, "text": text})
        lp = chat_logprobs(ev.logprobs, prep.tokenizer) if chat else \
            completion_logprobs(ev.logprobs, prep.tokenizer, len(prep.echo))
        choice.update(logprobs=lp, finish_reason=_finish_reason(ev))
        if chat and prep.tools is not None:
            content, calls = parse_tool_calls(text, prep.tools, prep.parallel_tools)
            if calls:
                choice["message"] = {"role": "assistant", "content": content, "tool_calls": calls}
                choice["finish_reason"] = "tool_calls"
        return {**base, "choices": [choice], "usage": _usage(ev)}
    return sse_response(_stream(handle, first, prep, base, chat))


async def _stream(handle: RequestHandle, first, prep: Prepared, base: dict, chat: bool):
    base = {**base, "object": "chat.completion.chunk" if chat else "text_completion"}
    extra = {"usage": None} if prep.include_usage else {}

    offset = [len(prep.echo)]  # completions: text_offset of the next token

    def chunk(text: str | None, finish: str | None, role: bool = False, lp: list | None = None) -> str:
        if chat:
            delta = ({"role": "assistant", "content": ""} if role else {}) | \
                ({"content": text} if text is not None else {})
            c = {"index": 0, "delta": delta, "logprobs": chat_logprobs(lp, prep.tokenizer), "finish_reason": finish}
        else:
            lps = completion_logprobs(lp, prep.tokenizer, offset[0])
            if lps is not None:
                offset[0] += sum(len(t) for t in lps["tokens"])
            c = {"index": 0, "text": text or "", "logprobs": lps, "finish_reason": finish}
        return frame({**base, "choices": [c], **extra})

    def tool_chunk(delta_call: dict) -> str:
        return frame({**base, "choices": [{"index": 0, "delta": {"tool_calls": [delta_call]}, "logprobs": None,
                                           "finish_reason": None}], **extra})

    done = False
    held = "" if chat and prep.tools is not None else None  # output held back while it may be a tool call
    held_lp: list = []  # logprob entries of the held text
    sent_lp = 0  # logprob entries sent so far
    try:
        if chat:
            yield chunk(None, None, role=True)
        if prep.echo:
            yield chunk(prep.echo, None)
        ev = first
        while True:
            if isinstance(ev, TextDelta):
                lp = ev.logprobs
                if held is not None:
                    held += ev.text
                    held_lp += lp or []
                    if not may_be_tool_call(held):
                        ev.text, held, lp = held, None, (held_lp if prep.request.params.logprobs is not None else None)
                if held is None and ev.text:
                    sent_lp += len(lp or [])
                    yield chunk(ev.text, None, lp=lp)
            elif isinstance(ev, Finished):
                done = True
                finish = _finish_reason(ev)
                rest_lp = ev.logprobs[sent_lp:] if ev.logprobs is not None else None
                if held:
                    content, calls = parse_tool_calls(held, prep.tools, prep.parallel_tools)
                    if content:
                        yield chunk(content, None, lp=rest_lp)
                        rest_lp = None
                    for d in stream_deltas(calls):
                        yield tool_chunk(d)
                    if calls:
                        finish = "tool_calls"
                yield chunk(None if chat else "", finish, lp=rest_lp or None)
                if prep.include_usage:  # + the server's own timings (the tray's hotkey stages; not OpenAI's)
                    yield frame({**base, "choices": [], "usage": _usage(ev), "deepinfer": _server_info(ev)})
                break
            else:  # Failed after the stream started: an error frame, then [DONE]
                done = True
                e = from_engine(ev.error)
                yield frame(error_body(e.message, e.type, e.param, e.code))
                break
            ev = await handle.get()
        yield DONE
    finally:
        if not done:
            handle.cancel()  # client disconnected (or the server is stopping)


@router.post("/v1/chat/completions")
@router.post("/chat/completions", include_in_schema=False)
async def chat_completions(body: ChatCompletionRequest, request: Request):
    prep = await run_in_threadpool(prepare_chat, _worker(request), body)
    return await _run(request, prep, chat=True, stream=bool(body.stream))


@router.post("/v1/completions")
@router.post("/completions", include_in_schema=False)
async def completions(body: CompletionRequest, request: Request):
    prep = await run_in_threadpool(prepare_completion, _worker(request), body)
    return await _run(request, prep, chat=False, stream=bool(body.stream))


__all__ = ["router", "APIError"]
