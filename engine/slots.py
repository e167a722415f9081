"""KV-cache slot bookkeeping and context checks shared by the CPU and GPU runners."""
from __future__ import annotations

from engine.errors import ContextOverflowError, ResourceError
from engine.sequence import Sequence


class SlotRunner:
    """Mixin: a runner sets self.max_context and self.free_slots (list of slot ids) in __init__."""

    max_context: int
    free_slots: list[int]

    def check_fits(self, n_prompt: int, max_tokens: int):
        if n_prompt == 0:
            raise ContextOverflowError("the prompt is empty")
        if n_prompt + 1 > self.max_context:
            raise ContextOverflowError(
                f"prompt is {n_prompt} tokens; the context holds {self.max_context}",
                "shorten the text or start with a larger --max-context")
        if n_prompt + max_tokens > self.max_context:
            raise ContextOverflowError(
                f"prompt ({n_prompt} tokens) + max_tokens ({max_tokens}) exceeds the context of {self.max_context}",
                f"lower max_tokens to at most {self.max_context - n_prompt}")

    def can_allocate(self) -> bool:
        return bool(self.free_slots)

    def allocate(self, seq: Sequence):
        if not self.free_slots:
            raise ResourceError("no free KV-cache slot")
        seq.slot = self.free_slots.pop(0)

    def release(self, seq: Sequence):
        if seq.slot >= 0:
            self.free_slots.append(seq.slot)
            self.free_slots.sort()
            seq.slot = -1
