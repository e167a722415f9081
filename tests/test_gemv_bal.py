"""The balanced GEMV schedule (decode_gemv.cu GEMV_BAL) on the CPU: its reference (decode_reference.bal_schedule,
the kernel's arithmetic) covers every (tile, group) once, a warp's run spans at most two tiles, and the slots each
tile's epilogue warp sums are exactly the runs that touched the tile, in warp order; bal_plan takes it only where a
plan is more than one wave. The kernel itself is checked against gemv_ref on a GPU (kernels/checks.py)."""
from pathlib import Path

import pytest

from kernels import decode_kernels as dk
from kernels.decode_kernels import bal_plan
from kernels.decode_reference import bal_first, bal_schedule


def test_bal_schedule_covers_every_unit_once():
    # 3B / 7B / 14B gate_up at 264 blocks, the 3B's with 8 and 1 tiles per block, a ragged small case; and the 3B's and
    # 7B's with the blocks from 136 on taking 5/8 or 1/4 of a share (BAL_LATE)
    for ntiles, nb, G, late in ((688, 264, 16, None), (1184, 264, 28, None), (864, 264, 40, None),
                                (2112, 264, 16, None), (264, 264, 16, None), (37, 5, 3, None), (9, 4, 1, None),
                                (688, 264, 16, (136, 160)), (688, 264, 16, (136, 64)), (1184, 264, 28, (40, 128))):
        seen = set()
        for blk in bal_schedule(ntiles, nb, G, late=late):
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
    # the q8 GEMVs (EngineConfig.decode_q8): their own module on first use (load_q8), in this one with GEMV_Q8=1
    assert not set(dk.Q8_NAMES) & set(names) and set(dk.Q8_NAMES) <= set(dk.module_names(src, ("-DGEMV_Q8=1",)))


def test_bal_late_weights_the_blocks_and_defaults_to_equal_shares(monkeypatch):
    # the kernel's bal_first: c = 0 (KSW = -1) is the old floor(b * ntiles / nb); f = 256 weighs every block alike
    for b in range(265):
        assert bal_first(b, 688, 264) == b * 688 // 264 == bal_first(b, 688, 264, (136, 256))
    sched = bal_schedule(688, 264, 16, late=(136, 160))
    early, late = [blk["nt"] for blk in sched[:136]], [blk["nt"] for blk in sched[136:]]
    assert min(early) >= 3 and max(late) <= 2 and sum(early) + sum(late) == 688  # the late blocks get less
    monkeypatch.delenv("DEEPINFER_GEMV_BAL_LATE", raising=False)
    assert dk.bal_late_code(688, 264) == 0
    monkeypatch.setenv("DEEPINFER_GEMV_BAL_LATE", "136:160")
    assert dk.bal_late_code(688, 264) == (136 << 9) | 160
    # kernels compiled without -DGEMV_BAL_LATE=1 would ignore it: refused, not silently equal shares
    with pytest.raises(ValueError, match="-DGEMV_BAL_LATE=1"):
        dk.bal_late_code(688, 264, compiled_in=False)
    for bad in ("0:160", "264:160", "136:32", "136:300", "4:64"):  # E out of range, f out of range, > 8 tiles
        monkeypatch.setenv("DEEPINFER_GEMV_BAL_LATE", bad)
        with pytest.raises(ValueError, match="DEEPINFER_GEMV_BAL_LATE"):
            dk.bal_late_code(688, 264)


def test_bal_blocks_knob_sets_the_balanced_grid_within_one_wave(monkeypatch):
    # DEEPINFER_GEMV_BAL_BLOCKS (A/B): the 3B's gate_up in the 200 slots that o_proj's 64 blocks leave free
    monkeypatch.setenv("DEEPINFER_GEMV_BAL_BLOCKS", "200")
    assert bal_plan(688, 16, 4, 1, 344, 132) == (-1, 200)
    assert bal_plan(864, 40, 4, 1, 432, 132) == (4, 432)  # where the balanced schedule is not taken: as planned
    first = [bal_first(b, 688, 200) for b in range(201)]
    assert first[0] == 0 and first[-1] == 688 and max(b - a for a, b in zip(first, first[1:])) <= 8
    units = sorted((t, g) for blk in bal_schedule(688, 200, 16) for run in blk["runs"] for t, g0, g1 in run
                   for g in range(g0, g1))
    assert units == [(t, g) for t in range(688) for g in range(16)]  # every (tile, group) once
    assert all(len(run) <= 2 for blk in bal_schedule(688, 200, 16) for run in blk["runs"])  # red[] holds two
    for bad in ("85", "265"):  # fewer than ceil(688 / 8) blocks, or more than a wave
        monkeypatch.setenv("DEEPINFER_GEMV_BAL_BLOCKS", bad)
        with pytest.raises(ValueError, match="DEEPINFER_GEMV_BAL_BLOCKS"):
            bal_plan(688, 16, 4, 1, 344, 132)
