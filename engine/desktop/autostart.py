"""`deepinfer autostart enable|disable|status`: start the tray at login.

- Linux:   $XDG_CONFIG_HOME/autostart/deepinfer.desktop (XDG autostart spec)
- Windows: Startup-folder DeepInfer.lnk made through PowerShell's WScript.Shell; when PowerShell
           cannot make it, the HKCU\\...\\Run value "DeepInfer" instead (disable removes both)
- macOS:   ~/Library/LaunchAgents/com.deepinfer.tray.plist (RunAtLoad), loaded at next login
Locations come from engine.desktop.install_plan so the installers and this command agree.
The command line is this install's own `deepinfer tray` (pythonw on Windows: no console window).
"""
from __future__ import annotations

import json
import os
import plistlib
import shlex
import subprocess
import sys
from pathlib import Path

from engine.desktop import install_plan
from engine.errors import ResourceError
from engine.paths import log_dir

LABEL = "com.deepinfer.tray"
RUN_KEY = r"Software\Microsoft\Windows\CurrentVersion\Run"


def add_arguments(p):
    p.add_argument("action", choices=["enable", "disable", "status"])
    p.add_argument("--command", dest="cmdline", help="command line to start at login (default: this install's `deepinfer tray`)")
    p.add_argument("--json", action="store_true", help="machine-readable status")


def tray_command(os_: str | None = None) -> list[str]:
    """argv that starts this install's tray: <venv>/bin/deepinfer tray, else python -m engine tray."""
    os_ = os_ or install_plan.os_name()
    exe_dir = Path(sys.executable).parent
    if os_ == "windows":
        pyw = exe_dir / "pythonw.exe"  # no console window at login
        return [str(pyw if pyw.exists() else sys.executable), "-m", "engine", "tray"]
    script = exe_dir / "deepinfer"
    if script.exists():
        return [str(script), "tray"]
    return [sys.executable, "-m", "engine", "tray"]


def _desktop_exec(argv: list[str]) -> str:
    """Quote for a .desktop Exec= line (spec: double quotes; escape \\ " ` $; % is %%)."""
    out = []
    for a in argv:
        a = a.replace("%", "%%")
        if any(c in a for c in ' \t\n"\'\\><~|&;$*?#()`'):
            a = '"' + "".join("\\" + c if c in '"`$\\' else c for c in a) + '"'
        out.append(a)
    return " ".join(out)


def desktop_entry(argv: list[str], autostart: bool = True) -> str:
    lines = ["[Desktop Entry]", "Type=Application", "Name=DeepInfer",
             "Comment=Local AI assistant (tray) and OpenAI-compatible endpoint on 127.0.0.1:18000",
             f"Exec={_desktop_exec(argv)}", "Terminal=false", "Categories=Utility;Development;"]
    if autostart:
        lines += ["X-GNOME-Autostart-enabled=true", "X-GNOME-Autostart-Delay=5"]
    return "\n".join(lines) + "\n"


def launch_agent(argv: list[str], log_dir: Path) -> bytes:
    return plistlib.dumps({"Label": LABEL, "ProgramArguments": argv, "RunAtLoad": True,
                           "KeepAlive": False, "ProcessType": "Interactive",
                           "StandardOutPath": str(log_dir / "tray.out.log"),
                           "StandardErrorPath": str(log_dir / "tray.err.log")})


def _ps_quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def windows_shortcut_script(lnk: str, argv: list[str]) -> str:
    """PowerShell that writes a .lnk running argv (what install.ps1 does for the Start-menu entry)."""
    args = subprocess.list2cmdline(argv[1:])
    return ("$s = (New-Object -ComObject WScript.Shell).CreateShortcut(" + _ps_quote(lnk) + "); "
            f"$s.TargetPath = {_ps_quote(argv[0])}; $s.Arguments = {_ps_quote(args)}; "
            "$s.WorkingDirectory = $env:USERPROFILE; $s.Description = 'DeepInfer tray'; $s.Save()")


def _run_key(set_value: str | None = None, delete: bool = False) -> str | None:
    import winreg  # Windows only

    with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY, 0, winreg.KEY_READ | winreg.KEY_SET_VALUE) as k:
        if set_value is not None:
            winreg.SetValueEx(k, "DeepInfer", 0, winreg.REG_SZ, set_value)
            return set_value
        try:
            val = winreg.QueryValueEx(k, "DeepInfer")[0]
        except FileNotFoundError:
            return None
        if delete:
            winreg.DeleteValue(k, "DeepInfer")
        return val


def enable(argv: list[str] | None = None, os_: str | None = None) -> dict:
    os_ = os_ or install_plan.os_name()
    argv = argv or tray_command(os_)
    path = Path(install_plan.autostart_path(os_))
    if os_ == "windows":
        path.parent.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["powershell", "-NoProfile", "-ExecutionPolicy", "Bypass", "-Command",
                            windows_shortcut_script(str(path), argv)], capture_output=True, text=True)
        if r.returncode != 0 or not path.exists():
            _run_key(set_value=subprocess.list2cmdline(argv))  # fallback: HKCU Run key
            return status(os_)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        if os_ == "macos":
            log_dir().mkdir(parents=True, exist_ok=True)
            data = launch_agent(argv, log_dir())
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
        else:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(desktop_entry(argv))
        os.replace(tmp, path)
    return status(os_)


def disable(os_: str | None = None) -> dict:
    os_ = os_ or install_plan.os_name()
    path = Path(install_plan.autostart_path(os_))
    path.unlink(missing_ok=True)
    if os_ == "windows":
        try:
            _run_key(delete=True)
        except OSError:
            pass
    return status(os_)


def status(os_: str | None = None) -> dict:
    os_ = os_ or install_plan.os_name()
    path = Path(install_plan.autostart_path(os_))
    st = {"enabled": path.exists(), "os": os_, "path": str(path), "command": None}
    if path.exists():
        if os_ == "linux":
            ex = next((ln[5:] for ln in path.read_text().splitlines() if ln.startswith("Exec=")), "")
            st["command"] = ex.replace("%%", "%")
        elif os_ == "macos":
            st["command"] = shlex.join(plistlib.loads(path.read_bytes())["ProgramArguments"])
    elif os_ == "windows":
        try:
            val = _run_key()
        except OSError:
            val = None
        if val:
            st.update(enabled=True, path="HKCU\\" + RUN_KEY + "\\DeepInfer", command=val)
    return st


def run(args) -> int:
    try:
        if args.action == "enable":
            st = enable(shlex.split(args.cmdline, posix=os.name != "nt") if args.cmdline else None)
        elif args.action == "disable":
            st = disable()
        else:
            st = status()
    except OSError as e:
        raise ResourceError(f"cannot change autostart ({e})", "check that your home folder is writable") from e
    if args.json:
        print(json.dumps(st))
    elif st["enabled"]:
        print(f"autostart: enabled ({st['path']})\n  runs: {st['command'] or '(shortcut)'}")
    else:
        print(f"autostart: disabled (would write {st['path']})")
    return 0
