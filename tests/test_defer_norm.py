"""The deferred rmsnorm's references (kernels/decode_reference.py defer_*; the kernels are checked against them on
the GPU by kernels/checks.py defer_checks): a linear on the deferred x, scaled by rstd / sc, equals the same linear
on a separate rmsnorm; the fixed-point sums give the same bits in any order; x stays finite where h is huge."""
import torch

from kernels import decode_reference as ref
from kernels.checks import rand_qweight

EPS = 1e-6


def _point(h: torch.Tensor, w: torch.Tensor, prev_scale: float, B: int):
    """A resid producer's x and ss for h (the previous point's sums from h * prev_scale)."""
    N = h.shape[-1]
    ss = torch.zeros(2, 8, dtype=torch.int64)
    ss[0, :B] = ref.to_fix(((h[:B] * prev_scale) ** 2).sum(-1))
    x = torch.full((8, N), float("nan"), dtype=torch.float16)
    ref.defer_resid_ref(h, B, (w, EPS, x), ss)
    return x, ss


def test_deferred_x_through_a_linear_equals_the_separate_norm():
    gen = torch.Generator().manual_seed(3)
    for N, scale, prev in [(896, 3.0, 1.0), (2048, 0.05, 1.0), (3584, 40.0, 0.01)]:
        h = torch.randn(8, N, generator=gen) * scale
        w = torch.rand(N, generator=gen) + 0.5
        x, ss = _point(h, w, prev, 5)
        W = rand_qweight(256, N, 4, torch.device("cpu"), gen, bias=True)
        y = torch.empty(8, 256, dtype=torch.float16)
        ref.gemv_epilogue(ref.gemv_ref(x[:5], W, bias=False), W, 5, "store", y, None, None, ss, EPS)
        sep = ref.gemv_ref(ref.rmsnorm_ref(h[:5], w, EPS), W)
        assert ref.rel_err(y[:5], sep) < 3e-3
        assert bool(x[5:].isnan().all())  # rows >= B untouched


def test_fixed_point_sums_do_not_depend_on_order():
    gen = torch.Generator().manual_seed(4)
    tiles = torch.rand(128, generator=gen) * 1e3  # per-tile float sums of squares
    fix = ref.to_fix(tiles)
    a = int(fix.sum())
    b = int(fix[torch.randperm(128, generator=gen)].sum())
    assert a == b and abs(a / ref.SS_ONE - float(tiles.double().sum())) / float(tiles.sum()) < 1e-6


def test_x_stays_finite_where_h_grows_a_hundredfold():
    """A layer that multiplies h's scale (massive activations): x = h * w * (the previous rstd / 16) stays in fp16."""
    h = torch.randn(8, 1024)
    h[:, 7] = 3.0e4  # one channel far above fp16's 65,504 / (rstd of a unit-scale h)
    w = torch.full((1024,), 2.0)
    x, ss = _point(h, w, 1 / 200.0, 8)  # the previous point's h was 200x smaller
    assert bool(torch.isfinite(x.float()).all())
    r = ref.defer_scale_ref(ss, 8, 1024, EPS)
    assert ref.rel_err(x.float() * r[:, None], ref.rmsnorm_ref(h, w, EPS).float()) < 2e-3
