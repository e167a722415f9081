"""Can this process run the GPU path? The one check that `pick_device` (engine/runtime/llm.py) and
`deepinfer doctor` (engine/doctor/checks.py) both ask:

    torch sees a CUDA GPU                      (torch.cuda.is_available())
    CuPy imports, and NVRTC compiles and runs a test kernel   (the decode kernels, kernels/decode_kernels.py)
    Triton (optional) compiles a test kernel   (the prefill kernels, kernels/prefill_triton.py; without
                                               it the GPU prefill runs torch ops: kernels/triton_check.py)

Heavy modules are imported inside the probes only; the answer is cached for the process (a CuPy
compile costs ~1 s the first time).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from kernels.triton_check import FIX as TRITON_FIX, triton_compiles, triton_status

CUPY_PIP = "cupy-cuda12x"  # the build for CUDA 12 drivers; `deepinfer doctor` names the one for yours
_KERNEL = r'''extern "C" __global__ void add1(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = x[i] + 1.0f; }'''


@dataclass(frozen=True)
class Probe:
    ok: bool
    summary: str  # what was found (a version, or what is wrong)
    fix: str = ""


@dataclass(frozen=True)
class GPUCapability:
    cuda: bool  # torch sees a CUDA GPU
    ok: bool  # ... and the kernels' toolchain works: the GPU path can run
    reason: str = ""  # why not (empty when ok)
    fix: str = ""


def probe_cupy(pip_name: str = CUPY_PIP) -> Probe:
    """CuPy importable, and able to compile (NVRTC) and run a kernel on the current GPU."""
    try:
        import cupy as cp  # CuPy: optional (GPU only)
    except ImportError:
        return Probe(False, "CuPy is not installed: the custom CUDA kernels cannot be compiled",
                     f"pip install {pip_name}")
    try:
        k = cp.RawKernel(_KERNEL, "add1")
        x = cp.arange(64, dtype=cp.float32)
        y = cp.empty_like(x)
        k((1,), (64,), (x, y, cp.int32(64)))
        ok = bool((y - x == 1).all())
    except Exception as e:  # NVRTC missing, PTX too new for the driver, ...
        return Probe(False, f"CuPy {cp.__version__} cannot compile/run a kernel with NVRTC ({e})",
                     f"install the CuPy matching your driver: pip install {pip_name} "
                     "(and update the NVIDIA driver if it reports an unsupported PTX version)")
    if not ok:
        return Probe(False, "an NVRTC-compiled test kernel gave wrong results", "update the NVIDIA driver")
    return Probe(True, f"CuPy {cp.__version__}: NVRTC compiled and ran a test kernel")


def probe_triton(cuda: bool = False) -> Probe:
    """Triton imports (and, with cuda, compiles and runs a test kernel). Not required: without it the GPU
    prefill falls back to plain torch ops (kernels/triton_check.py), slower prompts, same output."""
    ok, detail = triton_compiles("cuda") if cuda else triton_status()
    if not ok:
        return Probe(False, f"{detail}: the GPU prefill falls back to torch ops (slower prompts)", TRITON_FIX)
    return Probe(True, detail)


@functools.lru_cache(maxsize=1)
def gpu_capability() -> GPUCapability:
    try:
        import torch  # torch-free path: doctor imports this module and reports a missing torch
        cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch broken: the CPU path reports it
        cuda = False
    if not cuda:
        return GPUCapability(False, False, "no CUDA GPU is available to this process",
                             "install the NVIDIA driver and a CUDA build of torch")
    probe = probe_cupy()  # Triton is optional (the prefill falls back to torch ops): not asked here
    if not probe.ok:
        return GPUCapability(True, False, probe.summary, probe.fix)
    return GPUCapability(True, True)
