"""Pull a model from Ollama's public registry without Ollama: `deepinfer pull qwen2.5:3b`.

Protocol (the Docker registry v2 API Ollama's registry speaks; docs/model-sources.md):
  GET {registry}/v2/{namespace}/{model}/manifests/{tag}   Accept: application/vnd.docker.distribution.manifest.v2+json
      -> {"config": {digest, size}, "layers": [{mediaType, digest, size}, ...]}
  GET {registry}/v2/{namespace}/{model}/blobs/{digest}    (usually a 307 to a CDN; Range works there)
The layer application/vnd.ollama.image.model is the GGUF file; template/params/system/license
are small text layers. Registry: https://registry.ollama.ai, or DEEPINFER_OLLAMA_REGISTRY.

Our store copies Ollama's own layout under <models>/ollama: manifests/<registry>/<ns>/<model>/<tag>
and content-addressed blobs/sha256-<hex> (tags that share a blob store it once). The manifest is
written last, after every blob is verified: a model without its manifest is not pulled.
"""
from __future__ import annotations

import json
import os
import re
import urllib.error
from pathlib import Path

from engine.errors import ModelFileError, ResourceError
from engine.hub.download import OnProgress, Progress, ensure_space, fetch_blob, open_url, remaining
from engine.hub.lock import pull_lock
from engine.hub.ollama_local import DEFAULT_REGISTRY, MODEL_MEDIA_TYPE, list_local, split_name
from engine.paths import models_dir

MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
# layer media type -> what it holds (the ones we fetch; projector/adapter layers are refused)
WANTED = {MODEL_MEDIA_TYPE: "model", "application/vnd.ollama.image.template": "template",
          "application/vnd.ollama.image.params": "params", "application/vnd.ollama.image.system": "system",
          "application/vnd.ollama.image.license": "license",
          "application/vnd.docker.container.image.v1+json": "config"}
NAME_RE = re.compile(r"^(ollama:)?([\w.-]+/){0,2}[a-z0-9][\w.-]*(:[\w][\w.-]*)?$", re.IGNORECASE)


def store_root() -> Path:
    return models_dir() / "ollama"


def registry_url(registry: str) -> str:
    if registry == DEFAULT_REGISTRY:
        return os.environ.get("DEEPINFER_OLLAMA_REGISTRY", f"https://{DEFAULT_REGISTRY}").rstrip("/")
    return f"https://{registry}"


def canonical(name: str) -> str:
    """'qwen2.5' -> 'qwen2.5:latest'; 'library/qwen2.5:3b' -> 'qwen2.5:3b' (Ollama's short form)."""
    registry, ns, model, tag = split_name(name)
    prefix = "" if (registry, ns) == (DEFAULT_REGISTRY, "library") else \
        (f"{ns}/" if registry == DEFAULT_REGISTRY else f"{registry}/{ns}/")
    return f"{prefix}{model}:{tag}"


def looks_like_name(name: str) -> bool:
    """An Ollama model name (qwen2.5:3b, user/model:tag), not a path or a file."""
    return bool(NAME_RE.match(name)) and not name.lower().endswith(".gguf") and ("/" not in name or ":" in name)


def manifest_path(name: str) -> Path:
    registry, ns, model, tag = split_name(name)
    return store_root() / "manifests" / registry / ns / model / tag


def blob_path(digest: str) -> Path:
    return store_root() / "blobs" / digest.replace(":", "-")


def read_manifest(name: str) -> dict | None:
    """The stored manifest of a pulled model, or None when it is not (completely) pulled."""
    p = manifest_path(name)
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def model_file(name: str) -> Path | None:
    """The GGUF blob of a pulled model (None if not pulled or its blob went missing)."""
    m = read_manifest(name)
    layer = next((x for x in (m or {}).get("layers", []) if x.get("mediaType") == MODEL_MEDIA_TYPE), None)
    if layer is None:
        return None
    blob = blob_path(layer["digest"])
    return blob if blob.is_file() and blob.stat().st_size == layer.get("size", blob.stat().st_size) else None


def pulled_names() -> list[str]:
    return list_local(store_root())


def _fetch_manifest(name: str) -> dict:
    registry, ns, model, tag = split_name(name)
    base = registry_url(registry)
    url = f"{base}/v2/{ns}/{model}/manifests/{tag}"
    try:
        with open_url(url, {"Accept": MANIFEST_V2}, timeout=30) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise ModelFileError(f"{canonical(name)} is not in the Ollama registry ({base} has no {ns}/{model}:{tag})",
                                 f"check the name and tag at https://ollama.com/library/{model}/tags "
                                 "(e.g. qwen2.5:3b, qwen2.5:7b)") from None
        raise ResourceError(f"the Ollama registry {base} answered {e.code} {e.reason} for {canonical(name)}",
                            "try again later") from None
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        raise ResourceError(f"cannot reach the Ollama registry {base} to pull {canonical(name)} "
                            f"({getattr(e, 'reason', e)})",
                            "connect to the internet (or set HTTPS_PROXY / DEEPINFER_OLLAMA_REGISTRY to a mirror) "
                            "and run the pull again; a pulled model needs no network") from None
    except ValueError as e:
        raise ResourceError(f"the Ollama registry {base} sent an unreadable manifest for {canonical(name)} ({e})",
                            "try again later") from None


def pull(name: str, stream=None, on_progress: OnProgress | None = None) -> Path:
    """Fetch the manifest, every wanted layer (verified), then write the manifest; return the GGUF blob. One such
    pull at a time across processes (blobs are shared between models; engine/hub/lock.py)."""
    name = canonical(name)
    store_root().mkdir(parents=True, exist_ok=True)
    with pull_lock(store_root() / ".pull.lock", name, stream=stream):
        return _pull(name, stream, on_progress)


def _pull(name: str, stream, on_progress: OnProgress | None) -> Path:
    registry, ns, model, tag = split_name(name)
    manifest = _fetch_manifest(name)
    layers = [x for x in manifest.get("layers", []) if x.get("mediaType") in WANTED]
    if manifest.get("config", {}).get("digest"):
        layers.append({**manifest["config"], "mediaType": "application/vnd.docker.container.image.v1+json"})
    if not any(x["mediaType"] == MODEL_MEDIA_TYPE for x in layers):
        raise ModelFileError(f"{name}: the registry's manifest has no model layer", "pick another model or tag")
    for x in layers:
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", str(x.get("digest", ""))) or not isinstance(x.get("size"), int):
            raise ResourceError(f"{name}: the registry's manifest has a malformed layer {x!r}", "try again later")
    base = registry_url(registry)
    total = sum(x["size"] for x in layers)
    prog = Progress(total, f"pull {name}", stream, on_progress)
    again = f"deepinfer pull {name}"
    (store_root() / "blobs").mkdir(parents=True, exist_ok=True)
    ensure_space(store_root() / "blobs", sum(remaining(blob_path(x["digest"]), x["size"]) for x in layers),
                 f"pulling {name}")
    for x in layers:
        url = f"{base}/v2/{ns}/{model}/blobs/{x['digest']}"
        fetch_blob(url, blob_path(x["digest"]), x["size"], x["digest"].split(":", 1)[1], prog, again=again)
    prog.close()
    mpath = manifest_path(name)
    mpath.parent.mkdir(parents=True, exist_ok=True)
    tmp = mpath.with_name(mpath.name + ".tmp")
    tmp.write_text(json.dumps(manifest), encoding="utf-8")
    os.replace(tmp, mpath)  # the model counts as pulled from here on
    return model_file(name)


def file_type(name: str) -> str:
    """Quantization from the image config layer ('Q4_K_M'), '' when unknown."""
    m = read_manifest(name) or {}
    digest = m.get("config", {}).get("digest")
    try:
        return json.loads(blob_path(digest).read_text(encoding="utf-8")).get("file_type", "") if digest else ""
    except (OSError, ValueError):
        return ""


def remove(name: str) -> list[Path]:
    """Delete a pulled model's manifest and the blobs no other pulled model uses; returns what was deleted."""
    mpath = manifest_path(name)
    m = read_manifest(name)
    if m is None:
        raise ModelFileError(f"{canonical(name)} is not pulled", "see `deepinfer list`")
    mpath.unlink()
    gone = [mpath]
    keep = {x["digest"] for other in pulled_names() for x in _layers(read_manifest(other))}
    for x in _layers(m):
        b = blob_path(x["digest"])
        if x["digest"] not in keep and b.exists():
            b.unlink()
            gone.append(b)
    return gone


def _layers(m: dict | None) -> list[dict]:
    if not m:
        return []
    return list(m.get("layers", [])) + ([m["config"]] if m.get("config", {}).get("digest") else [])
