"""Draft heads: K small residual blocks on the target model's final (normed) hidden state, each followed by the
model's own lm_head, that guess the tokens after the next one (Medusa-1, Cai et al. 2024, with the lm_head
shared and frozen):

    h      [H]       the final rmsnorm's output at position t (what the lm_head turns into token t+1)
    z_i    [H]       = h + silu(W_i h + b_i)                        i = 1..K, W_i [H, H], b_i [H]
    draft  [K]       = argmax(lm_head(z_i))                         the guess for token t+1+i

A draft of k <= K tokens for "after token t+1" costs one [K*H, H] GEMV and one K-row lm_head GEMV; the
target verifies it in one step (engine/runtime/speculative.py), so greedy output stays the model's own.

File: safetensors, "w" [K, H, H] and "b" [K, H] (fp16), metadata "deepinfer-draft-heads/1" with the source
model's file name, hidden size, vocab size and the training report (engine/draft/train.py). Bundled heads live in
assets/drafters/<source file stem>.heads.safetensors.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

SCHEMA = "deepinfer-draft-heads/1"


class HeadsError(ValueError):
    """A heads file that is missing, corrupt or made for another model."""


def residual(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """h [..., H], w [K, H, H], b [K, H] -> z [..., K, H] = h + silu(W_i h + b_i), in h's dtype (fp32 math on CPU)."""
    K, H, _ = w.shape
    y = F.linear(h, w.reshape(K * H, H)).reshape(*h.shape[:-1], K, H) + b
    return h.unsqueeze(-2) + F.silu(y)


def save(path: str | Path, w: torch.Tensor, b: torch.Tensor, meta: dict):
    from safetensors.torch import save_file
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file({"w": w.detach().half().contiguous().cpu(), "b": b.detach().half().contiguous().cpu()}, str(path),
              metadata={"schema": SCHEMA, "meta": json.dumps(meta, ensure_ascii=False)})


def load(path: str | Path, hidden_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """-> (w fp16 [K, H, H], b fp16 [K, H], meta) on the CPU; HeadsError when the file is unusable."""
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
    if w.dim() != 3 or w.shape[1] != w.shape[2] or b.shape != w.shape[:2]:
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
