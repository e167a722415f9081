"""The embedding in host RAM (engine/model/host_embed.py, 7B on a 4 GB card): rows equal the embed kernel's
reference for 4-bit, 3-bit and fp16; the whole GPU step on the CPU references gives the same logits and
tokens with the embedding staged from host RAM as with it on the device (and on a GPU, in CUDA graphs); a tied
model refuses; the memory plans on a 4 GB card's numbers."""
import re

import pytest
import torch

from engine.config import ModelConfig


def _cfg(tied: bool) -> ModelConfig:
    return ModelConfig(vocab_size=1024, hidden_size=256, intermediate_size=384, num_layers=2, num_heads=4,
                       num_kv_heads=2, tie_word_embeddings=tied)


def test_rows_match_the_embed_reference():
    from engine.model.gpu_load import quantize_linear
    from engine.model.host_embed import HostEmbedding
    from kernels.decode_reference import embed_ref

    w = torch.randn(304, 256) * 0.05
    ids = [0, 299, 5, 5, 17]
    for bits in (4, 3, 16):
        q = quantize_linear(w, bits)
        got = HostEmbedding(q).rows(ids)
        ref = embed_ref(torch.tensor(ids), q) if bits != 16 else q.weight[ids].float()
        assert torch.equal(got, ref), bits


def test_step_with_host_embedding_equals_device_embedding(tmp_path):
    from engine.model.gpu_load import load_checkpoint
    from engine.model.gpu_model import GPUModel
    from engine.quant.make_random import make_random
    from engine.formats.load import load_spec

    make_random(_cfg(False), "w4", tmp_path, seed=3)
    ck = load_spec(str(tmp_path)).checkpoint
    a = GPUModel(load_checkpoint(ck, "cpu"), 2, 64, "cpu")
    wb = load_checkpoint(ck, "cpu", embed_on_host=True)
    assert wb.embed is None and wb.host_embed is not None
    b = GPUModel(wb, 2, 64, "cpu")
    assert b.memory()["embedding_in_host_ram_bytes"] > 0
    b.warmup(2)  # the load-time warm-up writes scratch K/V: nothing of it may reach a real sequence
    prompt = list(range(100, 113))
    la, lb = a.prefill(prompt, 0, 0), b.prefill(prompt, 0, 0)
    assert torch.equal(la, lb)
    ta = tb = int(la.argmax())
    for i in range(4):  # batch of 2: a second sequence in slot 1 with its own rows
        ia, xa = a.decode([ta, 9], [len(prompt) + i, i], [0, 1])
        ib, xb = b.decode([tb, 9], [len(prompt) + i, i], [0, 1])
        assert ia == ib and torch.equal(xa, xb)
        ta, tb = ia[0], ib[0]


def test_tied_embedding_cannot_leave_the_gpu(tmp_path):
    from engine.model.gpu_load import load_checkpoint
    from engine.quant.make_random import make_random
    from engine.formats.load import load_spec

    make_random(_cfg(True), "w4", tmp_path, seed=3)
    with pytest.raises(ValueError, match="tied"):
        load_checkpoint(load_spec(str(tmp_path)).checkpoint, "cpu", embed_on_host=True)


def _plan(shape, bits, mode="auto", limit_mb=0, free_gib=3.237, total_gib=4.0, ctx=4096, batch=1):
    from engine.config import QWEN25_SHAPES, EngineConfig
    from engine.runtime.memory_plan import embed_bytes, plan_memory, weight_bytes

    mc = ModelConfig(**QWEN25_SHAPES[shape])
    cfg = EngineConfig(max_context=ctx, max_batch=batch, embed_on_host=mode, gpu_memory_limit_mb=limit_mb)
    G = 1 << 30
    return plan_memory(mc, cfg, weight_bytes(mc, bits), embed_bytes(mc, bits), ctx,
                       mem_info=(int(free_gib * G), int(total_gib * G)), sms=20)


def test_memory_plan_moves_the_embedding_only_when_the_gpu_needs_it():
    """Driver numbers of an RTX 3050 4 GB laptop card with a desktop running: 3.237 GiB free (what the seed
    measured, engine/quant/budget.py USABLE_4GB), 20 SMs."""
    from engine.errors import BadRequestError, ResourceError

    from engine.runtime.memory_plan import LEAN, MemoryPlan

    b, plan = _plan("7b", 3)  # 7B 3-bit: needs the embedding in host RAM and the lean prefill plan
    assert plan == MemoryPlan(True, **LEAN) and b.need <= b.free
    assert _plan("7b", 3, ctx=512)[1] == MemoryPlan(True)  # a short cache: the full prefill plan
    with pytest.raises(ResourceError):  # the embedding may not move: over the budget even when lean
        _plan("7b", 3, mode="off")
    assert _plan("3b", 4)[1] == MemoryPlan()  # fits as is (and tied: it could not move anyway)
    assert _plan("3b", 4, free_gib=2.1)[1] == MemoryPlan(False, **LEAN)  # little room: lean, all on the GPU
    assert _plan("7b", 3, mode="on", free_gib=8)[1] == MemoryPlan(True)
    with pytest.raises(BadRequestError, match="tied"):
        _plan("3b", 4, mode="on")
    with pytest.raises(ResourceError) as e:  # 7B 4-bit does not fit 4 GB whatever the plan
        _plan("7b", 4)
    # the numbers (4.02-4.03 GiB: the weights and cache, plus the decode scratch) and the way out
    assert re.search(r"needs 4\.0[0-9] GiB", str(e.value)) and "3-bit scheme" in str(e.value)
    # an H200 told to stay under 3.237 GiB plans like the small card
    b, plan = _plan("7b", 3, limit_mb=3315, free_gib=139, total_gib=140)
    assert plan == MemoryPlan(True, **LEAN) and b.free == 3315 << 20


def test_fit_context_shrinks_instead_of_refusing():
    """The tray starts the engine with fit_context: 7B W3 at 4096 tokens does not fit the 4 GB card's budget,
    the longest context that does is used (and /health reports it)."""
    from engine.config import QWEN25_SHAPES, EngineConfig
    from engine.errors import ResourceError
    from engine.runtime.memory_plan import embed_bytes, plan_fitting_context, weight_bytes

    mc = ModelConfig(**QWEN25_SHAPES["7b"])
    args = (mc, weight_bytes(mc, 3), embed_bytes(mc, 3), 4096)
    info = dict(mem_info=(int(3.237 * (1 << 30)), 4 << 30), sms=20)
    with pytest.raises(ResourceError):
        plan_fitting_context(args[0], EngineConfig(max_context=4096), *args[1:], **info)
    b, plan, ctx = plan_fitting_context(args[0], EngineConfig(max_context=4096, fit_context=True), *args[1:], **info)
    assert 512 <= ctx < 4096 and ctx % 256 == 0 and b.need <= b.free and plan.embed_on_host
    with pytest.raises(ResourceError):  # a 7B W4 fits no context at all: still a clear refusal
        plan_fitting_context(mc, EngineConfig(max_context=4096, fit_context=True), weight_bytes(mc, 4),
                             embed_bytes(mc, 4), 4096, **info)


@pytest.mark.gpu
def test_host_embedding_on_the_gpu_equals_the_embed_kernel():
    """On the device, in CUDA graphs: a 7B-shape model (4 layers, random W4) gives the same prefill logits and
    the same 16 greedy decode steps (batch 1, then 3) with the embedding staged from host RAM as with the
    embed_rows kernel. (Was engine/bench/host_embed_check.py: docs/results/host_embed_check_h200.txt.)"""
    import dataclasses

    from engine.config import QWEN25_SHAPES
    from engine.model.gpu_load import random_weights
    from engine.model.gpu_model import GPUModel

    def run(embed_on_host: bool):
        cfg = dataclasses.replace(ModelConfig(**QWEN25_SHAPES["7b"]), num_layers=4)
        m = GPUModel(random_weights(cfg, 4, torch.device("cuda"), seed=5, embed_on_host=embed_on_host), 4, 1024)
        logits, toks, lens = [], [], [48, 300, 7]
        for s, n in enumerate(lens):
            lg = m.prefill(list(range(1000 + s, 1000 + s + n)), s, 0)
            logits.append(lg.float().cpu())
            toks.append([int(lg.argmax())])
        for i in range(16):
            B = 1 if i < 8 else 3
            ids, lg = m.decode([t[-1] for t in toks[:B]], [n + i for n in lens[:B]], list(range(B)))
            for b in range(B):
                toks[b].append(ids[b])
            logits.append(lg[:B].float().cpu())
        return logits, toks

    dev_logits, dev_toks = run(False)
    host_logits, host_toks = run(True)
    assert host_toks == dev_toks
    assert max(float((x - y).norm() / y.norm()) for x, y in zip(host_logits, dev_logits)) < 1e-5
