"""Would an EAGLE-style drafter pay for the tray's translations? A go/no-go probe, not an engine drafter.

    python -m engine.draft.eagle_probe --model qwen2.5-coder-0.5b --sources 1200 --seed 7 \
        --report $OUT/eagle_probe_0.5b.json

The draft heads (engine/draft/heads.py: one residual block per head on the model's last hidden row) give ~1.56
tokens per tree step on translations, and 1.5x needs ~1.9-2.2 (docs/hotpath.md, "What 1.5x on translation needs").
EAGLE (Li et al. 2024) drafts with one decoder layer over the target's feature sequence instead: at position k its
input is fc([f_k; e(x_{k+1})]) (the target's hidden row that produced x_{k+1}, and that token's embedding), causal
attention over the earlier inputs, and its output g_k predicts the next feature f_{k+1}, whose lm_head gives x_{k+2};
deeper guesses feed g_k and the drafted token back in. This script trains such a layer on the model's own outputs
(the same data as engine/draft/train.py: texts the model writes itself, translated / rewritten greedily through the
tray's templates) and measures, on held-out outputs, what the tree the engine verifies (draft_heads.TREE: the first
guess's top 3, the second's top 2 after the best first, the third's best after that) would accept per step:
    tokens = 1 + [x2 in top3(d1)] + [x2 = d1] [x3 in top2(d2)] + [x2 = d1] [x3 = d2] [x4 = d3]
with the EAGLE layer drafting autoregressively (depth 2 and 3 attend over the true prefix plus their own drafted
rows, as the drafter would at run time), next to the shipped heads and heads trained here on the same split. Nothing
here runs in the engine; a positive answer is what would justify building the drafter into the decode graphs.

Training follows EAGLE-1: loss = smooth-L1(g_k, f_{k+1}) + w_cls * CE(lm_head(g_k), x_{k+2}), uniform noise on the
input features; the lm_head and embedding are the model's, frozen. Features are the model's final normed hidden rows
(what engine/draft/train.py uses), so g_k predicts normed rows and the lm_head applies to it directly.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from kernels import ops_reference

TREE_FIRST, TREE_SECOND = 3, 2  # draft_heads.TREE: top 3 of the first guess, top 2 of the second after the best


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """x [..., T, n, hd] (neox halves), pos int64 [..., T] -> x rotated at pos (the rotation is the reference's,
    kernels/ops_reference.py; the angles come from any positions here, drafted rows included)."""
    hd = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd)
    ang = pos.float()[..., None] * inv  # [..., T, hd/2]
    return ops_reference.rope(x, ang.cos()[..., None, :], ang.sin()[..., None, :]).to(x.dtype)


class EagleLayer(nn.Module):
    """fc([f; e]) -> one Qwen2 decoder layer (GQA attention with rope, SiLU MLP) -> g (a predicted feature row)."""

    def __init__(self, H: int, nh: int, nkv: int, hd: int, ffn: int, theta: float, eps: float = 1e-6):
        super().__init__()
        self.nh, self.nkv, self.hd, self.theta = nh, nkv, hd, theta
        self.fc = nn.Linear(2 * H, H)
        self.n1, self.n2 = nn.RMSNorm(H, eps=eps), nn.RMSNorm(H, eps=eps)
        self.q, self.k, self.v = nn.Linear(H, nh * hd), nn.Linear(H, nkv * hd), nn.Linear(H, nkv * hd)
        self.o = nn.Linear(nh * hd, H, bias=False)
        self.gate, self.up = nn.Linear(H, ffn, bias=False), nn.Linear(H, ffn, bias=False)
        self.down = nn.Linear(ffn, H, bias=False)

    def inp(self, f: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([f, e], -1))

    def qkv(self, x: torch.Tensor, pos: torch.Tensor):
        """x [..., T, H] -> q [..., T, nh, hd], k and v [..., T, nh, hd] (KV heads repeated), roped at pos."""
        y = self.n1(x)
        sh = x.shape[:-1]
        q = rope(self.q(y).view(*sh, self.nh, self.hd), pos, self.theta)
        k = rope(self.k(y).view(*sh, self.nkv, self.hd), pos, self.theta)
        v = self.v(y).view(*sh, self.nkv, self.hd)
        r = self.nh // self.nkv
        return q, k.repeat_interleave(r, -2), v.repeat_interleave(r, -2)

    def finish(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """x [..., H] the layer input, a [..., nh, hd] attention output -> g [..., H]."""
        x = x + self.o(a.flatten(-2))
        y = self.n2(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))

    def forward(self, f: torch.Tensor, e: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Teacher-forced: f, e [B, T, H], pos [B, T], valid bool [B, T] (padding False) -> g [B, T, H]."""
        x = self.inp(f, e)
        q, k, v = self.qkv(x, pos)
        T = x.shape[1]
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()[None] & valid[:, None, :]  # [B, Tq, Tk]
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=mask[:, None])
        return self.finish(x, a.transpose(1, 2))


def sequences(runner, rows: list[dict], device) -> list[dict]:
    """Per output row: H fp16 [N, hidden] (the final normed hidden of every position of prompt + output: row i
    produced token i + 1), ids int64 [N], p (the prompt length)."""
    from engine.draft.train import hidden_of
    out = []
    for r in rows:
        ids = r["prompt_ids"] + r["output_ids"]
        if len(r["output_ids"]) < 2 or len(ids) > runner.max_context:
            continue
        out.append({"H": hidden_of(runner, ids).to(device, torch.float16).clone(),
                    "ids": torch.tensor(ids, dtype=torch.int64, device=device), "p": len(r["prompt_ids"])})
    return out


def _batch(seqs: list[dict], Ein: torch.Tensor):
    """Padded teacher-forced inputs for positions k = 0 .. N-2 of each sequence: f = H[k], e = emb(ids[k+1]),
    targets f* = H[k+1] and x* = ids[k+2] (-1 where it does not exist or k < p - 1: tokens only count in the output)."""
    T = max(len(s["ids"]) - 1 for s in seqs)
    B, Hd, dev = len(seqs), seqs[0]["H"].shape[1], seqs[0]["ids"].device
    f = torch.zeros(B, T, Hd, device=dev)
    ft = torch.zeros(B, T, Hd, device=dev)
    tok_in = torch.zeros(B, T, dtype=torch.int64, device=dev)
    tgt = torch.full((B, T), -1, dtype=torch.int64, device=dev)
    valid = torch.zeros(B, T, dtype=torch.bool, device=dev)
    for i, s in enumerate(seqs):
        n = len(s["ids"]) - 1
        f[i, :n] = s["H"][:n].float()
        ft[i, :n] = s["H"][1:n + 1].float()
        tok_in[i, :n] = s["ids"][1:n + 1]
        valid[i, :n] = True
        lo = max(0, s["p"] - 1)
        tgt[i, lo:n - 1] = s["ids"][lo + 2:n + 1]
    pos = torch.arange(T, device=dev).expand(B, T)
    return f, Ein[tok_in].float(), ft, tgt, pos, valid


def train_layer(layer: EagleLayer, seqs: list[dict], E: torch.Tensor, Ein: torch.Tensor, epochs: int, lr: float,
                batch: int, w_cls: float = 0.1, noise: float = 0.1, seed: int = 0, log=None) -> list[float]:
    from engine.draft.train import schedule, step
    opt = torch.optim.AdamW(layer.parameters(), lr=lr, weight_decay=0.0)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]["ids"]))  # similar lengths per batch: less padding
    batches = [order[i:i + batch] for i in range(0, len(order), batch)]
    steps = max(1, len(batches) * epochs)
    sched = schedule(opt, steps)
    rng = random.Random(seed)
    g = torch.Generator(device=seqs[0]["H"].device).manual_seed(seed)  # the noise drawn where the features are
    hist = []
    for ep in range(epochs):
        rng.shuffle(batches)
        tot, n = 0.0, 0
        for bi in batches:
            f, e, ft, tgt, pos, valid = _batch([seqs[i] for i in bi], Ein)
            scale = f[valid].std().item() if noise > 0 else 0.0
            if noise > 0:
                f = f + (torch.rand(f.shape, generator=g, device=f.device) * 2 - 1) * noise * scale
            gk = layer(f, e, pos, valid)
            reg = F.smooth_l1_loss(gk[valid], ft[valid])
            m = tgt >= 0
            cls = F.cross_entropy((gk[m].to(E.dtype) @ E.T).float(), tgt[m]) if m.any() else gk.sum() * 0
            tot, n = tot + step(opt, sched, reg + w_cls * cls), n + 1
        hist.append(round(tot / max(1, n), 4))
        if log:
            log(f"eagle epoch {ep + 1}/{epochs}: loss {hist[-1]}")
    return hist


def _attend(q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, extra_k: list, extra_v: list) -> torch.Tensor:
    """Row k's query q[k] over the true rows 0..k (K, V [T, nh, hd]) and its own drafted rows (extra_k/v: lists of
    [T, nh, hd], row k's private keys) -> [T, nh, hd]."""
    hd = q.shape[-1]
    T = q.shape[0]
    s_true = torch.einsum("qhd,khd->hqk", q.float(), K.float()) / hd ** 0.5  # [nh, T, T]
    s_true = s_true.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    s_ex = [((q.float() * k.float()).sum(-1) / hd ** 0.5).transpose(0, 1)[..., None] for k in extra_k]  # [nh, T, 1]
    p = torch.softmax(torch.cat([s_true] + s_ex, -1), -1)
    a = torch.einsum("hqk,khd->qhd", p[..., :T], V.float())
    for i, v in enumerate(extra_v):
        a = a + p[..., T + i].transpose(0, 1)[..., None] * v.float()
    return a.to(q.dtype)


@torch.no_grad()
def eagle_guesses(layer: EagleLayer, s: dict, E: torch.Tensor, Ein: torch.Tensor) -> tuple:
    """One held-out sequence: for every position k, the EAGLE layer's top-3 first guess (x_{k+2}), then drafting on
    (depth 2 from its own g_k and best first token, depth 3 likewise): top-2 second guess and the third's best.
    -> (top3 [T, 3], top2 [T, 2], top1 [T]) for k = 0 .. T-1, T = N - 1."""
    H, ids = s["H"].float(), s["ids"]
    T = len(ids) - 1
    pos = torch.arange(T, device=ids.device)
    x1 = layer.inp(H[:T], Ein[ids[1:T + 1]].float())
    q1, k1, v1 = layer.qkv(x1, pos)
    g1 = layer.finish(x1, _attend(q1, k1, v1, [], []))
    top3 = (g1.to(E.dtype) @ E.T).float().topk(TREE_FIRST, -1).indices
    x2 = layer.inp(g1, Ein[top3[:, 0]].float())
    q2, k2, v2 = layer.qkv(x2, pos + 1)
    g2 = layer.finish(x2, _attend(q2, k1, v1, [k2], [v2]))
    top2 = (g2.to(E.dtype) @ E.T).float().topk(TREE_SECOND, -1).indices
    x3 = layer.inp(g2, Ein[top2[:, 0]].float())
    q3, k3, v3 = layer.qkv(x3, pos + 2)
    g3 = layer.finish(x3, _attend(q3, k1, v1, [k2, k3], [v2, v3]))
    top1 = (g3.to(E.dtype) @ E.T).float().argmax(-1)
    return top3, top2, top1


@torch.no_grad()
def heads_guesses(W: torch.Tensor, b: torch.Tensor, s: dict, E: torch.Tensor, Ein: torch.Tensor) -> tuple:
    """The same three guesses from draft heads (engine/draft/heads.py; Medusa-style: every head reads row k)."""
    from engine.draft import heads as Hd
    ids, T = s["ids"], len(s["ids"]) - 1
    z = Hd.residual(s["H"][:T].float(), Ein[ids[1:T + 1]].float(), W.float(), b.float())  # [T, K, H]
    logit = lambda i: (z[:, i].to(E.dtype) @ E.T).float()  # noqa: E731
    return logit(0).topk(TREE_FIRST, -1).indices, logit(1).topk(TREE_SECOND, -1).indices, logit(2).argmax(-1)


def tree_tokens(guesses: tuple, s: dict) -> torch.Tensor:
    """Tokens a verify step of the engine's tree would keep at each output position k (p - 1 <= k <= N - 3: the row
    that produced the last token has nothing after it): 1 + the accepted path's length, from the guesses (top3 [T, 3],
    top2 [T, 2], top1 [T]) and the true tokens (past the end: no match)."""
    top3, top2, top1 = guesses
    ids, p = s["ids"], s["p"]
    N = len(ids)
    ks = torch.arange(max(0, p - 1), N - 2, device=ids.device)
    pad = torch.full((3,), -1, dtype=torch.int64, device=ids.device)
    ext = torch.cat([ids, pad])
    x2, x3, x4 = ext[ks + 2], ext[ks + 3], ext[ks + 4]
    h1 = top3[ks, 0] == x2
    in3 = (top3[ks] == x2[:, None]).any(-1)
    h2 = top2[ks, 0] == x3
    in2 = (top2[ks] == x3[:, None]).any(-1)
    h3 = top1[ks] == x4
    return 1 + in3.float() + (h1 & in2).float() + (h1 & h2 & h3).float()


def evaluate(guess_fn, seqs: list[dict]) -> dict:
    per, first = [], []
    for s in seqs:
        g = guess_fn(s)
        per.append(tree_tokens(g, s))
        ids, p = s["ids"], s["p"]
        ks = torch.arange(max(0, p - 1), len(ids) - 2, device=ids.device)
        first.append((g[0][ks, 0] == ids[ks + 2]).float())
    t = torch.cat(per)
    return {"tree_tokens_per_step": round(t.mean().item(), 4), "first_top1": round(torch.cat(first).mean().item(), 4),
            "positions": int(t.numel())}


def main(argv: list[str] | None = None) -> int:
    from engine.config import EngineConfig
    from engine.draft import heads as Hd
    from engine.draft import train as T
    from engine.runtime.llm import LLM
    p = argparse.ArgumentParser(prog="python -m engine.draft.eagle_probe", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--sources", type=int, default=1200)
    p.add_argument("--max-texts", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--val", type=float, default=0.1)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--batch", type=int, default=16, help="sequences per step")
    p.add_argument("--ffn", type=int, default=0, help="the layer's MLP width (0: the model's)")
    p.add_argument("--w-cls", type=float, default=0.1)
    p.add_argument("--noise", type=float, default=0.1)
    p.add_argument("--heads-epochs", type=int, default=16, help="heads trained on the same split (0: skip)")
    p.add_argument("--seed", type=int, default=7, help="7: texts the shipped heads never saw (trained on seed 0)")
    p.add_argument("--report", required=True)
    a = p.parse_args(argv)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    t0 = time.perf_counter()
    torch.manual_seed(a.seed)
    llm = LLM(EngineConfig(model=a.model, device=a.device, max_context=1024, max_batch=4 if a.device == "cpu" else 16,
                           draft_heads="", prefix_cache_mb=0))
    r, cfg = llm.runner, llm.spec.config
    texts = T.source_texts(llm, a.sources, a.seed)
    texts = texts[:a.max_texts] if a.max_texts else texts
    rows = T.outputs(llm, texts, a.max_tokens, seed=a.seed)
    random.Random(a.seed).shuffle(rows)
    t1 = time.perf_counter()
    log(f"{len(rows)} outputs in {t1 - t0:.0f} s")
    dev = torch.device("cuda") if r.device == "cuda" else torch.device("cpu")
    E, Ein = T.head_matrix(r), T.embed_matrix(r).to(dev)
    if dev.type == "cuda":
        E = E.to(torch.bfloat16)
    n_val = max(1, int(len(rows) * a.val))
    val, tr = sequences(r, rows[:n_val], dev), sequences(r, rows[n_val:], dev)
    t2 = time.perf_counter()
    log(f"features: {len(tr)} train / {len(val)} held-out sequences in {t2 - t1:.0f} s")
    layer = EagleLayer(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                       a.ffn or cfg.intermediate_size, cfg.rope_theta, cfg.rms_eps).to(dev)
    hist = train_layer(layer, tr, E, Ein, a.epochs, a.lr, a.batch, a.w_cls, a.noise, a.seed, log)
    layer.eval()
    res = {"eagle": evaluate(lambda s: eagle_guesses(layer, s, E, Ein), val)}
    src = Path(llm.spec.source).name
    shipped = Hd.bundled(src)
    if shipped is not None:
        W, b, _ = Hd.load(shipped, cfg.hidden_size)
        res["shipped_heads"] = evaluate(lambda s: heads_guesses(W.to(dev), b.to(dev), s, E, Ein), val)
    if a.heads_epochs:
        flat = T.features(r, rows[n_val:], 3, dev)
        Wt, bt, _ = T.train(flat[0], flat[1], flat[2], E, Ein, 3, a.heads_epochs, 1e-3, 1024, a.seed, None, flat[3])
        res["heads_same_split"] = evaluate(lambda s: heads_guesses(Wt, bt, s, E, Ein), val)
    t3 = time.perf_counter()
    params = sum(x.numel() for x in layer.parameters())
    report = {"schema": "deepinfer-eagle-probe/1", "model": a.model, "source": src, "device": r.device,
              "sequences": {"train": len(tr), "held_out": len(val)}, "layer_params": params,
              "ffn": a.ffn or cfg.intermediate_size, "epochs": a.epochs, "lr": a.lr, "batch": a.batch,
              "w_cls": a.w_cls, "noise": a.noise, "loss_per_epoch": hist, "tree": "first top 3, second top 2 after "
              "the best first, third best after that (draft_heads.TREE)", "held_out": res,
              "seconds": {"data": round(t1 - t0, 1), "features": round(t2 - t1, 1), "train_eval": round(t3 - t2, 1)},
              "command": "python -m engine.draft.eagle_probe " + " ".join(
                  Path(x).name if x == a.report else x for x in (sys.argv[1:] if argv is None else argv))}
    Path(a.report).write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
