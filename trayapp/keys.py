"""The OS edge for keys: global hotkeys, simulated key presses, modifier state.

`keyboard` (0.13.5, unmaintained) is kept behind these small adapters so pynput can stand in:
- Windows: keyboard (low-level hook, no admin needed); fallback pynput.
- macOS:   pynput (needs the Accessibility permission); keyboard's macOS support is experimental.
- Linux:   X11 -> pynput (XRecord, no root); else keyboard, which reads /dev/input and needs root
           (or the uinput group). Wayland does not let apps grab global keys or inject Ctrl+C: bind
           the desktop's own shortcut instead and use the tray menu.
Hotkeys are written "win+alt+q" (win = Windows key / Command on macOS), normalized by `parse_hotkey`.
"""
from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Protocol

from engine.errors import DeepInferError

MODIFIERS = ("ctrl", "alt", "shift", "win")
_ALIASES = {"control": "ctrl", "ctl": "ctrl", "option": "alt", "opt": "alt", "super": "win", "windows": "win",
            "meta": "win", "cmd": "win", "command": "win", "return": "enter", "esc": "escape"}
# The shortcut the focused app understands for copy / paste.
PRIMARY = "win" if sys.platform == "darwin" else "ctrl"


class HotkeyError(DeepInferError):
    """Global hotkeys or key simulation are not available here."""


def parse_hotkey(s: str) -> tuple[frozenset[str], str]:
    """'Win+Alt+Q' -> ({'win','alt'}, 'q'). Raises HotkeyError for malformed strings."""
    parts = [_ALIASES.get(p.strip().lower(), p.strip().lower()) for p in s.split("+")]
    mods = [p for p in parts if p in MODIFIERS]
    keys = [p for p in parts if p not in MODIFIERS]
    if len(keys) != 1 or not keys[0]:
        raise HotkeyError(f"hotkey {s!r} needs exactly one non-modifier key", "write it like win+alt+q")
    return frozenset(mods), keys[0]


def canonical(s: str) -> str:
    mods, key = parse_hotkey(s)
    return "+".join([m for m in MODIFIERS if m in mods] + [key])


def to_keyboard(s: str) -> str:
    mods, key = parse_hotkey(s)
    names = {"win": "command" if sys.platform == "darwin" else "windows"}
    return "+".join([names.get(m, m) for m in MODIFIERS if m in mods] + [key])


def to_pynput(s: str) -> str:
    mods, key = parse_hotkey(s)
    names = {"ctrl": "<ctrl>", "alt": "<alt>", "shift": "<shift>", "win": "<cmd>"}
    return "+".join([names[m] for m in MODIFIERS if m in mods] + [key if len(key) == 1 else f"<{key}>"])


class KeySender(Protocol):
    def send(self, combo: str) -> None: ...  # "ctrl+c"
    def is_pressed(self, key: str) -> bool: ...  # "alt"
    def release(self, key: str) -> None: ...


class HotkeyRegistrar(Protocol):
    def register(self, hotkey: str, callback: Callable[[], None]) -> None: ...
    def clear(self) -> None: ...
    # optional: commit() after a batch of register() calls (pynput starts one listener for all)


# ---------------------------------------------------------------- keyboard (Windows, Linux root)
# Each modifier by side, in keyboard's names. keyboard.release("alt") releases only the FIRST key of the
# name (send() uses scan_codes[0]: left Alt), so a held right Alt / right Windows key is released by
# its own name. tests/test_tray_windows_keys.py holds these decisions.
SIDED = {m: (f"left {n}", f"right {n}") for m, n in
         (("ctrl", "ctrl"), ("alt", "alt"), ("shift", "shift"), ("win", "windows"))}


class KeyboardKeys:
    def __init__(self):
        import keyboard  # optional: tray extra (Windows/Linux root)

        self.kb = keyboard

    def send(self, combo: str) -> None:
        self.kb.send(to_keyboard(combo))

    def _pressed(self, name: str) -> bool:
        try:
            return bool(self.kb.is_pressed(name))
        except ValueError:  # a name this keyboard layout / OS backend does not map
            return False

    def is_pressed(self, key: str) -> bool:
        if key in SIDED:  # either side, or the plain name (a layout may map right Alt as "alt gr" only)
            return any(self._pressed(n) for n in SIDED[key]) or self._pressed({"win": "windows"}.get(key, key))
        return self._pressed(to_keyboard(key))

    def release(self, key: str) -> None:
        if key not in SIDED:
            self.kb.release(to_keyboard(key))
            return
        held = [n for n in SIDED[key] if self._pressed(n)]
        for n in held or [{"win": "windows"}.get(key, key)]:
            self.kb.release(n)


class KeyboardRegistrar:
    def __init__(self):
        import keyboard  # optional: tray extra (Windows/Linux root)

        self.kb = keyboard
        self._handles: list = []

    def register(self, hotkey: str, callback: Callable[[], None]) -> None:
        try:
            self._handles.append(self.kb.add_hotkey(to_keyboard(hotkey), callback, suppress=False))
        except ImportError as e:  # "You must be root to use this library on linux."
            raise HotkeyError(f"global hotkeys unavailable: {e}",
                              "on Linux run under X11 (pynput) or give access to /dev/input (root/uinput)") from None

    def clear(self) -> None:
        for h in self._handles:
            try:
                self.kb.remove_hotkey(h)
            except (KeyError, ValueError):
                pass
        self._handles.clear()


# ---------------------------------------------------------------- pynput (X11, macOS, fallback)
def stop_listener(listener, timeout: float = 2.0) -> None:
    """Stop a pynput listener and wait for its thread. On X11, pynput's stop() writes the XRecord disable request
    to the record connection, whose own thread sits blocked reading it: the request only leaves with the next key
    event, so stop() + join() waited out its timeout (2 s per hotkey change) and left the thread running. The same
    request sent and flushed on the listener's other connection ends it at once. Errors are ignored: Xlib may
    already have closed a connection."""
    try:
        listener.stop()
        d, ctx = getattr(listener, "_display_stop", None), getattr(listener, "_context", None)
        if d is not None and ctx is not None:  # pynput's xorg backend
            d.record_disable_context(ctx)
            d.flush()
    except Exception:
        pass
    try:
        listener.join(timeout)
    except Exception:
        pass


def wait_ready(listener, timeout: float = 2.0) -> bool:
    """Wait (at most timeout s) until a started pynput listener has its X connections and record context: a hotkey
    pressed before that is not seen (pynput's own wait() has no timeout, and a listener that failed never becomes
    ready). True when ready. The record context is enabled just after this point, so a key event right after it can
    still be missed by a few milliseconds on a loaded machine."""
    cond = getattr(listener, "_condition", None)
    if cond is None:
        return True
    with cond:
        return bool(cond.wait_for(lambda: getattr(listener, "_ready", True) or not listener.is_alive(), timeout)) \
            and listener.is_alive()


class PynputKeys:
    """Key presses through pynput; modifier state from a pynput listener."""

    def __init__(self):
        from pynput import keyboard as pk  # optional: tray extra (needs a display)

        self.pk = pk
        self.ctl = pk.Controller()
        self._down: set[str] = set()
        self._lock = threading.Lock()
        self._listener = pk.Listener(on_press=self._on(True), on_release=self._on(False))
        self._listener.daemon = True
        self._listener.start()
        wait_ready(self._listener)  # modifier state known from the first key on

    def _name(self, key) -> str:
        name = getattr(key, "name", None) or getattr(key, "char", None) or ""
        name = name.split("_")[0]  # ctrl_l -> ctrl, alt_gr -> alt
        return _ALIASES.get(name, name)

    def _on(self, down: bool):
        def cb(key):
            with self._lock:
                (self._down.add if down else self._down.discard)(self._name(key))
        return cb

    def _key(self, name: str):
        pk = self.pk
        special = {"ctrl": pk.Key.ctrl, "alt": pk.Key.alt, "shift": pk.Key.shift, "win": pk.Key.cmd}
        return special.get(name) or getattr(pk.Key, name, None) or name

    def send(self, combo: str) -> None:
        mods, key = parse_hotkey(combo)
        held = [self._key(m) for m in MODIFIERS if m in mods]
        for m in held:
            self.ctl.press(m)
        try:
            self.ctl.tap(self._key(key))
        finally:
            for m in reversed(held):
                self.ctl.release(m)

    def is_pressed(self, key: str) -> bool:
        with self._lock:
            return key in self._down

    def release(self, key: str) -> None:
        self.ctl.release(self._key(key))

    def close(self) -> None:
        stop_listener(self._listener)


class PynputRegistrar:
    """Collects hotkeys; commit() (re)starts one pynput GlobalHotKeys listener with all of them."""

    def __init__(self):
        from pynput import keyboard as pk  # optional: tray extra (needs a display)

        self.pk = pk
        self._map: dict[str, Callable] = {}
        self._listener = None

    def register(self, hotkey: str, callback: Callable[[], None]) -> None:
        self._map[to_pynput(hotkey)] = callback

    def commit(self) -> None:
        self._stop()
        if self._map:
            self._listener = self.pk.GlobalHotKeys(dict(self._map))
            self._listener.daemon = True
            self._listener.start()
            wait_ready(self._listener)  # hotkeys work when register_hotkeys returns, not some time after

    def _stop(self) -> None:
        if self._listener is not None:
            stop_listener(self._listener)
        self._listener = None

    def clear(self) -> None:
        self._stop()
        self._map = {}


def _order() -> list[str]:
    if sys.platform == "win32":
        return ["keyboard", "pynput"]
    if sys.platform == "darwin":
        return ["pynput"]
    if os.environ.get("WAYLAND_DISPLAY") and not os.environ.get("DISPLAY"):
        return ["keyboard"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    if os.environ.get("DISPLAY"):
        return ["pynput", "keyboard"]
    return ["keyboard"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []


def make_os_keys(prefer: str = "auto") -> tuple[KeySender, HotkeyRegistrar]:
    """The key sender and hotkey registrar for this OS, or HotkeyError with what to do."""
    order = [prefer] if prefer != "auto" else _order()
    errors = []
    for name in order:
        try:
            if name == "keyboard":
                return KeyboardKeys(), KeyboardRegistrar()
            return PynputKeys(), PynputRegistrar()
        except Exception as e:  # ImportError, Xlib display errors, permission errors
            errors.append(f"{name}: {e}")
    if sys.platform.startswith("linux") and os.environ.get("WAYLAND_DISPLAY"):
        fix = "Wayland blocks global hotkeys: run under an X11 session or as root, or use the tray menu"
    elif sys.platform.startswith("linux"):
        fix = "run under X11 (pynput), or as root / in the input group for /dev/input (keyboard)"
    else:
        fix = "pip install keyboard pynput"
    raise HotkeyError("global hotkeys are not available" + (f" ({'; '.join(errors)})" if errors else ""), fix)
