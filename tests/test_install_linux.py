"""installer/linux/install.sh end to end in a temporary HOME, then uninstall.sh.

--reuse-python keeps it fast (about 20 s instead of 2+ minutes): the new venv sees this test
environment's packages (torch 2.13 CPU and the rest) through a .pth file and pip installs only
deepinfer itself, built from this checkout. Everything else (venv, launcher, menu entry,
autostart, uninstall) is the real path a user takes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux installer")


def _env(home: Path) -> dict:
    keep = {k: v for k, v in os.environ.items()
            if k in ("PATH", "LANG", "LC_ALL", "TMPDIR") or k.startswith("PIP_")}
    return {**keep, "HOME": str(home), "DEEPINFER_MODELS": str(home / "models"),
            "DEEPINFER_PYPI": "http://127.0.0.1:9"}  # never download: the model is already there


def test_install_then_uninstall_in_temp_home(tmp_path, model_path):
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    for f in (model_path, model_path.with_suffix(".verified")):  # the model step's `deepinfer pull` finds it
        (home / "models" / f.name).symlink_to(f)
    env = _env(home)
    r = subprocess.run(["bash", str(ROOT / "installer/linux/install.sh"), "--cpu", "--autostart",
                        "--reuse-python", sys.executable, "--source", str(ROOT)],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    prefix = home / ".local/share/deepinfer"
    venv_py, exe = prefix / "venv/bin/python", prefix / "venv/bin/deepinfer"
    assert exe.exists() and (prefix / ".deepinfer-install").exists()
    # deepinfer is installed in the new venv (a copy built from this checkout), not borrowed
    where = subprocess.run([str(venv_py), "-c", "import engine; print(engine.__file__)"], env=env, cwd=home,
                           capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(prefix / "venv/lib"))
    assert "torch: 2.13" in r.stdout or "already present" in r.stdout
    assert "model: deepinfer pull qwen2.5-coder-0.5b" in r.stdout and str(home / "models") in r.stdout
    # launcher, menu entry, autostart entry
    launcher = home / ".local/bin/deepinfer"
    assert launcher.is_symlink() and launcher.resolve() == exe.resolve()
    menu = (home / ".local/share/applications/deepinfer.desktop").read_text()
    assert f'Exec="{exe}" tray' in menu
    auto = home / ".config/autostart/deepinfer.desktop"
    assert f"Exec={exe} tray" in auto.read_text()
    st = json.loads(subprocess.run([str(launcher), "autostart", "status", "--json"], env=env, capture_output=True,
                                   text=True, check=True).stdout)
    assert st["enabled"] and st["path"] == str(auto)
    # the installed doctor: ready on this CPU machine, the model found and fitting
    doc = subprocess.run([str(launcher), "doctor", "--json", "--port", "0"], env=env, capture_output=True,
                         text=True, timeout=120)
    rep = json.loads(doc.stdout)
    assert doc.returncode == 0 and rep["ok"], doc.stdout + doc.stderr
    models = next(c for c in rep["checks"] if c["name"] == "models")
    m05 = models["data"]["models"][0]
    assert m05["name"] == "qwen2.5-coder-0.5b"
    # "fits" is judged against the RAM free at that moment (the test suite holds models in memory)
    assert m05["fits"] == (m05["estimate_bytes"] <= models["data"]["budget_bytes"])
    assert models["status"] == ("ok" if m05["fits"] else "warn")

    u = subprocess.run(["bash", str(ROOT / "installer/linux/uninstall.sh")], env=env, capture_output=True,
                       text=True, timeout=120)
    assert u.returncode == 0, u.stdout + u.stderr
    assert not prefix.exists() and not launcher.exists() and not launcher.is_symlink()
    assert not auto.exists() and not (home / ".local/share/applications/deepinfer.desktop").exists()
    assert "kept your models/config/logs" in u.stdout and (home / "models").exists()


def test_installer_refuses_bad_options(tmp_path):
    env = _env(tmp_path)
    r = subprocess.run(["bash", str(ROOT / "installer/linux/install.sh"), "--frobnicate"], env=env,
                       capture_output=True, text=True)
    assert r.returncode != 0 and "unknown option --frobnicate" in r.stderr
    r = subprocess.run(["bash", str(ROOT / "installer/linux/install.sh"), "--source", str(tmp_path)], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 1 and "is not a DeepInfer checkout" in r.stderr and "fix:" in r.stderr
