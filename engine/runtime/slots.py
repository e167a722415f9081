"""KV-cache slot bookkeeping and context checks shared by the CPU and GPU runners."""
from __future__ import annotations

from engine.errors import ContextOverflowError, ResourceError
from engine.runtime import prefix_cache
from engine.runtime.sequence import Sequence


def check_fits(n_prompt: int, max_tokens: int, max_context: int):
    """A prompt of n_prompt tokens and max_tokens more in a context of max_context, or a ContextOverflowError that
    says what to change. The runners check against the context they hold (it may be fitted below the one asked to the
    free memory); `deepinfer ask` checks against the asked one before the weights load."""
    if n_prompt == 0:
        raise ContextOverflowError("the prompt is empty")
    if n_prompt + 1 > max_context:
        raise ContextOverflowError(
            f"prompt is {n_prompt} tokens; the context holds {max_context}",
            "shorten the text or start with a larger --max-context")
    if n_prompt + max_tokens > max_context:
        raise ContextOverflowError(
            f"prompt ({n_prompt} tokens) + max_tokens ({max_tokens}) exceeds the context of {max_context}",
            f"lower max_tokens to at most {max_context - n_prompt}")


class SlotRunner:
    """Mixin: a runner sets self.max_context, self.free_slots (list of slot ids) and self.eos_ids in __init__,
    and implements _prefill_range (prompt positions p0..end into the slot -> last logits) and _sample."""

    max_context: int
    free_slots: list[int]
    eos_ids: set[int]

    def prefill(self, seq: Sequence, max_tokens: int | None = None) -> str | None:
        """Run the next max_tokens prompt tokens (None: all the rest). When the prompt is done, sample the first
        token and return its text delta; None while prompt tokens remain (the engine thread slices prompts)."""
        if seq.prefilled == 0:  # a prompt prefix an earlier request computed: copied in, not prefilled again
            seq.cached_tokens = prefix_cache.restore(self, seq)
        ids, p0 = seq.prompt_ids, seq.prefilled
        end = len(ids) if max_tokens is None else min(len(ids), p0 + max_tokens)
        logits = self._prefill_range(seq, p0, end)
        seq.prefilled = end
        if end < len(ids):
            return None
        # the prompt's KV is stored at release (with the output), not here: storing copies every 16-token
        # block (2 clones each), a few ms on a 2k-token prompt that the first token would wait for
        return seq.append(self._sample(logits, seq), self.eos_ids)

    def _prefill_range(self, seq: Sequence, p0: int, end: int):
        raise NotImplementedError

    def _sample(self, logits, seq: Sequence) -> int:
        raise NotImplementedError

    def check_fits(self, n_prompt: int, max_tokens: int):
        check_fits(n_prompt, max_tokens, self.max_context)

    def can_allocate(self) -> bool:
        return bool(self.free_slots)

    def allocate(self, seq: Sequence):
        if not self.free_slots:
            raise ResourceError("no free KV-cache slot")
        seq.slot = self.free_slots.pop(0)

    def release(self, seq: Sequence):
        drafter = getattr(self, "drafter", None)  # a draft model's slot for this sequence goes back too
        if drafter is not None:
            drafter.forget(seq)
        if seq.slot >= 0 and seq.finish_reason in ("stop", "length"):
            # prompt + output (the next chat turn resends both); the last sampled token has no KV yet
            prefix_cache.save(self, seq, seq.num_tokens - 1)
        if seq.slot >= 0:
            self.free_slots.append(seq.slot)
            self.free_slots.sort()
            seq.slot = -1
