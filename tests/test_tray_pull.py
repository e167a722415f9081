"""Tray first start without the model: the default (qwen2.5:3b) is pulled from a loopback Ollama registry
(tests/fake_hubs.py) with progress in notifications and the status line, then the endpoint comes up
ready; a failed pull leaves the tray running with the error in its menu."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest
from fake_hubs import FakeOllamaRegistry
from test_tray_support import FakeClipboard, FakeDesktop, FakeRegistrar, Notes, small_config

from engine.hub import catalog
from trayapp.app import TrayApp
from trayapp.backend import LocalEndpoint


@pytest.fixture
def registry(tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPINFER_MODELS", str(tmp_path / "models"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-ollama"))
    r = FakeOllamaRegistry()
    monkeypatch.setenv("DEEPINFER_OLLAMA_REGISTRY", r.url)
    yield r
    r.close()


def first_start_app(llm, started: list):
    """The shipped defaults' local backend (id qwen2.5-3b -> qwen2.5:3b); the endpoint serves the session's
    0.5B in a real server (loading a 3B on CPU is not what this test is about)."""
    from engine.server.app import ServerThread

    cfg = small_config()
    be = cfg.backend
    be.kind, be.model, be.models = "local", "qwen2.5-3b", {}
    assert be.model_arg(be.model) == "qwen2.5:3b"

    def starter(ecfg):
        started.append(ecfg)
        return ServerThread(replace(ecfg, port=0), llm=llm).start()

    notes = Notes()
    app = TrayApp(cfg, clipboard=FakeClipboard(""), keys=FakeDesktop(FakeClipboard("")), registrar=FakeRegistrar(),
                  notify=notes, endpoint=LocalEndpoint(be.model_arg(be.model), 1, starter=starter))
    states: list[str] = []
    app.on_change = lambda: states.append(app.status_line())
    return app, notes, states


def test_first_start_pulls_the_default_model_with_progress_then_ready(registry, llm):
    registry.add("library/qwen2.5:3b", b"3" * 4_000_000)
    started: list = []
    app, notes, states = first_start_app(llm, started)
    try:
        app.start_endpoint(wait=True)
        assert catalog.is_pulled("qwen2.5:3b")
        titles = [t for t, _ in notes]
        assert titles[0] == "Downloading the model" and "Model downloaded" in titles, notes.text()
        progress = [m for t, m in notes[1:] if t == "Downloading the model"]
        assert progress and all(re.fullmatch(r"qwen2\.5:3b: [1-9]\d% of 4 MB", m) for m in progress), progress
        assert any(re.search(r"downloading qwen2\.5:3b: [1-9]\d% of 4 MB", s) for s in states)  # status line
        assert started and started[0].model == "qwen2.5:3b" and started[0].list_pulled
        assert app.state == "ready", (app.status_line(), notes.text())
    finally:
        app.endpoint.stop()


def test_failed_pull_leaves_the_tray_running_with_the_error_in_its_menu(registry, llm, monkeypatch):
    import os

    os.environ["PYSTRAY_BACKEND"] = "dummy"
    import pystray

    from trayapp.tray import menu_lines

    monkeypatch.setenv("DEEPINFER_OLLAMA_REGISTRY", "http://127.0.0.1:9")  # offline
    started: list = []
    app, notes, _ = first_start_app(llm, started)
    app.start_endpoint(wait=True)
    assert app.state == "error" and not started and not app.endpoint.running
    assert "download of qwen2.5:3b failed: cannot reach the Ollama registry" in app.status_line()
    assert ("Model download failed" in [t for t, _ in notes]) and "tray keeps running" in notes.text()
    lines = menu_lines(pystray, app)  # the menu still builds; its first line says what went wrong
    assert "download of qwen2.5:3b failed: cannot reach the Ollama registry" in lines[0]
    registry.add("library/qwen2.5:3b", b"3" * 1_000_000)  # back online: Start endpoint retries the pull
    monkeypatch.setenv("DEEPINFER_OLLAMA_REGISTRY", registry.url)
    try:
        app.start_endpoint(wait=True)
        assert app.state == "ready" and catalog.is_pulled("qwen2.5:3b"), app.status_line()
    finally:
        app.endpoint.stop()
