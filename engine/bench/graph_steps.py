"""What the CUDA-graph boundary between two chained decode steps costs (#16; device):

    python -m engine.bench.graph_steps --shapes 3b:4,7b:4 --ks 1,2,4 --rounds 3 --out $OUT/graph_steps.json

A lone greedy request replays one chain-step graph per token (GPUModel.decode_chain), so every token pays one graph
boundary: the last kernel of graph i drains, then graph i + 1's first kernel launches, with no programmatic
dependent launch across the two. Here the chain step (StepOps with chain=True: its tokens are the last step's argmax
keys, its positions one on, all on the GPU) is captured k times in ONE graph, and the graphs are replayed back to
back over the same 128 positions (k = 1: 128 replays, k = 2: 64, ...), alternating k in each round: ms per step for
each k. If k = 2 or 4 is faster per step than k = 1 by more than the runs' spread, a multi-step chain graph is worth
building (the host then reads k tokens per wait); if not, the boundary is already as cheap as a kernel boundary.
Every k's greedy ids over the 128 steps are compared with k = 1's (the same steps: they must be equal).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from engine.bench.decode_ab import run_header
from engine.bench.decode_bench import log, replay_seconds, scheme_weights
from engine.config import QWEN25_SHAPES, ModelConfig
from engine.model.gpu_model import GPUModel
from engine.model.graph_capture import capture
from kernels.decode_kernels import keys_to_ids

STEPS = 128  # positions covered by every k's timing (a multiple of every k)
L0 = 64  # first position (short-context attention over 64..192 rows: the bench's tg128 range)


def chain_graph(m: GPUModel, k: int, pool):
    """A graph of k chain steps at batch 1 (captured at scratch positions far from L0; capture replays it once)."""
    m.write_meta([7], [1024], [0])
    m._step(1, chain=True)  # eager once: every kernel loaded before the capture
    torch.cuda.synchronize()

    def steps():
        for _ in range(k):
            m._step(1, chain=True)
    g, _ = capture(steps, pool)
    return g


def time_k(m: GPUModel, g, k: int) -> tuple[float, list[int]]:
    """ms per step over STEPS chain steps from L0 (STEPS / k replays back to back), and the steps' greedy ids: one
    eager plain step writes the first token's keys, then the replays; ids read back through a per-replay copy of the
    keys queued after each graph (not timed: a second pass)."""
    n = STEPS // k
    m.write_meta([7], [L0], [0])
    m._step(1)  # the plain first step: its argmax keys feed the chain
    torch.cuda.synchronize()
    ms = replay_seconds(g, n) * 1e3 / k
    # the same steps again, ids after each replay (k ids per replay are the last row's only: the keys buffer holds
    # the last step's argmax; so compare the ids at every k-th step)
    m.write_meta([7], [L0], [0])
    m._step(1)
    ids = []
    for _ in range(n):
        g.replay()
        ids.append(keys_to_ids(m.keys[:1].cpu().numpy())[0])
    return ms, ids


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="3b:4,7b:4")
    ap.add_argument("--ks", default="1,2,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", default="graph_steps.json")
    a = ap.parse_args(argv)
    ks = [int(v) for v in a.ks.split(",")]
    assert all(STEPS % k == 0 for k in ks)
    out = run_header("engine.bench.graph_steps", argv, a.commit,
                     "batch-1 chain steps captured k to a graph, replayed back to back over positions "
                     f"{L0}..{L0 + STEPS}; ms per step, median of rounds (k alternating in each round)")
    out["shapes"] = {}
    for spec in a.shapes.split(","):
        shape, bits = spec.split(":")
        cfg = ModelConfig(**QWEN25_SHAPES[shape])
        m = GPUModel(scheme_weights(cfg, bits if bits == "mixed" else int(bits), torch.device("cuda")), 1, 4096,
                     "cuda")
        m.decode_chain([7], [L0], [0], 3, lambda ids: True)  # the model's own graphs and kernels, warm
        pool = torch.cuda.graph_pool_handle()
        graphs = {k: chain_graph(m, k, pool) for k in ks}
        times: dict[int, list[float]] = {k: [] for k in ks}
        ids: dict[int, list[int]] = {}
        for _ in range(a.rounds):
            for k in ks:
                ms, got = time_k(m, graphs[k], k)
                times[k].append(ms)
                ids[k] = got
        base = ks[0]
        row = {}
        for k in ks:
            med = statistics.median(times[k])
            same = ids[k] == ids[base][k // base - 1::k // base] if k % base == 0 else None
            row[str(k)] = {"ms_per_step": med, "rounds": times[k], "ratio_to_first": med / statistics.median(
                times[base]), "ids_equal": same}
            log(f"| {shape} w{bits} | k={k} | {med:.4f} ms/step | {row[str(k)]['ratio_to_first']:.4f}x | "
                f"rounds {', '.join(f'{t:.4f}' for t in times[k])} | ids equal: {same} |")
        out["shapes"][spec] = row
        del m, graphs
        torch.cuda.empty_cache()
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
