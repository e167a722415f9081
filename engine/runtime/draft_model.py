"""A small draft model of the same tokenizer (qwen2.5 0.5B drafting for 3B/7B), for speculative decoding.

Used by engine/runtime/speculative.py when prompt lookup has no draft (translations, answers that do not
copy their input). The drafter keeps one KV slot of its own runner per target sequence: each proposal
first runs the context tokens it has not seen (one multi-token forward: after a verify step these are the
kept tokens), then decodes k tokens greedily, one forward each. Its KV is trusted only up to the context
it was given (`synced`); drafted positions beyond are overwritten by the next catch-up, as in the target's
static cache. Slots are returned when the target sequence's slot is (SlotRunner.release -> forget).
On the CPU the drafter has a prefix cache of its own (at most DRAFT_CACHE_MB): a new request's first
catch-up starts after the prefix an earlier request's drafter computed (a template, a chat's history), and a
finished request stores what its drafter computed; without it every request's first draft prefilled the whole
prompt on the draft model (a 90-token prompt: 234 ms on 2 CPU cores in int8, docs/hotpath.md "Drafts on the CPU").
Optional: EngineConfig.draft_model ("" = none).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from engine.config import PREFILL_CHUNK
from engine.formats.load import load_spec
from engine.runtime import prefix_cache

DRAFT_CACHE_MB = 64  # the drafter's prefix cache (the 0.5B's float32 KV: ~2,700 tokens)


class DraftModel:
    def __init__(self, runner):
        """runner: a loaded CPU/GPU runner of the draft model (its own KV slots, as many as the target's)."""
        self.runner = runner
        self.state: dict[int, list] = {}  # id(target seq) -> [draft slot, tokens whose KV it holds, their ids]

    @classmethod
    def load(cls, model: str, cfg, make_runner) -> "DraftModel":
        """make_runner: engine/runtime/llm.py make_runner (passed in: llm imports this module)."""
        from engine.runtime.llm import pick_device
        spec = load_spec(model)
        # its own prefix cache on the CPU (on a GPU its catch-up is a prefill graph, and the cache stays off as before)
        mb = min(cfg.prefix_cache_mb, DRAFT_CACHE_MB) if pick_device(cfg.device) == "cpu" else 0
        return cls(make_runner(spec, replace(cfg, model=model, draft_model="", draft_heads="", prefix_cache_mb=mb)))

    @torch.inference_mode()
    def propose(self, seq, k: int) -> list[int]:
        ctx = seq.prompt_ids + seq.output_ids
        st = self.state.get(id(seq))
        if st is None:
            if not self.runner.free_slots:
                return []
            slot = self.runner.free_slots.pop(0)
            pc = prefix_cache.for_runner(self.runner)
            n = pc.restore(*prefix_cache.kv_tensors(self.runner), slot, ctx) if pc is not None else 0
            st = self.state[id(seq)] = [slot, n, ctx[:n]]
        slot, synced, _ = st
        k = min(k, self.runner.max_context - len(ctx))
        ids, pos, out = ctx[synced:], synced, []
        for _ in range(k):
            t = int(self._last_logits(slot, ids, pos).argmax())
            out.append(t)
            pos, ids = pos + len(ids), [t]
        st[1], st[2] = len(ctx), ctx  # KV valid for the context; the kept draft tokens are re-run next time
        return out

    def started(self, seq) -> bool:
        """Whether the drafter holds a slot (and KV) for seq: its first proposal ran."""
        return id(seq) in self.state

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
            pc = prefix_cache.for_runner(self.runner)
            if pc is not None and st[1] > 0:  # what this drafter computed, for the next request's first catch-up
                pc.save(*prefix_cache.kv_tensors(self.runner), st[0], st[2], st[1])
            self.runner.free_slots.append(st[0])
            self.runner.free_slots.sort()
