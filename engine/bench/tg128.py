"""One line from a `deepinfer bench --runs decode` JSON: the median tg128 decode tok/s of its first target (the
device A/B scripts print it per variant; a failed run says why and the next variant still runs).

    python -m engine.bench.tg128 FILE.json NAME [DETAIL]
"""
from __future__ import annotations

import json
import statistics
import sys


def tg128(path: str) -> float:
    d = json.load(open(path))
    rows = d["targets"][0]["runs"]["decode"]["points"][0]["rows"]
    return statistics.median(r["decode_tps"] for r in rows)


def main(argv=None) -> int:
    a = sys.argv[1:] if argv is None else argv
    path, name, detail = a[0], a[1], " ".join(a[2:])
    try:
        print(f"{name:10s} {f'[{detail}] ' if detail else ''}tg128 decode {tg128(path):.1f} tok/s")
    except Exception as e:  # noqa: BLE001 - reported, not raised: the caller's next variant still runs
        print(name, "failed:", e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
