"""Benchmark arithmetic and the plan, without a model: medians from known rows (the seed
article's own 3B table, section 3.3), percentiles, decode tok/s, the README table."""
from __future__ import annotations

import pytest

from engine.bench import cli, protocol, readme_table, stats
from engine.errors import BadRequestError

# Seed article 3.3: 3B DeepInfer SM86 native, per round (wall, prefill, decode, completion, tps).
SEED_ROWS = [
    dict(wall_s=0.863216, ttft_s=0.456009, decode_s=0.400732, completion_tokens=18, decode_tps=44.918),
    dict(wall_s=1.004158, ttft_s=0.549768, decode_s=0.448161, completion_tokens=20, decode_tps=44.627),
    dict(wall_s=0.861360, ttft_s=0.454701, decode_s=0.399181, completion_tokens=18, decode_tps=45.092),
    dict(wall_s=0.926476, ttft_s=0.455816, decode_s=0.450063, completion_tokens=20, decode_tps=44.438),
]


def test_medians_match_the_seed_articles_published_medians():
    m = stats.summarize(SEED_ROWS, protocol.ROW_KEYS)
    assert m["ttft_s"] == pytest.approx(0.4559, abs=5e-5)  # article: prefill 0.4559 s
    assert m["decode_tps"] == pytest.approx(44.7725, abs=1e-6)  # article: 44.773 (rounded)
    assert m["wall_s"] == pytest.approx(0.8948, abs=5e-5)  # article: wall 0.8948 s
    assert m["completion_tokens"] == 19


def test_median_percentile_and_missing_values():
    assert stats.median([3, 1, 2]) == 2
    assert stats.median([4, 1, 3, 2]) == 2.5
    assert stats.median([]) is None
    assert stats.percentile([1, 2, 3, 4, 5], 50) == 3
    assert stats.percentile([1, 2, 3, 4, 5], 95) == pytest.approx(4.8)  # numpy's linear rule
    assert stats.percentile([7], 95) == 7
    rows = [{"a": 1.0, "b": None}, {"a": 3.0, "b": True}, {"a": None}]
    assert stats.summarize(rows, ["a", "b", "c"]) == {"a": 2.0}  # None and bools are not numbers here
    sp = stats.spread([1, 2, 3, 10])
    assert (sp["median"], sp["mean"], sp["min"], sp["max"], sp["n"]) == (2.5, 4.0, 1, 10, 4)


def test_decode_tps_excludes_the_first_token():
    assert protocol.decode_tps(18, 0.5) == pytest.approx(34.0)
    assert protocol.decode_tps(1, 0.5) is None and protocol.decode_tps(10, 0.0) is None


def _args(argv):
    import argparse
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    return p.parse_args(argv)


def test_plan_dry_run_and_bad_input(capsys):
    assert cli.run(_args(["--runs", "all", "--dry-run", "--peer", "ollama:http://127.0.0.1:9", "--peer-model",
                          "qwen2.5:3b"]), []) == 0
    out = capsys.readouterr().out
    assert "ollama:http://127.0.0.1:9 model qwen2.5:3b" in out and "max_context 32768" in out
    assert "'max_tokens': 64" in out and "'seed': 20261026" in out and "MODIFIED" not in out
    plan = cli.build_plan(_args(["--runs", "prefill", "--prefill-lengths", "48,512,2048"]))
    assert plan["max_context"] == 2304 and not plan["protocol_modified"]
    assert cli.build_plan(_args(["--max-tokens", "4"]))["protocol_modified"]
    assert cli.build_plan(_args(["--repeats", "1"]))["protocol_modified"]
    with pytest.raises(BadRequestError, match="unknown run"):
        cli.build_plan(_args(["--runs", "productivity,speedy"]))
    with pytest.raises(BadRequestError, match="openai:URL or ollama:URL"):
        cli.build_plan(_args(["--peer", "http://127.0.0.1:8080"]))
    assert cli.main(["--runs", "bogus"]) == 1  # one-line error, no traceback
    assert "error: unknown run(s) bogus" in capsys.readouterr().err


def test_readme_table_puts_labelled_peer_baseline_beside_our_numbers():
    res = {"env": {"device": "NVIDIA H200", "git_commit": "abcdef1234567"},
           "targets": [{"spec": "inproc", "info": {"name": "deepinfer-inproc", "model": "ckpt/3b-w4",
                                                   "layers": 36, "hidden": 2048},
                        "runs": {"decode": {"points": [{"label": "tg128", "median": {"decode_tps": 1234.5}}]},
                                 "prefill": {"points": [{"label": "pp512", "median": {"prefill_tps": 50000.0}}]},
                                 "combined": {"points": [{"label": "pp48+tg64",
                                                          "median": {"combined_tps": 900.0}}]}}},
                       {"spec": "ollama:http://x", "info": {"name": "ollama@x"}, "runs": {}}]}
    md = readme_table.table([("docs/results/bench_gpu_3b.json", res)])
    lines = md.splitlines()
    ours = [ln for ln in lines if ln.startswith("| DeepInfer")]
    peer = [ln for ln in lines if ln.startswith("| llama.cpp")]
    assert len(ours) == 1 and "1,234.5" in ours[0] and "50,000.0" in ours[0] and "900.0" in ours[0]
    assert len(peer) == 1 and "3B shape" in peer[0] and "407.7" in peer[0] and "peer-baseline" in peer[0]
    assert "not from this run" in peer[0] and "ollama" not in md.split("Decode =")[0]


def test_report_renders_gpu_memory_and_skips(tmp_path):
    from engine.bench import report
    res = {"env": {"device": "NVIDIA H200", "driver": "580", "cuda_runtime": "13.0", "cpu": "x", "cpu_count": 16,
                   "python": "3.12", "torch": "2.11", "git_commit": "abc", "time_utc": "t",
                   "command": "deepinfer bench --runs memory,concurrency"},
           "targets": [{"spec": "inproc", "info": {"name": "deepinfer-inproc", "kind": "inproc"}, "load_s": 1.5,
                        "errors": {"longctx": "ContextOverflowError: too long"},
                        "runs": {"memory": {"memory": {"weights_bytes": 2**30, "graphs": [1, 4],
                                                       "peak_allocated_bytes": 3 * 2**30}},
                                 "concurrency": {"skipped": "needs an HTTP endpoint", "points": []}}}]}
    path = report.write_report(res, tmp_path / "r.md")
    md = path.read_text(encoding="utf-8")
    assert "| deepinfer-inproc | 1.000 GiB | 3.000 GiB |" in md  # weights, peak allocated; the list is left out
    assert "longctx: FAILED ContextOverflowError" in md and "concurrency: skipped (needs an HTTP endpoint)" in md
    assert "driver 580, CUDA 13.0" in md
