"""Model backends the gateway can serve: id -> model argument, aliases, and a cheap spec cache.

`id` is what /v1/models lists and what clients put in "model". The default model also answers
to the aliases in DEFAULT_ALIASES (clients that insist on sending something).
"""
from __future__ import annotations

import gc
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.formats.load import load_spec
from engine.formats.spec import ModelSpec
from engine.hub import catalog
from engine.runtime import memory_plan
from engine.runtime.llm import LLM
from engine.runtime.worker_types import ModelNotFoundError

log = logging.getLogger("deepinfer.worker")
DEFAULT_ALIASES = ("default", "deepinfer", "local", "local-model")


def model_id(model_arg: str) -> str:
    """A stable, readable id for a model argument (known name, .gguf file, folder, ollama:NAME)."""
    if model_arg.startswith(("ollama:", "hf:")):
        return model_arg
    p = Path(model_arg)
    if len(p.parts) > 1 or p.suffix == ".gguf":
        return p.stem if p.suffix == ".gguf" else p.name
    return model_arg


def parse_models(items: list[str]) -> dict[str, str]:
    """["NAME=PATH", "PATH", ...] -> {id: model argument}."""
    out: dict[str, str] = {}
    for item in items or []:
        name, sep, arg = item.partition("=")
        if not sep:
            name, arg = model_id(item), item
        out[name.strip()] = arg.strip()
    return out


@dataclass
class Backends:
    cfg: EngineConfig
    default_id: str = ""
    args: dict[str, str] = field(default_factory=dict)  # id -> model argument
    _specs: dict[str, ModelSpec] = field(default_factory=dict)
    _from_pulled: set[str] = field(default_factory=set)  # ids added by _add_pulled
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self):
        self.default_id = model_id(self.cfg.model)
        self.args = {self.default_id: self.cfg.model}
        for k, v in parse_models(self.cfg.served_models).items():
            self.args.setdefault(k, v)

    def _add_pulled(self):
        """cfg.list_pulled: every pulled model (`deepinfer list`) is a backend too, also one pulled after start."""
        if not self.cfg.list_pulled:
            return
        pulled = catalog.list_pulled()
        args = dict(self.args)  # built aside and swapped in: request threads iterate self.args meanwhile
        for mid in self._from_pulled - {model_id(e.name) for e in pulled}:  # removed (`deepinfer rm`)
            args.pop(mid, None)
        self._from_pulled &= set(args)
        served = {Path(a).expanduser().resolve() for a in args.values() if Path(a).expanduser().exists()}
        for e in pulled:
            if e.name not in args.values() and e.where.resolve() not in served:
                args[model_id(e.name)] = e.name
                self._from_pulled.add(model_id(e.name))
        self.args = args

    @property
    def ids(self) -> list[str]:
        self._add_pulled()
        return list(self.args)

    def resolve(self, name: str | None) -> str:
        """Client's "model" -> backend id; raises ModelNotFoundError listing the ids."""
        if not name or name in DEFAULT_ALIASES or name == self.cfg.model:
            return self.default_id
        self._add_pulled()
        if name in self.args:
            return name
        low = name.lower().removesuffix(":latest")
        for i, arg in self.args.items():
            if low in (i.lower(), arg.lower(), model_id(arg).lower()):
                return i
        raise ModelNotFoundError(f"model {name!r} does not exist; available: {', '.join(self.ids)}",
                                 "use one of the ids from GET /v1/models")

    def spec(self, mid: str) -> ModelSpec:
        """Tokenizer/template/config of a backend (loads metadata only; weights stay lazy)."""
        with self._lock:
            if mid not in self._specs:
                self._specs[mid] = load_spec(self.args[mid])
            return self._specs[mid]

    def remember(self, mid: str, spec: ModelSpec):
        with self._lock:
            self._specs.setdefault(mid, spec)

    def load(self, mid: str):
        """Load a backend as an LLM (in the engine thread)."""

        t0 = time.perf_counter()
        llm = LLM(replace(self.cfg, model=self.args[mid]), spec=self.spec(mid))
        log.info("loaded %s in %.1f s (weights %.1f s, CUDA-graph warm-up %.1f s)", mid, time.perf_counter() - t0,
                 llm.load_seconds, llm.warmup_seconds)
        return llm

    def max_context(self, mid: str) -> int:
        return self.cfg.context_for(self.spec(mid).config)


def memory_fits(spec: ModelSpec, device: str, cfg: EngineConfig | None = None) -> bool:
    """Can this model load next to the resident one? (engine/runtime/memory_plan.py's "as is" estimate for
    cfg's context and slots, default EngineConfig(); the runner's own plan, with its fallbacks, decides at load)"""
    c, cfg = spec.config, cfg or EngineConfig()
    ctx = cfg.context_for(c)
    if device == "cuda":
        ck = getattr(spec, "checkpoint", None)
        w = ck.nbytes() if ck is not None else memory_plan.source_weight_bytes(c, spec.weight_types,
                                                                              cfg.requantize, cfg.gguf_pack)[0]
        free, _ = torch.cuda.mem_get_info()
        return memory_plan.gpu_estimate(c, w, ctx, cfg.max_batch,
                                        torch.cuda.get_device_properties(0).multi_processor_count) <= free
    # the CPU runner falls back to bfloat16 where float32 does not fit (dtype "auto"): the smaller need decides
    gguf = bool(getattr(spec, "gguf_tensors", None))  # a GGUF streamed into int8 / int4: estimated from its types
    return memory_plan.cpu_ram_fits(c, ctx, cfg.max_batch, 2 if cfg.dtype in ("auto", "bfloat16") else 4,
                                    cfg.cpu_weights, True, spec.weight_types if gguf else None)


def release_memory():
    gc.collect()
    try:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # pragma: no cover
        pass
