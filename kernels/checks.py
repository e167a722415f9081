"""Decode kernels vs their PyTorch references (fresh random inputs, several shapes; tests/test_gpu_decode.py asserts
them, engine/bench/decode_bench.py reports them), and per-kernel timings inside CUDA graphs with rotated weight
copies (so repeated launches do not read from L2)."""
from __future__ import annotations

import dataclasses

import torch

from kernels import decode_reference as ref, pack
from kernels.decode_kernels import MT, AttnWorkspace, DecodeKernels, keys_to_ids
from kernels.ops_reference import Rotary
from kernels.qweight import QWeight

TOL = 1e-2


def rand_qweight(N, K, bits, dev, gen, bias=False) -> QWeight:
    q = torch.randint(0, 1 << bits, (N, K), dtype=torch.uint8, generator=gen)
    s = (0.02 * (1 + torch.rand(N, K // 128, generator=gen))).half()
    m = (-(2 ** bits - 1) / 2 * s.float() + 0.01 * torch.randn(N, K // 128, generator=gen)).half()
    b = (torch.randn(N, generator=gen) * 0.1).half().to(dev) if bias else None
    return QWeight(N, K, bits, qweight=pack.pack(q, bits).to(dev), scales=s.to(dev), mins=m.to(dev), bias=b)


def recorder(rows: list[dict], log):
    """rec(name, shape, err, extra): one check row (ok = err < TOL and every bool in extra true), logged."""
    def rec(name, shape, err, extra=None):
        ok = err < TOL and all(v for v in (extra or {}).values() if isinstance(v, bool))
        rows.append({"kernel": name, "shape": shape, "rel_err": err, "ok": ok, **(extra or {})})
        log(f"  {'ok ' if ok else 'BAD'} {name:<14} {str(shape):<34} rel_err {err:.2e}")
    return rec


def check_kernels(log) -> list[dict]:
    kn, dev = DecodeKernels.get(), torch.device("cuda")
    gen = torch.Generator().manual_seed(1234)
    rows = []
    rec = recorder(rows, log)

    for bits in (4, 3):
        # ... and the 14B's qkv, o and down, whose default plans are one wave of larger blocks where the generic rule's
        # grid had a partial second wave on 132 SMs (DecodeKernels.tuned: o (8, 1, 2), down (4, 3, 2): K split over 3)
        for (N, K) in [(1152, 896), (2560, 2048), (2048, 11008), (4608, 3584), (3584, 18944), (7168, 5120),
                       (5120, 5120), (5120, 13824)]:
            w = rand_qweight(N, K, bits, dev, gen, bias=True)
            wref = ref.dense_weight(w).to(dev)
            for B in (1, 3, 8):
                x = torch.zeros(8, K, dtype=torch.float16, device=dev)
                x[:B] = torch.randn(B, K, generator=gen).half().to(dev)
                y = torch.full((B, N), float("nan"), dtype=torch.float16, device=dev)
                kn.gemv(w, x, B, "store", y)
                r = x[:B].float() @ wref.T + w.bias.float()
                rec(f"gemv_w{bits}_store", (B, N, K), ref.rel_err(y, r))
                h0 = torch.randn(8, N, generator=gen).to(dev)
                h = h0.clone()
                kn.gemv(w, x, B, "resid", h)
                rec(f"gemv_w{bits}_resid", (B, N, K), ref.rel_err(h[:B] - h0[:B], r - w.bias.float()),
                    {"untouched_rows_ok": bool((h[B:] == h0[B:]).all())})
        for (F2, K) in [(2 * 4864, 896), (2 * 11008, 2048), (2 * 18944, 3584), (2 * 13824, 5120)]:  # 0.5B-14B gate_up
            w = rand_qweight(F2, K, bits, dev, gen)
            for B in (1, 5):
                x = torch.zeros(8, K, dtype=torch.float16, device=dev)
                x[:B] = torch.randn(B, K, generator=gen).half().to(dev)
                y = torch.full((B, F2 // 2), float("nan"), dtype=torch.float16, device=dev)
                kn.gemv(w, x, B, "silu", y)
                rec(f"gemv_w{bits}_silu", (B, F2, K), ref.rel_err(y, ref.silu_mul_ref(ref.gemv_ref(x[:B], w))))
        lm_head_embed_checks(kn, rec, gen, dev, bits)
    for D in (896, 2048, 3584):
        h = torch.randn(8, D, generator=gen).to(dev) * 3
        wt = torch.rand(D, generator=gen).to(dev) + 0.5
        x = torch.full((5, D), float("nan"), dtype=torch.float16, device=dev)
        kn.rmsnorm(h, wt, 1e-6, 5, x)
        rec("rmsnorm", (5, D), ref.rel_err(x, ref.rmsnorm_ref(h[:5], wt, 1e-6)))
    defer_checks(kn, rec, gen, dev)
    attention_checks(kn, rec, gen, dev)
    return rows


def lm_head_embed_checks(kn, rec, gen, dev, bits: int, vocab: int = 151936):
    """The lm_head (logits and argmax keys) and the embedding rows, `bits`-bit weights of `vocab` rows: the 0.5B's K at
    its plan, the 3B's K at gemv_plan's (KSW 1) and at 4 warps along K (the default since the thirty-fourth session,
    docs/gpu.md), the in-block reduction before the argmax keys; then the 0.5B's lm_head weight read as its tied
    embedding, and rows as wide as the 14B's hidden size and wider. Its own function (with its own names) since a
    loop here once left the 3B's weight where the embedding check read the 0.5B's; tests/test_kernel_checks.py runs it
    on the references (RefKernels) with a small vocab."""
    lm = {}
    keys = torch.zeros(8, dtype=torch.int64, device=dev)
    for K, plan in ((896, None), (2048, None), (2048, (4, 1))):
        w = lm.setdefault(K, rand_qweight(vocab, K, bits, dev, gen))
        x = torch.randn(8, K, generator=gen).half().to(dev)
        logits = torch.full((3, vocab), float("nan"), device=dev)
        keys.zero_()
        kn.gemv(w, x, 3, "logits", logits, keys, plan=plan)
        r = ref.gemv_ref(x[:3], w)
        ids = keys_to_ids(keys.cpu().numpy()[:3])
        rec(f"gemv_w{bits}_logits" + (f"_ksw{plan[0]}" if plan else ""), (3, vocab, K), ref.rel_err(logits, r),
            {"argmax_ok": ids == ref.argmax_ref(logits)})  # recorder: a False argmax_ok makes the row not ok
    tok = torch.tensor([5, vocab - 1, 77], dtype=torch.int32, device=dev)
    h = torch.full((3, 896), float("nan"), device=dev)
    kn.embed(tok, lm[896], 3, h, keys)
    rec(f"embed_w{bits}", (3, 896), ref.rel_err(h, ref.embed_ref(tok.cpu(), lm[896]).to(dev)))
    for D in (5120, 6400):  # a thread loops over 20-25 elements
        we = rand_qweight(64, D, bits, dev, gen)
        te = torch.tensor([3, 63, 0], dtype=torch.int32, device=dev)
        he = torch.full((3, D), float("nan"), device=dev)
        kn.embed(te, we, 3, he, keys)
        rec(f"embed_w{bits}", (3, D), ref.rel_err(he, ref.embed_ref(te.cpu(), we).to(dev)))


def columns_alike(kn, wq, wg, x, ss, eps) -> bool:
    """A token's bits do not depend on its column in the GEMV's mma (a verify row b >= 1 against the one-token
    step's column 0): the store and silu consumers of a deferred norm on 8 rows, then on the rows with each even /
    odd pair swapped, outputs equal bit for bit after swapping back. The store's bias is set to about -(row 0's
    y * rs) so that y * rs + bias cancels: there an FMUL + FADD and an FFMA give different bits far more often than
    with a random bias (ptxas had compiled column 0 one way and 1..3 the other before decode_gemv.cu's epilogue
    rounded explicitly)."""
    perm = torch.tensor([1, 0, 3, 2, 5, 4, 7, 6], device=x.device)
    y0 = torch.empty(8, wq.N, dtype=torch.float16, device=x.device)
    kn.gemv(dataclasses.replace(wq, bias=None), x, 8, "store", y0, ss=ss, eps=eps)
    wc = dataclasses.replace(wq, bias=(-y0[0].float() * 1.001).half())
    ok = True
    for w, epi, n in ((wc, "store", wq.N), (wg, "silu", wg.N // 2)):
        a, b = (torch.empty(8, n, dtype=torch.float16, device=x.device) for _ in range(2))
        kn.gemv(w, x, 8, epi, a, ss=ss, eps=eps)
        kn.gemv(w, x[perm].contiguous(), 8, epi, b, ss=ss[:, perm].contiguous(), eps=eps)
        ok = ok and bool(torch.equal(b, a[perm]))
    return ok


DEFER_SHAPES = [(896, 4864, None), (2048, 11008, (8, 4)), (3584, 3584, None), (5120, 13824, (2, 8)),
                (5120, 5120, None), (5120, 13824, None)]  # (N, K, plan); the 14B's o and down on their default plans


def defer_checks(kn, rec, gen, dev, shapes=DEFER_SHAPES, vocab: int = 151936):
    """The deferred rmsnorm (decode_norm.cu) vs its references (decode_reference.py defer_*): the embedding's start,
    a resid GEMV's x and sums (0.5B / 3B / 7B / 14B hidden sizes, K split across blocks, B = 1, 3, 8), and the
    consumers (store + bias, silu) against the same linears on a separate rmsnorm of the same h (the identity the
    deferral rests on). Row 0's bits do not depend on B (the sums are fixed point: any order). shapes / vocab:
    tests/test_kernel_checks.py runs it on the references with small ones."""
    eps = 1e-6
    for (N, K, plan) in shapes:
        w = rand_qweight(N, K, 4, dev, gen)
        wq = rand_qweight(512, N, 4, dev, gen, bias=True)  # a store consumer (qkv-like, smaller N)
        wg = rand_qweight(2 * 256, N, 3, dev, gen)  # a silu consumer (gate | up)
        wt = torch.rand(N, generator=gen).to(dev) + 0.5
        x = torch.randn(8, K, generator=gen).half().to(dev)
        h0 = torch.randn(8, N, generator=gen).to(dev) * 3
        row0 = None
        for B in (1, 3, 8):
            ss = torch.zeros(3, 8, dtype=torch.int64, device=dev)
            ss[0] = ref.to_fix(((h0 * 0.7) ** 2).sum(-1))  # the previous point's sums (sc)
            ss[1, B:] = 12345  # rows >= B: untouched
            h, hr, ssr = h0.clone(), h0.clone(), ss.clone()
            xn = torch.full((8, N), float("nan"), dtype=torch.float16, device=dev)
            xr = xn.clone()
            kn.gemv(w, x, B, "resid", h, plan=plan, norm=(wt, eps, xn), ss=ss[:2])
            hr[:B] += ref.gemv_ref(x[:B], w)
            ref.defer_resid_ref(hr, B, (wt, eps, xr), ssr[:2])
            ss_err = float(((ss[1, :B] - ssr[1, :B]).abs().double() / ssr[1, :B].double()).max())
            rec("gemv_w4_resid+defer", (B, N, K), ref.rel_err(xn[:B], xr[:B]),
                {"h_rel_err": ref.rel_err(h[:B], hr[:B]), "ss_rel_err": ss_err, "ss_ok": ss_err < 1e-5,
                 "untouched_ok": bool(xn[B:].isnan().all()) and bool((ss[1, B:] == 12345).all())})
            row0 = (xn[0].clone(), ss[1, 0].clone()) if row0 is None else row0
            rec("defer row 0 = B 1", (B, N), 0.0, {"bits_equal": bool(torch.equal(row0[0], xn[0])) and
                                                    int(row0[1]) == int(ss[1, 0])})
            # consumers: on x (deferred) vs the same linear on a separate rmsnorm of the same h
            xs = ref.rmsnorm_ref(h[:B], wt, eps)
            y = torch.full((8, 512), float("nan"), dtype=torch.float16, device=dev)
            kn.gemv(wq, xn, B, "store", y, ss=ss[:2], eps=eps)
            yr = torch.empty_like(y)
            ref.gemv_epilogue(ref.gemv_ref(xn[:B], wq, bias=False), wq, B, "store", yr, None, None, ss[:2], eps)
            rec("gemv_w4_store+defer", (B, 512, N), ref.rel_err(y[:B], yr[:B]),
                {"vs_separate_norm": ref.rel_err(y[:B], ref.gemv_ref(xs, wq)),
                 "separate_ok": ref.rel_err(y[:B], ref.gemv_ref(xs, wq)) < 5e-3})
            a = torch.full((8, 256), float("nan"), dtype=torch.float16, device=dev)
            kn.gemv(wg, xn, B, "silu", a, ss=ss[:2], eps=eps)
            sep = ref.silu_mul_ref(ref.gemv_ref(xs, wg))
            ar = torch.empty_like(a)
            ref.gemv_epilogue(ref.gemv_ref(xn[:B], wg, bias=False), wg, B, "silu", ar, None, None, ss[:2], eps)
            rec("gemv_w3_silu+defer", (B, 512, N), ref.rel_err(a[:B], ar[:B]),
                {"vs_separate_norm": ref.rel_err(a[:B], sep), "separate_ok": ref.rel_err(a[:B], sep) < 5e-3})
            if B == 8:
                rec("defer column", (B, 512, N), 0.0, {"bits_equal": columns_alike(kn, wq, wg, xn, ss[:2], eps)})
    # the start: the embedding (and the host rows' copy) write h, x and ss[0] = ss[1], clear ss[2:]
    E = rand_qweight(vocab, 896, 4, dev, gen)
    wt = torch.rand(896, generator=gen).to(dev) + 0.5
    tok = torch.tensor([5, vocab - 1, 77], dtype=torch.int32, device=dev)
    keys = torch.zeros(8, dtype=torch.int64, device=dev)
    for name in ("embed", "copy_rows"):
        h = torch.full((8, 896), float("nan"), device=dev)
        xn = torch.full((8, 896), float("nan"), dtype=torch.float16, device=dev)
        ss = torch.full((5, 8), 7, dtype=torch.int64, device=dev)
        hr, xr, ssr = h.clone(), xn.clone(), ss.clone()
        if name == "embed":
            kn.embed(tok, E, 3, h, keys, norm=(wt, eps, xn), ss=ss)
        else:
            kn.copy_rows(ref.embed_ref(tok.cpu(), E).to(dev), 3, h, keys, norm=(wt, eps, xn), ss=ss)
        hr[:3] = ref.embed_ref(tok.cpu(), E).to(dev)
        ref.defer_start_ref(hr, 3, (wt, eps, xr), ssr)
        ss_err = float(((ss[:2, :3] - ssr[:2, :3]).abs().double() / ssr[:2, :3].double()).max())
        rec(f"{name}+defer", (3, 896), ref.rel_err(xn[:3], xr[:3]),
            {"ss_ok": ss_err < 1e-5 and bool((ss[2:, :3] == 0).all()) and bool((ss[:, 3:] == 7).all()),
             "scale_16": bool((ref.defer_scale_ref(ss, 3, 896, eps) == 16).all())})


def attention_checks(kn, rec, gen, dev):
    """Attention vs its reference: GQA shapes of 3B / 7B / 0.5B, 16k-32k contexts, forced split counts."""
    for (H, Hkv, hd, ctx, lens) in [(16, 2, 128, 4096, [1, 77, 3000]), (28, 4, 128, 1024, [500, 1024, 64]),
                                    (14, 2, 64, 2048, [2048, 300, 9]), (16, 2, 128, 32768, [32768, 16385]),
                                    (28, 4, 128, 32768, [20000])]:
        check_attention(kn, rec, gen, dev, H, Hkv, hd, ctx, lens)
    for nsplit in (1, 3, 256):  # forced split counts: one block, uneven runs, most blocks idle
        check_attention(kn, rec, gen, dev, 16, 2, 128, 4096, [4096, 129, 700], nsplit)
        check_attention(kn, rec, gen, dev, 14, 2, 64, 4096, [4000, 1], nsplit)
    # more active splits than the merge launch loads ahead (ATT_MPRE): its tail loop (71 and 256 partials)
    check_attention(kn, rec, gen, dev, 16, 2, 128, 32768, [32768, 9000], 256)


def check_attention(kn, rec, gen, dev, H, Hkv, hd, ctx, lens, nsplit=None):
    B, slots = len(lens), 4
    kc = (torch.randn(slots, Hkv, ctx, hd, generator=gen)).half().to(dev)
    vc = (torch.randn(slots, Hkv, ctx, hd, generator=gen)).half().to(dev)
    kref, vref = kc.clone(), vc.clone()
    qkv = (torch.randn(8, (H + 2 * Hkv) * hd, generator=gen) * 2).half().to(dev)
    sl = [3, 0, 2][:B]
    pos = [n - 1 for n in lens]
    meta = torch.tensor([sl, pos], dtype=torch.int32, device=dev)
    rope = Rotary(hd, ctx, 1e6)
    cos, sin = rope.cos.to(dev), rope.sin.to(dev)
    ws = AttnWorkspace(8, H, Hkv, hd, dev, nsplit=nsplit)
    out = torch.full((B, H * hd), float("nan"), dtype=torch.float16, device=dev)
    for rep_run in range(2):  # twice: the split counters must be back at 0 after a launch
        kn.attention(qkv, kc, vc, meta[0], meta[1], cos, sin, B, Hkv, H // Hkv, hd, ctx, out, ws)
    r = ref.attention_ref(qkv[:B], kref, vref, sl, pos, cos, sin, H, Hkv, hd)
    cache_ok = bool((kc == kref).all() and (vc == vref).all()) or \
        ref.rel_err(kc.float(), kref.float()) < 1e-3
    # the long-context graphs' path: partials only, then attn_merge (a launch of its own): the same bits
    out_m = torch.full_like(out, float("nan"))
    kn.attention(qkv, kc, vc, meta[0], meta[1], cos, sin, B, Hkv, H // Hkv, hd, ctx, out_m, ws, merge=True)
    extra = {"cache_ok": cache_ok, "merge_launch_bits_equal": bool(torch.equal(out, out_m))}
    # the grid merge (the long-context graphs' plain steps): the blocks merge slices after a barrier; one wave only
    if getattr(kn, "grid_merge", False) and ws.splits(B) * Hkv * B <= kn.sms:
        out_g = torch.full_like(out, float("nan"))
        for rep_run in range(3):  # the barrier's counter and generation must serve the next launches
            kn.attention(qkv, kc, vc, meta[0], meta[1], cos, sin, B, Hkv, H // Hkv, hd, ctx, out_g, ws, merge="grid")
        extra["grid_merge_bits_equal"] = bool(torch.equal(out, out_g))
    extra["counters_zero"] = bool((ws.counters == 0).all())
    rec("attention", (B, H, Hkv, hd, tuple(lens), ws.splits(B)), ref.rel_err(out, r), extra)


def graph_time(fns, reps: int = 20) -> float:
    """Seconds per launch of fns (called in order) inside one CUDA graph, median of reps replays."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / 1e3 / len(fns))
    return sorted(ts)[len(ts) // 2]


def time_kernels(cfg, bits: int, log, B_list=(1, 8)) -> list[dict]:
    """Per-kernel times for one model shape (weights rotated over > 150 MB)."""
    kn, dev = DecodeKernels.get(), torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    c = cfg
    rows = []
    shapes = {"qkv": (c.q_size + 2 * c.kv_size, c.hidden_size, "store"), "o": (c.hidden_size, c.q_size, "resid"),
              "gate_up": (2 * c.intermediate_size, c.hidden_size, "silu"),
              "down": (c.hidden_size, c.intermediate_size, "resid"), "lm_head": (c.vocab_size, c.hidden_size, "logits")}
    for name, (N, K, epi) in shapes.items():
        b = 4 if name == "lm_head" else bits
        one = N * K * b // 8 + N * K // 128 * 4
        copies = max(1, min(16, -(-150_000_000 // one)))
        ws = []
        for _ in range(copies):
            qw = torch.randint(-2**31, 2**31 - 1, (N, pack.packed_words(K, b)), dtype=torch.int32, device=dev,
                               generator=g)
            s = torch.rand(N, K // 128, device=dev, generator=g).half() * 0.01
            ws.append(QWeight(N, K, b, qweight=qw, scales=s, mins=-s * 7, bias=torch.zeros(N, device=dev).half()))
        x = torch.randn(8, K, device=dev, generator=g).half()
        out = torch.zeros(8, N, device=dev, dtype=torch.float32 if epi in ("resid", "logits") else torch.float16)
        keys = torch.zeros(8, dtype=torch.int64, device=dev)
        for B in B_list:
            for impl in ("gemv",):
                t = graph_time([lambda w=w: kn.gemv(w, x, B, epi, out, keys) for w in ws] * max(1, 8 // copies))
                tiles = N // 32 if epi == "silu" else N // (16 * MT[epi])
                plan = kn.tuned(epi, N, K) or kn.gemv_plan(tiles, K // 128)
                rows.append({"kernel": f"{impl}_{name}", "bits": b, "N": N, "K": K, "B": B, "us": t * 1e6,
                             "GBps": one / t / 1e9, "plan_ksw_ksb_blocks": plan})
                log(f"  {impl:<5} {name:<8} w{b} B={B} N={N:<6} K={K:<5} {t * 1e6:7.1f} us {one / t / 1e9:7.0f} GB/s"
                    f"  plan {plan}")
        del ws
    h = torch.randn(8, c.hidden_size, device=dev)
    x = torch.zeros(8, c.hidden_size, device=dev, dtype=torch.float16)
    wt = torch.ones(c.hidden_size, device=dev)
    for B in B_list:
        t = graph_time([lambda: kn.rmsnorm(h, wt, 1e-6, B, x)] * 16)
        rows.append({"kernel": "rmsnorm", "B": B, "us": t * 1e6})
        log(f"  rmsnorm  B={B} {t * 1e6:7.1f} us")
    rows += time_attention(c, log, B_list=B_list)
    return rows


def time_attention(c, log, Ls=(64, 512, 4096), B_list=(1, 8), kn=None, nsplit=None, ctx=4096) -> list[dict]:
    """Attention launch times in a CUDA graph (8 launches per replay) and the K/V bytes they stream."""
    kn, dev = kn or DecodeKernels.get(), torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    kc = torch.randn(max(B_list), c.num_kv_heads, ctx, c.head_dim, device=dev, generator=g).half()
    vc = torch.randn_like(kc)
    qkv = torch.randn(8, c.q_size + 2 * c.kv_size, device=dev, generator=g).half()
    rope = Rotary(c.head_dim, ctx, c.rope_theta)
    cos, sin = rope.cos.to(dev), rope.sin.to(dev)
    ws = AttnWorkspace(8, c.num_heads, c.num_kv_heads, c.head_dim, dev, nsplit=nsplit)
    out = torch.zeros(8, c.q_size, device=dev, dtype=torch.float16)
    rows = []
    for L in Ls:
        for B in B_list:
            meta = torch.tensor([list(range(B)), [L - 1] * B], dtype=torch.int32, device=dev)
            t = graph_time([lambda: kn.attention(qkv, kc, vc, meta[0], meta[1], cos, sin, B, c.num_kv_heads,
                                                 c.num_heads // c.num_kv_heads, c.head_dim, ctx, out, ws)] * 8)
            kv = B * c.num_kv_heads * L * c.head_dim * 2 * 2
            rows.append({"kernel": "attention", "L": L, "B": B, "splits": ws.splits(B), "us": t * 1e6,
                         "kv_GBps": kv / t / 1e9})
            log(f"  attn     L={L:<5} B={B} splits={ws.splits(B):<3} {t * 1e6:7.1f} us  {kv / t / 1e9:6.0f} GB/s")
    return rows
