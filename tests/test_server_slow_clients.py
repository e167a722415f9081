"""Slow and odd clients on raw sockets (loopback): header and body read deadlines, half-closed
requests answered, a connection cap, malformed HTTP answered in JSON. Every wait is bounded."""
from __future__ import annotations

import json
import select
import socket
import time

import pytest

from engine.config import EngineConfig
from engine.server.app import ServerThread

HEAD_S, BODY_S = 1.0, 1.0


@pytest.fixture(scope="module")
def server(llm):
    srv = ServerThread(EngineConfig(port=0, device="cpu", header_timeout_s=HEAD_S, body_timeout_s=BODY_S,
                                    max_connections=6), llm=llm).start()
    yield srv
    srv.stop()


def _connect(srv) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _read_all(s: socket.socket, limit_s: float = 30.0) -> bytes:
    """Everything until the server closes (bounded)."""
    data, t_end = b"", time.monotonic() + limit_s
    while time.monotonic() < t_end:
        r, _, _ = select.select([s], [], [], 0.2)
        if r:
            chunk = s.recv(65536)
            if not chunk:
                return data
            data += chunk
    raise AssertionError(f"the server kept the connection open for {limit_s} s; got {data[:200]!r}")


def _trickle(s: socket.socket, payload: bytes, every_s: float, limit_s: float) -> tuple[float, bytes]:
    """Send payload a byte at a time; returns (seconds until the server closed, what it sent)."""
    t0, got = time.monotonic(), b""
    for b in payload:
        if time.monotonic() - t0 > limit_s:
            break
        try:
            s.send(bytes([b]))
        except OSError:  # closed under us
            return time.monotonic() - t0, got
        r, _, _ = select.select([s], [], [], every_s)
        if r:
            try:
                chunk = s.recv(65536)
            except OSError:
                return time.monotonic() - t0, got
            if not chunk:
                return time.monotonic() - t0, got
            got += chunk
    raise AssertionError(f"still open after {time.monotonic() - t0:.1f} s of trickled headers")


def _json_body(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)


def test_slowloris_headers_get_408_in_time(server):
    req = b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nX-Pad: " + b"a" * 200 + b"\r\n\r\n"
    with _connect(server) as s:
        took, got = _trickle(s, req, every_s=0.1, limit_s=4 * HEAD_S + 3)
    assert took < HEAD_S + 2.5, took
    status, body = _json_body(got)
    assert status == 408 and body["error"]["code"] == "request_timeout"


def test_idle_connection_and_slow_body_are_closed(server):
    with _connect(server) as s:  # connects, says nothing
        t0 = time.monotonic()
        got = _read_all(s, limit_s=HEAD_S + 5)
        assert time.monotonic() - t0 < HEAD_S + 2.5 and got.startswith(b"HTTP/1.1 408")
    with _connect(server) as s:  # headers in time, then a body that never completes
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 500\r\n\r\n{\"messages\": [")
        t0 = time.monotonic()
        _read_all(s, limit_s=BODY_S + 5)
        assert time.monotonic() - t0 < BODY_S + 2.5
    with _connect(server) as s:  # a slow but complete request within the deadline is served
        for part in (b"GET /health HTTP/1.1\r\n", b"Host: localhost\r\n", b"Connection: close\r\n\r\n"):
            s.sendall(part)
            time.sleep(0.2)
        assert _read_all(s).startswith(b"HTTP/1.1 200")


def test_half_closed_requests_are_answered(server):
    with _connect(server) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n")
        s.shutdown(socket.SHUT_WR)  # e.g. `nc -N`, or a client that closes its side after sending
        status, body = _json_body(_read_all(s))
        assert status == 200 and body["data"][0]["id"]
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
    with _connect(server) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        s.shutdown(socket.SHUT_WR)
        status, out = _json_body(_read_all(s, limit_s=120))
        assert status == 200 and out["usage"]["completion_tokens"] >= 1


def test_malformed_http_gets_a_json_400(server):
    with _connect(server) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nBad Header Without Colon\r\n\r\n")
        status, body = _json_body(_read_all(s))
    assert status == 400 and body["error"]["code"] == "invalid_http"


def test_connection_cap(llm):
    with ServerThread(EngineConfig(port=0, device="cpu", max_connections=3), llm=llm) as srv:
        idle = [_connect(srv) for _ in range(3)]
        try:
            time.sleep(0.3)
            with _connect(srv) as s:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
                status, body = _json_body(_read_all(s, limit_s=10))
            assert status == 503 and body["error"]["code"] == "too_many_connections"
        finally:
            for s in idle:
                s.close()
        time.sleep(0.3)
        with _connect(srv) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            assert _read_all(s, limit_s=10).startswith(b"HTTP/1.1 200")
