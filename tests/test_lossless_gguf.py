"""A quantized GGUF runs as it is: exact repack at load (engine/model/gpu_load.py load_source), the memory plan
counts those bytes, the references and the Triton-free prefill read every layout, and the real 0.5B's lossless
weights give the fp32-dequantized model's greedy answers."""
import numpy as np
import pytest
import torch

from engine.config import EngineConfig, ModelConfig
from engine.formats.checkpoint import read_checkpoint
from engine.formats.gguf_kquant import decode, exactness_bound
from engine.formats.gguf_layout import REPACK
from engine.formats.gguf_reader import read_gguf
from engine.formats.load import load_spec
from engine.model import gpu_load
from engine.model.layout import FIELDS, FUSED, LINEARS
from engine.quant.eval_quality import PROMPTS
from engine.quant.export import export
from engine.quant.random_gguf import q4_k_m_layouts, use_more_bits, write_random_gguf
from engine.runtime.llm import LLM
from engine.runtime.memory_plan import source_weight_bytes, source_weight_parts, weight_bytes
from engine.runtime.sampling import SamplingParams
from kernels import pack
from kernels.decode_reference import dense_weight
from kernels.prefill_torch import dequant_rows
from kernels.qweight import QWeight
from tests.test_checkpoint import _hf_folder
from tests.test_prequant import _prequant_folder


@pytest.fixture(scope="module")
def lossless(spec):
    """The real 0.5B as the GPU loader builds it, on the CPU."""
    return gpu_load.load_source(spec, "cpu", mode="bytes")


def test_loader_layouts_and_memory_plan_agree(spec, lossless):
    w = lossless
    assert w.nbytes() == source_weight_bytes(spec.config, spec.weight_types, mode="bytes")[0]
    assert w.embed.nbytes() == source_weight_parts(spec.config, spec.weight_types, mode="bytes")["embedding"]
    # 0.5B: Q5_0/Q8_0 everywhere but ffn_down (Q4_K or Q6_K): (8,32), down (4,32) | (8,16)
    assert {(l.qkv.bits, l.qkv.group) for l in w.layers} == {(8, 32)}
    assert {(l.down.bits, l.down.group) for l in w.layers} == {(4, 32), (8, 16)}
    assert (w.embed.bits, w.embed.group, w.lm_head.bits, w.lm_head.group) == (8, 32, 8, 32)
    w4 = source_weight_bytes(spec.config, spec.weight_types, "w4")[0]
    assert w4 < w.nbytes()  # the exact layouts cost bytes (docs/quantization.md has the table)


def test_lossless_weights_dequantize_to_gguf_values(spec, lossless):
    """Every linear of two layers (and embedding rows, the head): within the fp16-rounding bound of gguf's dequant."""
    g = spec.gguf_tensors

    checks = [(lossless.embed, ["model.embed_tokens.weight"], 4096), (lossless.lm_head, ["lm_head.weight"], 4096)]
    for i in (0, 3):
        for mod in LINEARS:
            checks.append((getattr(lossless.layers[i], FIELDS[mod]),
                           [f"model.layers.{i}.{m}.weight" for m in FUSED[mod]], None))
    for qw, names, rows in checks:
        got = dense_weight(qw, None if rows is None else torch.arange(rows)).numpy()
        r0 = 0
        for n in names:
            t = g[n]
            raw = np.asarray(t.raw()[:rows] if rows else t.raw())
            ref = t.dequantize()[:raw.shape[0]]
            q, a, c = decode(raw, t.type_name)
            bound = exactness_bound(q, a, c, REPACK[t.type_name][1])
            part = got[r0:r0 + raw.shape[0]]
            assert (np.abs(part.astype(np.float64) - ref) <= bound).all(), n
            r0 += raw.shape[0]
        assert r0 == got.shape[0]


def test_requantize_w4_is_the_old_path(spec):
    assert source_weight_bytes(spec.config, spec.weight_types, "w4")[0] == weight_bytes(spec.config, 4)
    assert source_weight_bytes(spec.config, {"model.embed_tokens.weight": "BF16"})[0] == weight_bytes(spec.config, 4)


def test_triton_free_prefill_reads_every_layout():
    """kernels/prefill_torch.py (the GPU prefill without Triton) dequantizes every pack.LAYOUTS layout like
    kernels/pack.py (fp16 rounding of the weights only)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 256, generator=g) * 0.05
    for bits, group in pack.LAYOUTS:
        q, s, m = pack.quantize(w, bits, group)
        qw = QWeight(48, 256, bits, qweight=pack.pack(q, bits), scales=s, mins=m, group=group)
        assert torch.equal(dequant_rows(qw, 8, 40).float(), pack.dequantize(q, s, m)[8:48].half().float())
        assert torch.equal(dense_weight(qw), pack.dequantize(q, s, m))


def test_lossless_checkpoint_answers_like_the_fp32_reference(spec, llm, tmp_path):
    """`export --scheme lossless` of the real 0.5B stores each linear's exact layout and group (manifest), reads
    back to gguf's values, and greedy answers on protocol prompts (engine/quant/eval_quality.py) equal the
    fp32-dequantized GGUF's (the session's reference LLM)."""
    man = export(spec.source, tmp_path / "ck", "lossless")
    assert man["scheme"] == "lossless" and man["quantizer"] == "none"
    assert man["tensors"]["layers.0.mlp.down_proj.qweight"]["group"] in (16, 32)
    ck_spec = read_checkpoint(tmp_path / "ck")
    ck = ck_spec.checkpoint
    q = ck.linear("layers.0.self_attn.qkv_proj")
    assert (q.bits, q.group, q.K) == (8, 32, 896)
    ref = np.concatenate([spec.gguf_tensors[f"model.layers.0.self_attn.{m}_proj.weight"].dequantize() for m in "qkv"])
    assert np.array_equal(ck.dense("layers.0.self_attn.qkv_proj").numpy(), ref)  # Q5_0/Q8_0: exact
    lossless_llm = LLM(EngineConfig(model=str(tmp_path / "ck"), device="cpu", max_context=512, max_batch=1),
                       spec=ck_spec)
    params = SamplingParams(max_tokens=20, temperature=0.0)
    for p in PROMPTS[1:3]:  # English and Chinese
        msgs = [{"role": "user", "content": p}]
        assert lossless_llm.chat(msgs, params).token_ids == llm.chat(msgs, params).token_ids, p


def test_cpu_runner_holds_the_gguf_values(spec, llm):
    """The CPU path is lossless already: it runs the GGUF dequantized to float32 (the reference), never re-quantized."""
    m = llm.runner.model
    qkv = np.concatenate([spec.gguf_tensors[f"model.layers.2.self_attn.{p}_proj.weight"].dequantize() for p in "qkv"])
    assert np.array_equal(m.layers[2].self_attn.qkv_proj.weight.detach().numpy(), qkv)
    down = spec.gguf_tensors["model.layers.2.mlp.down_proj.weight"]
    assert down.type_name in ("Q4_K", "Q6_K")
    assert np.array_equal(m.layers[2].mlp.down_proj.weight.detach().numpy(), down.dequantize())


def test_random_q4_k_m_gguf_loads_in_llama_cpp_types(tmp_path):
    """make-random --format gguf: llama.cpp's Q4_K_M types (Q6_K attn_v/ffn_down in use_more_bits layers, Q6_K
    output), valid blocks (gguf dequantizes them to std ~0.02), read back by our reader, loaded as it is with the
    bytes the memory plan counts; gpu_load.random_weights(layouts=q4_k_m_layouts) gives the same layouts."""
    cfg = ModelConfig(vocab_size=151936, hidden_size=256, intermediate_size=512, num_layers=8, num_heads=4,
                      num_kv_heads=2, tie_word_embeddings=False)
    types = write_random_gguf(cfg, tmp_path / "r.gguf")
    assert [types[f"blk.{i}.attn_v.weight"] for i in range(8)] == \
        ["Q6_K" if use_more_bits(i, 8) else "Q4_K" for i in range(8)] and types["output.weight"] == "Q6_K"
    assert [use_more_bits(i, 28) for i in range(28)].count(True) == 14  # the real 1.5B: 14 Q6_K attn_v / ffn_down
    spec = read_gguf(tmp_path / "r.gguf")
    assert spec.config.num_layers == 8 and not spec.config.tie_word_embeddings
    w = spec.gguf_tensors["model.layers.1.mlp.down_proj.weight"].dequantize()
    assert 0.015 < w.std() < 0.03 and abs(w.mean()) < 0.002
    loaded = gpu_load.load_source(spec, "cpu")
    layouts = q4_k_m_layouts(cfg)
    assert loaded.nbytes() == source_weight_bytes(cfg, spec.weight_types)[0]
    lay = lambda w: (w.bits, w.group) + (("kq",) if w.kq else ())  # noqa: E731 - a KQ form's tuple (gguf_pack)
    assert [lay(l.qkv) for l in loaded.layers] == [layouts[f"layers.{i}.self_attn.qkv_proj"] for i in range(8)]
    assert [lay(l.gate_up) for l in loaded.layers] == [layouts[f"layers.{i}.mlp.gate_up_proj"] for i in range(8)]
    rand = gpu_load.random_weights(cfg, 4, torch.device("cpu"), layouts=layouts)
    assert rand.nbytes() == loaded.nbytes()


@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_awq_gptq_folder_loads_repacked_on_the_gpu_path(tmp_path, method):
    """--model ./Qwen-AWQ on the GPU: the 4-bit linears repacked (codes and scales exact, mins within one fp16
    rounding of -z*s), not re-quantized; the bytes are W4 g128's (what the memory plan counts)."""
    _hf_folder(tmp_path / "dense", tied=True)
    expect = _prequant_folder(tmp_path / "dense", tmp_path / "src", method)
    spec = load_spec(str(tmp_path / "src"))
    w = gpu_load.load_source(spec, "cpu")
    assert w.nbytes() == source_weight_bytes(spec.config, spec.weight_types)[0]
    for i, layer in enumerate(w.layers):
        for mod in LINEARS:
            q = getattr(layer, FIELDS[mod])
            want = torch.cat([expect[f"model.layers.{i}.{p}.weight"] for p in FUSED[mod]])
            got = dense_weight(q)
            steps = q.scales.float().abs().repeat_interleave(128, 1)
            assert (q.bits, q.group) == (4, 128)
            assert ((got - want).abs() <= steps * 15 * 2.0 ** -11 + 1e-9).all()  # |z*s| <= 15 s
