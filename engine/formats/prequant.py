"""AWQ and GPTQ 4-bit group-128 checkpoints (HF folders whose config.json has a quantization_config,
e.g. Qwen's own -AWQ and -GPTQ-Int4 releases): their packed linears are repacked into our layout
(kernels/pack.py) without re-quantizing, or dequantized exactly for the dense paths.

Published layouts, for a linear W [N out, K in] (HF stores it as in_features x out_features):
  AWQ (AutoAWQ, version "gemm", zero_point true)
    qweight int32 [K, N/8]      word (k, c) holds output columns 8c..8c+7; nibble i (bits 4i..4i+3)
                                holds column 8c + ORDER[i], ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
    qzeros  int32 [K/128, N/8]  the same packing, one zero point per (group, column)
    scales  fp16  [K/128, N]
    W[n, k] = (q - z) * s
  GPTQ (AutoGPTQ / Optimum, checkpoint_format "gptq", desc_act false)
    qweight int32 [K/8, N]      word (r, n) holds k = 8r..8r+7, nibble k % 8
    qzeros  int32 [K/128, N/8]  word (g, c) holds columns 8c..8c+7 in nibble order, storing z - 1;
                                the reference dequantization reads z = (stored + 1) & 15
    scales  fp16  [K/128, N]     g_idx int32 [K] = k // 128 (anything else is act-order: refused)
    W[n, k] = (q - z) * s       (checkpoint_format "gptq_v2", GPTQModel: z stored as is)

Ours: the codes q unchanged, scales = s^T, mins = -z * s. In float32 -z*s is exact (an 11-bit fp16
significand times an integer < 16), and so is q*s + mins = (q - z)*s: our CPU dequantization equals
the published formula evaluated in float32 bit for bit. float16 cannot hold every -z*s, so mins are
stored fp16 only when all are exact, else float32 (the one format extension; the GPU loader rounds
them to fp16 at load: error <= 2^-11 * |z*s| <= 0.0073 of a quantization step).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from safetensors import safe_open

from engine.errors import ModelFileError
from engine.quant.quantize import pack_fast
from kernels.pack import GROUP

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ word holds column 8c + AWQ_ORDER[i]
_AWQ_COLUMN_NIBBLE = [AWQ_ORDER.index(j) for j in range(8)]  # column 8c + j sits in nibble [0,4,1,5,2,6,3,7][j]
SUFFIXES = ("qweight", "qzeros", "scales", "g_idx")


@dataclass
class PreQuant:
    method: str  # "awq" | "gptq"
    zero_offset: int  # added to stored zeros (GPTQ "gptq" format: 1; AWQ, "gptq_v2": 0)
    label: str  # human-readable, for weight_types / manifests


def parse_config(raw: dict, where: str = "config.json") -> PreQuant | None:
    """quantization_config of an HF config.json -> PreQuant (None when the model is not pre-quantized).
    Refuses, with what to do, every variant the repack does not reproduce exactly."""
    qc = raw.get("quantization_config")
    if not qc:
        return None
    method = str(qc.get("quant_method", "")).lower()
    bits, group = qc.get("bits", qc.get("w_bit")), qc.get("group_size", qc.get("q_group_size"))
    fix = "use the model's 4-bit group-128 AWQ/GPTQ release, its GGUF, or its BF16 original with " \
          "`deepinfer export --scheme w4`"
    if method not in ("awq", "gptq"):
        raise ModelFileError(f"{where}: quantization method {method or '?'!r} is not supported "
                             "(only AWQ and GPTQ 4-bit group 128)", fix)
    if bits != 4 or group != GROUP:
        raise ModelFileError(f"{where}: {method.upper()} with bits={bits}, group_size={group} is not supported "
                             "(only 4-bit, group size 128)", fix)
    if method == "awq":
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm" or not qc.get("zero_point", True):
            raise ModelFileError(f"{where}: AWQ version {version!r} (zero_point={qc.get('zero_point')}) is not "
                                 "supported (only the GEMM layout with zero points)", fix)
        return PreQuant("awq", 0, "awq-4bit-g128")
    if qc.get("desc_act"):
        raise ModelFileError(f"{where}: GPTQ with desc_act=true (act-order: groups permuted by g_idx) is not "
                             "supported; only desc_act=false repacks exactly", fix)
    fmt = str(qc.get("checkpoint_format", "gptq")).lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise ModelFileError(f"{where}: GPTQ checkpoint_format {fmt!r} is not supported (gptq, gptq_v2)", fix)
    return PreQuant("gptq", 1 if fmt == "gptq" else 0, f"gptq-4bit-g128{'-v2' if fmt == 'gptq_v2' else ''}")


def _nibbles(words: torch.Tensor) -> torch.Tensor:
    """int32 [..., W] -> uint8 [..., W, 8]: element i = (word >> 4i) & 15 (little-endian bytes)."""
    b = words.contiguous().view(torch.uint8).reshape(*words.shape, 4)
    return torch.stack([b & 0xF, b >> 4], -1).reshape(*words.shape, 8)


def unpack_awq(qweight, qzeros, scales):
    """AWQ GEMM tensors -> (q uint8 [N, K], z uint8 [N, K/128], s fp16 [N, K/128])."""
    K = qweight.shape[0]
    N = qweight.shape[1] * 8
    q = _nibbles(qweight)[..., _AWQ_COLUMN_NIBBLE].reshape(K, N)
    z = _nibbles(qzeros)[..., _AWQ_COLUMN_NIBBLE].reshape(K // GROUP, N)
    return q.T.contiguous(), z.T.contiguous(), scales.T.contiguous()


def unpack_gptq(qweight, qzeros, scales, g_idx=None, zero_offset: int = 1):
    """GPTQ tensors -> (q uint8 [N, K], z uint8 [N, K/128], s fp16 [N, K/128])."""
    K, N = qweight.shape[0] * 8, qweight.shape[1]
    if g_idx is not None and not torch.equal(g_idx.long().cpu(), torch.arange(K) // GROUP):
        raise ModelFileError("GPTQ g_idx is not k // 128 (act-order / permuted groups): not supported",
                             "use a desc_act=false release of the model")
    q = _nibbles(qweight.T).reshape(N, K)
    z = (_nibbles(qzeros).reshape(K // GROUP, N) + zero_offset) & 0xF
    return q, z.T.contiguous(), scales.T.contiguous()


def dequantize(q, z, s) -> torch.Tensor:
    """The published formula (q - z) * s, float32 [N, K] (exact: at most 15 significant bits)."""
    N, K = q.shape
    g = (q.float() - z.float().repeat_interleave(GROUP, 1)).reshape(N, K // GROUP, GROUP)
    return (g * s.float().unsqueeze(-1)).reshape(N, K)


def to_ours(q, z, s) -> dict[str, torch.Tensor]:
    """Unpacked AWQ/GPTQ -> our W4 {"qweight", "scales", "mins"} (mins fp16 when exact, else fp32)."""

    mins = -(z.float() * s.float())
    if torch.equal(mins.half().float(), mins):
        mins = mins.half()
    return {"qweight": pack_fast(q, 4), "scales": s.half().contiguous(), "mins": mins.contiguous()}


def concat_rows(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Fuse repacked linears along N (rows q|k|v, gate|up); mins go fp32 if any part needs it."""
    mdt = torch.float32 if any(p["mins"].dtype == torch.float32 for p in parts) else torch.float16
    return {"qweight": torch.cat([p["qweight"] for p in parts]), "scales": torch.cat([p["scales"] for p in parts]),
            "mins": torch.cat([p["mins"].to(mdt) for p in parts])}


class PreQuantReader:
    """The packed linears of a folder: HF weight name ('...q_proj.weight') -> unpacked / ours / dense."""

    def __init__(self, pq: PreQuant, tensor_files: dict):
        """tensor_files: tensor name -> safetensors file holding it."""
        self.pq, self.files = pq, tensor_files
        self.linears = {n[:-len(".qweight")] + ".weight": n[:-len(".qweight")]
                        for n in tensor_files if n.endswith(".qweight")}

    def _get(self, name: str) -> torch.Tensor:
        with safe_open(str(self.files[name]), "pt") as f:
            return f.get_tensor(name)

    def tensor(self, name: str) -> torch.Tensor:
        """Any tensor of the folder as stored (embedding, norms, biases: the dense ones)."""
        if name not in self.files:
            raise ModelFileError(f"{self.pq.method.upper()} model lacks {name}", "the model folder is incomplete")
        return self._get(name)

    def unpacked(self, name: str):
        p = self.linears[name]
        for s in ("qzeros", "scales"):
            if f"{p}.{s}" not in self.files:
                raise ModelFileError(f"{self.pq.method.upper()} model lacks {p}.{s}", "the model folder is incomplete")
        qw, qz, sc = (self._get(f"{p}.{s}") for s in ("qweight", "qzeros", "scales"))
        if self.pq.method == "awq":
            return unpack_awq(qw, qz, sc)
        g = self._get(f"{p}.g_idx") if f"{p}.g_idx" in self.files else None
        return unpack_gptq(qw, qz, sc, g, self.pq.zero_offset)

    def ours(self, name: str) -> dict[str, torch.Tensor]:
        return to_ours(*self.unpacked(name))

    def dense(self, name: str) -> torch.Tensor:
        return dequantize(*self.unpacked(name))

    def owns(self, tensor: str) -> bool:
        """True for the packed tensors (read through this class, never as plain weights)."""
        head, _, suffix = tensor.rpartition(".")
        return suffix in SUFFIXES and head + ".weight" in self.linears
