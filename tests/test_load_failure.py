"""A load failure is never a hang: a missing module (ImportError), MemoryError or a corrupt model file puts
the engine thread in the error state that GET /health reports (message + fix), requests fail at once,
`deepinfer serve` exits 1 with the message within seconds, the tray shows it and keeps running;
pick_device asks the GPU capability check (a GPU without CuPy -> one warning, CPU)."""
from __future__ import annotations

import logging
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import httpx
import torch
import pytest

from engine.config import EngineConfig
from engine.errors import ResourceError
from engine.runtime import llm as llm_mod
from engine.runtime.backends import Backends
from engine.runtime.capability import GPUCapability
from engine.runtime.sampling import SamplingParams
from engine.runtime.worker import EngineWorker
from engine.runtime.worker_types import GenerateRequest, ModelUnavailableError

ROOT = Path(__file__).resolve().parents[1]
KINDS = {  # what the stub's load raises -> words the message and the fix must hold
    "import": (lambda: ImportError("No module named 'cupy'", name="cupy"), "cupy", "pip install cupy"),
    "memory": (lambda: MemoryError(), "out of memory", "smaller model"),
}


@pytest.fixture()
def corrupt(tmp_path) -> Path:
    p = tmp_path / "broken.gguf"
    p.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x07" * 19)  # a header, then nothing a reader can use
    return p


def _stub(monkeypatch, kind: str):
    make = KINDS[kind][0]

    def load(self, mid):
        raise make()
    monkeypatch.setattr(Backends, "load", load)


def _assert_error_state(w: EngineWorker, words: tuple[str, ...]):
    t0 = time.monotonic()
    assert w.wait_ready(10) == "error"
    assert time.monotonic() - t0 < 10
    h = w.health()
    assert h["state"] == "error" and h["fix"], h
    for word in words:
        assert word in h["error"], (word, h["error"])
    # a request is answered at once (the load is retried, fails again), not left waiting
    req = GenerateRequest([1, 2, 3], SamplingParams(max_tokens=2))
    with pytest.raises(ModelUnavailableError, match="could not be loaded"):
        w.submit(req).result(timeout=10)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_stub_load_failure_is_an_error_state(monkeypatch, kind):
    _stub(monkeypatch, kind)
    w = EngineWorker(EngineConfig(model="qwen2.5-coder-0.5b", device="cpu")).start()
    try:
        _assert_error_state(w, KINDS[kind][1:])
    finally:
        w.stop()
    assert w.state == "stopped"


def test_corrupt_file_is_an_error_state_and_health_says_so(corrupt):
    from engine.server.app import ServerThread

    cfg = EngineConfig(model=str(corrupt), device="cpu", port=0)
    with ServerThread(cfg) as srv:
        _assert_error_state(srv.worker, ("broken.gguf", "Fix:"))
        r = httpx.get(srv.url + "/health", timeout=10)
        assert r.status_code == 503
        body = r.json()
        assert body["status"] == "error" and "broken.gguf" in body["error"] and body["fix"]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_serve_exits_1_with_the_message(monkeypatch, capsys, tmp_path, kind):
    from engine.cli.main import main

    monkeypatch.setenv("DEEPINFER_LOG_DIR", str(tmp_path))
    _stub(monkeypatch, kind)
    t0 = time.monotonic()
    rc = main(["serve", "--model", "qwen2.5-coder-0.5b", "--port", "0", "--device", "cpu", "--no-pull"])
    assert rc == 1 and time.monotonic() - t0 < 10
    err = capsys.readouterr().err
    assert "error: " in err and KINDS[kind][1] in err and "Fix:" in err


def test_serve_subprocess_exits_1_on_a_corrupt_file(corrupt, tmp_path):
    """The real CLI in its own process: non-zero exit with the message, within 10 s of starting the load
    (interpreter start and imports come before; on a busy 2-core CI box they alone can take seconds)."""
    env = {"DEEPINFER_LOG_DIR": str(tmp_path), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
           "HOME": str(Path.home())}
    t_start = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--model", str(corrupt), "--port", "0",
                          "--device", "cpu", "--no-pull"], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    lines, t_load = [], None
    for line in p.stderr:
        lines.append(line)
        if line.startswith("loading ") and t_load is None:
            t_load = time.monotonic()
    rc = p.wait(timeout=120)
    t_end = time.monotonic()
    err = "".join(lines)
    assert rc == 1 and "broken.gguf" in err and "Fix:" in err and "Traceback" not in err, err
    assert t_load is not None and t_end - t_load < 10, (t_end - t_load, t_end - t_start)


def test_tray_shows_the_load_error_and_keeps_running(corrupt):
    from engine.server.app import ServerThread
    from test_tray_app import local_app
    from trayapp.backend import LocalEndpoint

    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ep = LocalEndpoint("qwen2.5-coder-0.5b", port,
                       starter=lambda cfg: ServerThread(replace(cfg, model=str(corrupt), device="cpu")).start())
    app, reg, notes, _ = local_app(port, endpoint=ep)
    t0 = time.monotonic()
    app.start_endpoint(wait=True)
    assert time.monotonic() - t0 < 15
    assert app.state == "error" and "broken.gguf" in app.message and "Fix:" in app.message, app.message
    assert any(t == "Model failed to load" for t, _ in notes), notes.text()
    assert app.status_line().startswith("error")
    app.stop_endpoint()  # the tray still works: the endpoint stops, the menu redraws
    assert not ep.running


def test_pick_device_gpu_without_cupy_warns_once_and_runs_on_cpu(monkeypatch, caplog):
    cap = GPUCapability(True, False, "CuPy is not installed: the custom CUDA kernels cannot be compiled",
                        "pip install cupy-cuda12x")
    monkeypatch.setattr(llm_mod, "gpu_capability", lambda: cap)
    monkeypatch.setattr(llm_mod, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="deepinfer.device"):
        assert llm_mod.pick_device("auto") == "cpu"
        assert llm_mod.pick_device("auto") == "cpu"
    warnings = [r.getMessage() for r in caplog.records if r.name == "deepinfer.device"]
    assert len(warnings) == 1 and "CuPy is not installed" in warnings[0] and "pip install cupy" in warnings[0]
    with pytest.raises(ResourceError, match="CuPy") as e:
        llm_mod.pick_device("cuda")
    assert "--device cpu" in e.value.fix
    assert llm_mod.pick_device("cpu") == "cpu"


def test_capability_check_is_the_doctors():
    """doctor's GPU toolchain check and pick_device run the same probes (engine/runtime/capability.py)."""
    from engine.doctor import checks
    from engine.runtime import capability

    assert checks.capability is capability and llm_mod.gpu_capability is capability.gpu_capability
    cap = capability.gpu_capability()
    assert cap.ok or cap.reason  # here (no GPU): "no CUDA GPU ..."; on the device: ok


def test_a_model_too_big_for_the_ram_is_refused_before_it_allocates(capsys, tmp_path, monkeypatch):
    """The CPU path on a machine without the RAM for it (here: the real 0.5B with 4,096 slots of 32,768 tokens, a
    3.3 TB KV cache; on a laptop: qwen2.5:7b's 30 GB of float32 weights): `deepinfer serve` exits 1 within
    seconds with what it needs, what is free and the fix, instead of the OS killing it mid-load or swapping."""
    from engine.cli.main import main
    from engine.runtime import memory_plan

    monkeypatch.setenv("DEEPINFER_LOG_DIR", str(tmp_path))
    t0 = time.monotonic()
    rc = main(["serve", "--model", "qwen2.5-coder-0.5b", "--port", "0", "--device", "cpu", "--no-pull",
               "--max-context", "32768", "--max-batch", "4096"])
    err = capsys.readouterr().err
    assert rc == 1 and time.monotonic() - t0 < 20, err
    assert "GiB of RAM on the CPU path" in err and "4096 x 32768 tokens" in err and "--max-context" in err, err
    # the arithmetic: the 7B's float32 weights on a 16 GiB laptop; bfloat16 halves them; unknown RAM passes
    from engine.config import QWEN25_SHAPES, ModelConfig
    c7 = ModelConfig(**QWEN25_SHAPES["7b"])
    with pytest.raises(ResourceError, match=r"about 29\.\d GiB .*28\.\d GiB of float32 weights.* 16\.0 GiB is avail"):
        memory_plan.check_cpu_ram(c7, "qwen2.5:7b", 4096, 1, 4, available=16 << 30)
    memory_plan.check_cpu_ram(c7, "qwen2.5:7b", 4096, 1, 2, available=16 << 30)  # bfloat16: ~14.5 GiB
    assert memory_plan.available_ram() is None or memory_plan.available_ram() > 0
    monkeypatch.setattr(memory_plan, "available_ram", lambda: None)  # an OS that does not say: no refusal
    memory_plan.check_cpu_ram(c7, "qwen2.5:7b", 4096, 1, 4)


def test_a_model_that_fits_only_in_bfloat16_runs_in_bfloat16(monkeypatch, caplog):
    """dtype "auto" on the CPU: float32 when it fits the free RAM, else bfloat16 (half the weights) with a warning,
    rather than no answer; the real 0.5B with RAM for bfloat16 only (free RAM is the OS edge: set here) loads in
    bfloat16 and answers."""
    from engine.runtime import memory_plan
    from engine.runtime.llm import LLM

    cfg = EngineConfig(device="cpu", max_batch=1, max_context=256)
    monkeypatch.setattr(memory_plan, "available_ram", lambda: 2 << 30)  # 0.5B: ~2.6 GiB in float32, ~1.5 in bf16
    with caplog.at_level(logging.WARNING, logger="deepinfer.engine"):
        llm = LLM(cfg)
    assert llm.runner.dtype == torch.bfloat16 and "running it in bfloat16" in caplog.text
    ids = llm.tokenizer.encode("1, 2, 3, 4,")
    out = "".join(d.text for d in llm.stream(ids, SamplingParams(max_tokens=6, temperature=0)))
    assert "5" in out, out
    del llm
    monkeypatch.setattr(memory_plan, "available_ram", lambda: 1 << 30)  # not even bfloat16: refused, with both
    with pytest.raises(ResourceError, match="bfloat16 weights"):
        LLM(cfg)


def test_fit_context_on_the_cpu_shortens_the_context_to_the_free_ram(monkeypatch, caplog, spec):
    """EngineConfig.fit_context (the tray sets it) on the CPU as on the GPU: a context whose KV cache does not fit the
    free RAM beside the weights comes up shorter (steps of 256, logged, /health's max_context) instead of refused;
    float32 is kept when a shorter context is enough. Free RAM is the OS edge, set here."""
    from engine.runtime import memory_plan
    from engine.runtime.llm import LLM

    need = lambda ctx: memory_plan.cpu_estimate(spec.config, ctx, 2)  # noqa: E731 - float32, 2 slots
    monkeypatch.setattr(memory_plan, "available_ram", lambda: need(6000))
    with caplog.at_level(logging.WARNING, logger="deepinfer.gpu"):
        llm = LLM(EngineConfig(device="cpu", max_batch=2, max_context=32768, fit_context=True), spec=spec)
    assert llm.runner.max_context == 5888 and llm.runner.dtype == torch.float32
    assert "does not fit the free RAM: using 5888" in caplog.text
    ids = llm.tokenizer.encode("1, 2, 3, 4,")
    assert "5" in "".join(d.text for d in llm.stream(ids, SamplingParams(max_tokens=6, temperature=0)))
    del llm
    with pytest.raises(ResourceError, match="32768 tokens"):  # without fit_context: refused, with the numbers
        LLM(EngineConfig(device="cpu", max_batch=2, max_context=32768, dtype="float32"), spec=spec)
