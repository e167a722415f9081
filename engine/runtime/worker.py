"""The engine thread: ONE thread owns the model(s) and their KV slots (llama.cpp-server style).

Everything else (HTTP handlers, tray) submits a typed GenerateRequest and reads events from
its RequestHandle (engine/runtime/worker_types.py). Each resident model has a Scheduler
(engine/runtime/scheduler.py, the same one the synchronous LLM drives); one engine step is

    reap cancelled and timed-out requests (their slots are freed here, before any new step)
    route waiting requests to their model's scheduler (loading the model when it is not resident)
    scheduler.step(): admit one request into a free slot, prefill the next slice of the admitted
             prompt (cfg.prefill_slice tokens while others decode, the whole rest when nothing else
             runs), then ONE batched decode step over all running sequences

so new requests join the running batch between decode steps, every active request gains one token
per step (fair progress), and a long prompt does not stall the streams already running (a 16k-token
document pasted from the tray costs the editor's completion stream one slice per step, not the
whole prefill). The waiting queue is bounded (QueueFullError -> 429).
A request for a model that is not resident waits until the other model's requests drain,
then the other model is unloaded (if it does not fit alongside) and this one is loaded.
Any exception while loading puts the worker in the "error" state with a message and fix
(engine/runtime/load_errors.py) that GET /health reports: never a hang.
"""
from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from dataclasses import replace

import torch

from engine.config import EngineConfig
from engine.errors import DeepInferError, ResourceError
from engine.runtime import speculative
from engine.runtime.backends import Backends, memory_fits, release_memory
from engine.runtime.load_errors import explain_load_failure
from engine.runtime.scheduler import Scheduler, StepOutput
from engine.runtime.sequence import Sequence
from engine.runtime.worker_types import (EngineInternalError, Failed, Finished, GenerateRequest, ModelUnavailableError,
                                         QueueFullError, RequestHandle, RequestTimeoutError, TextDelta)

log = logging.getLogger("deepinfer.worker")
LOAD_TIMEOUT_S = 600.0  # wait_ready's default: a 7B load with CUDA-graph warm-up on a slow disk fits


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
        self._sched: dict[str, Scheduler] = {}  # id -> this thread's scheduler over that LLM's runner
        self._given: dict = {}  # LLMs passed in from outside: re-used instead of reloaded
        if llm is not None:
            self._given[self.backends.default_id] = llm
            self._set_resident(self.backends.default_id, llm)
            self.backends.remember(self.backends.default_id, llm.spec)
        self.state = "ready" if llm is not None else "starting"  # starting|loading|ready|error|stopped
        self.load_error: DeepInferError | None = None
        self.steps = 0  # decode steps done (cancellation latency is measured in these)
        self.served = 0
        self.cancelled_log: collections.deque = collections.deque(maxlen=64)  # (id, cancel_step, freed_step, tokens)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._waiting: collections.deque[RequestHandle] = collections.deque()  # not yet given to a scheduler
        self._owned: dict[int, tuple[RequestHandle, Sequence, str]] = {}  # id(seq) -> (handle, seq, model id)
        self._pending = 0  # submitted, not yet admitted to a slot (the bounded queue)
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

    def wait_ready(self, timeout: float | None = LOAD_TIMEOUT_S) -> str:
        """Block until the model is loaded (or failed); returns the state ("loading" still after `timeout`)."""
        t_end = None if timeout is None else time.monotonic() + timeout
        while self.state in ("starting", "loading") and (t_end is None or time.monotonic() < t_end):
            if self.state == "loading" and not self.thread.is_alive():  # pragma: no cover - _run catches all
                self._fail_load(ResourceError("the engine thread ended while loading the model",
                                              "see the log (deepinfer logs) and run `deepinfer doctor`"))
                break
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
        scheds = list(self._sched.values())
        h = {"state": self.state, "model": self.backends.default_id, "resident": list(self.resident),
             "queue_depth": self._pending, "active": sum(len(s.running) for s in scheds),
             "prefilling": sum(s.prefilling is not None for s in scheds), "max_batch": self.cfg.max_batch,
             "max_queue": self.cfg.max_queue, "served": self.served, "decode_steps": self.steps}
        llm = self.resident.get(self.backends.default_id)
        h["max_context"] = llm.runner.max_context if llm is not None else self.cfg.max_context
        if llm is not None:  # the hotkey path's speed-ups: prompt prefixes reused, speculative drafts accepted
            pc = getattr(llm.runner, "_prefix_cache", None)  # made by the engine thread at the first prefill
            h["prefix_cache"] = pc.stats() if pc else None
            h["speculative"] = speculative.report(llm.runner)
            # GPU: engine steps in which a lone greedy request chained its tokens, those tokens (decode_chain), and the
            # chains' next first steps queued ahead / resumed from (GPUModel.ahead_stats)
            h["decode_chain"] = getattr(llm.runner, "chain_stats", None)
            # GPU: whether sampling requests draw on the GPU (off with DEEPINFER_SAMPLE_CHAIN=0 or after a failed
            # warmup of the sampling kernel: they then take the host path); null on the CPU
            h["sampling_on_gpu"] = getattr(getattr(llm.runner, "model", None), "sample_chain", None)
            if getattr(llm.runner, "gguf_pack", None):  # GPU, a GGUF: the packing that runs, and why not the asked one
                h["gguf_pack"] = {"running": llm.runner.gguf_pack, "note": llm.runner.gguf_pack_note}
        if self.load_error is not None:
            h["error"] = str(self.load_error)  # message + " Fix: ..." (what the tray shows)
            h["fix"] = self.load_error.fix or ""
        runners = [m.runner for m in list(self.resident.values())]
        h["device"] = runners[0].device if runners else self.cfg.device
        if runners and h["device"] == "cpu":  # how the CPU holds the linears: int4 | int8 | float32 | bfloat16
            h["cpu_weights"] = runners[0].weights_kind
        if h["device"] == "cuda":
            # int8 activations in the batch-1 decode steps (--decode-q8; GPUModel.q8): the numerics that run
            h["decode_q8"] = bool(getattr(getattr(runners[0], "model", None), "q8", False))
            try:
                free, total = torch.cuda.mem_get_info()
                h["vram"] = {"used_mb": (total - free) >> 20, "total_mb": total >> 20,
                             "allocated_mb": torch.cuda.memory_allocated() >> 20}
            except Exception:  # pragma: no cover - best effort
                pass
        return h

    # --- engine thread -------------------------------------------------------------------
    def _run(self):
        try:
            if not self.resident:
                self.state = "loading"
                try:
                    self._set_resident(self.backends.default_id, self.backends.load(self.backends.default_id))
                except Exception as e:  # ImportError, MemoryError, a corrupt file, CUDA OOM, ...
                    self._fail_load(e)
            if self.state != "error":
                self.state = "ready"
            while not self._stop:
                self._wake.clear()
                try:
                    if not self._tick():
                        self._wake.wait(0.25)
                except Exception as e:  # keep serving: fail what was running, free the slots
                    log.exception("engine step failed")
                    for mid, sched in list(self._sched.items()):
                        for seq in sched.holding():
                            o = self._owned.get(id(seq))
                            if o is None:
                                sched.abort(seq)
                            else:
                                self._end(o[0], seq, mid, Failed(EngineInternalError(f"internal engine error: {e!r}")))
        finally:
            self._shutdown()

    def _fail_load(self, e: BaseException):
        self.load_error = explain_load_failure(e, self.cfg.model)
        self.state = "error"
        log.error("%s", self.load_error)

    def _set_resident(self, mid: str, llm):
        self.resident[mid] = llm
        self._sched[mid] = Scheduler(llm.runner, self.cfg.prefill_slice)

    def _tick(self) -> bool:
        """One engine step; False when there was nothing to do."""
        self._drain_inbox()
        self._reap()
        routed = self._route()
        outs = [(mid, sched.step()) for mid, sched in list(self._sched.items())]
        if any(out.decoded for _, out in outs):
            self.steps += 1
        for mid, out in outs:
            self._deliver(mid, out)
        return routed or any(out.progressed for _, out in outs)

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
        for h, seq, mid in [o for o in self._owned.values() if o[0].cancelled or now > self._deadline(o[0])]:
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
        """Free the slot (if still held) and send the last event (ev None: cancelled / timed out)."""
        self._owned.pop(id(seq), None)
        sched = self._sched.get(mid)
        if sched is not None and not seq.finished:
            if seq.slot < 0:  # still in the scheduler's waiting queue: it leaves the bounded queue now
                self._unqueue()
            sched.abort(seq)
        h.freed_step = self.steps
        self.served += 1  # before the last event: a client that sees it also sees the count
        if ev is None:
            self._push_end(h, seq, time.monotonic())
        else:
            h.push(ev)

    def _route(self) -> bool:
        """Hand waiting requests, in order, to their model's scheduler; True if the queue changed."""
        changed = False
        while self._waiting:
            h = self._waiting[0]
            mid = h.request.model
            if mid not in self.resident:
                if not self._make_resident(mid):
                    return changed
                changed = True
                continue  # resident now, or the request was answered (load failed)
            self._waiting.popleft()
            changed = True
            req = h.request
            try:
                seq = Sequence(list(req.prompt_ids), req.params, self.resident[mid].tokenizer)
                self._sched[mid].add(seq)
            except DeepInferError as e:
                self._unqueue()
                h.push(Failed(e))
                continue
            self._owned[id(seq)] = (h, seq, mid)
        return changed

    def _deliver(self, mid: str, out: StepOutput):
        """Turn a scheduler step into events on the requests' handles."""
        now = time.monotonic()
        for seq in out.admitted:
            h = self._owned[id(seq)][0]
            h.queue_s = now - h.submitted
            self._unqueue()
        for seq in out.first:
            h = self._owned[id(seq)][0]
            h.ttft_s = now - h.submitted
        for seq, e in out.failed:
            h = self._owned.pop(id(seq))[0]
            h.push(Failed(EngineInternalError(f"internal engine error during prefill: {e!r}")))
        # a sequence can sample twice in one step (its prompt's first token, then the batch's decode token): it
        # ends after its last entry, not at the first one that sees it finished
        last = {id(seq): i for i, (seq, _) in enumerate(out.tokens)}
        for i, (seq, delta) in enumerate(out.tokens):
            h = self._owned[id(seq)][0]
            if delta:
                h.push(TextDelta.of(seq, delta))
            if seq.finished and last[id(seq)] == i:
                self._end(h, seq, mid, Finished(seq.finish_reason, seq.text, len(seq.prompt_ids),
                                                len(seq.output_ids), h.queue_s, h.ttft_s,
                                                seq.logprobs if seq.params.logprobs is not None else None,
                                                seq.stats()))

    # --- model residency -----------------------------------------------------------------
    def _make_resident(self, mid: str) -> bool:
        """Load `mid` for the first waiting request; False while other models still have requests (wait)."""
        if not self._fits_alongside(mid):
            if any(s.busy for s in self._sched.values()):
                return False
            for other in list(self.resident):
                log.info("unloading %s to make room for %s", other, mid)
                del self.resident[other], self._sched[other]
            release_memory()
        try:
            if mid not in self._given:
                self.state = "loading"
            self._set_resident(mid, self._given.get(mid) or self.backends.load(mid))
            if mid == self.backends.default_id:
                self.load_error = None
        except Exception as e:  # missing/corrupt file, too little (V)RAM, CUDA OOM, a missing module
            err = explain_load_failure(e, mid)
            if mid == self.backends.default_id or not self.resident:
                self.load_error = err
            log.error("%s", err)
            h = self._waiting.popleft()
            self._unqueue()
            h.push(Failed(ModelUnavailableError(f"model {mid!r} could not be loaded: {err.message}", err.fix)))
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
        for h, seq, mid in list(self._owned.values()):
            self._end(h, seq, mid, Failed(ModelUnavailableError("the server is shutting down")))
        while self._waiting:
            self._waiting.popleft().push(Failed(ModelUnavailableError("the server is shutting down")))
            self._unqueue()
        self.state = "stopped"
