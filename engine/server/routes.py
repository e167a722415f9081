"""The endpoints: /v1/models, /v1/chat/completions, /v1/completions, /health.

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
from engine.server.tools import may_be_tool_call, parse_tool_calls
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
        choice.update(logprobs=None, finish_reason=_finish_reason(ev))
        if chat and prep.tools is not None:
            content, calls = parse_tool_calls(text, prep.tools)
            if calls:
                choice["message"] = {"role": "assistant", "content": content, "tool_calls": calls}
                choice["finish_reason"] = "tool_calls"
        return {**base, "choices": [choice], "usage": _usage(ev)}
    return sse_response(_stream(handle, first, prep, base, chat))


async def _stream(handle: RequestHandle, first, prep: Prepared, base: dict, chat: bool):
    base = {**base, "object": "chat.completion.chunk" if chat else "text_completion"}
    extra = {"usage": None} if prep.include_usage else {}

    def chunk(text: str | None, finish: str | None, role: bool = False) -> str:
        if chat:
            delta = ({"role": "assistant", "content": ""} if role else {}) | \
                ({"content": text} if text is not None else {})
            c = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            c = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return frame({**base, "choices": [c], **extra})

    def tool_chunk(calls: list[dict]) -> str:
        delta = {"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]}
        return frame({**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}],
                      **extra})

    done = False
    held = "" if chat and prep.tools is not None else None  # output held back while it may be a tool call
    try:
        if chat:
            yield chunk(None, None, role=True)
        if prep.echo:
            yield chunk(prep.echo, None)
        ev = first
        while True:
            if isinstance(ev, TextDelta):
                if held is not None:
                    held += ev.text
                    if not may_be_tool_call(held):
                        ev.text, held = held, None
                if held is None and ev.text:
                    yield chunk(ev.text, None)
            elif isinstance(ev, Finished):
                done = True
                finish = _finish_reason(ev)
                if held:
                    content, calls = parse_tool_calls(held, prep.tools)
                    if content:
                        yield chunk(content, None)
                    if calls:
                        yield tool_chunk(calls)
                        finish = "tool_calls"
                yield chunk(None if chat else "", finish)
                if prep.include_usage:
                    yield frame({**base, "choices": [], "usage": _usage(ev)})
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
