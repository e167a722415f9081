"""Layered quantized checkpoint: a folder the engine loads in seconds (memory-mapped safetensors).

    manifest.json         written LAST (temp + rename): no manifest = not a checkpoint
    config.json           HF-style (ModelConfig.to_hf())
    tokenizer.json, chat_template.jinja
    embed.safetensors     embed_tokens.{qweight,scales,mins} | embed_tokens.weight (fp16);
                          lm_head.* too when untied (a tied embedding is stored once)
    norm.safetensors      norm.weight (fp32)
    layer_NN.safetensors  layers.{i}.input_layernorm.weight, layers.{i}.post_attention_layernorm.weight (fp32)
                          layers.{i}.self_attn.qkv_proj.{qweight,scales,mins,bias}  rows q|k|v, bias fp32
                          layers.{i}.self_attn.o_proj.{...}, layers.{i}.mlp.gate_up_proj.{...} (rows gate|up),
                          layers.{i}.mlp.down_proj.{...}; a dense linear has `.weight` fp16 instead.
Packed layout: kernels/pack.py (asymmetric, fp16 scales/mins; group 128, or per linear). manifest.json:
{"format": "deepinfer-checkpoint", "version": 1, "config", "scheme", "group_size", "policy",
 "tensors": {name: {file, dtype, shape, bits[, group]}}, "files": {name: {sha256, bytes}}, "source", "created"}.
A tensor's "group" (scheme "lossless": a GGUF's exact layouts, 32 or 16) overrides group_size; without it
(every older checkpoint) the group is group_size (128).

Verification: open_checkpoint() always checks that every file exists with its manifest size (a
truncated file is refused at once, with its sha256). The full sha256 of every file is checked by
`deepinfer export` / `--verify`, and on the first load of a folder, which then writes a ".verified"
stamp (file sizes + mtimes); later loads whose files are unchanged skip the hashing.
Set DEEPINFER_VERIFY=full to hash on every load, or =size to never hash on load.
"""
from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from engine.config import ModelConfig
from engine.errors import ModelFileError
from engine.formats.spec import ModelSpec
from engine.formats.tokenizer import Tokenizer
from engine.hub.store import sha256_file
from engine.model.layout import EMBED, HEAD, LINEARS, NORM, NORMS, split_fused
from engine.quant.quantize import dequantize_matrix
from engine.quant.writer import FORMAT, MANIFEST, STAMP, VERSION
from kernels.pack import W3_LAYOUT, w3_from_layout1, w3_from_layout2
from kernels.qweight import QWeight

log = logging.getLogger("deepinfer.checkpoint")

_DT = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "I32": torch.int32,
       "I64": torch.int64, "U8": torch.uint8, "I8": torch.int8}


def layer_file(i: int) -> str:
    return f"layer_{i:02d}.safetensors"


def _mmap_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file as views of one copy-on-write memory map (no reads yet)."""
    try:
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    except (OSError, ValueError, struct.error) as e:
        raise ModelFileError(f"{path.name} is not a readable safetensors file ({e})",
                             "re-export the checkpoint") from e
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = _DT[info["dtype"]]
        s, e = info["data_offsets"]
        count = (e - s) // torch.empty(0, dtype=dt).element_size()
        t = torch.frombuffer(mm, dtype=dt, count=count, offset=8 + n + s) if count else torch.empty(0, dtype=dt)
        out[name] = t.view(info["shape"])
    return out


class Checkpoint:
    def __init__(self, path: Path, manifest: dict):
        self.path, self.manifest = path, manifest
        self.config = ModelConfig.from_dict(manifest["config"])
        self.scheme: str = manifest["scheme"]
        self.group_size: int = manifest["group_size"]
        # W3 word layout (kernels/pack.py): absent in checkpoints written before layout 2; 1 and 2 load converted
        self.w3_layout: int = manifest.get("w3_layout", 1)
        if self.w3_layout not in (1, 2, W3_LAYOUT):
            raise ModelFileError(f"{path} has W3 words in layout {self.w3_layout}, which this version cannot read "
                                 f"(it reads 1, 2 and {W3_LAYOUT})", "update deepinfer or re-export the checkpoint")
        self._files: dict[str, dict[str, torch.Tensor]] = {}
        self._w3_hint = False

    # --- integrity -----------------------------------------------------------------------
    def check_sizes(self):
        for fname, info in self.manifest["files"].items():
            p = self.path / fname
            if not p.exists():
                raise ModelFileError(f"checkpoint {self.path} lacks {fname}", "re-export the checkpoint")
            size = p.stat().st_size
            if size != info["bytes"]:
                raise ModelFileError(
                    f"{fname} in {self.path} is damaged: {size} bytes, manifest says {info['bytes']}; "
                    f"sha256 mismatch: {sha256_file(p)} != {info['sha256']}", "re-export the checkpoint")

    def _stamp(self) -> dict:
        files = {f: [(self.path / f).stat().st_size, (self.path / f).stat().st_mtime_ns]
                 for f in self.manifest["files"]}
        man = hashlib.sha256((self.path / MANIFEST).read_bytes()).hexdigest()
        return {"manifest_sha256": man, "files": files}

    def verify(self, use_stamp: bool = False) -> float:
        """sha256 of every file against the manifest (threads: hashlib releases the GIL). Returns seconds."""
        t0 = time.perf_counter()
        self.check_sizes()
        stamp_path = self.path / STAMP
        if use_stamp and stamp_path.exists():
            try:
                if json.loads(stamp_path.read_text()) == self._stamp():
                    return 0.0
            except (OSError, ValueError):
                pass
        names = list(self.manifest["files"])
        with ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1))) as ex:
            digests = list(ex.map(lambda f: sha256_file(self.path / f), names))
        for fname, got in zip(names, digests):
            want = self.manifest["files"][fname]["sha256"]
            if got != want:
                raise ModelFileError(f"{fname} in {self.path} is corrupted: sha256 mismatch ({got} != {want})",
                                     "re-export the checkpoint")
        try:
            stamp_path.write_text(json.dumps(self._stamp()))
        except OSError:
            pass  # read-only folder: verify again next time
        return time.perf_counter() - t0

    # --- tensors -------------------------------------------------------------------------
    def _file(self, fname: str) -> dict[str, torch.Tensor]:
        if fname not in self._files:
            self._files[fname] = _mmap_safetensors(self.path / fname)
        return self._files[fname]

    def has(self, name: str) -> bool:
        return name in self.manifest["tensors"]

    def tensor(self, name: str) -> torch.Tensor:
        """A CPU tensor memory-mapped from its file (pages are read when touched)."""
        info = self.manifest["tensors"].get(name)
        if info is None:
            raise ModelFileError(f"checkpoint {self.path} has no tensor {name!r}")
        return self._file(info["file"])[name]

    def layer(self, i: int) -> dict[str, torch.Tensor]:
        return dict(self._file(layer_file(i)))

    def linear(self, prefix: str) -> QWeight:
        """A linear (e.g. 'layers.3.mlp.down_proj', 'embed_tokens', 'lm_head') as a CPU QWeight."""
        t = self.manifest["tensors"]
        bias = self.tensor(prefix + ".bias") if prefix + ".bias" in t else None
        if prefix + ".weight" in t:
            w = self.tensor(prefix + ".weight")
            return QWeight(w.shape[0], w.shape[1], 16, weight=w, bias=bias)
        sc = self.tensor(prefix + ".scales")
        info = t[prefix + ".qweight"]
        group = info.get("group", self.group_size)  # per linear (a GGUF's exact layouts); older: group_size
        qweight = self.tensor(prefix + ".qweight")
        if info["bits"] == 3 and self.w3_layout != W3_LAYOUT:  # an older checkpoint's words, moved (a copy)
            if not self._w3_hint:  # once per checkpoint: the conversion is repeated on every load
                self._w3_hint = True
                log.warning("%s stores W3 weights in layout %d: converting them as they load (a slower start); "
                            "`deepinfer export` the model again to store layout %d", self.path, self.w3_layout,
                            W3_LAYOUT)
            conv = w3_from_layout1 if self.w3_layout == 1 else w3_from_layout2
            qweight = conv(qweight, sc.shape[1] * group)
        return QWeight(sc.shape[0], sc.shape[1] * group, info["bits"],
                       qweight=qweight, scales=sc, mins=self.tensor(prefix + ".mins"), bias=bias, group=group)

    def dense(self, prefix: str, out: torch.Tensor | None = None) -> torch.Tensor:
        """Dequantized float32 weight of a linear / embedding (into `out` when given)."""

        q = self.linear(prefix)
        if q.bits == 16:
            return q.weight.float() if out is None else out.copy_(q.weight)
        return dequantize_matrix(q.qweight, q.scales, q.mins, q.bits, out=out, group=q.group)

    def nbytes(self) -> int:
        return sum(f["bytes"] for n, f in self.manifest["files"].items() if n.endswith(".safetensors"))


def open_checkpoint(path: str | Path, verify: str | None = None) -> Checkpoint:
    """verify: "size" (sizes only), "auto" (sha256 unless the .verified stamp matches), "full"."""
    path = Path(path).expanduser()
    mp = path / MANIFEST
    if not mp.exists():
        raise ModelFileError(f"{path} has no manifest.json: not a checkpoint, or its export did not finish",
                             "run `deepinfer export` again")
    try:
        manifest = json.loads(mp.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelFileError(f"{mp} is unreadable ({e})", "re-export the checkpoint") from e
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ModelFileError(f"{path} is not a {FORMAT} v{VERSION} checkpoint "
                             f"(format {manifest.get('format')!r}, version {manifest.get('version')!r})",
                             "re-export it with this version of deepinfer")
    ck = Checkpoint(path, manifest)
    mode = verify or os.environ.get("DEEPINFER_VERIFY", "auto")
    if mode == "size":
        ck.check_sizes()
    else:
        ck.verify(use_stamp=mode != "full")
    return ck


_TOKENIZERS: dict = {}  # (tokenizer.json sha256, eos ids) -> Tokenizer


def read_checkpoint(path: str | Path, verify: str | None = None):
    """A ModelSpec(kind="checkpoint") whose .checkpoint is the opened Checkpoint."""
    ck = open_checkpoint(path, verify)
    cfg = ck.config
    sha = ck.manifest["files"].get("tokenizer.json", {}).get("sha256")
    key = (sha, tuple(cfg.eos_token_ids)) if sha else None
    tok = _TOKENIZERS.get(key) if key else None
    if tok is None:  # parsing tokenizer.json takes ~1 s: reuse it across loads of same-tokenizer checkpoints
        tok = _TOKENIZERS[key] = Tokenizer.from_file(ck.path / "tokenizer.json", cfg.eos_token_ids)
    tpl = ck.path / "chat_template.jinja"
    template = tpl.read_text(encoding="utf-8") if tpl.exists() else None
    types = {n: f"{i['dtype']}/{i['bits']}bit" for n, i in ck.manifest["tensors"].items()}
    spec = ModelSpec(cfg, tok, template, str(ck.path), lambda: hf_weights(ck), types, kind="checkpoint")
    spec.checkpoint = ck  # noqa: attribute added to the dataclass instance (runner/gpu_runner read it)
    return spec


def hf_weights(ck: Checkpoint):
    """Dequantized (hf_name, float32 tensor) pairs with fused matrices split (re-export, dense tools)."""
    c = ck.config
    yield EMBED, ck.dense("embed_tokens")
    yield NORM, ck.tensor("norm.weight").float()
    if not c.tie_word_embeddings:
        yield HEAD, ck.dense("lm_head")
    for i in range(c.num_layers):
        p, hp = f"layers.{i}.", f"model.layers.{i}."
        for n in NORMS:
            yield f"{hp}{n}.weight", ck.tensor(f"{p}{n}.weight").float()
        for mod in LINEARS:
            for name, part in split_fused(c, mod, ck.dense(p + mod)):
                yield f"{hp}{name}.weight", part
            if ck.has(f"{p}{mod}.bias"):
                for name, part in split_fused(c, mod, ck.tensor(f"{p}{mod}.bias").float()):
                    yield f"{hp}{name}.bias", part


def load_into(model, spec) -> dict:
    """CPU path: dequantize every tensor straight into the model's (fused) parameters."""
    ck: Checkpoint = spec.checkpoint
    c, m = ck.config, model.cfg
    if (c.hidden_size, c.intermediate_size, c.num_layers, c.vocab_size, c.num_heads, c.num_kv_heads) != \
            (m.hidden_size, m.intermediate_size, m.num_layers, m.vocab_size, m.num_heads, m.num_kv_heads):
        raise ModelFileError(f"checkpoint {ck.path} shape does not match the model config")
    t0 = time.perf_counter()
    with torch.no_grad():
        _into(model.embed_tokens.weight, ck, "embed_tokens")
        model.norm.weight.copy_(ck.tensor("norm.weight"))
        if model.lm_head is not None:
            _into(model.lm_head.weight, ck, "lm_head")
        for i, layer in enumerate(model.layers):
            p = f"layers.{i}."
            for n in NORMS:
                layer.get_parameter(f"{n}.weight").copy_(ck.tensor(f"{p}{n}.weight"))
            for mod in LINEARS:
                lin = layer.get_submodule(mod)
                _into(lin.weight, ck, p + mod)
                if lin.bias is not None:
                    lin.bias.copy_(ck.tensor(p + mod + ".bias"))
    return {"load_s": time.perf_counter() - t0, "file_bytes": ck.nbytes()}


def _into(param: torch.Tensor, ck: Checkpoint, prefix: str):
    if param.dtype == torch.float32:
        ck.dense(prefix, out=param.data)
    else:
        param.data.copy_(ck.dense(prefix))
