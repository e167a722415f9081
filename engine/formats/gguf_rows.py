"""A GGUF embedding read from the mapped model file a row at a time (the CPU runner's int8 / int4 loads).

The embedding is the largest tensor a CPU runner holds in float32 (a 1.5B's 151,936 x 1,536 rows: 0.93 GB; a 3B's
1.24 GB), yet a step reads one row per token. MappedRows keeps it in its file (the mapping the reader has already)
and decodes the rows a lookup asks for with engine/formats/gguf_kquant.py dequantize_exact, which gives the bits of
GGUFTensor.dequantize: the lookups are the float32 table's, bit for bit, and the table never exists in RAM (the OS
keeps the file's pages it reads as cache, reclaimable). A tied head's int8 copy is made from its rows in chunks.
"""
from __future__ import annotations

import numpy as np
import torch

from engine.formats.gguf_kquant import BLOCK_BYTES, dequantize_exact


class MappedRows:
    """Rows of one quantized GGUF matrix [N, K] in matrix order: m[ids] / m[i] / m[a:b] -> float32 rows."""

    def __init__(self, t):
        self.t = t
        self.shape = (int(t.shape[1]), int(t.shape[0]))
        self.dtype = torch.float32
        self._raw = np.asarray(t.raw())  # [N, row_bytes] view of the mapping (numpy's memmap subclass costs per slice)

    @staticmethod
    def supports(t) -> bool:
        return t.type_name in BLOCK_BYTES and len(t.shape) == 2

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (any shape, int) -> float32 [*ids.shape, K]: F.embedding(ids, table) of the dequantized table."""
        flat = ids.reshape(-1).numpy()
        out = dequantize_exact(self._raw[flat], self.t.type_name, self.shape[1])
        return torch.from_numpy(out).reshape(*ids.shape, self.shape[1])

    def __getitem__(self, i) -> torch.Tensor:
        if isinstance(i, slice):
            return torch.from_numpy(dequantize_exact(self._raw[i], self.t.type_name, self.shape[1]))
        if isinstance(i, torch.Tensor):
            return self.rows(i)
        return self.rows(torch.tensor([int(i)]))[0]

    def dense(self) -> torch.Tensor:
        """The whole table in float32 (for the rare reader of all of it)."""
        return self[0:self.shape[0]]
