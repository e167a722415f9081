"""CORS with an allow-list (never `*` by default: any web page could otherwise drive the local
model) and request guards (body size limit, optional API key). Plain ASGI middleware."""
from __future__ import annotations

import fnmatch
import hmac
import json
import re

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


# scheme://host[:port], nothing else: no userinfo, path, query or spaces (RFC 6454 serialization).
# host: a DNS name / IPv4 / app id, or a bracketed IPv6 literal; port: digits. In a pattern the
# host may hold * and the port may be * ("any port").
_ORIGIN_RE = re.compile(r"^(?P<scheme>[a-z][a-z0-9+.-]*)://(?P<host>\[[0-9a-f:.]+\]|[a-z0-9_-]+(?:\.[a-z0-9_-]+)*)"
                        r"(?::(?P<port>\d{1,5}))?$")
_PATTERN_RE = re.compile(r"^(?P<scheme>[a-z][a-z0-9+.-]*)://(?P<host>\[[0-9a-f:.]+\]|[a-z0-9_.*-]+)"
                         r"(?::(?P<port>\d{1,5}|\*))?$")


def parse_origin(origin: str, pattern: bool = False) -> tuple[str, str, str | None] | None:
    """'http://LocalHost:5173' -> ('http', 'localhost', '5173'); None when malformed
    ('http://localhost:@evil.com', 'http://localhost:9999.evil.com', 'null', trailing paths)."""
    m = (_PATTERN_RE if pattern else _ORIGIN_RE).match(origin.lower())
    if not m or (m.group("port") not in (None, "*") and int(m.group("port")) > 65535):
        return None
    return m.group("scheme"), m.group("host"), m.group("port")


class CORSMiddleware:
    """Preflight answered here; requests from a non-listed Origin are refused with 403.
    Origins are parsed strictly before matching, so a malformed one is never echoed back."""

    def __init__(self, app, origins: list[str]):
        self.app = app
        self.patterns = [p for p in (parse_origin(o, pattern=True) for o in origins) if p is not None]

    def allowed(self, origin: str) -> bool:
        o = parse_origin(origin)
        if o is None:
            return False
        for scheme, host, port in self.patterns:
            if o[0] == scheme and fnmatch.fnmatchcase(o[1], host) and \
                    (port == o[2] or (port == "*" and o[2] is not None)):
                return True
        return False

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        h = _headers(scope)
        origin = h.get("origin")
        if origin is None:  # not a browser: nothing to do
            return await self.app(scope, receive, send)
        if not self.allowed(origin):
            what = f"origin {origin!r} is not allowed" if parse_origin(origin) else "the Origin header is malformed"
            return await _send_json(send, 403, _err(f"{what}; add it with --cors-origin", "permission_error",
                                                    "cors_origin"))
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
            # Bearer (OpenAI clients), x-api-key, or api-key (Azure-style clients)
            given = given[7:].strip() if given.lower().startswith("bearer ") else \
                h.get("x-api-key") or h.get("api-key", "")
            if not hmac.compare_digest(given.encode("utf-8", "replace"), self.api_key.encode()):
                return await _send_json(send, 401, _err(
                    "invalid or missing API key; send Authorization: Bearer <key> (or an api-key header)",
                    "authentication_error",
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
