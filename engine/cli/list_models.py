"""deepinfer list: the pulled models (NAME, SIZE, FORMAT, BITS, WHERE), like `ollama list`."""
from __future__ import annotations

from engine.hub import catalog
from engine.hub.download import human


def add_arguments(p):
    pass


def run(args) -> int:
    rows = [(e.name, human(e.size), e.format, e.bits, str(e.where)) for e in catalog.list_pulled()]
    head = ("NAME", "SIZE", "FORMAT", "BITS", "WHERE")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    for r in [head, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[4])
    if not rows:
        print("(no models pulled yet: deepinfer pull qwen2.5:3b)")
    return 0
