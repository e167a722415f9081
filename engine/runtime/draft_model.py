"""A small draft model of the same tokenizer (qwen2.5 0.5B drafting for 3B/7B), for speculative decoding.

Used by engine/runtime/speculative.py when prompt lookup has no draft (translations, answers that do not
copy their input). The drafter keeps one KV slot of its own runner per target sequence: each proposal
first runs the context tokens it has not seen (one multi-token forward: after a verify step these are the
kept tokens), then decodes k tokens greedily, one forward each. Its KV is trusted only up to the context
it was given (`synced`); drafted positions beyond are overwritten by the next catch-up, as in the target's
static cache. Slots are returned when the target sequence's slot is (SlotRunner.release -> forget).
Optional: EngineConfig.draft_model ("" = none).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from engine.config import PREFILL_CHUNK
from engine.formats.load import load_spec


class DraftModel:
    def __init__(self, runner):
        """runner: a loaded CPU/GPU runner of the draft model (its own KV slots, as many as the target's)."""
        self.runner = runner
        self.state: dict[int, list[int]] = {}  # id(target seq) -> [draft slot, tokens whose KV it holds]

    @classmethod
    def load(cls, model: str, cfg, make_runner) -> "DraftModel":
        """make_runner: engine/runtime/llm.py make_runner (passed in: llm imports this module)."""
        spec = load_spec(model)
        return cls(make_runner(spec, replace(cfg, model=model, draft_model="", prefix_cache_mb=0)))

    @torch.inference_mode()
    def propose(self, seq, k: int) -> list[int]:
        ctx = seq.prompt_ids + seq.output_ids
        st = self.state.get(id(seq))
        if st is None:
            if not self.runner.free_slots:
                return []
            st = self.state[id(seq)] = [self.runner.free_slots.pop(0), 0]
        slot, synced = st
        k = min(k, self.runner.max_context - len(ctx))
        ids, pos, out = ctx[synced:], synced, []
        for _ in range(k):
            t = int(self._last_logits(slot, ids, pos).argmax())
            out.append(t)
            pos, ids = pos + len(ids), [t]
        st[1] = len(ctx)  # KV valid for the context; the kept draft tokens are re-run next time (one forward)
        return out

    def _last_logits(self, slot: int, ids: list[int], p0: int) -> torch.Tensor:
        """ids at positions p0.. of the draft slot (in prefill chunks) -> logits of the last one [vocab]."""
        r, cache = self.runner, getattr(self.runner, "cache", None)
        if cache is None:  # GPU model (chunks itself)
            return r.model.prefill(ids, slot, p0)
        for s in range(0, len(ids), PREFILL_CHUNK):
            logits = r.model(torch.tensor([ids[s:s + PREFILL_CHUNK]]), cache, [slot], [p0 + s])[0]
        return logits

    def forget(self, seq):
        st = self.state.pop(id(seq), None)
        if st is not None:
            self.runner.free_slots.append(st[0])
            self.runner.free_slots.sort()
