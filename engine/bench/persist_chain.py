"""One linear of every layer as ONE persistent launch against one PDL launch each (device; #16's persistent-kernel
question, asked of the real GEMV bodies).

    python -m engine.bench.persist_chain --shapes 3b,7b --out $OUT/persist_chain_h200.json

Per linear (qkv, o, gate_up, down) of a random W4 model of the shape at batch 1, on the step's own buffers (inputs
whatever they hold, the same in every run) and with the step's plans: "pdl", that linear's launches for every layer
in a CUDA graph (each waits for the one before, as the step's kernels do); "persist_1" / "persist_2",
kernels/decode_persist.cu gemv_chain_w4_<kind> runs the same bodies in one launch of 1 or 2 blocks per SM (virtual
blocks round robin, a grid-wide barrier where the graph has a kernel boundary, each block's first weights of the
next op loaded before it waits, as under PDL); "*_nowait" the same without the barrier (values racy, not compared:
what the persistent form costs by itself). Outputs (h, qkv, act) of pdl and persist must be equal bit for bit.
us per op (graph replay / layers; the h restore included in every variant).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

from engine.bench.envinfo import emit_json

KINDS = {"store": 0, "resid": 1, "silu": 2, "store_mt2": 3, "resid_mt2": 4}
CHAINS = {"store", "resid", "silu", "resid_mt2"}  # the kinds decode_persist.cu has a chain kernel for


def op_row(call) -> list[int]:
    """DecodeKernels.gemv_call's (name, grid, block, args) of a W4 GEMV -> the persistent kernel's 16 int64."""
    name, grid, _, a = call
    assert name.startswith("gemv_w4_"), f"the persistent chain holds W4 bodies only, not {name}"
    v = [0 if x is None else int(x) for x in a]
    qw, sc, mn, bias, x, N, K, B, ksw, ts, oh, of = v[:12]
    return [qw, sc, mn, bias, x, oh, of, N, K, B, ksw, ts, KINDS[name[len("gemv_w4_"):]], grid[0], grid[1], 0]


def layer_calls(m, B: int = 1) -> dict[str, list[tuple]]:
    """{linear: [gemv args of every layer]} of the step's four GEMVs, on the step's buffers (tree_profile's)."""
    from engine.bench.tree_profile import layer_gemv_args
    per_layer = [layer_gemv_args(m, L, B) for L in m.w.layers]
    return {name: [a[name] for a in per_layer] for name in per_layer[0]}


def run_shape(shape: str, reps: int) -> dict:
    """{linear: timings and checks} for one shape (see the module's text)."""
    from cupy.cuda import driver

    from engine.bench.decode_ab import ensure_define
    from engine.bench.decode_bench import scheme_weights
    from engine.bench.tree_profile import replay_ms
    from engine.config import QWEN25_SHAPES, ModelConfig
    from engine.model.gpu_model import GPUModel
    from engine.model.graph_capture import capture
    ensure_define("-DGEMV_PERSIST=1")  # the module of the model built below holds the chain kernels
    cfg = ModelConfig(**QWEN25_SHAPES[shape])
    w = scheme_weights(cfg, 4, torch.device("cuda"))
    m = GPUModel(w, 1, 512, "cuda")
    m.decode([1], [0], [0])  # buffers and kernels ready
    kn = m.kn
    gen = torch.Generator(device="cuda").manual_seed(0)
    for t in (m.x, m.attn, m.act):
        t.copy_((torch.rand(t.shape, generator=gen, device="cuda") - 0.5).to(t.dtype))
    h0 = (torch.rand(m.h.shape, generator=gen, device="cuda") - 0.5).float()
    bar = torch.zeros(1, dtype=torch.int32, device="cuda")
    table = kn.module.get_global("persist_ops")
    out = {}
    for lin, calls in layer_calls(m).items():
        rows = [op_row(kn.gemv_call(*c)) for c in calls]
        kind = {v: k for k, v in KINDS.items()}[rows[0][12]]
        plan = {"ksw": rows[0][10], "blocks": rows[0][13], "ksb": rows[0][14]}
        row = out[lin] = {"ops": len(rows), "kind": kind, "plan": plan, "bytes": sum(c[0].nbytes() for c in calls)}
        if kind not in CHAINS:
            continue
        arr = np.asarray(rows, dtype=np.int64)
        table.copy_from_host(arr.ctypes.data, arr.nbytes)
        name = f"gemv_chain_w4_{kind}"
        kn.fn.setdefault(name, kn.module.get_function(name))
        occ = driver.occupancyMaxActiveBlocksPerMultiprocessor(kn.fn[name].kernel.ptr, 256, 0)
        row["occupancy_blocks_per_sm"] = occ

        def pdl():
            m.h.copy_(h0)
            for c in calls:
                kn.gemv(*c)

        def persist(per_sm, wait=True):
            def run():
                m.h.copy_(h0)
                bar.zero_()
                kn._launch(name, (kn.sms * per_sm,), (256,),
                           (np.int32(len(rows)), np.uint64(bar.data_ptr() if wait else 0),
                            np.uint64(kn.ws.data_ptr()), np.uint64(kn.cnt.data_ptr())), pdl=False)
            return run

        def outputs():
            torch.cuda.synchronize()
            return [t.clone() for t in (m.h, m.qkv, m.act)]

        variants = [("pdl", pdl)] + [(f"persist_{k}", persist(k)) for k in (1, 2) if k <= occ]
        variants += [(f"persist_{k}_nowait", persist(k, False)) for k in (1, 2) if k <= occ]
        ref = None
        for vname, run in variants:
            run()
            got = outputs()
            if ref is None:
                ref = got
            check = not vname.endswith("_nowait")
            if check:
                row[f"{vname}_equal"] = all(torch.equal(a, b) for a, b in zip(ref, got))
            g, _ = capture(run, torch.cuda.graph_pool_handle())
            g.replay()
            if check:
                row[f"{vname}_equal_graph"] = all(torch.equal(a, b) for a, b in zip(ref, outputs()))
            row[f"{vname}_us"] = round(min(replay_ms(g.replay, 20) for _ in range(reps)) * 1e3 / len(rows), 3)
            row[f"{vname}_gb_s"] = round(row["bytes"] / len(rows) / row[f"{vname}_us"] / 1e3, 1)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="3b,7b")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="persist_chain.json")
    ap.add_argument("--commit", default="unknown")
    a = ap.parse_args(argv)
    from engine.bench.decode_ab import ensure_define, run_header
    ensure_define("-DGEMV_PERSIST=1")
    res = run_header("engine.bench.persist_chain", argv, a.commit, __doc__.split("\n\n")[2].replace("\n", " "))
    res["defines"] = os.environ["DEEPINFER_KERNEL_DEFINES"]
    res["shapes"] = {}
    print("| shape | linear | pdl us | persist 1/SM | persist 2/SM | no wait 1/SM | no wait 2/SM | equal |")
    for s in a.shapes.split(","):
        res["shapes"][s] = run_shape(s, a.reps)
        for lin, r in res["shapes"][s].items():
            eq = all(v for k, v in r.items() if k.endswith("_equal") or k.endswith("_equal_graph"))
            print(f"| {s} | {lin} | {r.get('pdl_us', '-')} | {r.get('persist_1_us', '-')} | "
                  f"{r.get('persist_2_us', '-')} | {r.get('persist_1_nowait_us', '-')} | "
                  f"{r.get('persist_2_nowait_us', '-')} | {eq} |", flush=True)
        torch.cuda.empty_cache()
    emit_json(res, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
