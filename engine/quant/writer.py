"""CheckpointWriter: writes a layered checkpoint folder file by file (format: engine/formats/checkpoint.py).

Crash safety: the first thing the writer does is delete an existing manifest.json (and config.json),
every file is written to NAME.tmp and renamed, and config.json then manifest.json are written last
(temp + fsync + rename). A folder
without manifest.json is never read as a checkpoint, so an export killed midway never looks complete.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import torch
from safetensors.torch import save

from engine.errors import ModelFileError
from kernels.pack import GROUP, W3_LAYOUT

MANIFEST = "manifest.json"
STAMP = ".verified"
FORMAT, VERSION = "deepinfer-checkpoint", 1
_OUR_FILES = ("manifest.json", "config.json", "tokenizer.json", "chat_template.jinja", "embed.safetensors",
              "norm.safetensors")


def _ours(name: str) -> bool:
    return name in _OUR_FILES or (name.startswith("layer_") and name.endswith(".safetensors")) \
        or name.endswith(".tmp") or name == STAMP


def _atomic_write(path: Path, data: bytes):
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class CheckpointWriter:
    def __init__(self, out: str | Path):
        self.out = Path(out).expanduser()
        if self.out.exists() and not self.out.is_dir():
            raise ModelFileError(f"{self.out} exists and is not a folder", "pick another --out")
        self.out.mkdir(parents=True, exist_ok=True)
        foreign = [p.name for p in self.out.iterdir() if not _ours(p.name)]
        if foreign:
            raise ModelFileError(f"{self.out} already holds other files ({foreign[0]} ...)",
                                 "export into an empty folder or an earlier checkpoint folder")
        # From here on the folder is incomplete until finish() writes the manifest.
        (self.out / MANIFEST).unlink(missing_ok=True)
        (self.out / "config.json").unlink(missing_ok=True)
        (self.out / STAMP).unlink(missing_ok=True)
        self.tensors: dict[str, dict] = {}
        self.files: dict[str, dict] = {}

    def _record_file(self, name: str, data: bytes):
        self.files[name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}

    def write_tensors(self, fname: str, tensors: dict[str, torch.Tensor], bits: dict[str, int],
                      groups: dict[str, int] | None = None):
        """One safetensors file; bits[name] is the bit width recorded in the manifest (4|3|8|16|32); groups[name]
        the group of a packed linear's tensors when it is not the manifest's group_size (128), e.g. a GGUF's
        exact layouts (32, 16). A reader takes a missing "group" as group_size (older checkpoints)."""

        data = save({k: v.contiguous() for k, v in tensors.items()})
        _atomic_write(self.out / fname, data)
        self._record_file(fname, data)
        for k, v in tensors.items():
            self.tensors[k] = {"file": fname, "dtype": str(v.dtype).replace("torch.", ""),
                               "shape": list(v.shape), "bits": bits[k]}
            if groups and k in groups:
                self.tensors[k]["group"] = groups[k]

    def write_text(self, fname: str, text: str):
        data = text.encode("utf-8")
        _atomic_write(self.out / fname, data)
        self._record_file(fname, data)

    def finish(self, config, scheme: str, source: str, extra: dict | None = None) -> dict:
        """Write manifest.json (last), remove stale files of an earlier export; returns the manifest."""

        manifest = {"format": FORMAT, "version": VERSION, "config": config.to_dict(), "scheme": scheme,
                    "group_size": GROUP, "w3_layout": W3_LAYOUT, "tensors": self.tensors, "files": self.files,
                    "source": source, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        manifest.update(extra or {})
        # config.json only now: a folder with config.json + *.safetensors would otherwise look like
        # an HF model folder to engine.formats.load.load_spec if the export died before the manifest.
        self.write_text("config.json", json.dumps(config.to_hf(), indent=2))
        manifest["files"] = self.files
        for p in self.out.iterdir():
            if _ours(p.name) and p.name not in self.files and p.name != MANIFEST:
                p.unlink()
        _atomic_write(self.out / MANIFEST, json.dumps(manifest, indent=1).encode("utf-8"))
        return manifest
