"""The export's tuning pass (Recipe.tune > 0): after GPTQ has packed every layer, the scales and mins of every
calibrated linear (and of a calibrated untied head) are fitted end to end to the source model's next-token
distributions on the calibration text (engine/quant/tune.py), the codes fixed, and written back as fp16 before
the layer files are written. The embedding (round-to-nearest; a tied head is the embedding) stays as stored,
as in recipe_search's in-memory tuning (engine/quant/recipe_search.py tune_in_memory), which measured it.

    log = tune_packed(spec, src, layers, emb, recipe, device)

layers[i] = (tensors, bits) of layer i as export writes them; emb = the embedding file's tensors. Memory: the
source model in float32 (the teacher, freed after its targets) and every linear's codes as uint8.
"""
from __future__ import annotations

import sys
from types import SimpleNamespace

import torch

from engine.model.layout import BIASED, EMBED, FUSED, HEAD, LINEARS, NORM, NORMS, LayerWeights
from engine.quant import tune
from engine.quant.calibrate import recipe_segments
from engine.quant.quantize import dequantize_matrix, unpack_fast
from kernels.pack import GROUP


def _teacher(src, cfg, device) -> tune.Weights:
    """The source model (float32, on `device`) as tune's Weights."""
    layers = []
    for i in range(cfg.num_layers):
        hp = f"model.layers.{i}."
        lin = {}
        for mod in LINEARS:
            w = torch.cat([src.get(hp + m + ".weight") for m in FUSED[mod]]).float().to(device)
            b = torch.cat([src.get(hp + m + ".bias") for m in FUSED[mod]]).float().to(device) if mod in BIASED else None
            lin[mod] = tune._Dense(w, b)
        layers.append(LayerWeights(*[src.get(hp + n + ".weight").float().to(device) for n in NORMS],
                                   *[lin[m] for m in LINEARS]))
    embed = src.get(EMBED).float().to(device)
    head = embed if cfg.tie_word_embeddings else src.get(HEAD).float().to(device)
    return tune.Weights(embed, layers, src.get(NORM).float().to(device), head)


def _qlinear(tensors: dict, prefix: str, bits: int, bias=None) -> tune.QLinear:
    s = tensors[prefix + ".scales"]
    q = unpack_fast(tensors[prefix + ".qweight"], s.shape[1] * GROUP, bits)
    return tune.QLinear(q, s, tensors[prefix + ".mins"], bias)


def _fixed(tensors: dict, prefix: str, bits: int, group: int) -> torch.Tensor:
    """A packed matrix kept as stored (dequantized once, not tuned), or a dense one."""
    if prefix + ".weight" in tensors:
        return tensors[prefix + ".weight"].float()
    return dequantize_matrix(tensors[prefix + ".qweight"], tensors[prefix + ".scales"], tensors[prefix + ".mins"],
                             bits, group=group)


def tune_packed(spec, src, layers: list[tuple[dict, dict]], emb: dict, emb_bits: dict, emb_groups: dict,
                recipe, device: str, frozen: set | None = None, log=sys.stderr) -> dict:
    """Tune in place: every quantized linear's scales/mins in `layers` (and a group-128 lm_head in `emb`) but the
    (layer, linear) pairs in `frozen` (an AWQ/GPTQ source's tensors, imported exactly: kept as they are)."""
    frozen = frozen or set()
    cfg = spec.config
    segs = recipe_segments(spec, recipe)
    qs: dict[tuple, tune.QLinear] = {}
    student = []
    for i, (tensors, bits) in enumerate(layers):
        p = f"layers.{i}."
        mods = []
        for mod in LINEARS:
            bias = tensors.get(p + mod + ".bias")
            if (i, mod) in frozen:
                b = bits[p + mod + ".qweight"]
                mods.append(SimpleNamespace(weight=_fixed(tensors, p + mod, b, GROUP),
                                            bias=None if bias is None else bias.float()))
            elif p + mod + ".qweight" in tensors:
                ql = qs[i, mod] = _qlinear(tensors, p + mod, bits[p + mod + ".qweight"],
                                           None if bias is None else bias.float())
                mods.append(ql)
            else:  # fp16 (not quantized): fixed (a module-like pair, as tune.on_device copies it)
                mods.append(SimpleNamespace(weight=tensors[p + mod + ".weight"].float(),
                                            bias=None if bias is None else bias.float()))
        student.append(LayerWeights(*[tensors[p + n + ".weight"].float() for n in NORMS], *mods))
    eb = emb_bits.get("embed_tokens.qweight", emb_bits.get("embed_tokens.weight", 16))
    embed = _fixed(emb, "embed_tokens", eb, emb_groups.get("embed_tokens.qweight", GROUP))
    head = embed
    if not cfg.tie_word_embeddings:
        hb = emb_bits.get("lm_head.qweight", 16)
        if "lm_head.qweight" in emb and emb_groups.get("lm_head.qweight", GROUP) == GROUP:
            head = qs["head"] = _qlinear(emb, "lm_head", hb)
        else:
            head = _fixed(emb, "lm_head", hb, emb_groups.get("lm_head.qweight", GROUP))
    if not qs:  # every linear imported exactly (an AWQ/GPTQ source) and a tied head: nothing to tune
        return {"epochs": 0, "kl_train": [], "tuned_parameters": 0}
    teacher = _teacher(src, cfg, device)
    targets = tune.teacher_targets(teacher, cfg, segs, device)
    del teacher
    w = tune.on_device(tune.Weights(embed, student, src.get(NORM).float(), head), device)
    hist = tune.tune(w, cfg, segs, targets, epochs=recipe.tune, lr=recipe.tune_lr, log=log)
    moved = {id(m): m for m in tune._qlinears(w)}  # on_device moved each QLinear (.to returns the same module)
    for key, ql in qs.items():
        ql = moved.get(id(ql), ql)
        s, m = ql.fp16()
        if key == "head":
            emb["lm_head.scales"], emb["lm_head.mins"] = s, m
        else:
            i, mod = key
            layers[i][0][f"layers.{i}.{mod}.scales"], layers[i][0][f"layers.{i}.{mod}.mins"] = s, m
    hist["tuned_parameters"] = tune.param_count(w)
    return hist
