"""Reference layers in plain PyTorch (the CPU path and what every GPU kernel is checked against)."""
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
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


class Linear(nn.Module):
    """y = x @ W.T (+ b). W [out, in]. Quantized variants (engine/quant) replace this module
    and keep the same forward contract; fused projections are built here, at construction."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, dtype=torch.float32):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class Rotary:
    """Neox-style rotary embedding (Qwen2): cos/sin tables for positions [0, max_pos)."""

    def __init__(self, head_dim: int, max_pos: int, theta: float, device=None):
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim))
        t = torch.arange(max_pos, dtype=torch.float64, device=device)
        freqs = torch.outer(t, inv)  # [max_pos, hd/2]
        self.cos = freqs.cos().float()
        self.sin = freqs.sin().float()

    def apply(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x [T, heads, hd], pos [T] -> rotated x (same dtype)."""
        cos = self.cos[pos].unsqueeze(1)  # [T, 1, hd/2]
        sin = self.sin[pos].unsqueeze(1)
        xf = x.float()
        x1, x2 = xf.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


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
        qpos = q_start + torch.arange(T).repeat(rep)  # row r of each group is query r % T
        mask = torch.arange(L).unsqueeze(0) > qpos.unsqueeze(1)  # [rep*T, L]
        scores = scores.masked_fill(mask, float("-inf"))
    p = torch.softmax(scores, dim=-1)
    out = torch.matmul(p, v.float())  # [Hkv, rep*T, hd]
    out = out.reshape(Hkv, rep, T, hd).permute(2, 0, 1, 3).reshape(T, H * hd)
    return out.to(q.dtype)
