"""GPTQ quantizer (engine/quant/gptq.py) and its calibration forward (engine/quant/calibrate.py), on
tiny random Qwen2 models: the calibration forward is the model's forward, GPTQ lowers the output error
it is built to lower, and a calibrated export loads and runs."""
import torch

from engine.quant.calibrate import Calibrator, calibration_ids
from engine.quant.gptq import Hessian, gptq_quantize, output_error
from kernels import pack
from tests.test_checkpoint import _dense_model, _hf_folder, _logits


def test_gptq_lowers_output_error_on_correlated_inputs():
    g = torch.Generator().manual_seed(0)
    K, N = 256, 96
    mix = torch.randn(K, K, generator=g) / K ** 0.5 + torch.eye(K)  # correlated input channels
    x = torch.randn(2048, K, generator=g) @ mix
    x[:, 7] *= 20  # one outlier channel, as in real activations
    w = torch.randn(N, K, generator=g) * 0.02
    hs = Hessian(K)
    for part in x.split(500):
        hs.add(part)
    assert torch.allclose(hs.H, 2 * x.T @ x / x.shape[0], rtol=1e-4, atol=1e-3)
    for bits in (4, 3):
        q, s, m = gptq_quantize(w, hs.H, bits)
        assert q.dtype == torch.uint8 and int(q.max()) <= (1 << bits) - 1
        assert s.dtype == m.dtype == torch.float16 and s.shape == (N, K // 128)
        rtn = pack.dequantize(*pack.quantize(w, bits))
        assert output_error(w, pack.dequantize(q, s, m), hs.H) < 0.7 * output_error(w, rtn, hs.H)


def test_calibration_forward_is_the_model_forward(tmp_path):
    cfg, w = _hf_folder(tmp_path / "hf", tied=False)
    ids = [3707, 11, 1879, 0, 358, 1079, 264, 1273, 42, 7]
    cal = Calibrator(cfg, [ids], lambda t: w["model.embed_tokens.weight"][t], device="cpu")
    from engine.model.layout import FUSED
    for i in range(cfg.num_layers):
        hp = f"model.layers.{i}."
        dense = {m: torch.cat([w[hp + p + ".weight"] for p in parts]) for m, parts in FUSED.items()}
        dense["self_attn.qkv_proj.bias"] = torch.cat([w[hp + p + ".bias"] for p in FUSED["self_attn.qkv_proj"]])
        for n in ("input_layernorm", "post_attention_layernorm"):
            dense[n] = w[hp + n + ".weight"]
        out = cal.layer(dense, {m: 16 for m in FUSED})
        assert set(out) == set(FUSED) and out["mlp.down_proj"]["weight"].dtype == torch.float16
    x = cal.xs[0]
    n = w["model.norm.weight"]
    got = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_eps) * n) @ w["lm_head.weight"].T
    ref = _logits(_dense_model(cfg, w), ids)
    assert torch.allclose(got, ref, atol=1e-4, rtol=1e-4)


def test_calibrated_export_untied_head(tmp_path):
    from engine.formats.checkpoint import open_checkpoint
    from engine.quant.export import export

    cfg, w = _hf_folder(tmp_path / "hf", tied=False)
    man = export(str(tmp_path / "hf"), tmp_path / "ck", "mixed", quantizer="gptq")
    assert man["quantizer"] == "gptq" and man["calibration"]["act_order"] is False
    assert man["calibration"]["tokens"] > 1000  # ids beyond the tiny vocabulary are dropped
    t = man["tensors"]
    assert t["lm_head.qweight"]["bits"] == 4 and t["layers.0.mlp.down_proj.qweight"]["bits"] == 4
    ck = open_checkpoint(tmp_path / "ck")
    head = ck.dense("lm_head")
    assert (head - w["lm_head.weight"]).abs().max() < 0.02  # 4-bit of N(0, 0.02) weights
    ids = [3707, 11, 1879, 0, 358, 1079, 264, 1273]
    from tests.test_checkpoint import _loaded
    _, qm = _loaded(tmp_path / "ck")
    ref, got = _logits(_dense_model(cfg, w), ids), _logits(qm, ids)
    assert torch.nn.functional.cosine_similarity(ref.flatten(), got.flatten(), 0) > 0.95
