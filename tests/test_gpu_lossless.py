"""The lossless GGUF layouts on the GPU (@pytest.mark.gpu, run on the device): the Triton prefill dequant and the
fused dequant-GEMM read W8 and groups 32/16 (kernels/prefill_triton.py), and the real 0.5B loads as it is
(engine/model/gpu_load.py load_source) with the same weights as on the CPU."""
from __future__ import annotations

import pytest
import torch

from engine.model import gpu_load
from kernels import pack
from kernels.decode_reference import dense_weight
from kernels.prefill_reference import linear_reference
from kernels.qweight import QWeight

pytestmark = pytest.mark.gpu


def _qweight(N: int, K: int, bits: int, group: int, dev, g) -> tuple[QWeight, torch.Tensor]:
    w = torch.randn(N, K, generator=g) * 0.05
    q, s, m = pack.quantize(w, bits, group)
    qw = QWeight(N, K, bits, qweight=pack.pack(q, bits).to(dev), scales=s.to(dev), mins=m.to(dev),
                 bias=(torch.randn(N, generator=g) * 0.1).half().to(dev), group=group)
    return qw, pack.dequantize(q, s, m)


@pytest.mark.parametrize("bits,group,form", [(b, g, "") for b, g in pack.LAYOUTS] +
                         [(b, g, "kq") for b, g in pack.KQ_LAYOUTS] + [(b, g, "sym") for b, g in pack.SYM_LAYOUTS])
def test_triton_dequant_and_fused_read_every_layout(bits, group, form):
    from kernels.prefill_triton import dequant_into, fused_linear

    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(bits * 1000 + group)
    for N, K in ((208, 896), (96, 4864), (64, 160), (64, 2048)):  # 160: K not a multiple of 128 (BK 32)
        if K % group or (bits == 6 and K % 128) or (form == "kq" and K % 256):  # W6: blocks of 128; KQ: of 256
            continue
        if form:  # the KQ / SYM forms (kernels/checks_gguf.py rand_layout): KQ integer sub-scales, SYM no mins
            from kernels.checks_gguf import rand_layout
            qw, ref = rand_layout(N, K, bits, group, g, dev, bias=True, form=form)
            ref = ref.cpu()
        else:
            qw, ref = _qweight(N, K, bits, group, dev, g)
        buf = torch.empty(N * K, dtype=torch.float16, device=dev)
        got = dequant_into(qw, buf).float().cpu()
        assert torch.allclose(got, ref.half().float(), rtol=1e-3, atol=1e-5), (bits, group, N, K)
        part = dequant_into(qw, buf, 32, 24).float().cpu()  # a row block (from a 16-row tile: W3's words)
        assert torch.allclose(part, ref[32:56].half().float(), rtol=1e-3, atol=1e-5)
        for T in (5, 100):
            x = (torch.randn(T, K, generator=g) * 0.5).half().to(dev)
            y = fused_linear(x, qw).float().cpu()
            r = linear_reference(x, qw)
            assert float((y - r).norm() / r.norm()) < 5e-3, (bits, group, N, K, T)


def test_real_model_loads_as_it_is_on_the_gpu(request):
    from engine.errors import ResourceError

    try:  # the device machine is offline: the model is there only when moved in (engine.bench.device --real-model)
        spec = request.getfixturevalue("spec")
    except ResourceError as e:
        pytest.skip(f"the real 0.5B model is not available here: {e}")
    cpu = gpu_load.load_source(spec, "cpu")
    gpu = gpu_load.load_source(spec, torch.device("cuda"))
    for mode in ("6bit", "kquant"):  # EngineConfig.gguf_pack: the same weights
        other = gpu_load.load_source(spec, torch.device("cuda"), mode=mode)
        # layer 0's qkv is Q8_0 (8 bits either way; SYM in kquant), layer 3's down Q6_K (W6; KQ in kquant)
        want = {"6bit": ((8, ""), (6, "")), "kquant": ((8, "sym"), (6, "kq"))}[mode]
        for (a, b), form in zip(((cpu.layers[0].qkv, other.layers[0].qkv), (cpu.layers[3].down, other.layers[3].down)),
                                want):
            assert (b.bits, b.form) == form and torch.equal(dense_weight(a), dense_weight(b).cpu())
        assert other.layers[3].down.kq == (mode == "kquant")
        assert other.embed.sym == other.layers[0].gate_up.sym == (mode == "kquant")  # Q5_0: SYM (6, 32)
    assert gpu.nbytes() == cpu.nbytes()
    for a, b in ((cpu.layers[0].qkv, gpu.layers[0].qkv), (cpu.layers[5].down, gpu.layers[5].down),
                 (cpu.lm_head, gpu.lm_head)):
        assert (a.bits, a.group) == (b.bits, b.group)
        assert b.qweight.is_cuda and torch.equal(a.qweight, b.qweight.cpu()) and torch.equal(a.scales, b.scales.cpu())
    rows = torch.arange(64)
    assert torch.equal(dense_weight(gpu.embed, rows.cuda()).cpu(), dense_weight(cpu.embed, rows))


def test_gguf_packs_answer_as_the_bytes_on_the_gpu(request):
    """EngineConfig.gguf_pack "6bit" and "kquant" on the real 0.5B: the W6 / KQ decode GEMVs, embedding and Triton
    prefill carry the same weights as the byte layouts, so greedy answers are the same tokens."""
    from engine.config import EngineConfig
    from engine.errors import ResourceError
    from engine.quant.eval_quality import PROMPTS
    from engine.runtime.llm import LLM
    from engine.runtime.sampling import SamplingParams

    try:
        spec = request.getfixturevalue("spec")
    except ResourceError as e:
        pytest.skip(f"the real 0.5B model is not available here: {e}")
    params = SamplingParams(max_tokens=32, temperature=0.0)
    outs = {}
    for mode in ("bytes", "6bit", "kquant"):
        llm = LLM(EngineConfig(model="qwen2.5-coder-0.5b", device="cuda", max_context=1024, max_batch=1,
                               gguf_pack=mode), spec=spec)
        outs[mode] = [llm.chat([{"role": "user", "content": p}], params).token_ids for p in PROMPTS[:4]]
        del llm
        torch.cuda.empty_cache()
    assert outs["6bit"] == outs["bytes"] and outs["kquant"] == outs["bytes"]


def test_the_packings_pass_their_load_check_on_this_gpu():
    """engine/runtime/pack_check.py with the real kernels: every layout of the 6bit and kquant packings of a 3B and
    a 0.5B Q4_K_M (its Q5_0 / Q8_0 fallbacks: the SYM forms) passes (otherwise GPURunner would load the bytes and say
    why in /health)."""
    from engine.config import ModelConfig, QWEN25_SHAPES
    from engine.formats.gguf_layout import gguf_weight_types, linear_layouts
    from engine.model.gpu_prefill import linear_prefill
    from engine.quant.random_gguf import q4_k_m_types
    from engine.runtime import pack_check
    from kernels.decode_kernels import DecodeKernels

    dev = torch.device("cuda")
    for shape, mode in (("3b", "6bit"), ("3b", "kquant"), ("0.5b", "kquant")):
        cfg = ModelConfig(**QWEN25_SHAPES[shape])
        lay = linear_layouts(cfg, gguf_weight_types(q4_k_m_types(cfg)), mode)
        assert pack_check.packing_for(mode, lay, DecodeKernels.get(dev), dev, linear_prefill) == (mode, "")
        for key in pack_check.new_layouts(lay):
            assert pack_check._cache[(str(dev), key)] < 5e-3, key
