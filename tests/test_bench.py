"""`deepinfer bench` on the real Qwen2.5-Coder-0.5B: in-process (the session `llm`) and through
our own OpenAI-compatible server on loopback. Tiny max_tokens keep it fast on a CPU; the
protocol's prompts are still sent verbatim and must count 38 and 58 tokens on both paths."""
from __future__ import annotations

import json

import pytest

from engine.bench import cli
from engine.bench.targets import InProcTarget


def _args(argv):
    import argparse
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    return p.parse_args(argv), argv


def test_inprocess_target_real_model(llm, tmp_path):
    out, rep = tmp_path / "inproc.json", tmp_path / "inproc.md"
    args, argv = _args(["--runs", "productivity,decode,prefill,concurrency,memory", "--max-tokens", "2",
                        "--warmup", "0", "--repeats", "1", "--speed-repeats", "1", "--decode-tokens", "3",
                        "--prefill-lengths", "24", "--concurrency", "2", "--concurrency-max-tokens", "2",
                        "--concurrency-prompt-tokens", "16", "--quiet", "--out", str(out), "--report", str(rep)])
    assert cli.run(args, argv, instance=InProcTarget(None, llm=llm)) == 0
    res = json.loads(out.read_text(encoding="utf-8"))
    assert res["protocol_modified"] is True  # max_tokens 3 instead of 64: marked, never a protocol number
    t = res["targets"][0]
    assert t["info"]["kind"] == "inproc" and t["info"]["layers"] == 24 and t["load_s"] > 0
    rows = t["runs"]["productivity"]["rows"]
    assert [(r["prompt_tokens"], r["prompt_tokens_ours"]) for r in rows] == [(38, 38), (58, 58)]
    for r in rows:
        assert 1 <= r["completion_tokens"] <= 2 and not r.get("flags")
        assert 0 < r["ttft_s"] < r["wall_s"] and r["decode_s"] >= 0
    dec = t["runs"]["decode"]["points"][0]["rows"][0]
    assert dec["completion_tokens"] == 3 and dec["decode_tps"] == pytest.approx(2 / dec["decode_s"])  # EOS ignored
    pre = t["runs"]["prefill"]["points"][0]["rows"][0]
    assert pre["prompt_tokens"] == 24 and pre["prefill_tps"] == pytest.approx(24 / pre["ttft_s"])
    conc = t["runs"]["concurrency"]  # through the engine worker (continuous batching), no HTTP
    assert conc["settings"]["via"].startswith("EngineWorker") and conc["settings"]["kv_slots"] == 4
    c2 = conc["points"][0]
    assert c2["errors"] == 0 and [r["completion_tokens"] for r in c2["rows"]] == [2, 2]
    assert sorted(llm.runner.free_slots) == list(range(4))  # the worker is stopped, slots returned
    mem = t["runs"]["memory"]["memory"]
    assert mem["weights_bytes"] > 4e8 and mem["kv_cache_bytes"] > 0
    assert "38 / 38" in rep.read_text(encoding="utf-8")


def test_our_http_server_as_target(llm, tmp_path):
    from engine.config import EngineConfig
    from engine.server.app import ServerThread

    out = tmp_path / "http.json"
    with ServerThread(EngineConfig(port=0, device="cpu"), llm=llm) as srv:
        args, argv = _args(["--target", f"http:{srv.url}", "--runs", "productivity,concurrency", "--max-tokens", "2",
                            "--warmup", "0", "--repeats", "1", "--concurrency", "2", "--concurrency-max-tokens", "2",
                            "--concurrency-prompt-tokens", "16", "--quiet", "--out", str(out)])
        rc = cli.run(args, argv)
    res = json.loads(out.read_text(encoding="utf-8"))
    t = res["targets"][0]
    assert rc == 0, t["errors"]
    assert t["info"]["name"] == "deepinfer-http" and t["info"]["model"] == "qwen2.5-coder-0.5b"
    rows = t["runs"]["productivity"]["rows"]
    # the server's usage fields agree with our tokenizer on the protocol prompts
    assert [(r["prompt_tokens"], r["prompt_tokens_ours"]) for r in rows] == [(38, 38), (58, 58)]
    assert all(r["completion_tokens"] <= 2 and not r.get("flags") for r in rows)
    c2 = t["runs"]["concurrency"]["points"][0]
    assert c2["streams"] == 2 and c2["errors"] == 0
    assert all(r["completion_tokens"] == 2 for r in c2["rows"])  # ignore_eos honoured by our server
    assert c2["median"]["total_tps"] > 0 and c2["median"]["ttft_p95_s"] >= c2["median"]["ttft_p50_s"]
