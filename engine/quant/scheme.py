"""Quantization schemes: which bit width every tensor of a checkpoint gets.

    fp16   everything dense fp16 (a reference / debugging checkpoint)
    w4     every linear, the embedding and the lm_head 4-bit (group 128, kernels/pack.py)
    w3     every linear 3-bit; embedding and lm_head 4-bit (the head is the most sensitive matrix)
    mixed  attention (qkv, o), embedding and lm_head 4-bit; MLP (gate_up, down) 3-bit, except
           the first and the last layer, which stay 4-bit throughout (they are the most
           sensitive to error). The MLP is 87% of a 7B layer, so this is where bits are saved;
           see engine/quant/budget.py and docs/quantization.md for the 4 GB byte budget.

Norm weights and biases are never quantized (stored fp32: they are tiny and exact).
"""
from __future__ import annotations

from engine.errors import BadRequestError
from engine.model import layout
from kernels.pack import GROUP

SCHEMES = ("w4", "w3", "mixed", "fp16")

# Fused linears of one decoder layer: module path under layers.{i} -> kind
LINEARS = {m: m.split(".")[0].replace("self_attn", "attn") for m in layout.LINEARS}  # fused linear -> attn | mlp


def check_scheme(scheme: str) -> str:
    if scheme not in SCHEMES:
        raise BadRequestError(f"unknown scheme {scheme!r}", f"use one of: {', '.join(SCHEMES)}")
    return scheme


def linear_bits(scheme: str, module: str, layer: int, num_layers: int) -> int:
    """Bits of the fused linear `module` (a LINEARS key) in layer `layer`: 16, 4 or 3."""
    if scheme == "fp16":
        return 16
    if scheme == "w4":
        return 4
    if scheme == "w3":
        return 3
    if scheme == "mixed":
        if LINEARS[module] == "attn" or layer in (0, num_layers - 1):
            return 4
        return 3
    raise ValueError(scheme)


def embed_bits(scheme: str) -> int:
    """Bits of an untied embed_tokens (group 128; a lookup: one row read per token)."""
    return 16 if scheme == "fp16" else 4


# (bits, group) of the lm_head per scheme where it is not (embed_bits, 128); a tied embedding is the head and
# takes the head's layout. Empty: every scheme's head is 4-bit g128 (see docs/quantization.md for the measurement).
HEAD_LAYOUTS: dict[str, tuple[int, int]] = {}


def head_layout(scheme: str) -> tuple[int, int]:
    """(bits, group) of the lm_head (round-to-nearest when not (4, 128); kernels/pack.py LAYOUTS)."""
    return HEAD_LAYOUTS.get(scheme, (embed_bits(scheme), GROUP))


def policy(scheme: str, num_layers: int) -> dict:
    """Human-readable summary stored in manifest.json."""
    per_layer = {m: sorted({linear_bits(scheme, m, i, num_layers) for i in range(num_layers)})
                 for m in LINEARS}
    hb, hg = head_layout(scheme)
    out = {"embed_tokens": embed_bits(scheme), "lm_head": hb if hg == GROUP else f"{hb} (group {hg})",
           "linears": per_layer,
           "norms_and_biases": "fp32"}
    if scheme == "mixed":
        out["rule"] = "attention 4-bit; MLP 3-bit except layers 0 and last (4-bit); embedding/head 4-bit"
    return out
