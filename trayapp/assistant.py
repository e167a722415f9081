"""The hotkey flow: selection -> template -> backend -> paste / notify / window, one task at a time.

Threads: the hotkey library calls `trigger()` on its own thread; trigger starts a worker thread and
returns at once (never block a keyboard hook). A second trigger while a task runs is refused with
a "busy" notification (not queued: a queued task would copy whatever is selected seconds later,
which is rarely what the user meant). The user's text is never lost: the clipboard is restored
right after the copy, and on any error the selection is left untouched and the error notified.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.errors import DeepInferError
from trayapp import mapreduce, selection
from trayapp.clipboard import Clipboard
from trayapp.config import Template, TrayConfig
from trayapp.keys import KeySender
from trayapp.templates import render_messages


@dataclass(slots=True)
class Outcome:
    template: str
    status: str  # ok | empty | error | busy
    text: str = ""
    source: str = ""  # selection | clipboard | menu
    error: str = ""
    parts: int = 0  # map-reduce chunks summarized
    seconds: float = 0.0
    events: list[str] = field(default_factory=list)
    # time.monotonic() when each stage ended: key (hotkey callback), modifiers, copied, sent, first_token,
    # generated, paste_sent, restored (selection.py's recipe); stages() turns them into durations
    marks: dict[str, float] = field(default_factory=dict)
    usage: dict = field(default_factory=dict)  # the server's usage frame (server-side TTFT, cached tokens...)

    def stages(self) -> dict[str, float]:
        """Milliseconds per stage of the hotkey path (only those that ran). `http` is the client's time to the
        first token minus the server's own TTFT (request, SSE framing, loopback), when the server reports it."""
        m, out = self.marks, {}
        order = ["key", "modifiers", "copied", "sent", "first_token", "generated", "paste_sent", "restored"]
        names = {"modifiers": "modifier_wait", "copied": "copy", "sent": "render", "first_token": "to_first_token",
                 "generated": "generate", "paste_sent": "paste", "restored": "restore"}
        prev = None
        for k in order:
            if k in m and prev is not None:
                out[names[k]] = 1000 * (m[k] - (m["restore_wait"] if k == "restored" else m[prev]))
            if k in m:
                prev = k
        ttft = (self.usage.get("deepinfer") or {}).get("ttft_s")
        if ttft is not None and "to_first_token" in out:
            out["model_ttft"] = 1000 * ttft
            out["http"] = max(0.0, out["to_first_token"] - out["model_ttft"])
        return out


class Assistant:
    """Runs templates. backend() returns the current OpenAIBackend (it changes when the user switches).

    notify(title, message); set_state(state) with loading|ready|busy|error; open_window(title) ->
    an object with .append(delta), .done(error=None) or None when no window can be shown.
    """

    def __init__(self, cfg: TrayConfig, backend: Callable[[], object], clipboard: Clipboard, keys: KeySender,
                 notify: Callable[[str, str], None], set_state: Callable[[str], None] = lambda s: None,
                 open_window: Callable[[str], object | None] = lambda title: None,
                 context_tokens: Callable[[], int] = lambda: 4096):
        self.cfg = cfg
        self.backend = backend
        self.clip, self.keys = clipboard, keys
        self.notify, self.set_state, self.open_window = notify, set_state, open_window
        self.context_tokens = context_tokens
        self._busy = threading.Lock()
        self.current: str | None = None
        self.last: Outcome | None = None
        self.done = threading.Event()  # set after each finished task (tests wait on it)
        self.cancel = threading.Event()

    @property
    def busy(self) -> bool:
        return self._busy.locked()

    def trigger(self, template_id: str, hotkey: str = "", from_menu: bool = False) -> bool:
        """Start a task; False (and a 'busy' notification) if one is running."""
        if not self._busy.acquire(blocking=False):
            self.notify("DeepInfer is busy", f"still working on {self.current!r}; try again when it finishes")
            return False
        t_key = time.monotonic()
        self.current = template_id
        self.done.clear()
        self.cancel.clear()
        threading.Thread(target=self._run, args=(template_id, hotkey, from_menu, t_key), daemon=True,
                         name=f"tray-task-{template_id}").start()
        return True

    def _run(self, template_id: str, hotkey: str, from_menu: bool, t_key: float | None = None) -> None:
        t0 = time.perf_counter()
        out = Outcome(template_id, "error")
        try:
            out = self.run_task(self.cfg.template(template_id), hotkey, from_menu, t_key)
        except Exception as e:  # never let the worker die silently
            out.error = str(e)
            self.notify("DeepInfer error", out.error)
        finally:
            out.seconds = time.perf_counter() - t0
            self.last = out
            self.current = None
            self._busy.release()
            self.done.set()

    # ------------------------------------------------------------------ one task
    def run_task(self, tpl: Template, hotkey: str = "", from_menu: bool = False,
                 t_key: float | None = None) -> Outcome:
        out = Outcome(tpl.id, "error")
        marks = out.marks
        marks["key"] = t_key if t_key is not None else time.monotonic()
        if from_menu:  # focus is on the tray menu: there is no selection to copy, use the clipboard
            saved = self.clip.get()
            grab = selection.Grab(saved, "menu" if saved.strip() else "none", saved)
        else:
            if not selection.wait_modifiers_released(self.keys, hotkey):
                out.events.append("modifiers force-released")
            marks["modifiers"] = time.monotonic()
            grab = selection.grab_selection(self.clip, self.keys, self.cfg.copy_timeout_s)
        marks["copied"] = time.monotonic()
        out.source = grab.source
        if not grab.text.strip():
            out.status = "empty"
            self.notify(tpl.title, "Nothing selected and the clipboard is empty: select some text first.")
            return out
        self.set_state("busy")
        window = self.open_window(tpl.title) if tpl.output == "window" else None
        try:
            text = self._shrink(tpl, grab.text, out)
            messages = render_messages(tpl, text, self.cfg.lang)
            backend = self.backend()

            def on_delta(d: str) -> None:
                marks.setdefault("first_token", time.monotonic())
                if window:
                    window.append(d)
            marks["sent"] = time.monotonic()
            # prompt-lookup speculation: rewrite/translate/summary outputs copy much of the selection
            result = backend.chat(messages, tpl.max_tokens, tpl.temperature, on_delta=on_delta, cancel=self.cancel,
                                  speculative=True).strip()
            marks["generated"] = time.monotonic()
            out.usage = dict(getattr(backend, "last_usage", {}) or {})
            if not result:
                raise DeepInferError("the model returned an empty answer", "try again or switch the model")
        except Exception as e:
            self.clip.set(grab.saved)  # belt and braces: the user's clipboard, untouched selection
            out.error = str(e) if isinstance(e, DeepInferError) else f"{type(e).__name__}: {e}"
            if window:
                window.done(error=out.error)
            self.notify(f"{tpl.title} failed", out.error + " Your text and clipboard are unchanged.")
            self.set_state("error")
            return out
        out.text, out.status = result, "ok"
        self._deliver(tpl, result, grab, window, out)
        self.set_state("ready")
        return out

    def _shrink(self, tpl: Template, text: str, out: Outcome) -> str:
        """Map-reduce the text when the filled template would not fit the context."""
        ctx = self.context_tokens()
        if mapreduce.fits(render_messages(tpl, text, self.cfg.lang), tpl.max_tokens, ctx):
            return text
        overhead = sum(mapreduce.estimate_tokens(m["content"]) for m in render_messages(tpl, "", self.cfg.lang))
        room = ctx - tpl.max_tokens - overhead - mapreduce.CHAT_OVERHEAD
        backend = self.backend()

        def progress(done: int, total: int, rnd: int) -> None:
            out.parts += 1
            self.set_state("busy")
            self.notify(f"{tpl.title}: long text", f"summarizing part {done}/{total}"
                        + (f" (round {rnd})" if rnd > 1 else ""))

        def summarize(messages: list[dict], max_tokens: int) -> str:
            return backend.chat(messages, max_tokens, 0.0, cancel=self.cancel)

        self.notify(f"{tpl.title}: long text", f"~{mapreduce.estimate_tokens(text)} tokens > context {ctx}: "
                    "summarizing in parts first")
        return mapreduce.reduce_to_fit(text, room, ctx, summarize, progress)

    def _deliver(self, tpl: Template, result: str, grab: selection.Grab, window, out: Outcome) -> None:
        if tpl.output == "paste" and grab.source == "selection":
            selection.paste_over_selection(self.clip, self.keys, result, grab.saved, self.cfg.paste_restore_delay_s,
                                           out.marks)
            out.events.append("pasted")
        elif tpl.output == "window" and window is not None:
            window.done()
            out.events.append("window")
        else:  # notify, or paste without a selection to replace, or no window toolkit
            self.clip.set(result)
            out.events.append("copied")
            self.notify(tpl.title, _preview(result) + "\n(copied to the clipboard)")


def _preview(text: str, n: int = 240) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"
