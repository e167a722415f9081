"""Benchmark targets. Every target answers the same calls:

  chat(messages, sampling) -> row dict      (productivity protocol)
  generate(ids, text, max_tokens, ignore_eos, sampling) -> row dict   (speed runs; raw prompt)
  memory() -> dict | None,  info() -> dict,  close()

A row dict holds client-measured wall_s, ttft_s (time to first token), decode_s (first to last
token), the backend's own prompt_tokens / completion_tokens, the text, and native_* timings
where the backend reports its own (our engine's prefill/decode clocks, Ollama's durations).
"""
from __future__ import annotations

import os
import sys
import time

try:
    import resource  # POSIX only: Windows has no resource module
except ImportError:  # pragma: no cover
    resource = None

import torch

from engine.bench import targets_http
from engine.bench.protocol import decode_tps
from engine.config import DEFAULT_MODEL, EngineConfig
from engine.errors import BadRequestError
from engine.runtime.llm import LLM
from engine.runtime.sampling import SamplingParams
from engine.runtime.worker import EngineWorker
from engine.runtime.worker_types import Failed, Finished, GenerateRequest


def parse_target(spec: str, model: str | None = None, **inproc_kw):
    """'inproc' | 'http:URL' (our endpoint) | 'openai:URL' | 'ollama:URL' -> a target."""

    if spec == "inproc":
        return InProcTarget(model, **inproc_kw)
    kind, _, url = spec.partition(":")
    if kind == "http":
        return targets_http.OpenAITarget(url, model=None, name="deepinfer-http")
    if kind == "openai":
        return targets_http.OpenAITarget(url, model=model)
    if kind == "ollama":
        return targets_http.OllamaTarget(url, model=model)
    raise BadRequestError(f"unknown target {spec!r}",
                          "use inproc, http:URL, openai:URL (e.g. openai:http://127.0.0.1:8080/v1) or ollama:URL")


class InProcTarget:
    """Our engine in this process (engine.runtime.llm.LLM): exact token ids, no HTTP in the way. LLM drives the
    server's Scheduler (engine/runtime/scheduler.py) over the same runner, so single streams measure the
    server's path minus HTTP and the thread hop; concurrent streams go through the engine thread itself."""

    kind = "inproc"
    # Concurrency in-process goes through engine.runtime.worker.EngineWorker (the server's engine thread,
    # continuous batching) with max_batch slots; over HTTP it goes through a real endpoint.
    concurrent = True

    def __init__(self, model: str | None, device: str = "auto", max_context: int = 4096, max_batch: int = 1,
                 dtype: str = "auto", threads: int = 0, llm=None, **memory):
        """memory: gpu_memory_limit_mb / embed_on_host (EngineConfig)."""
        if llm is None:
            llm = LLM(EngineConfig(model=model or DEFAULT_MODEL, device=device, max_context=max_context,
                                   max_batch=max_batch, dtype=dtype, threads=threads, **memory))
        self.llm = llm
        self.name = "deepinfer-inproc"
        self.model = llm.name
        self.load_s = llm.load_seconds
        self.warmup_s = getattr(llm, "warmup_seconds", 0.0)
        self.tokenizer = llm.tokenizer
        self.max_context = llm.max_context
        self.worker = None
        self.load_peak = self._reset_cuda_peak()  # load transients are reported apart from the runs

    def _reset_cuda_peak(self) -> dict:
        try:
            if torch.cuda.is_available() and getattr(self.llm.runner, "device", "cpu") != "cpu":
                peak = {"load_peak_allocated_bytes": torch.cuda.max_memory_allocated(),
                        "load_peak_reserved_bytes": torch.cuda.max_memory_reserved()}
                torch.cuda.reset_peak_memory_stats()
                return peak
        except Exception:  # pragma: no cover
            pass
        return {}

    def render(self, msgs: list[dict]) -> str:
        return self.llm.render(msgs)

    def _run(self, prompt, params) -> dict:
        t: dict = {}
        t0 = time.perf_counter()
        text = "".join(ev.text for ev in self.llm.stream(prompt, params, t))
        wall = time.perf_counter() - t0
        return {"wall_s": wall, "ttft_s": t["prefill_s"], "decode_s": t["decode_s"],
                "prompt_tokens": t["prompt_tokens"], "completion_tokens": t["completion_tokens"],
                "finish_reason": t["finish_reason"], "text": text,
                "native_prefill_s": t["prefill_s"],
                "native_decode_tps": decode_tps(t["completion_tokens"], t["decode_s"])}

    def _params(self, sp: dict, max_tokens: int | None = None, ignore_eos: bool = False):
        return SamplingParams(max_tokens=max_tokens or sp["max_tokens"], temperature=sp.get("temperature", 0.0),
                              top_p=sp.get("top_p", 1.0), top_k=sp.get("top_k", 0), seed=sp.get("seed"),
                              ignore_eos=ignore_eos)

    def chat(self, msgs: list[dict], sp: dict) -> dict:
        return self._run(self.render(msgs), self._params(sp))

    def generate(self, ids: list[int], text: str, max_tokens: int, ignore_eos: bool, sp: dict) -> dict:
        return self._run(list(ids), self._params(sp, max_tokens, ignore_eos))

    def generate_concurrent(self, ids: list[int], text: str, max_tokens: int, ignore_eos: bool, sp: dict) -> dict:
        """One stream among several: submitted to an EngineWorker (thread-safe), client clocks."""
        if self.worker is None:
            self.worker = EngineWorker(self.llm.cfg, llm=self.llm).start()
        t0 = time.perf_counter()
        first = last = None
        parts = []
        fin = None
        handle = self.worker.submit(GenerateRequest(list(ids), self._params(sp, max_tokens, ignore_eos)))
        for ev in handle.iter(timeout=900):
            if isinstance(ev, Failed):
                raise ev.error
            if isinstance(ev, Finished):
                fin = ev
            elif ev.text:
                last = time.perf_counter()
                first = first or last
                parts.append(ev.text)
        end = time.perf_counter()
        return {"wall_s": end - t0, "ttft_s": (first or end) - t0, "decode_s": (last - first) if first else 0.0,
                "prompt_tokens": fin.prompt_tokens, "completion_tokens": fin.completion_tokens,
                "finish_reason": fin.finish_reason, "text": "".join(parts), "native_ttft_s": fin.ttft_s}

    def end_concurrent(self):
        if self.worker is not None:
            self.worker.stop()
            self.worker = None

    def memory(self) -> dict:
        out = dict(self.llm.runner.memory(), **self.load_peak)
        try:
            if torch.cuda.is_available() and getattr(self.llm.runner, "device", "cpu") != "cpu":
                out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
                out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        except Exception:  # pragma: no cover
            pass
        out.update(process_memory())
        return out

    def info(self) -> dict:
        cfg = self.llm.spec.config
        src = str(self.llm.spec.source)  # a file in the model cache: its name (no machine path in a results file)
        return {"name": self.name, "kind": self.kind, "model": self.model,
                "source": os.path.basename(src) if os.path.isabs(src) else src,
                "model_kind": self.llm.spec.kind, "device": getattr(self.llm.runner, "device", "?"),
                "dtype": str(getattr(self.llm.runner, "dtype", self.llm.cfg.dtype)),
                "max_context": self.max_context, "layers": cfg.num_layers, "hidden": cfg.hidden_size,
                "max_batch": self.llm.cfg.max_batch, "load_s": self.load_s, "warmup_s": self.warmup_s}

    def close(self):
        self.end_concurrent()


def process_memory() -> dict:
    """Peak resident set size of this process (CPU side), where the OS reports it."""
    try:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {"peak_rss_bytes": rss if sys.platform == "darwin" else rss * 1024}
    except Exception:  # Windows: no resource module
        return {}
