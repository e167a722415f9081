"""The tray's backends: one OpenAI-compatible HTTP client for both kinds.

- local:  the resident model in this process. `LocalEndpoint.start()` imports
  engine.server.app.start_background_server lazily (that import pulls torch; trayapp itself never
  does at import time), which runs uvicorn in a thread plus the engine worker thread that owns the
  model, on 127.0.0.1:<port>. A DeepInfer server already answering on that port is reused.
- remote: any OpenAI-compatible base URL (another machine, Ollama's /v1, ...).
Both are then driven by `OpenAIBackend` over HTTP (httpx, SSE streaming): one code path.
"""
from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator

import httpx

from engine.config import EngineConfig
from engine.errors import DeepInferError, ResourceError


class BackendError(DeepInferError):
    """The backend is down, refused the request or broke the stream."""


def _root(base_url: str) -> str:
    """http://host:port/v1 -> http://host:port (where /health lives)."""
    u = base_url.rstrip("/")
    return u[:-3] if u.endswith("/v1") else u


def _error_state(r: httpx.Response) -> bool:
    """A DeepInfer /health answer of a server in the error state (503 + {"state": "error", "error": ...})."""
    if r.status_code != 503:
        return False
    try:
        body = r.json()
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("state") == "error"


class OpenAIBackend:
    """Chat over /v1/chat/completions (streaming), model list, health and model switch."""

    def __init__(self, base_url: str, api_key: str = "", model: str = "", timeout_s: float = 300.0,
                 deepinfer: bool = False):
        self.base_url = base_url.rstrip("/")
        self.model = model
        # our own server: ask for usage (server-side TTFT, cached prompt tokens, speculation counts) and send
        # the extension fields; other OpenAI-compatible servers may refuse unknown fields, so never to them
        self.deepinfer = deepinfer
        self.last_usage: dict = {}  # the usage frame of the last streamed answer ({} when none came)
        self.timeout = httpx.Timeout(timeout_s, connect=5.0)
        self.headers = {"Authorization": f"Bearer {api_key or 'deepinfer'}"}

    def __repr__(self) -> str:
        return f"OpenAIBackend({self.base_url!r}, model={self.model!r})"

    # --------------------------------------------------------------- errors
    def _fail(self, e: Exception, what: str) -> BackendError:
        if isinstance(e, httpx.ConnectError):
            return BackendError(f"cannot reach the model at {self.base_url} ({what}: connection refused)",
                                "start the endpoint from the tray menu, or fix [backend] url in config.toml")
        if isinstance(e, httpx.TimeoutException):
            return BackendError(f"the model at {self.base_url} did not answer in time ({what})",
                                "retry, or use a smaller model / shorter text")
        if isinstance(e, httpx.HTTPStatusError):
            r = e.response
            try:
                msg = r.json()["error"]["message"]
            except Exception:
                msg = (r.text or r.reason_phrase)[:200]
            return BackendError(f"the model at {self.base_url} answered {r.status_code} ({what}): {msg}")
        return BackendError(f"{what} failed: {e}")

    # --------------------------------------------------------------- info
    def health(self) -> dict:
        """GET /health of a DeepInfer server ({} for servers without it)."""
        try:
            r = httpx.get(_root(self.base_url) + "/health", headers=self.headers, timeout=3.0)
        except httpx.HTTPError as e:
            raise self._fail(e, "health") from None
        if r.status_code == 404:
            return {}
        if _error_state(r):  # a DeepInfer server whose model failed to load: its state, message and fix
            return r.json()
        try:
            r.raise_for_status()
            return r.json()
        except (httpx.HTTPStatusError, ValueError) as e:
            raise self._fail(e, "health") from None

    def models(self) -> list[str]:
        try:
            r = httpx.get(self.base_url + "/models", headers=self.headers, timeout=5.0)
            r.raise_for_status()
            return [m["id"] for m in r.json().get("data", [])]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
            raise self._fail(e, "list models") from None

    def resolve_model(self) -> str:
        if not self.model:
            ids = self.models()
            if not ids:
                raise BackendError(f"{self.base_url}/models lists no model", "set [backend] model in config.toml")
            self.model = ids[0]
        return self.model

    # --------------------------------------------------------------- generation
    def stream_chat(self, messages: list[dict], max_tokens: int, temperature: float = 0.0,
                    cancel: threading.Event | None = None, speculative: bool = False) -> Iterator[str]:
        """Yields text deltas. The server sends only whole UTF-8 characters (seed 5.18).
        speculative: ask our server for prompt-lookup speculative decoding (same output under greedy)."""
        body = {"model": self.resolve_model(), "messages": messages, "max_tokens": max_tokens,
                "temperature": temperature, "stream": True}
        if self.deepinfer:
            body["stream_options"] = {"include_usage": True}
            if speculative:
                body["speculative"] = True
        self.last_usage = {}
        try:
            with httpx.stream("POST", self.base_url + "/chat/completions", json=body, headers=self.headers,
                              timeout=self.timeout) as r:
                if r.status_code >= 400:
                    r.read()
                    r.raise_for_status()
                for line in r.iter_lines():
                    if cancel is not None and cancel.is_set():
                        return
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    chunk = json.loads(data)
                    if "error" in chunk:
                        raise BackendError(f"the model failed mid-answer: {chunk['error'].get('message', chunk)}")
                    if chunk.get("usage"):
                        self.last_usage = {**chunk["usage"], "deepinfer": chunk.get("deepinfer") or {}}
                    for ch in chunk.get("choices") or []:
                        delta = (ch.get("delta") or {}).get("content")
                        if delta:
                            yield delta
        except httpx.HTTPError as e:
            raise self._fail(e, "chat") from None
        except ValueError as e:  # bad JSON in a frame
            raise BackendError(f"the model at {self.base_url} sent a malformed stream ({e})") from None

    def chat(self, messages: list[dict], max_tokens: int, temperature: float = 0.0,
             on_delta: Callable[[str], None] | None = None, cancel: threading.Event | None = None,
             speculative: bool = False) -> str:
        parts = []
        for d in self.stream_chat(messages, max_tokens, temperature, cancel, speculative):
            parts.append(d)
            if on_delta:
                on_delta(d)
        return "".join(parts)

    def switch_model(self, model_id: str) -> None:
        """Make `model_id` current; on a DeepInfer server the first request with it loads it."""
        old = self.model
        self.model = model_id
        try:
            self.chat([{"role": "user", "content": "hi"}], max_tokens=1)
        except BackendError as e:
            self.model = old
            raise BackendError(f"cannot switch to {model_id}: {e.message}", e.fix) from None


class LocalEndpoint:
    """The in-process endpoint on 127.0.0.1:<port> (model resident in the server's engine thread)."""

    def __init__(self, model: str, port: int = 18000, starter: Callable | None = None,
                 served: list[str] | None = None, gguf_pack: str = "", cpu_weights: str = ""):
        self.model, self.port = model, port
        self.gguf_pack = gguf_pack  # EngineConfig.gguf_pack for a GGUF on the GPU; "" = the engine's default
        self.cpu_weights = cpu_weights  # EngineConfig.cpu_weights without a GPU; "" = the engine's default
        self.served = served or []  # ["id=model argument", ...]: the other models the server may load
        self.url = f"http://127.0.0.1:{port}/v1"
        self._starter = starter  # tests may pass start_background_server-like callables
        self._handle = None
        self.external = False  # True when another DeepInfer process already serves the port

    @property
    def running(self) -> bool:
        return self._handle is not None or self.external

    def _probe(self) -> bool:
        """True if a DeepInfer server already answers on the port; error if something else does."""
        try:
            r = httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1.0)
        except httpx.HTTPError:
            return False
        if r.status_code == 200 or _error_state(r):
            return True
        raise ResourceError(f"port {self.port} is used by another program (GET /health -> {r.status_code})",
                            "stop that program or set [backend] port in config.toml")

    def start(self) -> str:
        if self.running:
            return self.url
        if self._probe():
            self.external = True
            return self.url
        starter = self._starter
        if starter is None:
            try:  # heavy import (torch) on purpose here only
                from engine.server.app import start_background_server as starter  # torch: tray never imports it
            except ImportError as e:
                raise ResourceError(f"the local engine is not installed ({e})",
                                    "pip install deepinfer[tray] torch, or use a remote backend") from None

        # fit_context: on a small card the model comes up with the context that fits (reported by /health,
        # which the assistant reads) rather than not at all
        pack = {k: v for k, v in (("gguf_pack", self.gguf_pack), ("cpu_weights", self.cpu_weights)) if v}
        self._handle = starter(EngineConfig(model=self.model, port=self.port, served_models=list(self.served),
                                            fit_context=True, list_pulled=True, **pack))
        url = getattr(self._handle, "url", self.url).rstrip("/")
        self.url = url if url.endswith("/v1") else url + "/v1"
        return self.url

    def stop(self) -> None:
        h, self._handle, self.external = self._handle, None, False
        if h is not None:
            h.stop()
