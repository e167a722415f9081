"""PyTorch references of kernels/prefill_offset.py: a prompt chunk whose start position and cache slot are
read from a device tensor `at` = int32 [p0, slot] (not baked into a CUDA graph at capture).

Both use device-side indexing only (index_select / index_copy_ with index tensors built on the device), so
they are also capturable; on the CPU they are the offset prefill graphs' static program (tests).
  rope_to_slot_ref   rotate q and k (neox halves) at positions p0.., write k, v into rows p0.. of the slot
  attention_at_ref   causal GQA of the chunk's queries over rows 0..p0+t of the slot (the whole static cache
                     with a mask: a reference, not fast)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.ops_reference import rope


def slot_rows(at: torch.Tensor, T: int, Hkv: int, ctx: int) -> torch.Tensor:
    """Flat row indices [Hkv * T] of (slot, head h, position p0 + t) in a layer's cache viewed as [-1, hd]."""
    dev = at.device
    pos = at[0].long() + torch.arange(T, device=dev)  # [T]
    head = (at[1].long() * Hkv + torch.arange(Hkv, device=dev)) * ctx  # [Hkv]
    return (head[:, None] + pos[None, :]).reshape(-1)


def rope_to_slot_ref(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, at: torch.Tensor,
                     kc: torch.Tensor, vc: torch.Tensor, H: int, Hkv: int) -> torch.Tensor:
    """qkv fp16 [T, (H + 2 Hkv) hd] (q|k|v); cos/sin fp32 [max_pos, hd/2]; at int32 [2] = (p0, slot);
    kc/vc one layer's cache [slots, Hkv, ctx, hd]: rows p0..p0+T-1 of the slot receive rope(k) and v.
    Returns rope(q) fp16 [T, H, hd] (as kernels.prefill_elementwise.rope_qkv_to_cache, at a device p0)."""
    T, hd, ctx = qkv.shape[0], kc.shape[-1], kc.shape[2]
    q, k, v = qkv.split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
    pos = at[0].long() + torch.arange(T, device=qkv.device)
    c, s = cos.index_select(0, pos).unsqueeze(1), sin.index_select(0, pos).unsqueeze(1)  # [T, 1, hd/2]
    rows = slot_rows(at, T, Hkv, ctx)
    kr = rope(k.reshape(T, Hkv, hd), c, s).to(kc.dtype).transpose(0, 1).reshape(Hkv * T, hd)
    kc.view(-1, hd).index_copy_(0, rows, kr)
    vc.view(-1, hd).index_copy_(0, rows, v.reshape(T, Hkv, hd).transpose(0, 1).reshape(Hkv * T, hd).to(vc.dtype))
    return rope(q.reshape(T, H, hd), c, s).half()


def attention_at_ref(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """q fp16 [T, H, hd] (roped) at positions p0..; query t sees rows 0..p0+t of the slot at[1] of kc/vc
    [slots, Hkv, ctx, hd] -> fp16 [T, H * hd]. float32 math (the CPU path)."""
    T, H, hd = q.shape
    Hkv, ctx = kc.shape[1], kc.shape[2]
    rep = H // Hkv
    slot = at[1:2].long()
    k = kc.index_select(0, slot)[0].float().repeat_interleave(rep, 0)  # [H, ctx, hd]
    v = vc.index_select(0, slot)[0].float().repeat_interleave(rep, 0)
    qpos = at[0].long() + torch.arange(T, device=q.device)
    mask = torch.arange(ctx, device=q.device)[None, :] <= qpos[:, None]  # [T, ctx] True = may attend
    out = F.scaled_dot_product_attention(q.float().transpose(0, 1)[None], k[None], v[None], attn_mask=mask)
    return out[0].transpose(0, 1).reshape(T, H * hd).half()
