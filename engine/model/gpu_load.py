"""GPU weights of a whole model: from a layered quantized checkpoint, a quantized GGUF as it is (exact repack
of its blocks into (4,32) / (8,32) / (8,16) layouts, load_gguf), or a dense ModelSpec quantized at load
(load_dense: W4 / W3 group 128; EngineConfig.requantize asks for it on a GGUF too). load_source picks.

Fused projections as the layout table says (engine/model/layout.py: qkv rows q|k|v with bias, gate_up rows
gate|up). Linears are kernels.qweight.QWeight on the GPU (bias fp16); norms fp32. A tied head reuses the embedding.
"""
from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.config import GGUF_PACK, ModelConfig
from engine.errors import ModelFileError
from kernels.qweight import QWeight
from engine.model.host_embed import HostEmbedding
from kernels import pack
from engine.formats.gguf_kquant import gguf_linear as kquant_linear
from engine.formats.gguf_layout import is_lossless_source
from engine.formats.prequant import concat_rows
from engine.model.layout import BIASED, EMBED, FUSED, HEAD, LINEARS, NORM, NORMS, LayerWeights, hf_names, \
    layer_names, linear_shape

GPULayer = LayerWeights  # fields: in_norm, post_norm (fp32), qkv, o, gate_up, down (QWeight)


@dataclass
class GPUWeights:
    cfg: ModelConfig
    embed: QWeight | None  # None when the embedding lives in host RAM (host_embed)
    lm_head: QWeight
    norm: torch.Tensor
    layers: list[GPULayer] = field(default_factory=list)
    host_embed: HostEmbedding | None = None

    def nbytes(self) -> int:
        """GPU bytes (a host-RAM embedding is not counted)."""
        n = self.norm.numel() * 4 + (self.embed.nbytes() if self.embed is not None else 0)
        if self.lm_head is not self.embed:
            n += self.lm_head.nbytes()
        for l in self.layers:
            n += (l.in_norm.numel() + l.post_norm.numel()) * 4
            n += sum(w.nbytes() for w in (l.qkv, l.o, l.gate_up, l.down))
        return n


def to_device(w: QWeight, device) -> QWeight:
    def mv(t, dtype=None):
        if t is None:
            return None
        t = t.to(device=device, non_blocking=False)
        return (t.to(dtype) if dtype is not None else t).contiguous()
    return QWeight(w.N, w.K, w.bits, qweight=mv(w.qweight), scales=mv(w.scales, None if w.kq else torch.float16),
                   mins=mv(w.mins, torch.float16), weight=mv(w.weight, torch.float16), bias=mv(w.bias, torch.float16),
                   group=w.group, form=w.form)


def quantize_linear(w: torch.Tensor, bits: int, bias: torch.Tensor | None = None) -> QWeight:
    """Dense float [N, K] -> packed CPU QWeight (round to nearest, pack.quantize, group 128)."""
    N, K = w.shape
    if bits == 16:
        return QWeight(N, K, 16, weight=w.half(), bias=None if bias is None else bias.half())
    q, s, m = pack.quantize(w, bits)
    return QWeight(N, K, bits, qweight=pack.pack(q, bits), scales=s, mins=m,
                   bias=None if bias is None else bias.half())


def gguf_linear(spec, names: list[str], bias: torch.Tensor | None = None, fallback_bits: int = 4,
                mode: str = GGUF_PACK) -> QWeight:
    """The GGUF tensors `names` (HF names, rows concatenated in order) as one CPU QWeight: their exact layout when
    every part has one (mode: EngineConfig.gguf_pack), else quantized at fallback_bits g128
    (engine/formats/gguf_kquant.py)."""
    return kquant_linear([spec.gguf_tensors[n] for n in names], bias, fallback_bits, what=", ".join(names), mode=mode)


def load_gguf(spec, device, embed_on_host: bool = False, workers: int | None = None,
              mode: str = GGUF_PACK) -> GPUWeights:
    """A quantized GGUF's tensors as they are (requantize "none"): every fused linear, the embedding and an untied
    head in their exact layout for EngineConfig.gguf_pack `mode` ((4,32) / (8,32) / (8,16); "6bit": (6,32) / (6,16)
    for the 5- and 6-bit types; "kquant": the KQ and SYM forms too; engine/formats/gguf_layout.py). Layers are repacked on
    the CPU by `workers` threads (numpy releases the GIL), at most `workers` layers ahead of the copies to the
    device, in order."""
    c: ModelConfig = spec.config
    _check_host_embed(c, embed_on_host)
    g = spec.gguf_tensors
    missing = [n for n in hf_names(c) if n not in g]
    if missing:
        raise ModelFileError(f"model file lacks tensor {missing[0]}", "re-download it (`deepinfer pull ...`)")

    def f32(name: str) -> torch.Tensor:
        return torch.from_numpy(np.array(g[name].dequantize(), dtype=np.float32))

    def cpu_layer(i: int) -> tuple[list[torch.Tensor], list[QWeight]]:
        hp = f"model.layers.{i}."
        lin = [gguf_linear(spec, [f"{hp}{m}.weight" for m in FUSED[mod]],
                           torch.cat([f32(f"{hp}{m}.bias") for m in FUSED[mod]]) if mod in BIASED else None, mode=mode)
               for mod in LINEARS]
        return [f32(f"{hp}{n}.weight") for n in NORMS], lin

    workers = workers or max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as ex:
        pending = deque(ex.submit(cpu_layer, i) for i in range(min(workers, c.num_layers)))
        emb = gguf_linear(spec, [EMBED], mode=mode)
        host = HostEmbedding(emb) if embed_on_host else None
        embed = None if embed_on_host else to_device(emb, device)
        del emb
        head = embed if c.tie_word_embeddings else to_device(gguf_linear(spec, [HEAD], mode=mode), device)
        out = GPUWeights(c, embed, head, f32(NORM).to(device), host_embed=host)
        for i in range(c.num_layers):
            norms, lin = pending.popleft().result()
            if i + workers < c.num_layers:
                pending.append(ex.submit(cpu_layer, i + workers))
            out.layers.append(GPULayer(*[t.to(device) for t in norms], *[to_device(w, device) for w in lin]))
    return out


def load_prequant(spec, device, embed_on_host: bool = False) -> GPUWeights:
    """An AWQ/GPTQ 4-bit g128 folder (spec.prequant, engine/formats/prequant.py) as it is: its packed linears
    repacked into our W4 g128 (codes and scales exact; float32 mins rounded to fp16 by to_device, at most
    2^-11 |z*s|), the dense embedding / head quantized to W4 like any dense source, norms and biases as stored."""
    c: ModelConfig = spec.config
    _check_host_embed(c, embed_on_host)
    r = spec.prequant

    def linear(names: list[str], bias: torch.Tensor | None) -> QWeight:
        if all(n in r.linears for n in names):
            p = concat_rows([r.ours(n) for n in names])
            return QWeight(p["scales"].shape[0], p["scales"].shape[1] * 128, 4, qweight=p["qweight"],
                           scales=p["scales"], mins=p["mins"], bias=None if bias is None else bias.half())
        dense = torch.cat([r.dense(n) if n in r.linears else r.tensor(n).float() for n in names])
        return quantize_linear(dense, 4, bias)

    emb = quantize_linear(r.tensor(EMBED).float(), 4)
    host = HostEmbedding(emb) if embed_on_host else None
    embed = None if embed_on_host else to_device(emb, device)
    head = embed if c.tie_word_embeddings else to_device(linear([HEAD], None), device)
    out = GPUWeights(c, embed, head, r.tensor(NORM).to(device, torch.float32), host_embed=host)
    for i in range(c.num_layers):
        hp = f"model.layers.{i}."
        lin = [to_device(linear([f"{hp}{m}.weight" for m in FUSED[mod]],
                                torch.cat([r.tensor(f"{hp}{m}.bias").float() for m in FUSED[mod]])
                                if mod in BIASED else None), device) for mod in LINEARS]
        norms = [r.tensor(f"{hp}{n}.weight").to(device, torch.float32) for n in NORMS]
        out.layers.append(GPULayer(*norms, *lin))
    return out


def runs_as_is(spec, requantize: str = "none") -> bool:
    """True when load_source runs the spec's GGUF tensors as they are (load_gguf: the packings apply)."""
    return requantize == "none" and bool(spec.gguf_tensors) and is_lossless_source(spec.weight_types)


def load_source(spec, device, requantize: str = "none", embed_on_host: bool = False, dense_bits: int = 4,
                mode: str = GGUF_PACK) -> GPUWeights:
    """A dense spec (GGUF / HF folder) as the runner loads it: a quantized GGUF exactly as it is (requantize
    "none", load_gguf), an AWQ/GPTQ folder repacked (load_prequant), else re-quantized at load (load_dense: W4,
    or W3 linears with a 4-bit embedding/head). The memory plan counts the same bytes
    (engine/runtime/memory_plan.py source_weight_parts; an AWQ/GPTQ folder is W4 g128)."""
    if runs_as_is(spec, requantize):
        return load_gguf(spec, device, embed_on_host, mode=mode)
    if requantize in ("none", "w4") and getattr(spec, "prequant", None) is not None:
        return load_prequant(spec, device, embed_on_host)
    return load_dense(spec, device, 3 if requantize == "w3" else dense_bits, embed_on_host)


def _check_host_embed(c: ModelConfig, embed_on_host: bool):
    if embed_on_host and c.tie_word_embeddings:
        raise ValueError("a tied embedding is the lm_head: it cannot live in host RAM")


def load_checkpoint(ck, device, embed_on_host: bool = False) -> GPUWeights:
    """From engine.formats.checkpoint.Checkpoint (memory-mapped; each tensor is copied to the GPU once).
    embed_on_host: keep the (untied) input embedding in host RAM (engine/model/host_embed.py)."""
    c = ck.config
    _check_host_embed(c, embed_on_host)
    host = HostEmbedding(ck.linear("embed_tokens")) if embed_on_host else None
    embed = None if embed_on_host else to_device(ck.linear("embed_tokens"), device)
    head = embed if c.tie_word_embeddings else to_device(ck.linear("lm_head"), device)
    out = GPUWeights(c, embed, head, ck.tensor("norm.weight").to(device, torch.float32), host_embed=host)
    for i in range(c.num_layers):
        p = f"layers.{i}."
        norms = [ck.tensor(f"{p}{n}.weight").to(device, torch.float32) for n in NORMS]
        out.layers.append(GPULayer(*norms, *[to_device(ck.linear(p + m), device) for m in LINEARS]))
    return out


def load_dense(spec, device, bits: int = 4, embed_on_host: bool = False) -> GPUWeights:
    """From a dense ModelSpec (GGUF / HF): fuse per layer as tensors arrive, quantize, move to the GPU."""
    c: ModelConfig = spec.config
    _check_host_embed(c, embed_on_host)
    pending: dict[int, dict[str, torch.Tensor]] = {}
    layers: dict[int, GPULayer] = {}
    top: dict[str, torch.Tensor] = {}
    for name, t in spec.weights():
        if not name.startswith("model.layers."):
            top[name] = t
            continue
        i = int(name.split(".")[2])
        d = pending.setdefault(i, {})
        d[name.split(".", 3)[3]] = t
        if len(d) == len(layer_names()):  # 2 norms, q/k/v weight + bias, o, gate, up, down
            layers[i] = _dense_layer(c, pending.pop(i), bits, device)
    if pending or len(layers) != c.num_layers:
        raise ModelFileError(f"model file lacks tensors of {c.num_layers - len(layers)} layers")
    eb = max(bits, 4) if bits != 16 else 16  # embedding / head at least 4-bit (the w3 scheme's rule)
    try:
        emb = quantize_linear(top["model.embed_tokens.weight"].float(), eb)
        host = HostEmbedding(emb) if embed_on_host else None
        embed = None if embed_on_host else to_device(emb, device)
        norm = top["model.norm.weight"].to(device, torch.float32)
        head = embed if c.tie_word_embeddings else \
            to_device(quantize_linear(top["lm_head.weight"].float(), eb), device)
    except KeyError as e:
        raise ModelFileError(f"model file lacks tensor {e.args[0]}") from None
    return GPUWeights(c, embed, head, norm, [layers[i] for i in range(c.num_layers)], host_embed=host)


def _dense_layer(c: ModelConfig, d: dict[str, torch.Tensor], bits: int, device) -> GPULayer:
    """One layer's HF tensors (names after 'model.layers.N.') -> fused, quantized, on the device."""
    def fused(mod: str, kind: str) -> torch.Tensor:
        return torch.cat([d[f"{m}.{kind}"].float() for m in FUSED[mod]])
    lin = [quantize_linear(fused(m, "weight"), bits, fused(m, "bias") if m in BIASED else None) for m in LINEARS]
    return GPULayer(*[d[f"{n}.weight"].float().to(device) for n in NORMS], *[to_device(w, device) for w in lin])


def random_weights(cfg: ModelConfig, bits: int, device, seed: int = 0, std: float = 0.02,
                   embed_on_host: bool = False, layouts: dict | None = None) -> GPUWeights:
    """Random packed weights generated on the GPU (speed work; same statistics as engine/quant/make_random.py).
    layouts: our linear name -> (bits, group) (engine/formats/gguf_layout.py linear_layouts; e.g.
    engine/quant/random_gguf.py q4_k_m_layouts(cfg): what a Q4_K_M GGUF loads as); None = `bits`, group 128."""
    _check_host_embed(cfg, embed_on_host)
    g = torch.Generator(device=device).manual_seed(seed)

    def lin(N, K, b=bits, group=128, form="", bias=False):
        words = pack.packed_words(K, b)
        qw = torch.randint(-2**31, 2**31 - 1, (N, words), dtype=torch.int32, device=device, generator=g)
        code_std = ((4 ** b - 1) / 12) ** 0.5
        bs = (torch.randn(N, device=device, generator=g) * std).half() if bias else None
        if form == "kq":  # the KQ form (kernels/pack.py): sub-scales around 32, factors per 256 giving the same statistics
            d = (std / code_std / 32) * (1 + 0.1 * torch.rand(N, K // 256, device=device, generator=g))
            if group == 32:
                sub = torch.randint(28, 36, (N, K // 32, 2), dtype=torch.uint8, device=device, generator=g)
                sub[..., 1] += 28  # min = -dmin m ~ -7.5 s (codes centred) with dmin = 4 d: m ~ 60
                sup = torch.stack([d, 4 * d], -1).half()
            else:
                sub = torch.randint(28, 36, (N, K // 16), dtype=torch.int8, device=device, generator=g)
                sup = d.half()
            return QWeight(N, K, b, qweight=qw, scales=sub, mins=sup, bias=bs, group=group, form="kq")
        s = (std / code_std) * (1 + 0.1 * torch.rand(N, K // group, device=device, generator=g))
        if form == "sym":  # the SYM form (kernels/pack.py): no mins stored; min = -2^(b-1) s (codes centred)
            return QWeight(N, K, b, qweight=qw, scales=s.half(), mins=s.new_empty(N, 0).half(), bias=bs,
                           group=group, form="sym")
        return QWeight(N, K, b, qweight=qw, scales=s.half(), mins=(-(2 ** b - 1) / 2 * s).half(), bias=bs,
                       group=group)

    c = cfg
    eb = 4 if bits in (3, 4) else bits
    lay = layouts or {}
    e_lay, h_lay = lay.get("embed_tokens") or (eb, 128), lay.get("lm_head") or (eb, 128)
    embed = lin(c.vocab_size, c.hidden_size, *e_lay)
    head = embed if c.tie_word_embeddings else lin(c.vocab_size, c.hidden_size, *h_lay)
    ones = lambda: torch.ones(c.hidden_size, device=device)  # noqa: E731
    out = GPUWeights(c, embed, head, ones())
    if embed_on_host:
        out.host_embed, out.embed = HostEmbedding(embed), None
    for i in range(c.num_layers):
        ws = []
        for m in LINEARS:
            b, grp, *kq = lay.get(f"layers.{i}.{m}") or (bits, 128)  # (bits, group) or (bits, group, "kq"/"sym")
            ws.append(lin(*linear_shape(c, m), b, grp, kq[0] if kq else "", bias=m in BIASED))
        out.layers.append(GPULayer(ones(), ones(), *ws))
    return out
