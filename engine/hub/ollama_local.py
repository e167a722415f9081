"""Resolve an Ollama model name (qwen2.5:3b, library/qwen2.5:7b-instruct, user/model:tag) to its GGUF blob.

Ollama keeps manifests under <models>/manifests/<registry>/<namespace>/<model>/<tag> and the
content-addressed blobs under <models>/blobs/sha256-<hex>. <models> is $OLLAMA_MODELS or
~/.ollama/models. The manifest's layer with mediaType application/vnd.ollama.image.model is the
GGUF file; we read it in place (no copy).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from engine.errors import ModelFileError

MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
DEFAULT_REGISTRY = "registry.ollama.ai"


def ollama_models_dir() -> Path:
    env = os.environ.get("OLLAMA_MODELS")
    return Path(env).expanduser() if env else Path.home() / ".ollama" / "models"


def split_name(name: str) -> tuple[str, str, str, str]:
    """'qwen2.5:3b' -> (registry, namespace, model, tag)."""
    name = name.strip()
    if name.startswith("ollama:"):
        name = name[len("ollama:"):]
    tag = "latest"
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = name.rsplit(":", 1)
    parts = name.split("/")
    if len(parts) == 1:
        return DEFAULT_REGISTRY, "library", parts[0], tag
    if len(parts) == 2:
        return DEFAULT_REGISTRY, parts[0], parts[1], tag
    return parts[0], "/".join(parts[1:-1]), parts[-1], tag


def list_local(root: Path | None = None) -> list[str]:
    """Names of the locally pulled Ollama models (model:tag)."""
    base = (root or ollama_models_dir()) / "manifests"
    out = []
    if base.is_dir():
        for p in base.rglob("*"):
            if p.is_file():
                rel = p.relative_to(base).parts  # registry, namespace, model, tag
                if len(rel) >= 4:
                    ns = "" if rel[1] == "library" and rel[0] == DEFAULT_REGISTRY else "/".join(rel[1:-2]) + "/"
                    out.append(f"{ns}{rel[-2]}:{rel[-1]}")
    return sorted(out)


def resolve_ollama(name: str) -> Path:
    """Path of the GGUF blob of a locally pulled Ollama model; a clear error when it is not there."""
    root = ollama_models_dir()
    registry, ns, model, tag = split_name(name)
    mpath = root / "manifests" / registry / ns / model / tag
    if not mpath.is_file():
        have = list_local(root)
        avail = f"local Ollama models: {', '.join(have)}" if have else f"no Ollama models found under {root}"
        raise ModelFileError(f"Ollama model {model}:{tag} is not pulled ({avail})",
                             f"run `ollama pull {model}:{tag}` or set OLLAMA_MODELS to Ollama's models folder")
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelFileError(f"Ollama manifest {mpath} is unreadable ({e})", f"run `ollama pull {model}:{tag}`") from e
    layer = next((l for l in manifest.get("layers", []) if l.get("mediaType") == MODEL_MEDIA_TYPE), None)
    if layer is None:
        raise ModelFileError(f"Ollama model {model}:{tag} has no model layer in its manifest",
                             f"run `ollama pull {model}:{tag}`")
    blob = root / "blobs" / layer["digest"].replace(":", "-")
    if not blob.is_file():
        raise ModelFileError(f"Ollama model {model}:{tag}: blob {blob.name} is missing", f"run `ollama pull {model}:{tag}`")
    if "size" in layer and blob.stat().st_size != layer["size"]:
        raise ModelFileError(f"Ollama blob {blob.name} is {blob.stat().st_size} bytes, manifest says {layer['size']}",
                             f"run `ollama pull {model}:{tag}`")
    return blob
