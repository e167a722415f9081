"""Sampling inside a chain of decode steps (GPUModel.decode_chain with `sample`): a lone request with temperature > 0
gets its tokens chained on the GPU as a greedy one does, instead of one host round trip per token.

After each step of the chain, `step()` draws the row-0 token from the step's logits with sampling.pick_index (the
very ops sampling.sample runs on the host path: same kernels, same inputs, same bits) and writes it into the step's
argmax key (keys[0]), where the next chain step's embedding and the host read their token (decode_kernels
keys_to_ids: id = 0xFFFFFFFF - low 32 bits). The uniforms are the request's own: `load` draws the chain's n from its
seeded CPU generator, one at a time as sample() does, uploads them once, and a device counter hands step i its u_i;
`rewind` puts the generator back to where the host path would have left it after the steps actually used (a chain
stopping early at EOS or a stop string draws no more than the host would have). So a seed gives the same tokens
chained or not (tests/test_gpu_step_reference.py, tests/test_gpu_chain_keys.py).

On the GPU the draw is one CUDA graph per (temperature, top_k, top_p), captured on first use (MAX_GRAPHS kept, least
recently used dropped; a capture that fails twice leaves that setting's draw eager, still without a host sync);
elsewhere it runs eagerly. A batched step's sampling rows (`draw_rows`) are drawn the same way, queued eagerly behind
the step before the host waits for it (GPURunner.decode), so the host's launches overlap the step and one wait serves
every row.
"""
from __future__ import annotations

import logging
from collections import OrderedDict

import torch

from engine.model.graph_capture import capture
from engine.runtime.sampling import SamplingParams, pick_index

log = logging.getLogger("deepinfer.graphs")
MAX_GRAPHS = 4  # sampler graphs kept: a chat app and the tray's templates each use one or two settings


class ChainSampler:
    def __init__(self, model, steps: int = 32):
        dev = model.logits.device
        self.m = model
        self.cuda = dev.type == "cuda"
        self.at = torch.zeros(1, dtype=torch.int64, device=dev)  # the next step's index into u
        self.graphs: OrderedDict = OrderedDict()  # (temperature, top_k, top_p) -> CUDA graph (None: eager)
        self.params: SamplingParams | None = None
        self._room(steps)

    def _room(self, steps: int):
        """u / u_host for a chain of `steps` (the graphs read u's storage: new buffers drop them)."""
        self.u = torch.zeros(steps, dtype=torch.float64, device=self.at.device)  # the chain's uniforms, in order
        self.u_host = torch.zeros(steps, dtype=torch.float64, pin_memory=self.cuda)
        self.graphs.clear()

    def _draw(self):
        """keys[0] = the sampled token of logits row 0 (a key keys_to_ids reads as that id); at += 1."""
        u = self.u.index_select(0, self.at)
        tok = pick_index(self.m.logits[0], self.params, u)
        self.m.keys[:1].copy_(0xFFFFFFFF - tok)
        self.at.add_(1)

    def prepare(self, p: SamplingParams, n: int):
        """Make p's draw for a chain of n steps ready before its first step is queued (a capture replays the draw
        once, on whatever the buffers hold: load() resets the counter after it, and the chain's steps rewrite keys)."""
        self.params = p
        if n > self.u.numel():
            self._room(max(n, 2 * self.u.numel()))
        if not self.cuda:
            return
        key = (p.temperature, p.top_k, p.top_p)
        if key in self.graphs:
            self.graphs.move_to_end(key)
            return
        if self.m.pool is None:
            self.m.pool = torch.cuda.graph_pool_handle()
        self.at.zero_()
        self._draw()  # eagerly once: every kernel and workspace loaded before the capture
        torch.cuda.synchronize()
        try:
            self.graphs[key], _ = capture(self._draw, self.m.pool)
        except RuntimeError as e:  # both tries failed: this setting's draw is queued eagerly (no host sync either)
            log.warning("sampler graph for %s disabled: %s", key, str(e).splitlines()[0])
            self.graphs[key] = None
        while len(self.graphs) > MAX_GRAPHS:
            self.graphs.popitem(last=False)

    def load(self, gen: torch.Generator, n: int):
        """Draw n uniforms from gen (as n calls of sample() would) and queue their upload; -> gen's state before."""
        assert n <= self.u.numel()
        state = gen.get_state()
        for i in range(n):
            self.u_host[i] = float(torch.rand(1, generator=gen, dtype=torch.float64))
        self.u[:n].copy_(self.u_host[:n], non_blocking=self.cuda)  # host rows unchanged until the chain has synced
        self.at.zero_()
        return state

    @staticmethod
    def rewind(gen: torch.Generator, state, used: int):
        """gen as sample() would have left it after `used` draws from `state`."""
        gen.set_state(state)
        for _ in range(used):
            torch.rand(1, generator=gen, dtype=torch.float64)

    def draw_rows(self, rows: list):
        """A batched step's sampling rows, queued behind the step without a host sync: rows = [(row, params,
        generator)]; each row's uniform drawn from its generator as sample() draws it, all uploaded at once, and
        keys[row] = the token pick_index draws from logits[row] (the ids the step's keys copy then brings to the
        host). The tokens of sample() on the same logits, without its per-row wait for the GPU."""
        n = len(rows)
        if n > self.u.numel():
            self._room(max(n, 2 * self.u.numel()))
        for j, (_, _, gen) in enumerate(rows):
            self.u_host[j] = float(torch.rand(1, generator=gen, dtype=torch.float64))
        self.u[:n].copy_(self.u_host[:n], non_blocking=self.cuda)  # read by the copy after the step; rewritten
        for j, (r, p, _) in enumerate(rows):  # only after the caller's sync
            self.m.keys[r:r + 1].copy_(0xFFFFFFFF - pick_index(self.m.logits[r], p, self.u[j:j + 1]))

    def step(self):
        """Queue the draw for the step just queued (after its lm_head, before its keys go to the host)."""
        g = self.graphs.get((self.params.temperature, self.params.top_k, self.params.top_p))
        if g is not None:
            g.replay()
        else:
            self._draw()
