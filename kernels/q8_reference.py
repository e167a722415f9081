"""References for kernels/decode_q8.cu (a probe: the W4 g128 decode GEMV at batch 1 on int8 activations).

x is quantized as llama.cpp quantizes activations for its batch-1 GEMVs (Q8_1): per block of 32, dx = amax / 127,
xq = round-half-even(x / dx) in int8, sx = dx * sum(xq) (fp32, each operation rounded once as the kernel does). The
GEMV then sums exact integer products per block: y[n] = sum_b s[n, b // 4] * (dx[b] * I[n, b]) + m[n, b // 4] * sx[b].
"""
from __future__ import annotations

import torch

BLOCK = 32  # x values per int8 block (Q8_1's)
ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # the kernel's byte order inside each run of 8 k (decode_q8.cu q8_dot)


def quant_x_q8_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [K] (fp16 or fp32 values) -> (xq int8 [K] in k order, dx fp32 [K/32], sx fp32 [K/32])."""
    K = x.numel()
    if K % BLOCK:
        raise ValueError(f"K={K} is not a multiple of {BLOCK}")
    v = x.detach().float().cpu().reshape(-1, BLOCK)
    dx = v.abs().amax(1) / 127.0  # fp32 division, correctly rounded as __fdiv_rn
    safe = torch.where(dx > 0, dx, torch.ones_like(dx))
    q = torch.where(dx.unsqueeze(1) > 0, torch.round(v / safe.unsqueeze(1)), torch.zeros_like(v))
    xq = q.to(torch.int8).reshape(K)
    sx = dx * q.sum(1)  # the integer sum is exact in fp32 (|sum| <= 32 x 127)
    return xq, dx, sx


def permute_q8(xq: torch.Tensor) -> torch.Tensor:
    """k order -> the kernel's byte order (each run of 8 as ORDER)."""
    return xq.reshape(-1, 8)[:, list(ORDER)].reshape(-1).contiguous()


def unpermute_q8(xp: torch.Tensor) -> torch.Tensor:
    inv = [ORDER.index(i) for i in range(8)]
    return xp.reshape(-1, 8)[:, inv].reshape(-1).contiguous()


def gemv_q8_ref(q: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, xq: torch.Tensor, dx: torch.Tensor,
                sx: torch.Tensor) -> torch.Tensor:
    """q uint8 codes [N, K] (group 128), scales / mins fp16 [N, K/128], xq int8 [K] in k order -> y float64 [N]
    (the blocks' integer sums exact, the rest in float64: the kernel's fp32 result lies within its roundings)."""
    N, K = q.shape
    I = (q.to(torch.int64).reshape(N, K // BLOCK, BLOCK) * xq.to(torch.int64).reshape(1, K // BLOCK, BLOCK)).sum(-1)
    per = 128 // BLOCK
    s = scales.double().repeat_interleave(per, dim=1)  # [N, K/32]
    m = mins.double().repeat_interleave(per, dim=1)
    return (s * (dx.double() * I.double()) + m * sx.double()).sum(1)


def q8_dot_words(words: list[int], xbytes: list[int]) -> int:
    """The kernel's q8_dot on one lane's 4 code words and 32 x bytes in the kernel's order (ints), as the masks and
    dp4a compute it: a model of the bit trick, for the CPU tests."""
    def dp4a(a: int, b: int, c: int) -> int:
        for i in range(4):
            ua = (a >> (8 * i)) & 0xFF
            sb = (b >> (8 * i)) & 0xFF
            sb = sb - 256 if sb >= 128 else sb
            c += ua * sb
        return c

    def word(bs):  # 4 signed bytes -> u32
        return sum((b & 0xFF) << (8 * i) for i, b in enumerate(bs))

    lo = hi = 0
    for i, w in enumerate(words):
        lo = dp4a(w & 0x0F0F0F0F, word(xbytes[8 * i: 8 * i + 4]), lo)
        hi = dp4a(w & 0xF0F0F0F0, word(xbytes[8 * i + 4: 8 * i + 8]), hi)
    assert hi % 16 == 0
    return lo + (hi >> 4)


def mma_pack(qweight: torch.Tensor) -> torch.Tensor:
    """W4 words int32 [N, K/8] (pack_w4's natural order) -> the mma form's (decode_q8.cu q8m_body): in each row's
    group of 16 words, word 4t + i = the natural word 4i + t (lane t's 8 codes of block i)."""
    N, W = qweight.shape
    return qweight.reshape(N, W // 16, 4, 4).transpose(2, 3).reshape(N, W).contiguous()
