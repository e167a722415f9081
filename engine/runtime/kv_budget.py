"""KV-cache sizing from the VRAM budget (seed 5.2: size from what is free, say clearly when it does not fit).

The GPU cache is static: k/v [layers, slots, kv_heads, max_context, head_dim] fp16, so its size is
bytes_per_token * slots * max_context. What must fit in the card beside the weights:
    kv cache + prefill activations (one chunk) + decode workspace + a safety reserve.
Numbers for the Qwen2.5 shapes (fp16 KV): 3B 36 KiB/token (4,096 tokens 144 MiB, 32,768 tokens
1.125 GiB); 7B 56 KiB/token (32,768 tokens 1.75 GiB).
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.config import ModelConfig
from engine.errors import ResourceError

GIB = 1 << 30
MAX_CONTEXT = 32768  # Qwen2.5 max_position_embeddings
RESERVE_BYTES = 192 << 20  # allocator fragmentation, cuBLAS workspace, graph pools


def kv_bytes_per_token(cfg: ModelConfig, dtype_bytes: int = 2) -> int:
    """K and V of one token over all layers."""
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * dtype_bytes


@dataclass(slots=True)
class KVPlan:
    max_context: int  # tokens per slot
    slots: int
    kv_bytes: int  # whole cache
    activation_bytes: int  # one prefill chunk
    free_after: int  # bytes left of the budget after everything


def plan_kv_cache(cfg: ModelConfig, free_bytes: int, max_context: int, slots: int,
                  prefill_chunk: int = 2048, reserve_bytes: int = RESERVE_BYTES) -> KVPlan:
    """Check that `slots` sequences of `max_context` tokens fit `free_bytes` (VRAM free after the
    weights are loaded, e.g. torch.cuda.mem_get_info()[0]); raise ResourceError with the largest
    context / slot count that would fit."""
    from engine.model.gpu_prefill import prefill_activation_bytes
    limit = min(MAX_CONTEXT, cfg.max_position)
    if max_context > limit:
        raise ResourceError(f"max_context {max_context} exceeds the model's {limit} positions",
                            f"use --max-context {limit} or less")
    per_tok = kv_bytes_per_token(cfg)
    act = prefill_activation_bytes(cfg, min(prefill_chunk, max_context))
    kv = per_tok * slots * max_context
    left = free_bytes - kv - act - reserve_bytes
    if left >= 0:
        return KVPlan(max_context, slots, kv, act, left)
    room = free_bytes - act - reserve_bytes
    fit_ctx = max(0, room // (per_tok * slots)) // 256 * 256
    fit_slots = max(0, room // (per_tok * max_context))
    fix = (f"use --max-context {fit_ctx}" if fit_ctx >= 512 else "use a smaller model or free GPU memory")
    if fit_slots >= 1:
        fix += f" or --max-batch {fit_slots}"
    raise ResourceError(
        f"the KV cache for {slots} x {max_context} tokens needs {kv / GIB:.2f} GiB "
        f"(+{(act + reserve_bytes) / GIB:.2f} GiB working memory); only {free_bytes / GIB:.2f} GiB "
        f"of GPU memory is free after the weights", fix)


def max_context_that_fits(cfg: ModelConfig, free_bytes: int, slots: int, prefill_chunk: int = 2048) -> int:
    """Largest context (multiple of 256, <= 32,768) for `slots` sequences in free_bytes; 0 if none."""
    from engine.model.gpu_prefill import prefill_activation_bytes
    room = free_bytes - prefill_activation_bytes(cfg, prefill_chunk) - RESERVE_BYTES
    ctx = max(0, room // (kv_bytes_per_token(cfg) * slots)) // 256 * 256
    return int(min(ctx, MAX_CONTEXT, cfg.max_position))
