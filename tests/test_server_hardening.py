"""Gateway hardening (issue: adversarial run): stop-list DoS, Host header (DNS rebinding), role
developer / image parts, strict Origin parsing, error shapes and /openapi.json. Real server on
loopback, real model; slow-client tests are in test_server_slow_clients.py."""
from __future__ import annotations

import json
import os
import threading
import time

import httpx
import pytest

from engine.config import EngineConfig
from engine.server.app import ServerThread
from engine.server.cors import parse_origin
from engine.server.hosts import HostGuardMiddleware, host_name

U = [{"role": "user", "content": "Count from 1 to 50, separated by spaces."}]


@pytest.fixture(scope="module")
def server(llm):
    srv = ServerThread(EngineConfig(port=0, device="cpu", api_key=None, allow_hosts=["mybox.lan", "*.internal"]),
                       llm=llm).start()
    yield srv
    srv.stop()
    assert sorted(llm.runner.free_slots) == list(range(llm.cfg.max_batch))


def _err(r: httpx.Response, status: int, code: str | None = None, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"] and err["code"]
    if code:
        assert err["code"] == code, err
    if param:
        assert err["param"] == param, err
    return err


# ------------------------------------------------------------------ 1. stop strings
def test_stop_list_is_bounded(server):
    url = server.base_url + "/chat/completions"
    many = [f"never{i:07d}" for i in range(20_000)]  # the adversarial run sent 300,000 (3.6 MB)
    body = json.dumps({"messages": U, "max_tokens": 2, "stop": many}, separators=(",", ":"))
    _err(httpx.post(url, content=body, headers={"Content-Type": "application/json"}, timeout=120), 400,
         "invalid_value", "stop")
    _err(httpx.post(url, json={"messages": U, "max_tokens": 2, "stop": ["x"] * 17}), 400, "invalid_value", "stop")
    _err(httpx.post(url, json={"messages": U, "max_tokens": 2, "stop": "é" * 129}), 400, "invalid_value", "stop")
    ok = httpx.post(url, json={"messages": U, "max_tokens": 2, "stop": ["x" * 256] * 16}, timeout=120)
    assert ok.status_code == 200, ok.text


def _timed(url: str, body: dict) -> float:
    t0 = time.monotonic()
    r = httpx.post(url, json=body, timeout=300)
    assert r.status_code == 200, r.text
    return time.monotonic() - t0


def _health(url: str) -> dict:
    return httpx.get(url.rsplit("/v1/", 1)[0] + "/health").json()


def _decoding(url: str, steps0: int) -> bool:
    """The engine runs a sequence past its prefill: one active, none prefilling, decode steps taken since steps0."""
    h = _health(url)
    return h["active"] >= 1 and h["prefilling"] == 0 and h["decode_steps"] > steps0


def _next_to(url: str, measured: dict, other: dict) -> float:
    """Latency of `measured` while `other` streams (started first, past its prefill). The hostile request's text
    keeps matching the start of a stop string, so the server holds it back (300 tokens took 37 s on a CPU before the
    first line): its first content line is no sign of being past the prefill, the engine's /health is."""
    done, first = threading.Event(), threading.Event()
    steps0 = _health(url)["decode_steps"]

    def run_other():
        with httpx.stream("POST", url, json={**other, "stream": True}, timeout=600) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and '"content":"' in line:
                    first.set()
                if done.is_set():
                    break  # closing the stream cancels the request
        first.set()

    t = threading.Thread(target=run_other, daemon=True)
    t.start()
    deadline = time.monotonic() + 120
    while not (first.is_set() or _decoding(url, steps0)):  # the other request is decoding (its prefill is over)
        assert time.monotonic() < deadline and t.is_alive(), "the other request did not start decoding"
        time.sleep(0.05)
    try:
        took = _timed(url, measured)
        still_running = t.is_alive()
    finally:
        done.set()
        t.join(120)
    assert still_running, "the other request ended before the measurement"
    return took


def test_hostile_stop_list_does_not_slow_others(server):
    """The largest stop list allowed (16 x 256 bytes, long output-like text that keeps partially
    matching) costs the engine thread no more than any other request: a concurrent request's latency
    next to it stays within 1.5x of its latency next to a benign request of the same length.
    (Its latency next to any second request is ~2x solo on a CPU, where decoding 2 sequences costs
    ~2x one: that part is the batch, not the stop list. DEEPINFER_HARDENING_OUT=FILE writes the numbers.)"""
    url = server.base_url + "/chat/completions"
    measured = {"messages": U, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    # each stop is long output-like text ending in a character the model never writes here
    hostile_stop = [(" " + " ".join(str(n) for n in range(1, 120)))[i:i + 255] + "\x07" for i in range(16)]
    # 60 tokens outlast the measured 8 at two sequences per step, with room; the hostile text is held back until
    # its end (a cut stream is only seen at the next line), so its length is what the join after it waits for
    benign = {"messages": U, "max_tokens": 60, "temperature": 0, "ignore_eos": True}
    hostile = {**benign, "stop": hostile_stop}
    _timed(url, measured)  # warm
    solo = _timed(url, measured)
    with_benign = _next_to(url, measured, benign)
    with_hostile = _next_to(url, measured, hostile)
    out = os.environ.get("DEEPINFER_HARDENING_OUT")
    if out:
        with open(out, "w", encoding="utf-8") as f:
            json.dump({"test": "tests/test_server_hardening.py::test_hostile_stop_list_does_not_slow_others",
                       "device": "cpu", "model": "qwen2.5-coder-0.5b", "measured_max_tokens": 8,
                       "hostile_stop": "16 strings x 256 bytes", "solo_s": round(solo, 3),
                       "next_to_benign_s": round(with_benign, 3), "next_to_hostile_s": round(with_hostile, 3)},
                      f, indent=2)
    assert with_hostile <= 1.5 * with_benign, \
        f"solo {solo:.2f} s; next to a benign request {with_benign:.2f} s, next to the hostile one {with_hostile:.2f} s"


# ------------------------------------------------------------------ 2. Host header
def test_host_header_guard(server):
    port = server.port
    for host in ("evil.com", f"evil.com:{port}", "127.0.0.1.evil.com", "localhost.evil.com", "user@localhost",
                 f"localhost:{port}:1"):
        for path in ("/v1/models", "/health", "/openapi.json"):
            r = httpx.get(server.url + path, headers={"Host": host})
            _err(r, 403, "host_not_allowed")
            assert r.json()["error"]["type"] == "permission_error"
    for host in ("localhost", f"localhost:{port}", "LOCALHOST:1", f"127.0.0.1:{port}", "[::1]", f"[::1]:{port}",
                 "mybox.lan", f"mybox.lan:{port}", "api.internal:80"):
        assert httpx.get(server.url + "/v1/models", headers={"Host": host}).status_code == 200, host


def test_host_rules_for_bind_address():
    lan = HostGuardMiddleware(None, "192.168.1.5", [])
    assert lan.allowed("192.168.1.5:18000") and lan.allowed("localhost") and not lan.allowed("10.0.0.1")
    wild = HostGuardMiddleware(None, "0.0.0.0", [])  # every interface: IP literals, never DNS names
    assert wild.allowed("10.0.0.7:18000") and wild.allowed("[fe80::1]") and not wild.allowed("evil.com")
    assert not wild.allowed("0.0.0.0.evil.com")
    assert HostGuardMiddleware(None, "127.0.0.1", ["*"]).allowed("anything.example")
    assert host_name("[::1]:80") == "::1" and host_name("a b") is None and host_name("x:port") is None


def test_serve_flag_allow_host():
    import argparse

    from engine.server.cli import add_arguments, build_config
    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg = build_config(p.parse_args(["--allow-host", "mybox.lan", "--allow-host", "*.lan"]))
    assert cfg.allow_hosts == ["mybox.lan", "*.lan"]


# ------------------------------------------------------------------ 3. developer role, image parts
def test_developer_role_and_image_parts(server):
    url = server.base_url + "/chat/completions"
    dev = [{"role": "developer", "content": "Reply with the single word: yes."}, {"role": "user", "content": "Go."}]
    sys_ = [{"role": "system", "content": "Reply with the single word: yes."}, {"role": "user", "content": "Go."}]
    a = httpx.post(url, json={"messages": dev, "max_tokens": 4, "temperature": 0}, timeout=120)
    b = httpx.post(url, json={"messages": sys_, "max_tokens": 4, "temperature": 0}, timeout=120)
    assert a.status_code == 200 and a.json()["choices"][0]["message"] == b.json()["choices"][0]["message"]
    assert a.json()["usage"] == b.json()["usage"]  # rendered exactly as a system message
    img = [{"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]
    err = _err(httpx.post(url, json={"messages": img}), 400, "unsupported_content", "messages")
    assert "text only" in err["message"] and len(err["message"]) < 160


# ------------------------------------------------------------------ 4. Origin parsing
def test_malformed_origins_are_never_echoed(server):
    url = server.base_url + "/models"
    pre = {"Access-Control-Request-Method": "POST"}
    for origin in ("http://localhost:@evil.com", "http://localhost:9999.evil.com", "http://localhost:80@evil.com",
                   "http://user:pw@localhost", "http://localhost:5173/path", "http://localhost:99999",
                   "http://localhost:5173 evil", "http://127.0.0.1:1.evil.com", "vscode-webview://x/../evil"):
        for r in (httpx.get(url, headers={"Origin": origin}), httpx.options(url, headers={"Origin": origin, **pre})):
            assert r.status_code == 403 and "access-control-allow-origin" not in r.headers, origin
            assert origin not in r.text
    r = httpx.get(url, headers={"Origin": "http://localhost:5173"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:5173"
    assert parse_origin("HTTP://LocalHost:8080") == ("http", "localhost", "8080")
    assert parse_origin("null") is None and parse_origin("http://[::1]:80") == ("http", "[::1]", "80")


# ------------------------------------------------------------------ 6. error shapes, schema
def test_error_shapes_and_strict_types(server):
    url = server.base_url
    for bad in ("8", True, 8.5, "many"):
        _err(httpx.post(url + "/chat/completions", json={"messages": U, "max_tokens": bad}), 400, "invalid_type",
             "max_tokens")
    _err(httpx.post(url + "/chat/completions", json={"messages": U, "temperature": True}), 400, "invalid_type")
    _err(httpx.post(url + "/chat/completions", json={"messages": []}), 400, param="messages")
    _err(httpx.post(url + "/chat/completions", content=b'{"messages": [',
                    headers={"Content-Type": "application/json"}), 400, "invalid_json")
    _err(httpx.post(url + "/chat/completions", json={}), 400, "missing_required_parameter", "messages")
    _err(httpx.post(url + "/completions", json={"prompt": "hello " * 2100}), 400, "context_length_exceeded", "prompt")
    _err(httpx.post(url + "/completions", json={"prompt": "hi", "max_tokens": 5000}), 400, "context_length_exceeded",
         "max_tokens")
    _err(httpx.post(url + "/chat/completions", json={"messages": [{"role": "user", "content": "hello " * 2100}]}),
         400, "context_length_exceeded", "messages")
    _err(httpx.get(url + "/nothing"), 404, "not_found")
    _err(httpx.get(url + "/chat/completions"), 405, "method_not_allowed")
    assert httpx.get(server.url + "/docs").status_code == 404  # would load its JS from a CDN
    assert httpx.get(server.url + "/redoc").status_code == 404


def test_openapi_documents_what_the_server_answers(server):
    doc = httpx.get(server.url + "/openapi.json").json()
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert "422" not in op["responses"], (path, method)
            if method == "post":
                assert {"400", "401", "403", "413", "429"} <= set(op["responses"]), (path, op["responses"].keys())
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    req = doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert req["messages"]["minItems"] == 1
    arrays = [s for s in req["stop"]["anyOf"] if s.get("type") == "array"]
    assert arrays[0]["maxItems"] == 16 and arrays[0]["items"]["maxLength"] == 256
    roles = doc["components"]["schemas"]["ChatMessage"]["properties"]["role"]["enum"]
    assert "developer" in roles


def test_api_key_header_variants(server):
    with ServerThread(EngineConfig(port=0, api_key="sekret"), worker=server.worker) as keyed:
        url = keyed.base_url + "/models"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers={"api-key": "nope"}).status_code == 401
        for h in ({"Authorization": "Bearer sekret"}, {"x-api-key": "sekret"}, {"api-key": "sekret"}):
            assert httpx.get(url, headers=h).status_code == 200, h
