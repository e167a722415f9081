"""The draft heads (engine/draft/heads.py) as a speculative drafter: proposes up to K tokens from the hidden state
the target's last step left for a sequence (Sequence.hidden, recorded by the runners and by speculative.step) and
the embedding of the token that step produced. No KV cache of its own.

On a GPUModel (CUDA, or the kernels' references on the CPU in tests) the draft is: embedding row of the token
(the decode step's embed kernel, or the row staged from host RAM), one fp16 [K*H, 2H] GEMV + silu + residual,
and the model's own decode GEMV for the lm_head on K rows with its fused argmax; on CUDA these are captured in
one graph (one replay + one 64-byte read per draft). On the CPU runner: the reference model's matrices.
Tree drafts (greedy requests on a GPUModel): the graph also keeps each head's TOPK best tokens, and propose_tree
builds a fixed token tree from them (TREE: head 1's three best, head 2's two best after head 1's best, head 3's
best after that), verified in one step (GPUModel.verify with parents). Sampling keeps the chain (speculative sampling
over a tree is not done here). tree_step runs the draft graph between the verify step's input copy and its
replay, the tree's tokens gathered into the step's inputs on the GPU: one host round trip per step instead of two.
burst_start / burst_next (speculative.burst): the accept graph (decode_spec.cu spec_accept + move_rows_dev) and
the draft + verify graph, alternated with the next step queued before the host reads the current one's tokens.
On the CPU runner (EngineConfig.spec_heads_cpu, 1 draft a step by default) the heads' lm_head is the model's own
over the draft vocabulary: int8 / int4 rows of its Int8Linear / Int4Linear head, or its float rows.
Optional: EngineConfig.draft_heads ("auto" / "on" = the heads bundled for the model file; "" = none; or a path).
"""
from __future__ import annotations

import logging
import time

import torch

from engine.config import EngineConfig
from engine.draft import heads as H
from engine.draft import vocab as draft_vocab
from kernels.ops_reference import linear

log = logging.getLogger("deepinfer.spec")

TOPK = 4  # best tokens kept per head for the tree (decode_topk.cu's)
# the draft tree, as rank paths: (r1, .., rd) = head 1's r1-th token, then head 2's r2-th, ..; parents before
# children; 6 nodes + the root = one 7-row verify step. Chosen by engine/bench/tree_choice.py: the likeliest nodes of
# these heads' rank statistics, and the size by expected tokens per ms of verify + draft (H200): on texts the heads
# never saw the 8-row tree (+ head 1's fourth guess) expects 1.885 tokens per step against 1.843, for ~0.09 ms more
# per step: 9% fewer tokens per ms (docs/results/tree_choice_unseen_0.5b.json, docs/hotpath.md)
TREE = ((0,), (1,), (2,), (0, 0), (0, 1), (0, 0, 0))


assert list(TREE) == sorted(TREE, key=len), "TREE in depth order: a prefix of it is a tree of bounded depth"
TREE_PARENTS = [-1] + [0 if len(t) == 1 else 1 + TREE.index(t[:-1]) for t in TREE]  # as GPUModel.verify takes them


def tree_nodes(depth: int, nodes: int) -> int:
    """How many of TREE's nodes a tree of at most `depth` ranks and `nodes` nodes keeps (a prefix of TREE)."""
    return min(nodes, sum(len(t) <= depth for t in TREE))


class DraftHeads:
    def __init__(self, runner, w: torch.Tensor, b: torch.Tensor, meta: dict, name: str = "", vocab="auto"):
        """vocab: the draft vocabulary, "auto" = the tokenizer's bundled one where EngineConfig.draft_vocab (GPU step
        model), None = the whole vocabulary, or sorted ids (tests)."""
        self.meta, self.name = meta, name
        self.wait_s = 0.0  # host time spent waiting for the GPU inside bursts (speculative.burst's stats)
        self.sub = self.top_local = None  # the draft vocabulary (GPU step model only; set below)
        self.K = w.shape[0]
        model = runner.model
        self.step_model = hasattr(model, "kn")  # GPUModel (CUDA kernels, or their references on the CPU in tests)
        self.cuda = self.step_model and model.device.type == "cuda"
        self.graph = None
        if not self.step_model:  # CPU runner: the heads in fp32, the model's lm_head over the draft vocabulary
            cfg = getattr(runner, "cfg", None)
            # drafts per verify step (docs/hotpath.md "Drafts on the CPU": one gains most; a verify step of 2-4 rows
            # costs ~1.2 plain steps there, docs/results/cpu_rows_0.5b.json)
            self.K = min(self.K, max(1, getattr(cfg, "spec_heads_cpu", EngineConfig.spec_heads_cpu)))
            self.w, self.b = w[:self.K].float(), b[:self.K].float()
            self.embed = model.embedding()  # [vocab, H]: a table, or rows from the mapped model file
            if isinstance(vocab, str):
                vocab = draft_vocab.load(model.cfg.vocab_size) if getattr(cfg, "draft_vocab", True) else None
            self.sub = None if vocab is None else torch.as_tensor(vocab, dtype=torch.int64)
            self.head = cpu_head(model, self.sub)
            return
        from kernels.decode_kernels import MAX_TOKENS
        from kernels.decode_reference import dense_gemv
        self.K = min(self.K, MAX_TOKENS - 1)  # verify takes 1 + k <= 8 tokens
        dev, c = model.device, model.cfg
        dt = torch.float16 if self.cuda else torch.float32
        self.w, self.b = w[:self.K].to(dev, dt).contiguous(), b[:self.K].to(dev, dt).contiguous()
        z = lambda *s, dt=torch.float32: torch.zeros(*s, dtype=dt, device=dev)  # noqa: E731
        self.h = z(c.hidden_size, dt=torch.float16)  # the sequence's hidden row, copied in
        self.tok = z(MAX_TOKENS, dt=torch.int32)  # the token whose embedding joins it (row 0)
        self.tok_host = torch.zeros(MAX_TOKENS, dtype=torch.int32, pin_memory=self.cuda)
        self.e = z(MAX_TOKENS, c.hidden_size)  # its embedding row (fp32, as the step's embed writes it)
        self.ekeys = z(MAX_TOKENS, dt=torch.int64)
        self.z = z(MAX_TOKENS, c.hidden_size, dt=torch.float16)  # the heads' rows (the GEMV reads 8)
        self.keys = z(MAX_TOKENS, dt=torch.int64)
        self.keys_host = torch.zeros(MAX_TOKENS, dtype=torch.int64, pin_memory=self.cuda)
        self.top_i = z(self.K, TOPK, dt=torch.int64)
        self.top_host = torch.zeros(self.K, TOPK, dtype=torch.int64, pin_memory=self.cuda)
        self.host_embed = model.host_embed  # embedding rows in host RAM (small cards): staged before the replay
        if self.host_embed is not None:
            self.e_host = torch.zeros(MAX_TOKENS, c.hidden_size, dtype=torch.float32, pin_memory=self.cuda)
        # the whole TREE's tokens, gathered from top_i by the draft graph straight into the verify step's meta[0, 1:]
        # (tree_step: draft and verify in one host round trip); needs heads for every depth of TREE
        self.fused = self.host_embed is None and self.K >= max(len(t) for t in TREE)
        self.flat = torch.tensor([(len(t) - 1) * TOPK + t[-1] for t in TREE], device=dev)
        self.parents = TREE_PARENTS
        # the burst (speculative.burst): each step's acceptance on the GPU (decode_spec.cu spec_accept) -> s_out
        # int32 [8] (count, kept tokens), s_margs (move_rows_dev); two graphs: accept+move, draft+verify
        self.s_out = z(8, dt=torch.int32)
        self.s_out_host = torch.zeros(8, dtype=torch.int32, pin_memory=self.cuda)
        self.s_margs = z(4, dt=torch.int32)
        self.s_graphs = None
        self.s_event = torch.cuda.Event() if self.cuda else None
        head = model.w.lm_head
        # the draft vocabulary (engine/draft/vocab.py): the heads' lm_head over its rows only (~1/5 of the bytes
        # and of the top-k); top_local holds subset positions, mapped to ids into top_i. The verify is unchanged.
        if isinstance(vocab, str):
            vocab = draft_vocab.load(head.N) if getattr(getattr(runner, "cfg", None), "draft_vocab", True) else None
        if vocab is not None:
            self.sub = torch.as_tensor(vocab, dtype=torch.int64, device=dev)
            head = head_rows(head, self.sub)
            self.top_local = z(self.K, TOPK, dt=torch.int64)
        self.logits = z(MAX_TOKENS, head.N)
        self._gemv = {"packed": model.kn.gemv, "dense": dense_gemv}[head.kind]
        self.head, self.model = head, model

    @classmethod
    def load(cls, runner, spec, choice: str) -> "DraftHeads | None":
        """choice: "auto" / "on" (the heads bundled for the model file, None where there are none), "" / "off"
        (None) or a path (errors raise)."""
        if choice in ("", "off", "none"):
            return None
        bundled = choice in ("auto", "on")
        path = H.bundled(spec.source) if bundled else choice
        if path is None:
            return None
        try:
            w, b, meta = H.load(path, spec.config.hidden_size)
        except H.HeadsError:
            if not bundled:
                raise
            log.warning("bundled draft heads unusable, speculation without them", exc_info=True)
            return None
        if meta.get("vocab_size") not in (None, spec.config.vocab_size):
            msg = f"draft heads {path} are for a vocabulary of {meta.get('vocab_size')}, not {spec.config.vocab_size}"
            if not bundled:
                raise H.HeadsError(msg)
            log.warning(msg)
            return None
        try:
            return cls(runner, w, b, meta, str(getattr(path, "name", path)))
        except (torch.cuda.OutOfMemoryError, MemoryError):  # ~20 MB on a GPU, 35-125 MB of RAM on the CPU
            if not bundled:
                raise
            log.warning("no memory left for the draft heads: speculation without them")
            return None

    def _draft(self):
        """The GPU draft on the static buffers (eager or captured): z = heads(h, e), keys = argmax lm_head(z)."""
        if self.host_embed is None:
            self.model.kn.embed(self.tok, self.model.w.embed, 1, self.e, self.ekeys)
        self.z[:self.K] = H.residual(self.h.to(self.w.dtype), self.e[0], self.w, self.b)
        self.keys.zero_()  # the fused argmax keeps the max of 64-bit keys
        self._gemv(self.head, self.z, self.K, "logits", self.logits, self.keys)
        if self.sub is None:
            self.model.kn.topk(self.logits, self.K, self.top_i)  # decode_topk.cu (torch.topk: ~0.1 ms in the graph)
        else:  # positions in the draft vocabulary -> token ids
            self.model.kn.topk(self.logits, self.K, self.top_local)
            torch.index_select(self.sub, 0, self.top_local.view(-1), out=self.top_i.view(-1))
        if self.fused:  # the tree's tokens into the next verify step's inputs (overwritten by any other step's copy)
            self.model.meta[0, 1:1 + len(TREE)] = self.top_i.view(-1)[self.flat]

    def _run(self):
        """CUDA: replay the draft graph (captured on first use: eager once to load the kernels, then captured;
        a failed capture stays eager, logged); elsewhere eagerly."""
        if self.cuda and self.graph is None:
            self._draft()
            torch.cuda.synchronize()
            from engine.model.graph_capture import capture
            if self.model.pool is None:
                self.model.pool = torch.cuda.graph_pool_handle()
            try:
                self.graph, _ = capture(self._draft, self.model.pool)
            except RuntimeError as e:
                log.warning("draft heads graph disabled: %s", str(e).splitlines()[0])
                self.graph = False
        elif self.cuda and self.graph is not False:
            self.graph.replay()
        else:
            self._draft()

    @torch.inference_mode()
    def warmup(self):
        """Capture the draft graph now (GPU), not on a request's first draft."""
        if self.cuda and self.graph is None:
            self._run()
            torch.cuda.synchronize()

    @torch.inference_mode()
    def propose(self, seq, k: int) -> list[int]:
        """A chain: each of the first k heads' best token."""
        if not self._ready(seq, k):
            return []
        if not self.step_model:
            k = min(k, self.K)
            z = H.residual(seq.hidden.float(), self.embed[seq.output_ids[-1]].float(), self.w[:k], self.b[:k])  # [k, H]
            best = self.head(z).argmax(dim=-1)
            return (best if self.sub is None else self.sub[best]).tolist()
        from kernels.decode_kernels import keys_to_ids
        self._replay(seq)
        if self.sub is not None:  # each head's best token: top-1 of the top-k (the argmax keys index the subset)
            return [int(t) for t in self.top_host[:min(k, self.K), 0].tolist()]
        return keys_to_ids(self.keys_host.numpy()[:min(k, self.K)])

    @torch.inference_mode()
    def propose_tree(self, seq, depth: int, nodes: int) -> tuple[list[int], list[int]] | None:
        """A tree of drafts (GPUModel only; None elsewhere or with nothing to draft from): (tokens of the nodes,
        parents) with parents indexing [root] + nodes (the root, index 0, is the sequence's last token), as
        GPUModel.verify takes them. depth: most tokens a path may add; nodes: most nodes."""
        n = tree_nodes(min(depth, self.K), nodes)
        if not self.step_model or not n or not self._ready(seq, 1):
            return None
        self._replay(seq)
        return self._tree_tokens(n), TREE_PARENTS[:1 + n]

    def _tree_tokens(self, n: int) -> list[int]:
        """The first n TREE nodes' tokens from top_host ([K][TOPK] ids of the last draft)."""
        top = self.top_host.tolist()
        return [int(top[len(t) - 1][t[-1]]) for t in TREE[:n]]

    @torch.inference_mode()
    def tree_step(self, seq, start: int):
        """Draft the full TREE and verify it in ONE host round trip (GPUModel only, the embedding on the GPU, a
        full tree's room checked by the caller): the verify step's inputs are copied, the draft graph writes the
        tree's tokens into them, the verify graph runs. -> (node tokens, parents, (greedy ids, logits, hidden
        rows)) as speculative.step takes them, or None where this cannot run (propose_tree then)."""
        if not self.step_model or not self.fused or not self._ready(seq, 1):
            return None
        m = self.model

        def before():  # after verify's input copy, before its step: the draft writes meta[0, 1:]
            self._stage(seq)
            self._run()
            self.top_host.copy_(self.top_i, non_blocking=self.cuda)  # read after the verify step's sync
        ids, logits = m.verify([seq.output_ids[-1]] + [0] * len(TREE), start, seq.slot, parents=self.parents,
                               before=before)
        return self._tree_tokens(len(TREE)), self.parents, (ids, logits, m.x[:1 + len(TREE)])

    # --- the burst: several tree steps queued on the GPU, each accepted there (speculative.burst) ------------------
    def _accept(self):
        """The last verify step's right path, on the GPU: s_out, the next step's inputs (meta, h, tok), rows moved."""
        m = self.model
        m.kn.spec_accept(m.meta, m.keys, self.parents, 1 + len(TREE), m.x, self.s_out, self.s_margs, self.h, self.tok)
        m.kn.move_rows_dev(m.kc, m.vc, self.s_margs)

    def _draft_verify(self):
        """Draft the tree from (h, tok) into meta[0, 1:], then verify it (the 1 + len(TREE)-row verify step)."""
        self._draft()
        self.model._step(1 + len(TREE), verify=True)

    def _tree_meta(self, root: int, start: int, slot: int):
        from kernels.decode_kernels import pack_path, tree_roots
        roots = tree_roots(self.parents)
        B = len(roots)
        self.model.write_meta([root] + [0] * (B - 1), [start + i for i in range(B)], [slot] * B,
                              [start + len(r) for r in roots], [pack_path(r) for r in roots])

    def _burst_graphs(self, seq, start: int):
        """Capture (CUDA) the two burst graphs on scratch inputs in seq's own slot past its end (rows a real step
        overwrites before it reads them); elsewhere the two functions run eagerly."""
        if not self.cuda:
            self.s_graphs = (self._accept, self._draft_verify)
            return
        from engine.model.graph_capture import capture
        m = self.model
        if m.pool is None:
            m.pool = torch.cuda.graph_pool_handle()
        self._tree_meta(seq.output_ids[-1], start, seq.slot)
        self._stage(seq)
        self._draft_verify()  # eagerly once: every kernel loaded before capture
        self._accept()
        torch.cuda.synchronize()
        try:
            ga, _ = capture(self._accept, m.pool)
            gb, _ = capture(self._draft_verify, m.pool)
            self.s_graphs = (ga.replay, gb.replay)
        except RuntimeError as e:
            log.warning("burst graphs disabled: %s", str(e).splitlines()[0])
            self.s_graphs = False
        torch.cuda.synchronize()  # the scratch inputs are consumed before the real ones are written

    @torch.inference_mode()
    def burst_start(self, seq, start: int) -> bool:
        """Queue a burst's first draft + verify for seq (the last token at position start). False where the burst
        cannot run (not a GPUModel, embedding in host RAM, graphs disabled)."""
        if not self.step_model or not self.fused or not self._ready(seq, 1):
            return False
        if self.s_graphs is None:
            self._burst_graphs(seq, start)
        if self.s_graphs is False:
            return False
        self._tree_meta(seq.output_ids[-1], start, seq.slot)
        self._stage(seq)
        self.s_graphs[1]()
        return True

    @torch.inference_mode()
    def burst_next(self, more: bool) -> list[int]:
        """Accept the queued verify step on the GPU; with more, queue the next draft + verify behind it before
        waiting, so the GPU works while the host handles this step's tokens. -> the kept tokens (1..4)."""
        accept, draft_verify = self.s_graphs
        accept()
        self.s_out_host.copy_(self.s_out, non_blocking=self.cuda)
        if self.cuda:
            self.s_event.record()
        if more:
            draft_verify()
        if self.cuda:
            t = time.perf_counter()
            self.s_event.synchronize()
            self.wait_s += time.perf_counter() - t  # the host idle, the GPU still busy: the burst is GPU-bound
        out = self.s_out_host.tolist()
        return out[1:1 + out[0]]

    def _ready(self, seq, k: int) -> bool:
        return getattr(seq, "hidden", None) is not None and k > 0 and bool(seq.output_ids)

    def _stage(self, seq):
        """seq's hidden row and last token (or its embedding row) into the draft's static inputs."""
        tok = seq.output_ids[-1]
        self.h.copy_(seq.hidden)
        if self.host_embed is not None:
            self.host_embed.rows([tok], self.e_host)
            self.e[:1].copy_(self.e_host[:1], non_blocking=self.cuda)
        else:
            self.tok_host[0] = tok
            self.tok.copy_(self.tok_host, non_blocking=self.cuda)

    def _replay(self, seq):
        """The draft for seq's hidden row and last token on the static buffers; keys_host / top_host hold it."""
        self._stage(seq)
        self._run()
        self.keys_host.copy_(self.keys, non_blocking=self.cuda)
        self.top_host.copy_(self.top_i, non_blocking=self.cuda)
        if self.cuda:
            torch.cuda.current_stream().synchronize()


def cpu_head(model, rows: torch.Tensor | None):
    """z [k, H] -> logits [k, len(rows)] (rows None: the whole vocabulary) with the CPU model's own lm_head: int8 or
    int4 rows of its kernels.cpu_int8.Int8Linear / kernels.cpu_int4.Int4Linear (the same codes, so a kept row's
    logits are the verify step's bits), else its float weight's rows in fp32."""
    from kernels.cpu_int4 import Int4Linear
    from kernels.cpu_int8 import Int8Linear
    head = model.weights().lm_head  # what the forward multiplies by: a module, or the (tied) embedding table
    if isinstance(head, (Int8Linear, Int4Linear)):
        return head if rows is None else type(head).rows_of(head, rows)
    w = head.weight if isinstance(head, torch.nn.Module) else head
    w = w if rows is None else w.index_select(0, rows)  # float32 (or bfloat16 where the model runs in it)
    return lambda z: linear(z.to(w.dtype), w).float()


def head_rows(w, rows: torch.Tensor):
    """The lm_head QWeight w restricted to rows (int64 [n] ids, sorted): the same layout, n rows (a copy)."""
    from kernels.qweight import QWeight
    from kernels import pack
    pick = lambda t: None if t is None else t.index_select(0, rows).contiguous()  # noqa: E731
    if w.bits == 3:  # W3 words sit in 16-row tiles (kernels/pack.py): the rows' codes packed again
        qw = pack.pack_w3(pack.unpack_rows(w.qweight.cpu(), rows.cpu(), w.K, 3)).to(w.qweight.device)
    else:
        qw = pick(w.qweight)
    return QWeight(len(rows), w.K, w.bits, qweight=qw, scales=pick(w.scales), mins=pick(w.mins),
                   weight=pick(w.weight), bias=pick(w.bias), group=w.group, form=w.form)
