"""The draw of one token from a sorted logits row (sampling.sample's semantics) in torch ops, and the reference of
kernels/decode_sample.cu sample_sorted built on it.

draw_sorted is the definition every path follows: sampling.pick_index (the CPU runner, the GPU's host path for rows
with a grammar, logprobs or biases) calls it after its sort; the kernel does the same arithmetic with its float64
sums in another order (per-thread runs and a block scan instead of one cumsum), so the two agree to ~1e-16 of the
row's mass and a draw can differ only that close to a boundary between two tokens. No host sync: a CUDA graph can
hold it.
"""
from __future__ import annotations

import torch


def draw_sorted(vals: torch.Tensor, idx: torch.Tensor, temperature: float, top_k: int, top_p: float,
                u: torch.Tensor) -> torch.Tensor:
    """vals float32 [V'] one row's logits sorted descending (ties to the lower id), idx int64 [V'] their ids, u float64
    [1] a uniform in [0, 1), all on one device -> the drawn id, int64 [1]:
      n = top_k if 0 < top_k < V' else V'; inv = float32(1 / temperature); e_i = exp(vals_i * inv - vals_0 * inv)
      (float32), then float64: incl = cumsum(e[:n]), Z = incl[-1];
      top_p < 1: keep = 1 + the first i with incl_i >= top_p * Z (at most n), else n; kept = incl[keep - 1];
      the id at the first i with incl_i > u * kept (at most keep - 1); id 0's place if kept is not positive."""
    V = vals.numel()
    n = top_k if 0 < top_k < V else V
    inv = torch.full((1,), 1.0 / temperature, dtype=torch.float32, device=vals.device)
    v = vals[:n] * inv
    incl = torch.cumsum(torch.exp(v - v[:1]).double(), 0)
    if top_p < 1.0:
        keep = (torch.searchsorted(incl, top_p * incl[-1:]) + 1).clamp_(max=n)
    else:
        keep = torch.full((1,), n, dtype=torch.int64, device=vals.device)
    kept = incl.gather(0, keep - 1)
    pick = torch.minimum(torch.searchsorted(incl, u * kept, right=True), keep - 1)
    pick = torch.where(kept > 0, pick, torch.zeros_like(pick))
    return idx[:n].gather(0, pick)


def sample_sorted_ref(vals: torch.Tensor, idx: torch.Tensor, prm: torch.Tensor, u: torch.Tensor, at: torch.Tensor,
                      keys: torch.Tensor, B: int):
    """decode_sample.cu sample_sorted: keys[r] = 0xFFFFFFFF - the id draw_sorted draws from sorted row r < B with
    (temperature, top_k, top_p) = prm[r] and u[at + r]; rows of temperature 0 untouched."""
    base = int(at.reshape(-1)[0])
    for r in range(B):
        T, k, p = (float(x) for x in prm[r].tolist())
        if not T > 0:
            continue
        tok = draw_sorted(vals[r], idx[r], T, int(k), p, u.reshape(-1)[base + r:base + r + 1])
        keys[r] = 0xFFFFFFFF - int(tok)
