"""The OS edge for the clipboard (text only), behind a two-method protocol so tests can fake it."""
from __future__ import annotations

from typing import Protocol

from engine.errors import DeepInferError


class ClipboardError(DeepInferError):
    """No usable clipboard (Linux without xclip/xsel/wl-clipboard, no display...)."""


class Clipboard(Protocol):
    def get(self) -> str: ...
    def set(self, text: str) -> None: ...


class SystemClipboard:
    """pyperclip; Linux needs xclip or xsel (X11) or wl-clipboard (Wayland)."""

    def __init__(self):
        import pyperclip  # optional: tray extra

        self.pc = pyperclip
        self.get()  # fail now, with the fix, rather than at the first hotkey

    def _wrap(self, fn, *a):
        try:
            return fn(*a)
        except self.pc.PyperclipException as e:
            raise ClipboardError(f"no clipboard access ({str(e).splitlines()[0][:120]})",
                                 "install xclip or xsel (X11) or wl-clipboard (Wayland)") from None

    def get(self) -> str:
        return self._wrap(self.pc.paste) or ""

    def set(self, text: str) -> None:
        self._wrap(self.pc.copy, text)
