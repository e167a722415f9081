"""GPU prefill (engine/model/gpu_prefill.py, kernels/prefill_*.py) against the CPU references.

CPU tests: chunking, KV sizing and its error, the attention fallback. GPU tests (@pytest.mark.gpu,
skipped without CUDA; the same checks run in engine/bench/prefill_bench.py on the device): the Triton
W4/W3 linears, flash GQA attention with q_start > 0, the elementwise kernels, and a small random-
weight model on the GPU vs engine.model.qwen2.Qwen2Model on the CPU, prompt in chunks == at once.
Helpers take a device so they can also be run under TRITON_INTERPRET=1 on the CPU.
"""
from __future__ import annotations

import pytest
import torch

from engine.config import QWEN25_SHAPES, ModelConfig
from engine.errors import ResourceError
from engine.model.gpu_prefill import attention_prefill, prefill_activation_bytes, prefill_chunks
from engine.runtime.kv_budget import kv_bytes_per_token, max_context_that_fits, plan_kv_cache
from kernels.prefill_reference import attention_reference, linear_reference

GIB = 1 << 30


def rel(a, b) -> float:
    a, b = a.float().cpu(), b.float().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


# --- CPU ------------------------------------------------------------------------------------
def test_prefill_chunks_cover_prompt_in_order():
    for n, budget in ((1, 512), (512, 512), (513, 512), (5000, 1024)):
        sl = prefill_chunks(n, budget)
        assert sl[0].start == 0 and sl[-1].stop == n
        assert all(a.stop == b.start for a, b in zip(sl, sl[1:]))
        assert all(0 < s.stop - s.start <= budget for s in sl)
    assert prefill_chunks(0, 8) == []
    with pytest.raises(ValueError):
        prefill_chunks(10, 0)


def test_kv_sizing_3b_fits_4096_and_explains_32k_on_small_budget():
    cfg = ModelConfig(**QWEN25_SHAPES["3b"])
    assert kv_bytes_per_token(cfg) == 36 * 1024  # 2 * 36 layers * 2 kv heads * 128 * fp16
    plan = plan_kv_cache(cfg, 1 * GIB, 4096, 1, prefill_chunk=1024)
    assert plan.kv_bytes == 4096 * 36 * 1024 and plan.free_after > 0
    with pytest.raises(ResourceError) as e:
        plan_kv_cache(cfg, 1 * GIB, 32768, 1, prefill_chunk=1024)
    fit = max_context_that_fits(cfg, 1 * GIB, 1, prefill_chunk=1024)
    assert f"--max-context {fit}" in str(e.value) and 16384 < fit < 32768
    plan_kv_cache(cfg, 1 * GIB, fit, 1, prefill_chunk=1024)  # the suggested value really fits
    with pytest.raises(ResourceError):
        plan_kv_cache(cfg, 64 * GIB, 40000, 1)  # beyond the model's positions
    assert prefill_activation_bytes(cfg, 1024) < 192 << 20  # 1,024-token chunk + 64 MiB scratch


def test_attention_fallback_matches_reference_with_q_start():
    g = torch.Generator().manual_seed(0)
    for T, qs, H, Hkv in ((7, 0, 4, 2), (5, 11, 4, 1), (1, 20, 6, 2)):
        q = torch.randn(T, H, 64, generator=g)
        k, v = torch.randn(2, Hkv, qs + T + 3, 64, generator=g)  # views of a longer cache
        out = attention_prefill(q, k[:, :qs + T], v[:, :qs + T], qs)
        assert rel(out, attention_reference(q, k[:, :qs + T], v[:, :qs + T], qs)) < 1e-5


# --- GPU ------------------------------------------------------------------------------------
def check_linears(dev):
    from engine.model.gpu_prefill import linear_prefill
    from engine.bench.prefill_model import random_qweight
    g = torch.Generator(device=dev).manual_seed(1)
    for bits in (4, 3):
        for bias in (True, False):
            w = random_qweight(384, 512, bits, bias, dev, g)
            for T in (1, 48, 300):
                x = torch.randn(T, 512, device=dev, generator=g).half()
                ref = linear_reference(x, w)
                for method in ("fused", "dequant"):
                    assert rel(linear_prefill(x, w, method), ref) < 3e-3, (bits, bias, T, method)


def check_attention(dev):
    g = torch.Generator(device=dev).manual_seed(2)
    for T, qs in ((48, 0), (100, 900), (1, 3000)):
        q = torch.randn(T, 16, 128, device=dev, generator=g).half()
        k, v = torch.randn(2, 2, qs + T + 5, 128, device=dev, generator=g).half()
        out = attention_prefill(q, k[:, :qs + T], v[:, :qs + T], qs)
        assert rel(out, attention_reference(q, k[:, :qs + T], v[:, :qs + T], qs)) < 3e-3, (T, qs)


def check_model_vs_cpu_and_chunked(dev):
    from engine.model.qwen2 import KVCache
    from engine.bench.prefill_model import GPUModel
    cfg = ModelConfig(vocab_size=1000, hidden_size=256, intermediate_size=512, num_layers=2,
                      num_heads=4, num_kv_heads=2)
    m = GPUModel(cfg, 4, 256, device=dev, seed=3)
    T = 40
    ids = torch.randint(0, 1000, (T,))
    once = m.forward(ids.to(dev), 0)
    k_once = m.k[:, :, :T].clone()
    cpu_cache = KVCache(cfg, 1, 256)
    ref = m.to_cpu_model(256)(ids.unsqueeze(0), cpu_cache, [0], [0])[0]
    assert rel(once, ref) < 1e-2 and int(once.argmax()) == int(ref.argmax())
    assert rel(k_once, cpu_cache.k[:, 0, :, :T]) < 1e-2 and rel(m.v[:, :, :T], cpu_cache.v[:, 0, :, :T]) < 1e-2
    m.k.zero_(), m.v.zero_()
    for sl in prefill_chunks(T, 16):
        last = m.forward(ids[sl].to(dev), sl.start)
    assert rel(last, once) < 5e-3 and rel(m.k[:, :, :T], k_once) < 5e-3


@pytest.mark.gpu
def test_gpu_linears_match_reference():
    check_linears("cuda")


@pytest.mark.gpu
def test_gpu_attention_matches_reference():
    check_attention("cuda")


@pytest.mark.gpu
def test_gpu_model_prefill_matches_cpu_and_chunked_equals_once():
    check_model_vs_cpu_and_chunked("cuda")
