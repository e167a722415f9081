"""Speculative decoding on the CPU runner, interleaved A/B (#17 on machines without a GPU):

    python -m engine.bench.cpu_spec --weights int8 --templates translate,rewrite,quick_ask --drafts 0,1,2 \
        --out docs/results/cpu_spec_int8.json

    python -m engine.bench.cpu_spec --model qwen2.5-coder-1.5b --draft-model qwen2.5-coder-0.5b --drafts 0,m2 ...

For each template, over the hot-path bench's texts (quick_ask: its questions), each round runs every text plainly and
then speculatively once per setting of --drafts (0: prompt lookup alone; k > 0: the draft heads with k drafts per
verify step, EngineConfig.spec_heads_cpu, behind prompt lookup; mK: the --draft-model with K drafts a step,
CPURunner.model_drafts), in that order; every speculative answer must equal the plain one (greedy). Speed-up per
setting = the sum over texts of the plain run's median decode time over the setting's median (--rounds rounds).
Prints one line per template; --out writes the JSON.
"""
from __future__ import annotations

import argparse
import statistics
import sys

from engine.bench.envinfo import emit_json, environment
from engine.bench.hotpath import QUESTIONS, TEXTS, _gen
from engine.config import CPU_WEIGHTS, EngineConfig
from engine.runtime.draft_heads import DraftHeads
from engine.runtime.llm import LLM
from trayapp.config import default_config
from trayapp.templates import render_messages


def _total(times: dict[int, list[float]]) -> float:
    return sum(statistics.median(v) for v in times.values())


def run(llm, template: str, texts: list[str], drafts: list[str], rounds: int, max_tokens: int) -> dict:
    """{setting: speed-up, ...} and the decode seconds behind them; asserts the answers equal plain decoding."""
    cfg = default_config("zh")
    prompts = [llm.render(render_messages(cfg.template(template), t, cfg.lang)) for t in texts]
    r = llm.runner
    drafter, md0 = getattr(r, "drafter", None), getattr(r, "model_drafts", None)
    heads, k0 = {}, r.cfg.spec_heads_cpu
    for k in drafts:  # each heads setting's heads, loaded with its drafts per step
        if k.isdigit():
            r.cfg.spec_heads_cpu = int(k)
            heads[k] = DraftHeads.load(r, llm.spec, "on") if int(k) else None
    r.cfg.spec_heads_cpu = k0

    def use(k: str):  # one setting's drafters on the runner
        r.heads = heads.get(k)
        r.drafter = drafter if k.startswith("m") else None
        if k.startswith("m"):
            r.model_drafts = int(k[1:])
    for p in prompts:  # the prompts' prefixes cached alike for every setting
        _gen(llm, p, 2, False)
    plain: dict[int, list[float]] = {}
    spec: dict[str, dict[int, list[float]]] = {k: {} for k in drafts}
    tokens, steps = 0, {k: [0, 0] for k in drafts}
    for rnd in range(rounds):
        for i, p in enumerate(prompts):
            use("0")
            a = _gen(llm, p, max_tokens, False)
            plain.setdefault(i, []).append(a["decode_s"])
            tokens += a["tokens"] if rnd == 0 else 0
            for k in drafts:
                use(k)
                b = _gen(llm, p, max_tokens, True)
                if b["ids"] != a["ids"]:
                    raise AssertionError(f"{template} text {i}, drafts {k}: speculative answer differs from plain")
                spec[k].setdefault(i, []).append(b["decode_s"])
                steps[k][0] += b["verify_steps"]
                steps[k][1] += b["verify_tokens"]
    use("0")
    r.drafter, r.model_drafts = drafter, md0
    base = _total(plain)
    return {"texts": len(texts), "rounds": rounds, "max_tokens": max_tokens, "answer_tokens": tokens,
            "plain_decode_s": round(base, 3), "identical": True,
            "speedup": {k: round(base / _total(spec[k]), 3) for k in drafts},
            "tokens_per_verify_step": {k: round(steps[k][1] / steps[k][0], 3) if steps[k][0] else None
                                       for k in drafts}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--weights", default="int8", choices=list(CPU_WEIGHTS))
    p.add_argument("--templates", default="translate,rewrite,quick_ask")
    p.add_argument("--drafts", default="0,1,2", help="0: prompt lookup alone; k: the heads, k drafts a step; "
                   "mK: the draft model, K drafts a step")
    p.add_argument("--draft-model", default="", help="a draft model of the same tokenizer (the mK settings)")
    p.add_argument("--texts", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--long-draft", type=int, default=0, help="prompt lookup's longest draft once a copy runs "
                   "(CPURunner.long_draft; 0: the runner's own)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    drafts = args.drafts.split(",")
    if any(not (k.isdigit() or k[:1] == "m" and k[1:].isdigit()) for k in drafts) or \
            any(k.startswith("m") for k in drafts) and not args.draft_model:
        raise SystemExit("--drafts: 0, heads counts (1, 2) or mK with --draft-model")
    llm = LLM(EngineConfig(model=args.model, device="cpu", max_context=2048, max_batch=2, cpu_weights=args.weights,
                           draft_heads="off", draft_model=args.draft_model))
    if args.long_draft:
        llm.runner.long_draft = args.long_draft
    res: dict = {"env": environment(sys.argv[1:] if argv is None else argv), "model": args.model,
                 "draft_model": args.draft_model or None, "weights": args.weights,
                 "cpu_weights": getattr(llm.runner, "weights_kind", args.weights),
                 "long_draft": llm.runner.long_draft, "templates": {}}
    for t in args.templates.split(","):
        texts = QUESTIONS if t == "quick_ask" else TEXTS[:args.texts]
        res["templates"][t] = row = run(llm, t, texts, drafts, args.rounds, args.max_tokens)
        print(f"{args.weights} {t}: speed-up by drafts {row['speedup']}, tokens per verify step "
              f"{row['tokens_per_verify_step']}, plain {row['plain_decode_s']} s for {row['answer_tokens']} tokens",
              flush=True)
    if args.out:
        emit_json(res, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
