"""GGUF quantized blocks -> (codes, scales, mins) of our packed layouts, exactly (no re-quantization).

Each GGUF type stores w = a * q + b per sub-block with a, b products of fp16 super-block factors and small
integer sub-scales (llama.cpp ggml-quants.c; gguf.quants in Python). decode() returns the integer codes and
those products in float32, where they are exact (an 11-bit fp16 mantissa times a <= 8-bit integer);
repack() rounds them to fp16 once (the only change):

    Q4_K  256 = 8 x 32: w = d*sc_j * q - dmin*m_j       q 0..15   s = fp16(d*sc_j)  m = fp16(-dmin*m_j)
    Q5_K  same with q 0..31 (4 low bits + 1 high bit)
    Q6_K  256 = 16 x 16: w = d*sc_j * (q - 32)          q 0..63   s = fp16(d*sc_j)  m = fp16(-32*d*sc_j) (sc int8)
    Q8_0  32: w = d * q8 (q8 int8)                      q = q8 + 128, s = d, m = -128*d (exact)
    Q4_0  32: w = d * (q - 8);  Q5_0: w = d * (q - 16)  s = d, m = -8d / -16d (exact)
    Q4_1 / Q5_1  32: w = d * q + m                      s = d, m = m (exact)

EngineConfig.gguf_pack "kquant" keeps the K-quants' integer sub-scales (repack_kq) and the 32-blocks' lone scale
(repack_sym: Q4_0 / Q5_0 / Q8_0 codes re-centred so that the min is -2^(bits-1) s; kernels/pack.py SYM).

Exactness bound (tests/test_gguf_kquant.py checks it against gguf.quants.dequantize on real and synthetic
blocks): with s*, m* the exact products, |q*fp16(s*) + fp16(m*) - (q*s* + m*)| <= q*e(s*) + e(m*), where
e(x) = 2^-11 |x| (half an fp16 ulp, normal range) + 2^-25 (fp16 subnormals); plus float32 rounding of the two
sides (2^-23 relative). Only the K-quants round at all; the 32-blocks are exact (powers of two times d).
"""
from __future__ import annotations

import numpy as np
import torch

from engine.config import GGUF_PACK
from engine.errors import ModelFileError
from engine.formats.gguf_layout import CODE_BITS, KQ, REPACK, SYM_CENTRE, common_layout, layout_form, part_layout
from engine.quant.quantize import pack_fast
from kernels import pack
from kernels.qweight import QWeight

QK_K = 256
BLOCK_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210, "Q8_0": 34, "Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24}
ROWS_PER_CHUNK_ELEMS = 1 << 24  # weights decoded at a time (bounded temporaries for a 7B embedding)


def _f16(b: np.ndarray) -> np.ndarray:
    """[n, 2] uint8 -> float32 [n] (the little-endian fp16 they hold)."""
    return np.ascontiguousarray(b).view(np.float16).reshape(-1).astype(np.float32)


def _scale_min_k4(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K packed 6-bit sub-scales and sub-mins: [n, 12] uint8 -> ([n, 8], [n, 8]) uint8."""
    d, m, md = sc[:, 0:4], sc[:, 4:8], sc[:, 8:12]
    scale = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], -1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], -1)
    return scale, mn


def _nibbles_32(qs: np.ndarray) -> np.ndarray:
    """[n, 16] bytes -> [n, 32] codes: low nibbles are values 0..15, high nibbles 16..31 (Q4_0/Q4_1/Q5_x)."""
    return np.concatenate([qs & 0x0F, qs >> 4], -1)


def _high_bits_32(qh: np.ndarray) -> np.ndarray:
    """[n, 4] bytes (a little-endian uint32) -> [n, 32] bits (bit j of the word is value j's fifth bit)."""
    return np.unpackbits(np.ascontiguousarray(qh), axis=-1, bitorder="little")  # bit j = bit j % 8 of byte j // 8


def _decode_blocks(b: np.ndarray, ty: str):
    """b [n, block_bytes] -> codes uint8 [n, values], a (scales), c (mins) float32 [n, groups] (exact)."""
    n = b.shape[0]
    if ty in ("Q4_K", "Q5_K"):
        d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
        sc, mn = _scale_min_k4(b[:, 4:16])
        qs = b[:, -128:].reshape(n, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
        q = (qs & 0x0F).reshape(n, 8, 32)  # sub-block 2i: low nibbles of bytes 32i.., 2i+1: high nibbles
        if ty == "Q5_K":
            qh = b[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
            q = q | ((qh & 1) << 4)  # bit j of byte l: value l of sub-block j
        return q.reshape(n, QK_K), d[:, None] * sc, -(dmin[:, None] * mn)
    if ty == "Q6_K":
        ql, qh, sc, d = b[:, :128], b[:, 128:192], b[:, 192:208].view(np.int8), _f16(b[:, 208:210])
        lo = (ql.reshape(n, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 0x0F
        hi = (qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
        q = lo.reshape(n, 8, 32) | (hi.reshape(n, 8, 32) << 4)  # 0..63, value d*sc*(q - 32)
        a = d[:, None] * sc.astype(np.float32)
        return q.reshape(n, QK_K), a, -32.0 * a
    d = _f16(b[:, 0:2])[:, None]
    if ty == "Q8_0":
        return b[:, 2:34] ^ 0x80, d, -128.0 * d  # int8 two's complement + 128 = flip the top bit
    if ty == "Q4_0":
        return _nibbles_32(b[:, 2:18]), d, -8.0 * d
    if ty == "Q4_1":
        return _nibbles_32(b[:, 4:20]), d, _f16(b[:, 2:4])[:, None]
    if ty == "Q5_0":
        return _nibbles_32(b[:, 6:22]) | (_high_bits_32(b[:, 2:6]) << 4), d, -16.0 * d
    if ty == "Q5_1":
        return _nibbles_32(b[:, 8:24]) | (_high_bits_32(b[:, 4:8]) << 4), d, _f16(b[:, 2:4])[:, None]
    raise ValueError(f"GGUF type {ty} has no exact repack (supported: {', '.join(REPACK)})")


def decode(raw: np.ndarray, ty: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """raw uint8 [rows, row_bytes] of GGUF type `ty` -> (codes uint8 [rows, K], scales, mins float32
    [rows, K // group]) with the exact products (w = codes * scales + mins per group of REPACK[ty][1])."""
    if ty not in REPACK:
        raise ValueError(f"GGUF type {ty} has no exact repack (supported: {', '.join(REPACK)})")
    rows, nbytes = raw.shape
    bb = BLOCK_BYTES[ty]
    if nbytes % bb:
        raise ModelFileError(f"a {ty} row of {nbytes} bytes is not a whole number of {bb}-byte blocks")
    q, a, c = _decode_blocks(np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, bb), ty)
    return q.reshape(rows, -1), a.reshape(rows, -1).astype(np.float32), c.reshape(rows, -1).astype(np.float32)


def dequantize_exact(raw: np.ndarray, ty: str, K: int) -> np.ndarray:
    """raw uint8 [rows..., row_bytes] of type `ty` -> float32 [rows..., K] = codes * scales + mins per group: the
    bits of gguf.quants.dequantize (its products d * sc * q are exact in float32 and its sum rounds once, as here),
    decoded a bounded number of weights at a time (GGUFTensor.dequantize, the CPU runner's load)."""
    lead = raw.shape[:-1]
    flat = raw.reshape(-1, raw.shape[-1])
    out = np.empty((flat.shape[0], K), dtype=np.float32)
    step = max(1, ROWS_PER_CHUNK_ELEMS // K)
    for r0 in range(0, flat.shape[0], step):
        q, a, c = decode(flat[r0:r0 + step], ty)
        n, G = a.shape
        w = out[r0:r0 + n].reshape(n, G, K // G)  # a view: computed in place, no temporary to copy
        w[...] = q.reshape(n, G, K // G)
        # a damaged scale's inf / nan is refused by the loader's finiteness check, naming the tensor: not warned here
        with np.errstate(invalid="ignore", over="ignore"):
            w *= a[:, :, None]  # exact products
            w += c[:, :, None]  # one rounding
    return out.reshape(lead + (K,))


def _pack_np(q: np.ndarray, bits: int) -> np.ndarray:
    """codes uint8 [rows, K] -> int32 words of kernels/pack.py (bits 4: k = 2j low / 2j+1 high nibble of byte j,
    little-endian words; bits 8: the bytes themselves; bits 6: both planes) — pack.pack's words, without int64
    temporaries."""
    if bits == 8:
        return np.ascontiguousarray(q).view(np.int32)
    if bits == 4:
        return np.ascontiguousarray(q[:, 0::2] | (q[:, 1::2] << 4)).view(np.int32)
    if bits == 6:  # kernels/pack.py W6: per block of 128, the W4 words of q & 15, then the high bits' 8 words
        n, K = q.shape
        lo = _pack_np(q & 15, 4).reshape(n, K // 128, 16)
        hi = (q >> 4).reshape(n, K // 128, 4, 2, 16)[..., _W6_ORDER]  # a word's 16 pairs in bit order
        b = hi[..., 0::4] | (hi[..., 1::4] << 2) | (hi[..., 2::4] << 4) | (hi[..., 3::4] << 6)  # its 4 bytes
        return np.concatenate([lo, np.ascontiguousarray(b).view(np.int32).reshape(n, K // 128, 8)], -1) \
            .reshape(n, K // 128 * 24)
    return pack_fast(torch.from_numpy(q), bits).numpy()


# W6's high-bit words (kernels/pack.py): code i of a word's 16 sits at bit w6_bit_pos()[i] = 2 j; _W6_ORDER[j] = i,
# so the codes taken in this order are packed 4 to a byte like any 2-bit stream (uint8 work, no uint32 temporaries)
_W6_ORDER = np.argsort(pack.w6_bit_pos()[0, 0].numpy())


def to_fp16(x: np.ndarray, what: str) -> torch.Tensor:
    """Round exact scale products to fp16 (the one rounding of the repack); refuse overflow."""
    with np.errstate(over="ignore"):
        h = x.astype(np.float16)
    if not np.isfinite(h).all():
        raise ModelFileError(f"{what}: a scale product overflows fp16 (|x| > 65504): no exact fp16 layout",
                             "run it with --requantize w4")
    return torch.from_numpy(h)


def repack(raw: np.ndarray, ty: str, bits: int | None = None, group: int | None = None, what: str = "tensor") \
        -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """raw [rows, row_bytes] -> (qweight int32, scales fp16, mins fp16) in layout (bits, group) (default REPACK[ty];
    a wider/finer one holds the same weights: codes widened, scales/mins repeated). Row chunks bound the
    temporaries."""
    b0, g0 = REPACK[ty]
    bits, group = bits or b0, group or g0
    if bits < CODE_BITS[ty] or g0 % group:
        raise ValueError(f"{ty} ({b0}-bit, group {g0}) does not fit layout ({bits}, {group}) exactly")
    rows = raw.shape[0]
    K = raw.shape[1] // BLOCK_BYTES[ty] * (QK_K if ty.endswith("_K") else 32)
    pack.check_layout(bits, group, K)
    qw = torch.empty(rows, pack.packed_words(K, bits), dtype=torch.int32)
    sc = torch.empty(rows, K // group, dtype=torch.float16)
    mn = torch.empty(rows, K // group, dtype=torch.float16)
    step = max(1, ROWS_PER_CHUNK_ELEMS // K)
    for r in range(0, rows, step):
        q, a, c = decode(np.asarray(raw[r:r + step]), ty)
        qw[r:r + step] = torch.from_numpy(_pack_np(q, bits))
        s16, m16 = to_fp16(a, what), to_fp16(c, what)
        if group != g0:
            s16, m16 = pack.regroup(s16, m16, g0, group)
        sc[r:r + step], mn[r:r + step] = s16, m16
    return qw, sc, mn


def repack_kq(raw: np.ndarray, ty: str, bits: int | None = None, what: str = "tensor") \
        -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """raw [rows, row_bytes] of Q4_K, Q5_K or Q6_K -> (qweight int32, sub-scales, super factors) in the KQ form of
    kernels/pack.py: the codes packed as W4 / W6 (`bits`: wider than the type's own to join a Q5_K part), the
    block's integer sub-scales (Q4_K / Q5_K: uint8 (sc, m) [rows, K/32, 2]; Q6_K: int8 sc [rows, K/16]) and fp16
    factors per 256 (Q4_K / Q5_K: (d, dmin) [rows, K/256, 2]; Q6_K: d [rows, K/256]) as stored. The scales and mins
    they make (pack.kq_expand) are repack()'s, bit for bit; a product that overflows fp16 is refused the same way."""
    if ty not in KQ:
        raise ValueError(f"{ty} has no KQ form (Q4_K, Q5_K, Q6_K)")
    bits, bb = bits or KQ[ty][0], BLOCK_BYTES[ty]
    if bits < CODE_BITS[ty] or (bits, KQ[ty][1]) not in pack.KQ_LAYOUTS:
        raise ValueError(f"{ty} has no KQ form with {bits}-bit codes")
    rows = raw.shape[0]
    K = raw.shape[1] // bb * QK_K
    q4 = ty != "Q6_K"  # Q4_K / Q5_K: (sc, m) per 32 and (d, dmin) per 256
    qw = torch.empty(rows, pack.packed_words(K, bits), dtype=torch.int32)
    sub = torch.empty((rows, K // 32, 2) if q4 else (rows, K // 16), dtype=torch.uint8 if q4 else torch.int8)
    sup = torch.empty((rows, K // QK_K, 2) if q4 else (rows, K // QK_K), dtype=torch.float16)
    step = max(1, ROWS_PER_CHUNK_ELEMS // K)
    for r in range(0, rows, step):
        chunk = np.ascontiguousarray(raw[r:r + step], dtype=np.uint8)
        n = chunk.shape[0]
        q, a, c = decode(chunk, ty)
        to_fp16(a, what), to_fp16(c, what)  # the kernels make these: refuse an overflow here
        qw[r:r + n] = torch.from_numpy(_pack_np(q, bits))
        b = chunk.reshape(-1, bb)
        if q4:
            sc, mn = _scale_min_k4(b[:, 4:16])  # [blocks, 8] each, in k order
            sub[r:r + n] = torch.from_numpy(np.stack([sc, mn], -1).reshape(n, K // 32, 2))
            sup[r:r + n] = torch.from_numpy(b[:, 0:4].copy().view(np.float16).reshape(n, K // QK_K, 2))
        else:
            sub[r:r + n] = torch.from_numpy(b[:, 192:208].copy().view(np.int8).reshape(n, K // 16))
            sup[r:r + n] = torch.from_numpy(b[:, 208:210].copy().view(np.float16).reshape(n, K // QK_K))
    return qw, sub, sup


def repack_sym(raw: np.ndarray, ty: str, bits: int, what: str = "tensor") -> tuple[torch.Tensor, torch.Tensor]:
    """raw [rows, row_bytes] of Q4_0, Q5_0 or Q8_0 -> (qweight int32, scales fp16 [rows, K/32]) in the SYM form of
    kernels/pack.py: codes q re-centred to q + 2^(bits-1) - c in `bits`-bit codes (c: SYM_CENTRE), so that the min is
    -2^(bits-1) d, made from the scale where read (no mins stored). The weights are repack()'s, bit for bit; a min
    that overflows fp16 is refused as repack() refuses one."""
    if ty not in SYM_CENTRE or bits < CODE_BITS[ty] or (bits, 32) not in pack.SYM_LAYOUTS:
        raise ValueError(f"{ty} has no SYM form with {bits}-bit codes")
    rows, off = raw.shape[0], (1 << (bits - 1)) - SYM_CENTRE[ty]
    K = raw.shape[1] // BLOCK_BYTES[ty] * 32
    pack.check_sym(bits, 32, K)
    qw = torch.empty(rows, pack.packed_words(K, bits), dtype=torch.int32)
    sc = torch.empty(rows, K // 32, dtype=torch.float16)
    step = max(1, ROWS_PER_CHUNK_ELEMS // K)
    for r in range(0, rows, step):
        q, a, _ = decode(np.asarray(raw[r:r + step]), ty)
        to_fp16(a * -float(1 << (bits - 1)), what)  # the min the kernels make: refuse an overflow here
        qw[r:r + step] = torch.from_numpy(_pack_np(q + np.uint8(off), bits))
        sc[r:r + step] = to_fp16(a, what)
    return qw, sc


def fused_qweight(parts: list, bias: torch.Tensor | None = None, layout: tuple | None = None,
                  what: str = "linear", mode: str = GGUF_PACK) -> QWeight:
    """GGUF tensors (engine.formats.gguf_file.GGUFTensor, rows concatenated in order: q|k|v, gate|up) -> one CPU
    QWeight in their exact layout for EngineConfig.gguf_pack `mode` (engine/formats/gguf_layout.py part_layout: the
    parts' common plain layout, or their KQ / SYM form), or `layout` when given (a plain superset of every part's)."""
    tys = [t.type_name for t in parts]
    if common_layout([REPACK.get(t) for t in tys]) is None:
        raise ValueError(f"{what}: types {tys} have no exact common layout")
    K = int(parts[0].shape[0])
    lay = layout or part_layout(tys, K, mode)
    b = None if bias is None else bias.half()
    if layout_form(lay) == "sym":
        out = [repack_sym(t.raw(), t.type_name, lay[0], what) for t in parts]
        qw, sc = (torch.cat([o[i] for o in out]) if len(out) > 1 else out[0][i] for i in range(2))
        return QWeight(qw.shape[0], K, lay[0], qweight=qw, scales=sc, mins=sc.new_empty(sc.shape[0], 0), bias=b,
                       group=32, form="sym")
    if layout_form(lay) == "kq":
        out = [repack_kq(t.raw(), t.type_name, lay[0], what) for t in parts]
        qw, sub, sup = (torch.cat([o[i] for o in out]) if len(out) > 1 else out[0][i] for i in range(3))
        return QWeight(qw.shape[0], K, lay[0], qweight=qw, scales=sub, mins=sup, bias=b, group=lay[1], form="kq")
    bits, group = lay
    out = [repack(t.raw(), t.type_name, bits, group, what) for t in parts]
    qw, sc, mn = (torch.cat([o[i] for o in out]) if len(out) > 1 else out[0][i] for i in range(3))
    return QWeight(qw.shape[0], K, bits, qweight=qw, scales=sc, mins=mn, bias=b, group=group)


def gguf_linear(parts: list, bias: torch.Tensor | None = None, fallback_bits: int = 4, what: str = "linear",
                mode: str = GGUF_PACK) -> QWeight:
    """GGUF tensors (rows concatenated in order) as one CPU QWeight: their exact layout when every part has one
    (fused_qweight; mode: EngineConfig.gguf_pack), else dequantized to float32 and quantized at fallback_bits,
    group 128 (F16/BF16/F32 linears: what the loader always did with them)."""
    if common_layout([REPACK.get(t.type_name) for t in parts]) is not None:
        return fused_qweight(parts, bias, what=what, mode=mode)
    w = torch.cat([torch.from_numpy(np.array(t.dequantize(), dtype=np.float32)) for t in parts])
    q, sc, mn = pack.quantize(w, fallback_bits)
    return QWeight(w.shape[0], w.shape[1], fallback_bits, qweight=pack.pack(q, fallback_bits), scales=sc, mins=mn,
                   bias=None if bias is None else bias.half())


def exactness_bound(codes: np.ndarray, a: np.ndarray, c: np.ndarray, group: int) -> np.ndarray:
    """Per-weight bound of |repacked - exact| (see the module docstring): q*e(s) + e(m) + float32 slack."""
    q = codes.astype(np.float64).reshape(codes.shape[0], -1, group)
    s, m = np.abs(a.astype(np.float64))[..., None], np.abs(c.astype(np.float64))[..., None]
    e = q * (2.0 ** -11 * s + 2.0 ** -25) + 2.0 ** -11 * m + 2.0 ** -25
    return (e + 2.0 ** -22 * (q * s + m)).reshape(codes.shape)
