"""`deepinfer autostart enable|disable|status` in a temporary HOME / XDG_CONFIG_HOME."""
from __future__ import annotations

import json
import os
import plistlib
import subprocess
import sys
from pathlib import Path

import pytest

from engine.desktop import autostart
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.setenv("DEEPINFER_LOG_DIR", str(tmp_path / "logs"))
    return tmp_path


def test_linux_enable_status_disable(home):
    path = home / "cfg/autostart/deepinfer.desktop"
    assert autostart.status("linux") == {"enabled": False, "os": "linux", "path": str(path), "command": None}
    st = autostart.enable(["/opt/Deep Infer/venv/bin/deepinfer", "tray"], "linux")
    text = path.read_text()
    assert st["enabled"] and st["path"] == str(path)
    assert 'Exec="/opt/Deep Infer/venv/bin/deepinfer" tray\n' in text  # quoted per the desktop-entry spec
    assert "[Desktop Entry]\nType=Application\n" in text and "X-GNOME-Autostart-enabled=true" in text
    assert st["command"] == '"/opt/Deep Infer/venv/bin/deepinfer" tray'
    autostart.enable(["/usr/bin/deepinfer", "tray"], "linux")  # again: replaced, not duplicated
    assert path.read_text().count("Exec=") == 1 and "Exec=/usr/bin/deepinfer tray" in path.read_text()
    assert not autostart.disable("linux")["enabled"] and not path.exists()
    assert not autostart.disable("linux")["enabled"]  # idempotent


def test_default_command_is_this_installs_tray():
    argv = autostart.tray_command("linux")
    assert argv[-1] == "tray"
    assert argv[0] == str(Path(sys.executable).parent / "deepinfer") or argv[:3] == [sys.executable, "-m", "engine"]
    win = autostart.tray_command("windows")
    assert win[1:] == ["-m", "engine", "tray"]


def test_macos_launch_agent(home):
    st = autostart.enable(["/Users/a/venv/bin/deepinfer", "tray"], "macos")
    plist = plistlib.loads((home / "Library/LaunchAgents/com.deepinfer.tray.plist").read_bytes())
    assert plist["Label"] == "com.deepinfer.tray" and plist["RunAtLoad"] is True
    assert plist["ProgramArguments"] == ["/Users/a/venv/bin/deepinfer", "tray"]
    assert plist["StandardErrorPath"].startswith(str(home / "logs"))
    assert st["enabled"] and st["command"] == "/Users/a/venv/bin/deepinfer tray"
    assert not autostart.disable("macos")["enabled"]


def test_windows_shortcut_script():
    ps = autostart.windows_shortcut_script(r"C:\Users\o'neil\Startup\DeepInfer.lnk",
                                           [r"C:\DI\venv\Scripts\pythonw.exe", "-m", "engine", "tray"])
    assert "CreateShortcut('C:\\Users\\o''neil\\Startup\\DeepInfer.lnk')" in ps  # '' escapes ' in PowerShell
    assert "$s.TargetPath = 'C:\\DI\\venv\\Scripts\\pythonw.exe'" in ps
    assert "$s.Arguments = '-m engine tray'" in ps and ps.endswith("$s.Save()")


def test_cli_round_trip(home):
    env = dict(os.environ)
    run = lambda *a: subprocess.run([sys.executable, "-m", "engine", "autostart", *a, "--json"], cwd=ROOT, env=env,
                                    capture_output=True, text=True, check=True)
    st = json.loads(run("enable", "--command", "/x/deepinfer tray").stdout)
    assert st["enabled"] and Path(st["path"]) == home / "cfg/autostart/deepinfer.desktop"
    assert json.loads(run("status").stdout)["command"] == "/x/deepinfer tray"
    assert not json.loads(run("disable").stdout)["enabled"]
    out = subprocess.run([sys.executable, "-m", "engine", "autostart", "status"], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith("autostart: disabled")
