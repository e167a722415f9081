"""GPU model runner: same interface as engine/runtime/cpu_runner.py CPURunner (the scheduler and LLM use either).

Loads a quantized layered checkpoint (or quantizes a dense spec to W4 at load) after a VRAM budget
check, keeps a static fp16 KV cache of max_batch slots, prefills with engine.model.gpu_prefill, and decodes
with the CUDA-graph step of engine/model/gpu_model.py (batched, up to 8 sequences per replay).
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

import torch

from engine.config import EngineConfig
from engine.runtime.logits import active, pick
from engine.runtime.sampling import sample
from engine.runtime.sequence import Sequence
from engine.runtime.slots import SlotRunner
from engine.formats.spec import ModelSpec
from kernels.decode_kernels import MAX_TOKENS

DENSE_BITS = 4  # a dense model (GGUF / HF) is quantized to this at load
log = logging.getLogger("deepinfer.gpu")


@dataclass(frozen=True)
class MemoryPlan:
    """How a model is laid out on the GPU (chosen by plan_memory before anything is allocated)."""
    embed_on_host: bool = False  # the untied input embedding in host RAM (engine/model/host_embed.py)
    prefill_chunk: int = 0  # tokens per prefill forward (0 = GPUModel's default, 2048)
    graph_buckets: tuple[int, ...] | None = None  # prefill graph lengths (None = all, up to 1024; () = none)


# small cards: 256-token prefill chunks and no prefill graphs (on a 4 GB laptop card a 7B prefill is compute-
# bound: the graphs' launch savings are a few ms of a ~100 ms prefill); ~310 MiB less working memory for 7B
LEAN = {"prefill_chunk": 256, "graph_buckets": ()}


def plan_memory(mcfg, cfg: EngineConfig, weight_bytes: int, embed_bytes: int, max_context: int, device=None,
                mem_info=None, sms: int | None = None):
    """-> (Budget, MemoryPlan): the first plan that fits the GPU budget, in this order:
    as is; the input embedding in host RAM (untied models, embed_on_host auto/on); the lean plan (LEAN:
    slower prefill, same decode).
    A tied embedding (the lm_head) never moves. Raises ResourceError with the numbers of the last plan."""
    from engine.errors import BadRequestError, ResourceError
    from engine.model.gpu_model import staging_rows
    from engine.runtime.vram import check_budget

    limit = cfg.gpu_memory_limit_mb << 20
    can_move = not mcfg.tie_word_embeddings
    if cfg.embed_on_host == "on" and not can_move:
        raise BadRequestError("this model's embedding is tied to its lm_head and must stay on the GPU",
                              "use --embed-on-host auto or off")
    hosts = {"on": [True], "off": [False]}.get(cfg.embed_on_host, [False, True] if can_move else [False])
    plans = [MemoryPlan(h) for h in hosts] + [MemoryPlan(hosts[-1], **LEAN)]
    err = None
    for plan in plans:
        staging = staging_rows(plan.prefill_chunk, plan.graph_buckets) * mcfg.hidden_size * 4 \
            if plan.embed_on_host else 0  # fp32 rows staged for the GPU
        try:
            b = check_budget(mcfg, weight_bytes - (embed_bytes if plan.embed_on_host else 0), max_context,
                             cfg.max_batch, device, limit, staging, mem_info, sms, plan.prefill_chunk,
                             plan.graph_buckets)
        except ResourceError as e:
            err = e
            continue
        if plan != plans[0]:
            log.info("memory plan %s (%.0f MiB of embedding in host RAM) so that the model fits the GPU budget",
                     plan, embed_bytes / 2**20 if plan.embed_on_host else 0)
        return b, plan
    raise err


def plan_fitting_context(mcfg, cfg: EngineConfig, weight_bytes: int, embed_bytes: int, max_context: int,
                         device=None, mem_info=None, sms: int | None = None, floor: int = 512):
    """plan_memory at max_context, or (cfg.fit_context) at the longest context down to `floor` (steps of 256)
    that fits. -> (Budget, MemoryPlan, context)."""
    from engine.errors import ResourceError

    if mem_info is None:  # the driver is asked once, not once per plan and context tried
        mem_info = torch.cuda.mem_get_info(device)
    if sms is None:
        sms = torch.cuda.get_device_properties(device).multi_processor_count
    tries = [max_context]
    if cfg.fit_context:
        tries += range((max_context - 1) // 256 * 256, floor - 1, -256)
    for ctx in tries:
        try:
            b, plan = plan_memory(mcfg, cfg, weight_bytes, embed_bytes, ctx, device, mem_info, sms)
        except ResourceError as e:
            err = e
            continue
        if ctx != max_context:
            log.warning("max_context %d does not fit the GPU budget: using %d", max_context, ctx)
        return b, plan, ctx
    raise err


class GPURunner(SlotRunner):
    device = "cuda"

    def __init__(self, spec: ModelSpec, cfg: EngineConfig):
        from engine.model import gpu_load
        from engine.model.gpu_model import GPUModel

        t0 = time.perf_counter()
        self.spec, self.cfg, self.mcfg = spec, cfg, spec.config
        self.max_context = min(cfg.max_context, spec.config.max_position)
        dev = torch.device("cuda")
        ck = getattr(spec, "checkpoint", None)
        wbytes = ck.nbytes() if ck is not None else gpu_load.estimate_bytes(spec.config, DENSE_BITS)
        ebytes = ck.linear("embed_tokens").nbytes() if ck is not None else \
            gpu_load.estimate_embed_bytes(spec.config, DENSE_BITS)
        self.budget, self.plan, self.max_context = plan_fitting_context(spec.config, cfg, wbytes, ebytes,
                                                                        self.max_context, dev)
        if cfg.gpu_memory_limit_mb:  # the torch allocator enforces the limit too (an OOM instead of paging)
            torch.cuda.set_per_process_memory_fraction(min(1.0, (cfg.gpu_memory_limit_mb << 20) /
                                                            self.budget.total))  # the current device
        host = self.plan.embed_on_host
        weights = gpu_load.load_checkpoint(ck, dev, host) if ck is not None else \
            gpu_load.load_dense(spec, dev, DENSE_BITS, host)
        self.model = GPUModel(weights, cfg.max_batch, self.max_context, dev, self.plan.prefill_chunk,
                              self.plan.graph_buckets)
        self.free_slots = list(range(cfg.max_batch))
        self.eos_ids = set(spec.config.eos_token_ids) | set(spec.tokenizer.eos_token_ids)
        torch.cuda.synchronize()
        self.load_seconds = time.perf_counter() - t0
        t1 = time.perf_counter()
        self.graphs_at_load = self.model.warmup(cfg.max_batch) if cfg.warmup else {}
        torch.cuda.synchronize()
        self.warmup_seconds = time.perf_counter() - t1

    # --- forward -------------------------------------------------------------------------
    def _prefill_range(self, seq: Sequence, p0: int, end: int) -> torch.Tensor:
        return self.model.prefill(seq.prompt_ids[p0:end], seq.slot, p0)

    def _sample(self, logits: torch.Tensor, seq: Sequence) -> int:
        return pick(logits, seq, sample)  # grammar mask / biases / logprobs around the sampler (logits.py)

    def decode(self, seqs: list[Sequence]) -> list[str]:
        """One token for each running sequence (up to 8 per CUDA-graph replay); returns text deltas."""
        out: list[str] = []
        for c in range(0, len(seqs), MAX_TOKENS):
            part = seqs[c:c + MAX_TOKENS]
            ids, logits = self.model.decode([s.output_ids[-1] for s in part], [s.num_tokens - 1 for s in part],
                                            [s.slot for s in part])
            for i, s in enumerate(part):
                # the fused argmax only for plain greedy rows; constrained / logprob rows take the logits path
                tok = ids[i] if s.params.greedy and not active(s) else self._sample(logits[i], s)
                out.append(s.append(tok, self.eos_ids))
        return out

    def logits(self, ids: list[int]) -> torch.Tensor:
        """All-position logits [T, vocab] (float32, CPU) of a token list, in a free slot."""
        slot = self.free_slots[0] if self.free_slots else 0
        return self.model.prefill(ids, slot, 0, all_logits=True).cpu()

    def memory(self) -> dict:
        m = self.model.memory()
        m.update(free_bytes_at_load=self.budget.free, total_bytes=self.budget.total,
                 memory_plan=asdict(self.plan), graphs_at_load=self.graphs_at_load)
        return m
