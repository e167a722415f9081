"""The offline drafter replay (engine/bench/draft_sim.py): step accounting and the n-gram table."""
from engine.bench.draft_sim import NgramTable, replay, summarize


def test_replay_without_drafts_is_one_token_per_step():
    st = replay([1, 2, 3], [10, 11, 12, 13], lambda ctx, k: [], backoff=True)
    assert st == {"tokens": 3, "plain_steps": 3, "verify_steps": 0, "drafted": 0, "accepted": 0}


def test_replay_perfect_and_wrong_drafts():
    truth = list(range(100, 120))
    oracle = lambda ctx, k: [t for t in truth if t > ctx[-1]][:k]  # noqa: E731 - always the true continuation
    st = replay([1], truth, oracle, backoff=True)
    # 19 tokens after the prefill's first: steps of 7 drafted + 1 = 8, 8, then the last 3 all drafted
    assert (st["verify_steps"], st["tokens"], st["accepted"]) == (3, 19, 17)
    s = summarize([st], 1.0)
    assert s["tokens_per_step"] == round(19 / 3, 3) and s["gpu_speedup_est"] == round(19 / 3, 3)
    wrong = replay([1], truth, lambda ctx, k: [0] * k, backoff=False)
    assert wrong["verify_steps"] == 19 and wrong["accepted"] == 0 and wrong["tokens"] == 19
    backed = replay([1], truth, lambda ctx, k: [0] * k, backoff=True)  # misses: skip 2, 4, 8, 16 steps
    assert backed["verify_steps"] < 6 and backed["plain_steps"] > 13


def test_ngram_table_prefers_longest_key_and_respects_threshold():
    t = NgramTable(2)
    t.add([5, 6, 7, 5, 6, 7, 9, 6, 8])
    assert t.predict([5, 6], 1) == (7, 1.0)  # key (5, 6): always 7
    assert t.predict([9, 6], 1) == (8, 1.0)  # key (9, 6)
    tok, share = t.predict([4, 6], 1)  # unseen pair: backs off to (6,) -> 7 twice, 8 once
    assert tok == 7 and abs(share - 2 / 3) < 1e-9
    assert t.chain([5, 6], 3, 1, 0.5) == [7, 5, 6]  # (6, 7) -> 5 or 9 (share 0.5, first seen wins), (7, 5) -> 6
    assert t.chain([5, 6], 3, 1, 0.9) == [7]
    assert t.chain([4, 6], 3, 1, 0.9) == []  # 2/3 < 0.9: no draft
