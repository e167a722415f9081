"""`deepinfer` command: dispatches to subcommand modules (each has add_arguments(p) and run(args) -> int).

Modules are imported only when their subcommand runs, so `deepinfer doctor` or `deepinfer tray`
start fast and the tray never pulls torch into its own code.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from engine.errors import DeepInferError

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "pull": ("engine.cli.pull", "download a model: qwen2.5:3b (Ollama registry), hf:ORG/REPO, qwen2.5-coder-0.5b"),
    "list": ("engine.cli.list_models", "the pulled models: name, size, format, bits, where"),
    "rm": ("engine.cli.rm", "delete a pulled model (refused while a running server uses it)"),
    "ask": ("engine.cli.ask", "ask a question, stream the answer to the terminal"),
    "serve": ("engine.server.cli", "OpenAI-compatible endpoint on http://127.0.0.1:18000/v1"),
    "export": ("engine.quant.export", "export a quantized layered checkpoint (w4 | w3 | mixed)"),
    "make-random": ("engine.quant.make_random",
                    "write a random-weight checkpoint (or Q4_K_M GGUF) with Qwen2.5 3B/7B/14B shapes"),
    "tray": ("trayapp.cli", "run the tray assistant (hotkeys on selected text)"),
    "doctor": ("engine.doctor.report", "check Python, torch, CUDA, GPU, port, models, hotkeys"),
    "autostart": ("engine.desktop.autostart", "enable | disable | status of run-at-login"),
    "bench": ("engine.bench.cli", "benchmark our engine and peers under one protocol"),
}


def build_parser(load: list[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deepinfer", description="Local Qwen2.5 assistant and inference engine")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (mod, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if load is None or name in load:
            try:
                importlib.import_module(mod).add_arguments(p)
            except ModuleNotFoundError as e:
                if not e.name or not mod.startswith(e.name):
                    raise
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cmd = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser([cmd] if cmd in COMMANDS else [])
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        mod = importlib.import_module(COMMANDS[args.command][0])
    except ModuleNotFoundError as e:
        print(f"deepinfer {args.command}: not available in this install ({e})", file=sys.stderr)
        return 2
    try:
        return int(mod.run(args) or 0)
    except DeepInferError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a file or folder the OS refuses (permissions, a full or unplugged disk): one line
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
