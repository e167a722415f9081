"""Draft heads: K small residual blocks on the target model's final (normed) hidden state and the embedding of the
token that state produced, each followed by the model's own lm_head, that guess the tokens after it (Medusa-1,
Cai et al. 2024, with the lm_head shared and frozen, and each head also given the embedding of the token already
known, as EAGLE (Li et al. 2024) feeds its drafter the shifted token):

    h      [H]       the final rmsnorm's output at position t (what the lm_head turned into token t+1)
    e      [H]       the input embedding of token t+1 (known when drafting: it was just appended)
    z_i    [H]       = h + silu(W_i [h; e] + b_i)                   i = 1..K, W_i [H, 2H], b_i [H]
    draft  [K]       = argmax(lm_head(z_i))                         the guess for token t+1+i

A draft of k <= K tokens costs one [K*H, 2H] GEMV and one K-row lm_head GEMV; the target verifies it in one step
(engine/runtime/speculative.py), so greedy output stays the model's own.

File: safetensors, "w" [K, H, 2H] and "b" [K, H] (fp16), metadata "deepinfer-draft-heads/2" with the source
model's file name, hidden size, vocab size and the training report (engine/draft/train.py). Bundled heads live in
assets/drafters/<source file stem>.heads.safetensors.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

SCHEMA = "deepinfer-draft-heads/2"


class HeadsError(ValueError):
    """A heads file that is missing, corrupt or made for another model."""


def residual(h: torch.Tensor, e: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """h, e [..., H], w [K, H, 2H], b [K, H] -> z [..., K, H] = h + silu(W_i [h; e] + b_i), in h's dtype."""
    K, H, _ = w.shape
    y = F.linear(torch.cat([h, e.to(h.dtype)], -1), w.reshape(K * H, 2 * H)).reshape(*h.shape[:-1], K, H) + b
    return h.unsqueeze(-2) + F.silu(y)


def save(path: str | Path, w: torch.Tensor, b: torch.Tensor, meta: dict):
    from safetensors.torch import save_file
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file({"w": w.detach().half().contiguous().cpu(), "b": b.detach().half().contiguous().cpu()}, str(path),
              metadata={"schema": SCHEMA, "meta": json.dumps(meta, ensure_ascii=False)})


def load(path: str | Path, hidden_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """-> (w fp16 [K, H, 2H], b fp16 [K, H], meta) on the CPU; HeadsError when the file is unusable."""
    from safetensors import SafetensorError, safe_open
    p = Path(path)
    if not p.is_file():
        raise HeadsError(f"draft heads file not found: {p}")
    try:
        with safe_open(str(p), "pt") as f:
            md = f.metadata() or {}
            w, b = f.get_tensor("w"), f.get_tensor("b")
    except (SafetensorError, OSError, KeyError, ValueError, RuntimeError) as e:
        raise HeadsError(f"draft heads file {p.name} is unreadable: {e}") from e
    if md.get("schema") != SCHEMA:
        raise HeadsError(f"{p.name} is not a draft heads file (schema {md.get('schema')!r})")
    try:
        meta = json.loads(md.get("meta", "{}"))
    except ValueError as e:
        raise HeadsError(f"{p.name}: bad metadata: {e}") from e
    if w.dim() != 3 or w.shape[2] != 2 * w.shape[1] or b.shape != w.shape[:2]:
        raise HeadsError(f"{p.name}: bad shapes w {tuple(w.shape)} b {tuple(b.shape)}")
    if hidden_size is not None and w.shape[1] != hidden_size:
        raise HeadsError(f"{p.name} was trained for hidden size {w.shape[1]}, this model has {hidden_size}")
    if not (torch.isfinite(w).all() and torch.isfinite(b).all()):
        raise HeadsError(f"{p.name}: non-finite weights")
    return w, b, meta


def bundled(source: str) -> Path | None:
    """The heads shipped for a model file (by its file name), or None."""
    from engine.assets_path import asset
    try:
        return asset(f"drafters/{Path(source).name.rsplit('.', 1)[0]}.heads.safetensors")
    except FileNotFoundError:
        return None
