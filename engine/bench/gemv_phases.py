"""Where a decode GEMV's time goes inside the step, block by block (device; #16).

    python -m engine.bench.gemv_phases --shapes 3b:4,7b:4 --out $OUT/gemv_phases_h200.json
    python -m engine.bench.gemv_phases --shapes 3b:4 --variants "base:,x:DEEPINFER_PDL=0" --out $OUT/p.json
                                                  (one JSON per variant, decode_ab's syntax: $OUT/p_base.json, p_x.json)

A build with `-DGEMV_TRACE=1` (kernels/decode_gemv.cu; same values) has thread 0 of every GEMV block record
%globaltimer at its start, when its wait returns (PDL: the previous kernel has finished), after its K loop and at its
end; the attention blocks and the merge launch's do the same (decode_attn.cu att_trace: start, wait, end of the K/V
loop or of the merge weights, end; N = the token's rows, K = its active splits). One batch-1 decode step of a random
model (graph replay, `--cached` tokens in the cache) is traced; per launch:

  pre       first block's start -> first wait return: how early the launch's blocks were resident
  skew      first -> last wait return (blocks that became resident only after the release start late)
  loop      median block, wait return -> end of its K loop (x loads, dequant, mma; attention: q, rope, the K/V tiles)
  tail      median block, K loop end -> its end (split-K reduction, epilogue; attention: the block's merge, the
            partials, the last block's cross-block merge)
  span      first wait return -> last block's end: what the launch adds to the step once its inputs exist
  gap       previous traced launch's last block end -> this launch's first wait return (the boundary)

Medians over the layers per linear, us. The record layout and the analysis (`launches`, `summary`) are tested on the
CPU (tests/test_gemv_phases.py); the trace itself needs a GPU.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from engine.bench.envinfo import emit_json

EPI_NAMES = {0: "store", 1: "resid", 2: "silu", 3: "logits", 4: "attn", 5: "attn_merge", 6: "attn_short"}
ATT_OPS = {"attn": "attention", "attn_short": "attention", "attn_merge": "merge"}  # decode_attn.cu att_trace
TRACE_CAP = 131072  # = decode_gemv.cu GEMV_TRACE_CAP (records kept; the counter runs on past it)


def records(raw: np.ndarray) -> list[dict]:
    """gemv_trace rows (uint64 [n, 8]) -> dicts (times in ns, as recorded; te: the epilogue's start, 0 where the
    block left its partial to another or does not record it: the attention's)."""
    out = []
    for r in np.asarray(raw, dtype=np.uint64).reshape(-1, 8):
        f, pos = int(r[6]), int(r[7])
        out.append({"t0": int(r[0]), "t1": int(r[1]), "t2": int(r[2]), "t3": int(r[3]), "N": int(r[4]) & 0xFFFFFFFF,
                    "K": int(r[4]) >> 32, "te": int(r[5]), "epi": EPI_NAMES.get(f & 15, str(f & 15)), "mt": (f >> 4) & 15,
                    "done": bool((f >> 8) & 1), "bx": pos & 0xFFFFF, "by": (pos >> 20) & 0xFFFFF, "sm": pos >> 40})
    return out


def launches(recs: list[dict]) -> list[dict]:
    """Blocks grouped into launches in step order: sorted by start, a new launch wherever the shape changes (a
    dependent grid's blocks start only after every block of the one before has, so launches do not interleave;
    two neighbouring launches of one step never share N, K and the epilogue). Times in us from the first start."""
    if not recs:
        return []
    rs = sorted(recs, key=lambda r: (r["t0"], r["t1"]))
    base = rs[0]["t0"]
    groups: list[list[dict]] = []
    for r in rs:
        key = (r["N"], r["K"], r["epi"], r["mt"])
        if not groups or key != (groups[-1][0]["N"], groups[-1][0]["K"], groups[-1][0]["epi"], groups[-1][0]["mt"]):
            groups.append([])
        groups[-1].append(r)
    out, prev_end = [], None
    for g in groups:
        us = lambda t: (t - base) / 1e3  # noqa: E731
        start = min(us(r["t0"]) for r in g)
        rel = min(us(r["t1"]) for r in g)
        end = max(us(r["t3"]) for r in g)
        la = {"N": g[0]["N"], "K": g[0]["K"], "epi": g[0]["epi"], "mt": g[0]["mt"], "blocks": len(g),
              "sms": len({r["sm"] for r in g}), "start": start, "release": rel, "end": end,
              "pre": rel - start, "skew": max(us(r["t1"]) for r in g) - rel,
              "loop": statistics.median((r["t2"] - r["t1"]) / 1e3 for r in g),
              "tail": statistics.median((r["t3"] - r["t2"]) / 1e3 for r in g),
              "span": end - rel, "gap": None if prev_end is None else rel - prev_end}
        # residency: blocks that started only after the launch before had ended (not resident early, through PDL),
        # how long after its end they started (late_start), what their start -> wait return took (late_pre), and
        # the lowest block index among them (blocks are dispatched in index order)
        late = [] if prev_end is None else [r for r in g if us(r["t0"]) > prev_end]
        la.update({"start_skew": max(us(r["t0"]) for r in g) - start, "late_blocks": len(late),
                   "late_start": statistics.median(us(r["t0"]) - prev_end for r in late) if late else None,
                   "late_pre": statistics.median((r["t1"] - r["t0"]) / 1e3 for r in late) if late else None,
                   "late_bx_min": min(r["bx"] + (r["by"] << 20) for r in late) if late else None})
        la.update(spread(g))
        out.append(la)
        prev_end = end
    return out


def _pct(vals: list[float], q: float) -> float:
    """The q-quantile (0..1) of vals by the nearest rank below (no interpolation: a block's own time)."""
    v = sorted(vals)
    return v[min(len(v) - 1, int(q * (len(v) - 1)))]


def spread(g: list[dict]) -> dict:
    """How a launch's blocks finish, in us after its first wait return: when the K loops end (loop_end_p10 / p50 /
    p90 / max) and the blocks (end_p50 / end_max), the longest tail (the split-K reduction's last block), and the
    median loop of the blocks on SMs that hold 1, 2, .. blocks of this launch (loop_by_sm_load): whether blocks that
    share an SM stream slower, and whether a span's excess over its median block is in the loops or in the tails."""
    r0 = min(r["t1"] for r in g)
    lend = [(r["t2"] - r0) / 1e3 for r in g]
    end = [(r["t3"] - r0) / 1e3 for r in g]
    load = Counter(r["sm"] for r in g)  # blocks of this launch per SM
    by_load: dict[int, list[float]] = {}
    for r in g:
        by_load.setdefault(load[r["sm"]], []).append((r["t2"] - r["t1"]) / 1e3)
    last = max(g, key=lambda r: r["t3"] - r["t2"])
    split = last["te"] > 0  # the longest tail as the reduction (loop end -> epilogue start) and the epilogue
    return {"loop_end_p10": _pct(lend, 0.1), "loop_end_p50": _pct(lend, 0.5), "loop_end_p90": _pct(lend, 0.9),
            "loop_end_max": max(lend), "end_p50": _pct(end, 0.5), "end_max": max(end),
            "tail_max": (last["t3"] - last["t2"]) / 1e3,
            "tail_max_reduce": (last["te"] - last["t2"]) / 1e3 if split else None,
            "tail_max_epilogue": (last["t3"] - last["te"]) / 1e3 if split else None,
            "loop_by_sm_load": {str(k): statistics.median(v) for k, v in sorted(by_load.items())}}


def op_name(la: dict, cfg) -> str:
    """Which linear of the step a launch is, or the attention / its merge launch (cfg: the model's ModelConfig)."""
    if la["epi"] in ATT_OPS:
        return ATT_OPS[la["epi"]]
    if la["epi"] == "silu":
        return "gate_up"
    if la["epi"] == "logits":
        return "lm_head"
    if la["epi"] == "store":
        return "qkv" if la["N"] == cfg.q_size + 2 * cfg.kv_size else f"store {la['N']}x{la['K']}"
    if la["K"] == cfg.intermediate_size:
        return "down"
    return "o" if la["K"] == cfg.q_size else f"resid {la['N']}x{la['K']}"


def launch_bytes(la: dict, cfg, bits: int | None) -> int | None:
    """Bytes a launch must stream from memory: a linear's codes and its group scales and mins (fp16 each per 128:
    our W4 / W3 layouts; the lm_head is 4-bit in both, engine/quant/scheme.py head_layout), the attention's K and V rows
    (fp16, L rows per KV head); None where the trace cannot tell (a mixed scheme's linears, the merge launch)."""
    if la["epi"] in ("attn", "attn_short"):
        return la["N"] * cfg.num_kv_heads * cfg.head_dim * 2 * 2
    if la["epi"] == "attn_merge" or la["epi"] not in ("store", "resid", "silu", "logits"):
        return None
    b = 4 if la["epi"] == "logits" else bits
    if b is None:
        return None
    n_k = la["N"] * la["K"]
    return n_k * b // 8 + (n_k // 128) * 4


def summary(las: list[dict], cfg, bits: int | None = None) -> dict[str, dict]:
    """{linear: medians over its launches of blocks, pre, skew, loop, tail, span, gap, and GB/s = the bytes it streams
    (launch_bytes) over its span}, in step order. bits: the scheme's (4 or 3; None: mixed, no GB/s for linears)."""
    by: dict[str, list[dict]] = {}
    for la in las:
        by.setdefault(op_name(la, cfg), []).append(la)
    out = {}
    for name, ls in by.items():
        row = {"launches": len(ls)}
        for k in ("blocks", "sms", "pre", "skew", "loop", "tail", "span", "gap", "start_skew", "late_blocks",
                  "late_start", "late_pre", "loop_end_p10", "loop_end_p50", "loop_end_p90", "loop_end_max", "end_p50",
                  "end_max", "tail_max", "tail_max_reduce", "tail_max_epilogue"):
            vals = [la[k] for la in ls if la[k] is not None]
            row[k] = round(statistics.median(vals), 3) if vals else None
        loads = sorted({n for la in ls for n in la["loop_by_sm_load"]}, key=int)
        row["loop_by_sm_load"] = {n: round(statistics.median(la["loop_by_sm_load"][n] for la in ls
                                                             if n in la["loop_by_sm_load"]), 3) for n in loads}
        rates = [nb / (la["span"] * 1e3) for la in ls
                 if (nb := launch_bytes(la, cfg, bits)) is not None and la["span"] > 0]  # bytes / us / 1e3 = GB/s
        row["GBps"] = round(statistics.median(rates), 1) if rates else None
        out[name] = row
    return out


def trace_step(shape: str, bits, cached: int) -> tuple[list[dict], float, object]:
    """(launches of one traced batch-1 step, the step's graph replay ms, cfg) of a random model of the shape."""
    import torch

    from engine.bench.decode_ab import ensure_define
    from engine.bench.decode_bench import scheme_weights, timed_decode
    from engine.config import QWEN25_SHAPES, ModelConfig
    from engine.model.gpu_model import GPUModel
    ensure_define("-DGEMV_TRACE=1")
    cfg = ModelConfig(**QWEN25_SHAPES[shape])
    w = scheme_weights(cfg, bits, torch.device("cuda"))
    m = GPUModel(w, 1, max(512, cached + 64), "cuda")
    # the bench's decode: `cached` tokens prefilled in slot 0, the step captured, 3 steps, the replay timed
    _, replay_s, seq = timed_decode(m, 1, 3, [1000 + i % 5000 for i in range(cached)])
    replay = replay_s * 1e3
    mod = m.kn.module
    n_ptr, t_ptr = mod.get_global("gemv_trace_n"), mod.get_global("gemv_trace")
    zero = np.zeros(1, dtype=np.uint32)
    n_ptr.copy_from_host(zero.ctypes.data, 4)
    m.decode([seq[-1]], [cached + 4], [0])  # the traced step (a replay of the captured graph)
    torch.cuda.synchronize()
    n = np.zeros(1, dtype=np.uint32)
    n_ptr.copy_to_host(n.ctypes.data, 4)
    k = min(int(n[0]), TRACE_CAP)
    raw = np.zeros(k * 8, dtype=np.uint64)
    t_ptr.copy_to_host(raw.ctypes.data, raw.nbytes)
    return launches(records(raw)), replay, cfg


def variant_outs(out: str, spec: str) -> list[tuple[str, dict, str]]:
    """--variants in decode_ab's syntax ("name:ENV=val+ENV2=val,...") -> (name, env, path): each variant traced in its
    environment into its own JSON beside --out (the stem + "_" + name); none: the environment as it is, into --out."""
    if not spec:
        return [("", {}, out)]
    from engine.bench.decode_ab import parse_variants
    p = Path(out)
    return [(n, env, str(p.with_name(f"{p.stem}_{n}{p.suffix}"))) for n, env in parse_variants(spec)]


def trace_shapes(shapes: str, cached: int, res: dict) -> None:
    """Trace each shape of `shapes` ("3b:4,14b:4"), print its tables and keep them in res["shapes"]."""
    res["shapes"] = {}
    for sb in shapes.split(","):
        shape, bits = sb.split(":")
        las, replay, cfg = trace_step(shape, bits, cached)
        summ = summary(las, cfg, int(bits) if bits in ("3", "4") else None)
        res["shapes"][sb] = {"replay_ms": round(replay, 4), "summary": summ, "launches": las}
        print(f"{sb}: step replay {replay:.3f} ms (traced build), {len(las)} traced launches")
        print("| op | launches | blocks | SMs | pre | skew | loop | tail | span | gap before | GB/s over span | "
              "late blocks | late start | late pre |")
        for name, r in summ.items():
            print(f"| {name} | " + " | ".join(str(r[k]) for k in ("launches", "blocks", "sms", "pre", "skew", "loop",
                                                                  "tail", "span", "gap", "GBps", "late_blocks",
                                                                  "late_start", "late_pre")) + " |", flush=True)
        print("| op | loop end p10 / p50 / p90 / max | block end p50 / max | longest tail (reduction / epilogue) | "
              "loop by blocks on the SM |")
        for name, r in summ.items():
            print(f"| {name} | {r['loop_end_p10']} / {r['loop_end_p50']} / {r['loop_end_p90']} / {r['loop_end_max']} "
                  f"| {r['end_p50']} / {r['end_max']} | {r['tail_max']} ({r.get('tail_max_reduce')} / "
                  f"{r.get('tail_max_epilogue')}) | {r['loop_by_sm_load']} |", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="3b:4,7b:4")
    ap.add_argument("--cached", type=int, default=64)
    ap.add_argument("--out", default="gemv_phases.json")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--variants", default="", help="decode_ab's syntax; one JSON per variant (variant_outs)")
    a = ap.parse_args(argv)
    from engine.bench.decode_ab import run_header, variant_env
    for name, env, path in variant_outs(a.out, a.variants):
        if name:
            print(f"== {name}", flush=True)
        with variant_env(env):
            method = __doc__.split("\n\n")[2].replace("\n", " ")
            res = run_header("engine.bench.gemv_phases", argv, a.commit, method)
            if name:
                res["variant"] = {"name": name, "env": env}
            trace_shapes(a.shapes, a.cached, res)
        emit_json(res, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
