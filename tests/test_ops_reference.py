"""kernels.ops_reference.linear: the CPU linear of the reference path (W @ x.T for few rows, one float32 row as two,
F.linear's bits where MKL gives them, close to F.linear elsewhere)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.ops_reference import FEW_ROWS, Linear, linear

MKL = torch.backends.mkl.is_available()  # x86 builds: the bits below are MKL's


@pytest.mark.parametrize("bias", [False, True])
def test_one_row_runs_as_a_two_row_batch(bias):
    """A float32 row (batch-1 decode) is computed as row 0 of a 2-row product (MKL's gemv used one thread): with MKL
    the bits of that row in a 2- or 3-row batch whatever the other rows hold (a verify of 1-2 drafts), and close to
    F.linear. bfloat16 keeps the one-row product."""
    torch.manual_seed(3)
    w, b = torch.randn(1152, 896), torch.randn(1152) if bias else None
    x = torch.randn(1, 896)
    y = linear(x, w, b)
    assert y.shape == (1, 1152) and y.is_contiguous()
    torch.testing.assert_close(y, F.linear(x, w, b), rtol=1e-4, atol=1e-3)
    assert linear(x[0], w, b).shape == (1152,)
    if MKL:
        for rows in (2, 3):
            assert torch.equal(linear(torch.cat([x, torch.randn(rows - 1, 896)]), w, b)[:1], y), rows
    wb, xb = w.bfloat16(), x.bfloat16()
    assert torch.equal(linear(xb, wb), F.linear(xb, wb))


@pytest.mark.parametrize("bias", [False, True])
def test_linear_has_f_linear_bits_from_twelve_rows(bias):
    """(With MKL: the two forms agree bit for bit there; elsewhere closely.)"""
    torch.manual_seed(0)
    w, b = torch.randn(1152, 896), torch.randn(1152) if bias else None
    for shape in [(12, 896), (1, 40, 896), (2, 20, 896), (FEW_ROWS - 1, 896), (1, FEW_ROWS + 3, 896)]:
        x = torch.randn(shape)
        y = linear(x, w, b)
        assert y.shape == (*shape[:-1], 1152) and y.is_contiguous()
        if MKL:
            assert torch.equal(y, F.linear(x, w, b)), shape
        else:  # another BLAS (arm64 builds) may sum the two forms in other orders
            torch.testing.assert_close(y, F.linear(x, w, b), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("bias", [False, True])
def test_linear_close_to_f_linear_at_two_to_eleven_rows(bias):
    torch.manual_seed(1)
    w, b = torch.randn(896, 4864), torch.randn(896) if bias else None
    for M in range(2, 12):
        x = torch.randn(M, 1, 4864)  # a decode batch: [B, 1, K]
        y = linear(x, w, b)
        assert y.shape == (M, 1, 896) and y.is_contiguous()
        exact = F.linear(x.double(), w.double(), None if b is None else b.double())
        # another summation order, an error of F.linear's size against float64 (both 0.7-2.6e-4 on sums ~70)
        assert (y - exact).abs().max() < 1e-3 and (F.linear(x, w, b) - exact).abs().max() < 1e-3


def test_linear_module_and_other_dtypes():
    torch.manual_seed(2)
    m = Linear(64, 32, bias=True, dtype=torch.bfloat16)
    m.weight.data.normal_()
    m.bias.data.normal_()
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    torch.testing.assert_close(m(x).float(), F.linear(x, m.weight, m.bias).float(), rtol=2e-2, atol=5e-2)
    assert linear(torch.zeros(0, 64), torch.randn(8, 64)).shape == (0, 8)
