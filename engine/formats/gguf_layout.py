"""Which packed layout each GGUF tensor type repacks to exactly, per fused linear, and GGUF tensor names -> HF names
(torch-free: the memory plan, doctor and budget tools use it without torch).

    Q4_K, Q4_0, Q4_1           -> (4, 32)   4-bit codes, fp16 scale + min per 32 weights
    Q5_K, Q5_0, Q5_1, Q8_0     -> (8, 32)   the 5-bit / 8-bit codes in bytes, fp16 scale + min per 32
    Q6_K                       -> (8, 16)   6-bit codes in bytes, fp16 scale + min per 16
EngineConfig.gguf_pack picks among three tables (engine/config.py GGUF_PACKS):
    "bytes"   REPACK above (the default until an H200 timed kquant faster: 2026-12-05)
    "6bit"    REPACK6: the 5- and 6-bit types as 6-bit codes instead of bytes: Q5_K, Q5_0, Q5_1 -> (6, 32),
              Q6_K -> (6, 16) (8 bits per weight with the scale and min for Q6_K, not 10)
    "kquant"  as "6bit", and a linear whose parts are all Q4_K / Q5_K or all Q6_K keeps their own scale structure
              (kernels/pack.py KQ: integer sub-scales, fp16 factors per 256): Q4_K -> (4, 32, "kq") at 4.625 bits
              per weight (not 5), Q5_K (or Q4_K with Q5_K parts) -> (6, 32, "kq") at 6.625 (not 9),
              Q6_K -> (6, 16, "kq") at 6.5625 (not 10); and a linear whose parts are all Q4_0 / Q5_0 / Q8_0 keeps
              their one fp16 scale per 32 without a min (kernels/pack.py SYM: codes re-centred, the min made from
              the scale): Q4_0 -> (4, 32, "sym") at 4.5 bits (not 5), Q5_0 -> (6, 32, "sym") at 6.5 (not 9),
              Q8_0 (or with Q4_0 / Q5_0 parts) -> (8, 32, "sym") at 8.5 (not 9)
(kernels/pack.py layouts; engine/formats/gguf_kquant.py decodes the blocks.) The fused linears (q|k|v,
gate|up) take the common superset of their parts: bits = the widest, group = the finest. Every layout
above is a lossless superset of the coarser ones (4-bit codes are valid 8-bit codes; a scale of a group of
32 repeated twice is the same weights in groups of 16). A type not in REPACK (F16, BF16, F32, other
quants) has no exact layout: that fused linear is quantized at load like before (None here).
"""
from __future__ import annotations

from engine.config import GGUF_PACK, GGUF_PACKS, ModelConfig
from engine.model.layout import EMBED, FUSED, HEAD, LINEARS, linear_shape

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


def gguf_weight_types(tensor_types: dict[str, str]) -> dict[str, str]:
    """GGUF tensor name -> type name (GGUFTensor.type_name) to ModelSpec.weight_types' HF names."""
    return {hf_name(n): t for n, t in tensor_types.items() if hf_name(n)}


REPACK: dict[str, tuple[int, int]] = {
    "Q4_K": (4, 32), "Q4_0": (4, 32), "Q4_1": (4, 32),
    "Q5_K": (8, 32), "Q5_0": (8, 32), "Q5_1": (8, 32), "Q8_0": (8, 32),
    "Q6_K": (8, 16),
}
REPACK6: dict[str, tuple[int, int]] = {**REPACK, "Q5_K": (6, 32), "Q5_0": (6, 32), "Q5_1": (6, 32), "Q6_K": (6, 16)}
FOUR_BIT = ("Q4_K", "Q4_0", "Q4_1")  # the CPU's int4 linears keep these codes (engine/formats/gguf_int4.py)
CODE_BITS = {"Q4_K": 4, "Q4_0": 4, "Q4_1": 4, "Q5_K": 5, "Q5_0": 5, "Q5_1": 5, "Q8_0": 8, "Q6_K": 6}  # code widths


KQ = {"Q4_K": (4, 32, "kq"), "Q5_K": (6, 32, "kq"), "Q6_K": (6, 16, "kq")}  # "kquant": kernels/pack.py KQ forms


def kq_layout(types: list[str]):
    """The KQ form holding every part (kernels/pack.py): all Q4_K / Q5_K (the same sub-scale structure; codes in the
    widest) or all Q6_K; None otherwise."""
    if types and all(t in ("Q4_K", "Q5_K") for t in types):
        return KQ["Q5_K"] if "Q5_K" in types else KQ["Q4_K"]
    if types and all(t == "Q6_K" for t in types):
        return KQ["Q6_K"]
    return None


SYM_CENTRE = {"Q4_0": 8, "Q5_0": 16, "Q8_0": 128}  # c of w = d (q - c) (Q8_0's code q = q8 + 128): kernels/pack.py SYM


def sym_layout(types: list[str], K: int):
    """The SYM form holding every part (kernels/pack.py): all Q4_0 / Q5_0 / Q8_0, codes in the widest container
    (5-bit ones in 6 when K allows W6's blocks of 128, else in bytes); None otherwise."""
    if not types or not all(t in SYM_CENTRE for t in types):
        return None
    bits = max(CODE_BITS[t] for t in types)
    return (4 if bits == 4 else 6 if bits == 5 and K % 128 == 0 else 8), 32, "sym"


def repack_table(mode: str = GGUF_PACK) -> dict[str, tuple[int, int]]:
    """GGUF type -> the plain (bits, group) it repacks to: REPACK ("bytes") or REPACK6 ("6bit", "kquant")."""
    if mode not in GGUF_PACKS:
        raise ValueError(f"unknown GGUF packing {mode!r}: {', '.join(GGUF_PACKS)}")
    return REPACK if mode == "bytes" else REPACK6


def layout_form(layout) -> str:
    """The scales' form of a layout tuple: "kq" for (bits, group, "kq"), "sym" for (bits, group, "sym"), "" for a
    plain (bits, group) (QWeight.form)."""
    return layout[2] if layout is not None and len(layout) == 3 else ""


def is_kq(layout) -> bool:
    """A layout tuple of the KQ form: (bits, group, "kq")."""
    return layout_form(layout) == "kq"


def part_layout(types: list[str], K: int, mode: str = GGUF_PACK):
    """The exact layout of a linear made of GGUF tensors of these types (rows concatenated), K inputs: the KQ or
    SYM form when mode is "kquant" and the parts have one (kq_layout, sym_layout), else the common superset of the
    parts' plain layouts (fit_k), or None when a part has none (quantized at load)."""
    kq = kq_layout(types) if mode == "kquant" and K % 256 == 0 else None
    if kq is None and mode == "kquant":
        kq = sym_layout(types, K)
    if kq is not None:
        return kq
    table = repack_table(mode)
    return fit_k(common_layout([table.get(t) for t in types]), K)


REQUANTIZE = ("none", "w4", "w3")  # EngineConfig.requantize: none = GGUF tensors run as they are


def fit_k(layout: tuple[int, int] | None, K: int) -> tuple[int, int] | None:
    """W6 words go in blocks of 128 k (kernels/pack.py): a 6-bit layout of a K that is not a multiple of 128 takes
    the bytes instead (same group)."""
    if layout is not None and layout[0] == 6 and K % 128:
        return 8, layout[1]
    return layout


def common_layout(layouts: list[tuple[int, int] | None]) -> tuple[int, int] | None:
    """The lossless (bits, group) holding every part, or None when a part has no exact layout."""
    if not layouts or any(x is None for x in layouts):
        return None
    return max(b for b, _ in layouts), min(g for _, g in layouts)


def linear_layouts(cfg: ModelConfig, weight_types: dict[str, str], mode: str = GGUF_PACK) -> dict[str, tuple | None]:
    """Our linear name ('embed_tokens', 'lm_head', 'layers.3.self_attn.qkv_proj' ...) -> its exact layout, (bits,
    group), (bits, group, "kq") or (bits, group, "sym") (part_layout), from the source types
    (ModelSpec.weight_types: hf name -> 'Q4_K' ...), or None (quantized at load). A tied lm_head is the embedding
    (no entry). mode: EngineConfig.gguf_pack."""
    D = cfg.hidden_size
    out = {"embed_tokens": part_layout([weight_types.get(EMBED, "")], D, mode)}
    if not cfg.tie_word_embeddings:
        out["lm_head"] = part_layout([weight_types.get(HEAD, "")], D, mode)
    for i in range(cfg.num_layers):
        for mod in LINEARS:
            types = [weight_types.get(f"model.layers.{i}.{m}.weight", "") for m in FUSED[mod]]
            out[f"layers.{i}.{mod}"] = part_layout(types, linear_shape(cfg, mod)[1], mode)
    return out


def is_lossless_source(weight_types: dict[str, str]) -> bool:
    """True when any tensor of the source has an exact repack (a quantized GGUF)."""
    return any(t in REPACK for t in weight_types.values())
