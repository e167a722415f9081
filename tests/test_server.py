"""The gateway over real HTTP on loopback: official openai client, raw SSE, curl, backends, CLI errors.
One server per module, reusing the session `llm` (the model loads once)."""
from __future__ import annotations

import json
import shutil
import subprocess

import httpx
import pytest

from engine.config import EngineConfig
from engine.server.app import ServerThread

CHAT = [{"role": "user", "content": "Write a haiku about the sea."}]
ZH = [{"role": "user", "content": "用中文介绍一下北京，写两句话。"}]


def make_tiny_hf(folder, spec):
    """A 2-layer random-weight Qwen2 HF folder with the real tokenizer (a second backend that loads in ~1 s)."""
    import torch
    from safetensors.torch import save_file

    from engine.config import ModelConfig
    from engine.formats.spec import expected_weight_names

    cfg = ModelConfig(vocab_size=spec.config.vocab_size, hidden_size=64, intermediate_size=128, num_layers=2,
                      num_heads=4, num_kv_heads=2, max_position=4096, tie_word_embeddings=True)
    from engine.model.qwen2 import Qwen2Model
    shapes = {}
    m = Qwen2Model(cfg)
    for name in expected_weight_names(cfg):
        p, rows = m.target(name)
        n = (rows.stop - rows.start) if rows is not None else p.shape[0]
        shapes[name] = (n,) + tuple(p.shape[1:])
    g = torch.Generator().manual_seed(0)
    save_file({k: (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16) for k, s in shapes.items()},
              str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg.to_hf()))
    spec.tokenizer.save(folder / "tokenizer.json")
    (folder / "chat_template.jinja").write_text(spec.chat_template or "")
    return folder


@pytest.fixture(scope="module")
def server(llm, tmp_path_factory):
    tiny = make_tiny_hf(tmp_path_factory.mktemp("tiny"), llm.spec)
    srv = ServerThread(EngineConfig(port=0, device="cpu", served_models=[f"tiny={tiny}"]), llm=llm).start()
    yield srv
    srv.stop()
    assert sorted(llm.runner.free_slots) == list(range(llm.cfg.max_batch))


@pytest.fixture(scope="module")
def zh_text(client):
    r = client.chat.completions.create(model="qwen2.5-coder-0.5b", messages=ZH, max_tokens=16, temperature=0)
    return r.choices[0].message.content


def sse_events(resp: httpx.Response) -> list:
    """Strict SSE parsing: every frame is `data: ...` followed by a blank line."""
    raw = resp.read().decode("utf-8")
    assert raw.endswith("data: [DONE]\n\n")
    frames = raw.split("\n\n")[:-1]
    assert all(f.startswith("data: ") and "\n" not in f for f in frames)
    return [f[6:] if f == "data: [DONE]" else json.loads(f[6:]) for f in frames]


def test_models_health_openapi(server, client):
    ids = [m.id for m in client.models.list().data]
    assert ids == ["qwen2.5-coder-0.5b", "tiny"]
    h = httpx.get(server.url + "/health").json()
    assert h["status"] == "ok" and h["model"] == "qwen2.5-coder-0.5b" and h["device"] == "cpu"
    assert h["cpu_weights"] == "float32"  # the engine's default on the CPU (--cpu-weights int8: "int8")
    assert {"queue_depth", "active", "max_batch", "state", "max_context"} <= set(h) and h["max_context"] == 2048
    assert h.get("sampling_on_gpu") is None  # the CPU: no draw on a GPU
    paths = httpx.get(server.url + "/openapi.json").json()["paths"]
    assert {"/v1/models", "/v1/chat/completions", "/v1/completions", "/health"} <= set(paths)
    assert httpx.get(server.url + "/models").json()["data"][0]["id"] == "qwen2.5-coder-0.5b"  # Chatbox without /v1


def test_openai_client_chat_stream_and_not(client):
    r = client.chat.completions.create(model="qwen2.5-coder-0.5b", messages=CHAT, max_tokens=8, temperature=0)
    text = r.choices[0].message.content
    assert text and r.choices[0].finish_reason == "length" and r.object == "chat.completion"
    assert r.usage.completion_tokens == 8 and r.usage.total_tokens == r.usage.prompt_tokens + 8
    chunks = list(client.chat.completions.create(model="qwen2.5-coder-0.5b", messages=CHAT, max_tokens=8,
                                                 temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


def test_chinese_stream_raw_sse_is_utf8_safe(server, zh_text):
    body = {"model": "qwen2.5-coder-0.5b", "messages": ZH, "max_tokens": 16, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.base_url + "/chat/completions", json=body, timeout=120) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["connection"] == "close"
        events = sse_events(resp)
    assert events[-1] == "[DONE]"
    pieces = [e["choices"][0]["delta"].get("content") or "" for e in events[:-1]]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == zh_text and any("\u4e00" <= ch <= "\u9fff" for ch in zh_text)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_curl_n_exits_after_done(server):
    body = json.dumps({"messages": CHAT, "max_tokens": 4, "temperature": 0, "stream": True})
    out = subprocess.run(["curl", "-sN", "-X", "POST", server.base_url + "/chat/completions",
                          "-H", "Content-Type: application/json", "-d", body],
                         capture_output=True, text=True, timeout=90)  # hangs -> TimeoutExpired
    assert out.returncode == 0 and out.stdout.endswith("data: [DONE]\n\n")


def test_completions_stream_not_echo_fim_ids(client, llm):
    r = client.completions.create(model="qwen2.5-coder-0.5b", prompt="def add(a, b):", max_tokens=6, temperature=0)
    text = r.choices[0].text
    assert text and r.object == "text_completion" and r.usage.completion_tokens == 6
    s = list(client.completions.create(model="qwen2.5-coder-0.5b", prompt="def add(a, b):", max_tokens=6,
                                       temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in s) == text and s[-1].choices[0].finish_reason == "length"
    ids = llm.tokenizer.encode("def add(a, b):")
    assert client.completions.create(model="qwen2.5-coder-0.5b", prompt=ids, max_tokens=6,
                                     temperature=0).choices[0].text == text
    e = client.completions.create(model="qwen2.5-coder-0.5b", prompt="def add(a, b):", max_tokens=6,
                                  temperature=0, echo=True)
    assert e.choices[0].text == "def add(a, b):" + text
    fim = client.completions.create(model="qwen2.5-coder-0.5b", prompt="def add(a, b):\n    return ",
                                    suffix="\n\nprint(add(1, 2))\n", max_tokens=4, temperature=0)
    assert fim.choices[0].text.strip().startswith("a")


def test_stop_variants_seed_parts_aliases(client, server):
    base = dict(messages=CHAT, max_tokens=8, temperature=0)
    ref = client.chat.completions.create(model="qwen2.5-coder-0.5b", stop=None, **base).choices[0].message.content
    no_model = httpx.post(server.base_url + "/chat/completions", json={**base, "stop": ""}, timeout=120).json()
    assert no_model["choices"][0]["message"]["content"] == ref  # "model" omitted, stop ""
    cut = ref[len(ref) // 2:len(ref) // 2 + 2]
    r = client.chat.completions.create(model="qwen2.5-coder-0.5b", stop=["zzz", cut], **base)
    assert r.choices[0].message.content == ref[:ref.index(cut)] and r.choices[0].finish_reason == "stop"
    parts = [{"role": "user", "content": [{"type": "text", "text": "Write a haiku "},
                                          {"type": "text", "text": "about the sea."}]}]
    r = client.chat.completions.create(model="default", messages=parts, max_tokens=8, temperature=0, stop=[""])
    assert r.choices[0].message.content == ref and r.model == "qwen2.5-coder-0.5b"
    seeded = [client.chat.completions.create(
        model="qwen2.5-coder-0.5b:latest", messages=CHAT, max_tokens=4, temperature=1.0, top_p=0.9, seed=7,
        presence_penalty=0.5, frequency_penalty=0.1, logit_bias={"42": 1}, user="u", n=1,
        extra_body={"top_k": 40}).choices[0].message.content for _ in range(2)]
    assert seeded[0] == seeded[1]


def test_tool_calls_stream_and_not(client):
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    ask = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    r = client.chat.completions.create(model="default", messages=ask, tools=tools, max_tokens=24, temperature=0)
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    chunks = list(client.chat.completions.create(model="default", messages=ask, tools=tools, max_tokens=24,
                                                 temperature=0, stream=True))
    deltas = [c.choices[0].delta for c in chunks]
    calls: dict[int, dict] = {}  # OpenAI's streamed shape: per call index, id/name first, then arguments
    for tc in (tc for d in deltas for tc in (d.tool_calls or [])):
        c = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
        c["id"] += tc.id or ""
        c["name"] += (tc.function.name or "") if tc.function else ""
        c["arguments"] += (tc.function.arguments or "") if tc.function else ""
    assert list(calls) == [0] and calls[0]["name"] == "get_weather" and not any(d.content for d in deltas)
    assert calls[0]["id"].startswith("call_") and json.loads(calls[0]["arguments"]) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # the follow-up turn (assistant tool_calls with string arguments + a tool result) renders and answers
    follow = ask + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                    {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}]
    r2 = client.chat.completions.create(model="default", messages=follow, tools=tools, max_tokens=4, temperature=0)
    assert r2.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_model_swap_loads_and_returns(client, server, zh_text):
    r = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4, temperature=0)
    assert r.model == "tiny" and r.usage.completion_tokens >= 1
    h = httpx.get(server.url + "/health").json()
    assert h["resident"] == ["tiny"]  # one resident: the default model was unloaded first
    again = client.chat.completions.create(model="qwen2.5-coder-0.5b", messages=ZH, max_tokens=16, temperature=0)
    assert again.choices[0].message.content == zh_text
    assert httpx.get(server.url + "/health").json()["resident"] == ["qwen2.5-coder-0.5b"]


def test_api_key_and_shared_worker(server, llm):
    cfg = EngineConfig(port=0, api_key="sekret")
    with ServerThread(cfg, worker=server.worker) as keyed:
        body = {"messages": CHAT, "max_tokens": 2}
        r = httpx.post(keyed.base_url + "/chat/completions", json=body)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = httpx.post(keyed.base_url + "/chat/completions", json=body, headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401
        r = httpx.post(keyed.base_url + "/chat/completions", json=body,
                       headers={"Authorization": "Bearer sekret"}, timeout=120)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        assert httpx.get(keyed.url + "/health").status_code == 200


def test_cors_allow_list(server):
    pre = {"Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os, x-stainless-lang"}
    for origin in ("app://obsidian.md", "vscode-webview://1abc", "http://localhost:5173", "http://127.0.0.1"):
        r = httpx.options(server.base_url + "/chat/completions", headers={"Origin": origin, **pre})
        assert r.status_code == 204 and r.headers["access-control-allow-origin"] == origin
        allowed = r.headers["access-control-allow-headers"]
        assert {"authorization", "content-type", "x-stainless-os"} <= {x.strip() for x in allowed.split(",")}
    r = httpx.get(server.base_url + "/models", headers={"Origin": "app://obsidian.md"})
    assert r.headers["access-control-allow-origin"] == "app://obsidian.md"
    for evil in ("https://evil.example", "null"):
        r = httpx.options(server.base_url + "/chat/completions", headers={"Origin": evil, **pre})
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
        r = httpx.post(server.base_url + "/chat/completions", headers={"Origin": evil},
                       json={"messages": CHAT, "max_tokens": 1})
        assert r.status_code == 403 and r.json()["error"]["code"] == "cors_origin"


def test_port_in_use_names_the_process(server):
    from engine.errors import ResourceError
    from engine.server.portcheck import bind_socket

    with pytest.raises(ResourceError) as e:
        bind_socket("127.0.0.1", server.port)
    assert "in use" in str(e.value) and f"--port {server.port + 1}" in str(e.value)
    assert "pid" in str(e.value) or "another process" in str(e.value)


def test_serve_cli_startup_errors(capsys, server):
    from engine.cli.main import main

    assert main(["serve", "--model", "/nonexistent/model.gguf", "--port", "0", "--no-pull"]) == 1
    assert "not found" in capsys.readouterr().err
    assert main(["serve", "--port", str(server.port), "--no-pull"]) == 1
    assert "already in use" in capsys.readouterr().err
    import torch
    if not torch.cuda.is_available():
        assert main(["serve", "--device", "cuda", "--port", "0", "--no-pull"]) == 1
        assert "no CUDA GPU" in capsys.readouterr().err
