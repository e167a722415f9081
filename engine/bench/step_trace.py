"""Where a decode step's time goes inside the step (device): the batch-1 decode graph replayed under torch.profiler
(CUPTI reports each kernel of a graph replay) and each kernel's END minus the previous kernel's end taken as what it
adds to the step. With programmatic dependent launch a kernel starts before its predecessor ends and waits inside,
so its own duration overstates its share; the end-to-end differences add up to the step exactly. Per kind (qkv,
attention, o, gate_up, down, lm_head, ...): launches per step, us added per launch and per step, the kernel's own
duration, and the bytes it reads over the time it adds (its weights: achieved bandwidth per phase).
Kernels timed alone (decode_bench `timing`, kernels/checks.py time_kernels) overlap copies of themselves instead.

    python -m engine.bench.step_trace --shapes 3b:4,7b:4,7b:3 --out $OUT/step_trace_h200.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

import torch

from engine.config import QWEN25_SHAPES, ModelConfig
from engine.bench.decode_ab import run_header
from engine.bench.decode_bench import scheme_weights

ORDER = ("embed", "qkv", "attention", "merge", "o", "gate_up", "down", "norm", "lm_head", "other")


def label_kernels(names: list[str]) -> list[str]:
    """Kernel names of one step, in order -> kinds. A layer runs store (qkv), attention, resid (o), silu (gate_up),
    resid (down); the step ends with the final rmsnorm and the logits GEMV (docs/gpu.md, "The decode step")."""
    out: list[str] = []
    for n in names:
        if n.startswith("embed"):
            k = "embed"
        elif n.startswith("attn_merge"):
            k = "merge"
        elif n.startswith("attn"):
            k = "attention"
        elif n.startswith("gemv") and "logits" in n:
            k = "lm_head"
        elif n.startswith("gemv") and "silu" in n:
            k = "gate_up"
        elif n.startswith("gemv") and "resid" in n:
            k = "o" if out and out[-1] in ("attention", "merge") else "down"
        elif n.startswith("gemv") and "store" in n:
            k = "qkv"
        elif "norm" in n:
            k = "norm"
        else:
            k = "other"
        out.append(k)
    return out


def split_steps(kernels: list[dict]) -> list[list[dict]]:
    """Kernel events sorted by start -> one list per step (each step starts with its embedding kernel)."""
    steps: list[list[dict]] = []
    for e in kernels:
        if e["name"].startswith("embed") or not steps:
            steps.append([])
        steps[-1].append(e)
    return steps[1:-1] if len(steps) > 2 else steps  # drop the edges (a replay cut by the profiler's window)


def attribute(steps: list[list[dict]]) -> dict:
    """Per kind: launches per step, us added per step / per launch (end - previous end), own duration per launch;
    the step's span (first start to last end) and the sum of the added times (= the span)."""
    per: dict[str, dict[str, list[float]]] = {}
    spans = []
    for st in steps:
        kinds = label_kernels([e["name"] for e in st])
        spans.append(st[-1]["end"] - st[0]["ts"])
        prev_end = st[0]["ts"]
        acc: dict[str, list[float]] = {}
        for e, k in zip(st, kinds):
            a = acc.setdefault(k, [0.0, 0.0, 0.0])
            a[0] += 1
            a[1] += e["end"] - prev_end
            a[2] += e["end"] - e["ts"]
            prev_end = e["end"]
        for k, (n, add, dur) in acc.items():
            d = per.setdefault(k, {"n": [], "add": [], "dur": []})
            d["n"].append(n)
            d["add"].append(add)
            d["dur"].append(dur)
    med = statistics.median
    rows = {}
    for k in sorted(per, key=lambda k: ORDER.index(k) if k in ORDER else len(ORDER)):
        n, add, dur = med(per[k]["n"]), med(per[k]["add"]), med(per[k]["dur"])
        rows[k] = {"launches_per_step": n, "added_us_per_step": add, "added_us_per_launch": add / n,
                   "own_us_per_launch": dur / n}
    return {"steps": len(steps), "step_span_us": med(spans), "kinds": rows}


def kind_bytes(m) -> dict[str, float]:
    """Weight bytes each kind reads per step (all layers; the embedding reads one row)."""
    L = m.w.layers
    b = {k: float(sum(getattr(l, k).nbytes() for l in L)) for k in ("qkv", "o", "gate_up", "down")}
    b["lm_head"] = float(m.w.lm_head.nbytes())
    return b


def trace_shape(shape: str, bits, replays: int, L: int, log) -> dict:
    from engine.model.gpu_model import GPUModel

    cfg = ModelConfig(**QWEN25_SHAPES[shape])
    m = GPUModel(scheme_weights(cfg, bits, torch.device("cuda")), 8, max(4096, L + 256), "cuda")
    for i in range(3):  # first call runs eagerly and captures; then replays
        m.decode([1000 + i], [L - 1 + i], [0])
    g = m.decode_graph(1, L + 2)
    for _ in range(10):
        g.replay()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            g.replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            ev = json.load(f)["traceEvents"]
    ks = sorted(({"name": e["name"], "ts": float(e["ts"]), "end": float(e["ts"]) + float(e["dur"])}
                 for e in ev if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    res = {"shape": shape, "bits": bits, "cached_rows": L, "kernel_events": len(ks),
           "kernel_names": sorted({e["name"] for e in ks})}
    if not any(e["name"].startswith("embed") for e in ks):
        log(f"  {shape}:{bits}: no per-kernel events inside the graph replays ({len(ks)} kernel events)")
        return res
    res.update(attribute(split_steps(ks)))
    by = kind_bytes(m)
    span = res["step_span_us"]
    log(f"  {shape} w{bits} L={L}: step span {span:.1f} us over {res['steps']} steps")
    log("  | kind | launches | us added / step | us added / launch | own us / launch | weight GB/s over added |")
    for k, r in res["kinds"].items():
        if k in by:
            r["weight_bytes_per_step"] = by[k]
            r["GBps_over_added"] = by[k] / (r["added_us_per_step"] * 1e-6) / 1e9
        gb = f"{r['GBps_over_added']:.0f}" if "GBps_over_added" in r else "-"
        log(f"  | {k} | {r['launches_per_step']:.0f} | {r['added_us_per_step']:.1f} | "
            f"{r['added_us_per_launch']:.2f} | {r['own_us_per_launch']:.2f} | {gb} |")
    del m, g
    torch.cuda.empty_cache()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="3b:4,7b:4,7b:3", help="shape:bits list (bits 4 | 3 | mixed | w3-<linears>)")
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--cached", type=int, default=64, help="tokens in the cache (attention length)")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    log = lambda *x: print(*x, flush=True)  # noqa: E731
    out = run_header("engine.bench.step_trace", argv, a.commit,
                     "batch-1 decode graph replayed under torch.profiler (CUDA activities); per step, each kernel's "
                     "end minus the previous kernel's end (the first: its own span); medians over steps")
    out["shapes"] = []
    for sb in a.shapes.split(","):
        shape, bits = sb.split(":")
        out["shapes"].append(trace_shape(shape, bits, a.replays, a.cached, log))
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
