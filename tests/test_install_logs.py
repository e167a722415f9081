"""engine/logs.py: rotating log files in engine.paths.log_dir() (DEEPINFER_LOG_DIR)."""
from __future__ import annotations

import logging

from engine import logs
def test_rotating_log_in_log_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPINFER_LOG_DIR", str(tmp_path / "logs"))
    try:
        path = logs.setup_logging("serve", max_bytes=2000, backups=2)
        assert path == tmp_path / "logs/serve.log"
        assert logs.setup_logging("serve", max_bytes=2000, backups=2) == path  # idempotent
        n = sum(1 for h in logging.getLogger().handlers if getattr(h, "_deepinfer", False))
        assert n == 1
        log = logging.getLogger("engine.test")
        for i in range(200):
            log.info("line %d %s", i, "x" * 40)
        files = sorted(p.name for p in path.parent.iterdir())
        assert files == ["serve.log", "serve.log.1", "serve.log.2"]  # rotated, 2 backups kept, no more
        assert all(p.stat().st_size <= 2100 for p in path.parent.iterdir())
        assert "line 199" in path.read_text()
    finally:
        logs.close_logging()
    assert not any(getattr(h, "_deepinfer", False) for h in logging.getLogger().handlers)


def test_unwritable_log_dir_falls_back_to_stderr(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    monkeypatch.setenv("DEEPINFER_LOG_DIR", str(blocker / "logs"))
    try:
        logs.setup_logging("tray")  # must not raise: logs never stop the app
        assert any(getattr(h, "_deepinfer_stderr", False) for h in logging.getLogger().handlers)
    finally:
        logs.close_logging()
