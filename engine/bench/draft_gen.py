"""Greedy outputs of the real model for the draft simulator (engine/bench/draft_sim.py), generated once and cached.

    OMP_NUM_THREADS=1 nice python -m engine.bench.draft_gen --out docs/results/draft_sim_greedy_cpu_0.5b.json

Greedy output does not depend on the drafter, so a drafter's acceptance is replayed offline from the prompt
tokens and the plain greedy output tokens. Sets: "test" = the hotpath bench's 10 texts (engine/bench/hotpath.py
TEXTS) through the tray's 改写 (rewrite) and 翻译 (translate) templates; "train" = the disjoint texts of
engine/bench/draft_texts.py through the translate template (what a static n-gram table is built from).
Templates: the shipped zh defaults (trayapp default_config("zh")), rendered through the model's chat template,
as the bench and the tray do. The file is rewritten after every text; texts already in it are skipped.

--topk N adds to each row the model's top-N next tokens at every output step (`topk[j]`: the logits that
predict output token j, eos included; one all-position forward over prompt + output): what Token Recycling
(draft_sim's "recycle") drafts from, the logits the engine's decode/verify steps compute anyway.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from engine.bench.draft_texts import train_texts
from engine.bench.envinfo import environment
from engine.bench.hotpath import TEXTS
from engine.config import EngineConfig
from engine.runtime.llm import LLM
from engine.runtime.sampling import SamplingParams
from trayapp.config import default_config
from trayapp.templates import render_messages


def jobs() -> list[tuple[str, str, int, str]]:
    """(set, template id, index, text) in generation order: the test texts first."""
    out = [("test", tid, i, t) for tid in ("translate", "rewrite") for i, t in enumerate(TEXTS)]
    return out + [("train", "translate", i, t) for i, t in enumerate(train_texts())]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench.draft_gen", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--sets", default="test,train")
    p.add_argument("--topk", type=int, default=0, help="also cache the top-N next tokens of every output step")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    out = Path(args.out)
    res = json.loads(out.read_text()) if out.exists() else {}
    if not res:
        env = environment(sys.argv[1:] if argv is None else argv)
        env["command"] = "python -m engine.bench.draft_gen " + " ".join(sys.argv[1:] if argv is None else argv)
        res = {"schema": "deepinfer-draft-greedy/1", "model": args.model, "device": "cpu",
               "max_tokens": args.max_tokens,
               "note": "plain greedy decoding (no speculation), CPU, the eos token is not in output_ids",
               "env": env, "rows": []}
    done = {(r["set"], r["template"], r["text"]) for r in res["rows"]}
    llm = LLM(EngineConfig(model=args.model, device="cpu", max_context=1024, max_batch=1))
    res["eos_ids"] = sorted(llm.runner.eos_ids)
    cfg = default_config("zh")
    sets = args.sets.split(",")
    for st, tid, i, text in jobs():
        if st not in sets or (st, tid, text) in done:
            continue
        prompt = llm.render(render_messages(cfg.template(tid), text, cfg.lang))
        t0 = time.perf_counter()
        c = llm.complete(prompt, SamplingParams(max_tokens=args.max_tokens, temperature=0.0))
        res["rows"].append({"set": st, "template": tid, "index": i, "text": text,
                            "prompt_ids": llm.tokenizer.encode(prompt), "output_ids": c.token_ids,
                            "finish_reason": c.finish_reason, "output": c.text})
        out.write_text(json.dumps(res, ensure_ascii=False, indent=None) + "\n", encoding="utf-8")
        print(f"{st} {tid} {i}: {c.completion_tokens} tokens {time.perf_counter() - t0:.1f}s {c.text[:60]!r}",
              file=sys.stderr, flush=True)
    if args.topk and any("topk" not in r for r in res["rows"]):
        res["topk_command"] = "python -m engine.bench.draft_gen " + " ".join(sys.argv[1:] if argv is None else argv)
    for r in res["rows"] if args.topk else []:
        if "topk" in r:
            continue
        ids = r["prompt_ids"] + r["output_ids"]
        logits = llm.runner.logits(ids)[len(r["prompt_ids"]) - 1:]  # row j predicts output token j (the last: eos)
        r["topk"] = logits.topk(args.topk, dim=-1).indices.tolist()
        top1 = [t[0] for t in r["topk"][:len(r["output_ids"])]]
        r["topk_top1_matches_greedy"] = top1 == r["output_ids"]  # all-position forward vs 1-token steps (rounding)
        out.write_text(json.dumps(res, ensure_ascii=False, indent=None) + "\n", encoding="utf-8")
        print(f"topk {r['set']} {r['template']} {r['index']}: top1 == greedy {r['topk_top1_matches_greedy']}",
              file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
