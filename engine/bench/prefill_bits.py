"""Prefill of W3 against W4 on the device: the same shapes, random weights, the engine's own prefill path
(GPUModel.prefill: graph buckets, split-K for short prompts, dequant + cuBLAS for long ones), ms per prompt
(median of 20 after warm-up), and the Triton dequant of one gate_up weight alone (us, GB/s of fp16 written).

    python -m engine.bench.prefill_bits --shapes 3b,7b --out $OUT/prefill_bits_h200.json
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from engine.bench.decode_bench import env_info
from engine.config import QWEN25_SHAPES, ModelConfig
from engine.model.gpu_load import random_weights
from engine.model.gpu_model import GPUModel


def warm_prompt_ms(m: GPUModel, ids: list[int]) -> float:
    """One prefill (the bucket's graph captured), then splitk_bench.prompt_ms."""
    from engine.bench.splitk_bench import prompt_ms  # imports Triton: GPU only
    m.prefill(ids, 0, 0)
    torch.cuda.synchronize()
    return prompt_ms(m, ids)


def dequant_us(w) -> float:
    """us per Triton dequant of w into a scratch buffer (tree_profile.replay_ms over 20 calls after a warm one)."""
    from engine.bench.tree_profile import replay_ms
    from kernels.prefill_triton import dequant_into
    buf = torch.empty(w.N * w.K, dtype=torch.float16, device="cuda")
    return replay_ms(lambda: dequant_into(w, buf), 20) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="3b,7b")
    ap.add_argument("--tokens", default="48,512,2048")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    out = {"env": env_info(a.commit), "rows": []}
    Ts = [int(t) for t in a.tokens.split(",")]
    print("| shape | bits | " + " | ".join(f"pp{T} ms" for T in Ts) + " | gate_up dequant us (fp16 GB/s) |", flush=True)
    for shape in a.shapes.split(","):
        cfg = ModelConfig(**QWEN25_SHAPES[shape])
        g = torch.Generator().manual_seed(0)
        prompts = {T: torch.randint(0, cfg.vocab_size, (T,), generator=g).tolist() for T in Ts}
        for bits in (4, 3):
            m = GPUModel(random_weights(cfg, bits, torch.device("cuda")), 1, 4096, "cuda")
            row = {"shape": shape, "bits": bits}
            for T in Ts:
                row[f"pp{T}_ms"] = warm_prompt_ms(m, prompts[T])
            w = m.w.layers[0].gate_up
            row["gate_up_dequant_us"] = dequant_us(w)
            row["gate_up_dequant_fp16_GBps"] = w.N * w.K * 2 / (row["gate_up_dequant_us"] * 1e-6) / 1e9
            out["rows"].append(row)
            print(f"| {shape} | {bits} | " + " | ".join(f"{row[f'pp{T}_ms']:.2f}" for T in Ts) +
                  f" | {row['gate_up_dequant_us']:.1f} ({row['gate_up_dequant_fp16_GBps']:.0f}) |", flush=True)
            del m, w
            torch.cuda.empty_cache()
            with open(a.out, "w") as f:
                json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
