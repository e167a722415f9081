"""Quantize / dequantize whole matrices in row chunks, into the packed layout of pack.py.

quantize_clip() improves on pack.quantize() (round-to-nearest over the full [min, max] range of
each group): for every group of 128 it also tries ranges shrunk toward zero and keeps the one
with the smallest squared error. Outliers otherwise stretch the grid and waste levels; this
matters most at 3 bits (8 levels). The packed layout is unchanged.

Row chunks bound the temporaries (seed 5.8: converting a 545M-parameter embedding to float32
at once ran the host out of memory), so a 7B embedding/head is processed ~4700 rows (16M weights) at a time.
"""
from __future__ import annotations

import torch

from kernels import pack
from kernels.pack import GROUP, packed_words, quantize as rtn

ELEMS_PER_CHUNK = 1 << 24  # 16M weights (64 MB as float32) per row chunk


def row_chunk(K: int) -> int:
    return max(256, ELEMS_PER_CHUNK // K // 16 * 16)  # whole 16-row tiles (W3 layout 3, kernels/pack.py)
# Range shrink factors tried per group (1.0 = plain min/max round-to-nearest).
CLIP_GRID = (1.0, 0.92, 0.84, 0.76)


def _fp16_params(lo: torch.Tensor, hi: torch.Tensor, qmax: int):
    scales = ((hi - lo) / qmax).clamp_min(1e-8).half()
    mins = lo.half()
    return scales, mins


def quantize_clip(w: torch.Tensor, bits: int, grid=CLIP_GRID):
    """w [N, K] -> (q uint8 [N, K], scales fp16, mins fp16 [N, K/128]); per-group best clip."""
    N, K = w.shape
    if K % GROUP:
        raise ValueError(f"K={K} is not a multiple of {GROUP}")
    qmax = (1 << bits) - 1
    g = w.float().reshape(N, K // GROUP, GROUP)
    lo0, hi0 = g.amin(-1), g.amax(-1)
    best_err = best_s = best_m = None
    for f in grid:
        scales, mins = _fp16_params(lo0 * f, hi0 * f, qmax)
        s, m = scales.float().unsqueeze(-1), mins.float().unsqueeze(-1)
        e = torch.sub(g, m).div_(s).round_().clamp_(0, qmax).mul_(s).add_(m).sub_(g)
        err = e.pow_(2).sum(-1)  # [N, K/128]
        if best_err is None:
            best_err, best_s, best_m = err, scales, mins
        else:
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best_s = torch.where(better, scales, best_s)
            best_m = torch.where(better, mins, best_m)
    s, m = best_s.float().unsqueeze(-1), best_m.float().unsqueeze(-1)
    q = torch.sub(g, m).div_(s).round_().clamp_(0, qmax).to(torch.uint8).reshape(N, K)
    return q, best_s, best_m


_P4 = torch.tensor([1, 16], dtype=torch.uint8)


def pack_fast(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Same words as pack.pack(), W4 built from uint8 bytes (little-endian); W3 / W6 are pack's own."""
    N, K = q.shape
    q = q.to(torch.uint8)
    if bits == 8:  # the codes are the words' bytes (little-endian)
        return q.contiguous().view(torch.int32)
    if bits == 4:
        b = (q.reshape(N, K // 2, 2) * _P4).sum(-1, dtype=torch.uint8)
        return b.reshape(N, K // 2).contiguous().view(torch.int32)
    if bits == 6:
        return pack.pack_w6(q)
    return pack.pack_w3(q)  # W3 layout 3 (kernels/pack.py)


def quantize_matrix(w: torch.Tensor, bits: int, clip: bool = True, group: int = GROUP) -> dict[str, torch.Tensor]:
    """Dense w [N, K] (any float dtype) -> {"qweight", "scales", "mins"} packed for (bits, group) (4 | 3 at 128;
    any pack.LAYOUTS layout round-to-nearest: the clip search is for group 128 only)."""

    N, K = w.shape
    qw = torch.empty(N, packed_words(K, bits), dtype=torch.int32)
    sc = torch.empty(N, K // group, dtype=torch.float16)
    mn = torch.empty(N, K // group, dtype=torch.float16)
    step = row_chunk(K)
    for r in range(0, N, step):
        rows = w[r:r + step]
        q, s, m = quantize_clip(rows, bits) if clip and group == GROUP else rtn(rows, bits, group)
        qw[r:r + step] = pack_fast(q, bits)
        sc[r:r + step], mn[r:r + step] = s, m
    return {"qweight": qw, "scales": sc, "mins": mn}


_SH4 = torch.tensor([0, 4], dtype=torch.uint8)


def unpack_fast(qweight: torch.Tensor, K: int, bits: int) -> torch.Tensor:
    """Same result as pack.unpack(), W4 / W8 on uint8 bytes (little-endian words); W3 / W6 are pack's own."""
    N = qweight.shape[0]
    b = qweight.contiguous().view(torch.uint8)
    if bits == 8:
        return b.reshape(N, K)
    if bits == 4:  # byte j of a word holds k = 2j (low nibble) and 2j+1 (high nibble)
        return ((b.unsqueeze(-1) >> _SH4) & 0xF).reshape(N, K)
    if bits == 6:
        return pack.unpack_w6(qweight, K)
    return pack.unpack_w3(qweight, K)  # W3 layout 3 (kernels/pack.py)


def dequantize_matrix(qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, bits: int,
                      out: torch.Tensor | None = None, dtype=torch.float32, group: int = GROUP) -> torch.Tensor:
    """Packed -> dense [N, K] (written into `out` when given, e.g. a model parameter); any pack.LAYOUTS group."""
    N, K = scales.shape[0], scales.shape[1] * group
    if out is None:
        out = torch.empty(N, K, dtype=dtype)
    step = row_chunk(K)
    for r in range(0, N, step):
        q = unpack_fast(qweight[r:r + step], K, bits)
        n = q.shape[0]
        g = q.float().reshape(n, K // group, group)
        g.mul_(scales[r:r + step].float().unsqueeze(-1)).add_(mins[r:r + step].float().unsqueeze(-1))
        out[r:r + step] = g.reshape(n, K)
    return out
