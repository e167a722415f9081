"""Train draft heads (engine/draft/heads.py) for one model by self-distillation on its own outputs.

    python -m engine.draft.train --model qwen2.5-coder-0.5b --sources 1200 \
        --out assets/drafters/qwen2.5-coder-0.5b-instruct-q4_k_m.heads.safetensors --report $OUT/draft_heads_train.json

1. Source texts of the tray's kind (mails, chat messages, notices, notes; zh and en): the model writes them
   itself from a grid of kinds x topics (sampled, seeded), plus engine/bench/draft_texts.py's texts. None of
   them is one of the hotpath bench's 10 test texts (engine/bench/hotpath.py TEXTS): checked.
2. The model's greedy outputs for them through the tray's templates (translate, and rewrite for a share),
   rendered as the tray renders them: what the heads will be asked to predict.
3. Features: the final normed hidden state at every output position, from one all-position forward over
   prompt + output (the engine's own prefill path: on a GPU the W4/K-quant kernels the heads will run beside).
   Inputs at position t: that hidden row and the token t+1 it produced; target of head i: token t+1+i (the eos
   that ends an answer included).
4. Training: the heads' residual blocks only (the lm_head and embedding are the model's, frozen), Adam, loss
   sum_i 0.8^i CE_i (Medusa-1); W starts at 0, so every head starts as the model's own next-token guess.
5. Report (JSON): data sizes, loss per epoch, held-out top-1 accuracy per head and the chain's expected tokens
   per verify step (1 + the run of correct heads), which is what speculation gains before its costs.
Runs on a CUDA GPU when there is one (minutes for the 0.5B on an H200), else on the CPU (slow: tests use tiny
settings).
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

from engine.bench.draft_texts import HELD_PER_LANGUAGE, hand_texts, train_texts
from engine.bench.hotpath import TEXTS as TEST_TEXTS
from engine.config import EngineConfig
from engine.draft import heads as H
from engine.runtime.llm import LLM
from engine.runtime.sampling import SamplingParams
from engine.runtime.scheduler import Scheduler
from trayapp.config import default_config
from trayapp.templates import render_messages

KINDS_ZH = ["一封简短的工作邮件", "一条发给同事的微信消息", "一则公司内部通知", "一段会议纪要", "一条个人备忘",
            "一条请假申请", "一段给客户的回复", "一条小区或学校的通知", "一段产品说明", "一条朋友之间的聊天消息"]
KINDS_EN = ["a short work email", "a chat message to a colleague", "an internal company notice",
            "meeting minutes", "a personal reminder note", "a leave request", "a reply to a customer",
            "a notice from a school or a building manager", "a short product description", "a text to a friend"]
TOPICS_ZH = ["项目延期", "团队聚餐", "服务器维护", "客户投诉", "出差安排", "期末考试", "房租上涨", "快递丢失",
             "健身房装修", "图书馆闭馆", "招聘面试", "报销流程", "新版本发布", "停电通知", "生日聚会", "航班取消",
             "合同修改", "实习生入职", "年度体检", "培训课程", "停车位", "数据备份", "预算审批", "搬家", "看病请假"]
TOPICS_EN = ["a delayed project", "a team dinner", "server maintenance", "a customer complaint", "a business trip",
             "final exams", "a rent increase", "a lost package", "a gym renovation", "the library closing early",
             "a job interview", "expense reports", "a new software release", "a power outage", "a birthday party",
             "a cancelled flight", "contract changes", "a new intern", "the annual health check", "a training course",
             "parking spaces", "data backups", "budget approval", "moving house", "a doctor's appointment"]


def _gen(llm, prompts: list, params: list[SamplingParams]) -> list:
    """Generate every (prompt, params) batched as the engine thread would; -> finished Sequences."""
    seqs = [llm.new_sequence(p, sp) for p, sp in zip(prompts, params)]
    return Scheduler(llm.runner, 0).run(seqs)


def source_texts(llm, n: int, seed: int = 0, max_tokens: int = 96) -> list[str]:
    """n texts the model writes itself (half zh, half en) + draft_texts.train_texts() + the hand-written texts'
    training split; none a test text (the hot-path bench's) or a held-out hand-written one."""
    rng = random.Random(seed)
    msgs, params = [], []
    for i in range(n):
        if i % 2 == 0:
            q = f"写{rng.choice(KINDS_ZH)}，内容关于{rng.choice(TOPICS_ZH)}，两到四句话。只输出正文。"
        else:
            q = f"Write {rng.choice(KINDS_EN)} about {rng.choice(TOPICS_EN)}, two to four sentences. Output only the text."
        msgs.append(llm.render([{"role": "user", "content": q}]))
        params.append(SamplingParams(max_tokens=max_tokens, temperature=0.9, top_p=0.95, seed=seed * 100003 + i))
    out = [s.text.strip() for s in _gen(llm, msgs, params)]
    texts = [t for t in out if len(t) >= 20 and "```" not in t] + train_texts() + hand_texts("train")
    test = set(TEST_TEXTS) | set(hand_texts("held"))
    return [t for t in dict.fromkeys(texts) if t not in test]


def outputs(llm, texts: list[str], max_tokens: int = 160, rewrite_share: float = 0.25, seed: int = 0) -> list[dict]:
    """Greedy outputs through the tray's templates: translate for every text, rewrite for a share of them."""
    cfg = default_config("zh")
    rng = random.Random(seed)
    jobs = [("translate", t) for t in texts] + [("rewrite", t) for t in texts if rng.random() < rewrite_share]
    prompts = [llm.render(render_messages(cfg.template(tid), t, cfg.lang)) for tid, t in jobs]
    seqs = _gen(llm, prompts, [SamplingParams(max_tokens=max_tokens, temperature=0.0) for _ in jobs])
    eos = llm.tokenizer.encode("<|im_end|>")
    rows = []
    for (tid, _), s in zip(jobs, seqs):
        out = list(s.output_ids)
        if s.finish_reason == "stop" and out and out[-1] not in llm.runner.eos_ids and len(eos) == 1:
            out.append(eos[0])  # the stop token the model emitted is what the heads should learn to predict too
        rows.append({"template": tid, "prompt_ids": list(s.prompt_ids), "output_ids": out})
    return rows


@torch.inference_mode()
def hidden_of(runner, ids: list[int]) -> torch.Tensor:
    """[T, H] final normed hidden rows of an all-position forward over ids (a free slot, position 0)."""
    slot = runner.free_slots[0]
    cache = getattr(runner, "cache", None)
    if cache is not None:  # CPU runner
        runner.model(torch.tensor([ids]), cache, [slot], [0], all_logits=True)
        return runner.model.last_hidden[0]
    assert len(ids) <= runner.model.prefill_chunk
    runner.model.prefill(ids, slot, 0, all_logits=True)
    return runner.model.last_hidden


def features(runner, rows: list[dict], K: int, device) -> tuple[torch.Tensor, ...]:
    """X fp16 [N, H] hidden rows at output positions, T int64 [N] the token each row produced (the heads' second
    input), Y int64 [N, K] targets (token t+1+i, -1 past the end), L int64 [N] rows after this one in its sequence
    (row r+1+i produced head i's target: the teacher row of distillation while i < L[r])."""
    xs, ts, ys, ls = [], [], [], []
    for r in rows:
        ids = r["prompt_ids"] + r["output_ids"]
        p = len(r["prompt_ids"])
        n = len(r["output_ids"]) - 1  # positions p-1 .. T-2 predict output tokens; the last one has no head target
        if n < 1 or len(ids) > runner.max_context:
            continue
        h = hidden_of(runner, ids)[p - 1:p - 1 + n]
        t = torch.tensor(ids, dtype=torch.int64)
        y = torch.full((n, K), -1, dtype=torch.int64)
        for i in range(K):  # row j (position p-1+j, which produced token p+j) -> token p+j+1+i
            tgt = t[p + 1 + i:p + n + 1 + i]
            y[:len(tgt), i] = tgt
        xs.append(h.to(device, torch.float16))
        ts.append(t[p:p + n].to(device))
        ys.append(y.to(device))
        ls.append(torch.arange(n - 1, -1, -1, dtype=torch.int64, device=device))
    return torch.cat(xs), torch.cat(ts), torch.cat(ys), torch.cat(ls)


def head_matrix(runner) -> torch.Tensor:
    """The model's lm_head as a dense [vocab, H] matrix on the runner's device (dequantized on a GPU)."""
    if getattr(runner, "cache", None) is not None:
        return runner.model.head_weight().detach()
    return _dense(runner.model.w.lm_head)


def embed_matrix(runner) -> torch.Tensor:
    """The model's input embedding as a dense [vocab, H] matrix (the heads' token input)."""
    if getattr(runner, "cache", None) is not None:
        e = runner.model.embedding()  # the table, or the mapped model file's rows (engine/formats/gguf_rows.py)
        return e.detach() if isinstance(e, torch.Tensor) else e.dense()
    if runner.model.host_embed is not None:
        raise RuntimeError("training needs the embedding on the GPU (it is in host RAM on this card)")
    return _dense(runner.model.w.embed)


def _dense(w) -> torch.Tensor:
    from kernels.decode_reference import dense_weight
    return (w.weight if w.kind == "dense" else dense_weight(w)).half()


def _loss(W, b, X, T, Y, E, Ein, idx, L=None, distill: float = 0.0, decay: float = 0.8) -> torch.Tensor:
    """Weighted CE of heads (W, b) on the rows idx of features X [N, H], tokens T [N], targets Y [N, K].
    distill > 0 (with L, features' rows-left): each head's loss is (1 - distill) * CE on the target token +
    distill * CE on the model's own next-token distribution at the row that produced it (softmax(lm_head(X[r+1+i])),
    where that row exists): the ranks below the argmax, which the tree's second and third guesses live on."""
    z = H.residual(X[idx].float(), Ein[T[idx]].float(), W, b)  # [n, K, H]
    loss = 0.0
    for i in range(W.shape[0]):
        logits = (z[:, i].to(E.dtype) @ E.T).float()
        li = F.cross_entropy(logits, Y[idx, i], ignore_index=-1)
        if distill > 0 and L is not None:
            ok = L[idx] > i  # [n] the teacher row r+1+i is in r's sequence
            if ok.any():
                with torch.no_grad():
                    p = torch.softmax((X[idx[ok] + 1 + i].to(E.dtype) @ E.T).float(), -1)  # [m, vocab]
                soft = -(p * torch.log_softmax(logits[ok], -1)).sum(-1).mean()
                li = (1 - distill) * li + distill * soft
        loss = loss + decay ** i * li
    return loss


def evaluate(W, b, X, T, Y, E, Ein, batch: int = 1024) -> dict:
    """Held-out top-1 accuracy per head, the chain's expected tokens per verify step, and the engine's tree's
    (engine/runtime/draft_heads.py TREE, its nodes as deep as there are heads; engine/bench/tree_choice.py
    tree_value: a node is accepted when every guess on its rank path is right)."""
    from engine.bench.tree_choice import tree_value
    from engine.runtime.draft_heads import TREE
    tree = [node for node in TREE if len(node) <= W.shape[0]]
    ranks = max(max(node) for node in tree) + 1
    with torch.no_grad():
        hits, n_valid = [], (Y >= 0).sum(0)
        for s in range(0, X.shape[0], batch):
            z = H.residual(X[s:s + batch].float(), Ein[T[s:s + batch]].float(), W, b)
            top = torch.stack([(z[:, i].to(E.dtype) @ E.T).topk(ranks, -1).indices for i in range(W.shape[0])], 1)
            y = Y[s:s + batch]
            hits.append((top == y.unsqueeze(-1)) & (y >= 0).unsqueeze(-1))  # [n, K, ranks]
        hits = torch.cat(hits)
        ok = hits[:, :, 0]  # each head's first guess right
        acc = (ok.sum(0).float() / n_valid.clamp(min=1)).tolist()
        tps = 1.0 + torch.cumprod(ok.int(), 1).sum(1).float().mean().item()  # consecutive correct heads from the first
    return {"top1_per_head": [round(a, 4) for a in acc], "tokens_per_step_chain": round(tps, 3),
            "tokens_per_step_tree": round(tree_value(hits, tree), 3), "positions": int(X.shape[0])}


def draft_vocab_targets(Y: torch.Tensor, vocab: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Targets Y (token ids, -1 = none) as rows of the draft vocabulary `vocab` (sorted ids); a token outside it
    becomes -1: the engine's heads draft over those rows only (engine/draft/vocab.py), so it is never drafted."""
    m = torch.full((vocab_size,), -1, dtype=torch.int64, device=Y.device)
    m[vocab.to(Y.device)] = torch.arange(len(vocab), device=Y.device)
    return torch.where(Y >= 0, m[Y.clamp(min=0)], torch.full_like(Y, -1))


def schedule(opt, steps: int):
    """20 warm-up steps, then a linear decay to 5% of the rate (the heads' and engine/draft/eagle_probe.py's)."""
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.05, 1 - s / steps))


def step(opt, sched, loss: torch.Tensor) -> float:
    """One optimizer step on loss; -> its value."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    sched.step()
    return float(loss.detach())


def train(X, T, Y, E, Ein, K: int, epochs: int, lr: float, batch: int, seed: int = 0, log=None, L=None,
          distill: float = 0.0, init: tuple | None = None) -> tuple:
    """Adam on the heads' W, b (zeros: every head starts as the model's own next-token guess; or init, a trained
    (W, b) to go on from). -> (W, b, loss per epoch)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    Hd = X.shape[1]
    if init is not None:
        W = init[0].to(X.device, torch.float32).clone().requires_grad_(True)
        b = init[1].to(X.device, torch.float32).clone().requires_grad_(True)
    else:
        W = torch.zeros(K, Hd, 2 * Hd, device=X.device, requires_grad=True)
        b = torch.zeros(K, Hd, device=X.device, requires_grad=True)
    opt = torch.optim.Adam([W, b], lr=lr)
    steps = max(1, -(-X.shape[0] // batch)) * epochs
    sched = schedule(opt, steps)
    hist = []
    for ep in range(epochs):
        perm = torch.randperm(X.shape[0], generator=g).to(X.device)
        tot, n = 0.0, 0
        for s in range(0, X.shape[0], batch):
            idx = perm[s:s + batch]
            tot, n = tot + step(opt, sched, _loss(W, b, X, T, Y, E, Ein, idx, L, distill)), n + 1
        hist.append(round(tot / max(1, n), 4))
        if log:
            log(f"epoch {ep + 1}/{epochs}: loss {hist[-1]}")
    return W.detach(), b.detach(), hist


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.draft.train", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--sources", type=int, default=3000, help="texts the model writes itself (half zh, half en)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--epochs", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--distill", type=float, default=0.0, help="weight of the model's own next-token distribution "
                   "in each head's loss (0: the target token alone, as Medusa-1)")
    p.add_argument("--init", default="", help="a heads file to go on training from (default: zeros)")
    p.add_argument("--vocab-subset", action="store_true", help="each head's loss over the draft vocabulary only "
                   "(engine/draft/vocab.py: the rows the engine drafts over; ~1/5 of the lm_head's cost on a CPU)")
    p.add_argument("--held", type=int, default=40, help="hand-written held-out texts to report on (never trained "
                   "on; draft_texts.hand_texts('held'), zh then en: a number below 40 takes both halves' first)")
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--max-texts", type=int, default=0, help="use at most this many source texts (0: all; smoke tests)")
    p.add_argument("--val", type=float, default=0.1, help="share of the sequences held out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="heads file (.safetensors)")
    p.add_argument("--report", default=None, help="JSON report")
    a = p.parse_args(argv)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    t0 = time.perf_counter()
    torch.manual_seed(a.seed)
    llm = LLM(EngineConfig(model=a.model, device=a.device, max_context=1024, max_batch=4 if a.device == "cpu" else 16,
                           draft_heads="",
                           prefix_cache_mb=0))
    r = llm.runner
    texts = source_texts(llm, a.sources, a.seed)
    texts = texts[:a.max_texts] if a.max_texts else texts
    t1 = time.perf_counter()
    log(f"{len(texts)} source texts in {t1 - t0:.0f} s")
    rows = outputs(llm, texts, a.max_tokens, seed=a.seed)
    t2 = time.perf_counter()
    log(f"{len(rows)} outputs, {sum(len(x['output_ids']) for x in rows)} tokens in {t2 - t1:.0f} s")
    random.Random(a.seed).shuffle(rows)
    n_val = max(1, int(len(rows) * a.val))
    hh, half = hand_texts("held"), HELD_PER_LANGUAGE  # zh, then en
    k = (min(a.held, len(hh)) + 1) // 2  # the first k of each language, never trained on
    held_texts = hh[:k] + hh[half:half + k]
    held = outputs(llm, held_texts, a.max_tokens, rewrite_share=0.0) if held_texts else []
    dev = torch.device("cuda") if r.device == "cuda" else torch.device("cpu")
    E, Ein = head_matrix(r), embed_matrix(r)
    if dev.type == "cuda":
        E = E.to(torch.bfloat16)
    Xv, Tv, Yv, _ = features(r, rows[:n_val], a.heads, dev)
    Xh, Th, Yh, _ = features(r, held, a.heads, dev) if held else (Xv[:0], Tv[:0], Yv[:0], None)
    X, T, Y, L = features(r, rows[n_val:], a.heads, dev)
    if a.vocab_subset:  # the loss and the held-out figures over the rows the engine drafts over
        from engine.draft.vocab import load as load_vocab
        ids = load_vocab(E.shape[0])
        if ids is None:
            log("no draft vocabulary for this model's tokenizer: the loss covers the whole vocabulary")
        else:
            vocab = torch.as_tensor(ids, dtype=torch.int64, device=dev)
            Yv, Yh, Y = (draft_vocab_targets(y, vocab, E.shape[0]) for y in (Yv, Yh, Y))
            E = E[vocab].contiguous()
    t3 = time.perf_counter()
    log(f"features: train {tuple(X.shape)} val {tuple(Xv.shape)} held-out hand-written {tuple(Xh.shape)} "
        f"in {t3 - t2:.0f} s")
    Hd = X.shape[1]
    init = H.load(a.init, Hd)[:2] if a.init else None
    start = tuple(x.to(dev, torch.float32) for x in init) if init else \
        (torch.zeros(a.heads, Hd, 2 * Hd, device=dev), torch.zeros(a.heads, Hd, device=dev))

    def held_eval(W_, b_):  # the hand-written held-out texts (none: None)
        return evaluate(W_, b_, Xh, Th, Yh, E, Ein) if len(Xh) else None

    before, before_h = evaluate(*start, Xv, Tv, Yv, E, Ein), held_eval(*start)
    W, b, hist = train(X, T, Y, E, Ein, a.heads, a.epochs, a.lr, a.batch, a.seed, log, L, a.distill, init)
    after, after_h = evaluate(W, b, Xv, Tv, Yv, E, Ein), held_eval(W, b)
    t4 = time.perf_counter()
    log(f"held out: before {before} after {after} ({t4 - t3:.0f} s training)")
    log(f"held-out hand-written texts: before {before_h} after {after_h}")
    src = Path(llm.spec.source).name
    report = {"schema": "deepinfer-draft-heads-train/1", "model": a.model, "source": src, "device": r.device,
              "heads": a.heads, "hidden_size": int(X.shape[1]), "vocab_size": llm.spec.config.vocab_size,
              "source_texts": len(texts), "sequences": len(rows), "val_sequences": n_val,
              "train_positions": int(X.shape[0]), "output_tokens": sum(len(x["output_ids"]) for x in rows),
              "templates": {t: sum(x["template"] == t for x in rows) for t in ("translate", "rewrite")},
              "epochs": a.epochs, "lr": a.lr, "batch": a.batch, "distill": a.distill, "loss_per_epoch": hist,
              "init": Path(a.init).name if a.init else None, "vocab_subset": a.vocab_subset,
              "val_before_training": before, "val": after,
              "held_hand_texts": {"texts": len(held), "before_training": before_h, "after": after_h},
              "seconds": {"sources": round(t1 - t0, 1), "outputs": round(t2 - t1, 1), "features": round(t3 - t2, 1),
                          "training": round(t4 - t3, 1)},
              "command": "python -m engine.draft.train " + " ".join(  # file arguments by name (no machine paths)
                  Path(x).name if x in (a.out, a.report, a.init) else x for x in (sys.argv[1:] if argv is None else argv))}
    H.save(a.out, W, b, {k: report[k] for k in ("model", "source", "heads", "hidden_size", "vocab_size", "val",
                                                 "train_positions", "epochs", "lr")})
    if a.report:
        Path(a.report).write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(json.dumps({k: report[k] for k in ("sequences", "train_positions", "val")}, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
