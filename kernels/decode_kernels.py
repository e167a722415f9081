"""Launchers for the decode kernels (decode_gemv.cu, decode_misc.cu, decode_attn.cu) through CuPy/NVRTC.

The sources are compiled once per process at run time for the device's own arch (-arch=sm_XX from its
compute capability): sm_86 and sm_90 take the same code (mma.sync, no Hopper-only instructions).
Every launch goes onto torch's current stream (so it is captured inside torch.cuda.graph), with raw
pointers as np.uint64, ints as np.int32 and floats as np.float32 (seed 5.6); no DLPack anywhere (5.5).
References for every kernel: kernels/decode_reference.py.
"""
from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import numpy as np
import torch

from kernels.decode_reference import bal_first as ref_bal_first  # the balanced schedule's blocks
from kernels.pack import KQ_LAYOUTS, SYM_LAYOUTS  # (bits, group) of the KQ / SYM forms (decode_gemv.cu GEMV_SF)
from kernels.pdl import PDLLauncher
from kernels.q8_plan import (Q8_NAMES, SMEM_MAX, q8_kernel, q8_layout, q8_name, q8_ok,  # int8 activations (q8 GEMVs)
                              q8_fit, q8_plan, slot_bytes)
from kernels.qweight import QWeight

log = logging.getLogger("deepinfer.kernels")

SOURCES = ("decode_common.cu", "decode_norm.cu", "decode_q8dot.cu", "decode_gemv.cu", "decode_misc.cu",
           "decode_attn.cu", "decode_kvwrite.cu", "decode_topk.cu", "decode_spec.cu",
           "decode_persist.cu")  # empty unless -DGEMV_PERSIST=1 (an experiment, engine/bench/persist_chain.py)
MAX_TOKENS = 8  # tokens per GEMV launch (the mma's n = 8)
WARPS = 8  # warps per GEMV block
ATT_REPM = 8  # max query heads per KV head
MT = {"store": 1, "resid": 1, "silu": 2, "logits": 2}  # 16-row tiles per warp (silu: one gate + one up tile)
_NAMES = ["gemv_w4_store", "gemv_w4_resid", "gemv_w4_silu", "gemv_w4_logits", "gemv_w3_store", "gemv_w3_resid",
          "gemv_w3_silu", "gemv_w3_logits", "embed_rows", "copy_rows", "keys_host", "rmsnorm_rows",
          "gemv_w4_store_mt2", "gemv_w4_resid_mt2", "gemv_w3_store_mt2", "gemv_w3_resid_mt2",
          "attn_decode_hd128", "attn_decode_hd64",
          "gemv_w4_silu_bal", "gemv_w3_silu_bal"]  # the balanced gate_up (decode_gemv.cu BAL)
GGUF_LAYOUTS = ((4, 32), (8, 32), (8, 16), (6, 32), (6, 16))  # the exact GGUF repacks (decode_gemv.cu GEMV_GGUF)
BYTE_LAYOUTS = GGUF_LAYOUTS[:3]  # in the engine's module; the 6-bit ones, KQ and SYM forms in the packs module
FORM_TAG = {"": "g", "kq": "k", "sym": "s"}  # QWeight.form -> the letter before the group in a GEMV's name


def _gemv_names(layouts, form: str = "") -> list[str]:
    return [f"gemv_w{b}{FORM_TAG[form]}{g}_{e}" for b, g in layouts
            for e in ("store", "resid", "silu", "logits", "store_mt2", "resid_mt2", "silu_bal")]


_GGUF_NAMES = _gemv_names(BYTE_LAYOUTS)
# the GGUF packings' GEMVs (EngineConfig.gguf_pack): a module of their own, compiled on first use (decode_gemv.cu
# GEMV_ONLY_PACKS) from these sources
_PACK_NAMES = _gemv_names(GGUF_LAYOUTS[3:]) + _gemv_names(KQ_LAYOUTS, "kq") + _gemv_names(SYM_LAYOUTS, "sym")
PACK_SOURCES = ("decode_common.cu", "decode_norm.cu", "decode_q8dot.cu", "decode_gemv.cu")
_NAMES += _GGUF_NAMES
_NAMES += ["attn_decode_hd128_tree", "attn_decode_hd64_tree"]  # speculative verification (#17)
_NAMES += ["attn_merge_hd128", "attn_merge_hd64"]  # the split schedule's merge as its own launch (long contexts)
_NAMES += ["topk_rows", "move_rows", "move_rows_dev", "spec_accept"]  # the draft heads' tree (#17)
# int8 activations (decode_gemv.cu q8_kloop; EngineConfig.decode_q8): kernels/q8_plan.py Q8_NAMES, a module of their
# own compiled on first use (DecodeKernels.load_q8: decode_gemv.cu GEMV_ONLY_Q8) from PACK_SOURCES
TOPK = 4  # decode_topk.cu
SAMPLE_SOURCE = "decode_sample.cu"  # a sampling request's draw (DecodeKernels.load_sample: its own module)
SMP_G, SMP_NS, SMP_CAP = 64, 17, 4096  # decode_sample.cu: blocks per row, partials per block, candidates per row
SMP_NB, SMP_RW = 2048, 16  # decode_sample.cu: histogram bins per row, a row's route record (u64)


def sample_scratch(rows: int) -> list[tuple[int, torch.dtype]]:
    """The draw's scratch for `rows` rows (DecodeKernels.load_sample; the memory plan counts it): (elements, dtype) of
    maxp / minp (a max / min per block), stats (u64 partials per block), cnt (candidates per row), cand (u64 keys per
    row), hist (u64 counts and masses per bin), rec (the histogram route's ranges per row)."""
    return [(rows * SMP_G, torch.float32), (rows * SMP_G, torch.float32), (rows * SMP_G * SMP_NS, torch.int64),
            (rows, torch.int32), (rows * SMP_CAP, torch.int64), (rows * 2 * SMP_NB, torch.int64),
            (rows * SMP_RW, torch.int64)]
TOPK_BLOCKS = 64  # blocks per row
# DEEPINFER_TREE_GRID=N caps the tree attention's blocks per (token, KV head) (an experiment knob,
# engine/bench/device_treegrid.sh; read once here, not per launch); 0: one wave (the default)
TREE_GRID = int(os.environ.get("DEEPINFER_TREE_GRID", "0"))


# H100, whole steps (docs/results/decode_ab_bal_h100.json, replay ms, KSW schedule -> balanced): 3B W4 1.200 ->
# 1.126, W3 1.167 -> 1.136 (6 groups per warp against 2 waves x 4); 7B W4 1.917 -> 1.891, W3 1.773 -> 1.781 (18
# against 3 x 7); the 14B's bench decode 6% slower (20 against 2 x 10, gpu_decode_bal_all_h100.json). H200
# (decode_ab_bal7b_h200.json): 7B W4 1.684 -> 1.644 (-2.4%), W3 1.658 -> 1.657. So where the balanced runs are
# shorter (the 3B's 0.75, the 7B's 0.86), not where they are level (the 14B's 1.0).
BAL_GAIN = 0.9


def bal_plan(tiles: int, groups: int, ksw: int, ksb: int, blocks: int, sms: int,
             gain: float | None = None) -> tuple[int, int]:
    """(KSW, blocks) of a gate_up GEMV (decode_gemv.cu BAL, DEEPINFER_GEMV_BAL): (-1, one wave of 2 blocks per SM)
    where the balanced schedule's groups per warp are at most BAL_GAIN of the KSW plan's (its waves x groups per
    warp in each) and the plan does not split K across blocks; else the plan as given. tiles: ffn / 16; groups:
    K / 128; a block takes at most WARPS tiles. gain: instead of BAL_GAIN (DEEPINFER_GEMV_BAL=force: any)."""
    slots = 2 * sms
    per_block = -(-tiles // slots)
    if ksb != 1 or blocks <= slots or per_block > WARPS:
        return ksw, blocks
    if -(-per_block * groups // WARPS) > (BAL_GAIN if gain is None else gain) * -(-blocks // slots) * -(-groups // ksw):
        return ksw, blocks
    # DEEPINFER_GEMV_BAL_BLOCKS (an A/B knob, read when a step is captured): the balanced grid's size instead of one
    # full wave, e.g. the slots that o_proj's blocks leave free (every block then starts at once, each with more tiles)
    n = int(os.environ.get("DEEPINFER_GEMV_BAL_BLOCKS", "0"))
    if n and not (-(-tiles // WARPS) <= n <= slots):
        raise ValueError(f"DEEPINFER_GEMV_BAL_BLOCKS={n}: {-(-tiles // WARPS)}..{slots} for {tiles} tiles")
    return -1, n or slots


def bal_late_code(tiles: int, blocks: int, compiled_in: bool = True) -> int:
    """The balanced schedule's block weighting (decode_gemv.cu bal_first; the kernel gets KSW = -1 - code): 0, equal
    shares, unless DEEPINFER_GEMV_BAL_LATE="E:f" (an A/B knob read when a step is captured; the kernels need
    DEEPINFER_KERNEL_DEFINES=-DGEMV_BAL_LATE=1, compiled_in): blocks from E on take f / 256 of an early block's share
    (64 <= f <= 256), E << 9 | f. Every block must keep 1 to 8 tiles."""
    env = os.environ.get("DEEPINFER_GEMV_BAL_LATE", "")
    if not env:
        return 0
    if not compiled_in:
        raise ValueError("DEEPINFER_GEMV_BAL_LATE needs DEEPINFER_KERNEL_DEFINES=-DGEMV_BAL_LATE=1")
    e, f = (int(v) for v in env.split(":"))
    first = [ref_bal_first(b, tiles, blocks, (e, f)) for b in range(blocks + 1)]
    nts = [b - a for a, b in zip(first, first[1:])]
    if not (0 < e < blocks and 64 <= f <= 256 and 1 <= min(nts) and max(nts) <= WARPS):
        raise ValueError(f"DEEPINFER_GEMV_BAL_LATE={env!r}: E in 1..{blocks - 1}, f in 64..256, and 1 to {WARPS} "
                         f"tiles per block ({min(nts)}..{max(nts)} for {tiles} tiles in {blocks} blocks)")
    return (e << 9) | f


def compiled(names, defines: tuple[str, ...] = ()) -> list[str]:
    """names less the *_silu_bal kernels where -DGEMV_BAL=0 leaves them out of the module."""
    return [n for n in names if not n.endswith("_bal")] if "-DGEMV_BAL=0" in defines else list(names)


def module_names(src: str, defines: tuple[str, ...] = ()) -> list[str]:
    """The kernels of _NAMES that a module compiled from src with defines holds: those named in src, the ones built
    by token pasting (the GGUF layouts' GEMV_GGUF, every silu GEMV's _bal unless -DGEMV_BAL=0), and with
    -DGEMV_PACKS=1 the packings' GEMVs too."""
    pasted = "GEMV_GGUF(" in src
    names = [n for n in _NAMES if n in src or n.endswith("_bal") and n[:-4] in src or pasted and n in _GGUF_NAMES]
    if pasted and "-DGEMV_PACKS=1" in defines:
        names += _PACK_NAMES
    if "GEMVQ8L(" in src and "-DGEMV_Q8=1" in defines:
        names += Q8_NAMES
    return compiled(names, defines)


def gemv_name(bits: int, group: int, epi: str, mt: int, form: str = "") -> str:
    """Kernel name for a layout and epilogue (decode_gemv.cu): w4/w3 group 128 keep their first names; the KQ forms
    are w{bits}k{group}, the SYM forms w{bits}s{group} (form: QWeight.form)."""
    tag = f"w{bits}" if group == 128 else f"w{bits}{FORM_TAG[form]}{group}"
    if form == "kq" and (bits, group) not in KQ_LAYOUTS or form == "sym" and (bits, group) not in SYM_LAYOUTS or \
            not form and (group != 128 and (bits, group) not in GGUF_LAYOUTS or group == 128 and bits not in (3, 4)):
        raise ValueError(f"no decode GEMV for {bits}-bit weights in groups of {group}" + (f" ({form})" if form else ""))
    return f"gemv_{tag}_{epi}" + ("_mt2" if mt == 2 and epi in ("store", "resid") else "")


_PLAN_WARNED: set = set()  # (epi, N, K) whose DEEPINFER_GEMV_PLAN KSB could not run as asked: warned once


def mts(epi: str) -> tuple[int, ...]:
    """The MT values decode_gemv.cu has a kernel for, per epilogue (gemv_name): store / resid at 1 and 2 (_mt2),
    silu and logits at 2 only. Another MT would launch the MT-2 kernel over the wrong tile count (a logits launch at
    MT 4 covered half the vocabulary, faster and wrong, in a plan A/B of the thirty-fourth session)."""
    return (1, 2) if epi in ("store", "resid") else (MT[epi],)


def _ss_ok(ss: torch.Tensor) -> bool:
    """The deferred norm's sums: int64, rows of MAX_TOKENS, contiguous (the kernels index ss[p * 8 + b])."""
    return ss.dtype == torch.int64 and ss.is_contiguous() and ss.dim() == 2 and ss.shape[1] == MAX_TOKENS


def _defer_args(norm, ss, D: int):
    """(weight, eps, x) of an embedding kernel's deferred norm, checked; (None, 0.0, None) without one."""
    if norm is None:
        return None, 0.0, None
    nw, eps, xn = norm
    assert ss is not None and _ss_ok(ss) and ss.shape[0] >= 2 and nw.dtype == torch.float32 and nw.numel() == D \
        and xn.dtype == torch.float16 and xn.shape[-1] == D
    return nw, eps, xn


def _p(t: torch.Tensor | None):
    return None if t is None else np.uint64(t.data_ptr())


def _i(v: int):
    return np.int32(v)


_PLAN_ENV: dict[str, dict] = {}
_PDL_OFF: dict[str, frozenset] = {}


def pdl_off() -> frozenset:
    """DEEPINFER_PDL_OFF="name/name" (or ","): kernels launched without the PDL attribute even where it is on (same
    values; per-kernel A/Bs inside whole steps, engine/bench/decode_ab.py variants: docs/gpu.md "What one dependency
    costs" found a 22.5 MB PDL hop slower than a plain one). Read at each launch (graphs capture it)."""
    env = os.environ.get("DEEPINFER_PDL_OFF", "")
    if env not in _PDL_OFF:
        _PDL_OFF[env] = frozenset(n for n in re.split(r"[,/\s]+", env) if n)
    return _PDL_OFF[env]


def _plan_override(bits: int, epi: str, N: int, K: int) -> tuple[int, int, int] | None:
    """DEEPINFER_GEMV_PLAN="bits:epi:N:K=KSWxKSBxMT/..." (plan A/Bs inside whole steps, engine/bench/decode_ab.py
    variants, hence no ',' or '+'): that linear's plan instead of tuned / gemv_plan. Unset: None."""
    env = os.environ.get("DEEPINFER_GEMV_PLAN", "")
    if not env:
        return None
    if env not in _PLAN_ENV:
        table = {}
        for item in filter(None, env.split("/")):
            try:
                key, val = item.split("=")
                b, e, n, k = key.split(":")
                plan = tuple(int(v) for v in val.split("x"))
                entry = (int(b), e, int(n), int(k))
            except ValueError:
                raise ValueError(f"DEEPINFER_GEMV_PLAN {item!r}: entries are bits:epi:N:K=KSWxKSBxMT, '/' between "
                                 "them (e.g. 4:logits:151936:2048=4x1x2)") from None
            if e not in MT:
                raise ValueError(f"DEEPINFER_GEMV_PLAN {item!r}: the epilogue is one of {', '.join(MT)}")
            if len(plan) != 3 or plan[2] not in mts(e):
                raise ValueError(f"DEEPINFER_GEMV_PLAN {item!r}: a plan is KSWxKSBxMT, and the {e} GEMV is built with "
                                 f"MT (16-row tiles per warp) in {mts(e)} only")
            table[entry] = plan
        _PLAN_ENV[env] = table
    return _PLAN_ENV[env].get((bits, epi, N, K))


def _unified_addressing(cp, index: int) -> bool:
    """Whether the device reaches pinned host memory by its host pointer (cudaDevAttrUnifiedAddressing = 41: every
    64-bit CUDA platform); False where the query fails, so that a chained step copies its keys instead."""
    try:
        return cp.cuda.runtime.deviceGetAttribute(41, index) == 1
    except Exception as e:  # noqa: BLE001 (any failure: the copy is the safe way)
        log.info("cudaDevAttrUnifiedAddressing not readable (%s)", e)  # chain_keys_mode says what follows
        return False


class DecodeKernels:
    """One compiled module per device; methods launch on torch.cuda.current_stream()."""

    _cache: dict[int, "DecodeKernels"] = {}

    @classmethod
    def get(cls, device: torch.device | int | None = None) -> "DecodeKernels":
        """The module for a device; DEEPINFER_KERNEL_DEFINES (space-separated -D options, read when a model is built)
        compiles a variant, for same-process timing comparisons (engine/bench/decode_ab.py)."""
        idx = torch.device(device if device is not None else "cuda").index or 0
        defines = tuple(os.environ.get("DEEPINFER_KERNEL_DEFINES", "").split())
        key = (idx, defines, os.environ.get("DEEPINFER_GEMV_BAL", "1"))  # the schedule knob: a module of its own
        if key not in cls._cache:
            cls._cache[key] = cls(idx, defines)
        return cls._cache[key]

    def __init__(self, index: int = 0, defines: tuple[str, ...] = (), sources: tuple[str, ...] = SOURCES):
        """defines: extra -D options; sources: a subset for variants (decode_common.cu first)."""
        import cupy as cp  # CuPy: optional (GPU only)

        self.cp = cp
        self.index = index
        major, minor = torch.cuda.get_device_capability(index)
        self.arch = f"sm_{major}{minor}"
        self.sms = torch.cuda.get_device_properties(index).multi_processor_count
        self.unified_addressing = _unified_addressing(cp, index)  # keys_host writes pinned memory by its host pointer
        # the attention's grid merge is compiled in only on request (decode_attn.cu ATT_GRID_MERGE)
        self.grid_merge = _define(defines, "ATT_GRID_MERGE", 0) == 1
        self.bal_late = _define(defines, "GEMV_BAL_LATE", 0) == 1  # the balanced schedule's weighting (bal_late_code)
        # attn_merge's threads per dim and dims per block (decode_attn.cu ATT_MERGE_P / ATT_MERGE_DB)
        self.merge_p = _define(defines, "ATT_MERGE_P", ATT_MERGE_P)
        self.merge_db = _define(defines, "ATT_MERGE_DB", ATT_MERGE_DB)
        self.defines = defines
        src = "\n".join((Path(__file__).parent / s).read_text() for s in sources)
        with cp.cuda.Device(index):
            self.module = cp.RawModule(code=src, options=(f"-arch={self.arch}", "-std=c++17", *defines))
            self.fn = {n: self.module.get_function(n) for n in module_names(src, defines)}
        self.packs_module = self.q8_module = self.sample_module = None
        self.q8_noquant = 0
        self._streams: dict[int, object] = {}
        dev = torch.device("cuda", index)
        self.ws = torch.empty(2 << 20, dtype=torch.float32, device=dev)  # split-K partials (8 MB)
        self.cnt = torch.zeros(8192, dtype=torch.int32, device=dev)  # per-tile arrival counters, kept at 0
        # every launch goes through cuLaunchKernelEx (ctypes; CUDA 12+ drivers), with the PDL attribute where it
        # applies; CuPy's launch on a wrapped torch stream only where that call is missing (cupy.cuda.ExternalStream
        # is deprecated since CuPy 14)
        try:
            self.launcher = PDLLauncher()
        except (OSError, AttributeError):
            self.launcher = None
        # the gate_up GEMVs (silu) take the balanced schedule where their grid is more than one wave (decode_gemv.cu
        # BAL, the *_silu_bal kernels; not compiled with -DGEMV_BAL=0); DEEPINFER_GEMV_BAL=0 turns it off, "force"
        # takes it wherever the grid is more than a wave (timing A/Bs: engine/bench/device_bal7b.sh)
        bal_env = os.environ.get("DEEPINFER_GEMV_BAL", "1")
        self.bal = bal_env not in ("0", "off", "") and "gemv_w4_silu_bal" in self.fn
        self.bal_gain = float("inf") if bal_env == "force" else None
        self.pdl = None  # programmatic dependent launch (sm_90+; DEEPINFER_PDL=0 turns it off)
        if major >= 9 and os.environ.get("DEEPINFER_PDL", "1") != "0":
            self.pdl = self.launcher
        # split-K GEMVs may launch as thread block clusters of their KSB blocks (sm_90+, a module built with
        # -DGEMV_CLUSTER=1; decode_gemv.cu: the partials summed through distributed shared memory, the same bits as
        # the global handshake, which runs otherwise); gemv_cluster() says whether they do
        self.cluster_ok = major >= 9 and self.launcher is not None and _define(defines, "GEMV_CLUSTER", 0) == 1

    def load_packs(self):
        """The GGUF packings' W6 / KQ / SYM GEMVs (decode_gemv.cu GEMV_ONLY_PACKS): compiled once, on first use (a model
        in the 6bit / kquant packing, its load check); CuPy keeps the binary on disk, as for the main module."""
        if self.packs_module is not None:
            return
        src = "\n".join((Path(__file__).parent / s).read_text() for s in PACK_SOURCES)
        with self.cp.cuda.Device(self.index):
            self.packs_module = self.cp.RawModule(code=src, options=(f"-arch={self.arch}", "-std=c++17",
                                                                      *self.defines, "-DGEMV_ONLY_PACKS=1"))
            self.fn.update({n: self.packs_module.get_function(n) for n in compiled(_PACK_NAMES, self.defines)})

    def load_sample(self):
        """The sampling kernels (decode_sample.cu smp_*): a module of their own, compiled on first use (a sampling
        request's first draw, eagerly before its graph's capture; CuPy keeps the binary on disk), and their scratch for
        MAX_TOKENS rows (partial maxima and sums, the candidates' keys, the histograms: 0.6 MiB)."""
        if "smp_pick" in self.fn:
            return
        src = (Path(__file__).parent / SAMPLE_SOURCE).read_text()
        with self.cp.cuda.Device(self.index):
            self.sample_module = self.cp.RawModule(code=src, options=(f"-arch={self.arch}", "-std=c++17"))
            for n in ("smp_max", "smp_stats", "smp_hist", "smp_compact", "smp_pick"):
                self.fn[n] = self.sample_module.get_function(n)
        dev = torch.device("cuda", self.index)
        self.smp_scratch = tuple(torch.empty(n, dtype=dt, device=dev) for n, dt in sample_scratch(MAX_TOKENS))

    def sample_rows(self, logits: torch.Tensor, prm: torch.Tensor, u: torch.Tensor, at: torch.Tensor,
                    keys: torch.Tensor, B: int):
        """keys[r] = 0xFFFFFFFF - the token drawn from logits row r < B (fp32 [>= B, V], contiguous, any order) with
        prm float64 [>= B, 3] = (temperature, top_k, top_p) and the uniform u[at[0] + r] (float64; at int32 [1]);
        rows with temperature 0 keep their key. Five launches, no sort of the row (decode_sample.cu); reference
        kernels/sample_reference.py sample_rows_ref."""
        V = logits.shape[-1]
        assert logits.dtype == torch.float32 and logits.is_contiguous() and B <= MAX_TOKENS
        assert prm.dtype == torch.float64 and u.dtype == torch.float64 and at.dtype == torch.int32 and V < 1 << 31
        self.load_sample()
        maxp, minp, stats, cnt, cand, hist, rec = self.smp_scratch
        x, pr, uu, aa = _p(logits), _p(prm), _p(u), _p(at)
        self._launch("smp_max", (SMP_G, B), (256,), (x, _i(V), pr, _p(maxp), _p(minp), _p(cnt), _p(hist)), pdl=False)
        self._launch("smp_stats", (SMP_G, B), (256,), (x, _i(V), pr, _p(maxp), _p(stats)), pdl=False)
        self._launch("smp_hist", (SMP_G, B), (256,), (x, _i(V), pr, uu, aa, _p(maxp), _p(minp), _p(stats), _p(hist)),
                     pdl=False)
        self._launch("smp_compact", (SMP_G, B), (256,), (x, _i(V), pr, uu, aa, _p(maxp), _p(minp), _p(stats),
                                                         _p(hist), _p(cnt), _p(cand), _p(rec)), pdl=False)
        self._launch("smp_pick", (B,), (512,), (x, _i(V), pr, uu, aa, _p(maxp), _p(stats), _p(cnt), _p(cand),
                                                 _p(rec), _p(keys)), pdl=False)

    def load_q8(self):
        """The int8-activation GEMVs (decode_gemv.cu GEMV_ONLY_Q8; EngineConfig.decode_q8): compiled once, on first
        use (the q8 step's first capture); CuPy keeps the binary on disk, as for the main module."""
        # DEEPINFER_TIMING_Q8_NOQUANT=1 (an A/B knob, wrong values): the kernels skip their block's quantization of x
        # (q8_kloop reads whatever the slots hold), to time what the in-block quantization costs; a module of its own
        # (2: the block barrier after it as well: what x quantized by the kernels that write it would leave)
        noq = int(os.environ.get("DEEPINFER_TIMING_Q8_NOQUANT", "0"))
        if self.q8_module is not None and self.q8_noquant == noq:
            return
        src = "\n".join((Path(__file__).parent / s).read_text() for s in PACK_SOURCES)
        with self.cp.cuda.Device(self.index):
            opts = (f"-arch={self.arch}", "-std=c++17", *self.defines, "-DGEMV_ONLY_Q8=1")
            self.q8_module = self.cp.RawModule(code=src, options=opts + ((f"-DQ8_NOQUANT={noq}",) if noq else ()))
            self.q8_noquant = noq
            self.fn.update({n: self.q8_module.get_function(n) for n in Q8_NAMES})

    def _launch(self, name: str, grid, block, args, smem: int = 0, pdl: bool = True, cluster=None,
                cluster_policy: int = 0):
        ptr = torch.cuda.current_stream().cuda_stream
        if pdl and self.pdl is not None and name not in pdl_off():
            return self.pdl.launch(self.fn[name].kernel.ptr, grid, block, smem, ptr, args, cluster=cluster,
                                   cluster_policy=cluster_policy)
        if self.launcher is not None:
            return self.launcher.launch(self.fn[name].kernel.ptr, grid, block, smem, ptr, args, pdl=False,
                                        cluster=cluster, cluster_policy=cluster_policy)
        assert cluster is None
        st = self._streams.get(ptr)
        if st is None:
            st = self._streams[ptr] = self.cp.cuda.ExternalStream(ptr, self.index)
        with st:
            self.fn[name](grid, block, args, shared_mem=smem)

    # --- GEMV ----------------------------------------------------------------------------
    def tuned(self, epi: str, N: int, K: int, long: bool = False) -> tuple[int, int, int] | None:
        """(KSW, KSB, MT) measured best on the H200 for the Qwen2.5 3B/7B linears (plan sweep,
        docs/results/gpu_decode_plan_sweep_h200.txt), and one wave instead of one to two where a grid would have a
        second, partial wave (the 14B's linears, measured inside the step on an H100); None -> gemv_plan's rule.
        long: for the long-context graphs (GPUModel.merge_from), where the 3B's o keeps gemv_plan's rule."""
        G = K // 128
        if G < 16:
            return None
        # 2 blocks of 8 warps per SM: a grid of slots < blocks <= 2 * slots runs a full wave and then a partial one
        # that takes a block's whole time (the 14B's o and down: 320 blocks on 132 SMs, span 12.5 / 21.9 us,
        # engine/bench/gemv_phases.py); one wave of larger blocks instead: 14B step 3.846 -> 3.321 ms with all three
        # below (docs/results/decode_ab_plans_14b_h100.json). The 3B's and 7B's grids fit one wave: unchanged.
        slots = 2 * self.sms
        partial_wave = lambda blocks: slots < blocks <= 2 * slots  # noqa: E731
        if epi == "logits" and N // 256 <= 4 * slots:  # the lm_head where gemv_plan's grid (blocks of 8 tiles of 32
            # rows) is a few waves: 4 warps along K, blocks of 2 tiles (3B / 7B / 14B on 132 SMs: 2,376 blocks, 9
            # waves, instead of 594, 2.25 waves whose last quarter streams alone): step replay shorter in every A/B on
            # H100s, 3B -0.6%, 7B -2.3%, 14B -0.6% in the last (docs/results/decode_ab_lm4_h100.json; its GPU checks
            # passed, docs/gpu.md thirty-fourth session). Many waves (20 SMs: 15): not measured
            return 4, 1, 2
        if epi == "silu":  # (4, 1, 2): N / 64 blocks of 2 tiles, unless the balanced schedule takes it (bal_plan)
            tiles = N // 32
            if partial_wave(tiles // 2) and N % 64 == 0 and \
                    bal_plan(tiles, G, 4, 1, tiles // 2, self.sms, self.bal_gain)[0] > 0:
                return 2, 1, 2  # 14B gate_up: 216 blocks of 4 tiles instead of 432 of 2
            return 4, 1, 2
        if epi in ("store", "resid") and G >= 64:  # down_proj: long K (7B: (8, 2, 2) 18.0 us vs (4, 4, 2) 19.0 in the
            # sweep after the lop3 change, docs/results/gpu_decode_plan_sweep_h200_d448147.txt)
            # 3B down: W3 7.6 us vs 8.7, W4 7.7 vs 8.1 (docs/results/plan_sweep_w{3,4}_w3rot_h200.txt)
            if 2048 <= N < 3072 and N % 32 == 0:
                return 8, 4, 2
            if partial_wave(N // 16) and N % 64 == 0:  # (8, 2, 2) would be N / 16 blocks: 14B 320
                return 4, max(1, slots // (N // 64)), 2  # 14B: 80 blocks of 2 tiles x 3 along K = 240
            return (8, 2, 2) if N >= 3072 and N % 32 == 0 else (4, 4, 1)
        if epi == "store" and N >= 4096 and N % 32 == 0:  # 7B qkv
            return 8, 1, 2
        if epi == "resid" and partial_wave(N // 16) and N % 32 == 0:  # o: gemv_plan's (8, 1, 1) would be
            return 8, 1, 2  # N / 16 blocks (14B: 320); 160 of 32 rows instead
        if epi == "resid" and N == K and 2048 <= N < 3072 and N // 32 <= slots and not long:  # the 3B's o: 64
            # blocks of 32 rows instead of 128 of 16 hold fewer slots while the balanced gate_up's blocks become
            # resident (227 of its 264 started only after o ended, gemv_phases_late_h100.json): step replay 1.111 ->
            # 1.083 ms, twice (decode_ab_plans_3b_o812_h100.json, decode_ab_o812_h100.json); the 7B's o (224 -> 112
            # blocks) 1.00x. Not in the long-context graphs: there it cost 3-4% (4k / 16k replay,
            # decode_ab_o812_long_h100.json)
            return 8, 1, 2
        return None

    def gemv_plan(self, tiles: int, groups: int) -> tuple[int, int, int]:
        """(KSW warps splitting K inside a block, KSB blocks splitting K, blocks along N): enough warps
        in flight to cover the GPU (2 blocks of 8 warps per SM), at least 2 groups of 128 per warp."""
        resident = self.sms * 16
        ksw = 1
        while ksw < WARPS and tiles * ksw < resident and groups // (ksw * 2) >= 2:
            ksw *= 2
        ksb = 1
        while ksb < 8 and tiles * ksw * ksb < resident and groups // (ksw * ksb * 2) >= 2 and \
                (ksb * 2) * tiles * 256 <= self.ws.numel() and tiles <= self.cnt.numel():
            ksb *= 2
        tpb = WARPS // ksw
        return ksw, ksb, (tiles + tpb - 1) // tpb

    def gemv(self, w: QWeight, x: torch.Tensor, B: int, epi: str, out: torch.Tensor,
             keys: torch.Tensor | None = None, plan: tuple[int, int] | None = None, mt: int | None = None,
             norm: tuple[torch.Tensor, float, torch.Tensor] | None = None, ss: torch.Tensor | None = None,
             eps: float = 0.0, pf: int | None = None, long: bool = False, q8: bool = False):
        """Launches gemv_call's kernel (below) on the current stream; a split-K grid as clusters of its K slices'
        blocks where gemv_cluster is on."""
        name, grid, block, args = self.gemv_call(w, x, B, epi, out, keys, plan, mt, norm, ss, eps, pf, long, q8)
        if q8_kernel(name):  # the q8 kernels' x slots in dynamic shared memory (decode_gemv.cu q8_kloop)
            if name not in self.fn:
                self.load_q8()
            ksw = int(args[8])
            smem = slot_bytes(w.K // 128, ksw * grid[1], ksw, B)  # B tokens' slots
            # DEEPINFER_Q8_SMEM_PAD=bytes (an A/B knob, read at each launch as the plan knob: captured graphs keep what
            # it set): that much more shared memory per block, to time what the first build's static 25.6 KB cost
            return self._launch(name, grid, block, args, smem=smem + int(os.environ.get("DEEPINFER_Q8_SMEM_PAD", "0")))
        policy = self.gemv_cluster(grid[1]) if grid[1] > 1 else None
        if policy is not None:
            try:
                return self._launch(name, grid, block, args, cluster=(1, grid[1], 1), cluster_policy=policy)
            except RuntimeError as e:  # e.g. no GPC holds KSB of these blocks at once: the handshake, from now on
                log.warning("split-K GEMV %s as clusters of %d failed (%s): the global handshake instead", name,
                            grid[1], e)
                self.cluster_ok = False
        self._launch(name, grid, block, args)

    def gemv_cluster(self, ksb: int) -> int | None:
        """The cluster scheduling policy for a split-K GEMV of ksb blocks along K, or None: launched the ordinary way.
        Clusters where the GPU and the module can (cluster_ok) and DEEPINFER_GEMV_CLUSTER asks (read at each launch, as
        the plan knob: a decode_ab variant's graphs capture what it sets): 1 (default placement), spread, lb (load
        balancing), pairs (KSB 2 only: where clusters placed well on an H100, docs/gpu.md thirty-fifth session)."""
        if not self.cluster_ok:  # the default build: no environment read per launch
            return None
        v = os.environ.get("DEEPINFER_GEMV_CLUSTER", "0")
        if v in ("0", "off", "") or (v == "pairs" and ksb != 2):
            return None
        if v not in _CLUSTER_POLICIES:
            raise ValueError(f"DEEPINFER_GEMV_CLUSTER={v!r}: one of 0, {', '.join(_CLUSTER_POLICIES)}")
        return _CLUSTER_POLICIES[v]

    def gemv_call(self, w: QWeight, x: torch.Tensor, B: int, epi: str, out: torch.Tensor,
                  keys: torch.Tensor | None = None, plan: tuple[int, int] | None = None, mt: int | None = None,
                  norm: tuple[torch.Tensor, float, torch.Tensor] | None = None, ss: torch.Tensor | None = None,
                  eps: float = 0.0, pf: int | None = None, long: bool = False,
                  q8: bool = False) -> tuple[str, tuple, tuple, tuple]:
        """(kernel name, grid, block, args) of one GEMV; x fp16 [8, K] (rows >= B ignored). epi: store (out fp16
        [B, N] = y + bias), resid (out fp32 += y), silu (w = gate|up rows, out fp16 [B, N/2] = silu(gate) * up), logits (out fp32 = y; keys argmax).
        The deferred rmsnorm (decode_norm.cu; ss int64 [2, 8]: the norm point's rows ss[p], ss[p + 1]):
        store / silu with ss: x is a deferred norm's output, y scaled by rstd / sc per token (eps: the norm's);
        resid with norm = (weight fp32 [N], eps, xn fp16 [8, N]) and ss: also xn[:B] = fp16(h * weight * sc) and
        ss[1, :B] += the rows' sums of squares (fixed point). Reference: decode_reference.py defer_* .
        pf: device address of an L2 prefetch descriptor (engine/model/l2_prefetch.py) or None; results unchanged.
        long: the GEMV is captured in a long-context graph (GPUModel.merge_from; tuned's plans may differ there).
        q8: int8 activations (EngineConfig.decode_q8; q8_ok says where they apply, elsewhere the fp16 kernel runs):
        x[0] quantized per block of 32 inside the kernel, the q8 plan (q8_plan); reference q8_reference.gemv_q8_w4_ref."""
        N, K = w.N, w.K
        if q8 and q8_ok(w, epi, B):
            return self.q8_call(w, x, B, epi, out, norm, ss, eps, pf)
        tuned = override = None
        if plan is None and mt is None:
            override = _plan_override(w.bits, epi, N, K)
            tuned = override or self.tuned(epi, N, K, long)
        if tuned is not None:
            plan, mt = tuned[:2], tuned[2]
        mt = mt or MT[epi]
        assert mt in mts(epi), f"no {epi} GEMV kernel with MT {mt}"
        name = gemv_name(w.bits, w.group, epi, mt, w.form)
        if name not in self.fn and name in _PACK_NAMES:
            self.load_packs()
        assert K % 128 == 0 and N % (16 * mt) == 0 and 1 <= B <= MAX_TOKENS
        assert N * K < 2 ** 32, "the GEMV kernels index their operands in 32 bits"
        assert x.dtype == torch.float16 and x.is_contiguous() and x.shape[-1] == K and x.numel() >= MAX_TOKENS * K
        ffn = N // 2
        tiles = ffn // 16 if epi == "silu" else N // (16 * mt)
        ksw, ksb, blocks = self.gemv_plan(tiles, K // 128)
        if plan is not None:  # (KSW, KSB) override (tuned shapes, planner sweeps)
            ksw, ksb = plan
            ksb = min(ksb, max(1, (K // 128) // ksw))
            if ksb > 1 and (tiles > self.cnt.numel() or ksb * tiles * 32 * 4 * mt > self.ws.numel()):
                ksb = 1
            if override is not None and ksb != override[1] and (epi, N, K) not in _PLAN_WARNED:
                # an A/B variant that silently ran another plan looks like a measurement of the one asked for (the
                # thirty-fourth session's lm_head at 4x2x2 ran as 4x1x2: its partials do not fit the workspace)
                _PLAN_WARNED.add((epi, N, K))
                log.warning("DEEPINFER_GEMV_PLAN %s %dx%d: KSB %d runs as %d (K groups per warp, or the split-K "
                            "workspace / counters, do not hold it)", epi, N, K, override[1], ksb)
            blocks = -(-tiles // (WARPS // ksw))
        if epi == "silu" and self.bal:
            ksw, blocks = bal_plan(tiles, K // 128, ksw, ksb, blocks, self.sms, self.bal_gain)
            if ksw < 0:
                name += "_bal"
                ksw = -1 - bal_late_code(tiles, blocks, self.bal_late)
        bias = w.bias if epi == "store" else None
        oh = out if epi in ("store", "silu") else None
        of = out if epi in ("resid", "logits") else None
        nw, xn = None, None
        if norm is not None:
            nw, eps, xn = norm
            assert epi == "resid" and ss is not None and nw.dtype == torch.float32 and nw.numel() == N and \
                xn.dtype == torch.float16 and xn.shape[-1] == N
        assert ss is None or (epi in ("store", "silu", "resid") and _ss_ok(ss) and (epi != "resid" or norm))
        return (name, (blocks, ksb), (32 * WARPS,),
                (_p(w.qweight), _p(w.scales), _p(w.mins), _p(bias), _p(x), _i(N), _i(K), _i(B), _i(ksw),
                 _i(ffn if epi == "silu" else 16), _p(oh), _p(of), _p(keys), _p(self.ws), _p(self.cnt), _p(nw),
                 np.float32(eps), _p(xn), _p(ss), None if pf is None else np.uint64(pf)))

    def q8_call(self, w: QWeight, x: torch.Tensor, B: int, epi: str, out: torch.Tensor, norm, ss, eps: float, pf):
        """gemv_call's launch of a q8 kernel (q8_ok(w, epi, B) holds; gemv_w4q8b_* for B > 1): the same arguments as
        the fp16 kernel's, the plan q8_plan's (its split-K partials through the same workspace and handshake)."""
        N, K = w.N, w.K
        ksw, ksb, mt = q8_plan(epi, N, K)
        if os.environ.get("DEEPINFER_Q8_PLAN") == "fp16":  # an A/B knob (read at each launch): the fp16 kernel's plan
            # (tuned / gemv_plan; the balanced gate_up as its plain (4, 1, 2)) made one the q8 kernels run, instead of
            # the probe's sweep's, which was timed without epilogues or handshakes (decode_ab_q8noq_h100.json)
            fp = self.tuned(epi, N, K)
            if fp is None:
                tiles = N // 32 if epi == "silu" else N // (16 * MT[epi])
                fp = (*self.gemv_plan(tiles, K // 128)[:2], MT[epi])
            ksw, ksb, mt = q8_fit(epi, N, K, *fp)
        # DEEPINFER_Q8_MAXKSB=n (an A/B knob, read at each launch): at most n blocks along K (the plans come from a
        # sweep whose split-K added atomically; here the last block of a tile sums the partials after a handshake)
        cap = int(os.environ.get("DEEPINFER_Q8_MAXKSB", "8"))
        if cap < ksb and slot_bytes(K // 128, ksw * cap, ksw, B) <= SMEM_MAX:
            ksb = cap
        tiles = N // 32 if epi == "silu" else N // (16 * mt)
        if ksb > 1 and (tiles > self.cnt.numel() or ksb * tiles * 32 * 4 * mt > self.ws.numel()):
            ksb = 1
        assert x.dtype == torch.float16 and x.is_contiguous() and x.shape[-1] == K
        name = q8_name(q8_layout(w), B, epi + ("_mt2" if mt == 2 and epi != "silu" else ""))
        nw = xn = None
        if norm is not None:
            nw, eps, xn = norm
            assert epi == "resid" and ss is not None and nw.numel() == N and xn.shape[-1] == N
        assert ss is None or _ss_ok(ss)
        blocks = -(-tiles // (WARPS // ksw))
        return (name, (blocks, ksb), (32 * WARPS,),
                (_p(w.qweight), _p(w.scales), _p(w.mins), _p(w.bias if epi == "store" else None), _p(x), _i(N),
                 _i(K), _i(B), _i(ksw), _i(N // 2 if epi == "silu" else 16), _p(out if epi != "resid" else None),
                 _p(out if epi == "resid" else None), _p(None), _p(self.ws), _p(self.cnt), _p(nw), np.float32(eps),
                 _p(xn), _p(ss), None if pf is None else np.uint64(pf)))

    # --- small kernels ---------------------------------------------------------------------
    def embed(self, tokens: torch.Tensor, w: QWeight, B: int, h: torch.Tensor, keys: torch.Tensor,
              chain: torch.Tensor | None = None, norm=None, ss: torch.Tensor | None = None):
        """h fp32 [B, D] = dequantized rows tokens[:B] of the embedding; keys[:B] = 0.
        chain: the step's meta int32 [5, M] (a greedy chain step): the rows' tokens are the argmax ids in keys, written
        to meta[0], and meta[1] / meta[3] (cache row, position) move one on (decode_misc.cu; embed_ref's chain).
        norm = (weight, eps, x) and ss int64 [P, 8]: the deferred rmsnorm's start (decode_norm.cu defer_norm_row)."""
        assert chain is None or (chain.dtype == torch.int32 and chain.is_contiguous() and chain.shape[0] == 5)
        nw, eps, xn = _defer_args(norm, ss, w.K)
        self._launch("embed_rows", (B,), (256,),
                     (_p(tokens), _p(w.qweight), _p(w.scales), _p(w.mins), _p(w.weight), _i(w.bits),
                      _i(w.group), _i(2 if w.sym else int(w.kq)), _i(w.K),
                      _p(h), _p(keys), _p(chain),
                      _i(chain.shape[1] if chain is not None else 0), _i(w.N),
                      _p(nw), np.float32(eps), _p(xn), _p(ss), _i(0 if ss is None else ss.shape[0])),
                     pdl=False)  # first kernel of a step: follows the host copy

    def keys_host(self, keys: torch.Tensor, host: torch.Tensor, meta: torch.Tensor, B: int):
        """host int64 [2, S] (pinned) row (meta[1][0] & 1), [:B] = keys[:B]: a chain step's argmax keys written to
        the host by the step itself (decode_misc.cu keys_host; reference keys_host_ref)."""
        assert host.is_pinned() and host.dtype == torch.int64 and host.is_contiguous() and host.shape[1] >= B
        assert meta.dtype == torch.int32 and meta.is_contiguous()
        self._launch("keys_host", (1,), (32,), (_p(keys), _p(host), _p(meta), _i(meta.shape[1]), _i(host.shape[1]),
                                                _i(B)))

    def copy_rows(self, src: torch.Tensor, B: int, h: torch.Tensor, keys: torch.Tensor, norm=None,
                  ss: torch.Tensor | None = None):
        """h fp32 [B, D] = src fp32 [B, D] (embedding rows staged from the host); keys[:B] = 0; norm, ss: as embed."""
        D = h.shape[-1]
        assert D % 4 == 0 and src.dtype == torch.float32 and src.shape[-1] == D
        nw, eps, xn = _defer_args(norm, ss, D)
        self._launch("copy_rows", (B,), (256,), (_p(src), _i(D), _p(h), _p(keys), _p(nw), np.float32(eps), _p(xn),
                                                 _p(ss), _i(0 if ss is None else ss.shape[0])), pdl=False)

    def rmsnorm(self, h: torch.Tensor, weight: torch.Tensor, eps: float, B: int, x: torch.Tensor):
        """x fp16 [B, D] = rmsnorm(h fp32 [B, D]) * weight fp32 [D]."""
        D = h.shape[-1]
        assert weight.dtype == torch.float32
        self._launch("rmsnorm_rows", (B,), (256,), (_p(h), _p(weight), _i(D), np.float32(eps), _i(B), _p(x)))

    def attention(self, qkv: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: torch.Tensor,
                  pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, B: int, Hkv: int, rep: int,
                  head_dim: int, max_context: int, out: torch.Tensor, ws: "AttnWorkspace",
                  merge: bool | str = False):
        """kc/vc: one layer's cache fp16 [slots, Hkv, max_context, hd]; writes k/v of the new tokens.
        merge, who merges the splits' partials (the same bits every way): False the last block of each (token, KV
        head); True attn_merge, a launch of its own (long contexts: GPUModel.merge_from); "grid" every split's
        block a slice of the outputs after a barrier in the launch (decode_attn.cu attn_grid_merge; the grid is one
        wave: attn_splits; compiled in with -DATT_GRID_MERGE=1 only, not yet timed on a GPU)."""
        assert rep <= ATT_REPM and head_dim in (64, 128) and B <= ws.max_tokens
        grid = (ws.splits(B), Hkv, B)
        gm = merge == "grid"
        assert not gm or self.grid_merge, "merge='grid' needs DEEPINFER_KERNEL_DEFINES=-DATT_GRID_MERGE=1"
        assert not gm or ws.splits(B) == 1 or grid[0] * Hkv * B <= self.sms, "the grid merge needs one wave"
        self._launch(f"attn_decode_hd{head_dim}", grid, (256,),
                     (_p(qkv), _p(kc), _p(vc), _p(slots), _p(pos), _p(cos), _p(sin), _i(Hkv), _i(rep),
                      _i(max_context), _p(out), _p(ws.part_o), _p(ws.part_ml),
                      None if merge is True else _p(ws.counters), _p(ws.gen) if gm else None))
        if merge is True:
            self.attn_merge(pos, B, Hkv, rep, head_dim, ws.splits(B), out, ws)

    def attn_merge(self, lpos: torch.Tensor, B: int, Hkv: int, rep: int, head_dim: int, nsplit: int,
                   out: torch.Tensor, ws: "AttnWorkspace"):
        """out rows b < B = the merge of the partials an attention launch with merge=True left (decode_attn.cu
        attn_merge_body_p, P threads per dim; attn_merge_body with -DATT_MERGE_P=1: the same bits; rows at L <=
        ATT_SHORT or with one active split are left as the attention wrote them)."""
        self._launch(f"attn_merge_hd{head_dim}", *merge_launch(Hkv * rep, B, head_dim, self.merge_p, self.merge_db),
                     (_p(lpos), _i(Hkv), _i(rep), _i(nsplit), _p(out), _p(ws.part_o), _p(ws.part_ml)))

    # --- speculative verification (issue #17): the tokens of one slot's draft chain or tree in one step --------
    # The k+1 tokens of one sequence (last accepted + k drafts) in consecutive rows of one slot run as one decode
    # step (GPUModel.verify). The default kernel reads a token's own row back from the cache after writing it;
    # here a block rebuilds the step's rows from qkv instead (decode_attn.cu TREE), so no token reads a row
    # another block of the same step writes, and no separate write kernel runs. Reference:
    # decode_reference.py attention_tree_ref.
    def attention_tree(self, qkv: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: torch.Tensor,
                       pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, B: int, Hkv: int, rep: int,
                       head_dim: int, max_context: int, out: torch.Tensor, ws: "AttnWorkspace",
                       nsplit: int | None = None, rpos: torch.Tensor | None = None,
                       path: torch.Tensor | None = None, merge: bool = False):
        """attention() of B tokens of one slot in rows pos[b] (k roped at sequence position rpos[b]; None: pos[b]),
        each over its own tree path (path int32 [B], decode_attn.cu; None: a chain, the identity paths); writes
        every token's k/v row. nsplit: splits per (token, KV head); the batch-1 count (GPUModel.verify) gives each
        token the same schedule, hence the same bits, as a step of one token."""
        n = nsplit or ws.splits(B)
        assert rep <= ATT_REPM and head_dim in (64, 128) and B <= ws.max_tokens and n <= ws.splits(1)
        if path is None:
            path = self._chain_path(pos.device)
        # the schedule is n splits per token; the grid is one wave (B tokens' blocks looping over their splits,
        # decode_attn.cu): n blocks per token would be B waves of blocks that mostly exit at short contexts
        grid = min(n, ws.splits(B), TREE_GRID or n)
        self._launch(f"attn_decode_hd{head_dim}_tree", (grid, Hkv, B), (256,),
                     (_p(qkv), _p(kc), _p(vc), _p(slots), _p(pos), _p(pos if rpos is None else rpos), _p(path),
                      _p(cos), _p(sin), _i(Hkv), _i(rep), _i(max_context), _p(out), _p(ws.part_o), _p(ws.part_ml),
                      None if merge else _p(ws.counters), _i(n)))
        if merge:
            self.attn_merge(pos if rpos is None else rpos, B, Hkv, rep, head_dim, n, out, ws)

    def topk(self, logits: torch.Tensor, R: int, out: torch.Tensor):
        """out int64 [R, 4] = the ids of the 4 largest logits of each row of logits fp32 [>= R, N] (descending,
        ties to the lower id: decode_reference.topk_ref). ws / counters: this object's, made on first use (before
        any capture: the callers run eagerly first)."""
        assert logits.dtype == torch.float32 and out.dtype == torch.int64 and R <= MAX_TOKENS
        if getattr(self, "_topk_ws", None) is None:
            self._topk_ws = torch.zeros(MAX_TOKENS * TOPK_BLOCKS * TOPK, dtype=torch.int64, device=logits.device)
            self._topk_cnt = torch.zeros(MAX_TOKENS, dtype=torch.int32, device=logits.device)
        self._launch("topk_rows", (TOPK_BLOCKS, R), (256,),
                     (_p(logits), _i(logits.shape[-1]), _p(self._topk_ws), _p(self._topk_cnt), _p(out)))

    def move_rows(self, kc: torch.Tensor, vc: torch.Tensor, slot: int, start: int, nodes: list[int]):
        """keep_path's K/V move (decode_kvwrite.cu move_rows): for the accepted path's node n_j (j = 1..d), rows
        start + n_j -> start + j of `slot` in every layer of kc, vc [layers, slots, Hkv, ctx, hd]. One launch."""
        L, S, Hkv, ctx, hd = kc.shape
        self._launch("move_rows", (L * Hkv, 2), (32,),
                     (_p(kc), _p(vc), _i(slot), _i(S), _i(Hkv), _i(ctx), _i(hd), _i(start), _i(pack_path(nodes)),
                      _i(len(nodes))), pdl=False)

    def move_rows_dev(self, kc: torch.Tensor, vc: torch.Tensor, margs: torch.Tensor):
        """move_rows with (start, path, d, slot) in margs int32 [4] on the GPU (written by spec_accept)."""
        L, S, Hkv, ctx, hd = kc.shape
        self._launch("move_rows_dev", (L * Hkv, 2), (32,),
                     (_p(kc), _p(vc), _i(S), _i(Hkv), _i(ctx), _i(hd), _p(margs)), pdl=False)

    def spec_accept(self, meta: torch.Tensor, keys: torch.Tensor, parents: list[int], B: int, x: torch.Tensor,
                    out: torch.Tensor, margs: torch.Tensor, hh: torch.Tensor, htok: torch.Tensor):
        """decode_spec.cu spec_accept: accept a verified draft tree's right path on the GPU and set up the next
        step (meta rows 0/1/3, the heads' inputs hh, htok); out int32 [8] = count, kept tokens; margs for
        move_rows_dev. parents: [-1, p1, .., p(B-1)] (static per tree: a kernel argument)."""
        self._launch("spec_accept", (1,), (256,),
                     (_p(meta), _i(meta.shape[1]), _p(keys), _i(pack_parents(parents)), _i(B), _p(x),
                      _i(x.shape[-1]), _p(out), _p(margs), _p(hh), _p(htok)), pdl=False)  # no PDL wait inside

    def _chain_path(self, device) -> torch.Tensor:
        if getattr(self, "_chain", None) is None:
            self._chain = torch.full((MAX_TOKENS,), CHAIN_PATH, dtype=torch.int32, device=device)
        return self._chain


def pack_path(nodes: list[int]) -> int:
    """A tree node's root path (the node at depth 1, 2, .., its own index last) packed 3 bits per depth, as
    decode_attn.cu's tree_row reads it."""
    assert len(nodes) < MAX_TOKENS and all(0 < n < MAX_TOKENS for n in nodes)
    return sum(n << 3 * j for j, n in enumerate(nodes))


def tree_roots(parents: list[int]) -> list[list[int]]:
    """Each node's root path (the nodes at depth 1, 2, .., itself last; [] for the root) of a tree given as
    [-1, p1, .., p(B-1)] with p_b < b: its depth is the path's length, pack_path packs it."""
    roots: list[list[int]] = [[]]
    for b in range(1, len(parents)):
        roots.append(roots[parents[b]] + [b])
    return roots


def tree_walk(toks: list[int], ids: list[int], parents: list[int]) -> list[int]:
    """A verified tree's accepted nodes: from the root, the child whose token is the argmax (ids) of the current
    node's row, while there is one (what decode_spec.cu spec_accept does on the GPU)."""
    cur, path = 0, []
    while True:
        nxt = next((c for c in range(1, len(parents)) if parents[c] == cur and toks[c] == ids[cur]), None)
        if nxt is None:
            return path
        path.append(nxt)
        cur = nxt


def pack_parents(parents: list[int]) -> int:
    """[-1, p1, .., p(B-1)] -> node b's parent at bits 3(b-1) (decode_spec.cu spec_accept)."""
    assert parents[0] == -1 and len(parents) <= MAX_TOKENS
    return sum(p << 3 * (b - 1) for b, p in enumerate(parents) if b)


CHAIN_PATH = pack_path(list(range(1, MAX_TOKENS)))  # node j at depth j: a chain of drafts


ATT_MAX_SPLITS = 256  # blocks along positions per (token, KV head); rep * splits <= 8 * ATT_REPM * 64 (merge)


# = decode_attn.cu's defaults: the merge launch's threads per dim and dims per block (0: a head's head_dim)
ATT_MERGE_P = 8
ATT_MERGE_DB = 0


_CLUSTER_POLICIES = {"1": 0, "pairs": 0, "spread": 1, "lb": 2}  # DEEPINFER_GEMV_CLUSTER -> CUclusterSchedulingPolicy


def _define(defines: tuple[str, ...], name: str, default: int) -> int:
    """The value of -Dname=V among defines, else default."""
    return next((int(d.split("=", 1)[1]) for d in defines if d.startswith(f"-D{name}=")), default)


def merge_launch(heads: int, B: int, head_dim: int, p: int, db: int) -> tuple[tuple[int, int, int], tuple[int]]:
    """(grid, block) of attn_merge (decode_attn.cu attn_merge_body / attn_merge_body_p): one block per (query head,
    token) of head_dim threads; with p > 1 threads per dim, head_dim / db blocks per (head, token) of db x p."""
    d = db if p > 1 and 0 < db < head_dim else head_dim
    assert head_dim % d == 0 and d * p <= 1024
    return (heads, B, head_dim // d), (d * p,)


def attn_splits(sms: int, kv_heads: int, tokens: int) -> int:
    """Blocks along positions per (token, KV head): the grid is one wave of one block per SM (the kernel
    holds ~200 registers x 256 threads); short contexts use fewer (each split is >= 64 rows)."""
    return max(1, min(ATT_MAX_SPLITS, sms // (kv_heads * tokens)))


class AttnWorkspace:
    """Split-K partials and the per-(token, KV head) arrival counters (zero between launches)."""

    def __init__(self, max_tokens: int, heads: int, kv_heads: int, head_dim: int, device, sms: int | None = None,
                 nsplit: int | None = None):
        if sms is None:
            sms = torch.cuda.get_device_properties(device).multi_processor_count
        self.max_tokens, self.kv_heads, self.sms, self.fixed = max_tokens, kv_heads, sms, nsplit
        n = nsplit or attn_splits(sms, kv_heads, 1)  # most splits per token at B = 1
        self.part_o = torch.empty(max_tokens * heads * n * head_dim, dtype=torch.float32, device=device)
        self.part_ml = torch.empty(max_tokens * heads * n * 2, dtype=torch.float32, device=device)
        self.counters = torch.zeros(max_tokens, kv_heads, dtype=torch.int32, device=device)
        self.gen = torch.zeros(max_tokens, kv_heads, dtype=torch.int32, device=device)  # the grid merge's generations

    def splits(self, B: int) -> int:
        return self.fixed or attn_splits(self.sms, self.kv_heads, B)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.part_o, self.part_ml, self.counters, self.gen))


def keys_to_ids(keys: np.ndarray) -> list[int]:
    """argmax keys (int64 view of orderable(max) << 32 | ~index) -> token ids."""
    k = keys.view(np.uint64) & np.uint64(0xFFFFFFFF)
    return [int(0xFFFFFFFF - int(v)) for v in k]
