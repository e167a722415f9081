"""Shared download pieces for the registries: a progress bar, and one resumable, digest-checked blob fetch.

A blob is written to DEST.partial and renamed to DEST only once its sha256 matches, so an
interrupted pull never looks complete. A cut connection leaves the .partial file; the next pull
asks for the rest with an HTTP Range request (the server may redirect, e.g. to a CDN: urllib
follows and keeps the Range header). A full-size file with a wrong digest is deleted, never kept.
"""
from __future__ import annotations

import errno
import hashlib
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from engine.errors import ModelFileError, ResourceError

USER_AGENT = "deepinfer/0.1 (+https://github.com/deepinfer)"
SPACE_FIX = ("free some disk space, or keep models on a bigger disk: set DEEPINFER_MODELS to a folder there "
             "(a pull resumes from what it already downloaded)")
OnProgress = Callable[[int, int], None]  # (bytes done, bytes total) of the whole pull


class Progress:
    """`pull NAME [#####-----]  37%  712.4/1929.9 MB  48.1 MB/s` on a terminal; callbacks for the tray.

    Redraws at most every 0.2 s on a TTY; writes nothing to a non-terminal stream (logs, pipes)
    except the final line. `on_progress(done, total)` gets every update (the tray throttles).
    """

    def __init__(self, total: int, label: str, stream=None, on_progress: OnProgress | None = None):
        self.total, self.done, self.label = total, 0, label
        self.stream = sys.stderr if stream is None else stream
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.on_progress = on_progress
        self._t0 = time.monotonic()
        self._base = 0  # bytes already on disk when we started (not counted in the speed)
        self._drawn = 0.0

    def skip(self, n: int):
        """Bytes that were already there (a resumed partial file)."""
        self.done += n
        self._base += n
        self._report(force=True)

    def add(self, n: int):
        self.done += n
        self._report()

    def _report(self, force: bool = False):
        if self.on_progress is not None:
            self.on_progress(self.done, self.total)
        now = time.monotonic()
        if self.tty and (force or now - self._drawn >= 0.2 or self.done >= self.total):
            self._drawn = now
            self.stream.write("\r" + self.line(now))
            self.stream.flush()

    def line(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        frac = self.done / self.total if self.total else 1.0
        bar = "#" * int(25 * frac)
        speed = (self.done - self._base) / max(now - self._t0, 1e-6) / 1e6
        return (f"{self.label} [{bar:<25}] {100 * frac:3.0f}% {self.done / 1e6:8.1f}/{self.total / 1e6:.1f} MB "
                f"{speed:6.1f} MB/s")

    def close(self):
        if self.tty:
            self.stream.write("\r" + self.line() + "\n")
            self.stream.flush()


def open_url(url: str, headers: dict[str, str] | None = None, timeout: float = 60.0):
    """urlopen with our User-Agent; redirects (301/302/303/307/308) are followed by urllib."""
    req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, **(headers or {})})
    return urllib.request.urlopen(req, timeout=timeout)


def _hash_prefix(path: Path) -> "hashlib._Hash":
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h


PARTIAL = ".partial"  # a download in progress: dest + PARTIAL (fetch_blob resumes it)


def remaining(dest: Path, size: int) -> int:
    """Bytes still to download for dest: 0 when it is complete, else size minus its partial file's."""
    if dest.exists() and dest.stat().st_size == size:
        return 0
    part = dest.with_name(dest.name + PARTIAL)
    have = part.stat().st_size if part.is_file() else 0
    return size - have if have <= size else size


def ensure_space(folder: Path, need: int, what: str):
    """ResourceError before a pull starts when `need` bytes do not fit the free space of folder's disk (the OS would
    stop the download half way, leaving a full disk); unknown free space passes."""
    p = folder
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        free = shutil.disk_usage(p).free
    except OSError:
        return
    if need > free:
        raise ResourceError(f"{what} needs {human(need)} of disk space in {folder}, which has {human(free)} free",
                            SPACE_FIX)


def human(n: int) -> str:
    """A byte count as `deepinfer list` and the pull errors show it: 1.9 GB, 3.0 MB, 512 B."""
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{n} B"


def ensure_writable(folder: Path):
    """ResourceError naming the folder when it cannot be created or written (a DEEPINFER_MODELS with a typo, a
    read-only or unplugged drive), before a pull starts, instead of a traceback from its first mkdir."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".deepinfer-write-test-"):
            pass
    except OSError as e:
        raise ResourceError(f"cannot write to the models folder {folder} ({e.strerror or e})",
                            "set DEEPINFER_MODELS to a folder you can write to, or fix this one") from None


def disk_full(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


def fetch_blob(url: str, dest: Path, size: int, sha256: str, progress: Progress, *, again: str) -> Path:
    """Download url into dest (resuming dest.partial), check size and sha256, then rename.

    `again` is the command that resumes (`deepinfer pull qwen2.5:3b`), quoted in the errors.
    """
    if dest.exists() and dest.stat().st_size == size:
        progress.skip(size)
        return dest  # verified when it was renamed into place
    part = dest.with_name(dest.name + PARTIAL)
    have = part.stat().st_size if part.exists() else 0
    if have > size:
        part.unlink()
        have = 0
    h = _hash_prefix(part) if have else hashlib.sha256()
    progress.skip(have)
    if have < size:
        try:
            with open_url(url, {"Range": f"bytes={have}-"} if have else {}, timeout=120) as r:
                if have and r.status != 206:  # the server ignored Range: start again
                    progress.skip(-have)
                    have, h = 0, hashlib.sha256()
                with open(part, "ab" if have else "wb") as f:
                    while chunk := r.read(1 << 20):
                        f.write(chunk)
                        h.update(chunk)
                        progress.add(len(chunk))
                        if f.tell() > size:
                            break
        except urllib.error.HTTPError as e:
            raise ResourceError(f"download of {dest.name} failed: {url.split('?')[0]} answered {e.code} {e.reason}",
                                f"run `{again}` again later") from None
        except (urllib.error.URLError, TimeoutError, OSError) as e:
            if disk_full(e):
                raise ResourceError(f"download of {dest.name} stopped at {_size(part)} of {size} bytes: the disk of "
                                    f"{dest.parent} is full", f"{SPACE_FIX}; then run `{again}` again") from None
            raise ResourceError(f"download of {dest.name} interrupted at {_size(part)} of {size} bytes ({_why(e)})",
                                f"run `{again}` again: it resumes where it stopped") from None
    got_size = part.stat().st_size
    if got_size < size:  # connection closed early: keep the partial file for the resume
        raise ResourceError(f"download of {dest.name} interrupted at {got_size} of {size} bytes",
                            f"run `{again}` again: it resumes where it stopped")
    got = h.hexdigest() if got_size == size else ""
    if got != sha256:
        part.unlink()
        raise ModelFileError(f"{dest.name}: the downloaded bytes do not match the registry's digest "
                             f"(expected sha256 {sha256}, got {got or f'{got_size} bytes, more than {size}'})",
                             f"run `{again}` again (the bad download was deleted)")
    part.rename(dest)
    return dest


def _size(p: Path) -> int:
    return p.stat().st_size if p.is_file() else 0


def _why(e: BaseException) -> str:
    return str(getattr(e, "reason", None) or e) or type(e).__name__
