"""PNG plots for the report (matplotlib, Agg backend). Labels are ASCII only: the default fonts
have no CJK glyphs, so prompts are named "prompt 1/2", not by their Chinese text."""
from __future__ import annotations

import re
from pathlib import Path


def _plt():
    try:
        import matplotlib  # matplotlib: dev extra
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # matplotlib: dev extra
        return plt
    except Exception:
        return None


def _name(t):
    return t.get("info", {}).get("name") or t.get("spec") or "?"


def _prod_rows(res):
    return [(_name(t), t["runs"]["productivity"]["rows"]) for t in res["targets"] if "productivity" in t["runs"]]


def _bars(plt, ax, groups: list[str], series: dict[str, list], ylabel: str, title: str):
    n = max(len(series), 1)
    width = 0.8 / n
    for j, (label, vals) in enumerate(series.items()):
        xs = [i + (j - (n - 1) / 2) * width for i in range(len(groups))]
        bars = ax.bar(xs, [v or 0 for v in vals], width, label=label)
        for b, v in zip(bars, vals):
            if v:
                ax.annotate(f"{v:.3g}", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center",
                            va="bottom", fontsize=7)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if len(series) > 1:
        ax.legend(fontsize=7)


def write_plots(res: dict, folder: Path, stem: str) -> list[tuple[str, str]]:
    """Writes STEM_*.png into folder; returns [(alt text, file name)]."""
    plt = _plt()
    if plt is None:
        return []
    out = []
    prod = _prod_rows(res)
    if prod:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        names = [n for n, _ in prod]
        for k, (key, ylabel, title) in enumerate([("decode_tps", "tokens/s", "Productivity: decode tok/s per round"),
                                                  ("wall_s", "seconds", "Productivity: wall and TTFT per round")]):
            ax = axes[k]
            series = {}
            for name, rows in prod:
                for r in rows:
                    lab = f"r{r['round']} p{1 + [x['prompt'] for x in rows].index(r['prompt'])}"
                    series.setdefault(lab, {})[name] = r.get(key)
                    if key == "wall_s":
                        series.setdefault(lab + " ttft", {})[name] = r.get("ttft_s")
            _bars(plt, ax, names, {lab: [d.get(n) for n in names] for lab, d in series.items()}, ylabel, title)
        fig.tight_layout()
        out.append(("productivity protocol per round", _save(plt, fig, folder, f"{stem}_productivity.png")))
    speed = _speed_series(res)
    if speed:
        fig, ax = plt.subplots(figsize=(10, 4))
        groups = sorted({g for d in speed.values() for g in d}, key=_order)
        _bars(plt, ax, groups, {n: [d.get(g) for g in groups] for n, d in speed.items()}, "tokens/s (log)",
              "Speed runs: tok/s per backend (median)")
        ax.set_yscale("log")
        fig.tight_layout()
        out.append(("speed runs tokens/s", _save(plt, fig, folder, f"{stem}_speed.png")))
    conc = [(_name(t), t["runs"]["concurrency"]["points"]) for t in res["targets"]
            if t["runs"].get("concurrency", {}).get("points")]
    if conc:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for name, pts in conc:
            xs = [p["streams"] for p in pts]
            line, = axes[0].plot(xs, [p["median"].get("total_tps") or 0 for p in pts], marker="o", label=name)
            c = line.get_color()
            axes[1].plot(xs, [p["median"].get("ttft_p50_s") or 0 for p in pts], marker="o", color=c,
                         label=f"{name} p50")
            axes[1].plot(xs, [p["median"].get("ttft_p95_s") or 0 for p in pts], marker="x", ls="--", color=c,
                         label=f"{name} p95")
        axes[0].set(xlabel="streams", ylabel="total tokens/s", title="Concurrency: total tok/s")
        axes[1].set(xlabel="streams", ylabel="seconds", title="Concurrency: time to first token")
        for ax in axes:
            ax.legend(fontsize=7)
        fig.tight_layout()
        out.append(("concurrency", _save(plt, fig, folder, f"{stem}_concurrency.png")))
    return out


def _order(label: str):
    m = re.match(r"([a-z+]+?)(\d+)", label)
    return (m.group(1), int(m.group(2))) if m else (label, 0)


def _speed_series(res: dict) -> dict[str, dict[str, float]]:
    """backend -> {"tg128": decode tok/s, "pp512": prefill tok/s, "pp48+tg64": combined, "ctx4096": decode}."""
    key = {"decode": "decode_tps", "prefill": "prefill_tps", "combined": "combined_tps", "longctx": "decode_tps"}
    out: dict[str, dict[str, float]] = {}
    for t in res["targets"]:
        for run, k in key.items():
            for p in t["runs"].get(run, {}).get("points", []):
                v = p.get("median", {}).get(k)
                if v:
                    out.setdefault(_name(t), {})[p["label"]] = v
    return out


def _save(plt, fig, folder: Path, name: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    fig.savefig(folder / name, dpi=110)
    plt.close(fig)
    return name
