"""Triton kernels for a prompt chunk at an offset inside a CUDA graph: the start position p0 and the cache slot
are read from a device tensor `at` = int32 [p0, slot] on every replay, not baked in at capture. One graph per
length bucket then serves any cached prefix length and any slot (engine/model/gpu_prefill_graph.py).

  rope_qkv_to_slot(qkv, cos, sin, at, kc, vc, H, Hkv)
        kernels/prefill_elementwise.py rope_qkv_to_cache with p0 and the slot from `at`: rotates q and k (neox
        halves) at positions p0 + t, writes k, v into rows p0.. of the slot; returns rotated q [T, H, hd]
  attention_at(q, kc, vc, at)
        causal GQA of the chunk over the slot's rows: query t (position p0 + t) sees rows 0..p0+t, i.e. the
        cached prefix and the chunk up to itself. Flash-style: one program per (block of BM queries, head)
        streams rows 0..p0+min(T, end of its block) in blocks of BN (a loop bound read on the device), online
        softmax in fp32, p in fp16 for the p @ v product (as flash attention does).
References: kernels/prefill_offset_reference.py (rope_to_slot_ref, attention_at_ref).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.prefill_elementwise import rope_head


@triton.jit
def _rope_slot_kernel(qkv_ptr, cos_ptr, sin_ptr, q_ptr, kc_ptr, vc_ptr, at_ptr, ld_qkv, slot_stride, cache_hs,
                      H: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr):
    # one program per (token t, head j): kernels/prefill_elementwise.py rope_head at p0 + t, into the slot's rows
    t = tl.program_id(0)
    j = tl.program_id(1)
    p0 = tl.load(at_ptr)
    slot = tl.load(at_ptr + 1).to(tl.int64)
    rope_head(qkv_ptr, cos_ptr, sin_ptr, q_ptr, kc_ptr + slot * slot_stride, vc_ptr + slot * slot_stride, t, j,
              p0 + t, ld_qkv, cache_hs, H, HKV, HD)


def rope_qkv_to_slot(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, at: torch.Tensor,
                     kc: torch.Tensor, vc: torch.Tensor, H: int, Hkv: int) -> torch.Tensor:
    """qkv fp16 [T, (H+2Hkv)*hd] (q|k|v); cos/sin fp32 [max_pos, hd/2]; at int32 [2] = (p0, slot) on the
    device; kc/vc one layer's cache fp16 [slots, Hkv, ctx, hd] (contiguous). The caller keeps p0 + T <= ctx.
    Returns rotated q fp16 [T, H, hd]."""
    T = qkv.shape[0]
    hd = kc.shape[-1]
    q = torch.empty(T, H, hd, dtype=torch.float16, device=qkv.device)
    _rope_slot_kernel[(T, H + 2 * Hkv)](qkv, cos, sin, q, kc, vc, at, qkv.stride(0), kc.stride(0), kc.stride(1),
                                        H=H, HKV=Hkv, HD=hd, num_warps=1)
    return q


@triton.jit
def _attn_at_kernel(q_ptr, kc_ptr, vc_ptr, o_ptr, at_ptr, T, slot_stride, cache_hs, sm_scale,
                    H: tl.constexpr, REP: tl.constexpr, HD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    mb = tl.program_id(0)
    h = tl.program_id(1)
    p0 = tl.load(at_ptr)
    slot = tl.load(at_ptr + 1).to(tl.int64)
    offs_m = mb * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, HD)
    qmask = offs_m < T
    q = tl.load(q_ptr + (offs_m[:, None] * H + h) * HD + offs_d[None, :], mask=qmask[:, None], other=0.0)
    base = slot * slot_stride + (h // REP) * cache_hs
    qpos = p0 + offs_m
    hi = p0 + tl.minimum((mb + 1) * BM, T)  # rows 0..hi-1: the prefix and the chunk up to this block's end
    m_i = tl.full([BM], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    acc = tl.zeros([BM, HD], dtype=tl.float32)
    for start in range(0, hi, BN):
        offs_n = start + tl.arange(0, BN)
        nmask = offs_n < hi
        k = tl.load(kc_ptr + base + offs_n[:, None] * HD + offs_d[None, :], mask=nmask[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale  # [BM, BN] fp32
        s = tl.where(offs_n[None, :] <= qpos[:, None], s, float("-inf"))  # row 0 always passes: m_i finite
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(vc_ptr + base + offs_n[:, None] * HD + offs_d[None, :], mask=nmask[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + offs_m[:, None] * (H * HD) + h * HD + offs_d[None, :], out.to(tl.float16), mask=qmask[:, None])


def attention_at(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """q fp16 [T, H, hd] contiguous (roped) at positions p0..; kc/vc one layer's cache fp16 [slots, Hkv, ctx, hd];
    at int32 [2] = (p0, slot) -> fp16 [T, H * hd]."""
    T, H, hd = q.shape
    Hkv = kc.shape[1]
    out = torch.empty(T, H * hd, dtype=torch.float16, device=q.device)
    BM = 16 if T <= 16 else (32 if T <= 32 else 64)
    _attn_at_kernel[(triton.cdiv(T, BM), H)](q, kc, vc, out, at, T, kc.stride(0), kc.stride(1), hd ** -0.5,
                                             H=H, REP=H // Hkv, HD=hd, BM=BM, BN=64, num_warps=4)
    return out
