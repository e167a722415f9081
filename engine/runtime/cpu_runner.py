"""CPU model runner: owns the model and the static KV cache, runs prefill and batched decode.

The GPU runner (engine/runtime/gpu_runner.py) has the same interface; the scheduler and LLM use either.
"""
from __future__ import annotations

import logging
import time

import torch

from engine.config import PREFILL_CHUNK, EngineConfig  # tokens per prefill forward (one constant, CPU and GPU)
from engine.formats import gguf_int4
from engine.formats.checkpoint import load_into
from engine.formats.spec import ModelSpec, expected_weight_names
from engine.model.qwen2 import KVCache, Qwen2Model
from engine.runtime import memory_plan, shared_weights
from engine.runtime.logits import pick
from engine.runtime.sampling import sample
from engine.runtime.sequence import Sequence
from engine.runtime.slots import SlotRunner
from kernels import cpu_int4

log = logging.getLogger("deepinfer.engine")


class CPURunner(SlotRunner):
    device = "cpu"
    # drafts one verify step takes at little more than a plain step's cost: the int8 kernel computes up to 4 rows in
    # one pass over the weights, float32 2-4 rows as one gemm (docs/hotpath.md "Drafts on the CPU"); prompt lookup
    # drafts more, up to long_draft (set in __init__), only after a draft kept this many (speculative.decode)
    cheap_draft = 3
    # a draft model's tokens per step: each costs a forward of the draft model (the 0.5B drafting for the 1.5B in int8:
    # 2 drafts 1.148x on translation, 3 1.095x, 4 0.747x; docs/hotpath.md "Drafts on the CPU")
    model_drafts = 2
    # ... and its first proposal (a forward over the prompt past its cached prefix) only after this many steps in a
    # row without a lookup draft (a rewrite's lookup drafts come first)
    draft_after = 2

    def __init__(self, spec: ModelSpec, cfg: EngineConfig):
        t0 = time.perf_counter()
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        dtype = {"auto": torch.float32, "float32": torch.float32, "bfloat16": torch.bfloat16,
                 "float16": torch.float32}[cfg.dtype]
        self.spec, self.cfg, self.mcfg = spec, cfg, spec.config
        self.max_context = cfg.context_for(spec.config)
        c, ctx, slots = spec.config, self.max_context, cfg.max_batch
        # int4: a model file's 4-bit linears keep their codes (kernels/cpu_int4.py), the rest as int8; a torch without
        # the int4 kernel, or a file without 4-bit tensors, runs int8 everywhere
        int4 = cfg.cpu_weights == "int4" and cpu_int4.available() and bool(spec.gguf_tensors)
        int8 = cfg.cpu_weights in ("int8", "int4")
        # lookup's longest draft: int8 8 rows = two passes (4 rows 1.17x a plain step, 8 rows 2.3x, 9 rows three
        # passes); float32 rows past 4 cost ~0.37 plain steps each, more than a kept token is worth there
        # (docs/results/cpu_rows_0.5b.json)
        self.long_draft = 7 if int8 else self.cheap_draft
        # int8: a model file's linears stream into int8 as their rows arrive (Qwen2Model.load_weights: about 1 byte a
        # weight at the peak); a checkpoint's load in bf16 first, then int8 layer by layer (quantize_int8)
        stream = int8 and spec.kind != "checkpoint"
        # a GGUF streamed: the estimate from its tensor types (int4 linears, the embedding left in the file)
        ram = (("int4" if int4 else "int8") if int8 else cfg.cpu_weights, stream,
               spec.weight_types if stream and spec.gguf_tensors else None)
        dbytes = 2 if dtype == torch.bfloat16 else 4
        if cfg.fit_context:  # the tray: a shorter context that fits rather than no model (as the GPU's plan does)
            ctx = memory_plan.cpu_fitting_context(c, self.max_context, slots, dbytes, *ram)
        if cfg.dtype == "auto" and not memory_plan.cpu_ram_fits(c, ctx, slots, 4, *ram):
            dtype, dbytes = torch.bfloat16, 2  # half the RAM (and of the bytes each token reads) rather than no answer
            log.warning("%s does not fit the free RAM in float32 on the CPU: running it in bfloat16", cfg.model)
            if cfg.fit_context:
                ctx = memory_plan.cpu_fitting_context(c, self.max_context, slots, 2, *ram)
        self.max_context = ctx
        # refused before anything is allocated: a model whose weights (at the load's peak) and KV cache exceed the
        # free RAM would otherwise be killed by the OS (or swap for minutes) half way through the load
        memory_plan.check_cpu_ram(c, cfg.model, ctx, slots, dbytes, *ram)
        self.dtype = dtype
        # dense float weights of a model file another runner of this process already loaded: its tensors, no copy
        share = shared_weights.key(spec, dtype) if not int8 else None
        self._weights = shared_weights.get(share)
        self.model = Qwen2Model(spec.config, dtype, "meta" if stream or self._weights else
                                torch.bfloat16 if int8 else None)
        if self._weights is not None:
            shared_weights.assign(self.model, self._weights)
        elif spec.kind == "checkpoint":
            load_into(self.model, spec)
        else:
            # a GGUF streamed (int8 / int4): its quantized embedding stays in the mapped file (gguf_rows.py), and with
            # int4 its 4-bit linears keep their codes
            # the GGUF reader's own iterator yields fresh arrays: whole tensors are taken, not copied
            owned = not stream and bool(spec.gguf_tensors) and spec.reader_weights is spec.weights
            self.model.load_weights(gguf_int4.weights(spec, int4) if stream and spec.gguf_tensors else spec.weights(),
                                    expected_weight_names(spec.config), owned=owned)
        if self._weights is None:
            self._weights = shared_weights.put(share, self.model)
        if int8:  # kernels/cpu_int8.py: a quarter of float32's bytes per token (what the load left float, the head)
            self.model.quantize_int8()
        self.model.eval()
        # how the CPU holds the linears (/health, `ask --stats`): int4 where a file's 4-bit codes were kept
        lin = [m for m in self.model.modules() if hasattr(m, "nbytes") and hasattr(m, "out_features")]
        b4 = sum(m.nbytes() for m in lin if isinstance(m, cpu_int4.Int4Linear))
        self.weights_kind = "int4" if b4 else "int8" if int8 else str(dtype).split(".")[-1]
        if b4 > sum(m.nbytes() for m in lin) / 2:  # mostly int4: its rows cost more past one (4 rows 1.7x a plain
            # step, 8 rows 3.4x): lookup's long drafts cost more than they keep (1.5B rewrite, 6 texts: drafts of up to
            # 7 1.92x, up to 3 2.05x; docs/quantization.md "The CPU path in int4")
            self.long_draft = self.cheap_draft
        self.cache = KVCache(spec.config, cfg.max_batch, self.max_context, dtype)
        self.free_slots = list(range(cfg.max_batch))
        self.eos_ids = set(spec.config.eos_token_ids) | set(spec.tokenizer.eos_token_ids)
        self.load_seconds = time.perf_counter() - t0

    def private_weights(self) -> None:
        """Before writing into self.model's weights (engine/quant's fake quantization): tensors no other runner of
        this process holds or will take (engine/runtime/shared_weights.py)."""
        shared_weights.make_private(self.model, self._weights)
        self._weights = None

    # --- forward -------------------------------------------------------------------------
    def _prefill_range(self, seq: Sequence, p0: int, end: int) -> torch.Tensor:
        """Prompt positions p0..end into the slot, in chunks; logits of the last one."""
        logits = None
        for s in range(p0, end, PREFILL_CHUNK):
            chunk = torch.tensor([seq.prompt_ids[s:min(s + PREFILL_CHUNK, end)]])
            logits = self.model(chunk, self.cache, [seq.slot], [s])[0]
        return logits

    def _sample(self, logits: torch.Tensor, seq: Sequence) -> int:
        return pick(logits, seq, sample)  # grammar mask / biases / logprobs around the sampler (logits.py)

    def decode(self, seqs: list[Sequence]) -> list[str]:
        """One token for each running sequence (batched linears); returns text deltas."""
        ids = torch.tensor([[s.output_ids[-1]] for s in seqs])
        starts = [s.num_tokens - 1 for s in seqs]
        logits = self.model(ids, self.cache, [s.slot for s in seqs], starts)
        if getattr(self, "heads", None) is not None:  # draft heads: each speculating sequence keeps its hidden row
            for i, s in enumerate(seqs):
                s.hidden = self.model.last_hidden[i] if s.params.speculative else None
        return [s.append(self._sample(logits[i], s), self.eos_ids) for i, s in enumerate(seqs)]

    def logits(self, ids: list[int]) -> torch.Tensor:
        """All-position logits of a token list (perplexity, tests); uses slot 0 scratch-free."""
        out = []
        slot = self.free_slots[0] if self.free_slots else 0
        for s in range(0, len(ids), PREFILL_CHUNK):
            chunk = torch.tensor([ids[s:s + PREFILL_CHUNK]])
            out.append(self.model(chunk, self.cache, [slot], [s], all_logits=True)[0])
        return torch.cat(out)

    def memory(self) -> dict:
        params = sum(p.numel() * p.element_size() for p in self.model.parameters())
        bufs = sum(b.numel() * b.element_size() for b in self.model.buffers())
        out = {"weights_bytes": params + bufs, "kv_cache_bytes": self.cache.nbytes()}
        if self.model.embed_map is not None:  # the embedding read from the mapped model file (not in weights_bytes)
            out["embedding_in_file_bytes"] = int(self.model.embed_map.t.n_bytes)
        return out
