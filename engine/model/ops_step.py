"""The forward's ops (engine/model/forward.py) for one GPU decode step of B <= 8 tokens.

Every op writes into GPUModel's static buffers (so the step can be captured in a CUDA graph and replayed):
  h fp32 [8, hidden] residual, x fp16 [8, hidden] normed, qkv fp16 [8, q+2kv], attn fp16 [8, q],
  act fp16 [8, ffn], logits fp32 [8, vocab] + keys int64 [8] (fused greedy argmax).
One kernel per op (kernels/decode_*.cu through DecodeKernels, or their PyTorch references RefKernels on
the CPU): embed, then per layer qkv GEMV(+bias), attention(rope, KV write), o GEMV(+residual), gate_up GEMV
(silu*mul), down GEMV(+residual); rmsnorm, lm_head GEMV(+argmax). With GPUModel.defer_norm (the default;
DEEPINFER_DEFER_NORM=0 turns it off; decode_norm.cu) the layers' rmsnorms are deferred: the kernel that updates h
(the embedding, o / down) writes the next linear's input unnormalized with its rows' sums of squares, and that linear
(qkv / gate_up) applies rstd in its epilogue: 5 kernels per layer instead of 7, verify rows bit-exact (gpu_model.py).
The final norm before lm_head is always a launch: its rows (m.x) are the draft heads' and the speculation's features.
"""
from __future__ import annotations

import os

import torch

from kernels.decode_reference import dense_gemv


def timing_skip() -> frozenset[str]:
    """DEEPINFER_TIMING_SKIP (a timing probe, WRONG values: never for answers): launches left out of the step,
    a "/"-separated list of "o" (o_proj) and "attn" (the attention), to bound what fusing them away could give."""
    v = os.environ.get("DEEPINFER_TIMING_SKIP", "")
    out = frozenset(x.strip() for x in v.split("/") if x.strip())
    if out - {"o", "attn"}:
        raise ValueError(f"DEEPINFER_TIMING_SKIP={v!r}: 'o', 'attn' or 'o/attn'")
    return out


def timing_q8() -> str:
    """DEEPINFER_TIMING_Q8 (a timing probe, WRONG values: never for answers): at batch 1 every W4 g128 layer GEMV runs
    as the int8-activation probe (kernels/decode_q8.cu) instead, into a scratch buffer, with no epilogue: "1" on
    whatever quantized x the scratch holds (what quantizing in the producers' epilogues could reach), "quant" with a
    quantize launch of the GEMV's input before each (what a launch of its own costs), "mma" the mma form (one
    arithmetic for B = 1..8, decode_q8.cu q8m_body) at every batch size, on copies of the weights in its packing. The
    lm_head stays (the chain reads its argmax)."""
    v = os.environ.get("DEEPINFER_TIMING_Q8", "")
    if v not in ("", "0", "1", "quant", "mma"):
        raise ValueError(f"DEEPINFER_TIMING_Q8={v!r}: 0, 1, quant or mma")
    return "" if v == "0" else v


class StepOps:
    """Ops over the first B rows of GPUModel m's static buffers; tokens/positions/slots in m.meta.
    verify: the B rows may be tokens of one slot at consecutive positions (speculative verification,
    GPUModel.verify): attention becomes the tree kernel (each row over its own path, the step's rows rebuilt from
    qkv, every row's k/v written) with the batch-1 split count, so each row gets the bits a one-token step at its
    position would.
    chain: a greedy chain step (GPUModel.decode_chain): the embedding reads each row's token from the previous
    step's argmax keys and moves the row's position one on, on the GPU, so steps can be queued back to back.
    merge: the long-context graphs (GPUModel.merge_from): the attention's cross-block merge is a launch of its own
    (decode_attn.cu attn_merge_body, the same arithmetic, so the same bits) instead of the last block's chain, or in
    plain steps with GPUModel.merge_kind "grid" the attention's blocks each merge a slice (attn_grid_merge)."""

    def __init__(self, m, B: int, verify: bool = False, chain: bool = False, merge: bool = False):
        self.m, self.B, self.kn, self.verify, self.chain = m, B, m.kn, verify, chain
        self.merge = merge  # long contexts: the attention's split partials merged by a launch of their own
        # ... or, in plain steps, by the attention launch's own blocks after a barrier (GPUModel.merge_kind)
        self.plain_merge = ("grid" if m.merge_kind == "grid" else True) if merge else False
        self.out = {"store": m.qkv, "silu": m.act}  # the only "store" linear is qkv, the only "silu" gate_up
        self.defer = getattr(m, "defer_norm", False)
        self.last_point = 2 * m.cfg.num_layers  # norm points 0 .. 2L - 1 deferred; 2L (before lm_head) a launch
        self.point = -1  # the norm point whose output x holds
        self.pending = None  # deferred: the embedding's weight, or a resid GEMV (w, x), until add_norm's weight
        self.prefetch = getattr(m, "prefetch", None)  # engine/model/l2_prefetch.py PrefetchPlan or None
        # int8 activations (GPUModel.q8): the batch-1 step's W4 GEMVs, and with GPUModel.q8_all every step's
        # (batches and verify rows: the same arithmetic per token; kernels/q8_plan.py q8_ok says which GEMVs)
        self.q8_act = getattr(m, "q8", False) and (B == 1 and not verify or getattr(m, "q8_all", False))
        self.skip = timing_skip()  # a timing probe only (wrong values)
        q8 = timing_q8()  # a timing probe only (wrong values)
        self.q8 = q8 if B == 1 or q8 == "mma" else ""
        if self.q8 and getattr(m, "q8_scratch", None) is None:
            from kernels.q8_kernels import Q8Kernels, eligible
            from kernels.q8_reference import mma_pack
            c, dev = m.cfg, m.h.device
            K = max(c.hidden_size, c.intermediate_size, c.num_heads * c.head_dim)
            N = max(2 * c.intermediate_size, (c.num_heads + 2 * c.num_kv_heads) * c.head_dim)
            # x per token (8 rows; the dp4a form reads row 0), the output [8, N]
            m.q8_scratch = (Q8Kernels(dev.index or 0), torch.zeros(8, K, dtype=torch.int8, device=dev),
                            torch.ones(8, K // 32, device=dev), torch.zeros(8, K // 32, device=dev),
                            torch.zeros(8, N, device=dev))
            m.q8_packed = {}  # the mma form's weight copies, by the weights' data pointer
            if self.q8 == "mma":
                for L in m.w.layers:
                    for w in (L.qkv, L.o, L.gate_up, L.down):
                        if eligible(w):
                            m.q8_packed[w.qweight.data_ptr()] = mma_pack(w.qweight)

    def _gemv(self, w, *args, **kw):
        """The one GEMV dispatch: packed weights through the kernels (with the step's L2 prefetch descriptor),
        dense ones through dense_gemv."""
        if w.kind == "dense":
            return dense_gemv(w, *args, **kw)
        if self.q8 and args[2] in ("store", "silu", "resid") and self._q8_gemv(w, *args[:2]):
            return None
        pf = self.prefetch.desc(w) if self.prefetch is not None else None
        # pf / long / q8 only when set: kernel objects without them (test doubles) keep working
        extra = ({"pf": pf} if pf is not None else {}) | ({"long": True} if self.merge else {}) | \
            ({"q8": True} if self.q8_act else {})
        return self.kn.gemv(w, *args, **kw, **extra)

    def _q8_gemv(self, w, x, B: int) -> bool:
        """DEEPINFER_TIMING_Q8 (wrong values): the probe's GEMV instead of w's, into the scratch; False where the probe
        does not take w (its own GEMV runs)."""
        from kernels.q8_kernels import eligible, plan
        if not eligible(w):
            return False
        kq, xq, dx, sx, out = self.m.q8_scratch
        if self.q8 == "mma":
            packed = self.m.q8_packed.get(w.qweight.data_ptr())
            if packed is None:
                return False
            kq.gemv_mma(w, packed, xq, dx, sx, out, B, *plan(w.N, w.K))
            return True
        if self.q8 == "quant":
            kq.quant_x(x[0, :w.K], xq[0], dx[0], sx[0])
        kq.gemv(w, xq[0], dx[0], sx[0], out[0], *plan(w.N, w.K))
        return True

    def embed(self, w):
        if self.defer:  # launched by the first add_norm, with the first layer's norm weight
            self.pending = ("embed", w, None)
        else:
            self._embed(w)
        return self.m.h

    def _embed(self, w, norm=None, ss=None):
        m = self.m
        if self.chain:  # a greedy chain step: the tokens are the last step's argmax ids, read on the GPU
            m.kn.embed(m.meta[0], w, self.B, m.h, m.keys, chain=m.meta, norm=norm, ss=ss)
        else:
            m._embed(m.meta[0], self.B, m.h, m.keys, norm=norm, ss=ss)

    def add_norm(self, h, y, weight):
        # y is always None here: the "resid" GEMV epilogue adds into h itself
        m = self.m
        self.point += 1
        p, eps = self.point, m.cfg.rms_eps
        if self.pending is not None:
            kind, w, x = self.pending
            self.pending = None
            if p < self.last_point:  # the producer of point p writes x and adds into ss[p + 1]
                norm = (weight, eps, m.x)
                if kind == "embed":  # ss[0] = ss[1] = its rows' sums; it clears the step's other rows
                    self._embed(w, norm, m.ss)
                elif "o" in self.skip and x is m.attn:
                    pass  # DEEPINFER_TIMING_SKIP: o_proj left out
                else:
                    self._gemv(w, x, self.B, "resid", h, norm=norm, ss=m.ss[p:p + 2])
                return m.x
            self._gemv(w, x, self.B, "resid", h)  # the last down_proj; the final norm below
        self.kn.rmsnorm(h, weight, eps, self.B, m.x)
        return m.x

    def linear(self, w, x, epi: str, h=None):
        assert self.pending is None
        if epi == "resid" and self.defer:  # forward() always follows it with add_norm(h, None, norm)
            self.pending = ("resid", w, x)
            return None
        out = h if epi == "resid" else self.out[epi]
        deferred = self.defer and epi in ("store", "silu") and x is self.m.x  # x = a deferred point's output
        self._gemv(w, x, self.B, epi, out, ss=self.m.ss[self.point:self.point + 2] if deferred else None,
                   eps=self.m.cfg.rms_eps)
        return None if epi == "resid" else out

    def attention(self, i: int, qkv):
        m, c = self.m, self.m.cfg
        args = (qkv, m.kc[i], m.vc[i], m.meta[2], m.meta[1], m.cos, m.sin, self.B, c.num_kv_heads,
                c.num_heads // c.num_kv_heads, c.head_dim, m.max_context)
        if "attn" in self.skip:  # DEEPINFER_TIMING_SKIP: the attention left out
            return m.attn
        if self.verify:  # rows 3-4 of meta: each row's sequence position and root path (a chain or a tree)
            self.kn.attention_tree(*args, m.attn, m.ws, m.ws.splits(1), rpos=m.meta[3], path=m.meta[4],
                                   merge=self.merge)
        else:
            self.kn.attention(*args, m.attn, m.ws, merge=self.plain_merge)
        return m.attn

    def logits(self, x, head):
        assert self.pending is None
        self._gemv(head, x, self.B, "logits", self.m.logits, self.m.keys)
        if self.chain and self.m.chain_keys == "kernel":  # the keys to the host by the step (decode_chain)
            self.kn.keys_host(self.m.keys, self.m.chain_host, self.m.meta, self.B)
        return self.m.logits
