"""ModelSpec: what every reader (GGUF, HF folder, layered checkpoint) yields.

Weights are produced lazily, one tensor at a time, under Hugging Face names
(model.layers.N.self_attn.q_proj.weight ...), so a loader never holds the dense model twice.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from engine.config import ModelConfig
from engine.formats.tokenizer import Tokenizer
from engine.model.layout import hf_names

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
    # GGUF sources: hf_name -> engine.formats.gguf_file.GGUFTensor (the raw blocks, for the exact repack of
    # engine/formats/gguf_kquant.py); empty for every other source
    gguf_tensors: dict = field(default_factory=dict)
    # the reader's own `weights` (engine/runtime/shared_weights.py shares a load only while spec.weights is this one:
    # a spec whose weights were replaced afterwards loads on its own)
    reader_weights: Callable[[], WeightIter] | None = None


def expected_weight_names(cfg: ModelConfig) -> list[str]:
    """Every HF tensor name a model file must hold (the layout's table: engine/model/layout.py)."""
    return hf_names(cfg)
