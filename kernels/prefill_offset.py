"""Triton kernels for a prompt chunk at an offset inside a CUDA graph: the start position p0 and the cache slot
are read from a device tensor `at` = int32 [p0, slot] on every replay, not baked in at capture. One graph per
length bucket then serves any cached prefix length and any slot (engine/model/gpu_prefill_graph.py).

  rope_qkv_to_slot(qkv, cos, sin, at, kc, vc, H, Hkv)
        kernels/prefill_elementwise.py rope_qkv_to_cache with p0 and the slot from `at`: rotates q and k (neox
        halves) at positions p0 + t, writes k, v into rows p0.. of the slot; returns rotated q [T, H, hd]
  attention_at(q, kc, vc, at)
        causal GQA of the chunk over the slot's rows: query t (position p0 + t) sees rows 0..p0+t, i.e. the
        cached prefix and the chunk up to itself. Flash-style: one program per (block of BM queries, head, key
        split) streams its share of rows 0..p0+min(T, end of its block) in blocks of BN (bounds read on the
        device), online softmax in fp32, p in fp16 for the p @ v product (as flash attention does); with
        several splits a merge kernel combines them (flash-decoding), so a short chunk after a long prefix
        fills the GPU.
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
def _attn_at_kernel(q_ptr, kc_ptr, vc_ptr, o_ptr, po_ptr, pml_ptr, at_ptr, T, slot_stride, cache_hs, sm_scale,
                    H: tl.constexpr, REP: tl.constexpr, HD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                    S: tl.constexpr):
    # program (block of BM queries mb, head h, key split s): rows [lo, end) of the rows 0..hi-1 it may see
    mb = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    p0 = tl.load(at_ptr)
    slot = tl.load(at_ptr + 1).to(tl.int64)
    offs_m = mb * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, HD)
    qmask = offs_m < T
    q = tl.load(q_ptr + (offs_m[:, None] * H + h) * HD + offs_d[None, :], mask=qmask[:, None], other=0.0)
    base = slot * slot_stride + (h // REP) * cache_hs
    qpos = p0 + offs_m
    hi = p0 + tl.minimum((mb + 1) * BM, T)  # rows 0..hi-1: the prefix and the chunk up to this block's end
    per = tl.cdiv(tl.cdiv(hi, BN), S) * BN  # rows per split, whole blocks of BN
    lo = s * per
    end = tl.minimum(hi, lo + per)
    m_i = tl.full([BM], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    acc = tl.zeros([BM, HD], dtype=tl.float32)
    for start in range(lo, end, BN):
        offs_n = start + tl.arange(0, BN)
        nmask = offs_n < end
        k = tl.load(kc_ptr + base + offs_n[:, None] * HD + offs_d[None, :], mask=nmask[:, None], other=0.0)
        sc = tl.dot(q, tl.trans(k)) * sm_scale  # [BM, BN] fp32
        sc = tl.where((offs_n[None, :] <= qpos[:, None]) & nmask[None, :], sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, 1))
        # a split past a query's position sees no row of it: keep m = -inf there without exp(-inf - -inf)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(sc - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(vc_ptr + base + offs_n[:, None] * HD + offs_d[None, :], mask=nmask[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        m_i = m_new
    if S == 1:  # split 0 holds row 0, which every query sees: l_i > 0
        out = acc / l_i[:, None]
        tl.store(o_ptr + offs_m[:, None] * (H * HD) + h * HD + offs_d[None, :], out.to(tl.float16),
                 mask=qmask[:, None])
    else:  # partials: po fp32 [S, T, H, HD], pml fp32 [S, T, H, 2] (max, sum)
        row = (s * T + offs_m) * H + h
        tl.store(po_ptr + row[:, None] * HD + offs_d[None, :], acc, mask=qmask[:, None])
        tl.store(pml_ptr + row * 2, m_i, mask=qmask)
        tl.store(pml_ptr + row * 2 + 1, l_i, mask=qmask)


@triton.jit
def _attn_at_merge(o_ptr, po_ptr, pml_ptr, T, H: tl.constexpr, HD: tl.constexpr, S: tl.constexpr):
    # program (query t, head h): out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s
    t = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, S)
    offs_d = tl.arange(0, HD)
    row = (offs_s * T + t) * H + h
    m = tl.load(pml_ptr + row * 2)
    l = tl.load(pml_ptr + row * 2 + 1)
    M = tl.max(m, 0)  # finite: split 0 holds row 0
    w = tl.exp(m - M)  # 0 for a split that saw nothing (m = -inf)
    acc = tl.load(po_ptr + row[:, None] * HD + offs_d[None, :])
    out = tl.sum(acc * w[:, None], 0) / tl.sum(l * w, 0)
    tl.store(o_ptr + t * (H * HD) + h * HD + offs_d, out.to(tl.float16))


def attn_splits(programs: int, sms: int) -> int:
    """Key splits so that a short chunk over a long cached prefix still fills the GPU: the largest power of two
    <= sms / programs, at most 16 (a 16-token chunk has 16 programs: one per head; without splits each streamed
    the whole prefix alone, ~100 us per layer behind a 2,000-token history on the H200)."""
    s = 1
    while s < 16 and programs * s * 2 <= sms:
        s *= 2
    return s


def attention_at(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, at: torch.Tensor,
                 splits: int | None = None) -> torch.Tensor:
    """q fp16 [T, H, hd] contiguous (roped) at positions p0..; kc/vc one layer's cache fp16 [slots, Hkv, ctx, hd];
    at int32 [2] = (p0, slot) -> fp16 [T, H * hd]. splits: key splits (None: attn_splits for this GPU); with
    more than one, a merge kernel combines the splits' (max, sum, acc) partials (flash-decoding)."""
    T, H, hd = q.shape
    Hkv = kc.shape[1]
    out = torch.empty(T, H * hd, dtype=torch.float16, device=q.device)
    BM = 16 if T <= 16 else (32 if T <= 32 else 64)
    mblocks = triton.cdiv(T, BM)
    if splits is None:
        splits = attn_splits(mblocks * H, torch.cuda.get_device_properties(q.device).multi_processor_count
                             if q.is_cuda else 132)
    # partials for the merge; with one split the kernel writes `out` directly and never touches these
    po = torch.empty(splits, T, H, hd, dtype=torch.float32, device=q.device) if splits > 1 else out
    pml = torch.empty(splits, T, H, 2, dtype=torch.float32, device=q.device) if splits > 1 else out
    _attn_at_kernel[(mblocks, H, splits)](q, kc, vc, out, po, pml, at, T, kc.stride(0), kc.stride(1), hd ** -0.5,
                                          H=H, REP=H // Hkv, HD=hd, BM=BM, BN=64, S=splits, num_warps=4)
    if splits > 1:
        _attn_at_merge[(T, H)](out, po, pml, T, H=H, HD=hd, S=splits, num_warps=1)
    return out
