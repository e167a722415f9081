"""pystray binding: the icon (state colour), its menu, notifications, and the degraded modes.

pystray picks its backend at import (PYSTRAY_BACKEND: win32, darwin, appindicator, gtk, xorg,
dummy) and fails at import without a display, so it is imported here, lazily. The xorg backend has
no menu, no radio items and no notifications: we check Icon.HAS_MENU / HAS_MENU_RADIO /
HAS_NOTIFICATION and fall back (stderr messages, a click runs quick ask, radio -> check marks).
"""
from __future__ import annotations

import sys
import threading

from engine.errors import DeepInferError
from trayapp.app import REMOTE, TrayApp
from trayapp.icons import make_icon


def import_pystray():
    try:
        import pystray  # optional: tray extra; fails without a display
    except Exception as e:  # ImportError, or Xlib's DisplayNameError without $DISPLAY
        raise DeepInferError(f"no system tray available ({type(e).__name__}: {str(e)[:160]})",
                             "run inside a desktop session; on Linux set PYSTRAY_BACKEND=gtk or appindicator "
                             "(pip install PyGObject) or xorg") from None
    return pystray


def pretty_hotkey(h: str) -> str:
    """'alt+win+q' -> 'Win+Alt+Q' (the order users write it in)."""
    if not h:
        return ""
    order = {"win": 0, "ctrl": 1, "alt": 2, "shift": 3}
    parts = sorted(h.split("+"), key=lambda p: order.get(p, 9))
    return "+".join(p.capitalize() if len(p) > 1 else p.upper() for p in parts)


def build_menu(pystray, app: TrayApp, icon_ref: list):
    """The tray menu; callables are re-evaluated on update_menu()."""
    Item, Menu = pystray.MenuItem, pystray.Menu
    radio = getattr(pystray.Icon, "HAS_MENU_RADIO", False)

    def task_item(t):
        label = f"{t.title}" + (f"\t{pretty_hotkey(t.hotkey)}" if t.hotkey else "")
        return Item(label, lambda icon, item: app.assistant.trigger(t.id, from_menu=True),
                    enabled=lambda item: not app.assistant.busy)

    def model_item(mid):
        return Item(mid, lambda icon, item: app.choose(mid), checked=lambda item: app.choice == mid, radio=radio)

    def backend_menu():
        items = [model_item(m) for m in app.model_choices()]
        items += [Menu.SEPARATOR,
                  Item(f"Remote: {app.cfg.backend.url}", lambda icon, item: app.choose(REMOTE),
                       checked=lambda item: app.choice == REMOTE, radio=radio)]
        return Menu(*items)

    def endpoint_label(item):
        port = app.cfg.backend.port
        return f"Stop endpoint (127.0.0.1:{port})" if app.endpoint.running else f"Start endpoint on 127.0.0.1:{port}"

    def toggle_endpoint(icon, item):
        app.stop_endpoint() if app.endpoint.running else app.start_endpoint()

    def quit_(icon, item):
        app.quit()
        icon.stop()

    return Menu(
        Item(lambda item: app.status_line(), None, enabled=False),
        Menu.SEPARATOR,
        *[task_item(t) for t in app.cfg.templates],
        Menu.SEPARATOR,
        Item("Backend", backend_menu()),
        Item(endpoint_label, toggle_endpoint),
        Item("Pause hotkeys", lambda icon, item: app.toggle_pause(), checked=lambda item: app.paused),
        Item("Open config file", lambda icon, item: app.open_config()),
        Item("Reload config", lambda icon, item: app.reload_config()),
        Menu.SEPARATOR,
        Item("Quit", quit_),
    )


class TrayUI:
    """Owns the pystray Icon; run() blocks the calling (main) thread."""

    def __init__(self, app: TrayApp, pystray=None):
        self.pystray = pystray or import_pystray()
        self.app = app
        Icon = self.pystray.Icon
        self.has_menu = getattr(Icon, "HAS_MENU", False)
        self.has_notify = getattr(Icon, "HAS_NOTIFICATION", False)
        ref: list = []
        menu = build_menu(self.pystray, app, ref) if self.has_menu else self.pystray.Menu(
            self.pystray.MenuItem("Quick ask", lambda icon, item: self._default_action(), default=True,
                                  visible=False))
        self.icon = Icon("deepinfer", make_icon(app.state), "DeepInfer", menu)
        ref.append(self.icon)
        app._notify = self.notify
        app.on_change = self.redraw
        self._stop = threading.Event()
        if not self.has_menu:
            print("deepinfer tray: this tray backend has no menu (pystray xorg); hotkeys work, a click runs "
                  "the first template, and `deepinfer tray --print-menu` shows the menu. For a menu: "
                  "PYSTRAY_BACKEND=gtk or appindicator with PyGObject.", file=sys.stderr)
        if not self.has_notify:
            print("deepinfer tray: this tray backend cannot show notifications; they go to stderr.", file=sys.stderr)

    def _default_action(self):
        if self.app.cfg.templates:
            self.app.assistant.trigger(self.app.cfg.templates[0].id, from_menu=True)

    def notify(self, title: str, message: str) -> None:
        if self.has_notify:
            try:
                self.icon.notify(message, title)
                return
            except Exception:  # a missing notification daemon must not break a task
                pass
        print(f"[{title}] {message}", file=sys.stderr, flush=True)

    def redraw(self) -> None:
        self.icon.icon = make_icon(self.app.state)
        self.icon.title = f"DeepInfer: {self.app.status_line()}"[:120]  # Windows caps tooltips at 128
        if self.has_menu:
            try:
                self.icon.update_menu()
            except Exception:
                pass

    def _poll(self) -> None:
        while not self._stop.wait(5.0):
            if not self.app.assistant.busy and self.app.state != "loading":
                self.app.refresh()

    def run(self, start_endpoint: bool = True) -> None:
        def setup(icon):
            icon.visible = True
            self.app.start(endpoint=start_endpoint)
            threading.Thread(target=self._poll, daemon=True, name="tray-health").start()

        try:
            self.icon.run(setup=setup)
        finally:
            self._stop.set()


def menu_lines(pystray, app: TrayApp) -> list[str]:
    """The menu as text (for backends without a menu, docs and tests)."""
    out = []

    def walk(menu, depth):
        for item in menu.items:
            if item is pystray.Menu.SEPARATOR:
                out.append("  " * depth + "----")
                continue
            if not item.visible:
                continue
            mark = ""
            if item.checked is not None:
                mark = ("(•) " if item.radio else "[x] ") if item.checked else ("( ) " if item.radio else "[ ] ")
            out.append("  " * depth + mark + item.text.replace("\t", "    ") + ("" if item.enabled else " (disabled)"))
            if item.submenu:
                walk(item.submenu, depth + 1)

    walk(build_menu(pystray, app, []), 0)
    return out
