"""The one Qwen2 forward (engine/model/forward.py) and the one layout table (engine/model/layout.py).

- the GPU decode step is exactly 5 kernels per layer + embed, final norm, lm_head (7 with DEEPINFER_DEFER_NORM=0;
  a recording kernel set on the CPU: the CUDA graph cannot gain launches);
- the CPU runner (RefOps, fp32) and the GPU decode step run on the kernels' PyTorch references (StepOps
  over RefKernels, fp16 weights and activations) give the same greedy tokens on the real 0.5B;
- every HF name has one place, fused row slices tile their linear, and splitting a fused tensor inverts it.
"""
import dataclasses

import torch

from engine.config import ModelConfig
from engine.model import layout

CFG = ModelConfig(vocab_size=1024, hidden_size=256, intermediate_size=384, num_layers=3, num_heads=4,
                  num_kv_heads=2)


def test_decode_step_launches_five_kernels_per_layer_or_seven_with_separate_norms(tmp_path, monkeypatch):
    """By default the layers' rmsnorms are deferred (decode_norm.cu): embed (+ the first x), then per layer qkv,
    attention, o (+ the next x), gate_up, down (+ the next x); the final rmsnorm and lm_head. With
    DEEPINFER_DEFER_NORM=0 each rmsnorm is its own launch (7 per layer). Both give the same greedy tokens and logits
    within the fp16 rounding of x."""
    from engine.formats.load import load_spec
    from engine.model.gpu_load import load_checkpoint
    from engine.model.gpu_model import GPUModel
    from engine.quant.make_random import make_random
    from kernels.decode_reference import RefKernels

    calls = []

    class Recording(RefKernels):
        def gemv(self, w, x, B, epi, out, keys=None, norm=None, ss=None, eps=0.0):
            calls.append(f"gemv_{epi}" + ("+norm" if norm is not None else "") + ("+ss" if ss is not None else ""))
            return super().gemv(w, x, B, epi, out, keys, norm, ss, eps)

        def embed(self, *a, norm=None, **k):
            calls.append("embed" + ("+norm" if norm is not None else ""))
            return super().embed(*a, norm=norm, **k)

        def __getattribute__(self, name):
            if name in ("copy_rows", "rmsnorm", "attention"):
                calls.append(name)
            return object.__getattribute__(self, name)

    make_random(CFG, "w4", tmp_path, seed=1)
    weights = load_checkpoint(load_spec(str(tmp_path)).checkpoint, "cpu")
    monkeypatch.delenv("DEEPINFER_DEFER_NORM", raising=False)  # the default
    m = GPUModel(weights, 2, 32, "cpu")
    m.kn = Recording()
    ids, logits = m.decode([3, 4], [0, 0], [0, 1])
    deferred = (ids, logits.clone())
    layer = ["gemv_store+ss", "attention", "gemv_resid+norm+ss", "gemv_silu+ss", "gemv_resid+norm+ss"]
    last = layer[:-1] + ["gemv_resid"]  # the last down_proj: the final norm is a launch
    assert calls == ["embed+norm"] + layer * (CFG.num_layers - 1) + last + ["rmsnorm", "gemv_logits"]
    assert bool((m.ss[:, :2] > 0).all())  # every point's sums were written

    calls.clear()
    monkeypatch.setenv("DEEPINFER_DEFER_NORM", "0")
    m = GPUModel(weights, 2, 32, "cpu")
    m.kn = Recording()
    ids, logits = m.decode([3, 4], [0, 0], [0, 1])
    assert ids == deferred[0]
    assert float((logits - deferred[1]).norm() / logits.norm()) < 2e-3
    layer = ["rmsnorm", "gemv_store", "attention", "gemv_resid", "rmsnorm", "gemv_silu", "gemv_resid"]
    assert calls == ["embed"] + layer * CFG.num_layers + ["rmsnorm", "gemv_logits"]


def test_cpu_runner_and_step_on_references_same_greedy_tokens_real_model(llm, spec):
    from engine.model.gpu_load import GPUWeights
    from engine.model.gpu_model import GPUModel
    from kernels.qweight import QWeight

    def fp16(t, bias=None):  # the CPU runner's fp32 weights as dense fp16 QWeights (no second file read)
        return QWeight(t.shape[0], t.shape[1], 16, weight=t.half(), bias=None if bias is None else bias.half())

    cpu = llm.runner.model.weights()
    emb = fp16(cpu.embed)
    layers = [layout.LayerWeights(L.in_norm, L.post_norm,
                                  *[fp16(lin.weight, lin.bias) for lin in (L.qkv, L.o, L.gate_up, L.down)])
              for L in cpu.layers]
    head = emb if isinstance(cpu.lm_head, torch.Tensor) else fp16(cpu.lm_head.weight)  # tied or not
    m = GPUModel(GPUWeights(spec.config, emb, head, cpu.norm, layers), 1, 64, "cpu")
    prompt = llm.tokenizer.encode("<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n")
    lg = m.prefill(prompt, 0, 0)
    toks = [int(lg.argmax())]
    for i in range(5):
        ids, _ = m.decode([toks[-1]], [len(prompt) + i], [0])
        toks.append(ids[0])
    ref = llm.runner.logits(prompt + toks[:-1])[len(prompt) - 1:]
    assert toks == [int(r.argmax()) for r in ref]


def test_layout_places_every_name_once_and_split_inverts_fuse():
    names = layout.hf_names(CFG)
    places = [layout.locate(CFG, n) for n in names]
    assert len({(p.param, p.rows.start if p.rows else None) for p in places}) == len(names)
    for mod in layout.LINEARS:
        N, K = layout.linear_shape(CFG, mod)
        sl = sorted(layout.part_slices(CFG, mod).values(), key=lambda s: s.start)
        assert sl[0].start == 0 and sl[-1].stop == N and all(a.stop == b.start for a, b in zip(sl, sl[1:]))
        w = torch.randn(N, K)
        parts = layout.split_fused(CFG, mod, w)
        assert [p for p, _ in parts] == list(layout.FUSED[mod])
        assert torch.equal(torch.cat([t for _, t in parts]), w)
        for name, t in parts:
            assert torch.equal(w[layout.locate(CFG, f"model.layers.1.{name}.weight").rows or slice(None)], t)
    untied = dataclasses.replace(CFG, tie_word_embeddings=False)
    assert layout.HEAD in layout.hf_names(untied) and layout.locate(untied, layout.HEAD).name == "lm_head"
    assert CFG.tie_word_embeddings and layout.HEAD not in layout.hf_names(CFG)
    for bad in ("lm_head.weight", "model.layers.9.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.bias"):
        try:
            layout.locate(CFG, bad)
        except KeyError:
            continue
        raise AssertionError(bad)
