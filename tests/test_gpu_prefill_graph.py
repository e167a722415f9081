"""GPU prefill through engine/model/gpu_model.py: the per-bucket CUDA graphs (engine/model/gpu_prefill_graph.py) and
the fused eager path (kernels/prefill_elementwise.py) against each other and the plain torch path.

GPU tests (@pytest.mark.gpu, skipped without CUDA) on a random 2-layer checkpoint of the 0.5B shape:
graph prefill == eager fused prefill (last logits, K/V of the real positions, nothing written past
them) for bucket and non-bucket lengths, including a replay on new tokens; chunked == at once; the
fallbacks (no bucket fits the context; all_logits). The helpers take a device and a capture flag so
they also run on the CPU under TRITON_INTERPRET=1 with the static program run eagerly.
"""
from __future__ import annotations

import pytest
import torch

from engine.config import QWEN25_SHAPES, ModelConfig

TOL = 1e-2


def rel(a, b) -> float:
    a, b = a.float().cpu(), b.float().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def make_model(path, device, max_context=512, cfg: ModelConfig | None = None):
    from engine.model.gpu_load import load_checkpoint
    from engine.model.gpu_model import GPUModel
    from engine.model.gpu_prefill_graph import PrefillGraphs
    from engine.quant.make_random import make_random
    from engine.formats.load import load_spec
    if cfg is None:
        cfg = ModelConfig(**QWEN25_SHAPES["0.5b"])
        cfg.num_layers = 2
    make_random(cfg, "w4", path, seed=5, name="prefill-graph-check")
    m = GPUModel(load_checkpoint(load_spec(str(path)).checkpoint, device), 2, max_context, device)
    if not m.cuda:  # CPU under TRITON_INTERPRET=1: same static program, no capture
        m.prefill_graphs = PrefillGraphs(m)
    return m


def _ids(n, seed, vocab):
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _prefill(m, mode, ids, slot, **kw):
    m.prefill_mode = mode
    m.kc[:, slot].zero_(), m.vc[:, slot].zero_()
    out = m.prefill(ids, slot, 0, **kw)
    return out.clone(), m.kc[:, slot].clone(), m.vc[:, slot].clone()


def check_graph_equals_eager(m, lengths=(5, 16, 48, 100, 300)):
    V, G = m.cfg.vocab_size, m.prefill_graphs
    for n in lengths:
        b = G.bucket(n)
        assert b is not None and b >= n
        ids = _ids(n, n, V)
        lt, kt, vt = _prefill(m, "torch", ids, 0)
        lf, kf, vf = _prefill(m, "fused", ids, 0)
        assert rel(lf, lt) < 2 * TOL and rel(kf[:, :, :n], kt[:, :, :n]) < 2 * TOL, n
        l1, _, _ = _prefill(m, "graph", ids, 1)  # first use of the bucket: eager answer + capture + check
        assert rel(l1, lf) < TOL
        if m.cuda:
            assert b in G.graphs and b not in G.disabled, (b, G.disabled, G.checks)
        _prefill(m, "graph", _ids(max(1, n - 1), n + 7, V), 1)  # replay on other tokens, other length
        lg, kg, vg = _prefill(m, "graph", ids, 1)  # replay
        assert rel(lg, lf) < TOL and int(lg.argmax()) == int(lf.argmax()), (n, rel(lg, lf))
        assert rel(kg[:, :, :n], kf[:, :, :n]) < TOL and rel(vg[:, :, :n], vf[:, :, :n]) < TOL, n
        assert not kg[:, :, n:].any() and not vg[:, :, n:].any(), f"padded K/V of {n} tokens leaked into the cache"


def check_chunked_equals_at_once(m, monkeypatch, n=300, chunk=64):
    ids = _ids(n, 11, m.cfg.vocab_size)
    once, k1, v1 = _prefill(m, "graph", ids, 0)  # bucket 512 (n <= 1024)
    monkeypatch.setattr(m, "prefill_chunk", chunk)
    chunked, k2, v2 = _prefill(m, "graph", ids, 1)  # first chunk: bucket 64 graph; the rest eager, p0 > 0
    monkeypatch.setattr(m, "prefill_chunk", 2048)
    assert rel(chunked, once) < TOL and rel(k2[:, :, :n], k1[:, :, :n]) < TOL and rel(v2[:, :, :n], v1[:, :, :n]) < TOL
    allrows, _, _ = _prefill(m, "graph", ids, 0, all_logits=True)  # eager fused, every row
    assert allrows.shape == (n, m.cfg.vocab_size) and rel(allrows[-1], once) < TOL


def check_no_bucket_falls_back(m):
    G = m.prefill_graphs
    assert G.bucket(90) is None and G.bucket(2000) is None and G.bucket(10, p0=5) is None
    ids = _ids(90, 3, m.cfg.vocab_size)
    lf, _, _ = _prefill(m, "fused", ids, 0)
    lg, _, _ = _prefill(m, "graph", ids, 0)
    assert rel(lg, lf) < 1e-6


@pytest.mark.gpu
def test_graph_prefill_equals_eager(tmp_path):
    m = make_model(tmp_path, "cuda")
    check_graph_equals_eager(m)
    assert not m.prefill_graphs.disabled, m.prefill_graphs.disabled


@pytest.mark.gpu
def test_chunked_prompt_equals_at_once(tmp_path, monkeypatch):
    check_chunked_equals_at_once(make_model(tmp_path, "cuda"), monkeypatch)


@pytest.mark.gpu
def test_no_bucket_within_context_runs_eager(tmp_path):
    m = make_model(tmp_path, "cuda", max_context=100)  # buckets 16, 32, 64 only
    assert m.prefill_graphs.buckets == (16, 32, 64)
    check_no_bucket_falls_back(m)
