"""Is Triton usable here? The GPU prefill's Triton kernels (kernels/prefill_triton.py,
kernels/prefill_elementwise.py) need it; torch's Windows wheels do not bring it (the Windows build
is the separate `triton-windows` package) and a present Triton can still fail to compile (no C
compiler, a driver it does not know). Without it the GPU prefill runs the plain torch path
(prefill_mode "torch", kernels/prefill_torch.py for the packed linears): slower, same results.

    prefill_backend(cuda)  -> "triton" | "torch"; on CUDA without a working Triton: ONE warning
    triton_status()        -> (ok, detail): import only (doctor, tests)
    triton_compiles(dev)   -> (ok, detail): compile and run a tiny kernel on a CUDA device
"""
from __future__ import annotations

import logging

log = logging.getLogger("deepinfer.kernels")
_status: tuple[bool, str] | None = None
_compiled: dict[str, tuple[bool, str]] = {}
_warned = False
FIX = ("pip install triton (Linux) / pip install triton-windows (Windows), or rerun the installer; "
       "deepinfer doctor shows what failed")


def reset() -> None:
    """Forget the cached answers (tests that hide or restore Triton)."""
    global _status, _warned
    _status, _warned = None, False
    _compiled.clear()


def triton_status() -> tuple[bool, str]:
    global _status
    if _status is None:
        try:
            import triton  # optional: Triton (GPU only)
            import triton.language  # noqa: F401  (optional: Triton)
            _status = (True, f"triton {getattr(triton, '__version__', '?')}")
        except Exception as e:  # ImportError, or a broken install raising anything at import
            _status = (False, f"triton not importable: {type(e).__name__}: {e}")
    return _status


def triton_compiles(device="cuda") -> tuple[bool, str]:
    """Compile and run an 8-element add on `device` (a CUDA device); cached per device."""
    key = str(device)
    if key not in _compiled:
        ok, detail = triton_status()
        if ok:
            try:
                import torch  # torch-free path: doctor imports this module (engine/runtime/capability.py)
                import triton  # optional: Triton (GPU only)
                import triton.language as tl  # optional: Triton

                @triton.jit
                def _add_one(x_ptr, n, BLOCK: tl.constexpr):
                    i = tl.arange(0, BLOCK)
                    m = i < n
                    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=m) + 1, mask=m)

                x = torch.zeros(8, dtype=torch.float32, device=device)
                _add_one[(1,)](x, 8, BLOCK=8)
                ok = bool((x == 1).all())
                detail = detail + (" compiles and runs" if ok else " ran a test kernel with wrong results")
            except Exception as e:
                ok, detail = False, f"{detail} fails to compile/run a kernel: {type(e).__name__}: {str(e)[:300]}"
        _compiled[key] = (ok, detail)
    return _compiled[key]


def prefill_backend(cuda: bool, device="cuda") -> str:
    """"triton" when the GPU prefill can use its Triton kernels, else "torch" (the CPU always is)."""
    global _warned
    if not cuda:
        return "torch"
    ok, detail = triton_compiles(device)
    if ok:
        return "triton"
    if not _warned:
        _warned = True
        log.warning("Triton is not usable (%s): the GPU prefill runs on plain torch ops (slower prompts, "
                    "same output). Fix: %s", detail, FIX)
    return "torch"
