"""Per-sequence logit processing around the sampler (CPU and GPU alike, on the logits' device):

    before sampling  process(logits, seq): logit_bias, presence / frequency penalties, the grammar mask
                     (engine/runtime/grammar.py) -> the logits the sampler draws from (temperature, top-k/p)
    after sampling   record(logits, seq, token): the chosen token's logprob and the top alternatives, from the
                     same processed logits the sampler drew from, after temperature (greedy: none), before
                     top-k / top-p (engine/runtime/sampling.py sample's docstring), when the request asked
    pick(logits, seq, sampler) does all three; runners call it instead of the bare sampler

A sequence that needs none of this (the common case) costs nothing: `active(seq)` is False and the GPU keeps
its fused argmax for greedy decoding.
"""
from __future__ import annotations

import torch

MAX_TOP_LOGPROBS = 5
FLOOR = -9999.0  # a masked token's logprob (-inf is not JSON); OpenAI reports the same value


def active(seq) -> bool:
    """Does this sequence need its logits processed or read (so the GPU's fused greedy argmax will not do)?"""
    p = seq.params
    return bool(seq.matcher is not None or p.logprobs is not None or p.logit_bias
                or p.presence_penalty or p.frequency_penalty)


def process(logits: torch.Tensor, seq) -> torch.Tensor:
    """logits fp32 [vocab] on any device -> processed logits (a new tensor when anything applies)."""
    p = seq.params
    dev = logits.device
    if p.logit_bias or ((p.presence_penalty or p.frequency_penalty) and seq.output_ids):
        logits = logits.clone()
        if p.logit_bias:
            ids = torch.tensor(list(p.logit_bias), dtype=torch.long)
            logits.index_add_(0, ids.to(dev), torch.tensor(list(p.logit_bias.values()), dtype=logits.dtype).to(dev))
        if (p.presence_penalty or p.frequency_penalty) and seq.output_ids:
            ids, counts = torch.unique(torch.tensor(seq.output_ids), return_counts=True)
            pen = counts.to(logits.dtype) * p.frequency_penalty + p.presence_penalty
            logits.index_add_(0, ids.to(dev), -pen.to(dev))
    if seq.matcher is not None:
        logits = logits.masked_fill(~seq.matcher.allowed(dev), float("-inf"))
    return logits


def record(logits: torch.Tensor, seq, token: int):
    """Append (token, logprob, [(id, logprob) x top_logprobs]) to seq.logprobs if the request asked for them."""
    k = seq.params.logprobs
    if k is None:
        return
    x = logits.float() if seq.params.greedy else logits.float() / seq.params.temperature
    lp = torch.log_softmax(x, dim=-1)
    top = []
    if k > 0:
        vals, idx = torch.topk(lp, min(k, lp.numel()))
        top = [(int(i), max(FLOOR, float(v))) for i, v in zip(idx.tolist(), vals.tolist())]
    seq.logprobs.append((token, max(FLOOR, float(lp[token])), top))


def pick(logits: torch.Tensor, seq, sampler) -> int:
    """The token for `seq` from its logits row: sampler(logits, params, generator) on the processed logits."""
    if not active(seq):
        return sampler(logits, seq.params, seq.gen)
    x = process(logits, seq)
    token = sampler(x, seq.params, seq.gen)
    record(x, seq, token)
    return token
