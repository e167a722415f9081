"""The engine thread: ONE thread owns the model(s) and their KV slots (llama.cpp-server style).

Everything else (HTTP handlers, tray) submits a typed GenerateRequest and reads events from
its RequestHandle (engine/runtime/worker_types.py). The loop does continuous batching over the runner
interface (allocate / prefill / decode / release):

    reap cancelled and timed-out requests (their slots are freed here, before any new step)
    prefill: admit ONE waiting request if a slot is free and nothing is prefilling; run the next
             slice of the prefilling prompt (cfg.prefill_slice tokens while others decode, the whole
             rest when nothing else runs); when its prompt is done, emit its first token
    ONE batched decode step over all active sequences (of each resident model)

so new requests join the running batch between decode steps, every active request gains one token
per step (fair progress), and a long prompt does not stall the streams already running (a 16k-token
document pasted from the tray costs the editor's completion stream one slice per step, not the
whole prefill). The waiting queue is bounded (QueueFullError -> 429).
A request for a model that is not resident waits until the other model's requests drain,
then the other model is unloaded (if it does not fit alongside) and this one is loaded.
"""
from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from dataclasses import replace

from engine.runtime.backends import Backends, memory_fits, release_memory
from engine.config import EngineConfig
from engine.errors import DeepInferError
from engine.runtime.sequence import Sequence
from engine.runtime.worker_types import (EngineInternalError, Failed, Finished, GenerateRequest, ModelUnavailableError,
                                 QueueFullError, RequestHandle, RequestTimeoutError, TextDelta)

log = logging.getLogger("deepinfer.worker")


class EngineWorker:
    def __init__(self, cfg: EngineConfig, llm=None, backends: Backends | None = None,
                 max_resident: int = 1):
        if llm is not None:  # the given model defines the slots and context
            cfg = replace(cfg, model=llm.cfg.model, device=llm.cfg.device, max_batch=llm.cfg.max_batch,
                          max_context=llm.cfg.max_context)
        self.cfg = cfg
        self.backends = backends or Backends(cfg)
        self.max_resident = max_resident  # models held at once (1: a 4 GB card holds one)
        self.resident: dict = {}  # id -> LLM
        self._given: dict = {}  # LLMs passed in from outside: re-used instead of reloaded
        if llm is not None:
            self.resident[self.backends.default_id] = llm
            self._given[self.backends.default_id] = llm
            self.backends.remember(self.backends.default_id, llm.spec)
        self.state = "ready" if llm is not None else "starting"  # starting|loading|ready|error|stopped
        self.load_error: DeepInferError | None = None
        self.steps = 0  # decode steps done (cancellation latency is measured in these)
        self.served = 0
        self.cancelled_log: collections.deque = collections.deque(maxlen=64)  # (id, cancel_step, freed_step, tokens)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._waiting: collections.deque[RequestHandle] = collections.deque()
        self._active: list[tuple[RequestHandle, Sequence, str]] = []  # (handle, seq, model id)
        self._prefilling: tuple[RequestHandle, Sequence, str] | None = None  # admitted, prompt not done
        self._pending = 0  # submitted, not yet admitted (the bounded queue)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self.thread = threading.Thread(target=self._run, name="deepinfer-engine", daemon=True)

    # --- public (any thread) -------------------------------------------------------------
    def start(self) -> "EngineWorker":
        self.thread.start()
        return self

    def stop(self, timeout: float = 30.0):
        self._stop = True
        self._wake.set()
        if self.thread.is_alive():
            self.thread.join(timeout)

    def wait_ready(self, timeout: float | None = None) -> str:
        t_end = None if timeout is None else time.monotonic() + timeout
        while self.state in ("starting", "loading") and (t_end is None or time.monotonic() < t_end):
            time.sleep(0.05)
        return self.state

    def submit(self, req: GenerateRequest) -> RequestHandle:
        """Queue a request (model already resolved to a backend id). Raises QueueFullError."""
        if self._stop:
            raise ModelUnavailableError("the server is shutting down")
        req.model = req.model or self.backends.default_id
        with self._lock:
            if self._pending >= self.cfg.max_queue:
                raise QueueFullError(f"{self._pending} requests are already waiting (limit {self.cfg.max_queue})",
                                     "retry after a few seconds")
            self._pending += 1
        handle = RequestHandle(req, self._on_cancel)
        self._inbox.put(handle)
        self._wake.set()
        return handle

    def max_context(self, mid: str) -> int:
        llm = self.resident.get(mid)
        return llm.runner.max_context if llm is not None else self.backends.max_context(mid)

    def _on_cancel(self, h: RequestHandle):
        h.cancel_step = self.steps
        self._wake.set()

    def health(self) -> dict:
        h = {"state": self.state, "model": self.backends.default_id, "resident": list(self.resident),
             "queue_depth": self._pending, "active": len(self._active), "prefilling": int(bool(self._prefilling)),
             "max_batch": self.cfg.max_batch,
             "max_queue": self.cfg.max_queue, "served": self.served, "decode_steps": self.steps}
        llm = self.resident.get(self.backends.default_id)
        h["max_context"] = llm.runner.max_context if llm is not None else self.cfg.max_context
        if self.load_error is not None:
            h["error"] = str(self.load_error)
        runners = [m.runner for m in list(self.resident.values())]
        h["device"] = runners[0].device if runners else self.cfg.device
        if h["device"] == "cuda":
            try:
                import torch
                free, total = torch.cuda.mem_get_info()
                h["vram"] = {"used_mb": (total - free) >> 20, "total_mb": total >> 20,
                             "allocated_mb": torch.cuda.memory_allocated() >> 20}
            except Exception:  # pragma: no cover - best effort
                pass
        return h

    # --- engine thread -------------------------------------------------------------------
    def _run(self):
        if not self.resident:
            try:
                self.state = "loading"
                self.resident[self.backends.default_id] = self.backends.load(self.backends.default_id)
            except DeepInferError as e:
                self.load_error, self.state = e, "error"
                log.error("%s", e)
        if self.state != "error":
            self.state = "ready"
        while not self._stop:
            self._wake.clear()
            try:
                self._drain_inbox()
                self._reap()
                progressed = self._prefill_step()
                if self._active:
                    self._decode_step()
                elif not progressed:
                    self._wake.wait(0.25)
            except Exception as e:  # keep serving: fail what was running, free the slots
                log.exception("engine step failed")
                for h, seq, mid in self._running():
                    self._end(h, seq, mid, Failed(EngineInternalError(f"internal engine error: {e!r}")))
        self._shutdown()

    def _running(self) -> list[tuple[RequestHandle, Sequence, str]]:
        """Every request holding a slot: the decoding ones and the one being prefilled (a copy)."""
        return self._active + ([self._prefilling] if self._prefilling else [])

    def _drain_inbox(self):
        while True:
            try:
                self._waiting.append(self._inbox.get_nowait())
            except queue.Empty:
                return

    def _deadline(self, h: RequestHandle) -> float:
        t = h.request.timeout_s if h.request.timeout_s is not None else self.cfg.request_timeout_s
        return h.submitted + t

    def _reap(self):
        now = time.monotonic()
        for h in [h for h in self._waiting if h.cancelled or now > self._deadline(h)]:
            self._waiting.remove(h)
            self._unqueue()
            h.freed_step = self.steps
            self._push_end(h, None, now)
        for h, seq, mid in [a for a in self._running() if a[0].cancelled or now > self._deadline(a[0])]:
            self._end(h, seq, mid, None)

    def _push_end(self, h: RequestHandle, seq: Sequence | None, now: float):
        if h.cancelled:
            self.cancelled_log.append((h.request.id, h.cancel_step, h.freed_step, len(seq.output_ids) if seq else 0))
            h.push(Finished("cancelled", seq.text if seq else "", len(h.request.prompt_ids),
                            len(seq.output_ids) if seq else 0))
        else:
            t = now - h.submitted
            h.push(Failed(RequestTimeoutError(f"request timed out after {t:.0f} s",
                                              "lower max_tokens or raise --timeout")))

    def _unqueue(self):
        with self._lock:
            self._pending -= 1

    def _end(self, h: RequestHandle, seq: Sequence, mid: str, ev):
        """Release the slot and send the last event (ev None: cancelled / timed out)."""
        self._active = [a for a in self._active if a[0] is not h]
        if self._prefilling and self._prefilling[0] is h:
            self._prefilling = None
        llm = self.resident.get(mid)
        if llm is not None:
            llm.runner.release(seq)
        h.freed_step = self.steps
        self.served += 1  # before the last event: a client that sees it also sees the count
        if ev is None:
            self._push_end(h, seq, time.monotonic())
        else:
            h.push(ev)

    def _prefill_step(self) -> bool:
        """Admit a request if none is prefilling, then run one slice of the prefilling prompt."""
        admitted = self._prefilling is None and self._admit_one()
        if self._prefilling is None:
            return admitted
        h, seq, mid = self._prefilling
        llm = self.resident[mid]
        n = self.cfg.prefill_slice if (self._active and self.cfg.prefill_slice > 0) else None
        try:
            delta = llm.runner.prefill(seq, n)
        except Exception as e:
            self._prefilling = None
            llm.runner.release(seq)
            log.exception("prefill failed")
            h.push(Failed(EngineInternalError(f"internal engine error during prefill: {e!r}")))
            return True
        if delta is None:  # more of the prompt next step
            return True
        self._prefilling = None
        h.ttft_s = time.monotonic() - h.submitted
        self._active.append((h, seq, mid))
        self._emit(h, seq, mid, delta)
        return True

    def _admit_one(self) -> bool:
        """Move the first waiting request into a KV slot (self._prefilling); True if the queue changed."""
        if not self._waiting:
            return False
        h = self._waiting[0]
        mid = h.request.model
        if mid not in self.resident:
            if not self._make_resident(mid):
                return False
        llm = self.resident.get(mid)
        if llm is None:  # load failed: that request has been answered
            return True
        if not llm.runner.can_allocate():
            return False
        self._waiting.popleft()
        self._unqueue()
        req = h.request
        try:
            llm.runner.check_fits(len(req.prompt_ids), req.params.max_tokens)
            seq = Sequence(list(req.prompt_ids), req.params, llm.tokenizer)
        except DeepInferError as e:
            h.push(Failed(e))
            return True
        h.queue_s = time.monotonic() - h.submitted
        llm.runner.allocate(seq)
        self._prefilling = (h, seq, mid)
        return True

    def _decode_step(self):
        by_model: dict[str, list] = {}
        for a in self._active:
            by_model.setdefault(a[2], []).append(a)
        for mid, group in by_model.items():
            deltas = self.resident[mid].runner.decode([seq for _, seq, _ in group])
            for (h, seq, _), delta in zip(group, deltas):
                self._emit(h, seq, mid, delta)
        self.steps += 1

    def _emit(self, h: RequestHandle, seq: Sequence, mid: str, delta: str):
        if delta:
            h.push(TextDelta(delta))
        if seq.finished:
            self._end(h, seq, mid, Finished(seq.finish_reason, seq.text, len(seq.prompt_ids),
                                            len(seq.output_ids), h.queue_s, h.ttft_s))

    # --- model residency -----------------------------------------------------------------
    def _make_resident(self, mid: str) -> bool:
        """Load `mid`; False while other models still have running requests (wait for them)."""
        if not self._fits_alongside(mid):
            if self._active or self._prefilling:
                return False
            for other in list(self.resident):
                log.info("unloading %s to make room for %s", other, mid)
                del self.resident[other]
            release_memory()
        try:
            if mid not in self._given:
                self.state = "loading"
            self.resident[mid] = self._given.get(mid) or self.backends.load(mid)
        except Exception as e:  # missing/corrupt file, too little (V)RAM, CUDA OOM
            h = self._waiting.popleft()
            self._unqueue()
            msg = str(e) if isinstance(e, DeepInferError) else repr(e)
            h.push(Failed(ModelUnavailableError(f"model {mid!r} could not be loaded: {msg}")))
        self.state = "ready" if self.resident else "error"
        return True

    def _fits_alongside(self, mid: str) -> bool:
        if not self.resident:
            return True
        if len(self.resident) >= self.max_resident:
            return False
        try:
            return memory_fits(self.backends.spec(mid), next(iter(self.resident.values())).runner.device)
        except DeepInferError:
            return True  # the load itself will report the problem

    def _shutdown(self):
        self._drain_inbox()
        for h, seq, mid in self._running():
            self._end(h, seq, mid, Failed(ModelUnavailableError("the server is shutting down")))
        while self._waiting:
            self._waiting.popleft().push(Failed(ModelUnavailableError("the server is shutting down")))
            self._unqueue()
        self.state = "stopped"

