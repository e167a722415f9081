"""The Windows hotkey adapter (trayapp/keys.py KeyboardKeys / KeyboardRegistrar over the `keyboard`
package) as decisions: key names for Win+Alt+letter, no suppression, the modifier-release wait,
and what is injected when the user still holds the keys. Only the OS edge is fake: a `keyboard`
module that behaves like keyboard 0.13.5 where it matters (names; `release(name)` lets go of the
FIRST key of a name only, as its send() uses scan_codes[0]; `is_pressed(name)` is true for any key
of the name). The rest is the real adapter, the real selection flow and keyboard's own name table.
"""
from __future__ import annotations

import sys
import types

import pytest

from trayapp import keys as K
from trayapp import selection

# keyboard's names -> the physical keys they cover (first = what release()/send() use)
KEYS = {"alt": ["left alt", "right alt"], "ctrl": ["left ctrl", "right ctrl"], "shift": ["left shift", "right shift"],
        "windows": ["left windows", "right windows"]}


class FakeKeyboard(types.ModuleType):
    def __init__(self):
        super().__init__("keyboard")
        self.down: set[str] = set()  # physical keys held
        self.log: list[tuple] = []  # what the adapter made the OS do, in order
        self.hotkeys: dict[int, tuple] = {}

    def _keys(self, name: str) -> list[str]:
        if name in KEYS:
            return KEYS[name]
        if name.startswith(("left ", "right ")) or len(name) == 1 or name in ("enter", "escape", "space"):
            return [name]
        raise ValueError(f"Key {name!r} is not mapped to any known key.")

    def is_pressed(self, name: str) -> bool:
        return any(k in self.down for k in self._keys(name))

    def release(self, name: str) -> None:
        k = self._keys(name)[0]
        self.log.append(("release", k))
        self.down.discard(k)

    def send(self, combo: str) -> None:
        for part in combo.split("+"):
            self._keys(part)  # every part must be a name keyboard knows
        self.log.append(("send", combo, frozenset(self.down)))  # the app sees combo + whatever is still down

    def add_hotkey(self, hotkey, callback, args=(), suppress=False, timeout=1, trigger_on_release=False):
        for part in hotkey.split("+"):
            self._keys(part)
        h = len(self.hotkeys) + 1
        self.hotkeys[h] = (hotkey, callback, suppress, trigger_on_release)
        return h

    def remove_hotkey(self, h):
        del self.hotkeys[h]


@pytest.fixture
def kb(monkeypatch):
    fake = FakeKeyboard()
    monkeypatch.setitem(sys.modules, "keyboard", fake)
    monkeypatch.setattr(sys, "platform", "win32")
    return fake


def test_key_names_are_keyboards_own(kb):
    """Win+Alt+Q -> "alt+windows+q": the names keyboard's table maps on Windows (win/command -> windows)."""
    from keyboard_names import normalize_name  # the real package's pure name table (see fixture below)

    assert K.to_keyboard("Win+Alt+Q") == "alt+windows+q"
    assert K.to_keyboard("ctrl+shift+1") == "ctrl+shift+1"
    for part in K.to_keyboard("win+alt+ctrl+shift+q").split("+"):
        assert normalize_name(part) == part
    assert normalize_name("win") == "windows" and normalize_name("left win") == "left windows"
    for pair in K.SIDED.values():  # the sided names the adapter releases are canonical too
        assert all(normalize_name(n) == n for n in pair), pair


@pytest.fixture(autouse=True)
def keyboard_names(monkeypatch):
    """keyboard._canonical_names is pure data; importing the package itself needs the OS hook (root on
    Linux), so the table module is loaded on its own as `keyboard_names`."""
    import importlib.util
    spec = importlib.util.find_spec("keyboard")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("keyboard is not installed (tray extra)")
    path = next(iter(spec.submodule_search_locations)) + "/_canonical_names.py"
    mod = types.ModuleType("keyboard_names")
    src = open(path, encoding="utf-8").read()
    exec(compile(src, path, "exec"), mod.__dict__)
    monkeypatch.setitem(sys.modules, "keyboard_names", mod)


def test_registration_does_not_suppress(kb):
    """suppress=False: the hook only watches, keys still reach the focused app (keyboard's suppress mode
    has to hold back and replay every key event system-wide); trigger on press, not release."""
    reg = K.KeyboardRegistrar()
    fired = []
    reg.register("win+alt+q", lambda: fired.append(1))
    (hotkey, cb, suppress, on_release), = kb.hotkeys.values()
    assert hotkey == "alt+windows+q" and suppress is False and on_release is False
    cb()
    assert fired == [1]
    reg.clear()
    assert kb.hotkeys == {}
    reg.clear()  # twice is fine


def test_released_in_time_copy_is_plain_ctrl_c(kb):
    keys = K.KeyboardKeys()
    kb.down = {"left windows", "left alt"}
    assert keys.is_pressed("win") and keys.is_pressed("alt") and not keys.is_pressed("ctrl")
    kb.down.clear()  # the user lets go before the wait ends
    assert selection.wait_modifiers_released(keys, "win+alt+q", timeout_s=0.05)
    keys.send("ctrl+c")
    assert kb.log == [("send", "ctrl+c", frozenset())]


@pytest.mark.parametrize("held", [{"left windows", "left alt"}, {"right windows", "right alt"},
                                  {"left windows", "right alt", "q"}])
def test_keys_still_held_are_released_before_ctrl_c(kb, held):
    """After the wait the adapter lets go of each held modifier by its own side, so Ctrl+C does not
    arrive as Ctrl+Win+Alt+C (plain keyboard.release("alt") would only release the LEFT Alt)."""
    keys = K.KeyboardKeys()
    kb.down = set(held)
    assert not selection.wait_modifiers_released(keys, "win+alt+q", timeout_s=0.05, poll_s=0.01)
    keys.send("ctrl+c")
    mods_up = [e[1] for e in kb.log if e[0] == "release"]
    assert sorted(mods_up) == sorted(k for k in held if k != "q")  # the letter is left alone
    assert kb.log[-1] == ("send", "ctrl+c", frozenset(held & {"q"}))  # no modifier is down any more


def test_paste_is_ctrl_v_and_the_plain_release_pitfall(kb):
    keys = K.KeyboardKeys()
    keys.send("ctrl+v")
    assert kb.log == [("send", "ctrl+v", frozenset())]
    kb.down = {"right alt"}
    kb.release("alt")  # what the adapter did before: keyboard releases the first key of "alt" only
    assert kb.is_pressed("alt")
    keys.release("alt")
    assert not kb.is_pressed("alt")


def test_unmapped_names_do_not_crash(kb):
    """A layout/backend that does not map a sided name (keyboard raises ValueError) reads as not held."""
    keys = K.KeyboardKeys()
    orig = kb._keys
    kb._keys = lambda n: (_ for _ in ()).throw(ValueError(n)) if n == "right alt" else orig(n)
    kb.down = {"left alt"}
    assert keys.is_pressed("alt")
    keys.release("alt")
    assert not keys.is_pressed("alt")


def test_windows_prefers_keyboard_then_pynput(monkeypatch, kb):
    monkeypatch.setattr(K.sys, "platform", "win32")
    assert K._order() == ["keyboard", "pynput"]
    sender, reg = K.make_os_keys()
    assert isinstance(sender, K.KeyboardKeys) and isinstance(reg, K.KeyboardRegistrar)
