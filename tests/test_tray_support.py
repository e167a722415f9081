"""Fakes at the OS edge only (clipboard, key sender, hotkey registrar, notifications) and the real
server fixture for the tray tests. The fakes model what a real desktop does: a focused app copies
the selection a little after Ctrl+C, sees Ctrl+Alt+C (and copies nothing) while the hotkey's
modifiers are held, and reads the clipboard a little after Ctrl+V."""
from __future__ import annotations

import threading
import time

import pytest

from trayapp.config import parse_config

APP_COPY_DELAY_S = 0.05  # the focused app answers Ctrl+C asynchronously
APP_PASTE_DELAY_S = 0.1  # ... and reads the clipboard this long after Ctrl+V


class FakeClipboard:
    def __init__(self, text: str = ""):
        self.text = text
        self.log: list[tuple[float, str]] = []  # (time, text set)
        self.lock = threading.Lock()

    def get(self) -> str:
        with self.lock:
            return self.text

    def set(self, text: str) -> None:
        with self.lock:
            self.text = text
            self.log.append((time.monotonic(), text))


class FakeDesktop:
    """The focused app (a document with a selection) plus the keyboard state; a KeySender."""

    def __init__(self, clip: FakeClipboard, document: str = "", selection: str = "",
                 hold: dict[str, float] | None = None):
        self.clip = clip
        self.document, self.selection = document, selection
        now = time.monotonic()
        self.release_at = {k: now + v for k, v in (hold or {}).items()}  # modifier -> release time
        self.events: list[tuple[float, str, frozenset]] = []  # (time, combo, modifiers held)
        self.pasted: list[str] = []
        self.forced: list[str] = []

    def _held(self) -> frozenset:
        now = time.monotonic()
        return frozenset(k for k, t in self.release_at.items() if t > now)

    def is_pressed(self, key: str) -> bool:
        return key in self._held()

    def release(self, key: str) -> None:
        self.forced.append(key)
        self.release_at[key] = 0.0

    def send(self, combo: str) -> None:
        held = self._held()
        self.events.append((time.monotonic(), combo, held))
        if held:  # Ctrl+Alt+C is not "copy": the app ignores it
            return
        if combo == "ctrl+c" and self.selection:
            threading.Timer(APP_COPY_DELAY_S, self.clip.set, args=(self.selection,)).start()
        elif combo == "ctrl+v":
            def paste():
                text = self.clip.get()
                self.pasted.append(text)
                self.document = self.document.replace(self.selection, text, 1)
            threading.Timer(APP_PASTE_DELAY_S, paste).start()


class FakeRegistrar:
    def __init__(self):
        self.hotkeys: dict = {}

    def register(self, hotkey, callback):
        self.hotkeys[hotkey] = callback

    def clear(self):
        self.hotkeys = {}

    def fire(self, hotkey: str) -> bool:
        return self.hotkeys[hotkey]()  # called on the "hook" thread = the test thread


class Notes(list):
    def __call__(self, title: str, message: str) -> None:
        self.append((title, message))

    def text(self) -> str:
        return "\n".join(f"{t}: {m}" for t, m in self)


def small_config(context_tokens: int = 0, url: str = "http://127.0.0.1:1/v1"):
    """The default templates with small max_tokens (CPU test budget) and quick timings."""
    cfg, issues = parse_config(f"""
[tray]
copy_timeout_s = 0.6
paste_restore_delay_s = 0.3
[backend]
kind = "remote"
url = "{url}"
context_tokens = {context_tokens}
[[templates]]
id = "rewrite"
title = "改写"
hotkey = "win+alt+e"
output = "paste"
max_tokens = 16
system = "你是一个文字编辑。只输出改写后的文字，不要解释。"
prompt = "用{{lang}}改写下面的文字：\\n\\n{{text}}"
[[templates]]
id = "summarize"
title = "Summarize"
hotkey = "win+alt+s"
output = "notify"
max_tokens = 12
prompt = "Summarize in {{lang}}, one sentence:\\n\\n{{text}}"
[[templates]]
id = "quick_ask"
title = "Quick ask"
hotkey = "win+alt+q"
output = "window"
max_tokens = 12
prompt = "{{text}}"
""")
    assert not issues, issues
    return cfg


@pytest.fixture(scope="module")
def server(llm):
    """The real gateway (uvicorn thread + engine thread) on a free loopback port, reusing `llm`."""
    from engine.config import EngineConfig
    from engine.server.app import ServerThread

    with ServerThread(EngineConfig(model=llm.cfg.model, device="cpu", port=0), llm=llm) as srv:
        yield srv
