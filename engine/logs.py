"""Rotating log files in engine.paths.log_dir() (DEEPINFER_LOG_DIR overrides).

setup_logging("serve") -> <log dir>/serve.log, rotated at 2 MB, 3 old files kept (serve.log.1 ..),
so a tray left running for weeks never fills the disk. Idempotent: calling it twice adds no
second handler. The tray, the server and the CLI each log to their own file.
"""
from __future__ import annotations

import logging
import logging.handlers
from pathlib import Path

from engine.paths import log_dir

FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
MAX_BYTES = 2 * 1024 * 1024
BACKUPS = 3


def log_file(name: str = "deepinfer") -> Path:
    return log_dir() / f"{name}.log"


def setup_logging(name: str = "deepinfer", level: int | str = logging.INFO, stderr: bool = False,
                  max_bytes: int = MAX_BYTES, backups: int = BACKUPS) -> Path:
    """Send the root logger to <log dir>/<name>.log (rotating); return that path.

    If the log dir cannot be created (read-only home), logging goes to stderr only: logs must
    never stop the app from starting.
    """
    root = logging.getLogger()
    root.setLevel(level)
    path = log_file(name)
    fmt = logging.Formatter(FORMAT)
    have = {getattr(h, "baseFilename", None) for h in root.handlers}
    if str(path.resolve()) not in have:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fh = logging.handlers.RotatingFileHandler(path, maxBytes=max_bytes, backupCount=backups,
                                                      encoding="utf-8", delay=True)
            fh.setFormatter(fmt)
            fh._deepinfer = True  # type: ignore[attr-defined]
            root.addHandler(fh)
        except OSError as e:
            stderr = True
            logging.getLogger(__name__).warning("cannot write logs to %s (%s); logging to stderr", path, e)
    if stderr and not any(getattr(h, "_deepinfer_stderr", False) for h in root.handlers):
        sh = logging.StreamHandler()
        sh.setFormatter(fmt)
        sh._deepinfer_stderr = True  # type: ignore[attr-defined]
        root.addHandler(sh)
    return path


def close_logging():
    """Remove the handlers setup_logging added (tests, or before the uninstaller deletes the dir)."""
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_deepinfer", False) or getattr(h, "_deepinfer_stderr", False):
            root.removeHandler(h)
            h.close()
