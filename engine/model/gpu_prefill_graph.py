"""CUDA graphs for the first prefill chunk of a prompt, one per length bucket (issue #5: TTFT).

The eager fused prefill (engine/model/gpu_model.py GPUModel._forward_chunk, mode "fused") launches ~14 kernels per layer;
at short prompts the launches, not the GPU, set the time. A chunk of T tokens at position 0 instead
replays the graph of the smallest bucket >= T with its tokens padded (token 0):
  - causal attention: real tokens never see the padded tail (positions T..bucket-1);
  - K/V goes to a static staging buffer [layers, Hkv, max bucket, hd] (a graph cannot take the slot
    as an argument); after the replay the T real positions are copied into the slot's cache, so the
    padded K/V never reaches the cache;
  - the row whose logits come back (T-1) is read from a device tensor: the graph stays static.
Capture is lazy, on first use of a bucket: the static program runs once eagerly (Triton compile,
dequant scratch, flash probe, cuBLAS handles), then the eager path computes this call's answer (and
writes the cache), then the graph is captured in a dedicated pool and replayed (seed 5.4: replay
before reading) and its logits and K/V are compared with the eager ones. Beyond fp16 tolerance the
bucket is disabled with a warning, so a device-only capture bug can never change tokens.

Offset graphs (run_at; used after a cached prefix or an earlier chunk, GPUModel.offset_graphs): a chunk of T
tokens at p0 > 0 replays the graph of its bucket b with p0 and the slot read from a device tensor (`at`,
engine/model/ops_prefill_offset.py, kernels/prefill_offset.py): K/V go straight into rows p0..p0+b-1 of the
slot (the padded rows p0+T.. lie past the prompt: decoding writes a row before anything reads it, as after
a rejected speculative draft), attention covers the cached rows and is causal inside the chunk, rope at
p0 + t. So one graph per bucket serves every prefix length and slot (p0 + b <= max_context). Captured on
first use with the same check against the eager path (the slot's rows are put back to the eager K/V when
the check fails).
"""
from __future__ import annotations

import logging

import torch

from engine.config import ModelConfig
from engine.model.gpu_prefill import FUSED_MAX_T, SCRATCH_BYTES, prefill_activation_bytes
from engine.model.graph_capture import capture

BUCKETS = (16, 32, 64, 128, 256, 512, 1024)
CHECK_TOL = 2e-2  # relative L2, graph vs eager (padding changes GEMM shapes: fp16 rounding, ~1e-3)

log = logging.getLogger("deepinfer.prefill")


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def graph_bytes(cfg: ModelConfig, max_context: int, buckets=BUCKETS) -> int:
    """GPU bytes the prefill graphs keep: staging K/V + the dedicated pool (the largest bucket's
    activations; buckets captured later reuse what earlier captures freed)."""
    b = max((x for x in buckets if x <= max_context), default=0)
    if b == 0:
        return 0
    staging = 2 * cfg.num_layers * cfg.num_kv_heads * b * cfg.head_dim * 2
    acts = prefill_activation_bytes(cfg, b) - (SCRATCH_BYTES if b > FUSED_MAX_T else 0)
    return staging + acts + b * cfg.hidden_size * 2 + cfg.vocab_size * 4  # + fp32 residual half, logits


class PrefillGraphs:
    """Per-bucket prefill graphs of one GPUModel. capture=False (default off CUDA) runs the same static
    program eagerly (checks of padding and staging on the CPU under TRITON_INTERPRET=1)."""

    def __init__(self, model, buckets=BUCKETS, capture: bool | None = None):
        c = model.cfg
        self.m, self.capture = model, model.cuda if capture is None else capture
        self.buckets = tuple(sorted(b for b in buckets if b <= model.max_context))
        self.maxb = max(self.buckets, default=0)
        shape = (c.num_layers, c.num_kv_heads, self.maxb, c.head_dim)
        self.k = torch.zeros(shape, dtype=torch.float16, device=model.device)
        self.v = torch.zeros(shape, dtype=torch.float16, device=model.device)
        # tokens | last row | p0 | slot (the last two: offset graphs only)
        self.inp = torch.zeros(self.maxb + 3, dtype=torch.int32, device=model.device)
        self.at = self.inp[self.maxb + 1:]
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.disabled: dict[int, str] = {}  # bucket -> why
        self.checks: dict[int, dict] = {}  # bucket -> errors measured at capture
        self.at_graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}  # offset graphs, by bucket
        self.at_disabled: dict[int, str] = {}
        self.at_checks: dict[int, dict] = {}
        self.pool = None
        self.mode = "fused"  # elementwise set of the static programs ("torch": the references, CPU tests)

    def bucket(self, T: int, p0: int = 0) -> int | None:
        """The bucket for a chunk of T tokens at p0, or None (eager): only first chunks, and the
        padded chunk must fit the context (rope tables and cache positions)."""
        if p0 != 0:
            return None
        return next((b for b in self.buckets if T <= b <= self.m.max_context - p0), None)

    def bucket_at(self, T: int, p0: int) -> int | None:
        """The offset graph bucket for T tokens at p0 > 0: the smallest b >= T with p0 + b <= max_context."""
        return next((b for b in self.buckets if T <= b and p0 + b <= self.m.max_context), None) if p0 > 0 else None

    def nbytes(self) -> int:
        return 2 * self.k.numel() * 2 + self.inp.numel() * 4

    def _program(self, b: int) -> torch.Tensor:
        """The static prefill of bucket b: tokens inp[:b] at 0.., K/V into staging -> logits [1, vocab]."""
        return self.m._forward_chunk(self.inp[:b], b, 0, lambda i: (self.k[i], self.v[i]),
                                     self.inp[self.maxb:self.maxb + 1], self.mode)

    def _program_at(self, b: int) -> torch.Tensor:
        """The static offset prefill of bucket b: tokens inp[:b] at at[0].. of slot at[1] -> logits [1, vocab]."""
        return self.m._forward_chunk(self.inp[:b], b, 0, None, self.inp[self.maxb:self.maxb + 1], self.mode,
                                     at=self.at)

    def _set_inputs(self, ids: list[int], b: int, p0: int = 0, slot: int = 0):
        if self.m.host_embed is not None:  # the program copies rows h_in[:b]: real rows, then token 0's
            self.m.stage_embeddings(ids + [0] * (b - len(ids)))
        host = torch.zeros(self.maxb + 3, dtype=torch.int32)
        host[:len(ids)] = torch.tensor(ids, dtype=torch.int32)
        host[self.maxb:] = torch.tensor([len(ids) - 1, p0, slot], dtype=torch.int32)
        self.inp.copy_(host)

    def _commit(self, slot: int, T: int):
        self.m.kc[:, slot, :, :T].copy_(self.k[:, :, :T])
        self.m.vc[:, slot, :, :T].copy_(self.v[:, :, :T])

    def run(self, ids: list[int], slot: int) -> torch.Tensor | None:
        """Prefill ids at position 0 of `slot`: logits fp32 [vocab], or None when no graph applies."""
        T = len(ids)
        b = self.bucket(T)
        if b is None or b in self.disabled:
            return None
        self._set_inputs(ids, b)
        if not self.capture:
            out = self._program(b)[0]
            self._commit(slot, T)
            return out
        entry = self.graphs.get(b)
        if entry is None:
            return self._capture(b, ids, slot)
        g, out = entry
        g.replay()
        self._commit(slot, T)
        return out[0].clone()

    def _capture(self, b: int, ids: list[int], slot: int) -> torch.Tensor:
        m, T = self.m, len(ids)
        self._program(b)  # warm-up of the exact shapes, eagerly, before capture
        ref = m._prefill_chunk(ids, slot, 0, False)  # this call's answer; writes the slot's cache
        torch.cuda.synchronize()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        try:
            g, out = capture(lambda: self._program(b), self.pool)
        except RuntimeError as e:  # never fail the request over a graph
            self.disabled[b] = f"capture failed: {str(e).splitlines()[0]}"
            log.warning("prefill graph for %d tokens disabled: %s", b, self.disabled[b])
            self._drop_pool_if_unused()
            return ref
        err = {"logits": rel_err(out[0], ref), "k": rel_err(self.k[:, :, :T], m.kc[:, slot, :, :T]),
               "v": rel_err(self.v[:, :, :T], m.vc[:, slot, :, :T]),
               "argmax_equal": int(out[0].argmax()) == int(ref.argmax())}
        self.checks[b] = err
        bad = [k for k in ("logits", "k", "v") if not err[k] <= CHECK_TOL]  # also catches NaN
        if bad:
            self.disabled[b] = f"graph differs from eager ({', '.join(f'{k} rel {err[k]:.2e}' for k in bad)})"
            log.warning("prefill graph for %d tokens disabled: %s", b, self.disabled[b])
            del g, out
            self._drop_pool_if_unused()
            return ref
        self.graphs[b] = (g, out)
        return ref

    def _drop_pool_if_unused(self):
        """After a dropped graph: with no graph of the pool left, the next capture starts a new pool (a capture into a
        pool whose graphs are all gone fails, engine/model/graph_capture.py)."""
        if not self.graphs and not self.at_graphs:
            self.pool = None

    # --- offset graphs ------------------------------------------------------------------------
    def run_at(self, ids: list[int], slot: int, p0: int) -> torch.Tensor | None:
        """Prefill ids at positions p0.. (> 0) of `slot` after rows 0..p0-1 already in its cache: logits fp32
        [vocab], or None when no offset graph applies (then the caller runs the chunk eagerly)."""
        T = len(ids)
        b = self.bucket_at(T, p0)
        if b is None or b in self.at_disabled:
            return None
        self._set_inputs(ids, b, p0, slot)
        if not self.capture:
            return self._program_at(b)[0]
        entry = self.at_graphs.get(b)
        if entry is None:
            return self._capture_at(b, ids, slot, p0)
        g, out = entry
        g.replay()
        return out[0].clone()

    def _capture_at(self, b: int, ids: list[int], slot: int, p0: int) -> torch.Tensor:
        m, T = self.m, len(ids)
        rows = slice(p0, p0 + T)
        self._program_at(b)  # warm-up of the exact shapes (writes rows p0..p0+b-1 of the slot; the eager run
        ref = m._prefill_chunk(ids, slot, p0, False)  # then rewrites p0..p0+T-1: this call's answer)
        kref, vref = m.kc[:, slot, :, rows].clone(), m.vc[:, slot, :, rows].clone()
        torch.cuda.synchronize()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        try:
            g, out = capture(lambda: self._program_at(b), self.pool)  # replayed once: the slot's rows again
        except RuntimeError as e:  # never fail the request over a graph
            self.at_disabled[b] = f"capture failed: {str(e).splitlines()[0]}"
            log.warning("offset prefill graph for %d tokens disabled: %s", b, self.at_disabled[b])
            self._drop_pool_if_unused()
            g = out = None
        if g is not None:
            err = {"logits": rel_err(out[0], ref), "k": rel_err(m.kc[:, slot, :, rows], kref),
                   "v": rel_err(m.vc[:, slot, :, rows], vref),
                   "argmax_equal": int(out[0].argmax()) == int(ref.argmax())}
            self.at_checks[b] = err
            bad = [k for k in ("logits", "k", "v") if not err[k] <= CHECK_TOL]  # also catches NaN
            if not bad:
                self.at_graphs[b] = (g, out)
                return ref
            self.at_disabled[b] = f"graph differs from eager ({', '.join(f'{k} rel {err[k]:.2e}' for k in bad)})"
            log.warning("offset prefill graph for %d tokens disabled: %s", b, self.at_disabled[b])
            del g, out
            self._drop_pool_if_unused()
        m.kc[:, slot, :, rows].copy_(kref)  # the request keeps the eager K/V
        m.vc[:, slot, :, rows].copy_(vref)
        return ref
