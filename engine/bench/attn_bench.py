"""Decode attention on the device: checks, variants and long-context timings (one `device` call).

    python -m engine.bench.attn_bench --out $OUT/gpu_attn_h200.json [--commit SHA] [--variants "split:-DATT_SHORT=0"]
        [--lens 64,512,4096] [--splits]

1. the kernel's registers / spills (the grid assumes one 256-thread block per SM);
2. attention vs its reference (kernels/checks.attention_checks) for the shipped kernel ("default") and
   each variant (NAME:-DDEFINE=V+-DDEFINE=V, compiled from decode_attn.cu; --splits: also split counts of half /
   twice the one-wave rule);
3. per-launch time in a CUDA graph at 64 .. 32k positions, batch 1 and 8, 3B and 7B shapes, with the K/V
   bytes streamed per second, beside torch's flash SDPA on the same cache (batch 1).
Prints a table; writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

from engine.bench.envinfo import module_command
from engine.config import QWEN25_SHAPES, ModelConfig
from kernels import checks as dc
from kernels.decode_kernels import DecodeKernels, attn_splits

LS = (64, 512, 4096, 16384, 32000)
CTX = 32768


def log(*a):
    print(*a, flush=True)


def regs(kn) -> dict:
    return {n: {k: getattr(f, a, None) for k, a in (("regs", "num_regs"), ("local_bytes", "local_size_bytes"),
                                                     ("smem", "shared_size_bytes"))}
            for n, f in kn.fn.items() if n.startswith("attn")}


def checks(kn) -> list[dict]:
    rows: list[dict] = []
    dc.attention_checks(kn, dc.recorder(rows, log), torch.Generator().manual_seed(7), torch.device("cuda"))
    return rows


def sdpa_time(c: ModelConfig, L: int) -> float:
    """torch flash attention for one decode query over L cached positions (GQA expanded by SDPA)."""
    dev = torch.device("cuda")
    q = torch.randn(1, c.num_heads, 1, c.head_dim, device=dev).half()
    k = torch.randn(1, c.num_kv_heads, L, c.head_dim, device=dev).half()
    v = torch.randn_like(k)
    f = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
    try:
        return dc.graph_time([f] * 8)
    except Exception as e:  # noqa: BLE001 - a missing backend is reported, not fatal
        log(f"  sdpa L={L}: {type(e).__name__}: {e}")
        return float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu_attn.json")
    ap.add_argument("--commit", default=os.environ.get("DEEPINFER_GIT_COMMIT", "unknown"))
    ap.add_argument("--variants", default="ch2:-DATT_CH=2")
    ap.add_argument("--lens", default=",".join(map(str, LS)))
    ap.add_argument("--splits", action="store_true", help="also time split counts of half / twice one wave")
    a = ap.parse_args(argv)
    lens = tuple(int(x) for x in a.lens.split(","))
    p = torch.cuda.get_device_properties(0)
    out: dict = {"env": {"device": p.name, "sms": p.multi_processor_count, "torch": torch.__version__,
                         "git_commit": a.commit, "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                         "command": module_command()}}

    def save():
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1, default=str)

    kn = DecodeKernels.get()
    variants = {"default": kn}
    for v in filter(None, a.variants.split(",")):
        name, _, defs = v.partition(":")
        variants[name] = DecodeKernels(0, tuple(defs.split("+")), ("decode_common.cu", "decode_attn.cu"))
    for name, k in variants.items():
        k.pdl = kn.pdl
        out.setdefault("regs", {})[name] = regs(k)
        log(f"== {name} registers {out['regs'][name]}")
        log(f"== {name} checks")
        out.setdefault("checks", {})[name] = checks(k)
        save()
    timing = out["timing"] = []
    for shape in ("3b", "7b"):
        c = ModelConfig(**QWEN25_SHAPES[shape])
        one_wave = attn_splits(kn.sms, c.num_kv_heads, 1)
        runs = [(name, k, None) for name, k in variants.items()]
        if a.splits:
            runs += [("default_2waves", kn, 2 * one_wave), ("default_halfwave", kn, max(1, one_wave // 2))]
        for name, k, nsplit in runs:
            log(f"== {shape} {name} (splits at B=1: {nsplit or one_wave})")
            for r in dc.time_attention(c, log, lens, (1, 8) if nsplit is None else (1,), kn=k, nsplit=nsplit,
                                       ctx=CTX):
                timing.append({"shape": shape, "variant": name, **r})
            save()
        for L in lens:
            t = sdpa_time(c, L)
            timing.append({"shape": shape, "variant": "torch_sdpa", "kernel": "sdpa", "L": L, "B": 1, "us": t * 1e6})
            log(f"  sdpa     L={L:<5} B=1 {t * 1e6:7.1f} us")
        save()
    log("| shape | variant | B | " + " | ".join(f"L={L}" for L in lens) + " |  (us per launch)")
    keys = sorted({(r["shape"], r["variant"], r["B"]) for r in timing}, key=str)
    for s, v, B in keys:
        us = {r["L"]: r["us"] for r in timing if (r["shape"], r["variant"], r["B"]) == (s, v, B)}
        log(f"| {s} | {v} | {B} | " + " | ".join(f"{us.get(L, float('nan')):.1f}" for L in lens) + " |")
    bad = [r for rows in out["checks"].values() for r in rows if not r["ok"]]
    log(f"== {len(bad)} attention checks failed; wrote {a.out}")
    save()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
