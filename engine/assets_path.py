"""Locate files in assets/: the repo checkout (editable installs, CI) or, in a wheel install, the package
data `deepinfer_assets` (setup.py maps assets/ there). Imports nothing heavy: the tray uses it too."""
from __future__ import annotations

import importlib.util
from pathlib import Path


def _roots() -> list[Path]:
    roots = [Path(__file__).resolve().parent.parent / "assets"]
    spec = importlib.util.find_spec("deepinfer_assets")
    if spec is not None and spec.submodule_search_locations:
        roots += [Path(p) for p in spec.submodule_search_locations]
    return roots


def asset(name: str) -> Path:
    """assets/<name> (a file or a folder such as "templates")."""
    roots = _roots()
    for r in roots:
        if (r / name).exists():
            return r / name
    raise FileNotFoundError(f"asset {name} not found under {', '.join(map(str, roots))}: reinstall deepinfer")


def bundled_chat_template() -> str:
    return asset("qwen2_chat_template.jinja").read_text(encoding="utf-8")
