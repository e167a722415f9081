"""Where a speculative tree step's GPU time goes (device): random weights of a Qwen2.5 shape and random draft heads
(timings do not depend on the values), the graphs the burst replays, each timed alone, and the burst loop as
speculative.burst runs it (host round trip per step included) against the plain batch-1 decode loop.

    python -m engine.bench.tree_profile --shapes 0.5b,3b --out $OUT/tree_profile_h200.json [--kernels]

Per shape: replay ms of the plain batch-1 step, the 8-row verify step (the TREE), the draft graph (heads + lm_head
over K rows + top-k), the burst's accept graph (spec_accept + move_rows_dev) and its draft+verify graph; the wall ms
per step of the burst loop and of the plain decode loop; each decode op alone at 1, 2 and 8 rows and the attention
kernels alone (ops_us, attention_us: a graph of one launch per layer, replayed). With --kernels, per kernel name the
GPU us per replay of the plain, verify, draft and accept graphs (torch.profiler over 20 of each; under the profiler the
PDL-chained steps' kernels add up to several times the replay, so read those as relative, the draft graph's as is).
The ratio that decides the speed-up: tokens per tree step / (burst wall / plain wall).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from engine.config import QWEN25_SHAPES, ModelConfig
from engine.model.gpu_load import random_weights
from engine.model.gpu_model import GPUModel
from engine.runtime.draft_heads import TREE, DraftHeads


class _Runner:  # what DraftHeads reads of a runner
    def __init__(self, model):
        self.model = model


class _Seq:  # what DraftHeads reads of a sequence
    def __init__(self, hidden, output_ids, slot):
        self.hidden, self.output_ids, self.slot = hidden, output_ids, slot


def replay_ms(fn, n: int = 50) -> float:
    fn()
    if not torch.cuda.is_available():  # a CPU smoke run (the kernels' references): wall time
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(n):
        fn()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / n


def kernels_us(fn, n: int = 20) -> dict[str, float]:
    """Per kernel name: GPU us per call of fn (torch.profiler, CUDA-graph replays included)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    rows: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            rows[e.name] = rows.get(e.name, 0.0) + e.time_range.elapsed_us() / n
    return dict(sorted(rows.items(), key=lambda kv: -kv[1]))


def _graph(graphs: dict, B: int, step):
    g = graphs.get(B)
    return g.replay if g is not None else step  # CPU: no graphs, the step itself


def launch_us(m, fn, n: int) -> float:
    """us per launch of fn's n launches: fn run once eagerly, captured into a graph (m.pool), the replay timed."""
    from engine.model.graph_capture import capture
    fn()
    torch.cuda.synchronize()
    g, _ = capture(fn, m.pool)
    return replay_ms(g.replay) * 1e3 / n


def layer_gemv_args(m, L, B: int) -> dict[str, tuple]:
    """The step's four GEMVs of layer weights L on its own buffers, as DecodeKernels.gemv's (w, x, B, epi, out)."""
    return {"qkv": (L.qkv, m.x, B, "store", m.qkv), "o": (L.o, m.attn, B, "resid", m.h),
            "gate_up": (L.gate_up, m.x, B, "silu", m.act), "down": (L.down, m.act, B, "resid", m.h)}


def layer_gemvs(m) -> dict:
    """The step's four per-layer GEMVs on its own buffers, as op(L, B) for layer weights L and B rows."""
    return {name: (lambda L, B, name=name: m.kn.gemv(*layer_gemv_args(m, L, B)[name]))
            for name in ("qkv", "o", "gate_up", "down")}


def attention_us(m, pos: int) -> dict[str, float]:
    """us per launch of the attention kernels alone (a graph of one launch per layer, replayed): the plain kernel at
    1 and 2 tokens (two slots), the tree kernel (verify's, batch-1 schedule) over chains of 2 and 8 rows of slot 0."""
    from kernels.decode_kernels import CHAIN_PATH
    c = m.cfg
    if m.pool is None:
        m.pool = torch.cuda.graph_pool_handle()
    out = {}
    for name, B, tree in (("plain_b1", 1, False), ("plain_b2", 2, False), ("tree_b2", 2, True), ("tree_b8", 8, True)):
        if tree:
            m.write_meta([1000] * B, [pos + i for i in range(B)], [0] * B, [pos + i for i in range(B)], [CHAIN_PATH] * B)
        else:
            m.write_meta([1000] * B, [pos] * B, list(range(B)))

        def layers(B=B, tree=tree):
            for i in range(c.num_layers):
                args = (m.qkv, m.kc[i], m.vc[i], m.meta[2], m.meta[1], m.cos, m.sin, B, c.num_kv_heads,
                        c.num_heads // c.num_kv_heads, c.head_dim, m.max_context)
                if tree:
                    m.kn.attention_tree(*args, m.attn, m.ws, m.ws.splits(1), rpos=m.meta[3], path=m.meta[4])
                else:
                    m.kn.attention(*args, m.attn, m.ws)
        out[name] = launch_us(m, layers, c.num_layers)
    return out


def ops_us(m) -> dict[str, dict[int, float]]:
    """us per launch of each decode op alone at B = 1, 2, 8 rows (a graph of one launch per layer, replayed; no
    neighbour to overlap with through PDL): the rmsnorm, the four GEMVs, the lm_head."""
    c, w = m.cfg, m.w
    out: dict[str, dict[int, float]] = {}
    ops = {"rmsnorm": lambda L, B: m.kn.rmsnorm(m.h, L.in_norm, c.rms_eps, B, m.x), **layer_gemvs(m)}
    for name, op in ops.items():
        out[name] = {}
        for B in (1, 2, 8):
            def layers(B=B, op=op):
                for L in w.layers:
                    op(L, B)
            out[name][B] = launch_us(m, layers, len(w.layers))
    out["lm_head"] = {}
    for B in (1, 2, 8):
        def head(B=B):
            m.keys.zero_()
            m.kn.gemv(w.lm_head, m.x, B, "logits", m.logits, m.keys)
        out["lm_head"][B] = launch_us(m, head, 1)
    return out


class _Without:
    """m.kn with the launches of one op skipped (a timing device: the step's values are garbage then): op is
    rmsnorm | qkv | attention | o | gate_up | down | lm_head; the GEMVs are told apart by their weight."""

    def __init__(self, kn, w, op: str):
        self.kn, self.op = kn, op
        if op in ("qkv", "o", "gate_up", "down"):
            self.ids = {id(getattr(L, op)) for L in w.layers}
        else:
            self.ids = {id(w.lm_head)} if op == "lm_head" else set()

    def __getattr__(self, name):
        return getattr(self.kn, name)

    def gemv(self, w, *a, **k):
        if id(w) in self.ids:
            return None
        return self.kn.gemv(w, *a, **k)

    def rmsnorm(self, *a, **k):
        return None if self.op == "rmsnorm" else self.kn.rmsnorm(*a, **k)

    def attention(self, *a, **k):
        return None if self.op == "attention" else self.kn.attention(*a, **k)

    def attention_tree(self, *a, **k):
        return None if self.op == "attention" else self.kn.attention_tree(*a, **k)


def timeline_us(replay, n: int = 10) -> dict[str, dict]:
    """Per kernel name inside one graph (torch.profiler over n replays): how much each kernel moves the chain's
    end, the sum over its launches of end(kernel) - end(kernel before it) (us per replay). Under PDL a kernel
    starts early and waits, so its own duration says little; the end-to-end increments add up to the step.
    Also 'launches' per replay."""
    from torch.profiler import ProfilerActivity, profile
    replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            replay()
            torch.cuda.synchronize()  # replays apart: the first kernel's increment is its own duration
    ev = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                key=lambda e: e.time_range.start)
    per = len(ev) // n
    rows: dict[str, dict] = {}
    for r in range(n):
        part = ev[r * per:(r + 1) * per]
        prev_end = part[0].time_range.start
        for e in part:
            end = max(e.time_range.end, prev_end)
            d = rows.setdefault(e.name, {"us": 0.0, "launches": 0})
            d["us"] += (end - prev_end) / n
            d["launches"] += 1 / n
            prev_end = end
    return dict(sorted(rows.items(), key=lambda kv: -kv[1]["us"]))


CHAIN_OPS = ("rmsnorm", "qkv", "attention", "o", "gate_up", "down", "lm_head")


def _step_graph(m, B: int, verify: bool, start: int):
    """The decode step of B rows captured alone: a verify chain of one slot at rows start.. (verify) or B slots
    at position start (plain)."""
    from engine.model.graph_capture import capture
    if verify:
        m.write_meta([1000] * B, [start + i for i in range(B)], [0] * B)  # a chain: rpos = rows
    else:
        m.write_meta([1000] * B, [start] * B, list(range(B)))
    fn = lambda: m._step(B, verify=verify)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    return capture(fn, m.pool)[0]


def chain_us(m, verify_start: int, timeline: bool = False, ablate: bool = True) -> dict:
    """Each op's share of the whole step INSIDE its graph: the step captured with that op's launches left out, at
    1 and 8 rows (plain decode over 8 slots, and the 8-row verify step of one slot); us the step loses without
    it. (The ops alone, ops_us, add up to the 1-row step but not to the 8-row one: this says which op's in-chain
    cost grows with the rows.) timeline: also each kernel's timeline_us, and the verify / plain steps by rows."""
    kn0, out = m.kn, {}
    for name, B, verify in (("plain_b1", 1, False), ("plain_b8", 8, False), ("verify_b8", 8, True)):
        res = {}
        for op in (None,) + (CHAIN_OPS if ablate else ()):
            m.kn = kn0 if op is None else _Without(kn0, m.w, op)
            try:
                g = _step_graph(m, B, verify, verify_start)
                res["all" if op is None else op] = replay_ms(g.replay) * 1e3
                if op is None and timeline:
                    tl = timeline_us(g.replay)
            finally:
                m.kn = kn0
        out[name] = {"step_us": res["all"], **{op: res["all"] - res[op] for op in CHAIN_OPS if op in res}}
        if timeline:
            out[name]["timeline_us"] = tl
    if timeline:  # which kernel's share grows with the rows; plain too: the tree kernel's or any 8-token step's
        for name, B, verify in [(f"verify_b{B}", B, True) for B in (2, 4, 6, 7)] + \
                               [(f"plain_b{B}", B, False) for B in (2, 7)]:
            g = _step_graph(m, B, verify, verify_start)
            out[name] = {"step_us": replay_ms(g.replay) * 1e3, "timeline_us": timeline_us(g.replay)}
    return out


def profile_shape(shape: str, bits: int, steps: int, kernels: bool, log, device: str = "cuda",
                  ablate: bool = True, layouts: str = "") -> dict:
    """layouts "q4_k_m": every linear in the layout a Q4_K_M GGUF of the shape loads as (groups of 32 / 16, 8-bit
    for its Q6_K tensors), as a user's Ollama model runs; "" = `bits`, group 128."""
    cfg = ModelConfig(**QWEN25_SHAPES[shape])
    dev = torch.device(device)
    lay = None
    if layouts == "q4_k_m":
        from engine.quant.random_gguf import q4_k_m_layouts
        lay = q4_k_m_layouts(cfg)
    elif layouts:
        raise SystemExit(f"unknown --layouts {layouts!r} (q4_k_m)")
    w = random_weights(cfg, bits, dev, layouts=lay)
    m = GPUModel(w, 8, 4096, device)
    prompt = list(range(1000, 1032))
    m.prefill(prompt, 0, 0)
    n0 = len(prompt)
    tok, _ = m.decode([prompt[-1]], [n0], [0])
    res: dict = {"shape": shape, "bits": bits, "layouts": layouts or f"w{bits}g128", "tree_nodes": len(TREE)}
    res["plain_replay_ms"] = replay_ms(_graph(m.graphs, 1, lambda m=m: m._step(1)))
    # the plain decode loop (host round trip per token), as timed_decode
    t0 = time.perf_counter()
    for i in range(steps):
        tok, _ = m.decode([tok[0]], [n0 + 1 + i], [0])
    res["plain_loop_ms"] = (time.perf_counter() - t0) * 1e3 / steps
    g = torch.Generator(device="cpu").manual_seed(0)
    H = cfg.hidden_size
    hw = (torch.randn(4, H, 2 * H, generator=g) * 0.02).half()
    hb = (torch.randn(4, H, generator=g) * 0.02).half()
    heads = DraftHeads(_Runner(m), hw, hb, {})
    heads.h.copy_(torch.randn(H, generator=g).half())
    heads.tok.fill_(1000)
    heads._run()  # eager once, then captured
    heads._run()
    res["draft_replay_ms"] = replay_ms(heads.graph.replay if heads.graph else heads._draft)
    start = n0 + 1 + steps
    seq = _Seq(heads.h.clone(), [1000], 0)
    heads._burst_graphs(seq, start)
    accept, draft_verify = heads.s_graphs
    res["accept_replay_ms"] = replay_ms(accept)
    res["draft_verify_replay_ms"] = replay_ms(draft_verify)
    m.verify([1000] + [0] * len(TREE), start, 0, parents=heads.parents)  # the 8-row verify graph alone
    res["verify_replay_ms"] = replay_ms(_graph(m.verify_graphs, 1 + len(TREE), lambda m=m: m._step(1 + len(TREE), verify=True)))
    # the verify step by rows (chains of B - 1 drafts) and a plain batch-8 decode step, for the cost per row
    res["verify_replay_ms_by_rows"] = {}
    for B in (2, 3, 4, 5, 6, 7, 8):
        m.verify([1000] * B, start, 0)
        res["verify_replay_ms_by_rows"][B] = replay_ms(_graph(m.verify_graphs, B, lambda m=m, B=B: m._step(B, verify=True)))
    res["verify_replay_ms_by_rows"][1 + len(TREE)] = res["verify_replay_ms"]
    for s in range(1, 8):
        m.prefill(prompt, s, 0)
    m.decode([1000] * 8, [n0] * 8, list(range(8)))
    res["decode_b8_replay_ms"] = replay_ms(_graph(m.graphs, 8, lambda m=m: m._step(8)))
    # the burst loop as speculative.burst drives it: accept, copy out, queue the next draft+verify, wait, read
    heads._tree_meta(1000, start, 0)
    heads._stage(seq)
    draft_verify()
    t0 = time.perf_counter()
    for _ in range(steps):
        heads.burst_next(True)
    heads.burst_next(False)
    res["burst_loop_ms"] = (time.perf_counter() - t0) * 1e3 / (steps + 1)
    res["burst_over_plain"] = res["burst_loop_ms"] / res["plain_loop_ms"]
    res["tokens_per_step_for_1.5x"] = 1.5 * res["burst_over_plain"]
    res["attention_us"] = attention_us(m, start) if device == "cuda" else {}
    res["ops_us"] = ops_us(m) if device == "cuda" else {}
    res["chain_us"] = chain_us(m, start, kernels, ablate) if device == "cuda" else {}
    if kernels:
        res["kernels_us"] = {"plain": kernels_us(m.graphs[1].replay), "verify": kernels_us(m.verify_graphs[1 + len(TREE)].replay),
                             "draft": kernels_us(heads.graph.replay), "accept": kernels_us(accept)}
        res["draft_timeline_us"] = timeline_us(heads.graph.replay)  # us each kernel moves the draft's end
        log(f"  {shape} draft timeline: " + ", ".join(f"{n[:28]} {d['us']:.1f}/{d['launches']:.0f}"
                                                       for n, d in res["draft_timeline_us"].items()))
    log(f"  {shape} {res['layouts']}: plain replay {res['plain_replay_ms']:.3f} ms (loop {res['plain_loop_ms']:.3f}) | "
        f"verify{1 + len(TREE)} {res['verify_replay_ms']:.3f} | draft {res['draft_replay_ms']:.3f} | accept "
        f"{res['accept_replay_ms']:.3f} | draft+verify {res['draft_verify_replay_ms']:.3f} | burst loop "
        f"{res['burst_loop_ms']:.3f} ms/step = {res['burst_over_plain']:.2f} plain steps | verify by rows "
        + ", ".join(f"{b}: {v:.3f}" for b, v in res["verify_replay_ms_by_rows"].items())
        + f" | decode b8 {res['decode_b8_replay_ms']:.3f} | attention us/launch "
        + ", ".join(f"{k} {v:.2f}" for k, v in res["attention_us"].items()) + " | ops us at B=1/2/8: "
        + ", ".join(f"{k} " + "/".join(f"{x:.2f}" for x in v.values()) for k, v in res["ops_us"].items()))
    for k, v in res["chain_us"].items():
        if "rmsnorm" in v:
            log(f"  {shape} {k}: step {v['step_us']:.1f} us; without each op, us saved: "
                + ", ".join(f"{op} {v[op]:.1f}" for op in CHAIN_OPS))
        if "timeline_us" in v:
            log(f"  {shape} {k} timeline (step {v['step_us']:.1f} us; us moved per replay/launches): " + ", ".join(
                f"{n[:28]} {d['us']:.1f}/{d['launches']:.0f}" for n, d in v["timeline_us"].items()))
    del heads, m, w
    torch.cuda.empty_cache()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="0.5b")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--layouts", default="", help="q4_k_m: the linears as a Q4_K_M GGUF loads (else --bits, group 128)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--kernels", action="store_true")
    ap.add_argument("--no-ablate", action="store_true", help="skip the step-without-each-op captures (chain_us)")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run on the kernels' references (no timings)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    log = lambda *x: print(*x, flush=True)  # noqa: E731
    out = {"device": torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu", "torch": torch.__version__, "commit": a.commit,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "command": "python -m engine.bench.tree_profile " + " ".join(argv if argv is not None else sys.argv[1:]),
           "shapes": {}}
    for s in a.shapes.split(","):
        out["shapes"][s] = profile_shape(s, a.bits, a.steps, a.kernels and a.device == "cuda", log, a.device,
                                       not a.no_ablate, a.layouts)
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    if a.kernels:
        for s, r in out["shapes"].items():
            for part in ("draft", "accept"):
                if "kernels_us" not in r:
                    continue
                log(f"  {s} {part}: " + ", ".join(f"{k[:40]} {v:.1f}" for k, v in list(r["kernels_us"][part].items())[:12]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
