"""The GPU Qwen2 model: static buffers, KV cache and CUDA graphs around the one forward (engine/model/forward.py)
run on the decode ops (engine/model/ops_step.py) or the prefill ops (engine/model/ops_prefill.py).

Decode step for B <= 8 tokens (kernels/decode_*.cu):
    embed -> [qkv GEMV(+bias) -> attention(rope, KV write, split-K) -> o GEMV(+residual)
              -> gate_up GEMV(silu*mul) -> down GEMV(+residual)] x layers -> rmsnorm -> lm_head GEMV
              (+fused greedy argmax); each layer's two rmsnorms deferred into the kernels around them
              (ops_step.py, decode_norm.cu; DEEPINFER_DEFER_NORM=0: their own launches)
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
import os

import torch

from engine.config import PREFILL_CHUNK
from engine.model.chain_sampler import ChainSampler
from engine.model.forward import forward
from engine.model.gpu_load import GPUWeights
from engine.model.gpu_prefill import attention_prefill, linear_prefill
from engine.model.gpu_prefill_graph import BUCKETS, PrefillGraphs
from engine.model.graph_capture import capture
from engine.model.ops_prefill import PrefillOps
from engine.model.ops_prefill_offset import OffsetPrefillOps
from engine.model.l2_prefetch import PrefetchPlan, step_weights
from engine.model.l2_prefetch import config_from_env as prefetch_config
from engine.model.ops_step import StepOps
from engine.runtime.sampling import SamplingParams
from kernels.decode_kernels import (CHAIN_PATH, MAX_TOKENS, AttnWorkspace, DecodeKernels, keys_to_ids, pack_path,
                                    tree_roots)
from kernels.decode_reference import RefKernels, gemv_ref
from kernels.ops_reference import Rotary, gqa_attention
from kernels.triton_check import prefill_backend

log = logging.getLogger("deepinfer.gpu")


def staging_rows(prefill_chunk: int, graph_buckets: tuple[int, ...] | None) -> int:
    """Rows of the host-embedding staging buffer: a decode step, a prefill chunk or a graph bucket
    (prefill_chunk 0 / graph_buckets None = the defaults). fp32 x hidden bytes each."""
    return max(MAX_TOKENS, prefill_chunk or PREFILL_CHUNK, *(BUCKETS if graph_buckets is None else graph_buckets))


class _Eager:
    """Stands in for a decode graph whose capture failed twice: replay() runs the step eagerly."""

    def __init__(self, step):
        self.replay = step


def chain_keys_mode(env: str | None, unified: bool) -> str:
    """How decode_chain's argmax keys reach the host: DEEPINFER_CHAIN_KEYS ("kernel" unless set), and "copy" where
    the device cannot write pinned memory by its host pointer (no unified addressing), logged."""
    mode = env or "kernel"
    if mode not in ("kernel", "copy"):
        raise ValueError(f"DEEPINFER_CHAIN_KEYS={mode!r}: 'kernel' or 'copy'")
    if mode == "kernel" and not unified:
        log.warning("this GPU reports no unified addressing: chained decode steps copy their keys to the host")
        return "copy"
    return mode


class GPUModel:
    def __init__(self, w: GPUWeights, slots: int, max_context: int, device="cuda", prefill_chunk: int = 0,
                 graph_buckets: tuple[int, ...] | None = None):
        """prefill_chunk: tokens per prefill forward (0 = PREFILL_CHUNK); graph_buckets: prefill graph
        lengths (None = gpu_prefill_graph.BUCKETS). Both set GPU memory (engine/runtime/memory_plan.py plan_memory)."""
        c = self.cfg = w.cfg
        self.w, self.device, self.max_context = w, torch.device(device), max_context
        self.prefill_chunk = prefill_chunk or PREFILL_CHUNK
        self.cuda = self.device.type == "cuda"
        # the layers' rmsnorms deferred into the kernels around them (ops_step.StepOps, decode_norm.cu): 5 kernels per
        # layer instead of 7 (DEEPINFER_DEFER_NORM=0), 2.7-5.4% faster decoding (3B W4 H200 861 vs 838 tok/s, H100
        # 818 vs 776). Off by default for one session (the twenty-first) because a verify row parted from the
        # one-token step by an fp16 ulp; found since: the qkv GEMV's epilogue rounded column 0 and 1..3 differently
        # (decode_gemv.cu, fixed), and verify rows are bit-exact again (docs/hotpath.md, "The parting found")
        self.defer_norm = os.environ.get("DEEPINFER_DEFER_NORM", "1") != "0"
        self._q8 = False  # the q8 property below
        if self.cuda:
            self.kn = DecodeKernels.get(self.device)
        else:  # the same step on the PyTorch references (CPU tests)
            self.kn = RefKernels()
        # int8 activations in the W4 GEMVs (llama.cpp's batch-1 numerics: kernels/q8_plan.py, decode_gemv.cu q8_kloop;
        # other bits than the fp16 kernels', so off unless asked, docs/gpu.md): DEEPINFER_DECODE_Q8 "1" the batch-1
        # steps, "all" every step (batches and verify rows too: a token's bits then do not depend on the batch)
        q8env = os.environ.get("DEEPINFER_DECODE_Q8", "0")
        self.q8_all = q8env == "all"
        self.q8 = q8env in ("1", "all")
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
        # tokens, positions (cache rows), slots of the step; verify steps also read rows 3-4: each row's sequence
        # position and packed root path (a chain of drafts: positions and the identity; a tree: verify's parents)
        self.meta = z(5, M, dt=torch.int32)
        self.meta_host = torch.zeros(5, M, dtype=torch.int32, pin_memory=self.cuda)
        self.meta_np = self.meta_host.numpy()
        self.h = z(M, c.hidden_size, dt=torch.float32)
        self.x = z(M, c.hidden_size)
        self.qkv = z(M, c.q_size + 2 * c.kv_size)
        self.attn = z(M, c.q_size)
        self.act = z(M, c.intermediate_size)
        self.logits = z(M, c.vocab_size, dt=torch.float32)
        self.keys = z(M, dt=torch.int64)
        self.ss = z(2 * c.num_layers + 1, M, dt=torch.int64)  # the deferred norms' sums of squares (fixed point)
        self.host_embed = w.host_embed  # HostEmbedding (rows staged from host RAM) or None (embed_rows)
        if self.host_embed is not None:  # staging: decode rows and prefill chunks / graph buckets
            R = staging_rows(self.prefill_chunk, graph_buckets)
            self.h_in = z(R, c.hidden_size, dt=torch.float32)
            self.h_in_host = torch.zeros(R, c.hidden_size, dtype=torch.float32, pin_memory=self.cuda)
        self.keys_host = torch.zeros(M, dtype=torch.int64, pin_memory=self.cuda)
        self.ws = AttnWorkspace(M, c.num_heads, c.num_kv_heads, c.head_dim, dev,
                                sms=self.kn.sms if self.cuda else 8)
        # the step's GEMVs prefetch the next weights into L2 (engine/model/l2_prefetch.py; DEEPINFER_L2_PREFETCH)
        self.prefetch = None
        if self.cuda:
            l2 = torch.cuda.get_device_properties(self.device).L2_cache_size
            self.prefetch = PrefetchPlan(step_weights(w), l2, prefetch_config(), dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        # from merge_from rows on (a step's largest L) steps replay the long-context graphs, whose attention leaves
        # its split partials to a merge launch of its own (StepOps merge, decode_attn.cu attn_merge_body: the same
        # bits, spread over H x B blocks instead of one block per KV head); DEEPINFER_ATTN_MERGE_FROM, 0 = never.
        # By default only where a token has >= 32 splits (measured on the H200's 66 / 33): with few splits (an RTX
        # 3050's 20 SMs give 10) the in-kernel merge is short and the extra launch would not pay (not measured)
        env = os.environ.get("DEEPINFER_ATTN_MERGE_FROM")
        self.merge_from = int(env) if env is not None else (4096 if self.ws.splits(1) >= 32 else 0)
        # who merges in those graphs' plain steps: "launch" attn_merge (default), "grid" the attention launch itself,
        # every split's block a slice after a barrier (decode_attn.cu attn_grid_merge, no kernel boundary; needs
        # DEEPINFER_KERNEL_DEFINES=-DATT_GRID_MERGE=1 and is not yet timed on a GPU: engine/bench/device_gmerge.sh);
        # verify steps (the tree kernel's blocks loop over splits, so no barrier) always use attn_merge. Same bits.
        self.merge_kind = os.environ.get("DEEPINFER_ATTN_MERGE", "launch")
        if self.merge_kind not in ("grid", "launch"):
            raise ValueError(f"DEEPINFER_ATTN_MERGE={self.merge_kind!r}: 'grid' or 'launch'")
        if self.merge_kind == "grid" and self.cuda and not self.kn.grid_merge:
            raise ValueError("DEEPINFER_ATTN_MERGE=grid needs DEEPINFER_KERNEL_DEFINES=-DATT_GRID_MERGE=1")
        self.graphs_m: dict[int, torch.cuda.CUDAGraph] = {}
        self.verify_graphs_m: dict[int, torch.cuda.CUDAGraph] = {}
        self.chain_graphs_m: dict[int, torch.cuda.CUDAGraph] = {}
        self.verify_graphs: dict[int, torch.cuda.CUDAGraph] = {}  # speculative verification steps, by B
        self.chain_graphs: dict[int, torch.cuda.CUDAGraph] = {}  # greedy chain steps (decode_chain), by B
        # decode_chain's argmax keys, two steps in flight: the step at cache row p lands in row p % 2, written by the
        # chain step's last kernel into this pinned buffer ("kernel", the default: decode_misc.cu keys_host) or copied
        # behind the step ("copy": a device -> host copy between two chained graphs; 9-11 us per 3B step at 16k
        # cached rows on an H100, chain_gap_kernel_h100.json). The kernel writes the host pointer itself (pinned
        # memory is mapped under unified addressing, every 64-bit CUDA platform); "copy" is the way back.
        self.chain_keys = chain_keys_mode(os.environ.get("DEEPINFER_CHAIN_KEYS"),
                                          self.kn.unified_addressing if self.cuda else True)
        # a chain the caller says will go on (decode_chain's ahead: the runner's greedy request with tokens left)
        # queues the next call's first step before the host reads its last ids, so the GPU steps while the host is
        # between engine steps, and the next decode_chain of the same sequences, ids and positions starts from it
        # instead of a plain step (same bits). Any other step or prefill in between drops it (write_meta, prefill);
        # it was then harmless: one row past the end, as a step queued past a stop. +0.9% tok/s for a 3B W4 greedy
        # request through deepinfer bench (H100, 3 A/B pairs, docs/results/bench_3b_chain_ahead_h100.json);
        # DEEPINFER_CHAIN_AHEAD=0 turns it off
        self.chain_ahead = os.environ.get("DEEPINFER_CHAIN_AHEAD", "1") != "0"
        # the runner's greedy batches of 2..8 step through decode_chain(n = 1, ahead) too, so a batch's next step runs
        # ahead of the host's per-token work: +7..16% total tok/s at 2 / 4 / 8 streams of a 3B W4 through deepinfer
        # bench (H100, 3 A/B pairs, docs/results/bench_3b_batch_ahead_h100.json); DEEPINFER_BATCH_AHEAD=0 turns it off
        self.batch_ahead = os.environ.get("DEEPINFER_BATCH_AHEAD", "1") != "0"
        # sampling on the GPU (temperature > 0, no grammar / logprobs / biases; chain_sampler.py): a lone sampling
        # request chains its steps (decode_chain's sample) and a batch's sampling rows are drawn behind the step;
        # DEEPINFER_SAMPLE_CHAIN=0 (or a sampling kernel that fails at warmup) leaves them to the host, per token
        self.sample_chain = os.environ.get("DEEPINFER_SAMPLE_CHAIN", "1") != "0"
        self._ahead = None  # (slots, positions, tokens, merge) of the queued step decode_chain may resume from
        self.ahead_stats = {"queued": 0, "resumed": 0}  # steps run ahead, and chains that started from one
        self.chain_host = torch.zeros(2, M, dtype=torch.int64, pin_memory=self.cuda)
        self._sampler = None  # ChainSampler: sampling requests' draws on the GPU (made on first use)
        self.chain_events = [torch.cuda.Event(), torch.cuda.Event()] if self.cuda else None
        self.pool = None
        self.use_graphs = self.cuda
        # "graph" | "fused" | "torch"; the GPU without a working Triton runs "torch" (one warning)
        self.prefill_mode = "graph" if prefill_backend(self.cuda, self.device) == "triton" else "torch"
        self.prefill_graphs = None
        # chunks at p0 > 0 replay offset graphs too (gpu_prefill_graph.py run_at); the runner turns this on with the
        # GPU prefix cache (EngineConfig.prefix_cache_gpu), else such chunks run eagerly as before
        self.offset_graphs = False
        if self.prefill_mode == "graph":
            self.prefill_graphs = PrefillGraphs(self, **({} if graph_buckets is None else {"buckets": graph_buckets}))

    # --- decode ----------------------------------------------------------------------------
    def _step(self, B: int, verify: bool = False, chain: bool = False, merge: bool = False):
        """Launch the whole decode step for the first B rows of the static buffers (eager or captured):
        the one forward on the decode ops (engine/model/ops_step.py, 5 kernels per layer)."""
        forward(StepOps(self, B, verify, chain, merge), self.w)

    def _merge(self, L: int) -> bool:
        """Whether a step whose largest attention length is L runs the long-context graphs (merge_from)."""
        return 0 < self.merge_from <= L

    def decode_graph(self, B: int, L: int):
        """The decode graph a batch-B step whose largest attention length is L replays (benches time it)."""
        return (self.graphs_m if self._merge(L) else self.graphs)[B]

    def decode(self, tokens: list[int], positions: list[int], slots: list[int],
               during=None) -> tuple[list[int], torch.Tensor]:
        """One token for each of B <= 8 sequences: feed tokens[b] at positions[b] of slots[b].
        Returns (greedy ids, logits fp32 [B, vocab] on the GPU, valid until the next call). during(): host work
        run while the step runs on the GPU (after its launch, before the wait for its ids)."""
        B = len(tokens)
        assert 1 <= B <= MAX_TOKENS
        m = self._merge(max(positions) + 1)
        return self._run(self.graphs_m if m else self.graphs, tokens, positions, slots, during,
                         lambda: self._step(B, merge=m), "decode")

    def decode_chain(self, tokens: list[int], positions: list[int], slots: list[int], n: int, on_ids,
                     ahead: bool = False, sample: tuple | None = None) -> int:
        """Up to n greedy steps of B <= 8 sequences with the GPU ahead of the host: step i + 1 (a chain step: its
        tokens are step i's argmax ids and its positions one on, both on the GPU) is queued before the host waits
        for step i's ids, so the host's work per token (on_ids: append, detokenize, stops) and the replay's launch
        overlap the GPU's step instead of adding to it. on_ids(ids) gets each step's greedy ids in order and returns
        False to stop; a step already queued past that point only writes K/V one row beyond each sequence's end,
        which the next step overwrites before anything reads it (as a rejected draft's). The ids are the bits of
        the same steps through decode(). Returns the number of steps whose ids on_ids got. Not with the embedding
        in host RAM (its rows are staged from the host by token).
        ahead (with chain_ahead): the caller will chain these sequences on, so step n (the next call's first, at
        positions + n, fed the last ids) is queued before the last ids are read; a next call with exactly those
        tokens, positions and slots, and nothing stepped in between, starts from it instead of a plain step. Its keys
        land in row (p0 + n) & 1, which no step of this call still to be read uses.
        sample = (SamplingParams, generator): one sequence sampling instead (temperature > 0, none of logits.py's
        processing): each step's token is drawn on the GPU after its lm_head (ChainSampler: a sort and
        decode_sample.cu, sampling.sample's semantics to float64 rounding, the generator's uniforms in order), so a
        seed gives the tokens decode() + sample() would; not run ahead."""
        B = len(tokens)
        assert 1 <= B <= MAX_TOKENS and n >= 1 and max(positions) + n <= self.max_context
        assert self.host_embed is None, "a chain step reads its tokens on the GPU"
        assert sample is None or B == 1
        m = self._merge(max(positions) + n)  # the chain's last step attends over the most rows
        chain_graphs = self.chain_graphs_m if m else self.chain_graphs
        # one step more, not read here, where the caller chains on and the cache has its row
        last = n + 1 if ahead and self.chain_ahead and sample is None and max(positions) + n < self.max_context \
            else n
        smp, state = None, None
        if sample is not None:  # the draw made ready first (its capture replays it once), then the chain's uniforms
            smp = self.sampler
            smp.prepare(sample[0], n)
        if last > 1 and self.use_graphs and B not in chain_graphs:
            self._capture_chain(tokens, positions, slots, m)
        if smp is not None:
            state = smp.load(sample[1], n)
        p0 = positions[0]  # step i's keys land in chain_host row (p0 + i) & 1 (its cache row's parity)
        if self._ahead != (tuple(slots), tuple(positions), tuple(tokens), m):
            self.write_meta(tokens, positions, slots)
            self._replay(self.graphs_m if m else self.graphs, B, lambda: self._step(B, merge=m), "decode")
            if smp is not None:
                smp.step()  # the step's token drawn into its key
            self._queue_keys(p0 & 1)  # the first step is a plain one: its keys by copy
        else:  # the call before queued this step (a chain step at p0: its keys in row p0 & 1, its event recorded)
            self.ahead_stats["resumed"] += 1
        self._ahead = None
        done, ids = 0, []
        try:
            for i in range(n):
                if i + 1 < last:  # the next step, queued before this one's ids are read
                    self._replay(chain_graphs, B, lambda: self._step(B, chain=True, merge=m), "chain")
                    if smp is not None:  # the drawn key replaces the argmax key the step's keys_host wrote
                        smp.step()
                    self._queue_keys((p0 + i + 1) & 1, copy=self.chain_keys == "copy" or smp is not None)
                    self.ahead_stats["queued"] += i + 1 == n
                r = (p0 + i) & 1
                if self.cuda:
                    self.chain_events[r].synchronize()
                done += 1
                ids = keys_to_ids(self.chain_host[r].numpy()[:B])
                if not on_ids(ids):
                    return done
        finally:
            if smp is not None:  # the generator as sample() would have left it after the steps read
                smp.rewind(sample[1], state, done)
        if last > n:  # step n runs on: the next call's first step if it comes with these ids
            self._ahead = (tuple(slots), tuple(p + n for p in positions), tuple(ids), m)
        return done

    @property
    def sampler(self) -> ChainSampler:
        if self._sampler is None:
            self._sampler = ChainSampler(self)
        return self._sampler

    def _queue_keys(self, r: int, copy: bool = True):
        """The step's argmax keys -> chain_host[r] (pinned), queued behind it (copy; else the chain step's keys_host
        kernel wrote them); chain_events[r] marks it done."""
        if copy:
            self.chain_host[r].copy_(self.keys, non_blocking=self.cuda)
        if self.cuda:
            self.chain_events[r].record()

    def _capture_chain(self, tokens: list[int], positions: list[int], slots: list[int], merge: bool = False):
        """Capture the chain step for B = len(tokens) on scratch inputs: the rows' own slots one and two rows past
        `positions` (K/V that the chain's real steps overwrite before any read; capture replays once)."""
        B = len(tokens)
        graphs = self.chain_graphs_m if merge else self.chain_graphs
        if max(positions) + 2 >= self.max_context:  # no scratch room: this chain's steps run eagerly
            graphs[B] = _Eager(lambda: self._step(B, chain=True, merge=merge))
            return
        self.write_meta(tokens, positions, slots)
        self.keys.zero_()  # read as id 0xFFFFFFFF: outside the vocab, row 0
        self._replay(graphs, B, lambda: self._step(B, chain=True, merge=merge), "chain")
        torch.cuda.synchronize()

    def verify(self, tokens: list[int], start: int, slot: int, during=None,
               parents: list[int] | None = None, before=None) -> tuple[list[int], torch.Tensor]:
        """Speculative verification in ONE decode step: tokens[i] (the last accepted token, then the k drafts;
        B = k + 1 <= 8) at position start + i of `slot`. Returns (greedy ids, logits fp32 [B, vocab]) as decode
        does: row i is the next-token distribution after tokens[:i + 1], the bits B one-token steps would give
        (StepOps verify: separate K/V write, batch-1 attention schedule; GEMV rows are independent). Rows after
        a rejected draft leave K/V past the sequence's end; the next step overwrites them before any read.
        parents: a draft TREE instead of a chain: tokens[i] (i >= 1) follows tokens[parents[i]] (parents[i] < i,
        parents[0] = -1); node i's K/V go to row start + i, its position is start + depth(i), and row i is the
        distribution after its root path, with the bits of one-token steps along that path (decode_attn.cu
        tree_row). After accepting a path, keep_path moves its K/V rows into place. Captured once per B
        (verify_graphs; chain and tree steps share them: the tree is in the step's inputs).
        before(): GPU work queued between the inputs' copy and the step; the draft heads' graph there writes the
        drafted tokens into meta[0, 1:] on the GPU (tokens[1:] are then placeholders; not with host_embed, whose
        staged rows need the tokens on the host), so drafting and verifying cost one host round trip."""
        B = len(tokens)
        assert 1 <= B <= MAX_TOKENS and start + B <= self.max_context
        if parents is None:
            rpos, paths = None, None
        else:
            assert len(parents) == B and parents[0] == -1 and all(0 <= parents[i] < i for i in range(1, B))
            roots = tree_roots(parents)
            rpos, paths = [start + len(r) for r in roots], [pack_path(r) for r in roots]
        m = self._merge(max(rpos or [start + B - 1]) + 1)
        return self._run(self.verify_graphs_m if m else self.verify_graphs, tokens, [start + i for i in range(B)],
                         [slot] * B, during, lambda: self._step(B, verify=True, merge=m), "verify", rpos, paths,
                         before)

    def keep_path(self, slot: int, start: int, nodes: list[int]):
        """After a tree verification at `start`: the K/V of the accepted nodes (tree indices, root excluded, in
        depth order) move to rows start + 1, start + 2, .. of `slot`, where one-token steps would have written
        them (the same bits: tree_row read them there). A path that is the chain's prefix moves nothing."""
        if all(n == j for j, n in enumerate(nodes, 1)):
            return
        self.kn.move_rows(self.kc, self.vc, slot, start, nodes)  # one launch (torch indexing: ~0.2 ms of host time)

    def write_meta(self, tokens: list[int], positions: list[int], slots: list[int], rpos: list[int] | None = None,
                   paths: list[int] | None = None):
        """The step's inputs (meta rows: tokens, cache rows, slots, sequence positions, root paths) to the GPU,
        queued on the stream (the pinned staging buffer is rewritten only after the step's sync)."""
        B = len(tokens)
        self._ahead = None  # another step's inputs: a chain step queued ahead is no longer resumed from
        mh = self.meta_np  # numpy view of the pinned meta_host: five row writes cost ~2 us, torch indexing ~25
        mh[0, :B] = tokens
        mh[1, :B] = positions
        mh[2, :B] = slots
        mh[3, :B] = positions if rpos is None else rpos
        mh[4, :B] = CHAIN_PATH if paths is None else paths
        self.meta.copy_(self.meta_host, non_blocking=True)

    def _run(self, graphs: dict, tokens: list[int], positions: list[int], slots: list[int], during, step,
             kind: str, rpos: list[int] | None = None, paths: list[int] | None = None,
             before=None) -> tuple[list[int], torch.Tensor]:
        """Refresh the step's static inputs, replay (or capture) graphs[B] of `step`, wait for the ids.
        before(): GPU work queued after the inputs' copy and before the step (the draft heads' graph, which writes
        the drafted tokens into meta[0, 1:] itself: DraftHeads.tree_step)."""
        B = len(tokens)
        self.write_meta(tokens, positions, slots, rpos, paths)
        if self.host_embed is not None:
            self.stage_embeddings(tokens, blocking=False)  # the step syncs before the next call writes again
        if before is not None:
            before()
        self._replay(graphs, B, step, kind)
        if during is not None:
            during()
        self.keys_host.copy_(self.keys, non_blocking=self.cuda)
        if self.cuda:
            torch.cuda.current_stream().synchronize()
        return keys_to_ids(self.keys_host.numpy()[:B]), self.logits[:B]

    def _replay(self, graphs: dict, B: int, step, kind: str):
        """Queue graphs[B] of `step` (captured on first use: eagerly once, which also loads every kernel, then
        captured; both capture tries failing leaves that B eager, logged); without graphs, step() itself.
        A first capture runs the step twice (eager, then capture's replay): a plain or verify step reads meta and
        writes the same cache rows again, a chain step moves on twice (decode_chain captures it on scratch rows)."""
        if not self.use_graphs:
            step()
            return
        g = graphs.get(B)
        if g is None:
            step()
            torch.cuda.synchronize()
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            try:
                g, _ = capture(step, self.pool)  # capture replays it once (seed 5.4: capture runs nothing)
            except RuntimeError as e:  # both tries failed: this batch size stays eager
                log.warning("%s graph for batch %d disabled: %s", kind, B, str(e).splitlines()[0])
                graphs[B] = _Eager(step)
                if not any(isinstance(x, torch.cuda.CUDAGraph) for d in (self.graphs, self.verify_graphs,
                                                                         self.chain_graphs, self.graphs_m,
                                                                         self.verify_graphs_m, self.chain_graphs_m)
                           for x in d.values()):
                    self.pool = None  # no graph holds the pool: the next capture starts a new one (graph_capture.py)
                return
            graphs[B] = g
            if kind == "chain":  # captured on scratch inputs: that run is over
                return
        g.replay()

    @property
    def q8(self) -> bool:
        """int8 activations in the batch-1 steps (EngineConfig.decode_q8 / DEEPINFER_DECODE_Q8; set before capture)."""
        return self._q8

    @q8.setter
    def q8(self, on: bool):
        self._q8 = bool(on)
        if self._q8 and self.cuda:  # their module now, not at the first launch inside a graph capture
            self.kn.load_q8()

    def warmup(self, max_batch: int, verify: bool = False) -> dict:
        """Capture every CUDA graph a request can need now (decode at batch 1..min(8, slots), each prefill
        bucket), so no request pays a capture (~50-200 ms each) later. Writes scratch K/V into slots that
        a real sequence overwrites before it reads them (prefill writes positions 0.. first).
        Returns {"decode": [B...], "prefill": [buckets...]}."""
        slots = self.kc.shape[1]
        nb = min(MAX_TOKENS, max_batch, slots)
        for B in range(1, nb + 1):
            self.decode([0] * B, [0] * B, list(range(B)))
        if self.host_embed is None and self.max_context > 3:  # a request decoding alone chains its greedy steps
            self.decode_chain([0], [0], [0], 2, lambda ids: True)
            for B in range(2, nb + 1) if self.batch_ahead else ():  # and a batch's, whose next step runs ahead
                self.decode_chain([0] * B, [0] * B, list(range(B)), 2, lambda ids: True)
            if self.sample_chain:  # the sampling kernel's module and the chain's draw graph (a tray template samples)
                try:
                    if self.cuda:  # the kernels against their reference on this card, then the graph
                        self.sampler.check()
                    self.sampler.prepare(SamplingParams(max_tokens=2, temperature=1.0), 2)
                except Exception as e:  # noqa: BLE001 -- a module that will not build or launch: the host path
                    log.warning("sampling on the GPU off (sampling requests take the host path): %s",
                                str(e).splitlines()[0] if str(e) else type(e).__name__)
                    self.sample_chain = False
        for B in range(2, MAX_TOKENS + 1) if verify else ():  # speculative verification (1 + k drafts)
            if B <= self.max_context:
                self.verify([0] * B, 0, 0)
        if self.prefill_graphs is not None and self.prefill_mode == "graph":
            for b in self.prefill_graphs.buckets:
                self.prefill([0] * b, 0, 0)
                if self.offset_graphs and 1 + b <= self.max_context:
                    self.prefill([0] * b, 0, 1)  # the offset graph of the bucket (at p0 = 1 of slot 0)
        return {"decode": sorted(self.graphs), "prefill": sorted(self.prefill_graphs.graphs)
                if self.prefill_graphs is not None else [],
                "prefill_at": sorted(self.prefill_graphs.at_graphs) if self.prefill_graphs is not None else [],
                "verify": sorted(self.verify_graphs), "chain": sorted(self.chain_graphs)}

    # --- embedding ---------------------------------------------------------------------------
    def _embed(self, toks: torch.Tensor, T: int, h: torch.Tensor, keys: torch.Tensor, norm=None, ss=None):
        """h fp32 [T, hidden] = embedding rows of toks (device int32); keys[:T] = 0. With the embedding in
        host RAM the rows were staged into h_in by stage_embeddings (same ids, same order). norm, ss: the decode
        step's deferred first norm (DecodeKernels.embed)."""
        if self.host_embed is not None:
            self.kn.copy_rows(self.h_in, T, h, keys, norm=norm, ss=ss)
        else:
            self.kn.embed(toks, self.w.embed, T, h, keys, norm=norm, ss=ss)

    def stage_embeddings(self, ids: list[int], blocking: bool = True):
        """Dequantize the rows of ids on the CPU into the pinned buffer and copy them to h_in[:len(ids)].
        blocking=False only where the caller syncs before the pinned buffer is written again."""
        n = len(ids)
        assert n <= self.h_in.shape[0]
        self.host_embed.rows(ids, self.h_in_host)
        self.h_in[:n].copy_(self.h_in_host[:n], non_blocking=self.cuda and not blocking)

    # --- prefill ---------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, ids: list[int], slot: int, start: int = 0, all_logits: bool = False) -> torch.Tensor:
        """Run ids at positions start.. of `slot` (chunked); logits fp32 of the last token [vocab]
        (or of every token [T, vocab])."""
        self._ahead = None  # a chain step queued ahead is not resumed across a prefill
        outs = []
        for s in range(0, len(ids), self.prefill_chunk):
            chunk, out = ids[s:s + self.prefill_chunk], None
            if self.prefill_mode == "graph" and self.prefill_graphs is not None and not all_logits:
                if start + s == 0:
                    out = self.prefill_graphs.run(chunk, slot)  # None: no bucket fits -> eager
                elif self.offset_graphs:  # after a cached prefix (or an earlier chunk): p0, slot on the device
                    out = self.prefill_graphs.run_at(chunk, slot, start + s)
            outs.append(out if out is not None else self._prefill_chunk(chunk, slot, start + s, all_logits))
        return torch.cat(outs) if all_logits else outs[-1]

    def _prefill_chunk(self, ids: list[int], slot: int, p0: int, all_logits: bool) -> torch.Tensor:
        """One chunk at positions p0.. of `slot`, eagerly: logits fp32 [vocab] (or [T, vocab])."""
        if self.host_embed is not None:
            self.stage_embeddings(ids)
        T = len(ids)
        toks = torch.tensor(ids, dtype=torch.int32, device=self.device)
        out = self._forward_chunk(toks, T, p0, lambda i: (self.kc[i, slot], self.vc[i, slot]),
                                  None if all_logits else T - 1, self.prefill_mode)
        return out if all_logits else out[0]

    def _forward_chunk(self, toks: torch.Tensor, T: int, p0: int, kv, last, mode: str = "fused",
                       at: torch.Tensor | None = None) -> torch.Tensor:
        """The one forward on the prefill ops (engine/model/ops_prefill.py; arguments as PrefillOps takes
        them). mode "fused"/"graph": Triton elementwise + linear_prefill; "torch": plain torch ops (on the
        CPU with the PyTorch references of the linears and attention). Logits fp32 [1, vocab] or [T, vocab].
        at: int32 [p0, slot] on the device instead of p0/kv (engine/model/ops_prefill_offset.py: the offset
        prefill graphs' program; rows p0.. of that slot of the model's cache)."""
        ref = mode == "torch" and not self.cuda
        if at is not None:
            return forward(OffsetPrefillOps(self.cfg, self.cos, self.sin, self._embed, toks, T, at, self.kc, self.vc,
                                            last, _linear_ref if ref else linear_prefill,
                                            "torch" if mode == "torch" else "triton"), self.w)
        ops = PrefillOps(self.cfg, self.cos, self.sin, self._embed, toks, T, p0, kv, last,
                         linear=_linear_ref if ref else linear_prefill,
                         attend=_attend_ref if ref else attention_prefill,
                         kind="torch" if mode == "torch" else "triton")
        out = forward(ops, self.w)
        self.last_hidden = getattr(ops, "hidden", None)  # all_logits: the chunk's final rows [T, H] (engine/draft)
        return out

    def memory(self) -> dict:
        kv = 2 * self.kc.numel() * 2
        work = sum(t.numel() * t.element_size() for t in (self.h, self.x, self.qkv, self.attn, self.act,
                                                          self.logits, self.keys, self.ss)) + self.ws.nbytes()
        if self.host_embed is not None:
            work += self.h_in.numel() * 4
        return {"weights_bytes": self.w.nbytes(), "kv_cache_bytes": kv, "workspace_bytes": work,
                "embedding_in_host_ram_bytes": self.host_embed.nbytes() if self.host_embed is not None else 0,
                "allocated_bytes": torch.cuda.memory_allocated(self.device) if self.cuda else 0,
                "reserved_bytes": torch.cuda.memory_reserved(self.device) if self.cuda else 0,
                "graphs": sorted(self.graphs),
                "verify_graphs": sorted(self.verify_graphs),
                "chain_graphs": sorted(self.chain_graphs),
                "prefill_graphs": sorted(self.prefill_graphs.graphs) if self.prefill_graphs else [],
                "prefill_graph_staging_bytes": self.prefill_graphs.nbytes() if self.prefill_graphs else 0}


def _linear_ref(x: torch.Tensor, w) -> torch.Tensor:
    return gemv_ref(x, w, rows_alone=False).half()  # a prefill chunk: one product (rows alone: the decode step's)


def _attend_ref(q, k, v, p0: int) -> torch.Tensor:
    return gqa_attention(q.float(), k.float(), v.float(), p0).half()
