"""Where do speculative and plain greedy decoding part? (device; #17's "greedy outputs identical")

    python -m engine.bench.spec_diff --device cuda --template translate --texts 0,1 \
        --configs kquant,bytes,kquant:nocache --out $OUT/spec_diff.json

For each configuration (a GGUF packing, then options after ":" joined by "+": `nocache` the GPU prefix cache off,
`noheads` no draft heads (prompt lookup alone), `nolookup` no prompt lookup (n-grams of 99), `chain` the heads'
drafts as a chain, not a tree; e.g. `kquant:nocache+noheads`) and text: the hot-path bench's
three runs (engine/bench/hotpath.py spec_run: plain chained, speculative, plain one step per engine step), after the
same warm-up, with their token ids; for every pair that differs the first position where they part, the tokens
there (decoded) and whether an end of sequence is among them. Prints one line per run and writes the JSON.
`--margin-at N` (CPU runner): also the three most likely next tokens after the plain answer's first N tokens, from one
forward over the prompt and those tokens, and the gap between the first two (how near a tie the parting is).
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from engine.bench.envinfo import emit_json, environment
from engine.bench.hotpath import TEXTS, three_runs
from engine.config import EngineConfig
from engine.runtime.llm import LLM
from trayapp.config import default_config
from trayapp.templates import render_messages


def first_diff(a: list[int], b: list[int]) -> int | None:
    """The first index where a and b differ (a length where one is a prefix of the other); None if equal."""
    if a == b:
        return None
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def runs(llm, template: str, text: str, max_tokens: int) -> dict[str, list[int]]:
    """The three runs of hotpath.spec_run on one text: {"chain", "spec", "host"} -> token ids."""
    cfg = default_config("zh")
    a, b, h = three_runs(llm, llm.render(render_messages(cfg.template(template), text, cfg.lang)), max_tokens)
    return {"chain": a["ids"], "spec": b["ids"], "host": h["ids"]}


def top3_after(llm, prompt: str, answer: list[int]) -> list[tuple[str, float]]:
    """The CPU runner's three largest logits for the token after prompt + answer (one all-position forward)."""
    r = llm.runner
    ids = llm.tokenizer.encode(prompt) + answer
    with torch.no_grad():
        logits = r.model(torch.tensor([ids]), r.cache, [0], [0], all_logits=True)[0][-1].float()
    v, i = logits.topk(3)
    return [(llm.tokenizer.decode([int(t)]), round(float(x), 4)) for t, x in zip(i, v)]


def compare(llm, ids: dict[str, list[int]]) -> list[dict]:
    tok = llm.tokenizer
    eos = set(getattr(llm.runner, "eos_ids", None) or ())
    rows = []
    for x, y in (("chain", "spec"), ("chain", "host"), ("spec", "host")):
        i = first_diff(ids[x], ids[y])
        if i is None:
            continue
        a, b = ids[x][i:i + 3], ids[y][i:i + 3]
        rows.append({"pair": f"{x}/{y}", "at": i, "lengths": [len(ids[x]), len(ids[y])], x: a, y: b,
                     f"{x}_text": tok.decode(a), f"{y}_text": tok.decode(b),
                     "before": tok.decode(ids[x][max(0, i - 6):i]), "eos_involved": bool(eos & set(a + b))})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--template", default="translate")
    p.add_argument("--texts", default="0", help="indices into hotpath.TEXTS")
    p.add_argument("--configs", default="kquant,bytes,kquant:nocache")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--margin-at", type=int, default=None, help="CPU: the top-3 logits after N answer tokens")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    res: dict = {"env": environment(sys.argv[1:] if argv is None else argv), "runs": []}
    for conf in args.configs.split(","):
        pack, _, opt = conf.partition(":")
        opts = set(filter(None, opt.split("+")))
        if opts - {"nocache", "noheads", "nolookup", "chain"}:
            raise SystemExit(f"unknown options in {conf!r}")
        llm = LLM(EngineConfig(model=args.model, device=args.device, max_context=2048, max_batch=2,
                               prefix_cache_gpu="nocache" not in opts, speculative_gpu=True, gguf_pack=pack,
                               draft_heads="" if "noheads" in opts else "auto", draft_tree="chain" not in opts,
                               spec_ngram_min=99 if "nolookup" in opts else 2))
        for i in (int(t) for t in args.texts.split(",")):
            ids = runs(llm, args.template, TEXTS[i], args.max_tokens)
            diffs = compare(llm, ids)
            row = {"config": conf, "text": i, "identical": not diffs, "diffs": diffs,
                   "ids": ids if diffs else {"all": ids["chain"]}}
            if args.margin_at is not None:
                cfg = default_config("zh")
                prompt = llm.render(render_messages(cfg.template(args.template), TEXTS[i], cfg.lang))
                top = top3_after(llm, prompt, ids["chain"][:args.margin_at])
                row["top3_after"] = {"at": args.margin_at, "tokens": top, "margin": round(top[0][1] - top[1][1], 4)}
            res["runs"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "ids"}, ensure_ascii=False)[:900], flush=True)
        del llm
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if args.out:
        emit_json(res, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
