"""Every bad input gets a 4xx OpenAI-style error and the server keeps serving (real HTTP, real model)."""
from __future__ import annotations

import json

import httpx
import pytest

from engine.config import EngineConfig
from engine.server.app import ServerThread
from engine.runtime.worker import EngineWorker

U = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(llm):
    srv = ServerThread(EngineConfig(port=0, device="cpu", served_models=["broken=/nonexistent/broken.gguf"]),
                       llm=llm).start()
    yield srv
    srv.stop()


F = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CHAT_BAD = [  # (body, status, code or None)
    ('{"messages": [', 400, "invalid_json"),
    ("[1, 2]", 400, None),
    ("{}", 400, None),
    ({"messages": []}, 400, None),
    ({"messages": "hi"}, 400, None),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, None),
    ({"messages": [{"role": "user", "content": 42}]}, 400, None),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, None),
    ({"messages": U, "temperature": "hot"}, 400, None),
    ({"messages": U, "temperature": 5}, 400, None),
    ({"messages": U, "top_p": 0}, 400, None),
    ({"messages": U, "top_k": -1}, 400, None),
    ({"messages": U, "max_tokens": 0}, 400, None),
    ({"messages": U, "max_tokens": -5}, 400, None),
    ({"messages": U, "max_tokens": "many"}, 400, None),
    ({"messages": U, "max_tokens": 10 ** 9}, 400, "context_length_exceeded"),
    ({"messages": U, "max_completion_tokens": 5000}, 400, "context_length_exceeded"),
    ({"messages": [{"role": "user", "content": "hello " * 2100}]}, 400, "context_length_exceeded"),
    ({"messages": U, "stream": "yes"}, 400, None),
    ({"messages": U, "stop": 5}, 400, None),
    ({"messages": U, "stop": [1, 2]}, 400, None),
    ({"messages": U, "n": 2}, 400, "unsupported_value"),
    ({"messages": U, "logprobs": True, "top_logprobs": 6}, 400, "invalid_value"),  # OpenAI allows 20, we 5
    ({"messages": U, "top_logprobs": 2}, 400, "invalid_value"),  # without logprobs: true
    ({"messages": U, "reasoning_effort": "high"}, 400, "unsupported_value"),
    ({"messages": U, "response_format": {"type": "xml"}}, 400, "unsupported_value"),
    ({"messages": U, "tool_choice": "required"}, 400, "invalid_value"),  # no tools to call
    ({"messages": U, "tools": [{"type": "function"}]}, 400, "invalid_value"),  # no function: unseen by the model
    ({"messages": U, "tools": [{"type": "function", "function": {"name": "a b"}}]}, 400, "invalid_value"),
    ({"messages": U, "tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, 400,
     "invalid_type"),
    ({"messages": U, "tools": [F, F]}, 400, "invalid_value"),  # one name twice
    ({"messages": U, "tools": [{"type": "web_search"}]}, 400, "unsupported_value"),
    ({"messages": U, "tools": ["f"]}, 400, "invalid_type"),
    ({"messages": U, "model": 123}, 400, None),
    ({"messages": U, "model": "gpt-nope"}, 404, "model_not_found"),
    ({"messages": U, "model": "broken"}, 503, "model_unavailable"),
]
COMPLETION_BAD = [
    ({}, 400, None),
    ({"prompt": []}, 400, None),
    ({"prompt": ["a", "b"]}, 400, "unsupported_value"),
    ({"prompt": [999999999]}, 400, "invalid_value"),
    ({"prompt": ""}, 400, None),
    ({"prompt": "x", "best_of": 3}, 400, "unsupported_value"),
]


def _check(r: httpx.Response, status: int, code: str | None):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code:
        assert err["code"] == code, err


def test_bad_inputs_get_4xx_and_server_keeps_serving(server):
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        for path, cases in (("/chat/completions", CHAT_BAD), ("/completions", COMPLETION_BAD)):
            for body, status, code in cases:
                raw = body if isinstance(body, str) else json.dumps(body)
                _check(c.post(path, content=raw, headers={"Content-Type": "application/json"}), status, code)
        r = c.post("/chat/completions", json={"messages": U, "model": "gpt-nope"})
        assert "qwen2.5-coder-0.5b" in r.json()["error"]["message"]  # 404 lists the ids
        _check(c.post("/chat/completions", content=b'{"messages": []}', headers={"Content-Type": "text/plain"}),
               400, None)
        _check(c.post("/chat/completions", content=b"x" * (10 * 1024 * 1024),
                      headers={"Content-Type": "application/json"}), 413, "request_too_large")
        _check(c.get("/nothing"), 404, None)
        _check(c.get("/chat/completions"), 405, None)
        # lone surrogate escapes are tolerated (replaced), not a 500
        r = c.post("/chat/completions", content=b'{"messages":[{"role":"user","content":"a\\ud800b"}],"max_tokens":1}',
                   headers={"Content-Type": "application/json"})
        assert r.status_code == 200
        # a denormal temperature is greedy, not NaN probabilities (schemathesis found this one)
        r = c.post("/chat/completions", json={"messages": U, "max_tokens": 1, "temperature": 5e-324})
        assert r.status_code == 200
        r = c.post("/chat/completions", json={"messages": U, "max_tokens": 1, "temperature": 1, "top_p": 5e-324})
        assert r.status_code == 200
        r = c.post("/chat/completions", json={"messages": U, "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    h = httpx.get(server.url + "/health").json()
    assert h["active"] == 0 and h["queue_depth"] == 0 and h["state"] == "ready"


def test_queue_full_is_429_with_retry_after(llm):
    idle = EngineWorker(EngineConfig(device="cpu", max_queue=0), llm=llm)  # never started: nothing admitted
    with ServerThread(EngineConfig(port=0), worker=idle) as srv:
        r = httpx.post(srv.base_url + "/chat/completions", json={"messages": U, "max_tokens": 1})
        _check(r, 429, "queue_full")
        assert int(r.headers["retry-after"]) > 0
