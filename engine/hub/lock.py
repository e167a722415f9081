"""One pull of a model at a time across processes: two `deepinfer pull` runs (or a pull from the tray while the CLI
pulls the same model, or test workers sharing the model cache) would append to the same partial files and join them
twice. The second waits for the first, then finds the model pulled (or resumes what the first left)."""
from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

from engine.errors import ResourceError


@contextlib.contextmanager
def pull_lock(path: Path, what: str, timeout: float = 3600.0, stream=None):
    """Hold an exclusive lock on `path` (created; its directory must exist) while the body runs. Waits up to
    `timeout` seconds for another process's pull (one line to `stream` when it has to wait), then gives up with a
    ResourceError. The OS drops the lock when the holder exits, so a killed pull never leaves it held."""
    f = open(path, "a+b")
    try:
        deadline, told = time.monotonic() + timeout, False
        while not _try_lock(f):
            if time.monotonic() > deadline:
                raise ResourceError(f"another process is still pulling {what} after {timeout:.0f} s",
                                    "wait for it to finish, or stop it, then pull again")
            if not told and stream is not None:
                print(f"waiting for another pull of {what} to finish", file=stream, flush=True)
                told = True
            time.sleep(0.2)
        try:
            yield
        finally:
            _unlock(f)
    finally:
        f.close()


if sys.platform == "win32":
    import msvcrt

    def _try_lock(f) -> bool:
        try:
            f.seek(0)
            msvcrt.locking(f.fileno(), msvcrt.LK_NBLCK, 1)
            return True
        except OSError:
            return False

    def _unlock(f):
        f.seek(0)
        msvcrt.locking(f.fileno(), msvcrt.LK_UNLCK, 1)
else:
    import fcntl

    def _try_lock(f) -> bool:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            return False

    def _unlock(f):
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)


__all__ = ["pull_lock"]
