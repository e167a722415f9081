"""The memory plan: every byte count the engine, doctor, gateway and quant table use, in one place.

GPU need = weights + KV cache + working memory, against the driver's free bytes (or --gpu-memory-limit):
    weights  packed codes + fp16 scale/min per group (128; 32 or 16 for a GGUF's exact layouts) + fp16 biases
             + fp32 norms (what gpu_load holds; source_weight_parts for a GGUF / HF source)
    KV       k/v [layers, slots, kv_heads, max_context, head_dim] fp16: bytes_per_token * slots * context
             (3B 36 KiB/token: 4,096 tokens 144 MiB; 7B 56 KiB/token: 32,768 tokens 1.75 GiB)
    work     decode step buffers + split-K partials + rope tables + decode graphs (GRAPH_BYTES per batch size)
             + the sampling draw's sorted rows
             + one prefill chunk's activations (PREFILL_CHUNK tokens, engine/model/gpu_prefill.py)
             + the prefill graphs' staging K/V and pool (engine/model/gpu_prefill_graph.py)
             + host-embedding staging rows (embedding in host RAM only) + RESERVE_BYTES
Plans, tried in order until one fits (plan_memory): as is; the untied input embedding in host RAM; LEAN
(256-token prefill chunks, no prefill graphs). plan_fitting_context also shrinks the context (fit_context).
CPU need (CPU runner, doctor, gateway): float32 weights + float32 KV + CPU_OVERHEAD, against available RAM
(check_cpu_ram: refused before anything is allocated).

This module imports no torch: doctor and `python -m engine.quant.budget` use it on machines without a GPU.
The GPU work-space parts are the model's own counts (what GPUModel allocates), imported when first needed.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from engine.config import GGUF_PACK, PREFILL_CHUNK, EngineConfig, ModelConfig  # PREFILL_CHUNK: defined there, once
from engine.errors import BadRequestError, ResourceError
from engine.formats.gguf_layout import is_lossless_source, linear_layouts  # GGUF type -> exact layout (torch-free)
from engine.model.layout import FUSED, LINEARS, linear_shape  # the tensor layout table (torch-free)

GIB = 1 << 30
DENSE_BITS = 4  # a dense model (GGUF / HF folder) is quantized to this at load
GROUP = 128  # weights per fp16 scale + min (kernels/pack.py GROUP; tests/test_memory_plan.py checks they agree)
MAX_CONTEXT = 32768  # Qwen2.5 max_position_embeddings
RESERVE_BYTES = 192 << 20  # allocator fragmentation, cuBLAS workspace
GRAPH_BYTES = 8 << 20  # per captured decode batch size (graph pool + exec)
CPU_OVERHEAD = 300 << 20  # CPU: interpreter, tokenizer, activations of a chunk (rough, doctor's estimate)
ESTIMATE_CONTEXT = 4096  # doctor's "does it fit" context (one slot)
DEFAULT_SMS = 132  # SM count assumed when no device is asked (H100/H200; only the split-K partials depend on it)
log = logging.getLogger("deepinfer.gpu")


# --- weights ---------------------------------------------------------------------------------
def linear_bytes(n_rows: int, k: int, bits: int, group: int = GROUP, kq: str = "") -> int:
    """GPU bytes of an [n_rows, k] linear: fp16, or packed codes + fp16 scale and min per `group` weights, or (kq
    "kq": kernels/pack.py KQ) codes + integer sub-scales per group + fp16 factors per 256 ((sc, m) and (d, dmin)
    in groups of 32; sc and d in groups of 16), or (kq "sym": kernels/pack.py SYM) codes + an fp16 scale per group."""
    if bits == 16:
        return n_rows * k * 2
    if kq == "sym":
        return n_rows * k * bits // 8 + n_rows * (k // group) * 2
    if kq:
        per_group, per_256 = (2, 4) if group == 32 else (1, 2)
        return n_rows * (k * bits // 8 + (k // group) * per_group + (k // 256) * per_256)
    return n_rows * k * bits // 8 + n_rows * (k // group) * 4


def param_counts(cfg: ModelConfig) -> tuple[int, int]:
    """(linear params of the decoder layers (+ an untied lm_head), embedding params); biases and norms aside."""
    per_layer = sum(n * k for n, k in (linear_shape(cfg, m) for m in LINEARS))
    lin = cfg.num_layers * per_layer + (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)
    return lin, cfg.vocab_size * cfg.hidden_size


def embed_bytes(cfg: ModelConfig, bits: int = 4) -> int:
    """Bytes of the input embedding at `bits` (what host RAM takes over for an untied model)."""
    return linear_bytes(cfg.vocab_size, cfg.hidden_size, bits)


def weight_parts(cfg: ModelConfig, bits_of, embed_bits: int) -> dict[str, int]:
    """GPU bytes by part; bits_of(module, layer) -> 16/4/3 for each fused linear (engine/quant/scheme.py)."""
    lin = sum(linear_bytes(*linear_shape(cfg, m), bits_of(m, i)) for i in range(cfg.num_layers) for m in LINEARS)
    small = cfg.num_layers * ((cfg.q_size + 2 * cfg.kv_size) * 2 + 2 * cfg.hidden_size * 4) \
        + cfg.hidden_size * 4  # fp16 qkv bias, fp32 norms
    emb = embed_bytes(cfg, embed_bits)
    return {"linears": lin, "norms_biases": small, "embedding": emb,
            "lm_head": 0 if cfg.tie_word_embeddings else emb}


def weight_bytes(cfg: ModelConfig, bits: int = 4) -> int:
    """GPU bytes of a model quantized uniformly at `bits` (a dense GGUF / HF model loaded at W4)."""
    return sum(weight_parts(cfg, lambda m, i: bits, bits).values())


def source_weight_parts(cfg: ModelConfig, weight_types: dict[str, str], requantize: str = "none",
                        mode: str = GGUF_PACK) -> dict[str, int]:
    """GPU bytes by part of a dense source (GGUF / HF folder) as engine/model/gpu_load.py loads it: a quantized
    GGUF's exact layouts (requantize "none": engine/formats/gguf_layout.py for EngineConfig.gguf_pack mode; a fused linear
    without one is W4 g128), else every linear W4 / W3 g128 with a 4-bit embedding and head."""
    if requantize != "none" or not is_lossless_source(weight_types):
        bits = 3 if requantize == "w3" else DENSE_BITS
        return weight_parts(cfg, lambda m, i: bits, DENSE_BITS)
    lay = linear_layouts(cfg, weight_types, mode)

    def lb(name: str, n: int, k: int) -> int:
        return linear_bytes(n, k, *(lay.get(name) or (DENSE_BITS, GROUP)))
    parts = weight_parts(cfg, lambda m, i: DENSE_BITS, DENSE_BITS)
    parts["linears"] = sum(lb(f"layers.{i}.{m}", *linear_shape(cfg, m)) for i in range(cfg.num_layers)
                           for m in LINEARS)
    parts["embedding"] = lb("embed_tokens", cfg.vocab_size, cfg.hidden_size)
    parts["lm_head"] = 0 if cfg.tie_word_embeddings else lb("lm_head", cfg.vocab_size, cfg.hidden_size)
    return parts


def source_weight_bytes(cfg: ModelConfig, weight_types: dict[str, str], requantize: str = "none",
                        mode: str = GGUF_PACK) -> tuple[int, int]:
    """(GPU bytes of all weights, of the input embedding) of a dense source loaded as source_weight_parts says."""
    p = source_weight_parts(cfg, weight_types, requantize, mode)
    return sum(p.values()), p["embedding"]


# --- KV cache --------------------------------------------------------------------------------
def kv_bytes_per_token(cfg: ModelConfig, dtype_bytes: int = 2) -> int:
    """K and V of one token over all layers."""
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * dtype_bytes


def kv_bytes(cfg: ModelConfig, tokens: int = ESTIMATE_CONTEXT, slots: int = 1, dtype_bytes: int = 2) -> int:
    return kv_bytes_per_token(cfg, dtype_bytes) * tokens * slots


# --- GPU working memory ----------------------------------------------------------------------
def _gpu_parts():
    """The model's own byte counts (imported here, not at the top: they pull torch; see the docstring)."""
    from engine.model import gpu_prefill, gpu_prefill_graph  # torch-free path: doctor imports this module
    from engine.model.gpu_model import staging_rows  # torch
    from kernels import decode_kernels  # torch
    return gpu_prefill, gpu_prefill_graph, staging_rows, decode_kernels


def decode_workspace_bytes(cfg: ModelConfig, max_context: int, max_batch: int, sms: int = DEFAULT_SMS) -> int:
    """GPUModel's decode buffers for MAX_TOKENS rows, split-K partials, rope tables, decode graphs and sampling."""
    dk = _gpu_parts()[3]
    M = dk.MAX_TOKENS
    acts = M * (cfg.hidden_size * 6 + (cfg.q_size + 2 * cfg.kv_size) * 2 + cfg.q_size * 2 +
                cfg.intermediate_size * 2 + cfg.vocab_size * 4)
    attn = M * cfg.num_heads * dk.attn_splits(sms, cfg.num_kv_heads, 1) * (cfg.head_dim + 2) * 4
    rope = max_context * cfg.head_dim * 4
    # sampling on the GPU: the draw's kernels' scratch (DecodeKernels.load_sample: partial sums, candidates and
    # histograms for M rows, 0.57 MiB for 8), and one row sorted (fp32 values + int64 ids + the sort's scratch,
    # ~24 bytes per vocabulary entry) by the host path (sampling.pick_index: rows with a grammar, logprobs or biases)
    sample = sum(n * dt.itemsize for n, dt in dk.sample_scratch(M)) + cfg.vocab_size * 24
    return acts + attn + rope + GRAPH_BYTES * min(max_batch, M) + sample


def prefill_activation_bytes(cfg: ModelConfig, tokens: int) -> int:
    """One prefill forward of `tokens` tokens (engine/model/gpu_prefill.py prefill_activation_bytes)."""
    return _gpu_parts()[0].prefill_activation_bytes(cfg, tokens)


@dataclass(frozen=True)
class MemoryPlan:
    """How a model is laid out on the GPU (chosen by plan_memory before anything is allocated)."""
    embed_on_host: bool = False  # the untied input embedding in host RAM (engine/model/host_embed.py)
    prefill_chunk: int = 0  # tokens per prefill forward (0 = PREFILL_CHUNK)
    graph_buckets: tuple[int, ...] | None = None  # prefill graph lengths (None = all, up to 1024; () = none)


# small cards: 256-token prefill chunks and no prefill graphs (on a 4 GB laptop card a 7B prefill is compute-
# bound: the graphs' launch savings are a few ms of a ~100 ms prefill); 7B at 4096 tokens: 452 MiB less work memory
LEAN = {"prefill_chunk": 256, "graph_buckets": ()}


def work_bytes(cfg: ModelConfig, max_context: int, slots: int, sms: int = DEFAULT_SMS,
               plan: MemoryPlan = MemoryPlan()) -> int:
    """Working memory of a plan: decode work space + one prefill chunk + prefill graphs + staging + reserve."""
    gp, gpg, staging_rows, _ = _gpu_parts()
    buckets = gpg.BUCKETS if plan.graph_buckets is None else plan.graph_buckets
    staging = staging_rows(plan.prefill_chunk, plan.graph_buckets) * cfg.hidden_size * 4 \
        if plan.embed_on_host else 0  # fp32 rows staged for the GPU
    return decode_workspace_bytes(cfg, max_context, slots, sms) + \
        gp.prefill_activation_bytes(cfg, min(plan.prefill_chunk or PREFILL_CHUNK, max_context)) + RESERVE_BYTES + \
        gpg.graph_bytes(cfg, max_context, buckets) + staging


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


def context_that_fits(cfg: ModelConfig, room: int, slots: int) -> int:
    """Longest context (a multiple of 256, <= MAX_CONTEXT and the model's positions) whose KV cache for
    `slots` sequences fits `room` bytes (free memory less weights and working memory); 0 if none."""
    ctx = max(0, room // (kv_bytes_per_token(cfg) * slots)) // 256 * 256 if room > 0 else 0
    return min(ctx, MAX_CONTEXT, cfg.max_position)


def check_budget(cfg: ModelConfig, weights: int, max_context: int, slots: int, mem_info: tuple[int, int],
                 sms: int, limit: int = 0, plan: MemoryPlan = MemoryPlan()) -> Budget:
    """Raise ResourceError (with every number and a fix) when weights + cache + work space do not fit.
    mem_info: the driver's (free, total) bytes; limit: bytes DeepInfer may use (0 = whatever is free);
    weights: GPU bytes of the weights in this plan (the embedding already taken out when it is on the host)."""
    free, total = mem_info
    if limit:
        free = min(free, limit)
    kv = kv_bytes(cfg, max_context, slots)
    work = work_bytes(cfg, max_context, slots, sms, plan)
    b = Budget(free, total, weights, kv, work)
    if b.need <= free:
        return b
    fit_ctx = context_that_fits(cfg, free - weights - work, slots)
    if free - weights - work <= 0:
        fix = "use a smaller model or a 3-bit scheme (deepinfer export --scheme w3|mixed), or free GPU memory"
    else:
        fix = f"use --max-context {fit_ctx}" if fit_ctx >= 512 else "use a smaller model or free GPU memory"
        if slots > 1:
            fix += " or a smaller --max-batch"
    raise ResourceError(
        f"the model needs {b.need / GIB:.2f} GiB of GPU memory (weights {weights / GIB:.2f} GiB, KV cache "
        f"{kv / GIB:.2f} GiB for {slots} x {max_context} tokens, working memory {work / GIB:.2f} GiB) but only "
        f"{free / GIB:.2f} GiB of {total / GIB:.2f} GiB is " + ("allowed (--gpu-memory-limit)" if limit and
                                                              free == limit else "free"), fix)


def plan_memory(mcfg: ModelConfig, cfg: EngineConfig, weights: int, embed: int, max_context: int,
                mem_info: tuple[int, int], sms: int) -> tuple[Budget, MemoryPlan]:
    """-> (Budget, MemoryPlan): the first plan that fits the GPU budget, in this order: as is; the input
    embedding (`embed` bytes of `weights`) in host RAM (untied models, embed_on_host auto/on); the lean plan
    (LEAN: slower prefill, same decode). A tied embedding (the lm_head) never moves. Raises ResourceError
    with the numbers of the last plan."""
    limit = cfg.gpu_memory_limit_mb << 20
    can_move = not mcfg.tie_word_embeddings
    if cfg.embed_on_host == "on" and not can_move:
        raise BadRequestError("this model's embedding is tied to its lm_head and must stay on the GPU",
                              "use --embed-on-host auto or off")
    hosts = {"on": [True], "off": [False]}.get(cfg.embed_on_host, [False, True] if can_move else [False])
    plans = [MemoryPlan(h) for h in hosts] + [MemoryPlan(hosts[-1], **LEAN)]
    err = None
    for plan in plans:
        try:
            b = check_budget(mcfg, weights - (embed if plan.embed_on_host else 0), max_context, cfg.max_batch,
                             mem_info, sms, limit, plan)
        except ResourceError as e:
            err = e
            continue
        if plan != plans[0]:
            log.info("memory plan %s (%.0f MiB of embedding in host RAM) so that the model fits the GPU budget",
                     plan, embed / 2**20 if plan.embed_on_host else 0)
        return b, plan
    raise err


def plan_fitting_context(mcfg: ModelConfig, cfg: EngineConfig, weights: int, embed: int, max_context: int,
                         mem_info: tuple[int, int], sms: int, floor: int = 512) -> tuple[Budget, MemoryPlan, int]:
    """plan_memory at max_context, or (cfg.fit_context) at the longest context down to `floor` (steps of 256)
    that fits. -> (Budget, MemoryPlan, context)."""
    tries = [max_context]
    if cfg.fit_context:
        tries += range((max_context - 1) // 256 * 256, floor - 1, -256)
    for ctx in tries:
        try:
            b, plan = plan_memory(mcfg, cfg, weights, embed, ctx, mem_info, sms)
        except ResourceError as e:
            err = e
            continue
        if ctx != max_context:
            log.warning("max_context %d does not fit the GPU budget: using %d", max_context, ctx)
        return b, plan, ctx
    raise err


# --- estimates before loading (doctor, the gateway's second model) ---------------------------
def gpu_estimate(cfg: ModelConfig, weights: int, context: int = ESTIMATE_CONTEXT, slots: int = 1,
                 sms: int = DEFAULT_SMS) -> int:
    """GPU bytes of the "as is" plan: weights + KV for slots x context + working memory."""
    return weights + kv_bytes(cfg, context, slots) + work_bytes(cfg, context, slots, sms)


def cpu_weight_bytes(cfg: ModelConfig, dtype_bytes: int = 4, cpu_weights: str = "dense", streamed: bool = True,
                     types: dict[str, str] | None = None) -> int:
    """The CPU runner's weights at its load's peak. dense: every weight in the dtype (float32: 4 bytes, bfloat16: 2).
    int8 (EngineConfig.cpu_weights, kernels/cpu_int8.py): the linears at 1 byte + the embedding in the dtype + a tied
    head's int8 copy, plus what is in flight: streamed (a model file, Qwen2Model.load_weights) the largest fused linear
    in float32; not streamed (a checkpoint) the linears in bf16 before they turn int8. int4 counts as int8 (a bound)
    unless `types` (a GGUF's HF name -> type, ModelSpec.weight_types) say more: then cpu_gguf_weight_bytes."""
    lin, emb = param_counts(cfg)
    if cpu_weights not in ("int8", "int4"):
        return (lin + emb) * dtype_bytes
    if types and streamed:
        return cpu_gguf_weight_bytes(cfg, cpu_weights, types, dtype_bytes)
    tied_head = emb if cfg.tie_word_embeddings else 0
    fused = [linear_shape(cfg, m) for m in LINEARS if len(FUSED[m]) > 1]  # q|k|v, gate|up: staged until whole
    in_flight = max(n * k for n, k in fused) * 4 if streamed else lin * 2
    return lin + emb * dtype_bytes + tied_head + in_flight


INT4_BYTES = 0.625  # kernels/cpu_int4.py: half a byte a weight + a bf16 scale and zero per 32
GGUF_DECODE_BYTES = 64 << 20  # gguf_int4 / gguf_rows: one chunk's decode temporaries (2^24 weights)


def cpu_gguf_weight_bytes(cfg: ModelConfig, cpu_weights: str, types: dict[str, str], dtype_bytes: int = 4) -> int:
    """What the CPU runner's streamed int8 / int4 load of a GGUF holds, from its tensor types: a quantized embedding
    stays in the file (engine/formats/gguf_rows.py; F16 / F32 ones in the dtype), each linear int4 (int4, every part
    Q4_K / Q4_0 / Q4_1: engine/formats/gguf_int4.py) or int8 (1 byte + a scale per row), the head likewise (a tied
    one from the embedding's type), plus in flight the largest fused linear with a part in float32 staging."""
    from engine.formats.gguf_layout import FOUR_BIT, REPACK
    from engine.model.layout import EMBED, HEAD

    int4 = cpu_weights == "int4"

    def linear(n: int, k: int, parts: list[str]) -> int:
        four = int4 and all(types.get(p) in FOUR_BIT for p in parts) and n % 64 == 0 and k % 32 == 0
        return int(n * k * INT4_BYTES) if four else n * k + 6 * n

    total, staged = 0, 0
    for i in range(cfg.num_layers):
        for m in LINEARS:
            n, k = linear_shape(cfg, m)
            parts = [f"model.layers.{i}.{p}.weight" for p in FUSED[m]]
            b = linear(n, k, parts)
            total += b
            if len(parts) > 1 and b >= n * k:  # int8: staged in float32 until whole
                staged = max(staged, n * k * 4)
    V, H = cfg.vocab_size, cfg.hidden_size
    emb_type = types.get(EMBED)
    total += 0 if emb_type in REPACK else V * H * dtype_bytes
    total += linear(V, H, [EMBED] if cfg.tie_word_embeddings else [HEAD])
    return total + max(staged, GGUF_DECODE_BYTES)


def cpu_estimate(cfg: ModelConfig, context: int = ESTIMATE_CONTEXT, slots: int = 1, dtype_bytes: int = 4,
                 cpu_weights: str = "dense", streamed: bool = True, types: dict[str, str] | None = None) -> int:
    """RAM of the CPU runner at its load's peak: cpu_weight_bytes + KV in the dtype + CPU_OVERHEAD."""
    return cpu_weight_bytes(cfg, dtype_bytes, cpu_weights, streamed, types) + \
        kv_bytes(cfg, context, slots, dtype_bytes) + CPU_OVERHEAD


def available_ram() -> int | None:
    """Bytes of RAM a new allocation can take without swapping (psutil where installed, else Linux's MemAvailable);
    None where unknown."""
    try:
        import psutil  # optional: not a dependency
        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - not installed, or no answer on this OS
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cpu_ram_fits(cfg: ModelConfig, context: int, slots: int, dtype_bytes: int = 4, cpu_weights: str = "dense",
                 streamed: bool = True, types: dict[str, str] | None = None) -> bool:
    """Whether the CPU runner's need (cpu_estimate) fits the available RAM (unknown RAM: yes)."""
    avail = available_ram()
    return avail is None or cpu_estimate(cfg, context, slots, dtype_bytes, cpu_weights, streamed, types) <= avail


def cpu_fitting_context(cfg: ModelConfig, context: int, slots: int, dtype_bytes: int = 4, cpu_weights: str = "dense",
                        streamed: bool = True, types: dict[str, str] | None = None, floor: int = 512) -> int:
    """EngineConfig.fit_context on the CPU (the tray sets it): the longest context <= `context`, in steps of 256 down
    to `floor`, whose KV cache fits the free RAM beside the weights (cpu_estimate); `context` when it fits or RAM is
    unknown, and also when not even `floor` fits (check_cpu_ram then says why)."""
    avail = available_ram()
    if avail is None or cpu_estimate(cfg, context, slots, dtype_bytes, cpu_weights, streamed, types) <= avail:
        return context
    for ctx in range((context - 1) // 256 * 256, floor - 1, -256):
        if cpu_estimate(cfg, ctx, slots, dtype_bytes, cpu_weights, streamed, types) <= avail:
            log.warning("max_context %d does not fit the free RAM: using %d", context, ctx)
            return ctx
    return context


def check_cpu_ram(cfg: ModelConfig, name: str, context: int, slots: int, dtype_bytes: int = 4,
                  cpu_weights: str = "dense", streamed: bool = True, types: dict[str, str] | None = None,
                  available: int | None = None):
    """Before the CPU runner allocates anything: ResourceError when its weights and KV cache (cpu_estimate) do not
    fit the RAM available (available_ram(), or `available`), instead of the operating system killing the app or
    swapping for minutes. Unknown RAM passes."""
    avail = available_ram() if available is None else available
    need = cpu_estimate(cfg, context, slots, dtype_bytes, cpu_weights, streamed, types)
    if avail is None or need <= avail:
        return
    w = cpu_weight_bytes(cfg, dtype_bytes, cpu_weights, streamed, types) / GIB
    kv = kv_bytes(cfg, context, slots, dtype_bytes) / GIB
    kind = cpu_weights if cpu_weights in ("int8", "int4") else "float32" if dtype_bytes == 4 else "bfloat16"
    raise ResourceError(
        f"model {name!r} needs about {need / GIB:.1f} GiB of RAM on the CPU path ({w:.1f} GiB of {kind} weights, "
        f"{kv:.1f} GiB of KV cache for {slots} x {context} tokens) and {avail / GIB:.1f} GiB is available",
        "use a smaller model (--model qwen2.5-coder-0.5b), --cpu-weights int4 (a GGUF) or int8, a shorter "
        "--max-context or fewer "
        "--max-batch slots, close other programs, or run it on an NVIDIA GPU (deepinfer doctor says what this "
        "machine has)")
