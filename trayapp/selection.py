"""Grabbing the selection and pasting over it, through the clipboard (desktop.md's recipe).

grab:  wait for the hotkey's modifiers to be released (else Ctrl+C becomes Ctrl+Alt+C) ->
       save the clipboard -> clear it -> send Ctrl+C -> poll for new text up to copy_timeout_s ->
       fall back to the saved clipboard text -> restore the saved clipboard.
paste: set the result -> send Ctrl+V -> wait -> THEN restore the saved clipboard (restoring too
       early makes the app paste the old text).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from trayapp.clipboard import Clipboard
from trayapp.keys import PRIMARY, KeySender, parse_hotkey


@dataclass(slots=True)
class Grab:
    text: str  # what the task runs on ("" = nothing selected and empty clipboard)
    source: str  # "selection" | "clipboard" | "none"
    saved: str  # the user's clipboard before the hotkey, restored afterwards


def wait_modifiers_released(keys: KeySender, hotkey: str, timeout_s: float = 1.0, poll_s: float = 0.01) -> bool:
    """Wait until every modifier of `hotkey` is up; after timeout_s release them ourselves.
    Returns True if the user released them in time."""
    if not hotkey:
        return True
    mods, _ = parse_hotkey(hotkey)
    deadline = time.monotonic() + timeout_s
    while True:
        held = [m for m in mods if keys.is_pressed(m)]
        if not held:
            return True
        if time.monotonic() >= deadline:
            for m in held:
                keys.release(m)
            return False
        time.sleep(poll_s)


def grab_selection(clip: Clipboard, keys: KeySender, timeout_s: float = 1.5, poll_s: float = 0.02) -> Grab:
    saved = clip.get()
    clip.set("")
    keys.send(f"{PRIMARY}+c")
    deadline = time.monotonic() + timeout_s
    text = ""
    while time.monotonic() < deadline:
        text = clip.get()
        if text:
            break
        time.sleep(poll_s)
    clip.set(saved)  # the clipboard is the user's again until we paste
    if text.strip():
        return Grab(text, "selection", saved)
    if saved.strip():
        return Grab(saved, "clipboard", saved)
    return Grab("", "none", saved)


def paste_over_selection(clip: Clipboard, keys: KeySender, result: str, saved: str, delay_s: float = 0.5,
                         marks: dict | None = None) -> None:
    """marks (optional) gets time.monotonic() at paste_sent (Ctrl+V sent) and restored; the delay_s wait between
    them is for the target app, which reads the clipboard asynchronously (not the user's wait: the text is
    already pasted), so it is kept out of the restore stage (restore_wait)."""
    marks = {} if marks is None else marks
    clip.set(result)
    keys.send(f"{PRIMARY}+v")
    marks["paste_sent"] = time.monotonic()
    time.sleep(delay_s)  # the target app reads the clipboard asynchronously
    marks["restore_wait"] = time.monotonic()
    clip.set(saved)
    marks["restored"] = time.monotonic()
