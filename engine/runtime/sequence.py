"""A generation request as the runner sees it: prompt ids, params, output ids, text, finish."""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.runtime.grammar import Matcher
from engine.runtime.sampling import SamplingParams, make_generator
from engine.runtime.stops import StopMatcher
from engine.formats.tokenizer import IncrementalDetokenizer, Tokenizer


@dataclass
class Sequence:
    prompt_ids: list[int]
    params: SamplingParams
    tokenizer: Tokenizer
    slot: int = -1  # KV-cache slot while active
    prefilled: int = 0  # prompt tokens already in the KV cache (a prefill can run in slices)
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" | "cancelled" | "error"
    text: str = ""  # emitted text (stop strings removed)
    cached_tokens: int = 0  # prompt tokens copied from the prefix cache instead of prefilled
    spec_drafted: int = 0  # speculative decoding: draft tokens verified / accepted (engine/runtime/speculative.py)
    spec_accepted: int = 0
    # the final normed hidden state [H] of the step that produced the last output token, kept for the draft heads
    # (engine/runtime/draft_heads.py) when they are loaded; None otherwise
    hidden: object = field(default=None, repr=False)

    def __post_init__(self):
        self.detok = IncrementalDetokenizer(self.tokenizer)
        self.gen = None if self.params.greedy else make_generator(self.params.seed)
        self._held = ""  # text withheld because it may be the start of a stop string
        # structured outputs (engine/runtime/grammar.py) and logprobs (engine/runtime/logits.py)
        self.matcher = Matcher(self.params.grammar) if self.params.grammar is not None else None
        self.logprobs: list[tuple[int, float, list[tuple[int, float]]]] = []  # (id, logprob, top alternatives)
        self.logprobs_sent = 0  # entries already handed to the client (streaming)
        self._stops = StopMatcher(self.params.stop) if self.params.stop else None

    def stats(self) -> dict:
        return {"cached_tokens": self.cached_tokens, "spec_drafted": self.spec_drafted,
                "spec_accepted": self.spec_accepted}

    @property
    def num_tokens(self) -> int:  # tokens in the KV cache after the next forward
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def append(self, token_id: int, eos_ids) -> str:
        """Record a sampled token; returns the text delta safe to emit now."""
        p = self.params
        if token_id in eos_ids and not p.ignore_eos:
            self.finish_reason = "stop"
            return self._finish_text()
        grammar_done = self.matcher is not None and (not self.matcher.accept(token_id) or self.matcher.done)
        self.output_ids.append(token_id)
        new = self.detok.add(token_id)
        delta = self._held + new
        self._held = ""
        out = delta
        if self._stops is not None:
            back, hold = self._stops.feed(new)  # incremental: cost independent of len(self.text)
            if back is not None:  # a stop string starts `back` characters before the end of delta
                self.finish_reason = "stop"
                keep = len(delta) - back
                out = delta[:keep] if keep >= 0 else ""
                self.text = self.text + out if keep >= 0 else self.text[:len(self.text) + keep]
                return out
            hold = min(hold, len(delta))  # hold back a suffix that could begin a stop string
            if hold:
                self._held, out = delta[len(delta) - hold:], delta[:len(delta) - hold]
        self.text += out
        if grammar_done:  # the JSON / tool call is complete: only EOS could follow
            self.finish_reason = "stop"
            return out + self._finish_text()
        if len(self.output_ids) >= p.max_tokens:
            self.finish_reason = "length"
            out += self._finish_text()
        return out

    def _finish_text(self) -> str:
        rest = self._held + self.detok.flush()
        self._held = ""
        self.text += rest
        return rest
