"""trayapp must never pull torch into the tray process at import time (the model lives behind HTTP)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULES = ["trayapp", "trayapp.cli", "trayapp.app", "trayapp.tray", "trayapp.assistant", "trayapp.backend",
           "trayapp.config", "trayapp.keys", "trayapp.clipboard", "trayapp.selection", "trayapp.mapreduce",
           "trayapp.templates", "trayapp.icons", "trayapp.window", "engine.cli.main"]


def test_trayapp_imports_without_torch():
    code = ("import sys, importlib\n"
            f"for m in {MODULES!r}: importlib.import_module(m)\n"
            "bad = [m for m in ('torch', 'numpy', 'engine.runtime.llm', 'engine.formats.spec', 'pystray', 'keyboard', 'tkinter')"
            " if m in sys.modules]\n"
            "print('LOADED', bad)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "LOADED []" in r.stdout, r.stdout


def test_cli_print_config_in_a_fresh_process(tmp_path):
    env = dict(os.environ, DEEPINFER_CONFIG_DIR=str(tmp_path), LANG="zh_CN.UTF-8")
    r = subprocess.run([sys.executable, "-m", "engine", "tray", "--print-config"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "config.toml").exists()  # written on first run, Chinese defaults from the locale
    assert "总结" in r.stdout and "alt+win+q" in r.stdout
    (tmp_path / "config.toml").write_text("[tray\n", encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "trayapp", "--print-config"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "problem: line 1: TOML syntax error" in r.stdout
