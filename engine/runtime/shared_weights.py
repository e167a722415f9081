"""Dense CPU weights loaded once per process: a second CPURunner of the same model file and dtype takes the tensors
the first one loaded instead of dequantizing the file again.

Loading the 0.5B GGUF into float32 on the CPU takes ~3 s on an idle 2-core machine and ~2.5 GB (a second runner
beside the first: 0.02 s; docs/results/cpu_load_0.5b.json); the weights are read-only after the load (inference
mode), so runners of one file can hold the same tensors. Where a process loads one file twice: the test suite's
servers and LLMs beside its shared one, benches that build several LLMs of a model, a CPU draft model that is the
model itself. The entries are weak: the tensors live as long as a runner holds them, so this never keeps a model's
RAM alive on its own. A tool that writes into a runner's weights (engine/quant) first calls
CPURunner.private_weights (make_private below).

Only the plain path shares: a model file (a GGUF) read by our own reader (its `weights` the reader's iterator, not a
replaced one), dense float weights (not the int8 / int4 streamed loads, not a layered checkpoint). The key is the
file's path, size and modification time (a re-pulled file is loaded again) and the dtype.
"""
from __future__ import annotations

import os
import stat
import threading
import weakref

import torch

from engine.formats.spec import ModelSpec


class LoadedWeights:
    """A loaded model's tensors by state-dict name (the runner keeps a reference: that is what keeps them alive)."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors
        self.taken = False  # another runner assigned them (get)


_LOADED: "weakref.WeakValueDictionary[tuple, LoadedWeights]" = weakref.WeakValueDictionary()
_LOCK = threading.Lock()


def key(spec: ModelSpec, dtype: torch.dtype) -> tuple | None:
    """The sharing key of a spec's weights in dtype, or None where they must be loaded on their own."""
    if spec.kind != "dense" or spec.reader_weights is not spec.weights:
        return None  # a checkpoint, a reader that does not offer it (Hugging Face folders), or replaced weights
    try:
        st = os.stat(spec.source)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None  # a folder: its mtime does not follow the files inside
    return (os.path.realpath(spec.source), st.st_size, st.st_mtime_ns, dtype)


def get(k: tuple | None) -> LoadedWeights | None:
    if k is None:
        return None
    with _LOCK:
        held = _LOADED.get(k)
        if held is not None:
            held.taken = True
        return held


def put(k: tuple | None, model: torch.nn.Module) -> LoadedWeights | None:
    """Offer a freshly loaded model's tensors for later runners; returns the holder the runner must keep."""
    if k is None:
        return None
    held = LoadedWeights({n: t.detach() for n, t in model.state_dict().items()})
    with _LOCK:
        _LOADED[k] = held
    return held


def assign(model: torch.nn.Module, held: LoadedWeights) -> None:
    """A model built without storage for its weights takes the held tensors (no copy)."""
    model.load_state_dict(held.tensors, strict=True, assign=True)
    for p in model.parameters():
        p.requires_grad_(False)


def make_private(model: torch.nn.Module, held: LoadedWeights | None) -> None:
    """For a tool that writes into a runner's weights (engine/quant: fake quantization, AWQ's folded scales): no
    later runner may take these tensors, and if another runner already holds them, this model gets its own copy."""
    if held is None:
        return
    with _LOCK:
        for k in [k for k, v in _LOADED.items() if v is held]:
            del _LOADED[k]
        taken = held.taken
    if taken:
        with torch.no_grad():
            for p in model.parameters():
                p.data = p.data.clone()
