"""GGUF reader: config from metadata, tokenizer from tokens/merges, dequantized weights.

GGUF stores shapes reversed (a tensor listed as [896, 4864] is a (4864, 896) matrix used as
y = x @ W.T); gguf.quants.dequantize returns the row-major matrix we want.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from engine.config import ModelConfig
from engine.errors import ModelFileError
from engine.formats.gguf_file import GGUFFile
from engine.formats.spec import ModelSpec
from engine.formats.tokenizer import Tokenizer

# GGUF name -> HF name ("{i}" is the layer index)
_LAYER_MAP = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_MAP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
            "output.weight": "lm_head.weight"}


def hf_name(gguf_name: str) -> str | None:
    if gguf_name in _TOP_MAP:
        return _TOP_MAP[gguf_name]
    if gguf_name.startswith("blk."):
        _, idx, rest = gguf_name.split(".", 2)
        if rest in _LAYER_MAP:
            return f"model.layers.{idx}.{_LAYER_MAP[rest]}"
    return None


def read_gguf(path: str | Path) -> ModelSpec:
    path = Path(path)
    if not path.exists():
        raise ModelFileError(f"model file {path} does not exist", "check the path or run `deepinfer pull`")
    gf = GGUFFile(path)
    meta = gf.fields
    arch = meta.get("general.architecture")
    if arch != "qwen2":
        raise ModelFileError(f"{path.name}: architecture {arch!r} is not supported (only qwen2 / Qwen2.5)",
                             "use a Qwen2.5 GGUF model")
    a = "qwen2."
    n_heads = int(meta.get(a + "attention.head_count"))
    tensors = gf.tensors
    tied = "output.weight" not in tensors
    emb = tensors.get("token_embd.weight")
    if emb is None:
        raise ModelFileError(f"{path.name} has no token_embd.weight: incomplete or damaged file")
    cfg = ModelConfig(
        vocab_size=int(emb.shape[1]),
        hidden_size=int(meta.get(a + "embedding_length")),
        intermediate_size=int(meta.get(a + "feed_forward_length")),
        num_layers=int(meta.get(a + "block_count")),
        num_heads=n_heads,
        num_kv_heads=int(meta.get(a + "attention.head_count_kv", n_heads)),
        rope_theta=float(meta.get(a + "rope.freq_base", 1_000_000.0)),
        rms_eps=float(meta.get(a + "attention.layer_norm_rms_epsilon", 1e-6)),
        max_position=int(meta.get(a + "context_length", 32768)),
        tie_word_embeddings=tied,
        bos_token_id=int(meta.get("tokenizer.ggml.bos_token_id", 151643)),
        eos_token_ids=[int(meta.get("tokenizer.ggml.eos_token_id", 151645))],
    )
    tokenizer = Tokenizer.from_gguf(
        list(meta.get("tokenizer.ggml.tokens")), list(meta.get("tokenizer.ggml.merges")),
        [int(x) for x in meta.get("tokenizer.ggml.token_type")], cfg.eos_token_ids)
    cfg.eos_token_ids = tokenizer.eos_token_ids
    template = meta.get("tokenizer.chat_template")

    names = {}
    for name, t in tensors.items():
        hn = hf_name(name)
        if hn is not None:
            names[hn] = t

    def weights():
        for hn, t in names.items():
            yield hn, torch.from_numpy(np.array(t.dequantize(), dtype=np.float32, copy=True))

    return ModelSpec(cfg, tokenizer, template, str(path), weights,
                     {hn: t.type_name for hn, t in names.items()}, kind="dense", gguf_tensors=names)
