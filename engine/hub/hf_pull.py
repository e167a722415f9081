"""Pull from the Hugging Face Hub through huggingface_hub: `deepinfer pull hf:Qwen/Qwen2.5-3B-Instruct-GGUF`.

- a GGUF repo: one .gguf file, the q4_k_m one unless `--file` names another;
- a safetensors repo (e.g. ...-AWQ): config.json, tokenizer files and every *.safetensors.
HF_ENDPOINT (read at call time) points at a mirror. Files land in <models>/hf/<org>/<repo>/ via
hf_hub_download(local_dir=...), which resumes its .incomplete files after a cut. LFS files are
checked against the sha256 the Hub lists; `.deepinfer-pull.json` is written last and marks the
folder as pulled (a half-downloaded folder is not listed and does not load).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import urllib.parse
from pathlib import Path

from engine.errors import ModelFileError, ResourceError
from engine.hub.download import SPACE_FIX, disk_full, ensure_space
from engine.hub.store import sha256_file
from engine.paths import models_dir

PREFIX = "hf:"
MARKER = ".deepinfer-pull.json"
DEFAULT_QUANT = "q4_k_m"
FOLDER_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "vocab.json", "merges.txt", "special_tokens_map.json", "model.safetensors.index.json")


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def repo_of(name: str) -> str:
    repo = name[len(PREFIX):] if name.startswith(PREFIX) else name
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise ModelFileError(f"{name!r} is not a Hugging Face repo name",
                             "use hf:ORG/REPO, e.g. hf:Qwen/Qwen2.5-3B-Instruct-GGUF")
    return repo


def folder(name: str) -> Path:
    return models_dir() / "hf" / repo_of(name)


def read_marker(name: str) -> dict | None:
    try:
        return json.loads((folder(name) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError, ModelFileError):
        return None


def model_path(name: str) -> Path | None:
    """The pulled .gguf file, or the folder of a safetensors repo; None when not (completely) pulled."""
    m = read_marker(name)
    if m is None:
        return None
    p = folder(name) / m["model"] if m.get("model") else folder(name)
    return p if p.exists() else None


def pulled_names() -> list[str]:
    base = models_dir() / "hf"
    return sorted(f"{PREFIX}{p.parent.relative_to(base).as_posix()}" for p in base.glob(f"*/*/{MARKER}")) \
        if base.is_dir() else []


def _check_reachable(url: str, name: str):
    """Fail in a second with the fix when the endpoint cannot be reached (huggingface_hub would retry ~30 s)."""
    u = urllib.parse.urlsplit(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        socket.create_connection((u.hostname, port), timeout=10).close()
    except OSError as e:
        raise ResourceError(f"cannot reach the Hugging Face Hub at {url} to pull {name} ({e.strerror or e})",
                            "connect to the internet, or set HF_ENDPOINT to a mirror (e.g. HF_ENDPOINT="
                            "https://hf-mirror.com) and run the pull again") from None


def _pick(name: str, files: dict, want: str | None) -> tuple[list[str], str]:
    """(files to fetch, the model entry: a .gguf name or '' for the folder)."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf"))
    if want:
        if want not in files:
            raise ModelFileError(f"{name} has no file {want!r}", "files: " + ", ".join(sorted(files)[:30]))
        return [want], want if want.lower().endswith(".gguf") else ""
    if ggufs:
        pick = [f for f in ggufs if DEFAULT_QUANT in f.lower()]
        if any(re.search(r"-\d{5}-of-\d{5}\.gguf$", f) for f in pick):
            raise ModelFileError(f"{name} stores its {DEFAULT_QUANT} model as a split GGUF ({len(pick)} parts), "
                                 "which DeepInfer does not read",
                                 "pull the Ollama name instead (e.g. qwen2.5:7b, one file) or a single-file GGUF "
                                 "with --file")
        if len(pick) != 1:
            raise ModelFileError(f"{name} has {len(pick)} {DEFAULT_QUANT} .gguf files (split or none): "
                                 f"{', '.join(pick or ggufs)[:300]}", "choose one with --file NAME.gguf")
        return pick, pick[0]
    weights = sorted(f for f in files if f.endswith(".safetensors"))
    if not weights or "config.json" not in files:
        raise ModelFileError(f"{name} has neither a .gguf file nor config.json + *.safetensors",
                             "pull a GGUF or safetensors repo (e.g. hf:Qwen/Qwen2.5-3B-Instruct-GGUF)")
    return [f for f in FOLDER_FILES if f in files] + weights, ""


def pull(name: str, file: str | None = None, quiet: bool = False) -> Path:
    """Download the repo's model file(s) into the store, verify LFS digests, write the marker."""
    repo = repo_of(name)
    name = PREFIX + repo
    url = endpoint()
    _check_reachable(url, name)
    try:  # imported here: it pulls httpx & co, and the tray/list/rm paths never need it
        from huggingface_hub import HfApi, hf_hub_download  # pull only: pulls httpx & co
        from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError  # pull only
        from huggingface_hub.utils import (are_progress_bars_disabled, disable_progress_bars,  # pull only
                                           enable_progress_bars)
    except ImportError as e:
        raise ResourceError(f"huggingface_hub is not installed ({e})", "pip install huggingface_hub") from None
    out = folder(name)
    bars_were_off = are_progress_bars_disabled()
    if quiet:  # its tqdm bars are the progress bar on a terminal; none for --quiet or the tray
        disable_progress_bars()
    try:
        entries = [e for e in HfApi(endpoint=url).list_repo_tree(repo, recursive=True)
                   if getattr(e, "size", None) is not None]
        files = {e.path: e for e in entries}
        fetch, model = _pick(name, files, file)
        ensure_space(out, sum(files[f].size for f in fetch
                              if not ((out / f).is_file() and (out / f).stat().st_size == files[f].size)),
                     f"pulling {name}")
        (out / MARKER).unlink(missing_ok=True)  # not pulled while we change it
        for f in fetch:
            got = Path(hf_hub_download(repo, f, local_dir=out, endpoint=url))
            lfs = getattr(files[f], "lfs", None)
            digest = getattr(lfs, "sha256", None) if lfs is not None else None
            if digest and sha256_file(got) != digest:
                got.unlink()
                raise ModelFileError(f"{name}: {f} does not match the Hub's sha256 {digest}",
                                     f"run `deepinfer pull {name}` again (the bad file was deleted)")
    except (ModelFileError, ResourceError):
        raise
    except RepositoryNotFoundError:
        raise ModelFileError(f"{name}: no such repository on {url} (or it is private/gated)",
                             "check the name at https://huggingface.co/models, e.g. hf:Qwen/Qwen2.5-3B-Instruct-GGUF") \
            from None
    except HfHubHTTPError as e:
        raise ResourceError(f"{name}: the Hub at {url} refused the download ({str(e).splitlines()[0]})",
                            "try again later, or log in with `hf auth login` for gated repos") from None
    except (OSError, ValueError) as e:  # the size check after a cut, a full disk
        if disk_full(e):
            raise ResourceError(f"download of {name} stopped: the disk of {out} is full",
                                f"{SPACE_FIX}; then run `deepinfer pull {name}` again") from None
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ResourceError(f"download of {name} interrupted ({why})",
                            f"run `deepinfer pull {name}` again: it resumes where it stopped") from None
    except Exception as e:  # httpx errors of huggingface_hub (connection lost, timeouts)
        raise ResourceError(f"download of {name} interrupted ({type(e).__name__}: {str(e).splitlines()[0][:200]})",
                            f"run `deepinfer pull {name}` again: it resumes where it stopped") from None
    finally:
        if quiet and not bars_were_off:
            enable_progress_bars()
    marker = {"repo": repo, "endpoint": url, "files": fetch, "model": model,
              "format": "gguf" if model else "safetensors"}
    (out / MARKER).write_text(json.dumps(marker, indent=1), encoding="utf-8")
    if not quiet:
        print(f"{name}: {len(fetch)} file(s) in {out}", flush=True)
    return model_path(name)


def remove(name: str) -> list[Path]:
    out = folder(name)
    if read_marker(name) is None and not out.exists():
        raise ModelFileError(f"{name} is not pulled", "see `deepinfer list`")
    shutil.rmtree(out)
    return [out]
