"""engine/model/graph_capture.py's retry, with torch's CUDA-graph API faked (the edge that needs a GPU): after a failed
try the retry captures into a NEW pool. The failed try's graph is gone and, when it was its pool's only graph, a
capture into that pool fails in the caching allocator ("use_count > 0 INTERNAL ASSERT FAILED", seen on the H200:
docs/results/splitk_rule_c6e7049_h200.log). The GPU tests capture for real on the device."""
import pytest
import torch


def test_capture_retries_in_a_new_pool(monkeypatch):
    from engine.model import graph_capture as gc

    tries, calls = [], []
    new_pools = iter(range(100, 110))

    class FakeGraph:
        def replay(self):
            pass

    class FakeCapture:  # torch.cuda.graph(g, pool=..., capture_error_mode=...)
        def __init__(self, g, pool=None, capture_error_mode="global"):
            self.pool, self.mode = pool, capture_error_mode

        def __enter__(self):
            tries.append((self.pool, self.mode))

        def __exit__(self, *exc):
            if len(tries) == 1:
                raise RuntimeError("it->second->use_count > 0 INTERNAL ASSERT FAILED")

    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", FakeCapture)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: next(new_pools))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    g, out = gc.capture(lambda: calls.append(1) or "out", pool=7)
    assert isinstance(g, FakeGraph) and out == "out"
    assert tries == [(7, "thread_local"), (100, "relaxed")]  # the retry is not in the failed try's pool
    assert len(calls) == 3  # captured, eager once more before the retry, captured again
    assert any("use_count" in f for f in gc.failures)

    tries.clear()  # both tries failing raise the last error (the caller keeps that size eager)

    class AlwaysFails(FakeCapture):
        def __exit__(self, *exc):
            raise RuntimeError("capture failed")
    monkeypatch.setattr(torch.cuda, "graph", AlwaysFails)
    with pytest.raises(RuntimeError, match="capture failed"):
        gc.capture(lambda: None, pool=7)
    assert [p for p, _ in tries] == [7, 101]
