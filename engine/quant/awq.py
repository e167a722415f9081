"""AWQ-style per-input-channel scaling before GPTQ (Lin et al., "AWQ: Activation-aware Weight
Quantization", 2023), folded into the layer where the fold is exact in float arithmetic.

For a linear y = x @ W.T and a positive scale s [K]: y = (x / s) @ (W * s).T. Scaling up the columns
that meet large activations gives them finer steps once quantized; dividing the input by s is folded
into whatever produces x, so the model computes the same function before quantization:

    qkv     x = rmsnorm(h) * input_layernorm       -> input_layernorm / s
    gate_up x = rmsnorm(h) * post_attention_layernorm -> post_attention_layernorm / s
    down    x = silu(gate) * up                    -> up rows / s
    o       x = softmax(q k^T) v per head          -> v rows (and v bias) / s; with grouped-query
            attention one v channel feeds the o columns of every query head of its group, so s is tied
            across those columns (stats averaged over them)

s = a^alpha / sqrt(max * min) with a = the RMS of each input channel on the calibration text
(sqrt(diag(H) / 2)); alpha in GRID is picked per linear by the least H-weighted error of a
round-to-nearest quantization, tr((W - Wq) H (W - Wq)^T), over ROWS evenly spaced rows (alpha 0 = no
scaling is on the grid, so the search never picks worse than unscaled by its own measure).
Hessians follow the fold exactly: H' = H / (s s^T).
"""
from __future__ import annotations

import torch

from kernels.pack import dequantize, quantize

GRID = tuple(i / 10 for i in range(11))
ROWS = 256


def _rtn_error(w: torch.Tensor, H: torch.Tensor, s: torch.Tensor, bits: int) -> float:
    wq = dequantize(*quantize(w * s, bits)).to(w.device) / s
    d = w - wq
    return float(((d @ H) * d).sum())


def search_scale(w: torch.Tensor, H: torch.Tensor, bits: int) -> torch.Tensor:
    """w [N, K] float32, H [K, K] -> s [K] (all ones when no alpha beats alpha 0)."""
    K, H = w.shape[1], H.to(w.dtype)
    a = (torch.diag(H).clamp_min(1e-12) / 2).sqrt()
    rows = w[torch.linspace(0, w.shape[0] - 1, min(ROWS, w.shape[0])).long()]
    best, best_s = None, torch.ones(K, device=w.device)
    for alpha in GRID:
        s = a.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()
        e = _rtn_error(rows, H, s, bits)
        if best is None or e < best:
            best, best_s = e, s
    return best_s


def search_scale_tied(w: torch.Tensor, H: torch.Tensor, bits: int, kv_heads: int, head_dim: int) -> torch.Tensor:
    """As search_scale, for o_proj under grouped-query attention: w [N, heads * head_dim] -> s [same K],
    equal on the columns (h, d) of all heads h that read kv head h // (heads / kv_heads)."""
    K, H = w.shape[1], H.to(w.dtype)
    rep = K // (kv_heads * head_dim)
    a = (torch.diag(H).clamp_min(1e-12) / 2).reshape(kv_heads, rep, head_dim).mean(1).sqrt()  # [kv, hd]
    rows = w[torch.linspace(0, w.shape[0] - 1, min(ROWS, w.shape[0])).long()]
    best, best_s = None, torch.ones(K, device=w.device)
    for alpha in GRID:
        s = a.pow(alpha)
        s = (s / (s.max() * s.min()).sqrt()).unsqueeze(1).expand(kv_heads, rep, head_dim).reshape(K)
        e = _rtn_error(rows, H, s, bits)
        if best is None or e < best:
            best, best_s = e, s
    return best_s


def tied_to_v(s: torch.Tensor, kv_heads: int, head_dim: int) -> torch.Tensor:
    """An o_proj scale from search_scale_tied [heads * head_dim] -> the v channels' scale [kv_heads * head_dim]."""
    return s.reshape(kv_heads, -1, head_dim)[:, 0, :].reshape(-1)


def fold(w: dict, hess: dict, bits: dict, cfg) -> dict[str, float]:
    """Search and fold the scales of one decoder layer in place.

    w: float32 fused weights of the layer (LINEARS keys, 'self_attn.qkv_proj.bias', the two norms);
    hess: LINEARS key -> gptq.Hessian of its (unscaled) inputs; bits: LINEARS key -> 4 | 3 | 16.
    Returns {linear: max(s) / min(s)} (1.0 where no scaling was chosen), for logs."""
    qkv, o, gu, down = "self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"
    q0, kv, inter = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
    out = {}

    def apply(m, s):
        w[m].mul_(s)
        hess[m].S.div_((s.unsqueeze(0) * s.unsqueeze(1)).to(hess[m].S.dtype))
        out[m] = float(s.max() / s.min())

    if bits[down] < 16:  # into the up rows of gate_up (before gate_up's own search: row scaling commutes)
        s = search_scale(w[down], hess[down].H, bits[down])
        apply(down, s)
        w[gu][inter:].div_(s.unsqueeze(1))
    if bits[o] < 16:  # into the v rows (and bias) of qkv
        s = search_scale_tied(w[o], hess[o].H, bits[o], cfg.num_kv_heads, cfg.head_dim)
        apply(o, s)
        sv = tied_to_v(s, cfg.num_kv_heads, cfg.head_dim)
        w[qkv][q0 + kv:q0 + 2 * kv].div_(sv.unsqueeze(1))
        w[qkv + ".bias"][q0 + kv:q0 + 2 * kv].div_(sv)
    for m, norm in ((qkv, "input_layernorm"), (gu, "post_attention_layernorm")):
        if bits[m] < 16:
            s = search_scale(w[m], hess[m].H, bits[m])
            apply(m, s)
            w[norm].div_(s)
    return out
