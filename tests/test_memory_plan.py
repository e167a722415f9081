"""engine/runtime/memory_plan.py: the one place byte counts come from (loader, doctor, gateway, quant table).

CPU only: the counts are arithmetic on the model's shape; the loader's real bytes come from loading a small
random checkpoint onto the CPU. The GPU plans themselves (host embedding, lean, fit-context) are checked
on the 4 GB card's numbers in tests/test_host_embed.py.
"""
from __future__ import annotations

import pytest

from engine import config
from engine.config import QWEN25_SHAPES, EngineConfig, ModelConfig
from engine.errors import BadRequestError, ResourceError
from engine.formats.load import load_spec
from engine.model import gpu_model, gpu_prefill, gpu_prefill_graph
from engine.model.gpu_load import load_checkpoint
from engine.quant.make_random import make_random
from engine.quant.scheme import embed_bits, linear_bits
from engine.runtime import cpu_runner, memory_plan
from engine.runtime.memory_plan import GIB, MemoryPlan, check_budget, kv_bytes_per_token
from kernels import pack

SMALL = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4, num_kv_heads=2)


def test_one_prefill_chunk_and_group_everywhere():
    assert gpu_model.PREFILL_CHUNK is config.PREFILL_CHUNK is gpu_prefill.PREFILL_CHUNK is cpu_runner.PREFILL_CHUNK
    assert memory_plan.PREFILL_CHUNK == config.PREFILL_CHUNK == 2048  # what GPUModel has always run
    assert memory_plan.GROUP == pack.GROUP


@pytest.mark.parametrize("scheme,tied", [("w4", True), ("mixed", False), ("w3", False)])
def test_weight_count_is_what_the_loader_holds(tmp_path, scheme, tied):
    cfg = ModelConfig(**SMALL, tie_word_embeddings=tied)
    make_random(cfg, scheme, tmp_path, seed=1)
    held = load_checkpoint(load_spec(str(tmp_path)).checkpoint, "cpu")
    parts = memory_plan.weight_parts(cfg, lambda m, i: linear_bits(scheme, m, i, cfg.num_layers),
                                     embed_bits(scheme))
    assert sum(parts.values()) == held.nbytes()
    if scheme == "w4":
        assert memory_plan.weight_bytes(cfg, 4) == held.nbytes()


def test_kv_sizing_3b_fits_4096_and_explains_32k_on_small_budget():
    """3B, 1.5 GiB free after the weights, 132 SMs: 4096 tokens fit, 32k does not and the error names the
    longest context that does (which then really fits)."""
    cfg = ModelConfig(**QWEN25_SHAPES["3b"])
    assert kv_bytes_per_token(cfg) == 36 * 1024  # 2 * 36 layers * 2 kv heads * 128 * fp16
    info = (int(1.5 * GIB), 4 * GIB)
    b = check_budget(cfg, 0, 4096, 1, info, 132)
    assert b.kv == 4096 * 36 * 1024 and b.need <= b.free
    with pytest.raises(ResourceError) as e:
        check_budget(cfg, 0, 32768, 1, info, 132)
    work = memory_plan.work_bytes(cfg, 32768, 1, 132)
    fit = memory_plan.context_that_fits(cfg, info[0] - work, 1)
    assert f"--max-context {fit}" in str(e.value) and 16384 < fit < 32768
    check_budget(cfg, 0, fit, 1, info, 132)  # the suggested value really fits
    with pytest.raises(BadRequestError):
        EngineConfig(max_context=40000)  # beyond the model's positions
    assert gpu_prefill.prefill_activation_bytes(cfg, 1024) < 192 << 20  # 1,024-token chunk + 64 MiB scratch


def test_working_memory_counts_chunk_graphs_and_staging():
    cfg = ModelConfig(**QWEN25_SHAPES["7b"])
    full = memory_plan.work_bytes(cfg, 4096, 1)
    lean = memory_plan.work_bytes(cfg, 4096, 1, plan=MemoryPlan(False, **memory_plan.LEAN))
    pa, graphs = gpu_prefill.prefill_activation_bytes, gpu_prefill_graph.graph_bytes
    assert full - lean == pa(cfg, 2048) - pa(cfg, 256) + graphs(cfg, 4096) > 0  # one chunk less, no graphs
    host = memory_plan.work_bytes(cfg, 4096, 1, plan=MemoryPlan(True))
    assert host - full == 2048 * cfg.hidden_size * 4  # fp32 staging rows of one prefill chunk


def test_estimates_are_the_plans_numbers():
    cfg = ModelConfig(**QWEN25_SHAPES["7b"])
    w = memory_plan.weight_bytes(cfg, 4)
    assert memory_plan.gpu_estimate(cfg, w) == check_budget(cfg, w, 4096, 1, (64 * GIB, 64 * GIB), 132).need
    lin, emb = memory_plan.param_counts(cfg)
    assert memory_plan.cpu_estimate(cfg) == (lin + emb) * 4 + 2 * 28 * 4 * 128 * 4096 * 4 + (300 << 20)
