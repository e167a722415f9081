"""engine/bench/tree_choice.py on synthetic rank hits: a tree's expected tokens per step is 1 + the sum of its nodes'
path probabilities, and the greedy growth keeps a tree (every node's parent in it) of the likeliest nodes."""
import torch

from engine.bench.tree_choice import best_trees, tree_value


def _hits():
    # 10 positions, 3 heads, 8 ranks: head 1 right at rank 0 on 6 positions, rank 1 on 2; head 2 at rank 0 on 4 of
    # head 1's 6 and at rank 1 on 1 of them; head 3 at rank 0 on 2 of those 4
    h = torch.zeros(10, 3, 8, dtype=torch.bool)
    h[:6, 0, 0] = True
    h[6:8, 0, 1] = True
    h[:4, 1, 0] = True
    h[4, 1, 1] = True
    h[:2, 2, 0] = True
    h[9, 1, 0] = True  # head 2 right where head 1 is wrong: no path reaches it
    return h


def test_tree_value_counts_whole_paths():
    h = _hits()
    assert abs(tree_value(h, [(0,)]) - 1.6) < 1e-6
    assert abs(tree_value(h, [(0,), (0, 0)]) - 2.0) < 1e-6  # (0, 0): positions 0-3 (not 9)
    assert abs(tree_value(h, [(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]) - (1 + 0.6 + 0.2 + 0.4 + 0.1 + 0.2)) < 1e-6


def test_best_trees_grow_by_likeliest_node_and_stay_trees():
    out = best_trees(_hits(), max_nodes=5)
    assert [r["added"] for r in out] == [[0], [0, 0], [1], [0, 0, 0], [0, 1]]
    for r in out:
        nodes = {tuple(t) for t in r["tree"]}
        assert all(len(t) == 1 or t[:-1] in nodes for t in nodes)
        assert r["tree"] == sorted(r["tree"], key=lambda t: (len(t), t))
    assert abs(out[-1]["expected_tokens_per_step"] - 2.5) < 1e-4


def test_dynamic_tree_follows_the_heads_confidence():
    """Per position the tree takes the nodes of highest estimated path probability: where head 1 is sure of its
    second guess (and right), the dynamic tree finds it; a static tree of head 1's top guess only does not."""
    from engine.bench.tree_choice import dynamic_values

    n = 10
    hits = torch.zeros(n, 4, 8, dtype=torch.bool)
    probs = torch.full((n, 4, 8), 0.01)
    hits[:5, 0, 0] = True   # positions 0-4: head 1's first guess is right and confident
    probs[:5, 0, 0] = 0.9
    hits[5:, 0, 1] = True   # positions 5-9: its second guess, and it says so
    probs[5:, 0, 1] = 0.9
    probs[5:, 0, 0] = 0.05
    hits[:, 1, 0] = True    # head 2's first guess always right, confident
    probs[:, 1, 0] = 0.8
    dyn = dynamic_values(hits, probs, sizes=(1, 2))
    assert dyn[1] == 2.0  # one node: the right head-1 guess every time
    assert dyn[2] == 3.0  # two nodes: it and head 2's guess after it
    assert abs(tree_value(hits, [(0,), (0, 0)]) - 2.0) < 1e-6  # static: half the positions get two tokens
