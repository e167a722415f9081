"""The Qwen2 tensor layout, once: HF names, our fused linears (q|k|v, gate|up), norms, the tied head.

Every reader, writer, loader and exporter asks this module where a tensor goes:
  HF (GGUF/safetensors)                      ours (checkpoint names, CPU/GPU weights)
  model.embed_tokens.weight                  embed_tokens              [vocab, hidden]
  model.norm.weight                          norm.weight               [hidden]
  lm_head.weight (absent when tied)          lm_head                   [vocab, hidden]
  model.layers.N.input_layernorm.weight      layers.N.input_layernorm.weight
  model.layers.N.post_attention_layernorm.weight
  model.layers.N.self_attn.{q,k,v}_proj.{weight,bias}   layers.N.self_attn.qkv_proj  rows q | k | v (+ bias)
  model.layers.N.self_attn.o_proj.weight                layers.N.self_attn.o_proj
  model.layers.N.mlp.{gate,up}_proj.weight              layers.N.mlp.gate_up_proj    rows gate | up
  model.layers.N.mlp.down_proj.weight                   layers.N.mlp.down_proj
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.config import ModelConfig

# fused linear -> the HF linears whose rows it holds, in order
FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         "self_attn.o_proj": ("self_attn.o_proj",),
         "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
         "mlp.down_proj": ("mlp.down_proj",)}
LINEARS = tuple(FUSED)  # per layer, in forward order
BIASED = ("self_attn.qkv_proj",)  # the only linear with a bias (rows q|k|v)
NORMS = ("input_layernorm", "post_attention_layernorm")
FIELDS = {"self_attn.qkv_proj": "qkv", "self_attn.o_proj": "o", "mlp.gate_up_proj": "gate_up",
          "mlp.down_proj": "down"}  # fused linear -> LayerWeights field
EMBED, HEAD, NORM = "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"


@dataclass
class LayerWeights:
    """One decoder layer as the forward (engine/model/forward.py) reads it. Norm weights are tensors;
    linears are whatever the ops take: kernels.qweight.QWeight (GPU), an nn.Module (CPU)."""
    in_norm: object
    post_norm: object
    qkv: object
    o: object
    gate_up: object
    down: object


def linear_shape(cfg: ModelConfig, mod: str) -> tuple[int, int]:
    """(N out, K in) of a fused linear."""
    c = cfg
    return {"self_attn.qkv_proj": (c.q_size + 2 * c.kv_size, c.hidden_size),
            "self_attn.o_proj": (c.hidden_size, c.q_size),
            "mlp.gate_up_proj": (2 * c.intermediate_size, c.hidden_size),
            "mlp.down_proj": (c.hidden_size, c.intermediate_size)}[mod]


def part_rows(cfg: ModelConfig, mod: str) -> list[tuple[str, int]]:
    """(HF linear, rows) of each part of a fused linear, in order."""
    c = cfg
    rows = {"self_attn.q_proj": c.q_size, "self_attn.k_proj": c.kv_size, "self_attn.v_proj": c.kv_size,
            "mlp.gate_proj": c.intermediate_size, "mlp.up_proj": c.intermediate_size}
    if len(FUSED[mod]) == 1:
        return [(mod, linear_shape(cfg, mod)[0])]
    return [(p, rows[p]) for p in FUSED[mod]]


def part_slices(cfg: ModelConfig, mod: str) -> dict[str, slice]:
    """HF linear -> its row slice of the fused linear `mod`."""
    out, r0 = {}, 0
    for name, n in part_rows(cfg, mod):
        out[name] = slice(r0, r0 + n)
        r0 += n
    return out


def split_fused(cfg: ModelConfig, mod: str, t):
    """A fused tensor (weight [N, K] or bias [N]) -> [(HF linear, part)] along rows."""
    parts = part_rows(cfg, mod)
    return list(zip([p for p, _ in parts], t.split([n for _, n in parts])))


def layer_names() -> list[str]:
    """HF tensor names of one decoder layer, after 'model.layers.N.'."""
    names = [n + ".weight" for n in NORMS]
    for mod in LINEARS:
        for hf in FUSED[mod]:
            names += [hf + ".weight"] + ([hf + ".bias"] if mod in BIASED else [])
    return names


def hf_names(cfg: ModelConfig) -> list[str]:
    """Every HF tensor name a Qwen2 model file must hold."""
    names = [EMBED, NORM]
    for i in range(cfg.num_layers):
        names += [f"model.layers.{i}.{n}" for n in layer_names()]
    if not cfg.tie_word_embeddings:
        names.append(HEAD)
    return names


@dataclass(frozen=True)
class Place:
    """Where an HF tensor goes: `name` (ours: 'embed_tokens', 'norm.weight', 'layers.3.input_layernorm.weight',
    'layers.3.self_attn.qkv_proj'), `kind` ('weight' | 'bias'), `rows` (slice of a fused linear or None),
    layer (int or None), mod (fused linear / norm name, or None for the top-level tensors)."""
    name: str
    kind: str
    rows: slice | None
    layer: int | None
    mod: str | None

    @property
    def param(self) -> str:
        """The tensor's full name (a module path of engine.model.qwen2.Qwen2Model too)."""
        return self.name if self.name.endswith(".weight") else f"{self.name}.{self.kind}"


def locate(cfg: ModelConfig, hf: str) -> Place:
    """The Place of an HF tensor name; KeyError for a name that is not part of the layout
    (lm_head.weight of a tied model is a KeyError too: the head is the embedding)."""
    if hf == EMBED:
        return Place("embed_tokens", "weight", None, None, None)
    if hf == NORM:
        return Place("norm.weight", "weight", None, None, None)
    if hf == HEAD:
        if cfg.tie_word_embeddings:
            raise KeyError(hf)
        return Place("lm_head", "weight", None, None, None)
    parts = hf.split(".")  # model.layers.N.<module>.<proj>.<weight|bias>
    if parts[:2] != ["model", "layers"] or len(parts) < 5 or not parts[2].isdigit() or \
            int(parts[2]) >= cfg.num_layers:
        raise KeyError(hf)
    i, mod, kind = int(parts[2]), ".".join(parts[3:-1]), parts[-1]
    if mod in NORMS and kind == "weight":
        return Place(f"layers.{i}.{mod}.weight", kind, None, i, mod)
    for fused in LINEARS:
        if mod in FUSED[fused] and (kind == "weight" or (kind == "bias" and fused in BIASED)):
            rows = part_slices(cfg, fused)[mod] if len(FUSED[fused]) > 1 else None
            return Place(f"layers.{i}.{fused}", kind, rows, i, fused)
    raise KeyError(hf)
