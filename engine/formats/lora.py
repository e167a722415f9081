"""PEFT LoRA adapters: read adapter_config.json + adapter_model.safetensors, give per-weight deltas.

For a target linear W [out, in]:  W' = W + (B @ A) * scale,  A = lora_A [r, in], B = lora_B [out, r],
scale = lora_alpha / r (or lora_alpha / sqrt(r) with use_rslora). Embedding adapters
(lora_embedding_A [r, vocab], lora_embedding_B [hidden, r]) give delta (B @ A).T.
Deltas are applied to the dense HF-named weights before fusing and quantizing (engine/quant/export.py).
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch
from safetensors.torch import load_file

from engine.errors import ModelFileError

_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<mod>.+?)\.(?P<kind>lora_A|lora_B|lora_embedding_A|lora_embedding_B)"
                  r"(?:\.[A-Za-z0-9_]+)?(?:\.weight)?$")


class LoraAdapter:
    def __init__(self, path: Path, config: dict, pairs: dict[str, dict[str, torch.Tensor]]):
        self.path, self.config = path, config
        self.pairs = pairs  # hf weight name -> {"A": ..., "B": ..., "embedding": bool}
        self.used: set[str] = set()

    @property
    def targets(self) -> list[str]:
        return sorted(self.pairs)

    def scale(self, name: str, r: int) -> float:
        alpha = self.config.get("lora_alpha", r)
        for pat, a in (self.config.get("alpha_pattern") or {}).items():
            if re.search(pat, name):
                alpha = a
        return alpha / math.sqrt(r) if self.config.get("use_rslora") else alpha / r

    def delta(self, name: str) -> torch.Tensor | None:
        """Float32 delta for HF weight `name` (e.g. model.layers.0.self_attn.q_proj.weight), or None."""
        p = self.pairs.get(name)
        if p is None:
            return None
        self.used.add(name)
        A, B = p["A"].float(), p["B"].float()
        r = A.shape[0]
        d = (B @ A) * self.scale(name, r)
        if p["embedding"]:
            return d.T.contiguous()
        return d.T.contiguous() if self.config.get("fan_in_fan_out") else d

    def delta_rows(self, name: str, r0: int, r1: int) -> torch.Tensor | None:
        """Rows [r0, r1) of delta(name) without building the whole matrix (embedding / lm_head)."""
        p = self.pairs.get(name)
        if p is None:
            return None
        self.used.add(name)
        A, B = p["A"].float(), p["B"].float()
        scale = self.scale(name, A.shape[0])
        if p["embedding"]:  # A [r, vocab], B [hidden, r]: delta = (B @ A).T
            return (B @ A[:, r0:r1]).T * scale
        if self.config.get("fan_in_fan_out"):
            return (B @ A).T[r0:r1] * scale
        return (B[r0:r1] @ A) * scale

    def apply(self, name: str, w: torch.Tensor) -> torch.Tensor:
        d = self.delta(name)
        if d is None:
            return w
        if tuple(d.shape) != tuple(w.shape):
            raise ModelFileError(f"LoRA adapter {self.path.name}: delta for {name} has shape {tuple(d.shape)}, "
                                 f"the model weight is {tuple(w.shape)}", "use an adapter trained for this model")
        return w.float() + d

    def check_all_used(self):
        unused = sorted(set(self.pairs) - self.used)
        if unused:
            raise ModelFileError(f"LoRA adapter {self.path.name} targets {len(unused)} weights this model does not "
                                 f"have (first: {unused[0]})", "use an adapter trained for this model")


def load_adapter(path: str | Path) -> LoraAdapter:
    path = Path(path).expanduser()
    cfg_path, st = path / "adapter_config.json", path / "adapter_model.safetensors"
    if not cfg_path.exists():
        raise ModelFileError(f"{path} has no adapter_config.json: not a PEFT LoRA adapter folder")
    if not st.exists():
        hint = " (adapter_model.bin is not read: convert it to safetensors)" if (path / "adapter_model.bin").exists() else ""
        raise ModelFileError(f"{path} has no adapter_model.safetensors{hint}")
    config = json.loads(cfg_path.read_text(encoding="utf-8"))
    if config.get("peft_type", "LORA") != "LORA":
        raise ModelFileError(f"{path.name}: adapter type {config.get('peft_type')!r} is not supported (only LORA)")
    if config.get("use_dora"):
        raise ModelFileError(f"{path.name}: DoRA adapters are not supported", "train a plain LoRA adapter")
    pairs: dict[str, dict] = {}
    for key, t in load_file(str(st)).items():
        m = _KEY.match(key)
        if m is None:
            raise ModelFileError(f"{path.name}: unsupported adapter tensor {key!r} (modules_to_save, DoRA "
                                 "magnitudes... are not merged)", "use a plain LoRA adapter")
        mod, kind = m.group("mod"), m.group("kind")
        if not mod.startswith("model.") and mod != "lm_head":
            mod = "model." + mod
        entry = pairs.setdefault(mod + ".weight", {"embedding": kind.startswith("lora_embedding")})
        entry["A" if kind.endswith("A") else "B"] = t
    for name, p in pairs.items():
        if "A" not in p or "B" not in p:
            raise ModelFileError(f"{path.name}: {name} has only one of lora_A / lora_B")
    if not pairs:
        raise ModelFileError(f"{path.name}: adapter_model.safetensors holds no LoRA weights")
    return LoraAdapter(path, config, pairs)
