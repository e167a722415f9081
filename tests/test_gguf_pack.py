"""How a GGUF's blocks are repacked (EngineConfig.gguf_pack): "6bit" (the 5- and 6-bit types as kernels/pack.py W6
codes) and "kquant" (also the K-quants' own integer sub-scales, pack.py KQ) against "bytes". The words follow the
contract, the bit tricks the decode kernels use on them (decode_gemv.cu w6_pair and kq_scales, decode_misc.cu
embed_rows, modelled here step by step) read the right codes and scales, each repack holds the very weights the byte
layouts hold, the memory plan counts its bytes, and the GPU step on the kernels' references answers as with the
bytes."""
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.config import ModelConfig
from engine.errors import ModelFileError
from engine.formats.gguf_kquant import BLOCK_BYTES, fused_qweight, repack, repack_kq, repack_sym
from engine.formats.gguf_layout import KQ, REPACK, REPACK6, common_layout, linear_layouts, part_layout
from engine.quant.random_gguf import random_blocks
from kernels import pack
from kernels.decode_reference import dense_weight
from kernels.qweight import QWeight
from tests.test_gguf_kquant import _T  # what fused_qweight reads of a GGUFTensor

MAGIC, MAGIC64 = 0x64006400, 0x54005400


def _halves(c: int) -> tuple[float, float]:
    return tuple(np.array([c & 0xFFFF, c >> 16], dtype=np.uint16).view(np.float16).astype(float))


def _w6_pair(lo: list[int], hi: list[int], p: int) -> int:
    """decode_gemv.cu w6_pair on a lane's 4 nibble words and 2 high-bit words (uint32): W4's two-mask unpack, then
    the high bits shifted next to the nibble and OR'ed in under a mask (the LOP3)."""
    w = lo[p >> 2] >> 8 if p & 2 else lo[p >> 2]
    c = (w & 0x00F000F0) | MAGIC64 if p & 1 else (w & 0x000F000F) | MAGIC
    h, l = hi[p >> 3], p & 7
    if l & 1:
        return ((h >> 2 * (l >> 1)) & 0x03000300) | c
    sh = 2 * (l >> 1) - 4
    return ((h >> sh if sh >= 0 else (h << -sh) & 0xFFFFFFFF) & 0x00300030) | c


def test_w6_words_follow_the_contract_and_the_kernels_unpack():
    g = torch.Generator().manual_seed(6)
    q = torch.randint(0, 64, (8, 256), dtype=torch.uint8, generator=g)
    words = pack.pack(q, 6)
    assert words.shape == (8, pack.packed_words(256, 6)) == (8, 48)  # 6 bits a weight, no padding
    assert torch.equal(pack.unpack(words, 256, 6), q)
    u = (words.to(torch.int64) & 0xFFFFFFFF).tolist()
    for n in range(8):
        for b in range(2):  # blocks of 128
            blk = u[n][24 * b:24 * b + 24]
            for t in range(4):  # decode lane t: k = 32 t .. 32 t + 31 of the block
                lo, hi = blk[4 * t:4 * t + 4], blk[16 + 2 * t:18 + 2 * t]
                for p in range(16):  # W4's pair p: k = 8 (p // 4) + p % 4 and + 4, at W4's offsets 1024 / 64
                    k0 = 128 * b + 32 * t + 8 * (p >> 2) + (p & 3)
                    off = 64 if p & 1 else 1024
                    got = [v - off for v in _halves(_w6_pair(lo, hi, p))]
                    assert got == [int(q[n, k0]), int(q[n, k0 + 4])], (n, b, t, p)
            for kk in range(128):  # decode_misc.cu embed_rows' gather of one code
                i = kk & 15
                l = 4 * (i >> 3) + (i & 3)
                bit = 16 * ((i >> 2) & 1) + 2 * ((l >> 1) + 4 * (l & 1))
                code = ((blk[kk >> 3] >> 4 * (kk & 7)) & 0xF) | (((blk[16 + (kk >> 4)] >> bit) & 3) << 4)
                assert code == int(q[n, 128 * b + kk])
    with pytest.raises(ValueError, match="multiple of 128"):
        pack.quantize(torch.randn(4, 160), 6, 32)


def _raw(ty: str, rows: int, rng) -> np.ndarray:
    per_row = 2 if ty.endswith("_K") else 16  # 512 weights a row
    return random_blocks(ty, rows * per_row, rng).reshape(rows, -1)


@pytest.mark.parametrize("ty", ["Q6_K", "Q5_K", "Q5_0", "Q5_1"])
def test_six_bit_repack_holds_the_byte_layouts_weights(ty):
    rng = np.random.default_rng(3)
    raw = _raw(ty, 6, rng)
    assert REPACK6[ty][0] == 6 and REPACK6[ty][1] == REPACK[ty][1]
    outs = {}
    for bits, group in (REPACK[ty], REPACK6[ty]):
        qw, s, m = repack(raw, ty, bits, group)
        outs[bits] = pack.dequantize(pack.unpack(qw, 512, bits), s, m)
        assert qw.shape[1] == pack.packed_words(512, bits)
    assert torch.equal(outs[6], outs[8])
    with pytest.raises(ValueError, match="does not fit"):
        repack(raw, ty, 4, REPACK[ty][1])  # 5- and 6-bit codes do not fit 4 bits


def _kq(raw, ty):
    qw, sub, sup = repack_kq(raw, ty)
    bits, group, _ = KQ[ty]
    return QWeight(raw.shape[0], raw.shape[1] // BLOCK_BYTES[ty] * 256, bits, qweight=qw, scales=sub, mins=sup,
                   group=group, form="kq")


@pytest.mark.parametrize("ty", ["Q4_K", "Q5_K", "Q6_K"])
def test_kq_form_holds_the_same_weights_in_fewer_bytes(ty):
    """The KQ form (integer sub-scales + fp16 factors per 256) makes the plain layout's fp16 scales and mins bit for
    bit (pack.kq_expand), at 4.625 / 6.625 / 6.5625 bits a weight; the GPU's rows read from it alike."""
    rng = np.random.default_rng(5)
    raw = _raw(ty, 12, rng)
    kq = _kq(raw, ty)
    bits, group = REPACK6[ty]
    qw, s, m = repack(raw, ty, bits, group)
    plain = QWeight(12, 512, bits, qweight=qw, scales=s, mins=m, group=group)
    es, em = kq.fp16_scales()
    assert torch.equal(es, s) and torch.equal(em, m)
    assert torch.equal(dense_weight(kq), dense_weight(plain))
    rows = torch.tensor([11, 0, 5])
    assert torch.equal(dense_weight(kq, rows), dense_weight(plain)[rows])
    assert kq.nbytes() * 8 / (12 * 512) == {"Q4_K": 4.625, "Q5_K": 6.625, "Q6_K": 6.5625}[ty]
    from engine.runtime.memory_plan import linear_bytes
    assert kq.nbytes() == linear_bytes(12, 512, *KQ[ty])
    from kernels.prefill_torch import dequant_rows
    assert torch.equal(dequant_rows(kq, 2, 8).float(), dense_weight(plain)[2:10].half().float())
    from engine.model.host_embed import HostEmbedding  # an embedding kept in host RAM reads its rows alike
    assert torch.equal(HostEmbedding(kq).rows([7, 1]), dense_weight(plain)[[7, 1]])


def _kq_scales_model(sc_words: np.ndarray, sup: np.ndarray, group: int, r: int, grp: int, t: int, G: int):
    """decode_gemv.cu kq_scales on the raw words: one 16-bit word of sub-scales at (r G + grp) 4 + t, the factors per
    256 at r G / 2 + grp / 2 (one 32-bit (d, dmin) word, or one fp16 d), fp32 products rounded to fp16 once."""
    v = int(sc_words[(r * G + grp) * 4 + t])
    sb = r * (G >> 1) + (grp >> 1)
    f16 = lambda x: np.float32(np.float16(x))  # noqa: E731 - cvt.rn.f16.f32
    if group == 32:
        dd = int(sup.view(np.uint32).reshape(-1)[sb])
        d, dmin = (np.array([dd & 0xFFFF, dd >> 16], np.uint16).view(np.float16).astype(np.float32))
        return [f16(d * np.float32(v & 0xFF))], [f16(-(dmin * np.float32(v >> 8)))]
    d = np.float32(sup.reshape(-1)[sb])
    a = [d * np.float32(np.int8(np.uint8((v >> (8 * e)) & 0xFF))) for e in range(2)]
    return [f16(x) for x in a], [f16(np.float32(-32.0) * x) for x in a]


@pytest.mark.parametrize("ty", ["Q4_K", "Q5_K", "Q6_K"])
def test_kernels_make_the_kq_scales_from_the_words(ty):
    """The decode GEMV's and the embedding's KQ scale loads (decode_gemv.cu kq_scales, decode_misc.cu embed_rows)
    modelled on the tensors' bytes give pack.kq_expand's scales and mins for every lane, row and block."""
    kq = _kq(_raw(ty, 5, np.random.default_rng(9)), ty)
    s, m = (t.float().numpy() for t in kq.fp16_scales())
    G = kq.K // 128
    words = kq.scales.contiguous().view(-1).numpy().view(np.uint16)
    sup = kq.mins.contiguous().numpy()
    for r in range(5):
        for grp in range(G):
            for t in range(4):
                ms, mm = _kq_scales_model(words, sup, kq.group, r, grp, t, G)
                for e in range(len(ms)):  # the lane's group(s): 32 t .. of the block, or its two 16s
                    gi = (grp * 128 + 32 * t) // kq.group + e
                    assert ms[e] == s[r, gi] and mm[e] == m[r, gi], (r, grp, t, e)
    # embed_rows: element k of row r from the sub-scale byte of its group and the factor of its 256
    sub_b = kq.scales.contiguous().view(-1).numpy().view(np.uint8)
    f16 = lambda x: np.float32(np.float16(x))  # noqa: E731
    for r, k in ((0, 0), (3, 300), (4, 511)):
        sb = r * (kq.K >> 8) + (k >> 8)
        if kq.group == 32:
            i = (r * (kq.K >> 5) + (k >> 5)) * 2
            d, dmin = sup.reshape(-1)[2 * sb].astype(np.float32), sup.reshape(-1)[2 * sb + 1].astype(np.float32)
            es, em = f16(d * np.float32(sub_b[i])), f16(-(dmin * np.float32(sub_b[i + 1])))
        else:
            a = sup.reshape(-1)[sb].astype(np.float32) * np.float32(sub_b.view(np.int8)[r * (kq.K >> 4) + (k >> 4)])
            es, em = f16(a), f16(np.float32(-32.0) * a)
        assert es == s[r, k // kq.group] and em == m[r, k // kq.group]


def test_kq_overflow_is_refused():
    b = random_blocks("Q6_K", 2, np.random.default_rng(0))
    b[:, 208:210] = np.array([60000.0], np.float16).view(np.uint8)
    with pytest.raises(ModelFileError, match="overflows fp16"):
        repack_kq(b.reshape(1, -1), "Q6_K")


def _sym(raw, ty, bits):
    qw, sc = repack_sym(raw, ty, bits)
    return QWeight(raw.shape[0], raw.shape[1] // BLOCK_BYTES[ty] * 32, bits, qweight=qw, scales=sc,
                   mins=sc.new_empty(sc.shape[0], 0), group=32, form="sym")


@pytest.mark.parametrize("ty,bits", [("Q4_0", 4), ("Q4_0", 6), ("Q4_0", 8), ("Q5_0", 6), ("Q5_0", 8), ("Q8_0", 8)])
def test_sym_form_holds_the_same_weights_in_fewer_bytes(ty, bits):
    """The SYM form (Q4_0 / Q5_0 / Q8_0: one fp16 scale per 32, codes re-centred so the min is -2^(bits-1) s): the
    byte layout's weights bit for bit in 0.5 bits a weight less, through every reader's arithmetic (the dense
    reference, the torch prefill, the host embedding), and the memory plan counts its bytes."""
    from engine.model.host_embed import HostEmbedding
    from engine.runtime.memory_plan import linear_bytes
    from kernels.prefill_torch import dequant_rows

    raw = _raw(ty, 12, np.random.default_rng(11))
    sym = _sym(raw, ty, bits)
    qw, s, m = repack(raw, ty)  # the bytes' layout
    plain = QWeight(12, 512, REPACK[ty][0], qweight=qw, scales=s, mins=m, group=32)
    assert torch.equal(sym.scales, s) and sym.form == "sym"
    assert torch.equal(dense_weight(sym), dense_weight(plain))
    rows = torch.tensor([11, 0, 5])
    assert torch.equal(dense_weight(sym, rows), dense_weight(plain)[rows])
    assert sym.nbytes() * 8 / (12 * 512) == bits + 0.5 == linear_bytes(12, 512, bits, 32, "sym") * 8 / (12 * 512)
    assert torch.equal(dequant_rows(sym, 2, 8).float(), dense_weight(plain)[2:10].half().float())
    assert torch.equal(HostEmbedding(sym).rows([7, 1]), dense_weight(plain)[[7, 1]])
    with pytest.raises(ValueError, match="no SYM form"):
        repack_sym(raw, ty, 3)


def test_kernels_sym_dequant_gives_the_byte_layouts_bits():
    """What the readers do with a SYM scale, modelled exactly: the min is fp16(-2^(bits-1) s) (decode_gemv.cu
    load_frag, embed_rows: a power-of-two multiple of an fp16, exact, subnormal scales included), and the GEMV's
    per-weight fma.rn.f16 of the re-centred code gives the bytes' fma of the original code and min bit for bit (both
    round the same exact value once); the Triton prefill's (q - 2^(bits-1)) s rounds that value once too."""
    rng = np.random.default_rng(2)
    s = np.concatenate([rng.uniform(1e-4, 0.05, 2000), rng.uniform(6e-8, 6e-5, 200)]).astype(np.float16)
    for ty, c in (("Q4_0", 8), ("Q5_0", 16), ("Q8_0", 128)):
        for bits in (b for b in (4, 6, 8) if b >= {"Q4_0": 4, "Q5_0": 5, "Q8_0": 8}[ty]):
            m_sym = np.float16(s.astype(np.float32) * np.float32(-(1 << (bits - 1))))
            assert np.array_equal(m_sym, pack.sym_mins(bits, torch.from_numpy(s)).numpy())
            assert np.array_equal(m_sym.astype(np.float64), s.astype(np.float64) * -(1 << (bits - 1)))  # exact
            m = (s.astype(np.float64) * -c).astype(np.float16)  # the bytes' stored min (exact too)
            q = rng.integers(0, 1 << {"Q4_0": 4, "Q5_0": 5, "Q8_0": 8}[ty], s.shape)
            off = (1 << (bits - 1)) - c
            fma = lambda q_, s_, m_: (q_ * s_.astype(np.float64) + m_.astype(np.float64)).astype(np.float16)  # noqa
            assert np.array_equal(fma(q + off, s, m_sym), fma(q, s, m))
            tri = ((q + off - (1 << (bits - 1))) * s.astype(np.float64)).astype(np.float16)
            assert np.array_equal(tri, fma(q, s, m))


def test_sym_layouts_and_overflow():
    """Which linears take the SYM form with kquant: all parts Q4_0 / Q5_0 / Q8_0, in the widest container (5-bit
    codes in bytes when K is not a multiple of 128); a mix with other types keeps the plain superset; a min that
    overflows fp16 is refused."""
    assert part_layout(["Q8_0"], 512, "kquant") == (8, 32, "sym")
    assert part_layout(["Q5_0", "Q5_0", "Q8_0"], 896, "kquant") == (8, 32, "sym")
    assert part_layout(["Q5_0"], 896, "kquant") == (6, 32, "sym") and part_layout(["Q5_0"], 160, "kquant") == \
        (8, 32, "sym")
    assert part_layout(["Q4_0"], 512, "kquant") == (4, 32, "sym")
    assert part_layout(["Q4_0", "Q5_0"], 512, "kquant") == (6, 32, "sym")
    assert part_layout(["Q4_1"], 512, "kquant") == (4, 32) and part_layout(["Q5_0", "Q4_K"], 512, "kquant") == (6, 32)
    assert part_layout(["Q8_0"], 512, "6bit") == (8, 32)
    rng = np.random.default_rng(4)
    parts = [_T(_raw(ty, 4, rng), ty) for ty in ("Q4_0", "Q5_0", "Q8_0")]
    w = fused_qweight(parts, mode="kquant")
    assert (w.bits, w.group, w.sym) == (8, 32, True)
    assert torch.equal(dense_weight(w), dense_weight(fused_qweight(parts, mode="bytes")))
    b = random_blocks("Q4_0", 2, np.random.default_rng(0))
    b[:, 0:2] = np.array([600.0], np.float16).view(np.uint8)  # -128 x 600 > 65504 in a byte container
    with pytest.raises(ModelFileError, match="overflows fp16"):
        repack_sym(b.reshape(1, -1), "Q4_0", 8)
    repack_sym(b.reshape(1, -1), "Q4_0", 4)  # -8 x 600 fits


def test_fused_parts_in_each_mode():
    """q/k Q4_K + v Q6_K: qkv (8, 16) as bytes, (6, 16) with 6bit and kquant (the Q4_K codes are valid 6-bit codes,
    a mixed linear has no KQ form); q/k alone: (4, 32), or its KQ form with kquant. The same weights every way."""
    rng = np.random.default_rng(1)
    parts = [_T(_raw(ty, 6, rng), ty) for ty in ("Q4_K", "Q4_K", "Q6_K")]
    assert common_layout([REPACK6[p.type_name] for p in parts]) == (6, 16)
    ws = {mode: fused_qweight(parts, mode=mode) for mode in ("bytes", "6bit", "kquant")}
    assert [(w.bits, w.group, w.kq) for w in ws.values()] == [(8, 16, False), (6, 16, False), (6, 16, False)]
    assert ws["6bit"].nbytes() < ws["bytes"].nbytes()
    assert torch.equal(dense_weight(ws["6bit"]), dense_weight(ws["bytes"]))
    qk = {mode: fused_qweight(parts[:2], mode=mode) for mode in ("bytes", "kquant")}
    assert (qk["bytes"].bits, qk["bytes"].group, qk["bytes"].kq) == (4, 32, False) and qk["kquant"].kq
    assert qk["kquant"].nbytes() < qk["bytes"].nbytes()
    assert torch.equal(dense_weight(qk["kquant"]), dense_weight(qk["bytes"]))
    assert part_layout(["Q6_K"], 512, "kquant") == (6, 16, "kq") and part_layout(["Q6_K"], 512, "6bit") == (6, 16)
    assert part_layout(["Q4_K", "Q5_K"], 512, "kquant") == (6, 32, "kq")  # one sub-scale structure, 6-bit codes
    mixed = [_T(_raw(ty, 4, rng), ty) for ty in ("Q4_K", "Q5_K")]
    w = fused_qweight(mixed, mode="kquant")
    assert (w.bits, w.group, w.kq) == (6, 32, True)
    assert torch.equal(dense_weight(w), dense_weight(fused_qweight(mixed, mode="bytes")))
    assert part_layout(["Q8_0"], 512, "6bit") == (8, 32) and part_layout(["F16"], 512, "kquant") is None
    with pytest.raises(ValueError, match="unknown GGUF packing"):
        part_layout(["Q4_K"], 512, "fast")


def test_a_k_that_is_not_a_multiple_of_128_keeps_the_bytes():
    cfg = ModelConfig(vocab_size=512, hidden_size=160, intermediate_size=256, num_layers=1, num_heads=2,
                      num_kv_heads=1)
    types = {"model.embed_tokens.weight": "Q6_K", "model.layers.0.mlp.down_proj.weight": "Q6_K",
             "model.layers.0.mlp.gate_proj.weight": "Q6_K", "model.layers.0.mlp.up_proj.weight": "Q6_K"}
    lay = linear_layouts(cfg, types, "6bit")
    assert lay["embed_tokens"] == (8, 16) and lay["layers.0.mlp.gate_up_proj"] == (8, 16)  # K = 160
    assert lay["layers.0.mlp.down_proj"] == (6, 16)  # K = 256
    assert linear_layouts(cfg, types, "kquant")["layers.0.mlp.down_proj"] == (6, 16, "kq")


def test_real_model_packs_same_weights_fewer_bytes(spec):
    """The real 0.5B (Q5_0 qkv / gate_up / embedding, Q4_K or Q6_K ffn_down) loaded in each mode: the layouts the
    table says, the bytes the memory plan counts, and every weight equal to the byte layouts'."""
    from engine.model import gpu_load
    from engine.runtime.memory_plan import source_weight_bytes

    c, types, g = spec.config, spec.weight_types, spec.gguf_tensors
    sizes = {}
    for mode in ("6bit", "kquant"):
        w = gpu_load.load_source(spec, "cpu", mode=mode)
        sizes[mode] = w.nbytes()
        assert w.nbytes() == source_weight_bytes(c, types, mode=mode)[0] < \
            source_weight_bytes(c, types, mode="bytes")[0]
        # qkv: Q5_0 parts -> (6, 32), with a Q8_0 attn_v -> the bytes; down: Q4_K (4, 32) or Q6_K (6, 16); with
        # kquant the Q5_0 / Q8_0 linears keep their lone scale (SYM) and the K-quants their sub-scales (KQ)
        kq = mode == "kquant"
        assert {(l.qkv.bits, l.qkv.group, l.qkv.sym) for l in w.layers} == {(6, 32, kq), (8, 32, kq)}
        assert {(l.down.bits, l.down.group, l.down.kq) for l in w.layers} == {(4, 32, kq), (6, 16, kq)}
        assert {(l.gate_up.bits, l.gate_up.sym) for l in w.layers} == {(6, kq)}
        assert types["model.embed_tokens.weight"] == "Q5_0" and (w.embed.bits, w.embed.group, w.embed.sym) == \
            (6, 32, kq)
        rows = torch.arange(0, 151936, 997)
        assert torch.equal(dense_weight(w.embed, rows),
                           dense_weight(fused_qweight([g["model.embed_tokens.weight"]], mode="bytes"), rows))
        for i in (0, 3):  # layer 3's down is Q6_K in the 0.5B's Q4_K_M
            for name, mods in (("qkv", ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]),
                               ("gate_up", ["mlp.gate_proj", "mlp.up_proj"]), ("down", ["mlp.down_proj"])):
                got = getattr(w.layers[i], name)
                want = fused_qweight([g[f"model.layers.{i}.{m}.weight"] for m in mods], mode="bytes")
                assert torch.equal(dense_weight(got), dense_weight(want)), (mode, i, name)
    assert sizes["kquant"] < sizes["6bit"]


@pytest.mark.parametrize("hidden,ftype", [(256, "q4_k_m"), (384, "q4_k_m"), (256, "q4_0")])
def test_step_on_references_answers_as_with_the_bytes(tmp_path, hidden, ftype):
    """A random Q4_K_M GGUF (Q6_K attn_v / ffn_down / output) loaded in each mode and decoded by the GPU step on the
    kernels' references (CPU): the same logits, bit for bit (the same weights in other words). With a hidden size
    that is not a multiple of 256 (as the 0.5B's 896) the linears it feeds fall back to Q5_0 / Q8_0 (llama.cpp's
    rule): their SYM forms with kquant; a Q4_0 file (every matrix Q4_0, the head Q6_K) likewise."""
    from engine.formats.gguf_reader import read_gguf
    from engine.model import gpu_load
    from engine.model.gpu_model import GPUModel
    from engine.quant.random_gguf import write_random_gguf

    cfg = ModelConfig(vocab_size=151936, hidden_size=hidden, intermediate_size=512, num_layers=4,
                      num_heads=hidden // 64, num_kv_heads=2, tie_word_embeddings=False)
    write_random_gguf(cfg, tmp_path / "r.gguf", ftype=ftype)
    spec = read_gguf(tmp_path / "r.gguf")
    modes = ("bytes", "6bit", "kquant")
    models = {mode: GPUModel(gpu_load.load_source(spec, "cpu", mode=mode), 1, 64, "cpu") for mode in modes}
    heads = [(models[m].w.lm_head.bits, models[m].w.lm_head.form) for m in modes]
    if ftype == "q4_0":
        assert heads == [(8, ""), (6, ""), (6, "kq")]
        assert all((l.qkv.bits, l.qkv.form, l.down.form) == (4, "sym", "sym") for l in models["kquant"].w.layers)
    elif hidden == 256:
        assert heads == [(8, ""), (6, ""), (6, "kq")]
        assert any(l.down.bits == 6 for l in models["6bit"].w.layers)
        assert any(l.gate_up.kq for l in models["kquant"].w.layers)
    else:  # output Q6_K -> Q8_0, token_embd / q / k / gate / up Q4_K -> Q5_0
        assert heads == [(8, ""), (8, ""), (8, "sym")]
        assert (models["kquant"].w.embed.bits, models["kquant"].w.embed.form) == (6, "sym")
        assert all(l.gate_up.sym and l.gate_up.bits == 6 for l in models["kquant"].w.layers)
        assert any(l.down.kq for l in models["kquant"].w.layers)
    prompt = list(range(100, 112))
    out = {}
    for mode, m in models.items():
        lg = m.prefill(prompt, 0, 0)
        toks, logs = [int(lg.argmax())], [lg.clone()]
        for i in range(3):
            ids, l = m.decode([toks[-1]], [len(prompt) + i], [0])
            toks.append(ids[0])
            logs.append(l[0].clone())
        out[mode] = toks, logs
    for mode in modes[1:]:
        assert out[mode][0] == out["bytes"][0]
        assert all(torch.equal(a, b) for a, b in zip(out[mode][1], out["bytes"][1])), mode


def test_the_flag_reaches_the_config_and_the_memory_plan():
    import argparse

    from engine.config import QWEN25_SHAPES, EngineConfig
    from engine.errors import BadRequestError
    from engine.formats.gguf_layout import gguf_weight_types
    from engine.quant.random_gguf import q4_k_m_types
    from engine.runtime.memory_plan import source_weight_parts
    from engine.server.cli import add_arguments, build_config

    p = argparse.ArgumentParser()
    add_arguments(p)
    from engine.config import GGUF_PACK
    assert build_config(p.parse_args([])).gguf_pack == GGUF_PACK == EngineConfig().gguf_pack
    assert build_config(p.parse_args(["--gguf-pack", "kquant"])).gguf_pack == "kquant"
    with pytest.raises(BadRequestError, match="gguf_pack"):
        EngineConfig(gguf_pack="8bit")
    # a 3B Q4_K_M: bytes read per token (linears + the tied Q6_K embedding as the head) in each mode
    cfg = ModelConfig(**QWEN25_SHAPES["3b"])
    types = gguf_weight_types(q4_k_m_types(cfg))
    parts = {m: source_weight_parts(cfg, types, mode=m) for m in ("bytes", "6bit", "kquant")}
    read = {m: (p["linears"] + p["embedding"]) / 1e9 for m, p in parts.items()}
    assert parts["6bit"]["embedding"] / parts["bytes"]["embedding"] == pytest.approx(0.8)
    assert parts["kquant"]["embedding"] / parts["bytes"]["embedding"] == pytest.approx(6.5625 / 10)
    assert read["bytes"] == pytest.approx(2.436, abs=0.002) and read["6bit"] == pytest.approx(2.233, abs=0.002)
    assert read["kquant"] < 2.0


def test_a_packing_whose_kernels_disagree_falls_back_to_the_bytes(caplog):
    """engine/runtime/pack_check.py, as GPURunner runs it before loading: each layout the packing adds is checked
    (decode GEMV, embedding gather, prefill linear) against the references; one that disagrees (here a GEMV that
    drops the last k, standing in for a kernel that misbehaves on some architecture) sends the load to the bytes,
    with the reason; one that cannot run at all likewise. On the references themselves every layout passes."""
    from engine.config import QWEN25_SHAPES
    from engine.formats.gguf_layout import gguf_weight_types
    from engine.quant.random_gguf import q4_k_m_types
    from engine.runtime import pack_check
    from kernels.decode_reference import RefKernels
    from kernels.prefill_torch import linear_torch

    cfg = ModelConfig(**QWEN25_SHAPES["3b"])
    types = gguf_weight_types(q4_k_m_types(cfg))
    lay = linear_layouts(cfg, types, "kquant")
    assert pack_check.new_layouts(lay) == [(4, 32, "kq"), (6, 16, ""), (6, 16, "kq")]
    assert pack_check.new_layouts(linear_layouts(cfg, types, "bytes")) == []
    prefill = linear_torch  # the Triton-free prefill (fp16 on the CPU)
    pack_check._cache.clear()
    assert pack_check.packing_for("kquant", lay, RefKernels(), torch.device("cpu"), prefill) == ("kquant", "")
    assert pack_check.packing_for("bytes", {}, None, None, None) == ("bytes", "")

    class DropsK(RefKernels):
        def gemv(self, w, x, B, epi, out, *a, **k):
            x = x.clone()
            x[:, -64:] = 0
            super().gemv(w, x, B, epi, out, *a, **k)

    pack_check._cache.clear()
    mode, why = pack_check.packing_for("kquant", lay, DropsK(), torch.device("cpu"), prefill)
    assert mode == "bytes" and "w4k32 error" in why and "w6k16" in why and "--gguf-pack kquant" in why

    class Broken(RefKernels):
        def embed(self, *a, **k):
            raise RuntimeError("no kernel image is available for execution on the device")

    pack_check._cache.clear()
    mode, why = pack_check.packing_for("6bit", linear_layouts(cfg, types, "6bit"), Broken(), torch.device("cpu"),
                                       prefill)
    assert mode == "bytes" and "w6g16 error inf" in why
    assert "failed to run" in caplog.text
    pack_check._cache.clear()


def test_the_packings_gemvs_live_in_their_own_module():
    """decode_kernels: the engine's module holds the byte layouts' GEMVs; every W6 / KQ GEMV the step can ask for
    (gemv_name) is in the packings' module, compiled on first use (decode_gemv.cu GEMV_ONLY_PACKS), so a first start
    does not compile 56 kernels a bytes model never runs (48 GEMVs and the 8 layouts' balanced gate_ups)."""
    from kernels import decode_kernels as dk

    for epi, mt in (("store", 1), ("store", 2), ("resid", 1), ("resid", 2), ("silu", 2), ("logits", 2)):
        for bits, group in dk.BYTE_LAYOUTS:
            assert dk.gemv_name(bits, group, epi, mt) in dk._GGUF_NAMES
        for bits, group in dk.GGUF_LAYOUTS[3:]:
            assert dk.gemv_name(bits, group, epi, mt) in dk._PACK_NAMES
        for bits, group in dk.KQ_LAYOUTS:
            assert dk.gemv_name(bits, group, epi, mt, "kq") in dk._PACK_NAMES
        for bits, group in dk.SYM_LAYOUTS:
            assert dk.gemv_name(bits, group, epi, mt, "sym") in dk._PACK_NAMES
    for bits, group, form in [(b, g, "") for b, g in dk.GGUF_LAYOUTS[3:]] + [(b, g, "kq") for b, g in dk.KQ_LAYOUTS] + \
            [(b, g, "sym") for b, g in dk.SYM_LAYOUTS]:  # the balanced gate_up (decode_gemv.cu BAL) beside each silu
        assert dk.gemv_name(bits, group, "silu", 2, form) + "_bal" in dk._PACK_NAMES
    assert len(dk._PACK_NAMES) == 56 and not set(dk._PACK_NAMES) & set(dk._NAMES)
    with pytest.raises(ValueError, match="no decode GEMV"):
        dk.gemv_name(6, 16, "store", 1, "sym")
    src = "".join((Path(dk.__file__).parent / s).read_text() for s in dk.PACK_SOURCES)
    assert "#if GEMV_PACKS || GEMV_ONLY_PACKS" in src and "#if !GEMV_ONLY_PACKS" in src
