"""The README's performance table: our numbers from results JSON(s) beside the llama.cpp figures
of docs/peer-baseline.md, which are labelled as peer-baseline figures (a separate run on
the same kind of machine, not a side-by-side measurement).

  python -m engine.bench.readme_table docs/results/bench_gpu_3b.json docs/results/bench_gpu_7b.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# docs/peer-baseline.md: llama.cpp 0.5.0, llama-bench -ngl 99 -fa 1 -r 5, one H200,
# driver 580.159.04, CUDA 13.0, measured 2026-11-30; random-weight Q4_K_M GGUF of the exact shapes.
PEER_BASELINE = {
    "3b": {"model": "Qwen2.5-3B shape, Q4_K_M (1.79 GiB)", "tg128": 407.7, "pp48": 5371, "pp512": 15729,
           "pp2048": 16275, "pp48+tg64": 665.5},
    "7b": {"model": "Qwen2.5-7B shape, Q4_K_M (4.36 GiB)", "tg128": 282.1, "pp48": 4541, "pp512": 9844,
           "pp2048": 9972, "pp48+tg64": 465.9},
}
PEER_LABEL = ("llama.cpp 0.5.0 — peer-baseline figures (docs/peer-baseline.md: "
              "llama-bench, H200, 2026-11-30; not from this run)")
SHAPES = {(36, 2048): "3b", (28, 3584): "7b", (24, 896): "0.5b", (28, 1536): "1.5b"}
COLUMNS = ["tg128", "pp48", "pp512", "pp2048", "pp48+tg64"]


def _shape(info: dict) -> str | None:
    return SHAPES.get((info.get("layers"), info.get("hidden")))


def our_rows(res: dict, source: str) -> list[dict]:
    rows = []
    for t in res["targets"]:
        if not (t.get("spec") == "inproc" or str(t.get("spec")).startswith("http:")):
            continue  # peers measured in the same run are reported by report.py, not claimed here
        runs, vals = t["runs"], {}
        for p in runs.get("decode", {}).get("points", []):
            vals[p["label"]] = p.get("median", {}).get("decode_tps")
        for p in runs.get("prefill", {}).get("points", []):
            vals[p["label"]] = p.get("median", {}).get("prefill_tps")
        for p in runs.get("combined", {}).get("points", []):
            vals["pp48+tg64"] = p.get("median", {}).get("combined_tps")
        prod = runs.get("productivity", {}).get("median", {})
        info = t["info"]
        rows.append({"backend": f"DeepInfer ({info.get('name')})", "model": info.get("model"),
                     "shape": _shape(info), "device": res["env"]["device"], "values": vals,
                     "productivity_tps": prod.get("decode_tps"), "productivity_ttft": prod.get("ttft_s"),
                     "source": f"`{source}` (commit {str(res['env'].get('git_commit'))[:10]})"})
    return rows


def _cell(v, digits=1):
    return "-" if v is None else f"{v:,.{digits}f}"


def table(results: list[tuple[str, dict]]) -> str:
    ours = [r for src, res in results for r in our_rows(res, src)]
    shapes = [r["shape"] for r in ours if r["shape"] in PEER_BASELINE] or list(PEER_BASELINE)
    head = ("| backend | model | device | decode tg128 tok/s | prefill pp48 tok/s | pp512 tok/s | pp2048 tok/s | "
            "pp48+tg64 tok/s | productivity decode tok/s / TTFT | source |")
    lines = [head, "|" + "---|" * 10]
    for r in ours:
        v = r["values"]
        prod = ("-" if r["productivity_tps"] is None else
                f"{r['productivity_tps']:.1f} / {r['productivity_ttft']:.3f} s")
        lines.append(f"| {r['backend']} | {r['model']} | {r['device']} | " +
                     " | ".join(_cell(v.get(c)) for c in COLUMNS) + f" | {prod} | {r['source']} |")
    for s in dict.fromkeys(shapes):
        p = PEER_BASELINE[s]
        lines.append(f"| {PEER_LABEL} | {p['model']} | NVIDIA H200 | " +
                     " | ".join(_cell(p[c]) for c in COLUMNS) + " | - | peer-baseline.md |")
    notes = ["", "Decode = batch 1, EOS ignored, (tokens - 1) / (last - first token time); prefill = prompt tokens / "
             "time to first token; pp48+tg64 = 112 tokens / wall. llama.cpp rows are llama-bench figures copied "
             "from docs/peer-baseline.md (same machine type, different run), not a side-by-side "
             "measurement; a speed-up claim needs both backends in one run's JSON."]
    return "\n".join(lines + notes) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench.readme_table", description=__doc__.splitlines()[0])
    p.add_argument("json", nargs="+", help="results JSON(s) from `deepinfer bench`")
    p.add_argument("--out", default=None, help="write the Markdown here instead of stdout")
    a = p.parse_args(argv)
    results = [(j, json.loads(Path(j).read_text(encoding="utf-8"))) for j in a.json]
    md = table(results)
    if a.out:
        Path(a.out).write_text(md, encoding="utf-8")
    else:
        sys.stdout.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
