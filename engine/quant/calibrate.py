"""Calibration for the GPTQ quantizer: run the dense model one decoder layer at a time on a short
calibration text and collect, for every fused linear, the Hessian of its inputs (engine/quant/gptq.py).

    cal = Calibrator(cfg, token_ids, embed_rows)      # hidden states [T, hidden] per segment
    packed = cal.layer(dense_weights_of_layer_i, bits_per_linear)   # GPTQ, then advance
    head = cal.head(final_norm, rows, n_rows, bits)    # untied lm_head, on the final-norm states

Only one layer's weights and the calibration activations (segments x 512 tokens x hidden, float32)
are in memory at a time. Hessians of a layer come from its dense forward; the hidden states passed
to the next layer come from the *quantized* layer (as in the GPTQ reference), so each layer is
calibrated on what the quantized model will really feed it. Within a layer, all four Hessians come
from one dense forward ("true sequential" per linear was measured worse for w4: 8.587 vs 8.270).

The calibration text is assets/calibration.txt (~2,900 tokens of English, Chinese, code and ChatML
chat, written for this repo; it is not the perplexity text tests/data/ppl_text.txt), plus
assets/calibration_extra.txt for the "extended" set (the recipe's `calib`).
Device: CUDA when present, else CPU (same torch code).
"""
from __future__ import annotations

import hashlib

import torch
import torch.nn.functional as F

from engine.assets_path import asset
from engine.model.forward import layer
from engine.model.layout import LINEARS, NORMS, LayerWeights
from engine.quant.awq import fold
from engine.quant.gptq import Hessian
from engine.quant.quantize import pack_fast
from engine.quant.recipe import DEFAULT, Recipe, quantize_linear
from kernels.ops_reference import RefOps, Rotary
from kernels.pack import dequantize

SEGMENT = 512  # tokens per calibration sequence (positions restart at 0 in each; 2048 measured worse for w4)
HEAD_ROWS = 16384  # lm_head rows per GPTQ call (rows are independent given H)


# Calibration sets: the bundled texts each uses (assets/README.md says where they come from).
CALIBRATION_TEXTS = {"base": ("calibration.txt",), "extended": ("calibration.txt", "calibration_extra.txt"),
                     "large": ("calibration.txt", "calibration_extra.txt", "calibration_large.txt")}


def calibration_ids(tokenizer, vocab: int | None = None, max_tokens: int = 16384,
                    texts: str = "base", extra: list[list[int]] | None = None) -> list[list[int]]:
    """The bundled calibration text(s) as segments of at most SEGMENT tokens, each text segmented on its
    own (ids >= vocab dropped: a test model with a cut vocabulary); then `extra` sequences as they are (the
    model's own text, engine/quant/selfcalib.py)."""
    out, n = [], 0
    for ids in extra or []:
        ids = [i for i in ids if vocab is None or i < vocab][:SEGMENT]
        if len(ids) >= 16:
            out.append(ids)
    for name in CALIBRATION_TEXTS[texts]:
        ids = tokenizer.encode(asset(name).read_text(encoding="utf-8"))[:max_tokens - n]
        ids = [i for i in ids if vocab is None or i < vocab]
        n += len(ids)
        out += [ids[i:i + SEGMENT] for i in range(0, len(ids), SEGMENT) if len(ids[i:i + SEGMENT]) >= 16]
    return out


# calib="auto": the first set (in this order) with at least FULL_RANK x the widest linear input (down_proj's K =
# intermediate_size) tokens, else the largest. Fitted on the two real models (docs/quantization.md): the 0.5B
# (K 4,864) measured best on "extended" (8,564 tokens, 1.8 K; "large": worse), the 1.5B (K 8,960: "extended" is
# 0.96 K, a singular down_proj Hessian) on "large" (16,384 tokens, 1.8 K).
AUTO_ORDER = ("base", "extended", "large")
FULL_RANK = 1.5


def calibration_set(spec, recipe: Recipe) -> str:
    """The bundled set a recipe calibrates on: its `calib`, with "auto" resolved for the model (above)."""
    if recipe.calib != "auto":
        return recipe.calib
    need = FULL_RANK * spec.config.intermediate_size
    for name in AUTO_ORDER:
        ids = calibration_ids(spec.tokenizer, vocab=spec.config.vocab_size, texts=name)
        if sum(len(s) for s in ids) >= need:
            return name
    return AUTO_ORDER[-1]


def recipe_segments(spec, recipe: Recipe) -> list[list[int]]:
    """The calibration segments a recipe asks for: its bundled texts (calibration_set), after `self_tokens` of
    the model's own text when set (selfcalib.py). What the export and recipe_search both calibrate on."""
    from engine.quant import selfcalib

    extra = selfcalib.generated_segments(spec, recipe.self_tokens) if recipe.self_tokens else None
    return calibration_ids(spec.tokenizer, vocab=spec.config.vocab_size, texts=calibration_set(spec, recipe),
                           extra=extra)


def digest(tensors) -> str:
    """Short sha256 of tensors' bytes, in order (to compare two runs bit for bit, e.g. at 1 vs 2 threads)."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:12]


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class _Recording:
    """A dense fused linear for RefOps (x [..., K] -> x @ W.T + b) that first adds x to a Hessian (or, given
    `keep`, stores x there under its name: the dense path's inputs that the asymmetric target pairs with)."""

    def __init__(self, w: torch.Tensor, b: torch.Tensor | None, hess=None, keep=None, name=None):
        self.w, self.b, self.hess, self.keep, self.name = w, b, hess, keep, name

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.hess is not None:
            self.hess.add(x)
        if self.keep is not None:
            self.keep[self.name] = x.reshape(-1, x.shape[-1])
        return F.linear(x, self.w, self.b)


class _Paired:
    """A Hessian that also sums the cross term C = X_dense^T X [K, K] (float64) of each batch with the dense
    path's inputs of the same tokens (engine/quant/calibrate.py asymmetric targets)."""

    def __init__(self, hess: Hessian, dense_inputs: dict, name: str):
        self.hess, self.dense, self.name = hess, dense_inputs, name
        self.C = torch.zeros_like(hess.S)

    def add(self, x: torch.Tensor):
        self.hess.add(x)
        self.C.addmm_(self.dense[self.name].double().T, x.reshape(-1, x.shape[-1]).double())


def asym_target(w: torch.Tensor, C: torch.Tensor, S: torch.Tensor, shrink: float) -> torch.Tensor:
    """W* = W (C + lam I)(S + lam I)^-1, lam = shrink x mean(diag S): the weights whose output on the quantized
    model's inputs X~ best matches the dense model's W X, kept near W where the calibration says little
    (minimises sum over tokens |W* x~ - W x|^2 + lam |W* - W|^2; S = X~^T X~, C = X^T X~). GPTQ of W* under S
    then minimises the error against the dense model's own outputs (GPTAQ, Li et al. 2025), not against W on
    drifted inputs. With X~ = X it is W exactly. float64; returns float32 [N, K]."""
    lam = shrink * S.diagonal().mean()
    A = S.clone()
    A.diagonal().add_(lam)
    B = C.T.clone()  # (C + lam I)^T
    B.diagonal().add_(lam)
    L = torch.linalg.cholesky(A)
    Z = torch.cholesky_solve(B @ w.double().T, L)  # A Z = (C + lam I)^T W^T (A symmetric) -> Z = W*^T [K, N]
    return Z.T.float().contiguous()


class Calibrator:
    def __init__(self, cfg, segments: list[list[int]], embed_rows, device: str | None = None,
                 recipe: Recipe = DEFAULT, dense_rows=None):
        """embed_rows(ids LongTensor) -> float32 [len, hidden] (the embedding the quantized model uses);
        dense_rows: the same for the dense model (the recipe's asym targets; default embed_rows)."""
        self.cfg, self.recipe = cfg, recipe
        self.device = device or default_device()
        self.rot = Rotary(cfg.head_dim, max(len(s) for s in segments), cfg.rope_theta, device=self.device)
        self.xs = [embed_rows(torch.tensor(s)).float().to(self.device) for s in segments]
        self.tokens = sum(len(s) for s in segments)
        # the dense model's own hidden states (recipe.asym): what each layer's output is matched against
        self.xd = [(dense_rows or embed_rows)(torch.tensor(s)).float().to(self.device) for s in segments] \
            if recipe.asym else None
        self.trace: list[dict] | None = None  # set to [] to record per-layer digests (inputs, Hessians, outputs)

    def _forward(self, x: torch.Tensor, w: dict, hess: dict | None, keep: dict | None = None) -> torch.Tensor:
        """One Qwen2 decoder layer on x [T, hidden] (positions 0..T-1) -> the residual stream after it: the
        model's own layer (engine.model.forward.layer) on the reference ops. w holds float32 fused weights
        (names as LINEARS + '.bias' + norms); inputs of every linear named in `hess` go to its Hessian."""
        c, T = self.cfg, x.shape[0]
        lin = [_Recording(w[m], w.get(m + ".bias"), (hess or {}).get(m), keep, m) for m in LINEARS]
        L = LayerWeights(w["input_layernorm"], w["post_attention_layernorm"], *lin)
        k = torch.empty(1, 1, c.num_kv_heads, T, c.head_dim, device=x.device)
        ops = RefOps(None, k, torch.empty_like(k), self.rot, [0], [0], c.num_heads, c.rms_eps)
        h = x.unsqueeze(0).clone()  # [1, T, hidden], updated in place by the layer
        layer(ops, 0, L, h, ops.add_norm(h, None, L.in_norm), L.post_norm)  # (the closing norm is unused)
        return h[0]

    @torch.no_grad()
    def layer(self, dense: dict[str, torch.Tensor], bits: dict[str, int],
              fixed: dict | None = None) -> dict[str, dict[str, torch.Tensor]]:
        """dense: fused float weights (LINEARS keys, '<qkv>.bias', the two norms); bits: LINEARS key -> 4|3|16;
        fixed: linears already packed (AWQ/GPTQ source), kept as they are.
        Returns {linear: {"qweight","scales","mins"} | {"weight"}} and advances the hidden states; with the
        recipe's awq, also {norm name: {"weight"}} and the qkv linear's "bias" (the scales folded in)."""
        fixed = fixed or {}
        w = {k: v.to(self.device, torch.float32, copy=True) for k, v in dense.items()}
        hess = {m: Hessian(w[m].shape[1], self.device, self.recipe.token_cap) for m in bits if m not in fixed}
        x_digest = digest(self.xs) if self.trace is not None else None
        if self.xd is None:
            for x in self.xs:
                self._forward(x, w, hess)
        else:  # per segment: the dense path's inputs (advancing it), then this path's, paired token by token
            keep, xd = {}, []
            paired = {m: _Paired(h, keep, m) for m, h in hess.items()}
            for x, x0 in zip(self.xs, self.xd):
                xd.append(self._forward(x0, w, None, keep))
                self._forward(x, w, paired)
            self.xd = xd
            del keep
        out = {}
        if self.recipe.awq and not fixed and any(b < 16 for b in bits.values()):
            fold(w, hess, bits, self.cfg)  # same function, scaled columns; norms / up / v rows absorb 1/s
            out.update({n: {"weight": w[n].cpu()} for n in NORMS})
        for m, b in bits.items():
            if m in fixed or b == 16:
                out[m] = fixed[m] if m in fixed else {"weight": w[m].half().cpu()}
                continue
            target = w[m] if self.xd is None else asym_target(w[m], paired[m].C, hess[m].S, self.recipe.asym)
            q, s, mn = quantize_linear(target, hess[m].H, b, self.recipe)
            out[m] = {"qweight": pack_fast(q, b), "scales": s, "mins": mn}
            if NORMS[0] in out and f"{m}.bias" in w:
                out[m]["bias"] = w[f"{m}.bias"].cpu()  # AWQ scaled the v part of the bias
            w[m] = dequantize(q, s, mn).to(self.device)  # the next layer sees the quantized output
        if self.trace is not None:
            self.trace.append({"x": x_digest, "H": {m: digest([h.S]) for m, h in hess.items()},
                               "q": {m: digest(list(p.values())) for m, p in out.items()}})
        del hess
        self.xs = [self._forward(x, w, None) for x in self.xs]
        return out

    @torch.no_grad()
    def head(self, norm: torch.Tensor, rows, n_rows: int, bits: int) -> dict[str, torch.Tensor]:
        """GPTQ of an untied lm_head [n_rows, hidden] on the final-norm hidden states.
        rows(r0, r1) -> float32 rows of the head (read in HEAD_ROWS chunks)."""
        n = norm.float().to(self.device)
        hs = Hessian(self.cfg.hidden_size, self.device)
        keep = {}
        pair = _Paired(hs, keep, "head") if self.xd is not None else hs
        for j, x in enumerate(self.xs):
            if self.xd is not None:
                keep["head"] = _rms(self.xd[j], n, self.cfg.rms_eps)
            pair.add(_rms(x, n, self.cfg.rms_eps))
        parts = []
        for r in range(0, n_rows, HEAD_ROWS):
            w = rows(r, min(n_rows, r + HEAD_ROWS))
            if self.xd is not None:
                w = asym_target(w.to(self.device), pair.C, hs.S, self.recipe.asym)
            q, s, m = quantize_linear(w, hs.H, bits, self.recipe)
            parts.append({"qweight": pack_fast(q, bits), "scales": s, "mins": m})
        out = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
        if self.trace is not None:
            self.trace.append({"x": digest(self.xs), "H": {"lm_head": digest([hs.S])},
                               "q": {"lm_head": digest(list(out.values()))}})
        return out
