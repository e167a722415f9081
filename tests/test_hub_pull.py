"""`deepinfer pull / list / rm` against loopback registries that speak the real protocols (tests/fake_hubs.py):
Ollama's registry and the Hugging Face Hub (via HF_ENDPOINT), serving the real 0.5B GGUF bytes.
Resume after a cut connection, digests checked, an interrupted pull never looks complete, offline
and unknown names give one-line errors; the pulled model loads and answers; /v1/models lists it."""
from __future__ import annotations

import gc
import io
import json

import httpx
import pytest
from fake_hubs import Blob, FakeHFHub, FakeOllamaRegistry

from engine.cli.main import main
from engine.config import EngineConfig
from engine.errors import ModelFileError
from engine.formats.load import load_spec
from engine.hub import catalog, ollama_registry
from engine.runtime.llm import LLM
from engine.runtime.sampling import SamplingParams

GGUF_REPO = "Qwen/Qwen2.5-3B-Instruct-GGUF"
QUESTION = "What is 2+3? Answer with one number."


class TTY(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture(scope="module")
def real_blob(model_path):
    return Blob(model_path)  # the cached 0.5B file, served from disk (sha256 computed once)


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPINFER_MODELS", str(tmp_path / "models"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "no-ollama"))  # no local Ollama store to fall back on
    return tmp_path / "models"


@pytest.fixture
def registry(monkeypatch):
    r = FakeOllamaRegistry()
    monkeypatch.setenv("DEEPINFER_OLLAMA_REGISTRY", r.url)
    yield r
    r.close()


@pytest.fixture
def hub(monkeypatch):
    h = FakeHFHub()
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    yield h
    h.close()


def one_error_line(capsys, *words):
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def test_ollama_pull_resumes_after_a_cut_then_the_model_answers(store, registry, real_blob, spec, capsys):
    registry.add("library/qwen2.5:3b", real_blob)
    registry.cut_after = 100 << 20  # the CDN drops the connection 100 MiB into the model layer
    assert main(["pull", "qwen2.5:3b"]) == 1
    one_error_line(capsys, "interrupted at 104857600 of 491400064", "Fix:", "deepinfer pull qwen2.5:3b", "resumes")
    assert not catalog.is_pulled("qwen2.5:3b") and catalog.list_pulled() == []  # never looks complete
    with pytest.raises(ModelFileError, match="not downloaded yet.*deepinfer pull qwen2.5:3b"):
        load_spec("qwen2.5:3b")
    assert main(["pull", "qwen2.5:3b"]) == 0
    assert (f"bytes={100 << 20}-") in [rng for _, _, rng in registry.requests]  # asked only for the rest
    assert any(p.startswith("/v2/library/qwen2.5/blobs/sha256:") for _, p, _ in registry.requests)  # 307 -> /cdn
    blob = catalog.resolve("qwen2.5:3b")
    assert blob.stat().st_size == real_blob.size and blob.name == f"sha256-{real_blob.sha256}"
    assert ollama_registry.file_type("qwen2.5:3b") == "Q4_K_M"
    pulled = load_spec("qwen2.5:3b")
    assert pulled.config == spec.config and pulled.source == str(blob)
    # the pulled file loads and answers (greedy); bfloat16 keeps a second copy of the 0.5B small next to
    # the session's float32 one
    llm = LLM(EngineConfig(model="qwen2.5:3b", device="cpu", dtype="bfloat16", max_context=256, max_batch=1))
    try:
        answer = "".join(ev.text for ev in llm.stream(llm.render([{"role": "user", "content": QUESTION}]),
                                                       SamplingParams(max_tokens=8)))
    finally:
        del llm
        gc.collect()
    assert "5" in answer, answer


def test_ollama_7b_progress_bar_wrong_digest_list_and_rm(store, registry, capsys):
    registry.add("library/qwen2.5:7b", b"7" * 3_000_000, file_type="Q4_K_M")
    shared = registry.add("library/qwen2.5:latest", b"7" * 3_000_000)  # same model layer as :7b
    bad = registry.add("library/qwen2.5:0.5b", b"0" * 2_000_000)
    tty = TTY()
    catalog.pull("qwen2.5:7b", stream=tty)
    bar = tty.getvalue()
    assert "\rpull qwen2.5:7b [" in bar and "100%" in bar and "MB/s" in bar and bar.endswith("\n")
    catalog.pull("qwen2.5:latest", stream=io.StringIO())
    assert catalog.resolve("qwen2.5") == catalog.resolve("qwen2.5:7b")  # one blob for both tags
    # a wrong digest is refused: nothing is renamed into place, nothing is listed, no bad bytes kept
    registry.corrupt.add(bad.sha256)
    with pytest.raises(ModelFileError, match="do not match the registry's digest"):
        catalog.pull("qwen2.5:0.5b", quiet=True)
    assert not catalog.is_pulled("qwen2.5:0.5b")
    assert not list((store / "ollama" / "blobs").glob(f"sha256-{bad.sha256}*"))
    capsys.readouterr()
    assert main(["list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["NAME", "SIZE", "FORMAT", "BITS", "WHERE"]
    assert [ln.split()[:5] for ln in out[1:]] == [["qwen2.5:7b", "3.0", "MB", "gguf", "Q4_K_M"],
                                                   ["qwen2.5:latest", "3.0", "MB", "gguf", "Q4_K_M"]]
    assert main(["rm", "qwen2.5:7b", "--port", "9"]) == 0  # nothing listens on port 9: nothing uses it
    assert catalog.resolve("qwen2.5:latest").stat().st_size == shared.size  # the shared blob stays
    assert main(["rm", "qwen2.5:7b", "--port", "9"]) == 1
    one_error_line(capsys, "not a pulled model", "qwen2.5:latest")


def test_ollama_unknown_tag_and_offline_are_one_line_errors(store, registry, capsys, monkeypatch):
    assert main(["pull", "qwen2.5:99b"]) == 1
    one_error_line(capsys, "qwen2.5:99b is not in the Ollama registry", "Fix:", "ollama.com/library/qwen2.5")
    monkeypatch.setenv("DEEPINFER_OLLAMA_REGISTRY", "http://127.0.0.1:9")  # nothing listens: offline
    assert main(["pull", "qwen2.5:3b"]) == 1
    one_error_line(capsys, "cannot reach the Ollama registry", "Fix:", "internet")
    assert main(["ask", "--model", "qwen2.5:3b", "hi"]) == 1  # ask pulls a missing model first: same error
    one_error_line(capsys, "cannot reach the Ollama registry")


def test_hf_gguf_picks_q4_k_m_resumes_and_loads(store, hub, real_blob, spec, capsys):
    hub.add(GGUF_REPO, {"qwen2.5-3b-instruct-q4_k_m.gguf": real_blob, "qwen2.5-3b-instruct-q8_0.gguf": b"8" * 5000,
                        "README.md": b"# model card", ".gitattributes": b"*.gguf filter=lfs"})
    hub.cut_after = 64 << 20  # cut once; huggingface_hub resumes from its .incomplete file with a Range request
    path = catalog.pull(f"hf:{GGUF_REPO}", quiet=True)
    assert path.name == "qwen2.5-3b-instruct-q4_k_m.gguf" and path.stat().st_size == real_blob.size
    assert any(rng and rng.startswith("bytes=") for _, _, rng in hub.requests)
    assert load_spec(f"hf:{GGUF_REPO}").config == spec.config
    assert not (path.parent / "README.md").exists()  # only the model file
    e = {x.name: x for x in catalog.list_pulled()}[f"hf:{GGUF_REPO}"]
    assert (e.format, e.bits, e.size) == ("gguf", "Q4_K_M", real_blob.size)
    assert main(["pull", f"hf:{GGUF_REPO}", "--file", "qwen2.5-3b-instruct-q8_0.gguf", "--quiet"]) == 0
    assert catalog.resolve(f"hf:{GGUF_REPO}").name == "qwen2.5-3b-instruct-q8_0.gguf"
    capsys.readouterr()
    assert main(["pull", "hf:Qwen/No-Such-Repo"]) == 1
    one_error_line(capsys, "no such repository", "Fix:")


def test_hf_safetensors_folder_and_bad_digest(store, hub, monkeypatch, capsys):
    cfg = {"architectures": ["Qwen2ForCausalLM"], "torch_dtype": "float16",
           "quantization_config": {"bits": 4, "group_size": 128, "quant_method": "awq"}}
    files = {"config.json": json.dumps(cfg).encode(), "tokenizer.json": b"{}", "tokenizer_config.json": b"{}",
             "model.safetensors": b"S" * 200_000, "README.md": b"card"}
    hub.add("Qwen/Qwen2.5-3B-Instruct-AWQ", files)
    hub.wrong_lfs.add("model.safetensors")
    with pytest.raises(ModelFileError, match="does not match the Hub's sha256"):
        catalog.pull("hf:Qwen/Qwen2.5-3B-Instruct-AWQ", quiet=True)
    assert not catalog.is_pulled("hf:Qwen/Qwen2.5-3B-Instruct-AWQ") and catalog.list_pulled() == []
    hub.wrong_lfs.clear()
    folder = catalog.pull("hf:Qwen/Qwen2.5-3B-Instruct-AWQ", quiet=True)
    assert {p.name for p in folder.iterdir() if not p.name.startswith(".")} == \
        {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"}
    (e,) = catalog.list_pulled()
    assert (e.name, e.format, e.bits) == ("hf:Qwen/Qwen2.5-3B-Instruct-AWQ", "safetensors", "4 (awq)")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    assert main(["pull", "hf:Qwen/Qwen2.5-7B-Instruct-GGUF"]) == 1
    one_error_line(capsys, "cannot reach the Hugging Face Hub", "Fix:", "HF_ENDPOINT")
    assert main(["rm", "hf:Qwen/Qwen2.5-3B-Instruct-AWQ", "--port", "9"]) == 0 and catalog.list_pulled() == []


def test_v1_models_lists_pulled_and_rm_refuses_a_model_in_use(store, registry, llm, model_path, capsys):
    import os

    from engine.hub import store as demo
    from engine.server.app import ServerThread

    registry.add("library/qwen2.5:7b", b"7" * 1_000_000)
    catalog.pull("qwen2.5:7b", quiet=True)
    # the demo 0.5B as pulled into this store: a hard link to the cached file (no 491 MB copy)
    store.mkdir(parents=True, exist_ok=True)
    os.link(model_path, demo.model_path("qwen2.5-coder-0.5b"))
    demo.model_path("qwen2.5-coder-0.5b").with_suffix(".verified").write_text("ok\n")
    # serve: the session's 0.5B is the resident model; /v1/models lists the pulled ones too
    cfg = EngineConfig(port=0, device="cpu", max_context=2048, list_pulled=True)
    with ServerThread(cfg, llm=llm) as srv:
        ids = [m["id"] for m in httpx.get(srv.url + "/v1/models").json()["data"]]
        assert ids == ["qwen2.5-coder-0.5b", "qwen2.5:7b"]
        assert main(["rm", "qwen2.5-coder-0.5b", "--port", str(srv.port)]) == 1
        one_error_line(capsys, "qwen2.5-coder-0.5b is in use by the DeepInfer server", "Fix:", "stop that server")
        assert catalog.is_pulled("qwen2.5-coder-0.5b")
        assert main(["rm", "qwen2.5:7b", "--port", str(srv.port)]) == 0  # listed, not loaded: may go
        assert [m["id"] for m in httpx.get(srv.url + "/v1/models").json()["data"]] == ["qwen2.5-coder-0.5b"]
    assert main(["rm", "qwen2.5-coder-0.5b", "--port", str(srv.port)]) == 0  # server gone: deleted
    assert catalog.list_pulled() == [] and model_path.exists()  # the link went, the session's file stays


def test_a_full_disk_is_said_before_the_pull_and_when_it_fills(store, registry, hub, capsys, monkeypatch):
    """Not enough free disk space for what a pull still has to download: one error line before a byte is fetched,
    with the numbers and the fix (DEEPINFER_MODELS on a bigger disk); what was downloaded stays. A disk that fills
    during the download (the OS's ENOSPC: a partial file that is /dev/full) says so instead of "interrupted"."""
    import os
    import shutil
    from collections import namedtuple

    blob = registry.add("library/qwen2.5:3b", b"3" * 3_000_000)
    usage = namedtuple("usage", "total used free")
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**12, 10**12 - 1_000_000, 1_000_000))  # OS edge
    assert main(["pull", "qwen2.5:3b"]) == 1
    one_error_line(capsys, "needs 3.0 MB of disk space", "1.0 MB free", "Fix:", "DEEPINFER_MODELS")
    assert not catalog.is_pulled("qwen2.5:3b") and not list((store / "ollama" / "blobs").glob("*"))
    hub.add(GGUF_REPO, {"qwen2.5-3b-instruct-q4_k_m.gguf": b"4" * 2_500_000})  # the Hub's pulls alike
    assert main(["pull", f"hf:{GGUF_REPO}"]) == 1
    one_error_line(capsys, "needs 2.5 MB of disk space", "Fix:", "DEEPINFER_MODELS")
    assert not catalog.is_pulled(f"hf:{GGUF_REPO}")
    monkeypatch.setattr(shutil, "disk_usage", real)
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this OS")
    part = store / "ollama" / "blobs" / f"sha256-{blob.sha256}.partial"
    part.symlink_to("/dev/full")  # every write to it fails with ENOSPC, as on a full disk
    assert main(["pull", "qwen2.5:3b"]) == 1
    one_error_line(capsys, "the disk of", "is full", "Fix:", "free some disk space")
    part.unlink()
    assert main(["pull", "qwen2.5:3b"]) == 0 and catalog.is_pulled("qwen2.5:3b")


def test_a_models_folder_that_cannot_be_written_is_one_error_line(tmp_path, monkeypatch, capsys):
    """DEEPINFER_MODELS under a file (as a typo or an unplugged drive makes it): `pull` and `ask` (which pulls a
    missing model) say which folder and what to do, no traceback."""
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv("DEEPINFER_MODELS", str(tmp_path / "a-file" / "models"))
    monkeypatch.setenv("DEEPINFER_OLLAMA_REGISTRY", "http://127.0.0.1:9")
    assert main(["pull", "qwen2.5:3b"]) == 1
    one_error_line(capsys, "cannot write to the models folder", "a-file", "Fix:", "DEEPINFER_MODELS")
    assert main(["ask", "--model", "qwen2.5:7b", "hi"]) == 1
    one_error_line(capsys, "cannot write to the models folder")
