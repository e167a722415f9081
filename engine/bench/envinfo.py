"""Where a benchmark ran: device, driver, library versions, git commit, command line."""
from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def _cmd(args: list[str]) -> str | None:
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=10, cwd=REPO)
        return out.stdout.strip() if out.returncode == 0 else None
    except Exception:
        return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(mod: str) -> str | None:
    try:
        m = __import__(mod)
        return getattr(m, "__version__", "?")
    except Exception:
        return None


def gpu_info() -> dict:
    try:
        if not torch.cuda.is_available():
            return {}
        props = torch.cuda.get_device_properties(0)
        out = {"gpu": torch.cuda.get_device_name(0), "gpu_memory_bytes": props.total_memory,
               "compute_capability": f"{props.major}.{props.minor}", "cuda_runtime": torch.version.cuda,
               "gpu_count": torch.cuda.device_count()}
    except Exception:
        return {}
    smi = _cmd(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if smi:
        out["driver"] = smi.splitlines()[0].strip()
    return out


def _repo_relative(arg: str) -> str:
    """A path inside this checkout as a repo-relative path (results files are committed)."""
    root = str(REPO) + os.sep
    return arg[len(root):] if arg.startswith(root) else arg


def module_command(argv: list[str] | None = None) -> str:
    """This process's command line for a results file: `python -m MODULE ARGS` when run as a module (sys.argv[0] is
    then the module file's absolute path, a machine path), paths inside the checkout repo-relative."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    head = ["python", "-m", spec.name] if spec is not None and spec.name else ["python", _repo_relative(sys.argv[0])]
    return " ".join(head + [_repo_relative(a) for a in (sys.argv[1:] if argv is None else argv)])


def environment(argv: list[str] | None = None) -> dict:
    gpu = gpu_info()
    # the caller's word first: a copied working tree (the device machine) can carry a stale .git
    commit = os.environ.get("DEEPINFER_GIT_COMMIT") or None
    dirty = None
    if not commit:
        commit = _cmd(["git", "rev-parse", "HEAD"])
        dirty = _cmd(["git", "status", "--porcelain", "--untracked-files=no"]) if commit else None
    return {
        "device": gpu.get("gpu") or f"CPU: {cpu_model()}",
        "device_kind": "cuda" if gpu else "cpu",
        **gpu,
        "cpu": cpu_model(), "cpu_count": os.cpu_count(),
        "python": platform.python_version(), "platform": platform.platform(),
        "torch": _version("torch"), "cupy": _version("cupy"),
        "torch_threads": _torch_threads(),
        "load_average": load_average(),  # other work on the machine skews CPU numbers; say so
        "host_loop_ns": host_loop_ns(),  # the host's single-thread speed (host-bound paths move with it)
        "git_commit": commit, "git_dirty": bool(dirty) if dirty is not None else None,
        "command": shlex.join(["deepinfer", "bench", *(sys.argv[1:] if argv is None else argv)]),
        "sys_argv": [_repo_relative(a) for a in sys.argv],  # no machine paths in committed results
        "time_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "knobs": knobs(),
    }


def knobs() -> dict:
    """The engine's DEEPINFER_* switches set for this run (DEEPINFER_DECODE_Q8 changes the step's numerics and
    speed, the kernel knobs its machine code): a result says which path it measured. The commit is recorded above."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("DEEPINFER_") and k != "DEEPINFER_GIT_COMMIT"}


def _torch_threads() -> int | None:
    try:
        return torch.get_num_threads()
    except Exception:
        return None


def host_loop_ns(n: int = 200_000, reps: int = 3) -> float:
    """ns per iteration of a fixed pure-Python loop, best of reps: the host's single-thread speed. Host-bound paths
    (a host-driven decode loop, prompt lookup's verify steps) moved 15% between two H100 leases with the same CPU
    name (docs/hotpath.md, twenty-ninth session); this says which lease had the slower host."""
    best = float("inf")
    for _ in range(reps):
        t, acc = time.perf_counter(), 0
        for i in range(n):
            acc += i & 7
        best = min(best, time.perf_counter() - t)
    return round(best / n * 1e9, 2)


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):  # Windows
        return None


def emit_json(res: dict, out: str | None, log=print):
    """A bench's result: written to `out` (folders made) and logged, or printed when no file is given."""
    text = json.dumps(res, ensure_ascii=False, indent=1)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text, encoding="utf-8")
        log(f"wrote {out}")
    else:
        print(text)
