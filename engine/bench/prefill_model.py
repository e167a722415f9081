"""A whole Qwen2 forward on the GPU assembled from engine/model/gpu_prefill.py (for the prefill benchmark).

Random packed weights are built on the GPU (any int32 bit pattern is a valid W4/W3 block), so the
exact 3B / 7B shapes need no checkpoint. `to_cpu_model` copies the same weights, dequantized, into
the CPU reference engine.model.qwen2.Qwen2Model so the two paths can be compared.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.config import ModelConfig
from engine.model.gpu_prefill import attention_prefill, linear_prefill
from kernels.qweight import QWeight
from kernels.ops_reference import Rotary
from kernels.pack import packed_words


def random_qweight(N: int, K: int, bits: int, bias: bool, device, gen: torch.Generator) -> QWeight:
    """Random packed weight with std about 1/sqrt(K) (keeps activations O(1) through the layers)."""
    qw = torch.randint(-2**31, 2**31 - 1, (N, packed_words(K, bits)), dtype=torch.int32, device=device,
                       generator=gen)
    qmax = (1 << bits) - 1
    s = (torch.rand(N, K // 128, device=device, generator=gen) * 0.5 + 0.75) * (3.4 / qmax) / K ** 0.5
    mins = -s * qmax / 2
    b = (torch.randn(N, device=device, generator=gen) * 0.1).half() if bias else None
    return QWeight(N, K, bits, qweight=qw, scales=s.half(), mins=mins.half(), bias=b)


@dataclass
class Layer:
    ln1: torch.Tensor
    qkv: QWeight
    o: QWeight
    ln2: torch.Tensor
    gate_up: QWeight
    down: QWeight


class GPUModel:
    """Weights + static KV cache [layers, Hkv, max_context, hd] fp16 for one sequence."""

    def __init__(self, cfg: ModelConfig, bits: int, max_context: int, device="cuda", seed: int = 0):
        g = torch.Generator(device=device).manual_seed(seed)
        c, self.cfg, self.device = cfg, cfg, device
        self.embed = (torch.randn(c.vocab_size, c.hidden_size, device=device, generator=g) * 0.5).half()
        ln = lambda: (1 + 0.1 * torch.randn(c.hidden_size, device=device, generator=g)).half()  # noqa: E731
        self.layers = [Layer(ln(), random_qweight(c.q_size + 2 * c.kv_size, c.hidden_size, bits, True, device, g),
                             random_qweight(c.hidden_size, c.q_size, bits, False, device, g), ln(),
                             random_qweight(2 * c.intermediate_size, c.hidden_size, bits, False, device, g),
                             random_qweight(c.hidden_size, c.intermediate_size, bits, False, device, g))
                       for _ in range(c.num_layers)]
        self.norm = ln()
        head = self.embed if c.tie_word_embeddings else \
            (torch.randn(c.vocab_size, c.hidden_size, device=device, generator=g) * c.hidden_size ** -0.5).half()
        self.head = QWeight(c.vocab_size, c.hidden_size, 16, weight=head)
        rope = Rotary(c.head_dim, max_context, c.rope_theta, device=device)
        self.cos, self.sin = rope.cos, rope.sin  # fp32 [max_context, hd/2]
        shape = (c.num_layers, c.num_kv_heads, max_context, c.head_dim)
        self.k = torch.zeros(shape, dtype=torch.float16, device=device)
        self.v = torch.zeros(shape, dtype=torch.float16, device=device)
        self.method: str | None = None  # None = linear_prefill's own rule; "fused" | "dequant" to force
        self.elementwise = "triton"  # "triton": kernels/prefill_elementwise.py; "torch": plain torch ops

    def weight_bytes(self) -> int:
        ws = [self.embed, self.norm] + ([] if self.head.weight is self.embed else [self.head.weight])
        total = sum(t.numel() * t.element_size() for t in ws)
        for L in self.layers:
            total += L.ln1.numel() * 4 + sum(w.nbytes() for w in (L.qkv, L.o, L.gate_up, L.down))
        return total

    def _rms(self, x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.cfg.rms_eps)).half() * w

    def _rope(self, x, cos, sin):  # x [T, heads, hd] fp16 (neox halves)
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).half()

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, q_start: int) -> torch.Tensor:
        """ids [T] on the GPU at positions q_start..q_start+T-1 -> fp32 logits [vocab] of the last one."""
        if self.elementwise == "triton":
            return self._forward_triton(ids, q_start)
        c, T, m = self.cfg, ids.shape[0], self.method
        L = q_start + T
        cos = self.cos[q_start:L].unsqueeze(1)
        sin = self.sin[q_start:L].unsqueeze(1)
        h = self.embed[ids]
        for i, lw in enumerate(self.layers):
            qkv = linear_prefill(self._rms(h, lw.ln1), lw.qkv, m)
            q, k, v = qkv.split([c.q_size, c.kv_size, c.kv_size], dim=-1)
            q = self._rope(q.view(T, c.num_heads, c.head_dim), cos, sin)
            self.k[i, :, q_start:L] = self._rope(k.view(T, c.num_kv_heads, c.head_dim), cos, sin).transpose(0, 1)
            self.v[i, :, q_start:L] = v.view(T, c.num_kv_heads, c.head_dim).transpose(0, 1)
            a = attention_prefill(q, self.k[i, :, :L], self.v[i, :, :L], q_start)
            h = h + linear_prefill(a, lw.o, m)
            gu = linear_prefill(self._rms(h, lw.ln2), lw.gate_up, m)
            g, u = gu.chunk(2, dim=-1)
            h = h + linear_prefill(F.silu(g) * u, lw.down, m)
        return linear_prefill(self._rms(h[-1:], self.norm), self.head)[0].float()

    def _forward_triton(self, ids: torch.Tensor, q_start: int) -> torch.Tensor:
        """Same math; norm+residual, rope+cache write and silu*mul are one Triton kernel each."""
        from kernels.prefill_elementwise import add_rmsnorm, rope_qkv_to_cache, silu_mul
        c, T, m, eps = self.cfg, ids.shape[0], self.method, self.cfg.rms_eps
        L = q_start + T
        h = self.embed[ids]  # residual stream fp16 [T, hidden], updated in place
        x = add_rmsnorm(h, None, self.layers[0].ln1, eps)
        for i, lw in enumerate(self.layers):
            qkv = linear_prefill(x, lw.qkv, m)
            q = rope_qkv_to_cache(qkv, self.cos, self.sin, q_start, self.k[i], self.v[i], c.num_heads,
                                  c.num_kv_heads)
            a = attention_prefill(q, self.k[i, :, :L], self.v[i, :, :L], q_start)
            x = add_rmsnorm(h, linear_prefill(a, lw.o, m), lw.ln2, eps)
            d = linear_prefill(silu_mul(linear_prefill(x, lw.gate_up, m)), lw.down, m)
            nxt = self.layers[i + 1].ln1 if i + 1 < len(self.layers) else self.norm
            x = add_rmsnorm(h, d, nxt, eps)
        return linear_prefill(x[-1:], self.head)[0].float()

    def to_cpu_model(self, max_context: int):
        """The CPU reference engine.model.qwen2.Qwen2Model (fp32) holding the same (dequantized) weights."""
        from engine.model.qwen2 import Qwen2Model
        from kernels.prefill_reference import dequant_reference
        m = Qwen2Model(self.cfg, torch.float32)
        m.embed_tokens.weight.copy_(self.embed.float().cpu())
        m.norm.weight.copy_(self.norm.float().cpu())
        if m.lm_head is not None:
            m.lm_head.weight.copy_(self.head.weight.float().cpu())
        for lw, cl in zip(self.layers, m.layers):
            cl.input_layernorm.weight.copy_(lw.ln1.float().cpu())
            cl.post_attention_layernorm.weight.copy_(lw.ln2.float().cpu())
            cl.self_attn.qkv_proj.weight.copy_(dequant_reference(lw.qkv))
            cl.self_attn.qkv_proj.bias.copy_(lw.qkv.bias.float().cpu())
            cl.self_attn.o_proj.weight.copy_(dequant_reference(lw.o))
            cl.mlp.gate_up_proj.weight.copy_(dequant_reference(lw.gate_up))
            cl.mlp.down_proj.weight.copy_(dequant_reference(lw.down))
        return m
