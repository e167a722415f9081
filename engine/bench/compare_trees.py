"""Same-machine speed of several source trees of this repository (a change costs no speed, or says how much).

    python -m engine.bench.compare_trees --model /tmp/r3b --tree before=/tmp/before --tree after=. \
        --rounds 2 --out $OUT/redesign_speed_h200.json
    python -m engine.bench.compare_trees --device cpu --model qwen2.5-coder-0.5b --tree before=../before \
        --tree after=. --rounds 2 --bench-args "--decode-tokens 16 --prefill-lengths 48 --speed-repeats 2" \
        --work /tmp/cmp --out docs/results/redesign_speed_cpu.json

Each round runs `python -m engine.bench.cli --runs decode,prefill` once per tree, the trees in turn (so
slow drift of the machine hits every tree alike), each in its own process with PYTHONPATH=<tree>.
Reported per tree: tg128 (decode tok/s at batch 1 after a 16-token prompt) and pp48/pp512/pp2048
(prefill tok/s), the median of each bench's repeats per round, then the median over rounds, and each
tree's ratio to the first tree. Every run's bench JSON is kept (--work).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def points(bench: dict) -> dict[str, float]:
    """{'tg128': decode tok/s, 'pp512': prefill tok/s, ...} from a deepinfer-bench/1 JSON (medians)."""
    runs = bench["targets"][0]["runs"]
    out = {}
    for run, key in (("decode", "decode_tps"), ("prefill", "prefill_tps")):
        for p in runs.get(run, {}).get("points", []):
            v = p.get("median", {}).get(key)
            if v is not None:
                out[p["label"]] = v
    return out


def git_commit(tree: Path) -> str:
    r = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() or os.environ.get(f"TREE_COMMIT_{tree.name.upper()}", "unknown")


def command(argv: list[str] | None) -> str:
    """This run's command line, the device's output folder written as $OUT (no machine paths in docs/)."""
    line = "python -m engine.bench.compare_trees " + " ".join(argv if argv is not None else sys.argv[1:])
    return line.replace(os.environ["OUT"], "$OUT") if os.environ.get("OUT") else line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tree", action="append", required=True, help="NAME=PATH (the first is the baseline)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--bench-args", default="", help="extra `deepinfer bench` options (e.g. fewer tokens on a CPU)")
    ap.add_argument("--budget-s", type=float, default=0, help="start no new round after this many seconds")
    ap.add_argument("--note", action="append", default=[], help="NAME=text describing a tree")
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default=None, help="folder for each run's bench JSON (default: beside --out)")
    a = ap.parse_args(argv)
    trees = [(n, Path(p).resolve()) for n, p in (t.split("=", 1) for t in a.tree)]
    notes = dict(n.split("=", 1) for n in a.note)
    out = Path(a.out)
    work = Path(a.work or out.parent)
    for d in (out.parent, work):
        d.mkdir(parents=True, exist_ok=True)
    res = {"schema": "deepinfer-compare-trees/1", "model": a.model, "command": command(argv),
           "trees": {n: {"path": str(p), "commit": git_commit(p), "note": notes.get(n, ""), "rounds": []}
                     for n, p in trees}}
    t0 = time.time()
    for r in range(a.rounds):
        if r and a.budget_s and time.time() - t0 > a.budget_s:
            break
        for name, path in trees:
            js = work / f"bench_{name}_r{r}.json"
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(path), os.environ.get("PYTHONPATH")]))}
            cmd = [sys.executable, "-m", "engine.bench.cli", "--model", a.model, "--device", a.device, "--quiet",
                   "--runs", "decode,prefill", "--out", str(js), *a.bench_args.split()]
            t1 = time.time()
            p = subprocess.run(cmd, cwd=path, env=env, capture_output=True, text=True)
            row = {"rc": p.returncode, "seconds": round(time.time() - t1, 1)}
            if p.returncode == 0 and js.exists():
                bench = json.loads(js.read_text())
                row.update(points(bench), load_s=bench["targets"][0].get("load_s"),
                           errors=bench["targets"][0].get("errors"))
                if r == 0:
                    res["env"] = bench.get("env")
            else:
                row["output_tail"] = (p.stdout + p.stderr)[-2000:]  # the bench reports its errors on stdout
            res["trees"][name]["rounds"].append(row)
            print(name, r, {k: v for k, v in row.items() if k != "output_tail"}, flush=True)
    base = None
    for name, _ in trees:
        t = res["trees"][name]
        labels = sorted({k for row in t["rounds"] for k in row if k.startswith(("tg", "pp"))})
        t["median"] = {k: statistics.median(row[k] for row in t["rounds"] if k in row) for k in labels}
        base = base or t["median"]
        t["ratio_to_first"] = {k: v / base[k] for k, v in t["median"].items() if base.get(k)}
    out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
