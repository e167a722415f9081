"""Models for `deepinfer doctor`: which are present, which fit this machine, how to get one.

Estimate (seed 5.2: weights + scales + KV + working memory, before saying "it runs"), from
engine/runtime/memory_plan.py, the numbers the GPU loader checks:
    GPU:  weights as the engine holds them (checkpoint: its file bytes; a quantized GGUF: its exact layouts'
          bytes, memory_plan.source_weight_parts; HF folder: quantized to W4 at load) + fp16 KV for 4096 tokens
          (one slot) + the working memory of the "as is" plan
    CPU:  float32 dense weights (4 B/param) + float32 KV for 4096 tokens + 300 MiB, against free RAM
No torch at import: configs come from config.json / manifest.json / the GGUF header.
"""
from __future__ import annotations

import functools
import json
import os
import re
import socket
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from engine.config import GGUF_PACK, QWEN25_SHAPES, ModelConfig
from engine.doctor.checks import GIB, Check
from engine.formats.gguf_layout import gguf_weight_types
from engine.hub import catalog  # registry pulls (qwen2.5:3b, hf:ORG/REPO) live in sub-folders of root
from engine.hub import store
from engine.hub.ollama_local import list_local
from engine.paths import models_dir
from engine.runtime import memory_plan


@dataclass
class Found:
    name: str  # what to pass as --model
    kind: str  # gguf | checkpoint | hf
    path: Path
    config: ModelConfig | None
    scheme: str = "w4"  # how the GPU path holds it
    weight_bytes: int = 0  # exact for checkpoints, 0 = estimate from config


def estimate_bytes(m: Found, device: str, pack: str = GGUF_PACK) -> int:
    """Bytes the model needs on the device (a GGUF on the GPU packed as EngineConfig.gguf_pack `pack` says)."""
    cfg = m.config
    if cfg is None:
        return m.path.stat().st_size * 2 + memory_plan.CPU_OVERHEAD if m.path.is_file() else 0
    if device == "cpu":
        return memory_plan.cpu_estimate(cfg)
    return memory_plan.gpu_estimate(cfg, m.weight_bytes or gguf_weight_bytes(m, cfg, pack) or
                                    memory_plan.weight_bytes(cfg, memory_plan.DENSE_BITS))


def _gguf_header(path: Path):
    """The GGUF's header (engine.formats.gguf_file: numpy only), read once per file version: the shape
    (gguf_config) and the tensor types (gguf_weight_bytes) come from the same read."""
    st = path.stat()
    return _gguf_header_at(path, st.st_mtime_ns, st.st_size)


@dataclass(frozen=True)
class _Tensor:
    type_name: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class _Header:
    """What doctor reads of a GGUF, as plain data: keeping the GGUFFile would keep its file mapped (a file that
    cannot be deleted on Windows while the tray runs)."""
    fields: dict
    tensors: dict[str, _Tensor]


@functools.lru_cache(maxsize=16)
def _gguf_header_at(path: Path, mtime_ns: int, size: int) -> _Header:
    from engine.formats.gguf_file import GGUFFile  # numpy: doctor imports nothing heavy until it reads a GGUF

    gf = GGUFFile(path)
    return _Header(dict(gf.fields), {n: _Tensor(t.type_name, tuple(int(d) for d in t.shape))
                                     for n, t in gf.tensors.items()})


def gguf_types(m: Found) -> dict[str, str] | None:
    """A GGUF's HF name -> tensor type; None when it is not a readable GGUF (the callers estimate from the shape)."""
    if m.kind != "gguf" or not m.path.is_file():
        return None
    try:
        return gguf_weight_types({n: t.type_name for n, t in _gguf_header(m.path).tensors.items()})
    except Exception:  # damaged or unreadable
        return None


def gguf_weight_bytes(m: Found, cfg: ModelConfig, pack: str = GGUF_PACK) -> int:
    """GPU bytes of a quantized GGUF run as it is (its tensors' exact layouts in packing `pack`,
    memory_plan.source_weight_parts); 0 when it is not a readable GGUF (the caller estimates from the shape)."""
    types = gguf_types(m)
    return memory_plan.source_weight_bytes(cfg, types, mode=pack)[0] if types else 0


def _shape_from_name(name: str) -> ModelConfig | None:
    m = re.search(r"(0\.5|1\.5|3|7)b", name.lower())
    return ModelConfig(**QWEN25_SHAPES[m.group(1) + "b"]) if m else None


def gguf_config(path: Path) -> ModelConfig | None:
    """Shape from the GGUF header (engine.formats.gguf_file: numpy only, well under a second); a separate
    output.weight means an untied lm_head. Falls back to the Qwen2.5 shape named in the file name."""
    try:
        gf = _gguf_header(path)
        meta, a = gf.fields, "qwen2."
        heads = int(meta[a + "attention.head_count"])
        return ModelConfig(vocab_size=int(gf.tensors["token_embd.weight"].shape[1]),
                           hidden_size=int(meta[a + "embedding_length"]),
                           intermediate_size=int(meta[a + "feed_forward_length"]),
                           num_layers=int(meta[a + "block_count"]), num_heads=heads,
                           num_kv_heads=int(meta.get(a + "attention.head_count_kv", heads)),
                           tie_word_embeddings="output.weight" not in gf.tensors)
    except Exception:  # not qwen2, damaged, or gguf_file unavailable: estimate from the name
        return _shape_from_name(path.name)


def find_models(root: Path) -> list[Found]:
    out: list[Found] = []
    seen: set[Path] = set()
    for name, km in store.KNOWN_MODELS.items():
        if store.is_pulled(name):
            p = store.model_path(name)
            seen.add(p)
            out.append(Found(name, "gguf", p, gguf_config(p)))
    for e in catalog.list_pulled():
        if e.where in seen:
            continue
        seen.add(e.where)
        try:
            cfg = gguf_config(e.where) if e.format == "gguf" else \
                ModelConfig.from_hf(json.loads((e.where / "config.json").read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        out.append(Found(e.name, "gguf" if e.format == "gguf" else "hf", e.where, cfg))
    if not root.is_dir():
        return out
    for p in sorted(root.iterdir()):
        if p in seen or p.name.startswith("."):
            continue
        try:
            if p.is_file() and p.suffix == ".gguf":
                out.append(Found(str(p), "gguf", p, gguf_config(p)))
            elif (p / "manifest.json").is_file():
                man = json.loads((p / "manifest.json").read_text())
                size = sum(int(f.get("bytes", 0)) for f in man.get("files", {}).values())
                out.append(Found(str(p), "checkpoint", p, ModelConfig.from_dict(man["config"]),
                                 man.get("scheme", "w4"), size))
            elif (p / "config.json").is_file():
                cfg = ModelConfig.from_hf(json.loads((p / "config.json").read_text()))
                out.append(Found(str(p), "hf", p, cfg))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # half-written export: not a usable model
    return out


def can_download(timeout: float = 3.0) -> bool:
    """Whether `deepinfer pull` could work: local wheels (DEEPINFER_WHEELS_DIR) or the index reachable."""
    wheels = os.environ.get("DEEPINFER_WHEELS_DIR")
    if wheels and any(Path(wheels).glob("*.whl")):
        return True
    try:
        u = urllib.parse.urlparse(store.PYPI)
        with socket.create_connection((u.hostname, u.port or (443 if u.scheme == "https" else 80)), timeout):
            return True
    except (OSError, ValueError, TypeError):  # unreachable, or a malformed DEEPINFER_PYPI
        return False


def check_models(ctx) -> Check:
    root = models_dir()
    gpu = bool(ctx.get("gpu"))
    budget = ctx.get("vram_free") if gpu else memory_plan.available_ram()
    where = f"{budget / GIB:.1f} GiB {'free VRAM' if gpu else 'free RAM'}" if budget else "unknown free memory"
    rows, fits = [], []
    for m in find_models(root):
        need = estimate_bytes(m, "cuda" if gpu else "cpu")
        ok = budget is None or need <= budget
        rows.append({"name": m.name, "kind": m.kind, "path": str(m.path), "scheme": m.scheme if gpu else "float32",
                     "estimate_bytes": need, "fits": ok})
        if not gpu and not ok and m.config is not None and budget is not None:
            # the CPU's int8 linears (kernels/cpu_int8.py), or a GGUF's 4-bit ones as they are (cpu_int4.py) with
            # its embedding left in the file (estimated from its tensor types)
            cw = "int4" if m.kind == "gguf" else "int8"
            if memory_plan.cpu_estimate(m.config, cpu_weights=cw, streamed=m.kind != "checkpoint",
                                        types=gguf_types(m)) <= budget:
                rows[-1]["fits_with"] = "--cpu-weights " + cw
        if ok:
            fits.append(m.name)
    data = {"models_dir": str(root), "device": "cuda" if gpu else "cpu", "budget_bytes": budget, "models": rows}
    try:
        data["ollama"] = list_local()
    except Exception:
        data["ollama"] = []

    def note(r: dict) -> str:
        return "" if r["fits"] else f" (too big; fits with {r['fits_with']})" if r.get("fits_with") else " (too big)"

    listing = ", ".join(f"{r['name']} ~{r['estimate_bytes'] / GIB:.1f} GiB{note(r)}" for r in rows)
    if fits:
        return Check("models", "ok", f"{listing}; {where}", data=data)
    if rows:
        packed = [r for r in rows if r.get("fits_with")]
        fix = (f"serve {packed[0]['name']} with {packed[0]['fits_with']} (int8 / int4 linears: a quarter of "
               "float32's bytes or less, 3x faster or more); or ") if packed else ""
        return Check("models", "warn", f"{listing}: none fits {where}",
                     fix + "use a smaller model (deepinfer pull qwen2.5-coder-0.5b), a w3 export, or close other "
                     "programs", data)
    if data["ollama"]:
        name = data["ollama"][0]
        return Check("models", "warn", f"no DeepInfer model in {root}; Ollama has: {', '.join(data['ollama'])}",
                     f"deepinfer export --source ollama:{name} --scheme w4 --out {root / (name.replace(':', '-') + '-w4')}",
                     data)
    if ctx.get("models_writable", True) and can_download():
        return Check("models", "warn", f"no model in {root} yet", "deepinfer pull qwen2.5:3b  (the default model, 1.9 GB; "
                     "or deepinfer pull qwen2.5-coder-0.5b, about 500 MB)", data)
    return Check("models", "fail", f"no model in {root} and no way to download one (index unreachable)",
                 "connect to the internet and run `deepinfer pull`, or copy a .gguf file / checkpoint folder into "
                 f"{root} (or set DEEPINFER_MODELS)", data)
