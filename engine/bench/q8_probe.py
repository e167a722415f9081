"""Would int8 activations make the batch-1 decode GEMVs faster? (device; #16, a go / no-go before any integration)

    python -m engine.bench.q8_probe --shapes 3b,7b,14b --out $OUT/q8_probe.json

kernels/decode_q8.cu computes the W4 g128 GEMV on x quantized as llama.cpp's batch-1 GEMVs quantize it (Q8_1 blocks of
32, dp4a integer dot products); the step's GEMVs put fp16 x into the mma. Per op of the step (qkv, o, gate_up, down;
random W4 weights of the exact shapes) this times, as engine/bench/l2_hot.py does (a graph of one launch per layer over
each layer's own weights, replayed; us per launch): the step's own GEMV (its plan, its epilogue) and the probe over a
sweep of plans (KSW warps and KSB blocks along K, MT tiles per warp; a probe's epilogue is a plain fp32 store, KSB > 1
adds atomically). Also: the x quantization alone (a launch per layer), the probe against its reference (exact integer
sums: relative error at fp32 rounding) and both numerics against the exact product (what int8 x costs in accuracy).
"""
from __future__ import annotations

import argparse
import itertools
import sys

import torch

from engine.bench.decode_ab import run_header
from engine.bench.decode_bench import scheme_weights
from engine.bench.envinfo import emit_json
from engine.bench.tree_profile import launch_us, layer_gemvs
from engine.config import QWEN25_SHAPES, ModelConfig
from engine.model.gpu_model import GPUModel
from kernels.pack import dequantize, unpack_w4
from kernels.q8_kernels import Q8Kernels, grid_blocks
from kernels.q8_reference import gemv_q8_ref, mma_pack, quant_x_q8_ref, unpermute_q8

def plans(N: int, K: int, sms: int) -> list[tuple[int, int, int]]:
    """(KSW, KSB, MT) worth timing: every warp >= 2 groups of 128, at least half the SMs given a block."""
    G = K // 128
    out = []
    for ksw, ksb, mt in itertools.product((1, 2, 4, 8), (1, 2, 4, 8), (1, 2)):
        if N % (16 * mt) or G // (ksw * ksb) < 2 or grid_blocks(N, mt, ksw) * ksb < sms // 2:
            continue
        out.append((ksw, ksb, mt))
    return out


def mma_row(m, w, name: str, op, kq: Q8Kernels, x8: torch.Tensor) -> dict:
    """The mma form (decode_q8.cu q8m_body) of one op: a sweep at batch 1, then batch 8 at its best plan beside the
    step's GEMV at batch 8 (us per launch, a launch per layer, cold)."""
    n = len(w.layers)
    Ws = [getattr(L, name) for L in w.layers]
    packed = [mma_pack(W.qweight) for W in Ws]
    N, K = Ws[0].N, Ws[0].K
    xq = torch.empty(8, K, dtype=torch.int8, device="cuda")
    dx = torch.empty(8, K // 32, dtype=torch.float32, device="cuda")
    sx = torch.empty_like(dx)
    for b in range(8):
        kq.quant_x(x8[b, :K].contiguous(), xq[b], dx[b], sx[b])
    out = torch.zeros(8, N, dtype=torch.float32, device="cuda")
    sweep = {}
    for ksw, ksb, mt in plans(N, K, kq.sms):
        sweep[f"{ksw}x{ksb}x{mt}"] = launch_us(m, lambda ksw=ksw, ksb=ksb, mt=mt: [
            kq.gemv_mma(W, P, xq, dx, sx, out, 1, ksw, ksb, mt) for W, P in zip(Ws, packed)], n)
    mb = min(sweep, key=sweep.get)
    ksw, ksb, mt = map(int, mb.split("x"))
    row = {"sweep_us": sweep, "best": mb, "b1_us": sweep[mb],
           "b8_us": launch_us(m, lambda: [kq.gemv_mma(W, P, xq, dx, sx, out, 8, ksw, ksb, mt)
                                          for W, P in zip(Ws, packed)], n),
           "step_b8_us": launch_us(m, lambda: [op(L, 8) for L in w.layers], n)}
    # the mma form against the reference at batch 3 (tokens 0..2), and its batch-1 row equal to its batch-3 row 0
    q = unpack_w4(Ws[0].qweight.cpu(), K).cuda()
    errs = []
    for b in range(3):
        rq, rd, rs = quant_x_q8_ref(x8[b, :K])
        ref = gemv_q8_ref(q, Ws[0].scales, Ws[0].mins, rq.cuda(), rd.cuda(), rs.cuda())
        out.zero_()
        kq.gemv_mma(Ws[0], packed[0], xq, dx, sx, out, 3, ksw, ksb, mt)
        torch.cuda.synchronize()
        errs.append((out[b].double() - ref).abs().max().item() / ref.abs().max().item())
    row["vs_ref_max_rel_b3"] = max(errs)
    if ksb == 1:  # deterministic: batch 1's row 0 must be batch 3's row 0 bit for bit
        o3 = out[0].clone()
        out.zero_()
        kq.gemv_mma(Ws[0], packed[0], xq, dx, sx, out, 1, ksw, ksb, mt)
        torch.cuda.synchronize()
        row["b1_equals_b3_row0"] = bool(torch.equal(out[0], o3))
    return row


def probe_shape(shape: str, kq: Q8Kernels, check: bool, variants: dict[str, Q8Kernels] | None = None,
                mma: bool = False) -> dict:
    cfg = ModelConfig(**QWEN25_SHAPES[shape])
    w = scheme_weights(cfg, 4, torch.device("cuda"))
    m = GPUModel(w, 1, 512, "cuda")
    m.decode([1], [0], [0])  # the step's buffers and kernels ready
    n = len(w.layers)
    gen = torch.Generator(device="cpu").manual_seed(0)
    res = {}
    for name, op in layer_gemvs(m).items():
        W0 = getattr(w.layers[0], name)
        N, K = W0.N, W0.K
        row = {"N": N, "K": K, "bytes": W0.nbytes()}
        row["step_us"] = launch_us(m, lambda op=op, layers=w.layers: [op(L, 1) for L in layers], n)
        x = (torch.randn(K, generator=gen) * 0.5).half().cuda()
        xq = torch.empty(K, dtype=torch.int8, device="cuda")
        dx = torch.empty(K // 32, dtype=torch.float32, device="cuda")
        sx = torch.empty_like(dx)
        kq.quant_x(x, xq, dx, sx)
        row["quant_x_us"] = launch_us(m, lambda: [kq.quant_x(x, xq, dx, sx) for _ in range(n)], n)
        out = torch.zeros(N, dtype=torch.float32, device="cuda")
        sweep = {}
        Ws = [getattr(L, name) for L in w.layers]
        for ksw, ksb, mt in plans(N, K, kq.sms):
            sweep[f"{ksw}x{ksb}x{mt}"] = launch_us(
                m, lambda ksw=ksw, ksb=ksb, mt=mt, Ws=Ws: [kq.gemv(Wl, xq, dx, sx, out, ksw, ksb, mt) for Wl in Ws], n)
        best = min(sweep, key=sweep.get)
        row.update(probe_sweep_us=sweep, probe_best=best, probe_us=sweep[best],
                   probe_over_step=sweep[best] / row["step_us"])
        ksw, ksb, mt = map(int, best.split("x"))
        for vn, kv in (variants or {}).items():  # another build of the probe at the best plan
            row.setdefault("variants_us", {})[vn] = launch_us(
                m, lambda kv=kv, Ws=Ws: [kv.gemv(Wl, xq, dx, sx, out, ksw, ksb, mt) for Wl in Ws], n)
        if check:
            xq_r, dx_r, sx_r = quant_x_q8_ref(x)
            row["quant_x_exact"] = bool(torch.equal(unpermute_q8(xq.cpu()), xq_r) and torch.equal(dx.cpu(), dx_r)
                                        and torch.equal(sx.cpu(), sx_r))
            q = unpack_w4(W0.qweight.cpu(), K).cuda()
            ref = gemv_q8_ref(q, W0.scales, W0.mins, xq_r.cuda(), dx_r.cuda(), sx_r.cuda())
            exact = dequantize(q, W0.scales, W0.mins).double() @ x.double()
            scale = exact.abs().max().item()
            errs = {}
            for plan in dict.fromkeys((best, "1x1x1", "8x4x2")):
                ksw, ksb, mt = map(int, plan.split("x"))
                if (ksw, ksb, mt) not in plans(N, K, kq.sms) and plan != best:
                    continue
                out.zero_()
                kq.gemv(W0, xq, dx, sx, out, ksw, ksb, mt)
                torch.cuda.synchronize()
                errs[plan] = (out.double() - ref).abs().max().item() / scale
            row["probe_vs_ref_max_rel"] = errs
            d = ref - exact
            row["q8_vs_exact"] = {"max_rel": d.abs().max().item() / scale,
                                  "rms_rel": (d.pow(2).mean().sqrt() / exact.pow(2).mean().sqrt()).item()}
            d16 = exact.float().half().double() - exact  # what an fp16 output alone rounds away, for scale
            row["fp16_out_rounding_rms_rel"] = (d16.pow(2).mean().sqrt() / exact.pow(2).mean().sqrt()).item()
            del q
        if mma:
            x8 = (torch.randn(8, K, generator=gen) * 0.5).half().cuda()
            row["mma"] = r = mma_row(m, w, name, op, kq, x8)
            print(f"  {shape} {name} mma form: batch 1 {r['b1_us']:.2f} us ({r['best']}), batch 8 {r['b8_us']:.2f} "
                  f"(step's {r['step_b8_us']:.2f}); vs ref {r['vs_ref_max_rel_b3']:.1e}, "
                  f"b1 = b3 row 0: {r.get('b1_equals_b3_row0')}", flush=True)
        res[name] = row
        print(f"| {shape} | {name} | {N}x{K} | {row['step_us']:.2f} | {row['probe_us']:.2f} ({best}) | "
              f"{row['probe_over_step']:.2f} | {row['quant_x_us']:.2f} |"
              + (f" {max(row['probe_vs_ref_max_rel'].values()):.1e} | {row['q8_vs_exact']['rms_rel']:.1e} |"
                 if check else ""), flush=True)
    res["chain"] = chain_us(m, w, kq, {op: tuple(map(int, r["probe_best"].split("x"))) for op, r in res.items()})
    c = res["chain"]
    print(f"  {shape} chain per layer: step's 4 GEMVs {c['step_us']:.2f} us, probe's {c['probe_us']:.2f} "
          f"({c['probe_us'] / c['step_us']:.2f}), with a quantize launch before each {c['probe_quant_us']:.2f} "
          f"({c['probe_quant_us'] / c['step_us']:.2f})", flush=True)
    del m, w
    torch.cuda.empty_cache()
    return res


def chain_us(m, w, kq: Q8Kernels, best: dict[str, tuple[int, int, int]]) -> dict[str, float]:
    """us per layer of the four GEMVs in sequence (qkv, o, gate_up, down: each layer's own weights, PDL between
    them, no attention or norm): the step's kernels on the step's buffers, the probe's at each op's best plan on one
    quantized x, and the probe's with a q8_quant_x launch before each GEMV (what quantizing in its own launch would
    cost; fused into the producers' epilogues it would cost less)."""
    ops = layer_gemvs(m)
    n = len(w.layers)
    K = {name: getattr(w.layers[0], name).K for name in ops}  # each GEMV's input width
    Kmax = max(K.values())
    x = (torch.randn(Kmax) * 0.5).half().cuda()
    xq = torch.empty(Kmax, dtype=torch.int8, device="cuda")
    dx = torch.empty(Kmax // 32, dtype=torch.float32, device="cuda")
    sx = torch.empty_like(dx)
    kq.quant_x(x, xq, dx, sx)
    outs = {name: torch.zeros(getattr(w.layers[0], name).N, dtype=torch.float32, device="cuda") for name in K}

    def step():
        for L in w.layers:
            for name in ("qkv", "o", "gate_up", "down"):
                ops[name](L, 1)

    def probe(quant: bool):
        for L in w.layers:
            for name in ("qkv", "o", "gate_up", "down"):
                if quant:
                    kq.quant_x(x[:K[name]], xq, dx, sx)
                kq.gemv(getattr(L, name), xq, dx, sx, outs[name], *best[name])

    return {"step_us": launch_us(m, step, n), "probe_us": launch_us(m, lambda: probe(False), n),
            "probe_quant_us": launch_us(m, lambda: probe(True), n)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="3b,7b,14b")
    ap.add_argument("--check", default="3b", help="shapes whose outputs are checked against the references")
    ap.add_argument("--variants", default="ptrs:-DQ8_PTRS=1,loads:-DQ8_LOADS_ONLY=1",
                    help="name:-D flags,... other builds of the probe, timed at each op's best plan")
    ap.add_argument("--mma", default="", help="shapes whose ops also time the mma form (batch 1 sweep, batch 8)")
    ap.add_argument("--out", default="q8_probe.json")
    ap.add_argument("--commit", default="unknown")
    a = ap.parse_args(argv)
    res = run_header("engine.bench.q8_probe", argv, a.commit,
                     "per op a graph of one batch-1 launch per layer over each layer's own weights, replayed; us per "
                     "launch: the step's GEMV (its plan and epilogue) vs the int8-x probe (decode_q8.cu) at its best "
                     "plan of a sweep; x quantization timed alone; errors relative to max |exact|")
    kq = Q8Kernels()
    variants = {v.split(":")[0]: Q8Kernels(defines=tuple(v.split(":", 1)[1].split())) for v in a.variants.split(",") if v}
    res["variants"] = a.variants
    res["shapes"] = {}
    print("| shape | op | N x K | step us | probe us (plan) | probe / step | quant x us | probe vs ref | q8 rms err |")
    for shape in a.shapes.split(","):
        res["shapes"][shape] = probe_shape(shape, kq, shape in a.check.split(","), variants,
                                           shape in a.mma.split(","))
        for op, row in res["shapes"][shape].items():
            if row.get("variants_us"):
                print(f"  {shape} {op} at {row['probe_best']}: base {row['probe_us']:.2f} us, " +
                      ", ".join(f"{k} {v:.2f}" for k, v in row["variants_us"].items()), flush=True)
    emit_json(res, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
