"""End-to-end tuning of a quantized model's scales and mins, the codes fixed: distillation from the dense
reference on the calibration text (the "E2E-QP" stage of EfficientQAT, Chen et al. 2024, on our layout).

GPTQ (gptq.py, refit.py) minimises each linear's own output error on its calibration inputs; what a user
sees is the model's next-token distribution, through 24-28 layers of softmax and SiLU gating that no
per-linear objective knows about. With every integer code fixed, the per-group scale and min of every
quantized tensor (embedding/head included) are a small set of parameters (2 per 128 weights) that the
whole model's output depends on smoothly, so they can be fitted to the dense model's distribution:

    targets = teacher_targets(dense, cfg, segments)   # top-K log-probs of the reference, per token
    log = tune(qweights, cfg, segments, targets)      # Adam on (a, b): s = s0 (1 + a), m = m0 + s0 b
    s, m = qlinear.fp16()                             # fp16 [N, K/128] each, the codes unchanged

The loss is KL(reference || quantized) over K+1 bins (the reference's top-K tokens and the rest of
the mass), averaged over the calibration tokens. Parameters are relative to the starting scale, so one
learning rate fits every tensor. The codes never change, so the packed layout, the kernels and the bytes
per token are those of the GPTQ result; only fp16 scale/min values differ. Same torch code on CPU/CUDA.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.forward import forward
from engine.model.layout import LayerWeights
from kernels.ops_reference import Rotary, rms_norm, silu_and_mul
from kernels.pack import dequantize

TOPK = 32  # reference log-probs kept per calibration token (the rest is one bin)
SCHEDS = ("const", "cos")  # learning-rate schedules of tune() (Recipe.tune_sched)


class _QMatmul(torch.autograd.Function):
    """y = x @ W.T with W [N, K] = q * s + m per group of `group` along K, rebuilt in backward (never kept):
    the saved state of a linear is its codes and [N, K/g] parameters, not a dense fp32 copy."""

    @staticmethod
    def forward(ctx, x, q, s, m, group):
        ctx.save_for_backward(x, q, s, m)
        ctx.group = group
        return x @ dequantize(q, s, m).T

    @staticmethod
    def backward(ctx, gy):
        x, q, s, m = ctx.saved_tensors
        g, (N, K) = ctx.group, q.shape
        gx = gy @ dequantize(q, s, m)
        gw = (gy.reshape(-1, N).T @ x.reshape(-1, K)).view(N, K // g, g)  # dL/dW [N, G, g]
        gs = (gw * q.view(N, K // g, g)).sum(-1)
        gm = gw.sum(-1)
        return gx, None, gs, gm, None


class QLinear(nn.Module):
    """A quantized linear with fixed codes q uint8 [N, K] and trainable per-group (a, b) [N, K/group]:
    scales = s0 (1 + a), mins = m0 + s0 b (s0, m0: the starting fp16 values, as float32)."""

    def __init__(self, q: torch.Tensor, s: torch.Tensor, m: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.group = q.shape[1] // s.shape[1]
        self.register_buffer("q", q.to(torch.uint8))
        self.register_buffer("s0", s.float())
        self.register_buffer("m0", m.float())
        self.register_buffer("bias", None if bias is None else bias.float())
        self.a = nn.Parameter(torch.zeros_like(self.s0))
        self.b = nn.Parameter(torch.zeros_like(self.s0))

    @classmethod
    def from_packed(cls, d: dict, bits: int, bias: torch.Tensor | None = None) -> "QLinear":
        """From a packed tensor dict {qweight, scales, mins} (group 128, as export and recipe_search hold them)."""
        from engine.quant.quantize import unpack_fast
        from kernels.pack import GROUP
        return cls(unpack_fast(d["qweight"], d["scales"].shape[1] * GROUP, bits), d["scales"], d["mins"], bias)

    def params(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.s0 * (1 + self.a), self.m0 + self.s0 * self.b

    def forward(self, x):
        s, m = self.params()
        y = _QMatmul.apply(x, self.q, s, m, self.group)
        return y if self.bias is None else y + self.bias

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Dequantized rows (an embedding lookup), differentiable in (a, b)."""
        s, m = self.params()
        return dequantize(self.q[ids], s[ids], m[ids])

    def fp16(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The tuned (scales, mins), rounded to fp16 as the checkpoint stores them."""
        with torch.no_grad():
            s, m = self.params()
            return s.clamp_min(1e-8).half().cpu(), m.half().cpu()


class _Resid:
    """The residual stream, replaced (not updated in place) on every add, so autograd can follow it."""

    def __init__(self, t):
        self.t = t


class TrainOps:
    """The one forward's ops (engine/model/forward.py) for one sequence at positions 0..T-1, out of place
    and differentiable: no KV cache (attention over the sequence itself), logits of every token."""

    def __init__(self, ids: torch.Tensor, rotary: Rotary, heads: int, kv_heads: int, eps: float):
        self.ids, self.rotary, self.heads, self.kv_heads, self.eps = ids, rotary, heads, kv_heads, eps
        self.pos = torch.arange(ids.shape[0], device=ids.device)

    def embed(self, w):
        return _Resid(w.rows(self.ids) if isinstance(w, QLinear) else F.embedding(self.ids, w))

    def add_norm(self, h, y, weight):
        if y is not None:
            h.t = h.t + y
        return rms_norm(h.t, weight, self.eps)

    def linear(self, w, x, epi, h=None):
        y = w(x)
        return silu_and_mul(y) if epi == "silu" else y

    def attention(self, i, qkv):
        T, H, Hkv = qkv.shape[0], self.heads, self.kv_heads
        hd = qkv.shape[1] // (H + 2 * Hkv)
        q, k, v = qkv.split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
        q = self.rotary.apply(q.reshape(T, H, hd), self.pos).transpose(0, 1)  # [H, T, hd]
        k = self.rotary.apply(k.reshape(T, Hkv, hd), self.pos).transpose(0, 1)
        v = v.reshape(T, Hkv, hd).transpose(0, 1)
        rep = H // Hkv
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        out = F.scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), is_causal=True)
        return out[0].transpose(0, 1).reshape(T, H * hd)

    def logits(self, x, head):
        return x @ head.T if isinstance(head, torch.Tensor) else head(x)


@dataclass
class Weights:
    """A model as TrainOps' forward reads it: embed (tensor or QLinear), layers (LayerWeights of modules),
    norm, lm_head (a module; a tied QLinear embedding serves as its own head)."""
    embed: object
    layers: list
    norm: torch.Tensor
    lm_head: object


class _Dense:
    """A dense linear's weights copied to a device (the model's own modules stay where they are)."""

    def __init__(self, w: torch.Tensor, b: torch.Tensor | None):
        self.w, self.b = w, b

    def __call__(self, x):
        return F.linear(x, self.w, self.b)


def on_device(w: Weights, device) -> Weights:
    """`w` with every tensor on `device`: QLinears moved (they are tune's own), dense modules and tensors
    copied (a model's parameters are not moved under it)."""
    def conv(x):
        if isinstance(x, (QLinear, torch.Tensor)):
            return x.to(device)
        return _Dense(x.weight.data.to(device), None if x.bias is None else x.bias.data.to(device))

    layers = [LayerWeights(*[conv(getattr(L, f)) for f in ("in_norm", "post_norm", "qkv", "o", "gate_up", "down")])
              for L in w.layers]
    embed = conv(w.embed)
    head = embed if w.lm_head is w.embed else conv(w.lm_head)
    return Weights(embed, layers, conv(w.norm), head)


def run(w: Weights, cfg, ids: torch.Tensor, rotary: Rotary) -> torch.Tensor:
    """ids [T] -> logits [T, vocab] float32, differentiable in every QLinear's (a, b)."""
    ops = TrainOps(ids, rotary, cfg.num_heads, cfg.num_kv_heads, cfg.rms_eps)
    return forward(ops, w).float()


@torch.no_grad()
def teacher_targets(w: Weights, cfg, segments: list[list[int]], device="cpu", k: int = TOPK):
    """Per segment: (top-k log-probs float32 [T, k], their token ids [T, k]) of the reference model."""
    rot = Rotary(cfg.head_dim, max(len(s) for s in segments), cfg.rope_theta, device=device)
    out = []
    for s in segments:
        lp = torch.log_softmax(run(w, cfg, torch.tensor(s, device=device), rot), -1)
        v, i = lp.topk(k, -1)
        out.append((v, i))
    return out


def kl_topk(logits: torch.Tensor, target: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Mean over tokens of KL(p || q) on k+1 bins: the reference's top-k tokens and the rest of the mass."""
    tv, ti = target
    lq = torch.log_softmax(logits, -1)
    lqk = lq.gather(1, ti)  # [T, k]
    p = tv.exp()
    p_rest = (1 - p.sum(-1)).clamp_min(1e-12)
    q_rest = (1 - lqk.exp().sum(-1)).clamp_min(1e-12)
    kl = (p * (tv - lqk)).sum(-1) + p_rest * (p_rest.log() - q_rest.log())
    return kl.mean()


class _Norms:
    """The RMSNorm weights of `w` (two per layer and the final one) as trainable relative offsets:
    weight = n0 (1 + c), c starting at 0, like the scales' `a`. They are fp32 vectors a checkpoint stores as
    they are (no rounding), 0.01% of a layer's parameters, and they rescale exactly the activations whose
    statistics quantization shifted. `view()` is `w` with the current weights (differentiable); `write()` puts
    the tuned values into `w` itself (detached), where the callers read them."""

    def __init__(self, w: Weights):
        self.w = w
        n0 = [t for L in w.layers for t in (L.in_norm, L.post_norm)] + [w.norm]
        self.n0 = [t.detach().float() for t in n0]
        self.c = [nn.Parameter(torch.zeros_like(t)) for t in self.n0]

    def values(self) -> list[torch.Tensor]:
        return [n * (1 + c) for n, c in zip(self.n0, self.c)]

    def view(self) -> Weights:
        v = self.values()
        layers = [replace(L, in_norm=v[2 * i], post_norm=v[2 * i + 1]) for i, L in enumerate(self.w.layers)]
        return Weights(self.w.embed, layers, v[-1], self.w.lm_head)

    @torch.no_grad()
    def write(self):
        v = [t.detach().clone() for t in self.values()]
        for i, L in enumerate(self.w.layers):
            L.in_norm, L.post_norm = v[2 * i], v[2 * i + 1]
        self.w.norm = v[-1]


def tune(w: Weights, cfg, segments: list[list[int]], targets, epochs: int = 4, lr: float = 1e-3,
         val: int = 0, log=sys.stderr, on_epoch=None, norms: bool = False, sched: str = "const") -> dict:
    """Adam on every QLinear's (a, b) in `w`, one segment per step, `epochs` passes over segments[val:]
    (segments[:val] are held out: their KL is reported before and after each epoch). norms: the RMSNorm
    weights too (_Norms; the tuned values are left in w's layers and w.norm after each epoch). sched "cos": the
    learning rate decays from lr to 0 over all steps (lr/2 (1 + cos(pi step/steps))), so the last epoch refines
    with small steps instead of adding one-segment noise of full size; "const": lr throughout. on_epoch(ep,
    hist), if given, runs after each epoch (ep = 1..epochs; a diagnostic such as the perplexity so far).
    Returns the log."""
    if sched not in SCHEDS:
        raise ValueError(f"tune sched {sched!r}: " + " or ".join(SCHEDS))
    qs = [m for m in _qlinears(w)]
    nw = _Norms(w) if norms else None
    opt = torch.optim.Adam([p for m in qs for p in (m.a, m.b)] + (nw.c if nw else []), lr=lr)
    device = qs[0].q.device
    rot = Rotary(cfg.head_dim, max(len(s) for s in segments), cfg.rope_theta, device=device)
    ids = [torch.tensor(s, device=device) for s in segments]
    train = list(range(val, len(segments)))
    hist = {"epochs": epochs, "lr": lr, "train_segments": len(train), "val_segments": val, "kl_train": [],
            "kl_val": [], "norms": norms, "sched": sched}
    steps, step = epochs * len(train), 0

    def cur():  # w as the step sees it (the norms' current values when they are tuned)
        return nw.view() if nw else w

    def val_kl():
        with torch.no_grad():
            return sum(kl_topk(run(cur(), cfg, ids[j], rot), targets[j]).item() for j in range(val)) / max(val, 1)

    if val:
        hist["kl_val"].append(val_kl())
        print(f"  tune: held-out KL before {hist['kl_val'][0]:.4f}", file=log, flush=True)
    g = torch.Generator().manual_seed(0)
    for ep in range(epochs):
        t0, tot = time.perf_counter(), 0.0
        for j in [train[i] for i in torch.randperm(len(train), generator=g).tolist()]:
            if sched == "cos":
                for grp in opt.param_groups:
                    grp["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / steps))
            step += 1
            opt.zero_grad(set_to_none=True)
            loss = kl_topk(run(cur(), cfg, ids[j], rot), targets[j])
            loss.backward()
            opt.step()
            tot += loss.item()
        hist["kl_train"].append(tot / len(train))
        if nw:
            nw.write()
        if val:
            hist["kl_val"].append(val_kl())
        print(f"  tune epoch {ep + 1}/{epochs}: train KL {hist['kl_train'][-1]:.4f}"
              + (f", held-out KL {hist['kl_val'][-1]:.4f}" if val else "")
              + f" ({time.perf_counter() - t0:.0f} s)", file=log, flush=True)
        if on_epoch is not None:
            on_epoch(ep + 1, hist)
    return hist


def _qlinears(w: Weights):
    seen = set()
    for m in [w.embed, w.lm_head] + [x for L in w.layers for x in (L.qkv, L.o, L.gate_up, L.down)]:
        if isinstance(m, QLinear) and id(m) not in seen:
            seen.add(id(m))
            yield m


def param_count(w: Weights, norms: bool = False) -> int:
    n = (sum(t.numel() for L in w.layers for t in (L.in_norm, L.post_norm)) + w.norm.numel()) if norms else 0
    return sum(m.a.numel() * 2 for m in _qlinears(w)) + n

