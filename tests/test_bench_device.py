"""engine/bench/device.py, the device entry point, on the CPU: it stops what it started by PID (the whole
process group, nothing else), reads pytest's summary, and writes its JSON under the output folder."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time

from engine.bench import device


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def test_stop_ends_the_started_process_group_only():
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    # a server-like parent with a child of its own, started the way device.py starts `deepinfer serve`
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
           "print('up', flush=True); time.sleep(60)"
    srv = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert srv.stdout.readline().strip() == "up"
        child = next(int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == srv.pid)
        t0 = time.time()
        device.stop(srv, grace=5)
        assert srv.returncode is not None and time.time() - t0 < 5
        for _ in range(50):  # the child got SIGTERM with its group; it is reaped by init
            if not _alive(child) or open(f"/proc/{child}/stat").read().split()[2] == "Z":
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the server's child survived")
        assert bystander.poll() is None  # what this run did not start keeps running
    finally:
        bystander.kill()
        bystander.wait()


def test_pytest_summary_counts():
    text = "....\n=== short test summary info ===\nSKIPPED [1] x\n9 passed, 180 deselected, 2 warnings, 8 errors in 44.00s\n"
    assert device.pytest_counts(text) == {"passed": 9, "deselected": 180, "errors": 8}
    assert device.pytest_counts("no tests ran") == {}


def test_tests_suite_runs_pytest_m_gpu_and_writes_json(tmp_path):
    """The tests suite end to end with the real pytest on a small test folder of its own (no GPU needed:
    its GPU test asserts nothing about a device); `pytest -m gpu` picks the marked test, deselects the other."""
    tests = tmp_path / "t"
    tests.mkdir()
    (tests / "test_x.py").write_text("import pytest\n\n@pytest.mark.gpu\ndef test_on_gpu():\n    assert True\n\n"
                                     "def test_cpu_only():\n    assert True\n")
    out = tmp_path / "out"
    assert device.main(["--suite", "tests", "--tests", str(tests), "--out", str(out), "--models", str(tmp_path)]) == 0
    summary = json.loads((out / "device_tests.json").read_text())
    assert summary["tests"]["passed"] == 1 and summary["tests"]["deselected"] == 1 and summary["tests"]["rc"] == 0
    assert [s["name"] for s in summary["steps"]] == ["pytest_gpu"] and "-m gpu" in summary["steps"][0]["cmd"]
    assert "1 passed" in (out / "pytest_gpu.txt").read_text()
    assert not (out / "logs").exists() and "logs" in tarfile.open(out / "logs.tar.gz").getnames()


def test_decode_bench_mixed_scheme_weights_follow_the_scheme():
    """decode_bench's "7b:mixed" (random weights of the mixed scheme, engine/quant/scheme.py): attention and the first
    and last layers 4-bit, the other layers' MLP 3-bit, group 128 (built on the CPU here, on the GPU there)."""
    import torch
    from engine.bench.decode_bench import scheme_weights
    from engine.config import ModelConfig
    cfg = ModelConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_layers=4, num_heads=2,
                      num_kv_heads=1)
    w = scheme_weights(cfg, "mixed", torch.device("cpu"))
    bits = [(L.qkv.bits, L.o.bits, L.gate_up.bits, L.down.bits) for L in w.layers]
    assert bits == [(4, 4, 4, 4), (4, 4, 3, 3), (4, 4, 3, 3), (4, 4, 4, 4)]
    assert w.lm_head.bits == 4 and all(L.down.group == 128 for L in w.layers)
    assert [L.down.bits for L in scheme_weights(cfg, 3, torch.device("cpu")).layers] == [3] * 4


def test_tg128_line_from_a_bench_json(tmp_path, capsys):
    """engine/bench/tg128.py, what the device A/B scripts print per variant: the median, or why it failed."""
    from engine.bench import tg128

    p = tmp_path / "b.json"
    rows = [{"decode_tps": v} for v in (700.0, 690.0, 710.0)]
    p.write_text(json.dumps({"targets": [{"runs": {"decode": {"points": [{"rows": rows}]}}}]}))
    tg128.main([str(p), "six_a", "-DX=1"])
    tg128.main([str(tmp_path / "missing.json"), "bytes_b"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "six_a      [-DX=1] tg128 decode 700.0 tok/s"
    assert out[1].startswith("bytes_b failed:")


def test_sass_listing_parsed_per_kernel():
    """engine/bench/sass_same.py reads cuobjdump's listing: instructions per kernel, addresses and encodings dropped,
    so two builds compare instruction for instruction."""
    from engine.bench.sass_same import parse_sass

    listing = """
        Function : gemv_a
        .headerflags    @"EF_CUDA_SM90"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                  /* 0x00000a00ff017b82 */
                                                                           /* 0x000fe40000000800 */
        /*0010*/              @!P0 IMAD.MOV.U32   R2,  RZ, RZ, 0x1 ;       /* 0x00000001ff028424 */
        Function : embed_rows
        /*0000*/                   EXIT ;                                  /* 0x000000000000794d */
"""
    got = parse_sass(listing)
    assert got == {"gemv_a": ["LDC R1, c[0x0][0x28]", "@!P0 IMAD.MOV.U32 R2, RZ, RZ, 0x1"], "embed_rows": ["EXIT"]}
