"""The checks `deepinfer doctor` runs: Python, torch, CUDA, GPU, CuPy/NVRTC, port, data dirs.

Each check takes the shared context dict (what earlier checks learned: torch module, GPU) and
returns a Check. Status: ok | info | warn (works, but degraded) | fail (the app cannot run).
Heavy modules (torch, cupy) are imported inside the checks only.
"""
from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from engine import paths
from engine.desktop import install_plan
from engine.runtime import capability

GIB = 1 << 30


@dataclass
class Check:
    name: str
    status: str  # ok | info | warn | fail
    summary: str
    fix: str = ""
    data: dict = field(default_factory=dict)


def check_python(ctx) -> Check:
    v = sys.version_info
    data = {"version": platform.python_version(), "executable": sys.executable}
    if v < (3, 10):
        return Check("python", "fail", f"Python {data['version']} is too old", "install Python 3.10-3.12 and "
                     "run the installer again", data)
    note = ""
    if os.name == "nt" and v >= (3, 12):
        note = " (if the CUDA torch wheel install hangs on Windows, use Python 3.11: installer -Python 3.11)"
    return Check("python", "ok", f"Python {data['version']} ({sys.executable}){note}", data=data)


def check_torch(ctx) -> Check:
    try:
        import torch  # torch-free path: doctor must run (and report) without torch
    except ImportError as e:
        return Check("torch", "fail", f"torch is not installed ({e})",
                     "run the installer again, or: pip install torch==" + install_plan.TORCH_VERSION)
    except OSError as e:  # Windows: "DLL load failed" from a half-extracted wheel
        return Check("torch", "fail", f"torch is installed but cannot load ({e})",
                     "reinstall it: pip install --force-reinstall torch==" + install_plan.TORCH_VERSION)
    ctx["torch"] = torch
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
    return Check("torch", "ok", f"torch {torch.__version__} ({build})",
                 data={"version": torch.__version__, "cuda_build": torch.version.cuda})


def check_cuda(ctx) -> Check:
    torch = ctx.get("torch")
    smi = install_plan.query_nvidia_smi()
    drv = install_plan.parse_driver_cuda(smi)
    data = {"driver_cuda": f"{drv[0]}.{drv[1]}" if drv else None, "available": False}
    if torch is None:
        return Check("cuda", "info", "skipped (no torch)", data=data)
    data["torch_cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        data["available"] = True
        ctx["gpu"] = True
        return Check("cuda", "ok", f"CUDA {torch.version.cuda} available"
                     + (f" (driver supports CUDA {data['driver_cuda']})" if drv else ""), data=data)
    want = install_plan.choose_torch(drv)
    if drv and not torch.version.cuda:
        return Check("cuda", "warn", f"an NVIDIA GPU is present (driver CUDA {data['driver_cuda']}) but torch is "
                     "the CPU build: the CPU path works but is slow",
                     f"run the installer again without --cpu (it picks torch {want.variant} + {want.cupy})", data)
    if drv:
        return Check("cuda", "warn", f"torch {torch.__version__} cannot use the GPU (driver supports CUDA "
                     f"{data['driver_cuda']}): the CPU path works but is slow",
                     want.note or f"update the NVIDIA driver, or reinstall torch {want.variant}: "
                     f"pip install --force-reinstall {want.spec} --index-url {want.index_url}", data)
    # the CPU's fast linears in this torch (kernels/cpu_int8.py, cpu_int4.py): int4 runs int8 where it cannot
    ops = getattr(torch, "ops", None)
    aten = getattr(ops, "aten", None)
    data["cpu_int8_kernel"] = hasattr(aten, "_weight_int8pack_mm")
    data["cpu_int4_kernel"] = hasattr(aten, "_weight_int4pack_mm_for_cpu") and \
        hasattr(aten, "_convert_weight_to_int4pack_for_cpu")
    cw = "int4" if data["cpu_int4_kernel"] else "int8"
    return Check("cuda", "warn", "no NVIDIA GPU found: the CPU path works but is slow (fine for 0.5B, slow for 3B/7B)",
                 f"on the CPU, --cpu-weights {cw} (or [backend] cpu_weights = \"{cw}\") decodes 3x faster or more; "
                 "for GPU speed: an NVIDIA GPU with a driver for CUDA 12.6+, then run the installer again", data)


def check_gpu(ctx) -> Check:
    torch = ctx.get("torch")
    if not ctx.get("gpu"):
        return Check("gpu", "info", "none (CPU inference)")
    p = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info(0)
    cc = f"{p.major}.{p.minor}"
    ctx["vram_free"], ctx["vram_total"] = free, total
    data = {"name": p.name, "compute_capability": cc, "total_bytes": total, "free_bytes": free,
            "arch_list": torch.cuda.get_arch_list()}
    summary = f"{p.name}, compute capability {cc}, {total / GIB:.1f} GiB total, {free / GIB:.1f} GiB free"
    archs = data["arch_list"]
    if archs and f"sm_{p.major}{p.minor}" not in archs and not any(a.startswith("compute_") for a in archs):
        want = install_plan.choose_torch(install_plan.parse_driver_cuda(install_plan.query_nvidia_smi()))
        return Check("gpu", "warn", summary + f"; this torch has no kernels for sm_{p.major}{p.minor}",
                     f"reinstall torch {want.variant}: pip install --force-reinstall {want.spec} "
                     f"--index-url {want.index_url}", data)
    if p.major < 7 or (p.major == 7 and p.minor < 5):
        return Check("gpu", "warn", summary + " (older than Turing: the custom kernels are untested there)",
                     "use --device cpu if generation fails", data)
    if total - free > 0.3 * total:
        return Check("gpu", "warn", summary + f"; other programs hold {(total - free) / GIB:.1f} GiB (on Windows "
                     "WDDM paging can make prefill 10x slower)", "close other GPU programs (browsers, games, "
                     "other model servers) before loading a model", data)
    return Check("gpu", "ok", summary, data=data)


def check_cupy(ctx) -> Check:
    """The GPU kernels' toolchain: CuPy compiles and runs a kernel (NVRTC). The same probe pick_device
    asks (engine/runtime/capability.py), so doctor and the engine never disagree."""
    if not ctx.get("gpu"):
        return Check("cupy", "info", "not needed on the CPU path")
    want = install_plan.choose_torch(install_plan.parse_driver_cuda(install_plan.query_nvidia_smi()))
    cupy = capability.probe_cupy(want.cupy or capability.CUPY_PIP)
    if not cupy.ok:
        return Check("cupy", "warn", cupy.summary, cupy.fix)
    return Check("cupy", "ok", cupy.summary)


def check_triton(ctx) -> Check:
    """Triton for the GPU prefill kernels: imports and compiles a test kernel (the engine asks the same,
    kernels/triton_check.py). Missing or failing: the prefill runs torch ops (warn, not fail)."""
    if not ctx.get("gpu"):
        t = capability.probe_triton(cuda=False)
        return Check("triton", "info", f"not needed on the CPU path ({t.summary if t.ok else 'not installed'})")
    t = capability.probe_triton(cuda=True)
    return Check("triton", "ok", t.summary) if t.ok else Check("triton", "warn", t.summary, t.fix)


# --- port ---------------------------------------------------------------------------------------

def _holder_linux(port: int) -> tuple[int, str] | None:
    """(pid, name) of the process listening on port, from /proc/net/tcp{,6} and /proc/*/fd."""
    inodes = set()
    for f in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(f).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    targets = {f"socket:[{i}]" for i in inodes}
    for pid in filter(str.isdigit, os.listdir("/proc")) if inodes else []:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in targets:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    return int(pid), cmd.strip() or Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
    return None


def _holder_windows(port: int) -> tuple[int, str] | None:
    try:
        out = subprocess.run(["netstat", "-ano", "-p", "TCP"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            cols = line.split()
            if len(cols) >= 5 and cols[1].endswith(f":{port}") and cols[3].upper() == "LISTENING":
                pid = int(cols[4])
                task = subprocess.run(["tasklist", "/FI", f"PID eq {pid}", "/FO", "CSV", "/NH"],
                                      capture_output=True, text=True, timeout=10).stdout
                return pid, (task.split(",")[0].strip('"') if task.startswith('"') else "?")
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return None


def port_holder(port: int) -> tuple[int, str] | None:
    try:
        import psutil  # optional: not a dependency
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                return c.pid, " ".join(psutil.Process(c.pid).cmdline()) or psutil.Process(c.pid).name()
    except Exception:  # psutil missing or access denied: use the OS tools
        pass
    if sys.platform.startswith("linux"):
        return _holder_linux(port)
    if os.name == "nt":
        return _holder_windows(port)
    return None


def check_port(ctx, host: str = "127.0.0.1", port: int = 18000) -> Check:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((host, port))
        return Check("port", "ok", f"{host}:{port} is free", data={"port": port, "free": True})
    except OSError:
        pass
    finally:
        s.close()
    who = port_holder(port)
    data = {"port": port, "free": False, "pid": who[0] if who else None, "process": who[1] if who else None}
    holder = f"pid {who[0]} ({who[1][:120]})" if who else "another process"
    if who and any(k in who[1].lower() for k in ("deepinfer", "-m engine", "trayapp")):
        return Check("port", "ok", f"{host}:{port} is served by DeepInfer already ({holder})", data=data)
    return Check("port", "warn", f"{host}:{port} is in use by {holder}",
                 f"stop that program, or run on another port: deepinfer serve --port {port + 1}", data)


# --- data dirs ----------------------------------------------------------------------------------

def check_dirs(ctx) -> Check:
    dirs = {"models": paths.models_dir(), "config": paths.config_dir(), "logs": paths.log_dir()}
    data = {k: str(v) for k, v in dirs.items()}
    bad = []
    for k, d in dirs.items():
        try:
            d.mkdir(parents=True, exist_ok=True)
            probe = d / ".doctor-write-test"
            probe.write_text("ok")
            probe.unlink()
        except OSError as e:
            bad.append(f"{k} dir {d} ({e.strerror or e})")
    ctx["models_writable"] = not any(b.startswith("models") for b in bad)
    free = shutil.disk_usage(dirs["models"]).free if dirs["models"].exists() else 0
    data["models_disk_free_bytes"] = free
    if bad:
        return Check("dirs", "warn", "not writable: " + "; ".join(bad),
                     "set DEEPINFER_MODELS / DEEPINFER_CONFIG_DIR / DEEPINFER_LOG_DIR to writable folders", data)
    summary = f"models {dirs['models']} ({free / GIB:.0f} GiB free), config {dirs['config']}, logs {dirs['logs']}"
    if free < 2 * GIB:
        return Check("dirs", "warn", summary, "free disk space: a 3B/7B model needs 2-5 GiB", data)
    return Check("dirs", "ok", summary, data=data)
