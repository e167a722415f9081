"""ModelSpec: what every reader (GGUF, HF folder, layered checkpoint) yields.

Weights are produced lazily, one tensor at a time, under Hugging Face names
(model.layers.N.self_attn.q_proj.weight ...), so a loader never holds the dense model twice.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch

from engine.config import ModelConfig
from engine.errors import ModelFileError
from engine.formats.tokenizer import Tokenizer

WeightIter = Iterator[tuple[str, torch.Tensor]]


@dataclass
class ModelSpec:
    config: ModelConfig
    tokenizer: Tokenizer
    chat_template: str | None
    source: str
    weights: Callable[[], WeightIter]  # fresh iterator of (hf_name, float tensor) on each call
    weight_types: dict[str, str] = field(default_factory=dict)  # hf_name -> source type (Q4_K, BF16 ...)
    kind: str = "dense"  # dense | checkpoint (quantized layered checkpoint, see engine/formats/checkpoint.py)


def expected_weight_names(cfg: ModelConfig) -> list[str]:
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        for proj in ("q", "k", "v"):
            names += [p + f"self_attn.{proj}_proj.weight", p + f"self_attn.{proj}_proj.bias"]
        names += [p + "self_attn.o_proj.weight"]
        names += [p + f"mlp.{m}_proj.weight" for m in ("gate", "up", "down")]
    if not cfg.tie_word_embeddings:
        names.append("lm_head.weight")
    return names
