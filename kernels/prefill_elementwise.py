"""Triton kernels for the non-GEMM work of a prefill layer (one launch each instead of 5-12 torch ops).

At 48 tokens the 3B forward spent about 3.6 ms of 8.2 ms in ~40 small torch kernels per layer
(rmsnorm in fp32, neox rope, cache writes, silu*mul); these three replace them:
  add_rmsnorm(h, delta, w, eps)        h += delta (in place, if delta given); returns rmsnorm(h) * w
                                       (h fp16 as in the benchmark, or fp32 as in engine/model/gpu_model.py)
  rope_qkv_to_cache(qkv, cos, sin, q_start, k_cache, v_cache, H, Hkv)
                                       rotates q and k (neox halves), writes k, v into the cache at
                                       positions q_start.., returns rotated q [T, H, hd]
  silu_mul(gu)                         gu [T, 2F] -> silu(gu[:, :F]) * gu[:, F:]
References: kernels/ops_reference.py RMSNorm, Rotary.apply, silu_and_mul (checked in prefill_bench.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rmsnorm_kernel(h_ptr, d_ptr, w_ptr, y_ptr, D, eps, HAS_DELTA: tl.constexpr, RESID_F16: tl.constexpr,
                        BLOCK: tl.constexpr):
    row = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    mask = c < D
    x = tl.load(h_ptr + row * D + c, mask=mask, other=0.0).to(tl.float32)
    if HAS_DELTA:
        x = x + tl.load(d_ptr + row * D + c, mask=mask, other=0.0).to(tl.float32)
        if RESID_F16:
            x = x.to(tl.float16).to(tl.float32)  # an fp16 residual stream rounds here, as torch would
        tl.store(h_ptr + row * D + c, x.to(h_ptr.dtype.element_ty), mask=mask)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    w = tl.load(w_ptr + c, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * D + c, (x * r * w).to(tl.float16), mask=mask)


def add_rmsnorm(h: torch.Tensor, delta: torch.Tensor | None, w: torch.Tensor, eps: float) -> torch.Tensor:
    """h fp16 or fp32 [T, D] contiguous (the residual stream, updated in place when delta is given;
    delta fp16 [T, D] contiguous) -> rmsnorm(h) * w fp16 [T, D]. w fp16 or fp32 [D]."""
    T, D = h.shape
    y = torch.empty(T, D, dtype=torch.float16, device=h.device)
    _add_rmsnorm_kernel[(T,)](h, delta if delta is not None else h, w, y, D, float(eps),
                              HAS_DELTA=delta is not None, RESID_F16=h.dtype == torch.float16,
                              BLOCK=triton.next_power_of_2(D), num_warps=4)
    return y


@triton.jit
def rope_head(qkv_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, t, j, pos, ld_qkv, cache_hs,
              H: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr):
    """Head j of token t at position pos: j < H -> rotated q into q_ptr [T, H, HD]; j < H+HKV -> rotated k into
    row pos of k_ptr [HKV, ctx, HD] (one layer's cache of one slot); else v into v_ptr the same way. Shared by
    _rope_kernel and kernels/prefill_offset.py (where pos and the slot come from the device)."""
    half = tl.arange(0, HD // 2)
    src = qkv_ptr + t * ld_qkv + j * HD
    x1 = tl.load(src + half).to(tl.float32)
    x2 = tl.load(src + HD // 2 + half).to(tl.float32)
    if j < H + HKV:
        c = tl.load(cos_ptr + pos * (HD // 2) + half)
        s = tl.load(sin_ptr + pos * (HD // 2) + half)
        y1 = (x1 * c - x2 * s).to(tl.float16)
        y2 = (x2 * c + x1 * s).to(tl.float16)
        if j < H:
            dst = q_ptr + (t * H + j) * HD
        else:
            dst = k_ptr + (j - H) * cache_hs + pos * HD
        tl.store(dst + half, y1)
        tl.store(dst + HD // 2 + half, y2)
    else:
        dst = v_ptr + (j - H - HKV) * cache_hs + pos * HD
        tl.store(dst + half, x1.to(tl.float16))
        tl.store(dst + HD // 2 + half, x2.to(tl.float16))


@triton.jit
def _rope_kernel(qkv_ptr, cos_ptr, sin_ptr, q_ptr, kc_ptr, vc_ptr, q_start, ld_qkv, cache_hs,
                 H: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr):
    # one program per (token t, head j): j < H -> q head, j < H+HKV -> k head, else v head
    t = tl.program_id(0)
    j = tl.program_id(1)
    rope_head(qkv_ptr, cos_ptr, sin_ptr, q_ptr, kc_ptr, vc_ptr, t, j, q_start + t, ld_qkv, cache_hs, H, HKV, HD)


def rope_qkv_to_cache(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_start: int,
                      k_cache: torch.Tensor, v_cache: torch.Tensor, H: int, Hkv: int) -> torch.Tensor:
    """qkv fp16 [T, (H+2Hkv)*hd] (q|k|v); cos/sin fp32 [max_pos, hd/2]; k_cache/v_cache fp16
    [Hkv, max_ctx, hd] (one layer, contiguous). Returns rotated q fp16 [T, H, hd]."""
    T = qkv.shape[0]
    hd = k_cache.shape[-1]
    q = torch.empty(T, H, hd, dtype=torch.float16, device=qkv.device)
    _rope_kernel[(T, H + 2 * Hkv)](qkv, cos, sin, q, k_cache, v_cache, q_start, qkv.stride(0),
                                   k_cache.stride(0), H=H, HKV=Hkv, HD=hd, num_warps=1)
    return q


@triton.jit
def _silu_mul_kernel(gu_ptr, y_ptr, F, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = c < F
    g = tl.load(gu_ptr + t * 2 * F + c, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + t * 2 * F + F + c, mask=mask, other=0.0).to(tl.float32)
    y = (g / (1.0 + tl.exp(-g))).to(tl.float16).to(tl.float32) * u  # round silu like torch's fp16 op
    tl.store(y_ptr + t * F + c, y.to(tl.float16), mask=mask)


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """gu fp16 [T, 2F] contiguous -> fp16 [T, F]."""
    T, F2 = gu.shape
    F = F2 // 2
    y = torch.empty(T, F, dtype=torch.float16, device=gu.device)
    BLOCK = 1024
    _silu_mul_kernel[(T, triton.cdiv(F, BLOCK))](gu, y, F, BLOCK=BLOCK, num_warps=4)
    return y
