"""The GPU Qwen2 forward: a CUDA-graph decode step of 7 kernels per layer, and a prefill on torch + engine.model.gpu_prefill.

Decode step for B <= 8 tokens (kernels/decode_*.cu):
    embed -> [rmsnorm -> qkv GEMV(+bias) -> attention(rope, KV write, split-K) -> o GEMV(+residual)
              -> rmsnorm -> gate_up GEMV(silu*mul) -> down GEMV(+residual)] x layers -> rmsnorm -> lm_head GEMV
              (+fused greedy argmax)
The residual stream is fp32; activations fp16. The step is captured once per batch size B and replayed
with static input buffers (tokens, positions, slots) refreshed before each replay; the only host sync is
reading the sampled ids (and the logits rows of non-greedy sequences).

Prefill (prefill_mode): "graph" (CUDA default) replays a CUDA graph per length bucket for the first
chunk of a prompt (engine/model/gpu_prefill_graph.py) and runs other chunks on "fused": per layer
add+rmsnorm, qkv linear, rope+KV write, flash attention, o linear, add+rmsnorm, gate_up linear,
silu*mul, down linear (kernels/prefill_elementwise.py + engine/model/gpu_prefill.py, ~14 launches).
"torch" is the plain torch version of the same math (the CPU path, and a reference on the GPU).
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from engine.config import PREFILL_CHUNK
from engine.model.gpu_load import GPUWeights
from engine.model.graph_capture import capture
from kernels.qweight import QWeight
from kernels.ops_reference import Rotary
from kernels.decode_kernels import MAX_TOKENS, AttnWorkspace, DecodeKernels, keys_to_ids

LOGITS_CHUNK = 512  # all-position logits: tokens per lm_head call
log = logging.getLogger("deepinfer.gpu")


def staging_rows(prefill_chunk: int, graph_buckets: tuple[int, ...] | None) -> int:
    """Rows of the host-embedding staging buffer: a decode step, a prefill chunk or a graph bucket
    (prefill_chunk 0 / graph_buckets None = the defaults). fp32 x hidden bytes each."""
    from engine.model.gpu_prefill_graph import BUCKETS
    return max(MAX_TOKENS, prefill_chunk or PREFILL_CHUNK, *(BUCKETS if graph_buckets is None else graph_buckets))


class _Eager:
    """Stands in for a decode graph whose capture failed twice: replay() runs the step eagerly."""

    def __init__(self, step):
        self.replay = step


class GPUModel:
    def __init__(self, w: GPUWeights, slots: int, max_context: int, device="cuda", prefill_chunk: int = 0,
                 graph_buckets: tuple[int, ...] | None = None):
        """prefill_chunk: tokens per prefill forward (0 = PREFILL_CHUNK); graph_buckets: prefill graph
        lengths (None = gpu_prefill_graph.BUCKETS). Both set GPU memory (engine/runtime/memory_plan.py plan_memory)."""
        c = self.cfg = w.cfg
        self.w, self.device, self.max_context = w, torch.device(device), max_context
        self.prefill_chunk = prefill_chunk or PREFILL_CHUNK
        self.cuda = self.device.type == "cuda"
        if self.cuda:
            self.kn = DecodeKernels.get(self.device)
        else:  # the same step on the PyTorch references (CPU tests)
            from kernels.decode_reference import RefKernels
            self.kn = RefKernels()
        if c.num_heads // c.num_kv_heads > 8 or c.head_dim not in (64, 128):
            raise ValueError("decode kernels support head_dim 64/128 and <= 8 query heads per KV head")
        dev = self.device
        shape = (c.num_layers, slots, c.num_kv_heads, max_context, c.head_dim)
        self.kc = torch.zeros(shape, dtype=torch.float16, device=dev)
        self.vc = torch.zeros(shape, dtype=torch.float16, device=dev)
        rope = Rotary(c.head_dim, max_context, c.rope_theta)
        self.cos, self.sin = rope.cos.to(dev), rope.sin.to(dev)
        M = MAX_TOKENS
        z = lambda *s, dt=torch.float16: torch.zeros(*s, dtype=dt, device=dev)  # noqa: E731
        self.meta = z(3, M, dt=torch.int32)  # tokens, positions, slots of the step
        self.meta_host = torch.zeros(3, M, dtype=torch.int32, pin_memory=self.cuda)
        self.h = z(M, c.hidden_size, dt=torch.float32)
        self.x = z(M, c.hidden_size)
        self.qkv = z(M, c.q_size + 2 * c.kv_size)
        self.attn = z(M, c.q_size)
        self.act = z(M, c.intermediate_size)
        self.logits = z(M, c.vocab_size, dt=torch.float32)
        self.keys = z(M, dt=torch.int64)
        self.host_embed = w.host_embed  # HostEmbedding (rows staged from host RAM) or None (embed_rows)
        if self.host_embed is not None:  # staging: decode rows and prefill chunks / graph buckets
            R = staging_rows(self.prefill_chunk, graph_buckets)
            self.h_in = z(R, c.hidden_size, dt=torch.float32)
            self.h_in_host = torch.zeros(R, c.hidden_size, dtype=torch.float32, pin_memory=self.cuda)
        self.keys_host = torch.zeros(M, dtype=torch.int64, pin_memory=self.cuda)
        self.ws = AttnWorkspace(M, c.num_heads, c.num_kv_heads, c.head_dim, dev,
                                sms=self.kn.sms if self.cuda else 8)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None
        self.use_graphs = self.cuda
        self.prefill_mode = "graph" if self.cuda else "torch"  # "graph" | "fused" | "torch"
        self.prefill_graphs = None
        if self.cuda:
            from engine.model.gpu_prefill_graph import PrefillGraphs
            self.prefill_graphs = PrefillGraphs(self, **({} if graph_buckets is None else {"buckets": graph_buckets}))

    # --- decode ----------------------------------------------------------------------------
    def _lin(self, w: QWeight, x: torch.Tensor, B: int, epi: str, out: torch.Tensor, keys=None):
        if w.bits != 16:
            return self.kn.gemv(w, x, B, epi, out, keys)
        y = F.linear(x[:B], w.weight, w.bias if epi == "store" else None)  # dense fp16 fallback (capturable)
        if epi == "store":
            out[:B] = y
        elif epi == "resid":
            out[:B] += y.float()
        elif epi == "silu":
            g, u = y.float().chunk(2, dim=-1)
            out[:B] = (F.silu(g) * u).half()
        else:
            out[:B] = y.float()
            keys[:B] = 0xFFFFFFFF - out[:B].argmax(-1)

    def _step(self, B: int):
        """Launch the whole decode step for the first B rows of the static buffers (eager or captured)."""
        c, w, kn = self.cfg, self.w, self.kn
        tokens, pos, slots = self.meta[0], self.meta[1], self.meta[2]
        self._embed(tokens, B, self.h, self.keys)
        rep = c.num_heads // c.num_kv_heads
        for i, L in enumerate(w.layers):
            kn.rmsnorm(self.h, L.in_norm, c.rms_eps, B, self.x)
            self._lin(L.qkv, self.x, B, "store", self.qkv)
            kn.attention(self.qkv, self.kc[i], self.vc[i], slots, pos, self.cos, self.sin, B, c.num_kv_heads,
                         rep, c.head_dim, self.max_context, self.attn, self.ws)
            self._lin(L.o, self.attn, B, "resid", self.h)
            kn.rmsnorm(self.h, L.post_norm, c.rms_eps, B, self.x)
            self._lin(L.gate_up, self.x, B, "silu", self.act)
            self._lin(L.down, self.act, B, "resid", self.h)
        kn.rmsnorm(self.h, w.norm, c.rms_eps, B, self.x)
        self._lin(w.lm_head, self.x, B, "logits", self.logits, self.keys)

    def decode(self, tokens: list[int], positions: list[int], slots: list[int]) -> tuple[list[int], torch.Tensor]:
        """One token for each of B <= 8 sequences: feed tokens[b] at positions[b] of slots[b].
        Returns (greedy ids, logits fp32 [B, vocab] on the GPU, valid until the next call)."""
        B = len(tokens)
        assert 1 <= B <= MAX_TOKENS
        mh = self.meta_host
        mh[0, :B] = torch.tensor(tokens, dtype=torch.int32)
        mh[1, :B] = torch.tensor(positions, dtype=torch.int32)
        mh[2, :B] = torch.tensor(slots, dtype=torch.int32)
        self.meta.copy_(mh, non_blocking=True)
        if self.host_embed is not None:
            self.stage_embeddings(tokens, blocking=False)  # the step syncs before the next call writes again
        if not self.use_graphs:
            self._step(B)
        else:
            g = self.graphs.get(B)
            if g is None:
                self._step(B)  # this step, eagerly (also loads every kernel before capture)
                torch.cuda.synchronize()
                if self.pool is None:
                    self.pool = torch.cuda.graph_pool_handle()
                try:
                    g, _ = capture(lambda: self._step(B), self.pool)
                except RuntimeError as e:  # both tries failed: this batch size stays eager
                    log.warning("decode graph for batch %d disabled: %s", B, str(e).splitlines()[0])
                    g = self.graphs[B] = _Eager(lambda: self._step(B))
                else:
                    self.graphs[B] = g
            g.replay()  # a captured graph was already replayed once by capture (capture runs nothing);
            # replaying the step again is idempotent: it reads meta and writes the same cache rows
        self.keys_host.copy_(self.keys, non_blocking=self.cuda)
        if self.cuda:
            torch.cuda.current_stream().synchronize()
        return keys_to_ids(self.keys_host.numpy()[:B]), self.logits[:B]

    def warmup(self, max_batch: int) -> dict:
        """Capture every CUDA graph a request can need now (decode at batch 1..min(8, slots), each prefill
        bucket), so no request pays a capture (~50-200 ms each) later. Writes scratch K/V into slots that
        a real sequence overwrites before it reads them (prefill writes positions 0.. first).
        Returns {"decode": [B...], "prefill": [buckets...]}."""
        slots = self.kc.shape[1]
        nb = min(MAX_TOKENS, max_batch, slots)
        for B in range(1, nb + 1):
            self.decode([0] * B, [0] * B, list(range(B)))
        if self.prefill_graphs is not None and self.prefill_mode == "graph":
            for b in self.prefill_graphs.buckets:
                self.prefill([0] * b, 0, 0)
        return {"decode": sorted(self.graphs), "prefill": sorted(self.prefill_graphs.graphs)
                if self.prefill_graphs is not None else []}

    # --- embedding ---------------------------------------------------------------------------
    def _embed(self, toks: torch.Tensor, T: int, h: torch.Tensor, keys: torch.Tensor):
        """h fp32 [T, hidden] = embedding rows of toks (device int32); keys[:T] = 0. With the embedding in
        host RAM the rows were staged into h_in by stage_embeddings (same ids, same order)."""
        if self.host_embed is not None:
            self.kn.copy_rows(self.h_in, T, h, keys)
        else:
            self.kn.embed(toks, self.w.embed, T, h, keys)

    def stage_embeddings(self, ids: list[int], blocking: bool = True):
        """Dequantize the rows of ids on the CPU into the pinned buffer and copy them to h_in[:len(ids)].
        blocking=False only where the caller syncs before the pinned buffer is written again."""
        n = len(ids)
        assert n <= self.h_in.shape[0]
        self.host_embed.rows(ids, self.h_in_host)
        self.h_in[:n].copy_(self.h_in_host[:n], non_blocking=self.cuda and not blocking)

    # --- prefill ---------------------------------------------------------------------------
    def _norm(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.cfg.rms_eps) * weight).half()

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).half()

    @torch.inference_mode()
    def prefill(self, ids: list[int], slot: int, start: int = 0, all_logits: bool = False) -> torch.Tensor:
        """Run ids at positions start.. of `slot` (chunked); logits fp32 of the last token [vocab]
        (or of every token [T, vocab])."""
        outs = []
        for s in range(0, len(ids), self.prefill_chunk):
            chunk, out = ids[s:s + self.prefill_chunk], None
            if self.prefill_mode == "graph" and self.prefill_graphs is not None and start + s == 0 \
                    and not all_logits:
                out = self.prefill_graphs.run(chunk, slot)  # None: no bucket fits -> eager
            outs.append(out if out is not None else self._prefill_chunk(chunk, slot, start + s, all_logits))
        return torch.cat(outs) if all_logits else outs[-1]

    def _linear(self, x: torch.Tensor, w: QWeight) -> torch.Tensor:
        if self.cuda:
            from engine.model.gpu_prefill import linear_prefill
            return linear_prefill(x, w)
        from kernels.decode_reference import gemv_ref
        return gemv_ref(x, w).half()

    def _attend(self, q, k, v, p0: int) -> torch.Tensor:
        if self.cuda:
            from engine.model.gpu_prefill import attention_prefill
            return attention_prefill(q, k, v, p0)
        from kernels.ops_reference import gqa_attention
        return gqa_attention(q.float(), k.float(), v.float(), p0).half()

    def _prefill_chunk(self, ids: list[int], slot: int, p0: int, all_logits: bool) -> torch.Tensor:
        """One chunk at positions p0.. of `slot`, eagerly: logits fp32 [vocab] (or [T, vocab])."""
        if self.host_embed is not None:
            self.stage_embeddings(ids)
        if self.prefill_mode == "torch":
            return self._prefill_chunk_torch(ids, slot, p0, all_logits)
        T = len(ids)
        toks = torch.tensor(ids, dtype=torch.int32, device=self.device)
        out = self._forward_fused(toks, T, p0, lambda i: (self.kc[i, slot], self.vc[i, slot]),
                                  None if all_logits else T - 1)
        return out if all_logits else out[0]

    def _forward_fused(self, toks: torch.Tensor, T: int, p0: int, kv, last) -> torch.Tensor:
        """toks int32 [T] on the device at positions p0..; kv(i) -> (k, v) fp16 [Hkv, >= p0+T, hd] of
        layer i (the slot's cache, or the graph's staging) receiving positions p0.. and read by attention;
        last: row whose logits come back (int, or an int tensor [1] on the device for graphs), None =
        every row. Returns logits fp32 [1, vocab] (or [T, vocab]). The residual stream h is fp32."""
        from engine.model.gpu_prefill import attention_prefill, linear_prefill
        from kernels.prefill_elementwise import add_rmsnorm, rope_qkv_to_cache, silu_mul
        c, w, eps, n = self.cfg, self.w, self.cfg.rms_eps, len(self.w.layers)
        h = torch.empty(T, c.hidden_size, dtype=torch.float32, device=self.device)
        keys = torch.empty(T, dtype=torch.int64, device=self.device)
        self._embed(toks, T, h, keys)
        x = add_rmsnorm(h, None, w.layers[0].in_norm, eps)
        for i, L in enumerate(w.layers):
            k, v = kv(i)
            q = rope_qkv_to_cache(linear_prefill(x, L.qkv), self.cos, self.sin, p0, k, v, c.num_heads,
                                  c.num_kv_heads)
            a = attention_prefill(q, k[:, :p0 + T], v[:, :p0 + T], p0)
            x = add_rmsnorm(h, linear_prefill(a, L.o), L.post_norm, eps)  # h += o(a); x = norm(h)
            d = linear_prefill(silu_mul(linear_prefill(x, L.gate_up)), L.down)
            x = add_rmsnorm(h, d, w.layers[i + 1].in_norm if i + 1 < n else w.norm, eps)
        if last is None:
            return torch.cat([linear_prefill(x[s:s + LOGITS_CHUNK], w.lm_head).float()
                              for s in range(0, T, LOGITS_CHUNK)])
        rows = x[last:last + 1] if isinstance(last, int) else x.index_select(0, last)
        return linear_prefill(rows, w.lm_head).float()

    def _prefill_chunk_torch(self, ids: list[int], slot: int, p0: int, all_logits: bool) -> torch.Tensor:
        c, w, dev = self.cfg, self.w, self.device
        T = len(ids)
        toks = torch.tensor(ids, dtype=torch.int32, device=dev)
        h = torch.empty(T, c.hidden_size, dtype=torch.float32, device=dev)
        keys = torch.empty(T, dtype=torch.int64, device=dev)
        self._embed(toks, T, h, keys)
        pos = torch.arange(p0, p0 + T, device=dev)
        H, Hkv, hd = c.num_heads, c.num_kv_heads, c.head_dim
        for i, L in enumerate(w.layers):
            qkv = self._linear(self._norm(h, L.in_norm), L.qkv)
            q, k, v = qkv.split([c.q_size, c.kv_size, c.kv_size], dim=-1)
            q = self._rope(q.reshape(T, H, hd), pos)
            self.kc[i, slot, :, p0:p0 + T] = self._rope(k.reshape(T, Hkv, hd), pos).transpose(0, 1)
            self.vc[i, slot, :, p0:p0 + T] = v.reshape(T, Hkv, hd).transpose(0, 1)
            a = self._attend(q, self.kc[i, slot, :, :p0 + T], self.vc[i, slot, :, :p0 + T], p0)
            h += self._linear(a, L.o).float()
            gu = self._linear(self._norm(h, L.post_norm), L.gate_up)
            g, u = gu.chunk(2, dim=-1)
            h += self._linear(F.silu(g) * u, L.down).float()
        if not all_logits:
            return self._linear(self._norm(h[-1:], w.norm), w.lm_head).float()[0]
        return torch.cat([self._linear(self._norm(h[s:s + LOGITS_CHUNK], w.norm), w.lm_head).float()
                          for s in range(0, T, LOGITS_CHUNK)])

    def memory(self) -> dict:
        kv = 2 * self.kc.numel() * 2
        work = sum(t.numel() * t.element_size() for t in (self.h, self.x, self.qkv, self.attn, self.act,
                                                          self.logits, self.keys)) + self.ws.nbytes()
        if self.host_embed is not None:
            work += self.h_in.numel() * 4
        return {"weights_bytes": self.w.nbytes(), "kv_cache_bytes": kv, "workspace_bytes": work,
                "embedding_in_host_ram_bytes": self.host_embed.nbytes() if self.host_embed is not None else 0,
                "allocated_bytes": torch.cuda.memory_allocated(self.device) if self.cuda else 0,
                "reserved_bytes": torch.cuda.memory_reserved(self.device) if self.cuda else 0,
                "graphs": sorted(self.graphs),
                "prefill_graphs": sorted(self.prefill_graphs.graphs) if self.prefill_graphs else [],
                "prefill_graph_staging_bytes": self.prefill_graphs.nbytes() if self.prefill_graphs else 0}
