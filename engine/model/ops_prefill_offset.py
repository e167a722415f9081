"""The prefill ops (engine/model/ops_prefill.py PrefillOps) for a chunk whose start position and slot are device
values: `at` = int32 [p0, slot] on the model's device, refreshed before each replay of an offset prefill graph
(engine/model/gpu_prefill_graph.py). Everything but attention is PrefillOps' own (it does not depend on p0);
attention ropes q/k at p0 + t, writes k/v into rows p0.. of the slot and attends over rows 0..p0+t:
  "triton"  kernels/prefill_offset.py (rope_qkv_to_slot, attention_at)
  "torch"   kernels/prefill_offset_reference.py (the CPU path and the reference)
"""
from __future__ import annotations

from engine.model.ops_prefill import PrefillOps
from kernels.prefill_offset_reference import attention_at_ref, rope_to_slot_ref


def offset_kernels(kind: str):
    """(rope_to_slot, attend_at) of the "triton" or "torch" set."""
    if kind == "torch":
        return rope_to_slot_ref, attention_at_ref
    from kernels.prefill_offset import attention_at, rope_qkv_to_slot  # Triton: GPU only
    return rope_qkv_to_slot, attention_at


class OffsetPrefillOps(PrefillOps):
    """PrefillOps over toks int32 [T] (device) at positions at[0].. of slot at[1]; kc/vc the model's caches
    [layers, slots, Hkv, ctx, hd]. The caller keeps at[0] + T <= ctx."""

    def __init__(self, cfg, cos, sin, embed, toks, T: int, at, kc, vc, last, linear, kind: str = "triton"):
        super().__init__(cfg, cos, sin, embed, toks, T, 0, None, last, linear, None, kind)
        self.at, self.kc, self.vc = at, kc, vc
        self._rope_at, self._attend_at = offset_kernels(kind)

    def attention(self, i: int, qkv):
        c = self.cfg
        q = self._rope_at(qkv, self.cos, self.sin, self.at, self.kc[i], self.vc[i], c.num_heads, c.num_kv_heads)
        return self._attend_at(q, self.kc[i], self.vc[i], self.at)
