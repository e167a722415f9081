"""deepinfer pull NAME: download a known model into the cache (resumable, verified)."""
from __future__ import annotations

from engine.hub import store
def add_arguments(p):
    p.add_argument("name", nargs="?", default="qwen2.5-coder-0.5b", choices=list(store.KNOWN_MODELS),
                   help="model name (default: qwen2.5-coder-0.5b)")
    p.add_argument("--quiet", action="store_true")


def run(args) -> int:
    path = store.pull(args.name, quiet=args.quiet)
    print(path)
    return 0
