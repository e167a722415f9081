"""Host header guard against DNS rebinding.

A web page on evil.com can re-point its own DNS name at 127.0.0.1; the browser then sends its
requests to our port with `Host: evil.com:18000`, and the Origin allow-list alone does not stop
simple GETs (/v1/models, /health, /openapi.json) from being read. So a request must name this
server: a loopback name (localhost, 127.0.0.1, [::1]) with any port, the --host value, or a name
opted in with --allow-host (fnmatch patterns, e.g. "*.lan"; "*" turns the check off). When the
server listens on every interface (0.0.0.0 / ::), any IP literal is accepted too: a rebinding
page always sends a DNS name, never an address. Ollama guards its API the same way.
"""
from __future__ import annotations

import fnmatch
import ipaddress
import re

from engine.server.cors import _err, _headers, _send_json

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
# host[:port] as sent in a Host header: a DNS name / IPv4, or a bracketed IPv6; the port is digits
_HOST_RE = re.compile(r"^(?:\[(?P<v6>[0-9a-f:.]+)\]|(?P<name>[a-z0-9_.-]+))(?::(?P<port>\d{1,5}))?$")


def host_name(header: str) -> str | None:
    """'LocalHost:18000' -> 'localhost'; '[::1]:80' -> '::1'; None when malformed."""
    m = _HOST_RE.match(header.strip().lower())
    if not m:
        return None
    return (m.group("v6") or m.group("name")).rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


class HostGuardMiddleware:
    """403 (OpenAI-style body) unless the Host header names this server."""

    def __init__(self, app, bind_host: str, allow: list[str]):
        self.app = app
        bind = bind_host.strip("[]").lower()
        self.any_ip = bind in ("0.0.0.0", "::", "")
        self.patterns = [p.lower() for p in allow]
        self.names = set(LOOPBACK_NAMES) | ({bind} if not self.any_ip else set())

    def allowed(self, header: str | None) -> bool:
        if header is None:  # HTTP/1.0 without Host: not a browser
            return True
        name = host_name(header)
        if name is None:
            return False
        if name in self.names or any(fnmatch.fnmatchcase(name, p) for p in self.patterns):
            return True
        return self.any_ip and _is_ip(name)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        host = _headers(scope).get("host")
        if self.allowed(host):
            return await self.app(scope, receive, send)
        shown = host_name(host or "")
        what = f"host {shown!r}" if shown else "a malformed Host header"
        await _send_json(send, 403, _err(
            f"{what} is not allowed (DNS rebinding guard); use localhost or 127.0.0.1, "
            "or start the server with --allow-host NAME", "permission_error", "host_not_allowed"),
            [(b"connection", b"close")])
