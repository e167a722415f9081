"""Triton missing or failing (torch's Windows wheels do not bring it): the GPU prefill chooses the
torch path with ONE warning, the packed linears run on torch dequant + matmul, doctor reports it.
Triton is hidden by blocking its import; the choice and the fallback linears run on the CPU."""
from __future__ import annotations

import logging
import sys

import pytest
import torch

from kernels import pack, triton_check
from kernels.prefill_reference import linear_reference
from kernels.qweight import QWeight


@pytest.fixture
def no_triton(monkeypatch):
    for name in ("triton", "triton.language"):
        monkeypatch.setitem(sys.modules, name, None)  # `import triton` raises ImportError
    triton_check.reset()
    yield
    triton_check.reset()


def _packed(bits: int, N: int = 192, K: int = 256) -> QWeight:
    g = torch.Generator().manual_seed(bits)
    w = torch.randn(N, K, generator=g)
    q, s, m = pack.quantize(w, bits)
    qw = pack.pack_w4(q) if bits == 4 else pack.pack_w3(q)
    return QWeight(N, K, bits, qweight=qw, scales=s.half(), mins=m.half(),
                   bias=(torch.randn(N, generator=g) * 0.1).half())


def test_gpu_prefill_chooses_torch_with_one_warning(no_triton, caplog):
    ok, detail = triton_check.triton_status()
    assert not ok and "not importable" in detail
    with caplog.at_level(logging.WARNING, logger="deepinfer.kernels"):
        assert triton_check.prefill_backend(cuda=True) == "torch"
        assert triton_check.prefill_backend(cuda=True) == "torch"  # asked again (every linear): no new warning
        assert triton_check.prefill_backend(cuda=False) == "torch"
    warnings = [r.getMessage() for r in caplog.records if r.name == "deepinfer.kernels"]
    assert len(warnings) == 1, warnings
    assert "torch ops" in warnings[0] and "triton-windows" in warnings[0]


def test_cpu_never_warns(no_triton, caplog):
    with caplog.at_level(logging.WARNING, logger="deepinfer.kernels"):
        assert triton_check.prefill_backend(cuda=False) == "torch"
    assert not [r for r in caplog.records if r.name == "deepinfer.kernels"]


@pytest.mark.parametrize("bits", [4, 3])
def test_packed_linear_falls_back_to_torch_dequant(no_triton, bits):
    from engine.model.gpu_prefill import linear_prefill  # the GPU prefill's linear entry point

    w = _packed(bits)
    x = torch.randn(5, w.K, generator=torch.Generator().manual_seed(0)).half()
    got = linear_prefill(x, w).float()  # would import kernels.prefill_triton (and fail) before the fallback
    ref = linear_reference(x, w)
    assert got.shape == (5, w.N) and torch.allclose(got, ref, atol=0.05, rtol=0.01), (got - ref).abs().max()


def test_gpu_model_without_triton_prefills_on_torch(no_triton, tmp_path, caplog):
    """GPUModel asks prefill_backend for its mode (CUDA: "graph" only with a working Triton); with Triton
    hidden the model still builds and prefills (here on the CPU, where the answer is "torch")."""
    import engine.model.gpu_model as gm
    from engine.config import ModelConfig
    from engine.formats.load import load_spec
    from engine.model.gpu_load import load_checkpoint
    from engine.quant.make_random import make_random

    assert gm.prefill_backend is triton_check.prefill_backend
    cfg = ModelConfig(vocab_size=1024, hidden_size=256, intermediate_size=384, num_layers=2, num_heads=4,
                      num_kv_heads=2)
    make_random(cfg, "w4", tmp_path, seed=1)
    with caplog.at_level(logging.WARNING, logger="deepinfer.kernels"):
        m = gm.GPUModel(load_checkpoint(load_spec(str(tmp_path)).checkpoint, "cpu"), 2, 32, "cpu")
        logits = m.prefill([1, 2, 3, 4], 0)
    assert m.prefill_mode == "torch" and m.prefill_graphs is None
    assert logits.shape == (cfg.vocab_size,) and torch.isfinite(logits).all()
    assert not [r for r in caplog.records if r.name == "deepinfer.kernels"]  # the CPU needs no Triton: silent


def test_doctor_reports_triton(no_triton):
    from engine.doctor import checks as dc
    from engine.doctor.report import CHECKS
    from engine.runtime import capability

    assert dc.check_triton in CHECKS
    c = dc.check_triton({"gpu": True})
    assert c.status == "warn" and "falls back to torch" in c.summary and "triton-windows" in c.fix
    c = dc.check_triton({"gpu": False})
    assert c.status == "info" and "not installed" in c.summary
    p = capability.probe_triton(cuda=True)
    assert not p.ok and "not importable" in p.summary
