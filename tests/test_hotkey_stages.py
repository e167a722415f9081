"""The hotkey path's stage arithmetic (trayapp/assistant.py Outcome.stages, engine/bench/hotkey.py summary):
durations between the recorded marks, the configured restore wait kept out, model TTFT split from HTTP."""
from __future__ import annotations

from engine.bench.hotkey import NON_MODEL, _summary, _xdotool
from trayapp.assistant import Outcome


def test_stages_from_marks():
    o = Outcome("rewrite", "ok")
    o.marks = {"key": 10.0, "modifiers": 10.01, "copied": 10.04, "sent": 10.041, "first_token": 10.5,
               "generated": 11.5, "paste_sent": 11.51, "restore_wait": 11.81, "restored": 11.814}
    o.usage = {"deepinfer": {"ttft_s": 0.4}}
    st = o.stages()
    exp = {"modifier_wait": 10, "copy": 30, "render": 1, "to_first_token": 459, "generate": 1000, "paste": 10,
           "restore": 4, "model_ttft": 400, "http": 59}
    assert st.keys() == exp.keys()
    assert all(abs(st[k] - v) < 0.01 for k, v in exp.items()), st
    # a remote server without our usage frame: no split, the rest still there
    o.usage = {}
    assert "http" not in o.stages() and "copy" in o.stages()


def test_summary_p50_and_non_model():
    rows = {"rewrite": [{"status": "ok", "source": "selection", "copy": float(c), "http": 50.0, "generate": 900.0}
                        for c in (10, 20, 30, 40, 1000)]}
    s = _summary(rows)["rewrite"]
    assert s["ok"] == 5 and s["selection_copied"] == 5
    assert s["stages"]["copy"]["p50_ms"] == 30 and s["stages"]["copy"]["p95_ms"] == 1000
    assert s["non_model_p50_ms"] == {"copy": 30.0, "http": 50.0} and s["max_non_model_p50_ms"] == 50
    assert "generate" not in NON_MODEL
    assert _xdotool("win+alt+e") == "super+alt+e"
