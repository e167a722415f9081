"""L2 prefetch of the decode step's next weights (#16: "the next weights prefetched while ... a reduction waits").

Every decode GEMV is latency-bound (docs/gpu.md "Where the time goes": gate_up streams at ~1.9 TB/s of the
H200's 4.2, qkv and o at 0.7-0.9), so DRAM is idle for half of each step. A GEMV launch may carry a prefetch
descriptor: its blocks issue `prefetch.global.L2` for a window of the weights the step reads next (before their
PDL wait; nothing the step writes), and the next GEMVs' loads then find those lines in L2 (a shorter round trip
for the same loads in flight). The step's weights are one stream in launch order (per layer qkv, o, gate_up,
down; then the lm_head; then layer 0 again, for the next step), each linear's codes, scales and mins in turn.
Launch k prefetches [where launch k - 1 stopped, the end of linear k + 1 + lead), never more than `cap` bytes past
the end of its own linear (what it may keep in L2 ahead of the reader). Results do not change: only where the
loads hit. Off on cards whose L2 cannot hold a linear's window (an RTX 3050 has 2 MB of L2).

Descriptor of a launch (int64 row): [n, ptr_0, bytes_0, ..., ptr_{n-1}, bytes_{n-1}] (decode_common.cu
l2_prefetch). Config: DEEPINFER_L2_PREFETCH = "lead_mb:cap_frac" (cap = cap_frac x the L2 size), "0" = off;
read when a GPUModel is built.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

MAX_RANGES = 12  # ranges per descriptor (a window may span the codes, scales and mins of several linears)
MIN_L2 = 16 << 20  # bytes of L2 below which prefetching is off


@dataclass(frozen=True)
class PrefetchConfig:
    lead: int = 0  # bytes prefetched past the end of the next linear
    cap_frac: float = 0.5  # bytes kept ahead of the reader, as a fraction of the L2


def config_from_env(value: str | None = None) -> PrefetchConfig | None:
    """DEEPINFER_L2_PREFETCH: unset -> the default; "0" / "off" -> None (off); "lead_mb[:cap_frac]"."""
    v = os.environ.get("DEEPINFER_L2_PREFETCH", "0") if value is None else value
    v = v.strip().lower()
    if v in ("0", "off", "", "none"):
        return None
    lead, _, cap = v.partition(":")
    return PrefetchConfig(int(float(lead) * (1 << 20)), float(cap) if cap else 0.5)


def segments(weights) -> list[tuple[int, int]]:
    """(ptr, bytes) of each packed linear's codes, scales and mins in order (dense ones: their fp16 weight)."""
    out = []
    for w in weights:
        for t in (w.qweight, w.scales, w.mins, w.weight):
            if t is not None and t.numel():
                out.append((t.data_ptr(), t.numel() * t.element_size()))
    return out


def windows(sizes: list[list[int]], lead: int, cap: int) -> list[list[tuple[int, int, int]]]:
    """The plan on sizes alone: sizes[k] = the byte sizes of linear k's segments (launch order; the stream is
    cyclic: after the last linear comes the next step's first). -> per launch k its ranges as (segment index in
    the flattened list, offset in that segment, bytes)."""
    flat = [(k, s, n) for k, segs in enumerate(sizes) for s, n in enumerate(segs)]
    starts, pos = [], 0
    for _, _, n in flat:
        starts.append(pos)
        pos += n
    total = pos
    ends = {}
    for (k, _, n), st in zip(flat, starts):
        ends[k] = st + n
    out, done = [], None
    K = len(sizes)
    for k in range(K):
        # stream positions grow across the cycle: linear k + 1 of the next step sits at + total
        nxt = k + 1
        own_end = ends[k]
        want = (ends[nxt] if nxt < K else total + ends[0]) + lead
        target = min(want, own_end + cap)
        lo = own_end if done is None else max(done, own_end)
        ranges = []
        if target > lo:
            for i, ((_, _, n), st) in enumerate(zip(flat + flat, starts + [s + total for s in starts])):
                a, b = max(lo, st), min(target, st + n)
                if a < b:
                    ranges.append((i % len(flat), a - st, b - a))
            done = target
        out.append(ranges[:MAX_RANGES])
    return out


class PrefetchPlan:
    """Descriptors for one model's decode step: desc(w) -> the device pointer of linear w's row (or None)."""

    def __init__(self, weights: list, l2_bytes: int, cfg: PrefetchConfig, device):
        self.rows: dict[int, int] = {}
        if cfg is None or l2_bytes < MIN_L2 or not weights:
            self.table = None
            return
        segs = [segments([w]) for w in weights]
        flat = [s for ss in segs for s in ss]
        plan = windows([[n for _, n in ss] for ss in segs], cfg.lead, int(cfg.cap_frac * l2_bytes))
        table = torch.zeros(len(weights), 1 + 2 * MAX_RANGES, dtype=torch.int64)
        for k, ranges in enumerate(plan):
            table[k, 0] = len(ranges)
            for r, (i, off, n) in enumerate(ranges):
                table[k, 1 + 2 * r] = flat[i][0] + off
                table[k, 2 + 2 * r] = n
        self.table = table.to(device)
        stride = self.table.stride(0) * 8
        for k, w in enumerate(weights):
            self.rows.setdefault(id(w), self.table.data_ptr() + k * stride)

    def desc(self, w) -> int | None:
        return self.rows.get(id(w))


def step_weights(w) -> list:
    """The decode step's linears in launch order (engine/model/forward.py): per layer qkv, o, gate_up, down; lm_head."""
    out = [x for L in w.layers for x in (L.qkv, L.o, L.gate_up, L.down)]
    return out + [w.lm_head]
