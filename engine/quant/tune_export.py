"""The export's tuning pass (Recipe.tune > 0): after GPTQ has packed every layer, the scales and mins of every
calibrated linear and of the packed embedding / head (group 128) are fitted end to end to the source model's
next-token distributions on the calibration text (engine/quant/tune.py), the codes fixed, and written back as
fp16 before the files are written: the same set of tensors as recipe_search's in-memory tuning
(engine/quant/recipe_search.py tune_in_memory), which measured it. A tied head is the embedding (one tensor).

    log = tune_packed(spec, src, layers, emb, emb_bits, emb_groups, recipe, device, frozen)

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
from engine.quant.quantize import dequantize_matrix
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
    return tune.QLinear.from_packed({k: tensors[f"{prefix}.{k}"] for k in ("qweight", "scales", "mins")}, bits, bias)


def _packed(tensors: dict, groups: dict, prefix: str) -> bool:
    """A packed group-128 tensor (what tuning fits), not a dense one or another GGUF-style group."""
    return prefix + ".qweight" in tensors and groups.get(prefix + ".qweight", GROUP) == GROUP


def _fixed(tensors: dict, prefix: str, bits: int, group: int) -> torch.Tensor:
    """A packed matrix kept as stored (dequantized once, not tuned), or a dense one."""
    if prefix + ".weight" in tensors:
        return tensors[prefix + ".weight"].float()
    return dequantize_matrix(tensors[prefix + ".qweight"], tensors[prefix + ".scales"], tensors[prefix + ".mins"],
                             bits, group=group)


def tune_packed(spec, src, layers: list[tuple[dict, dict]], emb: dict, emb_bits: dict, emb_groups: dict,
                recipe, device: str, frozen: set | None = None, log=sys.stderr, final: dict | None = None) -> dict:
    """Tune in place: every quantized linear's scales/mins in `layers` and the group-128 embedding / lm_head in
    `emb`, but the (layer, linear) pairs in `frozen` (an AWQ/GPTQ source's tensors, imported exactly: kept).
    recipe.tune_norms: the layers' norm weights too, and the final norm into final["norm.weight"]."""
    frozen = frozen or set()
    cfg = spec.config
    segs = recipe_segments(spec, recipe)
    qs: dict = {}  # (layer, linear) or "embed_tokens" / "lm_head" -> its QLinear
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

    def emb_part(name: str):  # embed_tokens / lm_head: tuned where packed in groups of 128, else kept as stored
        b = emb_bits.get(name + ".qweight", 16)
        if _packed(emb, emb_groups, name):
            qs[name] = _qlinear(emb, name, b)
            return qs[name]
        return _fixed(emb, name, b, emb_groups.get(name + ".qweight", GROUP))
    embed = emb_part("embed_tokens")
    head = embed if cfg.tie_word_embeddings else emb_part("lm_head")
    if not qs:  # every tensor imported exactly (an AWQ/GPTQ source) or dense: nothing to tune
        return {"epochs": 0, "kl_train": [], "tuned_parameters": 0}
    teacher = _teacher(src, cfg, device)
    targets = tune.teacher_targets(teacher, cfg, segs, device)
    del teacher
    w = tune.on_device(tune.Weights(embed, student, src.get(NORM).float(), head), device)
    hist = tune.tune(w, cfg, segs, targets, epochs=recipe.tune, lr=recipe.tune_lr, log=log, norms=recipe.tune_norms,
                     sched=recipe.tune_sched)
    if recipe.tune_norms:  # fp32, as export writes every norm
        for i, L in enumerate(w.layers):
            for n, t in zip(NORMS, (L.in_norm, L.post_norm)):
                layers[i][0][f"layers.{i}.{n}.weight"] = t.detach().float().cpu()
        if final is not None:
            final["norm.weight"] = w.norm.detach().float().cpu()
    for key, ql in qs.items():  # on_device moved each QLinear in place (Module.to returns the module itself)
        s, m = ql.fp16()
        if isinstance(key, str):  # embed_tokens / lm_head
            emb[key + ".scales"], emb[key + ".mins"] = s, m
        else:
            i, mod = key
            layers[i][0][f"layers.{i}.{mod}.scales"], layers[i][0][f"layers.{i}.{mod}.mins"] = s, m
    hist["tuned_parameters"] = tune.param_count(w, recipe.tune_norms)
    return hist
