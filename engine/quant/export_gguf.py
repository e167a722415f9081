"""`deepinfer export --scheme lossless`: a quantized GGUF -> a layered checkpoint holding its tensors as they are.

Every fused linear, the embedding and an untied head take the exact layout of their GGUF types
(engine/formats/gguf_layout.py: (4,32) / (8,32) / (8,16), the parts of a fused linear promoted to their common
layout); the group is stored per tensor in the manifest ("group"). A linear without an exact layout (F16/BF16/F32)
is quantized to W4 g128 like the GPU loader does. Norms and biases stay fp32. No calibration, no LoRA merge
(a merged weight has no exact GGUF layout: export it with --scheme w4). The byte layouts whatever
EngineConfig.gguf_pack says: checkpoints carry codes, fp16 scales and mins, not the 6-bit or KQ forms.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from engine.assets_path import bundled_chat_template
from engine.errors import BadRequestError
from engine.formats.checkpoint import layer_file, open_checkpoint
from engine.formats.gguf_kquant import gguf_linear
from engine.formats.gguf_layout import is_lossless_source
from engine.formats.load import load_spec
from engine.model.layout import BIASED, EMBED, FUSED, HEAD, LINEARS, NORM, NORMS
from engine.quant.writer import CheckpointWriter
from kernels.qweight import QWeight


def _f32(spec, name: str) -> torch.Tensor:
    return torch.from_numpy(np.array(spec.gguf_tensors[name].dequantize(), dtype=np.float32))


def _put(tensors: dict, bits: dict, groups: dict, prefix: str, q: QWeight, layouts: dict):
    if q.bits == 16:
        tensors[prefix + ".weight"], bits[prefix + ".weight"] = q.weight, 16
    else:
        for k in ("qweight", "scales", "mins"):
            tensors[f"{prefix}.{k}"], bits[f"{prefix}.{k}"], groups[f"{prefix}.{k}"] = getattr(q, k), q.bits, q.group
    layouts[f"{q.bits}-bit g{q.group}"] = layouts.get(f"{q.bits}-bit g{q.group}", 0) + 1


def export_lossless(source: str, out: str | Path, progress=None) -> dict:
    """Write the checkpoint of a quantized GGUF `source`; returns its manifest."""
    spec = load_spec(source)
    if not spec.gguf_tensors or not is_lossless_source(spec.weight_types):
        raise BadRequestError("--scheme lossless needs a quantized GGUF model (Q4_K_M, Q5_K_M, Q8_0 ...)",
                              "use --scheme w4 (or w3 / mixed) for other sources")
    cfg = spec.config
    w = CheckpointWriter(out)
    w.write_text("tokenizer.json", spec.tokenizer.tok.to_str())
    w.write_text("chat_template.jinja", spec.chat_template or bundled_chat_template())
    t0 = time.perf_counter()
    layouts: dict[str, int] = {}
    tensors, bits, groups = {}, {}, {}
    _put(tensors, bits, groups, "embed_tokens", gguf_linear([spec.gguf_tensors[EMBED]], what=EMBED, mode="bytes"),
         layouts)
    if not cfg.tie_word_embeddings:
        _put(tensors, bits, groups, "lm_head", gguf_linear([spec.gguf_tensors[HEAD]], what=HEAD, mode="bytes"), layouts)
    w.write_tensors("embed.safetensors", tensors, bits, groups)
    w.write_tensors("norm.safetensors", {"norm.weight": _f32(spec, NORM)}, {"norm.weight": 32})
    for i in range(cfg.num_layers):
        hp, p = f"model.layers.{i}.", f"layers.{i}."
        tensors, bits, groups = {}, {}, {}
        for n in NORMS:
            tensors[f"{p}{n}.weight"], bits[f"{p}{n}.weight"] = _f32(spec, f"{hp}{n}.weight"), 32
        for mod in BIASED:
            tensors[f"{p}{mod}.bias"] = torch.cat([_f32(spec, f"{hp}{m}.bias") for m in FUSED[mod]])
            bits[f"{p}{mod}.bias"] = 32
        for mod in LINEARS:
            names = [f"{hp}{m}.weight" for m in FUSED[mod]]
            _put(tensors, bits, groups, p + mod, gguf_linear([spec.gguf_tensors[n] for n in names],
                                                             what=", ".join(names), mode="bytes"), layouts)
        w.write_tensors(layer_file(i), tensors, bits, groups)
        if progress:
            progress.write(f"\rexport lossless: layer {i + 1}/{cfg.num_layers} ({time.perf_counter() - t0:.0f} s)   ")
            progress.flush()
    types: dict[str, int] = {}
    for t in spec.weight_types.values():
        types[t] = types.get(t, 0) + 1
    extra = {"policy": {"rule": "every GGUF tensor in its exact layout (engine/formats/gguf_layout.py); fused parts "
                                "promoted to their common layout; norms and biases fp32", "layouts": layouts},
             "quantizer": "none", "source_types": types}
    man = w.finish(cfg, "lossless", spec.source, extra)
    open_checkpoint(out, verify="full")  # read everything back from disk
    if progress:
        progress.write("\n")
    return man
