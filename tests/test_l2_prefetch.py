"""The decode step's L2 prefetch plan (engine/model/l2_prefetch.py): the windows on sizes alone (CPU), the
descriptor table's addresses, and on a GPU the step's bits with and without prefetching."""
import pytest
import torch

from engine.model.l2_prefetch import MAX_RANGES, PrefetchConfig, PrefetchPlan, config_from_env, windows

SIZES = [[100, 10, 10], [50, 5, 5], [400, 20, 20], [200, 10, 10], [300, 15, 15]]  # codes, scales, mins per linear


def _stream(sizes):
    """Start offset of every flattened segment and the stream's total bytes."""
    starts, pos = [], 0
    for segs in sizes:
        for n in segs:
            starts.append(pos)
            pos += n
    return starts, pos


def _covered(sizes, ranges, after=0):
    """The ranges as (start, end) positions of the cyclic stream unrolled: they come in stream order, so a start
    below the previous end (or below `after`) has wrapped into the next step."""
    starts, total = _stream(sizes)
    out, wrap = [], 0
    for i, off, n in ranges:
        a = starts[i] + off + wrap
        while a < (out[-1][1] if out else after):
            wrap += total
            a += total
        out.append((a, a + n))
    return out


def test_each_launch_prefetches_the_next_linear_whole_when_the_cap_allows():
    plan = windows(SIZES, lead=0, cap=10 ** 9)
    starts, total = _stream(SIZES)
    ends = [sum(map(sum, SIZES[:k + 1])) for k in range(len(SIZES))]
    for k, ranges in enumerate(plan):
        got = _covered(SIZES, ranges)
        nxt = (k + 1) % len(SIZES)
        lo = ends[nxt] - sum(SIZES[nxt])
        # the next linear's codes, scales and mins, in order and contiguous
        assert got[0][0] == lo and got[-1][1] == ends[nxt], (k, got)
        assert all(a[1] == b[0] for a, b in zip(got, got[1:]))
        assert [r[2] for r in ranges] == SIZES[nxt]


def test_cap_bounds_what_a_launch_keeps_ahead_and_windows_do_not_overlap():
    cap, lead = 130, 60
    plan = windows(SIZES, lead=lead, cap=cap)
    starts, total = _stream(SIZES)
    ends = [sum(map(sum, SIZES[:k + 1])) for k in range(len(SIZES))]
    prev_hi = None
    for k, ranges in enumerate(plan):
        got = _covered(SIZES, ranges, after=ends[k])
        assert all(a[1] == b[0] for a, b in zip(got, got[1:]))  # one contiguous window
        lo, hi = got[0][0], got[-1][1]
        assert lo >= ends[k]  # never what this launch reads itself
        assert hi - ends[k] <= cap  # what it keeps ahead of the reader
        if prev_hi is not None:
            assert lo >= prev_hi  # launch k starts where launch k - 1 stopped (or later): no line twice
        prev_hi = hi
        assert len(ranges) <= MAX_RANGES


def test_config_from_env():
    assert config_from_env("0") is None and config_from_env("off") is None
    c = config_from_env("8:0.25")
    assert c == PrefetchConfig(lead=8 << 20, cap_frac=0.25)
    assert config_from_env("0.5") == PrefetchConfig(lead=1 << 19, cap_frac=0.5)


def test_descriptor_rows_hold_the_segments_addresses():
    from kernels.qweight import QWeight

    def lin(N, K):
        return QWeight(N, K, 4, qweight=torch.zeros(N, K // 8, dtype=torch.int32),
                       scales=torch.zeros(N, K // 128, dtype=torch.float16),
                       mins=torch.zeros(N, K // 128, dtype=torch.float16))

    ws = [lin(256, 256), lin(512, 256), lin(128, 512)]
    plan = PrefetchPlan(ws, l2_bytes=64 << 20, cfg=PrefetchConfig(0, 0.5), device="cpu")
    t = plan.table
    for k, w in enumerate(ws):
        nxt = ws[(k + 1) % len(ws)]
        row = t[k]
        assert plan.desc(w) == t.data_ptr() + k * t.stride(0) * 8
        assert int(row[0]) == 3
        want = [(x.data_ptr(), x.numel() * x.element_size()) for x in (nxt.qweight, nxt.scales, nxt.mins)]
        assert [(int(row[1 + 2 * r]), int(row[2 + 2 * r])) for r in range(3)] == want
    # a small L2 (an RTX 3050's 2 MB) or the knob off: no descriptors
    assert PrefetchPlan(ws, l2_bytes=2 << 20, cfg=PrefetchConfig(), device="cpu").desc(ws[0]) is None
    assert PrefetchPlan(ws, l2_bytes=64 << 20, cfg=None, device="cpu").desc(ws[0]) is None


@pytest.mark.gpu
def test_prefetch_leaves_the_step_bits_unchanged(monkeypatch):
    """A 4-layer 3B-shaped random W4 model: greedy ids and logits of 12 steps at batch 1 and 3, with the L2 prefetch
    (lead 8 MB) and without, bit for bit."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    from engine.bench.decode_bench import scheme_weights
    from engine.config import QWEN25_SHAPES, ModelConfig
    from engine.model.gpu_model import GPUModel

    cfg = ModelConfig(**{**QWEN25_SHAPES["3b"], "num_layers": 4})
    w = scheme_weights(cfg, 4, torch.device("cuda"))
    outs = []
    for knob in ("8:0.5", "0"):
        monkeypatch.setenv("DEEPINFER_L2_PREFETCH", knob)
        m = GPUModel(w, 4, 256, "cuda")
        assert (m.prefetch.table is not None) == (knob != "0") or \
            torch.cuda.get_device_properties(0).L2_cache_size < (16 << 20)
        got = []
        for B in (1, 3):
            toks = [11 + b for b in range(B)]
            for step in range(12):
                ids, logits = m.decode(toks, [step] * B, list(range(B)))
                got.append(logits.clone())
                toks = ids
        outs.append(torch.stack([g[:1] for g in got]))
        del m
    assert torch.equal(outs[0], outs[1])
