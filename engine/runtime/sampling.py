"""Sampling parameters and the reference sampler (greedy / temperature / top-k / top-p, seeded)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.errors import BadRequestError
from kernels.sample_reference import draw_sorted, draw_target, masses, top_p_need


MIN_TEMPERATURE = 1e-4  # below this, sampling is greedy in all but name (and logits / T can overflow)
# Stop strings are matched per generated token on the engine thread: bound them (OpenAI allows 4).
MAX_STOP = 16
MAX_STOP_BYTES = 256


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0  # 0 -> greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 -> off
    seed: int | None = None
    stop: list[str] = field(default_factory=list)  # stop strings (not included in the output)
    ignore_eos: bool = False  # benchmarks: generate exactly max_tokens
    speculative: bool = False  # prompt-lookup speculative decoding (engine/runtime/speculative.py); same output
    # structured outputs / logprobs / biases (applied by engine/runtime/logits.py around the sampler)
    grammar: object | None = None  # engine/runtime/grammar.py Grammar: the output must match it
    logprobs: int | None = None  # None: off; n: the chosen token's logprob and the n (<= 5) most likely
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit
    presence_penalty: float = 0.0  # subtracted once from every token already in the output
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output

    def __post_init__(self):
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens <= 0:
            raise BadRequestError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not 0.0 <= float(self.temperature) <= 2.0:
            raise BadRequestError(f"temperature must be in [0, 2], got {self.temperature}")
        if not 0.0 < float(self.top_p) <= 1.0:
            raise BadRequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise BadRequestError(f"top_k must be >= 0, got {self.top_k}")
        self.stop = [s for s in (self.stop or []) if s]
        if len(self.stop) > MAX_STOP or any(len(s.encode("utf-8", "surrogatepass")) > MAX_STOP_BYTES for s in self.stop):
            raise BadRequestError(f"stop takes at most {MAX_STOP} strings of at most {MAX_STOP_BYTES} bytes each")

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE or self.top_k == 1


def make_generator(seed: int | None) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed if seed is not None else torch.seed())
    return g


def sample(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator | None,
           mask: torch.Tensor | None = None) -> int:
    """logits [vocab] on any device (CPU runner: float32; GPU runner: float32 on the GPU) -> token id.

    One semantics on every device, so the same seed gives the same tokens on the CPU and the GPU
    (given the same logits):
      greedy (temperature ~0 or top_k 1): argmax;
      otherwise, on the logits' device: the logits in descending order with ties broken by the lower id;
      keep the first top_k (0: all); each token's mass is an integer, floor(exp(x / temperature - max /
      temperature) * 2^44), so sums are exact; top_p keeps the shortest prefix whose mass reaches top_p of the
      total (the most likely token always stays); then ONE uniform u in [0, 1) from the sequence's seeded CPU
      generator picks by inverse CDF: the first kept token whose cumulative mass exceeds u * the kept mass
      (kernels/sample_reference.py draw_sorted; the GPU's sampling kernels, kernels/decode_sample.cu, find the
      same token without sorting). Devices may differ in the last bit of exp(); a pick can then differ only when
      u falls that close to a boundary between two tokens. On one device every path draws the same token.

    Hooks (for structured outputs and logprobs):
      mask: additive [vocab] tensor on the logits' device (0 allowed, -inf banned), added to the raw
            logits before the temperature (and before the greedy argmax). A runner whose decode graph
            already returns argmax ids must call sample() instead when a mask is given.
      logprobs: the chosen token's logprob is torch.log_softmax(x, -1)[id] of `x` below (after mask and
            temperature, before top-k/top-p); the top-n logprobs are torch.topk of the same vector.
    """
    x = logits.float()
    if mask is not None:
        x = x + mask
    if p.greedy:
        return int(torch.argmax(x))
    return int(pick_index(x, p, torch.tensor([uniform(gen)], dtype=torch.float64, device=x.device)))


def uniform(gen: torch.Generator | None) -> float:
    """One draw's uniform in [0, 1) from the sequence's generator (torch's global one without): every path that
    draws a sampling request's token takes its u here, one per token, so a seed gives one stream of them
    (engine/model/chain_sampler.py draws a chain's ahead of its steps and rewinds what the chain did not use)."""
    return float(torch.rand(1, generator=gen, dtype=torch.float64)) if gen is not None else \
        float(torch.rand(1, dtype=torch.float64))


CPU_HEAD = 1024  # the CPU's draw looks at the largest 1,024 logits first (_pick_cpu_head)
CPU_HEAD_DEFAULT = CPU_HEAD  # (engine/bench/cpu_sampling.py times the draw with the head off and back on)


def _canonical_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first k of x in the canonical order (descending, ties to the lower id): what a full stable sort's first k
    are, from topk (on 2 CPU cores a draw from the 1,024 largest of 151,936 real logits took 0.96 ms where the sort
    took 13.6 ms: docs/results/cpu_sampling_0.5b.json)."""
    vals, idx = torch.topk(x, k)
    kth = vals.min()
    tied = int((vals == kth).sum())
    if int((x == kth).sum()) > tied:  # topk chose among ties at its k-th value: the canonical k take the lowest ids
        idx = torch.cat([idx[vals > kth], torch.nonzero(x == kth).flatten()[:tied]])
        vals = x[idx]
    order = torch.argsort(idx)  # by id, then stably by value (ties -> lower id first)
    vals, idx = vals[order], idx[order]
    vals, o2 = torch.sort(vals, descending=True, stable=True)
    return vals, idx[o2]


def _pick_cpu_head(x: torch.Tensor, p: SamplingParams, u: torch.Tensor) -> torch.Tensor | None:
    """draw_sorted's draw over the whole vocabulary (top_k 0) from the CPU_HEAD largest logits alone, when the
    crossings it needs (top_p's and the draw's) fall among them; None when one falls past them (a flat row: the
    caller sorts everything). The masses are draw_sorted's integers: the total over all V (in any order) and the
    head's prefix in the canonical order are exact, so this draws the full sort's token, bit for bit."""
    vals, idx = _canonical_topk(x, CPU_HEAD)
    inv = torch.full((1,), 1.0 / p.temperature, dtype=torch.float32)
    M = masses(x * inv)  # (max(x * inv) = vals[0] * inv: the multiply is monotone)
    Z = int(M.sum())
    if Z == 0:
        return None
    incl = torch.cumsum(masses(vals * inv), 0)
    kept = Z
    if p.top_p < 1.0:
        j = int(torch.searchsorted(incl, torch.tensor([top_p_need(p.top_p, Z)])))
        if j >= CPU_HEAD:
            return None
        kept = int(incl[j])
    i = int(torch.searchsorted(incl, torch.tensor([draw_target(float(u.reshape(-1)[0]), kept)]), right=True))
    return None if i >= CPU_HEAD else idx[i:i + 1]


def pick_index(x: torch.Tensor, p: SamplingParams, u: torch.Tensor) -> torch.Tensor:
    """sample()'s draw for a non-greedy p: x float32 [vocab] (mask applied), u float64 [1] on x's device -> the token
    id, int64 [1] on x's device: the row in the canonical order (descending, ties to the lower id), then
    kernels/sample_reference.draw_sorted (the definition the GPU's sampling kernels follow too)."""
    if 0 < p.top_k < x.numel() and not x.is_cuda:  # the CPU: topk's k, put in the canonical order, as a full sort
        vals, idx = _canonical_topk(x, p.top_k)  # would give its first k (and far cheaper there)
    elif not x.is_cuda and p.top_k == 0 and x.numel() > 4 * CPU_HEAD and \
            (got := _pick_cpu_head(x, p, u)) is not None:  # the CPU, no top_k: the head, when the draw falls in it
        return got
    else:  # a stable sort gives the canonical order itself; on the GPU cheaper than topk's one-block select over
        # one row (H100, 151,936 wide: sort 55 us, topk(40) 62 us + the reorder; engine/bench/sampler_ops.py)
        vals, idx = torch.sort(x, descending=True, stable=True)
    return draw_sorted(vals, idx, p.temperature, p.top_k, p.top_p, u)
