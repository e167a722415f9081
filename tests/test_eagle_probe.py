"""engine/draft/eagle_probe.py on a tiny random layer (CPU): the tree's token count, the drafting attention against
a plain causal forward, and training that learns."""
import torch

from engine.draft import eagle_probe as ep


def _layer(seed=0):
    torch.manual_seed(seed)
    return ep.EagleLayer(H=32, nh=4, nkv=2, hd=8, ffn=48, theta=10000.0).eval()


def test_tree_tokens_counts_the_accepted_path():
    # p = 1: output positions k = 0 .. N-3; true tokens ids; guesses per k for x_{k+2}, x_{k+3}, x_{k+4}
    ids = torch.tensor([5, 6, 7, 8, 9, 10])
    s = {"ids": ids, "p": 1}
    T = len(ids) - 1
    top3 = torch.full((T, 3), 0)
    top2 = torch.full((T, 2), 0)
    top1 = torch.full((T,), 0)
    top3[0] = torch.tensor([7, 1, 2])   # k=0: x2 = 7 is the best first guess
    top2[0] = torch.tensor([8, 3])      # x3 = 8 is the best second guess
    top1[0] = 9                         # x4 = 9: the whole path -> 4 tokens
    top3[1] = torch.tensor([1, 2, 8])   # k=1: x2 = 8 only third: 2 tokens
    top3[2] = torch.tensor([9, 0, 0])   # k=2: best first right,
    top2[2] = torch.tensor([0, 10])     # second right as the second choice: 3 tokens
    got = ep.tree_tokens((top3, top2, top1), s)
    assert got.tolist() == [4.0, 2.0, 3.0, 1.0]  # k = 3: nothing right


def test_drafting_attention_equals_a_causal_forward_with_the_drafted_rows():
    layer = _layer()
    H, ids = torch.randn(7, 32), torch.randint(0, 50, (7,))
    Ein, E = torch.randn(50, 32), torch.randn(50, 32)
    s = {"H": H, "ids": ids, "p": 2}
    top3, top2, top1 = ep.eagle_guesses(layer, s, E, Ein)
    T = len(ids) - 1
    with torch.no_grad():
        pos = torch.arange(T)[None]
        g1 = layer(H[None, :T], Ein[ids[1:T + 1]][None], pos, torch.ones(1, T, dtype=torch.bool))[0]
        assert torch.equal((g1 @ E.T).topk(3, -1).indices, top3)
        # depth 2 at k = 3, by hand: the true rows 0..3, then row 4 = the drafted input (g1[3], best first guess)
        k = 3
        f = torch.cat([H[:k + 1], g1[k:k + 1]])
        e = torch.cat([Ein[ids[1:k + 2]], Ein[top3[k, 0]][None]])
        g2 = layer(f[None], e[None], torch.arange(k + 2)[None], torch.ones(1, k + 2, dtype=torch.bool))[0, -1]
        assert torch.equal((g2 @ E.T).topk(2).indices, top2[k])
        # depth 3 at k: one more drafted row (g2, its best guess)
        f3 = torch.cat([f, g2[None]])
        e3 = torch.cat([e, Ein[top2[k, 0]][None]])
        g3 = layer(f3[None], e3[None], torch.arange(k + 3)[None], torch.ones(1, k + 3, dtype=torch.bool))[0, -1]
        assert int((g3 @ E.T).argmax()) == int(top1[k])


def test_training_learns_a_feature_recurrence():
    # features follow f_{k+1} = tanh(A f_k + B e(x_{k+1})), tokens = argmax E f: a layer that learns it guesses well
    g = torch.Generator().manual_seed(3)
    Hd, V = 32, 40
    A, Bm = torch.randn(Hd, Hd, generator=g) / Hd ** 0.5, torch.randn(Hd, Hd, generator=g) / Hd ** 0.5
    E, Ein = torch.randn(V, Hd, generator=g), torch.randn(V, Hd, generator=g)
    seqs = []
    for _ in range(24):
        f = [torch.randn(Hd, generator=g)]
        ids = [int(torch.randint(0, V, (1,), generator=g)), int((E @ f[0]).argmax())]
        for _ in range(20):
            f.append(torch.tanh(A @ f[-1] + Bm @ Ein[ids[-1]]))
            ids.append(int((E @ f[-1]).argmax()))
        seqs.append({"H": torch.stack(f), "ids": torch.tensor(ids[:len(f)]), "p": 2})
    layer = ep.EagleLayer(Hd, 4, 2, 8, 64, 10000.0)
    before = ep.evaluate(lambda s: ep.eagle_guesses(layer.eval(), s, E, Ein), seqs[:4])
    hist = ep.train_layer(layer.train(), seqs[4:], E, Ein, epochs=30, lr=3e-3, batch=8, noise=0.0)
    after = ep.evaluate(lambda s: ep.eagle_guesses(layer.eval(), s, E, Ein), seqs[:4])
    assert hist[-1] < hist[0] / 2, hist
    assert after["first_top1"] > before["first_top1"] + 0.2, (before, after)
    assert after["tree_tokens_per_step"] > before["tree_tokens_per_step"], (before, after)
