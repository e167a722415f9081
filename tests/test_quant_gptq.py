"""GPTQ quantizer (engine/quant/gptq.py) and its calibration forward (engine/quant/calibrate.py), on
tiny random Qwen2 models: the calibration forward is the model's forward, GPTQ lowers the output error
it is built to lower, and a calibrated export loads and runs."""
import torch

from engine.quant.calibrate import Calibrator
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
    assert torch.allclose(hs.H, 2 * x.double().T @ x.double() / x.shape[0], rtol=1e-10, atol=1e-10)
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
    assert man["quantizer"] == "gptq" and man["calibration"]["act_order"] is True and man["calibration"]["refit"] == 2
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


def _correlated(K=256, N=96, T=2048, seed=0):
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(K, K, generator=g) / K ** 0.5 + torch.eye(K)
    x = torch.randn(T, K, generator=g) @ mix
    x[:, 7] *= 20
    x[:, 200] *= 8
    hs = Hessian(K)
    hs.add(x)
    return torch.randn(N, K, generator=g) * 0.02, hs.H


def test_act_order_static_groups_keep_the_layout_and_lower_the_error():
    from engine.quant.quantize import pack_fast, unpack_fast
    w, H = _correlated()
    for bits in (4, 3):
        q0, s0, m0 = gptq_quantize(w, H, bits)
        q, s, m = gptq_quantize(w, H, bits, act_order=True)
        # static groups: every group's params are the min/max ones of the unmodified weights
        ref_q, ref_s, ref_m = pack.quantize(w, bits)
        assert torch.equal(s, ref_s) and torch.equal(m, ref_m)
        assert torch.equal(unpack_fast(pack_fast(q, bits), w.shape[1], bits), q)
        wq = pack.dequantize(q, s, m)
        assert output_error(w, wq, H) < output_error(w, pack.dequantize(q0, s0, m0), H)
        # fixed params given: the same codes as act-order computing those params itself
        q2, s2, m2 = gptq_quantize(w, H, bits, act_order=True, params=(s, m))
        assert torch.equal(q2, q) and torch.equal(s2, s)


def test_refit_is_the_least_squares_optimum_for_fixed_codes():
    from engine.quant.recipe import Recipe, quantize_linear
    from engine.quant.refit import refit_params
    w, H = _correlated(K=256, N=32)
    q, s, m = gptq_quantize(w, H, 4)
    s2, m2 = refit_params(w, q, s, m, H, damp=0.0)
    e0 = output_error(w, pack.dequantize(q, s, m), H)
    e1 = output_error(w, pack.dequantize(q, s2, m2), H)
    assert e1 < 0.97 * e0 and torch.equal(q, q)
    # optimum: the float64 least-squares solution of one row, built column by column, agrees
    r, G = 3, 2
    B = torch.zeros(256, 2 * G, dtype=torch.float64)
    for g in range(G):
        B[g * 128:(g + 1) * 128, g] = q[r, g * 128:(g + 1) * 128].double()
        B[g * 128:(g + 1) * 128, G + g] = 1
    Hd = H.double()
    theta = torch.linalg.solve(B.T @ Hd @ B, B.T @ Hd @ w[r].double())
    assert torch.allclose(s2[r].double(), theta[:G], rtol=2e-3)
    assert torch.allclose(m2[r].double(), theta[G:], rtol=2e-3, atol=1e-5)
    # the recipe's rounds never raise the calibration error
    errs = [output_error(w, pack.dequantize(*quantize_linear(w, H, 3, Recipe(refit=n))), H) for n in (0, 1, 2)]
    assert errs[2] <= errs[1] * 1.02 and errs[1] < errs[0]


def test_export_with_an_8bit_head(tmp_path, monkeypatch):
    """A scheme whose lm_head layout is (8, 32): written round-to-nearest with its group in the manifest, read back
    by the CPU path (the layouts of a GGUF Q8_0 head), the rest calibrated as before."""
    from engine.formats.checkpoint import open_checkpoint
    from engine.quant import scheme
    from engine.quant.export import export
    from tests.test_checkpoint import _loaded

    monkeypatch.setitem(scheme.HEAD_LAYOUTS, "w4", (8, 32))
    cfg, w = _hf_folder(tmp_path / "hf", tied=False)
    man = export(str(tmp_path / "hf"), tmp_path / "ck", "w4", quantizer="gptq")
    t = man["tensors"]
    assert t["lm_head.qweight"]["bits"] == 8 and t["lm_head.scales"]["group"] == 32
    assert t["embed_tokens.qweight"]["bits"] == 4 and "group" not in t["embed_tokens.qweight"]
    assert man["policy"]["lm_head"] == "8 (group 32)"
    head = open_checkpoint(tmp_path / "ck").dense("lm_head")
    assert (head - w["lm_head.weight"]).abs().max() < 0.02 / 8  # 8-bit steps over a group of 32
    ids = [3707, 11, 1879, 0, 358, 1079, 264, 1273]
    _, qm = _loaded(tmp_path / "ck")
    ref, got = _logits(_dense_model(cfg, w), ids), _logits(qm, ids)
    assert torch.nn.functional.cosine_similarity(ref.flatten(), got.flatten(), 0) > 0.95


def test_hessian_token_cap_scales_only_outlier_tokens():
    """Recipe.token_cap: a token with more than cap x the batch's mean squared norm counts as cap x the mean (the
    attention-sink row); the others as they are."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 32, generator=g, dtype=torch.float64)
    x[0] *= 100.0  # one sink-like token
    plain, capped = Hessian(32), Hessian(32, cap=10.0)
    plain.add(x)
    capped.add(x)
    e = (x * x).sum(1)
    y = x.clone()
    y[0] *= (10.0 * e.mean() / e[0]).sqrt()
    assert torch.allclose(capped.H, 2 * y.T @ y / 64, rtol=1e-12, atol=1e-12)
    assert torch.allclose(plain.H, 2 * x.T @ x / 64, rtol=1e-12, atol=1e-12)


def test_asymmetric_target_matches_the_dense_outputs():
    """calibrate.asym_target: with the quantized path's inputs X~ = X (no drift) it is W itself; with drift,
    the target fitted on X~ reproduces the dense outputs W X better than W does, and GPTQ of it keeps that."""
    from engine.quant.calibrate import _Paired, asym_target

    g = torch.Generator().manual_seed(3)
    K, N, T = 256, 64, 4096
    x = torch.randn(T, K, generator=g) @ (torch.randn(K, K, generator=g) / K ** 0.5 + torch.eye(K))
    xq = x + 0.3 * torch.randn(T, K, generator=g) @ (torch.randn(K, K, generator=g) / K ** 0.5)  # drift
    w = torch.randn(N, K, generator=g) * 0.02
    same = _Paired(Hessian(K), {"m": x}, "m")
    same.add(x)
    assert torch.allclose(asym_target(w, same.C, same.hess.S, 0.01), w, atol=1e-4)
    p = _Paired(Hessian(K), {}, "m")
    for a, b in zip(x.split(1024), xq.split(1024)):  # batches, paired token by token
        p.dense["m"] = a
        p.add(b)
    ws = asym_target(w, p.C, p.hess.S, 0.01)
    y = x @ w.T
    err = lambda wq: ((xq @ wq.T - y) ** 2).mean().item()
    assert err(ws) < 0.8 * err(w)  # (the drift is partly independent of X: no target removes all of it)
    q, s, m = gptq_quantize(ws, p.hess.H, 4)
    q0, s0, m0 = gptq_quantize(w, p.hess.H, 4)
    assert err(pack.dequantize(q, s, m)) < 0.8 * err(pack.dequantize(q0, s0, m0))


def test_auto_calibration_set_gives_the_widest_hessian_full_rank():
    """calib="auto" (the default recipe): the 0.5B (down_proj K 4,864) calibrates on "extended" (8,564 tokens),
    the 1.5B (K 8,960: "extended" would leave its down_proj Hessian singular) on "large"; the widest models take
    the largest set."""
    from types import SimpleNamespace

    from engine.formats.tokenizer import bundled_qwen2_tokenizer
    from engine.quant.calibrate import calibration_set, recipe_segments
    from engine.quant.recipe import DEFAULT

    tok = bundled_qwen2_tokenizer()
    spec = lambda K: SimpleNamespace(tokenizer=tok, config=SimpleNamespace(vocab_size=151936, intermediate_size=K))
    assert DEFAULT.calib == "auto"
    assert calibration_set(spec(4864), DEFAULT) == "extended"
    assert calibration_set(spec(8960), DEFAULT) == "large"
    assert calibration_set(spec(18944), DEFAULT) == "large"
    assert calibration_set(spec(8960), DEFAULT.but(calib="base")) == "base"
    n = sum(len(s) for s in recipe_segments(spec(8960), DEFAULT))
    assert 1.5 * 8960 <= n <= 16384
