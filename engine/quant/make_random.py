"""`deepinfer make-random`: a random-weight checkpoint with an exact Qwen2.5 shape (speed work on 3B/7B/14B),
or (--format gguf) a GGUF of valid random Q4_K_M blocks of that shape (engine/quant/random_gguf.py).

Weights are generated directly in packed form (random codes, fixed per-group scales), so a 7B
checkpoint takes seconds of CPU, not a quantization pass. Scales are chosen so the dequantized
weights have std 0.02 (mean 0), like a trained model's init; norms are 1, biases N(0, 0.02).
Runs on the device machine: imports only torch + safetensors + tokenizers.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch

from engine.assets_path import bundled_chat_template
from engine.config import QWEN25_SHAPES, ModelConfig
from engine.formats.checkpoint import layer_file
from engine.formats.tokenizer import bundled_qwen2_tokenizer
from engine.model.layout import BIASED, LINEARS, NORMS, linear_shape
from engine.quant.scheme import check_scheme, embed_bits, linear_bits, policy
from engine.quant.random_gguf import FTYPES, write_random_gguf
from engine.quant.writer import CheckpointWriter
from kernels.pack import GROUP, packed_words

STD = 0.02


def add_arguments(p):
    p.add_argument("--shape", choices=list(QWEN25_SHAPES), required=True, help="Qwen2.5 model shape")
    p.add_argument("--scheme", choices=["w4", "w3", "mixed", "fp16"], default="w4")
    p.add_argument("--out", required=True, help="output folder (--format gguf: the .gguf file)")
    p.add_argument("--format", choices=["checkpoint", "gguf"], default="checkpoint",
                   help="gguf: a GGUF file of valid random blocks (--gguf-type; llama.cpp's type choice per "
                        "tensor; engine/quant/random_gguf.py), run as it is by the lossless path; --scheme is ignored")
    p.add_argument("--gguf-type", choices=list(FTYPES), default="q4_k_m",
                   help="with --format gguf: llama.cpp's Q4_K_M mix, or every matrix Q4_0 / Q8_0 (the head Q6_K "
                        "unless Q8_0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=None, help="fewer decoder layers (quick tests)")


def run(args) -> int:
    cfg = ModelConfig(**QWEN25_SHAPES[args.shape])
    if args.layers:
        cfg.num_layers = args.layers
    t0 = time.perf_counter()
    if args.format == "gguf":
        types = write_random_gguf(cfg, args.out, seed=args.seed, name=f"random-qwen2.5-{args.shape}",
                                  progress=sys.stderr, ftype=args.gguf_type)
        counts = {t: list(types.values()).count(t) for t in sorted(set(types.values()))}
        print(f"{args.out}: random {args.shape} ({cfg.num_layers} layers) {args.gguf_type.upper()} GGUF {counts}, "
              f"{Path(args.out).stat().st_size / 2**30:.3f} GiB in {time.perf_counter() - t0:.1f} s")
        return 0
    man = make_random(cfg, args.scheme, args.out, seed=args.seed, name=f"random-qwen2.5-{args.shape}",
                      progress=sys.stderr)
    size = sum(f["bytes"] for f in man["files"].values())
    print(f"{args.out}: random {args.shape} ({cfg.num_layers} layers) {args.scheme}, "
          f"{size / 2**30:.3f} GiB in {time.perf_counter() - t0:.1f} s")
    return 0


def random_linear(N: int, K: int, bits: int, gen: torch.Generator, std: float = STD) -> dict[str, torch.Tensor]:
    """Packed random linear: uniform codes, scales so that the weights have the given std."""
    if bits == 16:
        w = torch.empty(N, K, dtype=torch.float16)
        for r in range(0, N, 8192):
            rows = min(8192, N - r)
            w[r:r + rows] = (torch.randn(rows, K, generator=gen) * std).half()
        return {"weight": w}
    levels = 1 << bits
    words = packed_words(K, bits)
    # random bytes -> every 4-bit / 2+1-bit code field uniform over [0, 2^bits)
    qweight = torch.randint(0, 256, (N, words * 4), dtype=torch.uint8, generator=gen).view(torch.int32)
    code_std = math.sqrt((levels * levels - 1) / 12)  # std of a uniform code in [0, levels-1]
    jitter = 1 + 0.1 * torch.rand(N, K // GROUP, generator=gen)
    scales = (std / code_std) * jitter
    mins = -(levels - 1) / 2 * scales
    return {"qweight": qweight, "scales": scales.half(), "mins": mins.half()}


def make_random(cfg: ModelConfig, scheme: str, out: str | Path, seed: int = 0, name: str = "random",
                progress=None) -> dict:

    check_scheme(scheme)
    gen = torch.Generator().manual_seed(seed)
    w = CheckpointWriter(out)
    tok = bundled_qwen2_tokenizer()
    w.write_text("tokenizer.json", tok.tok.to_str())
    w.write_text("chat_template.jinja", bundled_chat_template())

    eb = embed_bits(scheme)
    tensors, bits = {}, {}

    def put(prefix: str, parts: dict[str, torch.Tensor], b: int):
        for k, v in parts.items():
            tensors[f"{prefix}.{k}"] = v
            bits[f"{prefix}.{k}"] = b

    put("embed_tokens", random_linear(cfg.vocab_size, cfg.hidden_size, eb, gen), eb)
    if not cfg.tie_word_embeddings:
        put("lm_head", random_linear(cfg.vocab_size, cfg.hidden_size, eb, gen), eb)
    w.write_tensors("embed.safetensors", tensors, bits)
    w.write_tensors("norm.safetensors", {"norm.weight": torch.ones(cfg.hidden_size)}, {"norm.weight": 32})
    t0 = time.perf_counter()
    for i in range(cfg.num_layers):
        tensors, bits = {}, {}
        p = f"layers.{i}."
        for n in NORMS:
            tensors[f"{p}{n}.weight"], bits[f"{p}{n}.weight"] = torch.ones(cfg.hidden_size), 32
        for mod in LINEARS:
            b = linear_bits(scheme, mod, i, cfg.num_layers)
            put(p + mod, random_linear(*linear_shape(cfg, mod), b, gen), b)
        for mod in BIASED:
            tensors[f"{p}{mod}.bias"] = torch.randn(linear_shape(cfg, mod)[0], generator=gen) * STD
            bits[f"{p}{mod}.bias"] = 32
        w.write_tensors(layer_file(i), tensors, bits)
        if progress:
            progress.write(f"\rmake-random: layer {i + 1}/{cfg.num_layers} ({time.perf_counter() - t0:.1f} s)")
            progress.flush()
    if progress:
        progress.write("\n")
    return w.finish(cfg, scheme, name, {"policy": policy(scheme, cfg.num_layers), "random_seed": seed,
                                        "quantizer": "random-codes"})
