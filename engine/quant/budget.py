"""Byte budget of a checkpoint on the GPU (seed 5.2: count weights + scales + KV + activations first).

    python -m engine.quant.budget            # table for every Qwen2.5 shape and scheme
    python -m engine.quant.budget --json docs/results/quant_budget.json

Every count comes from engine/runtime/memory_plan.py (the numbers the GPU loader checks): bytes per weight
with group 128 and fp16 scale + min per group: 4-bit 0.5 + 4/128 = 0.53125, 3-bit 0.375 + 4/128 = 0.40625,
fp16 2; fp16 biases and fp32 norms; fp16 KV; activations of one prefill forward of `chunk` tokens (512 here:
the engine's own count, incl. the 64 MiB dequant scratch). The loader adds decode work space, prefill graphs
and a reserve on top (memory_plan.work_bytes): this table is weights + cache + one chunk.
"""
from __future__ import annotations

import argparse
import json
import sys

from engine.config import QWEN25_SHAPES, ModelConfig
from engine.quant.scheme import SCHEMES, embed_bits, linear_bits
from engine.runtime.memory_plan import GIB, kv_bytes, prefill_activation_bytes, weight_parts

USABLE_4GB = 3.237 * GIB  # what a 4 GB laptop card left free in the seed's measurements (5.2)


def budget(cfg: ModelConfig, scheme: str, context: int = 4096, slots: int = 1, chunk: int = 512) -> dict:
    w = weight_parts(cfg, lambda m, i: linear_bits(scheme, m, i, cfg.num_layers), embed_bits(scheme))
    kv = kv_bytes(cfg, context, slots)
    act = prefill_activation_bytes(cfg, chunk)
    gpu_all = sum(w.values()) + kv + act
    gpu_host_embed = gpu_all - w["embedding"] if not cfg.tie_word_embeddings else gpu_all
    return {"scheme": scheme, **w, "kv_cache": kv, "activations": act, "total_gpu": gpu_all,
            "total_gpu_embedding_on_host": gpu_host_embed, "context": context, "slots": slots,
            "fits_4gb": gpu_all <= USABLE_4GB, "fits_4gb_embedding_on_host": gpu_host_embed <= USABLE_4GB}


def table(context: int = 4096) -> list[dict]:
    rows = []
    for shape, d in QWEN25_SHAPES.items():
        cfg = ModelConfig(**d)
        for scheme in SCHEMES:
            rows.append({"shape": shape, **budget(cfg, scheme, context)})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    rows = table(a.context)
    print(f"{'shape':5} {'scheme':6} {'linears':>8} {'emb':>6} {'head':>6} {'KV':>6} {'act':>6} {'GPU':>7} "
          f"{'GPU(emb host)':>13}  GiB, context {a.context}, 1 slot; usable on a 4 GB card: {USABLE_4GB / GIB:.3f}")
    for r in rows:
        g = {k: r[k] / GIB for k in ("linears", "embedding", "lm_head", "kv_cache", "activations", "total_gpu",
                                    "total_gpu_embedding_on_host")}
        print(f"{r['shape']:5} {r['scheme']:6} {g['linears']:8.3f} {g['embedding']:6.3f} {g['lm_head']:6.3f} "
              f"{g['kv_cache']:6.3f} {g['activations']:6.3f} {g['total_gpu']:7.3f} {g['total_gpu_embedding_on_host']:13.3f}"
              f"  {'fits' if r['fits_4gb'] else ('fits, embedding on host' if r['fits_4gb_embedding_on_host'] else '-')}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"usable_4gb_bytes": USABLE_4GB, "context": a.context, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
