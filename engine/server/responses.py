"""POST /v1/responses: OpenAI's Responses API (the first example of both SDKs' READMEs) over the same engine.

The request is turned into a chat request (instructions -> system message, input text or items -> messages,
function tools -> chat tools, text.format -> response_format, max_output_tokens -> max_completion_tokens) and
prepared by prepare_chat, so structured outputs, tool forcing and every limit are the chat endpoint's.
Output: a "message" item with "output_text", or "function_call" items when the model called a tool.
Streaming sends OpenAI's event sequence: response.created, response.in_progress, output_item.added,
content_part.added, output_text.delta ..., output_text.done, content_part.done, output_item.done (function
calls: function_call_arguments.delta/.done), then response.completed (response.incomplete when
max_output_tokens ended it). Nothing is stored: previous_response_id and background are refused (400).
"""
from __future__ import annotations

import itertools
import json
import time
import uuid
from typing import Annotated, Any, Union

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError, WithJsonSchema
from starlette.concurrency import run_in_threadpool

from engine.server.errors import APIError, from_engine
from engine.server.prepare import Prepared, prepare_chat
from engine.server.routes import ClientGone, _next, _submit, _worker
from engine.server.schemas import ChatCompletionRequest, _Open
from engine.server.sse import SSE_HEADERS
from engine.server.tools import may_be_tool_call, parse_tool_calls
from engine.runtime.worker_types import Finished, TextDelta

router = APIRouter()
TEXT_PARTS = ("input_text", "output_text", "text")


_MESSAGE_ITEM = {"type": "object", "required": ["role", "content"], "properties": {
    "type": {"enum": ["message"]}, "role": {"enum": ["system", "developer", "user", "assistant"]},
    "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": {
        "type": "object", "required": ["type", "text"],
        "properties": {"type": {"enum": list(TEXT_PARTS)}, "text": {"type": "string"}}}}]}}}
_CALL_ITEM = {"type": "object", "required": ["type", "name", "arguments"], "properties": {
    "type": {"enum": ["function_call"]}, "call_id": {"type": ["string", "null"]}, "name": {"type": "string"},
    "arguments": {"type": "string"}}}
_OUTPUT_ITEM = {"type": "object", "required": ["type", "output"], "properties": {
    "type": {"enum": ["function_call_output"]}, "call_id": {"type": ["string", "null"]}, "output": {"type": "string"}}}
INPUT_SCHEMA = {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1,
                                               "items": {"anyOf": [_MESSAGE_ITEM, _CALL_ITEM, _OUTPUT_ITEM]}}]}
TOOLS_SCHEMA = {"anyOf": [{"type": "array", "items": {"type": "object", "required": ["type", "name"], "properties": {
    "type": {"enum": ["function"]}, "name": {"type": "string"}, "description": {"type": "string"},
    "parameters": {"type": "object"}}}}, {"type": "null"}]}


class ResponsesRequest(_Open):
    """The published schema (WithJsonSchema) is what the handler accepts; the handler checks the same rules
    itself with messages that say what to send instead."""
    model: StrictStr | None = None
    input: Annotated[Union[StrictStr, list[dict[str, Any]]], WithJsonSchema(INPUT_SCHEMA)] = Field(
        description="text, or a list of messages / items")
    instructions: StrictStr | None = Field(None, description="a system message put first")
    max_output_tokens: StrictInt | None = Field(None, ge=1)
    temperature: StrictFloat | None = Field(None, ge=0, le=2)
    top_p: StrictFloat | None = Field(None, gt=0, le=1)
    stream: StrictBool | None = False
    tools: Annotated[list[dict[str, Any]] | None, WithJsonSchema(TOOLS_SCHEMA)] = Field(None, description='function tools: {"type": "function", "name", ...}')
    tool_choice: Union[StrictStr, dict[str, Any], None] = None
    parallel_tool_calls: StrictBool | None = None
    text: dict[str, Any] | None = Field(None, description='{"format": {"type": "text" | "json_object" | "json_schema"}}')
    previous_response_id: Annotated[StrictStr | None, WithJsonSchema({"type": "null"})] = Field(
        None, description="refused: nothing is stored")
    store: StrictBool | None = Field(None, description="informational: nothing is stored")
    background: Annotated[StrictBool | None, WithJsonSchema({"anyOf": [{"enum": [False]}, {"type": "null"}]})] = Field(
        None, description="refused when true")
    reasoning: dict[str, Any] | None = Field(None, description="refused when it sets an effort (no reasoning model)")
    truncation: Annotated[StrictStr | None, WithJsonSchema({"anyOf": [{"enum": ["disabled"]}, {"type": "null"}]})] = Field(
        None, description='"disabled" only (a too-long input is a 400)')
    include: Annotated[list[StrictStr] | None, WithJsonSchema({"anyOf": [{"type": "array", "maxItems": 0},
                                                                         {"type": "null"}]})] = Field(
        None, description="refused when not empty")
    top_logprobs: Annotated[StrictInt | None, WithJsonSchema(
        {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 0}, {"type": "null"}]})] = Field(None, description="refused when > 0 (use /v1/chat/completions)")


def _text(content, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, "message content must be text or a list of text parts", param=param)
    out = []
    for p in content:
        if not isinstance(p, dict) or p.get("type") not in TEXT_PARTS or not isinstance(p.get("text"), str):
            raise APIError(400, f"only text parts are supported in {param}; got {p.get('type') if isinstance(p, dict) else p!r}",
                           param=param, code="unsupported_value")
        out.append(p["text"])
    return "".join(out)


def _messages(body: ResponsesRequest) -> list[dict]:
    msgs = [{"role": "system", "content": body.instructions}] if body.instructions else []
    if isinstance(body.input, str):
        return msgs + [{"role": "user", "content": body.input}]
    for i, it in enumerate(body.input):
        kind = it.get("type", "message")
        if kind == "message" or (kind is None and "role" in it):
            role = it.get("role")
            if role not in ("system", "developer", "user", "assistant"):
                raise APIError(400, f"input[{i}].role {role!r} is not supported", param=f"input.{i}.role")
            msgs.append({"role": role, "content": _text(it.get("content"), f"input.{i}.content")})
        elif kind == "function_call":
            call = {"id": it.get("call_id") or it.get("id"), "type": "function",
                    "function": {"name": it.get("name"), "arguments": it.get("arguments", "{}")}}
            if msgs and msgs[-1]["role"] == "assistant" and "tool_calls" in msgs[-1]:
                msgs[-1]["tool_calls"].append(call)
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out = it.get("output")
            msgs.append({"role": "tool", "tool_call_id": it.get("call_id"),
                         "content": out if isinstance(out, str) else json.dumps(out)})
        else:
            raise APIError(400, f"input item type {kind!r} is not supported (message, function_call, "
                                "function_call_output are)", param=f"input.{i}.type", code="unsupported_value")
    return msgs


def _refuse(body: ResponsesRequest):
    def no(param: str, msg: str):
        raise APIError(400, msg, param=param, code="unsupported_value")
    if body.previous_response_id:
        no("previous_response_id", "this server stores no responses; send the whole conversation in input")
    if body.background:
        no("background", "background responses are not supported; omit background")
    if body.reasoning and body.reasoning.get("effort") not in (None, "none"):
        no("reasoning", "this model does not reason; omit reasoning")
    if body.truncation not in (None, "disabled"):
        no("truncation", 'only truncation "disabled" is supported')
    if body.include:
        no("include", "include is not supported; omit it")
    if body.top_logprobs:
        no("top_logprobs", "logprobs are served by /v1/chat/completions; omit top_logprobs here")


def to_chat(body: ResponsesRequest) -> ChatCompletionRequest:
    _refuse(body)
    tools = None
    if body.tools:
        tools = []
        for i, t in enumerate(body.tools):
            if t.get("type") != "function" or not isinstance(t.get("name"), str):
                raise APIError(400, f"tools[{i}]: only function tools are supported", param=f"tools.{i}",
                               code="unsupported_value")
            tools.append({"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")
                                                           if k in t}})
    tc = body.tool_choice
    if isinstance(tc, dict) and tc.get("type") == "function" and "function" not in tc:
        tc = {"type": "function", "function": {"name": tc.get("name")}}
    rf = None
    fmt = (body.text or {}).get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        rf = {"type": "json_schema", "json_schema": {"name": fmt.get("name"), "schema": fmt.get("schema"),
                                                     "strict": fmt.get("strict")}}
    elif fmt is not None:
        rf = fmt
    chat = {"model": body.model, "messages": _messages(body), "max_completion_tokens": body.max_output_tokens,
            "temperature": body.temperature, "top_p": body.top_p, "tools": tools, "tool_choice": tc,
            "parallel_tool_calls": body.parallel_tool_calls, "response_format": rf}
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in chat.items() if v is not None})
    except ValidationError as e:  # an input item that makes no valid chat message (a call without a name, ...)
        err = e.errors()[0] if e.errors() else {}
        raise APIError(400, f"input: {err.get('msg', 'invalid')} at {'.'.join(map(str, err.get('loc', ())))}",
                       param="input", code="invalid_value") from None


def _usage(f: Finished) -> dict:
    return {"input_tokens": f.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": f.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": f.prompt_tokens + f.completion_tokens}


def _items(text: str, prep: Prepared, msg_id: str) -> list[dict]:
    """The output items for the whole text: function calls, or one message."""
    content, calls = (parse_tool_calls(text, prep.tools, prep.parallel_tools) if prep.tools is not None
                      else (text, []))
    items = []
    if content or not calls:
        items.append({"type": "message", "id": msg_id, "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "text": content or "", "annotations": [], "logprobs": []}]})
    for c in calls:
        items.append({"type": "function_call", "id": "fc_" + c["id"][5:], "call_id": c["id"], "status": "completed",
                      "name": c["function"]["name"], "arguments": c["function"]["arguments"]})
    return items


def _finish(resp: dict, f: Finished, items: list[dict]) -> dict:
    incomplete = f.finish_reason == "length"
    return {**resp, "status": "incomplete" if incomplete else "completed", "output": items, "usage": _usage(f),
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None}


@router.post("/v1/responses")
@router.post("/responses", include_in_schema=False)
async def create_response(body: ResponsesRequest, request: Request):
    chat = to_chat(body)
    prep = await run_in_threadpool(prepare_chat, _worker(request), chat)
    resp = {"id": "resp_" + uuid.uuid4().hex, "object": "response", "created_at": int(time.time()),
            "status": "in_progress", "model": prep.model, "output": [], "error": None, "incomplete_details": None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "temperature": prep.request.params.temperature, "top_p": prep.request.params.top_p,
            "tools": body.tools or [], "tool_choice": body.tool_choice or "auto",
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "text": body.text or {"format": {"type": "text"}}, "truncation": "disabled", "store": False,
            "previous_response_id": None, "reasoning": {"effort": None, "summary": None}, "metadata": {},
            "usage": None}
    try:
        handle, first = await _submit(request, prep)
    except ClientGone:
        return Response(status_code=499)
    msg_id = "msg_" + uuid.uuid4().hex
    if not body.stream:
        ev = first
        try:
            while not isinstance(ev, Finished):
                ev = await _next(handle, request)
                if not isinstance(ev, (TextDelta, Finished)):
                    raise from_engine(ev.error)
        except ClientGone:
            return Response(status_code=499)
        return _finish(resp, ev, _items(ev.text, prep, msg_id))
    return StreamingResponse(_events(handle, first, prep, resp, msg_id), media_type="text/event-stream; charset=utf-8",
                             headers=SSE_HEADERS)


async def _events(handle, first, prep: Prepared, resp: dict, msg_id: str):
    seq = itertools.count()

    def ev(type_: str, **kw) -> str:
        data = json.dumps({"type": type_, "sequence_number": next(seq), **kw}, ensure_ascii=False,
                          separators=(",", ":"))
        return f"event: {type_}\ndata: {data}\n\n"

    msg = {"type": "message", "id": msg_id, "status": "in_progress", "role": "assistant", "content": []}
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    loc = {"item_id": msg_id, "output_index": 0, "content_index": 0}
    opened = False  # the message item has been announced
    text = ""
    held = "" if prep.tools is not None else None  # held back while it may become a tool call
    done = False
    try:
        yield ev("response.created", response=resp)
        yield ev("response.in_progress", response=resp)
        e = first
        while True:
            if isinstance(e, TextDelta):
                delta = e.text
                if held is not None:
                    held += delta
                    if may_be_tool_call(held):
                        delta = ""
                    else:
                        delta, held = held, None
                if delta:
                    if not opened:
                        opened = True
                        yield ev("response.output_item.added", output_index=0, item=msg)
                        yield ev("response.content_part.added", part=part, **loc)
                    text += delta
                    yield ev("response.output_text.delta", delta=delta, logprobs=[], **loc)
            elif isinstance(e, Finished):
                done = True
                items = _items(text if held is None else held, prep, msg_id) if not opened else \
                    [{**msg, "status": "completed", "content": [{**part, "text": text}]}]
                for i, it in enumerate(items):
                    if it["type"] == "message":
                        if not opened:
                            yield ev("response.output_item.added", output_index=i, item=msg)
                            yield ev("response.content_part.added", part=part, **{**loc, "output_index": i})
                            t = it["content"][0]["text"]
                            if t:
                                yield ev("response.output_text.delta", delta=t, logprobs=[], **{**loc, "output_index": i})
                        t = it["content"][0]["text"]
                        yield ev("response.output_text.done", text=t, logprobs=[], **{**loc, "output_index": i})
                        yield ev("response.content_part.done", part={**part, "text": t}, **{**loc, "output_index": i})
                    else:
                        yield ev("response.output_item.added", output_index=i,
                                 item={**it, "status": "in_progress", "arguments": ""})
                        yield ev("response.function_call_arguments.delta", item_id=it["id"], output_index=i,
                                 delta=it["arguments"])
                        yield ev("response.function_call_arguments.done", item_id=it["id"], output_index=i,
                                 name=it["name"], arguments=it["arguments"])
                    yield ev("response.output_item.done", output_index=i, item=it)
                final = _finish(resp, e, items)
                kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
                yield ev(kind, response=final)
                break
            else:  # Failed after the stream started
                done = True
                err = from_engine(e.error)
                yield ev("error", message=err.message, code=err.code, param=err.param)
                break
            e = await handle.get()
    finally:
        if not done:
            handle.cancel()
