"""Where user data lives: one place, platform conventions, overridable by environment variables.

- models:  DEEPINFER_MODELS  or <user cache dir>/deepinfer/models
- config:  DEEPINFER_CONFIG_DIR or <user config dir>/deepinfer   (config.toml, templates)
- logs:    <user log dir>/deepinfer  (rotating files)
This module imports no torch so the tray and doctor can use it.
"""
from __future__ import annotations

import os
from pathlib import Path

try:
    import platformdirs
except ImportError:  # pragma: no cover - platformdirs is a dependency, but stay usable without it
    platformdirs = None

APP = "deepinfer"


def _dir(env: str, kind: str) -> Path:
    if os.environ.get(env):
        p = Path(os.environ[env]).expanduser()
    elif platformdirs is not None:
        p = Path(getattr(platformdirs, f"user_{kind}_dir")(APP, appauthor=False))
    else:
        p = Path.home() / f".{APP}" / kind
    return p


def models_dir() -> Path:
    if os.environ.get("DEEPINFER_MODELS"):
        return Path(os.environ["DEEPINFER_MODELS"]).expanduser()
    return _dir("DEEPINFER_CACHE_DIR", "cache") / "models"


def config_dir() -> Path:
    return _dir("DEEPINFER_CONFIG_DIR", "config")


def log_dir() -> Path:
    return _dir("DEEPINFER_LOG_DIR", "log")


def config_file() -> Path:
    return config_dir() / "config.toml"
