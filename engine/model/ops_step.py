"""The forward's ops (engine/model/forward.py) for one GPU decode step of B <= 8 tokens.

Every op writes into GPUModel's static buffers (so the step can be captured in a CUDA graph and replayed):
  h fp32 [8, hidden] residual, x fp16 [8, hidden] normed, qkv fp16 [8, q+2kv], attn fp16 [8, q],
  act fp16 [8, ffn], logits fp32 [8, vocab] + keys int64 [8] (fused greedy argmax).
One kernel per op (kernels/decode_*.cu through DecodeKernels, or their PyTorch references RefKernels on
the CPU): embed, then per layer rmsnorm, qkv GEMV(+bias), attention(rope, KV write), o GEMV(+residual),
rmsnorm, gate_up GEMV(silu*mul), down GEMV(+residual); rmsnorm, lm_head GEMV(+argmax). fuse_norm True
(GPUModel.fuse_norm, DEEPINFER_FUSE_NORM=1) runs each rmsnorm after a residual GEMV in that GEMV's last block
instead (same bits; measured slower on the H200, so off by default).
"""
from __future__ import annotations

from kernels.decode_reference import dense_gemv


class StepOps:
    """Ops over the first B rows of GPUModel m's static buffers; tokens/positions/slots in m.meta.
    verify: the B rows may be tokens of one slot at consecutive positions (speculative verification,
    GPUModel.verify): attention becomes the tree kernel (each row over its own path, the step's rows rebuilt from
    qkv, every row's k/v written) with the batch-1 split count, so each row gets the bits a one-token step at its
    position would.
    chain: a greedy chain step (GPUModel.decode_chain): the embedding reads each row's token from the previous
    step's argmax keys and moves the row's position one on, on the GPU, so steps can be queued back to back."""

    def __init__(self, m, B: int, verify: bool = False, chain: bool = False):
        self.m, self.B, self.kn, self.verify, self.chain = m, B, m.kn, verify, chain
        self.out = {"store": m.qkv, "silu": m.act}  # the only "store" linear is qkv, the only "silu" gate_up
        self.gemv = {"packed": m.kn.gemv, "dense": dense_gemv}  # by QWeight.kind: the one dense/packed switch
        self.fuse_norm = getattr(m, "fuse_norm", False)  # the rmsnorm after a resid GEMV runs in its last block
        self.pending = None  # a resid GEMV (w, x) held back until add_norm gives it the norm to end with

    def embed(self, w):
        m = self.m
        if self.chain:  # a greedy chain step: the tokens are the last step's argmax ids, read on the GPU
            m.kn.embed(m.meta[0], w, self.B, m.h, m.keys, chain=m.meta)
        else:
            m._embed(m.meta[0], self.B, m.h, m.keys)
        return m.h

    def add_norm(self, h, y, weight):
        # y is always None here: the "resid" GEMV epilogue adds into h itself
        m = self.m
        if self.pending is not None:  # o_proj / down_proj + the next norm: one launch (decode_norm.cu)
            w, x = self.pending
            self.pending = None
            self.gemv[w.kind](w, x, self.B, "resid", h, norm=(weight, m.cfg.rms_eps, m.x))
        else:
            self.kn.rmsnorm(h, weight, m.cfg.rms_eps, self.B, m.x)
        return m.x

    def linear(self, w, x, epi: str, h=None):
        assert self.pending is None
        if epi == "resid" and self.fuse_norm:  # forward() always follows it with add_norm(h, None, norm)
            self.pending = (w, x)
            return None
        out = h if epi == "resid" else self.out[epi]
        self.gemv[w.kind](w, x, self.B, epi, out)
        return None if epi == "resid" else out

    def attention(self, i: int, qkv):
        m, c = self.m, self.m.cfg
        args = (qkv, m.kc[i], m.vc[i], m.meta[2], m.meta[1], m.cos, m.sin, self.B, c.num_kv_heads,
                c.num_heads // c.num_kv_heads, c.head_dim, m.max_context)
        if self.verify:  # rows 3-4 of meta: each row's sequence position and root path (a chain or a tree)
            self.kn.attention_tree(*args, m.attn, m.ws, m.ws.splits(1), rpos=m.meta[3], path=m.meta[4])
        else:
            self.kn.attention(*args, m.attn, m.ws)
        return m.attn

    def logits(self, x, head):
        assert self.pending is None
        self.gemv[head.kind](head, x, self.B, "logits", self.m.logits, self.m.keys)
        return self.m.logits
