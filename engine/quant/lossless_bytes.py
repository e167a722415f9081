"""Bytes a decode step reads per token: a Q4_K_M GGUF run as it is (exact layouts) vs our W4 g128 vs the GGUF itself.

Per token, decode reads every decoder linear, the lm_head (a tied model's embedding matrix) and the norms and
biases once (batch 1; the input embedding is one row and is left out). Types per tensor: llama.cpp's Q4_K_M rule
(engine/quant/random_gguf.py q4_k_m_types) for each Qwen2.5 shape, and the real files' own types where the file
is here (0.5B, 1.5B). "promotion" is what fusing costs: q|k|v and gate|up take the common layout of their parts
(a Q6_K attn_v makes its layer's whole qkv (8,16)); "unfused" counts each part in its own layout.

    python -m engine.quant.lossless_bytes --out docs/results/lossless_bytes.json
"""
from __future__ import annotations

import argparse
import json
import sys

from engine.config import QWEN25_SHAPES, ModelConfig
from engine.formats.gguf_kquant import BLOCK_BYTES, QK_K
from engine.formats.gguf_layout import REPACK, linear_layouts
from engine.formats.gguf_reader import hf_name
from engine.formats.load import load_spec
from engine.hub import store
from engine.model.layout import EMBED, HEAD, LINEARS, linear_shape, part_rows
from engine.quant.random_gguf import q4_k_m_types
from engine.runtime.memory_plan import linear_bytes, source_weight_parts, weight_parts

REAL = {"0.5b": "qwen2.5-coder-0.5b", "1.5b": "qwen2.5-coder-1.5b"}
MIB = 1 << 20


def _gguf_bytes(K: int, ty: str, rows: int) -> int:
    return rows * K // (QK_K if ty.endswith("_K") else 32) * BLOCK_BYTES[ty]


def per_token(cfg: ModelConfig, types: dict[str, str], shapes: dict[str, tuple[int, int]]) -> dict:
    """types, shapes: HF name -> GGUF type / (rows, K) of every matrix."""
    lossless = source_weight_parts(cfg, types, mode="bytes")  # the byte layouts (docs/quantization.md's table)
    w4 = weight_parts(cfg, lambda m, i: 4, 4)
    head = HEAD if not cfg.tie_word_embeddings else EMBED

    def read(parts):  # decode reads: linears + head + norms/biases
        return parts["linears"] + parts["lm_head" if not cfg.tie_word_embeddings else "embedding"] + \
            parts["norms_biases"]
    unfused = sum(linear_bytes(r, k, *REPACK[types[n]]) for n, (r, k) in shapes.items() if n not in (EMBED, HEAD))
    gguf = sum(_gguf_bytes(k, types[n], r) for n, (r, k) in shapes.items() if n not in (EMBED, HEAD)) + \
        _gguf_bytes(cfg.hidden_size, types[head], cfg.vocab_size) + lossless["norms_biases"]
    out = {"lossless_bytes": read(lossless), "w4_g128_bytes": read(w4), "gguf_q4_k_m_bytes": gguf,
           "lossless_linears_bytes": lossless["linears"], "lossless_linears_unfused_bytes": unfused,
           "promotion_cost_bytes": lossless["linears"] - unfused}
    out["lossless_vs_w4"] = round(out["lossless_bytes"] / out["w4_g128_bytes"], 4)
    out["lossless_vs_gguf"] = round(out["lossless_bytes"] / gguf, 4)
    out["lossless_mib"] = round(out["lossless_bytes"] / MIB, 1)
    out["w4_g128_mib"] = round(out["w4_g128_bytes"] / MIB, 1)
    counts: dict[str, int] = {}
    for t in types.values():
        counts[t] = counts.get(t, 0) + 1
    out["types"] = counts
    by_layout: dict[str, int] = {}  # read bytes of the linears + head by exact layout (after promotion)
    lay = linear_layouts(cfg, types, "bytes")
    for name, (b, g) in ((n, lay[n]) for n in lay if n != "embed_tokens" or cfg.tie_word_embeddings):
        N, K = (cfg.vocab_size, cfg.hidden_size) if name in ("embed_tokens", "lm_head") else \
            linear_shape(cfg, name.split(".", 2)[2])
        by_layout[f"{b}-bit g{g}"] = by_layout.get(f"{b}-bit g{g}", 0) + linear_bytes(N, K, b, g)
    out["bytes_by_layout"] = by_layout
    return out


def _shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """HF name -> (rows, K) of every matrix of the model."""
    out = {EMBED: (cfg.vocab_size, cfg.hidden_size)}
    if not cfg.tie_word_embeddings:
        out[HEAD] = (cfg.vocab_size, cfg.hidden_size)
    for i in range(cfg.num_layers):
        for mod in LINEARS:
            K = linear_shape(cfg, mod)[1]
            for part, rows in part_rows(cfg, mod):
                out[f"model.layers.{i}.{part}.weight"] = (rows, K)
    return out


def table() -> dict:
    rows = {}
    for shape, d in QWEN25_SHAPES.items():
        cfg = ModelConfig(**d)
        shapes = _shapes(cfg)
        types = {hf_name(n): t for n, t in q4_k_m_types(cfg).items()}
        rows[shape] = {"q4_k_m_rule": per_token(cfg, types, shapes)}
        if shape in REAL and store.is_pulled(REAL[shape]):
            spec = load_spec(REAL[shape])  # the real file's own types (and output.weight: the 0.5B stores it)
            cfg = spec.config
            shapes = _shapes(cfg)
            real = {n: t for n, t in spec.weight_types.items() if n in shapes}
            rows[shape][f"real_file ({REAL[shape]})"] = per_token(cfg, real, shapes)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    res = {"what": __doc__.split("\n\n")[1].replace("\n", " "), "shapes": table()}
    for shape, r in res["shapes"].items():
        for k, v in r.items():
            print(f"{shape:5} {k:34} lossless {v['lossless_mib']:8.1f} MiB  w4 {v['w4_g128_mib']:8.1f} MiB  "
                  f"x{v['lossless_vs_w4']:.3f} of w4, x{v['lossless_vs_gguf']:.3f} of the GGUF; promotion "
                  f"{v['promotion_cost_bytes'] / MIB:.1f} MiB", file=sys.stderr)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
