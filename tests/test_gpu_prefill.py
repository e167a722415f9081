"""GPU prefill (engine/model/gpu_prefill.py, kernels/prefill_*.py) against the CPU references.

CPU tests: chunking, the attention fallback (KV sizing: tests/test_memory_plan.py). GPU tests (@pytest.mark.gpu,
skipped without CUDA; the same checks run in engine/bench/prefill_bench.py on the device): the Triton
W4/W3 linears, flash GQA attention with q_start > 0, the elementwise kernels, and a small random-
weight model on the GPU vs engine.model.qwen2.Qwen2Model on the CPU, prompt in chunks == at once.
Helpers take a device so they can also be run under TRITON_INTERPRET=1 on the CPU.
"""
from __future__ import annotations

import pytest
import torch

from engine.config import ModelConfig
from engine.model.gpu_prefill import attention_prefill, prefill_chunks
from kernels.prefill_reference import attention_reference, linear_reference


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
                for method in ("splitk", "fused", "dequant"):
                    assert rel(linear_prefill(x, w, method), ref) < 3e-3, (bits, bias, T, method)
    from kernels.checks_gguf import rand_layout  # the GGUF layouts through the split-K kernel (short prompts)
    for bits, group, form in ((4, 32, ""), (8, 32, ""), (8, 16, ""), (6, 32, ""), (6, 16, ""), (4, 32, "kq"),
                              (6, 16, "kq"), (4, 32, "sym"), (6, 32, "sym"), (8, 32, "sym")):
        w, wf = rand_layout(256, 512, bits, group, torch.Generator().manual_seed(bits + group), dev, bias=True,
                            form=form)
        x = torch.randn(48, 512, device=dev, generator=g).half()
        ref = x.float() @ wf.t() + w.bias.float()
        assert rel(linear_prefill(x, w, "splitk"), ref) < 3e-3, (bits, group)


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
