"""Layered checkpoints on tiny random Qwen2 models (fast): export -> load, LoRA merge, tied storage,
corruption / truncation / interruption, Ollama names, make-random."""
import json

import pytest
import torch

from engine.config import ModelConfig
from engine.errors import ModelFileError

TINY = dict(vocab_size=4096, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4,
            num_kv_heads=2, tie_word_embeddings=True)


def _hf_folder(path, tied=True, seed=0):
    """A dense HF-style Qwen2 folder with random weights and the bundled tokenizer."""
    from safetensors.torch import save_file

    from engine.formats.spec import expected_weight_names
    from engine.formats.tokenizer import bundled_qwen2_tokenizer

    cfg = ModelConfig(**{**TINY, "tie_word_embeddings": tied})
    g = torch.Generator().manual_seed(seed)
    model = {}
    from engine.model.qwen2 import Qwen2Model
    ref = Qwen2Model(cfg)
    for name in expected_weight_names(cfg):
        param, sl = ref.target(name) if name != "lm_head.weight" else (ref.lm_head.weight, None)
        shape = param[sl].shape if sl is not None else param.shape
        if name.endswith("norm.weight"):
            model[name] = 1 + 0.1 * torch.randn(shape, generator=g)
        else:
            model[name] = torch.randn(shape, generator=g) * 0.02
    path.mkdir(parents=True, exist_ok=True)
    save_file(model, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg.to_hf()))
    bundled_qwen2_tokenizer().save(path / "tokenizer.json")
    return cfg, model


@pytest.fixture(scope="module")
def hf_tiny(tmp_path_factory):
    p = tmp_path_factory.mktemp("hf_tiny")
    cfg, weights = _hf_folder(p)
    return p, cfg, weights


def _dense_model(cfg, weights):
    from engine.model.qwen2 import Qwen2Model
    from engine.formats.spec import expected_weight_names

    m = Qwen2Model(cfg)
    m.load_weights(iter(weights.items()), expected_weight_names(cfg))
    return m


def _logits(model, ids):
    from engine.model.qwen2 import KVCache

    cache = KVCache(model.cfg, 1, 64)
    return model(torch.tensor([ids]), cache, [0], [0], all_logits=True)[0]


def _loaded(path):
    from engine.formats.checkpoint import load_into, read_checkpoint
    from engine.model.qwen2 import Qwen2Model

    spec = read_checkpoint(path)
    m = Qwen2Model(spec.config)
    load_into(m, spec)
    return spec, m


def test_export_load_round_trip(hf_tiny, tmp_path):
    from engine.quant.export import export
    from kernels.pack import dequantize
    from engine.quant.quantize import quantize_clip
    from engine.formats.spec import expected_weight_names
    from engine.formats.load import load_spec

    src, cfg, w = hf_tiny
    man = export(str(src), tmp_path / "w4", "w4", quantizer="clip")
    assert man["format"] == "deepinfer-checkpoint" and man["version"] == 1 and man["scheme"] == "w4"
    assert (tmp_path / "w4" / ".verified").exists()
    spec = load_spec(str(tmp_path / "w4"))
    assert spec.kind == "checkpoint" and spec.checkpoint.config.hidden_size == 128
    t = spec.checkpoint.manifest["tensors"]
    assert t["layers.1.self_attn.qkv_proj.qweight"]["bits"] == 4
    assert t["layers.1.self_attn.qkv_proj.qweight"]["shape"] == [cfg.q_size + 2 * cfg.kv_size, 128 // 8]
    assert t["layers.0.self_attn.qkv_proj.bias"]["dtype"] == "float32"
    # fused rows q|k|v hold exactly the quantized dense q/k/v
    ck = spec.checkpoint
    qkv = torch.cat([w[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(ck.dense("layers.1.self_attn.qkv_proj"), dequantize(*quantize_clip(qkv, 4)))
    # spec.weights() gives every HF name back (dequantized, unfused)
    names = {n: x.shape for n, x in spec.weights()}
    assert set(names) == set(expected_weight_names(cfg))
    assert names["model.layers.0.mlp.up_proj.weight"] == w["model.layers.0.mlp.up_proj.weight"].shape
    # the loaded model computes what the dense one does, up to 4-bit error
    _, qm = _loaded(tmp_path / "w4")
    ids = [3707, 11, 1879, 0, 358, 1079, 264, 1273]
    ref, got = _logits(_dense_model(cfg, w), ids), _logits(qm, ids)
    assert torch.nn.functional.cosine_similarity(ref.flatten(), got.flatten(), 0) > 0.95
    # fp16 scheme: exact up to fp16 rounding
    export(str(src), tmp_path / "fp16", "fp16")
    _, fm = _loaded(tmp_path / "fp16")
    assert torch.allclose(_logits(fm, ids), ref, atol=2e-3, rtol=1e-3)


def test_mixed_policy_and_tied_embedding_stored_once(hf_tiny, tmp_path):
    from engine.quant.export import export

    src, cfg, _ = hf_tiny
    man = export(str(src), tmp_path / "mixed", "mixed", clip=False)
    t = man["tensors"]
    assert not any(n.startswith("lm_head") for n in t)  # tied: stored once
    assert t["layers.0.mlp.down_proj.qweight"]["bits"] == 4  # first layer stays 4-bit
    assert t["layers.1.mlp.down_proj.qweight"]["bits"] == 4  # last layer too (2 layers)
    assert t["layers.1.self_attn.o_proj.qweight"]["bits"] == 4
    untied = tmp_path / "hf_untied"
    _hf_folder(untied, tied=False)
    export(str(untied), tmp_path / "mixed_untied", "mixed", clip=False)
    tied_bytes = (tmp_path / "mixed" / "embed.safetensors").stat().st_size
    untied_bytes = (tmp_path / "mixed_untied" / "embed.safetensors").stat().st_size
    one = 4096 * (128 // 2 + 2 * 2 * 1)  # 4-bit codes + fp16 scale/min per 128-group
    assert one <= tied_bytes < one * 1.01
    assert 2 * one <= untied_bytes < 2 * one * 1.01


def test_lora_merge_equals_dense_computation(hf_tiny, tmp_path):
    from safetensors.torch import save_file

    from engine.quant.export import export

    src, cfg, w = hf_tiny
    g = torch.Generator().manual_seed(3)
    r, alpha = 4, 8
    ad = tmp_path / "adapter"
    ad.mkdir()
    (ad / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": r, "lora_alpha": alpha,
                                                        "target_modules": ["q_proj", "down_proj"]}))
    tensors, merged = {}, dict(w)
    for i in range(cfg.num_layers):
        for mod, (n, k) in {"self_attn.q_proj": (cfg.q_size, 128), "mlp.down_proj": (128, 256)}.items():
            A, B = torch.randn(r, k, generator=g) * 0.05, torch.randn(n, r, generator=g) * 0.05
            key = f"base_model.model.model.layers.{i}.{mod}"
            tensors[key + ".lora_A.weight"], tensors[key + ".lora_B.weight"] = A, B
            name = f"model.layers.{i}.{mod}.weight"
            merged[name] = w[name] + B @ A * (alpha / r)
    save_file(tensors, str(ad / "adapter_model.safetensors"))
    man = export(str(src), tmp_path / "merged", "fp16", adapter=str(ad))
    assert man["adapter"]["targets"] == 4
    spec, m = _loaded(tmp_path / "merged")
    got = spec.checkpoint.dense("layers.1.mlp.down_proj")
    assert torch.allclose(got, merged["model.layers.1.mlp.down_proj.weight"].half().float())
    ids = [3707, 11, 1879, 0, 358]
    assert torch.allclose(_logits(m, ids), _logits(_dense_model(cfg, merged), ids), atol=2e-3, rtol=1e-3)
    assert not torch.allclose(_logits(m, ids), _logits(_dense_model(cfg, w), ids), atol=2e-3, rtol=1e-3)


def test_corrupted_and_truncated_files_are_refused(tmp_path):
    from engine.formats.checkpoint import open_checkpoint
    from engine.quant.make_random import make_random

    cfg = ModelConfig(**TINY)
    out = tmp_path / "ck"
    make_random(cfg, "w3", out)
    open_checkpoint(out)  # first load: full sha256, writes the stamp
    assert (out / ".verified").exists()
    f = out / "layer_01.safetensors"
    data = bytearray(f.read_bytes())
    data[-100] ^= 0x55  # same size, one flipped byte
    f.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match=r"layer_01\.safetensors.*sha256 mismatch"):
        open_checkpoint(out)
    data[-100] ^= 0x55
    f.write_bytes(bytes(data[:-1000]))  # truncated
    with pytest.raises(ModelFileError, match=r"layer_01\.safetensors.*sha256 mismatch"):
        open_checkpoint(out, verify="size")


def test_interrupted_export_never_looks_complete(hf_tiny, tmp_path):
    from engine.quant.export import export
    from engine.formats.load import load_spec

    src, _, _ = hf_tiny
    out = tmp_path / "ck"
    export(str(src), out, "w4", clip=False)  # a complete earlier export in the same folder

    def boom(i):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        export(str(src), out, "w3", clip=False, _after_layer=boom)
    assert not (out / "manifest.json").exists() and not (out / "config.json").exists()
    with pytest.raises(ModelFileError, match="neither|manifest"):
        load_spec(str(out))
    export(str(src), out, "w3", clip=False)  # a re-run completes it
    assert load_spec(str(out)).checkpoint.scheme == "w3"


def test_ollama_names(tmp_path, monkeypatch):
    from engine.hub.ollama_local import resolve_ollama
    from engine.formats.load import load_spec

    root = tmp_path / "ollama"
    blob = root / "blobs" / ("sha256-" + "ab" * 32)
    blob.parent.mkdir(parents=True)
    blob.write_bytes(b"GGUF....")
    man = root / "manifests" / "registry.ollama.ai" / "library" / "qwen2.5" / "3b"
    man.parent.mkdir(parents=True)
    man.write_text(json.dumps({"layers": [
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "cd" * 32},
        {"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:" + "ab" * 32, "size": 8}]}))
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    assert resolve_ollama("qwen2.5:3b") == blob
    with pytest.raises(ModelFileError, match=r"qwen2\.5:7b is not pulled.*qwen2\.5:3b.*ollama pull qwen2\.5:7b"):
        resolve_ollama("qwen2.5:7b")
    with pytest.raises(ModelFileError, match="not pulled"):
        load_spec("ollama:nosuchmodel")


def test_export_cli_unknown_ollama_name(tmp_path, monkeypatch, capsys):
    from engine.cli.main import main

    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "empty"))
    assert main(["export", "--source", "ollama:qwen2.5:7b", "--scheme", "mixed", "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "qwen2.5:7b is not pulled" in err and "ollama pull qwen2.5:7b" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_make_random_shapes_and_scale(tmp_path):
    from engine.formats.checkpoint import read_checkpoint
    from engine.cli.main import main
    from engine.quant.make_random import make_random

    cfg = ModelConfig(**{**TINY, "num_layers": 3, "tie_word_embeddings": False})
    make_random(cfg, "mixed", tmp_path / "r", seed=1)
    spec = read_checkpoint(tmp_path / "r")
    ck = spec.checkpoint
    assert ck.linear("layers.1.mlp.gate_up_proj").bits == 3 and ck.linear("layers.2.mlp.down_proj").bits == 4
    assert ck.linear("lm_head").bits == 4 and ck.linear("layers.1.self_attn.qkv_proj").bits == 4
    w = ck.dense("layers.1.mlp.gate_up_proj")
    assert w.shape == (512, 128) and 0.017 < w.std() < 0.023 and abs(w.mean()) < 1e-3
    from engine.model.qwen2 import Qwen2Model
    from engine.formats.checkpoint import load_into
    m = Qwen2Model(spec.config)
    load_into(m, spec)
    assert torch.isfinite(_logits(m, [1, 2, 3])).all()
    assert main(["export", "--verify", str(tmp_path / "r")]) == 0


def _pack_w3_layout1(q: torch.Tensor) -> torch.Tensor:
    """The W3 words checkpoints held before "w3_layout": 2 (2-bit lows in w0 / w1, high bits in w2)."""
    from kernels.pack import _to_int32

    N, K = q.shape
    v = q.to(torch.int64).reshape(N, K // 32, 32)
    low, high = v & 3, (v >> 2) & 1
    s2 = torch.arange(0, 32, 2, dtype=torch.int64)
    w = torch.stack([(low[..., :16] << s2).sum(-1), (low[..., 16:] << s2).sum(-1),
                     (high << torch.arange(32, dtype=torch.int64)).sum(-1)], -1)
    return _to_int32(w.reshape(N, K // 32 * 3))


def _pack_w3_layout2(q: torch.Tensor) -> torch.Tensor:
    """The W3 words checkpoints held with "w3_layout": 2 (row-major blocks, an odd block's stored (w2, w0, w1))."""
    from kernels import pack

    w = pack.w3_rows(pack.pack(q, 3)).clone()
    w[:, 1::2] = w[:, 1::2][:, :, [2, 0, 1]]
    return w.reshape(q.shape[0], -1).contiguous()


@pytest.mark.parametrize("old_layout", [1, 2])
def test_older_w3_layout_loads_converted_and_unknown_layout_is_refused(tmp_path, old_layout, caplog):
    """A checkpoint written with an older W3 layout (1: no "w3_layout" in its manifest, 2+1-bit words; 2: row-major
    words) loads with the same codes in today's layout; a layout this version does not know is a clear error."""
    import hashlib

    from safetensors.torch import load_file, save_file

    from engine.formats.checkpoint import open_checkpoint
    from engine.quant.make_random import make_random
    from kernels import pack

    cfg = ModelConfig(**TINY)
    new, old = tmp_path / "new", tmp_path / "old"
    make_random(cfg, "w3", new)
    ck = open_checkpoint(new)
    assert ck.manifest["w3_layout"] == pack.W3_LAYOUT == 3
    name = "layers.1.mlp.down_proj"
    want = ck.linear(name)
    assert want.bits == 3

    import shutil
    shutil.copytree(new, old)
    (old / ".verified").unlink(missing_ok=True)
    manifest = json.loads((old / "manifest.json").read_text())
    if old_layout == 1:
        del manifest["w3_layout"]
    else:
        manifest["w3_layout"] = 2
    old_pack = _pack_w3_layout1 if old_layout == 1 else _pack_w3_layout2
    for fname in list(manifest["files"]):
        if not fname.endswith(".safetensors"):
            continue
        t = load_file(str(old / fname))
        for k, v in t.items():
            if k.endswith(".qweight") and manifest["tensors"][k]["bits"] == 3:
                t[k] = old_pack(pack.unpack(v, v.shape[1] // 3 * 32, 3))
        save_file(t, str(old / fname))
        data = (old / fname).read_bytes()
        manifest["files"][fname] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (old / "manifest.json").write_text(json.dumps(manifest))
    with caplog.at_level("WARNING", logger="deepinfer.checkpoint"):
        got = open_checkpoint(old).linear(name)
    assert f"layout {old_layout}" in caplog.text and "export" in caplog.text  # the user learns why it loads slower
    raw = open_checkpoint(old).tensor(name + ".qweight")
    assert not torch.equal(raw, want.qweight)  # the file holds the old words ...
    assert torch.equal(got.qweight, want.qweight)  # ... and they load as layout 3
    assert torch.equal(got.scales, want.scales)

    manifest["w3_layout"] = 7
    (old / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelFileError, match="layout 7"):
        open_checkpoint(old)
