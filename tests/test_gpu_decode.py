"""GPU decode on the device machine (pytest -m gpu): every kernel vs its PyTorch reference, the GPU runner
vs the CPU runner on one random checkpoint, and the LLM facade on the GPU. Skipped without CUDA."""
import pytest

pytestmark = pytest.mark.gpu


def test_decode_kernels_match_references():
    from kernels.checks import check_kernels

    rows = check_kernels(lambda *a: None)
    bad = [r for r in rows if not r["ok"]]
    assert not bad, bad


def test_gguf_layout_kernels_match_references():
    """(4, 32), (8, 32), (8, 16), (6, 32), (6, 16), the KQ forms (4, 32) / (6, 32) / (6, 16) and the SYM forms
    (4, 32) / (6, 32) / (8, 32): GEMV store/resid/silu/logits (+argmax) and the embedding gather."""
    from kernels.checks_gguf import check

    rows = check(lambda *a: None)
    bad = [r for r in rows if not r["ok"]]
    assert not bad and len(rows) >= 100, bad


def test_gpu_runner_matches_cpu_runner():
    from gpu_checks import compare_runners

    r = compare_runners("0.5b", "w4", print)
    assert r["ok"], r


def test_llm_streams_stops_and_samples_on_gpu():
    from gpu_checks import llm_check

    r = llm_check(print)
    assert r["runner"] == "GPURunner"
    assert r["ok"], r


def test_balanced_gate_up_with_late_blocks_weighted_matches_the_reference(monkeypatch):
    """DEEPINFER_GEMV_BAL_LATE on a module built with -DGEMV_BAL_LATE=1 (decode_gemv.cu bal_first): the 3B's and 7B's
    gate_up with the late blocks taking less (the A/B knob of engine/bench/device_plans.sh) against gemv_ref."""
    import torch

    from kernels import decode_reference as ref
    from kernels.checks import TOL, rand_qweight
    from kernels.decode_kernels import DecodeKernels

    kn = DecodeKernels(0, defines=("-DGEMV_BAL_LATE=1",))
    if kn.sms != 132:
        pytest.skip("the late blocks' E values are those of 132 SMs (H100 / H200)")
    gen = torch.Generator().manual_seed(7)
    for (F2, K, late) in ((2 * 11008, 2048, "136:160"), (2 * 11008, 2048, "136:96"), (2 * 18944, 3584, "40:160")):
        w = rand_qweight(F2, K, 4, "cuda", gen)
        for B in (1, 5):
            x = torch.zeros(8, K, dtype=torch.float16, device="cuda")
            x[:B] = torch.randn(B, K, generator=gen).half().cuda()
            want = ref.silu_mul_ref(ref.gemv_ref(x[:B], w))
            for env in ("", late):
                monkeypatch.setenv("DEEPINFER_GEMV_BAL_LATE", env)
                name, grid, _, _ = kn.gemv_call(w, x, B, "silu", torch.empty(B, F2 // 2, device="cuda").half())
                assert name.endswith("_bal") and grid[0] == 2 * kn.sms, (name, grid)  # the balanced schedule
                y = torch.full((B, F2 // 2), float("nan"), dtype=torch.float16, device="cuda")
                kn.gemv(w, x, B, "silu", y)
                assert ref.rel_err(y, want) < TOL, (F2, K, B, env)


@pytest.mark.parametrize("pre", [0, 1])
def test_balanced_gate_up_with_loads_after_the_wait_matches_the_default_bitwise(pre):
    """A module built with -DGEMV_BAL_PRE=0 / 1 (decode_gemv.cu: the balanced gate_up's first units loaded after its PDL
    wait instead of before; engine/bench/device_balpre.sh's A/B knob): the 3B's and 7B's gate_up equal the default
    build's bit for bit (same loads, same sums) and gemv_ref within the tolerance."""
    import torch

    from kernels import decode_reference as ref
    from kernels.checks import TOL, rand_qweight
    from kernels.decode_kernels import DecodeKernels

    base, kn = DecodeKernels(0), DecodeKernels(0, defines=(f"-DGEMV_BAL_PRE={pre}",))
    gen = torch.Generator().manual_seed(11)
    for (F2, K) in ((2 * 11008, 2048), (2 * 18944, 3584)):
        w = rand_qweight(F2, K, 4, "cuda", gen)
        for B in (1, 5):
            x = torch.zeros(8, K, dtype=torch.float16, device="cuda")
            x[:B] = torch.randn(B, K, generator=gen).half().cuda()
            ys = []
            for k in (base, kn):
                y = torch.full((B, F2 // 2), float("nan"), dtype=torch.float16, device="cuda")
                k.gemv(w, x, B, "silu", y)
                ys.append(y)
            assert torch.equal(ys[0], ys[1]), (F2, K, B, pre)
            assert ref.rel_err(ys[1], ref.silu_mul_ref(ref.gemv_ref(x[:B], w))) < TOL, (F2, K, B, pre)
