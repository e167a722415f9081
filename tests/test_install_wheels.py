"""The install sets resolve to wheels on every platform we ship for (runs in CI; skips only when PyPI
is unreachable). What the installers install, per target:

  windows  win_amd64, Python 3.10-3.12: torch (PyPI: the CPU build; the CUDA build comes from the
           PyTorch index, out of reach here), cupy-cuda12x, cupy-cuda13x, triton-windows (install.ps1
           on a GPU), deepinfer's dependencies + [tray]
  macos    arm64 (macOS 14+), Python 3.10-3.12: torch from PyPI, deepinfer + [tray]
  linux    x86_64 CPU path (glibc 2.31+), Python 3.10-3.12: deepinfer + [tray] from PyPI; torch from
           the PyTorch CPU index (checked when that index is reachable)

Resolved with `uv pip compile --python-platform P --python-version V --only-binary :all:`: a
package without a wheel for the target fails. Not `pip download --platform`: pip evaluates
environment markers for the machine it runs on, so on Linux it pulls torch's Linux-only nvidia-*
dependencies into a win_amd64 set and fails for the wrong reason; uv evaluates them for the target.
"""
from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

from engine.desktop import install_plan as ip

ROOT = Path(__file__).resolve().parents[1]
PYPI = "https://pypi.org/simple"
TORCH_CPU_INDEX = ip.TORCH_INDEX.format(variant="cpu")
PYTHONS = ("3.10", "3.11", "3.12")
# the oldest systems the sets must install on: glibc 2.31 (Ubuntu 20.04 / Debian 11; llguidance's wheels
# need it, torch's 2.28) and macOS 14 (torch 2.13's arm64 wheels are macosx_14_0)
TARGETS = {"windows": "x86_64-pc-windows-msvc", "macos": "aarch64-apple-darwin", "linux": "x86_64-manylinux_2_31"}
MACOS = "14.0"
# Source builds the installers accept (everything else must be a wheel): evdev, pynput's Linux
# backend, is published as an sdist only; it builds with a C compiler and the Python headers
# (docs/install.md: build-essential python3-dev).
SDIST_OK = {"linux": ["evdev"]}


def _reachable(url: str) -> bool:
    return ip.index_reachable(url, timeout=5)


def _package_deps() -> list[str]:
    """deepinfer's dependencies + the [tray] extra (what `pip install .[tray]` asks for), torch apart."""
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = proj["dependencies"] + proj["optional-dependencies"]["tray"]
    return [d for d in deps if not d.replace(" ", "").startswith("torch")]


def install_set(os_: str) -> list[list[str]]:
    """Requirement lists resolved one by one (the installers install torch apart, from its own index)."""
    torch = f"torch=={ip.TORCH_VERSION}"
    if os_ == "windows":  # every GPU variant's extras, so a driver change cannot hit a missing wheel
        gpu = sorted({c.cupy for c in (ip.choose_torch(d, os_="windows") for d in ((12, 6), (13, 0)))})
        return [[torch, *gpu, ip.TRITON_WINDOWS, *_package_deps()]]
    if os_ == "macos":
        return [[torch, *_package_deps()]]
    return [_package_deps()]  # linux CPU path; its torch: test_linux_cpu_torch_resolves


def _compile(reqs: list[str], target: str, python: str, index: str = PYPI,
             sdist_ok: list[str] = ()) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_INDEX", "UV_EXTRA"))}
    env["UV_NO_CONFIG"] = "1"
    env["MACOSX_DEPLOYMENT_TARGET"] = MACOS  # uv's aarch64-apple-darwin means this macOS version
    return subprocess.run([sys.executable, "-m", "uv", "pip", "compile", "-", "--python-platform", target,
                           "--python-version", python, "--only-binary", ":all:", "--index-url", index,
                           *[x for name in sdist_ok for x in ("--no-binary", name)],
                           "--no-header", "--no-annotate", "--quiet"],
                          input="\n".join(reqs), capture_output=True, text=True, env=env, timeout=300)


_STARTED: dict = {}


def start_resolution() -> None:
    """Start resolving every (os, python) set in background threads (the time is network round trips, ~50 s):
    conftest calls this when the session's tests are collected, so the waiting overlaps the CPU-bound tests
    before this module; the `resolved` fixture collects the results (and starts them itself otherwise)."""
    if _STARTED:
        return
    ex = ThreadPoolExecutor(max_workers=16)
    _STARTED["reachable"] = ex.submit(_reachable, PYPI)
    jobs = {(os_, py, i): reqs for os_ in TARGETS for py in PYTHONS for i, reqs in enumerate(install_set(os_))}
    _STARTED["jobs"] = {k: (reqs, ex.submit(_compile, reqs, TARGETS[k[0]], k[1], sdist_ok=SDIST_OK.get(k[0], [])))
                        for k, reqs in jobs.items()}
    ex.shutdown(wait=False)


@pytest.fixture(scope="module")
def resolved():
    """Every (os, python) set resolved at once, in parallel."""
    start_resolution()
    if not _STARTED["reachable"].result():
        pytest.skip("PyPI is unreachable")
    return {k: (reqs, f.result()) for k, (reqs, f) in _STARTED["jobs"].items()}


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("os_", ["windows", "macos", "linux"])
def test_install_set_resolves_to_wheels(resolved, os_, python):
    for (o, py, _), (reqs, r) in resolved.items():
        if (o, py) != (os_, python):
            continue
        assert r.returncode == 0, f"{os_} / Python {python}: no wheel set for {reqs}\n{r.stderr[-3000:]}"
        pinned = {line.split("==")[0].lower() for line in r.stdout.splitlines() if "==" in line}
        names = {q.split("<")[0].split(">")[0].split("=")[0].split("[")[0].strip().lower().replace("_", "-")
                 for q in reqs}
        assert names <= pinned, names - pinned


def test_linux_cpu_torch_resolves():
    if not _reachable(TORCH_CPU_INDEX):
        pytest.skip(f"{TORCH_CPU_INDEX} is unreachable")
    for python in PYTHONS:
        r = _compile([f"torch=={ip.TORCH_VERSION}"], TARGETS["linux"], python, TORCH_CPU_INDEX)
        assert r.returncode == 0, r.stderr[-3000:]


def test_installers_name_the_plan_script_and_triton():
    """The plan script path the installers run exists (it moved once), and a Windows GPU gets Triton."""
    ps1 = (ROOT / "installer/windows/install.ps1").read_text(encoding="utf-8-sig")
    sh = (ROOT / "installer/linux/install.sh").read_text()
    assert '"engine\\desktop\\install_plan.py"' in ps1 and (ROOT / "engine/desktop/install_plan.py").exists()
    assert '"$SRC/engine/desktop/install_plan.py" torch' in sh
    assert '$Choice["triton"]' in ps1
    assert ip.choose_torch((12, 8), os_="windows").triton == ip.TRITON_WINDOWS
    assert ip.choose_torch((12, 8), os_="linux").triton == "" and ip.choose_torch(None, os_="windows").triton == ""
