"""The generation events, and the typed messages between the HTTP layer (or tray) and the engine thread.

One event set for both drivers of engine/runtime/scheduler.py: the synchronous LLM.stream
(engine/runtime/llm.py) yields TextDelta events, the last with its finish_reason; the engine thread
(engine/runtime/worker.py) pushes non-empty TextDelta events, then exactly one Finished or Failed.
The HTTP side builds a GenerateRequest (token ids + SamplingParams: all JSON and chat-template
work is already done), submits it, and reads events from the RequestHandle. The handle is safe to
read from an asyncio loop (`await handle.get()`) or from a plain thread (`handle.iter()`).
"""
from __future__ import annotations

import asyncio
import collections
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Iterator, Union

from engine.errors import DeepInferError, ResourceError
from engine.runtime.sampling import SamplingParams


class QueueFullError(ResourceError):
    """The waiting queue is full (HTTP 429 + Retry-After)."""


class RequestTimeoutError(DeepInferError):
    """The request ran past its deadline (HTTP 504)."""


class ModelNotFoundError(DeepInferError):
    """The request names a model that is not configured (HTTP 404)."""


class EngineInternalError(DeepInferError):
    """A bug or device fault inside the engine step (HTTP 500); the engine keeps serving."""


class ModelUnavailableError(ResourceError):
    """The model is configured but cannot be loaded or used now (HTTP 503)."""


@dataclass(slots=True)
class GenerateRequest:
    prompt_ids: list[int]
    params: SamplingParams
    model: str = ""  # backend id ("" -> the default model)
    timeout_s: float | None = None  # None -> EngineConfig.request_timeout_s
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])


@dataclass(slots=True)
class TextDelta:
    text: str  # complete UTF-8 characters only
    token_id: int | None = None  # the last token kept in the output (None before any)
    finish_reason: str | None = None  # set on the sequence's last delta ("stop" | "length")
    logprobs: list | None = None  # requests with logprobs: Sequence.logprobs entries not sent before

    @classmethod
    def of(cls, seq, delta: str) -> "TextDelta":
        """The event for a Sequence (engine/runtime/sequence.py) that just sampled a token."""
        lp = None
        if seq.params.logprobs is not None:
            lp, seq.logprobs_sent = seq.logprobs[seq.logprobs_sent:], len(seq.logprobs)
        return cls(delta, seq.output_ids[-1] if seq.output_ids else None, seq.finish_reason, lp)


@dataclass(slots=True)
class Finished:
    finish_reason: str  # "stop" | "length" | "cancelled"
    text: str  # the whole output (stop strings removed)
    prompt_tokens: int
    completion_tokens: int
    queue_s: float = 0.0  # submit -> admitted
    ttft_s: float = 0.0  # submit -> first token sampled
    logprobs: list | None = None  # requests with logprobs: every Sequence.logprobs entry (id, logprob, top)
    stats: dict = field(default_factory=dict)  # Sequence.stats(): prefix-cache and speculation counts


@dataclass(slots=True)
class Failed:
    error: Exception  # a DeepInferError subclass tells the HTTP layer which status to use


Event = Union[TextDelta, Finished, Failed]


class RequestHandle:
    """The submitter's side of one request. Events are pushed by the engine thread."""

    def __init__(self, request: GenerateRequest, on_cancel: Callable[["RequestHandle"], None]):
        self.request = request
        self.submitted = time.monotonic()
        self.queue_s = 0.0  # submit -> admitted to a slot
        self.ttft_s = 0.0  # submit -> first token
        self.cancelled = False
        self.cancel_step: int | None = None  # engine decode-step counter when cancel() was called
        self.freed_step: int | None = None  # counter when the slot was released
        self._on_cancel = on_cancel
        self._events: collections.deque = collections.deque()  # append/popleft are thread-safe
        self._sync = threading.Event()
        self._async = asyncio.Event()
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    # --- engine thread -------------------------------------------------------------------
    def push(self, ev: Event):
        self._events.append(ev)
        self._sync.set()
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._async.set)
            except RuntimeError:  # loop closed: nobody is listening any more
                pass

    # --- submitter -----------------------------------------------------------------------
    def cancel(self):
        """Stop generating (client went away); the slot is freed before the next decode step."""
        if not self.cancelled:
            self.cancelled = True
            self._on_cancel(self)

    async def get(self) -> Event:
        while True:
            if self._events:
                return self._events.popleft()
            self._async.clear()
            if self._events:
                continue
            await self._async.wait()

    async def events(self) -> AsyncIterator[Event]:
        while True:
            ev = await self.get()
            yield ev
            if not isinstance(ev, TextDelta):
                return

    def iter(self, timeout: float | None = None) -> Iterator[Event]:
        """Blocking iteration for threads (tray, tests)."""
        while True:
            if not self._events:
                self._sync.clear()
                if not self._events and not self._sync.wait(timeout):
                    raise TimeoutError(f"no event within {timeout} s")
                continue
            ev = self._events.popleft()
            yield ev
            if not isinstance(ev, TextDelta):
                return

    def result(self, timeout: float | None = None) -> Finished:
        """Block until the end; raises the error of a Failed event."""
        for ev in self.iter(timeout):
            if isinstance(ev, Failed):
                raise ev.error
            if isinstance(ev, Finished):
                return ev
        raise RuntimeError("event stream ended without a result")  # pragma: no cover
