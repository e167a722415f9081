"""The decode kernels' divisions without the IEEE slow path give a / b's bits (pytest -m gpu; skipped without CUDA):
kernels/div_check.py's quick run: silu and 1 / d on every finite fp32 input, the norm's x / D on every reachable x for the
Qwen2.5 hidden sizes, the attention's fp16(o / den) on every finite o for four sums, 2^30 random scale ratios."""
import pytest

pytestmark = pytest.mark.gpu


def test_fast_divisions_give_the_ieee_bits():
    from kernels.div_check import run

    res = run(quick=True, log=lambda *a: None)
    assert res["ok"], res["checks"]
    assert res["checks"]["silu"]["inputs"] == 2 ** 32 - 2 ** 24  # every finite pattern
