"""Prompt-lookup speculative decoding (engine/runtime/speculative.py) on the real 0.5B: greedy outputs are
the plain greedy outputs (protocol prompts, the five tray templates), drafts are accepted where the output
copies the input, and sampling with speculation keeps the target distribution (exact test on a toy)."""
from __future__ import annotations

import torch

from engine.bench import protocol
from engine.runtime import speculative
from engine.runtime.sampling import SamplingParams
from trayapp.config import default_config
from trayapp.templates import render_messages

from test_tray_support import server  # noqa: F401  (the real gateway over the session model)

TEXT_ZH = "明天下午三点前把实验报告发给导师，并抄送课题组的其他同学。会议改到周四上午十点，在三楼会议室。"
TEXT_EN = ("Please send the lab report to the supervisor before 3 pm tomorrow and copy the other group members. "
           "The meeting moved to Thursday 10 am in room 301.")


def _both(llm, prompt: str, n: int) -> tuple:
    plain = llm.complete(prompt, SamplingParams(max_tokens=n, temperature=0.0))
    before = dict(speculative.stats_for(llm.runner))
    spec = llm.complete(prompt, SamplingParams(max_tokens=n, temperature=0.0, speculative=True))
    after = speculative.stats_for(llm.runner)
    return plain, spec, after["drafted"] - before["drafted"], after["accepted"] - before["accepted"]


def test_draft_lookup():
    ids = [5, 6, 7, 8, 9, 1, 2, 6, 7]
    assert speculative.draft(ids, 3) == [8, 9, 1]  # the trigram 2,6,7 is new; the bigram 6,7 was seen
    assert speculative.draft([1, 2, 3], 4) == []
    assert speculative.draft([4, 1, 2, 4], 2) == []  # one repeated token is not enough by default
    assert speculative.draft([4, 1, 2, 4], 2, ngram_min=1) == [1, 2]


def test_greedy_identical_protocol_and_templates(llm):
    prompts = [llm.render([{"role": "system", "content": protocol.SYSTEM}, {"role": "user", "content": p}])
               for _, p in protocol.PROMPTS]
    cfg = default_config("zh")
    assert len(cfg.templates) == 5
    prompts += [llm.render(render_messages(t, TEXT_ZH, cfg.lang)) for t in cfg.templates]
    en = default_config("en").template("rewrite")
    prompts.append(llm.render(render_messages(en, TEXT_EN, "en")))
    drafted = accepted = 0
    for p in prompts:
        plain, spec, d, a = _both(llm, p, 16)
        assert spec.token_ids == plain.token_ids, (p[-80:], plain.text, spec.text)
        assert spec.text == plain.text
        drafted, accepted = drafted + d, accepted + a
    assert drafted > 0 and accepted > 0  # the rewrites copy their input


def test_cpu_lookup_drafts_are_short_in_float32(llm, lookup_drafts):
    """On the CPU a verify row past the cheap ones costs a pass over the weights (CPURunner.cheap_draft): in float32
    prompt lookup drafts at most 3 tokens; the tokens stay plain decoding's."""
    en = default_config("en").template("rewrite")
    plain, spec, d, a = _both(llm, llm.render(render_messages(en, TEXT_EN, "en")), 48)
    drafts = lookup_drafts
    assert spec.token_ids == plain.token_ids
    # float32: rows past 4 cost more than a kept token is worth (long_draft = cheap_draft); int8: tests/test_cpu_int8.py
    assert llm.runner.cheap_draft == llm.runner.long_draft == 3 and drafts and max(drafts) <= 3, drafts


def test_speculative_sampling_keeps_the_distribution():
    """The accept/resample rule with a point-mass drafter, over many draws, gives p (not the draft)."""
    torch.manual_seed(0)
    p = SamplingParams(temperature=1.0)
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0])
    target = speculative.probs(logits, p)
    gen = torch.Generator().manual_seed(1)
    counts = torch.zeros(4)
    d = 1  # the draft proposes token 1 every time
    n = 6000
    for _ in range(n):
        pr = speculative.probs(logits, p)
        if float(torch.rand(1, generator=gen)) < float(pr[d]):
            counts[d] += 1
        else:
            pr[d] = 0.0
            counts[speculative._draw(pr / pr.sum(), gen)] += 1
    assert (counts / n - target).abs().max() < 0.025


def test_tray_backend_gets_speculation_and_cache_counts(server):
    """Tray -> real server: the speculative flag reaches the engine; the usage frame and /health report it."""
    from trayapp.backend import OpenAIBackend

    b = OpenAIBackend(server.url + "/v1", deepinfer=True)
    tpl = default_config("zh").template("rewrite")
    msgs = render_messages(tpl, TEXT_ZH, "zh")
    first = b.chat(msgs, 12, 0.0, speculative=True)
    again = b.chat(msgs, 12, 0.0, speculative=True)
    assert first == again
    info = b.last_usage["deepinfer"]
    assert info["ttft_s"] > 0 and info["spec_drafted"] > 0 and info["spec_accepted"] >= 0
    assert info["cached_tokens"] >= 16  # the same prompt again: its blocks come from the prefix cache
    h = b.health()
    assert h["prefix_cache"]["hits"] >= 1 and h["speculative"]["drafted"] >= info["spec_drafted"]


def test_draft_model_greedy_identical(llm):
    """The optional draft model (engine/runtime/draft_model.py) where prompt lookup has no draft: here the
    session's 0.5B drafts for itself from its own free KV slots, so nearly every draft is accepted; the
    tokens must be the plain greedy ones and the drafter's slots must come back."""
    from engine.runtime.draft_model import DraftModel

    r = llm.runner
    free = list(r.free_slots)
    prompt = llm.render([{"role": "user", "content": "Why is the sky blue? Answer in two sentences."}])
    plain = llm.complete(prompt, SamplingParams(max_tokens=16, temperature=0.0))
    r.drafter = DraftModel(r)
    try:
        before = dict(speculative.stats_for(r))
        spec = llm.complete(prompt, SamplingParams(max_tokens=16, temperature=0.0, speculative=True))
        after = speculative.stats_for(r)
    finally:
        del r.drafter
    assert spec.token_ids == plain.token_ids
    assert after["drafted"] > before["drafted"] and after["accepted"] - before["accepted"] >= 8
    assert r.free_slots == free


def test_draft_model_on_the_cpu_waits_for_lookup_and_reuses_its_prefix(llm):
    """A loaded draft model (its own runner: no heads, a prefix cache of its own): its first proposal waits until
    prompt lookup had no draft for CPURunner.draft_after steps in a row, a second request's drafter starts after the
    prefix the first one's stored, and the answers stay plain greedy decoding's."""
    from engine.runtime.draft_model import DRAFT_CACHE_MB, DraftModel
    from engine.runtime.llm import make_runner
    from engine.runtime import prefix_cache

    r = llm.runner
    d = DraftModel.load(llm.cfg.model, llm.cfg, make_runner)
    assert getattr(d.runner, "heads", None) is None and d.runner.cfg.prefix_cache_mb == DRAFT_CACHE_MB
    firsts = []
    propose = d.propose

    def rec(seq, k):
        if not d.started(seq):
            firsts.append(len(seq.output_ids))
        return propose(seq, k)
    d.propose = rec
    prompt = llm.render([{"role": "user", "content": "Name three rivers in Europe, one line each."}])
    plain = llm.complete(prompt, SamplingParams(max_tokens=24, temperature=0.0))
    r.drafter = d
    try:
        outs = [llm.complete(prompt, SamplingParams(max_tokens=24, temperature=0.0, speculative=True))
                for _ in range(2)]
    finally:
        del r.drafter
    assert all(o.token_ids == plain.token_ids for o in outs)
    assert len(firsts) == 2 and all(f > r.draft_after for f in firsts), firsts  # plain steps while lookup was dry
    pc = prefix_cache.for_runner(d.runner)
    assert pc.hits >= 1 and pc.reused_tokens >= len(llm.tokenizer.encode(prompt)) - 1, pc.stats()
    assert sorted(d.runner.free_slots) == list(range(llm.cfg.max_batch)) and not d.state


def test_probs_without_a_sort_where_none_is_needed():
    """speculative.probs without top_k: top_p 1 is the softmax itself, and on the CPU a nucleus the 1,024 largest
    logits hold comes from them; both equal the sorted path's distribution (a flat row falls back to the sort)."""
    g = torch.Generator().manual_seed(3)
    for x in (torch.randn(30000, generator=g) * 6, torch.randn(30000, generator=g) * 0.1):
        for t, top_p in [(0.7, 0.9), (1.0, 1.0), (0.3, 0.95)]:
            p = SamplingParams(temperature=t, top_p=top_p)
            vals, idx = torch.sort(x / t, descending=True)  # the sorted path, written out
            pr = torch.softmax(vals, -1)
            if top_p < 1.0:
                keep = (torch.cumsum(pr, -1) - pr) < top_p
                keep[0] = True
                pr = pr * keep
                pr = pr / pr.sum()
            want = torch.zeros_like(x).scatter_(0, idx, pr)
            got = speculative.probs(x, p)
            assert torch.allclose(got, want, atol=1e-6, rtol=1e-4) and (got > 0).sum() == (want > 0).sum()
