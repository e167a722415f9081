"""GEMVs on their producer's group flags (decode_gemv.cu gemv_body DEP, GPUModel.dep, StepOps._dep).

CPU: the step releases flags only where the next GEMV waits on them and waits only on flags released in the step
(a GEMV waiting for nobody would hang the GPU): gate_up -> down_proj, o -> gate_up, down_proj -> the next layer's qkv.
GPU (pytest -m gpu): the gate_up / down_proj pair against the PDL pair and the reference at batch 1, 3 and 8 with the
flags back at zero after every pair, and whole steps with and without the flags (levels 1 and 2): the same greedy
tokens, row 0's logits bit for bit at batch 1 and 3.
"""
import pytest
import torch

from kernels.decode_reference import RefKernels


class _Recording(RefKernels):
    """The references, noting which GEMVs were handed the flags."""

    def __init__(self):
        self.calls = []

    def gemv(self, w, x, B, epi, out, *a, dep_w=None, dep_r=None, **kw):
        self.calls.append((epi, dep_w is not None, dep_r is not None))
        return super().gemv(w, x, B, epi, out, *a, **kw)


def test_flags_go_to_each_gate_up_and_the_down_proj_after_it(tmp_path):
    from engine.bench.decode_bench import scheme_weights
    from engine.config import QWEN25_SHAPES, ModelConfig
    from engine.model.gpu_model import GPUModel

    cfg = ModelConfig(**{**QWEN25_SHAPES["0.5b"], "num_layers": 3, "vocab_size": 512})
    w = scheme_weights(cfg, 4, torch.device("cpu"))
    m = GPUModel(w, 2, 64, "cpu")
    assert m.dep == {}  # only on CUDA with DEEPINFER_GEMV_DEP=1 or 2
    ids0, logits0 = m.decode([5, 7], [0, 0], [0, 1])
    m.kn = _Recording()
    flags = lambda: torch.zeros(1025, dtype=torch.int32)  # noqa: E731
    m.dep = {"down": flags()}  # level 1
    ids1, logits1 = m.decode([5, 7], [0, 0], [0, 1])
    assert ids1 == ids0 and torch.equal(logits1, logits0)
    # per layer qkv, o, gate_up (releases), down (waits); then the lm_head
    layer = [("store", False, False), ("resid", False, False), ("silu", False, True), ("resid", True, False)]
    assert m.kn.calls == layer * cfg.num_layers + [("logits", False, False)]
    m.kn.calls.clear()
    m.dep = {"down": flags(), "gate_up": flags(), "qkv": flags()}  # level 2
    ids2, logits2 = m.decode([5, 7], [0, 0], [0, 1])
    assert ids2 == ids0 and torch.equal(logits2, logits0)
    first = [("store", False, False), ("resid", False, True), ("silu", True, True), ("resid", True, True)]
    mid = [("store", True, False)] + first[1:]
    last = mid[:3] + [("resid", True, False)]  # the last down_proj: the final norm is a launch of its own
    assert m.kn.calls == first + mid * (cfg.num_layers - 2) + last + [("logits", False, False)]


def _pair(kn, gu, down, x, h, B, dep):
    kn.gemv(gu, x, B, "silu", kn_act(gu, x), dep_r=dep)
    kn.gemv(down, kn_act(gu, x), B, "resid", h, dep_w=dep)


_ACT = {}


def kn_act(gu, x):
    key = (gu.N, x.device)
    if key not in _ACT:
        _ACT[key] = torch.zeros(8, gu.N // 2, dtype=torch.float16, device=x.device)
    return _ACT[key]


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [4, 3])
def test_dep_pair_matches_the_pdl_pair_and_resets_its_flags(bits):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    from kernels.checks import rand_qweight
    from kernels.decode_kernels import DEP_WORDS, DecodeKernels
    from kernels.decode_reference import gemv_ref

    dev = torch.device("cuda")
    kn = DecodeKernels.get(dev)
    gen = torch.Generator(device="cpu").manual_seed(3)
    for hidden, ffn in ((2048, 11008), (896, 4864), (3584, 18944)):
        gu = rand_qweight(2 * ffn, hidden, bits, dev, gen)
        down = rand_qweight(hidden, ffn, bits, dev, gen)
        dep = torch.zeros(DEP_WORDS, dtype=torch.int32, device=dev)
        for B in (1, 3, 8):
            x = (torch.randn(8, hidden, generator=gen) * 0.5).half().to(dev)
            h0 = torch.randn(8, hidden, generator=gen).to(dev)
            want = h0.clone()
            _pair(kn, gu, down, x, want, B, None)
            for rep in range(3):
                got = h0.clone()
                _pair(kn, gu, down, x, got, B, dep)
                torch.cuda.synchronize()
                assert int(dep.abs().sum()) == 0, (hidden, B, rep, dep.nonzero()[:4])
                # the same sums in another order: fp32 rounding apart
                torch.testing.assert_close(got[:B], want[:B], rtol=1e-3, atol=2e-2)
                assert torch.equal(got[B:], h0[B:])
            # and the references
            g = gemv_ref(x[:B], gu, bias=False).float()
            f = gu.N // 2
            act = (torch.nn.functional.silu(g[:, :f]) * g[:, f:]).half()
            ref = h0[:B] + gemv_ref(act, down, bias=False).float()
            # act rounds to fp16 on both sides, and an ulp of a large act moves h by that ulp times a weight
            assert float((want[:B] - ref).abs().max()) <= 2e-3 * float(ref.abs().max()) + 0.05


@pytest.mark.gpu
@pytest.mark.parametrize("level", ["1", "2"])
def test_steps_on_flags_give_the_same_tokens(monkeypatch, level):
    """A 4-layer 3B-shaped random W4 model, 12 greedy steps at batch 1 and 3: the same ids with and without the
    flags; with them, row 0's logits at batch 3 are batch 1's bit for bit (the sums' order does not depend on B)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    from engine.bench.decode_bench import scheme_weights
    from engine.config import QWEN25_SHAPES, ModelConfig
    from engine.model.gpu_model import GPUModel

    cfg = ModelConfig(**{**QWEN25_SHAPES["3b"], "num_layers": 4})
    w = scheme_weights(cfg, 4, torch.device("cuda"))
    runs = {}
    for knob in (level, "0"):
        monkeypatch.setenv("DEEPINFER_GEMV_DEP", knob)
        m = GPUModel(w, 4, 256, "cuda")
        assert len(m.dep) == {"0": 0, "1": 1, "2": 3}[knob]
        ids_by_b, row0 = {}, {}
        for B in (1, 3):
            toks, seq, rows = [11] * B, [], []
            for step in range(12):
                ids, logits = m.decode(toks, [step] * B, list(range(B)))
                seq.append(ids[0])
                rows.append(logits[0].clone())
                toks = ids
            ids_by_b[B], row0[B] = seq, torch.stack(rows)
        if m.dep:
            assert all(int(d.abs().sum()) == 0 for d in m.dep.values())
            assert torch.equal(row0[1], row0[3])
        runs[knob] = (ids_by_b, row0)
        del m
    assert runs[level][0] == runs["0"][0]
    torch.testing.assert_close(runs[level][1][1], runs["0"][1][1], rtol=1e-2, atol=5e-2)
