"""Speculative decoding by prompt lookup: draft tokens copied from the context, verified in one forward.

Rewrite, translate, summarize and to-do outputs copy long runs of their input. When the last n tokens
(n = 3, 2, 1) of prompt + output occurred earlier in the context, the k tokens that followed them
there are the draft (no second model). One forward runs [last token] + draft at positions p .. p+k of
the sequence's slot through the multi-token (prefill) path with logits at every position, so
logits[i] is the model's next-token distribution after draft[:i]:

- greedy: draft[i] is kept while it equals argmax(logits[i]); then argmax at the first mismatch (or
  after the whole draft) is appended too. The tokens are exactly those of plain greedy decoding
  (up to the float rounding of a k+1-token forward vs 1-token forwards, as for any batched step).
- sampling: standard speculative sampling with the drafter's point mass q = delta(draft[i]): keep
  draft[i] with probability p_i(draft[i]); on the first rejection sample from p_i with draft[i]
  removed (renormalized); after a fully kept draft sample from p_k. The output is distributed as
  plain sampling from p (Leviathan et al. 2023, Chen et al. 2023).

On a CUDA GPU the forward is one graph-captured decode step of the k+1 tokens (GPUModel.verify: every
row's K/V written first, then attention; k <= 7): each row's logits and fused argmax are the bits a
one-token step would give, so greedy output is plain greedy output exactly.

Drafts come from prompt lookup first; where it has none, from the optional draft model
(engine/runtime/draft_model.py) or the draft heads (engine/runtime/draft_heads.py: Medusa-style heads on the
hidden state of the sequence's last step, which this module keeps after each verify step). Only prompt lookup
backs off after a miss: a head draft costs one small GEMV, and its verify step about a plain step on a GPU.

Draft trees (greedy, GPU step model, from the draft heads): the k nodes of a token tree run as one verify step
(GPUModel.verify with parents: each node attends to its own root path); the kept tokens are the longest root path
whose every token equals the argmax of its parent's row, plus the argmax after it: plain greedy decoding again.
GPUModel.keep_path then moves that path's K/V rows into place. A request decoding alone runs them in bursts
(burst(): each tree accepted on the GPU, the next step queued before the host reads the tokens).

Rejected positions leave KV behind in the static slot beyond the sequence's length; the next step
overwrites them before anything attends to them. Requests opt in (SamplingParams.speculative: the
tray's templates); requests with a grammar, logprobs or logit biases decode the plain way.
"""
from __future__ import annotations

import time

import torch

from engine.runtime.draft_heads import TREE
from engine.runtime.sampling import CPU_HEAD
from engine.runtime.sequence import Sequence
from kernels.decode_kernels import tree_walk

NGRAM_MAX, NGRAM_MIN = 3, 2  # a single repeated token predicts too little: drafts need a 2- or 3-token match
MAX_DRAFT = 8  # draft tokens per verify step (a 9-token forward costs ~ a 1-token one on a GPU, more on CPU)
DRAFT_MODEL_K = 4  # tokens a draft model proposes per step (each costs one small-model forward)
TREE_DEPTH, TREE_NODES = max(len(t) for t in TREE), len(TREE)  # the draft heads' full tree
MAX_BACKOFF = 16  # after a draft with nothing accepted, plain steps before drafting again: 2, 4, .. 16
LOOKUP_RECENT = 8  # engine steps after an accepted lookup draft without bursts (rewrite: runs of copied text)


def draft(ids: list[int], k: int, ngram_max: int = NGRAM_MAX, ngram_min: int = NGRAM_MIN) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the context's last n tokens."""
    L = len(ids)
    for n in range(min(ngram_max, L - 1), ngram_min - 1, -1):
        pat = ids[L - n:]
        first = pat[0]
        for i in range(L - n - 1, -1, -1):  # latest first: the copy being made right now
            if ids[i] == first and ids[i:i + n] == pat:
                out = ids[i + n:i + n + k]
                if out:
                    return out
    return []


def wants(seq: Sequence) -> bool:
    p = seq.params
    return bool(getattr(p, "speculative", False)) and getattr(p, "grammar", None) is None \
        and getattr(p, "logprobs", None) is None and not getattr(p, "logit_bias", None) \
        and not getattr(p, "presence_penalty", 0.0) and not getattr(p, "frequency_penalty", 0.0)


def stats_for(runner) -> dict:
    st = getattr(runner, "_spec_stats", None)
    if st is None:
        st = runner._spec_stats = {"verify_steps": 0, "drafted": 0, "accepted": 0, "tokens": 0, "verify_s": 0.0,
                                   "by_source": {}}
    return st


def report(runner) -> dict:
    """For /health and --stats: acceptance rate and tokens per verify forward (1.0 = no gain)."""
    st = dict(stats_for(runner))
    st["by_source"] = {k: {**v, "acceptance_rate": round(v["accepted"] / v["drafted"], 4) if v["drafted"] else None,
                           "tokens_per_step": round(v["tokens"] / v["verify_steps"], 3) if v["verify_steps"] else None}
                       for k, v in st.get("by_source", {}).items()}
    st["acceptance_rate"] = round(st["accepted"] / st["drafted"], 4) if st["drafted"] else None
    st["tokens_per_step"] = round(st["tokens"] / st["verify_steps"], 3) if st["verify_steps"] else None
    st["verify_s"] = round(st["verify_s"], 3)
    return st


def all_logits(runner, seq: Sequence, ids: list[int], start: int) -> torch.Tensor:
    """ids at positions start.. of the sequence's slot in one forward -> fp32 logits [len(ids), vocab]."""
    cache = getattr(runner, "cache", None)
    if cache is not None:  # CPU runner: Qwen2Model over its KVCache
        return runner.model(torch.tensor([ids]), cache, [seq.slot], [start], all_logits=True)[0]
    return runner.model.prefill(ids, seq.slot, start, all_logits=True)  # GPU model


def tree_capable(runner) -> bool:
    """Whether the runner verifies draft trees: a GPUModel's verify step (CUDA, or its references in tests)."""
    return hasattr(getattr(runner, "model", None), "keep_path") and hasattr(runner, "max_draft")


def verify_logits(runner, seq: Sequence, ids: list[int], start: int,
                  parents: list[int] | None = None) -> tuple[list[int] | None, torch.Tensor, object]:
    """(greedy ids or None, fp32 logits [len(ids), vocab], final hidden rows [len(ids), H] or None) of ids at
    positions start..: the GPU's verify step (its fused argmax is the plain decode step's; parents: a draft
    tree), else one all-position forward."""
    verify = getattr(getattr(runner, "model", None), "verify", None)
    if parents is not None or getattr(runner, "device", "cpu") == "cuda" and verify is not None \
            and len(ids) <= runner.max_draft + 1:
        ids_, logits = verify(ids, start, seq.slot, parents=parents)
        return ids_, logits, runner.model.x[:len(ids)]  # the step's final normed rows (ops_step: x buffer)
    logits = all_logits(runner, seq, ids, start)
    hidden = getattr(runner.model, "last_hidden", None) if getattr(runner, "cache", None) is not None else None
    return None, logits, None if hidden is None else hidden[0]


def probs(logits: torch.Tensor, p) -> torch.Tensor:
    """The sampler's distribution over the whole vocabulary (temperature, top-k, top-p as in sampling.sample).
    Without top_k no sort where none is needed: top_p 1 is the softmax itself, and on the CPU a nucleus that the
    CPU_HEAD largest logits hold comes from them (a sort of 151,936 logits there: 13.6 ms on 2 cores,
    docs/results/cpu_sampling_0.5b.json)."""
    x = logits.float() / p.temperature
    if p.top_k == 0 and p.top_p >= 1.0:
        return torch.softmax(x, dim=-1)
    if p.top_k == 0 and not x.is_cuda and x.numel() > 4 * CPU_HEAD:
        vals, idx = torch.topk(x, CPU_HEAD)
        pr = torch.exp(vals - vals[0]) / torch.exp(x - vals[0]).sum()
        if float(pr.sum()) >= p.top_p:  # the nucleus ends inside the head
            keep = (torch.cumsum(pr, dim=-1) - pr) < p.top_p
            keep[0] = True
            pr = pr * keep
            return torch.zeros_like(x).scatter_(0, idx, pr / pr.sum())
    if p.top_k > 0:
        vals, idx = torch.topk(x, min(p.top_k, x.numel()))
    else:
        vals, idx = torch.sort(x, descending=True)
    pr = torch.softmax(vals, dim=-1)
    if p.top_p < 1.0:
        keep = (torch.cumsum(pr, dim=-1) - pr) < p.top_p
        keep[0] = True
        pr = pr * keep
        pr = pr / pr.sum()
    return torch.zeros_like(x).scatter_(0, idx, pr)


def _draw(pr: torch.Tensor, gen) -> int:
    return int(torch.multinomial(pr.cpu(), 1, generator=gen))


def step(runner, seq: Sequence, proposal: list[int], source: str = "lookup", parents: list[int] | None = None,
         verified=None, t0: float | None = None) -> str:
    """Verify `proposal` for one sequence and append the kept tokens plus one more; returns the text delta.
    source: "lookup" | "model" | "heads" | "tree" (stats; only lookup backs off after a miss; burst()'s tree steps
    count as "burst"). parents: the proposal is a draft tree (greedy only; parents index [last token] + proposal,
    tree_capable runners).
    verified: (ids, logits, hidden) of a verify step already run (DraftHeads.tree_step, started at t0)."""
    st = stats_for(runner)
    t0 = time.perf_counter() if t0 is None else t0
    start = seq.num_tokens - 1
    toks = [seq.output_ids[-1]] + proposal
    ids, logits, hidden = verified if verified is not None else verify_logits(runner, seq, toks, start, parents)
    p = seq.params
    kept: list[int] = []
    last_row = None  # the verify row whose argmax gave the last kept token
    if parents is not None:
        assert p.greedy and ids is not None
        path = tree_walk(toks, ids, parents)  # down the tree: the child holding the argmax of the current node's row
        cur = path[-1] if path else 0
        kept = [toks[c] for c in path] + [ids[cur]]
        runner.model.keep_path(seq.slot, start, path)
        last_row = cur
    elif p.greedy:
        target = ids if ids is not None else logits.argmax(dim=-1).tolist()
        for d, t in zip(proposal, target):
            if d != t:
                break
            kept.append(d)
        kept.append(target[len(kept)])
    else:
        for i, d in enumerate(proposal):
            pr = probs(logits[i], p)
            u = float(torch.rand(1, generator=seq.gen))
            if u < float(pr[d]):
                kept.append(d)
                continue
            pr[d] = 0.0  # the residual max(0, p - q) with q a point mass on d
            kept.append(_draw(pr / pr.sum(), seq.gen) if float(pr.sum()) > 0 else int(pr.argmax()))
            break
        else:
            kept.append(_draw(probs(logits[len(proposal)], p), seq.gen))
    if last_row is None:
        last_row = len(kept) - 1
    accepted = min(len(kept) - 1, len(proposal))
    if source == "lookup":  # output that does not copy its input: back off so that it decodes (almost) the plain way
        seq.lookup_run = accepted  # runner.cheap_draft: a long draft next only after this many were kept
        seq.spec_misses = 0 if accepted else getattr(seq, "spec_misses", 0) + 1
        seq.spec_skip = min(2 ** seq.spec_misses, MAX_BACKOFF) if not accepted else 0
        if accepted:  # an output copying its input: lookup will draft again soon, a burst would run past it
            seq.lookup_recent = LOOKUP_RECENT
    if getattr(runner, "heads", None) is not None:  # the row whose logits gave the last kept token
        seq.hidden = None if hidden is None else hidden[last_row].clone()
    delta = ""
    for tok in kept:
        delta += seq.append(tok, runner.eos_ids)
        if seq.finished:
            break
    seq.spec_drafted += len(proposal)
    seq.spec_accepted += accepted
    st["verify_steps"] += 1
    st["drafted"] += len(proposal)
    st["accepted"] += accepted
    st["tokens"] += len(kept)
    st["verify_s"] += time.perf_counter() - t0
    src = st["by_source"].setdefault(source, {"verify_steps": 0, "drafted": 0, "accepted": 0, "tokens": 0})
    src["verify_steps"] += 1
    src["drafted"] += len(proposal)
    src["accepted"] += accepted
    src["tokens"] += len(kept)
    return delta


def burst(runner, seq: Sequence, n: int) -> str | None:
    """Up to n tree steps for ONE sequence with the GPU ahead of the host: each verify step's right path is accepted
    on the GPU (decode_spec.cu) and the next draft + verify is queued before the host reads this step's tokens, so
    the host's work per step (appending, detokenizing, stops) overlaps the GPU's. Greedy only; the same tokens as
    the host-driven tree step (the same walk on the same verify rows). Stops at a finished sequence (a step queued
    past it only wrote K/V beyond the sequence's end), and after the queued step once prompt lookup has a draft
    again (rewrites copy their input in runs: lookup's long drafts beat the tree's). None where the heads cannot
    run a burst."""
    heads = runner.heads
    st = stats_for(runner)
    t0 = time.perf_counter()
    if not heads.burst_start(seq, seq.num_tokens - 1):
        return None
    src = st["by_source"].setdefault("burst", {"verify_steps": 0, "drafted": 0, "accepted": 0, "tokens": 0,
                                               "wall_s": 0.0, "wait_s": 0.0, "bursts": 0})
    wait0 = heads.wait_s
    delta = ""
    ngram_min = getattr(getattr(runner, "cfg", None), "spec_ngram_min", NGRAM_MIN)
    i = 0
    while i < n:
        kept = heads.burst_next(more=i < n - 1)
        used = 0
        for tok in kept:
            delta += seq.append(tok, runner.eos_ids)
            used += 1
            if seq.finished:  # tokens past the end are dropped (and not counted)
                break
        for k in (st, src):
            k["verify_steps"] += 1
            k["drafted"] += TREE_NODES
            k["accepted"] += min(used, len(kept) - 1)
            k["tokens"] += used
        seq.spec_drafted += TREE_NODES
        seq.spec_accepted += min(used, len(kept) - 1)
        if seq.finished:
            break
        i += 1
        if i < n - 1 and draft(seq.prompt_ids + seq.output_ids, 1, ngram_min=ngram_min):
            n = i + 1  # the output copies its input again: accept the queued step, then prompt lookup drafts
    if not seq.finished:
        seq.hidden = heads.h.clone()  # x of the row whose argmax gave the last kept token (spec_accept copied it)
    wall = time.perf_counter() - t0
    st["verify_s"] += wall
    # wall vs wait: a burst step's wall time near the verify graph's means GPU-bound, wait near 0 means host-bound
    src["wall_s"] += wall
    src["wait_s"] += heads.wait_s - wait0
    src["bursts"] += 1
    return delta


def decode(runner, seqs: list[Sequence]) -> list[str]:
    """One engine decode step: sequences that want speculation and have a draft are verified one by one
    (each gains 1..k+1 tokens); the others take one batched plain decode step. Deltas in seqs' order."""
    out: dict[int, str] = {}
    plain = []
    cfg = getattr(runner, "cfg", None)
    on = getattr(runner, "device", "cpu") != "cuda" or getattr(cfg, "speculative_gpu", False)  # see EngineConfig
    drafter = getattr(runner, "drafter", None)  # engine/runtime/draft_model.py (optional)
    heads = getattr(runner, "heads", None)  # engine/runtime/draft_heads.py (optional)
    for s in seqs:
        room = min(s.params.max_tokens - len(s.output_ids) - 1, runner.max_context - s.num_tokens)
        prop, source, parents, verified, t0 = [], "lookup", None, None, None
        if on and wants(s) and room > 0:
            if getattr(s, "spec_skip", 0) > 0:
                s.spec_skip -= 1
            else:
                k = min(MAX_DRAFT, room, getattr(runner, "max_draft", MAX_DRAFT))
                cheap = getattr(runner, "cheap_draft", 0)  # CPU: rows past 1 + cheap cost a pass over the weights
                if cheap:  # long drafts (at most runner.long_draft) only while a copy runs
                    k = min(k, cheap if getattr(s, "lookup_run", 0) < cheap else runner.long_draft)
                prop = draft(s.prompt_ids + s.output_ids, k, ngram_min=getattr(cfg, "spec_ngram_min", NGRAM_MIN))
            s.lookup_dry = 0 if prop else getattr(s, "lookup_dry", 0) + 1  # steps in a row without a lookup draft
            if not prop and drafter is not None:
                if getattr(s, "lookup_recent", 0) > 0:  # copying its input lately: lookup drafts again soon, and a
                    s.lookup_recent -= 1  # draft model would first catch up on every token lookup gave
                elif not drafter.started(s) and s.lookup_dry <= getattr(runner, "draft_after", 0):
                    pass  # CPU: the draft model's first catch-up (the prompt) waits until lookup has no drafts
                else:
                    k = min(DRAFT_MODEL_K, room, getattr(runner, "model_drafts", DRAFT_MODEL_K))
                    prop, source = drafter.propose(s, k), "model"
            elif not prop and heads is not None:
                tree = s.params.greedy and getattr(cfg, "draft_tree", True) and tree_capable(runner)
                ctx_room = runner.max_context - s.num_tokens  # rows the tree's nodes take after the last token
                n = min(getattr(cfg, "spec_burst", 0), room, (ctx_room - TREE_NODES - 1) // (TREE_DEPTH + 1))
                if getattr(s, "lookup_recent", 0) > 0:  # copying its input lately: host-driven tree steps
                    s.lookup_recent -= 1
                    n = 0
                if tree and len(seqs) == 1 and n >= 2:  # alone: a burst of n tree steps, the GPU ahead of the host
                    d = burst(runner, s, n)
                    if d is not None:
                        out[id(s)] = d
                        continue
                if tree and room >= TREE_DEPTH and ctx_room >= TREE_NODES:  # draft + verify in one round trip
                    t0 = time.perf_counter()
                    done = heads.tree_step(s, s.num_tokens - 1)
                    if done is not None:
                        prop, parents, verified = done
                        source = "tree"
                if not prop and tree:
                    got = heads.propose_tree(s, room, ctx_room)
                    if got is not None:
                        (prop, parents), source = got, "tree"
                if not prop:
                    prop, source = heads.propose(s, room), "heads"
        if prop:
            out[id(s)] = step(runner, s, prop, source, parents, verified, t0)
        else:
            plain.append(s)
    if plain:
        for s, d in zip(plain, runner.decode(plain)):
            out[id(s)] = d
    return [out[id(s)] for s in seqs]
