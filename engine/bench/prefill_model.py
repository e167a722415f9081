"""A whole Qwen2 prefill on the GPU for the prefill benchmark: random packed weights, one sequence's cache,
and the one forward (engine/model/forward.py) on the prefill ops (engine/model/ops_prefill.py).

Random packed weights are built on the GPU (any int32 bit pattern is a valid W4/W3 block), so the
exact 3B / 7B shapes need no checkpoint. `to_cpu_model` copies the same weights, dequantized, into
the CPU reference engine.model.qwen2.Qwen2Model so the two paths can be compared.
"""
from __future__ import annotations

import torch

from engine.config import ModelConfig
from engine.model.forward import forward
from engine.model.gpu_load import GPUWeights
from engine.model.gpu_prefill import attention_prefill, linear_prefill
from engine.model.layout import BIASED, FIELDS, LINEARS, NORMS, LayerWeights, linear_shape
from engine.model.ops_prefill import PrefillOps
from engine.model.qwen2 import Qwen2Model
from kernels.ops_reference import Rotary
from kernels.pack import packed_words
from kernels.prefill_reference import dequant_reference
from kernels.qweight import QWeight


def random_qweight(N: int, K: int, bits: int, bias: bool, device, gen: torch.Generator) -> QWeight:
    """Random packed weight with std about 1/sqrt(K) (keeps activations O(1) through the layers)."""
    qw = torch.randint(-2**31, 2**31 - 1, (N, packed_words(K, bits)), dtype=torch.int32, device=device,
                       generator=gen)
    qmax = (1 << bits) - 1
    s = (torch.rand(N, K // 128, device=device, generator=gen) * 0.5 + 0.75) * (3.4 / qmax) / K ** 0.5
    mins = -s * qmax / 2
    b = (torch.randn(N, device=device, generator=gen) * 0.1).half() if bias else None
    return QWeight(N, K, bits, qweight=qw, scales=s.half(), mins=mins.half(), bias=b)


class GPUModel:
    """Weights (engine.model.gpu_load.GPUWeights; fp16 dense embedding/head) + static KV cache
    k, v [layers, Hkv, max_context, hd] fp16 for one sequence."""

    def __init__(self, cfg: ModelConfig, bits: int, max_context: int, device="cuda", seed: int = 0):
        g = torch.Generator(device=device).manual_seed(seed)
        c, self.cfg, self.device = cfg, cfg, device
        emb = (torch.randn(c.vocab_size, c.hidden_size, device=device, generator=g) * 0.5).half()
        ln = lambda: 1 + 0.1 * torch.randn(c.hidden_size, device=device, generator=g)  # noqa: E731 fp32
        layers = [LayerWeights(ln(), ln(), *[random_qweight(*linear_shape(c, m), bits, m in BIASED, device, g)
                                             for m in LINEARS]) for _ in range(c.num_layers)]
        norm = ln()
        head = emb if c.tie_word_embeddings else \
            (torch.randn(c.vocab_size, c.hidden_size, device=device, generator=g) * c.hidden_size ** -0.5).half()
        embed = QWeight(c.vocab_size, c.hidden_size, 16, weight=emb)
        self.w = GPUWeights(c, embed, embed if head is emb else QWeight(c.vocab_size, c.hidden_size, 16, weight=head),
                            norm, layers)
        rope = Rotary(c.head_dim, max_context, c.rope_theta, device=device)
        self.cos, self.sin = rope.cos, rope.sin  # fp32 [max_context, hd/2]
        shape = (c.num_layers, c.num_kv_heads, max_context, c.head_dim)
        self.k = torch.zeros(shape, dtype=torch.float16, device=device)
        self.v = torch.zeros(shape, dtype=torch.float16, device=device)
        self.method: str | None = None  # None = linear_prefill's own rule; "fused" | "dequant" to force
        self.elementwise = "triton"  # "triton": kernels/prefill_elementwise.py; "torch": plain torch ops

    def weight_bytes(self) -> int:
        return self.w.nbytes()

    def _embed(self, toks, T: int, h, keys):
        h[:T] = self.w.embed.weight[toks.long()].float()
        keys[:T] = 0

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, q_start: int) -> torch.Tensor:
        """ids [T] on the GPU at positions q_start..q_start+T-1 -> fp32 logits [vocab] of the last one."""
        T, m = ids.shape[0], self.method
        ops = PrefillOps(self.cfg, self.cos, self.sin, self._embed, ids, T, q_start,
                         lambda i: (self.k[i], self.v[i]), T - 1, linear=lambda x, w: linear_prefill(x, w, m),
                         attend=attention_prefill, kind=self.elementwise)
        return forward(ops, self.w)[0]

    def to_cpu_model(self, max_context: int) -> Qwen2Model:
        """The CPU reference engine.model.qwen2.Qwen2Model (fp32) holding the same (dequantized) weights
        (its module paths are the layout's names)."""
        m, w = Qwen2Model(self.cfg, torch.float32), self.w
        m.embed_tokens.weight.copy_(w.embed.weight.float().cpu())
        m.norm.weight.copy_(w.norm.float().cpu())
        if m.lm_head is not None:
            m.lm_head.weight.copy_(w.lm_head.weight.float().cpu())
        for i, L in enumerate(w.layers):
            for n, t in zip(NORMS, (L.in_norm, L.post_norm)):
                m.get_parameter(f"layers.{i}.{n}.weight").copy_(t.float().cpu())
            for mod in LINEARS:
                qw, lin = getattr(L, FIELDS[mod]), m.get_submodule(f"layers.{i}.{mod}")
                lin.weight.copy_(dequant_reference(qw))
                if lin.bias is not None:
                    lin.bias.copy_(qw.bias.float().cpu())
        return m
