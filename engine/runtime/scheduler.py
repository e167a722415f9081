"""The scheduler: waiting -> prefilling -> running -> finished, over one runner (nano-vllm style).

Both drivers use it: the engine thread (engine/runtime/worker.py: continuous batching for the server
and the tray) and the synchronous LLM (engine/runtime/llm.py: CLI, bench, tests). One `step()`:

    admit: if nothing is prefilling and the runner has a free KV slot, the first waiting sequence
           gets the slot (FIFO; one admission per step)
    prefill: the next slice of the prefilling prompt (`prefill_slice` tokens while others decode,
             the whole rest when nothing else runs); when its prompt is done, its first token is
             sampled and it joins the running batch
    decode: ONE batched decode step over the sequences running before this step (each gains a token;
            a sequence samples once per step at most, its first sample being its prefill's)

A sequence that finishes (EOS, stop string, max_tokens) leaves the batch and frees its slot in
the same step; `abort()` frees it at once (cancel, timeout, a client gone). The runner interface
is engine/runtime/slots.py SlotRunner: can_allocate / allocate / prefill / decode / release.
"""
from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field

from engine.runtime import speculative
from engine.runtime.sequence import Sequence

log = logging.getLogger("deepinfer.scheduler")


@dataclass(slots=True)
class StepOutput:
    """What one step did. `tokens` holds (sequence, text delta) for every sequence that sampled a token
    (its first after the prefill, or one decode token), in order; a finished one has already left."""
    admitted: list[Sequence] = field(default_factory=list)  # got a KV slot this step (queueing ends)
    tokens: list[tuple[Sequence, str]] = field(default_factory=list)
    first: list[Sequence] = field(default_factory=list)  # prompt done: first token sampled this step
    failed: list[tuple[Sequence, Exception]] = field(default_factory=list)  # prefill raised (slot freed)
    decoded: bool = False  # a batched decode step ran

    @property
    def progressed(self) -> bool:
        return bool(self.admitted or self.tokens or self.failed or self.decoded)


class Scheduler:
    def __init__(self, runner, prefill_slice: int = 0):
        self.runner = runner
        self.prefill_slice = prefill_slice  # tokens per prefill step while others decode (0: whole prompts)
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.prefilling: Sequence | None = None  # holds a slot, prompt not done
        self.running: list[Sequence] = []  # decoding, one token per step
        self.decode_steps = 0

    # --- queue -------------------------------------------------------------------------
    def add(self, seq: Sequence):
        """Queue a sequence; raises ContextOverflowError if prompt + max_tokens cannot fit a slot."""
        self.runner.check_fits(len(seq.prompt_ids), seq.params.max_tokens)
        self.waiting.append(seq)

    def abort(self, seq: Sequence):
        """Drop a sequence wherever it is and free its slot (no event: the driver reports the end)."""
        if self.prefilling is seq:
            self.prefilling = None
        self.running = [s for s in self.running if s is not seq]
        self.waiting = collections.deque(s for s in self.waiting if s is not seq)
        self.runner.release(seq)

    def holding(self) -> list[Sequence]:
        """Every sequence holding a KV slot: the running ones and the prefilling one."""
        return self.running + ([self.prefilling] if self.prefilling is not None else [])

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running or self.prefilling is not None)

    def run(self, seqs: list[Sequence]) -> list[Sequence]:
        """Generate every sequence to its end, batched as the engine thread would (checks, evaluation)."""
        for s in seqs:
            self.add(s)
        try:
            while any(not s.finished for s in seqs):
                self.step()
        finally:
            for s in seqs:
                if not s.finished:
                    self.abort(s)
        return seqs

    # --- one engine step ---------------------------------------------------------------
    def step(self) -> StepOutput:
        out = StepOutput()
        if self.prefilling is None and self.waiting and self.runner.can_allocate():
            seq = self.waiting.popleft()
            self.runner.allocate(seq)
            self.prefilling = seq
            out.admitted.append(seq)
        batch = list(self.running)  # one sampling per sequence per step: a prompt completed below decodes next step
        if self.prefilling is not None:
            self._prefill(out)
        if batch:
            deltas = speculative.decode(self.runner, batch)  # plain batched decode for requests without drafts
            self.decode_steps += 1
            out.decoded = True
            for seq, delta in zip(batch, deltas):
                self._emit(out, seq, delta)
        return out

    def _prefill(self, out: StepOutput):
        seq = self.prefilling
        n = self.prefill_slice if (self.running and self.prefill_slice > 0) else None
        try:
            delta = self.runner.prefill(seq, n)
        except Exception as e:  # this request fails; the others keep decoding
            log.exception("prefill failed")
            self.prefilling = None
            self.runner.release(seq)
            out.failed.append((seq, e))
            return
        if delta is None:  # more of the prompt next step
            return
        self.prefilling = None
        self.running.append(seq)
        out.first.append(seq)
        self._emit(out, seq, delta)

    def _emit(self, out: StepOutput, seq: Sequence, delta: str):
        out.tokens.append((seq, delta))
        if seq.finished:
            self.running = [s for s in self.running if s is not seq]
            self.runner.release(seq)
