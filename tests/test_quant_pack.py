"""Fast pack/unpack/quantize helpers (engine/quant/quantize.py) against the layout contract (pack.py)."""
import torch

from kernels import pack
from engine.quant.quantize import dequantize_matrix, pack_fast, quantize_clip, quantize_matrix, unpack_fast


def test_fast_pack_unpack_match_the_contract():
    g = torch.Generator().manual_seed(0)
    for bits in (4, 3):
        q = torch.randint(0, 1 << bits, (37, 384), dtype=torch.uint8, generator=g)
        words = pack.pack(q, bits)
        assert torch.equal(pack_fast(q, bits), words)
        assert torch.equal(unpack_fast(words, 384, bits), q)
        assert words.shape == (37, pack.packed_words(384, bits))


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
    w = torch.randn(700, 256) * 0.05
    for bits in (4, 3):
        d = quantize_matrix(w, bits)
        q, s, m = quantize_clip(w, bits)
        assert torch.equal(d["qweight"], pack.pack(q, bits))
        assert torch.equal(dequantize_matrix(d["qweight"], d["scales"], d["mins"], bits), pack.dequantize(q, s, m))
