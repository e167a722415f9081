"""PyTorch references of the decode kernels (kernels/decode_*.cu): what each kernel is checked against.

They compute in float32 on any device from the same inputs the kernels take (packed weights per
kernels/pack.py, fp16 activations, fp32 residual stream, static KV cache [slots, Hkv, ctx, hd]).
rmsnorm and attention are kernels/ops_reference.py's (one definition); `epilogue` is the GEMV epilogues in
torch, shared by RefKernels and dense_gemv (the fp16-weight decode linear, capturable).
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import torch
import torch.nn.functional as F

from kernels.q8_plan import q8_ok
from kernels.q8_reference import gemv_q8_w4_ref
from kernels.qweight import QWeight
from kernels.sample_reference import sample_rows_ref
from kernels.ops_reference import RefOps, Rotary, gqa_attention, rms_norm
from kernels import pack


def dense_weight(w: QWeight, rows: torch.Tensor | None = None) -> torch.Tensor:
    """float32 [N, K] of a packed (or fp16) linear, any pack.LAYOUTS (bits, group): w = q * s[k // group] + m.
    rows: only these rows (long [R]) -> [R, K]."""
    if w.bits == 16:
        return (w.weight if rows is None else w.weight[rows.to(w.weight.device)]).float()
    pack.check_layout(w.bits, w.group, w.K)
    if w.kq:
        pack.check_kq(w.bits, w.group, w.K)
    if w.sym:
        pack.check_sym(w.bits, w.group, w.K)
    if w.scales.shape[1] * w.group != w.K:
        raise ValueError(f"QWeight group {w.group} does not match scales {tuple(w.scales.shape)} for K={w.K}")
    qw, dev = w.qweight.cpu(), w.qweight.device
    if rows is None:
        sc, mn = w.fp16_scales()
        return pack.dequantize(pack.unpack(qw, w.K, w.bits), sc.cpu(), mn.cpu()).to(dev)
    r = rows.cpu()
    sc, mn = w.fp16_scales(r.to(w.scales.device))  # KQ / SYM: only these rows' scales made
    return pack.dequantize(pack.unpack_rows(qw, r, w.K, w.bits), sc.cpu(), mn.cpu()).to(dev)


DENSE_MEMO_BYTES = 512 << 20  # the memo's bound (float32 bytes); the least recently used weight goes first
_dense_memo: OrderedDict = OrderedDict()  # key -> (w, float32 [N, K])
_dense_memo_lock = threading.Lock()


def dense_weight_memo(w: QWeight) -> torch.Tensor:
    """dense_weight(w) of a packed linear on the CPU, memoized: the reference step runs every linear each step, and
    unpacking a 151,936-row lm_head on every call was most of a reference step's time (2 s of a random 2-layer model's
    step, tests/test_spec_diff.py). Keyed by the object and its packed tensors' storage and version counters, so a
    weight changed in place is unpacked again; bounded by DENSE_MEMO_BYTES. The result is shared: never write to it."""
    if w.bits == 16 or w.qweight.device.type != "cpu":
        return dense_weight(w)
    # id(w) is unique while the entry lives: the entry holds w itself, so w cannot be freed and its id reused
    key = (id(w),) + tuple(None if t is None else (t.data_ptr(), t._version) for t in (w.qweight, w.scales, w.mins))
    with _dense_memo_lock:
        hit = _dense_memo.get(key)
        if hit is not None:
            _dense_memo.move_to_end(key)
            return hit[1]
    d = dense_weight(w)
    size = d.numel() * d.element_size()
    with _dense_memo_lock:
        if size <= DENSE_MEMO_BYTES:
            _dense_memo[key] = (w, d)
            total = sum(v.numel() * v.element_size() for _, v in _dense_memo.values())
            while total > DENSE_MEMO_BYTES:
                _, (_, old) = _dense_memo.popitem(last=False)
                total -= old.numel() * old.element_size()
    return d


def gemv_ref(x: torch.Tensor, w: QWeight, bias: bool = True, rows_alone: bool = True) -> torch.Tensor:
    """x [B, K] -> float32 [B, N] = x @ W.T (+ b), each row a product of its own (rows_alone; the prefill's
    reference, engine/model/gpu_model.py _linear_ref, multiplies its chunk at once): the decode kernels' contract (a
    row's bits do not depend on the rows beside it, so a verify step's rows are one-token steps' bits). One product of
    B rows is not that on the CPU: MKL sums a 1-row and a B-row product in different orders (the real 0.5B's layer 0:
    ~1,000 of 1,152 qkv outputs differ in their last bits), and `spec_diff --device ref` found the speculative run's
    K/V rows 1 ulp off the plain run's from its first verify step on."""
    wt = dense_weight_memo(w).T
    y = x.float() @ wt if x.shape[0] == 1 or not rows_alone else torch.cat([r.float() @ wt for r in x.split(1)])
    if bias and w.bias is not None:
        y = y + w.bias.float()
    return y


def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    g, u = gate_up.float().chunk(2, dim=-1)
    return F.silu(g) * u


def rmsnorm_ref(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return rms_norm(h.float(), weight, eps).half()


def embed_ref(tokens: torch.Tensor, w: QWeight) -> torch.Tensor:
    """float32 [B, K]: the embedding rows of tokens (only those rows are dequantized)."""
    return dense_weight(w, tokens.long())


def chain_advance_ref(meta: torch.Tensor, keys: torch.Tensor, B: int, vocab: int):
    """embed_rows' chain mode before its gather: meta int32 [5, M] rows 0 (tokens) = the argmax ids of keys[:B]
    (keys_to_ids; an id outside the vocab reads row 0), rows 1 and 3 (cache row, position) + 1; keys[:B] = 0."""
    ids = 0xFFFFFFFF - (keys[:B].to(torch.int64) & 0xFFFFFFFF)
    meta[0, :B] = torch.where(ids < vocab, ids, torch.zeros_like(ids)).to(meta.dtype)
    meta[1, :B] += 1
    meta[3, :B] += 1
    keys[:B] = 0


def attention_ref(qkv: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: list[int], pos: list[int],
                  cos: torch.Tensor, sin: torch.Tensor, H: int, Hkv: int, hd: int) -> torch.Tensor:
    """One decode step of GQA attention; updates kc/vc [slots, Hkv, ctx, hd] in place like the kernel.
    The reference ops' attention (RefOps.attention: rope rounded to fp16 as the kernel stores it, cache
    write, causal GQA), one token per row. qkv fp16 [B, (H + 2 Hkv) hd] (bias included) -> float32 [B, H * hd]."""
    ops = RefOps(None, kc[None], vc[None], Rotary.from_tables(cos, sin), slots, pos, H, 0.0)
    return ops.attention(0, qkv.unsqueeze(1))[:, 0].float()


# --- speculative verification (issue #17): decode_attn.cu's _tree kernels, decode_kvwrite.cu ------------------
def kv_write_ref(qkv: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: list[int], pos: list[int],
                 cos: torch.Tensor, sin: torch.Tensor, H: int, Hkv: int, hd: int, rpos: list[int] | None = None):
    """attention_tree_ref's write: row pos[b] of slot slots[b] of kc/vc [slots, Hkv, ctx, hd] = rope(k_b) at position
    rpos[b] (None: pos[b]) in fp16, v_b."""
    rot = Rotary.from_tables(cos, sin)
    for b, (s, p) in enumerate(zip(slots, pos)):
        k = qkv[b, H * hd:(H + Hkv) * hd].view(1, Hkv, hd)
        rp = p if rpos is None else rpos[b]
        kc[s, :, p] = rot.apply(k, torch.tensor([rp], device=qkv.device))[0].to(kc.dtype)
        vc[s, :, p] = qkv[b, (H + Hkv) * hd:(H + 2 * Hkv) * hd].view(Hkv, hd).to(vc.dtype)


def topk_ref(logits: torch.Tensor, k: int = 4) -> torch.Tensor:
    """decode_topk.cu topk_rows: ids int64 [R, k] of each row's k largest logits fp32 [R, N], descending, ties to
    the lower id (a stable sort of the values)."""
    return torch.sort(logits.float(), dim=-1, descending=True, stable=True).indices[:, :k]


def move_rows_ref(kc: torch.Tensor, vc: torch.Tensor, slot: int, start: int, nodes: list[int]):
    """decode_kvwrite.cu move_rows: rows start + n_j -> start + j (j = 1..d, in order) of `slot` in every layer of
    kc, vc [layers, slots, Hkv, ctx, hd]."""
    for j, n in enumerate(nodes, 1):
        if n != j:
            kc[:, slot, :, start + j] = kc[:, slot, :, start + n]
            vc[:, slot, :, start + j] = vc[:, slot, :, start + n]


def accept_ref(meta: torch.Tensor, keys: torch.Tensor, parents: list[int], B: int, x: torch.Tensor, out: torch.Tensor,
               margs: torch.Tensor, hh: torch.Tensor, htok: torch.Tensor):
    """decode_spec.cu spec_accept: the greedy walk down a verified tree (the child holding the argmax of the current
    node's row), then the next step's inputs; in place on the same buffers."""
    from kernels.decode_kernels import pack_path, tree_roots, tree_walk
    ids = [int(0xFFFFFFFF - (int(k) & 0xFFFFFFFF)) for k in keys[:B].tolist()]
    toks = meta[0, :B].tolist()
    depth = [len(r) for r in tree_roots(parents[:B])]
    path = tree_walk(toks, ids, parents[:B])
    cur = path[-1] if path else 0
    kept = [toks[c] for c in path] + [ids[cur]]
    out.zero_()
    out[0] = len(kept)
    out[1:1 + len(kept)] = torch.tensor(kept, dtype=out.dtype)
    start, slot = int(meta[1, 0]), int(meta[2, 0])
    margs[:] = torch.tensor([start, pack_path(path), len(path), slot], dtype=margs.dtype)
    ns = start + len(kept)
    meta[0, 0] = ids[cur]
    meta[1, :B] = torch.tensor([ns + b for b in range(B)], dtype=meta.dtype)
    meta[3, :B] = torch.tensor([ns + d for d in depth], dtype=meta.dtype)
    hh.copy_(x[cur])
    htok[0] = ids[cur]


def tree_rows(pos: int, b: int, rpos: int, path: int) -> list[int]:
    """decode_attn.cu tree_row: the cache rows node b (row pos = base + b, position rpos = base + depth) attends
    to, in logical order: rows 0..base, then the node of each depth 1..depth on its root path (3 bits each)."""
    base = pos - b
    return list(range(base + 1)) + [base + ((path >> 3 * j) & 7) for j in range(rpos - base)]


def attention_nowrite_ref(qkv: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: list[int], pos: list[int],
                          cos: torch.Tensor, sin: torch.Tensor, H: int, Hkv: int, hd: int,
                          rpos: list[int] | None = None, path: list[int] | None = None) -> torch.Tensor:
    """attention_tree_ref's read: token b (rope(q) at rpos[b]) over rows 0..rpos[b] of its slot in tree_rows order,
    nothing written (kv_write_ref wrote them). rpos/path None: a chain (rpos = pos, rows 0..pos[b])
    -> float32 [B, H * hd]."""
    rot = Rotary.from_tables(cos, sin)
    outs = []
    for b, (s, p) in enumerate(zip(slots, pos)):
        rp = p if rpos is None else rpos[b]
        rows = torch.arange(p + 1) if path is None else torch.tensor(tree_rows(p, b, rp, path[b]))
        q = rot.apply(qkv[b, :H * hd].view(1, H, hd), torch.tensor([rp], device=qkv.device))
        outs.append(gqa_attention(q.float(), kc[s, :, rows].float(), vc[s, :, rows].float(), rp)[0])
    return torch.stack(outs).float()


def attention_tree_ref(qkv: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: list[int], pos: list[int],
                       cos: torch.Tensor, sin: torch.Tensor, H: int, Hkv: int, hd: int,
                       rpos: list[int] | None = None, path: list[int] | None = None) -> torch.Tensor:
    """attn_decode_hd*_tree: every token's k/v row written, then each token over its tree path's rows (the kernel
    rebuilds the step's rows from qkv instead of reading them back: the same fp16 values) -> float32 [B, H * hd]."""
    kv_write_ref(qkv, kc, vc, slots, pos, cos, sin, H, Hkv, hd, rpos)
    return attention_nowrite_ref(qkv, kc, vc, slots, pos, cos, sin, H, Hkv, hd, rpos, path)


ATT_MRUN, ATT_MRUN_FROM = 128, 2048  # decode_attn.cu: the tensor-core schedule's run unit from 2,048 rows on


def mma_run(L: int, head_dim: int) -> int:
    """The run unit decode_attn.cu's tensor-core schedule uses at L rows: ATT_MRUN from ATT_MRUN_FROM rows on, else
    the chunk (64 rows at head dim 128, 128 at 64). A function of L only: plain and verify rows agree."""
    chunk = 64 if head_dim == 128 else 128
    return ATT_MRUN if L >= ATT_MRUN_FROM else chunk


def split_runs(L: int, nsplit: int, chunk: int) -> list[tuple[int, int]]:
    """decode_attn.cu's runs: positions 0..L-1 in nact <= nsplit runs [s0, s1) of sl rows, sl a multiple of chunk."""
    sl = -(-(-(-L // nsplit)) // chunk) * chunk
    return [(s0, min(L, s0 + sl)) for s0 in range(0, L, sl)]


def attention_split_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, nsplit: int, chunk: int,
                        warps: int = 8, rows_per_warp: int = 2) -> torch.Tensor:
    """decode_attn.cu's schedule in PyTorch: q [rep, hd] (roped, scaled), k/v [L, hd] -> [rep, hd].

    Positions go in nact <= nsplit runs of sl rows (sl a multiple of chunk); inside a run each warp keeps a
    running max / sum / o over its rows, chunk by chunk; warps merge per block, blocks merge at the end.
    The kernel's short-context mode (L <= ATT_SHORT: a block per query head over one run) is nsplit = 1."""
    ppi = warps * rows_per_warp
    parts = []
    for s0, s1 in split_runs(k.shape[0], nsplit, chunk):
        wparts = []
        for w in range(warps):  # rows of warp w: s0 + it * ppi + w * rows_per_warp + r
            m = torch.full((q.shape[0],), -1e30, dtype=torch.float64)
            tot, o = torch.zeros_like(m), torch.zeros(q.shape[0], q.shape[1], dtype=torch.float64)
            for c0 in range(s0, s1, chunk):
                rows = [c0 + it * ppi + w * rows_per_warp + r for it in range(chunk // ppi)
                        for r in range(rows_per_warp)]
                rows = torch.tensor([p for p in rows if p < s1], dtype=torch.long)
                if len(rows) == 0:
                    continue
                sc = q.double() @ k[rows].double().T  # [rep, rows]
                mx = torch.maximum(m, sc.max(-1).values)
                a = torch.exp(m - mx)
                e = torch.exp(sc - mx[:, None])
                m, tot, o = mx, tot * a + e.sum(-1), o * a[:, None] + e @ v[rows].double()
            wparts.append((m, tot, o))
        parts.append(_merge(wparts))
    M, tot, o = _merge(parts)
    return (o / tot[:, None]).float()


def attention_mma_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, nsplit: int, chunk: int,
                      warps: int = 8, tile: int = 16) -> torch.Tensor:
    """decode_attn.cu's split schedule on the tensor cores (ATT_MMA): q [rep, hd] (roped, scaled) -> [rep, hd].

    The runs are attention_split_ref's; inside a run warp w takes the 16-row tiles w, w + 8, ..; q is rounded to
    fp16 once, each tile's weights exp(s - m) are rounded to fp16 before the PV product and the running sum adds the
    rounded values (the mma's inputs are fp16, its sums fp32)."""
    qh = q.half().double()
    parts = []
    for s0, s1 in split_runs(k.shape[0], nsplit, chunk):
        nt = -(-(s1 - s0) // tile)
        wparts = []
        for w in range(warps):
            m = torch.full((q.shape[0],), -1e30, dtype=torch.float64)
            tot, o = torch.zeros_like(m), torch.zeros(q.shape[0], q.shape[1], dtype=torch.float64)
            for ti in range(w, nt, warps):
                rows = torch.arange(s0 + ti * tile, min(s1, s0 + ti * tile + tile))
                sc = qh @ k[rows].half().double().T  # [rep, rows]
                mx = torch.maximum(m, sc.max(-1).values)
                a = torch.exp(m - mx)
                e = torch.exp(sc - mx[:, None]).half().double()
                m, tot, o = mx, tot * a + e.sum(-1), o * a[:, None] + e @ v[rows].half().double()
            wparts.append((m, tot, o))
        parts.append(_merge(wparts))
    M, tot, o = _merge(parts)
    return (o / tot[:, None]).float()


def mma16816_lanes(a: list, b: list, d: list) -> None:
    """mma.sync m16n8k16 on per-lane registers, as the hardware distributes them (decode_common.cu mma16816):
    a[lane] = 4 pairs, b[lane] = 2 pairs, d[lane] = 4 floats (updated). For checking fragment layouts on the CPU."""
    A, B = torch.zeros(16, 16, dtype=torch.float64), torch.zeros(16, 8, dtype=torch.float64)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for r, (row, col) in enumerate([(g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)]):
            A[row, col], A[row, col + 1] = a[lane][r]
        for r, kk in enumerate([2 * t, 2 * t + 8]):
            B[kk, g], B[kk + 1, g] = b[lane][r]
    D = A @ B
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for r, (row, col) in enumerate([(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]):
            d[lane][r] += float(D[row, col])


def _merge(parts):
    """(m, sum, o) partials over disjoint rows -> one (M, sum, o)."""
    M = torch.stack([p[0] for p in parts]).max(0).values
    e = [torch.exp(p[0] - M) for p in parts]
    return M, sum(x * p[1] for x, p in zip(e, parts)), sum(x[:, None] * p[2] for x, p in zip(e, parts))


def argmax_ref(logits: torch.Tensor) -> list[int]:
    return [int(i) for i in logits.float().argmax(-1)]


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """||got - ref|| / ||ref|| in float64; NaN anywhere -> inf."""
    g, r = got.double(), ref.double()
    if not torch.isfinite(g).all():
        return float("inf")
    return float((g - r).norm() / r.norm().clamp_min(1e-30))


def epilogue(y: torch.Tensor, epi: str, out: torch.Tensor, keys=None):
    """The GEMV epilogues on y [B, N] (bias already in for "store"): store (out fp16 = y), resid (out fp32
    += y), silu (out fp16 = silu(gate) * up of y's halves), logits (out fp32 = y; keys = argmax key)."""
    B = y.shape[0]
    if epi == "store":
        out[:B] = y.half()
    elif epi == "resid":
        out[:B] += y.float()
    elif epi == "silu":
        out[:B] = silu_mul_ref(y).half()
    else:
        out[:B] = y.float()
        keys[:B] = 0xFFFFFFFF - out[:B].argmax(-1)


# --- the deferred rmsnorm (decode_norm.cu): fixed-point sums of squares per norm point and token -------------
SS_ONE = 2.0 ** 20  # SS_ONE
DEFER_SC = 0.0625  # DEFER_SC: x = h * w * (the previous point's rstd / 16)


def to_fix(q: torch.Tensor) -> torch.Tensor:
    """float32 sums of squares -> int64 fixed point (__float2ll_rn(q * SS_ONE))."""
    return torch.round(q.float() * SS_ONE).to(torch.int64)


def rstd_fix(v: torch.Tensor, D: int, eps: float) -> torch.Tensor:
    """int64 fixed-point sums of squares -> float32 rsqrt(mean + eps), in the kernel's order of float32 ops."""
    return torch.rsqrt(v.float() * (1.0 / SS_ONE) / D + eps)


def defer_start_ref(h: torch.Tensor, B: int, norm, ss: torch.Tensor):
    """The embedding kernels' deferred norm (defer_norm_row): ss[0] = ss[1] = the rows' sums, ss[2:] = 0,
    xn = fp16(h * w * sc), sc = rstd / 16 of the row itself."""
    weight, eps, xn = norm
    f = to_fix((h[:B].float() ** 2).sum(-1))
    ss[:2, :B] = f
    ss[2:, :B] = 0
    sc = rstd_fix(f, h.shape[-1], eps) * DEFER_SC
    xn[:B] = (h[:B].float() * weight * sc[:, None]).half()


def defer_resid_ref(h: torch.Tensor, B: int, norm, ss: torch.Tensor):
    """A resid GEMV's deferred norm after h += y: xn = fp16(h * w * sc), sc = rstd(ss[0]) / 16; ss[1] += sums."""
    weight, eps, xn = norm
    sc = rstd_fix(ss[0, :B], h.shape[-1], eps) * DEFER_SC
    xn[:B] = (h[:B].float() * weight * sc[:, None]).half()
    ss[1, :B] += to_fix((h[:B].float() ** 2).sum(-1))


def defer_scale_ref(ss: torch.Tensor, B: int, D: int, eps: float) -> torch.Tensor:
    """float32 [B]: rstd / sc of each token, the factor a deferred norm's consumer applies to its sums."""
    return rstd_fix(ss[1, :B], D, eps) / (rstd_fix(ss[0, :B], D, eps) * DEFER_SC)


def gemv_epilogue(y: torch.Tensor, w: QWeight, B: int, epi: str, out: torch.Tensor, keys, norm, ss, eps: float):
    """DecodeKernels.gemv's contract after the product y = x[:B] @ W.T (no bias yet): the deferred norm's scale
    (store / silu with ss), the bias (store), the epilogue, and a resid's deferred norm (norm with ss)."""
    rs = defer_scale_ref(ss, B, w.K, eps)[:, None] if ss is not None and epi in ("store", "silu") else None
    bias = w.bias if epi == "store" else None
    if rs is not None and bias is not None:  # the kernel's one rounding: fma(y, rs, bias)
        y = (y.double() * rs.double() + bias.double()).float()
    elif rs is not None:
        y = y.float() * rs
    elif bias is not None:
        y = y.float() + bias.float()
    epilogue(y, epi, out, keys)
    if norm is not None:
        defer_resid_ref(out, B, norm, ss)


def dense_gemv(w: QWeight, x: torch.Tensor, B: int, epi: str, out: torch.Tensor, keys=None, norm=None, ss=None,
               eps: float = 0.0):
    """DecodeKernels.gemv's contract for a dense fp16 weight (bits 16), in torch (capturable)."""
    gemv_epilogue(F.linear(x[:B], w.weight), w, B, epi, out, keys, norm, ss, eps)


def keys_host_ref(keys: torch.Tensor, host: torch.Tensor, meta: torch.Tensor, B: int):
    """decode_misc.cu keys_host: a chain step's argmax keys into host row (its cache row's parity): the row of
    meta[1][0] & 1, as the kernel writes it after embed_rows moved the position on."""
    host[int(meta[1, 0]) & 1, :B] = keys[:B].to(host.device)


class RefKernels:
    """DecodeKernels' interface on the references: runs engine/model/gpu_model.py's step on the CPU (tests, CI)."""

    def gemv(self, w: QWeight, x: torch.Tensor, B: int, epi: str, out: torch.Tensor, keys=None, norm=None, ss=None,
             eps: float = 0.0, pf=None, long: bool = False, plan=None, mt=None, q8: bool = False):  # pf: an L2
        # prefetch descriptor, long: a long-context graph's GEMV (its plan there), plan / mt: the kernel's grid; none
        # of them changes results. q8: int8 activations where the q8 kernels take the GEMV (q8_plan.q8_ok)
        if q8 and q8_ok(w, epi, B):  # each token alone (the kernels' arithmetic per token)
            y = torch.cat([gemv_q8_w4_ref(x[b], w) for b in range(B)])
        else:
            y = gemv_ref(x[:B], w, bias=False)
        gemv_epilogue(y, w, B, epi, out, keys, norm, ss, eps)

    def copy_rows(self, src, B: int, h, keys, norm=None, ss=None):
        h[:B] = src[:B]
        keys[:B] = 0
        if norm is not None:
            defer_start_ref(h, B, norm, ss)

    def embed(self, tokens, w: QWeight, B: int, h, keys, chain=None, norm=None, ss=None):
        if chain is not None:
            chain_advance_ref(chain, keys, B, w.N)
        h[:B] = embed_ref(tokens[:B], w)
        keys[:B] = 0
        if norm is not None:
            defer_start_ref(h, B, norm, ss)

    def keys_host(self, keys, host, meta, B: int):
        keys_host_ref(keys, host, meta, B)

    def sample_rows(self, logits, prm, u, at, keys, B: int):
        sample_rows_ref(logits, prm, u, at, keys, B)

    def rmsnorm(self, h, weight, eps: float, B: int, x):
        x[:B] = rmsnorm_ref(h[:B], weight, eps)

    def attention(self, qkv, kc, vc, slots, pos, cos, sin, B, Hkv, rep, head_dim, max_context, out, ws, merge=False):
        # merge: who merges the kernel's split partials (DecodeKernels.attn_merge); the result is the same
        out[:B] = attention_ref(qkv[:B], kc, vc, slots[:B].tolist(), pos[:B].tolist(), cos, sin, Hkv * rep, Hkv,
                                head_dim).half()

    # speculative verification (issue #17)
    def move_rows(self, kc, vc, slot: int, start: int, nodes: list[int]):
        move_rows_ref(kc, vc, slot, start, nodes)

    def move_rows_dev(self, kc, vc, margs):
        start, path, d, slot = margs.tolist()
        move_rows_ref(kc, vc, slot, start, [(path >> 3 * j) & 7 for j in range(d)])

    def spec_accept(self, meta, keys, parents, B, x, out, margs, hh, htok):
        accept_ref(meta, keys, parents, B, x, out, margs, hh, htok)

    def topk(self, logits, R: int, out):
        out[:R] = topk_ref(logits[:R], out.shape[-1])

    def attention_tree(self, qkv, kc, vc, slots, pos, cos, sin, B, Hkv, rep, head_dim, max_context, out, ws,
                       nsplit=None, rpos=None, path=None, merge=False):
        out[:B] = attention_tree_ref(qkv[:B], kc, vc, slots[:B].tolist(), pos[:B].tolist(), cos, sin, Hkv * rep,
                                     Hkv, head_dim, None if rpos is None else rpos[:B].tolist(),
                                     None if path is None else path[:B].tolist()).half()


def grid_merge_ref(part_o: torch.Tensor, part_ml: torch.Tensor, B: int, Hkv: int, rep: int, nsplit: int,
                   nact: list[int], hd: int) -> torch.Tensor:
    """decode_attn.cu attn_grid_merge block by block: part_o fp32 [B * H * nsplit * hd], part_ml [B * H * nsplit * 2]
    (the attention's partials; H = Hkv * rep) -> out fp32 [B, H * hd]. Block `split` < nact[b] of (b, kvh) gathers
    its slice o0 .. o1 of the rep * hd outputs (item j = s * nout + k at the kernel's address), weights each head's
    splits as merge_weights does, and sums over s in order. Outputs no block writes stay NaN (the test checks there
    are none)."""
    H = Hkv * rep
    out = torch.full((B, H * hd), float("nan"), dtype=torch.float32)
    for b in range(B):
        for kvh in range(Hkv):
            n_a, tot = nact[b], rep * hd
            per = (tot + n_a - 1) // n_a
            hb0 = (b * H + kvh * rep) * nsplit
            for split in range(n_a):
                o0, o1 = split * per, min(tot, split * per + per)
                nout = o1 - o0
                if nout <= 0:
                    continue
                n = nout * n_a
                j = torch.arange(n)
                s, k = j // nout, j % nout
                oi = o0 + k
                pv = part_o[(hb0 + (oi // hd) * nsplit + s) * hd + oi % hd].view(n_a, nout)  # [s][k], as in smem
                hk = (o0 + torch.arange(nout)) // hd  # each output's head (of the KV head's rep)
                pm = part_ml.view(-1, 2)[hb0 + hk[:, None] * nsplit + torch.arange(n_a)]  # [k][s] (M, sum)
                e = torch.exp(pm[..., 0] - pm[..., 0].max(-1, keepdim=True).values)
                out[b, kvh * rep * hd + o0:kvh * rep * hd + o1] = (e * pv.T).sum(-1) / (e * pm[..., 1]).sum(-1)
    return out


def bal_first(b: int, ntiles: int, nb: int, late: tuple[int, int] | None = None) -> int:
    """decode_gemv.cu bal_first: block b's first tile; late = (E, f): blocks from E on take f / 256 of a share."""
    if late is None:
        return b * ntiles // nb
    e, f = late
    cum = lambda x: 256 * min(x, e) + f * max(x - e, 0)  # noqa: E731
    return cum(b) * ntiles // cum(nb)


def bal_schedule(ntiles: int, nb: int, G: int, warps: int = 8, late: tuple[int, int] | None = None) -> list[dict]:
    """The balanced GEMV schedule (decode_gemv.cu GEMV_BAL), as the kernel computes it, per block: its tiles
    [t0, t0 + nt), each warp's run of (tile, group) units as segments (tile, first group, end group), and per tile i
    of the block the red[] slots warp i sums, in order (slot w: run w's first tile, 8 + w: its second). late: the
    BAL_LATE weighting (bal_first)."""
    out = []
    for b in range(nb):
        t0 = bal_first(b, ntiles, nb, late)
        nt = bal_first(b + 1, ntiles, nb, late) - t0
        units = nt * G
        U = (units + 7) >> 3
        runs = []
        for w in range(warps):
            u, ue = w * U, min(units, w * U + U)
            segs: list[tuple[int, int, int]] = []
            while u < ue:
                t, g = divmod(u, G)
                end = min(ue, (t + 1) * G)
                segs.append((t0 + t, g, g + end - u))
                u = end
            runs.append(segs)
        slots = []
        for i in range(nt):
            ws = range(i * G // U, ((i + 1) * G - 1) // U + 1) if U else range(0)
            slots.append([w if (w * U) // G == i else 8 + w for w in ws])
        out.append({"t0": t0, "nt": nt, "U": U, "runs": runs, "slots": slots})
    return out
