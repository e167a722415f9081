"""LLM: load a model (CPU or GPU runner) and generate synchronously (CLI, bench, tests).

It drives the same Scheduler (engine/runtime/scheduler.py) over the same runner as the server's engine
thread (engine/runtime/worker.py), and yields the same events (TextDelta, engine/runtime/worker_types.py):
what the CLI and the in-process bench measure is the server's path without the HTTP and thread hop.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Iterator

from engine.config import EngineConfig
from engine.errors import BadRequestError, ResourceError
from engine.formats.chat import render_chat
from engine.formats.load import load_spec
from engine.formats.spec import ModelSpec
from engine.runtime.capability import gpu_capability
from engine.runtime.cpu_runner import CPURunner
from engine.runtime.draft_heads import DraftHeads
from engine.runtime.draft_model import DraftModel
from engine.runtime.gpu_runner import GPURunner
from engine.runtime.sampling import SamplingParams
from engine.runtime.scheduler import Scheduler
from engine.runtime.sequence import Sequence
from engine.runtime.worker_types import TextDelta

log = logging.getLogger("deepinfer.device")
_warned: set[str] = set()


def pick_device(requested: str) -> str:
    """"cpu" | "cuda" for a requested "auto" | "cpu" | "cuda", asking the check `deepinfer doctor` uses
    (engine/runtime/capability.py: a CUDA GPU, CuPy compiling a kernel; Triton is optional). "auto" on a GPU
    whose toolchain is incomplete warns once and runs on the CPU; "cuda" there raises ResourceError."""
    if requested == "cpu":
        return "cpu"
    cap = gpu_capability()
    if cap.ok:
        return "cuda"
    if requested == "cuda":
        raise ResourceError(f"the GPU path cannot run: {cap.reason}", f"{cap.fix}, or use --device cpu")
    if cap.cuda and cap.reason not in _warned:  # a GPU is there but unusable: say why, once
        _warned.add(cap.reason)
        log.warning("a CUDA GPU is present but %s: running on the CPU (slow). Fix: %s", cap.reason, cap.fix)
    return "cpu"


def make_runner(spec: ModelSpec, cfg: EngineConfig):
    if pick_device(cfg.device) == "cuda":
        return GPURunner(spec, cfg)
    return CPURunner(spec, cfg)


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


def encode_chat(spec: ModelSpec, messages: list) -> list[int]:
    """The prompt ids of a chat on a model's template, with the generation prompt: LLM.encode_chat, and `deepinfer ask`'s
    check before the weights load (the spec alone: header, tokenizer, template)."""
    return spec.tokenizer.encode(render_chat(spec.chat_template, messages, True))


class LLM:
    def __init__(self, cfg: EngineConfig | None = None, spec: ModelSpec | None = None, runner_factory=None):
        """runner_factory(spec, cfg) -> runner: make_runner unless given (engine/bench/spec_diff.py's "ref": the GPU
        runner's code on the kernels' CPU references)."""
        self.cfg = cfg or EngineConfig()
        t0 = time.perf_counter()
        self.spec = spec or load_spec(self.cfg.model)
        self.runner = (runner_factory or make_runner)(self.spec, self.cfg)
        if self.cfg.draft_model:  # engine/runtime/draft_model.py: drafts where prompt lookup has none
            self.runner.drafter = DraftModel.load(self.cfg.draft_model, self.cfg, make_runner)
        elif self.cfg.draft_heads:  # engine/runtime/draft_heads.py: Medusa-style heads, where bundled for the model
            self.runner.heads = DraftHeads.load(self.runner, self.spec, self.cfg.draft_heads)
            if self.runner.heads is not None and self.cfg.warmup:
                self.runner.heads.warmup()
        self.scheduler = Scheduler(self.runner, self.cfg.prefill_slice)
        # load = file -> weights in memory; warm-up (GPU: CUDA-graph captures) is reported apart
        self.warmup_seconds = getattr(self.runner, "warmup_seconds", 0.0)
        self.load_seconds = time.perf_counter() - t0 - self.warmup_seconds
        self.tokenizer = self.spec.tokenizer
        self.name = self.cfg.model
        try:  # compile the chat template now, not on the first request (a broken one fails chat requests only)
            self.encode_chat([{"role": "user", "content": "hi"}])
        except BadRequestError:
            pass

    @property
    def max_context(self) -> int:
        return self.runner.max_context

    def render(self, messages: list, tools: list | None = None) -> str:
        return render_chat(self.spec.chat_template, messages, True, tools)

    def encode_chat(self, messages: list) -> list[int]:
        return encode_chat(self.spec, messages)

    def new_sequence(self, prompt: str | list[int], params: SamplingParams) -> Sequence:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self.runner.check_fits(len(ids), params.max_tokens)
        return Sequence(ids, params, self.tokenizer)

    def stream(self, prompt: str | list[int], params: SamplingParams | None = None,
               timings: dict | None = None) -> Iterator[TextDelta]:
        """Generate for one prompt, yielding text deltas; the last event has finish_reason."""
        seq = self.new_sequence(prompt, params or SamplingParams())
        sched = self.scheduler
        t0 = t1 = time.perf_counter()
        sched.add(seq)
        try:
            while not seq.finished:
                out = sched.step()
                for s, e in out.failed:
                    if s is seq:
                        raise e
                if any(s is seq for s in out.first):
                    t1 = time.perf_counter()
                    if timings is not None:
                        timings.update(prefill_s=t1 - t0, prompt_tokens=len(seq.prompt_ids))
                for s, delta in out.tokens:
                    if s is seq and (delta or s.finished):
                        yield TextDelta.of(s, delta)
            if timings is not None:
                timings.update(decode_s=time.perf_counter() - t1, completion_tokens=len(seq.output_ids),
                               token_ids=list(seq.output_ids), finish_reason=seq.finish_reason)
        finally:
            if not seq.finished:  # the caller stopped early, or a step raised: free the slot
                sched.abort(seq)

    def complete(self, prompt: str | list[int], params: SamplingParams | None = None) -> Completion:
        t: dict = {}
        text = "".join(ev.text for ev in self.stream(prompt, params, t))
        return Completion(text, t["prompt_tokens"], t["completion_tokens"], t["finish_reason"],
                          t["prefill_s"], t["decode_s"], t["token_ids"])

    def chat(self, messages: list, params: SamplingParams | None = None) -> Completion:
        return self.complete(self.render(messages), params)
