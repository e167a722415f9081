"""A GGUF file's 4-bit tensors for the CPU's int4 linears (EngineConfig.cpu_weights "int4", kernels/cpu_int4.py).

The CPU runner's int4 load reads the model file's tensors through `weights(spec)` (its int8 load too, for the
embedding's rows: engine/formats/gguf_rows.py): a linear stored in a 4-bit type
(Q4_K, Q4_0, Q4_1: w = q * a + c per group of 32, q 0..15) comes as a Q4Tensor, not decoded yet; everything else as
the float32 matrix spec.weights() gives. Qwen2Model.load_weights makes an Int4Linear of a linear whose parts are all
Q4Tensors (`int4_linear`: decoded and packed a bounded number of rows at a time, no float copy), and dequantizes a
Q4Tensor anywhere else (a fused linear with a part in another type goes int8 whole; the embedding's lookups read
float rows).
"""
from __future__ import annotations

from collections.abc import Iterator

import torch

from engine.formats.gguf_kquant import ROWS_PER_CHUNK_ELEMS, decode
from engine.formats.gguf_layout import FOUR_BIT
from kernels import cpu_int4


class Q4Tensor:
    """One GGUF tensor in a 4-bit type, [rows, K] in matrix order (GGUFTensor.raw's rows)."""

    def __init__(self, t):
        self.t = t
        self.shape = (int(t.shape[1]) if len(t.shape) > 1 else 1, int(t.shape[0]))

    def dequantize(self) -> torch.Tensor:
        return torch.from_numpy(self.t.dequantize())

    def chunks(self, rows: int) -> Iterator[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(first row, codes uint8 [n, K], a, c float32 [n, K / 32]) for `rows` rows at a time (exact products)."""
        raw = self.t.raw()
        for r0 in range(0, self.shape[0], rows):
            q, a, c = decode(raw[r0:r0 + rows], self.t.type_name)
            yield r0, torch.from_numpy(q), torch.from_numpy(a), torch.from_numpy(c)


def fits(parts: list[Q4Tensor]) -> bool:
    """Whether parts (a linear's, in row order) can be one Int4Linear: the kernel, whole 64-row blocks per part."""
    K = parts[0].shape[1]
    return all(isinstance(p, Q4Tensor) and p.shape[1] == K for p in parts) and \
        all(cpu_int4.supports(p.shape[0], K) for p in parts)


def int4_linear(parts: list[Q4Tensor], bias: torch.Tensor | None = None) -> cpu_int4.Int4Linear:
    """The Int4Linear of parts stacked by rows (q|k|v, gate|up, or one), decoded and packed in chunks of whole
    64-row blocks (a packed block depends on its own rows only, so the chunks' packings are the whole one's)."""
    K = parts[0].shape[1]
    N = sum(p.shape[0] for p in parts)
    packed = torch.empty(N, K // 2, dtype=torch.uint8)
    sz = torch.empty(K // cpu_int4.GROUP, N, 2, dtype=torch.bfloat16)
    step = max(cpu_int4.BLOCK_N, ROWS_PER_CHUNK_ELEMS // K // cpu_int4.BLOCK_N * cpu_int4.BLOCK_N)
    row = 0
    for p in parts:
        for r0, q, a, c in p.chunks(step):
            n = q.shape[0]
            packed[row + r0:row + r0 + n] = cpu_int4.pack(q)
            sz[:, row + r0:row + r0 + n] = cpu_int4.scales_zeros(a, c)
        row += p.shape[0]
    return cpu_int4.Int4Linear(packed, sz, bias)


def weights(spec, int4: bool = True) -> Iterator[tuple[str, object]]:
    """spec.weights() for the CPU runner's streamed int8 / int4 load of a GGUF: (HF name, MappedRows) for a quantized
    embedding (engine/formats/gguf_rows.py: its rows stay in the file), with int4 (HF name, Q4Tensor) for the other
    4-bit matrices, (HF name, float32 tensor) for the rest."""
    from engine.formats.gguf_rows import MappedRows
    from engine.model.layout import EMBED

    for hn, t in spec.gguf_tensors.items():
        if hn == EMBED and MappedRows.supports(t):
            yield hn, MappedRows(t)
        elif int4 and t.type_name in FOUR_BIT and len(t.shape) == 2:
            yield hn, Q4Tensor(t)
        else:
            yield hn, torch.from_numpy(t.dequantize())
