"""GPU-resident weights of one linear layer (shared by the decode runner and the prefill path).

A quantized linear follows kernels/pack.py: qweight int32, scales/mins fp16 [N, K / group] with
(bits, group) one of pack.LAYOUTS: (4, 128), (3, 128) our quantizer; (4, 32), (8, 32), (8, 16) exact GGUF repacks.
A dense one (bits == 16) holds weight fp16 [N, K]. bias fp16 [N] or None. N = out, K = in. In form "kq" the scales
are the GGUF's integer sub-scales and super-block factors (kernels/pack.py KQ), in form "sym" no mins are stored
(SYM); fp16_scales gives the plain ones.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class QWeight:
    N: int
    K: int
    bits: int  # 4 | 3 | 8 | 16
    qweight: torch.Tensor | None = None  # int32 [N, packed_words(K, bits)]
    scales: torch.Tensor | None = None  # fp16 [N, K // group]
    mins: torch.Tensor | None = None  # fp16 [N, K // group]
    weight: torch.Tensor | None = None  # fp16 [N, K] when bits == 16
    bias: torch.Tensor | None = None  # fp16 [N]
    group: int = 128  # weights per scale/min along K (ignored when bits == 16)
    # the scales' form (kernels/pack.py): "" fp16 scale and min per group; "kq" the K-quants' own scales ((4, 32) /
    # (6, 32) from Q4_K / Q5_K, (6, 16) from Q6_K: scales holds the integer sub-scales (uint8 [N, K/32, 2] | int8
    # [N, K/16]) and mins the fp16 factors per 256); "sym" the symmetric 32-blocks' own structure ((4, 32) / (6, 32) /
    # (8, 32) from Q4_0 / Q5_0 / Q8_0: scales fp16 [N, K/32], mins fp16 [N, 0]: min = -2^(bits-1) x scale, made where
    # read). Spelt as the layout tuples of engine/formats/gguf_layout.py spell it.
    form: str = ""

    def __post_init__(self):
        if self.form not in ("", "kq", "sym"):
            raise ValueError(f"unknown scale form {self.form!r}")

    @property
    def kq(self) -> bool:
        return self.form == "kq"

    @property
    def sym(self) -> bool:
        return self.form == "sym"

    def fp16_scales(self, rows: slice | torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(scales, mins) fp16 [N or rows, K / group], whatever the form (KQ / SYM made exactly)."""
        sc, mn = (self.scales, self.mins) if rows is None else (self.scales[rows], self.mins[rows])
        if self.sym:
            from kernels.pack import sym_mins
            return sc, sym_mins(self.bits, sc)
        if not self.kq:
            return sc, mn
        from kernels.pack import kq_expand
        return kq_expand(self.group, sc, mn)

    @property
    def kind(self) -> str:
        """'dense' (fp16 weight) or 'packed' (W4/W3/W8 codes): the key each ops table dispatches a linear on."""
        return "dense" if self.bits == 16 else "packed"

    def nbytes(self) -> int:
        ts = [self.qweight, self.scales, self.mins, self.weight, self.bias]
        return sum(t.numel() * t.element_size() for t in ts if t is not None)
