"""Prefix KV cache: KV blocks of prompt prefixes that an earlier request computed, reused instead of prefilled.

The tray sends the same template (system prompt + instructions) before every selection, an editor sends
the same long system prompt, a chat resends its whole history: those tokens' keys and values are the same
every time (a position's KV depends only on the tokens up to it), so they are copied from here into the
new request's slot and only the rest of the prompt is prefilled.

Blocks of BLOCK token ids, chained: a block's key is hash((parent key, its tokens)), so a hit on block i
means the whole prefix up to block i matched (each step also compares the stored tokens and parent key,
so a hash collision can never give wrong KV). The last block of a stored sequence may be partial; at the
first block that does not match, the children of the last matched block are compared token by token, so
a prompt reuses every token it shares with a stored one, not only whole blocks.
Each block holds k, v [layers, kv_heads, n, head_dim] (rows of one copy per save: the slots' static
cache is not paged); a restore copies a matched chain in with one K and one V copy; the store is bounded in bytes
(EngineConfig.prefix_cache_mb), least recently used blocks go first (with their descendants, which
cannot be reached without them). The engine thread is the only user: no locks.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field

import torch

BLOCK = 16
ROOT = 0  # the parent key of a prompt's first block


@dataclass(slots=True, eq=False)
class _Block:
    """Rows r0 .. r0 + len(tokens) of one save's K and V copies (kc, vc [layers, kv_heads, rows, head_dim], the
    cache's dtype and device). No views are made per block at save: a 2,048-token prompt stores 128 blocks, and two
    views and a slice each took 5.5 ms of the engine thread per release, paid by the next request's first token
    (docs/hotpath.md)."""
    key: int
    parent: int
    tokens: tuple[int, ...]
    kc: torch.Tensor
    vc: torch.Tensor
    r0: int
    nbytes: int
    children: set[int] = field(default_factory=set)


def kv_tensors(runner) -> tuple[torch.Tensor, torch.Tensor]:
    """The runner's static cache k, v [layers, slots, kv_heads, ctx, head_dim]: the CPU runner's KVCache or the
    GPU model's kc/vc (same layout)."""
    cache = getattr(runner, "cache", None)
    if cache is not None:
        return cache.k, cache.v
    return runner.model.kc, runner.model.vc


def _common(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class PrefixCache:
    def __init__(self, max_bytes: int, block: int = BLOCK):
        self.max_bytes, self.block = max_bytes, block
        self.blocks: collections.OrderedDict[int, _Block] = collections.OrderedDict()  # LRU order, oldest first
        self.roots: set[int] = set()  # keys of first blocks
        self.bytes = 0
        self.lookups = self.hits = self.reused_tokens = self.evicted = 0

    # --- lookup --------------------------------------------------------------------------
    def match(self, ids: list[int], limit: int) -> list[tuple[_Block, int]]:
        """The stored chain sharing the longest prefix with ids[:limit]: [(block, tokens used of it)]."""
        chain: list[tuple[_Block, int]] = []
        key, n, B = ROOT, 0, self.block
        while n + B <= limit:
            toks = tuple(ids[n:n + B])
            k = hash((key, toks))
            b = self.blocks.get(k)
            if b is None or b.parent != key or b.tokens != toks:
                break
            chain.append((b, B))
            key, n = k, n + B
        # partial: the child of the last matched block (a partial or a diverging full block) sharing most tokens
        rest = ids[n:limit]
        best, best_n = None, 0
        for ck in (self.roots if key == ROOT else self.blocks[key].children):
            m = _common(self.blocks[ck].tokens, rest)
            if m > best_n:
                best, best_n = self.blocks[ck], m
        if best is not None:
            chain.append((best, best_n))
        for b, _ in reversed(chain):  # deepest first: parents end up more recent than their children
            self.blocks.move_to_end(b.key)
        return chain

    def restore(self, k_all: torch.Tensor, v_all: torch.Tensor, slot: int, ids: list[int]) -> int:
        """Copy the longest stored prefix of ids (at most len(ids) - 1 tokens: the last prompt token is always
        run, its logits give the first output token) into the slot; returns its length."""
        self.lookups += 1
        parts = list(self.match(ids, len(ids) - 1))
        n = sum(m for _, m in parts)
        if n:  # one copy for K and one for V (a 2,000-token history is 125 blocks: 250 launches otherwise)
            runs: list[list] = []  # [block, first row, end row]: consecutive rows of one save's copy as one slice
            for b, m in parts:
                if runs and runs[-1][0].kc is b.kc and runs[-1][2] == b.r0:
                    runs[-1][2] += m
                else:
                    runs.append([b, b.r0, b.r0 + m])
            for dst, src in ((k_all, [b.kc[:, :, r0:r1] for b, r0, r1 in runs]),
                             (v_all, [b.vc[:, :, r0:r1] for b, r0, r1 in runs])):
                dst[:, slot, :, :n].copy_(src[0] if len(src) == 1 else torch.cat(src, dim=2))
            self.hits += 1
            self.reused_tokens += n
        return n

    # --- store ---------------------------------------------------------------------------
    def save(self, k_all: torch.Tensor, v_all: torch.Tensor, slot: int, ids: list[int], n: int):
        """Store the KV of ids[:n] (whose KV is in the slot) as blocks; blocks already stored are only touched.
        The blocks not stored yet are a suffix of the chain (a new block's key makes its children's keys new):
        their KV is copied out in one K and one V copy and each new block keeps a view of its rows (a block per
        copy was 2 launches per 16 tokens on the engine thread: ~8 ms after a 2,000-token prompt on a GPU,
        paid by the next request's first token)."""
        key, B = ROOT, self.block
        first_new = n
        for p in range(0, n, B):  # where the stored chain ends (no changes yet)
            toks = tuple(ids[p:min(p + B, n)])
            b = self.blocks.get(hash((key, toks)))
            if b is None or b.parent != key or b.tokens != toks:
                first_new = p
                break
            key = b.key
        kc = k_all[:, slot, :, first_new:n].clone() if first_new < n else None
        vc = v_all[:, slot, :, first_new:n].clone() if first_new < n else None
        L, _, H, _, D = k_all.shape
        per_token = 2 * L * H * D * k_all.element_size()  # K and V bytes of one token
        key = ROOT
        path = []
        for p in range(0, n, B):
            toks = tuple(ids[p:min(p + B, n)])
            k = hash((key, toks))
            b = self.blocks.get(k)
            if b is None:
                size = per_token * len(toks)
                if p < first_new or size > self.max_bytes or not self._make_room(size, keep=key):
                    break
                b = _Block(k, key, toks, kc, vc, p - first_new, size)
                self.blocks[k] = b
                self.bytes += b.nbytes
                (self.roots if key == ROOT else self.blocks[key].children).add(k)
            elif b.parent != key or b.tokens != toks:  # a hash collision: keep the stored block, stop here
                break
            else:
                self.blocks.move_to_end(k)  # not evicted while its children are being added
            path.append(k)
            key = k
        for k in reversed(path):  # a sequence longer than the store evicts its own first blocks: skip those
            if k in self.blocks:
                self.blocks.move_to_end(k)

    def _make_room(self, size: int, keep: int) -> bool:
        """Evict least recently used blocks (never `keep`, the parent being extended) until size fits."""
        while self.bytes + size > self.max_bytes:
            victim = next((k for k in self.blocks if k != keep), None)
            if victim is None:
                return False
            self._evict(victim)
            if keep != ROOT and keep not in self.blocks:
                return False
        return True

    def _evict(self, key: int):
        b = self.blocks.pop(key, None)
        if b is None:
            return
        self.bytes -= b.nbytes
        self.evicted += 1
        (self.roots if b.parent == ROOT else getattr(self.blocks.get(b.parent), "children", set())).discard(key)
        for c in list(b.children):  # unreachable without their parent
            self._evict(c)

    def clear(self):
        self.blocks.clear()
        self.roots.clear()
        self.bytes = 0

    def stats(self) -> dict:
        return {"blocks": len(self.blocks), "bytes": self.bytes, "max_bytes": self.max_bytes, "block": self.block,
                "lookups": self.lookups, "hits": self.hits, "reused_tokens": self.reused_tokens,
                "evicted_blocks": self.evicted}


GPU_MARGIN = 128 << 20  # of the GPU memory the plan leaves free, kept free (allocator slack, other processes)


def for_runner(runner) -> PrefixCache | None:
    """The runner's prefix cache, made on first use from its EngineConfig (prefix_cache_mb 0: none). On a GPU it
    gets at most what the memory plan (engine/runtime/memory_plan.py Budget: free - need) left free, less a
    margin: it never takes memory the weights, KV slots or working memory were planned to use."""
    pc = getattr(runner, "_prefix_cache", False)
    if pc is False:
        cfg = getattr(runner, "cfg", None)
        cap = getattr(cfg, "prefix_cache_mb", 0) << 20
        if getattr(runner, "device", "cpu") == "cuda" and not getattr(cfg, "prefix_cache_gpu", False):
            cap = 0  # turned off for this GPU (EngineConfig.prefix_cache_gpu, --no-prefix-cache-gpu)
        budget = getattr(runner, "budget", None)
        if budget is not None:
            cap = min(cap, max(0, budget.free - budget.need - GPU_MARGIN))
        pc = PrefixCache(cap) if cap >= (1 << 20) else None
        runner._prefix_cache = pc
    return pc


def restore(runner, seq) -> int:
    """Where a sequence's prefill starts (SlotRunner.prefill): reuse its cached prefix; returns tokens reused."""
    pc = for_runner(runner)
    if pc is None or seq.prefilled:
        return 0
    n = pc.restore(*kv_tensors(runner), seq.slot, seq.prompt_ids)
    seq.prefilled = n
    return n


def save(runner, seq, n: int):
    """Store the first n tokens of the sequence (prompt, then output) whose KV is in its slot."""
    pc = for_runner(runner)
    if pc is not None and n > 0 and seq.slot >= 0:
        pc.save(*kv_tensors(runner), seq.slot, seq.prompt_ids + seq.output_ids, n)
