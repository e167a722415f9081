"""Int8 activations in the batch-1 decode step (DEEPINFER_DECODE_Q8=1: decode_gemv.cu gemv_w4q8_*, kernels/q8_plan.py):
the plans' bounds and the step on the references on the CPU; on a GPU the kernels against their references with
every epilogue (bias, the deferred norm on both sides, silu), bit-equal reruns, and the real step against the
reference step."""
import pytest
import torch

from kernels.decode_reference import RefKernels
from kernels.pack import pack_w4
from kernels.q8_plan import Q8_PLANS, Q8_SLOTS, q8_fit, q8_ok, q8_plan, q8_slots
from kernels.qweight import QWeight
from tiny_step import tiny_step_model


def test_q8_plans_fit_the_shared_memory_and_keep_two_groups_per_warp():
    for (N, K) in list(Q8_PLANS) + [(768, 256), (256, 384), (4096, 20480), (1024, 128)]:
        for epi in ("store", "resid", "silu"):
            ksw, ksb, mt = q8_plan(epi, N, K)
            G = K // 128
            assert q8_slots(G, ksw * ksb, ksw) <= Q8_SLOTS
            assert ksw * ksb == 1 or G // (ksw * ksb) >= 2
            assert N % (16 * mt) == 0 and (mt == 2 if epi == "silu" else mt in (1, 2))
    # the fp16 kernels' plans (DEEPINFER_Q8_PLAN=fp16: the 3B's qkv by gemv_plan's rule, o (8, 1, 2), gate_up
    # (4, 1, 2), down (8, 4, 2)) made ones the q8 kernels run; a plan that fits is kept as it is
    assert q8_fit("resid", 2048, 2048, 8, 1, 2) == (8, 1, 2) and q8_fit("silu", 22016, 2048, 4, 1, 2) == (4, 1, 2)
    assert q8_fit("resid", 2048, 11008, 8, 4, 2) == (8, 4, 2) and q8_fit("silu", 22016, 2048, 4, 1, 1) == (4, 1, 2)
    assert q8_fit("store", 2560, 2048, 8, 4, 1) == (8, 1, 1)  # 16 groups: two per warp at most 8 slices
    # every block row's slots hold its groups: group grp of slice grp % KS sits in block row (grp % KS) // KSW
    for G, KS, KSW in [(86, 32, 8), (16, 8, 2), (148, 16, 8), (3, 1, 1), (17, 8, 4)]:
        for by in range(KS // KSW):
            mine = [grp for grp in range(G) if (grp % KS) // KSW == by]
            slots = {(grp // KS) * KSW + grp % KS - by * KSW for grp in mine}
            assert max(slots, default=-1) < q8_slots(G, KS, KSW, by) and len(slots) == len(mine)


def _w4(N, K, gen, bias=False, dev="cpu"):
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8, generator=gen)
    s = (torch.rand(N, K // 128, generator=gen) * 0.02 + 0.002).half()
    m = (-8 * s.float() + torch.randn(N, K // 128, generator=gen) * 0.002).half()
    b = (torch.randn(N, generator=gen) * 0.1).half() if bias else None
    return QWeight(N, K, 4, qweight=pack_w4(q).to(dev), scales=s.to(dev), mins=m.to(dev),
                   bias=None if b is None else b.to(dev))


def test_q8_ok_takes_only_the_batch_1_w4_layer_gemvs():
    gen = torch.Generator().manual_seed(0)
    w = _w4(256, 256, gen)
    assert q8_ok(w, "store", 1) and q8_ok(w, "resid", 1) and q8_ok(w, "silu", 1)
    assert q8_ok(w, "store", 8) and not q8_ok(w, "store", 9) and not q8_ok(w, "logits", 1)
    assert not q8_ok(_w4(64, 128 * (Q8_SLOTS + 1), gen), "store", 1)
    # the x slots of 8 tokens within 48 KB of shared memory: the 3B's linears, not the 7B's or 14B's down (plans of
    # few K slices: 8 x 80 and 8 x 112 slots) nor the 14B's gate_up
    from kernels.q8_plan import q8_smem
    for e, N, K in [("resid", 3584, 18944), ("resid", 5120, 13824), ("silu", 27648, 5120)]:
        assert q8_smem(e, N, K, 1) <= 48 * 1024 < q8_smem(e, N, K, 8)
    assert all(q8_smem(e, N, K, 8) <= 48 * 1024 for e, N, K in [("store", 2560, 2048), ("resid", 2048, 2048),
                                                                 ("resid", 2048, 11008), ("silu", 22016, 2048)])


def test_step_on_references_with_int8_activations(tmp_path, monkeypatch):
    """The step with DEEPINFER_DECODE_Q8=1 on the references: its batch-1 logits move (the q8 path runs) but stay
    near the fp16 step's; a batch of 2 keeps the fp16 GEMVs (same logits as without q8)."""
    prompt = list(range(40, 52))
    runs = {}
    for q8 in ("0", "1"):
        monkeypatch.setenv("DEEPINFER_DECODE_Q8", q8)
        _, m = tiny_step_model(tmp_path / q8, seed=3)
        assert m.q8 == (q8 == "1")
        first = int(m.prefill(prompt, 0, 0).argmax())
        m.prefill(prompt[:5], 1, 0)
        _, l1 = m.decode([first], [len(prompt)], [0])
        l1 = l1[0].clone()
        _, l2 = m.decode([first, 7], [len(prompt), 5], [0, 1])
        runs[q8] = (l1, l2[:2].clone())
    (a1, a2), (b1, b2) = runs["0"], runs["1"]
    assert not torch.equal(a1, b1) and float((a1 - b1).norm() / a1.norm()) < 0.05
    assert torch.equal(a2, b2)


def test_step_on_references_with_int8_activations_in_every_step(tmp_path, monkeypatch):
    """DEEPINFER_DECODE_Q8=all: batched steps take the q8 GEMVs too (one token's arithmetic whatever the batch), so a
    sequence's logits in a batch of 2 are its logits alone, and differ from the fp16 batch's."""
    monkeypatch.setenv("DEEPINFER_DECODE_Q8", "all")
    _, m = tiny_step_model(tmp_path, seed=3)
    assert m.q8 and m.q8_all
    prompt = list(range(40, 52))
    first = int(m.prefill(prompt, 0, 0).argmax())
    m.prefill(prompt[:5], 1, 0)
    _, l1 = m.decode([first], [len(prompt)], [0])
    l1 = l1[0].clone()
    _, l2 = m.decode([first, 7], [len(prompt), 5], [0, 1])
    assert float((l2[0] - l1).abs().max()) <= 1e-5 * float(l1.abs().max())


@pytest.mark.gpu
def test_q8_kernels_match_references_with_every_epilogue():
    from kernels.decode_kernels import DecodeKernels
    from kernels.decode_reference import to_fix
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    kn, ref, dev = DecodeKernels.get(torch.device("cuda")), RefKernels(), "cuda"
    gen = torch.Generator().manual_seed(7)
    shapes = [("store", 2560, 2048), ("store", 4608, 3584), ("resid", 2048, 2048), ("resid", 2048, 11008),
              ("resid", 3584, 18944), ("resid", 5120, 13824), ("silu", 22016, 2048), ("silu", 768, 256),
              ("store", 256, 384)]
    for epi, N, K in shapes:
        wc = _w4(N, K, gen, bias=epi == "store")  # the reference's copy on the CPU
        w = QWeight(N, K, 4, qweight=wc.qweight.to(dev), scales=wc.scales.to(dev), mins=wc.mins.to(dev),
                    bias=None if wc.bias is None else wc.bias.to(dev))
        assert q8_ok(w, epi, 1)
        x = torch.zeros(8, K, dtype=torch.float16, device=dev)
        x[0] = (torch.randn(K, generator=gen) * 0.7).half()
        x[0, :32] = 0  # an all-zero block
        ss = torch.zeros(2, 8, dtype=torch.int64, device=dev)
        ss[:, 0] = to_fix(torch.tensor([K * 0.5, K * 0.8]))  # the deferred norm's sums (consumer: rstd / sc)
        kw = {"ss": ss.clone(), "eps": 1e-6}
        if epi == "resid":  # the producer side: h += y, xn and the next point's sums
            nw = (torch.rand(N, generator=gen) + 0.5).to(dev)
            outs = [torch.randn(8, N, generator=gen).to(dev) for _ in range(2)]
            outs[1].copy_(outs[0])
            xns = [torch.zeros(8, N, dtype=torch.float16, device=dev) for _ in range(2)]
            sss = [ss.clone(), ss.clone()]
            kn.gemv(w, x, 1, epi, outs[0], norm=(nw, 1e-6, xns[0]), ss=sss[0], q8=True)
            o, xr, sr = outs[1].cpu(), xns[1].cpu(), sss[1].cpu()
            ref.gemv(wc, x.cpu(), 1, epi, o, norm=(nw.cpu(), 1e-6, xr), ss=sr, q8=True)
            torch.cuda.synchronize()
            assert float((outs[0][0].cpu() - o[0]).abs().max() / o[0].abs().max()) < 1e-5, (N, K)
            assert float((xns[0][0].float().cpu() - xr[0].float()).abs().max()) <= 2e-3 * float(xr[0].abs().max())
            assert abs(int(sss[0][1, 0]) - int(sr[1, 0])) <= 4096 + (int(sr[1, 0]) >> 16)
            assert torch.equal(outs[0][1:].cpu(), o[1:])  # rows >= B untouched
            continue
        cols = N // 2 if epi == "silu" else N
        outs = [torch.zeros(8, cols, dtype=torch.float16, device=dev) for _ in range(3)]
        kn.gemv(w, x, 1, epi, outs[0], q8=True, **kw)
        kn.gemv(w, x, 1, epi, outs[1], q8=True, **kw)
        o = outs[2].cpu()
        ref.gemv(wc, x.cpu(), 1, epi, o, ss=ss.cpu(), eps=1e-6, q8=True)
        torch.cuda.synchronize()
        assert torch.equal(outs[0], outs[1])  # deterministic (the split-K handshake, no atomics on y)
        got, want = outs[0][0].float().cpu(), o[0].float()
        tol = 2e-3 * float(want.abs().max()) + 1e-6  # fp16 outputs: an ulp of the largest, fp32 sums apart
        assert float((got - want).abs().max()) <= tol, (epi, N, K, float((got - want).abs().max()), tol)
        assert not outs[0][1:].any()
        if q8_ok(w, epi, 3):  # 3 tokens (gemv_w4q8b_*): each against the reference, token 0 bit-equal to B = 1's
            x[1:3] = (torch.randn(2, K, generator=gen) * 0.7).half().to(dev)
            ss[:, 1:3] = ss[:, :1]
            o3 = torch.zeros(8, cols, dtype=torch.float16, device=dev)
            kn.gemv(w, x, 3, epi, o3, q8=True, ss=ss.clone(), eps=1e-6)
            r3 = torch.zeros(8, cols, dtype=torch.float16)
            ref.gemv(wc, x.cpu(), 3, epi, r3, ss=ss.cpu(), eps=1e-6, q8=True)
            torch.cuda.synchronize()
            assert torch.equal(o3[0], outs[0][0]), (epi, N, K)
            for b in range(3):
                d = float((o3[b].float().cpu() - r3[b].float()).abs().max())
                assert d <= 2e-3 * float(r3[b].float().abs().max()) + 1e-6, (epi, N, K, b, d)
            assert not o3[3:].any()


@pytest.mark.gpu
def test_q8_in_every_step_gives_a_sequence_its_tokens_alone(tmp_path, monkeypatch):
    """DEEPINFER_DECODE_Q8=all on the GPU: a sequence decoded beside another gets the tokens it gets alone."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    monkeypatch.setenv("DEEPINFER_DECODE_Q8", "all")
    _, m = tiny_step_model(tmp_path, device="cuda", seed=4)
    prompts = [list(range(40, 52)), list(range(300, 307))]
    firsts = [int(m.prefill(p, s, 0).argmax()) for s, p in enumerate(prompts)]
    alone, t = [], firsts[0]
    for i in range(10):
        ids, _ = m.decode([t], [len(prompts[0]) + i], [0])
        t = ids[0]
        alone.append(t)
    m.prefill(prompts[0], 0, 0)
    both, toks = [], firsts
    for i in range(10):
        toks, _ = m.decode(toks, [len(p) + i for p in prompts], [0, 1])
        both.append(toks[0])
    assert both == alone


@pytest.mark.gpu
def test_q8_step_on_the_gpu_matches_the_reference_step(tmp_path, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    monkeypatch.setenv("DEEPINFER_DECODE_Q8", "1")
    prompt = list(range(40, 52))
    toks = {}
    for dev in ("cpu", "cuda"):
        _, m = tiny_step_model(tmp_path / dev, device=dev, seed=4)
        t = [int(m.prefill(prompt, 0, 0).argmax())]
        for i in range(12):
            ids, _ = m.decode([t[-1]], [len(prompt) + i], [0])
            t.append(ids[0])
        toks[dev] = t
    assert toks["cuda"] == toks["cpu"]


def test_the_switch_reaches_the_config():
    import argparse

    from engine.server.cli import add_arguments, build_config
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert build_config(p.parse_args([])).decode_q8 is False
    assert build_config(p.parse_args(["--decode-q8"])).decode_q8 is True


def test_q8_layouts_take_our_w4_and_the_gguf_q4_repacks():
    """The q8 kernels read W4 in groups of 128 (our checkpoints) and of 32 in every scale form (the GGUF Q4_K / Q4_0
    repacks a pulled Ollama model runs on); every other layout keeps the fp16 kernels."""
    from kernels.checks_gguf import rand_layout
    from kernels.q8_plan import q8_kernel, q8_layout
    gen = torch.Generator().manual_seed(1)
    assert q8_layout(_w4(256, 256, gen)) == ""
    for form, infix in (("", "g32"), ("kq", "k32"), ("sym", "s32")):
        w, _ = rand_layout(256, 512, 4, 32, gen, "cpu", form=form)
        assert q8_layout(w) == infix and q8_ok(w, "resid", 1) and q8_ok(w, "silu", 8)
    for bits, group, form in ((8, 32, ""), (6, 16, "kq"), (8, 32, "sym"), (6, 32, "")):
        w, _ = rand_layout(256, 512, bits, group, gen, "cpu", form=form)
        assert q8_layout(w) is None and not q8_ok(w, "store", 1)
    assert q8_kernel("gemv_w4q8_store") == 1 and q8_kernel("gemv_w4k32q8b_silu") == 8
    assert q8_kernel("gemv_w4s32q8_resid_mt2") == 1 and q8_kernel("gemv_w4_store") == 0
    assert q8_kernel("gemv_w4k32_store") == 0 and q8_kernel("gemv_q8_w4") == 0


def test_q8_reference_on_the_gguf_q4_layouts():
    """gemv_q8_w4_ref on groups of 32 (plain, KQ, SYM): the quantized x times the dequantized weights, each group
    with its own scale and min; and the reference step's q8 GEMV stays within a few per cent of its fp16 one."""
    from kernels.checks_gguf import rand_layout
    from kernels.q8_reference import gemv_q8_w4_ref, quant_x_q8_ref
    gen = torch.Generator().manual_seed(2)
    ref = RefKernels()
    for form in ("", "kq", "sym"):
        w, wf = rand_layout(384, 1024, 4, 32, gen, "cpu", form=form)
        x = (torch.randn(1024, generator=gen) * 0.7).half()
        x[:32] = 0  # an all-zero block
        xq, dx, _ = quant_x_q8_ref(x)
        want = (xq.double().reshape(-1, 32) * dx.double()[:, None]).reshape(-1) @ wf.double().T
        got = gemv_q8_w4_ref(x, w)[0].double()
        assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max()), form
        xs = torch.zeros(8, 1024, dtype=torch.float16)
        xs[0] = x
        o8, o16 = torch.zeros(8, 384, dtype=torch.float16), torch.zeros(8, 384, dtype=torch.float16)
        ref.gemv(w, xs, 1, "store", o8, q8=True)
        ref.gemv(w, xs, 1, "store", o16)
        d = float((o8[0].float() - o16[0].float()).norm() / o16[0].float().norm())
        assert 0 < d < 0.03, (form, d)


@pytest.mark.gpu
def test_q8_kernels_on_the_gguf_q4_layouts_match_references():
    """gemv_w4{g32,k32,s32}q8_*: every epilogue at batch 1 and 3 against the reference, token 0 of the batch of 3
    bit-equal to batch 1's, reruns bit-equal."""
    from kernels.checks_gguf import rand_layout
    from kernels.decode_kernels import DecodeKernels
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    kn, ref, dev = DecodeKernels.get(torch.device("cuda")), RefKernels(), "cuda"
    gen = torch.Generator().manual_seed(9)
    for form in ("", "kq", "sym"):
        for epi, N, K in (("store", 2560, 2048), ("resid", 2048, 11008), ("silu", 22016, 2048), ("store", 256, 512)):
            wc, _ = rand_layout(N, K, 4, 32, gen, "cpu", bias=epi == "store", form=form)
            w = QWeight(N, K, 4, qweight=wc.qweight.to(dev), scales=wc.scales.to(dev), mins=wc.mins.to(dev),
                        bias=None if wc.bias is None else wc.bias.to(dev), group=32, form=form)
            assert q8_ok(w, epi, 3)
            x = torch.zeros(8, K, dtype=torch.float16)
            x[:3] = (torch.randn(3, K, generator=gen) * 0.7).half()
            cols = N // 2 if epi == "silu" else N
            mk = (lambda: torch.randn(8, N, generator=torch.Generator().manual_seed(5))) if epi == "resid" else \
                (lambda: torch.zeros(8, cols, dtype=torch.float16))
            res = {}
            for B in (1, 3):
                outs = [mk().to(dev) for _ in range(2)]
                for o in outs:
                    kn.gemv(w, x.to(dev), B, epi, o, q8=True)
                r = mk()
                ref.gemv(wc, x, B, epi, r, q8=True)
                torch.cuda.synchronize()
                assert torch.equal(outs[0], outs[1]), (form, epi, N, K, B)
                for b in range(B):
                    got, want = outs[0][b].float().cpu(), r[b].float()
                    tol = 2e-3 * float(want.abs().max()) + 1e-6
                    assert float((got - want).abs().max()) <= tol, (form, epi, N, K, B, b)
                res[B] = outs[0][0].cpu()
            assert torch.equal(res[1], res[3]), (form, epi, N, K)


def _q4km_step(tmp_path, device, monkeypatch, q8):
    """A random Q4_K_M GGUF (Q4_K linears, Q6_K attn_v / ffn_down in some layers) loaded as a pull loads it
    (kquant) into the decode step, DEEPINFER_DECODE_Q8 = q8."""
    from engine.config import ModelConfig
    from engine.formats.gguf_reader import read_gguf
    from engine.model import gpu_load
    from engine.model.gpu_model import GPUModel
    from engine.quant.random_gguf import write_random_gguf
    path = tmp_path / "r.gguf"
    if not path.exists():
        cfg = ModelConfig(vocab_size=151936, hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4,
                          num_kv_heads=2, tie_word_embeddings=False)
        write_random_gguf(cfg, path, ftype="q4_k_m")
    monkeypatch.setenv("DEEPINFER_DECODE_Q8", q8)
    return GPUModel(gpu_load.load_source(read_gguf(path), device, mode="kquant"), 1, 64, device)


def _decode(m, n=4):
    prompt = list(range(100, 112))
    lg = m.prefill(prompt, 0, 0)
    toks, logs = [int(lg.argmax())], []
    for i in range(n):
        ids, l = m.decode([toks[-1]], [len(prompt) + i], [0])
        toks.append(ids[0])
        logs.append(l[0].float().cpu().clone())
    return toks, logs


def test_q8_step_on_a_q4_k_m_gguf_on_references(tmp_path, monkeypatch):
    """A user's Q4_K_M model (kquant): with the switch its Q4_K GEMVs take the q8 kernels (Q6_K's keep fp16), the
    logits move a little and no more."""
    from kernels.q8_plan import q8_layout
    m0 = _q4km_step(tmp_path, "cpu", monkeypatch, "0")
    _, l0 = _decode(m0)
    m1 = _q4km_step(tmp_path, "cpu", monkeypatch, "1")
    assert m1.q8 and {q8_layout(l.gate_up) for l in m1.w.layers} == {"k32"}
    assert {q8_layout(l.down) for l in m1.w.layers} >= {None}  # Q6_K downs: fp16 kernels
    _, l1 = _decode(m1)
    for a, b in zip(l0, l1):
        assert not torch.equal(a, b) and float((a - b).norm() / a.norm()) < 0.05


@pytest.mark.gpu
def test_q8_step_on_a_q4_k_m_gguf_on_the_gpu_matches_the_reference_step(tmp_path, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    toks = {dev: _decode(_q4km_step(tmp_path, dev, monkeypatch, "1"), 8)[0] for dev in ("cpu", "cuda")}
    assert toks["cuda"] == toks["cpu"]
