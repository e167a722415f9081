"""Shared fixtures: the real Qwen2.5-Coder-0.5B model (downloaded once by our own store code
into the user's model cache, which CI keeps between runs) and one loaded LLM per session."""
from __future__ import annotations

import pytest

MODEL = "qwen2.5-coder-0.5b"


def pytest_collection_modifyitems(config, items):
    try:
        import torch
        has_gpu = torch.cuda.is_available()
    except Exception:
        has_gpu = False
    if not has_gpu:
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (runs on the device machine)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


def pytest_collection_finish(session):
    """test_install_wheels resolves the installers' wheel sets over the network (~50 s of waiting): start that
    when the session's tests are known, so it overlaps the CPU-bound tests that run before it."""
    for item in session.items:
        if item.module.__name__.endswith("test_install_wheels") and "resolved" in getattr(item, "fixturenames", ()):
            item.module.start_resolution()
            return


@pytest.fixture(scope="session")
def model_path():
    from engine.hub import store
    return store.pull(MODEL, quiet=True)


@pytest.fixture(scope="session")
def spec(model_path):
    from engine.formats.load import load_spec

    return load_spec(MODEL)


@pytest.fixture(scope="session")
def llm(spec):
    """One CPU LLM for the whole session: 4 KV slots of 2048 tokens."""
    from engine.config import EngineConfig
    from engine.runtime.llm import LLM

    return LLM(EngineConfig(model=MODEL, device="cpu", max_context=2048, max_batch=4), spec=spec)


@pytest.fixture(scope="session")
def tokenizer(spec):
    return spec.tokenizer


@pytest.fixture(scope="module")
def client(server):
    """A real OpenAI client on the module's `server` fixture (a ServerThread on loopback)."""
    from openai import OpenAI
    return OpenAI(base_url=server.base_url, api_key="anything", timeout=120, max_retries=0)


@pytest.fixture
def lookup_drafts(monkeypatch):
    """The lengths of the prompt-lookup drafts verified during the test (engine/runtime/speculative.py step)."""
    from engine.runtime import speculative

    drafts, step = [], speculative.step

    def rec(runner, seq, proposal, source="lookup", *a, **kw):
        if source == "lookup":
            drafts.append(len(proposal))
        return step(runner, seq, proposal, source, *a, **kw)
    monkeypatch.setattr(speculative, "step", rec)
    return drafts
