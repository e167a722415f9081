"""Decode step variants side by side in one process (device): the same random weights, the variants' GPUModels
built in turn and timed in alternating rounds, so drift hits every variant alike.

    python -m engine.bench.decode_ab --variants "separate:DEEPINFER_DEFER_NORM=0,deferred:" \
        --shapes 3b:4,7b:4,0.5b:4 --rounds 3 --out $OUT/decode_ab.json

A variant is NAME:ENV=V+ENV=V (environment read when a GPUModel is built: engine/model/gpu_model.py). Per shape
and variant: batch-1 tok/s over 128 greedy steps (wall clock, the host round trip included), the graph replay
time of the step, batch-8 total tok/s; medians over rounds, and each variant's ratio to the first. Every variant's
greedy tokens are compared with the first's (the same weights and prompt: they must be equal). `--long 4096,16384`
also measures batch 1 with that many tokens already cached (host-loop tok/s and the step's replay there, and
short / long replay: the issue's long-context ratio) for every variant.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import time

import torch

from engine.config import QWEN25_SHAPES, ModelConfig
from engine.bench.decode_bench import long_tok_s, replay_seconds, scheme_weights, timed_decode
from engine.model.gpu_model import GPUModel


def run_header(module: str, argv, commit: str, method: str) -> dict:
    """The JSON head of a device bench run: device, torch, commit, the command ($OUT for the output folder), date."""
    p = torch.cuda.get_device_properties(0)
    cmd = f"python -m {module} " + " ".join(argv if argv is not None else sys.argv[1:])
    if os.environ.get("OUT"):
        cmd = cmd.replace(os.environ["OUT"], "$OUT")
    return {"device": p.name, "torch": torch.__version__, "commit": commit, "command": cmd,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "method": method}


def ensure_define(flag: str) -> None:
    """Add a -D flag to DEEPINFER_KERNEL_DEFINES (read when a model is built: its decode module is compiled with it)."""
    d = os.environ.get("DEEPINFER_KERNEL_DEFINES", "")
    if flag not in d.split():
        os.environ["DEEPINFER_KERNEL_DEFINES"] = (d + " " + flag).strip()


def parse_variants(spec: str) -> list[tuple[str, dict]]:
    out = []
    for v in spec.split(","):
        name, _, env = v.partition(":")
        out.append((name, dict(e.split("=", 1) for e in env.split("+") if e)))
    return out


@contextlib.contextmanager
def variant_env(env: dict):
    """os.environ updated by a variant's env for as long as the variant is built AND measured: some knobs are read
    when a GEMV's launch arguments are made at graph capture (DEEPINFER_GEMV_PLAN, DEEPINFER_PDL_OFF), not when the
    GPUModel is made (until the session of 2026-12-06, twenty-ninth, they were restored before the capture, so
    those variants ran the default plans); restored afterwards."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def measure(m: GPUModel, B: int, steps: int) -> tuple[float, float, list[int]]:
    """(tok/s at batch B over `steps` steps, graph replay ms, greedy tokens of sequence 0)."""
    dt, replay, seq = timed_decode(m, B, steps, list(range(1000, 1032)))
    return B * steps / dt, replay * 1e3, seq


def measure_long(m: GPUModel, L: int, steps: int) -> tuple[float, float]:
    """Batch 1 with L tokens already in slot 0's cache: (tok/s as decode_bench.long_context measures it, graph
    replay ms at the last position)."""
    return long_tok_s(m, L, steps), replay_seconds(m.decode_graph(1, L + steps)) * 1e3


def measure_variant(w, ctx: int, env: dict, steps: int, longs: tuple[int, ...]):
    """One variant's GPUModel over weights w, built and measured inside its env (some knobs are read at capture:
    DEEPINFER_GEMV_PLAN), then freed: (batch-1 tok/s, replay ms, greedy tokens, batch-8 tok/s, {L: measure_long})."""
    with variant_env(env):
        m = GPUModel(w, 8, ctx, "cuda")
        tps, rep, seq = measure(m, 1, steps)
        tps8, _, _ = measure(m, 8, steps // 2)
        lts = {L: measure_long(m, L, 32) for L in longs}
    del m
    gc.collect()  # the model's graphs and buffers hold references among themselves
    torch.cuda.empty_cache()
    return tps, rep, seq, tps8, lts


def run_shape(shape: str, bits, variants, rounds: int, steps: int, log, longs: tuple[int, ...] = (),
              warmup: bool = True) -> dict:
    """bits: "4" | "3" | "mixed" as given (decode_bench.scheme_weights reads them); longs: cached-token counts for
    measure_long (each variant's model then holds max(longs) + 256 positions)."""
    cfg = ModelConfig(**QWEN25_SHAPES[shape])
    w = scheme_weights(cfg, bits, torch.device("cuda"))
    res: dict = {v: {"b1_tok_s": [], "b1_replay_ms": [], "b8_tok_s": []} for v, _ in variants}
    ctx = max(4096, max(longs, default=0) + 256)
    first_seq = None
    if warmup:  # one unmeasured pass of the first variant: in both 3B A/Bs of the twenty-ninth session the base's first
        # replays were the slowest (H100, docs/gpu.md "One wave for the 14B's linears"), favouring the variants after it
        measure_variant(w, ctx, variants[0][1], steps, ())
    for r in range(rounds):
        for name, env in variants:
            tps, rep, seq, tps8, lts = measure_variant(w, ctx, env, steps, longs)
            first_seq = first_seq or seq
            res[name]["b1_tok_s"].append(tps)
            res[name]["b1_replay_ms"].append(rep)
            res[name]["b8_tok_s"].append(tps8)
            for L, (lt, lr) in lts.items():
                res[name].setdefault("long", {}).setdefault(str(L), {"tok_s": [], "replay_ms": []})
                res[name]["long"][str(L)]["tok_s"].append(lt)
                res[name]["long"][str(L)]["replay_ms"].append(lr)
                log(f"  {shape} w{bits} round {r} {name:<12} L={L} b1 {lt:7.1f} tok/s (replay {lr:.3f} ms)")
            res[name].setdefault("tokens_equal_first", True)
            res[name]["tokens_equal_first"] &= seq == first_seq
            log(f"  {shape} w{bits} round {r} {name:<12} b1 {tps:7.1f} tok/s (replay {rep:.3f} ms)  b8 {tps8:7.1f}")
    base = statistics.median(res[variants[0][0]]["b1_tok_s"])
    for name, _ in variants:
        d = res[name]
        d["median"] = {k: statistics.median(d[k]) for k in ("b1_tok_s", "b1_replay_ms", "b8_tok_s")}
        d["replay_spread_ms"] = [min(d["b1_replay_ms"]), max(d["b1_replay_ms"])]  # the rounds' range: the noise
        d["b1_ratio_to_first"] = d["median"]["b1_tok_s"] / base
        for L, x in d.get("long", {}).items():
            x["median_tok_s"], x["median_replay_ms"] = statistics.median(x["tok_s"]), statistics.median(x["replay_ms"])
            x["ratio_to_short_replay"] = d["median"]["b1_replay_ms"] / x["median_replay_ms"]
    del w
    torch.cuda.empty_cache()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="separate:DEEPINFER_DEFER_NORM=0,deferred:")
    ap.add_argument("--shapes", default="3b:4,7b:4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--out", default="decode_ab.json")
    ap.add_argument("--commit", default=os.environ.get("GIT_COMMIT", "unknown"))
    ap.add_argument("--long", default="", help="comma list of cached-token counts also measured at batch 1")
    ap.add_argument("--no-warmup", action="store_true", help="no unmeasured pass of the first variant")
    a = ap.parse_args(argv)
    longs = tuple(int(x) for x in a.long.split(",") if x)
    log = lambda *x: print(*x, flush=True)  # noqa: E731
    variants = parse_variants(a.variants)
    out = run_header("engine.bench.decode_ab", argv, a.commit,
                     "one process, same random weights; per round each variant's GPUModel built, 128 greedy batch-1 "
                     "steps after a 32-token prompt (wall clock incl. host), 20 graph replays, 64 batch-8 steps; "
                     "medians over rounds (replay_spread_ms: their range)"
                     + ("" if a.no_warmup else ", after one unmeasured pass of the first variant"))
    out["shapes"] = {}
    for sb in a.shapes.split(","):
        shape, bits = sb.split(":")
        out["shapes"][sb] = run_shape(shape, bits, variants, a.rounds, a.steps, log, longs,
                                   not a.no_warmup)  # "4" | "3" | "mixed"
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    log("| shape | " + " | ".join(f"{n} b1 tok/s (replay ms) | b8" for n, _ in variants) + " | ratio |")
    for sb, res in out["shapes"].items():
        cells = [f"{res[n]['median']['b1_tok_s']:.0f} ({res[n]['median']['b1_replay_ms']:.3f}, "
                 f"{res[n]['replay_spread_ms'][0]:.3f}-{res[n]['replay_spread_ms'][1]:.3f}) | "
                 f"{res[n]['median']['b8_tok_s']:.0f}" for n, _ in variants]
        ratio = " / ".join(f"{res[n]['b1_ratio_to_first']:.3f}" for n, _ in variants)
        eq = all(res[n]["tokens_equal_first"] for n, _ in variants)
        log(f"| {sb} | " + " | ".join(cells) + f" | {ratio} | tokens equal: {eq}")
        for L in longs:
            log(f"| {sb} L={L} | " + " | ".join(
                f"{res[n]['long'][str(L)]['median_tok_s']:.0f} ({res[n]['long'][str(L)]['median_replay_ms']:.3f}) | "
                f"short/long replay {res[n]['long'][str(L)]['ratio_to_short_replay']:.3f}" for n, _ in variants) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
