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


# --- the attention's idle blocks prefetch what follows it -----------------------------------------------------
# A batch-1 attention at a short context works in `rep` blocks per KV head (decode_attn.cu's short-context mode)
# out of a grid of one block per SM: the other blocks exit at once and DRAM idles for the attention's ~3-4 us. With
# a descriptor those idle blocks first issue `prefetch.global.L2` for the weights the layer reads next: o_proj
# whole, then the gate_up rows in the order the silu GEMV's blocks take them (block j: gate rows and up rows of
# tiles 2j, 2j + 1, so gate row r and up row ffn + r together), up to `nbytes` in all. Results do not change.
# DEEPINFER_ATTN_PREFETCH = MB after the attention ("0" = off).


def attn_config_from_env(value: str | None = None) -> int:
    """DEEPINFER_ATTN_PREFETCH: MB of weights the attention's idle blocks prefetch (0 / unset / "off": none)."""
    v = (os.environ.get("DEEPINFER_ATTN_PREFETCH", "0") if value is None else value).strip().lower()
    if v in ("0", "off", "", "none"):
        return 0
    return int(float(v) * (1 << 20))


def _rows_of(t: torch.Tensor | None, lo: int, hi: int) -> list[tuple[int, int]]:
    """(ptr, bytes) of rows lo..hi of a row-major 2-D tensor (nothing if the tensor is absent or the range empty)."""
    if t is None or not t.numel() or hi <= lo:
        return []
    row = t.stride(0) * t.element_size()
    return [(t.data_ptr() + lo * row, (hi - lo) * row)]


def attn_ranges(o, gate_up, nbytes: int) -> list[tuple[int, int]]:
    """The (ptr, bytes) ranges one layer's attention prefetches: o's segments, then gate_up's gate and up rows
    r0..r1 pairwise (codes, scales, mins of both halves) in chunks, until nbytes are covered (<= MAX_RANGES)."""
    out, left = [], nbytes
    for ptr, n in segments([o]):
        take = min(n, left)
        if take > 0:
            out.append((ptr, take))
            left -= take
    if left <= 0 or gate_up is None or gate_up.kind == "dense":
        return out[:MAX_RANGES]
    ffn = gate_up.N // 2
    per_row = 2 * sum(t.stride(0) * t.element_size() for t in (gate_up.qweight, gate_up.scales, gate_up.mins)
                      if t is not None and t.numel())  # one gate row and its up row
    rows = min(ffn, max(0, left // per_row))
    rows -= rows % 16  # whole 16-row tiles
    for t in (gate_up.qweight, gate_up.scales, gate_up.mins):
        out += _rows_of(t, 0, rows) + _rows_of(t, ffn, ffn + rows)
    return out[:MAX_RANGES]


class AttnPrefetchPlan:
    """Per layer the attention's descriptor ([n, ptr_0, bytes_0, ...] int64 rows, decode_common.cu l2_prefetch):
    desc(i) -> the device address of layer i's row, or None when off."""

    def __init__(self, layers: list, l2_bytes: int, nbytes: int, device):
        self.rows: list[int] = []
        self.table = None
        if nbytes <= 0 or l2_bytes < MIN_L2 or not layers:
            return
        nbytes = min(nbytes, l2_bytes // 2)  # never more than half the L2 ahead of the reader
        table = torch.zeros(len(layers), 1 + 2 * MAX_RANGES, dtype=torch.int64)
        for i, L in enumerate(layers):
            ranges = attn_ranges(L.o, L.gate_up, nbytes)
            table[i, 0] = len(ranges)
            for r, (ptr, n) in enumerate(ranges):
                table[i, 1 + 2 * r], table[i, 2 + 2 * r] = ptr, n
        self.table = table.to(device)
        stride = self.table.stride(0) * 8
        self.rows = [self.table.data_ptr() + i * stride for i in range(len(layers))]

    def desc(self, i: int) -> int | None:
        return self.rows[i] if self.rows else None
