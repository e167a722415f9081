"""Where the decode time goes (device): GEMV variants (full / no ones-mma / loads only) on the 3B shapes,
SM clock while the decode graph replays, and one kernel of each kind for ncu."""
from __future__ import annotations

import subprocess
import sys
import time

import torch

from engine.config import QWEN25_SHAPES, ModelConfig
from engine.model.gpu_load import random_weights
from engine.model.gpu_model import GPUModel
from kernels import pack
from kernels.checks import graph_time
from kernels.decode_kernels import MT, AttnWorkspace, DecodeKernels
from kernels.qweight import QWeight


def gemv_variants():
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    kns = {v: DecodeKernels(0, (f"-DGEMV_VARIANT={v}",)) for v in (0, 1, 2)}
    kns["tiled"] = DecodeKernels(0, ("-DGEMV_TILED=1",))  # 16-row-tile-major weights (pack.tile_rows)
    kns["tiled_loads"] = DecodeKernels(0, ("-DGEMV_TILED=1", "-DGEMV_VARIANT=2"))
    for name, N, K, epi, bits in [("gate_up", 22016, 2048, "silu", 4), ("down", 2048, 11008, "resid", 4),
                                  ("lm_head", 151936, 2048, "logits", 4), ("qkv", 2560, 2048, "store", 4)]:
        # (W4 only: W3's words have their own tile layout since layout 3, kernels/pack.py)
        one = N * K * bits // 8 + N * K // 128 * 4
        copies = max(1, min(16, -(-150_000_000 // one)))
        ws = [QWeight(N, K, bits, qweight=torch.randint(-2**31, 2**31 - 1, (N, pack.packed_words(K, bits)),
                                                        dtype=torch.int32, device=dev, generator=g),
                      scales=torch.rand(N, K // 128, device=dev).half(), mins=torch.rand(N, K // 128, device=dev).half(),
                      bias=torch.zeros(N, device=dev).half()) for _ in range(copies)]
        x = torch.randn(8, K, device=dev).half()
        out = torch.zeros(8, N, device=dev)
        keys = torch.zeros(8, dtype=torch.int64, device=dev)
        tiled = [QWeight(N, K, bits, qweight=pack.tile_rows(w.qweight, K), scales=pack.tile_rows(w.scales, K),
                         mins=pack.tile_rows(w.mins, K), bias=w.bias) for w in ws]
        row = []
        for B in (1, 3):  # the tiled layout reads the same values in the same lanes: bit-identical results
            o1, o2 = torch.zeros_like(out), torch.zeros_like(out)
            kns[0].gemv(ws[0], x, B, epi, o1, keys)
            kns["tiled"].gemv(tiled[0], x, B, epi, o2, keys)
            torch.cuda.synchronize()
            row.append(f"tiled==v0(B{B}) {torch.equal(o1, o2)}")
        for v, kn in kns.items():
            src = tiled if str(v).startswith("tiled") else ws
            t = graph_time([lambda w=w: kn.gemv(w, x, 1, epi, out, keys) for w in src] * max(1, 8 // copies))
            row.append(f"v{v} {t * 1e6:6.1f} us {one / t / 1e9:5.0f} GB/s")
        print(f"{name:<8} w{bits} N={N} K={K}: " + " | ".join(row), flush=True)


def clocks_during_decode():
    cfg = ModelConfig(**QWEN25_SHAPES["3b"])
    m = GPUModel(random_weights(cfg, 4, torch.device("cuda")), 1, 4096, "cuda")
    m.prefill(list(range(100, 132)), 0, 0)
    m.decode([5], [32], [0])
    g = m.graphs[1]
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw", "--format=csv",
                            "-lms", "200"], stdout=subprocess.PIPE, text=True)
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < 2.0:
        for _ in range(50):
            g.replay()
        torch.cuda.synchronize()
        n += 50
    dt = time.perf_counter() - t0
    smi.terminate()
    print(f"3b w4 graph replay sustained: {dt / n * 1e3:.3f} ms/step over {n} steps", flush=True)
    print(smi.communicate()[0][-600:], flush=True)


def one_of_each():
    """For ncu (3B shapes, batch 1): gate_up, down, qkv and lm_head GEMVs, an rmsnorm, one attention (L=64), twice.

    ncu --clock-control none --kernel-name regex:'^(gemv|attn|rmsnorm)' --launch-skip 6 \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --csv \
        python -m engine.bench.decode_profile ncu"""
    dev = torch.device("cuda")
    kn = DecodeKernels.get()

    def qw(N, K):
        return QWeight(N, K, 4, qweight=torch.randint(0, 2**31 - 1, (N, K // 8), dtype=torch.int32, device=dev),
                       scales=torch.rand(N, K // 128, device=dev).half(),
                       mins=torch.rand(N, K // 128, device=dev).half(), bias=torch.zeros(N, device=dev).half())
    N, K = 22016, 2048
    w = qw(N, K)
    wd, wq, wl = qw(2048, 11008), qw(2560, 2048), qw(151936, 2048)
    xd = torch.randn(8, 11008, device=dev).half()
    h = torch.randn(8, 2048, device=dev)
    nw = torch.ones(2048, device=dev)
    logits = torch.zeros(8, 151936, device=dev)
    keys = torch.zeros(8, dtype=torch.int64, device=dev)
    x = torch.randn(8, K, device=dev).half()
    out = torch.zeros(8, N // 2, device=dev).half()
    qkv_out = torch.zeros(8, 2560, device=dev).half()
    kc = torch.randn(1, 2, 4096, 128, device=dev).half()
    qkv = torch.randn(8, 2560, device=dev).half()
    meta = torch.tensor([[0], [63]], dtype=torch.int32, device=dev)
    cs = torch.rand(4096, 64, device=dev)
    ws = AttnWorkspace(8, 16, 2, 128, dev)
    o = torch.zeros(8, 2048, device=dev).half()
    for _ in range(2):
        kn.rmsnorm(h, nw, 1e-6, 1, x)
        kn.gemv(w, x, 1, "silu", out)
        kn.gemv(wd, xd, 1, "resid", h)
        kn.gemv(wq, x, 1, "store", qkv_out)
        kn.gemv(wl, x, 1, "logits", logits, keys)
        kn.attention(qkv, kc, kc.clone(), meta[0], meta[1], cs, cs, 1, 2, 8, 128, 4096, o, ws)
    torch.cuda.synchronize()


if __name__ == "__main__" and sys.argv[1] != "sweep":
    {"variants": gemv_variants, "clocks": clocks_during_decode, "ncu": one_of_each}[sys.argv[1]]()


def plan_sweep(bits: int = 4, shapes: tuple[str, ...] = ("3b", "7b")):
    """Every (KSW, KSB) for the linears of `shapes` at batch 1 (W4 or W3 weights: `sweep 3`; other shapes: `sweep 4
    14b`): is the planner's choice the fastest?"""
    dev = torch.device("cuda")
    kn = DecodeKernels.get()
    g = torch.Generator(device=dev).manual_seed(0)
    for shape in shapes:
        c = ModelConfig(**QWEN25_SHAPES[shape])
        for name, N, K, epi in [("qkv", c.q_size + 2 * c.kv_size, c.hidden_size, "store"),
                                ("o", c.hidden_size, c.q_size, "resid"),
                                ("gate_up", 2 * c.intermediate_size, c.hidden_size, "silu"),
                                ("down", c.hidden_size, c.intermediate_size, "resid")]:
            one = N * K * bits // 8 + N * K // 128 * 4
            copies = max(1, min(16, -(-150_000_000 // one)))
            ws = [QWeight(N, K, bits, qweight=torch.randint(-2**31, 2**31 - 1, (N, pack.packed_words(K, bits)),
                                                            dtype=torch.int32, device=dev, generator=g),
                          scales=torch.rand(N, K // 128, device=dev).half(),
                          mins=torch.rand(N, K // 128, device=dev).half(), bias=torch.zeros(N, device=dev).half())
                  for _ in range(copies)]
            x = torch.randn(8, K, device=dev).half()
            out = torch.zeros(8, N, device=dev)
            tiles = N // 32 if epi == "silu" else N // (16 * MT[epi])
            default = kn.tuned(epi, N, K) or kn.gemv_plan(tiles, K // 128)[:2] + (MT[epi],)  # what decode uses
            res = {}
            for mt in ((1, 2) if epi in ("store", "resid") else (2,)):
                tl = N // 32 if epi == "silu" else N // (16 * mt)
                for ksw in (1, 2, 4, 8):
                    for ksb in (1, 2, 4, 8):
                        if K // 128 < ksw * ksb or ksb * tl * 256 > kn.ws.numel() or tl * ksw * ksb < 264:
                            continue
                        t = graph_time([lambda w=w: kn.gemv(w, x, 1, epi, out, plan=(ksw, ksb), mt=mt)
                                        for w in ws] * max(1, 8 // copies), reps=10)
                        res[(ksw, ksb, mt)] = t * 1e6
            best = min(res, key=res.get)
            print(f"{shape} w{bits} {name:<8} default {default} {res.get(default, float('nan')):6.1f} us | best {best} "
                  f"{res[best]:6.1f} us | " + " ".join(f"{k[0]}x{k[1]}m{k[2]}:{v:.1f}" for k, v in sorted(res.items())),
                  flush=True)


if __name__ == "__main__" and sys.argv[1] == "sweep":
    plan_sweep(int(sys.argv[2]) if len(sys.argv) > 2 else 4, tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else
               ("3b", "7b"))
