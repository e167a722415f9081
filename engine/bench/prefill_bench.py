"""Prefill benchmark: correctness vs the CPU references, then speed and memory (one device call).

    python engine/bench/prefill_bench.py --out $OUT --commit <sha>

Writes gpu_prefill_h200.json (and prints a short table last). Sections, each recorded even if a
later one fails: kernel checks on fresh random inputs, whole-model GPU prefill vs the CPU model and
chunked == at once, peak memory (3B W4, 4,096-token cache), per-linear fused vs dequant+cuBLAS,
whole-model prefill tok/s (3B, 7B; CUDA graph per length), decode step vs context length.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

import engine.model.gpu_prefill as gp  # noqa: E402
from engine.bench.envinfo import module_command
from engine.bench.prefill_model import GPUModel, random_qweight  # noqa: E402
from engine.config import QWEN25_SHAPES, ModelConfig  # noqa: E402
from engine.model.qwen2 import KVCache  # noqa: E402
from kernels.ops_reference import RMSNorm, Rotary, silu_and_mul  # noqa: E402
from kernels.prefill_reference import attention_reference, dequant_reference  # noqa: E402

R: dict = {}


def rel(a, b) -> float:
    a, b = a.float().cpu(), b.float().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def events_ms(fn, iters: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return sorted(times)[len(times) // 2]


def graphed(fn):
    """Warm up eagerly (Triton compile, scratch, flash probe), capture one CUDA graph, return replay."""
    fn()
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def check_kernels():
    dev, out = "cuda", []
    g = torch.Generator(device=dev).manual_seed(int(time.time()))
    for bits in (4, 3):
        for (N, K) in ((2560, 2048), (2048, 11008), (1000, 384)):
            w = random_qweight(N, K, bits, True, dev, g)
            buf = torch.full((N * K,), float("nan"), dtype=torch.float16, device=dev)
            from kernels.prefill_triton import dequant_into  # optional: Triton (GPU only)
            d = dequant_into(w, buf)
            wref = dequant_reference(w)
            out.append(dict(what="dequant", bits=bits, N=N, K=K, max_abs=float((d.float().cpu() - wref).abs().max())))
            for T in (1, 48, 300, 512):
                x = torch.randn(T, K, device=dev, generator=g).half()
                ref = torch.nn.functional.linear(x.float().cpu(), wref, w.bias.float().cpu())
                for m in ("fused", "dequant"):
                    y = gp.linear_prefill(x, w, m)
                    out.append(dict(what=f"linear_{m}", bits=bits, N=N, K=K, T=T, rel=rel(y, ref),
                                    nan=bool(torch.isnan(y).any())))
    for (H, Hkv) in ((16, 2), (28, 4)):
        for (T, qs) in ((48, 0), (512, 0), (100, 900), (257, 3000), (1, 4000), (1, 16383)):
            L, cap = qs + T, qs + T + 37  # k/v are views of a longer cache, as in the engine
            q = torch.randn(T, H, 128, device=dev, generator=g).half()
            k = torch.randn(Hkv, cap, 128, device=dev, generator=g).half()
            v = torch.randn(Hkv, cap, 128, device=dev, generator=g).half()
            o = gp.attention_prefill(q, k[:, :L], v[:, :L], qs)
            out.append(dict(what="attention", H=H, Hkv=Hkv, T=T, q_start=qs,
                            rel=rel(o, attention_reference(q, k[:, :L], v[:, :L], qs))))
    from kernels.prefill_elementwise import add_rmsnorm, rope_qkv_to_cache, silu_mul  # optional: Triton (GPU only)
    for T in (1, 48, 700):
        h = torch.randn(T, 2048, device=dev, generator=g).half()
        dlt = torch.randn(T, 2048, device=dev, generator=g).half()
        nw = (1 + 0.1 * torch.randn(2048, device=dev, generator=g)).half()
        ref_norm = RMSNorm(2048, 1e-6)
        ref_norm.weight.data.copy_(nw.float().cpu())
        hs = (h.float() + dlt.float()).half().float().cpu()
        y = add_rmsnorm(h, dlt, nw, 1e-6)
        out.append(dict(what="add_rmsnorm", T=T, rel=rel(y, ref_norm(hs)), resid_rel=rel(h, hs)))
        gu = torch.randn(T, 2 * 11008, device=dev, generator=g).half()
        out.append(dict(what="silu_mul", T=T, rel=rel(silu_mul(gu), silu_and_mul(gu.float().cpu()))))
        H, Hkv, hd, qs, cap = 16, 2, 128, 37, 1024
        rope = Rotary(hd, cap, 1e6, device=dev)
        qkv = torch.randn(T, (H + 2 * Hkv) * hd, device=dev, generator=g).half()
        kc = torch.zeros(Hkv, cap, hd, dtype=torch.float16, device=dev)
        vc = torch.zeros_like(kc)
        qr = rope_qkv_to_cache(qkv, rope.cos, rope.sin, qs, kc, vc, H, Hkv)
        pos = torch.arange(qs, qs + T)
        rc = Rotary(hd, cap, 1e6)
        q, k, v = qkv.float().cpu().split([H * hd, Hkv * hd, Hkv * hd], -1)
        out.append(dict(what="rope_cache", T=T, q_rel=rel(qr, rc.apply(q.view(T, H, hd), pos)),
                        k_rel=rel(kc[:, qs:qs + T], rc.apply(k.view(T, Hkv, hd), pos).transpose(0, 1)),
                        v_rel=rel(vc[:, qs:qs + T], v.view(T, Hkv, hd).transpose(0, 1)),
                        untouched=float(kc[:, :qs].abs().max()) == 0 and float(kc[:, qs + T:].abs().max()) == 0))
    bad = [r for r in out if not r.get("untouched", True) or r.get("nan") or r.get("max_abs", 0) > 1e-3
           or any(x > 3e-3 for kk, x in r.items() if kk.endswith("rel") and isinstance(x, float))]
    R["kernel_checks"] = dict(cases=out, failures=bad, passed=not bad, flash_gqa=gp._flash_ok(torch.device(dev)))


def check_model():
    """GPU prefill (random W4, 0.5B shape cut to 3 layers) vs the CPU reference model; chunked vs at once."""
    cfg = ModelConfig(**{**QWEN25_SHAPES["0.5b"], "num_layers": 3})
    m = GPUModel(cfg, 4, 1024, seed=int(time.time()) % 1000)
    T = 300
    ids = torch.randint(0, cfg.vocab_size, (T,))
    logits = m.forward(ids.cuda(), 0)
    kv_gpu = (m.k[:, :, :T].clone(), m.v[:, :, :T].clone())
    cpu = m.to_cpu_model(1024)
    cache = KVCache(cfg, 1, 1024)
    ref = cpu(ids.unsqueeze(0), cache, [0], [0])[0]
    res = dict(T=T, logits_rel=rel(logits, ref), argmax_same=int(logits.argmax()) == int(ref.argmax()),
               k_rel=rel(kv_gpu[0], cache.k[:, 0, :, :T]), v_rel=rel(kv_gpu[1], cache.v[:, 0, :, :T]))
    for budget in (128, 64):
        m.k.zero_(), m.v.zero_()
        for sl in gp.prefill_chunks(T, budget):
            lc = m.forward(ids[sl].cuda(), sl.start)
        res[f"chunked{budget}_vs_once_logits_rel"] = rel(lc, logits)
        res[f"chunked{budget}_vs_once_k_rel"] = rel(m.k[:, :, :T], kv_gpu[0])
        res[f"chunked{budget}_vs_cpu_logits_rel"] = rel(lc, ref)
    res["passed"] = res["logits_rel"] < 2e-2 and res["argmax_same"] and res["k_rel"] < 1e-2 and \
        res["chunked128_vs_once_logits_rel"] < 2e-2
    R["model_check"] = res


def memory_3b():
    """Peak GPU memory: 3B W4 (fp16 tied embedding), one 4,096-token cache, a 4,096-token prompt
    prefilled in 2,048-token chunks, then 16 decode steps."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    m = GPUModel(ModelConfig(**QWEN25_SHAPES["3b"]), 4, 4096)
    wb = m.weight_bytes()
    ids = torch.randint(0, 151936, (4096,), device="cuda")
    for sl in gp.prefill_chunks(4096 - 16, gp.PREFILL_CHUNK):
        m.forward(ids[sl], sl.start)
    for p in range(4096 - 16, 4096):
        m.forward(ids[p:p + 1], p)
    torch.cuda.synchronize()
    gib = 1 << 30
    R["memory_3b_w4_ctx4096"] = dict(
        weights_gib=wb / gib, kv_cache_gib=(m.k.numel() + m.v.numel()) * 2 / gib,
        peak_allocated_gib=(torch.cuda.max_memory_allocated() - base) / gib,
        peak_reserved_gib=torch.cuda.max_memory_reserved() / gib,
        note="torch allocator only; the CUDA context (about 0.3-0.5 GiB, driver-dependent) is extra")
    del m
    torch.cuda.empty_cache()


def bench_linears():
    out, dev = [], "cuda"
    g = torch.Generator(device=dev).manual_seed(1)
    shapes = {"3b": [("qkv", 2560, 2048), ("o", 2048, 2048), ("gate_up", 22016, 2048), ("down", 2048, 11008)],
              "7b": [("gate_up", 37888, 3584), ("down", 3584, 18944)]}
    for model, sh in shapes.items():
        for name, N, K in sh:
            copies = max(1, int(256e6 // (N * K // 2)))  # rotate > 4x L2 so weights come from HBM
            ws = [random_qweight(N, K, 4, name == "qkv", dev, g) for _ in range(copies)]
            for T in (1, 16, 48, 128, 256, 512, 2048):
                x = torch.randn(T, K, device=dev, generator=g).half()
                row = dict(model=model, name=name, N=N, K=K, T=T)
                for meth in ("fused", "dequant"):  # CUDA graph of the loop: no launch overhead
                    gr = graphed(lambda: [gp.linear_prefill(x, w, meth) for w in ws])
                    ms = events_ms(gr.replay, 10) / copies
                    row[f"{meth}_us"] = ms * 1e3
                    row[f"{meth}_tflops"] = 2 * T * N * K / ms / 1e9
                    row[f"{meth}_weight_GBps"] = ws[0].nbytes() / ms / 1e6
                    del gr
                x16 = torch.randn(N, K, device=dev, generator=g).half()
                row["fp16_cublas_us"] = events_ms(lambda: torch.matmul(x, x16.t()), 10) * 1e3
                out.append(row)
    R["linears_w4"] = out
    # small-M tile shapes for the fused kernel (3B shapes, T=1 and 48): is any better than dequant+cuBLAS?
    import kernels.prefill_triton as pt  # optional: Triton (GPU only)
    variants = [dict(BN=64, BK=128, GROUP_M=1, num_warps=4, num_stages=4),
                dict(BN=128, BK=128, GROUP_M=1, num_warps=4, num_stages=3),
                dict(BN=256, BK=128, GROUP_M=1, num_warps=8, num_stages=3)]  # BK must divide 128
    vres = []
    for vi, var in enumerate(variants):
        pt.SMALL_M_OVERRIDE = var
        for T in (1, 48):
            tot = 0.0
            for name, N, K in shapes["3b"]:
                ws = [random_qweight(N, K, 4, name == "qkv", dev, g) for _ in range(max(1, int(256e6 // (N * K // 2))))]
                x = torch.randn(T, K, device=dev, generator=g).half()
                gr = graphed(lambda: [gp.linear_prefill(x, w, "fused") for w in ws])
                tot += events_ms(gr.replay, 10) / len(ws) * 1e3
                del gr
            vres.append(dict(variant=vi, T=T, layer_us=tot, **var))
    pt.SMALL_M_OVERRIDE = None
    base = {T: sum(r["dequant_us"] for r in out if r["model"] == "3b" and r["T"] == T) for T in (1, 48)}
    best = min((r for r in vres if r["T"] == 48), key=lambda r: r["layer_us"])
    R["fused_small_m"] = dict(variants=vres, dequant_layer_us=base, best_T48=best)


def bench_model(name: str, bits: int, lengths, methods=("fused", "dequant"), m: GPUModel | None = None):
    """Whole-model prefill (all layers + lm_head on the last token), one CUDA graph per length."""
    m = m or GPUModel(ModelConfig(**QWEN25_SHAPES[name]), bits, 4096)
    res = R.setdefault("prefill", {}).setdefault(f"{name}_w{bits}", {})
    for T in lengths:
        ids = torch.randint(0, m.cfg.vocab_size, (T,), device="cuda")
        for meth in methods:
            m.method = meth
            key = f"T{T}_{meth}"
            try:
                g = graphed(lambda: m.forward(ids, 0))
                ms = events_ms(g.replay, 20 if T <= 512 else 8)
                res[key] = dict(ms=ms, tok_s=T / ms * 1e3)
                del g
            except Exception as e:  # record and continue
                res[key] = dict(error=repr(e)[:300])
            print(name, key, res[key], flush=True)
        if T == 48 and name == "3b" and bits == 4:
            m.elementwise, m.method = "torch", "dequant"
            g = graphed(lambda: m.forward(ids, 0))
            res["T48_dequant_torch_elementwise"] = dict(ms=events_ms(g.replay, 20))
            del g
            m.elementwise = "triton"
            best = R.get("fused_small_m", {}).get("best_T48")
            if best:
                import kernels.prefill_triton as pt  # optional: Triton (GPU only)
                pt.SMALL_M_OVERRIDE = {k: best[k] for k in ("BN", "BK", "GROUP_M", "num_warps", "num_stages")}
                m.method = "fused"
                g = graphed(lambda: m.forward(ids, 0))
                ms = events_ms(g.replay, 20)
                res["T48_fused_best_tiles"] = dict(ms=ms, tok_s=T / ms * 1e3, tiles=pt.SMALL_M_OVERRIDE)
                pt.SMALL_M_OVERRIDE = None
                del g
        m.method = None  # the default rule (FUSED_MAX_T): same kernels as one row above
        res[f"T{T}_default"] = dict(res.get(f"T{T}_{'fused' if T <= gp.FUSED_MAX_T else 'dequant'}", {}),
                                    eager_ms=events_ms(lambda: m.forward(ids, 0), 5, 1))
        if T > gp.PREFILL_CHUNK:  # what the engine runs: chunks of PREFILL_CHUNK
            sl = gp.prefill_chunks(T, gp.PREFILL_CHUNK)
            g = graphed(lambda: [m.forward(ids[c], c.start) for c in sl])
            ms = events_ms(g.replay, 8)
            res[f"T{T}_chunked{gp.PREFILL_CHUNK}"] = dict(ms=ms, tok_s=T / ms * 1e3)
            del g
    return m


def decode_context(name: str = "3b"):
    """One decode step (T=1, my fused linears + torch SDPA flash for attention, a CUDA graph) at
    several cache lengths: a stand-in for the decode helper's kernel."""
    m = GPUModel(ModelConfig(**QWEN25_SHAPES[name]), 4, 32768)
    res = {}
    ids = torch.randint(0, m.cfg.vocab_size, (1,), device="cuda")
    for ctx in (512, 4096, 16384, 32768):
        g = graphed(lambda: m.forward(ids, ctx - 1))
        ms = events_ms(g.replay, 30)
        res[f"ctx{ctx}"] = dict(ms=ms, tok_s=1e3 / ms)
        del g
    res["ratio_16k_vs_512"] = res["ctx512"]["ms"] / res["ctx16384"]["ms"]
    c = m.cfg
    q = torch.randn(1, c.num_heads, c.head_dim, device="cuda").half()
    for ctx in (512, 4096, 16384, 32768):  # attention alone, all layers, one token (T=1 SDPA)
        g = graphed(lambda: [gp.attention_prefill(q, m.k[i, :, :ctx], m.v[i, :, :ctx], ctx - 1)
                             for i in range(c.num_layers)])
        res[f"attention_only_ctx{ctx}_ms"] = events_ms(g.replay, 30)
        del g
    R["decode_context_standin"] = res
    return m


def env(args):
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    import triton  # optional: Triton (GPU only)
    R["env"] = dict(device=torch.cuda.get_device_name(), nvidia_smi=smi, torch=torch.__version__,
                    cuda=torch.version.cuda, triton=triton.__version__, python=sys.version.split()[0],
                    commit=args.commit, command=module_command(), fused_max_t=gp.FUSED_MAX_T,
                    scratch_bytes=gp.SCRATCH_BYTES, prefill_chunk=gp.PREFILL_CHUNK)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--skip", default="", help="comma list of sections to skip")
    args = ap.parse_args()
    env(args)
    path = os.path.join(args.out, "gpu_prefill_h200.json")
    skip = set(args.skip.split(","))
    steps = [("memory", memory_3b), ("kernels", check_kernels), ("model", check_model),
             ("linears", bench_linears),
             ("p3b", lambda: bench_model("3b", 4, (48, 128, 256, 512, 2048))),
             ("p7b", lambda: bench_model("7b", 4, (48, 512, 2048))),
             ("p3b_w3", lambda: bench_model("3b", 3, (48, 512))),
             ("decode", decode_context)]
    for key, fn in steps:
        if key in skip:
            continue
        t0 = time.time()
        try:
            fn()
        except Exception:
            R.setdefault("errors", {})[key] = traceback.format_exc()[-1500:]
            print(R["errors"][key], flush=True)
        R.setdefault("section_seconds", {})[key] = round(time.time() - t0, 1)
        torch.cuda.empty_cache()
        with open(path, "w") as f:
            json.dump(R, f, indent=1)
    summary()


def summary():
    p = R.get("prefill", {})
    get = lambda mdl, k: p.get(mdl, {}).get(k, {}).get("tok_s")  # noqa: E731
    print("kernel checks passed:", R.get("kernel_checks", {}).get("passed"),
          "| model check:", {k: v for k, v in R.get("model_check", {}).items() if "rel" in k or "pass" in k})
    for mdl in p:
        for k, v in p[mdl].items():
            print(f"{mdl:8s} {k:16s} {v}")
    print("memory:", R.get("memory_3b_w4_ctx4096"))
    print("decode ctx:", R.get("decode_context_standin"))
    print("3b T48 ms", p.get("3b_w4", {}).get("T48_default", {}).get("ms"), "| 3b T512 tok/s",
          get("3b_w4", "T512_default"), "| T2048", get("3b_w4", "T2048_default"),
          "| 7b T512", get("7b_w4", "T512_default"))
    print("sections s:", R.get("section_seconds"), "errors:", list(R.get("errors", {})))


if __name__ == "__main__":
    main()
