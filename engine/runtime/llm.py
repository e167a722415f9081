"""LLM: load a model (CPU or GPU runner) and generate for one request at a time.

The server's engine thread (engine/runtime/worker.py) drives the same runner for many requests;
this class is what the CLI, tests and benchmarks use directly.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

from engine.formats.chat import render_chat
from engine.config import EngineConfig
from engine.errors import ResourceError
from engine.runtime.sampling import SamplingParams
from engine.runtime.sequence import Sequence
from engine.formats.spec import ModelSpec
from engine.formats.load import load_spec


def pick_device(requested: str) -> str:
    if requested == "cpu":
        return "cpu"
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover
        has_cuda = False
    if requested == "cuda" and not has_cuda:
        raise ResourceError("no CUDA GPU is available to this process",
                            "install the NVIDIA driver and a CUDA build of torch, or use --device cpu")
    return "cuda" if has_cuda else "cpu"


def make_runner(spec: ModelSpec, cfg: EngineConfig):
    if pick_device(cfg.device) == "cuda":
        from engine.runtime.gpu_runner import GPURunner
        return GPURunner(spec, cfg)
    from engine.runtime.cpu_runner import CPURunner
    return CPURunner(spec, cfg)


@dataclass
class GenEvent:
    text: str  # text delta (complete UTF-8 characters only)
    token_id: int | None = None
    finish_reason: str | None = None


@dataclass
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    prefill_s: float  # time to first token
    decode_s: float
    token_ids: list[int] = field(default_factory=list)

    @property
    def decode_tps(self) -> float:
        n = self.completion_tokens - 1
        return n / self.decode_s if self.decode_s > 0 and n > 0 else 0.0


class LLM:
    def __init__(self, cfg: EngineConfig | None = None, spec: ModelSpec | None = None):
        self.cfg = cfg or EngineConfig()
        t0 = time.perf_counter()
        self.spec = spec or load_spec(self.cfg.model)
        self.runner = make_runner(self.spec, self.cfg)
        # load = file -> weights in memory; warm-up (GPU: CUDA-graph captures) is reported apart
        self.warmup_seconds = getattr(self.runner, "warmup_seconds", 0.0)
        self.load_seconds = time.perf_counter() - t0 - self.warmup_seconds
        self.tokenizer = self.spec.tokenizer
        self.name = self.cfg.model

    @property
    def max_context(self) -> int:
        return self.runner.max_context

    def render(self, messages: list, tools: list | None = None) -> str:
        return render_chat(self.spec.chat_template, messages, True, tools)

    def encode_chat(self, messages: list) -> list[int]:
        return self.tokenizer.encode(self.render(messages))

    def new_sequence(self, prompt: str | list[int], params: SamplingParams) -> Sequence:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self.runner.check_fits(len(ids), params.max_tokens)
        return Sequence(ids, params, self.tokenizer)

    def stream(self, prompt: str | list[int], params: SamplingParams | None = None,
               timings: dict | None = None) -> Iterator[GenEvent]:
        """Generate for one prompt, yielding text deltas; the last event has finish_reason."""
        seq = self.new_sequence(prompt, params or SamplingParams())
        t0 = time.perf_counter()
        self.runner.allocate(seq)
        try:
            delta = self.runner.prefill(seq)
            t1 = time.perf_counter()
            if timings is not None:
                timings.update(prefill_s=t1 - t0, prompt_tokens=len(seq.prompt_ids))
            if delta or seq.finished:
                yield GenEvent(delta, seq.output_ids[-1] if seq.output_ids else None, seq.finish_reason)
            while not seq.finished:
                delta = self.runner.decode([seq])[0]
                if delta or seq.finished:
                    yield GenEvent(delta, seq.output_ids[-1] if seq.output_ids else None, seq.finish_reason)
            if timings is not None:
                timings.update(decode_s=time.perf_counter() - t1, completion_tokens=len(seq.output_ids),
                               token_ids=list(seq.output_ids), finish_reason=seq.finish_reason)
        finally:
            self.runner.release(seq)

    def complete(self, prompt: str | list[int], params: SamplingParams | None = None) -> Completion:
        t: dict = {}
        text = "".join(ev.text for ev in self.stream(prompt, params, t))
        return Completion(text, t["prompt_tokens"], t["completion_tokens"], t["finish_reason"],
                          t["prefill_s"], t["decode_s"], t["token_ids"])

    def chat(self, messages: list, params: SamplingParams | None = None) -> Completion:
        return self.complete(self.render(messages), params)
