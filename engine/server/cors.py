"""CORS with an allow-list (never `*` by default: any web page could otherwise drive the local
model) and request guards (body size limit, optional API key). Plain ASGI middleware."""
from __future__ import annotations

import fnmatch
import hmac
import json

ALLOWED_HEADERS = ("authorization", "content-type", "accept", "x-stainless-*", "openai-*", "x-api-key",
                   "api-key", "cache-control", "x-requested-with", "user-agent")
METHODS = "GET, POST, OPTIONS"
DRAIN_MAX = 64 << 20  # an oversized body up to this is read and dropped, so the client sees the 413


async def _drain(receive, declared: int):
    """Read and drop the rest of a too-large body: a client still uploading when the connection
    closes sees a broken pipe instead of our 413. Beyond DRAIN_MAX we just close."""
    if declared > DRAIN_MAX:
        return
    seen = 0
    while seen <= DRAIN_MAX:
        msg = await receive()
        seen += len(msg.get("body", b""))
        if msg["type"] != "http.request" or not msg.get("more_body"):
            return


def _headers(scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


async def _send_json(send, status: int, body: dict, headers: list | None = None):
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())] + (headers or [])})
    await send({"type": "http.response.body", "body": data})


def _err(message: str, type_: str, code: str) -> dict:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


class CORSMiddleware:
    """Preflight answered here; requests from a non-listed Origin are refused with 403."""

    def __init__(self, app, origins: list[str]):
        self.app, self.origins = app, [o.lower() for o in origins]

    def allowed(self, origin: str) -> bool:
        o = origin.lower()
        return any(o == p or fnmatch.fnmatchcase(o, p) for p in self.origins)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        h = _headers(scope)
        origin = h.get("origin")
        if origin is None:  # not a browser: nothing to do
            return await self.app(scope, receive, send)
        if not self.allowed(origin):
            return await _send_json(send, 403, _err(
                f"origin {origin!r} is not allowed; add it with --cors-origin", "permission_error", "cors_origin"))
        cors = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]
        if scope["method"] == "OPTIONS" and "access-control-request-method" in h:
            asked = [x.strip() for x in h.get("access-control-request-headers", "").split(",") if x.strip()]
            ok = [x for x in asked if any(fnmatch.fnmatchcase(x.lower(), p) for p in ALLOWED_HEADERS)]
            hdrs = cors + [(b"access-control-allow-methods", METHODS.encode()),
                           (b"access-control-allow-headers", ", ".join(ok or ["authorization", "content-type"]).encode()),
                           (b"access-control-max-age", b"600"), (b"content-length", b"0")]
            await send({"type": "http.response.start", "status": 204, "headers": hdrs})
            return await send({"type": "http.response.body", "body": b""})

        async def send_cors(msg):
            if msg["type"] == "http.response.start":
                msg = {**msg, "headers": list(msg.get("headers", [])) + cors}
            await send(msg)

        await self.app(scope, receive, send_cors)


class GuardMiddleware:
    """API key (Bearer) on /v1/*, and the body-size limit (413) read up front."""

    def __init__(self, app, api_key: str | None, max_body: int):
        self.app, self.api_key, self.max_body = app, api_key, max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        h = _headers(scope)
        path = scope.get("path", "")
        if self.api_key and path not in ("/health", "/docs", "/openapi.json"):
            given = h.get("authorization", "")
            given = given[7:].strip() if given.lower().startswith("bearer ") else h.get("x-api-key", "")
            if not hmac.compare_digest(given.encode(), self.api_key.encode()):
                return await _send_json(send, 401, _err(
                    "invalid or missing API key; send Authorization: Bearer <key>", "authentication_error",
                    "invalid_api_key"), [(b"www-authenticate", b"Bearer")])
        too_big = _err(f"request body exceeds {self.max_body} bytes", "invalid_request_error", "request_too_large")
        try:
            declared = int(h.get("content-length", "0") or 0)
        except ValueError:
            declared = 0
        if declared > self.max_body:
            await _drain(receive, declared)
            return await _send_json(send, 413, too_big, [(b"connection", b"close")])
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        chunks, size = [], 0
        while True:  # read the body here, bounded, then replay it
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body:
                if msg.get("more_body"):
                    await _drain(receive, DRAIN_MAX)
                return await _send_json(send, 413, too_big, [(b"connection", b"close")])
            if not msg.get("more_body"):
                break
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
