"""CUDA-graph capture with one retry (decode steps and prefill buckets share it).

A capture can be invalidated by a call that is harmless outside capture (a lazily loaded module, an
allocator call; seen on the H200 for the first 7B prefill bucket after a 3B model in the same process).
The first try uses "thread_local" (the strict mode); the retry, after one more eager run, "relaxed".
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
