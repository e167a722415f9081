"""Sampling on the GPU without a host round trip per token: a lone request with temperature > 0 chains its steps
(GPUModel.decode_chain with `sample`) as a greedy one does, and a batched step's sampling rows are drawn behind the
step (GPURunner.decode), one wait for the whole batch.

A draw is decode_sample.cu's five small launches after the step's lm_head (no sort: the row's max, its integer
masses' total and a few prefix sums, the smallest prefix of the canonical order that holds the draw's crossings, or
on a flat row the histogram bins that do, gathered and sorted in shared memory): temperature, top_k, top_p and the inverse CDF of sampling.sample's
semantics, the row's (temperature, top_k, top_p) read from `prm` and its uniform from `u`, the drawn id written into
the row's argmax key (keys[r] = 0xFFFFFFFF - id), where the host (keys_to_ids) and the next chain step's embedding
read their token. The masses are integers (kernels/sample_reference.py), so a request draws the same tokens
chained, batched or on the host path (sample(): pick_index on the GPU's logits), bit for bit.

The uniforms are the request's own: `load` draws a chain's n from its seeded CPU generator one at a time as sample()
does, uploads them once, and a device counter hands step i its u_i; `rewind` puts the generator back to where the host
path would have left it after the steps actually used (a chain stopping early at EOS or a stop string draws no more
than the host would). `draw_rows` draws one per sampling row of a batched step.

On the GPU the chain's draw is one CUDA graph (its parameters are in `prm`, so one graph serves every setting),
captured on first use; a capture that fails twice leaves it eager (still without a host sync). Elsewhere (the
references: kernels/sample_reference.py sample_rows_ref) it runs eagerly.
"""
from __future__ import annotations

import logging

import torch

from engine.model.graph_capture import capture
from engine.runtime.sampling import SamplingParams, uniform
from kernels.decode_kernels import MAX_TOKENS

log = logging.getLogger("deepinfer.graphs")


class ChainSampler:
    def __init__(self, model, steps: int = 32):
        dev = model.logits.device
        self.m = model
        self.cuda = dev.type == "cuda"
        pin = self.cuda
        self.prm = torch.zeros(MAX_TOKENS, 3, dtype=torch.float64, device=dev)  # per row (temperature, top_k, top_p)
        self.prm_host = torch.zeros(MAX_TOKENS, 3, dtype=torch.float64, pin_memory=pin)
        self.ub = torch.zeros(MAX_TOKENS, dtype=torch.float64, device=dev)  # a batched step's uniforms, by row
        self.ub_host = torch.zeros(MAX_TOKENS, dtype=torch.float64, pin_memory=pin)
        self.at = torch.zeros(1, dtype=torch.int32, device=dev)  # the chain's next step's index into u
        self.zero = torch.zeros(1, dtype=torch.int32, device=dev)  # a batched step reads ub[0 + r]
        self.graph = None  # the chain's draw (row 0), captured on first use
        self.captured = False  # the draw ran once and its capture was tried (graph None after it: eager)
        self._room(steps)

    def _room(self, steps: int):
        """u / u_host for a chain of `steps` (the graph reads u's storage: new buffers drop it)."""
        self.u = torch.zeros(steps, dtype=torch.float64, device=self.at.device)  # the chain's uniforms, in order
        self.u_host = torch.zeros(steps, dtype=torch.float64, pin_memory=self.cuda)
        self.graph, self.captured = None, False

    def _draw(self, B: int, u: torch.Tensor, at: torch.Tensor):
        """keys[r] = the token drawn from logits row r < B (rows whose prm temperature is 0 keep theirs)."""
        self.m.kn.sample_rows(self.m.logits, self.prm, u, at, self.m.keys, B)

    def _chain_draw(self):
        self._draw(1, self.u, self.at)
        self.at.add_(1)

    def _params(self, row: int, p: SamplingParams):
        self.prm_host[row, 0] = float(p.temperature)
        self.prm_host[row, 1] = float(p.top_k)
        self.prm_host[row, 2] = float(p.top_p)

    CHECKS = [(0.7, 0, 0.9), (1.0, 0, 1.0), (0.8, 40, 0.9)]  # a chat app's, no top_p, Ollama's defaults

    def check(self):
        """The draw against its reference (kernels/sample_reference.py, the same device's exp) on three rows of the
        model's vocabulary width, each route of the kernels (peaked: the gathered prefix; flat: the histogram's bins;
        half masked), for CHECKS' settings: RuntimeError on any difference (warmup then leaves sampling on the host
        path, as for a module that does not build)."""
        from kernels.sample_reference import sample_rows_ref
        dev, V = self.m.logits.device, self.m.logits.shape[-1]
        g = torch.Generator(device=dev).manual_seed(0)
        x = torch.randn(3, V, generator=g, device=dev) * torch.tensor([[6.0], [0.05], [2.0]], device=dev)
        x[2, ::2] = float("-inf")
        at = torch.zeros(1, dtype=torch.int32, device=dev)
        u = torch.rand(3, generator=g, dtype=torch.float64, device=dev)
        for t, k, p in self.CHECKS:
            prm = torch.tensor([[t, k, p]] * 3, dtype=torch.float64, device=dev)
            got = torch.zeros(3, dtype=torch.int64, device=dev)
            want = torch.zeros(3, dtype=torch.int64, device=dev)
            self.m.kn.sample_rows(x, prm, u, at, got, 3)
            sample_rows_ref(x, prm, u, at, want, 3)
            if not torch.equal(got, want):
                raise RuntimeError(f"the sampling kernels drew {got.tolist()} where the reference drew "
                                   f"{want.tolist()} (temperature {t}, top_k {k}, top_p {p})")

    def prepare(self, p: SamplingParams, n: int):
        """p's draw for a chain of n steps, ready before the chain's first step is queued (a capture replays the
        draw once, on whatever the buffers hold: load() resets the counter after it, and the chain's steps rewrite
        the keys)."""
        if n > self.u.numel():
            self._room(max(n, 2 * self.u.numel()))
        self._params(0, p)
        self.prm[:1].copy_(self.prm_host[:1], non_blocking=self.cuda)  # host row rewritten only after a sync
        if self.captured:
            return
        self.at.zero_()
        self._chain_draw()  # eagerly once: the kernel's module and every workspace loaded (a failure shows here)
        self.captured = True
        if not self.cuda:
            return
        if self.m.pool is None:
            self.m.pool = torch.cuda.graph_pool_handle()
        torch.cuda.synchronize()
        try:
            self.graph, _ = capture(self._chain_draw, self.m.pool)
        except RuntimeError as e:  # both tries failed: the draw is queued eagerly (no host sync either)
            log.warning("sampling graph disabled: %s", str(e).splitlines()[0])
            self.graph = None

    def load(self, gen: torch.Generator, n: int):
        """Draw n uniforms from gen (as n calls of sample() would) and queue their upload; -> gen's state before."""
        assert n <= self.u.numel()
        state = gen.get_state()
        for i in range(n):
            self.u_host[i] = uniform(gen)
        self.u[:n].copy_(self.u_host[:n], non_blocking=self.cuda)  # host rows unchanged until the chain has synced
        self.at.zero_()
        return state

    @staticmethod
    def rewind(gen: torch.Generator, state, used: int):
        """gen as sample() would have left it after `used` draws from `state`."""
        gen.set_state(state)
        for _ in range(used):
            uniform(gen)

    def step(self):
        """Queue the draw for the chain step just queued (after its lm_head, before its keys go to the host)."""
        if self.graph is not None:
            self.graph.replay()
        else:
            self._chain_draw()

    def draw_rows(self, rows: list, B: int):
        """A batched step of B rows: rows = [(row, params, generator)] are its sampling rows; each one's uniform drawn
        from its generator as sample() draws it, and keys[row] = its drawn token, queued behind the step without a
        host sync (the step's keys copy then brings the ids to the host); the other rows keep their argmax keys."""
        self.prm_host[:B] = 0.0
        for r, p, gen in rows:
            self._params(r, p)
            self.ub_host[r] = uniform(gen)
        self.prm[:B].copy_(self.prm_host[:B], non_blocking=self.cuda)  # read after the step; rewritten only after
        self.ub[:B].copy_(self.ub_host[:B], non_blocking=self.cuda)  # the caller's sync
        self._draw(B, self.ub, self.zero)
