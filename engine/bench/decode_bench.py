"""GPU decode benchmark (run on the device machine; it measures, the checks are GPU tests):

    python -m engine.bench.decode_bench --out $OUT/gpu_decode_h200.json [--commit SHA] [--quick]

Per-kernel timings in CUDA graphs and the model-level decode benchmark: batch 1, 128 new tokens, 3B and 7B
shapes, W4 and W3 (batch 1 through GPUModel.decode_chain, the path of a lone greedy request, with the host-driven
loop's speed and the equality of both token streams beside it); batch 8 total throughput; bandwidth as a fraction of measured copy bandwidth; decode with
a long context cached. The kernels vs their references and the GPU runner vs the CPU runner are asserted by
tests/test_gpu_decode.py (`python -m engine.bench.device --suite tests`).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback

import torch

from engine.bench.envinfo import module_command
from engine.config import QWEN25_SHAPES, ModelConfig
from engine.model.gpu_load import random_weights
from engine.model.gpu_model import GPUModel
from kernels.checks import rand_qweight, time_kernels
from kernels.decode_kernels import DecodeKernels


def log(*a):
    print(*a, flush=True)


def env_info(commit: str) -> dict:
    import cupy  # CuPy: optional (GPU only)
    drv = ""
    try:
        drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:
        pass
    p = torch.cuda.get_device_properties(0)
    return {"device": p.name, "sms": p.multi_processor_count, "capability": f"{p.major}.{p.minor}",
            "driver": drv, "torch": torch.__version__, "cupy": cupy.__version__, "cuda": torch.version.cuda,
            "git_commit": commit, "command": module_command(), "date": time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                                                                        time.gmtime())}


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second (the ceiling for a memory-bound kernel)."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(10):
        b.copy_(a)
    e1.record()
    e1.synchronize()
    return 2 * a.numel() * 10 / (e0.elapsed_time(e1) / 1e3)


def model_speed_nopdl(shape: str, bits: int, copy_bw: float) -> dict:
    """The same decode benchmark with programmatic dependent launch off (ordinary launches)."""
    kn = DecodeKernels.get()
    saved, kn.pdl = kn.pdl, None
    try:
        return model_speed(shape, bits, copy_bw)
    finally:
        kn.pdl = saved


def timed_decode(m: GPUModel, B: int, steps: int, prompt: list[int]) -> tuple[float, float, list[int]]:
    """B sequences (slots 0..B-1) prefilled with `prompt`, then `steps` greedy batch-B decode steps after the
    capturing one: (wall seconds of those steps, host round trips included; seconds per replay of the step's
    graph, the mean of 20; sequence 0's tokens)."""
    for s in range(B):
        m.prefill(prompt, s, 0)
    toks, n0 = [prompt[-1]] * B, len(prompt)
    toks, _ = m.decode(toks, [n0] * B, list(range(B)))  # capture + first step
    seq = [toks[0]]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        toks, _ = m.decode(toks, [n0 + 1 + i] * B, list(range(B)))
        seq.append(toks[0])
    dt = time.perf_counter() - t0
    return dt, replay_seconds(m.decode_graph(B, n0 + steps)), seq  # the long-context graphs from merge_from rows


def replay_seconds(g, n: int = 20) -> float:
    """Seconds per replay of a captured graph, the mean of n back to back (CUDA events)."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(n):
        g.replay()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / 1e3 / n


def timed_chain(m: GPUModel, B: int, steps: int, prompt: list[int]) -> tuple[float, list[int]]:
    """The same B sequences and steps through GPUModel.decode_chain (what the runner does for a lone greedy request:
    each step queued before the host reads the one before): (wall seconds of the steps after the first, sequence
    0's tokens)."""
    for s in range(B):
        m.prefill(prompt, s, 0)
    n0, seq, t = len(prompt), [], []

    def on_ids(ids):
        t.append(time.perf_counter())
        seq.append(ids[0])
        return True
    m.decode_chain([prompt[-1]] * B, [n0] * B, list(range(B)), steps + 1, on_ids)
    return t[-1] - t[0], seq


def scheme_weights(cfg: ModelConfig, bits, device):
    """Random packed weights of a scheme: bits 4 | 3, or "mixed" (engine/quant/scheme.py: attention, the first and last
    layers, embedding and head 4-bit; the other layers' MLP 3-bit: the seed's 7B-on-4-GB configuration)."""
    from engine.model.layout import FIELDS, LINEARS
    from engine.quant.scheme import linear_bits
    L = cfg.num_layers
    if isinstance(bits, str) and bits.startswith("w3-"):  # "w3-gate_up+down": those linears 3-bit, the rest 4 (A/B)
        mods = bits[3:].split("+")
        lay = {f"layers.{i}.{m}": (3 if FIELDS[m] in mods else 4, 128) for i in range(L) for m in LINEARS}
        return random_weights(cfg, 4, device, layouts=lay)
    if bits != "mixed":
        return random_weights(cfg, int(bits), device)
    lay = {f"layers.{i}.{m}": (linear_bits("mixed", m, i, L), 128) for i in range(L) for m in LINEARS}
    return random_weights(cfg, 4, device, layouts=lay)


def model_speed(shape: str, bits, copy_bw: float, new_tokens: int = 128) -> dict:
    cfg = ModelConfig(**QWEN25_SHAPES[shape])
    w = scheme_weights(cfg, bits, torch.device("cuda"))
    m = GPUModel(w, 8, 4096, "cuda")
    prompt = list(range(1000, 1032))
    res = {"shape": shape, "bits": bits, "weights_bytes": w.nbytes(), "prompt_tokens": len(prompt)}
    n0 = len(prompt)
    for B in (1, 8):
        dt, replay, host_seq = timed_decode(m, B, new_tokens, prompt)
        dtc, chain_seq = timed_chain(m, B, new_tokens, prompt)
        host_tps = B * new_tokens / dt
        if B == 1:  # a lone greedy request chains its steps (GPURunner._decode_chain): that is its speed
            dt = dtc
        # bytes a step must read: every linear + lm_head (the embedding row is negligible)
        lin = sum(x.nbytes() for L in w.layers for x in (L.qkv, L.o, L.gate_up, L.down)) + w.lm_head.nbytes()
        kv = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2 * (n0 + new_tokens // 2) * B
        res[f"b{B}"] = {"tok_s": B * new_tokens / dt, "step_ms": dt / new_tokens * 1e3, "replay_ms": replay * 1e3,
                        "bytes_per_step": lin + kv, "achieved_GBps": (lin + kv) / replay / 1e9,
                        "fraction_of_copy_bw": (lin + kv) / replay / copy_bw,
                        "host_loop_tok_s": host_tps, "chain_tok_s": B * new_tokens / dtc,
                        "chain_tokens_equal": chain_seq == host_seq, "path": "chain" if B == 1 else "host loop"}
        log(f"  {shape} w{bits} batch {B}: {B * new_tokens / dt:8.1f} tok/s  step {dt / new_tokens * 1e3:.3f} ms "
            f"[host loop {host_tps:.1f}, chain {B * new_tokens / dtc:.1f} tok/s, same tokens: {chain_seq == host_seq}] "
            f"(graph replay {replay * 1e3:.3f} ms, {(lin + kv) / replay / 1e9:.0f} GB/s = "
            f"{(lin + kv) / replay / copy_bw:.0%} of copy bw)")
    del m, w
    torch.cuda.empty_cache()
    return res


def long_tok_s(m: GPUModel, L: int, steps: int) -> float:
    """Batch-1 tok/s over `steps` host-driven steps of slot 0 after L cached tokens (positions set directly: the
    cache's contents do not change the speed); the first step (a capture on a new model) is not timed."""
    m.decode([7], [L], [0])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        m.decode([7], [L + 1 + i], [0])
    return steps / (time.perf_counter() - t0)


def long_chain_tok_s(m: GPUModel, L: int, steps: int) -> float:
    """The same as long_tok_s through GPUModel.decode_chain, the path a lone greedy request takes (each step queued
    before the host reads the one before): tok/s over the steps after the first of one chain of steps + 1."""
    m.decode_chain([7], [L], [0], 2, lambda ids: True)  # captures the chain graph of this context's mode
    torch.cuda.synchronize()
    t = []

    def on_ids(ids):
        t.append(time.perf_counter())
        return True
    m.decode_chain([7], [L], [0], steps + 1, on_ids)
    return steps / (t[-1] - t[0])


def long_context(shape: str = "3b", bits: int = 4, steps: int = 32) -> dict:
    """Batch-1 decode tok/s with 4k / 16k / 32k tokens already in the cache (cache contents do not change
    the speed; positions are set directly): {L: host-driven steps} as before, and "chain": {L: chained steps}, the
    path of a lone greedy request and of the speed section's batch-1 figure."""

    cfg = ModelConfig(**QWEN25_SHAPES[shape])
    m = GPUModel(random_weights(cfg, bits, torch.device("cuda")), 1, 32768, "cuda")
    out, chain = {}, {}
    for L in (64, 4096, 16384, 32000):
        out[L] = long_tok_s(m, L, steps)
        chain[L] = long_chain_tok_s(m, L, 4 * steps)
        log(f"  {shape} w{bits} batch 1 with {L} tokens in the cache: {out[L]:.1f} tok/s host loop, "
            f"{chain[L]:.1f} chained ({chain[L] / chain[64]:.3f} of short)")
    out["chain"] = chain
    del m
    torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu_decode.json")
    ap.add_argument("--commit", default=os.environ.get("GIT_COMMIT", "unknown"))
    ap.add_argument("--quick", action="store_true", help="checks + 3B W4 only")
    ap.add_argument("--skip", default="", help="comma list of sections to skip: timing,speed,speed_nopdl,long_context")
    ap.add_argument("--shapes", default="3b:4,3b:3,7b:4,7b:3", help="shape:bits list for speed and timing (14b:4 "
                    "too, and bits 'mixed', e.g. 7b:mixed: speed only)")
    a = ap.parse_args(argv)
    skip = set(filter(None, a.skip.split(",")))
    out: dict = {"env": env_info(a.commit)}
    kn = DecodeKernels.get()
    if kn.pdl is not None:  # smoke test: one PDL launch in a graph vs an ordinary launch
        try:
            g = torch.Generator().manual_seed(0)
            w = rand_qweight(2560, 2048, 4, torch.device("cuda"), g, bias=True)
            x = torch.randn(8, 2048, generator=g).half().cuda()
            y1, y2 = torch.zeros(1, 2560).half().cuda(), torch.zeros(1, 2560).half().cuda()
            kn.gemv(w, x, 1, "store", y1)
            cg = torch.cuda.CUDAGraph()
            with torch.cuda.graph(cg):
                kn.gemv(w, x, 1, "store", y2)
            cg.replay()
            torch.cuda.synchronize()
            saved, kn.pdl = kn.pdl, None
            y3 = torch.zeros(1, 2560).half().cuda()
            kn.gemv(w, x, 1, "store", y3)
            kn.pdl = saved
            torch.cuda.synchronize()
            assert torch.equal(y1, y3) and torch.equal(y2, y3), "PDL result differs"
        except Exception as e:
            out["env"]["pdl_error"] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
            kn.pdl = None
    out["env"]["pdl"] = kn.pdl is not None
    log(f"   programmatic dependent launch: {out['env']['pdl']}")
    log(json.dumps(out["env"]))

    def section(name, fn):
        if name in skip:
            return
        t0 = time.perf_counter()
        log(f"== {name}")
        try:
            out[name] = fn()
        except Exception as e:  # keep going: one call should report on every section
            out[name] = {"error": f"{type(e).__name__}: {e}"}
            traceback.print_exc()
        log(f"   ({time.perf_counter() - t0:.1f} s)")
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1, default=str)

    section("copy_bw", lambda: {"bytes_per_s": copy_bandwidth()})
    bw = out.get("copy_bw", {}).get("bytes_per_s", 4.24e12)
    log(f"   copy bandwidth {bw / 1e12:.2f} TB/s")
    shapes = [("3b", 4)] if a.quick else [(s, b if b == "mixed" else int(b))
                                          for s, b in (x.split(":") for x in a.shapes.split(","))]
    section("speed", lambda: [model_speed(s, b, bw) for s, b in shapes])
    section("speed_nopdl", lambda: [model_speed_nopdl(s, b, bw) for s, b in shapes[:1] + shapes[2:3]])
    section("long_context", long_context)
    section("timing", lambda: {f"{s}_w{b}": time_kernels(ModelConfig(**QWEN25_SHAPES[s]), b, log)
                               for s, b in shapes if s != "14b" and b != "mixed"})
    failed = [k for k, v in out.items() if isinstance(v, dict) and "error" in v]
    log(f"== done: {len(failed)} sections failed {failed}; wrote {a.out}")
    if isinstance(out.get("speed"), list):
        log("| shape | bits | batch 1 tok/s | batch 8 tok/s | b1 step ms | b1 % copy bw |")
        for r in out["speed"]:
            log(f"| {r['shape']} | {r['bits']} | {r['b1']['tok_s']:.0f} | {r['b8']['tok_s']:.0f} | "
                f"{r['b1']['step_ms']:.3f} | {r['b1']['fraction_of_copy_bw']:.0%} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
