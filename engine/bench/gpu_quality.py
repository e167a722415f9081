"""A quantized GGUF run as it is on the GPU vs its float32 reference on the CPU (device run, real model):

    python -m engine.bench.gpu_quality --model qwen2.5-coder-0.5b --out $OUT/quant_quality_lossless_gpu_0.5b.json

The reference is engine/quant/eval_quality.py's: the GGUF dequantized to float32 on the CPU, greedy 64-token answers
to its 12 chat prompts (decoded as one batch) and the perplexity of tests/data/ppl_text.txt. The GPU side loads
the same file through the default path (exact layouts, engine/model/gpu_load.load_source; fp16 activations) and
is measured the same way: perplexity, teacher-forced top-1 agreement, and how many of the 12 free-running greedy
answers are identical to the CPU's (the rest: where they first differ).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from engine.bench.envinfo import emit_json
from engine.config import EngineConfig
from engine.formats.chat import render_chat
from engine.formats.load import load_spec
from engine.quant.eval_quality import PPL_TEXT, PROMPTS, ROOT, _llm, evaluate
from engine.runtime.llm import LLM


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.bench.gpu_quality", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b", help="a GGUF (path or store name)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: this bench compares the GPU with the CPU", file=sys.stderr)
        return 2
    spec = load_spec(a.model)
    tok = spec.tokenizer
    prompts = [tok.encode(render_chat(spec.chat_template, [{"role": "user", "content": p}])) for p in PROMPTS]
    ppl_ids = tok.encode(PPL_TEXT.read_text(encoding="utf-8"))
    ctx = max(max(len(p) for p in prompts) + a.tokens + 8, len(ppl_ids) + 8)
    t0 = time.perf_counter()
    ref = evaluate(_llm(spec, ctx), prompts, None, a.tokens, ppl_ids)
    ref_s = time.perf_counter() - t0
    gpu = LLM(EngineConfig(model=spec.source, device="cuda", max_context=ctx, max_batch=len(prompts)), spec=spec)
    r = evaluate(gpu, prompts, ref, a.tokens, ppl_ids)
    types: dict[str, int] = {}
    for t in spec.weight_types.values():
        types[t] = types.get(t, 0) + 1
    mem = gpu.runner.memory()
    res = {"model": a.model, "source": Path(spec.source).name, "source_types": types,
           "reference": "the GGUF dequantized to float32 on the CPU (engine/quant/eval_quality.py)",
           "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "prompts": len(prompts), "tokens_per_prompt": a.tokens, "ppl_text": str(PPL_TEXT.relative_to(ROOT)),
           "ppl_tokens": len(ppl_ids), "reference_perplexity": ref["perplexity"], "gpu_perplexity": r["perplexity"],
           "perplexity_vs_reference": r["perplexity"] / ref["perplexity"] - 1,
           "teacher_forced_agreement": r["teacher_forced_agreement"], "mean_kl": r["mean_kl"],
           "identical_answers_gpu_vs_cpu": r["identical_answers"], "mean_identical_prefix": r["mean_identical_prefix"],
           "per_prompt": r["per_prompt"], "gpu_weights_bytes": mem.get("weights_bytes"),
           "layouts": sorted({f"w{w.bits}g{w.group}" for lay in gpu.runner.model.w.layers
                              for w in (lay.qkv, lay.o, lay.gate_up, lay.down)}),
           "lm_head_layout": f"w{gpu.runner.model.w.lm_head.bits}g{gpu.runner.model.w.lm_head.group}",
           "reference_s": round(ref_s, 1), "gpu_eval_s": r["eval_s"],
           "targets": {"perplexity_within_0.2%": abs(r["perplexity"] / ref["perplexity"] - 1) <= 0.002,
                       "agreement_at_least_0.99": r["teacher_forced_agreement"] >= 0.99}}
    print(f"reference ppl {ref['perplexity']:.4f}  gpu ppl {r['perplexity']:.4f} "
          f"({res['perplexity_vs_reference'] * 100:+.3f}%)  top-1 agreement {r['teacher_forced_agreement']:.4f}  "
          f"identical answers {r['identical_answers']}", flush=True)
    emit_json(res, a.out)
    return 0 if all(res["targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
