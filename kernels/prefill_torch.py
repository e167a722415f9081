"""Packed W4/W3/W6/W8 linears (any kernels/pack.py group) for the GPU prefill without Triton: dequantize on the
weight's device with torch ops (row blocks into fp16), then cuBLAS. The fallback of kernels/prefill_triton.py's
dequant_into + matmul (kernels/triton_check.py decides); same math as kernels/pack.py dequantize.
"""
from __future__ import annotations

import torch

from kernels.pack import unpack_w3, unpack_w6

BLOCK_BYTES = 64 << 20  # fp32 work per row block while dequantizing


def dequant_rows(w, r0: int, r: int) -> torch.Tensor:
    """Rows r0..r0+r of a packed QWeight as fp16 [r, K] on its device."""
    qw, dev = w.qweight[r0:r0 + r], w.qweight.device
    if w.bits == 8:  # 4 bytes per int32, low first (kernels/pack.py pack_w8)
        sh = torch.arange(0, 32, 8, dtype=torch.int32, device=dev)
        q = ((qw.unsqueeze(-1) >> sh) & 0xFF).reshape(r, w.K)
    elif w.bits == 4:  # 8 nibbles per int32, low first (kernels/pack.py pack_w4)
        sh = torch.arange(0, 32, 4, dtype=torch.int32, device=dev)
        q = ((qw.unsqueeze(-1) >> sh) & 0xF).reshape(r, w.K)
    elif w.bits == 6:  # nibble and high-bit planes per block of 128 (kernels/pack.py W6), unpacked on the device
        q = unpack_w6(qw, w.K)
    else:  # 3 words per 32 values in 16-row tiles (layout 3): the tiles around the rows, unpacked on the device
        t0, t1 = r0 // 16 * 16, -(-(r0 + r) // 16) * 16
        q = unpack_w3(w.qweight[t0:t1], w.K)[r0 - t0:r0 - t0 + r]
    g = q.float().reshape(r, w.K // w.group, w.group)
    s, m = (t.float().unsqueeze(-1) for t in w.fp16_scales(slice(r0, r0 + r)))  # KQ: expanded exactly
    return (g * s + m).reshape(r, w.K).half()


def linear_torch(x: torch.Tensor, w) -> torch.Tensor:
    """x fp16 [T, K] -> fp16 [T, N] = x @ W.T (+ bias) for a packed QWeight."""
    rows = max(16, min(w.N, BLOCK_BYTES // (8 * w.K)) // 16 * 16)  # whole 16-row tiles: no W3 tile unpacked twice
    y = torch.empty(x.shape[0], w.N, dtype=torch.float16, device=x.device)
    for r0 in range(0, w.N, rows):
        r = min(rows, w.N - r0)
        y[:, r0:r0 + r] = torch.matmul(x, dequant_rows(w, r0, r).t())
    if w.bias is not None:
        y += w.bias
    return y
