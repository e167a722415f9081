"""Where a long-context chained step loses time against its graph's replay (device; #16's 16k ratio):

    python -m engine.bench.chain_gap --shape 3b --bits 4 --lens 64,16384 --out $OUT/chain_gap.json

The bench's 16k figure (decode_bench.long_context, chained) was 2.3% below the step's back-to-back replay at a
fixed position on an H100 (1.402 vs 1.370 ms; short contexts 1.109 vs 1.106). Per cached length L, ms per step:
  replay_fixed   the plain decode graph replayed 40 times at one position (decode_ab's figure)
Then per way a chain step's argmax keys reach the host (GPUModel.chain_keys: "copy" a device -> host copy queued
behind each chain graph, "kernel" the chain graph's own last kernel writes them to pinned memory; each mode's chain
graph captured afresh):
  replay_chain_M   the chain graph replayed 40 times back to back: positions and tokens advance on the GPU, no host
  replay_chain128_M  the same, 128 times (as long a run as decode_chain's: sustained-load clocks)
  chain_queued_M   the same with what decode_chain queues per step behind each replay (copy: the copy and an event;
                   kernel: the event), still without waiting; chain_queued_kernel+copy: the kernel's graph with the
                   copy as well (what the copy costs by itself)
  decode_chain_M   GPUModel.decode_chain over 128 steps (decode_bench.long_chain_tok_s: the bench's chained figure)
  host_fixed / host_advance   GPUModel.decode per step at one position / advancing (decode_bench.long_tok_s)
Measured first (chain_gap_h100.json, copy only): at 16k the copy and its event cost 11 us per 3B step on an H100
(1.385 ms replayed back to back, 1.396 queued with them), at 64 rows nothing measurable.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from engine.bench.decode_bench import env_info, log, long_chain_tok_s, long_tok_s, replay_seconds
from engine.config import QWEN25_SHAPES, ModelConfig
from engine.model.gpu_load import random_weights
from engine.model.gpu_model import GPUModel


def _events_ms(fn, n: int) -> float:
    """ms per call of fn(i), n calls back to back between two CUDA events (replay_seconds for any queued work)."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for i in range(n):
        fn(i)
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / n


def measure(m: GPUModel, L: int, n: int = 40) -> dict:
    out = {}
    m.decode([7], [L], [0])  # captures the plain graph of this context's mode
    torch.cuda.synchronize()
    out["replay_fixed"] = replay_seconds(m.decode_graph(1, L + 1), n) * 1e3
    own = m.chain_keys
    for mode in ("copy", "kernel"):  # how a chain step's keys reach the host (GPUModel.chain_keys)
        m.chain_keys = mode
        m.chain_graphs.clear()
        m.chain_graphs_m.clear()
        m.decode_chain([7], [L], [0], 2, lambda ids: True)  # captures the chain graph of this mode
        torch.cuda.synchronize()
        cg = (m.chain_graphs_m if m._merge(L + n + 1) else m.chain_graphs)[1]
        m.write_meta([7], [L], [0])
        out[f"replay_chain_{mode}"] = replay_seconds(cg, n) * 1e3
        m.write_meta([7], [L], [0])
        out[f"replay_chain128_{mode}"] = replay_seconds(cg, 128) * 1e3  # as long as decode_chain's run (clocks)
        m.write_meta([7], [L], [0])

        def queued(i, copy=mode == "copy"):
            cg.replay()
            m._queue_keys(i & 1, copy=copy)
        out[f"chain_queued_{mode}"] = _events_ms(queued, n)
        if mode == "kernel":  # the same graph with a copy behind it anyway: the copy's own cost
            m.write_meta([7], [L], [0])
            out["chain_queued_kernel+copy"] = _events_ms(lambda i: (cg.replay(), m._queue_keys(i & 1)), n)
        out[f"decode_chain_{mode}"] = 1e3 / long_chain_tok_s(m, L, 128)  # the bench's figure, as ms per step
    m.chain_keys = own  # the model's own mode again, its chain graphs captured anew when next needed
    m.chain_graphs.clear()
    m.chain_graphs_m.clear()
    m.decode([7], [L], [0])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(32):
        m.decode([7], [L + 1], [0])
    out["host_fixed"] = (time.perf_counter() - t0) / 32 * 1e3
    out["host_advance"] = 1e3 / long_tok_s(m, L, 32)  # the bench's host loop
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="3b")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--lens", default="64,16384")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    lens = [int(x) for x in a.lens.split(",")]
    cfg = ModelConfig(**QWEN25_SHAPES[a.shape])
    m = GPUModel(random_weights(cfg, a.bits, torch.device("cuda")), 1, max(lens) + 1024, "cuda")
    res = {str(L): [] for L in lens}
    for r in range(a.rounds):
        for L in lens:
            res[str(L)].append(measure(m, L))
    keys = list(res[str(lens[0])][0])
    log("| L | " + " | ".join(keys) + " |")
    log("|---" * (len(keys) + 1) + "|")
    med = {}
    for L in lens:
        med[str(L)] = {k: sorted(x[k] for x in res[str(L)])[len(res[str(L)]) // 2] for k in keys}
        log(f"| {L} | " + " | ".join(f"{med[str(L)][k]:.3f}" for k in keys) + " |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"env": env_info(a.commit), "shape": a.shape, "bits": a.bits, "unit": "ms per step",
                       "rounds": res, "median": med}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
