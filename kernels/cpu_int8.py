"""The CPU path's fast linears (EngineConfig.cpu_weights "int8"): int8 weights, one scale per output row, through
torch's int8 weight-only CPU kernel (aten._weight_int8pack_mm: bf16 activations, the int8 weights widened in
registers, fp32 accumulation, a bf16 result), beside its reference.

    w8 [N, K] int8 = round(w / s) clamped to +-127,  s [N] = max |w[n, :]| / 127         (symmetric, per row)
    y [M, N] = bf16( bf16(x) @ (w8 * bf16(s)).T ) (+ bias fp32)                         (int8_linear_ref)

Why: the float32 reference reads 4 bytes a weight per decode token, the kernel 1 (the 0.5B's 2 GB per token
become 0.5 GB), and it keeps a decode row's bits whatever the rows around it (each output row of the kernel is
independent of the batch: tests/test_cpu_int8.py), so prompt lookup, draft heads and the prefix cache keep giving
the tokens they give without them. The rounding of the activations and results to bf16 (8 bits of mantissa) is
the price: docs/results/cpu_int8_quality_0.5b.json measures it against the float32 path.
"""
from __future__ import annotations

import torch
from torch import nn

_OP = getattr(torch.ops.aten, "_weight_int8pack_mm", None)


def quantize_rows(w: torch.Tensor, rows: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] float -> (w8 int8 [N, K], scales float32 [N]): symmetric round-to-nearest per output row, `rows` rows
    at a time (the float32 temporaries stay in cache, and a 151936-row head adds no full-size copy to the load's
    peak)."""
    N, K = w.shape
    w8 = torch.empty(N, K, dtype=torch.int8)
    s = torch.empty(N, dtype=torch.float32)
    for r in range(0, N, rows):
        wf = w[r:r + rows].float()
        sc = (wf.abs().amax(1) / 127).clamp_min(torch.finfo(torch.float32).tiny)
        w8[r:r + rows] = (wf / sc[:, None]).round_().clamp_(-127, 127)  # a new tensor: w itself is never written
        s[r:r + rows] = sc
    return w8, s


def int8_linear_ref(x: torch.Tensor, w8: torch.Tensor, s: torch.Tensor, b: torch.Tensor | None = None) \
        -> torch.Tensor:
    """What the kernel computes, in float64: bf16 activations times the int8 weights scaled by bf16 scales, the sum
    rounded to bf16 (then the bias in float32)."""
    y = x.bfloat16().double() @ (w8.double() * s.bfloat16().double()[:, None]).T
    y = y.bfloat16().float()
    return y if b is None else y + b.float()


class Int8Linear(nn.Module):
    """Drop-in for kernels.ops_reference.Linear on the CPU (called on x [..., K] -> float32 [..., N])."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        w8, s = quantize_rows(weight)
        self.register_buffer("w8", w8)
        self.register_buffer("scales", s)  # float32 (the reference's); the kernel takes them in bf16
        self.register_buffer("scales_bf16", s.bfloat16())
        # a float32 bias is kept as the same tensor (a streamed load may write it after this module exists)
        self.register_buffer("bias", None if bias is None else bias.data if bias.dtype == torch.float32 else
                             bias.float())

    @classmethod
    def rows_of(cls, src: "Int8Linear", rows: torch.Tensor) -> "Int8Linear":
        """A copy of src restricted to output rows (int64 ids): the same int8 codes and scales, so each kept row
        computes the bits src's row computes (a draft vocabulary's lm_head, engine/runtime/draft_heads.py)."""
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.out_features, self.in_features = len(rows), src.in_features
        pick = lambda t: None if t is None else t.index_select(0, rows).contiguous()  # noqa: E731
        self.register_buffer("w8", pick(src.w8))
        self.register_buffer("scales", pick(src.scales))
        self.register_buffer("scales_bf16", pick(src.scales_bf16))
        self.register_buffer("bias", pick(src.bias))
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead, K = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, K).bfloat16().contiguous()
        if _OP is not None:
            y = _OP(x2, self.w8, self.scales_bf16).float()
        else:  # a torch without the kernel: the same numbers, slowly
            y = int8_linear_ref(x2, self.w8, self.scales_bf16)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)

    @property
    def weight(self) -> torch.Tensor:
        """The weights it computes with, float32 [N, K] (made on each call: for the rare reader of a head's rows)."""
        return self.w8.float() * self.scales_bf16.float()[:, None]

    def nbytes(self) -> int:
        return self.w8.numel() + self.scales.numel() * 6 + (0 if self.bias is None else self.bias.numel() * 4)


def available() -> bool:
    """Whether this torch has the int8 weight-only CPU kernel (torch >= 2.4); without it Int8Linear computes the
    reference (correct, not fast)."""
    return _OP is not None
