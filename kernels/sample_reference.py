"""The draw of one token from a logits row (sampling.sample's semantics), and the reference of
kernels/decode_sample.cu built on it.

draw_sorted is the definition every path follows: sampling.pick_index (the CPU runner, the GPU's host path for rows
with a grammar, logprobs or biases) calls it after its sort; the GPU's kernels (decode_sample.cu smp_*) find the
same crossings without sorting. A token's mass is an integer, floor(exp(x * inv - max * inv) * 2^44), so every sum is
exact in whatever order a path adds it: given the same exp, every path draws the same token, bit for bit.
"""
from __future__ import annotations

import torch

MASS_BITS = 44  # a token's mass: floor(e * 2^44), e = exp(x / T - max / T) in (0, 1]; a row of 151,936 sums < 2^62
U_BITS = 53  # the uniform and top_p as integers: floor(u * 2^53), floor(top_p * 2^53)


def masses(v: torch.Tensor) -> torch.Tensor:
    """v float32 [n] = logits * inv (float32), its max first or anywhere -> int64 [n] masses floor(exp(v - max(v)) *
    2^44) (float32 exp, as the kernels' expf; NaN -> 0)."""
    e = torch.nan_to_num_(torch.exp(v - v.max()), nan=0.0)
    return torch.floor_(e.mul_(float(1 << MASS_BITS))).long()  # float32 e * 2^44 and its floor are exact


def frac53(a: int, b: int, up: bool) -> int:
    """floor (or ceil) of a * b / 2^53, exactly (Python integers; the kernels: a 128-bit product)."""
    q, rem = divmod(a * b, 1 << U_BITS)
    return q + (1 if up and rem else 0)


def top_p_need(top_p: float, Z: int) -> int:
    """top_p's crossing: the kept prefix is the shortest whose mass reaches max(1, ceil(floor(top_p * 2^53) * Z / 2^53))."""
    return max(1, frac53(int(max(top_p, 0.0) * float(1 << U_BITS)), Z, True))


def draw_target(u: float, kept: int) -> int:
    """The draw's target: the first token whose mass through it exceeds floor(floor(u * 2^53) * kept / 2^53)."""
    return frac53(int(u * float(1 << U_BITS)), kept, False)


def draw_sorted(vals: torch.Tensor, idx: torch.Tensor, temperature: float, top_k: int, top_p: float,
                u: torch.Tensor) -> torch.Tensor:
    """vals float32 [V'] one row's logits sorted descending (ties to the lower id), idx int64 [V'] their ids, u float64
    [1] a uniform in [0, 1), all on one device -> the drawn id, int64 [1]:
      n = top_k if 0 < top_k < V' else V'; inv = float32(1 / temperature); M_i = masses(vals[:n] * inv) (integers);
      incl = cumsum(M), Z = incl[-1] (exact);
      top_p < 1: keep = 1 + the first i with incl_i >= max(1, ceil(P * Z / 2^53)), P = floor(top_p * 2^53); else n;
      kept = incl[keep - 1]; the id at the first i with incl_i > floor(U * kept / 2^53), U = floor(u * 2^53);
      the first id if Z is 0 (every logit -inf)."""
    V = vals.numel()
    n = top_k if 0 < top_k < V else V
    inv = torch.full((1,), 1.0 / temperature, dtype=torch.float32, device=vals.device)
    incl = torch.cumsum(masses(vals[:n] * inv), 0)
    Z = int(incl[-1])
    if Z == 0:
        return idx[:1]
    keep = n
    if top_p < 1.0:
        keep = int(torch.searchsorted(incl, torch.tensor([top_p_need(top_p, Z)], device=incl.device))) + 1
    kept = int(incl[keep - 1])
    t = draw_target(float(u.reshape(-1)[0]), kept)
    pick = min(int(torch.searchsorted(incl, torch.tensor([t], device=incl.device), right=True)), keep - 1)
    return idx[pick:pick + 1]


def sample_rows_ref(logits: torch.Tensor, prm: torch.Tensor, u: torch.Tensor, at: torch.Tensor, keys: torch.Tensor,
                    B: int):
    """decode_sample.cu (smp_max .. smp_pick): keys[r] = 0xFFFFFFFF - the id draw_sorted draws from row r < B of
    logits (any order) with (temperature, top_k, top_p) = prm[r] and u[at + r]; rows of temperature 0 untouched."""
    base = int(at.reshape(-1)[0])
    for r in range(B):
        T, k, p = (float(x) for x in prm[r].tolist())
        if not T > 0:
            continue
        vals, idx = torch.sort(logits[r], descending=True, stable=True)
        tok = draw_sorted(vals, idx, T, int(k), p, u.reshape(-1)[base + r:base + r + 1])
        keys[r] = 0xFFFFFFFF - int(tok)
