"""Sampling parameters and the reference sampler (greedy / temperature / top-k / top-p, seeded)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.errors import BadRequestError


MIN_TEMPERATURE = 1e-4  # below this, sampling is greedy in all but name (and logits / T can overflow)


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0  # 0 -> greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 -> off
    seed: int | None = None
    stop: list[str] = field(default_factory=list)  # stop strings (not included in the output)
    ignore_eos: bool = False  # benchmarks: generate exactly max_tokens

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

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE or self.top_k == 1


def make_generator(seed: int | None) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed if seed is not None else torch.seed())
    return g


def sample(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
    """logits [vocab] (float32) -> token id. Same seed + same logits -> same id."""
    if p.greedy:
        return int(torch.argmax(logits))
    x = logits.float() / p.temperature
    if p.top_k > 0:
        k = min(p.top_k, x.numel())
        vals, idx = torch.topk(x, k)
    else:
        vals, idx = torch.sort(x, descending=True)
    probs = torch.softmax(vals, dim=-1)
    if p.top_p < 1.0:
        cum = torch.cumsum(probs, dim=-1)
        keep = (cum - probs) < p.top_p
        keep[0] = True  # the most likely token always stays (top_p may round to 0 in float32)
        probs = probs * keep
        probs = probs / probs.sum()
    choice = torch.multinomial(probs.cpu(), 1, generator=gen)
    return int(idx[choice])
