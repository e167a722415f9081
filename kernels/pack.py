"""Packed weight layouts for W4A16 and W3A16 (the contract between checkpoints and kernels).

A linear weight W is [N out, K in] with y = x @ W.T. K must be a multiple of GROUP (128);
every Qwen2.5 hidden/FFN size is. Quantization is asymmetric per group of 128 along K:

    w[n, k] ~= q[n, k] * scales[n, k // 128] + mins[n, k // 128]      q in [0, 2^bits - 1]

scales, mins: float16 [N, K // 128] (one FMA per weight to dequantize).

W4  qweight int32 [N, K // 8]:  q[n, k] = (qweight[n, k // 8] >> (4 * (k % 8))) & 0xF
W3  qweight int32 [N, K // 32 * 3]: a block of 32 k-values in 3 words (w0, w1, w2):
        j = k % 32, b = k // 32, w* = qweight[n, 3b + *]
        low 2 bits:  (w0 >> 2j) & 3 for j < 16,  (w1 >> 2(j-16)) & 3 for j >= 16
        high bit:    (w2 >> j) & 1
    q = low | (high << 2). Rows are tight: row n starts at word n * K // 32 * 3, no per-row
    padding (seed 5.7: a padding byte per row broke a kernel that assumed a tight stride).
A 16-byte load (4 words) covers 32 W4 values; 3 words cover 32 W3 values.
"""
from __future__ import annotations

import torch

GROUP = 128


def quantize(w: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest asymmetric quantization. w [N, K] -> (q uint8 [N, K], scales, mins fp16 [N, K/128])."""
    N, K = w.shape
    if K % GROUP:
        raise ValueError(f"K={K} is not a multiple of {GROUP}")
    g = w.float().reshape(N, K // GROUP, GROUP)
    lo, hi = g.amin(-1), g.amax(-1)
    qmax = (1 << bits) - 1
    scales = ((hi - lo) / qmax).clamp_min(1e-8).half()
    mins = lo.half()
    s, m = scales.float().unsqueeze(-1), mins.float().unsqueeze(-1)
    q = torch.round((g - m) / s).clamp_(0, qmax).to(torch.uint8).reshape(N, K)
    return q, scales, mins


def dequantize(q: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
    """q uint8 [N, K] -> float32 [N, K]."""
    N, K = q.shape
    g = q.float().reshape(N, K // GROUP, GROUP)
    return (g * scales.float().unsqueeze(-1) + mins.float().unsqueeze(-1)).reshape(N, K)


def pack_w4(q: torch.Tensor) -> torch.Tensor:
    N, K = q.shape
    v = q.to(torch.int64).reshape(N, K // 8, 8)
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    words = (v << shifts).sum(-1)
    return _to_int32(words)


def unpack_w4(qweight: torch.Tensor, K: int) -> torch.Tensor:
    N = qweight.shape[0]
    w = qweight.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    return ((w.unsqueeze(-1) >> shifts) & 0xF).reshape(N, K).to(torch.uint8)


def pack_w3(q: torch.Tensor) -> torch.Tensor:
    N, K = q.shape
    if K % 32:
        raise ValueError("K must be a multiple of 32 for W3")
    v = q.to(torch.int64).reshape(N, K // 32, 32)
    low, high = v & 3, (v >> 2) & 1
    s2 = torch.arange(0, 32, 2, dtype=torch.int64)
    w0 = (low[..., :16] << s2).sum(-1)
    w1 = (low[..., 16:] << s2).sum(-1)
    w2 = (high << torch.arange(32, dtype=torch.int64)).sum(-1)
    return _to_int32(torch.stack([w0, w1, w2], -1).reshape(N, K // 32 * 3))


def unpack_w3(qweight: torch.Tensor, K: int) -> torch.Tensor:
    N = qweight.shape[0]
    w = (qweight.to(torch.int64) & 0xFFFFFFFF).reshape(N, K // 32, 3)
    s2 = torch.arange(0, 32, 2, dtype=torch.int64)
    low = torch.cat([(w[..., 0:1] >> s2) & 3, (w[..., 1:2] >> s2) & 3], -1)
    high = (w[..., 2:3] >> torch.arange(32, dtype=torch.int64)) & 1
    return (low | (high << 2)).reshape(N, K).to(torch.uint8)


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    words = words & 0xFFFFFFFF
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    return pack_w4(q) if bits == 4 else pack_w3(q)


def unpack(qweight: torch.Tensor, K: int, bits: int) -> torch.Tensor:
    return unpack_w4(qweight, K) if bits == 4 else unpack_w3(qweight, K)


def packed_words(K: int, bits: int) -> int:
    """int32 words per row."""
    return K // 8 if bits == 4 else K // 32 * 3
