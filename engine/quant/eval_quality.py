"""Measured quality of W4 / W3 / mixed checkpoints against the unquantized reference.

Reference = the GGUF dequantized to float32 (itself Q4_K_M: our W4/W3 re-quantize already-quantized
weights, so the numbers include that re-quantization loss on top of GGUF's own, which cannot be
measured here: there is no unquantized original). For every scheme:

  * greedy token agreement over the first 64 generated tokens of 12 chat prompts (EOS ignored, so
    every answer is 64 tokens; the 12 prompts are decoded as one batch):
      - teacher-forced: the quantized model reads prompt + the reference's greedy continuation, and we
        count positions where its argmax equals the reference token (no drift after one miss);
      - free-running: both generate greedily; length of the identical prefix, and how many prompts
        give an identical 64-token answer;
      - mean KL(ref || quant) of the next-token distributions at the teacher-forced positions;
  * perplexity of tests/data/ppl_text.txt (1444 tokens, original text + code written for this test).

    python -m engine.quant.eval_quality --model qwen2.5-coder-0.5b --out docs/results/quant_quality_0.5b.json
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.formats.chat import render_chat
from engine.formats.checkpoint import open_checkpoint, read_checkpoint
from engine.formats.load import load_spec
from engine.quant.export import DEFAULT_QUANTIZER, QUANTIZERS, export
from engine.runtime.llm import LLM
from engine.runtime.sampling import SamplingParams

ROOT = Path(__file__).resolve().parents[2]
PPL_TEXT = ROOT / "tests" / "data" / "ppl_text.txt"
PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain what a mutex is in two sentences.",
    "用一句话解释 CUDA Graph。",
    "Write a SQL query that returns the ten customers with the highest total order value.",
    "What is the difference between a list and a tuple in Python?",
    "Write a bash one-liner that counts the lines of all .py files in a folder.",
    "Translate to English: 今天的天气很好，我们去公园散步吧。",
    "Give three tips for writing readable code.",
    "Write a JavaScript function that debounces another function.",
    "Explain big-O notation to a beginner.",
    "Write a C function that reverses a linked list.",
    "What does the HTTP status code 429 mean and how should a client react?",
]


def rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096
    except OSError:
        return None


def _llm(spec, max_context: int, batch: int = len(PROMPTS), device: str = "cpu", cpu_weights: str = "dense"):
    return LLM(EngineConfig(model=spec.source, device=device, max_context=max_context, max_batch=batch,
                            cpu_weights=cpu_weights), spec=spec)


def perplexity(llm, ids: list[int]) -> float:
    logits = llm.runner.logits(ids)[:-1]  # [T-1, vocab]
    target = torch.tensor(ids[1:])
    # nll = logsumexp - logit of the target, 256 rows at a time (no second [T, vocab] float32 copy)
    nll = torch.cat([torch.logsumexp(c.float(), -1) - c.float().gather(1, t.unsqueeze(1)).squeeze(1)
                     for c, t in zip(logits.split(256), target.split(256))])
    return math.exp(nll.mean().item())


def generate_batch(llm, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Greedy n tokens for every prompt, decoded together (one batched step per token; ignore_eos so
    every answer has exactly n tokens, EOS included where the model chose it)."""

    seqs = [llm.new_sequence(p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)) for p in prompts]
    return [list(s.output_ids) for s in llm.scheduler.run(seqs)]  # the engine thread's batching


def evaluate(llm, prompts_ids, ref=None, n_tokens: int = 64, ppl_ids=None, free_run: bool = True) -> dict:
    """ref None: produce the reference (continuations + log-probs). Else compare against ref.
    free_run False: skip the free-running generation (teacher-forced numbers, KL, perplexity only)."""
    t0 = time.perf_counter()
    out = {"conts": [], "logp": []} if ref is None else {}
    agree = total = ident = prefix_sum = 0
    kl_sum = kl_n = 0.0
    per_prompt = []
    gens = generate_batch(llm, prompts_ids, n_tokens) if free_run or ref is None else None
    print(f"  generated {len(gens or [])} x {n_tokens} tokens ({time.perf_counter() - t0:.0f} s)", file=sys.stderr,
          flush=True)
    for i, p in enumerate(prompts_ids):
        if ref is None:
            cont = gens[i]
            out["conts"].append(cont)
        else:
            cont = ref["conts"][i]
        logits = llm.runner.logits(p + cont)[len(p) - 1:len(p) - 1 + len(cont)].float()
        logp = torch.log_softmax(logits, -1)
        if ref is None:
            out["logp"].append(logp.half())
            continue
        a = int((logits.argmax(-1) == torch.tensor(cont)).sum())
        if ref.get("logp"):  # a compact reference (--ref-compact) keeps no log-probs: no KL
            rl = ref["logp"][i].float()
            kl = (rl.exp() * (rl - logp)).sum(-1)
        else:
            kl = torch.full((len(cont),), float("nan"))
        own = gens[i] if gens else None
        pre = None if own is None else \
            next((j for j, (x, y) in enumerate(zip(own, cont)) if x != y), min(len(own), len(cont)))
        same = own == cont
        agree, total, ident, prefix_sum = agree + a, total + len(cont), ident + same, prefix_sum + (pre or 0)
        kl_sum, kl_n = kl_sum + float(kl.sum()), kl_n + len(cont)
        per_prompt.append({"teacher_forced_agree": a, "tokens": len(cont), "identical_prefix": pre,
                           "identical": same})
    if ppl_ids is not None:
        out["perplexity"] = perplexity(llm, ppl_ids)
    if ref is not None:
        out.update({"teacher_forced_agreement": agree / total, "tokens_compared": total,
                    "mean_identical_prefix": prefix_sum / len(prompts_ids) if gens else None,
                    "identical_answers": f"{ident}/{len(prompts_ids)}" if gens else None,
                    "mean_kl": kl_sum / kl_n if ref.get("logp") else None,
                    "per_prompt": per_prompt})
    out["eval_s"] = round(time.perf_counter() - t0, 1)
    return out


def _finish(r: dict, ref: dict, key: str) -> dict:
    r["perplexity_vs_reference"] = r["perplexity"] / ref["perplexity"] - 1
    print(f"{key}: agree {r['teacher_forced_agreement']:.3f} prefix {r['mean_identical_prefix']} "
          f"ppl {r['perplexity']:.3f} (ref {ref['perplexity']:.3f}) kl {r['mean_kl']}", file=sys.stderr)
    return r


def merge_results(paths: list[str]) -> dict:
    """Schemes of several runs in one result; refuses runs whose reference differs (runs are
    deterministic, so parallel runs of the same model reproduce the reference exactly)."""
    labels = [p.partition("@")[2] for p in paths]  # PATH@LABEL: that run's schemes become SCHEME@LABEL
    paths = [p.partition("@")[0] for p in paths]
    runs = [json.loads(Path(p).read_text(encoding="utf-8")) for p in paths]
    for r, label in zip(runs, labels):
        if label:
            r["schemes"] = {f"{k}@{label}": v for k, v in r["schemes"].items()}
    out = runs[0]
    for p, r in zip(paths[1:], runs[1:]):
        for k in ("model", "reference_perplexity", "reference_texts", "ppl_tokens", "prompts", "tokens_per_prompt"):
            if r.get(k) != out.get(k):
                raise SystemExit(f"{p}: {k} differs from {paths[0]} ({r.get(k)!r} != {out.get(k)!r})")
        out["schemes"].update(r["schemes"])
    out["merged_from_parallel_runs"] = len(runs)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--schemes", default="w4,w3,mixed",
                    help="comma list of SCHEME or SCHEME:QUANTIZER (e.g. w4:gptq,w4:rtn,w3:gptq); a bare "
                         "scheme uses --quantizer; lossless = a GGUF's tensors as they are (no quantizer); "
                         "cpu-int8 / cpu-int4 = the model on the CPU with --cpu-weights int8 / int4 "
                         "(kernels/cpu_int8.py, kernels/cpu_int4.py)")
    ap.add_argument("--work", default="/tmp/deepinfer-quant-eval", help="where the checkpoints are exported")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--quantizer", choices=list(QUANTIZERS), default=DEFAULT_QUANTIZER)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ref-cache", help="file keeping the reference's continuations and log-probs between runs")
    ap.add_argument("--ref-compact", action="store_true",
                    help="the --ref-cache keeps only the continuations and perplexity (kilobytes: carried to the "
                         "GPU machine; no KL then)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="where the schemes run (the reference is always the CPU float32 model); on cuda the "
                         "scheme lossless is the GGUF itself loaded as it is by the GPU runner")
    ap.add_argument("--no-free-run", action="store_true",
                    help="quantized schemes: skip the free-running generation (no identical-prefix numbers)")
    ap.add_argument("--merge", nargs="+", metavar="JSON",
                    help="only merge the schemes of earlier runs (same model, reference and text) into --out")
    args = ap.parse_args(argv)
    if args.merge:
        Path(args.out).write_text(json.dumps(merge_results(args.merge), indent=1, ensure_ascii=False))
        return 0

    spec = load_spec(args.model)
    tok = spec.tokenizer

    prompts = [tok.encode(render_chat(spec.chat_template, [{"role": "user", "content": p}]))
               for p in PROMPTS[:args.prompts]]
    ppl_ids = tok.encode(PPL_TEXT.read_text(encoding="utf-8"))
    ctx = max(max(len(p) for p in prompts) + args.tokens + 8, len(ppl_ids) + 8)
    model = Path(args.model).name if Path(args.model).exists() else args.model  # no machine path in results
    result = {"model": model, "source": Path(spec.source).name,  # no machine path in committed results
              "reference": "GGUF dequantized to float32 (Q4_K_M "
              "source: the reference is itself quantized)", "source_types": {}, "prompts": len(prompts),
              "tokens_per_prompt": args.tokens, "ppl_text": str(PPL_TEXT.relative_to(ROOT)),
              "ppl_tokens": len(ppl_ids), "device": "cpu float32 (dequantized at load)" if args.device == "cpu" else
              "cuda (the engine's GPU runner: fp16 activations, packed weights)",
              "machine": platform.processor() or platform.machine(), "torch": torch.__version__, "schemes": {}}
    for t in spec.weight_types.values():
        result["source_types"][t] = result["source_types"].get(t, 0) + 1
    print(f"reference: {args.model}", file=sys.stderr)
    src = Path(spec.source)  # the cache key names the file by name and size: valid on another machine too
    key_ref = {"model": src.name, "bytes": src.stat().st_size if src.is_file() else None, "prompts": prompts,
               "ppl_ids": ppl_ids, "tokens": args.tokens}
    ref = None
    if args.ref_cache and Path(args.ref_cache).exists():
        cached = torch.load(args.ref_cache)
        ref = cached["ref"] if cached["key"] == key_ref else None
    if ref is None:
        llm = _llm(spec, ctx)
        ref = evaluate(llm, prompts, None, args.tokens, ppl_ids)
        del llm
        if args.ref_cache:
            keep = {"conts": ref["conts"], "perplexity": ref["perplexity"]} if args.ref_compact else ref
            torch.save({"key": key_ref, "ref": keep}, args.ref_cache)
    result["reference_perplexity"] = ref["perplexity"]
    result["reference_texts"] = [tok.decode(c)[:160] for c in ref["conts"][:3]]
    result["free_running"] = not args.no_free_run
    gc.collect()
    for entry in args.schemes.split(","):
        scheme, _, quantizer = entry.partition(":")
        quantizer = "none" if scheme == "lossless" else (quantizer or args.quantizer)  # lossless: no quantizer
        key = entry if ":" in entry else scheme
        batch = 1 if args.no_free_run else len(PROMPTS)
        if scheme in ("cpu-int8", "cpu-int4"):  # the source on the CPU with EngineConfig.cpu_weights "int8" /
            cw = scheme[4:]  # "int4" (kernels/cpu_int8.py, kernels/cpu_int4.py)
            rss0 = rss_bytes()
            llm = _llm(spec, ctx, batch, "cpu", cw)
            rss1 = rss_bytes()
            r = evaluate(llm, prompts, ref, args.tokens, ppl_ids, free_run=not args.no_free_run)
            r.update({"cpu_load_s": round(llm.load_seconds, 2),
                      "quantizer": "int8 per output row (rtn)" if cw == "int8" else
                      "the file's 4-bit tensors as their codes (bf16 scale and zero per 32), the rest int8 per row",
                      "cpu_weight_bytes": llm.runner.memory().get("weights_bytes"),
                      "cpu_load_rss_delta_bytes": (rss1 - rss0) if rss0 else None,
                      "identical_answers_means": f"{cw} greedy answers equal to the float32 reference's"})
            result["schemes"][key] = _finish(r, ref, key)
            del llm
            gc.collect()
            continue
        if scheme == "lossless" and args.device == "cuda":  # the GGUF itself, repacked by the GPU loader
            llm = _llm(spec, ctx, batch, "cuda")
            r = evaluate(llm, prompts, ref, args.tokens, ppl_ids, free_run=not args.no_free_run)
            r.update({"gpu_load_s": round(llm.load_seconds, 2), "quantizer": "none",
                      "gpu_weight_bytes": llm.runner.memory().get("weights_bytes"),
                      "identical_answers_means": "GPU greedy answers equal to the CPU float32 reference's"})
            result["schemes"][key] = _finish(r, ref, key)
            del llm
            gc.collect()
            continue
        out = Path(args.work) / f"{Path(args.model).stem}-{scheme}-{quantizer}"
        t0 = time.perf_counter()
        if not (out / "manifest.json").exists() or \
                json.loads((out / "manifest.json").read_text()).get("quantizer") != quantizer:
            export(args.model, out, scheme, quantizer=quantizer, progress=sys.stderr)
        export_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        ck = open_checkpoint(out, verify="full")
        verify_s = time.perf_counter() - t1
        t1 = time.perf_counter()
        qspec = read_checkpoint(out)  # stamp matches: sizes only + tokenizer
        open_s = time.perf_counter() - t1
        rss0 = rss_bytes()
        llm = _llm(qspec, ctx, batch, args.device)
        rss1 = rss_bytes()
        r = evaluate(llm, prompts, ref, args.tokens, ppl_ids, free_run=not args.no_free_run)
        r.update({"checkpoint_bytes": ck.nbytes(), "checkpoint_gib": round(ck.nbytes() / 2**30, 4),
                  "export_s": round(export_s, 1), "verify_sha256_s": round(verify_s, 2),
                  "open_s": round(open_s, 2), f"{args.device}_load_s": round(llm.load_seconds, 2),
                  "cpu_load_rss_delta_bytes": (rss1 - rss0) if rss0 else None,
                  "quantizer": ck.manifest.get("quantizer"), "policy": ck.manifest.get("policy"),
                  "calibration": ck.manifest.get("calibration")})
        result["schemes"][key] = _finish(r, ref, key)
        del llm, qspec, ck
        gc.collect()
        Path(args.out).write_text(json.dumps(result, indent=1, ensure_ascii=False))
    Path(args.out).write_text(json.dumps(result, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
