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



def test_module_command_names_the_module_not_a_machine_path(tmp_path):
    """Results files are committed: a bench run as `python -m MODULE` records that, not sys.argv[0] (the module
    file's absolute path), and paths inside the checkout come out repo-relative."""
    import os
    import subprocess
    import sys

    from engine.bench.envinfo import REPO, module_command
    (tmp_path / "benchmod.py").write_text("from engine.bench.envinfo import module_command\nprint(module_command())\n")
    out = subprocess.run([sys.executable, "-m", "benchmod", str(REPO / "docs" / "x.json"), "--n", "2"], cwd=tmp_path,
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}).stdout.strip()
    assert out == "python -m benchmod docs/x.json --n 2", out
    assert module_command(["--out", str(REPO / "a.json")]).endswith(" --out a.json")
