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
`--kv`: also where the runs' caches part: each run's K/V rows (all layers, the rows that hold final values when its
request is released) are compared with the plain chained run's bit for bit; the first differing row (a prompt row:
the prefill or the restored prefix; an answer row: the step that wrote it, from a trace of the speculative run's
steps: plain, lookup, tree, burst), its first differing layer and the largest difference there. Identical rows up to
the parting token mean the step that chose it computed other logits from the same cache; a row that parts earlier
names the step to look at.
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
from engine.runtime.prefix_cache import kv_tensors
from trayapp.config import default_config
from trayapp.templates import render_messages


def ref_runner(spec, cfg):
    """`--device ref`: the GPU runner's own code (slots, the prefix cache, prompt lookup, the heads' trees and bursts,
    verify steps, keep_path) over GPUModel on the kernels' CPU references, no CUDA: the references' bits, not the
    GPU's, but the same logic, and their verify rows are one-token steps' bits (tests/test_spec_verify.py). Prompts
    after a cached prefix take the eager chunked path (no offset graphs on the CPU). A step of the real 0.5B takes
    seconds."""
    from engine.model import gpu_load
    from engine.model.gpu_model import GPUModel
    from engine.runtime.gpu_runner import GPURunner

    r = object.__new__(GPURunner)  # its __init__ needs CUDA (memory plan, graphs)
    r.spec, r.cfg, r.mcfg = spec, cfg, spec.config
    r.max_context = cfg.context_for(spec.config)
    r.gguf_pack, r.gguf_pack_note = cfg.gguf_pack, ""
    r.model = GPUModel(gpu_load.load_source(spec, "cpu", mode=cfg.gguf_pack), cfg.max_batch, r.max_context, "cpu")
    r.model.offset_graphs = False
    r.free_slots = list(range(cfg.max_batch))
    r.eos_ids = set(spec.config.eos_token_ids) | set(spec.tokenizer.eos_token_ids)
    r.chain_stats = {"chains": 0, "tokens": 0}
    return r


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


def kv_rows(runner, slot: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K, V rows 0..n-1 of a slot, all layers: [layers, kv_heads, n, head_dim] on the host (GPU model or CPU cache)."""
    k, v = kv_tensors(runner)
    return k[:, slot, :, :n].cpu().clone(), v[:, slot, :, :n].cpu().clone()


class Probe:
    """Records, per request, its K/V rows at release and the decode steps that produced its tokens: (kind, m, a):
    a step that found m output tokens and added a (its input token m - 1 and the a - 1 accepted ones got their K/V
    rows in it; the last added has none yet). Installed on one LLM for the duration of a `with`."""

    def __init__(self, llm):
        from engine.runtime import speculative
        self.llm, self.spec, self.runs, self.steps = llm, speculative, [], []

    def __enter__(self):
        r, sp = self.llm.runner, self.spec
        self.saved = (r.release, r.decode, sp.step, sp.burst)
        release, decode, step, burst = self.saved
        probe = self

        def on_release(seq):
            if seq.slot >= 0:
                k, v = kv_rows(r, seq.slot, seq.num_tokens - 1)
                probe.runs.append({"prompt": len(seq.prompt_ids), "k": k, "v": v, "steps": probe.steps})
            probe.steps = []
            return release(seq)

        def on_decode(seqs):
            m = [len(s.output_ids) for s in seqs]
            out = decode(seqs)
            if len(seqs) == 1:
                probe.steps.append(("chain" if len(seqs[0].output_ids) - m[0] > 1 else "plain", m[0],
                                    len(seqs[0].output_ids) - m[0]))
            return out

        def on_step(runner, seq, proposal, source="lookup", *a, **kw):
            m = len(seq.output_ids)
            out = step(runner, seq, proposal, source, *a, **kw)
            probe.steps.append((source, m, len(seq.output_ids) - m))
            return out

        def on_burst(runner, seq, n):
            heads = runner.heads
            nxt = heads.burst_next

            def on_next(more):
                m = len(seq.output_ids)
                kept = nxt(more)
                probe.steps.append(("burst", m, len(kept)))
                return kept
            heads.burst_next = on_next
            try:
                return burst(runner, seq, n)
            finally:
                del heads.burst_next  # the bound method again
        r.release, r.decode, sp.step, sp.burst = on_release, on_decode, on_step, on_burst
        return self

    def __exit__(self, *exc):
        r = self.llm.runner
        del r.release, r.decode  # the class's methods again
        self.spec.step, self.spec.burst = self.saved[2], self.saved[3]


def writer(steps: list, j: int) -> list | None:
    """The traced step that wrote answer token j's K/V row (its input, or a draft it accepted)."""
    return next((list(s) for s in steps if s[1] - 1 <= j <= s[1] + s[2] - 2), None)


def kv_parting(base: dict, other: dict) -> dict | None:
    """Where other's K/V rows first differ from base's (bit for bit), over the rows both hold; None if nowhere."""
    n = min(base["k"].shape[2], other["k"].shape[2])
    diff = (base["k"][:, :, :n] != other["k"][:, :, :n]) | (base["v"][:, :, :n] != other["v"][:, :, :n])
    rows = diff.any(dim=3).any(dim=1).any(dim=0)  # [n]
    if not bool(rows.any()):
        return None
    r = int(rows.nonzero()[0])
    layer = int(diff[:, :, r].any(dim=2).any(dim=1).nonzero()[0])
    dk = (base["k"][layer, :, r].float() - other["k"][layer, :, r].float()).abs().max()
    dv = (base["v"][layer, :, r].float() - other["v"][layer, :, r].float()).abs().max()
    j = r - base["prompt"]  # < 0: a prompt row
    return {"row": r, "answer_token": j if j >= 0 else None, "prompt_rows": base["prompt"], "layer": layer,
            "max_abs_k": float(dk), "max_abs_v": float(dv), "rows_differing": int(rows.sum()), "rows_compared": n,
            "written_by": writer(other["steps"], j) if j >= 0 else "prefill",
            "base_written_by": writer(base["steps"], j) if j >= 0 else "prefill"}


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
    p.add_argument("--device", default="cuda", help="cuda | cpu (the CPU runner) | ref (the GPU runner's code on the "
                   "kernels' CPU references: ref_runner)")
    p.add_argument("--template", default="translate")
    p.add_argument("--texts", default="0", help="indices into hotpath.TEXTS")
    p.add_argument("--configs", default="kquant,bytes,kquant:nocache")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--margin-at", type=int, default=None, help="CPU: the top-3 logits after N answer tokens")
    p.add_argument("--kv", action="store_true", help="also where the runs' K/V caches part, and the steps' trace")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    res: dict = {"env": environment(sys.argv[1:] if argv is None else argv), "runs": []}
    for conf in args.configs.split(","):
        pack, _, opt = conf.partition(":")
        opts = set(filter(None, opt.split("+")))
        if opts - {"nocache", "noheads", "nolookup", "chain"}:
            raise SystemExit(f"unknown options in {conf!r}")
        ref = args.device == "ref"
        llm = LLM(EngineConfig(model=args.model, device="cpu" if ref else args.device, max_context=2048, max_batch=2,
                               prefix_cache_gpu="nocache" not in opts, speculative_gpu=True, gguf_pack=pack,
                               draft_heads="" if "noheads" in opts else "auto", draft_tree="chain" not in opts,
                               spec_ngram_min=99 if "nolookup" in opts else 2, warmup=not ref),
                  runner_factory=ref_runner if ref else None)
        for i in (int(t) for t in args.texts.split(",")):
            if args.kv:
                with Probe(llm) as probe:
                    ids = runs(llm, args.template, TEXTS[i], args.max_tokens)
            else:
                ids = runs(llm, args.template, TEXTS[i], args.max_tokens)
            diffs = compare(llm, ids)
            row = {"config": conf, "text": i, "identical": not diffs, "diffs": diffs,
                   "ids": ids if diffs else {"all": ids["chain"]}}
            if args.kv:  # the warm-up, then chain, spec, host (three_runs' order)
                _, a, b, h = probe.runs[-4:]
                row["kv"] = {"chain/spec": kv_parting(a, b), "chain/host": kv_parting(a, h),
                             "spec_steps": [list(s) for s in b["steps"]]}
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
