"""GPU prefill building blocks: quantized linears, causal GQA attention for a prompt chunk, chunking.

Used by engine/runtime/gpu_runner.py. Every function has a CPU reference (kernels/prefill_reference.py) and
is checked against it by engine/bench/prefill_bench.py and tests/test_gpu_prefill.py.

linear_prefill   x fp16 [T, K] @ W.T (+ b) for a QWeight (W4/W3/W8 packed or fp16). Three kernels:
                 "splitk"  Triton dequant-in-GEMM with K split over the grid (reads each weight once; short
                           prompts, where the weight read is the cost);
                 "fused"   the same without the split (measured slower everywhere; kept as an alternative);
                 "dequant" Triton dequant into a reused fp16 scratch + cuBLAS (best for long chunks).
                 The choice is one visible rule on T (SPLITK_MAX_T, FUSED_MAX_T; measured: docs/prefill.md).
attention_prefill  flash attention, causal with the diagonal at the bottom-right (query t sits at
                 position q_start + t and sees keys 0..q_start+t), GQA without repeating K/V.
prefill_chunks   split a prompt so activation memory never exceeds a fixed budget.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.config import PREFILL_CHUNK, ModelConfig  # PREFILL_CHUNK: tokens per forward, the engine's
from kernels.prefill_torch import linear_torch
from kernels.triton_check import prefill_backend

FUSED_MAX_T = 0  # T <= this: fused dequant-GEMM; above: dequant scratch + cuBLAS (measured: cuBLAS wins, docs/prefill.md)
# T <= this, for a group-128 weight (our W4/W3) of at least SPLITK_MIN_WEIGHTS: the split-K fused kernel
# (kernels/prefill_triton.py fused_splitk: weights read once, K spread over the grid, partials in the scratch); else
# dequant + cuBLAS. Measured per linear on the H200 at 48 tokens (docs/results/splitk_h200.json, docs/prefill.md): 3B
# gate_up 51 vs 68 us, down 26 vs 32, 7B gate_up 132 vs 205, down 82 vs 109; the small qkv / o (3B 12.1 vs 10.9 us)
# and the GGUF groups of 32 (0.5B / 1.5B Q4_K_M whole prefill 0.81-0.89x at 48-64 tokens) stay on cuBLAS.
SPLITK_MAX_T = 64
SPLITK_MIN_WEIGHTS = 1 << 24
SCRATCH_BYTES = 64 << 20  # fp16 dequant scratch; larger weights are done in row blocks of this size

_scratch: dict[torch.device, torch.Tensor] = {}
_flash_gqa: dict[torch.device, bool] = {}
_sm_count: dict[torch.device, int] = {}


def scratch_buffer(device) -> torch.Tensor:
    """The per-device fp16 scratch of SCRATCH_BYTES (the dequant's W, the split-K partials), allocated whole on first
    use: a buffer grown later would free the one that CUDA graphs captured earlier still write. Allocate it before
    CUDA-graph capture: call once eagerly."""
    device = torch.device(device)
    buf = _scratch.get(device)
    if buf is None:
        buf = _scratch[device] = torch.empty(SCRATCH_BYTES // 2, dtype=torch.float16, device=device)
    return buf


def linear_prefill(x: torch.Tensor, w, method: str | None = None) -> torch.Tensor:
    """x fp16 [T, K] (cuda) -> fp16 [T, N]; w an kernels.qweight.QWeight; bias added if w.bias.
    Dense or packed is the weight's kind (QWeight.kind): this table is the one place that tells them apart."""
    return _LINEAR[w.kind](x, w, method)


def _dense(x: torch.Tensor, w, method: str | None = None) -> torch.Tensor:
    return F.linear(x, w.weight, w.bias)


def _packed(x: torch.Tensor, w, method: str | None = None) -> torch.Tensor:
    if prefill_backend(x.is_cuda, x.device) != "triton":  # no working Triton (kernels/triton_check.py)
        return linear_torch(x, w)
    T = x.shape[0]
    if method is None:
        big = w.group == 128 and w.N * w.K >= SPLITK_MIN_WEIGHTS
        method = "splitk" if T <= SPLITK_MAX_T and big else "fused" if T <= FUSED_MAX_T else "dequant"
    if method == "splitk":
        part = scratch_buffer(x.device).view(torch.float32)
        if T * w.N <= part.numel():  # one split's partials fit (always, for T <= 64 on Qwen2.5 shapes)
            from kernels.prefill_triton import fused_splitk  # optional: Triton (GPU only)
            return fused_splitk(x if x.stride(1) == 1 else x.contiguous(), w, part, sms=_sms(x.device))
        method = "dequant"
    if method == "fused":
        from kernels.prefill_triton import fused_linear  # optional: Triton (GPU only)
        return fused_linear(x if x.stride(1) == 1 else x.contiguous(), w)
    return _dequant_matmul(x, w)


def _sms(device) -> int:
    device = torch.device(device)
    if device not in _sm_count:
        _sm_count[device] = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8
    return _sm_count[device]


def _dequant_matmul(x: torch.Tensor, w) -> torch.Tensor:
    from kernels.prefill_triton import dequant_into  # optional: Triton (GPU only)
    buf = scratch_buffer(x.device)
    rows = min(w.N, max(128, buf.numel() // w.K // 128 * 128))
    if rows >= w.N:  # the whole weight fits the scratch: one dequant, one GEMM
        wt = dequant_into(w, buf)
        return torch.addmm(w.bias, x, wt.t()) if w.bias is not None else torch.matmul(x, wt.t())
    y = torch.empty(x.shape[0], w.N, dtype=torch.float16, device=x.device)
    for r0 in range(0, w.N, rows):
        r = min(rows, w.N - r0)
        wt = dequant_into(w, buf, r0, r)
        part = torch.matmul(x, wt.t())
        if w.bias is not None:
            part += w.bias[r0:r0 + r]
        y[:, r0:r0 + r] = part
    return y


_LINEAR = {"dense": _dense, "packed": _packed}


def attention_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int) -> torch.Tensor:
    """Causal GQA attention of a prompt chunk.

    q fp16 [T, H, hd]; k, v fp16 [Hkv, L, hd] with L = q_start + T (a view of the cache is fine:
    only the last dim must be contiguous) -> fp16 [T, H*hd].
    """
    T, H, hd = q.shape
    Hkv, L, _ = k.shape
    if L != q_start + T:
        raise ValueError(f"k holds {L} positions, expected q_start + T = {q_start + T}")
    qh, kh, vh = q.transpose(0, 1).unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)  # [1, heads, len, hd]
    if T == 1:  # the last position sees every key: no mask
        out = F.scaled_dot_product_attention(qh, kh, vh, enable_gqa=H != Hkv)
    elif q.is_cuda and _flash_ok(q.device):
        # aten's flash op: causal means bottom-right aligned (query T-1 sees key L-1), and it takes
        # fewer K/V heads than Q heads natively (GQA). F.sdpa(is_causal=True) would be top-left.
        out = torch.ops.aten._scaled_dot_product_flash_attention(qh, kh, vh, 0.0, True, False,
                                                                  scale=hd ** -0.5)[0]
    else:
        out = _attention_masked(qh, kh, vh, q_start)
    return out[0].transpose(0, 1).reshape(T, H * hd)


def _attention_masked(qh, kh, vh, q_start: int) -> torch.Tensor:
    """Fallback (CPU, pre-Ampere): explicit bottom-right causal mask, K/V heads repeated."""
    T, L = qh.shape[2], kh.shape[2]
    rep = qh.shape[1] // kh.shape[1]
    if rep > 1:
        kh, vh = kh.repeat_interleave(rep, 1), vh.repeat_interleave(rep, 1)
    pos = torch.arange(L, device=qh.device)
    mask = pos[None, :] <= (q_start + torch.arange(T, device=qh.device))[:, None]  # True = may attend
    return F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)


def _flash_ok(device) -> bool:
    """Probe once per device: the flash op exists (sm_80+) and handles GQA + bottom-right causal."""
    if device not in _flash_gqa:
        ok = False
        try:
            g = torch.Generator(device=device).manual_seed(0)
            qh = torch.randn(1, 4, 8, 64, device=device, dtype=torch.float16, generator=g)
            kh = torch.randn(1, 2, 24, 64, device=device, dtype=torch.float16, generator=g)
            vh = torch.randn(1, 2, 24, 64, device=device, dtype=torch.float16, generator=g)
            got = torch.ops.aten._scaled_dot_product_flash_attention(qh, kh, vh, 0.0, True, False,
                                                                     scale=64 ** -0.5)[0]
            ref = _attention_masked(qh.float(), kh.float(), vh.float(), 16)
            ok = bool((got.float() - ref).abs().max() < 1e-2)
        except RuntimeError:
            ok = False
        _flash_gqa[device] = ok
    return _flash_gqa[device]


def prefill_chunks(n_tokens: int, budget: int = PREFILL_CHUNK) -> list[slice]:
    """Token slices of at most `budget` tokens covering 0..n_tokens in order (budget: tokens per forward;
    chunk_budget() turns a byte budget into one). Chunk i attends to the cache of chunks 0..i-1."""
    if budget < 1:
        raise ValueError("budget must be at least one token")
    return [slice(s, min(s + budget, n_tokens)) for s in range(0, n_tokens, budget)]


def prefill_activation_bytes(cfg: ModelConfig, T: int) -> int:
    """Peak transient bytes of one prefill forward of T tokens (fp16), layer outputs freed as we go:
    residual + normed + attention out (3 x hidden), qkv, gate_up + its activation (3 x ffn),
    flash softmax stats (H fp32), plus the dequant scratch when T > FUSED_MAX_T."""
    per_tok = 2 * (3 * cfg.hidden_size + cfg.q_size + 2 * cfg.kv_size + 3 * cfg.intermediate_size) \
        + 4 * cfg.num_heads
    return T * per_tok + (SCRATCH_BYTES if T > FUSED_MAX_T else 0)


def chunk_budget(cfg: ModelConfig, budget_bytes: int) -> int:
    """Largest token count (a multiple of 64, at least 64) whose prefill activations fit budget_bytes."""
    t = PREFILL_CHUNK
    while t > 64 and prefill_activation_bytes(cfg, t) > budget_bytes:
        t -= 64
    return t
