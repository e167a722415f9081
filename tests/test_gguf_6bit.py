"""The 6-bit repack of a GGUF's 5- and 6-bit tensors (EngineConfig.gguf_6bit; kernels/pack.py W6): the words follow
the contract, the bit tricks the decode kernels use on them (decode_gemv.cu w6_pair, decode_misc.cu embed_rows,
modelled here step by step) read the right codes, the repack holds the very weights the byte layouts hold, the
memory plan counts its bytes, and the GPU step on the kernels' references answers as with the bytes."""
import numpy as np
import pytest
import torch

from engine.config import ModelConfig
from engine.formats.gguf_kquant import fused_qweight, repack
from engine.formats.gguf_layout import REPACK, REPACK6, common_layout, linear_layouts
from engine.quant.random_gguf import random_blocks
from kernels import pack
from kernels.decode_reference import dense_weight
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


def test_fused_parts_with_six_bits():
    """q/k Q4_K + v Q6_K -> qkv (6, 16) with six (the Q4_K codes are valid 6-bit codes), the same weights as (8, 16)."""
    rng = np.random.default_rng(1)
    parts = [_T(_raw(ty, 6, rng), ty) for ty in ("Q4_K", "Q4_K", "Q6_K")]
    assert common_layout([REPACK6[p.type_name] for p in parts]) == (6, 16)
    six, eight = fused_qweight(parts, six=True), fused_qweight(parts)
    assert (six.bits, six.group, eight.bits, eight.group) == (6, 16, 8, 16)
    assert six.nbytes() < eight.nbytes()
    assert torch.equal(dense_weight(six), dense_weight(eight))
    assert (fused_qweight(parts[:2], six=True).bits, fused_qweight(parts[:2], six=True).group) == (4, 32)


def test_a_k_that_is_not_a_multiple_of_128_keeps_the_bytes():
    cfg = ModelConfig(vocab_size=512, hidden_size=160, intermediate_size=256, num_layers=1, num_heads=2,
                      num_kv_heads=1)
    types = {"model.embed_tokens.weight": "Q6_K", "model.layers.0.mlp.down_proj.weight": "Q6_K",
             "model.layers.0.mlp.gate_proj.weight": "Q6_K", "model.layers.0.mlp.up_proj.weight": "Q6_K"}
    lay = linear_layouts(cfg, types, six=True)
    assert lay["embed_tokens"] == (8, 16) and lay["layers.0.mlp.gate_up_proj"] == (8, 16)  # K = 160
    assert lay["layers.0.mlp.down_proj"] == (6, 16)  # K = 256


def test_real_model_six_bit_load_same_weights_fewer_bytes(spec):
    """The real 0.5B (Q5_0 qkv / gate_up, Q6_K ffn_down in some layers) loaded with six: 6-bit layouts where its codes
    have 5 or 6 bits, the bytes the memory plan counts, and every weight equal to the byte layouts'."""
    from engine.model import gpu_load
    from engine.runtime.memory_plan import source_weight_bytes

    six = gpu_load.load_source(spec, "cpu", six=True)
    c, types, g = spec.config, spec.weight_types, spec.gguf_tensors
    assert six.nbytes() == source_weight_bytes(c, types, six=True)[0] < source_weight_bytes(c, types)[0]
    # qkv: Q5_0 parts -> (6, 32), with a Q8_0 attn_v -> the bytes; down: Q4_K (4, 32) or Q6_K (6, 16)
    assert {(l.qkv.bits, l.qkv.group) for l in six.layers} == {(6, 32), (8, 32)}
    assert {(l.down.bits, l.down.group) for l in six.layers} == {(4, 32), (6, 16)}
    assert types["model.embed_tokens.weight"] == "Q5_0" and (six.embed.bits, six.embed.group) == (6, 32)
    rows = torch.arange(0, 151936, 997)
    assert torch.equal(dense_weight(six.embed, rows), dense_weight(fused_qweight([g["model.embed_tokens.weight"]]), rows))
    for i in (0, 3):  # layer 3's down is Q6_K in the 0.5B's Q4_K_M
        for name, mods in (("qkv", ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]),
                           ("down", ["mlp.down_proj"])):
            w6 = getattr(six.layers[i], name)
            w8 = fused_qweight([g[f"model.layers.{i}.{m}.weight"] for m in mods])
            assert torch.equal(dense_weight(w6), dense_weight(w8)), (i, name)


def test_step_on_references_answers_as_with_the_bytes(tmp_path):
    """A random Q4_K_M GGUF (Q6_K attn_v / ffn_down / output) loaded both ways and decoded by the GPU step on the
    kernels' references (CPU): the same logits, bit for bit (the same weights in other words)."""
    from engine.formats.gguf_reader import read_gguf
    from engine.model import gpu_load
    from engine.model.gpu_model import GPUModel
    from engine.quant.random_gguf import write_random_gguf

    cfg = ModelConfig(vocab_size=151936, hidden_size=256, intermediate_size=512, num_layers=4, num_heads=4,
                      num_kv_heads=2, tie_word_embeddings=False)
    write_random_gguf(cfg, tmp_path / "r.gguf")
    spec = read_gguf(tmp_path / "r.gguf")
    models = {six: GPUModel(gpu_load.load_source(spec, "cpu", six=six), 1, 64, "cpu") for six in (False, True)}
    assert models[True].w.lm_head.bits == 6 and models[False].w.lm_head.bits == 8
    assert any(l.down.bits == 6 for l in models[True].w.layers)
    prompt = list(range(100, 112))
    out = {}
    for six, m in models.items():
        lg = m.prefill(prompt, 0, 0)
        toks, logs = [int(lg.argmax())], [lg.clone()]
        for i in range(3):
            ids, l = m.decode([toks[-1]], [len(prompt) + i], [0])
            toks.append(ids[0])
            logs.append(l[0].clone())
        out[six] = toks, logs
    assert out[True][0] == out[False][0]
    assert all(torch.equal(a, b) for a, b in zip(out[True][1], out[False][1]))


def test_the_flag_reaches_the_config_and_the_memory_plan():
    import argparse

    from engine.runtime.memory_plan import source_weight_parts
    from engine.quant.random_gguf import q4_k_m_types
    from engine.formats.gguf_layout import gguf_weight_types
    from engine.server.cli import add_arguments, build_config

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert build_config(p.parse_args([])).gguf_6bit is False
    assert build_config(p.parse_args(["--gguf-6bit"])).gguf_6bit is True
    # a 3B Q4_K_M: the Q6_K embedding (tied head) and the Q6_K parts at 8 bits a weight with scale and min, not 10
    from engine.config import QWEN25_SHAPES
    cfg = ModelConfig(**QWEN25_SHAPES["3b"])
    types = gguf_weight_types(q4_k_m_types(cfg))
    eight, six = source_weight_parts(cfg, types), source_weight_parts(cfg, types, six=True)
    assert six["embedding"] / eight["embedding"] == pytest.approx(0.8)
    assert 0.85 < six["linears"] / eight["linears"] < 0.95
