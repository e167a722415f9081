"""Locate files in assets/ (repo checkout or installed package data)."""
from __future__ import annotations

from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent / "assets"


def asset(name: str) -> Path:
    p = _ROOT / name
    if not p.exists():
        raise FileNotFoundError(f"asset {name} not found under {_ROOT}")
    return p


def bundled_chat_template() -> str:
    return asset("qwen2_chat_template.jinja").read_text(encoding="utf-8")
