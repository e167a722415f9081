"""The CPU path's int8 linears (EngineConfig.cpu_weights "int8", kernels/cpu_int8.py): the kernel against its
reference, each output row independent of the rows beside it (so speculation and the prefix cache keep their tokens),
and the real 0.5B loaded that way: a quarter of the weights' bytes, the right answers, speculative decoding with the
same tokens as plain decoding, the flag through the CLI."""
from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.errors import BadRequestError
from engine.runtime.sampling import SamplingParams
from kernels.cpu_int8 import Int8Linear, available, int8_linear_ref, quantize_rows


def test_int8_linear_is_its_reference_row_by_row():
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(1152, 896, generator=g) * 0.02, torch.randn(1152, generator=g)
    w0 = w.clone()
    w8, s = quantize_rows(w, rows=100)  # row chunks (the last one short) quantize each row alone, w untouched
    assert torch.equal(w, w0) and torch.equal(w8, quantize_rows(w, rows=5000)[0])
    assert w8.dtype == torch.int8 and (w - w8.float() * s[:, None]).abs().le(s[:, None] * (0.5 + 1e-5)).all()
    lin = Int8Linear(w, b)
    x = torch.randn(40, 896, generator=g)
    y = lin(x)
    assert y.dtype == torch.float32 and y.shape == (40, 1152)
    ref = int8_linear_ref(x, lin.w8, lin.scales, b)
    assert float((y - ref).abs().max()) <= float(ref.abs().max()) * 2 ** -8  # within a bf16 rounding of the sum
    # each row's bits do not depend on the rows computed with it: one row at a time gives the same tensor
    assert torch.equal(torch.cat([lin(x[i:i + 1]) for i in range(40)]), y)
    assert torch.equal(lin(x.reshape(5, 8, 896)).reshape(40, 1152), y)
    assert torch.allclose(lin.weight, w, atol=float(s.max()))
    assert available(), "torch has aten._weight_int8pack_mm (else Int8Linear is correct but slow)"


def test_rows_of_an_int8_linear_compute_its_rows_bits():
    """A draft vocabulary's head (engine/runtime/draft_heads.py cpu_head): the kept rows give the full head's bits."""
    g = torch.Generator().manual_seed(1)
    lin = Int8Linear(torch.randn(500, 64, generator=g), torch.randn(500, generator=g))
    rows = torch.tensor([3, 17, 250, 499])
    sub = Int8Linear.rows_of(lin, rows)
    x = torch.randn(2, 64, generator=g)
    assert sub.out_features == 4 and sub.nbytes() < lin.nbytes() / 100
    assert torch.equal(sub(x), lin(x)[:, rows]) and torch.equal(sub.weight, lin.weight[rows])


@pytest.fixture(scope="module")
def int8_llm(spec):
    from engine.runtime.llm import LLM

    return LLM(EngineConfig(device="cpu", max_batch=2, max_context=1024, cpu_weights="int8"), spec=spec)


def test_the_real_model_in_int8_answers_in_a_quarter_of_the_bytes(int8_llm, llm):
    dense = llm.runner.memory()["weights_bytes"]
    small = int8_llm.runner.memory()["weights_bytes"]
    assert small < 0.45 * dense  # the linears and head at 1 byte a weight; the embedding stays in the file
    from engine.formats.chat import render_chat

    ids = int8_llm.tokenizer.encode(render_chat(int8_llm.spec.chat_template,
                                                [{"role": "user", "content": "What is 2+3? Answer with one number."}]))
    out = "".join(d.text for d in int8_llm.stream(ids, SamplingParams(max_tokens=8, temperature=0)))
    assert "5" in out, out


def test_speculation_gives_the_same_tokens_in_int8(int8_llm):
    """Prompt lookup verifies drafts through the multi-token forward: with row-independent int8 linears its greedy
    tokens equal plain decoding's, as in float32."""
    from engine.formats.chat import render_chat

    text = ("The build failed after last night's dependency update. I pinned the old version for now, but we need "
            "to read the changelog and fix the two failing tests before the release.")
    ids = int8_llm.tokenizer.encode(render_chat(int8_llm.spec.chat_template, [
        {"role": "user", "content": "Rewrite this politely, keep every fact:\n\n" + text}]))
    outs = {}
    for spec_on in (False, True):
        p = SamplingParams(max_tokens=48, temperature=0, speculative=spec_on)
        outs[spec_on] = [d.text for d in int8_llm.stream(ids, p)]
    assert "".join(outs[True]) == "".join(outs[False]) and len("".join(outs[False])) > 40


def test_int8_lookup_drafts_long_only_while_a_copy_runs(int8_llm, lookup_drafts):
    """int8 computes 4 rows a pass: prompt lookup drafts at most 3 tokens until a draft kept 3, then up to 7 (an
    8-row step, two passes; 9 rows would take three)."""
    from engine.formats.chat import render_chat

    text = ("Please send the lab report to the supervisor before 3 pm tomorrow and copy the other group members. "
            "The meeting moved to Thursday 10 am in room 301.")
    ids = int8_llm.tokenizer.encode(render_chat(int8_llm.spec.chat_template, [
        {"role": "user", "content": "Rewrite this politely, keep every fact:\n\n" + text}]))
    out = "".join(d.text for d in int8_llm.stream(ids, SamplingParams(max_tokens=48, temperature=0, speculative=True)))
    drafts, r = lookup_drafts, int8_llm.runner
    assert out and (r.cheap_draft, r.long_draft) == (3, 7)
    assert drafts and drafts[0] <= 3 and 3 < max(drafts) <= 7, drafts


def test_the_flag_reaches_the_config():
    import argparse

    from engine.server.cli import add_arguments, build_config

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert build_config(p.parse_args([])).cpu_weights == "dense"
    assert build_config(p.parse_args(["--cpu-weights", "int8"])).cpu_weights == "int8"
    with pytest.raises(BadRequestError, match="cpu_weights"):
        EngineConfig(cpu_weights="int2")


def test_a_checkpoint_in_int8_gives_the_dense_logits_closely(tmp_path):
    """A DeepInfer checkpoint (W4 here) on the CPU in int8: its linears load in bf16 and turn int8 layer by layer
    (Qwen2Model.quantize_int8), the tied head gets an int8 copy; the logits stay close to the dense path's."""
    from engine.config import ModelConfig
    from engine.formats.checkpoint import read_checkpoint
    from engine.quant.make_random import make_random
    from engine.runtime.cpu_runner import CPURunner
    from kernels.cpu_int8 import Int8Linear

    cfg = ModelConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4,
                      num_kv_heads=2, tie_word_embeddings=True)
    make_random(cfg, "w4", tmp_path / "ck", seed=3)
    spec = read_checkpoint(tmp_path / "ck")
    runs = {cw: CPURunner(spec, EngineConfig(model=str(tmp_path / "ck"), device="cpu", max_batch=1,
                                             max_context=64, cpu_weights=cw)) for cw in ("dense", "int8")}
    m = runs["int8"].model
    assert isinstance(m.layers[1].mlp.down_proj, Int8Linear) and isinstance(m.tied_head, Int8Linear)
    ids = list(range(5, 25))
    a, b = (runs[cw].logits(ids) for cw in ("dense", "int8"))
    assert float((a - b).norm() / a.norm()) < 0.05


def test_the_int8_load_leaves_a_ggufs_embedding_in_the_file(int8_llm, spec):
    """engine/formats/gguf_rows.py: the quantized embedding stays in the mapped model file; its rows, decoded per
    lookup, are the float32 table's bits (a tied head's int8 copy from them: tests/test_cpu_int4.py)."""
    from engine.formats.gguf_rows import MappedRows
    from engine.model.layout import EMBED

    m = int8_llm.runner.model
    assert isinstance(m.embed_map, MappedRows) and m.embed_tokens.weight.numel() == 0
    mem = int8_llm.runner.memory()
    assert mem["embedding_in_file_bytes"] == spec.gguf_tensors[EMBED].n_bytes
    assert mem["weights_bytes"] < 0.55e9  # the table was ~0.54 GB of float32 here
    table = torch.from_numpy(spec.gguf_tensors[EMBED].dequantize()[:4096])
    ids = torch.tensor([[5, 4095, 17], [0, 1, 2048]])
    assert torch.equal(m.embed_map.rows(ids), table[ids])
    assert torch.equal(m.embed_map[77], table[77]) and torch.equal(m.embed_map[10:20], table[10:20])
