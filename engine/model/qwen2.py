"""Qwen2 decoder in plain PyTorch with a static KV cache (the CPU reference path).

Fused q/k/v and gate/up projections exist from construction; loaders write HF-named
tensors straight into their slices (seed 5.3: fusing after load doubled memory).
"""
from __future__ import annotations

import torch
from torch import nn

from engine.config import ModelConfig
from engine.errors import ModelFileError
from kernels.ops_reference import Linear, RMSNorm, Rotary, gqa_attention, silu_and_mul


class KVCache:
    """Static cache: k/v [layers, slots, kv_heads, max_context, head_dim]."""

    def __init__(self, cfg: ModelConfig, slots: int, max_context: int, dtype=torch.float32, device="cpu"):
        shape = (cfg.num_layers, slots, cfg.num_kv_heads, max_context, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.slots, self.max_context = slots, max_context

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype):
        super().__init__()
        self.cfg = cfg
        self.qkv_proj = Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=True, dtype=dtype)
        self.o_proj = Linear(cfg.q_size, cfg.hidden_size, dtype=dtype)

    def forward(self, x, layer: int, rope: Rotary, cache: KVCache, slots, starts):
        """x [B, T, hidden]; row b holds tokens at positions starts[b] .. starts[b]+T-1 of slot slots[b]."""
        c = self.cfg
        B, T, _ = x.shape
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split([c.q_size, c.kv_size, c.kv_size], dim=-1)
        outs = []
        for b in range(B):
            s, p0 = slots[b], starts[b]
            pos = torch.arange(p0, p0 + T)
            qb = rope.apply(q[b].view(T, c.num_heads, c.head_dim), pos)
            kb = rope.apply(k[b].view(T, c.num_kv_heads, c.head_dim), pos)
            cache.k[layer, s, :, p0:p0 + T] = kb.transpose(0, 1)
            cache.v[layer, s, :, p0:p0 + T] = v[b].view(T, c.num_kv_heads, c.head_dim).transpose(0, 1)
            outs.append(gqa_attention(qb, cache.k[layer, s, :, :p0 + T], cache.v[layer, s, :, :p0 + T], p0))
        return self.o_proj(torch.stack(outs))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype):
        super().__init__()
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, dtype=dtype)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, dtype=dtype)

    def forward(self, x):
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps, dtype)
        self.self_attn = Attention(cfg, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps, dtype)
        self.mlp = MLP(cfg, dtype)


class Qwen2Model(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype=torch.float32):
        super().__init__()
        self.cfg, self.dtype = cfg, dtype
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(DecoderLayer(cfg, dtype) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, dtype)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(cfg.hidden_size, cfg.vocab_size, dtype=dtype)
        self.rope: Rotary | None = None

    def head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache: KVCache, slots: list[int], starts: list[int],
                all_logits: bool = False) -> torch.Tensor:
        """ids [B, T] -> logits [B, vocab] of each row's last token (or [B, T, vocab] if all_logits)."""
        if self.rope is None or self.rope.cos.shape[0] < cache.max_context:
            self.rope = Rotary(self.cfg.head_dim, cache.max_context, self.cfg.rope_theta)
        h = self.embed_tokens(ids)
        for i, layer in enumerate(self.layers):
            h = h + layer.self_attn(layer.input_layernorm(h), i, self.rope, cache, slots, starts)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        h = self.norm(h if all_logits else h[:, -1])
        if self.lm_head is None:
            return (h @ self.embed_tokens.weight.T).float()
        return self.lm_head(h).float()

    # --- weight loading ------------------------------------------------------------------
    def target(self, name: str) -> tuple[torch.Tensor, slice | None]:
        """Where an HF-named tensor goes: (parameter, row slice of a fused matrix or None)."""
        c = self.cfg
        if name == "model.embed_tokens.weight":
            return self.embed_tokens.weight, None
        if name == "model.norm.weight":
            return self.norm.weight, None
        if name == "lm_head.weight":
            if self.lm_head is None:
                raise KeyError(name)  # tied: ignored by the caller
            return self.lm_head.weight, None
        parts = name.split(".")  # model.layers.N.<module>.<proj>.<weight|bias>
        if parts[:2] != ["model", "layers"]:
            raise KeyError(name)
        layer = self.layers[int(parts[2])]
        mod, kind = ".".join(parts[3:-1]), parts[-1]
        qkv = {"self_attn.q_proj": slice(0, c.q_size), "self_attn.k_proj": slice(c.q_size, c.q_size + c.kv_size),
               "self_attn.v_proj": slice(c.q_size + c.kv_size, c.q_size + 2 * c.kv_size)}
        if mod in qkv:
            return getattr(layer.self_attn.qkv_proj, kind), qkv[mod]
        ffn = c.intermediate_size
        if mod in ("mlp.gate_proj", "mlp.up_proj"):
            return layer.mlp.gate_up_proj.weight, slice(0, ffn) if mod.endswith("gate_proj") else slice(ffn, 2 * ffn)
        simple = {"self_attn.o_proj": layer.self_attn.o_proj, "mlp.down_proj": layer.mlp.down_proj,
                  "input_layernorm": layer.input_layernorm, "post_attention_layernorm": layer.post_attention_layernorm}
        if mod in simple:
            return getattr(simple[mod], kind), None
        raise KeyError(name)

    def load_weights(self, weights, expected: list[str]):
        """Copy (hf_name, tensor) pairs into place; every expected name must arrive with its shape."""
        seen = set()
        for name, t in weights:
            try:
                param, sl = self.target(name)
            except KeyError:
                if name == "lm_head.weight":
                    continue
                raise ModelFileError(f"unexpected tensor {name!r} in model file")
            dst = param.data if sl is None else param.data[sl]
            if tuple(dst.shape) != tuple(t.shape):
                raise ModelFileError(f"tensor {name} has shape {tuple(t.shape)}, expected {tuple(dst.shape)}")
            dst.copy_(t)
            seen.add(name)
        missing = [n for n in expected if n not in seen]
        if missing:
            raise ModelFileError(f"model file lacks {len(missing)} tensors (first: {missing[0]})",
                                 "the file is incomplete: re-download or re-export it")
