"""CUDA-graph capture with one retry (decode steps and prefill buckets share it).

A capture can be invalidated by a call that is harmless outside capture (a lazily loaded module, an
allocator call; seen on the H200 for the first 7B prefill bucket after a 3B model in the same process).
The first try uses "thread_local" (the strict mode); the retry, after one more eager run, "relaxed", in a new
memory pool: the failed try's graph is gone, and when it was its pool's only graph the caching allocator keeps that
pool at a use count of 0, so a capture into it fails with "use_count > 0 INTERNAL ASSERT FAILED"
(CUDACachingAllocator create_or_incref_pool; seen on the H200 when a bench recaptured into a dropped graph's pool,
docs/results/splitk_rule_c6e7049_h200.log). Callers that drop a graph (a capture check failed) and hold no other
graph of that pool start a new pool too (gpu_prefill_graph.py).
Prefill graphs are checked against an eager run at capture (gpu_prefill_graph.py); decode graphs by
the device checks (tests/gpu_checks.py: graph replay vs the CPU path, batch vs single).
"""
from __future__ import annotations

import logging

import torch

log = logging.getLogger("deepinfer.graphs")
failures: list[str] = []  # every failed try in this process ("mode: first line of the error"), for reports


def capture(fn, pool):
    """-> (graph, fn's output inside the graph's memory). Raises the last RuntimeError if both tries fail."""
    err = None
    for mode in ("thread_local", "relaxed"):
        if err is not None:
            torch.cuda.synchronize()
            fn()  # once more eagerly before the retry
            torch.cuda.synchronize()
            pool = torch.cuda.graph_pool_handle()  # not the failed try's (possibly dead) pool: see above
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g, pool=pool, capture_error_mode=mode):
                out = fn()
            g.replay()  # seed 5.4: capture runs nothing
            torch.cuda.synchronize()
            if err is not None:
                log.info("graph captured on the retry (%s) after: %s", mode, str(err).splitlines()[0])
            return g, out
        except RuntimeError as e:
            err = e
            failures.append(f"{mode}: {str(e).splitlines()[0]}")
            log.warning("graph capture (%s) failed: %s", mode, str(e).splitlines()[0])
    raise err
