"""A second CPU runner of the same model file takes the first one's weights (engine/runtime/shared_weights.py): the
same tensors, the same answers, in a fraction of the load; replaced weights and other dtypes never share, and a
runner that writes into its weights (engine/quant's tools) gets a copy of its own."""
from __future__ import annotations

import dataclasses
import gc
import time

import torch

from engine.config import EngineConfig
from engine.runtime import shared_weights
from engine.runtime.llm import LLM
from engine.runtime.sampling import SamplingParams

MODEL = "qwen2.5-coder-0.5b"
GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


def _ptrs(llm):
    return {n: p.data_ptr() for n, p in llm.runner.model.named_parameters()}


def test_second_runner_shares_the_tensors_and_answers_alike(llm):
    t0 = time.perf_counter()
    other = LLM(EngineConfig(model=MODEL, device="cpu", max_context=512, max_batch=1))
    load = time.perf_counter() - t0
    assert _ptrs(other) == _ptrs(llm)  # every parameter the same storage: no second copy of the weights
    assert other.runner.weights_kind == llm.runner.weights_kind == "float32"
    msgs = [{"role": "user", "content": "Name three primary colors."}]
    assert other.chat(msgs, GREEDY).token_ids == llm.chat(msgs, GREEDY).token_ids
    # a load from the file takes ~12 s on a 2-core machine (dequantization + copies); a shared one ~1-2 s
    assert load < 8, load


def test_replaced_weights_and_other_dtypes_do_not_share(spec):
    assert shared_weights.key(spec, torch.float32) is not None
    swapped = dataclasses.replace(spec, weights=lambda: iter(()))
    assert shared_weights.key(swapped, torch.float32) is None  # a spec whose weights were replaced loads on its own
    assert shared_weights.key(spec, torch.float32) != shared_weights.key(spec, torch.bfloat16)


def test_private_weights_copies_what_another_runner_holds(llm):
    other = LLM(EngineConfig(model=MODEL, device="cpu", max_context=256, max_batch=1, draft_heads=""))
    before = _ptrs(llm)
    assert _ptrs(other) == before
    other.runner.private_weights()  # what engine/quant's tools do before writing into the weights
    mine = dict(other.runner.model.named_parameters())
    assert all(p.data_ptr() != before[n] for n, p in mine.items())
    w = mine["layers.0.mlp.down_proj.weight"]
    w.data.mul_(0.5)  # a write into the private copy leaves the shared runner's weights alone
    ref = dict(llm.runner.model.named_parameters())["layers.0.mlp.down_proj.weight"]
    assert not torch.equal(w, ref) and torch.equal(w * 2, ref)
    del other, mine, w
    gc.collect()
