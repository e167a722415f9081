"""Configuration dataclasses: the model's shape (ModelConfig) and the engine's settings (EngineConfig)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields

from engine.errors import BadRequestError

DEFAULT_MODEL = "qwen2.5-coder-0.5b"  # EngineConfig's default: the demo model from PyPI (make run, CI, tests)
DEFAULT_CHAT_MODEL = "qwen2.5:3b"  # what `deepinfer ask/serve/pull` and the tray use unless told: pulled on first use
# Tokens per prefill forward, CPU and GPU (GPUModel.prefill, CPURunner, gpu_prefill.prefill_chunks): bounds a
# forward's activation memory (engine/runtime/memory_plan.py counts one chunk). GPUModel has always run 2048
# (the speeds in docs/results/bench_gpu_3b_final.json); the lean memory plan uses 256 (docs/prefill.md).
PREFILL_CHUNK = 2048


@dataclass(slots=True)
class ModelConfig:
    """Qwen2 hyper-parameters (what config.json / GGUF metadata describe)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int = 0  # 0 -> hidden_size // num_heads
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6
    max_position: int = 32768
    tie_word_embeddings: bool = True
    bos_token_id: int = 151643
    eos_token_ids: list[int] = field(default_factory=lambda: [151645, 151643])
    name: str = "qwen2"

    def __post_init__(self):
        if self.head_dim == 0:
            self.head_dim = self.hidden_size // self.num_heads
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} not a multiple of num_kv_heads {self.num_kv_heads}")

    @property
    def q_size(self) -> int:  # rows of q_proj
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:  # rows of k_proj (= v_proj)
        return self.num_kv_heads * self.head_dim

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def from_hf(cls, d: dict) -> "ModelConfig":
        """From a Hugging Face config.json dict."""
        eos = d.get("eos_token_id", 151645)
        eos_ids = eos if isinstance(eos, list) else [eos]
        if 151645 not in eos_ids and d.get("vocab_size", 0) > 151645:
            eos_ids = eos_ids + [151645]
        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=d["num_attention_heads"],
            num_kv_heads=d.get("num_key_value_heads", d["num_attention_heads"]),
            head_dim=d.get("head_dim") or 0,
            rope_theta=float(d.get("rope_theta", 1_000_000.0)),
            rms_eps=float(d.get("rms_norm_eps", 1e-6)),
            max_position=d.get("max_position_embeddings", 32768),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            bos_token_id=d.get("bos_token_id", 151643) or 151643,
            eos_token_ids=eos_ids,
        )

    def to_hf(self) -> dict:
        return {
            "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
            "rope_theta": self.rope_theta, "rms_norm_eps": self.rms_eps,
            "max_position_embeddings": self.max_position,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id, "eos_token_id": self.eos_token_ids,
            "hidden_act": "silu", "torch_dtype": "bfloat16",
        }


# The exact Qwen2.5 shapes (docs/real-model.md), for random-weight speed work.
QWEN25_SHAPES: dict[str, dict] = {
    "0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24,
                 num_heads=14, num_kv_heads=2, tie_word_embeddings=True),
    "1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28,
                 num_heads=12, num_kv_heads=2, tie_word_embeddings=True),
    "3b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_layers=36,
               num_heads=16, num_kv_heads=2, tie_word_embeddings=True),
    "7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=28,
               num_heads=28, num_kv_heads=4, tie_word_embeddings=False),
    "14b": dict(vocab_size=152064, hidden_size=5120, intermediate_size=13824, num_layers=48,
                num_heads=40, num_kv_heads=8, tie_word_embeddings=False),
}


CPU_WEIGHTS = ("dense", "int8", "int4")  # EngineConfig.cpu_weights
GGUF_PACKS = ("bytes", "6bit", "kquant")  # EngineConfig.gguf_pack (engine/formats/gguf_layout.py: their tables)
GGUF_PACK = "kquant"  # the default: the one the device measured fastest (docs/gpu.md "The GGUF packings, timed")


@dataclass(slots=True)
class EngineConfig:
    """Everything the engine, server and tray need; built once from CLI flags / config file."""

    model: str = DEFAULT_MODEL  # pulled name | .gguf path | HF folder | checkpoint folder
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto (cpu: float32, cuda: float16) | float32 | bfloat16 | float16
    max_context: int = 4096  # static KV cache length per slot
    max_batch: int = 4  # KV-cache slots = sequences decoded together
    threads: int = 0  # torch CPU threads, 0 = torch default
    gpu_memory_limit_mb: int = 0  # GPU memory DeepInfer may use (budget + torch allocator cap), 0 = what is free
    embed_on_host: str = "auto"  # untied input embedding in host RAM: auto (when the GPU budget needs it) | on | off
    # GPU: none = a quantized GGUF's tensors run as they are (exact repack, engine/formats/gguf_kquant.py);
    # w4 | w3 = re-quantize every linear to our W4 / W3 group-128 layout at load (the old path; less memory)
    requantize: str = "none"
    # GPU, requantize none: how a GGUF's blocks are repacked (GGUF_PACKS, engine/formats/gguf_layout.py): "bytes"
    # the 5- and 6-bit codes in bytes (10 bits a weight for Q6_K); "6bit" as 6-bit codes (kernels/pack.py W6, 8 bits);
    # "kquant" also the K-quants' own integer sub-scales (KQ: Q4_K 4.625 bits, not 5; Q6_K 6.5625) and Q4_0 / Q5_0 /
    # Q8_0's lone scale per 32 (SYM: 4.5 / 6.5 / 8.5 bits). The same weights every way; a 3B Q4_K_M reads 2.44 / 2.23 /
    # 2.00 GB per token. "kquant" is the default since the H200 timed it (3B Q4_K_M decode 730-734 tok/s against
    # 702-707 as bytes and 687 as 6bit, same lease; docs/gpu.md "The GGUF packings, timed")
    gguf_pack: str = GGUF_PACK
    # CPU: "dense" = every weight in `dtype` (float32: the reference path); "int8" = the linears and the head as int8
    # per output row through torch's int8 CPU kernel (kernels/cpu_int8.py): a quarter of float32's bytes per token,
    # bf16 activations through the linears (docs/results/cpu_int8_*.json: speed and quality against dense); "int4" =
    # a GGUF's 4-bit linears (Q4_K / Q4_0 / Q4_1) as their own codes through torch's int4 CPU kernel
    # (kernels/cpu_int4.py), the rest as int8: half the bytes of those linears, closer to the file than int8
    # (docs/results/cpu_int4_quality_*.json, bench_cpu_int4_ab_*.json)
    cpu_weights: str = "dense"
    seed: int | None = None
    # gateway
    host: str = "127.0.0.1"
    port: int = 18000
    api_key: str | None = None
    max_queue: int = 32
    prefill_slice: int = 512  # prompt tokens per engine step while other requests decode (0 = whole prompt)
    # prompt-prefix KV blocks kept for reuse (engine/runtime/prefix_cache.py), MiB of the KV's device; 0 = off.
    # 256 MiB = ~10k tokens of the 0.5B in fp32 on CPU, ~7k of the 3B in fp16 on a GPU
    prefix_cache_mb: int = 256
    # On a CUDA GPU: the rest of a prompt after a reused prefix replays offset prefill graphs, and speculative
    # verification is one captured decode step (GPUModel.verify). Measured on the H200 with the real 0.5B
    # (docs/results/hotpath_gpu_0.5b.json): cached-template TTFT 1.29x the 50 tokens alone, chat second turn
    # 7.4x faster, rewrite 3.6x, no slowdown elsewhere; so both are on (off: --no-prefix-cache-gpu /
    # --no-speculative-gpu, e.g. to spare the offset graphs' memory).
    prefix_cache_gpu: bool = True
    speculative_gpu: bool = True
    # int8 activations in the batch-1 decode step's W4 GEMVs (llama.cpp's batch-1 numerics, so Ollama's: x quantized
    # per block of 32, integer dot products; kernels/q8_plan.py, docs/gpu.md): other bits than the fp16 step and
    # 4.5-6% fewer tokens/s than it on an H100 (3B / 7B / 14B W4, docs/results/decode_ab_q8gemv_dyn_h100.json); at
    # the fp16 kernels' plans (DEEPINFER_Q8_PLAN=fp16) step replay 0.958x / 1.020x / 1.094x on an H200
    # (decode_ab_q8fp_h200.json, decode_ab_q8fp14_h200.json): a win by size, not yet per size, so off by default;
    # batched steps keep fp16, and speculation is off with it (its verify rows are fp16: answers would part)
    decode_q8: bool = False
    spec_ngram_min: int = 2  # prompt lookup: shortest n-gram match that drafts (1 drafts more, accepts less)
    draft_model: str = ""  # speculative decoding's optional draft model (same tokenizer, e.g. the 0.5B for 3B/7B)
    # draft heads (engine/runtime/draft_heads.py) where prompt lookup has no draft: "auto" (= "on") the heads bundled
    # for the model file (assets/drafters/), on a GPU or the CPU; "" = none; or a heads file
    draft_heads: str = "auto"
    # greedy requests on the GPU verify the heads' drafts as a token tree (draft_heads.TREE, 7 rows a step), not a chain
    draft_tree: bool = True
    # the heads draft over the tokenizer's draft vocabulary (engine/draft/vocab.py: 32,768 of 151,936 ids; the verify
    # step is the full lm_head): the draft's lm_head GEMV and top-k read ~1/5 as much
    draft_vocab: bool = True
    # a request decoding alone runs up to this many tree steps per engine step with the GPU ahead of the host
    # (speculative.burst: acceptance on the GPU, the next step queued before the host reads the tokens); 0 = off
    spec_burst: int = 16
    # the CPU runner: heads drafting per verify step (a chain of 1 + this many rows; the int8 kernel's cost steps up
    # past 4 rows, docs/hotpath.md "Drafts on the CPU")
    spec_heads_cpu: int = 1
    # a greedy request decoding alone (no speculation) runs up to this many steps per engine step with the next one
    # queued on the GPU before the host reads the current one's token (GPUModel.decode_chain); 0 or 1 = off
    decode_chain: int = 16
    warmup: bool = True  # GPU: capture the decode and prefill CUDA graphs at load, not on first use
    fit_context: bool = False  # shrink max_context to what fits the GPU / the free RAM instead of refusing (the tray)
    request_timeout_s: float = 600.0
    max_body_bytes: int = 4 * 1024 * 1024
    cors_origins: list[str] = field(default_factory=lambda: [
        "app://obsidian.md", "vscode-webview://*", "http://localhost", "http://localhost:*",
        "http://127.0.0.1", "http://127.0.0.1:*"])
    served_models: list[str] = field(default_factory=list)  # extra backends listed in /v1/models
    list_pulled: bool = False  # /v1/models also lists every pulled model, loaded on first use (serve, tray)
    allow_hosts: list[str] = field(default_factory=list)  # Host names accepted besides loopback + host (patterns)
    header_timeout_s: float = 10.0  # slow clients: a request line + headers must arrive within this
    body_timeout_s: float = 60.0  # ... and the body within this after the headers
    max_connections: int = 256  # open HTTP connections; requests beyond get 503

    def __post_init__(self):
        if self.max_context < 16:
            raise BadRequestError(f"max_context {self.max_context} is too small", "use at least 16 (default 4096)")
        if self.max_context > 32768:
            raise BadRequestError(f"max_context {self.max_context} exceeds Qwen2.5's 32768", "use at most 32768")
        if self.prefix_cache_mb < 0:
            raise BadRequestError("prefix_cache_mb must be >= 0 (0 = no prefix cache)")
        if self.spec_ngram_min < 1:
            raise BadRequestError("spec_ngram_min must be >= 1")
        if self.prefill_slice < 0:
            raise BadRequestError("prefill_slice must be >= 0 (0 = whole prompts)")
        if self.max_batch < 1:
            raise BadRequestError("max_batch must be >= 1")
        if self.embed_on_host not in ("auto", "on", "off"):
            raise BadRequestError(f"unknown embed_on_host {self.embed_on_host!r}", "use auto, on or off")
        if self.requantize not in ("none", "w4", "w3"):
            raise BadRequestError(f"unknown requantize {self.requantize!r}", "use none, w4 or w3")
        if self.cpu_weights not in CPU_WEIGHTS:
            raise BadRequestError(f"unknown cpu_weights {self.cpu_weights!r}", f"use one of {', '.join(CPU_WEIGHTS)}")
        if self.gguf_pack not in GGUF_PACKS:
            raise BadRequestError(f"unknown gguf_pack {self.gguf_pack!r}", f"use one of {', '.join(GGUF_PACKS)}")
        if self.gpu_memory_limit_mb < 0:
            raise BadRequestError("gpu_memory_limit_mb must be >= 0 (0 = no limit)")
        if self.device not in ("auto", "cpu", "cuda"):
            raise BadRequestError(f"unknown device {self.device!r}", "use auto, cpu or cuda")

    def context_for(self, model: ModelConfig) -> int:
        """The context a runner starts from for a model: max_context, at most the model's max_position (the memory
        plan may fit it shorter still: fit_context). The runners, the backends' estimates and `deepinfer ask`'s early
        check all take it from here."""
        return min(self.max_context, model.max_position)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def add_gpu_memory_arguments(p):
    """--gpu-memory-limit / --embed-on-host for the commands that load a model (serve, ask, bench)."""
    p.add_argument("--gpu-memory-limit", type=int, default=0, metavar="MB",
                   help="GPU memory DeepInfer may use (0 = whatever is free)")
    p.add_argument("--embed-on-host", default="auto", choices=["auto", "on", "off"],
                   help="keep an untied input embedding in host RAM (auto: when the GPU needs the room)")
    p.add_argument("--requantize", default="none", choices=["none", "w4", "w3"],
                   help="GPU: none runs a GGUF's quantized tensors exactly as they are (default); w4/w3 "
                        "re-quantize to 4/3-bit groups of 128 at load (less memory, lower quality)")
    p.add_argument("--gguf-pack", default=GGUF_PACK, choices=list(GGUF_PACKS),
                   help="GPU: how a GGUF's blocks are repacked: kquant (default: the K-quants' own sub-scales, "
                        "Q4_0/Q5_0/Q8_0 without mins), bytes (5- and 6-bit codes in bytes), 6bit (as 6-bit codes); the "
                        "same weights every way, kquant the fewest bytes per token and the fastest on an H200")
    p.add_argument("--cpu-weights", default=None, choices=list(CPU_WEIGHTS),
                   help="CPU: dense (float32 weights, the reference; the default), int8 (int8 weights per row: ~4x "
                        "fewer bytes per token, ~5x faster decoding, bf16 activations through the linears) or int4 (a "
                        "GGUF's 4-bit linears as their codes, the rest int8: 1.5x int8's decoding from 1.5B up)")


def gpu_memory_kwargs(args) -> dict:
    return {"gpu_memory_limit_mb": getattr(args, "gpu_memory_limit", 0),
            "embed_on_host": getattr(args, "embed_on_host", "auto"), "requantize": getattr(args, "requantize", "none"),
            "gguf_pack": getattr(args, "gguf_pack", GGUF_PACK), "cpu_weights": getattr(args, "cpu_weights", None) or "dense"}
