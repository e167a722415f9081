"""Do the decode GEMVs run faster when their weights are already in L2? (device; #16)

    python -m engine.bench.l2_hot --shapes 3b:4,7b:4 --out $OUT/l2_hot_h200.json

Per op (qkv, o, gate_up, down) a graph of one launch per layer at batch 1, replayed: "cold" launches each layer's own
weights in turn (the step's case: nothing of them is in L2 when a launch starts, the model's weights being far larger
than the L2), "hot" launches layer 0's weights every time (after the first launch they sit in L2 when they fit).
us per launch. If hot is much faster than cold, weights brought into L2 while DRAM idles (a prefetch) can pay; if
not, the GEMVs' own pipelines limit them (measured: not, docs/gpu.md "What would close the gap").
"""
from __future__ import annotations

import argparse
import sys

import torch

from engine.bench.decode_ab import run_header
from engine.bench.decode_bench import scheme_weights
from engine.bench.envinfo import emit_json
from engine.bench.tree_profile import launch_us, layer_gemvs
from engine.config import QWEN25_SHAPES, ModelConfig
from engine.model.gpu_model import GPUModel


def hot_cold(m) -> dict[str, dict[str, float]]:
    """{op: {"cold_us", "hot_us", "bytes", "cold_gb_s", "hot_gb_s"}} at batch 1."""
    w = m.w
    out = {}
    n = len(w.layers)
    for name, op in layer_gemvs(m).items():
        row = {"bytes": getattr(w.layers[0], name).nbytes()}
        for kind, layers in (("cold", w.layers), ("hot", [w.layers[0]] * n)):
            def run(layers=layers, op=op):
                for L in layers:
                    op(L, 1)
            us = launch_us(m, run, n)
            row[f"{kind}_us"] = us
            row[f"{kind}_gb_s"] = row["bytes"] / us / 1e3
        out[name] = row
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="3b:4,7b:4")
    ap.add_argument("--out", default="l2_hot.json")
    ap.add_argument("--commit", default="unknown")
    a = ap.parse_args(argv)
    res = run_header("engine.bench.l2_hot", argv, a.commit,
                     "per op a graph of one batch-1 launch per layer, replayed 50 times: each layer's weights (cold) "
                     "or layer 0's every time (hot, L2-resident when they fit); us per launch")
    res["l2_bytes"] = torch.cuda.get_device_properties(0).L2_cache_size
    res["shapes"] = {}
    print("| shape | op | MB | cold us (GB/s) | hot us (GB/s) | hot / cold |")
    for sb in a.shapes.split(","):
        shape, bits = sb.split(":")
        cfg = ModelConfig(**QWEN25_SHAPES[shape])
        w = scheme_weights(cfg, bits, torch.device("cuda"))
        m = GPUModel(w, 1, 512, "cuda")
        m.decode([1], [0], [0])  # the step's buffers and kernels ready
        r = res["shapes"][sb] = hot_cold(m)
        for op, x in r.items():
            print(f"| {sb} | {op} | {x['bytes'] / 1e6:.1f} | {x['cold_us']:.2f} ({x['cold_gb_s']:.0f}) | "
                  f"{x['hot_us']:.2f} ({x['hot_gb_s']:.0f}) | {x['hot_us'] / x['cold_us']:.2f} |", flush=True)
        del m, w
        torch.cuda.empty_cache()
    emit_json(res, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
