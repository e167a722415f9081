"""A GGUF file of valid random Q4_K_M blocks with an exact Qwen2.5 shape (speed work on the lossless path).

Types follow llama.cpp's Q4_K_M choice (llama_tensor_get_type): Q4_K for every linear, except attn_v and
ffn_down in the layers `use_more_bits` picks (the first and last eighth, and every third layer between),
which get Q6_K; the output matrix is Q6_K (a tied model's token_embd is the output); an untied token_embd is
Q4_K. Rows whose length is not a multiple of 256 fall back like llama.cpp (Q4_K -> Q5_0, Q6_K -> Q8_0).
Norms are F32 ones, q/k/v biases F32 N(0, 0.02).

Blocks are random bytes (every code and packed 6-bit sub-scale pattern is valid) with the fp16 super-block
factors set so that the weights have std ~0.02 and mean ~0: numpy only, written tensor by tensor (a 3B file,
1.9 GB, takes seconds plus the disk). `deepinfer make-random --format gguf`.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from gguf.constants import GGMLQuantizationType

from engine.assets_path import bundled_chat_template
from engine.config import ModelConfig
from engine.formats.gguf_kquant import BLOCK_BYTES, QK_K
from engine.formats.gguf_layout import gguf_weight_types, linear_layouts
from engine.formats.tokenizer import bundled_qwen2_tokenizer

STD = 0.02
# rms of the integer parts (uniform random bytes): 6-bit sub-scale 0..63, int8 sub-scale, codes
_RMS_SC6, _RMS_I8 = (63 * 127 / 6) ** 0.5, 73.9
_CODE = {4: (7.5, 4.61), 5: (15.5, 9.23), 6: (31.5, 18.47), 8: (127.5, 73.9)}  # bits -> (mean, std) of a code
ROWS_PER_WRITE = 4096


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's Q4_K_M rule for attn_v / ffn_down: the layers that get Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _fallback(ty: str, K: int) -> str:
    if ty.endswith("_K") and K % QK_K:
        return {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}[ty]
    return ty


def q4_k_m_types(cfg: ModelConfig) -> dict[str, str]:
    """GGUF tensor name -> type of a Q4_K_M file of this shape (matrices only)."""
    h, f, n = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
    out = {"token_embd.weight": _fallback("Q6_K" if cfg.tie_word_embeddings else "Q4_K", h)}
    if not cfg.tie_word_embeddings:
        out["output.weight"] = _fallback("Q6_K", h)
    for i in range(n):
        more = use_more_bits(i, n)
        for t, K in (("attn_q", h), ("attn_k", h), ("attn_output", cfg.q_size), ("ffn_gate", h), ("ffn_up", h)):
            out[f"blk.{i}.{t}.weight"] = _fallback("Q4_K", K)
        out[f"blk.{i}.attn_v.weight"] = _fallback("Q6_K" if more else "Q4_K", h)
        out[f"blk.{i}.ffn_down.weight"] = _fallback("Q6_K" if more else "Q4_K", f)
    return out


def uniform_types(cfg: ModelConfig, ty: str) -> dict[str, str]:
    """GGUF tensor name -> type of a file quantized to one type (llama.cpp's Q4_0 / Q8_0 ftypes): every matrix `ty`
    but the head (output.weight, or a tied token_embd), which llama.cpp makes Q6_K unless the type is Q8_0."""
    head = "Q8_0" if ty == "Q8_0" else _fallback("Q6_K", cfg.hidden_size)
    out = {"token_embd.weight": head if cfg.tie_word_embeddings else ty}
    if not cfg.tie_word_embeddings:
        out["output.weight"] = head
    for i in range(cfg.num_layers):
        for t in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
            out[f"blk.{i}.{t}.weight"] = ty
    return out


def q4_k_m_layouts(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """Our linear name -> (bits, group) a Q4_K_M GGUF of this shape loads as (gpu_load.random_weights' layouts)."""
    return linear_layouts(cfg, gguf_weight_types(q4_k_m_types(cfg)))


def _set_f16(b: np.ndarray, off: int, v: np.ndarray):
    b[:, off:off + 2] = v.astype(np.float16).reshape(-1, 1).view(np.uint8)


def random_blocks(ty: str, n: int, rng: np.random.Generator, std: float = STD) -> np.ndarray:
    """n valid random blocks of GGUF type ty (uint8 [n, block_bytes]) whose weights have std ~`std`."""
    bb = BLOCK_BYTES[ty]
    b = np.frombuffer(rng.bytes(n * bb), dtype=np.uint8).reshape(n, bb).copy()
    jit = 1 + 0.1 * rng.random(n, dtype=np.float32)
    if ty in ("Q4_K", "Q5_K"):
        mean, sd = _CODE[4 if ty == "Q4_K" else 5]
        # var(w) over groups = d^2 (E[sc^2] sd^2 + mean^2 (var(sc) + var(m))), sc, m uniform 0..63 (var 341.25)
        d = std / (_RMS_SC6 ** 2 * sd ** 2 + 2 * mean ** 2 * 341.25) ** 0.5 * jit
        _set_f16(b, 0, d)
        _set_f16(b, 2, d * mean)  # dmin * m_j ~ d * sc_j * mean code: centred on average
    elif ty == "Q6_K":
        _set_f16(b, 208, std / (_RMS_I8 * _CODE[6][1]) * jit)
    elif ty == "Q8_0":
        _set_f16(b, 0, std / _RMS_I8 * jit)
    else:  # Q4_0 Q4_1 Q5_0 Q5_1
        mean, sd = _CODE[4 if ty.startswith("Q4") else 5]
        d = std / sd * jit
        _set_f16(b, 0, d)
        if ty.endswith("_1"):
            _set_f16(b, 2, -d * mean)
    return b


def _tokenizer_meta(w: GGUFWriter, vocab_size: int):
    tok = bundled_qwen2_tokenizer()
    model = json.loads(tok.tok.to_str())
    vocab = model["model"]["vocab"]
    tokens = [""] * vocab_size
    types = [1] * vocab_size
    for t, i in vocab.items():
        tokens[i] = t
    for a in model.get("added_tokens", []):
        tokens[a["id"]], types[a["id"]] = a["content"], 3
    for i, t in enumerate(tokens):
        if not t:
            tokens[i], types[i] = f"[PAD{i}]", 3
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(151643)
    w.add_eos_token_id(151645)
    w.add_chat_template(bundled_chat_template())


FTYPES = {"q4_k_m": 15, "q4_0": 2, "q8_0": 7}  # llama.cpp's LLAMA_FTYPE_MOSTLY_* numbers of the files made here


def write_random_gguf(cfg: ModelConfig, path: str | Path, seed: int = 0, name: str = "random-qwen2.5",
                      progress=None, ftype: str = "q4_k_m") -> dict[str, str]:
    """Write the file; returns its matrix types (q4_k_m_types, or uniform_types for "q4_0" / "q8_0")."""
    rng = np.random.default_rng(seed)
    types = q4_k_m_types(cfg) if ftype == "q4_k_m" else uniform_types(cfg, ftype.upper())
    h = cfg.hidden_size
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (cfg.vocab_size, h), "output_norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["output.weight"] = (cfg.vocab_size, h)
    for i in range(cfg.num_layers):
        p = f"blk.{i}."
        shapes.update({p + "attn_norm.weight": (h,), p + "ffn_norm.weight": (h,),
                       p + "attn_q.weight": (cfg.q_size, h), p + "attn_q.bias": (cfg.q_size,),
                       p + "attn_k.weight": (cfg.kv_size, h), p + "attn_k.bias": (cfg.kv_size,),
                       p + "attn_v.weight": (cfg.kv_size, h), p + "attn_v.bias": (cfg.kv_size,),
                       p + "attn_output.weight": (h, cfg.q_size), p + "ffn_gate.weight": (cfg.intermediate_size, h),
                       p + "ffn_up.weight": (cfg.intermediate_size, h),
                       p + "ffn_down.weight": (h, cfg.intermediate_size)})
    w = GGUFWriter(str(path), "qwen2")
    w.add_name(name)
    w.add_context_length(cfg.max_position)
    w.add_embedding_length(h)
    w.add_block_count(cfg.num_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_eps)
    w.add_file_type(FTYPES[ftype])
    _tokenizer_meta(w, cfg.vocab_size)
    for n, shape in shapes.items():
        if n in types:
            ty = types[n]
            rows, K = shape
            nbytes = rows * (K // (QK_K if ty.endswith("_K") else 32)) * BLOCK_BYTES[ty]
            w.add_tensor_info(n, (rows, nbytes // rows), np.dtype(np.uint8), nbytes, GGMLQuantizationType[ty])
        else:
            w.add_tensor_info(n, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for j, (n, shape) in enumerate(shapes.items()):
        if n in types:
            ty, (rows, K) = types[n], shape
            per_row = K // (QK_K if ty.endswith("_K") else 32)
            parts = [random_blocks(ty, min(ROWS_PER_WRITE, rows - r) * per_row, rng).reshape(-1)
                     for r in range(0, rows, ROWS_PER_WRITE)]
            w.write_tensor_data(np.concatenate(parts) if len(parts) > 1 else parts[0])
        elif n.endswith(".bias"):
            w.write_tensor_data((rng.standard_normal(shape, dtype=np.float32) * STD).astype(np.float32))
        else:
            w.write_tensor_data(np.ones(shape, dtype=np.float32))
        if progress and j % 16 == 0:
            progress.write(f"\rmake-random gguf: {j + 1}/{len(shapes)} tensors")
            progress.flush()
    w.close()
    if progress:
        progress.write("\n")
    return types
