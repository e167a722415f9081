"""End-to-end scale/min tuning (engine/quant/tune.py) on tiny random Qwen2 models: its quantized matmul's
gradients are the dense formula's, its differentiable forward is the model's forward, and tuning lowers the
KL to the dense model with every integer code unchanged."""
import math

import pytest
import torch

from engine.quant import tune
from kernels import pack
from kernels.ops_reference import Rotary
from tests.test_checkpoint import TINY, _dense_model, _hf_folder, _logits


def test_quantized_matmul_gradients_are_the_dense_formulas():
    g = torch.Generator().manual_seed(0)
    N, K = 48, 256
    q = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
    s0, m0 = torch.rand(N, K // 128, generator=g) * 0.01 + 1e-3, torch.randn(N, K // 128, generator=g) * 0.05
    lin = tune.QLinear(q, s0.half(), m0.half(), torch.randn(N, generator=g))
    with torch.no_grad():
        lin.a.normal_(0, 0.05, generator=g), lin.b.normal_(0, 0.05, generator=g)
    x = torch.randn(3, 5, K, generator=g, requires_grad=True)
    y = lin(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    # the same math through autograd on an explicit dense W
    a, b = lin.a.detach().clone().requires_grad_(), lin.b.detach().clone().requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    s, m = lin.s0 * (1 + a), lin.m0 + lin.s0 * b
    W = (q.float().view(N, 2, 128) * s.unsqueeze(-1) + m.unsqueeze(-1)).view(N, K)
    y2 = x2 @ W.T + lin.bias
    y2.backward(gy)
    assert torch.allclose(y, y2, atol=1e-5)
    for got, want in ((x.grad, x2.grad), (lin.a.grad, a.grad), (lin.b.grad, b.grad)):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)


def _weights(model):
    d = model.weights()
    return tune.Weights(d.embed, d.layers, d.norm, d.lm_head)


def test_training_forward_is_the_model_forward(tmp_path):
    cfg, w = _hf_folder(tmp_path / "hf", tied=False)
    model = _dense_model(cfg, w)
    ids = [3707, 11, 1879, 0, 358, 1079, 264, 1273, 42, 7]
    got = tune.run(_weights(model), cfg, torch.tensor(ids), Rotary(cfg.head_dim, 16, cfg.rope_theta))
    want = _logits(model, ids)
    assert torch.allclose(got, want.reshape(got.shape), atol=1e-4, rtol=1e-4)


def test_tuning_lowers_kl_and_keeps_the_codes(tmp_path):
    cfg, w = _hf_folder(tmp_path / "hf", tied=False)  # (a tied random model predicts its input token)
    model = _dense_model(cfg, w)
    g = torch.Generator().manual_seed(1)
    segs = [torch.randint(0, TINY["vocab_size"], (64,), generator=g).tolist() for _ in range(6)]
    dense = _weights(model)
    # every linear and the tied embedding at 3 bits, round-to-nearest
    qs = {}
    for i, L in enumerate(model.layers):
        for m in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
            mod = L.get_submodule(m)
            qs[f"layers.{i}.{m}"] = tune.QLinear(*pack.quantize(mod.weight.data, 3),
                                                 None if mod.bias is None else mod.bias.data)
    emb = tune.QLinear(*pack.quantize(model.embed_tokens.weight.data, 3))
    head = tune.QLinear(*pack.quantize(model.lm_head.weight.data * 20, 3))  # larger rows: a sharper head
    from engine.model.layout import LayerWeights
    layers = [LayerWeights(L.in_norm, L.post_norm, *[qs[f"layers.{i}.{m}"] for m in
              ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")])
              for i, L in enumerate(dense.layers)]
    qw = tune.Weights(emb, layers, dense.norm, head)
    targets = tune.teacher_targets(tune.Weights(dense.embed, dense.layers, dense.norm,
                                                model.lm_head.weight.data * 20), cfg, segs)
    rot = Rotary(cfg.head_dim, 64, cfg.rope_theta)

    def kl():
        with torch.no_grad():
            return sum(tune.kl_topk(tune.run(qw, cfg, torch.tensor(s), rot), t).item() for s, t in zip(segs, targets))

    codes = {id(m): m.q.clone() for m in tune._qlinears(qw)}
    before = kl()
    hist = tune.tune(qw, cfg, segs, targets, epochs=8, lr=3e-3)
    after = kl()
    assert after < 0.8 * before, (before, after, hist)
    for m in tune._qlinears(qw):
        assert torch.equal(m.q, codes[id(m)])
        s, mn = m.fp16()
        assert s.dtype == mn.dtype == torch.float16 and torch.isfinite(s).all() and (s > 0).all()
    assert tune.param_count(qw) == sum(2 * m.s0.numel() for m in tune._qlinears(qw))


def _tiny_task(tmp_path, seed: int, n: int, T: int):
    """A tiny untied random model, n random segments of T tokens, the dense model's Weights and top-k targets, and
    kl(w): the summed KL of Weights w to those targets."""
    cfg, w = _hf_folder(tmp_path / "hf", tied=False)
    g = torch.Generator().manual_seed(seed)
    segs = [torch.randint(0, TINY["vocab_size"], (T,), generator=g).tolist() for _ in range(n)]
    dense = _weights(_dense_model(cfg, w))
    targets = tune.teacher_targets(dense, cfg, segs)
    rot = Rotary(cfg.head_dim, T, cfg.rope_theta)

    def kl(qw):
        with torch.no_grad():
            return sum(tune.kl_topk(tune.run(qw, cfg, torch.tensor(s), rot), t).item() for s, t in zip(segs, targets))

    return cfg, segs, dense, targets, kl


def _w3_weights(dense, copy_norms: bool = False) -> "tune.Weights":
    """`dense`'s layers with every linear a 3-bit round-to-nearest QLinear (the embedding/head left dense);
    copy_norms: the norm weights cloned (a test that tunes them compares against the originals)."""
    from engine.model.layout import LayerWeights
    c = (lambda t: t.clone()) if copy_norms else (lambda t: t)
    def q3(lin):
        return tune.QLinear(*pack.quantize(lin.weight.data, 3), None if lin.bias is None else lin.bias.data)

    layers = [LayerWeights(c(L.in_norm), c(L.post_norm), *[q3(getattr(L, f)) for f in ("qkv", "o", "gate_up", "down")])
              for L in dense.layers]
    return tune.Weights(dense.embed, layers, c(dense.norm), dense.lm_head)


def test_norm_tuning_fits_the_norms_and_lowers_kl_further(tmp_path):
    """norms=True: the RMSNorm weights are fitted too (tune._Norms) and left in the Weights, the codes unchanged,
    and the KL ends below scales/mins alone from the same start."""
    cfg, segs, dense, targets, kl = _tiny_task(tmp_path, seed=1, n=6, T=64)
    plain, normed = _w3_weights(dense, copy_norms=True), _w3_weights(dense, copy_norms=True)
    n0 = [L.in_norm.clone() for L in normed.layers] + [normed.norm.clone()]
    codes = [m.q.clone() for m in tune._qlinears(normed)]
    tune.tune(plain, cfg, segs, targets, epochs=6, lr=3e-3)
    hist = tune.tune(normed, cfg, segs, targets, epochs=6, lr=3e-3, norms=True)
    assert hist["norms"] is True
    assert kl(normed) < kl(plain), (kl(normed), kl(plain))
    n1 = [L.in_norm for L in normed.layers] + [normed.norm]
    assert all(not a.requires_grad and a.dtype == torch.float32 for a in n1)
    assert all(not torch.equal(a, b) for a, b in zip(n0, n1))
    assert all(torch.equal(m.q, c) for m, c in zip(tune._qlinears(normed), codes))
    extra = sum(L.in_norm.numel() + L.post_norm.numel() for L in normed.layers) + normed.norm.numel()
    assert tune.param_count(normed, True) == tune.param_count(normed) + extra


def test_cosine_schedule_decays_the_rate_to_zero_and_still_lowers_kl(tmp_path, monkeypatch):
    """sched="cos": Adam's rate follows lr/2 (1 + cos(pi step/steps)) over every step of every epoch (the last
    step's rate is lr/2 (1 + cos(pi (n-1)/n)), near 0), the KL still falls, and an unknown schedule is an error,
    in tune() and already where a Recipe names it."""
    from engine.quant.recipe import DEFAULT
    cfg, segs, dense, targets, kl = _tiny_task(tmp_path, seed=2, n=4, T=48)
    qw = _w3_weights(dense)
    rates = []
    adam_step = torch.optim.Adam.step

    def spy(self, *a, **k):
        rates.append(self.param_groups[0]["lr"])
        return adam_step(self, *a, **k)

    before = kl(qw)
    monkeypatch.setattr(torch.optim.Adam, "step", spy)
    hist = tune.tune(qw, cfg, segs, targets, epochs=2, lr=3e-3, sched="cos")
    monkeypatch.undo()
    n = 2 * len(segs)
    assert hist["sched"] == "cos" and len(rates) == n
    assert rates == pytest.approx([3e-3 * 0.5 * (1 + math.cos(math.pi * i / n)) for i in range(n)])
    assert kl(qw) < before
    with pytest.raises(ValueError, match="const or cos"):
        tune.tune(qw, cfg, segs, targets, epochs=1, sched="linear")
    with pytest.raises(ValueError, match="const or cos"):
        DEFAULT.but(tune_sched="linear")


def test_export_with_tuning_keeps_the_codes_and_lowers_kl(tmp_path, monkeypatch):
    """Recipe.tune > 0 in the export (engine/quant/tune_export.py): the same GPTQ codes as without it, other fp16
    scales/mins, a lower KL to the dense model on the calibration text, and the tuning in the manifest."""
    from engine.formats.checkpoint import open_checkpoint
    from engine.quant import export as ex
    from engine.quant.calibrate import recipe_segments
    from engine.formats.load import load_spec
    from tests.test_checkpoint import _loaded

    cfg, w = _hf_folder(tmp_path / "hf", tied=False)
    base = ex.RECIPE.but(calib="base")
    monkeypatch.setattr(ex, "RECIPE", base.but(tune=3, tune_lr=3e-3))
    plain = ex.export(str(tmp_path / "hf"), tmp_path / "plain", "w4", quantizer="gptq", tune=0)  # --tune-epochs 0
    assert plain["calibration"]["tune"] is None
    man = ex.export(str(tmp_path / "hf"), tmp_path / "tuned", "w4", quantizer="gptq")
    assert man["calibration"]["tune"]["epochs"] == 3 and len(man["calibration"]["tune"]["kl_train"]) == 3
    a, b = open_checkpoint(tmp_path / "plain"), open_checkpoint(tmp_path / "tuned")
    name = "layers.1.mlp.down_proj"
    pa, pb = a.linear(name), b.linear(name)
    assert torch.equal(pa.qweight, pb.qweight) and not torch.equal(pa.scales, pb.scales)
    for name in ("embed_tokens", "lm_head"):  # tuned too, as recipe_search's in-memory tuning does
        ea, eb = a.linear(name), b.linear(name)
        assert torch.equal(ea.qweight, eb.qweight) and not torch.equal(ea.scales, eb.scales), name
    dense = _dense_model(cfg, w)
    segs = recipe_segments(load_spec(str(tmp_path / "hf")), base)[:4]

    def kl(model):
        tot = 0.0
        for s in segs:
            s = s[:64]
            p = torch.log_softmax(_logits(dense, s), -1)
            q = torch.log_softmax(_logits(model, s), -1)
            tot += float((p.exp() * (p - q)).sum(-1).mean())
        return tot
    assert kl(_loaded(tmp_path / "tuned")[1]) < kl(_loaded(tmp_path / "plain")[1])


def test_export_cli_tune_epochs(tmp_path):
    import json as _json

    from engine.cli.main import main
    _hf_folder(tmp_path / "hf", tied=True)
    assert main(["export", "--source", str(tmp_path / "hf"), "--out", str(tmp_path / "o"), "--tune-epochs", "0"]) == 0
    man = _json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert man["calibration"]["tune"] is None and man["quantizer"] == "gptq"
    assert main(["export", "--source", str(tmp_path / "hf"), "--out", str(tmp_path / "p"), "--tune-epochs", "-1"]) == 1


def test_recipe_search_perplexity_curve_over_epochs(tmp_path):
    """recipe_search --ppl-every: one tuned run measures perplexity after each N-th epoch; the last entry is the
    run's own perplexity (the same weights), and the quantization is cached for recipes differing in tuning."""
    import json as _json

    from engine.quant import recipe_search
    _hf_folder(tmp_path / "hf", tied=True)
    out = tmp_path / "r.json"
    argv = ["--model", str(tmp_path / "hf"), "--variants", "act_order+tune=3+tune_lr=1e-3", "--ppl-every", "2",
            "--codes-cache", str(tmp_path / "codes"), "--out", str(out)]
    assert recipe_search.main(argv) == 0
    run = _json.loads(out.read_text())["runs"]["w4:act_order+tune=3+tune_lr=1e-3"]
    curve = run["tune"]["perplexity_by_epoch"]
    assert sorted(curve) == ["2", "3"] and curve["3"] == run["perplexity"], run
    assert len(list((tmp_path / "codes").iterdir())) == 1
