"""GGUF blocks -> our packed layouts, exactly up to fp16 rounding of the scale products
(engine/formats/gguf_kquant.py), against gguf.quants.dequantize (the gguf package's own float32 dequant).

Bound (the module docstring): |ours - gguf| <= q*e(s) + e(m) + float32 slack, e(x) = 2^-11|x| + 2^-25;
0 for the 32-blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1)."""
import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize

from engine.errors import ModelFileError
from engine.formats.gguf_file import GGUFFile
from engine.formats.gguf_kquant import BLOCK_BYTES, decode, dequantize_exact, exactness_bound, fused_qweight, repack
from engine.formats.gguf_layout import REPACK, common_layout
from engine.quant.random_gguf import random_blocks
from kernels import pack
from kernels.decode_reference import dense_weight

EXACT_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")


def _gguf(raw: np.ndarray, ty: str) -> np.ndarray:
    return np.asarray(dequantize(raw, GGMLQuantizationType[ty]), dtype=np.float32)


def _ours(raw: np.ndarray, ty: str, layout=None) -> np.ndarray:
    bits, group = layout or REPACK[ty]
    qw, s, m = repack(raw, ty, bits, group)
    K = s.shape[1] * group
    return pack.dequantize(pack.unpack(qw, K, bits), s, m).numpy()


def _check(raw: np.ndarray, ty: str):
    ref = _gguf(raw, ty)
    ours = _ours(raw, ty)
    q, a, c = decode(raw, ty)
    group = REPACK[ty][1]
    exact = (q.reshape(q.shape[0], -1, group) * a[..., None].astype(np.float64) + c[..., None]).reshape(q.shape)
    assert np.abs(exact - ref).max() <= 2.0 ** -22 * np.abs(ref).max()  # decode = gguf's own math
    diff = np.abs(ours.astype(np.float64) - ref)
    if ty in EXACT_TYPES:
        assert diff.max() == 0, ty
    assert (diff <= exactness_bound(q, a, c, group)).all(), (ty, diff.max())
    return diff.max()


@pytest.mark.parametrize("ty", list(REPACK))
def test_synthetic_blocks_of_every_type(ty):
    rng = np.random.default_rng(7)
    per_row = 256 // (256 if ty.endswith("_K") else 32)
    raw = random_blocks(ty, 24 * per_row, rng).reshape(24, -1)
    # super-block factors over the whole fp16 range that cannot overflow: subnormal to large
    d = np.exp2(rng.uniform(-24, 3, raw.shape[0] * per_row)).astype(np.float16).view(np.uint8).reshape(-1, 2)
    blocks = raw.reshape(-1, BLOCK_BYTES[ty])
    off = 208 if ty == "Q6_K" else 0
    blocks[:, off:off + 2] = d
    _check(blocks.reshape(24, -1), ty)


def test_real_blocks_of_the_real_model(model_path):
    """Every repackable type in the real 0.5B Q4_K_M file (Q4_K, Q6_K, Q5_0, Q8_0), on real rows."""
    gf = GGUFFile(model_path)
    seen = {}
    for name, t in gf.tensors.items():
        if t.type_name in REPACK and t.type_name not in seen:
            seen[t.type_name] = _check(np.asarray(t.raw()[:256]), t.type_name)
    assert set(seen) == {"Q4_K", "Q6_K", "Q5_0", "Q8_0"}
    assert seen["Q5_0"] == seen["Q8_0"] == 0  # exact
    assert 0 < seen["Q4_K"] < 1e-3 and 0 < seen["Q6_K"] < 1e-3  # fp16 rounding of d*sc only


@pytest.mark.parametrize("ty", list(REPACK))
def test_fast_dequantize_equals_gguf_quants(ty):
    """GGUFTensor.dequantize's path (dequantize_exact: codes * scales + mins in float32) gives gguf.quants' values
    on blocks of every type, factors from subnormal to large."""
    rng = np.random.default_rng(11)
    per_row = 256 // (256 if ty.endswith("_K") else 32) * 2
    raw = random_blocks(ty, 16 * per_row, rng).reshape(16, -1)
    K = per_row * (256 if ty.endswith("_K") else 32)
    assert np.array_equal(dequantize_exact(raw, ty, K), _gguf(raw, ty))


def test_real_tensors_dequantize_like_gguf_quants(model_path):
    """The real 0.5B's tensors of each type, whole (the embedding included), as the CPU runner loads them."""
    gf = GGUFFile(model_path)
    done = set()
    for name, t in gf.tensors.items():
        if t.type_name not in done and (t.type_name in REPACK or t.type_name == "F32"):
            done.add(t.type_name)
            got = t.dequantize()
            assert got.flags.writeable and got.flags.c_contiguous and got.dtype == np.float32
            assert np.array_equal(got, _gguf(np.asarray(t.raw()), t.type_name)), name
    assert done == {"Q4_K", "Q6_K", "Q5_0", "Q8_0", "F32"}


class _T:  # the two things fused_qweight reads of a GGUFTensor
    def __init__(self, raw, ty):
        self._raw, self.type_name = raw, ty
        self.shape = (raw.shape[1] // BLOCK_BYTES[ty] * (256 if ty.endswith("_K") else 32), raw.shape[0])

    def raw(self):
        return self._raw


def test_fused_parts_promote_to_the_common_layout_exactly():
    """q/k Q4_K (4,32) + v Q6_K (8,16) -> qkv (8,16): each part's rows dequantize exactly as on their own."""
    rng = np.random.default_rng(1)
    parts = [_T(random_blocks(ty, 6 * 2, rng).reshape(6, -1), ty) for ty in ("Q4_K", "Q4_K", "Q6_K")]
    assert common_layout([REPACK[p.type_name] for p in parts]) == (8, 16)
    w = fused_qweight(parts, bias=torch.zeros(18), mode="bytes")
    assert (w.bits, w.group, w.N, w.K) == (8, 16, 18, 512)
    got = dense_weight(w).numpy()
    want = np.concatenate([_ours(p.raw(), p.type_name) for p in parts])
    assert np.array_equal(got, want)
    same = fused_qweight(parts[:2], mode="bytes")
    assert (same.bits, same.group) == (4, 32)
    assert common_layout([(4, 32), None]) is None
    with pytest.raises(ValueError):
        repack(parts[2].raw(), "Q6_K", 8, 32)  # group 16 cannot be coarsened


def test_scale_overflow_is_refused():
    b = random_blocks("Q6_K", 1, np.random.default_rng(0))
    b[:, 208:210] = np.array([60000.0], np.float16).view(np.uint8)
    with pytest.raises(ModelFileError, match="overflows fp16"):
        repack(b, "Q6_K")
