"""Which draft tree to verify (engine/runtime/draft_heads.py TREE), from the heads' rank statistics and the
measured cost of a verify step by rows. CPU, no GPU needed for the statistics:

    python -m engine.bench.tree_choice --texts 40 --out docs/results/tree_choice_0.5b.json \
        [--cost docs/results/tree_profile_rows_h200.json]

The model translates texts DISJOINT from the hot-path bench's (engine/bench/draft_texts.py train_texts) greedily
through the tray's template; at every output position the heads (the bundled file) rank their guesses for the next
tokens. A tree node is a tuple of ranks (r1, .., rd): head 1's r1-th guess, then head 2's r2-th, ...; it is
accepted when every guess on its path equals the model's own next tokens, so a tree's expected tokens per verify
step is 1 + the sum over its nodes of P(node's path right), estimated over the positions. A child is never more
likely than its parent, so adding the likeliest node that keeps a tree a tree, one at a time, gives the best tree
of every size. With --cost (a tree_profile JSON with the verify step's replay us by rows and the draft graph's ms),
each size's expected tokens per ms of GPU time decide the size.

`dynamic_by_size`: what a tree chosen per position on the heads' own softmax confidence (EAGLE-2's dynamic tree)
would give instead of the one static TREE, same positions (dynamic_values).

Caveat: train_texts are among the texts the bundled heads were trained on (engine/draft/train.py source_texts), so
the absolute tokens per step come out higher than on unseen text; the order of the nodes is what the choice uses.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

RANKS = 8  # guesses per head considered
OLD_TREE = ((0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 0, 0))  # the 8-row tree used until 2026-12-03


def rank_hits(runner, rows: list[dict], w: torch.Tensor, b: torch.Tensor, probs: list | None = None) -> torch.Tensor:
    """bool [positions, K heads, RANKS]: head i's r-th guess equals the token i+1 places after the next one.
    probs (a list): also gets float [positions, K, RANKS], each guess's softmax probability under its head."""
    from engine.draft import heads as H
    from engine.draft.train import embed_matrix, features, head_matrix
    K = w.shape[0]
    X, T, Y, _ = features(runner, rows, K, "cpu")
    E, Ein = head_matrix(runner).float(), embed_matrix(runner).float()
    hits = []
    for s in range(0, X.shape[0], 256):
        z = H.residual(X[s:s + 256].float(), Ein[T[s:s + 256]], w.float(), b.float())  # [n, K, H]
        tops = [(z[:, i] @ E.T).float().log_softmax(-1).topk(RANKS, -1) for i in range(K)]
        top = torch.stack([t.indices for t in tops], 1)  # [n, K, RANKS]
        if probs is not None:
            probs.append(torch.stack([t.values.exp() for t in tops], 1))
        y = Y[s:s + 256]
        hits.append((top == y.unsqueeze(-1)) & (y >= 0).unsqueeze(-1))
    return torch.cat(hits)


def best_trees(hits: torch.Tensor, max_nodes: int = 7) -> list[dict]:
    """Greedy: the likeliest node whose parent is in the tree, max_nodes times. -> per size, the tree (nodes in the
    order added, re-sorted by depth as TREE wants) and its expected tokens per step."""
    K, R = hits.shape[1:]
    prob = {}

    def p(node):
        if node not in prob:
            prob[node] = path_prob(hits, node)
        return prob[node]

    tree, out, total = [], [], 1.0
    for _ in range(max_nodes):
        cands = [(r,) for r in range(R) if (r,) not in tree]
        cands += [t + (r,) for t in tree if len(t) < K for r in range(R) if t + (r,) not in tree]
        best = max(cands, key=lambda c: (p(c), -len(c), [-x for x in c]))
        tree.append(best)
        total += p(best)
        out.append({"nodes": len(tree), "tree": sorted(tree, key=lambda t: (len(t), t)),
                    "expected_tokens_per_step": round(total, 4), "added": list(best), "p_added": round(p(best), 4)})
    return out


def path_prob(hits: torch.Tensor, node) -> float:
    """P(every guess on node's rank path is right): the share of positions where the node is accepted."""
    ok = torch.ones(hits.shape[0], dtype=torch.bool)
    for d, r in enumerate(node):
        ok &= hits[:, d, r]
    return ok.float().mean().item()


def dynamic_values(hits: torch.Tensor, probs: torch.Tensor, sizes=(4, 5, 6, 7), ranks: int = 4,
                   depth: int = 3) -> dict:
    """A tree chosen per position (EAGLE-2's dynamic tree, on the heads' own confidence): the `size` nodes of
    highest estimated path probability, a node's estimate being the product of its guesses' softmax probabilities
    (a child never scores above its parent, so the top nodes form a tree). Nodes: rank tuples over the top `ranks`
    guesses (the GPU's top-4) up to `depth`. -> {size: expected tokens per verify step}, on the same positions as
    tree_value."""
    import itertools
    nodes = [t for d in range(1, depth + 1) for t in itertools.product(range(ranks), repeat=d)]
    n = hits.shape[0]
    score = torch.ones(n, len(nodes))
    ok = torch.ones(n, len(nodes), dtype=torch.bool)
    for j, node in enumerate(nodes):
        for d, r in enumerate(node):
            score[:, j] *= probs[:, d, r]
            ok[:, j] &= hits[:, d, r]
    # ties (a guess at probability 1) keep the shallower node first: nodes are listed by depth, topk is stable here
    score = score - 1e-9 * torch.tensor([len(t) for t in nodes], dtype=torch.float32)
    out = {}
    for k in sizes:
        idx = score.topk(k, -1).indices
        out[k] = round(1.0 + ok.gather(1, idx).float().sum(1).mean().item(), 4)
    return out


def tree_value(hits: torch.Tensor, tree) -> float:
    """Expected tokens per verify step of a given tree (tuples of ranks)."""
    return 1.0 + sum(path_prob(hits, node) for node in tree)


def main(argv: list[str] | None = None) -> int:
    from engine.assets_path import asset
    from engine.runtime.llm import LLM
    from engine.bench.draft_texts import train_texts
    from engine.config import EngineConfig
    from engine.draft import heads as H
    from engine.draft.train import outputs
    from engine.runtime.draft_heads import TREE

    ap = argparse.ArgumentParser(prog="python -m engine.bench.tree_choice", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--heads", default="", help="heads file (default: the one bundled for the model)")
    ap.add_argument("--texts", type=int, default=40)
    ap.add_argument("--self-seed", type=int, default=-1, help=">= 0: texts the model writes itself with this seed "
                    "(engine/draft/train.py source_texts; a seed other than the heads' 0 gives texts they never saw) "
                    "instead of draft_texts.train_texts")
    ap.add_argument("--bench-texts", action="store_true", help="the hot-path bench's 10 test texts (engine/bench/"
                    "hotpath.py TEXTS, never trained on) instead")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--cost", default="", help="tree_profile JSON: verify replay us by rows and the draft's ms")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    t0 = time.perf_counter()
    llm = LLM(EngineConfig(model=a.model, device="cpu", max_context=2048, max_batch=8, draft_heads=""))
    path = a.heads or str(H.bundled(llm.spec.source) or "")
    w, b, meta = H.load(path, llm.spec.config.hidden_size)
    if a.bench_texts:
        from engine.bench.hotpath import TEXTS
        texts = list(TEXTS)[:a.texts]
    elif a.self_seed >= 0:
        from engine.draft.train import source_texts
        seen = set(train_texts())
        texts = [t for t in source_texts(llm, a.texts, seed=a.self_seed) if t not in seen][:a.texts]
    else:
        texts = train_texts()[:a.texts]
    rows = outputs(llm, texts, max_tokens=a.max_tokens, rewrite_share=0.0)
    log(f"{len(rows)} translations, {sum(len(r['output_ids']) for r in rows)} tokens ({time.perf_counter() - t0:.0f} s)")
    probs: list = []
    hits = rank_hits(llm.runner, rows, w, b, probs)
    probs = torch.cat(probs)
    res = {"model": a.model, "heads": meta.get("source", ""), "texts": len(rows),
           "text_source": "hotpath.TEXTS" if a.bench_texts else f"source_texts(seed={a.self_seed})" if a.self_seed >= 0
           else "draft_texts.train_texts", "positions": int(hits.shape[0]),
           "rank_hit_rate": [[round(x, 4) for x in hits[:, i].float().mean(0).tolist()] for i in range(hits.shape[1])],
           "current_tree": {"tree": [list(t) for t in TREE], "expected_tokens_per_step": round(tree_value(hits, TREE), 4)},
           "tree_before_2026_12_03": {"tree": [list(t) for t in OLD_TREE],
                                      "expected_tokens_per_step": round(tree_value(hits, OLD_TREE), 4)},
           "best_by_size": best_trees(hits),
           "dynamic_by_size": dynamic_values(hits, probs)}
    if a.cost:
        prof = json.load(open(a.cost))
        sh = next(iter(prof["shapes"].values()))
        by_rows = {int(k): v for k, v in sh["verify_replay_ms_by_rows"].items()}
        draft = sh["draft_replay_ms"] + sh.get("accept_replay_ms", 0.0)
        for r in res["best_by_size"]:
            rows_ = r["nodes"] + 1
            lo = max((k for k in by_rows if k <= rows_), default=None)
            hi = min((k for k in by_rows if k >= rows_), default=None)
            if lo is not None and hi is not None:  # rows not measured: linear between the neighbours
                v = by_rows[lo] if hi == lo else by_rows[lo] + (by_rows[hi] - by_rows[lo]) * (rows_ - lo) / (hi - lo)
                ms = v + draft
                r["step_ms"] = round(ms, 4)
                r["tokens_per_ms"] = round(r["expected_tokens_per_step"] / ms, 3)
        res["cost_from"] = {"file": a.cost.split("/")[-1], "device": prof.get("device"), "draft_ms": round(draft, 4)}
    # how much of what the model writes a truncated draft vocabulary would cover (the heads' lm_head over a subset)
    out_ids = [t for r in rows for t in r["output_ids"]]
    cal = set()
    for name in ("calibration.txt", "calibration_extra.txt"):
        cal.update(llm.tokenizer.encode(asset(name).read_text(encoding="utf-8")))
    res["draft_vocab_coverage"] = {f"ids<{n}": round(sum(t < n for t in out_ids) / len(out_ids), 4)
                                   for n in (16384, 32768, 65536)}
    res["draft_vocab_coverage"]["in_calibration_text"] = round(sum(t in cal for t in out_ids) / len(out_ids), 4)
    res["draft_vocab_coverage"]["calibration_distinct_ids"] = len(cal)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    res["command"] = "python -m engine.bench.tree_choice " + " ".join(argv if argv is not None else sys.argv[1:])
    for r in res["best_by_size"]:
        log(f"  {r['nodes']} nodes: {r['expected_tokens_per_step']:.3f} tokens/step"
            + (f", {r['tokens_per_ms']:.3f} per ms" if "tokens_per_ms" in r else "") + f"  {r['tree']}")
    log(f"  current TREE: {res['current_tree']['expected_tokens_per_step']:.3f}")
    log(f"  a tree chosen per position on the heads' confidence, by size: {res['dynamic_by_size']}")
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
