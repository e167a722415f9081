"""`deepinfer bench` (also `python -m engine.bench.cli`): run the protocol of
docs/bench/protocol.md on our engine (in-process or over HTTP) and on peers, write JSON.

  deepinfer bench --runs productivity --model qwen2.5-coder-0.5b --out docs/results/bench_cpu_0.5b.json \
      --report docs/bench/bench_cpu_0.5b.md
  deepinfer bench --runs all --model ckpt/3b-w4 --peer ollama:http://127.0.0.1:11434 --peer-model qwen2.5:3b
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from engine.bench import protocol, speed
from engine.bench.report import write_report
from engine.config import add_gpu_memory_arguments
from engine.errors import BadRequestError, DeepInferError

ALL_RUNS = ["productivity"] + speed.SPEED_RUNS


def _ints(s: str) -> list[int]:
    try:
        return [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise BadRequestError(f"expected comma-separated integers, got {s!r}")


def add_arguments(p):
    p.add_argument("--runs", default="productivity",
                   help=f"comma-separated: {','.join(ALL_RUNS)} or all (default productivity); or hotkey alone "
                        "(the tray's hotkey path under Xvfb, engine/bench/hotkey.py)")
    p.add_argument("--target", default="inproc",
                   help="our engine: inproc (default), http:URL (our running endpoint) or none")
    p.add_argument("--model", default=None, help="in-process model: pulled name, .gguf, HF folder or checkpoint")
    p.add_argument("--peer", action="append", default=[],
                   help="openai:URL or ollama:URL (repeatable), e.g. openai:http://127.0.0.1:8080/v1")
    p.add_argument("--peer-model", action="append", default=[], help="model name for the Nth --peer (repeatable)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = default)")
    p.add_argument("--max-context", type=int, default=0, help="in-process KV length (0 = what the runs need)")
    p.add_argument("--max-batch", type=int, default=0,
                   help="in-process KV slots (0 = 1, or the largest --concurrency level when that run is on)")
    add_gpu_memory_arguments(p)
    p.add_argument("--prefix-cache-mb", type=int, default=None, metavar="MB",
                   help="in-process prefix KV cache (default: the engine's; 0 = off, for A/B runs)")
    p.add_argument("--warmup", type=int, default=protocol.WARMUP)
    p.add_argument("--repeats", type=int, default=protocol.REPEATS, help="productivity rounds (x 2 prompts)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="override the protocol's 64 (tests only; the JSON marks the run as modified)")
    p.add_argument("--speed-repeats", type=int, default=3)
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--prefill-lengths", default="48,512,2048")
    p.add_argument("--combined", default="48,64", help="prompt,generated tokens of the combined request")
    p.add_argument("--long-lengths", default="4096,16384,32768")
    p.add_argument("--long-decode-tokens", type=int, default=32)
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--concurrency-max-tokens", type=int, default=64)
    p.add_argument("--concurrency-prompt-tokens", type=int, default=48)
    p.add_argument("--hotkey-repeats", type=int, default=5, help="hotkey run: presses per template")
    p.add_argument("--out", default=None, help="results JSON (e.g. docs/results/bench_gpu_3b.json)")
    p.add_argument("--report", default=None, help="Markdown report with PNG plots beside it (docs/bench/NAME.md)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--quiet", action="store_true", help="no progress output")


def build_plan(args) -> dict:
    runs = ALL_RUNS if args.runs.strip() == "all" else [r.strip() for r in args.runs.split(",") if r.strip()]
    bad = [r for r in runs if r not in ALL_RUNS]
    if bad:
        raise BadRequestError(f"unknown run(s) {', '.join(bad)}",
                              f"choose from {', '.join(ALL_RUNS)} or all; or hotkey alone")
    comb = _ints(args.combined)
    s = speed.SpeedSettings(repeats=args.speed_repeats, warmup=args.warmup, decode_tokens=args.decode_tokens,
                            prefill_lengths=_ints(args.prefill_lengths), combined=(comb[0], comb[1]),
                            long_lengths=_ints(args.long_lengths), long_decode_tokens=args.long_decode_tokens,
                            concurrency=_ints(args.concurrency), concurrency_max_tokens=args.concurrency_max_tokens,
                            concurrency_prompt_tokens=args.concurrency_prompt_tokens)
    targets = []
    if args.target != "none":
        targets.append({"spec": args.target, "model": args.model})
        if getattr(args, "gguf_pack", "bytes") != "bytes":  # EngineConfig.gguf_pack: recorded with the numbers
            targets[-1]["gguf_pack"] = args.gguf_pack
        if getattr(args, "cpu_weights", None) not in (None, "dense"):  # EngineConfig.cpu_weights likewise
            targets[-1]["cpu_weights"] = args.cpu_weights
    for i, peer in enumerate(args.peer):
        if not peer.startswith(("openai:", "ollama:")):
            raise BadRequestError(f"--peer {peer!r}", "use openai:URL or ollama:URL")
        targets.append({"spec": peer, "model": args.peer_model[i] if i < len(args.peer_model) else None})
    if not targets:
        raise BadRequestError("nothing to benchmark", "use --target inproc|http:URL and/or --peer ...")
    sampling = dict(protocol.SAMPLING)
    if args.max_tokens:
        sampling["max_tokens"] = args.max_tokens
    return {"runs": runs, "targets": targets, "speed": s, "sampling": sampling,
            "max_context": args.max_context or needed_context(runs, s),
            "max_batch": args.max_batch or (max(s.concurrency, default=1) if "concurrency" in runs else 1),
            "repeats": args.repeats, "warmup": args.warmup,
            "protocol_modified": (sampling != protocol.SAMPLING or args.repeats != protocol.REPEATS
                                  or args.warmup != protocol.WARMUP)}


def needed_context(runs: list[str], s: speed.SpeedSettings) -> int:
    need = 512
    if "prefill" in runs:
        need = max(need, max(s.prefill_lengths, default=0) + 8)
    if "combined" in runs:
        need = max(need, sum(s.combined) + 8)
    if "decode" in runs:
        need = max(need, s.decode_prompt_tokens + s.decode_tokens + 8)
    if "longctx" in runs:
        need = max(need, max(s.long_lengths, default=0) + s.long_decode_tokens)
    return min(32768, -(-need // 256) * 256)


def print_plan(plan: dict, out=None):
    out = out or sys.stdout
    print("benchmark plan (docs/bench/protocol.md)", file=out)
    for t in plan["targets"]:
        print(f"  target {t['spec']}" + (f" model {t['model']}" if t["model"] else ""), file=out)
    print(f"  runs: {', '.join(plan['runs'])}", file=out)
    if "productivity" in plan["runs"]:
        print(f"  productivity: 2 prompts x {plan['repeats']} rounds after {plan['warmup']} warmup, "
              f"sampling {plan['sampling']}" + (" (MODIFIED)" if plan["protocol_modified"] else ""), file=out)
    s = plan["speed"]
    for r in plan["runs"]:
        desc = {"decode": f"batch 1, {s.decode_tokens} tokens after {s.decode_prompt_tokens}, EOS ignored",
                "prefill": f"prompts of {s.prefill_lengths} tokens",
                "combined": f"{s.combined[0]}-token prompt + {s.combined[1]} generated, wall",
                "longctx": f"decode {s.long_decode_tokens} tokens after {s.long_lengths} (as context allows)",
                "concurrency": f"{s.concurrency} streams (HTTP; in-process through the engine worker)",
                "memory": "peak allocated/reserved GPU memory, model resident size"}.get(r)
        if desc:
            print(f"  {r}: {desc}" + ("" if r in ("longctx", "concurrency", "memory")
                                      else f", {s.repeats} repeats"), file=out)
    print(f"  in-process max_context {plan['max_context']}, KV slots {plan['max_batch']}", file=out)


def run(args, argv: list[str] | None = None, instance=None) -> int:
    """instance: an already loaded in-process target (tests pass InProcTarget(None, llm=llm))."""
    if argv is None:  # called as `deepinfer bench ...`
        argv = sys.argv[1:]
        argv = argv[argv.index("bench") + 1:] if "bench" in argv else argv
    progress = (lambda m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    if args.runs.strip() == "hotkey":  # its own harness: an X server, the tray, our server over HTTP
        from engine.bench.hotkey import main as hotkey_main  # heavy: tray + server; bench --help stays light
        return hotkey_main(args, progress)
    plan = build_plan(args)
    if instance is not None:
        for t in plan["targets"]:
            if t["spec"] == "inproc":
                t["instance"] = instance
    if args.dry_run:
        print_plan(plan)
        return 0
    from engine.bench.envinfo import environment, load_average  # heavy: torch; bench --help/--dry-run stay light
    from engine.bench.session import run_all  # heavy: loads the engine (torch) only when a run starts

    result = {"schema": "deepinfer-bench/1", "env": environment(argv),
              "protocol_modified": plan["protocol_modified"], "runs": plan["runs"],
              "speed_settings": speed.settings_dict(plan["speed"]), "targets": []}
    out = Path(args.out) if args.out else None
    save = (lambda: _write(out, result)) if out else (lambda: None)
    t0 = time.perf_counter()
    run_all(plan, args, result, progress, save)
    result["total_s"] = time.perf_counter() - t0
    result["env"]["load_average_end"] = load_average()
    save()
    if out:
        progress(f"wrote {out}")
    else:
        json.dump(result, sys.stdout, ensure_ascii=False, indent=1)
        print()
    if args.report:
        path = write_report(result, Path(args.report))
        progress(f"wrote {path}")
    return 1 if any(t.get("errors") for t in result["targets"]) else 0


def _write(path: Path, result: dict):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(result, ensure_ascii=False, indent=1), encoding="utf-8")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m engine.bench.cli", description=__doc__.splitlines()[0])
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return run(args, argv)
    except DeepInferError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
