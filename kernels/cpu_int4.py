"""The CPU path's 4-bit linears (EngineConfig.cpu_weights "int4"): a model file's own 4-bit codes (GGUF Q4_K, Q4_0,
Q4_1) kept as they are, through torch's int4 weight-only CPU kernel (aten._weight_int4pack_mm_for_cpu: bf16
activations, the codes widened in registers, fp32 accumulation, a bf16 result), beside its reference.

    file:   w = q * a + c             per group of 32 weights, q 0..15 (engine/formats/gguf_kquant.py decode:
                                      Q4_K a = d*sc_j, c = -dmin*m_j; Q4_0 a = d, c = -8d; Q4_1 a = d, c = m)
    kernel: w = (q - 8) * S + Z       S = bf16(a), Z = bf16(c + 8a): the only change is these two roundings
                                      (8 bits of mantissa), centred on q = 8 so the scale's error weighs |q - 8| <= 8
    y [M, N] = bf16( bf16(x) @ w.T ) (+ bias fp32)                                       (int4_linear_ref)

Why: half the int8 path's bytes per decode token for the linears a Q4_K_M file stores in 4 bits (most of them from
1.5B up), measured 1.9-2.1x faster per GEMV than the int8 kernel on this project's CPU (docs/quantization.md), and
no re-quantization: the weights are the file's (the int8 path rounds the file's weights again, per row). Each output
row of the kernel is independent of the other rows of x (tests/test_cpu_int4.py), so speculation and the prefix
cache keep giving plain decoding's tokens, as with int8.

The packed layout is the kernel's own and depends on the CPU the torch build runs on (torch's int4mm_kernel.cpp: on
AVX-512 rows in blocks of 64, block b K x 32 bytes, byte [k, j] = q[64b + j, k] | q[64b + 32 + j, k] << 4; blocks of
32 in another order on AVX2; another again in MSVC builds), so `pack` and `unpack` use an order learned from torch's
packing op (aten._convert_weight_to_int4pack_for_cpu) itself (`_order`), never a layout written out here. Blocks of
rows are independent and contiguous, so N must be a multiple of 64 (every Qwen2.5 linear is: it covers every
platform's block) and a file's tensors pack 64-row chunks at a time.
"""
from __future__ import annotations

import torch
from torch import nn

_OP = getattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu", None)
_PACK = getattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu", None)
GROUP = 32  # weights per scale: the GGUF 4-bit types' block (Q4_K's sub-block)
BLOCK_N = 64  # rows per packed block


def supports(n: int, k: int, group: int = GROUP) -> bool:
    """Whether an [n, k] linear can run as Int4Linear: the kernel and its packing exist, rows in whole blocks of 64,
    groups in whole rows."""
    return _OP is not None and _PACK is not None and n % BLOCK_N == 0 and k % group == 0 and k % 2 == 0


def pack(q: torch.Tensor) -> torch.Tensor:
    """codes q [N, K] (0..15, any integer dtype) -> the kernel's packed weight uint8 [N, K / 2]: torch's packing op's
    bytes (its layout depends on the CPU the torch build runs on: blocks of 64 rows with AVX-512, 32 with AVX2, another
    order in MSVC builds), made by a gather in the order learned from that op (_order; the op itself converts int32
    codes, 4x the temporaries and ~1.5x the load time)."""
    N, K = q.shape
    nib = q.to(torch.uint8).reshape(N // BLOCK_N, BLOCK_N * K)[:, _order(K)].reshape(N, K // 2, 2)
    return nib[..., 0] | (nib[..., 1] << 4)


_ORDER: dict[int, torch.Tensor] = {}


def _order(K: int) -> torch.Tensor:
    """Where a 64-row block's codes go in its packed bytes, learned from the packing op itself (so on any CPU):
    long [64 K], the nibbles of the block's bytes in order (byte 0 low, byte 0 high, byte 1 low, ..) -> the index
    n K + k of the code each holds. Digit by digit in base 16: a probe of codes = digit i of n K + k per position."""
    if K not in _ORDER:
        idx = torch.arange(BLOCK_N * K, dtype=torch.int64)
        src = torch.zeros(BLOCK_N * K, dtype=torch.int64)
        i = 0
        while (BLOCK_N * K - 1) >> (4 * i):
            p = _PACK(((idx >> (4 * i)) & 15).to(torch.int32).reshape(BLOCK_N, K), 1).reshape(-1)
            src |= torch.stack([p & 15, p >> 4], -1).reshape(-1).to(torch.int64) << (4 * i)
            i += 1
        _ORDER[K] = src
    return _ORDER[K]


def unpack(p: torch.Tensor) -> torch.Tensor:
    """The inverse of pack: uint8 [N, K / 2] -> codes uint8 [N, K] (rows_of, the weight property, tests)."""
    N, K = p.shape[0], p.shape[1] * 2
    nib = torch.stack([p & 15, p >> 4], -1).reshape(N // BLOCK_N, BLOCK_N * K)
    out = torch.empty_like(nib)
    out[:, _order(K)] = nib
    return out.reshape(N, K)


def scales_zeros(a: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Per-group a, c [N, G] (w = q * a + c, float32) -> the kernel's [G, N, 2] bf16 (S, Z): (q - 8) * S + Z."""
    a32, c32 = a.float(), c.float()
    return torch.stack([a32, c32 + 8 * a32], -1).transpose(0, 1).contiguous().bfloat16()


def int4_linear_ref(x: torch.Tensor, q: torch.Tensor, sz: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """What the kernel computes, in float64: bf16 activations times (q - 8) * S + Z per group, the sum rounded to bf16
    (then the bias in float32). q [N, K] codes, sz [G, N, 2] as scales_zeros gives."""
    N, K = q.shape
    g = K // sz.shape[0]
    s = sz[..., 0].double().T.repeat_interleave(g, 1)  # [N, K]
    z = sz[..., 1].double().T.repeat_interleave(g, 1)
    y = x.bfloat16().double() @ ((q.double() - 8) * s + z).T
    y = y.bfloat16().float()
    return y if b is None else y + b.float()


class Int4Linear(nn.Module):
    """Drop-in for kernels.ops_reference.Linear on the CPU (called on x [..., K] -> float32 [..., N]) holding a file's
    4-bit codes (from_codes; engine/formats/gguf_int4.py builds one from GGUF tensors a chunk of rows at a time)."""

    def __init__(self, packed: torch.Tensor, sz: torch.Tensor, bias: torch.Tensor | None = None):
        """packed uint8 [N, K / 2] (pack), sz bf16 [G, N, 2] (scales_zeros), bias [N] or None."""
        super().__init__()
        self.out_features, self.in_features = packed.shape[0], packed.shape[1] * 2
        self.group = self.in_features // sz.shape[0]
        if not supports(self.out_features, self.in_features, self.group) or sz.shape[1] != self.out_features:
            raise ValueError(f"an int4 linear needs the kernel, rows in blocks of {BLOCK_N} and whole groups: "
                             f"[{self.out_features}, {self.in_features}] in groups of {self.group}")
        self.register_buffer("packed", packed)
        self.register_buffer("sz", sz)
        self.register_buffer("bias", None if bias is None else bias.data if bias.dtype == torch.float32 else
                             bias.float())

    @classmethod
    def from_codes(cls, q: torch.Tensor, a: torch.Tensor, c: torch.Tensor, bias: torch.Tensor | None = None) \
            -> "Int4Linear":
        """q [N, K] codes 0..15, a, c float32 [N, K / group]: w = q * a + c per group."""
        return cls(pack(q), scales_zeros(a, c), bias)

    @classmethod
    def rows_of(cls, src: "Int4Linear", rows: torch.Tensor) -> nn.Module:
        """src restricted to output rows (int64 ids), computing the bits src's rows compute. A row subset is not in
        whole blocks of 64 in general: it is padded with its last id to an Int4Linear and cut (the same codes)."""
        n = len(rows)
        pad = (-n) % BLOCK_N
        ids = torch.cat([rows, rows[-1:].expand(pad)]) if pad else rows
        sub = cls(pack(unpack(src.packed).index_select(0, ids)), src.sz.index_select(1, ids).contiguous(),
                  None if src.bias is None else src.bias.index_select(0, ids).contiguous())
        return sub if not pad else _Cut(sub, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead, K = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, K).bfloat16().contiguous()
        y = _OP(x2, self.packed, self.group, self.sz).float()
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)

    def codes(self) -> torch.Tensor:
        return unpack(self.packed)

    @property
    def weight(self) -> torch.Tensor:
        """The weights it computes with, float32 [N, K] (made on each call: for the rare reader of a head's rows)."""
        s = self.sz[..., 0].float().T.repeat_interleave(self.group, 1)
        z = self.sz[..., 1].float().T.repeat_interleave(self.group, 1)
        return (self.codes().float() - 8) * s + z

    def nbytes(self) -> int:
        return self.packed.numel() + self.sz.numel() * 2 + (0 if self.bias is None else self.bias.numel() * 4)


class _Cut(nn.Module):
    """The first n outputs of a padded Int4Linear (a draft vocabulary's rows: rarely a multiple of 64)."""

    def __init__(self, inner: Int4Linear, n: int):
        super().__init__()
        self.inner, self.out_features, self.in_features = inner, n, inner.in_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)[..., :self.out_features]

    @property
    def weight(self) -> torch.Tensor:
        return self.inner.weight[:self.out_features]

    def nbytes(self) -> int:
        return self.inner.nbytes()


def available() -> bool:
    """Whether this torch has the int4 weight-only CPU kernel; without it the int4 setting runs int8 everywhere."""
    return _OP is not None and _PACK is not None
