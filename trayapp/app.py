"""TrayApp: the tray's state and actions (backend choice, endpoint, hotkeys, config), UI-free.

tray.py binds it to a pystray icon; tests drive it directly. `on_change()` is called after every
state change so the UI can redraw the icon and rebuild the menu.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from engine.errors import DeepInferError
from trayapp.assistant import Assistant
from trayapp.backend import BackendError, LocalEndpoint, OpenAIBackend
from trayapp.config import ConfigIssue, TrayConfig, load_config
from trayapp.first_pull import pull_if_missing
from trayapp.keys import HotkeyError, canonical
from trayapp.templates import render_messages

REMOTE = "remote"


class TrayApp:
    def __init__(self, cfg: TrayConfig, *, clipboard, keys, registrar, notify: Callable[[str, str], None],
                 endpoint: LocalEndpoint | None = None, open_window=lambda title: None,
                 issues: list[ConfigIssue] | None = None):
        self.cfg = cfg
        self.keys, self.registrar = keys, registrar
        self._notify = notify
        self.on_change: Callable[[], None] = lambda: None
        self.state = "loading"
        self.message = ""  # last error / progress, shown in the menu's status line
        self.health: dict = {}
        self.server_models: list[str] = []
        self.paused = not cfg.hotkeys
        be = cfg.backend
        self.choice = REMOTE if be.kind == "remote" else be.model  # a local model id, or REMOTE
        self.endpoint = endpoint or LocalEndpoint(
            be.model_arg(be.model), be.port, served=[f"{m}={be.model_arg(m)}" for m in be.models if m != be.model],
            gguf_pack=be.gguf_pack, cpu_weights=be.cpu_weights)
        self.local = OpenAIBackend(self.endpoint.url, model="", deepinfer=True)
        self.remote = OpenAIBackend(be.url, be.api_key, be.remote_model)
        self.assistant = Assistant(cfg, self.backend, clipboard, keys, self.notify, self.set_state, open_window,
                                   self.context_tokens)
        for issue in issues or []:
            self.notify("config.toml has a problem", f"{issue} (defaults kept)")

    # ------------------------------------------------------------------ small helpers
    def notify(self, title: str, message: str) -> None:
        self._notify(title, message)

    def set_state(self, state: str, message: str = "", poll: bool = False) -> None:
        if poll and self.assistant.busy:  # a task owns the icon while it runs
            return
        self.state = "paused" if state == "ready" and self.paused else state
        self.message = message
        self.on_change()

    def backend(self) -> OpenAIBackend:
        return self.remote if self.choice == REMOTE else self.local

    def context_tokens(self) -> int:
        return self.cfg.backend.context_tokens or int(self.health.get("max_context") or 4096)

    def status_line(self) -> str:
        """'ready · qwen2.5-3b · cuda · VRAM 2.1/4.0 GB' from the last GET /health."""
        h = self.health
        if self.choice == REMOTE:
            parts = [self.state, f"remote {self.remote.base_url}", self.remote.model or "?"]
        else:
            model = (h.get("resident") or [h.get("model") or self.choice])[0]
            own = self.state in ("busy", "error", "paused")  # the tray's own state wins over the server's
            parts = [self.state if own else h.get("state") or self.state, model]
            if h.get("device") not in (None, "", "auto"):
                parts.append(h["device"])
            v = h.get("vram") or {}
            if v.get("total_mb"):
                parts.append(f"VRAM {v['used_mb'] / 1024:.1f}/{v['total_mb'] / 1024:.1f} GB")
            if not self.endpoint.running:
                parts = ["endpoint stopped"]
        line = " · ".join(str(p) for p in parts)
        return line + (f" · {self.message}" if self.message else "")

    # ------------------------------------------------------------------ lifecycle
    def start(self, endpoint: bool = True) -> None:
        self.register_hotkeys()
        if self.choice != REMOTE and endpoint:
            self.start_endpoint()
        else:
            threading.Thread(target=self.refresh, daemon=True).start()

    def register_hotkeys(self) -> None:
        if self.registrar is None:
            return
        self.registrar.clear()
        if self.paused:
            return
        try:
            for t in self.cfg.templates:
                if t.hotkey:
                    self.registrar.register(canonical(t.hotkey), self._hotkey_cb(t.id, t.hotkey))
            getattr(self.registrar, "commit", lambda: None)()
        except HotkeyError as e:
            self.notify("Hotkeys unavailable", str(e) + " The tray menu still works.")
        except Exception as e:  # a hook library failing must not take the tray down
            self.notify("Hotkeys unavailable", f"{type(e).__name__}: {e}. The tray menu still works.")

    def _hotkey_cb(self, tid: str, hotkey: str):
        return lambda: self.assistant.trigger(tid, hotkey)

    def start_endpoint(self, wait: bool = False) -> None:
        def go():
            if not self.endpoint.running and not pull_if_missing(self.endpoint.model, self.notify, self.set_state):
                return  # the error is in the status line; the tray keeps running
            self.set_state("loading", "starting the endpoint")
            try:
                self.local.base_url = self.endpoint.start()
                self.refresh(wait_ready=True)
                self.warm_templates()
            except DeepInferError as e:
                self.set_state("error", str(e))
                self.notify("Endpoint failed", str(e))
        t = threading.Thread(target=go, daemon=True, name="tray-endpoint")
        t.start()
        if wait:
            t.join()

    def warm_templates(self) -> None:
        """Prefill each template's fixed part once (max_tokens=1) so that the server's prefix cache holds it:
        the first hotkey then prefills only the selection. Best effort: a failure only costs that speed-up."""
        b = self.backend()
        if not b.deepinfer or self.state == "error":  # only our server has a prefix cache to warm
            return
        for t in self.cfg.templates:
            # a sample text in each language: {lang} = auto / opposite resolve from the selection's language
            variants = {str(render_messages(t, s, self.cfg.lang)): s for s in ("中文", "English")}
            try:
                for s in variants.values():
                    b.chat(render_messages(t, s, self.cfg.lang), max_tokens=1)
            except DeepInferError:
                return

    def stop_endpoint(self) -> None:
        self.endpoint.stop()
        self.health = {}
        self.set_state("error" if self.choice != REMOTE else self.state, "endpoint stopped")

    def refresh(self, wait_ready: bool = False, timeout_s: float = 600.0) -> None:
        """Poll /health and /v1/models of the current backend; update state."""

        t_end = time.monotonic() + timeout_s
        while True:
            try:
                b = self.backend()
                self.health = b.health()
                self.server_models = b.models()
            except BackendError as e:
                self.set_state("error", e.message, poll=True)
                return
            if self.choice != REMOTE and self.choice not in self.server_models and \
                    self.health.get("model") in self.server_models:
                self.choice = self.health["model"]  # e.g. --model path/x.gguf is served as "x"
            st = self.health.get("state", "ready")
            if st in ("starting", "loading") and wait_ready and time.monotonic() < t_end:
                self.set_state("loading", poll=True)
                time.sleep(0.5)
                continue
            if st == "error":
                self.set_state("error", self.health.get("error", "the model failed to load"))
                self.notify("Model failed to load", self.message + " Choose another model in the tray menu.")
            else:
                self.set_state("ready" if st not in ("starting", "loading") else "loading", poll=True)
            return

    # ------------------------------------------------------------------ menu actions
    def model_choices(self) -> list[str]:
        ids = list(self.cfg.backend.models)
        return ids + [m for m in self.server_models if m not in ids]

    def choose(self, choice: str) -> None:
        """Switch backend: a local model id (the server loads it on the first request) or REMOTE."""
        if choice == self.choice or self.assistant.busy:
            if self.assistant.busy:
                self.notify("DeepInfer is busy", "switch the model when the current task finishes")
            return
        old = self.choice
        self.choice = choice

        def go():
            self.set_state("loading", f"switching to {choice}")
            try:
                if choice == REMOTE:
                    self.remote.resolve_model()
                else:
                    if not self.endpoint.running:
                        self.local.base_url = self.endpoint.start()
                    self.local.switch_model(choice)
                self.refresh()
                self.warm_templates()
                self.notify("Backend switched", f"now using {self.status_line()}")
            except DeepInferError as e:
                self.choice = old
                self.set_state("error", str(e))
                self.notify("Switch failed", f"{e} Still using {old}.")
        threading.Thread(target=go, daemon=True, name="tray-switch").start()

    def toggle_pause(self) -> None:
        self.paused = not self.paused
        self.register_hotkeys()
        self.set_state("ready" if self.state in ("ready", "paused") else self.state)
        self.notify("Hotkeys", "paused" if self.paused else "active again")

    def reload_config(self) -> None:
        cfg, issues = load_config(self.cfg.path)
        self.cfg.templates, self.cfg.lang = cfg.templates, cfg.lang
        self.cfg.copy_timeout_s, self.cfg.paste_restore_delay_s = cfg.copy_timeout_s, cfg.paste_restore_delay_s
        for issue in issues:
            self.notify("config.toml has a problem", f"{issue} (defaults kept)")
        self.register_hotkeys()
        self.on_change()

    def open_config(self) -> None:
        path = Path(self.cfg.path or "")
        try:
            if sys.platform == "win32":
                os.startfile(path)  # noqa: S606 - opens the user's editor
            else:
                subprocess.Popen(["open" if sys.platform == "darwin" else "xdg-open", str(path)])
        except OSError as e:
            self.notify("Cannot open the config file", f"{path}: {e}")

    def quit(self) -> None:
        if self.registrar is not None:
            self.registrar.clear()
        self.assistant.cancel.set()
        self.endpoint.stop()
