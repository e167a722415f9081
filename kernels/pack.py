"""Packed weight layouts (the contract between checkpoints, GGUF repacks and kernels).

A linear weight W is [N out, K in] with y = x @ W.T. Quantization is asymmetric per group of `group`
consecutive k along K (K a multiple of 32, and of the group):

    w[n, k] = q[n, k] * scales[n, k // group] + mins[n, k // group]      q in [0, 2^bits - 1]

scales, mins: float16 [N, K // group] (one FMA per weight to dequantize). The group is not stored in
the packed words: it is K // scales.shape[1] (QWeight.group holds it too).

Supported (bits, group): (4, 128), (3, 128) our own W4/W3 quantization; (4, 32), (8, 32), (8, 16) the exact
repacks of GGUF blocks (engine/formats/gguf_kquant.py: Q4_K/Q4_0/Q4_1 -> (4, 32); Q5_K/Q5_0/Q5_1/Q8_0 ->
(8, 32); Q6_K -> (8, 16)); (6, 32), (6, 16) the 6-bit repacks of the 5- and 6-bit types (EngineConfig.gguf_pack
"6bit": 8 bits per weight with the scale and min against 10 for the bytes), and the KQ forms of (4, 32) / (6, 32) /
(6, 16) and the SYM forms of (4, 32) / (6, 32) / (8, 32) (below). bits 16 is a dense fp16 weight (no codes).
Anything else is a ValueError.

W4  qweight int32 [N, K // 8]:  q[n, k] = (qweight[n, k // 8] >> (4 * (k % 8))) & 0xF
W8  qweight int32 [N, K // 4]:  q[n, k] = (qweight[n, k // 4] >> (8 * (k % 4))) & 0xFF  (unsigned codes;
    little-endian, so the words viewed as uint8 are the codes in k order)
W3  qweight int32 [N, K // 32 * 3], N a multiple of 16. A block of 32 k-values of a row is 3 words (w0, w1, w2),
    j = k % 32. Code pair p = (j = p, j = p + 16), p = 0..15, sits in the two 16-bit halves:
        p < 15:  q[p] = (w[p // 5] >> 3 (p % 5)) & 7,   q[p + 16] = (w[p // 5] >> (16 + 3 (p % 5))) & 7
        p = 15:  bit i of q[15] is bit 15 of w_i, bit i of q[31] is bit 31 of w_i (i = 0, 1, 2)
    so a decode kernel turns 15 of the 16 pairs into fp16 pairs with one shift and one LOP3 each, as W4.
    Where the words sit (layout 3, "row pairs"): rows go in tiles of 16 (the 16 rows one decode warp reads), a
    tile's rows in pairs (g, g + 8), g = 0..7, and each pair's 128-k group (4 blocks b = 4 grp + t, t = 0..3) is 24
    consecutive words:
        word 4 t + 2 h + i   (i = 0, 1):  w_i of block t, row g + 8 h
        word 16 + 2 t + h:                w2 of block t, row g + 8 h
    at word ((tile * 8 + g) * K / 128 + grp) * 24 of the tensor. A decode lane (t) then reads both of its rows'
    words of a group with one 16-byte and one 8-byte load, and every 32-byte sector is read by one instruction
    (decode_gemv.cu). A tile's words are tensor rows 16 tile .. 16 tile + 15, so whole tiles can be sliced and
    concatenated along N like the other layouts; single rows cannot (unpack_rows). Checkpoints record the layout
    ("w3_layout": 3 in the manifest); older ones load converted: layout 2 (the same words row-major, an odd
    block's stored (w2, w0, w1)) by w3_from_layout2, layout 1 (the 2+1-bit split) by w3_from_layout1.
W6  qweight int32 [N, K // 128 * 24] (K a multiple of 128): per row and block of 128 k (b = k // 128), 24 words
    at 24 b: words 0..15 the low nibbles q & 15 exactly as W4 (word w: k = 128 b + 8 w .. + 7, nibble k % 8);
    words 16..23 the high two bits q >> 4: word 16 + 2 t + h holds k = 128 b + 32 t + 16 h + i, i = 0..15, with
    i = 8 u + 4 v + j (u, v in 0..1, j in 0..3) at bit 16 v + 2 slot(4 u + j), slot(l) = l // 2 + 4 (l % 2).
    So a decode lane t (k = 32 t .. 32 t + 31) reads its nibbles with one 16-byte load and its high bits with one
    8-byte load, and W4's code pair p (k = 8 (p // 4) + p % 4 and + 4: halves 0 and 1) finds its high bits in word
    h = p // 8 at slot(p % 8) of both halves: even pairs at slots 0..3, odd ones at 4..7, so that one shift of the
    word (-4, -2, 0, 2 for even pairs; 0, 2, 4, 6 for odd) puts them at bits 4..5 / 8..9 of each half, next to the
    nibble W4's unpack leaves at bits 0..3 / 4..7 (decode_gemv.cu w6_pair).
KQ  the K-quants' own scale structure (QWeight.kq; EngineConfig.gguf_pack "kquant"): the codes as W4 (from Q4_K)
    or W6 (from Q6_K), but instead of an fp16 scale and min per group, the integer sub-scales and the fp16
    super-block factors per 256 weights that the GGUF block stores, from which a kernel makes the fp16 scale and
    min of each group exactly as the repack rounds them (kq_expand: the product of an fp16 and a <= 8-bit integer
    is exact in float32, rounded to fp16 once):
    group 32, from Q4_K (4, 32) or Q5_K (6, 32): scales uint8 [N, K / 32, 2] = (sc, m) (6-bit), mins fp16
        [N, K / 256, 2] = (d, dmin):  s = fp16(d sc), min = fp16(-(dmin m))
        4.625 / 6.625 bits per weight (5 as (4, 32); 7 as (6, 32), 9 as (8, 32))
    group 16, from Q6_K (6, 16): scales int8 [N, K / 16] = sc, mins fp16 [N, K / 256] = d:
        s = fp16(d sc), min = fp16(-32 d sc)                                      6.5625 bits per weight (8 as W6)
    K a multiple of 256. A decode lane reads its group's (sc, m) or its two groups' sc as one 16-bit load.
SYM the symmetric 32-blocks' own structure (QWeight.sym; EngineConfig.gguf_pack "kquant"): Q4_0, Q5_0 and Q8_0 store
    one fp16 d per 32 weights and w = d (q - c), so the min is -c d: the codes re-centred in the container (code
    + 2^(bits - 1) - c) make it -2^(bits - 1) s, which a kernel makes from the scale (a power-of-two multiple of an
    fp16 is exact, so these are the plain layout's bits): scales fp16 [N, K / 32], mins fp16 [N, 0] (none stored):
        (4, 32) from Q4_0 4.5 bits per weight (5 as (4, 32)); (6, 32) from Q5_0 (or Q4_0 with it) 6.5 (7 as
        (6, 32), 9 as (8, 32)); (8, 32) from Q8_0 (or with Q4_0 / Q5_0 parts) 8.5 (9)     sym_mins makes the mins
Every layout is tight: no padding per row or tile (seed 5.7: a padding byte per row broke a kernel that assumed a
tight stride).
A 16-byte load (4 words) covers 32 W4 values, 16 W8 values; 3 words cover 32 W3 values; 6 words 32 W6 values.
"""
from __future__ import annotations

import torch

GROUP = 128  # our own quantizer's group (and the default of every group argument)
W3_LAYOUT = 3  # the W3 word layout this version writes and reads (module docstring; manifest "w3_layout")
# supported packed (bits, group); bits 16 = dense
LAYOUTS = ((4, 128), (3, 128), (4, 32), (8, 32), (8, 16), (6, 32), (6, 16))


def check_layout(bits: int, group: int = GROUP, K: int | None = None):
    """ValueError unless (bits, group) is a supported packed layout (and K fits it)."""
    if (bits, group) not in LAYOUTS:
        raise ValueError(f"unsupported packed layout bits={bits} group={group}: supported (bits, group) are "
                         f"{', '.join(map(str, LAYOUTS))} (bits 16 = dense fp16)")
    if K is not None and (K % group or K % 32):
        raise ValueError(f"K={K} is not a multiple of the group {group} (and of 32)")
    if K is not None and bits == 6 and K % 128:
        raise ValueError(f"K={K} is not a multiple of 128 (W6 words go in blocks of 128)")


KQ_LAYOUTS = ((4, 32), (6, 32), (6, 16))  # (bits, group) that have a KQ form (QWeight.kq); the group decides which


def check_kq(bits: int, group: int, K: int | None = None):
    if (bits, group) not in KQ_LAYOUTS:
        raise ValueError(f"no KQ layout for bits={bits} group={group}: {KQ_LAYOUTS}")
    if K is not None and K % 256:
        raise ValueError(f"K={K} is not a multiple of 256 (KQ super-blocks)")


def kq_expand(group: int, scales: torch.Tensor, mins: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A KQ layout's integer sub-scales and fp16 super-block factors (module docstring; the group says which form)
    -> the fp16 scales and mins [N, groups] of its plain layout, exactly (the kernels compute the same fp32 products
    and round them once), on the tensors' device."""
    if group == 32:  # scales uint8 [N, K/32, 2] = (sc, m), mins fp16 [N, K/256, 2] = (d, dmin); 8 groups per 256
        sup = mins.float().repeat_interleave(8, 1)  # [N, K/32, 2]
        sc, m = scales[..., 0].float(), scales[..., 1].float()
        return (sup[..., 0] * sc).half(), (-(sup[..., 1] * m)).half()
    if group == 16:  # scales int8 [N, K/16], mins fp16 [N, K/256] = d; 16 groups per 256
        a = mins.float().repeat_interleave(16, 1) * scales.float()
        return a.half(), (-32.0 * a).half()
    raise ValueError(f"no KQ layout for group {group}")


SYM_LAYOUTS = ((4, 32), (6, 32), (8, 32))  # (bits, group) that have a SYM form (QWeight.sym)


def check_sym(bits: int, group: int, K: int | None = None):
    if (bits, group) not in SYM_LAYOUTS:
        raise ValueError(f"no SYM layout for bits={bits} group={group}: {SYM_LAYOUTS}")
    check_layout(bits, group, K)


def sym_mins(bits: int, scales: torch.Tensor) -> torch.Tensor:
    """A SYM layout's mins (module docstring): -2^(bits - 1) x each fp16 scale, exact in fp16 (as the kernels make
    them), on the scales' device."""
    return (scales.float() * -float(1 << (bits - 1))).half()


def group_of(K: int, scales: torch.Tensor) -> int:
    """The group of a packed linear from its shapes (K // scales columns)."""
    G = scales.shape[-1]
    if G == 0 or K % G:
        raise ValueError(f"scales with {G} columns do not divide K={K}")
    return K // G


def quantize(w: torch.Tensor, bits: int, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest asymmetric quantization. w [N, K] -> (q uint8 [N, K], scales, mins fp16 [N, K/group])."""
    N, K = w.shape
    check_layout(bits, group, K)
    g = w.float().reshape(N, K // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    qmax = (1 << bits) - 1
    scales = ((hi - lo) / qmax).clamp_min(1e-8).half()
    mins = lo.half()
    s, m = scales.float().unsqueeze(-1), mins.float().unsqueeze(-1)
    q = torch.round((g - m) / s).clamp_(0, qmax).to(torch.uint8).reshape(N, K)
    return q, scales, mins


def dequantize(q: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
    """q uint8 [N, K] -> float32 [N, K]; the group is K // scales.shape[1]."""
    N, K = q.shape
    group = group_of(K, scales)
    g = q.float().reshape(N, K // group, group)
    return (g * scales.float().unsqueeze(-1) + mins.float().unsqueeze(-1)).reshape(N, K)


def pack_w4(q: torch.Tensor) -> torch.Tensor:
    N, K = q.shape
    v = q.to(torch.int64).reshape(N, K // 8, 8)
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    words = (v << shifts).sum(-1)
    return _to_int32(words)


def unpack_w4(qweight: torch.Tensor, K: int) -> torch.Tensor:
    N = qweight.shape[0]
    w = qweight.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    return ((w.unsqueeze(-1) >> shifts) & 0xF).reshape(N, K).to(torch.uint8)


def pack_w8(q: torch.Tensor) -> torch.Tensor:
    """q uint8 [N, K] -> int32 [N, K // 4] (byte k % 4 of word k // 4: the codes' own bytes, little-endian)."""
    N, K = q.shape
    v = q.to(torch.int64).reshape(N, K // 4, 4)
    return _to_int32((v << torch.arange(0, 32, 8, dtype=torch.int64)).sum(-1))


def unpack_w8(qweight: torch.Tensor, K: int) -> torch.Tensor:
    N = qweight.shape[0]
    w = qweight.to(torch.int64) & 0xFFFFFFFF
    return ((w.unsqueeze(-1) >> torch.arange(0, 32, 8, dtype=torch.int64)) & 0xFF).reshape(N, K).to(torch.uint8)


def w6_bit_pos() -> torch.Tensor:
    """int64 [4 t, 2 h, 16 i]: the bit of word 16 + 2 t + h that holds the high bits of k = 32 t + 16 h + i of a block
    (module docstring: i = 8 u + 4 v + j at 16 v + 2 slot(4 u + j))."""
    i = torch.arange(16, dtype=torch.int64)
    u, v, j = i >> 3, (i >> 2) & 1, i & 3
    pl = 4 * u + j
    return (16 * v + 2 * ((pl >> 1) + 4 * (pl & 1))).expand(4, 2, 16)


def pack_w6(q: torch.Tensor) -> torch.Tensor:
    """q uint8 [N, K] (codes 0..63, K a multiple of 128) -> int32 [N, K // 128 * 24] (module docstring)."""
    N, K = q.shape
    check_layout(6, 16, K)
    lo = pack_w4(q & 15).reshape(N, K // 128, 16)
    hi = (q.to(torch.int32) >> 4).reshape(N, K // 128, 4, 2, 16)  # int32: bit 31 wraps to the sign bit, as W3's
    words = (hi << w6_bit_pos().to(torch.int32)).sum(-1, dtype=torch.int32).reshape(N, K // 128, 8)
    return torch.cat([lo, words], -1).reshape(N, K // 128 * 24).contiguous()


def unpack_w6(qweight: torch.Tensor, K: int) -> torch.Tensor:
    """int32 [N, K // 128 * 24] -> uint8 codes [N, K], on the words' device (int32 shifts: the & drops sign bits)."""
    N, dev = qweight.shape[0], qweight.device
    w = qweight.reshape(N, K // 128, 24)
    lo = (w[..., :16].unsqueeze(-1) >> torch.arange(0, 32, 4, dtype=torch.int32, device=dev)) & 0xF  # [N, G, 16, 8]
    pos = w6_bit_pos().to(device=dev, dtype=torch.int32)
    hi = (w[..., 16:].reshape(N, K // 128, 4, 2, 1) >> pos) & 3  # [N, G, 4, 2, 16]
    return (lo.reshape(N, K) | (hi.reshape(N, K) << 4)).to(torch.uint8)


_ODD, _UNODD = [2, 0, 1], [1, 2, 0]  # layout 2: an odd block's stored order (w2, w0, w1), and back


def _w3_consts(device) -> tuple[torch.Tensor, torch.Tensor]:
    """(the 5 slot shifts of a 16-bit half, the 3 bit positions of pair 15's codes) on the words' device."""
    return (torch.arange(0, 15, 3, dtype=torch.int32, device=device),
            torch.arange(3, dtype=torch.int32, device=device))


def _w3_check_rows(N: int):
    if N % 16:
        raise ValueError(f"W3 needs a multiple of 16 rows (it has {N}): its words go in 16-row tiles "
                         "(kernels/pack.py, layout 3)")


def w3_pairs(words: torch.Tensor) -> torch.Tensor:
    """Row-major block words [N, K / 32, 3] (w0, w1, w2 per block) -> layout 3 int32 [N, K / 32 * 3]."""
    N, nb, _ = words.shape
    _w3_check_rows(N)
    G = nb // 4
    v = words.reshape(N // 16, 2, 8, G, 4, 3)  # [tile, h, g, grp, t, w]
    a = v[..., :2].permute(0, 2, 3, 4, 1, 5).reshape(N // 16, 8, G, 16)  # [tile, g, grp, (t, h, i)]
    b = v[..., 2].permute(0, 2, 3, 4, 1).reshape(N // 16, 8, G, 8)  # [tile, g, grp, (t, h)]
    return torch.cat([a, b], -1).reshape(N, nb * 3).contiguous()


def w3_rows(qweight: torch.Tensor) -> torch.Tensor:
    """Layout 3 int32 [N, K / 32 * 3] -> the row-major block words [N, K / 32, 3] (inverse of w3_pairs)."""
    N, W = qweight.shape
    _w3_check_rows(N)
    G = W // 12
    v = qweight.reshape(N // 16, 8, G, 24)
    a = v[..., :16].reshape(N // 16, 8, G, 4, 2, 2).permute(0, 4, 1, 2, 3, 5)  # [tile, h, g, grp, t, i]
    b = v[..., 16:].reshape(N // 16, 8, G, 4, 2).permute(0, 4, 1, 2, 3).unsqueeze(-1)
    return torch.cat([a, b], -1).reshape(N, G * 4, 3)


def pack_w3(q: torch.Tensor) -> torch.Tensor:
    """q uint8 [N, K] (codes 0..7) -> int32 [N, K // 32 * 3], layout 3 (module docstring); int32 throughout (a code
    shifted into bit 31 wraps to the sign bit, which is the word's bit 31), on q's device."""
    N, K = q.shape
    if K % 128:
        raise ValueError("K must be a multiple of 128 for W3")
    _w3_check_rows(N)
    s3, b3 = _w3_consts(q.device)
    v = q.to(torch.int32).reshape(N, K // 32, 32)
    lo, hi = v[..., :15].reshape(N, K // 32, 3, 5), v[..., 16:31].reshape(N, K // 32, 3, 5)
    words = ((lo << s3) | (hi << (s3 + 16))).sum(-1, dtype=torch.int32)  # disjoint bits: sum = or; [N, K/32, 3]
    words |= ((v[..., 15:16] >> b3) & 1) << 15
    words |= ((v[..., 31:32] >> b3) & 1) << 31
    return w3_pairs(words)


def _w3_codes(w: torch.Tensor) -> torch.Tensor:
    """Row-major block words [N, K / 32, 3] -> uint8 codes [N, K]."""
    N, nb, _ = w.shape
    s3, b3 = _w3_consts(w.device)
    w = w.to(torch.int32).unsqueeze(-1)
    lo = ((w >> s3) & 7).reshape(N, nb, 15)  # arithmetic shifts: the & keeps the right bits
    hi = ((w >> (s3 + 16)) & 7).reshape(N, nb, 15)
    q15 = (((w[..., 0] >> 15) & 1) << b3).sum(-1, keepdim=True, dtype=torch.int32)
    q31 = (((w[..., 0] >> 31) & 1) << b3).sum(-1, keepdim=True, dtype=torch.int32)
    return torch.cat([lo, q15, hi, q31], -1).reshape(N, nb * 32).to(torch.uint8)


def unpack_w3(qweight: torch.Tensor, K: int) -> torch.Tensor:
    """int32 [N, K // 32 * 3] (layout 3) -> uint8 codes [N, K], on the words' device (the CPU unpack, the torch
    prefill's dequant)."""
    return _w3_codes(w3_rows(qweight))


def unpack_rows(qweight: torch.Tensor, rows: torch.Tensor, K: int, bits: int) -> torch.Tensor:
    """Codes uint8 [R, K] of the rows `rows` (int64 [R]) of a packed qweight: W3 words sit in 16-row tiles, so its
    rows are taken from their tiles' unpacked codes."""
    if bits != 3:
        return unpack(qweight[rows], K, bits)
    N, W = qweight.shape
    tiles, inv = torch.unique(rows // 16, return_inverse=True)
    q = unpack_w3(qweight.reshape(N // 16, 16, W)[tiles].reshape(-1, W), K).reshape(len(tiles), 16, K)
    return q[inv, rows % 16]


def dequantize_rows(qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, rows: torch.Tensor, K: int,
                    bits: int) -> torch.Tensor:
    """float32 [R, K]: the rows `rows` (int64 [R]) of a packed weight, dequantized (unpack_rows: W3 from whole tiles)."""
    return dequantize(unpack_rows(qweight, rows, K, bits), scales[rows], mins[rows])


def w3_from_layout2(qweight: torch.Tensor, K: int) -> torch.Tensor:
    """A layout-2 W3 qweight (row-major words, odd blocks stored (w2, w0, w1)) as layout 3: the same words moved."""
    N = qweight.shape[0]
    w = qweight.reshape(N, K // 32, 3).clone()
    w[:, 1::2] = w[:, 1::2][:, :, _UNODD]
    return w3_pairs(w)


def unpack_w3_layout1(qweight: torch.Tensor, K: int) -> torch.Tensor:
    """Codes of the W3 layout of checkpoints before "w3_layout": 2: per block of 32, w0 / w1 hold the 2-bit lows of
    j < 16 / j >= 16 at bits 2 (j % 16), w2 bit j the high bit."""
    N = qweight.shape[0]
    w = (qweight.to(torch.int64) & 0xFFFFFFFF).reshape(N, K // 32, 3)
    s2 = torch.arange(0, 32, 2, dtype=torch.int64)
    low = torch.cat([(w[..., 0:1] >> s2) & 3, (w[..., 1:2] >> s2) & 3], -1)
    high = (w[..., 2:3] >> torch.arange(32, dtype=torch.int64)) & 1
    return (low | (high << 2)).reshape(N, K).to(torch.uint8)


def w3_from_layout1(qweight: torch.Tensor, K: int, rows: int = 4096) -> torch.Tensor:
    """A layout-1 W3 qweight as layout 3 (the same codes), in row chunks of whole tiles (bounded int64 work)."""
    out = torch.empty_like(qweight)
    for r in range(0, qweight.shape[0], rows):
        out[r:r + rows] = pack_w3(unpack_w3_layout1(qweight[r:r + rows], K))
    return out


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    words = words & 0xFFFFFFFF
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


_PACK = {4: (pack_w4, unpack_w4), 3: (pack_w3, unpack_w3), 8: (pack_w8, unpack_w8), 6: (pack_w6, unpack_w6)}


def _codec(bits: int):
    if bits not in _PACK:
        raise ValueError(f"no packed layout for bits={bits} (4, 3, 6 or 8; 16 is dense)")
    return _PACK[bits]


def pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    return _codec(bits)[0](q)


def unpack(qweight: torch.Tensor, K: int, bits: int) -> torch.Tensor:
    return _codec(bits)[1](qweight, K)


def packed_words(K: int, bits: int) -> int:
    """int32 words per row."""
    _codec(bits)
    return {4: K // 8, 8: K // 4, 3: K // 32 * 3, 6: K // 128 * 24}[bits]


def regroup(scales: torch.Tensor, mins: torch.Tensor, group: int, new_group: int):
    """The same weights with a finer group (new_group divides group): each scale/min repeated group // new_group
    times along K. Exact: w = q * s + m is unchanged for every k."""
    if group % new_group:
        raise ValueError(f"group {new_group} does not divide {group}")
    r = group // new_group
    return scales.repeat_interleave(r, -1), mins.repeat_interleave(r, -1)


def widen(qweight: torch.Tensor, K: int, bits: int, new_bits: int) -> torch.Tensor:
    """The same codes in a wider packing (4 -> 6 -> 8): exact (codes 0..15 are valid 6- and 8-bit codes)."""
    if new_bits == bits:
        return qweight
    if new_bits < bits:
        raise ValueError(f"cannot narrow {bits}-bit codes to {new_bits} bits")
    return pack(unpack(qweight, K, bits), new_bits)


def tile_rows(t: torch.Tensor, K: int, tile: int = 16) -> torch.Tensor:
    """Row-major [N, words or scales of K] -> 16-row-tile-major: [N/16][K/128][16][per-block] flattened back to
    [N, same] (the layout decode_gemv.cu reads with GEMV_TILED: one warp's 16 rows of a 128-block contiguous).
    Works for qweight (per = its words per 128 codes) and for scales/mins (per = 128 / group)."""
    N, W = t.shape
    G = K // 128
    per = W // G
    return t.reshape(N // tile, tile, G, per).permute(0, 2, 1, 3).contiguous().reshape(N, W)
