"""The GGUF-layout decode kernels ((bits, group) = (4, 32), (8, 32), (8, 16): exact repacks of Q4_K, Q5_K /
Q8_0 and Q6_K; (6, 32), (6, 16): the 6-bit repacks; the KQ forms (4, 32) / (6, 32) / (6, 16) with the K-quants'
integer sub-scales; the SYM forms (4, 32) / (6, 32) / (8, 32) of Q4_0 / Q5_0 / Q8_0) against a float32 reference, and their timings next to our W4 g128 on one model's shapes.

Device: `python -m kernels.checks_gguf --out $OUT/gpu_gguf_kernels_h200.json [--shapes 3b]` prints a table and
writes the JSON (checks + us per launch inside a CUDA graph, weights rotated over > 150 MB so L2 does not help).
tests/test_gpu_decode.py asserts the checks.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from kernels import pack
from kernels.checks import graph_time, recorder
from kernels.decode_kernels import FORM_TAG, GGUF_LAYOUTS, KQ_LAYOUTS, SYM_LAYOUTS, DecodeKernels, keys_to_ids
from kernels.qweight import QWeight

# Qwen2.5 shapes (hidden, q heads x hd, kv heads x hd, ffn, vocab): kernels/ imports nothing from engine/
SHAPES = {"0.5b": (896, 896, 128, 4864, 151936), "3b": (2048, 2048, 256, 11008, 151936),
          "7b": (3584, 3584, 512, 18944, 152064), "14b": (5120, 5120, 1024, 13824, 152064)}


def rand_layout(N: int, K: int, bits: int, group: int, gen, dev, bias: bool = False, form: str = ""):
    """A random weight in a GGUF layout (form "kq" / "sym": its KQ / SYM form, kernels/pack.py; QWeight.form) and
    its float32 dequantization (the reference)."""
    q = torch.randint(0, 1 << bits, (N, K), dtype=torch.uint8, generator=gen)
    if form == "sym":  # one fp16 scale per 32, min -2^(bits-1) s: made by the readers
        s = (0.02 * (1 + torch.rand(N, K // group, generator=gen)) / 2.0 ** (bits - 4)).half()
        wf = ((q.float() - 2 ** (bits - 1)).reshape(N, K // group, group) * s.float()[..., None]).reshape(N, K)
        b = (torch.randn(N, generator=gen) * 0.1).half().to(dev) if bias else None
        w = QWeight(N, K, bits, qweight=pack.pack(q, bits).to(dev), scales=s.to(dev),
                    mins=torch.empty(N, 0, dtype=torch.float16, device=dev), bias=b, group=group, form="sym")
        return w, wf.to(dev)
    if form == "kq":  # integer sub-scales as the K-quants store them, fp16 factors per 256: w ~ 0.02 like the plain layouts
        d = 0.02 / 32 / 2.0 ** (bits - 4) * (1 + torch.rand(N, K // 256, generator=gen))
        if group == 32:
            sub = torch.randint(1, 64, (N, K // 32, 2), dtype=torch.uint8, generator=gen)
            sup = torch.stack([d, d * 7.5], -1).half()  # -dmin m ~ -7.5 s (m ~ 32): codes centred
        else:
            sub = torch.randint(-63, 64, (N, K // 16), dtype=torch.int8, generator=gen)
            sup = d.half()
        s, m = pack.kq_expand(group, sub, sup)
        wf = (q.float().reshape(N, K // group, group) * s.float()[..., None] + m.float()[..., None]).reshape(N, K)
        b = (torch.randn(N, generator=gen) * 0.1).half().to(dev) if bias else None
        w = QWeight(N, K, bits, qweight=pack.pack(q, bits).to(dev), scales=sub.to(dev), mins=sup.to(dev), bias=b,
                    group=group, form="kq")
        return w, wf.to(dev)
    s = (0.02 * (1 + torch.rand(N, K // group, generator=gen)) / 2.0 ** (bits - 4)).half()
    m = (-(2 ** bits - 1) / 2 * s.float() + 0.01 * torch.randn(N, K // group, generator=gen)).half()
    wf = (q.float().reshape(N, K // group, group) * s.float()[..., None] + m.float()[..., None]).reshape(N, K)
    b = (torch.randn(N, generator=gen) * 0.1).half().to(dev) if bias else None
    w = QWeight(N, K, bits, qweight=pack.pack(q, bits).to(dev), scales=s.to(dev), mins=m.to(dev), bias=b, group=group)
    return w, wf.to(dev)


def check(log, kn: DecodeKernels | None = None) -> list[dict]:
    kn, dev = kn or DecodeKernels.get(), torch.device("cuda")
    gen = torch.Generator().manual_seed(7)
    rows: list[dict] = []
    rec = recorder(rows, log)
    forms = [(b, g, "") for b, g in GGUF_LAYOUTS] + [(b, g, "kq") for b, g in KQ_LAYOUTS] + \
        [(b, g, "sym") for b, g in SYM_LAYOUTS]
    for bits, group, form in forms:
        tag = f"w{bits}{FORM_TAG[form]}{group}"
        kq = form == "kq"
        for N, K in [(1152, 896), (2560, 2048), (2048, 11008)]:
            if kq and K % 256:  # KQ: super-blocks of 256
                continue
            w, wf = rand_layout(N, K, bits, group, gen, dev, bias=True, form=form)
            for B in (1, 3, 8):
                x = torch.zeros(8, K, dtype=torch.float16, device=dev)
                x[:B] = torch.randn(B, K, generator=gen).half().to(dev)
                r = x[:B].float() @ wf.T
                for mt in (1, 2):
                    y = torch.full((B, N), float("nan"), dtype=torch.float16, device=dev)
                    kn.gemv(w, x, B, "store", y, plan=None if mt == 1 else (1, 1), mt=mt)
                    rec(f"{tag}_store_mt{mt}", (B, N, K), _err(y, r + w.bias.float()))
                h0 = torch.randn(8, N, generator=gen).to(dev)
                h = h0.clone()
                kn.gemv(w, x, B, "resid", h)
                rec(f"{tag}_resid", (B, N, K), _err(h[:B] - h0[:B], r), {"untouched_rows_ok": bool((h[B:] == h0[B:]).all())})
        for F2, K in [(2 * 4864, 896), (2 * 11008, 2048)]:
            if kq and K % 256:
                continue
            w, wf = rand_layout(F2, K, bits, group, gen, dev, form=form)
            for B in (1, 5):
                x = torch.zeros(8, K, dtype=torch.float16, device=dev)
                x[:B] = torch.randn(B, K, generator=gen).half().to(dev)
                gu = x[:B].float() @ wf.T
                r = torch.nn.functional.silu(gu[:, : F2 // 2]) * gu[:, F2 // 2:]
                y = torch.full((B, F2 // 2), float("nan"), dtype=torch.float16, device=dev)
                kn.gemv(w, x, B, "silu", y)
                rec(f"{tag}_silu", (B, F2, K), _err(y, r))
        # the lm_head at the 0.5B's K (gemv_plan's grid) and at the 3B's (DecodeKernels.tuned's (4, 1, 2) since the
        # thirty-fourth session: 4 warps along K before the argmax keys); KQ: super-blocks of 256, K = 2048 only
        for V, K in ([(151936, 896)] if not kq else []) + [(65536, 2048)]:
            w, wf = rand_layout(V, K, bits, group, gen, dev, form=form)
            for B in (1, 4):
                x = torch.zeros(8, K, dtype=torch.float16, device=dev)
                x[:B] = torch.randn(B, K, generator=gen).half().to(dev)
                r = x[:B].float() @ wf.T
                lg = torch.zeros(8, V, device=dev)
                keys = torch.zeros(8, dtype=torch.int64, device=dev)
                kn.gemv(w, x, B, "logits", lg, keys)
                ids = keys_to_ids(keys[:B].cpu().numpy())
                rec(f"{tag}_logits", (B, V, K), _err(lg[:B], r),
                    {"argmax_ok": ids == lg[:B].argmax(-1).tolist(), "argmax_vs_ref_top2": all(
                        i in r[b].topk(2).indices.tolist() for b, i in enumerate(ids))})
                tokens = torch.tensor([3, V - 1, 77, 1000][:B] + [0] * (8 - B), dtype=torch.int32, device=dev)
                h = torch.zeros(8, K, device=dev)
                kn.embed(tokens, w, B, h, keys)
                rec(f"{tag}_embed", (B, K), _err(h[:B], wf[tokens[:B].long()]), {"keys_cleared": bool((keys[:B] == 0).all())})
    return rows


def _err(got: torch.Tensor, ref: torch.Tensor) -> float:
    got = got.float()
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got - ref).norm() / ref.norm().clamp_min(1e-12))


def time_layouts(shape: str, log, B_list=(1, 8), kn: DecodeKernels | None = None,
                 layouts=((4, 128),) + GGUF_LAYOUTS) -> list[dict]:
    """us per launch of each linear of a model shape in every layout (and W4 g128 for comparison)."""
    kn, dev = kn or DecodeKernels.get(), torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    D, Q, KV, F, V = SHAPES[shape]
    lins = {"qkv": (Q + 2 * KV, D, "store"), "o": (D, Q, "resid"), "gate_up": (2 * F, D, "silu"),
            "down": (D, F, "resid"), "lm_head": (V, D, "logits")}
    rows = []
    for bits, group in layouts:
        for name, (N, K, epi) in lins.items():
            w0, _ = rand_layout(N, K, bits, group, gen, dev, bias=(epi == "store"))
            one = w0.nbytes()
            copies = max(1, min(16, -(-150_000_000 // one)))
            ws = [w0] + [rand_layout(N, K, bits, group, gen, dev, bias=(epi == "store"))[0] for _ in range(copies - 1)]
            x = torch.randn(8, K, device=dev).half()
            out = torch.zeros(8, N, device=dev, dtype=torch.float32 if epi in ("resid", "logits") else torch.float16)
            keys = torch.zeros(8, dtype=torch.int64, device=dev)
            for B in B_list:
                t = graph_time([lambda w=w: kn.gemv(w, x, B, epi, out, keys) for w in ws] * max(1, 8 // copies))
                rows.append({"layout": f"w{bits}g{group}", "linear": name, "N": N, "K": K, "B": B, "us": t * 1e6,
                             "bytes": one, "GBps": one / t / 1e9})
                log(f"  w{bits}g{group:<3} {name:<8} B={B} {t * 1e6:7.1f} us {one / t / 1e9:7.0f} GB/s ({one / 1e6:.1f} MB)")
            del ws
            torch.cuda.empty_cache()
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--shapes", default="3b")
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--variants", default=None, help="GEMV pipeline variants to time, ';'-separated sets of "
                    "decode_gemv.cu defines, e.g. 'default;GEMV_NST1=3;GEMV_NST2=3,GEMV_MINB2=1' (3B shape, "
                    "layouts w4 w3 w4g32 w8g16; each variant also runs the GGUF checks)")
    a = ap.parse_args(argv)
    log = lambda s: print(s, flush=True)  # noqa: E731
    res = {"device": torch.cuda.get_device_name(0), "checks": check(log)}
    bad = [r for r in res["checks"] if not r["ok"]]
    log(f"checks: {len(res['checks']) - len(bad)} ok, {len(bad)} bad")
    if a.variants:
        res["variants"] = {}
        for v in a.variants.split(";"):
            defs = tuple(f"-D{d}" for d in v.split(",") if d and d != "default")
            kn = DecodeKernels(0, defs)
            rows = check(lambda *_: None, kn)
            nbad = sum(not r["ok"] for r in rows)
            log(f"variant {v}: checks {len(rows) - nbad} ok, {nbad} bad")
            res["variants"][v] = {"checks_bad": nbad, "timings": time_layouts(
                "3b", log, kn=kn, layouts=((4, 128), (3, 128), (4, 32), (8, 16)))}
            bad += [r for r in rows if not r["ok"]]
    elif not a.skip_timing:
        res["timings"] = {s: time_layouts(s, log) for s in a.shapes.split(",")}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
