"""`deepinfer bench --runs hotkey`: the tray's hotkey path as a user feels it, on a real X server.

Under its own Xvfb (never the user's desktop): a Tk app holds a selected sentence, xdotool presses each
template's hotkey, the real tray (trayapp.app.TrayApp: pynput hotkey and Ctrl+C / Ctrl+V, the real
clipboard through xclip) runs the template against our server (the real model, loopback HTTP). Per run the
stages, in milliseconds (trayapp/assistant.py Outcome.stages):

    hook           xdotool pressed -> the tray's hotkey callback ran
    modifier_wait  -> the hotkey's modifiers were up (the user's fingers; xdotool releases at once)
    copy           -> the selection was copied (save clipboard, Ctrl+C, poll, restore)
    render         -> the request was sent (template filled, map-reduce check)
    to_first_token -> the first token arrived = model_ttft (server: queue + prefill) + http (the rest)
    generate       -> the last token arrived (model time)
    paste          -> Ctrl+V sent (clipboard set to the result)
    paste_visible  result ready (end of generate) -> the target app had the text (its own clock:
                   time.monotonic() is system-wide), so it includes paste
    restore        -> the user's clipboard was back (after the configured paste_restore_delay_s, which
                      the target app needs to read the clipboard and the user does not wait for)
p50 / p95 per template and stage go into the JSON; `non_model_p50_ms` lists the stages that are not model
time. Needs Xvfb, xdotool and xclip (apt-get install xvfb xdotool xclip) and the tray extra.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engine.bench.envinfo import emit_json, environment
from engine.config import EngineConfig
from engine.errors import ResourceError
from engine.server.app import start_background_server
from trayapp.app import TrayApp
from trayapp.clipboard import SystemClipboard
from trayapp.config import default_config
from trayapp.keys import make_os_keys

NON_MODEL = ("hook", "modifier_wait", "copy", "render", "http", "paste", "paste_visible", "restore")
SELECTED = "明天下午三点前把实验报告发给导师，并抄送课题组的其他同学。"
TK_APP = r"""
import json, sys, time, tkinter as tk
out, text = sys.argv[1], sys.argv[2]
root = tk.Tk(); root.geometry("900x60+0+0")
e = tk.Entry(root, width=120); e.pack(fill="both", expand=True)
e.insert(0, "Dear prof, " + text + " Thanks.")
e.selection_range(11, 11 + len(text)); e.icursor(11)
def paste(ev):  # like most editors: the paste replaces the selection
    try: e.delete("sel.first", "sel.last")
    except tk.TclError: pass
    e.insert("insert", root.clipboard_get(type="UTF8_STRING"))
    open(out, "a", encoding="utf-8").write(json.dumps({"pasted": time.monotonic(), "text": e.get()}) + "\n")
    return "break"
e.bind("<Control-v>", paste)
def ready():
    e.focus_force(); open(out, "a", encoding="utf-8").write(json.dumps({"ready": time.monotonic()}) + "\n")
root.after(200, ready); root.mainloop()
"""


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    i = min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))
    return xs[i]


def _events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _wait(cond, timeout: float, what: str):
    t_end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > t_end:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.005)


class _Xvfb:
    def __enter__(self):
        self.p = subprocess.Popen(["Xvfb", "-displayfd", "1", "-screen", "0", "1000x200x24"], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)
        self.old = os.environ.get("DISPLAY")
        os.environ["DISPLAY"] = ":" + self.p.stdout.readline().strip()
        return self

    def __exit__(self, *exc):
        if self.old is None:
            os.environ.pop("DISPLAY", None)
        else:
            os.environ["DISPLAY"] = self.old
        self.p.terminate()
        self.p.wait(5)


class _Window:
    """The tray's output window at the OS edge: records when the first text became visible."""

    def __init__(self, sink: dict):
        self.sink = sink

    def append(self, delta: str):
        self.sink.setdefault("window_first", time.monotonic())

    def done(self, error=None):
        self.sink["window_done"] = time.monotonic()


def run_hotkey(model: str, device: str = "cpu", repeats: int = 5, max_tokens: int = 48, lang: str = "zh",
               templates: list[str] | None = None, progress=lambda m: None, cpu_weights: str | None = None) -> dict:
    """cpu_weights: EngineConfig.cpu_weights of the server; None = the tray's [backend] cpu_weights (what a user's
    tray runs: int8 by default)."""
    missing = [t for t in ("Xvfb", "xdotool", "xclip") if not shutil.which(t)]
    if missing:
        raise ResourceError(f"the hotkey bench needs {', '.join(missing)}", "apt-get install xvfb xdotool xclip")

    cfg = default_config(lang)
    cfg.copy_timeout_s, cfg.paste_restore_delay_s = 1.0, 0.3
    for t in cfg.templates:
        t.max_tokens = min(t.max_tokens, max_tokens)  # CPU budget: the non-model stages do not depend on it
    tids = templates or [t.id for t in cfg.templates if t.hotkey]
    # the engine as the tray runs it: its [backend] cpu_weights (int8 by default) on a machine without a GPU
    cpu_weights = cpu_weights or cfg.backend.cpu_weights or "dense"
    server = start_background_server(EngineConfig(model=model, device=device, port=0, max_context=2048,
                                                  max_batch=2, cpu_weights=cpu_weights))
    rows: dict[str, list[dict]] = {t: [] for t in tids}
    notes: list = []
    try:
        url = server.url.rstrip("/")
        with _Xvfb(), tempfile.TemporaryDirectory() as tmp:
            cfg.backend.kind, cfg.backend.url = "remote", url + "/v1"
            clip = SystemClipboard()
            clip.set("USER CLIPBOARD")
            keys, registrar = make_os_keys("pynput")
            sink: dict = {}
            app = TrayApp(cfg, clipboard=clip, keys=keys, registrar=registrar,
                          notify=lambda title, msg: notes.append((time.monotonic(), title, msg)),
                          open_window=lambda title: _Window(sink))
            app.remote.deepinfer = True  # our server behind the "remote" URL: usage + speculation fields
            app.refresh(wait_ready=True)
            app.choice = "remote"
            app.warm_templates()  # what the tray does once its endpoint is ready
            app.register_hotkeys()
            time.sleep(0.5)  # the XRecord listener starts asynchronously
            try:
                for r in range(repeats):
                    for tid in tids:
                        try:
                            row = _one(app, cfg.template(tid), Path(tmp) / f"{tid}-{r}.jsonl", sink)
                        except TimeoutError as e:  # recorded, not fatal: the other runs still count
                            row = {"status": "timeout", "error": str(e)}
                        rows[tid].append(row)
                        progress(f"hotkey {tid} #{r + 1}: " + ", ".join(
                            f"{k} {v:.0f}" for k, v in rows[tid][-1].items() if isinstance(v, float)))
            finally:
                registrar.clear()
                keys.close()
                display = getattr(keys.ctl, "_display", None)
                if display is not None:
                    display.close()  # before Xvfb goes (pynput's __del__ would close it later)
                    del keys.ctl._display
    finally:
        server.stop()
    return {"schema": "deepinfer-hotkey/1", "model": model, "device": device,
            "cpu_weights": cpu_weights if device == "cpu" else None, "repeats": repeats, "max_tokens_cap": max_tokens,
            "paste_restore_delay_s": cfg.paste_restore_delay_s,
            "selection": SELECTED, "templates": _summary(rows), "runs": rows}


def _one(app, tpl, out: Path, sink: dict) -> dict:
    sink.clear()
    tk = subprocess.Popen([sys.executable, "-c", TK_APP, str(out), SELECTED])
    try:
        _wait(lambda: any("ready" in e for e in _events(out)), 20, "the Tk app")
        subprocess.run(["xdotool", "mousemove", "100", "30"], check=True)
        time.sleep(0.3)  # mapped and focused (a loaded machine can be slow to)
        a = app.assistant
        a.last = None
        t_press = time.monotonic()
        subprocess.run(["xdotool", "key", _xdotool(tpl.hotkey)], check=True)
        _wait(lambda: a.last is not None, 300, f"the {tpl.id} task")
        last = a.last
        row: dict = {"status": last.status, "source": last.source, "output": tpl.output,
                     "completion_tokens": (last.usage or {}).get("completion_tokens"),
                     "cached_tokens": ((last.usage or {}).get("deepinfer") or {}).get("cached_tokens"),
                     "hook": 1000 * (last.marks["key"] - t_press)}
        row.update(last.stages())
        if tpl.output == "paste" and last.status == "ok" and "pasted" in last.events:
            _wait(lambda: any("pasted" in e for e in _events(out)), 10, "the paste")
            pasted = next(e for e in _events(out) if "pasted" in e)
            # the result ready -> the target app holds it (clipboard set, Ctrl+V, the app's paste handler)
            row["paste_visible"] = 1000 * (pasted["pasted"] - last.marks["generated"])
            row["key_to_paste_visible"] = 1000 * (pasted["pasted"] - t_press)
        if "window_first" in sink:
            row["key_to_first_visible"] = 1000 * (sink["window_first"] - t_press)
        if "generated" in last.marks:
            row["key_to_done"] = 1000 * (last.marks["generated"] - t_press)
        return row
    finally:
        tk.terminate()
        tk.wait(5)


def _xdotool(hotkey: str) -> str:
    return "+".join({"win": "super", "ctrl": "ctrl", "alt": "alt", "shift": "shift"}.get(p, p)
                    for p in hotkey.lower().split("+"))


def _summary(rows: dict[str, list[dict]]) -> dict:
    out = {}
    for tid, rs in rows.items():
        keys = sorted({k for r in rs for k, v in r.items() if isinstance(v, float)})
        st = {k: {"p50_ms": round(_pct([r[k] for r in rs if k in r], 50), 1),
                  "p95_ms": round(_pct([r[k] for r in rs if k in r], 95), 1),
                  "n": sum(1 for r in rs if k in r)} for k in keys}
        out[tid] = {"ok": sum(1 for r in rs if r["status"] == "ok"), "runs": len(rs), "stages": st,
                    "selection_copied": sum(1 for r in rs if r.get("source") == "selection"),
                    "non_model_p50_ms": {k: st[k]["p50_ms"] for k in NON_MODEL if k in st},
                    "max_non_model_p50_ms": max((st[k]["p50_ms"] for k in NON_MODEL if k in st), default=0.0)}
    return out


def main(args, progress=print) -> int:
    res = run_hotkey(args.model or "qwen2.5-coder-0.5b", "cpu" if args.device == "auto" else args.device,
                     args.hotkey_repeats, args.max_tokens or 48, progress=progress,
                     cpu_weights=getattr(args, "cpu_weights", None))
    res["env"] = environment(sys.argv[1:])
    emit_json(res, args.out, progress)
    for tid, s in res["templates"].items():
        progress(f"{tid:10s} ok {s['ok']}/{s['runs']}  non-model p50 (ms): " +
                 ", ".join(f"{k} {v:.0f}" for k, v in s["non_model_p50_ms"].items()))
    return 0 if all(s["ok"] == s["runs"] for s in res["templates"].values()) else 1
