"""Minimal fast GGUF parser (header, metadata, tensor table) over a memory map.

gguf.GGUFReader builds a Python object per token string (10 s for Qwen's 151k-token vocab);
this reads the same data in well under a second (strings sliced from a memoryview, not numpy memmap views).
Dequantization of the types with an exact repack (engine/formats/gguf_kquant.py: Q4_K, Q5_K, Q6_K, Q8_0, Q4_0/1,
Q5_0/1) is codes * scales + mins over whole tensors in numpy: the same float32 bits as gguf.quants (the products
are exact in float32, one rounding in the sum; tests/test_gguf_kquant.py) in a fraction of its time (its per-row
groups of memmap views took 9 of the 0.5B's 17 s CPU load); other types still use gguf.quants.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from engine.errors import ModelFileError

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NP = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
       7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}


@dataclass
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # GGUF order (reversed: ne[0] is the row length)
    ggml_type: int
    offset: int  # absolute offset in the file
    n_bytes: int
    _mm: np.memmap | None = None

    @property
    def type_name(self) -> str:
        return GGMLQuantizationType(self.ggml_type).name

    def raw(self) -> np.ndarray:
        """Bytes as gguf.quants.dequantize expects: [rows..., row_bytes] uint8 (or typed for F32/F16)."""
        buf = self._mm[self.offset:self.offset + self.n_bytes]
        rows = tuple(reversed(self.shape[1:]))
        if self.ggml_type == 0:
            return buf.view(np.float32).reshape(rows + (self.shape[0],))
        if self.ggml_type == 1:
            return buf.view(np.float16).reshape(rows + (self.shape[0],))
        return buf.reshape(rows + (-1,))

    def dequantize(self) -> np.ndarray:
        """float32 array in row-major matrix order: (rows, row_length); a new, writable array (never a view of
        the file)."""
        from engine.formats.gguf_kquant import BLOCK_BYTES, dequantize_exact  # (gguf_kquant imports torch)

        raw = np.asarray(self.raw())  # a plain ndarray view: numpy's memmap subclass costs per slice
        if self.type_name in BLOCK_BYTES:
            return dequantize_exact(raw, self.type_name, self.shape[0])
        out = np.asarray(dequantize(raw, GGMLQuantizationType(self.ggml_type)), dtype=np.float32)
        return out.copy() if not out.flags.owndata or not out.flags.writeable else out


class GGUFFile:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")
            self._mv = memoryview(self._mm)  # header parsing: slices without numpy view objects
            self._parse()
            self._mv.release()
        except ModelFileError:
            raise
        except (struct.error, ValueError, IndexError, OSError, UnicodeDecodeError) as e:
            raise ModelFileError(f"{self.path.name} is not a readable GGUF file ({type(e).__name__}: {e})",
                                 "re-download it (`deepinfer pull ...`) or check the path") from e

    # --- parsing -------------------------------------------------------------------------
    def _read(self, fmt: str):
        size = struct.calcsize(fmt)
        v = struct.unpack_from(fmt, self._mv, self._pos)
        self._pos += size
        return v[0] if len(v) == 1 else v

    def _str(self) -> str:
        n = self._read("<Q")
        if n > len(self._mv) - self._pos:
            raise ValueError("string length past end of file")
        s = str(self._mv[self._pos:self._pos + n], "utf-8")
        self._pos += n
        return s

    def _value(self, t: int):
        if t in _SCALARS:
            return self._read(_SCALARS[t])
        if t == 8:
            return self._str()
        if t == 9:
            et, n = self._read("<I"), self._read("<Q")
            if et in _NP:
                arr = np.frombuffer(self._mm, dtype=_NP[et], count=n, offset=self._pos)
                self._pos += arr.nbytes
                return arr.tolist()
            return [self._value(et) for _ in range(n)]
        raise ValueError(f"unknown GGUF value type {t}")

    def _parse(self):
        self._pos = 0
        if bytes(self._mm[:4]) != b"GGUF":
            raise ModelFileError(f"{self.path.name} is not a GGUF file (bad magic)",
                                 "pass a .gguf model, an HF folder or a DeepInfer checkpoint")
        self._pos = 4
        self.version = self._read("<I")
        n_tensors, n_kv = self._read("<Q"), self._read("<Q")
        self.fields: dict = {}
        for _ in range(n_kv):
            key = self._str()
            self.fields[key] = self._value(self._read("<I"))

        infos = []
        for _ in range(n_tensors):
            name = self._str()
            nd = self._read("<I")
            shape = tuple(self._read("<Q") for _ in range(nd))
            infos.append((name, shape, self._read("<I"), self._read("<Q")))
        align = int(self.fields.get("general.alignment", 32))
        data_start = (self._pos + align - 1) // align * align
        self.tensors: dict[str, GGUFTensor] = {}
        for name, shape, ty, off in infos:
            block, tsize = GGML_QUANT_SIZES[GGMLQuantizationType(ty)]
            n_bytes = int(np.prod(shape)) // block * tsize
            t = GGUFTensor(name, shape, ty, data_start + off, n_bytes, self._mm)
            if t.offset + n_bytes > len(self._mm):
                raise ModelFileError(f"{self.path.name} is truncated (tensor {name} ends past the end of the file)",
                                     "re-download the model (`deepinfer pull ...`)")
            self.tensors[name] = t
