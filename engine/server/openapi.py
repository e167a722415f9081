"""/openapi.json as the server really answers: request errors are 400 with the OpenAI error body
(FastAPI documents 422 with its own shape), plus the guard answers every route can give."""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}
_REF = {"$ref": "#/components/schemas/ErrorResponse"}
# one server-sent event (`data: {json}` or `data: [DONE]`), as SSE-aware tools read the stream
SSE_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"},
                                                                     "event": {"type": "string"}}}
# status -> description; which apply: ALL to every operation, BODY to operations that take a body
ALL = {403: "Host or Origin not allowed (DNS rebinding guard, CORS allow-list)",
       401: "missing or wrong API key (--api-key)"}
BODY = {400: "invalid request (bad JSON, wrong types, unsupported values, context length exceeded)",
        404: "unknown model", 413: "request body too large", 429: "queue full (see Retry-After)",
        500: "internal error", 503: "model unavailable (failed to load)", 504: "request timed out"}


def _error(description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": _REF}}}


def rewrite(schema: dict) -> dict:
    for path, ops in schema.get("paths", {}).items():
        for method, op in ops.items():
            responses = op.setdefault("responses", {})
            had_body = responses.pop("422", None) is not None or "requestBody" in op
            extra = {**ALL, **(BODY if had_body else {})}
            if path == "/health":
                extra = {403: ALL[403], 503: "engine not ready (load error)"}
            for status, desc in sorted(extra.items()):
                responses.setdefault(str(status), _error(desc))
            ok = responses.get("200", {}).get("content")
            if "requestBody" in op and ok is not None:  # "stream": true answers server-sent events
                ok.setdefault("text/event-stream", {"schema": SSE_EVENT})
    comps = schema.setdefault("components", {}).setdefault("schemas", {})
    comps.pop("HTTPValidationError", None)
    comps.pop("ValidationError", None)
    comps["ErrorResponse"] = ERROR_SCHEMA
    return schema


def install(app: FastAPI):
    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = rewrite(get_openapi(title=app.title, version=app.version,
                                                     description=app.description, routes=app.routes))
        return app.openapi_schema

    app.openapi = openapi
