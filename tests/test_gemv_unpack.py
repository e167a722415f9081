"""The decode GEMV's code unpacking (kernels/decode_gemv.cu, GEMV_UNPACK2) emulated bit for bit with numpy: every
pair of codes OR'ed into its magic reads as off + q in fp16 exactly, and the W3 mma pairing takes each of the 16
pairs once, k 0..7 of every mma from an offset-1024 pair and k 8..15 from an offset-128 one (so T = sum off x is one
constant row of the ones-mma). The GPU kernels themselves are checked against gemv_ref on the device."""
import numpy as np

MAGIC, MAGIC64, MAGIC128 = 0x64006400, 0x54005400, 0x58005800


def halves(v: np.ndarray) -> np.ndarray:  # uint32 pairs -> the two fp16 values (low half first)
    return np.stack([(v & 0xFFFF).astype(np.uint16), (v >> 16).astype(np.uint16)], -1).view(np.float16)


def and_or(a, mask, c):
    return (a & np.uint32(mask)) | np.uint32(c)


def w4_pair(w, p):  # decode_gemv.cu w4_pair, GEMV_UNPACK2
    v = w >> np.uint32(8) if p & 2 else w
    return and_or(v, 0x00F000F0, MAGIC64) if p & 1 else and_or(v, 0x000F000F, MAGIC)


def w3_pair(w0, w1, w2, p):  # decode_gemv.cu w3_pair, GEMV_UNPACK2
    if p == 15:
        b0 = and_or(w0 >> np.uint32(15), 0x00010001, MAGIC)
        b1 = and_or(w1 >> np.uint32(14), 0x00020002, b0)
        return and_or(w2 >> np.uint32(13), 0x00040004, b1)
    w, j = (w0, w1, w2)[p // 5], p % 5
    if j == 2:
        return and_or(w >> np.uint32(3), 0x00380038, MAGIC128) if p < 10 else and_or(w >> np.uint32(6), 0x00070007, MAGIC)
    v = w >> np.uint32(9) if j >= 3 else w
    return and_or(v, 0x00070007, MAGIC) if j in (0, 3) else and_or(v, 0x00380038, MAGIC128)


W3_LO, W3_HI = [0, 3, 5, 8, 10, 13, 12, 15], [1, 4, 6, 9, 11, 14, 2, 7]


def test_w4_pairs_read_offset_plus_code():
    rng = np.random.default_rng(0)
    w = rng.integers(0, 2 ** 32, 4096, dtype=np.uint64).astype(np.uint32)
    for p in range(4):  # pair p of a word: nibble p of each 16-bit half
        q = np.stack([(w >> np.uint32(4 * p)) & 0xF, (w >> np.uint32(16 + 4 * p)) & 0xF], -1).astype(np.float32)
        off = 64.0 if p & 1 else 1024.0
        np.testing.assert_array_equal(halves(w4_pair(w, p)).astype(np.float32), off + q)


def test_w3_pairs_read_offset_plus_code_and_pair_up_by_offset():
    rng = np.random.default_rng(1)
    w0, w1, w2 = (rng.integers(0, 2 ** 32, 4096, dtype=np.uint64).astype(np.uint32) for _ in range(3))

    def code(p, half):  # layout 3: pair p < 15 in slot p % 5 of word p // 5; pair 15 = bits 15 of the three words
        s = 16 * half
        if p < 15:
            return ((w0, w1, w2)[p // 5] >> np.uint32(s + 3 * (p % 5))) & 7
        return ((w0 >> np.uint32(s + 15)) & 1) | (((w1 >> np.uint32(s + 15)) & 1) << 1) | \
            (((w2 >> np.uint32(s + 15)) & 1) << 2)

    assert sorted(W3_LO + W3_HI) == list(range(16))
    for p in range(16):
        off = 1024.0 if p in W3_LO else 128.0
        q = np.stack([code(p, 0), code(p, 1)], -1).astype(np.float32)
        np.testing.assert_array_equal(halves(w3_pair(w0, w1, w2, p)).astype(np.float32), off + q)


def test_the_kernel_source_pairs_as_emulated():
    import re
    from pathlib import Path
    src = (Path(__file__).resolve().parents[1] / "kernels" / "decode_gemv.cu").read_text()
    tables = {n: [int(x) for x in v.split(",")] for n, v in re.findall(r"constexpr int (lo|hi)\[8\] = \{([^}]*)\}", src)}
    assert tables == {"lo": W3_LO, "hi": W3_HI}
    assert "#define MAGIC64 0x54005400u" in src and "#define W3_OFF_HI 0x58005800u" in src
