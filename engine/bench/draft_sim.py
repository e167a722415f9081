"""Offline replay of zero-cost drafters over cached greedy outputs: tokens per decode step, no model run.

    python -m engine.bench.draft_sim --no-backoff --out docs/results/draft_sim_0.5b.json

Greedy output does not depend on the drafter (speculative.step keeps the draft's longest prefix equal to the
model's argmax, plus the model's own next token), so for each text the decode is replayed from its prompt
tokens and its plain greedy output tokens (engine/bench/draft_gen.py caches them): at every step the drafter
sees prompt + output so far; with a draft, the step is a verify step that gains the longest matching prefix
+ 1 token; without one it is a plain step (1 token). The first output token comes from the prefill and is not
counted (as the bench's decode tokens/s); the eos token that ends an answer is (it is a decode step).

Per drafter and template: decoded tokens, plain steps, verify steps, drafted, accepted, tokens per step, and the
GPU speed-up that implies with a verify step costing `--verify-cost` plain steps (GPUModel.verify: one captured
decode step of 1 + k <= 8 tokens, about one plain step on an H200).

Drafters (all cost no forward pass; the list is drafters() below):
- lookup: speculative.draft (prompt lookup on prompt + output, n = 3..ngram_min), as the engine does today;
- history: the same, also searching the model's outputs for the texts before (the tray's earlier requests);
- static: an n-gram table (llama.cpp lookup-static) of the model's own greedy translations of DISJOINT texts
  (draft_gen's "train" set): key = the last 1..n tokens (the longest key seen >= min_count times), value = its
  most frequent next token; drafts are chained while that token's share >= p_min;
- dynamic: the same table, also updated with every finished test answer (the tray's earlier requests);
- recycle: Token Recycling (Luo et al. 2024) as a chain: M[token] = the model's top-1 next token the last time
  that token was the input of a step (the verify/decode logits the engine computes anyway), seeded from the
  train set; needs the cached per-step top-k (draft_gen --topk); skipped when the file has none.
Also written: union_oracle (at each step the best of all drafters, chosen with hindsight: a ceiling, not a
drafter), the static table's learning curve (1/4, 1/2, all of the train texts), the recycled top-k's first-token
hit rates (the ceiling of a depth-1 tree draft), and the compact numbers of the other back-off setting.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

from engine.bench.envinfo import emit_json, environment
from engine.runtime.speculative import draft as lookup_draft

K = 7  # GPUModel.verify takes 1 + k <= 8 tokens


class NgramTable:
    """next-token counts keyed by the last 1..n_max tokens."""

    def __init__(self, n_max: int):
        self.n_max = n_max
        self.t: dict[tuple, Counter] = defaultdict(Counter)

    def add(self, seq: list[int], start: int = 0):
        """count seq[i] after each key ending at i-1, for i >= max(start, 1)."""
        for i in range(max(start, 1), len(seq)):
            for n in range(1, self.n_max + 1):
                if i - n < 0:
                    break
                self.t[tuple(seq[i - n:i])][seq[i]] += 1

    def predict(self, ctx: list[int], min_count: int) -> tuple[int, float] | None:
        """(token, share) for the longest key with >= min_count observations, else None."""
        for n in range(min(self.n_max, len(ctx)), 0, -1):
            c = self.t.get(tuple(ctx[-n:]))
            if c is None:
                continue
            tot = sum(c.values())
            if tot >= min_count:
                tok, m = c.most_common(1)[0]
                return tok, m / tot
        return None

    def chain(self, ctx: list[int], k: int, min_count: int, p_min: float) -> list[int]:
        out: list[int] = []
        c = list(ctx[-self.n_max:])
        while len(out) < k:
            pr = self.predict(c, min_count)
            if pr is None or pr[1] < p_min:
                break
            out.append(pr[0])
            c = c[1:] + [pr[0]] if len(c) >= self.n_max else c + [pr[0]]
        return out


def replay(prompt: list[int], truth: list[int], drafter, backoff: bool, topk=None, on_step=None) -> dict:
    """Decode truth[1:] (truth[0] came from the prefill) with drafts from drafter(ctx, k) -> list[int]."""
    st = {"tokens": 0, "plain_steps": 0, "verify_steps": 0, "drafted": 0, "accepted": 0}
    pos, skip, misses = 1, 0, 0
    while pos < len(truth):
        ctx = prompt + truth[:pos]
        k = K  # the engine does not know where the answer ends (max_tokens aside)
        d = []
        if skip > 0:
            skip -= 1
        else:
            d = drafter(ctx, k)[:k]
        if d:
            a = 0
            while a < len(d) and pos + a < len(truth) and d[a] == truth[pos + a]:
                a += 1
            gained = min(a + 1, len(truth) - pos)
            st["verify_steps"] += 1
            st["drafted"] += len(d)
            st["accepted"] += a
            if backoff:  # speculative.step: after a draft with nothing kept, 2, 4 .. 16 plain steps
                misses = 0 if a else misses + 1
                skip = min(2 ** misses, 16) if not a else 0
        else:
            gained = 1
            st["plain_steps"] += 1
        if on_step is not None:  # the positions the step computed logits for: inputs truth[pos-1 .. pos+gained-2]
            on_step(prompt, truth, pos, gained)
        pos += gained
        st["tokens"] += gained
    return st


def summarize(rows: list[dict], verify_cost: float) -> dict:
    s = {k: sum(r[k] for r in rows) for k in ("tokens", "plain_steps", "verify_steps", "drafted", "accepted")}
    steps = s["plain_steps"] + s["verify_steps"]
    s["tokens_per_step"] = round(s["tokens"] / steps, 3) if steps else None
    s["tokens_per_verify_step"] = round((s["tokens"] - s["plain_steps"]) / s["verify_steps"], 3) \
        if s["verify_steps"] else None
    s["acceptance_rate"] = round(s["accepted"] / s["drafted"], 3) if s["drafted"] else None
    cost = s["plain_steps"] + verify_cost * s["verify_steps"]  # in plain decode steps
    s["gpu_speedup_est"] = round(s["tokens"] / cost, 3) if steps else None
    return s


def truth_of(row: dict, eos: int) -> list[int]:
    return list(row["output_ids"]) + ([eos] if row["finish_reason"] == "stop" else [])


def drafters(train: list[dict], eos: int, has_topk: bool):
    """name -> (config, factory) ; factory() returns (drafter(ctx, k), end(prompt, truth) or None, on_step or None)."""
    out = {}
    for nmin in (2, 1):
        out[f"lookup_n{nmin}"] = ({"ngram_min": nmin},
                                  lambda nmin=nmin: (lambda ctx, k: lookup_draft(ctx, k, 3, nmin), None, None))

    def hist_factory(nmin):
        hist: list[int] = []

        def d(ctx, k):
            r = lookup_draft(ctx, k, 3, nmin)  # the current text first, then the earlier answers
            if r or not hist:
                return r
            n = min(3, len(ctx))
            while n >= nmin:
                m = lookup_draft(hist + ctx[-n:], k, n, n)
                if m:
                    return m
                n -= 1
            return []

        def end(prompt, truth):
            hist.extend(truth)
        return d, end, None
    for nmin in (2, 1):
        out[f"history_n{nmin}"] = ({"ngram_min": nmin, "history": "earlier answers of the same template"},
                                   lambda nmin=nmin: hist_factory(nmin))

    def static_factory(n_max, min_count, p_min, dynamic, with_lookup):
        tab = NgramTable(n_max)
        for r in train:
            p = r["prompt_ids"]
            tab.add(p[-3:] + truth_of(r, eos), 3)  # keys may reach back into "<|im_start|>assistant\n"

        def d(ctx, k):
            if with_lookup:
                r = lookup_draft(ctx, k, 3, 2)
                if r:
                    return r
            return tab.chain(ctx, k, min_count, p_min)

        def end(prompt, truth):
            if dynamic:
                tab.add(prompt[-3:] + truth, 3)
        return d, end, None
    for n_max in (1, 2, 3):
        for min_count in (1, 2, 3):
            for p_min in (0.0, 0.3, 0.5, 0.7, 0.9):
                for dyn in (False, True):
                    name = f"{'dynamic' if dyn else 'static'}_n{n_max}_c{min_count}_p{p_min}"
                    out[name] = ({"n_max": n_max, "min_count": min_count, "p_min": p_min, "dynamic": dyn},
                                 lambda a=(n_max, min_count, p_min, dyn): static_factory(*a, False))
    for dyn in (False, True):
        out[f"lookup+{'dynamic' if dyn else 'static'}_n3_c2_p0.5"] = (
            {"lookup_first": True, "n_max": 3, "min_count": 2, "p_min": 0.5, "dynamic": dyn},
            lambda dyn=dyn: static_factory(3, 2, 0.5, dyn, True))

    if has_topk:
        def recycle_factory(key_n, with_lookup):
            M: dict[tuple, list[int]] = {}

            def learn(prompt, truth, pos, gained):  # inputs truth[j-1] predicting truth[j], j = pos .. pos+gained-1
                tk = cur["topk"]
                seq = prompt + truth
                for j in range(pos, pos + gained):
                    i = len(prompt) + j - 1  # input position
                    M[tuple(seq[i - key_n + 1:i + 1])] = tk[j]
            cur: dict = {}
            for r in train:
                t = truth_of(r, eos)
                cur["topk"] = r["topk"]
                learn(r["prompt_ids"], t, 1, len(t) - 1)

            def d(ctx, k):
                if with_lookup:
                    r = lookup_draft(ctx, k, 3, 2)
                    if r:
                        return r
                out, c = [], list(ctx[-key_n:])
                while len(out) < k:
                    nxt = M.get(tuple(c[-key_n:]))
                    if nxt is None:
                        break
                    out.append(nxt[0])
                    c.append(nxt[0])
                return out
            return d, None, learn, cur
        for key_n in (1, 2):
            for lk in (False, True):
                out[f"{'lookup+' if lk else ''}recycle_key{key_n}"] = (
                    {"key_tokens": key_n, "lookup_first": lk}, lambda a=(key_n, lk): recycle_factory(*a))
    return out


def union_oracle(made: dict, cur: dict):
    """NOT a drafter: at each step the longest-accepted draft among `made` (it peeks at the answer). The ceiling
    of combining these zero-cost sources with a perfect chooser."""
    def d(ctx, k):
        want = cur["truth"][len(ctx) - len(cur["prompt"]):]
        best: list[int] = []
        for f in made.values():
            r = f(ctx, k)[:k]
            a = 0
            while a < len(r) and a < len(want) and r[a] == want[a]:
                a += 1
            if a > len(best):
                best = r[:a] + r[a:a + 1]  # the kept prefix + the miss: same step count as the real draft
        return best
    return d


def run(data: dict, verify_cost: float, backoff: bool, only: str | None = None) -> dict:
    # <|im_end|>: what a chat answer ends with (the greedy file leaves it out of output_ids)
    eos = 151645 if 151645 in data.get("eos_ids", [151645]) else data["eos_ids"][0]
    rows = data["rows"]
    train = [r for r in rows if r["set"] == "train"]
    res: dict = {}
    for name, (conf, factory) in drafters(train, eos, bool(train) and all("topk" in r for r in rows)).items():
        if only and only not in name:
            continue
        res[name] = {"config": conf}
        for tid in ("translate", "rewrite"):
            test = sorted((r for r in rows if r["set"] == "test" and r["template"] == tid), key=lambda r: r["index"])
            if not test:
                continue
            made = factory()
            d, end, learn = made[:3]
            cur = made[3] if len(made) > 3 else None
            per = []
            for r in test:
                t = truth_of(r, eos)
                if cur is not None:
                    cur["topk"] = r["topk"]
                per.append(replay(r["prompt_ids"], t, d, backoff, on_step=learn))
                if end is not None:
                    end(r["prompt_ids"], t)
            res[name][tid] = summarize(per, verify_cost)
            res[name][tid]["texts"] = len(per)
    if only is None:  # the ceiling: every drafter above at every step, the best one chosen with hindsight
        ds = drafters(train, eos, bool(train) and all("topk" in r for r in rows))
        res["union_oracle"] = {"config": {"of": list(ds), "note": "peeks at the answer: a ceiling, not a drafter"}}
        for tid in ("translate", "rewrite"):
            test = sorted((r for r in rows if r["set"] == "test" and r["template"] == tid), key=lambda r: r["index"])
            made = {n: f() for n, (c, f) in ds.items()}
            cur: dict = {}
            per = []
            for r in test:
                t = truth_of(r, eos)
                cur.update(prompt=r["prompt_ids"], truth=t, topk=r.get("topk"))
                for m in made.values():
                    if len(m) > 3:
                        m[3]["topk"] = r["topk"]
                learns = [m[2] for m in made.values() if m[2] is not None]
                per.append(replay(r["prompt_ids"], t, union_oracle({n: m[0] for n, m in made.items()}, cur),
                                  False, on_step=(lambda *a: [f(*a) for f in learns]) if learns else None))
                for m in made.values():
                    if m[1] is not None:
                        m[1](r["prompt_ids"], t)
            res["union_oracle"][tid] = summarize(per, verify_cost)
            res["union_oracle"][tid]["texts"] = len(per)
    return res


def learning_curve(data: dict, verify_cost: float, names=("static_n1_c1_p0.0", "static_n3_c1_p0.0",
                                                           "static_n3_c2_p0.5")) -> dict:
    """Translate tokens/step of static tables built from the first 1/4, 1/2 and all of the train texts (no
    backoff): whether more of the model's own translations would lift a table toward 1.6 tokens/step."""
    rows, out = data["rows"], {}
    train = [r for r in rows if r["set"] == "train"]
    for n in sorted({max(1, len(train) // 4), max(1, len(train) // 2), len(train)}):
        sub = {**data, "rows": [r for r in rows if r["set"] == "test" and r["template"] == "translate"] + train[:n]}
        res = run(sub, verify_cost, False, only="static_")
        out[str(n)] = {k: res[k]["translate"]["tokens_per_step"] for k in names if k in res}
    return out


def recycle_hits(data: dict, widths=(1, 2, 4, 7)) -> dict:
    """Share of translate decode steps whose next token is among the first b candidates of M[last token]
    (Token Recycling's matrix, seeded from the train texts, updated along the answers). A tree draft of b
    siblings at depth 1 (not a chain: GPUModel.verify would need a tree attention mask) gains at most this
    share of a token per step: the ceiling of recycling's first level."""
    rows = data["rows"]
    eos = 151645
    M: dict[int, list[int]] = {}

    def learn(r):
        seq = r["prompt_ids"] + truth_of(r, eos)
        for j, tk in enumerate(r["topk"]):
            M[seq[len(r["prompt_ids"]) + j - 1]] = tk
    for r in rows:
        if r["set"] == "train":
            learn(r)
    hits, n = Counter(), 0
    for r in sorted((r for r in rows if r["set"] == "test" and r["template"] == "translate"), key=lambda r: r["index"]):
        t = truth_of(r, eos)
        for pos in range(1, len(t)):
            cand = M.get(t[pos - 1], [])
            n += 1
            for b in widths:
                hits[b] += t[pos] in cand[:b]
            M[t[pos - 1]] = r["topk"][pos]  # this step's logits, learned after drafting
    return {f"top{b}": round(hits[b] / n, 3) for b in widths} | {"steps": n}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench.draft_sim", description=__doc__.splitlines()[0])
    p.add_argument("--greedy", default="docs/results/draft_sim_greedy_cpu_0.5b.json")
    p.add_argument("--verify-cost", type=float, default=1.05, help="a verify step's time in plain decode steps")
    p.add_argument("--no-backoff", action="store_true", help="draft at every step (the engine backs off after misses)")
    p.add_argument("--only", default=None, help="drafters whose name contains this")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    data = json.loads(Path(args.greedy).read_text(encoding="utf-8"))
    res = {"schema": "deepinfer-draft-sim/1", "greedy_file": Path(args.greedy).name, "model": data.get("model"),
           "verify_cost": args.verify_cost, "backoff": not args.no_backoff, "max_draft": K,
           "env": environment(sys.argv[1:] if argv is None else argv),
           "texts": {s: Counter(f"{r['template']}" for r in data["rows"] if r["set"] == s) for s in ("test", "train")},
           "drafters": run(data, args.verify_cost, not args.no_backoff, args.only)}
    if not args.only:
        res["learning_curve_translate"] = learning_curve(data, args.verify_cost)
        if all("topk" in r for r in data["rows"]):
            res["recycle_first_token_hits_translate"] = recycle_hits(data)
        other = run(data, args.verify_cost, args.no_backoff, None)  # the other backoff setting, compact
        res["other_backoff_setting"] = {"backoff": args.no_backoff, "tokens_per_step": {
            k: {t: v[t]["tokens_per_step"] for t in ("translate", "rewrite")} for k, v in other.items()}}
    res["env"]["command"] = "python -m engine.bench.draft_sim " + " ".join(sys.argv[1:] if argv is None else argv)
    best = sorted(((v["translate"]["tokens_per_step"] or 0, k) for k, v in res["drafters"].items()), reverse=True)
    res["best_translate"] = [{"drafter": k, "tokens_per_step": t, "gpu_speedup_est":
                              res["drafters"][k]["translate"]["gpu_speedup_est"]} for t, k in best[:5]]
    for k, v in res["drafters"].items():
        tr, rw = v["translate"], v["rewrite"]
        print(f"{k:40s} translate {tr['tokens_per_step']} tok/step (acc {tr['acceptance_rate']}, {tr['verify_steps']} "
              f"verify / {tr['plain_steps']} plain, est x{tr['gpu_speedup_est']})   rewrite {rw['tokens_per_step']} "
              f"(est x{rw['gpu_speedup_est']})", file=sys.stderr)
    emit_json(res, args.out, lambda m: print(m, file=sys.stderr))
    return 0


if __name__ == "__main__":
    sys.exit(main())
