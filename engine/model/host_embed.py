"""The input embedding kept in host RAM (7B on a 4 GB card).

An untied model (Qwen2.5 7B) carries two vocab x hidden matrices: the embedding, read one row per token,
and the lm_head, read whole every step. Only the lm_head needs GPU bandwidth; moving the embedding to
host RAM frees its bytes (276 MiB packed 4-bit for 7B; docs/results/quant_budget.json: 7B `mixed` needs
3.23 GiB then, which fits a 4 GB card). Each step dequantizes its B rows on the CPU (kernels/pack.py
layout, same fp32 math as the embed_rows kernel) into a pinned staging buffer; GPUModel copies them to
the device and its first kernel (copy_rows) moves them into the residual stream.
"""
from __future__ import annotations

import torch

from kernels.decode_reference import dense_weight
from kernels.qweight import QWeight


class HostEmbedding:
    """Rows of a CPU QWeight (packed 4/3-bit or fp16) as float32, the same values as embed_rows."""

    def __init__(self, w: QWeight):
        self.w = QWeight(w.N, w.K, w.bits, group=w.group, form=w.form,
                         **{k: None if getattr(w, k) is None else getattr(w, k).detach().cpu().clone()
                            for k in ("qweight", "scales", "mins", "weight", "bias")})  # out of the mmap

    def nbytes(self) -> int:
        return self.w.nbytes()

    def rows(self, ids: list[int], out: torch.Tensor | None = None) -> torch.Tensor:
        """float32 [len(ids), hidden] (written into out[:len(ids)] when given)."""
        r = dense_weight(self.w, torch.tensor(ids, dtype=torch.long))  # the embedding's reference rows (embed_ref)
        if out is None:
            return r
        out[:len(ids)] = r
        return out[:len(ids)]
