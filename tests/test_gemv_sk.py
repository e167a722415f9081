"""The stream-K GEMV schedule's cut (decode_gemv.cu gemv_sk_body; kernels/decode_kernels.py sk_ranges / sk_warp), on
the CPU: every unit in exactly one warp's range, sk_warp the inverse of the ranges, and the partial slots of the
tiles cut between warps distinct (no two partials share ws). The kernels themselves are checked against gemv_ref on
the GPU (kernels/checks.py, tests/test_gpu_decode.py)."""
import pytest

from kernels.decode_kernels import sk_epilogues, sk_ranges, sk_warp

SHAPES = [(688, 16, 2112), (128, 86, 2112), (160, 16, 1280), (4748, 16, 2112), (1184, 28, 2112), (7, 16, 8),
          (13, 7, 40)]  # (tiles, groups, warps): 3B gate_up / down / qkv, lm_head, 7B gate_up, small ones


@pytest.mark.parametrize("tiles,G,W", SHAPES)
def test_cut_covers_every_unit_once_and_warp_of_inverts_it(tiles, G, W):
    U = tiles * G
    ranges = sk_ranges(U, W)
    assert ranges[0][0] == 0 and ranges[-1][1] == U
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    for w, (a, b) in enumerate(ranges):
        for u in range(a, b):
            assert sk_warp(u, U, W) == w


@pytest.mark.parametrize("tiles,G,W", SHAPES)
def test_partial_slots_are_distinct(tiles, G, W):
    U = tiles * G
    ranges = sk_ranges(U, W)
    used = set()
    for T in range(tiles):
        wf, wl = sk_warp(T * G, U, W), sk_warp(T * G + G - 1, U, W)
        assert wf <= wl
        if wf == wl:
            continue
        for w in range(wf, wl + 1):
            a, b = ranges[w]
            assert a < b and a < (T + 1) * G and b > T * G  # the warp holds units of T
            slot = 2 * w + (0 if T == a // G else 1)
            assert slot not in used
            used.add(slot)
            if T != a // G:  # a tile after the warp's first is its last one
                assert T == (b - 1) // G


def test_epilogue_knob():
    assert sk_epilogues("0") == frozenset() and sk_epilogues("") == frozenset()
    assert sk_epilogues("silu,logits") == {"silu", "logits"}
    assert sk_epilogues("all") == {"store", "resid", "silu", "logits"}
    assert sk_epilogues("silu,bogus") == {"silu"}
