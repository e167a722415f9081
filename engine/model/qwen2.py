"""Qwen2 decoder in plain PyTorch with a static KV cache (the CPU reference path): the modules hold the
weights, the math is the one forward (engine/model/forward.py) on kernels.ops_reference.RefOps.

Fused q/k/v and gate/up projections exist from construction; loaders write HF-named
tensors straight into their slices (seed 5.3: fusing after load doubled memory).
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from engine.config import ModelConfig
from engine.errors import ModelFileError
from engine.model.forward import forward
from engine.model.layout import BIASED, EMBED, HEAD, LINEARS, LayerWeights, linear_shape, locate
from kernels.ops_reference import Linear, RefOps, RMSNorm, Rotary


class KVCache:
    """Static cache: k/v [layers, slots, kv_heads, max_context, head_dim]."""

    def __init__(self, cfg: ModelConfig, slots: int, max_context: int, dtype=torch.float32, device="cpu"):
        shape = (cfg.num_layers, slots, cfg.num_kv_heads, max_context, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.slots, self.max_context = slots, max_context

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


def _linear(cfg: ModelConfig, mod: str, dtype, linear_dtype=None) -> Linear:
    """The fused linear `mod` of the layout table (shape, bias) as a reference Linear: its weight in linear_dtype
    (default dtype; "meta": no storage, a shape for Qwen2Model's streamed int8 load), a bias in dtype."""
    N, K = linear_shape(cfg, mod)
    meta = linear_dtype == "meta"
    return Linear(K, N, bias=mod in BIASED, dtype=dtype if meta else linear_dtype or dtype, bias_dtype=dtype,
                  device="meta" if meta else None)


class Attention(nn.Module):
    """Holds the fused q|k|v (with bias) and o linears; the math is RefOps.attention (one forward)."""

    def __init__(self, cfg: ModelConfig, dtype, linear_dtype=None):
        super().__init__()
        self.qkv_proj = _linear(cfg, "self_attn.qkv_proj", dtype, linear_dtype)
        self.o_proj = _linear(cfg, "self_attn.o_proj", dtype, linear_dtype)


class MLP(nn.Module):
    """Holds the fused gate|up and the down linears."""

    def __init__(self, cfg: ModelConfig, dtype, linear_dtype=None):
        super().__init__()
        self.gate_up_proj = _linear(cfg, "mlp.gate_up_proj", dtype, linear_dtype)
        self.down_proj = _linear(cfg, "mlp.down_proj", dtype, linear_dtype)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype, linear_dtype=None):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps, dtype)
        self.self_attn = Attention(cfg, dtype, linear_dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps, dtype)
        self.mlp = MLP(cfg, dtype, linear_dtype)


class Qwen2Model(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype=torch.float32, linear_dtype=None):
        """linear_dtype: the decoder linears' and an untied head's (default dtype); bfloat16 for a model that
        quantize_int8 turns int8 right after the load (half the load's peak RAM); "meta" for load_weights to stream
        them into int8 (no float copy of the whole model at any time)."""
        super().__init__()
        self.cfg, self.dtype = cfg, dtype
        # _weight: no random init of a [vocab, hidden] table that load_weights overwrites (1 s for the 0.5B on the CPU)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype,
                                         _weight=torch.empty(cfg.vocab_size, cfg.hidden_size, dtype=dtype))
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(DecoderLayer(cfg, dtype, linear_dtype) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, dtype)
        meta = linear_dtype == "meta"
        self.lm_head = None if cfg.tie_word_embeddings else \
            Linear(cfg.hidden_size, cfg.vocab_size, dtype=dtype if meta else linear_dtype or dtype,
                   device="meta" if meta else None)
        self.rope: Rotary | None = None
        # a quantized GGUF embedding left in the mapped file (engine/formats/gguf_rows.py MappedRows; the streamed
        # int8 / int4 loads): its rows are decoded per lookup and embed_tokens holds no table
        self.embed_map = None

    def embedding(self):
        """What the lookups read: the float table [vocab, H], or the MappedRows of the model file (m[ids], m[i])."""
        return self.embed_map if self.embed_map is not None else self.embed_tokens.weight

    def head_weight(self) -> torch.Tensor:
        if self.lm_head is not None:
            return self.lm_head.weight
        return self.embed_map.dense() if self.embed_map is not None else self.embed_tokens.weight

    def weights(self) -> SimpleNamespace:
        """The modules as the forward reads them (engine/model/forward.py); built per call so a swapped
        (e.g. quantized) linear module is picked up."""
        layers = [LayerWeights(L.input_layernorm.weight, L.post_attention_layernorm.weight, L.self_attn.qkv_proj,
                               L.self_attn.o_proj, L.mlp.gate_up_proj, L.mlp.down_proj) for L in self.layers]
        head = self.lm_head if self.lm_head is not None else getattr(self, "tied_head", None)
        return SimpleNamespace(embed=self.embedding(), layers=layers, norm=self.norm.weight,
                               lm_head=self.embed_tokens.weight if head is None else head)

    def quantize_int8(self):
        """EngineConfig.cpu_weights "int8" / "int4", after the load: every linear and the head that are still float
        become kernels.cpu_int8.Int8Linear, layer by layer (each float weight is released as its int8 copy is made; a
        streamed load, load_weights on meta linears, made them int8 or int4 already); a tied head gets its own copy:
        int4 from the embedding's 4-bit codes where the int4 load met them (engine/formats/gguf_int4.py), else int8;
        the embedding stays as loaded (the lookups read exact rows)."""
        from kernels.cpu_int8 import Int8Linear

        paths = [f"layers.{i}.{mod}" for i in range(len(self.layers)) for mod in LINEARS]
        for path in paths + ([] if self.lm_head is None else ["lm_head"]):
            lin = self.get_submodule(path)
            if isinstance(lin, Linear):
                self._replace(path, Int8Linear(lin.weight.data, lin.bias))
        if self.lm_head is None:
            q4 = getattr(self, "_embed_q4", None)
            if q4 is not None:
                from engine.formats import gguf_int4
                self.tied_head = None
                if gguf_int4.fits([q4]):
                    self._replace("tied_head", gguf_int4.int4_linear([q4]))
            if getattr(self, "tied_head", None) is None:  # int8 rows of the table (of the mapped file's, in chunks)
                self._replace("tied_head", Int8Linear(self.embed_map if self.embed_map is not None else
                                                      self.embed_tokens.weight.data))
        self._embed_q4 = None

    def _replace(self, path: str, module: nn.Module):
        """Put `module` at the module path (a layout name: 'layers.3.mlp.down_proj', 'lm_head', 'tied_head'); an int8 /
        int4 linear whose scales are not finite (a damaged model file) is refused here, the one place every CPU linear
        made at load passes, not turned into NaN answers later."""
        for name in ("scales", "sz"):
            t = getattr(module, name, None)
            if isinstance(t, torch.Tensor) and not bool(torch.isfinite(t).all()):
                raise ModelFileError(f"{path}: a scale is not a finite number (the model file is damaged)",
                                     "re-download the model (`deepinfer pull ...`)")
        owner, _, attr = path.rpartition(".")
        setattr(self.get_submodule(owner) if owner else self, attr, module)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache: KVCache, slots: list[int], starts: list[int],
                all_logits: bool = False) -> torch.Tensor:
        """ids [B, T] -> logits [B, vocab] of each row's last token (or [B, T, vocab] if all_logits)."""
        if self.rope is None or self.rope.cos.shape[0] < cache.max_context:
            self.rope = Rotary(self.cfg.head_dim, cache.max_context, self.cfg.rope_theta)
        ops = RefOps(ids, cache.k, cache.v, self.rope, slots, starts, self.cfg.num_heads, self.cfg.rms_eps, all_logits)
        out = forward(ops, self.weights())
        self.last_hidden = ops.hidden  # final normed rows the head read (draft heads, engine/runtime/draft_heads.py)
        return out

    # --- weight loading ------------------------------------------------------------------
    def target(self, name: str) -> tuple[torch.Tensor, slice | None]:
        """Where an HF-named tensor goes: (tensor, row slice of a fused matrix or None). Our module paths are the
        layout's names (engine/model/layout.py); an Int8Linear's bias is a buffer, found the same way."""
        p = locate(self.cfg, name)
        owner, _, attr = p.param.rpartition(".")
        return getattr(self.get_submodule(owner) if owner else self, attr), p.rows

    def load_weights(self, weights, expected: list[str], owned: bool = False):
        """Copy (hf_name, tensor) pairs into place; every expected name must arrive with its shape. Linears built on
        the meta device (linear_dtype "meta") are streamed into int8 or int4 instead (_stream_linear). owned: each
        tensor is a fresh one nobody else holds (the GGUF reader's dequantized arrays): a whole tensor of the
        parameter's dtype becomes the parameter instead of being copied into it (the embedding, o, down, the
        norms: about half of the 0.5B's bytes; docs/results/cpu_load_0.5b.json)."""
        seen = set()
        staged: dict[str, dict] = {}  # fused linear path -> its parts so far (_stream_linear)
        for name, t in weights:
            try:
                param, sl = self.target(name)
            except KeyError:
                if name == HEAD:
                    continue  # tied: the head is the embedding
                raise ModelFileError(f"unexpected tensor {name!r} in model file")
            if param.is_meta:
                self._stream_linear(name, t, sl, staged)
                seen.add(name)
                continue
            if name == EMBED and hasattr(t, "rows"):  # gguf_rows.MappedRows: the table stays in the model file
                if tuple(t.shape) != tuple(param.shape):
                    raise ModelFileError(f"tensor {name} has shape {tuple(t.shape)}, expected {tuple(param.shape)}")
                self.embed_map = t
                self.embed_tokens.weight = nn.Parameter(param.new_empty(0, param.shape[1]), requires_grad=False)
                from engine.formats import gguf_int4
                if self.cfg.tie_word_embeddings and t.t.type_name in gguf_int4.FOUR_BIT:
                    self._embed_q4 = gguf_int4.Q4Tensor(t.t)  # the tied head's int4 codes (quantize_int8)
                seen.add(name)
                continue
            if not isinstance(t, torch.Tensor):  # a file's 4-bit tensor (gguf_int4.Q4Tensor) that is not a linear
                t = t.dequantize()
            dst = param.data if sl is None else param.data[sl]
            if tuple(dst.shape) != tuple(t.shape):
                raise ModelFileError(f"tensor {name} has shape {tuple(t.shape)}, expected {tuple(dst.shape)}")
            if owned and sl is None and t.dtype == dst.dtype and t.is_contiguous():
                param.data = t
            else:
                dst.copy_(t)
            seen.add(name)
        missing = [n for n in expected if n not in seen]
        if missing:
            raise ModelFileError(f"model file lacks {len(missing)} tensors (first: {missing[0]})",
                                 "the file is incomplete: re-download or re-export it")
        if staged:
            raise ModelFileError(f"model file lacks rows of {next(iter(staged))}", "the file is incomplete: "
                                 "re-download it")

    def _stream_linear(self, name: str, t, sl, staged: dict):
        """One HF tensor of a linear built on the meta device: a whole linear becomes an Int8Linear
        (kernels/cpu_int8.py) at once, or an Int4Linear (kernels/cpu_int4.py) from a file's 4-bit codes
        (engine/formats/gguf_int4.py Q4Tensor, the int4 load); a fused one's parts are kept until every row has
        arrived: 4-bit parts as they are, float parts in a float32 staging copy of the linear. All parts 4-bit: an
        Int4Linear; else the 4-bit parts are dequantized into the copy and it becomes an Int8Linear and is freed, so
        at most the fused linears in flight exist in float32."""
        from engine.formats import gguf_int4
        from kernels.cpu_int8 import Int8Linear

        path = locate(self.cfg, name).name
        lin = self.get_submodule(path)
        N, K = lin.weight.shape
        if sl is None:  # the whole linear in one tensor (o, down, an untied head): straight from it, no copy
            if tuple(t.shape) != (N, K):
                raise ModelFileError(f"tensor {name} has shape {tuple(t.shape)}, expected {(N, K)}")
            if isinstance(t, torch.Tensor):
                self._replace(path, Int8Linear(t, lin.bias))
            else:
                self._replace(path, gguf_int4.int4_linear([t], lin.bias) if gguf_int4.fits([t]) else
                              Int8Linear(t.dequantize(), lin.bias))
            return
        st = staged.setdefault(path, {"parts": {}, "rows": 0, "buf": None})
        n = sl.stop - sl.start
        if tuple(t.shape) != (n, K):
            raise ModelFileError(f"tensor {name} has shape {tuple(t.shape)}, expected {(n, K)}")
        if isinstance(t, torch.Tensor):
            if st["buf"] is None:
                st["buf"] = torch.empty(N, K, dtype=torch.float32)
            st["buf"][sl].copy_(t)
        else:
            st["parts"][sl.start] = t
        st["rows"] += n
        if st["rows"] < N:
            return
        parts = [st["parts"][r] for r in sorted(st["parts"])]
        if st["buf"] is None and gguf_int4.fits(parts):
            self._replace(path, gguf_int4.int4_linear(parts, lin.bias))
        else:
            buf = st["buf"] if st["buf"] is not None else torch.empty(N, K, dtype=torch.float32)
            for r0, p in st["parts"].items():
                buf[r0:r0 + p.shape[0]].copy_(p.dequantize())
            self._replace(path, Int8Linear(buf, lin.bias))
        del staged[path]
