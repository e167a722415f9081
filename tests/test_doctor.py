"""`deepinfer doctor` on this machine (CPU only in CI; GPU facts are checked where a GPU exists)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from engine.doctor import report as doctor

from engine.doctor import models as doctor_models
from engine.runtime import memory_plan
from engine.config import QWEN25_SHAPES, ModelConfig

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30


def _by_name(checks):
    return {c["name"] if isinstance(c, dict) else c.name: c for c in checks}


def _doctor(*args, env=None):
    return subprocess.run([sys.executable, "-m", "engine", "doctor", *args], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=120)


def test_doctor_json_on_this_machine(model_path, tmp_path):
    """Subprocess, as the tray runs it: exit 0, every check reported, facts match this machine."""
    import torch

    # hold a port so the port check has something to find: this process, by pid
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        r = _doctor("--json", "--port", str(port),
                    env={"DEEPINFER_MODELS": str(model_path.parent), "DEEPINFER_CONFIG_DIR": str(tmp_path / "c"),
                         "DEEPINFER_LOG_DIR": str(tmp_path / "l")})
    finally:
        s.close()
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    c = _by_name(rep["checks"])
    assert rep["ok"] is True and rep["exit_code"] == 0
    assert list(c) == ["python", "torch", "cuda", "gpu", "cupy", "triton", "dirs", "models", "port", "hotkey",
                       "clipboard", "tray"]
    assert c["python"]["status"] == "ok" and c["python"]["data"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert c["torch"]["status"] == "ok" and c["torch"]["data"]["version"] == torch.__version__
    assert c["port"]["status"] == "warn" and c["port"]["data"]["pid"] == os.getpid()
    assert f"127.0.0.1:{port} is in use by pid {os.getpid()}" in c["port"]["summary"] and "--port" in c["port"]["fix"]
    models = {m["name"]: m for m in c["models"]["data"]["models"]}
    m05 = models["qwen2.5-coder-0.5b"]
    # fits is decided against the RAM free at that moment (the suite itself holds models in memory)
    assert m05["fits"] == (m05["estimate_bytes"] <= c["models"]["data"]["budget_bytes"])
    assert c["models"]["status"] == ("ok" if m05["fits"] else "warn")
    for w in (x for x in rep["checks"] if x["status"] in ("warn", "fail")):
        assert w["fix"], f"{w['name']} has no fix"
    if torch.cuda.is_available():
        assert c["cuda"]["status"] == "ok" and c["gpu"]["data"]["total_bytes"] > 0
    else:  # the CPU path: a warning, not a failure
        assert c["cuda"]["status"] == "warn" and "CPU path works" in c["cuda"]["summary"]
        assert c["gpu"]["status"] == "info" and c["cupy"]["status"] == "info"
        assert models["qwen2.5-coder-0.5b"]["scheme"] == "float32"


def test_no_model_and_no_way_to_get_one_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPINFER_MODELS", str(tmp_path / "empty"))
    monkeypatch.delenv("DEEPINFER_WHEELS_DIR", raising=False)
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-ollama"))
    monkeypatch.setenv("DEEPINFER_CONFIG_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("DEEPINFER_LOG_DIR", str(tmp_path / "l"))
    monkeypatch.setattr("engine.hub.store.PYPI", "http://127.0.0.1:9")  # nothing listens on port 9
    checks = doctor.run_checks(port=0)
    c = _by_name(checks)
    assert c["models"].status == "fail" and "deepinfer pull" in c["models"].fix
    assert doctor.exit_code(checks) == 1
    text = doctor.format_report(checks)
    assert "FAIL  models" in text and "result: DeepInfer cannot run here (models)" in text
    # with local wheels `deepinfer pull` works offline: a warning with the command, exit 0
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "x-1-py3-none-any.whl").write_bytes(b"")
    monkeypatch.setenv("DEEPINFER_WHEELS_DIR", str(wheels))
    c = _by_name(doctor.run_checks(port=0))
    assert c["models"].status == "warn" and c["models"].fix.startswith("deepinfer pull")


def test_torch_missing_fails_with_fix(tmp_path):
    """A torch that cannot be imported (the OS edge, faked by a package on PYTHONPATH) -> exit 1."""
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('No module named torch')\n")
    r = _doctor(env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "DEEPINFER_PYPI": "http://127.0.0.1:9",
                     "DEEPINFER_CONFIG_DIR": str(tmp_path / "c"), "DEEPINFER_LOG_DIR": str(tmp_path / "l")})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL  torch      torch is not installed" in r.stdout
    assert "fix: run the installer again, or: pip install torch==" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr


def test_doctor_imports_nothing_heavy():
    code = ("import sys, engine.doctor.report, engine.desktop.autostart, engine.desktop.install_plan, engine.logs; "
            "print(sorted(m for m in ('torch', 'cupy', 'numpy', 'pystray', 'keyboard', 'pynput') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_estimates_follow_weights_kv_and_overhead(tmp_path):
    cfg7 = ModelConfig(**QWEN25_SHAPES["7b"])
    lin, emb = memory_plan.param_counts(cfg7)
    assert 7.0e9 < lin + emb < 7.7e9  # Qwen2.5-7B: 7.6B parameters (biases and norms aside)
    kv = memory_plan.kv_bytes(cfg7)
    assert kv == 2 * 28 * 4 * 128 * 4096 * 2  # 224 MiB for 4096 tokens, fp16
    work = memory_plan.work_bytes(cfg7, 4096, 1)  # what the GPU loader adds: decode, prefill chunk, graphs, reserve
    m = doctor_models.Found("7b", "checkpoint", tmp_path, cfg7, "w4", weight_bytes=4 * GIB)
    assert doctor_models.estimate_bytes(m, "cuda") == 4 * GIB + kv + work
    # from the config: quantized to W4 at load like the GPU loader does (7.6B x 0.53 B = 3.77 GiB)
    # + KV + working memory = 4.7 GiB: a 4 GB card cannot hold it as is (seed 5.2)
    m.weight_bytes = 0
    assert doctor_models.estimate_bytes(m, "cuda") == memory_plan.weight_bytes(cfg7, 4) + kv + work
    assert 4.6 * GIB < doctor_models.estimate_bytes(m, "cuda") < 4.9 * GIB


def test_checkpoint_folders_are_listed(tmp_path, monkeypatch):
    cfg = ModelConfig(**QWEN25_SHAPES["3b"])
    ck = tmp_path / "qwen-3b-w4"
    ck.mkdir()
    (ck / "manifest.json").write_text(json.dumps({"config": cfg.to_dict(), "scheme": "w4",
                                                  "files": {"a": {"bytes": 1_500_000_000}, "b": {"bytes": 500}}}))
    (tmp_path / "half-export").mkdir()  # no manifest: an interrupted export, not a model
    monkeypatch.setenv("DEEPINFER_MODELS", str(tmp_path))
    found = {f.path.name: f for f in doctor_models.find_models(tmp_path)}
    assert set(found) >= {"qwen-3b-w4"} and "half-export" not in found
    assert found["qwen-3b-w4"].weight_bytes == 1_500_000_500 and found["qwen-3b-w4"].config.num_layers == 36
    c = doctor_models.check_models({"gpu": True, "vram_free": 3 * GIB})
    row = next(r for r in c.data["models"] if r["name"].endswith("qwen-3b-w4"))
    assert row["fits"] and row["estimate_bytes"] == 1_500_000_500 + memory_plan.kv_bytes(cfg) + \
        memory_plan.work_bytes(cfg, 4096, 1)  # 2.08 GiB
    c = doctor_models.check_models({"gpu": True, "vram_free": 1 * GIB})
    assert c.status == "warn" and "none fits" in c.summary


def test_gguf_shape_from_the_header(model_path):
    cfg = doctor_models.gguf_config(model_path)
    want = ModelConfig(**QWEN25_SHAPES["0.5b"])
    assert (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads) == \
        (want.vocab_size, want.hidden_size, want.intermediate_size, want.num_layers, want.num_heads, want.num_kv_heads)
    # this GGUF stores output.weight separately: the CPU path holds a float32 lm_head too
    from engine.formats.gguf_file import GGUFFile
    assert cfg.tie_word_embeddings == ("output.weight" not in GGUFFile(model_path).tensors)


def test_a_model_too_big_is_told_the_packing_that_fits(tmp_path, monkeypatch):
    """doctor on a GPU estimates a GGUF in the default packing (kquant, the fewest bytes since the H200 timed it): a
    model that would not fit the free VRAM in its byte layouts but fits in kquant's is listed as fitting. Without a
    GPU: a model file too big in float32 that fits with the CPU's int8 / int4 linears is listed as 'fits with
    --cpu-weights int4', and the fix says so."""
    from engine.config import GGUF_PACK
    from engine.quant.random_gguf import write_random_gguf

    assert GGUF_PACK == "kquant"
    cfg = ModelConfig(vocab_size=151936, hidden_size=512, intermediate_size=1024, num_layers=4, num_heads=4,
                      num_kv_heads=2, tie_word_embeddings=False)
    write_random_gguf(cfg, tmp_path / "small-q4_k_m.gguf")
    monkeypatch.setenv("DEEPINFER_MODELS", str(tmp_path))
    m = next(f for f in doctor_models.find_models(tmp_path) if f.path.name == "small-q4_k_m.gguf")
    big, small = doctor_models.estimate_bytes(m, "cuda", "bytes"), doctor_models.estimate_bytes(m, "cuda", "kquant")
    assert small < big and doctor_models.estimate_bytes(m, "cuda") == small
    c = doctor_models.check_models({"gpu": True, "vram_free": (big + small) // 2})
    row = next(r for r in c.data["models"] if r["name"].endswith("small-q4_k_m.gguf"))
    assert row["fits"] and "fits_with" not in row and c.status == "ok"
    # on a machine without a GPU: too big in float32, fits with the CPU's int8 linears (free RAM: the OS edge)
    from engine.runtime import memory_plan
    dense = memory_plan.cpu_estimate(m.config)
    int8 = memory_plan.cpu_estimate(m.config, cpu_weights="int8")
    assert int8 < dense
    monkeypatch.setattr(memory_plan, "available_ram", lambda: (dense + int8) // 2)
    c = doctor_models.check_models({"gpu": False})
    row = next(r for r in c.data["models"] if r["name"].endswith("small-q4_k_m.gguf"))
    # a model file: its 4-bit linears as they are (the estimate is int8's, a bound)
    assert not row["fits"] and row["fits_with"] == "--cpu-weights int4" and "--cpu-weights int4" in c.fix
