"""HTTP targets: any OpenAI-compatible endpoint (ours, llama.cpp server, vLLM ...) and Ollama's
native API. Times are taken on the client: ttft_s = request sent -> first non-empty text,
decode_s = first -> last text; token counts come from the backend's own usage fields."""
from __future__ import annotations

import json
import time
from urllib.parse import urlparse

from engine.errors import BadRequestError, ResourceError

TIMEOUT_S = 900.0


def _client():
    try:
        import httpx  # httpx: tray/dev extra, not a core dependency
    except ImportError as e:  # pragma: no cover
        raise ResourceError("httpx is needed to benchmark an HTTP endpoint", "pip install httpx") from e
    return httpx.Client(timeout=httpx.Timeout(TIMEOUT_S, connect=10.0),
                        limits=httpx.Limits(max_connections=64, max_keepalive_connections=64))


def _check(resp, what: str):
    if resp.status_code >= 400:
        resp.read()
        raise BadRequestError(f"{what} answered HTTP {resp.status_code}: {resp.text[:300]}",
                              "check the URL, the model name (--peer-model) and that the server is running")


def _get_json(http, base: str, path: str, fix: str, headers: dict | None = None) -> dict:
    """GET base+path as JSON; an unreachable server or an HTTP error is a one-line error with the fix."""
    try:
        r = http.get(base + path, headers=headers)
    except Exception as e:
        raise ResourceError(f"cannot reach {base}: {e}", fix) from e
    _check(r, base + path)
    return r.json()


class _Timer:
    """Client-side clocks for one streamed request."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.first = self.last = None
        self.parts: list[str] = []

    def text(self, s: str):
        if s:
            now = time.perf_counter()
            self.first = self.first or now
            self.last = now
            self.parts.append(s)

    def row(self) -> dict:
        end = time.perf_counter()
        return {"wall_s": end - self.t0,
                "ttft_s": (self.first or end) - self.t0,
                "decode_s": (self.last - self.first) if self.first else 0.0,
                "text": "".join(self.parts)}


class _HTTPTarget:
    """What the HTTP peers share: no memory report (another process), their URL in info(), one client."""

    concurrent = True
    load_s = None  # loading happened in another process
    max_context = None

    def memory(self):
        return None

    def info(self) -> dict:
        return {"name": self.name, "kind": self.kind, "url": self.base, "model": self.model}

    def close(self):
        self.http.close()


class OpenAITarget(_HTTPTarget):
    kind = "openai"

    def __init__(self, url: str, model: str | None = None, name: str | None = None, api_key: str = "bench"):
        url = url.rstrip("/")
        self.base = url if url.endswith("/v1") else url + "/v1"
        self.name = name or f"openai@{urlparse(self.base).netloc}"
        self.http = _client()
        self.headers = {"Authorization": f"Bearer {api_key}"}
        self.model = model or self._first_model()

    def _first_model(self) -> str:
        data = _get_json(self.http, self.base, "/models", "start the server or fix the URL",
                         self.headers).get("data") or []
        if not data:
            raise BadRequestError(f"{self.base}/models lists no model", "pass --peer-model NAME")
        return data[0]["id"]

    def _stream(self, path: str, body: dict, pick) -> dict:
        tm = _Timer()
        usage, finish, timings = {}, None, {}
        with self.http.stream("POST", self.base + path, json=body, headers=self.headers) as resp:
            _check(resp, self.base + path)
            for line in resp.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("usage"):
                    usage = chunk["usage"]
                if chunk.get("timings"):  # llama.cpp server reports its own clocks
                    timings = chunk["timings"]
                for ch in chunk.get("choices") or []:
                    tm.text(pick(ch) or "")
                    finish = ch.get("finish_reason") or finish
        row = tm.row()
        row.update(prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens"),
                   finish_reason=finish)
        if timings.get("predicted_ms") is not None:
            row.update(native_prefill_s=timings.get("prompt_ms", 0) / 1000,
                       native_prefill_tps=timings.get("prompt_per_second"),
                       native_decode_s=timings["predicted_ms"] / 1000,
                       native_decode_tps=timings.get("predicted_per_second"))
        if not usage:
            row.setdefault("flags", []).append("backend sent no usage (stream_options.include_usage ignored)")
        return row

    def _sampling(self, sp: dict, max_tokens: int) -> dict:
        return {"model": self.model, "stream": True, "stream_options": {"include_usage": True},
                "max_tokens": max_tokens, "temperature": sp.get("temperature", 0.0), "top_p": sp.get("top_p", 1.0),
                "top_k": sp.get("top_k", 0) or None, "seed": sp.get("seed")}

    def chat(self, msgs: list[dict], sp: dict) -> dict:
        body = {**self._sampling(sp, sp["max_tokens"]), "messages": msgs}
        return self._stream("/chat/completions", body, lambda ch: (ch.get("delta") or {}).get("content"))

    def generate(self, ids: list[int], text: str, max_tokens: int, ignore_eos: bool, sp: dict) -> dict:
        body = {**self._sampling(sp, max_tokens), "prompt": text}
        if ignore_eos:
            body["ignore_eos"] = True  # llama.cpp server / vLLM / our server extension
        row = self._stream("/completions", body, lambda ch: ch.get("text"))
        if ignore_eos and (row.get("completion_tokens") or 0) < max_tokens:
            row.setdefault("flags", []).append(f"stopped at {row.get('completion_tokens')} < {max_tokens} tokens")
        return row


class OllamaTarget(_HTTPTarget):
    """Ollama's native API: /api/chat and /api/generate report prompt_eval_count/_duration and
    eval_count/_duration (nanoseconds); those are kept as native_* beside the client clocks."""

    kind = "ollama"

    def __init__(self, url: str, model: str | None = None, name: str | None = None):
        self.base = url.rstrip("/")
        self.name = name or f"ollama@{urlparse(self.base).netloc}"
        self.http = _client()
        self.model = model or self._first_model()

    def _first_model(self) -> str:
        models = _get_json(self.http, self.base, "/api/tags", "start ollama serve or fix the URL").get("models") or []
        if not models:
            raise BadRequestError(f"{self.base} has no model pulled", "ollama pull qwen2.5:3b, or pass --peer-model")
        return models[0]["name"]

    def _stream(self, path: str, body: dict, pick) -> dict:
        tm = _Timer()
        final = {}
        with self.http.stream("POST", self.base + path, json=body) as resp:
            _check(resp, self.base + path)
            for line in resp.iter_lines():
                if not line.strip():
                    continue
                chunk = json.loads(line)
                if chunk.get("error"):
                    raise BadRequestError(f"ollama: {chunk['error']}", "check --peer-model")
                tm.text(pick(chunk) or "")
                if chunk.get("done"):
                    final = chunk
        row = tm.row()
        ns = 1e-9
        pe_n, pe_d = final.get("prompt_eval_count"), final.get("prompt_eval_duration")
        ev_n, ev_d = final.get("eval_count"), final.get("eval_duration")
        row.update(prompt_tokens=pe_n, completion_tokens=ev_n, finish_reason=final.get("done_reason"),
                   native_prefill_s=pe_d * ns if pe_d else None,
                   native_decode_s=ev_d * ns if ev_d else None,
                   native_decode_tps=(ev_n / (ev_d * ns)) if ev_n and ev_d else None,
                   native_prefill_tps=(pe_n / (pe_d * ns)) if pe_n and pe_d else None,
                   native_load_s=(final.get("load_duration") or 0) * ns,
                   native_total_s=(final.get("total_duration") or 0) * ns)
        return row

    def _options(self, sp: dict, max_tokens: int, n_ctx: int | None = None) -> dict:
        opts = {"temperature": sp.get("temperature", 0.0), "top_p": sp.get("top_p", 1.0),
                "top_k": sp.get("top_k", 0) or None, "seed": sp.get("seed"), "num_predict": max_tokens}
        if n_ctx and n_ctx > 2048:  # Ollama's default context would truncate the prompt
            opts["num_ctx"] = n_ctx
        return {k: v for k, v in opts.items() if v is not None}

    def chat(self, msgs: list[dict], sp: dict) -> dict:
        body = {"model": self.model, "messages": msgs, "stream": True, "options": self._options(sp, sp["max_tokens"])}
        return self._stream("/api/chat", body, lambda c: (c.get("message") or {}).get("content"))

    def generate(self, ids: list[int], text: str, max_tokens: int, ignore_eos: bool, sp: dict) -> dict:
        n_ctx = len(ids) + max_tokens + 64
        body = {"model": self.model, "prompt": text, "raw": True, "stream": True,
                "options": self._options(sp, max_tokens, n_ctx)}
        row = self._stream("/api/generate", body, lambda c: c.get("response"))
        if ignore_eos and (row.get("completion_tokens") or 0) < max_tokens:
            row.setdefault("flags", []).append(
                f"stopped at {row.get('completion_tokens')} < {max_tokens} tokens (Ollama cannot ignore EOS)")
        return row
