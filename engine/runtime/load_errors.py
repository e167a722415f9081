"""Any exception raised while loading a model -> a DeepInferError that says what happened and what to do.

The engine thread (engine/runtime/worker.py) turns every load failure into its error state with this
message (GET /health shows it, `deepinfer serve` exits with it, the tray displays it): a load failure
is never a hang and never a stack trace.
"""
from __future__ import annotations

import struct
import zipfile

import torch

from engine.errors import DeepInferError, ModelFileError, ResourceError

MEMORY_FIX = ("use a smaller model or a lower-bit quantization, a shorter --max-context or fewer --max-batch "
              "slots, or close other programs that hold memory")
GPU_MODULE_FIX = ("pip install cupy-cuda12x triton (`deepinfer doctor` names the builds for your driver), "
                  "or run on the CPU: --device cpu")


def _is_oom(e: BaseException) -> bool:
    if isinstance(e, MemoryError):
        return True
    try:
        if isinstance(e, torch.cuda.OutOfMemoryError):
            return True
    except Exception:  # pragma: no cover - torch broken: not an OOM we can name
        pass
    return isinstance(e, RuntimeError) and "out of memory" in str(e).lower()


def explain_load_failure(e: BaseException, model: str) -> DeepInferError:
    """The user-facing error for an exception raised while loading `model` (a DeepInferError passes)."""
    if isinstance(e, DeepInferError):
        return e
    what = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    if isinstance(e, ImportError):
        return ResourceError(f"model {model!r} could not be loaded: a module it needs is missing ({what})",
                             GPU_MODULE_FIX)
    if _is_oom(e):
        return ResourceError(f"model {model!r} could not be loaded: out of memory ({what})", MEMORY_FIX)
    if isinstance(e, (ValueError, KeyError, IndexError, EOFError, UnicodeDecodeError, struct.error,
                      zipfile.BadZipFile)):
        return ModelFileError(f"the file of model {model!r} looks corrupt or unsupported ({what})",
                              "download it again (deepinfer pull NAME) or pick another model file")
    if isinstance(e, OSError):
        return ModelFileError(f"the file of model {model!r} could not be read ({what})",
                              "check the path and its permissions, or download it again (deepinfer pull NAME)")
    return ResourceError(f"model {model!r} could not be loaded ({what})",
                         "run `deepinfer doctor` to check this machine, or try --device cpu")
