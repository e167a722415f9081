"""Run a benchmark plan: each target in turn, each selected run on it; errors are recorded per
run (a peer that is down must not lose the numbers already taken) and the JSON is saved after
every target."""
from __future__ import annotations

import traceback

from engine.assets_path import bundled_chat_template
from engine.bench import protocol, speed
from engine.bench.targets import parse_target
from engine.config import gpu_memory_kwargs
from engine.errors import DeepInferError
from engine.formats.chat import render_chat
from engine.formats.tokenizer import bundled_qwen2_tokenizer

_bundled = None


def bundled_tokenizer_and_render():
    """The Qwen2.5 tokenizer + chat template shipped in assets/, for targets that are only URLs."""
    global _bundled
    if _bundled is None:
        template = bundled_chat_template()
        _bundled = (bundled_qwen2_tokenizer(), lambda msgs: render_chat(template, msgs, True, None))
    return _bundled


def open_target(t: dict, plan: dict, args):
    if t.get("instance") is not None:
        return t["instance"]
    kw = {}
    if t["spec"] == "inproc":
        kw = dict(device=getattr(args, "device", "auto"), max_context=plan["max_context"],
                  max_batch=plan.get("max_batch", 1), dtype=getattr(args, "dtype", "auto"),
                  threads=getattr(args, "threads", 0), **gpu_memory_kwargs(args))
        if getattr(args, "prefix_cache_mb", None) is not None:
            kw["prefix_cache_mb"] = args.prefix_cache_mb
    return parse_target(t["spec"], t.get("model"), **kw)


def run_target(target, plan: dict, progress) -> dict:
    entry = {"spec": None, "info": target.info(), "load_s": target.load_s, "runs": {}, "errors": {}}
    if target.kind == "inproc":
        tok, render = target.tokenizer, target.render
    else:
        tok, render = bundled_tokenizer_and_render()
    for name in plan["runs"]:
        progress(f"[{target.name}] {name}")
        try:
            if name == "productivity":
                res = protocol.run_productivity(target, tok, render, progress, plan.get("warmup", protocol.WARMUP),
                                                plan.get("repeats", protocol.REPEATS), plan["sampling"])
            else:
                res = speed.RUNNERS[name](target, tok, plan["speed"], progress)
            entry["runs"][name] = res
        except Exception as e:  # a failing run (or a peer going down) must not lose the others
            entry["errors"][name] = f"{type(e).__name__}: {e}"
            progress(f"[{target.name}] {name} FAILED: {type(e).__name__}: {e}")
            if not isinstance(e, DeepInferError):
                entry.setdefault("tracebacks", {})[name] = traceback.format_exc(limit=6)
    return entry


def run_all(plan: dict, args, result: dict, progress, save) -> None:
    for t in plan["targets"]:
        progress(f"opening target {t['spec']}" + (f" ({t['model']})" if t.get("model") else ""))
        try:
            target = open_target(t, plan, args)
        except Exception as e:
            msg = str(e) if isinstance(e, DeepInferError) else f"{type(e).__name__}: {e}"
            progress(f"  cannot open {t['spec']}: {msg}")
            result["targets"].append({"spec": t["spec"], "info": {"name": t["spec"]}, "runs": {},
                                      "errors": {"open": msg}})
            save()
            continue
        if target.load_s is not None:
            progress(f"  model load {target.load_s:.2f}s (reported separately, never inside decode)")
        try:
            entry = run_target(target, plan, progress)
        finally:
            if t.get("instance") is None:
                target.close()
        entry["spec"] = t["spec"]
        result["targets"].append(entry)
        save()
