"""First start without the model: pull it (Ollama's registry / HF / PyPI, engine/hub/catalog.py), showing
progress in a notification and in the menu's status line, before the endpoint loads it.

A failed pull leaves the tray running: state "error", the reason in the status line, a notification
with the fix. engine.hub is torch-free, so the tray stays light.
"""
from __future__ import annotations

from collections.abc import Callable

from engine.errors import DeepInferError
from engine.hub import catalog

NOTIFY_EVERY = 25  # percent between progress notifications (the status line shows every percent)


def pull_if_missing(model: str, notify: Callable[[str, str], None], set_state: Callable[..., None]) -> bool:
    """True when `model` is ready to load (already here, not a registry name, or pulled now)."""
    if catalog.source(model) is None or catalog.is_pulled(model):
        return True
    last = {"pct": -1, "told": 0}

    def on_progress(done: int, total: int):
        pct = int(100 * done / max(total, 1))
        if pct == last["pct"]:
            return
        last["pct"] = pct
        line = f"{pct}% of " + (f"{total / 1e9:.1f} GB" if total >= 1e9 else f"{total / 1e6:.0f} MB")
        set_state("loading", f"downloading {model}: {line}")
        if pct >= last["told"] + NOTIFY_EVERY and pct < 100:
            last["told"] = pct - pct % NOTIFY_EVERY
            notify("Downloading the model", f"{model}: {line}")

    notify("Downloading the model", f"{model} is not on this computer yet: downloading it once "
                                    "(the tray is ready when it is done)")
    set_state("loading", f"downloading {model}")
    try:
        catalog.pull(model, quiet=True, on_progress=on_progress)
    except DeepInferError as e:
        set_state("error", f"download of {model} failed: {e}")
        notify("Model download failed", f"{e} The tray keeps running: retry with Start endpoint, "
                                        "or choose another model / a remote backend.")
        return False
    notify("Model downloaded", f"{model} is ready; loading it")
    return True
