"""Compile the decode kernels with NVRTC for given archs on a machine without a GPU (no CuPy, no driver):
the same sources and options as kernels/decode_kernels.py, so a syntax error or an sm_86-only problem shows up
before device time is spent. With ptxas (the nvidia-cuda-nvcc wheel's), each kernel's registers and spills.

    pip install --target "$DIR" nvidia-cuda-nvrtc-cu12 nvidia-cuda-nvcc-cu12
    NVRTC_LIB="$DIR/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" PTXAS="$DIR/nvidia/cuda_nvcc/bin/ptxas" \\
        python -m kernels.nvrtc_check --arch sm_86,sm_90 [--define NAME=V] [--kernels gemv_w3_silu,...]
"""
from __future__ import annotations

import argparse
import ctypes
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from kernels.decode_kernels import PACK_SOURCES, SAMPLE_SOURCE, SOURCES
from kernels.q8_kernels import SOURCES as Q8_SOURCES  # the int8-activation probe's module

HERE = Path(__file__).resolve().parent


def _lib() -> ctypes.CDLL:
    path = os.environ.get("NVRTC_LIB", "libnvrtc.so.12")
    try:
        return ctypes.CDLL(path)
    except OSError as e:
        raise SystemExit(f"cannot load NVRTC ({path}): {e}; set NVRTC_LIB (pip install nvidia-cuda-nvrtc-cu12)")


def compile_ptx(src: str, arch: str, defines: list[str]) -> str:
    """CUDA C++ -> PTX for arch (sm_XX) through NVRTC; SystemExit with the compile log on an error."""
    lib = _lib()
    prog = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"decode.cu", 0, None, None)
    assert rc == 0, f"nvrtcCreateProgram: {rc}"
    opts = [f"-arch=compute_{arch[3:]}".encode(), b"-std=c++17", *[f"-D{d}".encode() for d in defines]]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        raise SystemExit(f"NVRTC {arch} failed ({rc}):\n{log.value.decode(errors='replace')}")
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, ptx)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return ptx.value.decode()


def ptxas_usage(ptx: str, arch: str) -> dict[str, dict]:
    """{kernel: {registers, spill_stores, spill_loads}} from `ptxas -v` (PTXAS env or ptxas on PATH); {} without it."""
    exe = os.environ.get("PTXAS", "ptxas")
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "k.ptx"
        p.write_text(ptx)
        try:
            r = subprocess.run([exe, f"-arch={arch}", "-v", "-o", str(Path(d) / "k.cubin"), str(p)],
                               capture_output=True, text=True)
        except FileNotFoundError:
            return {}
    if r.returncode:
        raise SystemExit(f"ptxas {arch} failed:\n{r.stderr}")
    out, cur = {}, None
    for line in r.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            cur = out.setdefault(m.group(1), {})
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur is not None:
            cur["spill_stores"], cur["spill_loads"] = int(m.group(1)), int(m.group(2))
        m = re.search(r"Used (\d+) registers", line)
        if m and cur is not None:
            cur["registers"] = int(m.group(1))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_86,sm_90")
    ap.add_argument("--define", action="append", default=[])
    ap.add_argument("--kernels", default="", help="comma list of kernels to report (default: every kernel)")
    a = ap.parse_args(argv)
    src = "\n".join((HERE / s).read_text() for s in SOURCES)
    packs = "\n".join((HERE / s).read_text() for s in PACK_SOURCES)
    q8 = "\n".join((HERE / s).read_text() for s in Q8_SOURCES)
    want = set(filter(None, a.kernels.split(",")))
    for arch in a.arch.split(","):
        ptx = compile_ptx(src, arch, a.define)
        use = ptxas_usage(ptx, arch)
        print(f"{arch}: NVRTC ok ({len(ptx) // 1024} KiB PTX); {len(use)} kernels through ptxas")
        # the GGUF packings' module, compiled on first use (decode_kernels.DecodeKernels.load_packs)
        pptx = compile_ptx(packs, arch, [*a.define, "GEMV_ONLY_PACKS=1"])
        puse = ptxas_usage(pptx, arch)
        print(f"{arch}: the packings' module NVRTC ok ({len(pptx) // 1024} KiB PTX); {len(puse)} kernels")
        use.update({k: v for k, v in puse.items() if k not in use})
        # the int8-activation GEMVs' module, compiled on first use (DecodeKernels.load_q8)
        q8ptx = compile_ptx(packs, arch, [*a.define, "GEMV_ONLY_Q8=1"])
        q8use = ptxas_usage(q8ptx, arch)
        print(f"{arch}: the q8 GEMVs' module NVRTC ok ({len(q8ptx) // 1024} KiB PTX); {len(q8use)} kernels")
        use.update({k: v for k, v in q8use.items() if k not in use})
        # the int8-activation probe (engine/bench/q8_probe.py compiles it alone)
        qptx = compile_ptx(q8, arch, a.define)
        quse = ptxas_usage(qptx, arch)
        print(f"{arch}: the q8 probe's module NVRTC ok ({len(qptx) // 1024} KiB PTX); {len(quse)} kernels")
        use.update(quse)
        # the sampling kernel's module, compiled on first use (DecodeKernels.load_sample)
        sptx = compile_ptx((HERE / SAMPLE_SOURCE).read_text(), arch, a.define)
        suse = ptxas_usage(sptx, arch)
        print(f"{arch}: the sampling module NVRTC ok ({len(sptx) // 1024} KiB PTX); {len(suse)} kernels")
        use.update(suse)
        for name, u in sorted(use.items()):
            spill = u.get("spill_stores", 0) + u.get("spill_loads", 0)
            if (not want or any(w in name for w in want)) or spill:
                print(f"  {name}: {u.get('registers')} registers, spills {u.get('spill_stores', 0)} / "
                      f"{u.get('spill_loads', 0)} bytes")
    return 0  # spills are reported, not failures (the W4 two-tile kernels sit at the 128-register cap)


if __name__ == "__main__":
    sys.exit(main())
