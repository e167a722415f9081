"""Triton kernels for prefill linears on packed W4/W3/W6/W8 weights (kernels/pack.py layout, any pack.LAYOUTS group).

Two ways to compute y[T, N] = x[T, K] @ W.T with W[n, k] = q[n, k] * scale[n, k//GS] + min[n, k//GS]
(GS = QWeight.group: 128 for our W4/W3, 32 or 16 for a GGUF's exact layouts; a tile of BK columns reads one
scale per row when BK <= GS, else BK // GS per row, broadcast over their groups):
  dequant_into(w, out)       one pass writes W as fp16 [N, K] into a reused scratch buffer; the caller
                             then runs cuBLAS (torch.matmul). Memory-bound: reads 0.53 B/weight, writes 2.
  fused_linear(x, w)         dequantizes each [BK, BN] weight tile in registers right before tl.dot,
                             so weights are read once per M-block and never written as fp16.
Both are plain tl.dot code (no Hopper-only instructions requested), so the same source compiles for
sm_86 (Ampere mma.sync) and sm_90 (Triton may pick wgmma there by itself).
References: kernels/prefill_reference.py.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.splitk_plan import splitk_plan, splitk_tiles  # the split-K tiles and launch plan (no Triton: CPU-testable)


@triton.jit
def _w3_half(w0, w1, w2, S: tl.constexpr):
    """Half S (0: bits 0-15, 16: bits 16-31) of a layout-3 block's words w0, w1, w2 -> (A, B): A = codes 0-9 at
    bits 3 p (w0's and w1's 15 code bits side by side), B = codes 10-15 at bits 3 (p - 10) (w2's code bits, then
    pair 15 gathered from the three words' bit 15 + S)."""
    x0, x1, x2 = w0 >> S, w1 >> S, w2 >> S
    A = (x0 & 0x7FFF) | ((x1 & 0x7FFF) << 15)
    q15 = ((x0 >> 15) & 1) | (((x1 >> 15) & 1) << 1) | (((x2 >> 15) & 1) << 2)
    B = (x2 & 0x7FFF) | (q15 << 15)
    return A, B


@triton.jit
def _load_q_tile(qw_ptr, n, k0, KW, BITS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, nmask):
    """q[n, k0:k0+BK] as int32 [BN, BK] from whole contiguous words (n: [BN] row indices)."""
    row = qw_ptr + n[:, None] * KW
    if BITS == 8:
        wi = k0 // 4 + tl.arange(0, BK // 4)
        words = tl.load(row + wi[None, :], mask=nmask[:, None], other=0)  # [BN, BK/4]
        sh = tl.arange(0, 4) * 8
        q = (words[:, :, None] >> sh[None, None, :]) & 0xFF  # [BN, BK/4, 4]: k = word*4 + byte
    elif BITS == 4:
        wi = k0 // 8 + tl.arange(0, BK // 8)
        words = tl.load(row + wi[None, :], mask=nmask[:, None], other=0)  # [BN, BK/8]
        sh = tl.arange(0, 8) * 4
        q = (words[:, :, None] >> sh[None, None, :]) & 0xF  # [BN, BK/8, 8]: k = word*8 + nibble
    elif BITS == 6:
        # W6 (kernels/pack.py): per block of 128 k, 24 words: the nibbles as W4 in words 0..15 (word (k % 128) // 8),
        # the high bits in 16..23 (word 16 + (k % 128) // 16; k % 16 = i = 8 u + 4 v + j at bit 16 v + 2 slot(4 u + j))
        kl = k0 + tl.arange(0, BK // 8) * 8
        lo_w = tl.load(row + ((kl // 128) * 24 + (kl % 128) // 8)[None, :], mask=nmask[:, None], other=0)
        lo = (lo_w[:, :, None] >> (tl.arange(0, 8) * 4)[None, None, :]) & 0xF  # [BN, BK/8, 8]
        kh = k0 + tl.arange(0, BK // 16) * 16
        hi_w = tl.load(row + ((kh // 128) * 24 + 16 + (kh % 128) // 16)[None, :], mask=nmask[:, None], other=0)
        i = tl.arange(0, 16)
        sl = 4 * (i >> 3) + (i & 3)
        pos = 16 * ((i >> 2) & 1) + 2 * ((sl >> 1) + 4 * (sl & 1))
        hi = (hi_w[:, :, None] >> pos[None, None, :]) & 3  # [BN, BK/16, 16]
        q = tl.reshape(lo, (BN, BK)) | (tl.reshape(hi, (BN, BK)) << 4)
    else:
        # layout 3 (kernels/pack.py): row n is half h = (n // 8) % 2 of pair (n // 16) * 8 + n % 8, whose group grp
        # (blocks 4 grp + t) is 24 words at pair * 2 KW + 24 grp: w0, w1 at 4 t + 2 h (+1), w2 at 16 + 2 t + h
        bi = k0 // 32 + tl.arange(0, BK // 32)
        pair = (n // 16) * 8 + n % 8
        hh = (n // 8) % 2
        pb = qw_ptr + pair[:, None] * (2 * KW) + (bi // 4)[None, :] * 24  # [BN, BK/32]
        t4 = (bi % 4)[None, :]
        w0 = tl.load(pb + 4 * t4 + 2 * hh[:, None], mask=nmask[:, None], other=0)  # [BN, BK/32]
        w1 = tl.load(pb + 4 * t4 + 2 * hh[:, None] + 1, mask=nmask[:, None], other=0)
        w2 = tl.load(pb + 16 + 2 * t4 + hh[:, None], mask=nmask[:, None], other=0)
        # code j = p + 16 s of a block: pair p < 15 in word p // 5 at bit 3 (p % 5) + 16 s, pair 15's bit i in word i
        # at bit 15 + 16 s. Once per block and half s, the 16 codes are regrouped into two words: A = codes 0-9 at
        # bits 3 p, B = codes 10-15 at bits 3 (p - 10); then each code is one select, one shift and one mask
        # (before: two selects, a shift and a mask per code, and pair 15's six-operation gather for every code)
        a0, b0 = _w3_half(w0, w1, w2, 0)
        a1, b1 = _w3_half(w0, w1, w2, 16)
        A = tl.join(a0, a1)  # [BN, BK/32, 2]: half s = 0, 1
        B = tl.join(b0, b1)
        p = tl.arange(0, 16)[None, None, None, :]
        sel = tl.where(p < 10, A[:, :, :, None], B[:, :, :, None])  # [BN, BK/32, 2, 16]
        q = (sel >> (3 * (p % 10))) & 7
    return tl.reshape(q, (BN, BK))


def scale_form(w) -> int:
    """The SF constexpr of a QWeight's scales (QWeight.form): 0 fp16 scale + min, 1 KQ, 2 SYM (kernels/pack.py)."""
    return 1 if w.kq else 2 if w.sym else 0


@triton.jit
def _kq_scales(s_ptr, m_ptr, gi, mask, GS: tl.constexpr):
    """The fp16 (scale, min) of flat group indices gi (row * groups + group) of a KQ weight (kernels/pack.py): made
    from the integer sub-scales (s_ptr) and the fp16 factors per 256 (m_ptr) as the repack rounds them (the fp32
    products are exact, rounded to fp16 once)."""
    sb = gi // (256 // GS)  # the super-block: K is a multiple of 256, so rows do not straddle one
    if GS == 32:  # uint8 (sc, m) per group of 32, fp16 (d, dmin) per 256 (Q4_K / Q5_K)
        sc = tl.load(s_ptr + 2 * gi, mask=mask, other=0).to(tl.float32)
        mb = tl.load(s_ptr + 2 * gi + 1, mask=mask, other=0).to(tl.float32)
        d = tl.load(m_ptr + 2 * sb, mask=mask, other=0.0).to(tl.float32)
        dmin = tl.load(m_ptr + 2 * sb + 1, mask=mask, other=0.0).to(tl.float32)
        return (d * sc).to(tl.float16), (-(dmin * mb)).to(tl.float16)
    else:  # int8 sc per group of 16, fp16 d per 256 (Q6_K)
        a = tl.load(m_ptr + sb, mask=mask, other=0.0).to(tl.float32) * \
            tl.load(s_ptr + gi, mask=mask, other=0).to(tl.float32)
        return a.to(tl.float16), (-32.0 * a).to(tl.float16)


@triton.jit
def _scale_tile(q, s_ptr, m_ptr, n, k0, G, GS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, nmask,
                F32: tl.constexpr, SF: tl.constexpr = 0, BITS: tl.constexpr = 4):
    """W[n, k0:k0+BK] = q * scale + min as a [BN, BK] tile (float32 if F32 else fp16 math). A tile inside one
    group reads one scale/min per row; a tile of BK // GS groups reads [BN, BK // GS] and broadcasts them over
    q viewed as [BN, BK // GS, GS] (not one gathered load per column: that made the GGUF layouts' prefill
    5x slower than W4's). SF (scale_form): 1 the mins made from KQ sub-scales; 2 (SYM) no mins: W = (q - 2^(BITS-1))
    * scale, the true weight rounded once (the centred code is exact in fp16)."""
    C: tl.constexpr = 1 << (BITS - 1)
    if BK <= GS:
        g = k0 // GS
        if SF == 1:
            s, mn = _kq_scales(s_ptr, m_ptr, n * G + g, nmask, GS)
            s, mn = s[:, None], mn[:, None]
        else:
            s = tl.load(s_ptr + n * G + g, mask=nmask, other=0.0)[:, None]
            if SF == 0:
                mn = tl.load(m_ptr + n * G + g, mask=nmask, other=0.0)[:, None]
        if SF == 2:
            if F32:
                w = (q.to(tl.float32) - C) * s.to(tl.float32)
            else:
                w = (q.to(tl.float16) - C) * s
        elif F32:
            w = q.to(tl.float32) * s.to(tl.float32) + mn.to(tl.float32)
        else:
            w = q.to(tl.float16) * s + mn
    else:
        NG: tl.constexpr = BK // GS
        gi = n[:, None] * G + k0 // GS + tl.arange(0, NG)[None, :]  # [BN, NG]
        if SF == 1:
            s, mn = _kq_scales(s_ptr, m_ptr, gi, nmask[:, None], GS)
        else:
            s = tl.load(s_ptr + gi, mask=nmask[:, None], other=0.0)
            if SF == 0:
                mn = tl.load(m_ptr + gi, mask=nmask[:, None], other=0.0)
        q3 = tl.reshape(q, (BN, NG, GS))
        if SF == 2:
            if F32:
                w3 = (q3.to(tl.float32) - C) * s.to(tl.float32)[:, :, None]
            else:
                w3 = (q3.to(tl.float16) - C) * s[:, :, None]
        elif F32:
            w3 = q3.to(tl.float32) * s.to(tl.float32)[:, :, None] + mn.to(tl.float32)[:, :, None]
        else:
            w3 = q3.to(tl.float16) * s[:, :, None] + mn[:, :, None]
        w = tl.reshape(w3, (BN, BK))
    return w


@triton.jit
def _dequant_kernel(qw_ptr, s_ptr, m_ptr, out_ptr, N, K, KW, G,
                    BITS: tl.constexpr, GS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                    SF: tl.constexpr = 0):
    # out [N, K] fp16 (row stride K); one program = BN rows x BK columns (BK divides K; GS = weights per group).
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n = pid_n * BN + tl.arange(0, BN)
    k0 = pid_k * BK
    nmask = n < N
    q = _load_q_tile(qw_ptr, n, k0, KW, BITS, BN, BK, nmask)
    w = _scale_tile(q, s_ptr, m_ptr, n, k0, G, GS, BN, BK, nmask, True, SF, BITS)
    k = k0 + tl.arange(0, BK)
    tl.store(out_ptr + n[:, None] * K + k[None, :], w.to(tl.float16), mask=nmask[:, None])


def dequant_into(w, out: torch.Tensor, row0: int = 0, rows: int | None = None) -> torch.Tensor:
    """Rows [row0, row0+rows) of quantized QWeight w as fp16 into out[:rows] (out: contiguous, >= rows*K).
    Any kernels/pack.py layout: bits 4/3/6/8, group w.group (128, 32, 16)."""
    rows = w.N - row0 if rows is None else rows
    GS = w.group
    K, KW, G = w.K, w.qweight.shape[1], w.K // GS
    assert w.scales.shape[1] == G, "QWeight.group does not match its scales"
    assert w.bits != 3 or row0 % 16 == 0, "W3 words sit in 16-row tiles (kernels/pack.py): row0 must be a multiple of 16"
    dst = out[: rows * K].view(rows, K)
    BN = 32
    BK = 128 if K % 128 == 0 else 32  # K is a multiple of 32 (and of the group) in every layout
    grid = (triton.cdiv(rows, BN), K // BK)
    _dequant_kernel[grid](w.qweight[row0:], w.scales[row0:], w.mins[row0:], dst, rows, K, KW, G,
                          BITS=w.bits, GS=GS, BN=BN, BK=BK, SF=scale_form(w), num_warps=4)
    return dst


@triton.jit
def _dot_tile(acc, x_ptr, qw_ptr, s_ptr, m_ptr, m, n, k, k0, sxm, KW, G, mmask, nmask,
              BITS: tl.constexpr, GS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SF: tl.constexpr = 0):
    """acc [BM, BN] += x[m, k] @ W[n, k].T for the BK columns k = k0.. : W from whole words, dequantized with fp16 FMA
    in registers right before tl.dot (masked rows load zeros)."""
    a = tl.load(x_ptr + m[:, None] * sxm + k[None, :], mask=mmask[:, None], other=0.0)
    q = _load_q_tile(qw_ptr, n, k0, KW, BITS, BN, BK, nmask)  # [BN, BK]
    w = _scale_tile(q, s_ptr, m_ptr, n, k0, G, GS, BN, BK, nmask, False, SF, BITS)
    return tl.dot(a, tl.trans(w), acc)


@triton.jit
def _fused_kernel(x_ptr, qw_ptr, s_ptr, m_ptr, b_ptr, y_ptr, M, N, K, KW, G, sxm, sym,
                  BITS: tl.constexpr, GS: tl.constexpr, HAS_BIAS: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                  SF: tl.constexpr = 0):
    # y [M, N] = x [M, K] @ W.T ; W dequantized per [BK, BN] tile in registers. BK divides K.
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    # grouped ordering: GROUP_M m-blocks share each weight tile while it sits in L2
    width = GROUP_M * num_n
    gid = pid // width
    first_m = gid * GROUP_M
    gsize = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % gsize
    pid_n = (pid % width) // gsize
    m = pid_m * BM + tl.arange(0, BM)
    n = pid_n * BN + tl.arange(0, BN)
    kk = tl.arange(0, BK)
    mmask = m < M
    nmask = n < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        acc = _dot_tile(acc, x_ptr, qw_ptr, s_ptr, m_ptr, m, n, k0 + kk, k0, sxm, KW, G, mmask, nmask,
                        BITS, GS, BN, BK, SF)
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=nmask, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + m[:, None] * sym + n[None, :], acc.to(tl.float16), mask=mmask[:, None] & nmask[None, :])


@triton.jit
def _splitk_kernel(x_ptr, qw_ptr, s_ptr, m_ptr, p_ptr, M, N, K, KW, G, sxm, KB,
                   BITS: tl.constexpr, GS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   SF: tl.constexpr = 0):
    # part[s, m, n] (fp32) = x[m, ks] @ W[n, ks].T over split s's K range ks = [s KB BK, (s + 1) KB BK) ∩ [0, K).
    # Grid (N tiles, splits, M tiles): at small M the weight read is the cost, so the grid spreads it over K too.
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_m = tl.program_id(2)
    m = pid_m * BM + tl.arange(0, BM)
    n = pid_n * BN + tl.arange(0, BN)
    kk = tl.arange(0, BK)
    mmask = m < M
    nmask = n < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for i in range(0, KB):  # the last split may run past K: those blocks load zeros (x and W masked)
        k0 = (pid_s * KB + i) * BK
        live = k0 < K
        acc = _dot_tile(acc, x_ptr, qw_ptr, s_ptr, m_ptr, m, n, k0 + kk, k0, sxm, KW, G, mmask & live, nmask & live,
                        BITS, GS, BN, BK, SF)
    tl.store(p_ptr + (pid_s * M + m[:, None]) * N + n[None, :], acc, mask=mmask[:, None] & nmask[None, :])


@triton.jit
def _splitk_reduce(p_ptr, b_ptr, y_ptr, M, N, S, sym, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    # y[m, n] = fp16(sum_s part[s, m, n] (+ bias[n])), the splits summed in order (deterministic)
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < M * N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(0, S):
        acc += tl.load(p_ptr + s * M * N + idx, mask=mask, other=0.0)
    n = idx % N
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + (idx // N) * sym + n, acc.to(tl.float16), mask=mask)


def fused_splitk(x: torch.Tensor, w, part: torch.Tensor, out: torch.Tensor | None = None, sms: int | None = None,
                 cfg: dict | None = None) -> torch.Tensor:
    """x fp16 [M, K] (row-contiguous) -> fp16 [M, N]: W4/W3/W8 (any group) dequantized in registers, K split over
    the grid (fp32 partials in `part`, a flat float32 buffer, then summed in order with the bias). Reads every
    weight once per 64 tokens: for short prompts this is the weight-read-bound kernel the dequant + cuBLAS path is
    not (that one writes and reads W as fp16)."""
    M, K = x.shape
    assert K == w.K and x.stride(1) == 1 and part.dtype == torch.float32
    c = dict(splitk_tiles(w.bits) if cfg is None else cfg)
    sms = sms or torch.cuda.get_device_properties(x.device).multi_processor_count
    BM, S, KB = splitk_plan(M, w.N, K, sms, part.numel(), c)
    BK = c["BK"] if K % c["BK"] == 0 else 32
    y = torch.empty(M, w.N, dtype=torch.float16, device=x.device) if out is None else out
    grid = (triton.cdiv(w.N, c["BN"]), S, triton.cdiv(M, BM))
    _splitk_kernel[grid](x, w.qweight, w.scales, w.mins, part, M, w.N, K, w.qweight.shape[1], K // w.group,
                         x.stride(0), KB, BITS=w.bits, GS=w.group, BM=BM, BN=c["BN"], BK=BK, SF=scale_form(w),
                         num_warps=c["num_warps"], num_stages=c["num_stages"])
    bias = w.bias if w.bias is not None else w.scales  # a dummy pointer when there is no bias (never read)
    BLOCK = 1024
    _splitk_reduce[(triton.cdiv(M * w.N, BLOCK),)](part, bias, y, M, w.N, S, y.stride(0),
                                                    HAS_BIAS=w.bias is not None, BLOCK=BLOCK, num_warps=4)
    return y


SMALL_M_OVERRIDE: dict | None = None  # the benchmark sets this to try tile shapes for M <= 64


def fused_config(M: int) -> dict:
    """Tile shape by token count: small M is weight-read-bound (many narrow N tiles), large M compute-bound."""
    if M <= 64 and SMALL_M_OVERRIDE is not None:
        return dict(SMALL_M_OVERRIDE, BM=16 if M <= 16 else (32 if M <= 32 else 64))
    if M <= 16:
        return dict(BM=16, BN=32, BK=128, GROUP_M=1, num_warps=4, num_stages=3)
    if M <= 64:
        return dict(BM=64 if M > 32 else 32, BN=32, BK=128, GROUP_M=1, num_warps=4, num_stages=3)
    if M <= 256:
        return dict(BM=64, BN=128, BK=64, GROUP_M=8, num_warps=4, num_stages=3)
    return dict(BM=128, BN=128, BK=64, GROUP_M=8, num_warps=8, num_stages=3)


def fused_linear(x: torch.Tensor, w, out: torch.Tensor | None = None, cfg: dict | None = None) -> torch.Tensor:
    """x fp16 [M, K] (row-contiguous) -> fp16 [M, N] with W4/W3/W8 (any group) dequantized in the GEMM."""
    M, K = x.shape
    assert K == w.K and x.stride(1) == 1
    y = torch.empty(M, w.N, dtype=torch.float16, device=x.device) if out is None else out
    c = dict(fused_config(M) if cfg is None else cfg)
    BM, BN = c["BM"], c["BN"]
    grid = (triton.cdiv(M, BM) * triton.cdiv(w.N, BN),)
    if K % c["BK"]:  # K is a multiple of 32 in every layout (kernels/pack.py)
        c["BK"] = 32
    bias = w.bias if w.bias is not None else w.scales
    _fused_kernel[grid](x, w.qweight, w.scales, w.mins, bias, y, M, w.N, K, w.qweight.shape[1], K // w.group,
                        x.stride(0), y.stride(0), BITS=w.bits, GS=w.group, HAS_BIAS=w.bias is not None,
                        SF=scale_form(w), **c)
    return y
