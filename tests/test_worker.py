"""The engine thread: continuous batching, cancellation, timeouts, bounded queue (real 0.5B model)."""
from __future__ import annotations

import pytest

from engine.config import EngineConfig
from engine.runtime import prefix_cache
from engine.runtime.sampling import SamplingParams
from engine.runtime.worker import EngineWorker
from engine.runtime.worker_types import (Failed, Finished, GenerateRequest, QueueFullError, RequestTimeoutError,
                                 TextDelta)

PROMPTS = ["Write a Python function that adds two numbers.", "What is 2+2?", "用中文说你好"]


def _free(llm):
    return sorted(llm.runner.free_slots) == list(range(llm.cfg.max_batch))


@pytest.fixture(scope="module")
def refs(llm):
    p = SamplingParams(max_tokens=6, temperature=0.0)
    return [llm.chat([{"role": "user", "content": q}], p).text for q in PROMPTS]


@pytest.fixture()
def worker(llm):
    w = EngineWorker(EngineConfig(device="cpu", max_queue=8), llm=llm).start()
    yield w
    w.stop()
    assert w.state == "stopped" and _free(llm)


def _req(llm, q, **kw):
    kw.setdefault("max_tokens", 6)
    kw.setdefault("temperature", 0.0)
    return GenerateRequest(llm.encode_chat([{"role": "user", "content": q}]), SamplingParams(**kw))


def test_batched_requests_match_single_runs(llm, refs, worker):
    steps0 = worker.steps
    handles = [worker.submit(_req(llm, q)) for q in PROMPTS]
    deltas = [ev.text for ev in handles[2].iter(timeout=120) if isinstance(ev, TextDelta)]  # streamed
    results = [h.result(timeout=120) for h in handles[:2]]
    assert [r.text for r in results] == refs[:2]
    assert "".join(deltas) == refs[2] and "\ufffd" not in refs[2]
    assert all(r.finish_reason in ("stop", "length") and r.prompt_tokens > 0 for r in results)
    # the three joined one running batch: one after another would take 3 x 5 decode steps
    assert worker.steps - steps0 <= 6 + 2


def test_cancel_frees_slot_within_one_step(llm, worker):
    h = worker.submit(_req(llm, PROMPTS[0], max_tokens=400))
    first = next(h.iter(timeout=120))
    assert isinstance(first, TextDelta)
    h.cancel()
    res = h.result(timeout=60)
    assert res.finish_reason == "cancelled" and res.completion_tokens < 400
    assert h.freed_step - h.cancel_step <= 1
    assert worker.health()["active"] == 0 and _free(llm)


def test_timeout_in_queue_and_while_running(llm, worker):
    h = worker.submit(GenerateRequest(_req(llm, "hi").prompt_ids, SamplingParams(max_tokens=5), timeout_s=0.0))
    ev = list(h.iter(timeout=60))[-1]
    assert isinstance(ev, Failed) and isinstance(ev.error, RequestTimeoutError)
    r = _req(llm, PROMPTS[0], max_tokens=1000)
    r.timeout_s = 1.0
    evs = list(worker.submit(r).iter(timeout=120))
    assert isinstance(evs[-1], Failed) and isinstance(evs[-1].error, RequestTimeoutError)
    assert worker.submit(_req(llm, "hi", max_tokens=2)).result(timeout=60).completion_tokens >= 1


def test_bounded_queue(llm):
    w = EngineWorker(EngineConfig(device="cpu", max_queue=2), llm=llm)  # not started: nothing is admitted
    w.submit(_req(llm, "a"))
    w.submit(_req(llm, "b"))
    with pytest.raises(QueueFullError):
        w.submit(_req(llm, "c"))
    assert w.health()["queue_depth"] == 2


def test_prompt_over_context_fails_cleanly(llm, worker):
    ev = list(worker.submit(GenerateRequest([1] * 10, SamplingParams(max_tokens=5000))).iter(timeout=60))[-1]
    assert isinstance(ev, Failed) and "context" in str(ev.error)
    assert isinstance(worker.submit(_req(llm, "hi", max_tokens=1)).result(timeout=60), Finished)


def test_long_prompt_prefills_in_slices_while_others_decode(llm):
    """A long prompt arriving while a stream decodes is prefilled 64 tokens per engine step: the running
    stream keeps gaining tokens during that prefill, and the long request's answer is the one it gets alone."""
    import threading
    import time

    w = EngineWorker(EngineConfig(device="cpu", max_queue=8, prefill_slice=64), llm=llm).start()
    try:
        doc = "Summarize this list in one word. " + " ".join(f"item{i} costs {i % 7} coins;" for i in range(75))
        alone = w.submit(_req(llm, doc, max_tokens=4)).result(timeout=300)
        a = w.submit(_req(llm, PROMPTS[0], max_tokens=1000, ignore_eos=True))
        stamps: list[float] = []
        done = threading.Event()

        def drain():
            for ev in a.iter(timeout=300):
                if isinstance(ev, TextDelta):
                    stamps.append(time.monotonic())
            done.set()

        threading.Thread(target=drain, daemon=True).start()
        while not stamps:
            time.sleep(0.01)
        cache = prefix_cache.for_runner(llm.runner)
        if cache is not None:  # the solo run stored doc's KV: b must prefill it again, in slices
            cache.clear()
        t0 = time.monotonic()
        b = w.submit(_req(llm, doc, max_tokens=4))
        seen_prefilling = False
        while not b._events:
            seen_prefilling |= w.health()["prefilling"] == 1
            time.sleep(0.005)
        res = b.result(timeout=300)
        a.cancel()
        assert done.wait(60)
        n_prompt = res.prompt_tokens
        during = [t for t in stamps if t0 < t < t0 + res.ttft_s]
        assert n_prompt > 500 and seen_prefilling
        assert len(during) >= n_prompt // 64 - 2, (len(during), n_prompt)  # ~one token per slice
        assert res.text == alone.text
    finally:
        w.stop()
    assert _free(llm)
