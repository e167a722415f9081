"""GPTQ-style error-compensating quantization into our packed layout (kernels/pack.py).

Frantar et al., "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained Transformers"
(2022), adapted to our format: asymmetric, group 128 along K, fp16 scale and min per group, act-order
off, damping 0.01 * mean(diag H). For a linear y = x @ W.T with calibration inputs X [T, K], the
Hessian of the layer's output error is H = 2 X^T X / T [K, K]. Columns (input channels k) are quantized
left to right; the rounding error of column k is spread over the not-yet-quantized columns through
the inverse Hessian, so the *output* error on the calibration activations is what is minimized, not
the weight error (that is what round-to-nearest and the clip search minimize).

Group parameters are fixed when a group's first column is reached, from the weights as updated by
the earlier groups (the reference implementation's `groupsize` rule), and rounded to fp16 *before*
quantizing the group, so the error fed back is the error of exactly what the checkpoint stores.

Runs on whatever device W and H live on (CPU for the 0.5B; CUDA when present).
"""
from __future__ import annotations

import torch

from kernels.pack import GROUP

DAMP = 0.01
SUB = 16  # columns per inner sub-block of a 128-column block


class Hessian:
    """H = 2 X^T X / n over batches of inputs x [..., K], accumulated in float64 (a sum of X^T X over
    the batches, divided once at the end: no rescaling of the running sum per batch)."""

    def __init__(self, K: int, device="cpu", cap: float = 0.0):
        """cap > 0: a token whose squared norm exceeds cap x the batch's mean counts as if it were cap x the mean
        (its row scaled down): Qwen2's attention-sink token (position 0) carries up to half of an early
        down_proj's trace(H) alone (docs/quantization.md)."""
        self.S = torch.zeros(K, K, dtype=torch.float64, device=device)
        self.n = 0
        self.cap = cap

    def add(self, x: torch.Tensor):
        x = x.reshape(-1, x.shape[-1]).double()
        if self.cap > 0:
            e = (x * x).sum(1)
            x = x * (self.cap * e.mean() / e.clamp_min(1e-30)).clamp(max=1.0).sqrt().unsqueeze(1)
        self.n += x.shape[0]
        self.S.addmm_(x.T, x)

    @property
    def H(self) -> torch.Tensor:
        """[K, K] float64."""
        return self.S * (2.0 / max(self.n, 1))


def _group_params(w: torch.Tensor, qmax: int):
    """w [N, GROUP] -> fp16-exact (scale, min) as float32 [N, 1] (the pack.quantize min/max rule)."""
    lo, hi = w.amin(-1), w.amax(-1)
    s = ((hi - lo) / qmax).clamp_min(1e-8).half().float()
    m = lo.half().float()
    return s.unsqueeze(1), m.unsqueeze(1)


def gptq_prepare(H: torch.Tensor, damp: float = DAMP, act_order: bool = False):
    """(dead inputs, column order, upper Cholesky factor of the damped, permuted H^-1): what every GPTQ
    pass over the same H shares (the K^3 part; computed once when a recipe runs GPTQ twice).
    Damping, Cholesky and the triangular inverse run in float64 (H of a wide down_proj is rank-deficient on
    a few thousand calibration tokens and far from well conditioned); the factor is returned as float32,
    what the column loop uses. Ties in diag(H) are broken by column index (stable sort)."""
    H = H.to(torch.float64, copy=True)
    dead = torch.diag(H) == 0  # inputs that never fire: any value works, zero them
    H[dead, dead] = 1
    H.diagonal().add_(damp * torch.mean(torch.diag(H)))
    K = H.shape[0]
    perm = torch.argsort(torch.diag(H), descending=True, stable=True) if act_order \
        else torch.arange(K, device=H.device)
    H = H[perm][:, perm]
    # Upper Cholesky factor U of H^-1 (row i: the update coefficients for column i onward). With J the
    # reversal and J H J = L L^T: H^-1 = J L^-T L^-1 J = U^T U, U = J L^-1 J upper triangular. One Cholesky and
    # one triangular solve (~5x faster on CPU than cholesky_inverse then a second Cholesky; same U).
    L = torch.linalg.cholesky(H.flip(0, 1))
    eye = torch.eye(K, dtype=H.dtype, device=H.device)
    U = torch.linalg.solve_triangular(L, eye, upper=False).flip(0, 1)
    return dead, perm, U.float()


def gptq_quantize(w: torch.Tensor, H: torch.Tensor, bits: int, damp: float = DAMP, act_order: bool = False,
                  params: tuple[torch.Tensor, torch.Tensor] | None = None, prep=None):
    """w [N, K], H [K, K] -> (q uint8 [N, K], scales fp16, mins fp16 [N, K/128]) on CPU.

    Same output contract as pack.quantize / quantize_clip, so quantize.pack_fast packs it.
    act_order: columns in decreasing diag(H) order ("static groups": every group's scale/min is fixed
    first, from the weights before any update, so groups stay the layout's contiguous 128 columns).
    params: (scales, mins) [N, K/128] to use as they are (e.g. from refit_params); implies static groups.
    prep: gptq_prepare(H, damp, act_order), when already computed.
    """
    N, K = w.shape
    if K % GROUP:
        raise ValueError(f"K={K} is not a multiple of {GROUP}")
    qmax = (1 << bits) - 1
    dead, perm, Hinv = prep or gptq_prepare(H, damp, act_order)
    W = w.to(Hinv.device, torch.float32).clone()
    W[:, dead] = 0
    static = act_order or params is not None
    if static:
        if params is None:
            s0, m0 = _group_params(W.reshape(N * (K // GROUP), GROUP), qmax)
            params = s0.reshape(N, K // GROUP), m0.reshape(N, K // GROUP)
        S = params[0].to(W.device, torch.float32).clone()
        M = params[1].to(W.device, torch.float32).clone()
    else:
        S = torch.empty(N, K // GROUP, dtype=torch.float32, device=W.device)
        M = torch.empty_like(S)
    W = W[:, perm]
    group = (perm // GROUP).tolist()  # column i of the permuted order belongs to group group[i]
    Q = torch.empty(N, K, dtype=torch.uint8, device=W.device)
    for g, i1 in enumerate(range(0, K, GROUP)):  # block = 128 columns (one group unless act_order)
        i2 = i1 + GROUP
        W1 = W[:, i1:i2].clone()
        Hinv1 = Hinv[i1:i2, i1:i2]
        Err1 = torch.zeros_like(W1)
        if not static:
            s, m = _group_params(W1, qmax)
            S[:, g], M[:, g] = s[:, 0], m[:, 0]
        for j1 in range(0, GROUP, SUB):  # columns in sub-blocks: per column only its sub-block is updated,
            j2 = j1 + SUB                 # the rest of the block once per sub-block (one matmul; same result)
            for i in range(j1, j2):
                if static:
                    gi = group[i1 + i]
                    s, m = S[:, gi:gi + 1], M[:, gi:gi + 1]
                col = W1[:, i:i + 1]
                q = torch.round((col - m) / s).clamp_(0, qmax)
                Q[:, i1 + i] = q[:, 0].to(torch.uint8)
                err = (col - (q * s + m)) / Hinv1[i, i]
                W1[:, i:j2].addmm_(err, Hinv1[i:i + 1, i:j2], alpha=-1)
                Err1[:, i:i + 1] = err
            W1[:, j2:].addmm_(Err1[:, j1:j2], Hinv1[j1:j2, j2:], alpha=-1)
        W[:, i2:].addmm_(Err1, Hinv[i1:i2, i2:], alpha=-1)
    Q[:, perm] = Q.clone()  # back to the layout's column order
    return Q.cpu(), S.half().cpu(), M.half().cpu()


def output_error(w: torch.Tensor, wq: torch.Tensor, H: torch.Tensor) -> float:
    """tr((W - Wq) H (W - Wq)^T): the calibration output error GPTQ minimizes (for tests / logs)."""
    d = (w.double() - wq.double()).to(H.device)
    return float(((d @ H.double()) * d).sum())
