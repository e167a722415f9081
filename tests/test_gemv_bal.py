"""The balanced GEMV schedule (decode_gemv.cu GEMV_BAL) on the CPU: its reference (decode_reference.bal_schedule,
the kernel's arithmetic) covers every (tile, group) once, a warp's run spans at most two tiles, and the slots each
tile's epilogue warp sums are exactly the runs that touched the tile, in warp order; bal_plan takes it only where a
plan is more than one wave. The kernel itself is checked against gemv_ref on a GPU (kernels/checks.py)."""
from pathlib import Path

from kernels import decode_kernels as dk
from kernels.decode_kernels import bal_plan
from kernels.decode_reference import bal_schedule


def test_bal_schedule_covers_every_unit_once():
    # 3B / 7B / 14B gate_up at 264 blocks, the 3B's with 8 and 1 tiles per block, a ragged small case
    for ntiles, nb, G in ((688, 264, 16), (1184, 264, 28), (864, 264, 40), (2112, 264, 16), (264, 264, 16),
                          (37, 5, 3), (9, 4, 1)):
        seen = set()
        for blk in bal_schedule(ntiles, nb, G):
            assert 1 <= blk["nt"] <= 8
            touched: dict[int, list[int]] = {}
            for w, segs in enumerate(blk["runs"]):
                assert len(segs) <= 2
                for t, g0, g1 in segs:
                    assert blk["t0"] <= t < blk["t0"] + blk["nt"] and 0 <= g0 < g1 <= G
                    for g in range(g0, g1):
                        assert (t, g) not in seen
                        seen.add((t, g))
                    touched.setdefault(t - blk["t0"], []).append(8 + w if segs.index((t, g0, g1)) else w)
            assert [touched[i] for i in range(blk["nt"])] == blk["slots"]
            for i in range(blk["nt"]):  # tile i's epilogue warp i had a run (its scales were loaded)
                assert blk["runs"][i]
        assert len(seen) == ntiles * G


def test_bal_plan_where_the_runs_are_clearly_shorter():
    # 3B gate_up (KSW 4, 16 groups): 344 blocks for 264 slots, 2 waves x 4 groups -> one wave of runs of 6
    assert bal_plan(688, 16, 4, 1, 344, 132) == (-1, 264)
    # 7B (28 groups): 3 waves x 7 against 18; 14B (40): 2 x 10 against 20: measured no faster / slower, kept
    assert bal_plan(1184, 28, 4, 1, 592, 132) == (-1, 264)  # 7B: 18 against 3 x 7
    assert bal_plan(864, 40, 4, 1, 432, 132) == (4, 432)
    # split across blocks, or one wave already: as planned
    assert bal_plan(688, 16, 4, 2, 344, 132) == (4, 344)
    assert bal_plan(160, 16, 8, 1, 160, 132) == (8, 160)
    assert bal_plan(4748, 16, 1, 1, 594, 132) == (1, 594)  # more than 8 tiles per block
    # DEEPINFER_GEMV_BAL=force (A/Bs): wherever the grid is more than a wave and a block takes <= 8 tiles
    assert bal_plan(1184, 28, 4, 1, 592, 132, float("inf")) == (-1, 264)
    assert bal_plan(4748, 16, 1, 1, 594, 132, float("inf")) == (1, 594)


def test_the_engine_module_holds_the_balanced_kernels_unless_compiled_out():
    src = "\n".join((Path(dk.__file__).parent / f).read_text() for f in dk.SOURCES)
    names = dk.module_names(src)
    assert names == dk._NAMES  # every kernel the engine launches, the _bal ones by token pasting
    assert {"gemv_w4_silu_bal", "gemv_w3_silu_bal", "gemv_w4g32_silu_bal"} <= set(names)
    off = dk.module_names(src, ("-DGEMV_BAL=0",))
    assert not any(n.endswith("_bal") for n in off) and len(off) == len(names) - 5
    assert "GEMV_SILU(gemv_w4_silu, 4, 128, SF_PLAIN)" in src and "NAME##_bal" in src
    both = dk.module_names(src, ("-DGEMV_PACKS=1",))
    assert set(dk._PACK_NAMES) <= set(both)
