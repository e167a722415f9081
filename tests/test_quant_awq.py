"""AWQ-style scaling (engine/quant/awq.py): the fold is exact in float (same layer output before
quantization), the searched scales follow the activations, and a calibrated export with it runs."""
import torch

from engine.model.layout import FUSED, LINEARS
from engine.quant.awq import fold, search_scale
from engine.quant.calibrate import Calibrator
from engine.quant.gptq import Hessian
from tests.test_checkpoint import _hf_folder


def _layer(w, i):
    hp = f"model.layers.{i}."
    dense = {m: torch.cat([w[hp + p + ".weight"] for p in parts]) for m, parts in FUSED.items()}
    dense["self_attn.qkv_proj.bias"] = torch.cat([w[hp + p + ".bias"] for p in FUSED["self_attn.qkv_proj"]])
    for n in ("input_layernorm", "post_attention_layernorm"):
        dense[n] = w[hp + n + ".weight"].clone()
    return dense


def test_fold_is_exact_before_quantization(tmp_path):
    cfg, w = _hf_folder(tmp_path / "hf", tied=False)
    ids = [3707, 11, 1879, 0, 358, 1079, 264, 1273, 42, 7, 99, 5]
    cal = Calibrator(cfg, [ids], lambda t: w["model.embed_tokens.weight"][t], device="cpu")
    x = cal.xs[0] * 50  # large activations so the searched scales are far from 1
    dense = _layer(w, 0)
    hess = {m: Hessian(dense[m].shape[1]) for m in LINEARS}
    ref = cal._forward(x, dense, hess)
    before = {m: h.H.clone() for m, h in hess.items()}
    ratios = fold(dense, hess, {m: 3 for m in LINEARS}, cfg)
    assert max(ratios.values()) > 1.5  # something was scaled
    hess2 = {m: Hessian(dense[m].shape[1]) for m in LINEARS}
    got = cal._forward(x, dense, hess2)
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5 * ref.abs().max())
    for m in LINEARS:  # the folded Hessians are those of the scaled inputs
        assert torch.allclose(hess[m].H, hess2[m].H, rtol=1e-3, atol=1e-5 * hess2[m].H.abs().max())
        assert not torch.equal(hess[m].H, before[m]) or ratios[m] == 1.0


def test_search_scales_up_the_channels_with_large_inputs():
    g = torch.Generator().manual_seed(0)
    K, N = 256, 64
    x = torch.randn(4096, K, generator=g)
    x[:, :8] *= 30  # salient input channels
    hs = Hessian(K)
    hs.add(x)
    w = torch.randn(N, K, generator=g) * 0.02
    s = search_scale(w, hs.H, 3)
    assert s[:8].min() > s[8:].max()  # the salient channels get the larger scales


def test_calibrated_export_with_awq_runs(tmp_path, monkeypatch):
    from engine.quant import export as ex
    from tests.test_checkpoint import _dense_model, _loaded, _logits
    cfg, w = _hf_folder(tmp_path / "hf", tied=False)
    monkeypatch.setattr(ex, "RECIPE", ex.RECIPE.but(awq=True))
    man = ex.export(str(tmp_path / "hf"), tmp_path / "ck", "w4", quantizer="gptq")
    assert man["calibration"]["awq"] is True
    assert man["tensors"]["layers.0.input_layernorm.weight"]["bits"] == 32
    ids = [3707, 11, 1879, 0, 358, 1079, 264, 1273]
    _, qm = _loaded(tmp_path / "ck")
    ref, got = _logits(_dense_model(cfg, w), ids), _logits(qm, ids)
    assert torch.nn.functional.cosine_similarity(ref.flatten(), got.flatten(), 0) > 0.95
