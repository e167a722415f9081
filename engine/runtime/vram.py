"""VRAM budget check before a GPU load (seed 5.2: refuse with the numbers instead of paging/OOM midway).

need = weights (codes + scales + mins + bias + norms) + KV cache + prefill activations + decode workspace
       + CUDA-graph pools (decode; prefill: engine/model/gpu_prefill_graph.py graph_bytes) + reserve,
       against torch.cuda.mem_get_info()'s free bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import ModelConfig
from engine.errors import ResourceError
from engine.runtime.kv_budget import GIB, RESERVE_BYTES, kv_bytes_per_token

GRAPH_BYTES = 8 << 20  # per captured batch size (graph pool + exec)


@dataclass
class Budget:
    free: int
    total: int
    weights: int
    kv: int
    work: int

    @property
    def need(self) -> int:
        return self.weights + self.kv + self.work


def decode_workspace_bytes(cfg: ModelConfig, max_context: int, max_batch: int, sms: int = 132) -> int:
    from kernels.decode_kernels import MAX_TOKENS, attn_splits
    M = MAX_TOKENS
    acts = M * (cfg.hidden_size * 6 + (cfg.q_size + 2 * cfg.kv_size) * 2 + cfg.q_size * 2 +
                cfg.intermediate_size * 2 + cfg.vocab_size * 4)
    attn = M * cfg.num_heads * attn_splits(sms, cfg.num_kv_heads, 1) * (cfg.head_dim + 2) * 4
    rope = max_context * cfg.head_dim * 4
    return acts + attn + rope + GRAPH_BYTES * min(max_batch, M)


def check_budget(cfg: ModelConfig, weight_bytes: int, max_context: int, slots: int, device=None,
                 limit: int = 0, extra_work: int = 0, mem_info=None, sms: int | None = None,
                 prefill_chunk: int = 0, graph_buckets: tuple[int, ...] | None = None) -> Budget:
    """Raise ResourceError (with every number) when the model + cache + work space do not fit.
    limit: bytes DeepInfer may use (0 = whatever is free); extra_work: more work space (host-embedding
    staging); mem_info / sms: the driver's (free, total) and SM count, read from the device by default;
    prefill_chunk / graph_buckets: what GPUModel will run with (0 / None = its defaults)."""
    from engine.model.gpu_model import PREFILL_CHUNK
    from engine.model.gpu_prefill import prefill_activation_bytes
    from engine.model.gpu_prefill_graph import BUCKETS, graph_bytes

    free, total = mem_info if mem_info is not None else torch.cuda.mem_get_info(device)
    if limit:
        free = min(free, limit)
    kv = kv_bytes_per_token(cfg) * slots * max_context
    if sms is None:
        sms = torch.cuda.get_device_properties(device).multi_processor_count
    work = decode_workspace_bytes(cfg, max_context, slots, sms) + \
        prefill_activation_bytes(cfg, min(prefill_chunk or PREFILL_CHUNK, max_context)) + RESERVE_BYTES + \
        graph_bytes(cfg, max_context, BUCKETS if graph_buckets is None else graph_buckets) + extra_work  # prefill graphs: staging K/V + pool
    b = Budget(free, total, weight_bytes, kv, work)
    if b.need <= free:
        return b
    room = free - weight_bytes - work
    per_tok = kv_bytes_per_token(cfg) * slots
    fit_ctx = max(0, room // per_tok) // 256 * 256 if room > 0 else 0
    if room <= 0:
        fix = "use a smaller model or a 3-bit scheme (deepinfer export --scheme w3|mixed), or free GPU memory"
    else:
        fix = f"use --max-context {fit_ctx}" if fit_ctx >= 512 else "use a smaller model or free GPU memory"
        if slots > 1:
            fix += " or a smaller --max-batch"
    raise ResourceError(
        f"the model needs {b.need / GIB:.2f} GiB of GPU memory (weights {weight_bytes / GIB:.2f} GiB, KV cache "
        f"{kv / GIB:.2f} GiB for {slots} x {max_context} tokens, working memory {work / GIB:.2f} GiB) but only "
        f"{free / GIB:.2f} GiB of {total / GIB:.2f} GiB is " + ("allowed (--gpu-memory-limit)" if limit and
                                                              free == limit else "free"), fix)
