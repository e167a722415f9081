"""The CPU speculation benches behind docs/hotpath.md "Drafts on the CPU" run end to end on the real 0.5B (tiny
settings): engine/bench/cpu_spec.py (answers asserted equal to plain decoding) and engine/bench/cpu_rows.py."""
import json

import pytest

from engine.bench import cpu_rows, cpu_spec


def test_cpu_spec_writes_speedups_per_setting(tmp_path, model_path):
    out = tmp_path / "spec.json"
    assert cpu_spec.main(["--templates", "rewrite", "--drafts", "0,1", "--texts", "1", "--rounds", "1",
                          "--max-tokens", "12", "--out", str(out)]) == 0
    row = json.loads(out.read_text())["templates"]["rewrite"]
    assert row["identical"] and set(row["speedup"]) == {"0", "1"} and row["answer_tokens"] > 0
    with pytest.raises(SystemExit, match="draft-model"):
        cpu_spec.main(["--drafts", "m2"])


def test_cpu_rows_times_verify_rows_and_drafts(tmp_path, model_path):
    out = tmp_path / "rows.json"
    assert cpu_rows.main(["--weights", "int8", "--reps", "1", "--out", str(out)]) == 0
    row = json.loads(out.read_text())["weights"]["int8"]
    assert sorted(map(int, row["forward_ms_by_rows"])) == list(range(1, 10))
    assert row["heads_draft_ms_1"] > 0 and row["full_fp32_head_mb"] > 500
