"""engine/bench/envinfo.py: what every bench JSON says about where it ran, the host's single-thread speed included
(host-bound paths differ between leases of the same CPU name)."""
from engine.bench.envinfo import environment, host_loop_ns


def test_environment_names_the_host_and_its_speed():
    env = environment(["--runs", "decode"])
    assert env["device_kind"] in ("cpu", "cuda") and env["cpu_count"] >= 1
    assert env["command"] == "deepinfer bench --runs decode"
    assert 0.5 < env["host_loop_ns"] < 5_000  # ~20-60 ns per iteration on a current x86 core
    assert 0 < host_loop_ns(n=1000, reps=1)


def test_environment_records_the_engine_switches(monkeypatch):
    """A run with DEEPINFER_DECODE_Q8 measured other kernels and numerics: its JSON says so."""
    monkeypatch.setenv("DEEPINFER_DECODE_Q8", "1")
    monkeypatch.setenv("DEEPINFER_GIT_COMMIT", "abc1234")
    monkeypatch.setenv("OTHER_VAR", "x")
    env = environment([])
    assert env["knobs"].get("DEEPINFER_DECODE_Q8") == "1"
    assert "OTHER_VAR" not in env["knobs"] and "DEEPINFER_GIT_COMMIT" not in env["knobs"]
    assert env["git_commit"] == "abc1234"
