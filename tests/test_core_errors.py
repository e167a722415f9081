"""User errors from `deepinfer ask`: one line naming the fix, exit code 1, no traceback."""
import os
import subprocess
import sys

import numpy as np
import pytest


def run_cli(*args, stdin=None):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True,
                          input=stdin, env=env, timeout=300)


def assert_one_line_error(r, *words):
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, r.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_missing_model_file(tmp_path):
    r = run_cli("ask", "--model", str(tmp_path / "nope.gguf"), "hi")
    assert_one_line_error(r, "not found", "Fix:")


def test_truncated_gguf(tmp_path, model_path):
    bad = tmp_path / "cut.gguf"
    with open(model_path, "rb") as src, open(bad, "wb") as dst:
        dst.write(src.read(60 << 20))
    r = run_cli("ask", "--model", str(bad), "hi")
    assert_one_line_error(r, "truncated", "re-download")


def test_not_a_gguf(tmp_path):
    bad = tmp_path / "junk.gguf"
    bad.write_bytes(b"this is not a model" * 100)
    r = run_cli("ask", "--model", str(bad), "hi")
    assert_one_line_error(r, "not a GGUF")


def test_unsupported_architecture(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "llama.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = run_cli("ask", "--model", str(path), "hi")
    assert_one_line_error(r, "'llama' is not supported", "Qwen2.5")


def test_max_tokens_must_be_positive():
    r = run_cli("ask", "--max-tokens", "0", "hi")
    assert_one_line_error(r, "max_tokens must be a positive integer")


def test_empty_question():
    r = run_cli("ask", stdin="")
    assert_one_line_error(r, "empty")


def test_prompt_longer_than_context(model_path):
    r = run_cli("ask", "--model", "qwen2.5-coder-0.5b", "--max-context", "64", "--max-tokens", "8", "字" * 200)
    assert_one_line_error(r, "context", "Fix:")


def test_ask_refuses_a_prompt_too_long_before_loading_the_weights(model_path, monkeypatch):
    # the tokenizer and template come from the file's header (~0.5 s); the weights (~10 s here, more for a 7B on a
    # GPU) are not read for a request that cannot fit: LLM made here fails the test
    from engine.cli import ask
    from engine.cli.main import build_parser
    from engine.errors import ContextOverflowError
    from engine.runtime import llm as llm_module

    def loads(*a, **k):
        raise AssertionError("the weights were loaded before the prompt was checked")

    monkeypatch.setattr(llm_module, "LLM", loads)
    parser = build_parser(["ask"])
    for argv, words in ((["--max-context", "64", "字" * 200], "the context holds 64"),
                        (["--max-context", "64", "--max-tokens", "60", "hi"], "exceeds the context of 64")):
        with pytest.raises(ContextOverflowError, match=words):
            ask.run(parser.parse_args(["ask", "--model", "qwen2.5-coder-0.5b", "--no-pull", *argv]))


def test_ask_streams_answer_with_stats(model_path):
    r = run_cli("ask", "--model", "qwen2.5-coder-0.5b", "--stats", "--max-tokens", "12", "--system", "只用中文回答。",
                stdin="用一句话解释 CUDA Graph。")
    assert r.returncode == 0, r.stderr
    assert "CUDA" in r.stdout
    assert "prefill" in r.stderr and "tok/s" in r.stderr and "load" in r.stderr
    assert "device cpu float32" in r.stderr  # the engine's default on the CPU (--cpu-weights int8: "cpu int8")
