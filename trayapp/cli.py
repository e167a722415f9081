"""`deepinfer tray` / `python -m trayapp`: build the TrayApp from config.toml + flags and run the icon."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from engine.errors import DeepInferError
from engine.hub import store  # torch-free
from engine.logs import setup_logging
from trayapp.clipboard import ClipboardError, SystemClipboard
from trayapp.config import load_config
from trayapp.keys import HotkeyError, make_os_keys
from trayapp.window import open_window


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, default=None, help="config file (default: the user's config.toml)")
    p.add_argument("--lang", choices=["zh", "en"], default=None,
                   help="language of the default templates written on first run (default: from the locale)")
    p.add_argument("--backend", choices=["local", "remote"], default=None, help="override [backend] kind")
    p.add_argument("--url", default=None, help="remote OpenAI-compatible base URL (implies --backend remote)")
    p.add_argument("--model", default=None, help="local model id or argument to load first")
    p.add_argument("--no-endpoint", action="store_true", help="do not start the local endpoint at launch")
    p.add_argument("--no-hotkeys", action="store_true", help="tray menu only")
    p.add_argument("--keys", choices=["auto", "keyboard", "pynput"], default="auto", help="hotkey library")
    p.add_argument("--print-config", action="store_true", help="print the templates and config problems, exit")
    p.add_argument("--print-menu", action="store_true", help="print the tray menu as text, exit")


class _NoKeys:
    """Stands in when hotkeys/key simulation are unavailable: menu tasks still work on the clipboard."""

    def __init__(self, err: DeepInferError):
        self.err = err

    def send(self, combo):
        raise self.err

    def is_pressed(self, key):
        return False

    def release(self, key):
        pass


class _NoClipboard:
    def __init__(self, err: DeepInferError):
        self.err = err

    def get(self):
        raise self.err

    def set(self, text):
        raise self.err


def _pick_model(cfg, override: str | None, say) -> None:
    """Keep the configured model, or fall back to a pulled 0.5B when its checkpoint is missing."""
    be = cfg.backend
    if override:
        be.model = override
    arg = be.model_arg(be.model)
    looks_like_path = "/" in arg or "\\" in arg or arg.endswith(".gguf")
    if looks_like_path and not Path(arg).expanduser().exists():
        fallback = next((n for n in store.KNOWN_MODELS if store.is_pulled(n)), None)
        if fallback:
            say("Model not found", f"{be.model}: {arg} does not exist (deepinfer export ... --out {arg}); "
                f"using {fallback}")
            be.models.setdefault(fallback, fallback)
            be.model = fallback


def build_app(args, notify=None, pystray=None):
    from trayapp.app import TrayApp  # httpx (tray extra): tray --help / --print-config run without it

    cfg, issues = load_config(args.config, args.lang)
    if args.url:
        cfg.backend.url, cfg.backend.kind = args.url, "remote"
    if args.backend:
        cfg.backend.kind = args.backend
    if args.no_hotkeys:
        cfg.hotkeys = False
    messages: list[tuple[str, str]] = []
    say = notify or (lambda t, m: messages.append((t, m)))
    _pick_model(cfg, args.model, say)
    try:
        clipboard = SystemClipboard()
    except ClipboardError as e:
        clipboard = _NoClipboard(e)
        say("Clipboard unavailable", str(e))
    keys, registrar = None, None
    if cfg.hotkeys:
        try:
            keys, registrar = make_os_keys(args.keys)
        except HotkeyError as e:
            say("Hotkeys unavailable", f"{e} The tray menu still works.")
    if keys is None:
        keys = _NoKeys(HotkeyError("key simulation is unavailable here", "use the tray menu on clipboard text"))
    app = TrayApp(cfg, clipboard=clipboard, keys=keys, registrar=registrar, notify=say,
                  open_window=open_window, issues=issues)
    return app, messages


def run(args) -> int:
    if args.print_config:
        cfg, issues = load_config(args.config, args.lang)
        print(f"config: {cfg.path}")
        for t in cfg.templates:
            print(f"  {t.id:<10} {t.title:<10} {t.hotkey or '-':<12} {t.output:<6} max_tokens={t.max_tokens}")
        for i in issues:
            print(f"  problem: {i}")
        return 1 if issues else 0
    if args.print_menu:
        os.environ.setdefault("PYSTRAY_BACKEND", "dummy")
        args.no_hotkeys = True
    from trayapp.tray import TrayUI, import_pystray, menu_lines  # PIL (tray icon): --print-config runs without it

    pystray = import_pystray()
    app, early = build_app(args)
    if args.print_menu:
        print("\n".join(menu_lines(pystray, app)))
        return 0
    setup_logging("tray")  # rotating file in the log dir: a tray runs for weeks without a console
    ui = TrayUI(app, pystray)
    for title, msg in early:
        ui.notify(title, msg)
    print(f"deepinfer tray: {len(app.cfg.templates)} templates, config {app.cfg.path}", file=sys.stderr)
    ui.run(start_endpoint=not args.no_endpoint)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trayapp", description="DeepInfer tray assistant")
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return run(args)
    except DeepInferError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
