"""A step's GEMVs as ONE persistent launch against one PDL launch each (device; #16's persistent-kernel question).

    python -m engine.bench.persist_chain --shapes 3b,7b --out $OUT/persist_chain_h200.json

The chain is every layer's qkv, o, gate_up and down GEMV of a random W4 model of the shape at batch 1, on the step's
own buffers (no attention, no norms: their inputs are whatever the buffers hold, the same in both runs), with the
plans the step uses. "pdl": the 4 x layers launches captured in a CUDA graph, as the decode step launches them;
"persist": kernels/decode_persist.cu gemv_chain_w4 runs the same GEMVs (same kernels' bodies, same plans, virtual
blocks round robin) in one launch with a grid-wide barrier where the graph has a kernel boundary, at 1 and 2
blocks per SM. Both start from the same residual h; their outputs (h, qkv, act) must be equal bit for bit. ms per
chain (graph replay, the h restore included in both).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch

KINDS = {"store": 0, "resid": 1, "silu": 2, "store_mt2": 3, "resid_mt2": 4}


def op_row(call) -> list[int]:
    """DecodeKernels.gemv_call's (name, grid, block, args) of a W4 GEMV -> the persistent kernel's 16 int64."""
    name, grid, _, a = call
    assert name.startswith("gemv_w4_"), f"the persistent chain holds W4 bodies only, not {name}"
    v = [0 if x is None else int(x) for x in a]
    qw, sc, mn, bias, x, N, K, B, ksw, ts, oh, of = v[:12]
    return [qw, sc, mn, bias, x, oh, of, N, K, B, ksw, ts, KINDS[name[len("gemv_w4_"):]], grid[0], grid[1], 0]


def chain_calls(m, B: int = 1):
    """[(op name, gemv_call args)] of the step's four GEMVs per layer, in order."""
    out = []
    for L in m.w.layers:
        out += [("qkv", (L.qkv, m.x, B, "store", m.qkv)), ("o", (L.o, m.attn, B, "resid", m.h)),
                ("gate_up", (L.gate_up, m.x, B, "silu", m.act)), ("down", (L.down, m.act, B, "resid", m.h))]
    return out


def run_shape(shape: str, reps: int) -> dict:
    from engine.bench.decode_bench import scheme_weights
    from engine.bench.tree_profile import replay_ms
    from engine.config import QWEN25_SHAPES, ModelConfig
    from engine.model.gpu_model import GPUModel
    from engine.model.graph_capture import capture
    cfg = ModelConfig(**QWEN25_SHAPES[shape])
    w = scheme_weights(cfg, 4, torch.device("cuda"))
    m = GPUModel(w, 1, 512, "cuda")
    m.decode([1], [0], [0])  # buffers and kernels ready
    kn = m.kn
    gen = torch.Generator(device="cuda").manual_seed(0)
    for t in (m.x, m.attn):
        t.copy_((torch.rand(t.shape, generator=gen, device="cuda") - 0.5).to(t.dtype))
    h0 = (torch.rand(m.h.shape, generator=gen, device="cuda") - 0.5).float()
    calls = chain_calls(m)
    ops = torch.tensor([op_row(kn.gemv_call(*c)) for _, c in calls], dtype=torch.int64, device="cuda")
    bar = torch.zeros(1, dtype=torch.int32, device="cuda")
    fn = kn.module.get_function("gemv_chain_w4")
    from cupy.cuda import driver
    occ = driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, 256, 0)
    row = {"ops": len(calls), "occupancy_blocks_per_sm": occ, "sms": kn.sms,
           "bytes": sum(c[0].nbytes() for _, c in calls)}

    def pdl():
        m.h.copy_(h0)
        for _, c in calls:
            kn.gemv(*c)

    def persist(per_sm, wait=True):
        def run():
            m.h.copy_(h0)
            bar.zero_()
            kn._launch("gemv_chain_w4", (kn.sms * per_sm,), (256,),
                       (np.uint64(ops.data_ptr()), np.int32(len(calls)), np.uint64(bar.data_ptr() if wait else 0),
                        np.uint64(kn.ws.data_ptr()), np.uint64(kn.cnt.data_ptr())), pdl=False)
        return run

    def outputs():
        torch.cuda.synchronize()
        return [t.clone() for t in (m.h, m.qkv, m.act)]

    kn.fn.setdefault("gemv_chain_w4", fn)
    variants = [("pdl", pdl)] + [(f"persist_{k}", persist(k)) for k in (1, 2) if k <= occ]
    # no barrier at all (racy values, not compared): what the persistent form costs without its waits
    variants += [(f"persist_{k}_nowait", persist(k, False)) for k in (1, 2) if k <= occ]
    ref = None
    for name, run in variants:
        run()
        got = outputs()
        if ref is None:
            ref = got
        if not name.endswith("_nowait"):
            row[f"{name}_equal"] = all(torch.equal(a, b) for a, b in zip(ref, got))
        g, _ = capture(run, torch.cuda.graph_pool_handle())
        g.replay()
        if not name.endswith("_nowait"):
            row[f"{name}_equal_graph"] = all(torch.equal(a, b) for a, b in zip(ref, outputs()))
        row[f"{name}_ms"] = round(min(replay_ms(g.replay, 20) for _ in range(reps)), 4)
        row[f"{name}_gb_s"] = round(row["bytes"] / row[f"{name}_ms"] / 1e6, 1)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="3b,7b")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="persist_chain.json")
    ap.add_argument("--commit", default="unknown")
    a = ap.parse_args(argv)
    os.environ["DEEPINFER_KERNEL_DEFINES"] = (os.environ.get("DEEPINFER_KERNEL_DEFINES", "") +
                                              " -DGEMV_PERSIST=1").strip()
    from engine.bench.decode_ab import run_header
    res = run_header("engine.bench.persist_chain", argv, a.commit, __doc__.split("\n\n")[1].replace("\n", " "))
    res["defines"] = os.environ["DEEPINFER_KERNEL_DEFINES"]
    res["shapes"] = {}
    print("| shape | ops | pdl ms | persist 1/SM ms | persist 2/SM ms | no wait 1/SM | no wait 2/SM | equal |")
    for s in a.shapes.split(","):
        r = res["shapes"][s] = run_shape(s, a.reps)
        torch.cuda.empty_cache()
        eq = all(v for k, v in r.items() if k.endswith("_equal") or k.endswith("_equal_graph"))
        print(f"| {s} | {r['ops']} | {r['pdl_ms']} | {r.get('persist_1_ms', '-')} | {r.get('persist_2_ms', '-')} | "
              f"{r.get('persist_1_nowait_ms', '-')} | {r.get('persist_2_nowait_ms', '-')} | {eq} |", flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
