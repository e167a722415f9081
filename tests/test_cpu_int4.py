"""The CPU path's 4-bit linears (EngineConfig.cpu_weights "int4", kernels/cpu_int4.py, engine/formats/gguf_int4.py):
the packing is the kernel's, the kernel is its reference row by row (so speculation keeps its tokens), a GGUF's 4-bit
tensors keep the file's weights within the bf16 rounding of a scale and a zero, and a model file loads with int4
exactly where its linears are 4-bit (int8 elsewhere), answering as the float32 path does."""
from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig, ModelConfig
from engine.errors import BadRequestError
from kernels import cpu_int4
from kernels.cpu_int4 import Int4Linear, int4_linear_ref

needs_kernel = pytest.mark.skipif(not cpu_int4.available(), reason="this torch has no int4 CPU kernel")


def _codes(n: int, k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    a = torch.rand(n, k // 32, generator=g) * 0.01 + 1e-3
    c = -torch.rand(n, k // 32, generator=g) * 0.08
    return q, a, c, g


@needs_kernel
def test_pack_is_the_kernels_layout_and_unpacks():
    q, *_ = _codes(192, 256)
    assert torch.equal(cpu_int4.pack(q), torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.int(), 1))
    assert torch.equal(cpu_int4.unpack(cpu_int4.pack(q)), q)
    # 64-row blocks are independent: packing a fused linear's parts one by one is packing the whole
    assert torch.equal(torch.cat([cpu_int4.pack(q[:64]), cpu_int4.pack(q[64:])]), cpu_int4.pack(q))
    # on this CPU (AVX-512): block b of 64 rows is K x 32 bytes, byte [k, j] = row j | row 32 + j << 4
    if torch.backends.cpu.get_cpu_capability() == "AVX512":
        b = cpu_int4.pack(q)[:64].reshape(256, 32)
        assert torch.equal(b, (q[:32].T | (q[32:64].T << 4)).to(torch.uint8))


def _avx2_pack(w: torch.Tensor, _tiles: int) -> torch.Tensor:
    """torch's int4mm_kernel.cpp packing on an AVX2 CPU (blocks of 32 rows: byte [k, d] = row d | row d + 16 << 4)."""
    N, K = w.shape
    out = torch.empty(N // 32, K, 16, dtype=torch.uint8)
    for b in range(N // 32):
        s = w[32 * b:32 * b + 32]
        out[b] = (s[:16].T | (s[16:].T << 4)).to(torch.uint8)
    return out.reshape(N, K // 2)


def _plain_pack(w: torch.Tensor, _tiles: int) -> torch.Tensor:
    """... and in an MSVC / unvectorized build (blocks of 32 rows: byte [k, n / 2] = row n | row n + 1 << 4)."""
    N, K = w.shape
    out = torch.empty(N // 32, K, 16, dtype=torch.uint8)
    for b in range(N // 32):
        s = w[32 * b:32 * b + 32]
        out[b] = (s[0::2].T | (s[1::2].T << 4)).to(torch.uint8)
    return out.reshape(N, K // 2)


def test_unpack_learns_any_cpus_packing_from_the_op(monkeypatch):
    """The packed layout is the torch build's per CPU: unpack inverts whatever the packing op does (orders learned
    from the op), here torch's AVX2 and unvectorized layouts as well as this machine's."""
    q, *_ = _codes(192, 96)
    for fake in (_avx2_pack, _plain_pack):
        monkeypatch.setattr(cpu_int4, "_PACK", fake)
        monkeypatch.setattr(cpu_int4, "_ORDER", {})
        p = cpu_int4.pack(q)
        assert torch.equal(p, fake(q.int(), 1)) and torch.equal(cpu_int4.unpack(p), q), fake.__name__


@needs_kernel
def test_int4_linear_is_its_reference_row_by_row():
    q, a, c, g = _codes(1152, 896)
    b = torch.randn(1152, generator=g)
    lin = Int4Linear.from_codes(q, a, c, b)
    x = torch.randn(40, 896, generator=g)
    y = lin(x)
    assert y.dtype == torch.float32 and y.shape == (40, 1152)
    ref = int4_linear_ref(x, q, lin.sz, b)
    assert float((y - ref).abs().max()) <= float(ref.abs().max()) * 2 ** -8  # within a bf16 rounding of the sum
    # each row's bits do not depend on the rows computed with it (a verify step's rows are one-token steps' bits)
    assert torch.equal(torch.cat([lin(x[i:i + 1]) for i in range(40)]), y)
    assert torch.equal(lin(x.reshape(5, 8, 896)).reshape(40, 1152), y)
    # the weights it computes with: the file's (q * a + c) within the bf16 roundings of S = a and Z = c + 8a
    w = q.float() * a.repeat_interleave(32, 1) + c.repeat_interleave(32, 1)
    bound = (8 * a + (c + 8 * a).abs()).repeat_interleave(32, 1) * 2 ** -8 * 1.01 + 1e-7
    assert ((lin.weight - w).abs() <= bound).all()
    assert lin.nbytes() < 1152 * 896 * 0.64  # half a byte a weight + a bf16 scale and zero per 32 (0.625)


@needs_kernel
def test_rows_of_an_int4_linear_compute_its_rows_bits():
    """A draft vocabulary's head (engine/runtime/draft_heads.py cpu_head): the kept rows give the full head's bits,
    in whole 64-row blocks or padded to them."""
    q, a, c, g = _codes(512, 64, seed=1)
    lin = Int4Linear.from_codes(q, a, c, torch.randn(512, generator=g))
    x = torch.randn(3, 64, generator=g)
    for rows in (torch.tensor([3, 17, 250, 499, 64]), torch.arange(128, 256)):
        sub = Int4Linear.rows_of(lin, rows)
        assert sub.out_features == len(rows)
        assert torch.equal(sub(x), lin(x)[:, rows]) and torch.equal(sub.weight, lin.weight[rows])


@needs_kernel
def test_a_files_q4_k_tensor_keeps_its_weights(spec):
    """The real 0.5B's Q4_K tensors (12 ffn_down matrices) as one Int4Linear: the file's exact weights within the
    scale / zero rounding bound, and the product within a bf16 rounding of the float32 one."""
    from engine.formats import gguf_int4

    name, t = next((n, t) for n, t in spec.gguf_tensors.items() if t.type_name == "Q4_K")
    q4 = gguf_int4.Q4Tensor(t)
    assert gguf_int4.fits([q4])
    lin = gguf_int4.int4_linear([q4])
    w = q4.dequantize()
    assert tuple(w.shape) == q4.shape == (lin.out_features, lin.in_features), name
    (_, q, a, c), = list(q4.chunks(q4.shape[0]))
    assert torch.equal(lin.codes(), q)
    bound = (8 * a.abs() + (c + 8 * a).abs()).repeat_interleave(32, 1) * 2 ** -8 * 1.01 + 1e-7
    assert ((lin.weight - w).abs() <= bound).all()
    # decoded and packed in chunks of 64 rows: the same as at once
    chunked = Int4Linear(torch.cat([cpu_int4.pack(qq) for _, qq, _, _ in q4.chunks(64)]), lin.sz)
    assert torch.equal(chunked.packed, lin.packed)
    x = torch.randn(2, lin.in_features)
    y, ref = lin(x), x @ w.T
    assert float((y - ref).abs().max()) <= float(ref.abs().max()) * 2 ** -6


def _small(tmp_path, ftype: str, tied: bool = False):
    from engine.formats.gguf_reader import read_gguf
    from engine.quant.random_gguf import write_random_gguf

    cfg = ModelConfig(vocab_size=151936, hidden_size=256, intermediate_size=512, num_layers=4, num_heads=4,
                      num_kv_heads=2, tie_word_embeddings=tied)
    types = write_random_gguf(cfg, tmp_path / f"{ftype}.gguf", ftype=ftype)
    return read_gguf(tmp_path / f"{ftype}.gguf"), types


@needs_kernel
def test_a_q4_k_m_file_runs_int4_where_its_linears_are_4_bit(tmp_path):
    """Q4_K_M: gate|up and o are Q4_K in every layer; q|k|v and down only where attn_v / ffn_down are not Q6_K (a
    fused linear with a part in another type runs int8 whole); the Q6_K head int8. The answers: the float32 path's."""
    from engine.quant.random_gguf import use_more_bits
    from engine.runtime.llm import LLM
    from kernels.cpu_int8 import Int8Linear

    spec, types = _small(tmp_path, "q4_k_m")
    llm4 = LLM(EngineConfig(device="cpu", max_batch=1, max_context=128, cpu_weights="int4"), spec=spec)
    m = llm4.runner.model
    assert llm4.runner.weights_kind == "int4"
    for i, L in enumerate(m.layers):
        more = use_more_bits(i, len(m.layers))
        assert isinstance(L.mlp.gate_up_proj, Int4Linear) and isinstance(L.self_attn.o_proj, Int4Linear)
        assert isinstance(L.self_attn.qkv_proj, Int8Linear if more else Int4Linear), i
        assert isinstance(L.mlp.down_proj, Int8Linear if more else Int4Linear), i
        assert L.self_attn.qkv_proj.bias is not None
    assert isinstance(m.lm_head, Int8Linear) and types["output.weight"] == "Q6_K"
    # the RAM plan from the file's types: what the runner holds, plus at most the load's in-flight bytes
    from engine.runtime import memory_plan
    held = llm4.runner.memory()["weights_bytes"]
    est = memory_plan.cpu_weight_bytes(spec.config, 4, "int4", True, spec.weight_types)
    assert held <= est <= held + memory_plan.GGUF_DECODE_BYTES + (1 << 20), (held, est)
    assert est < memory_plan.cpu_weight_bytes(spec.config, 4, "int8", True)  # the bound without types
    dense = LLM(EngineConfig(device="cpu", max_batch=1, max_context=128), spec=spec)
    ids = list(range(1000, 1024))
    l4, lf = llm4.runner.logits(ids), dense.runner.logits(ids)
    assert float((l4 - lf).abs().max()) <= 0.02 * float(lf.abs().max())
    assert (l4.argmax(-1) == lf.argmax(-1)).float().mean() >= 0.9


@needs_kernel
def test_a_tied_4_bit_embedding_makes_an_int4_head(tmp_path, monkeypatch):
    """A Q4_0 file whose tied token_embd is Q4_0 too (llama.cpp --pure): the head is the embedding's codes in int4,
    the embedding's lookups float rows; without the int4 kernel (an older torch) the same file runs int8."""
    from engine.quant import random_gguf
    from engine.runtime.llm import LLM
    from kernels.cpu_int8 import Int8Linear

    monkeypatch.setattr(random_gguf, "uniform_types", lambda cfg, ty: {
        **{f"blk.{i}.{t}.weight": ty for i in range(cfg.num_layers) for t in
           ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")},
        "token_embd.weight": ty})
    spec, types = _small(tmp_path, "q4_0", tied=True)
    assert types["token_embd.weight"] == "Q4_0"
    llm = LLM(EngineConfig(device="cpu", max_batch=1, max_context=64, cpu_weights="int4"), spec=spec)
    m = llm.runner.model
    assert isinstance(m.tied_head, Int4Linear) and m.embed_tokens.weight.dtype == torch.float32
    assert all(isinstance(L.self_attn.qkv_proj, Int4Linear) for L in m.layers)
    dense = LLM(EngineConfig(device="cpu", max_batch=1, max_context=64), spec=spec)
    ids = list(range(500, 516))
    l4, lf = llm.runner.logits(ids), dense.runner.logits(ids)
    assert float((l4 - lf).abs().max()) <= 0.02 * float(lf.abs().max())
    monkeypatch.setattr(cpu_int4, "_OP", None)
    old = LLM(EngineConfig(device="cpu", max_batch=1, max_context=64, cpu_weights="int4"), spec=spec)
    assert old.runner.weights_kind == "int8" and isinstance(old.runner.model.tied_head, Int8Linear)


def test_a_tied_head_in_int8_is_made_from_the_files_rows(tmp_path):
    """A tied Q4_K_M file (token_embd Q6_K, the head): with the embedding left in the mapped file, the head's int8
    copy is quantized from its rows in chunks, the same codes the float32 table gives; the lookups are its rows."""
    from engine.formats.gguf_rows import MappedRows
    from engine.model.layout import EMBED
    from engine.runtime.llm import LLM
    from kernels.cpu_int8 import quantize_rows

    spec, types = _small(tmp_path, "q4_k_m", tied=True)
    assert types["token_embd.weight"] == "Q6_K"
    m = LLM(EngineConfig(device="cpu", max_batch=1, max_context=64, cpu_weights="int8"), spec=spec).runner.model
    assert isinstance(m.embed_map, MappedRows) and m.embed_tokens.weight.numel() == 0
    table = torch.from_numpy(spec.gguf_tensors[EMBED].dequantize())
    w8, s = quantize_rows(table)
    assert torch.equal(m.tied_head.w8, w8) and torch.equal(m.tied_head.scales, s)
    assert torch.equal(m.head_weight(), table) and torch.equal(m.embedding()[torch.tensor([3, 9])], table[[3, 9]])


@needs_kernel
def test_the_real_model_in_int4_speculates_to_plain_tokens(spec):
    """The real 0.5B (12 of its linears Q4_K): prompt lookup and the draft heads give plain greedy decoding's
    tokens, and /health's word for it is int4."""
    from engine.formats.chat import render_chat
    from engine.runtime.llm import LLM
    from engine.runtime.sampling import SamplingParams

    llm = LLM(EngineConfig(device="cpu", max_batch=1, max_context=1024, cpu_weights="int4", draft_heads="auto"),
              spec=spec)
    assert llm.runner.weights_kind == "int4"
    assert sum(isinstance(x, Int4Linear) for x in llm.runner.model.modules()) == 12
    text = "The meeting moved to Thursday at 3 pm because the projector in room B is broken again."
    prompt = render_chat(llm.spec.chat_template, [{"role": "user", "content": "Rewrite more politely: " + text}])
    ids = llm.tokenizer.encode(prompt)
    plain = llm.complete(ids, SamplingParams(max_tokens=40, temperature=0)).token_ids
    spec_ = llm.complete(ids, SamplingParams(max_tokens=40, temperature=0, speculative=True)).token_ids
    assert plain == spec_ and len(plain) >= 10


def test_int4_is_a_cpu_weights_choice():
    import argparse

    from engine.server.cli import add_arguments, build_config

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert build_config(p.parse_args(["--cpu-weights", "int4"])).cpu_weights == "int4"
    with pytest.raises(BadRequestError, match="cpu_weights"):
        EngineConfig(cpu_weights="int2")


@needs_kernel
def test_a_damaged_4_bit_block_is_refused_at_load(tmp_path):
    """A Q4_K block whose fp16 factor is not finite (a damaged file): a clear ModelFileError at load, not NaN answers."""
    import numpy as np

    from engine.errors import ModelFileError
    from engine.runtime.llm import LLM

    spec, _ = _small(tmp_path, "q4_k_m")
    t = spec.gguf_tensors["model.layers.1.mlp.gate_proj.weight"]
    with open(spec.source, "r+b") as f:  # the first block's d = +inf (fp16 0x7c00)
        f.seek(t.offset)
        f.write(np.array([np.inf], dtype=np.float16).tobytes())
    from engine.formats.gguf_reader import read_gguf
    with pytest.raises(ModelFileError, match="not a finite number"):
        LLM(EngineConfig(device="cpu", max_batch=1, max_context=64, cpu_weights="int4"), spec=read_gguf(spec.source))


def test_a_damaged_block_is_refused_by_the_int8_load_too(tmp_path):
    """The same damage in a Q6_K tensor (int8 on the CPU): ModelFileError naming the linear."""
    import numpy as np

    from engine.errors import ModelFileError
    from engine.formats.gguf_reader import read_gguf
    from engine.runtime.llm import LLM

    spec, types = _small(tmp_path, "q4_k_m")
    assert types["output.weight"] == "Q6_K"
    t = spec.gguf_tensors["lm_head.weight"]
    with open(spec.source, "r+b") as f:  # the first Q6_K block's d (its last 2 bytes) = +inf
        f.seek(t.offset + 208)
        f.write(np.array([np.inf], dtype=np.float16).tobytes())
    with pytest.raises(ModelFileError, match="lm_head"):
        LLM(EngineConfig(device="cpu", max_batch=1, max_context=64, cpu_weights="int8"), spec=read_gguf(spec.source))
