"""Reference layers and ops in plain PyTorch (the CPU path and what every GPU kernel is checked against).

RefOps is the ops object of the one Qwen2 forward (engine/model/forward.py) on these references.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype=torch.float32):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., dim]
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., dim] -> rmsnorm(x) * weight, computed in float32, returned in x's dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * weight.float()).to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox rotary (Qwen2) of x [..., hd] with cos/sin [..., hd/2] broadcastable to its halves -> float32."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


# Below this many rows the CPU linear runs as W @ x.T. For 2-11 rows MKL's x @ W.T (F.linear) takes a path that
# streams W once per row: on a 2-core AVX2 machine 4 rows of the 0.5B's tied head (151936 x 896 fp32) took 241 ms
# against 46 ms as W @ x.T, which streams it once (docs/results/cpu_small_batch_linear.json). From 12 rows on and
# at one row the two forms give the same bits with MKL (x86 builds; the bias as addmm's column;
# tests/test_ops_reference.py), so prompts keep F.linear's numbers; above this many rows the two run alike.
# One float32 row (a decode step at batch 1) runs as two, the second zeros: MKL's gemv ran on one thread (AMD EPYC,
# 2 threads: the 0.5B's gate_up 1.62 ms as a gemv, 0.67 ms as a 2-column gemm, docs/results/cpu_one_row_linear.json;
# decode 9.4 -> 16.7 tok/s, bench_cpu_dense_one_row*.json), and row 0 then has the bits a 2- or 3-row batch gives it
# (MKL), so a prompt lookup / draft heads verify of 1-2 drafts computes the plain step's rows. bfloat16 keeps the gemv
# (faster there).
FEW_ROWS = 128


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ w [N, K].T (+ b) -> [..., N] (contiguous); fewer than FEW_ROWS rows on the CPU as W @ x.T."""
    K, N = x.shape[-1], w.shape[0]
    M = x.numel() // max(1, K)
    if M >= FEW_ROWS or M == 0 or x.device.type != "cpu" or w.dim() != 2:
        return F.linear(x, w, b)
    if M == 1 and w.dtype == torch.float32 and x.dtype == torch.float32:
        xt = torch.cat([x.reshape(1, K), x.new_zeros(1, K)]).T  # [K, 2]: a gemm on every thread
        y = (w @ xt if b is None else torch.addmm(b[:, None], w, xt))[:, 0]  # [N], a strided view
        return y.contiguous().reshape(*x.shape[:-1], N)
    xt = x.reshape(M, K).T  # [K, M]
    y = (w @ xt if b is None else torch.addmm(b[:, None], w, xt)).T  # [M, N], a transposed view
    return y.contiguous().reshape(*x.shape[:-1], N)


class Linear(nn.Module):
    """y = x @ W.T (+ b). W [out, in]. Quantized variants (engine/quant) replace this module
    and keep the same forward contract; fused projections are built here, at construction."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, dtype=torch.float32, bias_dtype=None,
                 device=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype, device=device),
                                   requires_grad=False)  # device "meta": a shape only (streamed int8 loads)
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=bias_dtype or dtype), requires_grad=False) \
            if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class Rotary:
    """Neox-style rotary embedding (Qwen2): cos/sin tables for positions [0, max_pos)."""

    def __init__(self, head_dim: int, max_pos: int, theta: float, device=None):
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim))
        t = torch.arange(max_pos, dtype=torch.float64, device=device)
        freqs = torch.outer(t, inv)  # [max_pos, hd/2]
        self.cos = freqs.cos().float()
        self.sin = freqs.sin().float()

    @classmethod
    def from_tables(cls, cos: torch.Tensor, sin: torch.Tensor) -> "Rotary":
        """A Rotary over given tables (fp32 [max_pos, hd/2], e.g. the ones the kernels read)."""
        r = cls.__new__(cls)
        r.cos, r.sin = cos, sin
        return r

    def apply(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x [T, heads, hd], pos [T] -> rotated x (same dtype)."""
        return rope(x, self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)).to(x.dtype)  # cos [T, 1, hd/2]


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [..., 2*ffn] -> silu(gate) * up [..., ffn]."""
    g, u = gate_up.chunk(2, dim=-1)
    return F.silu(g) * u


def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int) -> torch.Tensor:
    """Causal attention of T new queries over L = q_start + T cached keys.

    q [T, H, hd]; k, v [Hkv, L, hd] -> out [T, H*hd]. Query t sits at position q_start + t.
    """
    T, H, hd = q.shape
    Hkv, L, _ = k.shape
    rep = H // Hkv
    qh = q.transpose(0, 1).reshape(Hkv, rep * T, hd) if rep == 1 else \
        q.transpose(0, 1).reshape(Hkv, rep, T, hd).reshape(Hkv, rep * T, hd)
    scores = torch.matmul(qh.float(), k.float().transpose(1, 2)) * (hd ** -0.5)  # [Hkv, rep*T, L]
    if T > 1:
        qpos = q_start + torch.arange(T, device=q.device).repeat(rep)  # row r of each group is query r % T
        mask = torch.arange(L, device=q.device).unsqueeze(0) > qpos.unsqueeze(1)  # [rep*T, L]
        scores = scores.masked_fill(mask, float("-inf"))
    p = torch.softmax(scores, dim=-1)
    out = torch.matmul(p, v.float())  # [Hkv, rep*T, hd]
    out = out.reshape(Hkv, rep, T, hd).permute(2, 0, 1, 3).reshape(T, H * hd)
    return out.to(q.dtype)


class RefOps:
    """The forward's ops on the references, over rows: ids [B, T], row b holds tokens at positions
    starts[b] .. starts[b]+T-1 of slot slots[b]. k, v: caches [layers, slots, Hkv, ctx, hd] (any float
    dtype). Linears are modules (nn.Linear-like: called on x; a quantized module swaps in with the
    same call); norm weights and a tied head are tensors. logits: each row's last token [B, vocab]
    fp32, or every token [B, T, vocab] with all_logits."""

    def __init__(self, ids: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rotary: Rotary, slots, starts,
                 heads: int, eps: float, all_logits: bool = False):
        self.ids, self.k, self.v, self.rotary = ids, k, v, rotary
        self.slots, self.starts, self.heads, self.eps, self.all_logits = slots, starts, heads, eps, all_logits

    def embed(self, w) -> torch.Tensor:
        # w: the float table, or rows decoded from a mapped model file on demand (engine/formats/gguf_rows.py)
        return F.embedding(self.ids, w) if isinstance(w, torch.Tensor) else w.rows(self.ids)

    def add_norm(self, h, y, weight):
        if y is not None:
            h += y
        return rms_norm(h, weight, self.eps)

    def linear(self, w, x, epi: str, h=None):
        y = w(x)
        return silu_and_mul(y) if epi == "silu" else y  # "resid": add_norm adds it

    def attention(self, i: int, qkv: torch.Tensor) -> torch.Tensor:
        B, T, _ = qkv.shape
        Hkv, hd = self.k.shape[2], self.k.shape[-1]
        q, k, v = qkv.split([self.heads * hd, Hkv * hd, Hkv * hd], dim=-1)
        outs = []
        for b in range(B):
            s, p0 = self.slots[b], self.starts[b]
            pos = torch.arange(p0, p0 + T, device=qkv.device)
            kc, vc = self.k[i, s], self.v[i, s]  # [Hkv, ctx, hd]
            kc[:, p0:p0 + T] = self.rotary.apply(k[b].view(T, Hkv, hd), pos).transpose(0, 1)
            vc[:, p0:p0 + T] = v[b].view(T, Hkv, hd).transpose(0, 1)
            qb = self.rotary.apply(q[b].view(T, self.heads, hd), pos)
            outs.append(gqa_attention(qb, kc[:, :p0 + T], vc[:, :p0 + T], p0))
        return torch.stack(outs)

    def logits(self, x, head):
        x = x if self.all_logits else x[:, -1]
        self.hidden = x  # the rows the head reads ([B, T, H] or [B, H]): the draft heads' input
        return (linear(x, head) if isinstance(head, torch.Tensor) else head(x)).float()
