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
