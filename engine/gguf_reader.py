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
from engine.spec import ModelSpec
from engine.tokenizer import Tokenizer

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


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def _open(path: Path):
    from gguf import GGUFReader

    try:
        return GGUFReader(str(path))
    except Exception as e:  # truncated / not a GGUF: gguf raises ValueError, struct.error, ...
        raise ModelFileError(f"{path.name} is not a readable GGUF file ({type(e).__name__}: {e})",
                             "re-download it (`deepinfer pull ...`) or check the path") from e


def read_gguf(path: str | Path) -> ModelSpec:
    path = Path(path)
    reader = _open(path)
    arch = _field(reader, "general.architecture")
    if arch != "qwen2":
        raise ModelFileError(f"{path.name}: architecture {arch!r} is not supported (only qwen2 / Qwen2.5)",
                             "use a Qwen2.5 GGUF model")
    a = "qwen2."
    n_heads = int(_field(reader, a + "attention.head_count"))
    tensors = {t.name: t for t in reader.tensors}
    tied = "output.weight" not in tensors
    emb = tensors.get("token_embd.weight")
    if emb is None:
        raise ModelFileError(f"{path.name} has no token_embd.weight: incomplete or damaged file")
    cfg = ModelConfig(
        vocab_size=int(emb.shape[1]),
        hidden_size=int(_field(reader, a + "embedding_length")),
        intermediate_size=int(_field(reader, a + "feed_forward_length")),
        num_layers=int(_field(reader, a + "block_count")),
        num_heads=n_heads,
        num_kv_heads=int(_field(reader, a + "attention.head_count_kv", n_heads)),
        rope_theta=float(_field(reader, a + "rope.freq_base", 1_000_000.0)),
        rms_eps=float(_field(reader, a + "attention.layer_norm_rms_epsilon", 1e-6)),
        max_position=int(_field(reader, a + "context_length", 32768)),
        tie_word_embeddings=tied,
        bos_token_id=int(_field(reader, "tokenizer.ggml.bos_token_id", 151643)),
        eos_token_ids=[int(_field(reader, "tokenizer.ggml.eos_token_id", 151645))],
    )
    # Every tensor's data must lie inside the file (a truncated download fails here, not mid-load).
    size = path.stat().st_size
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size:
            raise ModelFileError(f"{path.name} is truncated (tensor {t.name} ends past the end of the file)",
                                 "re-download the model")
    tokenizer = Tokenizer.from_gguf(
        list(_field(reader, "tokenizer.ggml.tokens")), list(_field(reader, "tokenizer.ggml.merges")),
        [int(x) for x in _field(reader, "tokenizer.ggml.token_type")], cfg.eos_token_ids)
    cfg.eos_token_ids = tokenizer.eos_token_ids
    template = _field(reader, "tokenizer.chat_template")

    names = {}
    for name, t in tensors.items():
        hn = hf_name(name)
        if hn is not None:
            names[hn] = t

    def weights():
        from gguf.quants import dequantize

        for hn, t in names.items():
            arr = dequantize(t.data, t.tensor_type)
            yield hn, torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))

    return ModelSpec(cfg, tokenizer, template, str(path), weights,
                     {hn: t.tensor_type.name for hn, t in names.items()}, kind="dense")
