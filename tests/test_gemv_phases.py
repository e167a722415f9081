"""engine/bench/gemv_phases.py: the GEMV trace's records read as kernels/decode_gemv.cu GEMV_TRACE writes them, grouped
into the step's launches and summarised per linear (CPU; the trace itself is a device run)."""
import numpy as np
import pytest

from engine.bench.gemv_phases import launch_bytes, launches, op_name, records, summary, variant_outs
from engine.config import QWEN25_SHAPES, ModelConfig


def _rec(t0, t1, t2, t3, N, K, epi, mt=1, done=1, bx=0, by=0, sm=0, te=0):
    # decode_gemv.cu GEMV_TRACE_END: t_start, t_wait, t_loop, t_end, N | K << 32, t_epi, EPI | MT << 4 | done << 8,
    # bx | by << 20 | smid << 40
    return [t0, t1, t2, t3, N | (K << 32), te, epi | (mt << 4) | (done << 8), bx | (by << 20) | (sm << 40)]


def _step(cfg, t=0):
    """Two layers of a step: qkv, the attention (64 splits at 16k rows) and its merge launch, o, gate_up, down (two
    blocks each), then the lm_head; times in ns."""
    q = cfg.q_size + 2 * cfg.kv_size
    rows = []
    for _ in range(2):
        for N, K, epi, mt in ((q, cfg.hidden_size, 0, 1), (16384, 64, 4, 0), (16384, 64, 5, 0),
                              (cfg.hidden_size, cfg.q_size, 1, 1),
                              (2 * cfg.intermediate_size, cfg.hidden_size, 2, 2),
                              (cfg.hidden_size, cfg.intermediate_size, 1, 2)):
            for b in range(2):  # block 1 became resident late: starts after the release
                t0 = t + (0 if b == 0 else 1500)
                rows.append(_rec(t0, t + 1000 + 600 * b, t + 3000 + 600 * b, t + 3500 + 600 * b, N, K, epi, mt,
                                 bx=b, sm=b))
            t += 5000
    rows.append(_rec(t, t + 1000, t + 9000, t + 9500, cfg.vocab_size, cfg.hidden_size, 3, 2))
    return np.array(rows, dtype=np.uint64)


def test_records_read_the_kernel_layout():
    r, = records(np.array([_rec(5, 6, 7, 8, 2560, 2048, 2, mt=2, done=0, bx=343, by=3, sm=131)], dtype=np.uint64))
    assert (r["t0"], r["t1"], r["t2"], r["t3"], r["N"], r["K"]) == (5, 6, 7, 8, 2560, 2048)
    assert (r["epi"], r["mt"], r["done"], r["bx"], r["by"], r["sm"]) == ("silu", 2, False, 343, 3, 131)


def test_launches_and_their_phases():
    cfg = ModelConfig(**QWEN25_SHAPES["3b"])
    raw = _step(cfg)
    rng = np.random.default_rng(0)
    las = launches(records(raw[rng.permutation(len(raw))]))  # any order in the buffer: the atomic slots
    assert [op_name(la, cfg) for la in las] == ["qkv", "attention", "merge", "o", "gate_up", "down"] * 2 + ["lm_head"]
    qkv = las[0]
    assert qkv["blocks"] == 2 and qkv["sms"] == 2
    assert qkv["pre"] == pytest.approx(1.0) and qkv["skew"] == pytest.approx(0.6)
    assert qkv["loop"] == pytest.approx(2.0) and qkv["tail"] == pytest.approx(0.5)
    assert qkv["span"] == pytest.approx(3.1) and qkv["gap"] is None
    assert las[1]["gap"] == pytest.approx(5.0 + 1.0 - 4.1)  # the attention released 1 us into its slot, qkv ended at 4.1
    assert (las[1]["N"], las[1]["K"], las[2]["epi"]) == (16384, 64, "attn_merge")
    s = summary(las, cfg)
    assert list(s) == ["qkv", "attention", "merge", "o", "gate_up", "down", "lm_head"]
    assert s["qkv"]["launches"] == 2 and s["qkv"]["gap"] == pytest.approx(1.9)  # layer 1's qkv after layer 0's down
    assert s["lm_head"]["loop"] == pytest.approx(8.0)


def test_bytes_per_launch_and_the_rate_over_its_span():
    cfg = ModelConfig(**QWEN25_SHAPES["3b"])
    las = launches(records(_step(cfg)))
    gate_up, attn, merge = las[4], las[1], las[2]
    # 3B gate_up W4: 22,016 x 2,048 codes at 4 bits + a (scale, min) fp16 pair per 128
    assert launch_bytes(gate_up, cfg, 4) == 22016 * 2048 // 2 + 22016 * 16 * 4
    assert launch_bytes(gate_up, cfg, 3) == 22016 * 2048 * 3 // 8 + 22016 * 16 * 4
    assert launch_bytes(gate_up, cfg, None) is None and launch_bytes(merge, cfg, 4) is None
    assert launch_bytes(las[-1], cfg, 3) == 151936 * 2048 // 2 + 151936 * 16 * 4  # the lm_head is 4-bit in W3 too
    assert launch_bytes(attn, cfg, 4) == 16384 * 2 * 128 * 2 * 2  # K and V rows, fp16, 2 KV heads
    s = summary(las, cfg, 4)
    assert s["gate_up"]["GBps"] == pytest.approx(launch_bytes(gate_up, cfg, 4) / (3.1 * 1e3), rel=1e-3)
    assert s["merge"]["GBps"] is None and summary(las, cfg)["gate_up"]["GBps"] is None


def test_blocks_resident_only_after_the_launch_before_ended_are_counted_late():
    # o (2 blocks, ends at 10 us), then gate_up: blocks 0 and 1 resident early (PDL), block 2 only at 12 us, its
    # wait returning 1.5 us later (the balanced gate_up's skew: which of the two it is, the trace now says)
    us = 1000
    raw = np.array([_rec(0, 1 * us, 8 * us, 9 * us, 2048, 2048, 1, bx=0),
                    _rec(0, 1 * us, 9 * us, 10 * us, 2048, 2048, 1, bx=1),
                    _rec(5 * us, 10 * us, 15 * us, 16 * us, 22016, 2048, 2, mt=2, bx=0),
                    _rec(6 * us, 10 * us, 15 * us, 16 * us, 22016, 2048, 2, mt=2, bx=1),
                    _rec(12 * us, 13500, 18 * us, 19 * us, 22016, 2048, 2, mt=2, bx=2)], dtype=np.uint64)
    o, gu = launches(records(raw))
    assert o["late_blocks"] == 0 and o["late_start"] is None  # the first launch: nothing before it
    assert gu["blocks"] == 3 and gu["start_skew"] == pytest.approx(7.0) and gu["skew"] == pytest.approx(3.5)
    assert gu["late_blocks"] == 1 and gu["late_bx_min"] == 2
    assert gu["late_start"] == pytest.approx(2.0) and gu["late_pre"] == pytest.approx(1.5)
    cfg = ModelConfig(**QWEN25_SHAPES["3b"])
    s = summary([o, gu], cfg, 4)
    assert s["gate_up"]["late_blocks"] == 1 and s["o"]["late_start"] is None


def test_spread_of_loop_and_block_ends_and_loops_by_blocks_per_sm():
    # down-like launch: blocks 0, 1 share SM 0 (loops 4 and 5 us), block 2 alone on SM 1 (loop 3 us); block 1 is the
    # split-K tile's last (tail 2 us), the others 0.5 us
    us = 1000
    cfg = ModelConfig(**QWEN25_SHAPES["3b"])
    raw = np.array([_rec(0, 1 * us, 5 * us, int(5.5 * us), 2048, 11008, 1, mt=2, bx=0, sm=0),
                    _rec(0, 1 * us, 6 * us, 8 * us, 2048, 11008, 1, mt=2, bx=1, sm=0),
                    _rec(0, 1 * us, 4 * us, int(4.5 * us), 2048, 11008, 1, mt=2, bx=2, sm=1)], dtype=np.uint64)
    la, = launches(records(raw))
    assert (la["loop_end_p10"], la["loop_end_p50"], la["loop_end_max"]) == (3.0, 4.0, 5.0)
    assert (la["end_p50"], la["end_max"], la["tail_max"]) == (4.5, 7.0, 2.0)
    assert la["loop_by_sm_load"] == {"1": 3.0, "2": 4.5}
    s = summary([la], cfg, 4)["down"]
    assert s["loop_by_sm_load"] == {"1": 3.0, "2": 4.5} and s["end_max"] == 7.0


def test_variants_are_traced_each_into_its_own_json_beside_out():
    assert variant_outs("/o/gemv_phases.json", "") == [("", {}, "/o/gemv_phases.json")]
    assert variant_outs("/o/gemv_phases.json", "base:,skipo:DEEPINFER_TIMING_SKIP=o+DEEPINFER_PDL=0") == [
        ("base", {}, "/o/gemv_phases_base.json"),
        ("skipo", {"DEEPINFER_TIMING_SKIP": "o", "DEEPINFER_PDL": "0"}, "/o/gemv_phases_skipo.json")]


def test_longest_tail_split_into_the_reduction_and_the_epilogue():
    # split-K: the last block of the tile starts its epilogue (te) after the reduction; the others record te = 0
    us = 1000
    raw = np.array([_rec(0, 1 * us, 3 * us, int(3.2 * us), 2048, 11008, 1, mt=2, done=0, by=1),
                    _rec(0, 1 * us, 4 * us, 7 * us, 2048, 11008, 1, mt=2, by=0, te=6 * us)], dtype=np.uint64)
    r = records(raw)[1]
    assert (r["N"], r["K"], r["te"]) == (2048, 11008, 6 * us)
    la, = launches(records(raw))
    assert la["tail_max"] == pytest.approx(3.0) and la["tail_max_reduce"] == pytest.approx(2.0)
    assert la["tail_max_epilogue"] == pytest.approx(1.0)
    la, = launches(records(raw[:1]))  # no block recorded an epilogue start (the attention's records): no split
    assert la["tail_max_reduce"] is None and la["tail_max_epilogue"] is None
