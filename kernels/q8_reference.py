"""References for the W4 decode GEMV on int8 activations: the step's q8 kernels (decode_gemv.cu
gemv_w4q8_*, EngineConfig.decode_q8; gemv_q8_w4_ref) and the probe's (decode_q8.cu, decode_q8dot.cu).

x is quantized as llama.cpp quantizes activations for its batch-1 GEMVs (Q8_1): per block of 32, dx = amax / 127,
xq = round-half-even(x * (1 / dx)) in int8 (llama.cpp's CPU quantize_row_q8_1 form: one reciprocal per block),
sx = dx * sum(xq) (fp32, each operation rounded once as the kernels do). The GEMV then sums exact integer products
per block: y[n] = sum_b s[n, b // 4] * (dx[b] * I[n, b]) + m[n, b // 4] * sx[b] (groups of 128; of 32: s[n, b]).
"""
from __future__ import annotations

import torch

from kernels.pack import unpack_w4

BLOCK = 32  # x values per int8 block (Q8_1's)
ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # the kernel's byte order inside each run of 8 k (decode_q8.cu q8_dot)


def quant_x_q8_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [K] (fp16 or fp32 values) -> (xq int8 [K] in k order, dx fp32 [K/32], sx fp32 [K/32])."""
    K = x.numel()
    if K % BLOCK:
        raise ValueError(f"K={K} is not a multiple of {BLOCK}")
    v = x.detach().float().cpu().reshape(-1, BLOCK)
    dx = v.abs().amax(1) / 127.0  # fp32 division, correctly rounded as __fdiv_rn
    inv = torch.where(dx > 0, 1.0 / torch.where(dx > 0, dx, torch.ones_like(dx)), torch.zeros_like(dx))  # __frcp_rn
    q = torch.round(v * inv.unsqueeze(1))  # fp32 product (__fmul_rn), then half-even (__float2int_rn)
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
    """q uint8 codes [N, K] (groups of 128 or 32: K / scales' columns), scales / mins fp16 [N, groups], xq int8 [K] in
    k order -> y float64 [N] (the blocks' integer sums exact, the rest in float64: the kernel's fp32 result lies within
    its roundings of it)."""
    N, K = q.shape
    I = (q.to(torch.int64).reshape(N, K // BLOCK, BLOCK) * xq.to(torch.int64).reshape(1, K // BLOCK, BLOCK)).sum(-1)
    per = (K // scales.shape[1]) // BLOCK  # x blocks per group: 4 (g128) or 1 (g32)
    s = scales.double().repeat_interleave(per, dim=1)  # [N, K/32]
    m = mins.double().repeat_interleave(per, dim=1)
    return (s * (dx.double() * I.double()) + m * sx.double()).sum(1)


def gemv_q8_w4_ref(x: torch.Tensor, w) -> torch.Tensor:
    """The step's q8 GEMV product of one token (decode_gemv.cu q8_kloop, before its epilogue): x fp16 [K] quantized as
    quant_x_q8_ref, QWeight w's W4 codes (groups of 128, or of 32 in any scale form: its fp16 scales and mins as the
    kernels make them) summed per block exactly -> float32 [1, N] on x's device (the kernel's fp32 sums lie within
    their roundings of it)."""
    xq, dx, sx = quant_x_q8_ref(x)
    s, m = w.fp16_scales()
    y = gemv_q8_ref(unpack_w4(w.qweight.cpu(), w.K), s.cpu(), m.cpu(), xq, dx, sx)
    return y.float()[None].to(x.device)


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
