"""Summary statistics for benchmark rows (plain Python: no numpy needed)."""
from __future__ import annotations

import math


def median(xs: list[float]) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    mid = n // 2
    return xs[mid] if n % 2 else (xs[mid - 1] + xs[mid]) / 2


def mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def percentile(xs: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default), q in [0, 100]."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(rows: list[dict], keys: list[str]) -> dict:
    """{key: median over rows} for each key present in the rows (None values are skipped)."""
    out = {}
    for k in keys:
        vals = [r.get(k) for r in rows if isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)]
        if vals:
            out[k] = median(vals)
    return out


def spread(xs: list[float]) -> dict:
    """Median, mean, p50, p95, min, max of one series."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return {}
    return {"median": median(xs), "mean": mean(xs), "p50": percentile(xs, 50), "p95": percentile(xs, 95),
            "min": min(xs), "max": max(xs), "n": len(xs)}
