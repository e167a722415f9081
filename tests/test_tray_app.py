"""TrayApp + menu against the real server: status/VRAM line from /health, backend radio items and
switching, endpoint start/stop, pause hotkeys, degraded tray backends (pystray's dummy backend
stands in for the OS tray; everything behind it is real)."""
from __future__ import annotations

import socket
import types

import pytest

from test_tray_support import FakeClipboard, FakeDesktop, FakeRegistrar, Notes, server, small_config  # noqa: F401
from trayapp.app import REMOTE, TrayApp
from trayapp.backend import BackendError, LocalEndpoint, OpenAIBackend


@pytest.fixture(scope="module")
def pystray():
    import os

    os.environ["PYSTRAY_BACKEND"] = "dummy"
    import pystray

    return pystray


def local_app(port: int, endpoint=None, remote_url="http://127.0.0.1:1/v1"):
    cfg = small_config(url=remote_url)
    be = cfg.backend
    be.kind, be.port, be.model, be.models = "local", port, "qwen2.5-coder-0.5b", {"qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b"}
    clip = FakeClipboard("")
    desk = FakeDesktop(clip, "doc sel", "sel")
    reg, notes = FakeRegistrar(), Notes()
    app = TrayApp(cfg, clipboard=clip, keys=desk, registrar=reg, notify=notes,
                  endpoint=endpoint or LocalEndpoint(be.model, port))
    return app, reg, notes, desk


def test_menu_status_and_backend_items(server, pystray):
    from trayapp.tray import menu_lines

    app, reg, notes, _ = local_app(server.port)
    app.start(endpoint=False)
    app.start_endpoint(wait=True)  # finds the running DeepInfer server on the port and reuses it
    assert app.endpoint.external and app.state == "ready", notes.text()
    assert set(reg.hotkeys) == {"alt+win+e", "alt+win+s", "alt+win+q"}
    lines = menu_lines(pystray, app)
    assert lines[0].startswith("ready · qwen2.5-coder-0.5b · cpu") and lines[0].endswith("(disabled)")
    assert "改写    Win+Alt+E" in lines and "Quick ask    Win+Alt+Q" in lines
    assert "  (•) qwen2.5-coder-0.5b" in lines and "  ( ) Remote: http://127.0.0.1:1/v1" in lines
    assert f"Stop endpoint (127.0.0.1:{server.port})" in lines and "[ ] Pause hotkeys" in lines


def test_vram_line_from_health():
    app, *_ = local_app(1, endpoint=types.SimpleNamespace(running=True, url="http://127.0.0.1:1/v1"))
    app.health = {"state": "ready", "model": "qwen2.5-3b", "resident": ["qwen2.5-3b"], "device": "cuda",
                  "vram": {"used_mb": 2150, "total_mb": 4096}}
    app.state = "ready"
    assert app.status_line() == "ready · qwen2.5-3b · cuda · VRAM 2.1/4.0 GB"


def test_switch_to_remote_and_back(server, pystray):
    app, reg, notes, desk = local_app(server.port)
    app.start(endpoint=False)
    app.start_endpoint(wait=True)
    app.cfg.backend.url = "http://127.0.0.1:1/v1"
    app.choose(REMOTE)  # nothing listens there: refused, still local
    _wait(lambda: any(t == "Switch failed" for t, _ in notes))
    assert app.choice == "qwen2.5-coder-0.5b" and "cannot reach" in notes.text()
    app.remote = OpenAIBackend(server.url + "/v1")  # a "remote" OpenAI-compatible URL (same protocol)
    app.choose(REMOTE)
    _wait(lambda: any(t == "Backend switched" for t, _ in notes))
    assert app.choice == REMOTE and app.remote.model == "qwen2.5-coder-0.5b"
    assert reg.fire("alt+win+s") and app.assistant.done.wait(60)
    assert app.assistant.last.status == "ok" and app.assistant.last.source == "selection"


def test_pause_hotkeys(server):
    app, reg, notes, _ = local_app(server.port)
    app.register_hotkeys()
    app.toggle_pause()
    assert reg.hotkeys == {} and app.paused
    app.toggle_pause()
    assert len(reg.hotkeys) == 3 and not app.paused


def test_endpoint_start_and_stop(llm):
    from engine.server.app import ServerThread

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    seen = []

    def starter(cfg):
        seen.append(cfg)
        return ServerThread(cfg, llm=llm).start()
    ep = LocalEndpoint("qwen2.5-coder-0.5b", port, starter=starter, served=["big=/nowhere/qwen2.5-7b"])
    app, reg, notes, _ = local_app(port, endpoint=ep)
    app.start_endpoint(wait=True)
    assert ep.running and not ep.external and app.state == "ready", notes.text()
    assert seen[0].port == port and seen[0].served_models == ["big=/nowhere/qwen2.5-7b"]
    # the loaded model, then the configured one; every other model pulled into the user's cache follows
    # (a CI cache that kept the 1.5B from another run lists it too)
    assert app.server_models[:2] == ["qwen2.5-coder-0.5b", "big"] and "big" in app.model_choices()
    app.choose("big")  # configured but its checkpoint is missing: refused, the old model stays
    _wait(lambda: any(t == "Switch failed" for t, _ in notes))
    assert app.choice == "qwen2.5-coder-0.5b" and "cannot switch to big" in notes.text()
    assert "/nowhere/qwen2.5-7b" in notes.text()
    assert app.backend().health()["state"] == "ready"
    assert app.backend().health()["state"] == "ready"
    app.stop_endpoint()
    assert not ep.running and app.status_line().startswith("endpoint stopped")
    with pytest.raises(BackendError, match="cannot reach"):
        app.backend().health()


def test_degraded_tray_backend_without_menu(pystray, capsys):
    from trayapp.tray import TrayUI

    class NoMenuIcon(pystray.Icon):
        HAS_MENU = HAS_MENU_RADIO = HAS_NOTIFICATION = False

    fake = types.SimpleNamespace(Icon=NoMenuIcon, Menu=pystray.Menu, MenuItem=pystray.MenuItem)
    app, *_ = local_app(1)
    ui = TrayUI(app, fake)
    ui.notify("t", "hello")
    err = capsys.readouterr().err
    assert "has no menu" in err and "cannot show notifications" in err and "[t] hello" in err
    app.set_state("busy")  # redraws without a menu
    assert ui.icon.icon.size == (64, 64)


def _wait(cond, timeout=60.0):
    import time

    t_end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < t_end, "timed out"
        time.sleep(0.05)
