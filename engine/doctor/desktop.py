"""Desktop checks for `deepinfer doctor`: hotkey, clipboard and tray backends (docs/desktop.md).

These only warn: without them the endpoint, `deepinfer ask` and the tray menu still work.
Nothing is imported (keyboard raises at import on Linux without root, pystray/pynput connect to
the display): we look for the modules and for what they need on this OS.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import sys

from engine.doctor.checks import Check


def _has(mod: str) -> bool:
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False


def _display() -> str | None:
    if os.environ.get("WAYLAND_DISPLAY"):
        return "wayland"
    if os.environ.get("DISPLAY"):
        return "x11"
    return None


def _linux() -> bool:
    return sys.platform.startswith("linux")


def check_hotkey(ctx) -> Check:
    if os.name == "nt":
        if _has("keyboard"):
            return Check("hotkey", "ok", "keyboard (Windows low-level hook)", data={"backend": "keyboard"})
        return Check("hotkey", "warn", "no hotkey library", "pip install keyboard")
    if sys.platform == "darwin":
        if _has("pynput"):
            return Check("hotkey", "info", "pynput (allow the terminal/app in System Settings > Privacy > "
                         "Accessibility and Input Monitoring)", data={"backend": "pynput"})
        return Check("hotkey", "warn", "no hotkey library", "pip install pynput")
    usable, why = [], []
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    events = glob.glob("/dev/input/event*")
    if _has("keyboard"):
        if root and events:
            usable.append("keyboard")
        else:
            why.append("keyboard needs root and /dev/input" + ("" if events else " (no /dev/input/event* here)"))
    else:
        why.append("keyboard not installed")
    disp = _display()
    if _has("pynput"):
        if disp == "x11":
            usable.append("pynput")
        else:
            why.append("pynput needs an X11 display" + (" (Wayland blocks global hotkeys)" if disp else
                                                        " (no DISPLAY)"))
    else:
        why.append("pynput not installed")
    data = {"usable": usable, "display": disp, "root": root}
    if usable:
        return Check("hotkey", "ok", f"{usable[0]} usable" + (f" (also: {', '.join(usable[1:])})" if usable[1:] else ""),
                     data=data)
    return Check("hotkey", "warn", "no global hotkey backend usable: " + "; ".join(why),
                 "log in to an X11 session with pynput installed (pip install pynput); meanwhile use the tray "
                 "menu or `deepinfer ask`", data)


def check_clipboard(ctx) -> Check:
    if not _has("pyperclip"):
        return Check("clipboard", "warn", "pyperclip is not installed", "pip install pyperclip")
    if not _linux():
        return Check("clipboard", "ok", "pyperclip (native clipboard)")
    disp = _display()
    tools = [t for t in ("wl-copy", "xclip", "xsel") if shutil.which(t)]
    data = {"display": disp, "tools": tools}
    if disp is None:
        return Check("clipboard", "warn", "no display: the clipboard is unavailable (tools: "
                     f"{', '.join(tools) or 'none'})", "run the tray inside a desktop session", data)
    need = ["wl-copy"] if disp == "wayland" else ["xclip", "xsel"]
    if any(t in tools for t in need):
        return Check("clipboard", "ok", f"pyperclip via {next(t for t in tools if t in need)}", data=data)
    pkg = "wl-clipboard" if disp == "wayland" else "xclip"
    return Check("clipboard", "warn", f"pyperclip needs {' or '.join(need)} on {disp}",
                 f"sudo apt install {pkg}", data)


def _typelib(name: str) -> bool:
    """GObject typelib installed (Debian: /usr/lib/<triplet>/girepository-1.0, others /usr/lib64/...)."""
    return any(glob.glob(f"{d}/girepository-1.0/{name}-*.typelib") for d in ("/usr/lib", "/usr/lib64", "/usr/lib/*"))


def check_tray(ctx) -> Check:
    if not _has("pystray"):
        return Check("tray", "warn", "pystray is not installed: no tray icon",
                     "pip install 'deepinfer[tray]'  (the endpoint works without it)")
    forced = os.environ.get("PYSTRAY_BACKEND")
    if os.name == "nt" or sys.platform == "darwin":
        b = forced or ("win32" if os.name == "nt" else "darwin")
        return Check("tray", "ok", f"pystray backend {b}", data={"backend": b})
    disp = _display()
    if forced:
        backend = forced
    elif _has("gi") and (_typelib("AyatanaAppIndicator3") or _typelib("AppIndicator3")):
        backend = "appindicator"
    elif _has("gi") and _typelib("Gtk"):
        backend = "gtk"
    elif _has("Xlib"):
        backend = "xorg"
    else:
        backend = None
    data = {"backend": backend, "display": disp, "forced": bool(forced)}
    if disp is None:
        return Check("tray", "warn", f"no display (DISPLAY/WAYLAND_DISPLAY unset): the tray cannot show "
                     f"(backend would be {backend or 'none'})",
                     "start it from a desktop session; headless, use `deepinfer serve`", data)
    if backend is None:
        return Check("tray", "warn", "no pystray backend (needs PyGObject or python-xlib)",
                     "sudo apt install python3-gi gir1.2-ayatanaappindicator3-0.1", data)
    if backend == "xorg":
        return Check("tray", "warn", "pystray backend xorg: no menu and no notifications",
                     "sudo apt install gir1.2-ayatanaappindicator3-0.1 (GNOME also needs the AppIndicator "
                     "extension)", data)
    return Check("tray", "ok", f"pystray backend {backend} on {disp}", data=data)
