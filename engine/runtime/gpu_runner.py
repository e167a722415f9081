"""GPU model runner: same interface as engine/runtime/cpu_runner.py CPURunner (the scheduler and LLM use either).

Loads a quantized layered checkpoint (a quantized GGUF as it is, exact repack; or a dense spec quantized to W4 at
load, EngineConfig.requantize) after the memory plan
(engine/runtime/memory_plan.py) fits it, keeps a static fp16 KV cache of max_batch slots, prefills with
engine.model.gpu_prefill, and decodes with the CUDA-graph step of engine/model/gpu_model.py (batched, up to 8
sequences per replay).
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict

import torch

from engine.config import EngineConfig
from engine.formats.spec import ModelSpec
from engine.model import gpu_load
from engine.model.gpu_model import GPUModel
from engine.runtime.logits import active, pick
from engine.runtime.memory_plan import DENSE_BITS, plan_fitting_context, source_weight_bytes
from engine.runtime.sampling import SamplingParams, sample
from engine.runtime.sequence import Sequence
from engine.runtime.slots import SlotRunner
from kernels.decode_kernels import MAX_TOKENS

log = logging.getLogger("deepinfer.gpu")


class GPURunner(SlotRunner):
    device = "cuda"
    max_draft = MAX_TOKENS - 1  # speculative verification is one decode step of 1 + k <= 8 tokens (GPUModel.verify)

    def __init__(self, spec: ModelSpec, cfg: EngineConfig):
        t0 = time.perf_counter()
        self.spec, self.cfg, self.mcfg = spec, cfg, spec.config
        self.max_context = cfg.context_for(spec.config)
        dev = torch.device("cuda")
        ck = getattr(spec, "checkpoint", None)
        # a quantized GGUF run as it is: its packing (EngineConfig.gguf_pack), whose new layouts' kernels are checked
        # on this GPU first (else the bytes); None for other sources
        self.gguf_pack, self.gguf_pack_note = None, ""
        if ck is None and gpu_load.runs_as_is(spec, cfg.requantize):
            self.gguf_pack = cfg.gguf_pack
            if cfg.gguf_pack != "bytes":
                self.gguf_pack, self.gguf_pack_note = self._checked_packing(dev)
        pack = self.gguf_pack or "bytes"
        if ck is not None:
            wbytes, ebytes = ck.nbytes(), ck.linear("embed_tokens").nbytes()
        else:  # a quantized GGUF's exact layouts, or W4/W3 re-quantized (cfg.requantize)
            wbytes, ebytes = source_weight_bytes(spec.config, spec.weight_types, cfg.requantize, pack)
        self.budget, self.plan, self.max_context = plan_fitting_context(  # the driver is asked once
            spec.config, cfg, wbytes, ebytes, self.max_context, torch.cuda.mem_get_info(dev),
            torch.cuda.get_device_properties(dev).multi_processor_count)
        if cfg.gpu_memory_limit_mb:  # the torch allocator enforces the limit too (an OOM instead of paging)
            torch.cuda.set_per_process_memory_fraction(min(1.0, (cfg.gpu_memory_limit_mb << 20) /
                                                            self.budget.total))  # the current device
        host = self.plan.embed_on_host
        weights = gpu_load.load_checkpoint(ck, dev, host) if ck is not None else \
            gpu_load.load_source(spec, dev, cfg.requantize, host, DENSE_BITS, mode=pack)
        self.model = GPUModel(weights, cfg.max_batch, self.max_context, dev, self.plan.prefill_chunk,
                              self.plan.graph_buckets)
        if cfg.decode_q8:  # int8 activations at batch 1 (EngineConfig.decode_q8); before warmup captures the graphs
            self.model.q8 = True
        if self.model.q8 and not self.model.q8_all and cfg.speculative_gpu:  # (DEEPINFER_DECODE_Q8=all: verify
            # rows take the int8 loop too, one token's arithmetic whatever the rows, so speculation stays exact)
            log.info("int8 activations at batch 1: speculative decoding off (verify rows are fp16, plain steps int8)")
            cfg.speculative_gpu = False
        # a cached prefix makes prompts start at p0 > 0: those chunks replay the offset prefill graphs
        self.model.offset_graphs = bool(cfg.prefix_cache_gpu and cfg.prefix_cache_mb)
        self.free_slots = list(range(cfg.max_batch))
        self.eos_ids = set(spec.config.eos_token_ids) | set(spec.tokenizer.eos_token_ids)
        self.chain_stats = self.new_chain_stats(self.model)
        torch.cuda.synchronize()
        self.load_seconds = time.perf_counter() - t0
        t1 = time.perf_counter()
        self.graphs_at_load = self.model.warmup(cfg.max_batch, verify=cfg.speculative_gpu) if cfg.warmup else {}
        if cfg.warmup:
            self._warm_request_path()
        torch.cuda.synchronize()
        self.warmup_seconds = time.perf_counter() - t1

    def _warm_request_path(self):
        """Two tiny requests (greedy and sampled) through prefill, sampling and a batched decode step, so that
        nothing a first real request runs is set up lazily (the first request waited ~95 ms on an H200)."""
        tok = self.spec.tokenizer
        seqs = [Sequence([0] * 8, SamplingParams(max_tokens=4, ignore_eos=True), tok),
                Sequence([0] * 8, SamplingParams(max_tokens=4, temperature=0.7, seed=0, ignore_eos=True), tok)]
        seqs = seqs[:len(self.free_slots)]  # one KV slot (max_batch 1): the greedy one alone
        for s in seqs:
            self.allocate(s)
            self.prefill(s)
        self.decode(seqs)
        for s in seqs:  # unfinished: release stores nothing in the prefix cache
            self.release(s)

    # --- forward -------------------------------------------------------------------------
    def _prefill_range(self, seq: Sequence, p0: int, end: int) -> torch.Tensor:
        return self.model.prefill(seq.prompt_ids[p0:end], seq.slot, p0)

    def _sample(self, logits: torch.Tensor, seq: Sequence) -> int:
        return pick(logits, seq, sample)  # grammar mask / biases / logprobs around the sampler (logits.py)

    def decode(self, seqs: list[Sequence]) -> list[str]:
        """One token for each running sequence (up to 8 per CUDA-graph replay); returns text deltas. A greedy
        sequence decoding alone gets up to cfg.decode_chain tokens instead, its steps queued back to back."""
        if len(seqs) == 1:
            n = self._chain_steps(seqs[0])
            if n:
                return [self._decode_chain(seqs[0], n)]
        if 1 < len(seqs) <= MAX_TOKENS and self.model.batch_ahead and self.cfg.decode_chain and \
                all(self._greedy_on_gpu(s) and not self._speculates(s) for s in seqs):
            return self._decode_batch_ahead(seqs)
        out: list[str] = []
        for c in range(0, len(seqs), MAX_TOKENS):
            part = seqs[c:c + MAX_TOKENS]
            masked = [s.matcher for s in part if s.matcher is not None]
            # sampling rows with nothing of logits.py around the draw: drawn on the GPU behind the step, their ids in
            # its keys (ChainSampler.draw_rows: _sample's semantics, to float64 rounding), one wait for the batch
            drawn = [(i, s.params, s.gen) for i, s in enumerate(part) if self._samples_on_gpu(s)]
            drawn_rows = {i for i, _, _ in drawn}

            def during():  # while the GPU steps: grammar masks on the CPU, the draws queued behind the step
                for m in masked:
                    m.prefetch(self.model.device)
                if drawn:
                    self.model.sampler.draw_rows(drawn, len(part))
            ids, logits = self.model.decode([s.output_ids[-1] for s in part], [s.num_tokens - 1 for s in part],
                                            [s.slot for s in part], during if masked or drawn else None)
            if drawn:
                self.chain_stats["sampled"]["batched"] += len(drawn)
            if getattr(self, "heads", None) is not None:  # draft heads: each speculating sequence keeps its hidden row
                rows = self.model.x[:len(part)].clone() if any(s.params.speculative for s in part) else None
                for i, s in enumerate(part):
                    s.hidden = rows[i] if rows is not None and s.params.speculative else None
            for i, s in enumerate(part):
                # the fused argmax for plain greedy rows, the GPU's draw for plain sampling rows; constrained /
                # logprob rows take the logits path
                tok = ids[i] if (s.params.greedy and not active(s)) or i in drawn_rows else self._sample(logits[i], s)
                out.append(s.append(tok, self.eos_ids))
        return out

    def _decode_batch_ahead(self, seqs: list[Sequence]) -> list[str]:
        """One greedy token for each of 2..8 sequences (GPUModel.batch_ahead): a one-step chain whose next step, fed
        these ids, is queued before they are read when every sequence has tokens left; the next call with the same
        sequences in the same order starts from it (decode_chain's ahead). The same tokens as GPUModel.decode's."""
        got: list[list[int]] = []
        ahead = all(s.params.max_tokens - len(s.output_ids) > 1 for s in seqs)
        self.model.decode_chain([s.output_ids[-1] for s in seqs], [s.num_tokens - 1 for s in seqs],
                                [s.slot for s in seqs], 1, lambda ids: got.append(ids) or True, ahead=ahead)
        return [s.append(tok, self.eos_ids) for s, tok in zip(seqs, got[0])]

    def _greedy_on_gpu(self, s: Sequence) -> bool:
        """s's next token is its argmax, read on the GPU (no sampling, grammar, logprobs or biases: logits.active),
        and its tokens' embedding rows are the GPU's (not staged from host RAM)."""
        return self.model.host_embed is None and s.params.greedy and not active(s)

    def _samples_on_gpu(self, s: Sequence) -> bool:
        """s samples (temperature > 0) with nothing of logits.py around the draw, its generator seeded, and its
        tokens' embedding rows on the GPU: a chain can draw its tokens (GPUModel.decode_chain's sample)."""
        return self.model.sample_chain and self.model.host_embed is None and not s.params.greedy and \
            not active(s) and s.gen is not None

    @staticmethod
    def new_chain_stats(model) -> dict:
        """/health's decode_chain: engine steps that chained and the tokens they gave (_decode_chain); "ahead", the
        model's own count of steps run ahead / resumed from (the same dict: the batches' one-step chains count there
        too); "sampled", tokens drawn on the GPU inside chains / behind batched steps (chain_sampler.py)."""
        return {"chains": 0, "tokens": 0, "ahead": model.ahead_stats, "sampled": {"chained": 0, "batched": 0}}

    def _speculates(self, s: Sequence) -> bool:
        """GPU speculation (prompt lookup / draft heads) decides s's steps."""
        return bool(s.params.speculative and self.cfg.speculative_gpu)

    def _chain_steps(self, s: Sequence) -> int:
        """Steps a lone sequence may chain on the GPU (GPUModel.decode_chain): 0 where its tokens need the host
        (a grammar, logprobs, biases, embedding rows staged from host RAM), and requests that speculate
        (speculative.decode drafts for them each step; the draft heads read their hidden rows), except for the plain
        steps of prompt lookup's back-off. A sampling request chains with its draws on the GPU (_samples_on_gpu)."""
        if not (self._greedy_on_gpu(s) or self._samples_on_gpu(s)):
            return 0
        limit = self.cfg.decode_chain
        if self._speculates(s):  # prompt lookup / draft heads decide its steps
            if getattr(self, "heads", None) is not None:
                return 0
            # prompt lookup backing off after a miss (speculative.decode: spec_skip plain steps, this one included)
            limit = min(limit, getattr(s, "spec_skip", 0) + 1)
        n = min(limit, s.params.max_tokens - len(s.output_ids), self.max_context - s.num_tokens + 1)
        return n if n >= 2 else 0

    def _decode_chain(self, s: Sequence, n: int) -> str:
        """Up to n tokens for s (greedy, or drawn on the GPU), ending at EOS, a stop string or max_tokens; returns the
        text delta."""
        parts: list[str] = []

        def on_ids(ids: list[int]) -> bool:
            parts.append(s.append(ids[0], self.eos_ids))
            return not s.finished

        # more tokens after these (and no drafts deciding the next step): the next chain's first step may run ahead
        ahead = not self._speculates(s) and s.params.max_tokens - len(s.output_ids) > n
        sample = None if s.params.greedy else (s.params, s.gen)  # drawn on the GPU, from its generator
        steps = self.model.decode_chain([s.output_ids[-1]], [s.num_tokens - 1], [s.slot], n, on_ids, ahead=ahead,
                                        sample=sample)
        if sample is not None:
            self.chain_stats["sampled"]["chained"] += steps
        if getattr(s, "spec_skip", 0):  # the back-off's plain steps this chain ran
            s.spec_skip = max(0, s.spec_skip - (steps - 1))
        self.chain_stats["chains"] += 1
        self.chain_stats["tokens"] += steps
        return "".join(parts)

    def logits(self, ids: list[int]) -> torch.Tensor:
        """All-position logits [T, vocab] (float32, CPU) of a token list, in a free slot."""
        slot = self.free_slots[0] if self.free_slots else 0
        return self.model.prefill(ids, slot, 0, all_logits=True).cpu()

    def _checked_packing(self, dev) -> tuple[str, str]:
        """(packing, why it is not cfg.gguf_pack) after the layout kernels' check (engine/runtime/pack_check.py)."""
        from engine.formats.gguf_layout import linear_layouts
        from engine.model.gpu_prefill import linear_prefill
        from engine.runtime import pack_check
        from kernels.decode_kernels import DecodeKernels

        layouts = linear_layouts(self.mcfg, self.spec.weight_types, self.cfg.gguf_pack)
        return pack_check.packing_for(self.cfg.gguf_pack, layouts, DecodeKernels.get(dev), dev, linear_prefill)

    def memory(self) -> dict:
        m = self.model.memory()
        m.update(free_bytes_at_load=self.budget.free, total_bytes=self.budget.total,
                 memory_plan=asdict(self.plan), graphs_at_load=self.graphs_at_load)
        if self.gguf_pack:
            m.update(gguf_pack=self.gguf_pack, gguf_pack_note=self.gguf_pack_note)
        return m
