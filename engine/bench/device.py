"""Device work as code: the one entry point for a GPU machine (replaces the old kernels/bench/device_*.sh).

    python -m engine.bench.device --suite tests|decode|prefill|server|structured|gguf|all [--shapes 3b,7b] [--out DIR]

tests    `pytest -m gpu` over tests/ (every GPU test, no hand-picked list); the checks that assert live there
decode   random-weight W4 checkpoints (`deepinfer make-random`), `deepinfer bench` decode + long context + memory
prefill  the same checkpoints, `deepinfer bench` productivity protocol + prefill + prefill-then-decode
server   `deepinfer serve` on the GPU (random 3B W4) under 1/4/16 streaming clients (engine/server/loadtest.py)
gguf     a random Q4_K_M GGUF per shape (`deepinfer make-random --format gguf`) decoded as it is (lossless layouts)
quality  with --real-model: the GGUF run as it is on the GPU vs its float32 reference (engine/quant/eval_quality.py --device cuda)
hotpath  with --real-model: prefix cache and speculation on it (engine/bench/hotpath.py)
all      all of the above; decode and prefill share one bench per shape (one load), and the constrained-decoding
         bench (engine/bench/structured_decode.py) on the random 3B
--before TREE   also: the same-machine speed of an older source tree vs this one on the random 3B
                (engine/bench/compare_trees.py: a change costs no speed, or says how much)
--real-model F  the real Qwen2.5-Coder-0.5B GGUF (moved to the device in parts): put into the model cache so the
                GPU tests that need it run (and the quality / hotpath suites, which need it)
Benches only measure. Everything goes under $OUT (or --out): device_<suite>.json (each step's command, exit
status and seconds, the pytest counts and the headline numbers), the bench / loadtest JSON, pytest_gpu.txt and
logs.tar.gz. What it starts it stops by PID. DEEPINFER_GIT_COMMIT names the commit measured.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

from engine.bench.readme_table import our_rows
from engine.hub import store

PY = sys.executable
RUNS = {"decode": ["decode", "memory"], "prefill": ["productivity", "prefill", "combined"]}
LONGCTX_SHAPES = ("3b",)  # the 32k-token decode points take minutes on 7B
PORT = 18123


class Device:
    def __init__(self, out: Path, models: Path):
        self.out, self.models, self.logs = out, models, out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.steps: list[dict] = []
        self.summary: dict = {"commit": os.environ.get("DEEPINFER_GIT_COMMIT", "unknown"), "steps": self.steps}

    def step(self, name: str, cmd: list[str], timeout: float, log: str | None = None) -> int:
        """Run cmd (output to logs/<name>.txt or `log`), record rc and seconds; a timeout is rc 124."""
        path = Path(log) if log else self.logs / f"{name}.txt"
        t0 = time.time()
        print(f"=== {name}: {' '.join(cmd)}", flush=True)
        with open(path, "w") as f:
            try:
                rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                rc = 124
        self.steps.append({"name": name, "cmd": " ".join(cmd), "rc": rc, "seconds": round(time.time() - t0, 1),
                           "log": str(path.relative_to(self.out))})
        print(f"    rc={rc} in {time.time() - t0:.0f} s", flush=True)
        return rc

    def checkpoint(self, shape: str) -> str:
        path = self.models / f"random-{shape}-w4"
        if not (path / "manifest.json").is_file():
            self.step(f"make_random_{shape}", [PY, "-m", "engine", "make-random", "--shape", shape, "--scheme", "w4",
                                               "--out", str(path)], 600)
        return str(path)

    # --- suites ---------------------------------------------------------------------------
    def tests(self, timeout: float, where: str = "tests"):
        log = self.out / "pytest_gpu.txt"
        # a test module that cannot be imported there (a CPU test's optional package) is counted as an error
        # instead of stopping the GPU tests from running
        rc = self.step("pytest_gpu", [PY, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider",
                                      "--continue-on-collection-errors", where], timeout, str(log))
        self.summary["tests"] = {"rc": rc, **pytest_counts(log.read_text(errors="replace"))}

    def bench(self, shape: str, runs: list[str], timeout: float):
        runs = runs + (["longctx"] if "decode" in runs and shape in LONGCTX_SHAPES else [])
        out = self.out / f"bench_gpu_{shape}.json"
        self.step(f"bench_{shape}", [PY, "-m", "engine.bench.cli", "--model", self.checkpoint(shape), "--device",
                                     "cuda", "--quiet", "--runs", ",".join(runs), "--out", str(out)], timeout)
        if out.is_file():
            self.summary.setdefault("bench", {})[shape] = bench_headline(json.loads(out.read_text()))

    def server(self, timeout: float):
        model, url = self.checkpoint("3b"), f"http://127.0.0.1:{PORT}"
        log = open(self.logs / "serve_3b.txt", "w")
        cmd = [PY, "-m", "engine", "serve", "--model", model, "--device", "cuda", "--max-batch", "16",
               "--max-context", "2048", "--port", str(PORT)]
        print(f"=== serve: {' '.join(cmd)}", flush=True)
        srv = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            if not wait_health(url, srv, 180):
                self.steps.append({"name": "serve_3b", "cmd": " ".join(cmd), "rc": srv.poll(), "log": "logs/serve_3b.txt",
                                   "error": "no /health within 180 s"})
                return
            out = self.out / "server_loadtest_3b.json"
            self.step("loadtest_3b", [PY, "-m", "engine.server.loadtest", "--url", url, "--streams", "1,4,16",
                                      "--max-tokens", "64", "--out", str(out)], timeout)
            if out.is_file():
                self.summary["server"] = loadtest_headline(json.loads(out.read_text()))
        finally:
            stop(srv)
            log.close()

    def compare(self, before: str, timeout: float):
        out = self.out / "redesign_speed_h200.json"
        self.step("compare_trees", [PY, "-m", "engine.bench.compare_trees", "--model", self.checkpoint("3b"),
                                    "--tree", f"before={before}", "--tree", "after=.", "--rounds", "3",
                                    "--budget-s", str(int(timeout * 0.8)), "--work", str(self.models / "compare"),
                                    "--out", str(out)], timeout)
        if out.is_file():
            res = json.loads(out.read_text())
            self.summary["compare"] = {t: v.get("ratio_to_first") for t, v in res.get("trees", {}).items()}

    def gguf(self, shape: str, timeout: float):
        """A random Q4_K_M GGUF of the shape (valid blocks, llama.cpp's per-tensor types) run as it is: decode."""
        path = self.models / f"random-{shape}-q4_k_m.gguf"
        if not path.is_file():
            self.step(f"make_random_gguf_{shape}", [PY, "-m", "engine", "make-random", "--shape", shape, "--format",
                                                    "gguf", "--out", str(path)], 600)
        out = self.out / f"bench_gpu_{shape}_q4_k_m.json"
        self.step(f"bench_gguf_{shape}", [PY, "-m", "engine.bench.cli", "--model", str(path), "--device", "cuda",
                                          "--quiet", "--runs", "decode", "--out", str(out)], timeout)
        if out.is_file():
            self.summary.setdefault("bench_gguf", {})[shape] = bench_headline(json.loads(out.read_text()))

    def structured(self, timeout: float):
        out = self.out / "structured_decode_gpu_3b.json"
        self.step("structured_3b", [PY, "-m", "engine.bench.structured_decode", "--model", self.checkpoint("3b"),
                                    "--device", "cuda", "--out", str(out)], timeout)

    def real_model(self, gguf: str):
        """Put the real 0.5B where the model store looks (DEEPINFER_MODELS), marked verified (sha256 checked here)."""
        cache = self.models / "store"
        os.environ["DEEPINFER_MODELS"] = str(cache)
        name = "qwen2.5-coder-0.5b"
        dest = store.model_path(name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists():
            try:
                os.link(gguf, dest)
            except OSError:  # another file system
                shutil.copy(gguf, dest)
        digest = store.sha256_file(dest)
        self.summary["real_model"] = {"name": name, "sha256": digest, "size": dest.stat().st_size}
        dest.with_suffix(".verified").write_text(digest + "\n")
        return name

    def hotpath(self, model: str, timeout: float):
        out = self.out / "hotpath_gpu_0.5b.json"
        self.step("hotpath_0.5b", [PY, "-m", "engine.bench.hotpath", "--model", model, "--device", "cuda",
                                   "--texts", "10", "--out", str(out)], timeout)

    def gpu_quality(self, gguf: str, timeout: float):
        """The real GGUF run as it is on the GPU vs the CPU float32 reference kept in tests/data (keyed by the
        file's name and size): perplexity, top-1 agreement, identical greedy answers (engine/quant/eval_quality.py)."""
        out = self.out / "quant_quality_lossless_gpu_0.5b.json"
        self.step("gpu_quality_0.5b", [PY, "-m", "engine.quant.eval_quality", "--model", gguf, "--schemes", "lossless",
                                       "--device", "cuda", "--ref-cache", "tests/data/quality_ref_0.5b.pt",
                                       "--ref-compact", "--work", str(self.models / "quality"), "--out", str(out)],
                  timeout)
        if out.is_file():
            r = json.loads(out.read_text()).get("schemes", {}).get("lossless", {})
            self.summary["gpu_quality"] = {k: r.get(k) for k in ("perplexity", "perplexity_vs_reference",
                                                                 "teacher_forced_agreement", "identical_answers")}

    def finish(self, suite: str) -> Path:
        with tarfile.open(self.out / "logs.tar.gz", "w:gz") as tar:  # $OUT brings back 8 files: logs in one
            tar.add(self.logs, arcname="logs")
        shutil.rmtree(self.logs)
        path = self.out / f"device_{suite}.json"
        path.write_text(json.dumps(self.summary, indent=1))
        return path


def stop(proc: subprocess.Popen, grace: float = 20):
    """SIGTERM to the process group this run started (by its PID), SIGKILL after `grace` seconds."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_health(url: str, proc: subprocess.Popen, timeout: float) -> bool:
    end = time.time() + timeout
    while time.time() < end and proc.poll() is None:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if json.loads(r.read()).get("state", "ready") == "ready":
                    return True
        except (OSError, ValueError):
            pass
        time.sleep(1)
    return False


def pytest_counts(text: str) -> dict:
    """The counts of pytest's last summary line ("3 failed, 40 passed, 2 skipped in 12.3s")."""
    lines = [l for l in text.splitlines() if re.search(r"\d+ (passed|failed|error|skipped|deselected)", l)]
    return {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected)",
                                            lines[-1] if lines else "")}


def bench_headline(res: dict) -> dict:
    """Decode tok/s (batch 1, tg128) and prefill tok/s (pp512) of a `deepinfer bench` JSON, its errors."""
    rows = our_rows(res, "") if res.get("targets") else []
    v = rows[0]["values"] if rows else {}
    return {"decode_tps": v.get("tg128"), "prefill512_tps": v.get("pp512"), "prefill2048_tps": v.get("pp2048"),
            "errors": res["targets"][0].get("errors") if res.get("targets") else ["no target"]}


def loadtest_headline(res: dict) -> dict:
    """Streams -> aggregate tok/s and TTFT p50 of an engine/server/loadtest.py JSON."""
    return {str(r["streams"]): {"tok_s": r.get("aggregate_tps"), "ttft_p50_ms": r.get("ttft_p50_ms"),
                                "errors": r.get("errors")} for r in res.get("levels", [])}


def print_table(summary: dict):
    print(f"\n{'step':24} {'rc':>4} {'s':>7}")
    for s in summary["steps"]:
        print(f"{s['name']:24} {str(s['rc']):>4} {s.get('seconds', '-'):>7}")
    if "tests" in summary:
        print("pytest -m gpu:", ", ".join(f"{n} {k}" for k, n in summary["tests"].items() if k != "rc") or "no summary")
    for shape, h in summary.get("bench", {}).items():
        print(f"bench {shape}: decode {h['decode_tps']} tok/s, pp512 {h['prefill512_tps']} tok/s, "
              f"pp2048 {h['prefill2048_tps']} tok/s, errors {h['errors']}")
    if "server" in summary:
        print("gateway 3B tok/s by streams:", summary["server"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.bench.device", description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="tests",
                    help="tests|decode|prefill|server|structured|gguf|all, or several: decode,gguf")
    ap.add_argument("--shapes", default="3b,7b", help="checkpoint shapes for decode/prefill (random W4)")
    ap.add_argument("--out", default=os.environ.get("OUT", "device_out"), help="results folder (default $OUT)")
    ap.add_argument("--models", default=os.environ.get("DEEPINFER_MODELS_TMP", "/tmp/deepinfer-device-models"),
                    help="where the random checkpoints are written")
    ap.add_argument("--tests", default="tests", help="where pytest looks for the GPU tests")
    ap.add_argument("--test-timeout", type=float, default=300)
    ap.add_argument("--bench-timeout", type=float, default=300)
    ap.add_argument("--before", default=None, help="an older source tree to compare speed with (3B, same machine)")
    ap.add_argument("--real-model", default=None, help="the real 0.5B GGUF file (GPU tests + hot-path bench on it)")
    a = ap.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    d = Device(Path(a.out), Path(a.models))
    d.summary["suite"] = a.suite
    try:
        d.summary["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                           "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    except OSError:
        d.summary["gpu"] = "nvidia-smi not found"
    known = {"tests", "decode", "prefill", "server", "structured", "gguf", "quality", "hotpath"}
    suites = known if a.suite == "all" else set(a.suite.split(","))
    unknown = suites - known
    if unknown:
        ap.error(f"unknown suite {', '.join(sorted(unknown))}")
    real = d.real_model(a.real_model) if a.real_model else None
    if "tests" in suites:
        d.tests(a.test_timeout, a.tests)
    runs = [r for name in ("decode", "prefill") if name in suites for r in RUNS[name]]
    if runs:
        for shape in a.shapes.split(","):
            d.bench(shape, runs, a.bench_timeout)
    if "gguf" in suites:
        for shape in a.shapes.split(","):
            d.gguf(shape, a.bench_timeout)
    if "server" in suites:
        d.server(a.bench_timeout)
    if "structured" in suites:
        d.structured(a.bench_timeout)
    if a.before:
        d.compare(a.before, a.bench_timeout)
    if real and "quality" in suites:
        d.gpu_quality(a.real_model, a.bench_timeout)
    if real and "hotpath" in suites:
        d.hotpath(real, a.bench_timeout)
    path = d.finish(a.suite.replace(",", "_"))
    print_table(d.summary)
    print(f"wrote {path}")
    return 0 if all(s["rc"] == 0 for s in d.steps) else 1


if __name__ == "__main__":
    sys.exit(main())
