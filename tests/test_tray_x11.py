"""End to end on a real X server: a real global hotkey (pynput/XRecord, pressed with xdotool), real
Ctrl+C / Ctrl+V (pynput/XTest) into a real Tk app holding a selection, the real clipboard (pyperclip
+ xclip), the real server and 0.5B model. Runs under its own Xvfb (never the user's desktop);
skipped where Xvfb/xdotool/xclip are missing."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from test_tray_support import Notes, server, small_config  # noqa: F401

# Always our own Xvfb: xdotool must never type into a developer's real desktop.
pytestmark = pytest.mark.skipif(not (shutil.which("xdotool") and shutil.which("xclip") and shutil.which("Xvfb")),
                                reason="needs Xvfb, xdotool and xclip")

TK_APP = r"""
import sys, tkinter as tk
out = sys.argv[1]
root = tk.Tk(); root.geometry("700x60+0+0")
e = tk.Entry(root, width=90); e.pack(fill="both", expand=True)
e.insert(0, "Dear prof, 明天下午三点前把实验报告发给导师。 Thanks.")
e.selection_range(11, 11 + len("明天下午三点前把实验报告发给导师。")); e.icursor(11)
def paste(ev):  # like most editors: the paste replaces the selection
    try: e.delete("sel.first", "sel.last")
    except tk.TclError: pass
    e.insert("insert", root.clipboard_get(type="UTF8_STRING")); return "break"
e.bind("<Control-v>", paste)
def dump():
    open(out, "w", encoding="utf-8").write(e.get()); root.after(100, dump)
root.after(100, dump); root.after(200, e.focus_force); root.mainloop()
"""


@pytest.fixture(scope="module")
def display():
    xvfb = subprocess.Popen(["Xvfb", "-displayfd", "1", "-screen", "0", "800x200x24"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    disp = ":" + xvfb.stdout.readline().strip()  # Xvfb picks a free display number
    old = os.environ.get("DISPLAY")
    os.environ["DISPLAY"] = disp
    try:
        yield disp
    finally:
        import threading
        if old is None:
            del os.environ["DISPLAY"]
        else:
            os.environ["DISPLAY"] = old
        xvfb.terminate()
        xvfb.wait(5)
        # pynput's XRecord listener may only end when its X server goes, with a ConnectionClosedError in its
        # last flush: wait for it here, inside this module's teardown (filtered below), not in a later test
        for t in _pynput_threads():
            if t is not threading.current_thread():
                t.join(10)


# pynput's xorg listener threads raise ConnectionClosedError when stopped mid-read; harmless at exit
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_real_hotkey_copy_paste_restore(display, server, tmp_path):
    from trayapp.app import TrayApp
    from trayapp.clipboard import SystemClipboard
    from trayapp.keys import make_os_keys

    out = tmp_path / "entry.txt"
    tk_app = subprocess.Popen([sys.executable, "-c", TK_APP, str(out)])
    keys = registrar = None
    try:
        _wait(lambda: out.exists() and out.read_text(encoding="utf-8"), 15)
        subprocess.run(["xdotool", "mousemove", "100", "30"], check=True)
        clip = SystemClipboard()
        clip.set("USER CLIPBOARD")
        keys, registrar = make_os_keys("pynput")
        notes = Notes()
        cfg = small_config(url=server.url + "/v1")
        # the real X server, xdotool and Tk answer Ctrl+C quickly on an idle machine, but on a busy 2-core CI one the
        # fake-test 0.6 s once fell back to the clipboard: allow what a slow desktop may need (the product: 1.5 s); 5 s
        # once ran out too, with two compilers busy on the same two cores (the test passed 3 of 3 right after, idle)
        cfg.copy_timeout_s = 10.0
        app = TrayApp(cfg, clipboard=clip, keys=keys, registrar=registrar,
                      notify=notes)
        app.register_hotkeys()  # returns when the listener is ready (keys.wait_ready)
        # the XRecord context is enabled just after the listener reports ready: on a loaded 2-core CI machine a key
        # sent at once was missed (the run waited 120 s for a task that never started); press again if nothing started
        for _ in range(3):
            time.sleep(0.3)
            subprocess.run(["xdotool", "key", "super+alt+e"], check=True)  # the rewrite template, paste mode
            if _poll(lambda: app.assistant.busy or app.assistant.last is not None, 10):
                break
        _wait(lambda: app.assistant.last is not None, 120)
        last = app.assistant.last
        assert last.status == "ok" and last.source == "selection", (last, notes.text())
        want = f"Dear prof, {last.text} Thanks."
        # Tk writes the entry on its own key events: on a loaded 2-core CI machine that took over 5 s once
        _wait(lambda: out.read_text(encoding="utf-8") == want, 20,
              lambda: f"entry {out.read_text(encoding='utf-8')!r}, expected {want!r}")
        assert clip.get() == "USER CLIPBOARD"  # restored after the paste
        # the hotkey path's stages were recorded (deepinfer bench --runs hotkey reports their p50/p95)
        st = last.stages()
        assert {"modifier_wait", "copy", "render", "to_first_token", "generate", "paste", "restore"} <= st.keys(), st
        assert all(v >= 0 for v in st.values()), st
        assert st["copy"] < 1000 and st["paste"] < 1000 and st["restore"] < 1000, st  # seconds would be a hang
    finally:
        if registrar is not None:
            registrar.clear()
            keys.close()
            keys.ctl._display.close()  # now, before Xvfb goes away (pynput's __del__ would close it later)
            del keys.ctl._display
        tk_app.terminate()
        tk_app.wait(5)


def _poll(cond, timeout) -> bool:
    t_end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() >= t_end:
            return False
        time.sleep(0.05)
    return True


def _wait(cond, timeout, what=lambda: ""):
    assert _poll(cond, timeout), f"timed out {what()}"


def _pynput_threads():
    import threading
    return [t for t in threading.enumerate() if type(t).__module__.startswith("pynput") and t.is_alive()]


def test_hotkey_rebind_and_close_end_the_listeners_at_once(display):
    """Changing the hotkeys restarts the XRecord listener: the old one must end at once (pynput's own stop()
    only ends it at the next key event: 2 s per change and a thread left behind), and closing ends them all."""
    from trayapp.keys import make_os_keys

    before = len(_pynput_threads())
    keys, registrar = make_os_keys("pynput")
    try:
        registrar.register("win+alt+q", lambda: None)
        registrar.commit()
        time.sleep(0.3)
        t0 = time.monotonic()
        registrar.register("win+alt+e", lambda: None)
        registrar.commit()  # a rebind: stop the old listener, start one with both keys
        assert time.monotonic() - t0 < 1.0
        _wait(lambda: len(_pynput_threads()) == before + 2, 2, lambda: str(_pynput_threads()))  # keys' + new one
    finally:
        t0 = time.monotonic()
        registrar.clear()
        keys.close()
        assert time.monotonic() - t0 < 1.0
        keys.ctl._display.close()
        del keys.ctl._display
    _wait(lambda: len(_pynput_threads()) == before, 2, lambda: str(_pynput_threads()))
