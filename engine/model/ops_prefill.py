"""The forward's ops (engine/model/forward.py) for a prompt chunk on the GPU: T tokens at positions p0..

Residual stream h fp32 [T, hidden]; activations fp16. Two elementwise sets, the same math:
  "triton"  kernels/prefill_elementwise.py: add+rmsnorm, rope+KV write, silu*mul one launch each
            (with the linears ~14 launches per layer; the prefill CUDA graphs capture this set)
  "torch"   plain torch ops (the reference on the GPU, and the CPU path of GPUModel)
Linears and attention are callables chosen by the caller: engine.model.gpu_prefill.linear_prefill
(dense/packed by the weight's kind, in one place there) and attention_prefill, or the PyTorch references.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.ops_reference import rms_norm, rope

LOGITS_CHUNK = 512  # all-position logits: tokens per lm_head call


def add_norm_torch(h: torch.Tensor, y: torch.Tensor | None, w: torch.Tensor, eps: float) -> torch.Tensor:
    """h fp32 [T, D] (+= y in place) -> rmsnorm(h) * w fp16."""
    if y is not None:
        h += y.float()
    return rms_norm(h.float(), w, eps).half()


def rope_to_cache_torch(qkv, cos, sin, p0: int, k, v, H: int, Hkv: int) -> torch.Tensor:
    """kernels.prefill_elementwise.rope_qkv_to_cache in torch: qkv fp16 [T, (H+2Hkv)hd]; k, v [Hkv, ctx, hd]
    receive positions p0..p0+T-1; returns rotated q fp16 [T, H, hd]."""
    T, hd = qkv.shape[0], k.shape[-1]
    q, kk, vv = qkv.split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
    c, s = cos[p0:p0 + T].unsqueeze(1), sin[p0:p0 + T].unsqueeze(1)  # [T, 1, hd/2]
    k[:, p0:p0 + T] = rope(kk.reshape(T, Hkv, hd), c, s).half().transpose(0, 1)
    v[:, p0:p0 + T] = vv.reshape(T, Hkv, hd).transpose(0, 1)
    return rope(q.reshape(T, H, hd), c, s).half()


def silu_mul_torch(gu: torch.Tensor) -> torch.Tensor:
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g) * u


def elementwise(kind: str):
    """(add_norm, rope_to_cache, silu_mul) of the "triton" or "torch" set."""
    if kind == "torch":
        return add_norm_torch, rope_to_cache_torch, silu_mul_torch
    from kernels.prefill_elementwise import add_rmsnorm, rope_qkv_to_cache, silu_mul  # Triton: GPU only
    return add_rmsnorm, rope_qkv_to_cache, silu_mul


class PrefillOps:
    """toks int32 [T] on the device at positions p0..; embed(toks, T, h, keys) fills h fp32 [T, hidden];
    kv(i) -> (k, v) fp16 [Hkv, >= p0+T, hd] of layer i (a slot's cache, or a graph's staging) receiving
    positions p0.. and read by attention; last: the row whose logits come back (int, or an int tensor [1]
    on the device for graphs), None = every row. linear(x, w) -> fp16 [T, N] (bias included);
    attend(q, k, v, p0) -> fp16 [T, H*hd]. logits: fp32 [1, vocab] (or [T, vocab])."""

    def __init__(self, cfg, cos, sin, embed, toks, T: int, p0: int, kv, last, linear, attend,
                 kind: str = "triton"):
        self.cfg, self.cos, self.sin, self.embed_rows = cfg, cos, sin, embed
        self.toks, self.T, self.p0, self.kv, self.last = toks, T, p0, kv, last
        self.lin, self.attend = linear, attend
        self._add_norm, self._rope, self._silu = elementwise(kind)

    def embed(self, w):
        h = torch.empty(self.T, self.cfg.hidden_size, dtype=torch.float32, device=self.toks.device)
        keys = torch.empty(self.T, dtype=torch.int64, device=self.toks.device)
        self.embed_rows(self.toks, self.T, h, keys)
        return h

    def add_norm(self, h, y, weight):
        return self._add_norm(h, y, weight, self.cfg.rms_eps)

    def linear(self, w, x, epi: str, h=None):
        y = self.lin(x, w)
        return self._silu(y) if epi == "silu" else y  # "resid": the next add_norm adds it

    def attention(self, i: int, qkv):
        c, p0, L = self.cfg, self.p0, self.p0 + self.T
        k, v = self.kv(i)
        q = self._rope(qkv, self.cos, self.sin, p0, k, v, c.num_heads, c.num_kv_heads)
        return self.attend(q, k[:, :L], v[:, :L], p0)

    def logits(self, x, head):
        last = self.last
        if last is None:
            self.hidden = x  # [T, H] final normed rows (all positions: the draft heads' training features)
            return torch.cat([self.lin(x[s:s + LOGITS_CHUNK], head).float() for s in range(0, self.T, LOGITS_CHUNK)])
        rows = x[last:last + 1] if isinstance(last, int) else x.index_select(0, last)
        return self.lin(rows, head).float()
