"""Models loaded one after another in one process (the tray's 3B -> 7B swap): does every prefill and
decode graph capture, and on which try? (The first 7B W4 prefill bucket after two 3B models failed its
capture once on the H200.)  python -m engine.bench.swap_capture --out $OUT/swap_capture.json"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from engine.model import graph_capture
from engine.config import QWEN25_SHAPES, ModelConfig
from engine.model.gpu_load import random_weights
from engine.model.gpu_model import GPUModel


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="swap_capture.json")
    a = ap.parse_args(argv)
    rows = []
    for shape, bits in [("3b", 4), ("3b", 3), ("7b", 4), ("7b", 3), ("3b", 4)]:
        n0 = len(graph_capture.failures)
        m = GPUModel(random_weights(ModelConfig(**QWEN25_SHAPES[shape]), bits, torch.device("cuda")), 8, 4096)
        prompt = list(range(1000, 1032))
        m.prefill(prompt, 0, 0)
        ids, _ = m.decode([prompt[-1]], [len(prompt)], [0])
        ids2, _ = m.decode([ids[0]], [len(prompt) + 1], [0])
        pg = m.prefill_graphs
        r = {"shape": shape, "bits": bits, "prefill_graphs": sorted(pg.graphs), "disabled": pg.disabled,
             "checks": pg.checks, "decode_graph": type(m.graphs[1]).__name__,
             "failed_tries": graph_capture.failures[n0:]}
        rows.append(r)
        print(json.dumps(r, default=str), flush=True)
        del m
        torch.cuda.empty_cache()
    with open(a.out, "w") as f:
        json.dump(rows, f, indent=1, default=str)
    ok = all(r["prefill_graphs"] and not r["disabled"] and r["decode_graph"] == "CUDAGraph" for r in rows)
    print("all graphs captured" if ok else "some graph did not capture", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
