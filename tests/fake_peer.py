"""A test double of a PEER backend (not of our server): speaks the OpenAI streaming protocol
(/v1/models, /v1/chat/completions, /v1/completions with SSE + usage) and Ollama's native API
(/api/tags, /api/chat, /api/generate with prompt_eval_count/_duration, eval_count/_duration) on
loopback, with known token counts and known delays, so the harness's clocks and parsing can be
checked against numbers we chose.

Tokens are counted with the tokenizer passed in (the real Qwen2.5 one in the tests); the answer
is a list of single-token English words, so the benchmark's cross-check agrees with the counts.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WORDS = [" one", " two", " three", " four", " five", " six", " seven", " eight", " nine", " ten"]


class FakePeer:
    def __init__(self, count_tokens, render, prefill_s: float = 0.02, token_s: float = 0.005,
                 answer_tokens: int = 12, model: str = "fake-qwen2.5:3b", prompt_skew: int = 0,
                 usage: bool = True, llama_timings: bool = False):
        self.count_tokens, self.render = count_tokens, render
        self.prefill_s, self.token_s, self.answer_tokens = prefill_s, token_s, answer_tokens
        self.model, self.prompt_skew = model, prompt_skew
        self.usage, self.llama_timings = usage, llama_timings  # llama.cpp server adds "timings"
        self.requests: list[tuple[str, dict]] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def words(self, n: int) -> list[str]:
        return [WORDS[i % len(WORDS)] for i in range(n)]

    def _handler(self):
        peer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _json(self, obj, code=200):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/v1/models":
                    self._json({"object": "list", "data": [{"id": peer.model, "object": "model", "created": 0,
                                                            "owned_by": "fake"}]})
                elif self.path == "/api/tags":
                    self._json({"models": [{"name": peer.model, "model": peer.model}]})
                else:
                    self._json({"error": {"message": "not found"}}, 404)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with peer.lock:
                    peer.requests.append((self.path, body))
                if self.path in ("/v1/chat/completions", "/v1/completions"):
                    self._openai(body, chat=self.path.endswith("chat/completions"))
                elif self.path in ("/api/chat", "/api/generate"):
                    self._ollama(body, chat=self.path == "/api/chat")
                else:
                    self._json({"error": {"message": "not found"}}, 404)

            def _count_prompt(self, body, chat):
                text = peer.render(body["messages"]) if chat else body["prompt"]
                return peer.count_tokens(text) + peer.prompt_skew

            def _openai(self, body, chat):
                n_prompt = self._count_prompt(body, chat)
                n = body.get("max_tokens", 16)
                if chat or not body.get("ignore_eos"):
                    n = min(n, peer.answer_tokens)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                time.sleep(peer.prefill_s)
                t1 = time.perf_counter()
                for i, w in enumerate(peer.words(n)):
                    if i:
                        time.sleep(peer.token_s)
                    ch = {"delta": {"content": w}} if chat else {"text": w}
                    self._sse({"id": "x", "object": "chunk", "model": peer.model,
                               "choices": [{"index": 0, **ch, "finish_reason": None}]})
                last = {"id": "x", "choices": [{"index": 0, "delta": {}, "text": "",
                                                "finish_reason": "length" if n < peer.answer_tokens else "stop"}]}
                if peer.llama_timings:
                    dt = time.perf_counter() - t1
                    last["timings"] = {"prompt_n": n_prompt, "prompt_ms": peer.prefill_s * 1000,
                                       "prompt_per_second": n_prompt / peer.prefill_s, "predicted_n": n,
                                       "predicted_ms": dt * 1000, "predicted_per_second": n / dt}
                self._sse(last)
                if peer.usage and (body.get("stream_options") or {}).get("include_usage"):
                    self._sse({"id": "x", "choices": [], "usage": {"prompt_tokens": n_prompt, "completion_tokens": n,
                                                                   "total_tokens": n_prompt + n}})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

            def _sse(self, obj):
                self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
                self.wfile.flush()

            def _ollama(self, body, chat):
                opts = body.get("options") or {}
                n_prompt = self._count_prompt(body, chat)
                n = opts.get("num_predict", 128)
                if chat:
                    n = min(n, peer.answer_tokens)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-ndjson")
                self.send_header("Connection", "close")
                self.end_headers()
                t0 = time.perf_counter()
                time.sleep(peer.prefill_s)
                t1 = time.perf_counter()
                for i, w in enumerate(peer.words(n)):
                    if i:
                        time.sleep(peer.token_s)
                    part = {"message": {"role": "assistant", "content": w}} if chat else {"response": w}
                    self._line({"model": peer.model, **part, "done": False})
                t2 = time.perf_counter()
                ns = lambda s: int(s * 1e9)
                self._line({"model": peer.model, "done": True, "done_reason": "length",
                            **({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}),
                            "total_duration": ns(t2 - t0), "load_duration": 1000,
                            "prompt_eval_count": n_prompt, "prompt_eval_duration": ns(t1 - t0),
                            "eval_count": n, "eval_duration": ns(t2 - t1)})
                self.close_connection = True

            def _line(self, obj):
                self.wfile.write(json.dumps(obj).encode() + b"\n")
                self.wfile.flush()

        return H
