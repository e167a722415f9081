"""PyTorch references for the prefill kernels (what kernels/prefill_triton.py is checked against).

Everything here runs on the CPU in float32; inputs may live on any device.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.ops_reference import gqa_attention
from kernels.pack import dequantize, unpack


def dequant_reference(w) -> torch.Tensor:
    """QWeight (bits 4|3|16) -> float32 [N, K] on the CPU."""
    if w.bits == 16:
        return w.weight.float().cpu()
    q = unpack(w.qweight.cpu(), w.K, w.bits)
    sc, mn = w.fp16_scales()  # the plain fp16 ones (a KQ weight's made exactly)
    return dequantize(q, sc.cpu(), mn.cpu())


def linear_reference(x: torch.Tensor, w) -> torch.Tensor:
    """x [T, K] -> float32 [T, N] = x @ W.T (+ b), W from the packed layout."""
    b = None if w.bias is None else w.bias.float().cpu()
    return F.linear(x.float().cpu(), dequant_reference(w), b)


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int) -> torch.Tensor:
    """kernels.ops_reference.gqa_attention in float32 on the CPU: q [T, H, hd], k/v [Hkv, L, hd] -> [T, H*hd]."""
    return gqa_attention(q.float().cpu(), k.float().cpu(), v.float().cpu(), q_start)
