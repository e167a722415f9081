"""AWQ / GPTQ 4-bit group-128 import (engine/formats/prequant.py): small checkpoints written in the
exact published layouts from known weights, by packers written here from the published format
descriptions (AutoAWQ GEMM, AutoGPTQ), are repacked into our layout and dequantize to the published
formula's values exactly (max abs diff 0 in float32), through export and the CPU load path."""
import json

import numpy as np
import pytest
import torch

from engine.errors import ModelFileError
from engine.formats import prequant
from engine.quant.quantize import dequantize_matrix
from kernels import pack

ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ: nibble i of a word holds column 8c + ORDER[i]


def _known(N, K, seed, zmin=0):
    """Codes, zero points, fp16 scales [N, K/128] and the published dequantization (q - z) * s (fp32)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
    z = torch.randint(zmin, 16, (N, K // 128), generator=g, dtype=torch.uint8)
    s = (torch.rand(N, K // 128, generator=g) * 0.01 + 1e-3).half()
    w = (q.float() - z.float().repeat_interleave(128, 1)) * s.float().repeat_interleave(128, 1)
    return q, z, s, w


def _words(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a.astype(np.uint32).view(np.int32))


def awq_pack(q, z, s):
    """AutoAWQ WQLinear_GEMM layout: intweight [K, N] (transposed), 8 columns per int32 in ORDER."""
    iw, iz = q.T.numpy().astype(np.uint32), z.T.numpy().astype(np.uint32)  # [K, N], [K/128, N]
    qweight = np.zeros((iw.shape[0], iw.shape[1] // 8), np.uint32)
    qzeros = np.zeros((iz.shape[0], iz.shape[1] // 8), np.uint32)
    for col in range(iw.shape[1] // 8):
        for i in range(8):
            qweight[:, col] |= iw[:, col * 8 + ORDER[i]] << (i * 4)
            qzeros[:, col] |= iz[:, col * 8 + ORDER[i]] << (i * 4)
    return {"qweight": _words(qweight), "qzeros": _words(qzeros), "scales": s.T.contiguous()}


def gptq_pack(q, z, s, v2=False):
    """AutoGPTQ layout: qweight [K/8, N] (8 consecutive k per word), qzeros [K/128, N/8] holding z - 1."""
    iw = q.T.numpy().astype(np.uint32)  # [K, N]
    zeros = z.T.numpy().astype(np.int64) - (0 if v2 else 1)  # [K/128, N]
    qweight = np.zeros((iw.shape[0] // 8, iw.shape[1]), np.uint32)
    for row in range(qweight.shape[0]):
        for j in range(8):
            qweight[row] |= iw[row * 8 + j] << (4 * j)
    zeros = zeros.astype(np.uint32)
    qzeros = np.zeros((zeros.shape[0], zeros.shape[1] // 8), np.uint32)
    for col in range(qzeros.shape[1]):
        for j in range(8):
            qzeros[:, col] |= zeros[:, col * 8 + j] << (4 * j)
    K = iw.shape[0]
    return {"qweight": _words(qweight), "qzeros": _words(qzeros), "scales": s.T.contiguous(),
            "g_idx": torch.arange(K, dtype=torch.int32) // 128}


def _ours_dense(d):
    return dequantize_matrix(d["qweight"], d["scales"], d["mins"], 4)


def test_awq_repack_is_exact():
    q, z, s, w = _known(96, 384, 0)
    t = awq_pack(q, z, s)
    uq, uz, us = prequant.unpack_awq(t["qweight"], t["qzeros"], t["scales"])
    assert torch.equal(uq, q) and torch.equal(uz, z) and torch.equal(us, s)
    ours = prequant.to_ours(uq, uz, us)
    assert ours["mins"].dtype == torch.float32  # -z*s is not fp16-exact for these scales
    assert (_ours_dense(ours) - w).abs().max().item() == 0
    assert (pack.dequantize(pack.unpack(ours["qweight"], 384, 4), ours["scales"], ours["mins"]) - w).abs().max() == 0
    assert (prequant.dequantize(uq, uz, us) - w).abs().max().item() == 0


@pytest.mark.parametrize("v2", [False, True])
def test_gptq_repack_is_exact(v2):
    q, z, s, w = _known(64, 256, 1, zmin=0 if v2 else 1)  # the v1 format stores z - 1: z >= 1
    t = gptq_pack(q, z, s, v2)
    uq, uz, us = prequant.unpack_gptq(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], 0 if v2 else 1)
    assert torch.equal(uq, q) and torch.equal(uz, z) and torch.equal(us, s)
    assert (_ours_dense(prequant.to_ours(uq, uz, us)) - w).abs().max().item() == 0


def test_gptq_symmetric_zero_eight_and_fp16_exact_mins():
    q, _, s, _ = _known(32, 128, 2)
    s = (torch.randint(1, 64, s.shape) * 2.0 ** -12).half()  # few significant bits: 8*s is fp16-exact
    z = torch.full(s.shape, 8, dtype=torch.uint8)  # sym=True: stored 7, read back as 8
    t = gptq_pack(q, z, s)
    assert (prequant.unpack_gptq(t["qweight"], t["qzeros"], t["scales"])[1] == 8).all()
    ours = prequant.to_ours(*prequant.unpack_gptq(t["qweight"], t["qzeros"], t["scales"]))
    assert ours["mins"].dtype == torch.float16
    w = (q.float() - 8) * s.float().repeat_interleave(128, 1)
    assert (_ours_dense(ours) - w).abs().max().item() == 0


def test_refused_variants_say_what_to_do():
    with pytest.raises(ModelFileError, match="desc_act"):
        prequant.parse_config({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128,
                                                       "desc_act": True}})
    with pytest.raises(ModelFileError, match="bits=8"):
        prequant.parse_config({"quantization_config": {"quant_method": "gptq", "bits": 8, "group_size": 128}})
    with pytest.raises(ModelFileError, match="GEMM"):
        prequant.parse_config({"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128,
                                                       "version": "gemv"}})
    q, z, s, _ = _known(32, 256, 3, zmin=1)
    t = gptq_pack(q, z, s)
    with pytest.raises(ModelFileError, match="g_idx"):
        prequant.unpack_gptq(t["qweight"], t["qzeros"], t["scales"], t["g_idx"].flip(0))
    assert prequant.parse_config({"model_type": "qwen2"}) is None


def _prequant_folder(dense_dir, out, method):
    """Rewrite a dense tiny HF folder as an AWQ / GPTQ release: every decoder linear packed from known
    codes; embedding, norms, biases (and the head) stay dense, as in the published checkpoints."""
    from safetensors.torch import load_file, save_file

    w = load_file(str(dense_dir / "model.safetensors"))
    out.mkdir()
    tensors, expect = {}, {}
    for i, (name, t) in enumerate(sorted(w.items())):
        if ".layers." in name and name.endswith("_proj.weight"):
            N, K = t.shape
            q, z, s, dq = _known(N, K, 100 + i, zmin=1)
            packed = awq_pack(q, z, s) if method == "awq" else gptq_pack(q, z, s)
            tensors.update({f"{name[:-len('.weight')]}.{k}": v for k, v in packed.items()})
            expect[name] = dq
        else:
            tensors[name] = t.half()
    save_file(tensors, str(out / "model.safetensors"))
    cfg = json.loads((dense_dir / "config.json").read_text())
    cfg["quantization_config"] = ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm",
                                   "zero_point": True} if method == "awq" else
                                  {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False,
                                   "sym": False, "damp_percent": 0.01})
    (out / "config.json").write_text(json.dumps(cfg))
    (out / "tokenizer.json").write_text((dense_dir / "tokenizer.json").read_text(encoding="utf-8"),
                                        encoding="utf-8")
    return expect


@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_export_repacks_a_published_checkpoint_exactly(tmp_path, method):
    from engine.formats.checkpoint import open_checkpoint
    from engine.formats.load import load_spec
    from engine.formats.spec import expected_weight_names
    from engine.model.layout import FUSED
    from engine.quant.export import export
    from tests.test_checkpoint import _hf_folder

    _hf_folder(tmp_path / "dense", tied=True)
    expect = _prequant_folder(tmp_path / "dense", tmp_path / "src", method)
    spec = load_spec(str(tmp_path / "src"))
    assert spec.weight_types["model.layers.0.mlp.down_proj.weight"].startswith(method)
    dense = dict(spec.weights())  # the dense paths read the exact published dequantization
    assert all(torch.equal(dense[n], expect[n]) for n in expect)
    assert set(dense) == set(expected_weight_names(spec.config))  # loadable as a dense model
    man = export(str(tmp_path / "src"), tmp_path / "w4", "w4")  # default quantizer: still a pure repack
    ck = open_checkpoint(tmp_path / "w4")
    for i in range(2):
        for mod, parts in FUSED.items():
            want = torch.cat([expect[f"model.layers.{i}.{p}.weight"] for p in parts])
            assert (ck.dense(f"layers.{i}.{mod}") - want).abs().max().item() == 0
    assert man["tensors"]["layers.0.mlp.down_proj.mins"]["dtype"] == "float32"
    # mixed: attention stays the exact repack, the 3-bit MLP is re-quantized from the exact dense values
    export(str(tmp_path / "src"), tmp_path / "mixed", "mixed", quantizer="rtn")
    ck = open_checkpoint(tmp_path / "mixed")
    want = torch.cat([expect[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert (ck.dense("layers.1.self_attn.qkv_proj") - want).abs().max().item() == 0
    assert ck.manifest["tensors"]["layers.0.mlp.down_proj.qweight"]["bits"] == 4  # first layer 4-bit: exact
    assert ck.manifest["tensors"]["layers.1.mlp.down_proj.qweight"]["bits"] == 4  # last layer 4-bit
