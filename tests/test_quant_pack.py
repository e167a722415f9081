"""Fast pack/unpack/quantize helpers (engine/quant/quantize.py) against the layout contract (pack.py)."""
import pytest
import torch

from kernels import pack
from engine.quant.quantize import dequantize_matrix, pack_fast, quantize_clip, quantize_matrix, unpack_fast


def test_fast_pack_unpack_match_the_contract():
    g = torch.Generator().manual_seed(0)
    for bits, N in ((4, 37), (3, 48)):
        q = torch.randint(0, 1 << bits, (N, 384), dtype=torch.uint8, generator=g)
        words = pack.pack(q, bits)
        assert torch.equal(pack_fast(q, bits), words)
        assert torch.equal(unpack_fast(words, 384, bits), q)
        assert words.shape == (N, pack.packed_words(384, bits))
        rows = torch.tensor([N - 1, 0, 17, 17, 5])
        assert torch.equal(pack.unpack_rows(words, rows, 384, bits), q[rows])
        sc, mn = torch.rand(N, 3, generator=g).half(), torch.rand(N, 3, generator=g).half()
        assert torch.equal(pack.dequantize_rows(words, sc, mn, rows, 384, bits), pack.dequantize(q, sc, mn)[rows])
    with pytest.raises(ValueError, match="multiple of 16 rows"):
        pack.pack(torch.zeros(37, 384, dtype=torch.uint8), 3)


def test_w3_layout_follows_the_contract():
    """W3 (kernels/pack.py): pair p = (j = p, p + 16) of each block of 32 in the 3-bit slots of word p // 5, pair 15
    one bit per word at bits 15 / 31; the words in layout 3 (16-row tiles, rows g and g + 8 paired, 24 words per
    pair and group); and the conversions from layouts 1 and 2 of older checkpoints."""
    g = torch.Generator().manual_seed(4)
    N, K = 32, 256
    G = K // 128
    q = torch.randint(0, 8, (N, K), dtype=torch.uint8, generator=g)
    flat = pack.pack(q, 3).reshape(-1).to(torch.int64) & 0xFFFFFFFF
    for n in range(N):
        pair, hh = (n // 16) * 8 + n % 8, (n // 8) % 2
        for k in range(K):
            b, j = divmod(k, 32)
            grp, t = divmod(b, 4)
            base = (pair * G + grp) * 24
            wi = [base + 4 * t + 2 * hh, base + 4 * t + 2 * hh + 1, base + 16 + 2 * t + hh]  # w0, w1, w2
            p, h = j % 16, 16 * (j // 16)
            if p < 15:
                got = (flat[wi[p // 5]] >> (3 * (p % 5) + h)) & 7
            else:
                got = sum(((flat[wi[i]] >> (15 + h)) & 1) << i for i in range(3))
            assert int(got) == int(q[n, k]), (n, k)
    s2 = torch.arange(0, 32, 2, dtype=torch.int64)  # layout 1 words of the same codes
    v = q.to(torch.int64).reshape(N, K // 32, 32)
    old = torch.stack([((v[..., :16] & 3) << s2).sum(-1), ((v[..., 16:] & 3) << s2).sum(-1),
                       (((v >> 2) & 1) << torch.arange(32)).sum(-1)], -1).reshape(N, K // 32 * 3)
    old = torch.where(old >= 2**31, old - 2**32, old).to(torch.int32)
    assert torch.equal(pack.unpack_w3_layout1(old, K), q)
    assert torch.equal(pack.w3_from_layout1(old, K, rows=16), pack.pack(q, 3))
    l2 = pack.w3_rows(pack.pack(q, 3)).clone()  # layout 2: the words row-major, an odd block's stored (w2, w0, w1)
    l2[:, 1::2] = l2[:, 1::2][:, :, [2, 0, 1]]
    assert torch.equal(pack.w3_from_layout2(l2.reshape(N, -1), K), pack.pack(q, 3))


def test_clip_search_never_worse_than_round_to_nearest():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 256, generator=g) * 0.02
    w[::7, ::13] *= 12  # outliers: where clipping helps
    for bits in (4, 3):
        q0, s0, m0 = pack.quantize(w, bits)
        q1, s1, m1 = quantize_clip(w, bits)
        e0 = (pack.dequantize(q0, s0, m0) - w).pow(2).sum()
        e1 = (pack.dequantize(q1, s1, m1) - w).pow(2).sum()
        assert e1 <= e0 * 1.0001
        if bits == 3:
            assert e1 < 0.95 * e0


def test_quantize_matrix_round_trip_in_row_chunks(monkeypatch):
    import engine.quant.quantize as qz

    monkeypatch.setattr(qz, "ELEMS_PER_CHUNK", 256 * 100)  # force several chunks
    w = torch.randn(704, 256) * 0.05  # chunks of 256, 256, 192 rows (whole 16-row tiles, as W3 needs)
    for bits in (4, 3):
        d = quantize_matrix(w, bits)
        q, s, m = quantize_clip(w, bits)
        assert torch.equal(d["qweight"], pack.pack(q, bits))
        assert torch.equal(dequantize_matrix(d["qweight"], d["scales"], d["mins"], bits), pack.dequantize(q, s, m))


def test_w8_and_group_layouts_follow_the_contract():
    """W8: q = (word >> 8*(k%4)) & 0xFF; groups 32/16: w = q * s[k // group] + m (kernels/pack.py)."""
    g = torch.Generator().manual_seed(3)
    q = torch.randint(0, 256, (5, 64), dtype=torch.uint8, generator=g)
    words = pack.pack(q, 8)
    assert words.shape == (5, 16) == (5, pack.packed_words(64, 8))
    k = torch.arange(64)
    by_formula = (words.to(torch.int64)[:, k // 4] >> (8 * (k % 4))) & 0xFF
    assert torch.equal(by_formula.to(torch.uint8), q)
    assert torch.equal(pack.unpack(words, 64, 8), q) and torch.equal(unpack_fast(words, 64, 8), q)
    assert torch.equal(pack_fast(q, 8), words)
    w = torch.randn(16, 256, generator=g)  # 16 rows: W3 words go in 16-row tiles
    for bits, group in pack.LAYOUTS:
        qq, s, m = pack.quantize(w, bits, group)
        assert s.shape == (16, 256 // group)
        d = pack.dequantize(qq, s, m)
        manual = qq.float() * s.float().repeat_interleave(group, 1) + m.float().repeat_interleave(group, 1)
        assert torch.equal(d, manual)
        words = pack.pack(qq, bits)
        assert torch.equal(dequantize_matrix(words, s, m, bits, group=group), d)
    for bits, group in ((4, 64), (3, 32), (8, 128), (2, 128), (5, 32)):
        with pytest.raises(ValueError):
            pack.quantize(w, bits, group)


def test_widen_and_regroup_are_exact():
    """(4,32) -> (8,32) -> (8,16): same codes, scales/mins repeated: identical dequantized weights."""
    g = torch.Generator().manual_seed(4)
    w = torch.randn(7, 128, generator=g)
    q, s, m = pack.quantize(w, 4, 32)
    d = pack.dequantize(q, s, m)
    w8 = pack.widen(pack.pack(q, 4), 128, 4, 8)
    s16, m16 = pack.regroup(s, m, 32, 16)
    assert torch.equal(pack.dequantize(pack.unpack(w8, 128, 8), s16, m16), d)
    with pytest.raises(ValueError):
        pack.regroup(s, m, 32, 64)


def test_decode_references_read_the_group():
    from kernels.decode_reference import dense_weight, embed_ref, gemv_ref
    from kernels.qweight import QWeight

    g = torch.Generator().manual_seed(5)
    w = torch.randn(40, 96, generator=g)
    for bits, group in ((8, 16), (8, 32), (4, 32)):
        q, s, m = pack.quantize(w, bits, group)
        qw = QWeight(40, 96, bits, qweight=pack.pack(q, bits), scales=s, mins=m, group=group)
        d = pack.dequantize(q, s, m)
        assert torch.equal(dense_weight(qw), d)
        x = torch.randn(3, 96, generator=g).half()
        # each row multiplied alone (the kernels' contract): exactly the rows' own products with the group's weights
        assert torch.equal(gemv_ref(x, qw), torch.cat([r.float() @ d.T for r in x.split(1)]))
        # ... and the batch product's values (MKL sums a B-row product in another order: last bits differ)
        assert torch.allclose(gemv_ref(x, qw), x.float() @ d.T, rtol=1e-5, atol=1e-4)
        assert torch.equal(gemv_ref(x, qw)[1], gemv_ref(x[1:2], qw)[0])
        assert torch.equal(embed_ref(torch.tensor([3, 0, 39]), qw), d[[3, 0, 39]])
    bad = QWeight(40, 96, 8, qweight=pack.pack(q, 8), scales=s, mins=m, group=16)  # scales are of group 32
    with pytest.raises(ValueError):
        dense_weight(bad)
