"""`deepinfer bench` against peers on loopback: tests/fake_peer.py speaks the OpenAI streaming
protocol and Ollama's native API with delays and token counts we chose, so the client clocks,
the usage parsing, the token cross-check, the JSON and the report can be checked exactly."""
from __future__ import annotations

import json

import pytest

from engine.bench import cli, protocol
from engine.bench.session import bundled_tokenizer_and_render
from fake_peer import FakePeer

PREFILL_S, TOKEN_S = 0.03, 0.004


@pytest.fixture(scope="module")
def tok_render():
    return bundled_tokenizer_and_render()


def _peer(tok_render, **kw):
    tok, render = tok_render
    return FakePeer(lambda text: len(tok.encode(text)), render, prefill_s=PREFILL_S, token_s=TOKEN_S, **kw)


def test_bench_against_openai_and_ollama_peers(tok_render, tmp_path, capsys):
    out, rep = tmp_path / "bench_fake.json", tmp_path / "bench" / "bench_fake.md"
    with _peer(tok_render) as oa, _peer(tok_render, model="qwen2.5:3b") as ol:
        rc = cli.main(["--target", "none", "--peer", f"openai:{oa.url}/v1", "--peer", f"ollama:{ol.url}",
                       "--peer-model", "fake-qwen2.5:3b", "--peer-model", "qwen2.5:3b",
                       "--runs", "productivity,decode,prefill,combined,concurrency,memory", "--decode-tokens", "10",
                       "--prefill-lengths", "16,40", "--speed-repeats", "2", "--concurrency", "1,4",
                       "--concurrency-max-tokens", "6", "--out", str(out), "--report", str(rep)])
        oa_reqs, ol_reqs = list(oa.requests), list(ol.requests)
    assert rc == 0, capsys.readouterr().err
    assert "round 1 待办压缩" in capsys.readouterr().err  # progress while running
    res = json.loads(out.read_text(encoding="utf-8"))
    env = res["env"]
    assert env["device"] and env["python"] and env["torch"] and env["git_commit"]
    assert env["command"].startswith("deepinfer bench --target none --peer openai:")
    oa_t, ol_t = res["targets"]
    assert oa_t["info"]["kind"] == "openai" and ol_t["info"]["kind"] == "ollama" and not oa_t["errors"]

    # the protocol went over the wire verbatim
    chat = [b for path, b in oa_reqs if path == "/v1/chat/completions"]
    assert len(chat) == 6  # 1 warmup + 2 rounds, x 2 prompts
    assert chat[0]["messages"] == protocol.messages(protocol.PROMPTS[0][1])
    assert chat[0]["messages"][0]["content"] == "你是一个简洁、可靠的中文个人助理。只输出最终答案，不要复述任务。"
    assert {k: chat[0][k] for k in ("max_tokens", "temperature", "top_p", "top_k", "seed")} == protocol.SAMPLING
    assert chat[0]["stream"] and chat[0]["stream_options"] == {"include_usage": True}
    ol_chat = [b for path, b in ol_reqs if path == "/api/chat"][0]
    assert ol_chat["options"] == {"temperature": 0.0, "top_p": 0.95, "top_k": 50, "seed": 20261026, "num_predict": 64}

    for t in (oa_t, ol_t):
        prod = t["runs"]["productivity"]
        rows = prod["rows"]
        assert [(r["round"], r["prompt"]) for r in rows] == [(0, "CUDA Graph"), (0, "待办压缩"),
                                                              (1, "CUDA Graph"), (1, "待办压缩")]
        # backend usage and our tokenizer agree: 38 and 58 prompt tokens (seed article 3.2)
        assert [(r["prompt_tokens"], r["prompt_tokens_ours"]) for r in rows] == [(38, 38), (58, 58)] * 2
        assert all(r["completion_tokens"] == 12 and r["completion_tokens_ours"] == 12 and not r.get("flags")
                   for r in rows)
        for r in rows:  # client clocks against the known delays: 12 tokens, 11 gaps of TOKEN_S
            assert PREFILL_S <= r["ttft_s"] < PREFILL_S + 0.5
            assert 0 < r["decode_s"] < 11 * TOKEN_S + 0.5  # (a starved client may read chunks late)
            assert r["wall_s"] >= PREFILL_S + 11 * TOKEN_S  # the stream cannot end before the server's delays
            assert r["decode_tps"] == pytest.approx(11 / r["decode_s"])
            assert r["wall_s"] >= r["ttft_s"] + r["decode_s"]
        mid = sorted(r["decode_tps"] for r in rows)[1:3]
        assert prod["median"]["decode_tps"] == pytest.approx(sum(mid) / 2)
        dec = t["runs"]["decode"]["points"][0]
        assert dec["label"] == "tg10" and all(r["completion_tokens"] == 10 for r in dec["rows"])
        pre = t["runs"]["prefill"]["points"]
        assert [p["label"] for p in pre] == ["pp16", "pp40"]
        assert all(r["prompt_tokens"] == r["prompt_tokens_ours"] for p in pre for r in p["rows"])
        assert all(r["prefill_tps"] == pytest.approx(r["prompt_tokens"] / r["ttft_s"]) for r in pre[1]["rows"])
        comb = t["runs"]["combined"]["points"][0]
        assert comb["label"] == "pp48+tg64" and comb["median"]["combined_tps"] > 0
        conc = t["runs"]["concurrency"]["points"]
        assert [p["streams"] for p in conc] == [1, 4] and all(p["errors"] == 0 for p in conc)
        c4 = conc[1]["median"]
        assert c4["ttft_p50_s"] >= PREFILL_S and c4["ttft_p95_s"] >= c4["ttft_p50_s"]
        assert c4["total_tps"] > conc[0]["median"]["total_tps"]  # the fake serves streams in parallel
        assert t["runs"]["memory"]["skipped"]

    # Ollama's own durations are kept beside the client clocks
    r = ol_t["runs"]["productivity"]["rows"][0]
    assert r["native_prefill_s"] >= PREFILL_S and r["native_decode_tps"] == pytest.approx(
        12 / r["native_decode_s"]) and r["native_load_s"] > 0
    gen = [b for path, b in ol_reqs if path == "/api/generate"]
    assert gen and gen[0]["raw"] is True
    oa_gen = [b for path, b in oa_reqs if path == "/v1/completions"]
    assert oa_gen and all(b["ignore_eos"] for b in oa_gen)

    md = rep.read_text(encoding="utf-8")
    assert "## Productivity protocol" in md and "| 1 | 待办压缩 |" in md and "38 / 38" in md
    assert "ollama@" in md and "## Concurrency" in md
    for png in ("bench_fake_productivity.png", "bench_fake_speed.png", "bench_fake_concurrency.png"):
        assert (rep.parent / png).stat().st_size > 5000 and f"]({png})" in md


def test_token_count_mismatch_is_flagged_and_a_dead_peer_is_recorded(tok_render, tmp_path):
    out = tmp_path / "b.json"
    with _peer(tok_render, prompt_skew=3) as skew, _peer(tok_render, usage=False, llama_timings=True) as llama:
        rc = cli.main(["--target", "none", "--peer", f"openai:{skew.url}", "--peer", "openai:http://127.0.0.1:9/v1",
                       "--peer", f"openai:{llama.url}/v1", "--runs", "productivity", "--warmup", "0",
                       "--repeats", "1", "--quiet", "--out", str(out)])
    assert rc == 1  # a failed target makes the command fail, after writing what it measured
    res = json.loads(out.read_text(encoding="utf-8"))
    ok, dead, no_usage = res["targets"]
    rows = ok["runs"]["productivity"]["rows"]
    assert [r["prompt_tokens"] for r in rows] == [41, 61]
    assert rows[0]["flags"] == ["prompt tokens: backend 41 vs ours 38"]
    assert "cannot reach" in dead["errors"]["open"]
    # no usage in the stream: the count comes from our tokenizer, flagged; llama.cpp "timings" kept as native
    r = no_usage["runs"]["productivity"]["rows"][0]
    assert r["completion_tokens"] == 12 and r["decode_tps"] == pytest.approx(11 / r["decode_s"])
    assert "completion tokens counted with our tokenizer (no usage)" in r["flags"]
    assert r["native_prefill_s"] == pytest.approx(PREFILL_S) and r["native_decode_tps"] > 0
