"""Hotkey -> copy -> template -> REAL engine (0.5B over the real HTTP server) -> paste/notify -> restore.

Fakes only at the OS edge (tests/test_tray_support.py). Small max_tokens keep this file fast.
"""
from __future__ import annotations

from test_tray_support import (APP_PASTE_DELAY_S, FakeClipboard, FakeDesktop, FakeRegistrar, Notes,  # noqa: F401
                               server, small_config)
from trayapp.app import TrayApp
from trayapp.backend import OpenAIBackend

SELECTION = "明天下午三点前把实验报告发给导师，并附上结果表格。"


def make_app(server_url: str | None, *, selection=SELECTION, clipboard="USER CLIPBOARD", hold=None,
             context_tokens=0, windows=None):
    cfg = small_config(context_tokens, url=(server_url + "/v1") if server_url else "http://127.0.0.1:1/v1")
    clip = FakeClipboard(clipboard)
    desk = FakeDesktop(clip, document=f"Dear prof, {selection} Thanks.", selection=selection, hold=hold)
    reg, notes = FakeRegistrar(), Notes()

    def open_window(title):
        if windows is None:
            return None
        w = FakeWindow()
        windows.append(w)
        return w
    app = TrayApp(cfg, clipboard=clip, keys=desk, registrar=reg, notify=notes, open_window=open_window)
    app.register_hotkeys()
    return app, clip, desk, reg, notes


class FakeWindow:
    def __init__(self):
        self.deltas, self.finished, self.error = [], False, None

    def append(self, d):
        self.deltas.append(d)

    def done(self, error=None):
        self.finished, self.error = True, error


def fire_and_wait(app, reg, hotkey, timeout=60):
    assert reg.fire(hotkey) is True
    assert app.assistant.done.wait(timeout), "task did not finish"
    return app.assistant.last


def test_paste_flow_restores_clipboard_only_after_the_paste(server):
    app, clip, desk, reg, notes = make_app(server.url)
    assert set(reg.hotkeys) == {"alt+win+e", "alt+win+s", "alt+win+q"}
    out = fire_and_wait(app, reg, "alt+win+e")
    assert out.status == "ok", notes.text()
    assert out.source == "selection" and out.events == ["pasted"]
    # the app pasted the model's answer (not the old clipboard) over the selection
    assert desk.pasted == [out.text] and out.text and out.text != SELECTION
    assert desk.document == f"Dear prof, {out.text} Thanks."
    # ordering: Ctrl+C, Ctrl+V; the user's clipboard comes back only after the app read it
    combos = [c for _, c, _ in desk.events]
    assert combos == ["ctrl+c", "ctrl+v"]
    t_paste = desk.events[1][0]
    t_restore = [t for t, text in clip.log if text == "USER CLIPBOARD"][-1]
    assert t_restore >= t_paste + APP_PASTE_DELAY_S
    assert clip.get() == "USER CLIPBOARD"
    assert app.state == "ready" and not notes


def test_waits_for_hotkey_modifiers_before_ctrl_c(server):
    app, clip, desk, reg, notes = make_app(server.url, hold={"win": 0.25, "alt": 0.35})
    out = fire_and_wait(app, reg, "alt+win+s")
    assert out.status == "ok" and out.source == "selection", notes.text()
    t_copy, combo, held = desk.events[0]
    assert combo == "ctrl+c" and held == frozenset()  # a plain Ctrl+C, not Ctrl+Win+Alt+C
    assert not desk.forced
    assert clip.get() == out.text  # notify mode: the answer is copied, and notified
    assert notes[-1][0] == "Summarize" and out.text[:20] in notes[-1][1]


def test_stuck_modifiers_are_released_by_us(server):
    app, clip, desk, reg, notes = make_app(server.url, hold={"alt": 60.0})
    out = fire_and_wait(app, reg, "alt+win+s")
    assert desk.forced == ["alt"] and "modifiers force-released" in out.events
    assert out.status == "ok" and out.source == "selection"


def test_no_selection_falls_back_to_clipboard_text(server):
    app, clip, desk, reg, notes = make_app(server.url, selection="", clipboard="The meeting moved to Friday 10am.")
    out = fire_and_wait(app, reg, "alt+win+e")  # paste template, but nothing selected to replace
    assert out.status == "ok" and out.source == "clipboard"
    assert desk.pasted == [] and out.events == ["copied"] and clip.get() == out.text


def test_nothing_selected_and_empty_clipboard(server):
    app, clip, desk, reg, notes = make_app(server.url, selection="", clipboard="")
    served = app.backend().health()["served"]
    out = fire_and_wait(app, reg, "alt+win+s")
    assert out.status == "empty" and "select some text" in notes.text()
    assert app.backend().health()["served"] == served  # the engine was not called
    assert app.state != "busy"


def test_engine_down_keeps_the_users_text():
    app, clip, desk, reg, notes = make_app(None)  # backend URL with nothing listening
    before = desk.document
    out = fire_and_wait(app, reg, "alt+win+e")
    assert out.status == "error" and "cannot reach" in out.error
    assert desk.document == before and desk.pasted == []
    assert clip.get() == "USER CLIPBOARD"
    assert "unchanged" in notes.text() and app.state == "error"


def test_second_hotkey_while_busy_is_refused(server):
    app, clip, desk, reg, notes = make_app(server.url)
    assert reg.fire("alt+win+e") is True
    assert reg.fire("alt+win+s") is False  # still grabbing/generating the first
    assert "busy" in notes.text()
    assert app.assistant.done.wait(60)
    assert app.assistant.last.template == "rewrite" and app.assistant.last.status == "ok"
    assert desk.pasted == [app.assistant.last.text]
    assert not app.assistant.busy  # free again for the next hotkey


def test_window_mode_streams_deltas(server):
    windows = []
    app, clip, desk, reg, notes = make_app(server.url, selection="What is 2+2? Answer with a number.",
                                           windows=windows)
    out = fire_and_wait(app, reg, "alt+win+q")
    assert out.status == "ok" and out.events == ["window"]
    (w,) = windows
    assert w.finished and w.error is None and "".join(w.deltas).strip() == out.text
    assert clip.get() == "USER CLIPBOARD"  # window mode leaves the clipboard alone


def test_long_text_is_summarized_in_parts(server):
    para = ("The quarterly report covers sales in the northern region, which rose by twelve percent, "
            "while costs of shipping grew faster than planned because fuel prices went up in May. ")
    long_text = "\n".join(f"Section {i}: " + para * 2 for i in range(1, 3))  # ~130 estimated tokens each
    app, clip, desk, reg, notes = make_app(server.url, selection=long_text, context_tokens=250)
    out = fire_and_wait(app, reg, "alt+win+s", timeout=240)
    assert out.status == "ok", notes.text()
    assert out.parts >= 2  # several chunks went through the model first
    progress = [m for t, m in notes if "long text" in t]
    assert progress[0].startswith("~") and any("summarizing part 1/" in m for m in progress)
    assert out.text and clip.get() == out.text


def test_backend_health_models_and_switch(server):
    b = OpenAIBackend(server.url + "/v1")
    h = b.health()
    assert h["state"] == "ready" and h["device"] == "cpu"
    (mid,) = b.models()
    b.switch_model(mid)
    assert b.model == mid
    bad = OpenAIBackend(server.url + "/v1", model="no-such-model")
    try:
        bad.chat([{"role": "user", "content": "hi"}], 2)
        raise AssertionError("expected a BackendError")
    except Exception as e:
        assert "404" in str(e) and mid in str(e)
