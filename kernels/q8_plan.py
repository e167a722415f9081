"""Where and how the step's int8-activation GEMVs run (decode_gemv.cu gemv_w4q8_*, EngineConfig.decode_q8): which
linears they take (q8_ok) and their launch plans (q8_plan). No torch or CUDA here: the references (decode_reference,
q8_reference) and the launcher (decode_kernels) both read it."""
from __future__ import annotations

# int8 activations (the gemv_w4q8_* kernels): the best (KSW, KSB, MT) of the int8 probe's sweep per (N, K) on an H100
# (docs/results/q8_probe_chain_h100.json: the 3B, 7B and 14B linears, the gate_up as plain rows); other shapes (2, 4,
# 1). The silu GEMV is built at MT = 2 (a gate and an up tile per warp) and takes the sweep's KSW and KSB.
Q8_PLANS = {(2560, 2048): (2, 4, 1), (2048, 2048): (2, 4, 1), (22016, 2048): (2, 1, 1), (2048, 11008): (8, 4, 2),
            (4608, 3584): (2, 4, 1), (3584, 3584): (2, 4, 1), (37888, 3584): (2, 4, 1), (3584, 18944): (8, 2, 2),
            (7168, 5120): (4, 2, 2), (5120, 5120): (2, 8, 2), (27648, 5120): (4, 1, 2), (5120, 13824): (8, 1, 1)}
Q8_SLOTS = 160  # groups of 128 of x one block holds at most (one token: 25.6 KB of shared memory)
SLOT_BYTES = 160  # a slot in shared memory: 128 xq bytes and 4 (dx, sx) float pairs (decode_gemv.cu q8_kloop)


def w4g128(w) -> bool:
    """Packed W4 in groups of 128 with plain scales and mins: the weights the probe's int8 kernels read
    (kernels/q8_kernels.py), the step's first q8 layout."""
    return q8_layout(w) == ""


# the step's q8 kernels by W4 layout (decode_gemv.cu GEMVQ8L): (group, scale form) -> the name's infix
Q8_LAYOUTS = {(128, ""): "", (32, ""): "g32", (32, "kq"): "k32", (32, "sym"): "s32"}
Q8_EPIS = ("store", "resid", "silu", "store_mt2", "resid_mt2")  # each layout's kernels, for 1 and for 2..8 tokens


def q8_layout(w) -> str | None:
    """The infix of the q8 kernels that read QWeight w (gemv_w4{infix}q8_*): our W4 g128 checkpoints, and the GGUF Q4
    repacks in groups of 32 (plain, Q4_K's KQ form, Q4_0's SYM form: EngineConfig.gguf_pack), whose groups are one
    x block each; None for every other layout (W3, W6, W8: the fp16 kernels)."""
    if w.kind == "dense" or w.bits != 4:
        return None
    return Q8_LAYOUTS.get((w.group, w.form))


def q8_name(layout: str, B: int, epi: str) -> str:
    """The q8 kernel of a layout's infix for B tokens (gemv_w4{infix}q8_* for one, gemv_w4{infix}q8b_* for 2..8);
    epi with its tile suffix (Q8_EPIS)."""
    return f"gemv_w4{layout}q8{'b' if B > 1 else ''}_{epi}"


# every q8 kernel (the module DecodeKernels.load_q8 compiles) -> the tokens it takes at most
_Q8_TOKENS = {q8_name(lay, B, e): B for lay in Q8_LAYOUTS.values() for B in (1, 8) for e in Q8_EPIS}
Q8_NAMES = list(_Q8_TOKENS)


def q8_kernel(name: str) -> int:
    """How many tokens a kernel of the q8 family takes (1 or 8), 0 for any other kernel (the launcher's dynamic
    shared memory, sass_mix's loops before the K loop)."""
    return _Q8_TOKENS.get(name, 0)


def q8_plan(epi: str, N: int, K: int) -> tuple[int, int, int]:
    """(KSW, KSB, MT) of a q8 GEMV: Q8_PLANS, MT as the kernels are built (silu 2), KSB and KSW cut to at least two
    groups per warp, and the block's slots within Q8_SLOTS."""
    return q8_fit(epi, N, K, *Q8_PLANS.get((N, K), (2, 4, 1)))


def q8_fit(epi: str, N: int, K: int, ksw: int, ksb: int, mt: int) -> tuple[int, int, int]:
    """A (KSW, KSB, MT) made one the q8 kernels run: MT as they are built (silu 2), KSB and KSW cut to at least two
    groups per warp and the block's slots within Q8_SLOTS."""
    if epi == "silu":
        mt = 2
    while mt > 1 and N % (16 * mt):
        mt //= 2
    G = K // 128
    while ksw * ksb > 1 and (G // (ksw * ksb) < 2 or q8_slots(G, ksw * ksb, ksw) > Q8_SLOTS):
        ksb, ksw = (ksb // 2, ksw) if ksb > 1 else (ksb, ksw // 2)
    assert ksw & (ksw - 1) == 0, "the kernels' slot arithmetic takes KSW as a power of two (decode_q8dot.cu)"
    return ksw, ksb, mt


def q8_slots(G: int, KS: int, KSW: int, by: int = 0) -> int:
    """decode_q8dot.cu q8_slots: the shared-memory slots block row `by` of a q8 GEMV fills (the most at by = 0)."""
    first = by * KSW
    return -(-(G - first) // KS) * KSW if first < G else 0


SMEM_MAX = 48 * 1024  # dynamic shared memory a block takes without an opt-in (every arch)


def slot_bytes(G: int, KS: int, KSW: int, B: int) -> int:
    """Dynamic shared memory of a q8 GEMV's block: B tokens' slots at a plan of KS = KSB x KSW K slices."""
    return SLOT_BYTES * B * q8_slots(G, KS, KSW)


def q8_smem(epi: str, N: int, K: int, B: int) -> int:
    """Bytes of x slots a q8 GEMV's block holds for B tokens at its plan."""
    ksw, ksb, _ = q8_plan(epi, N, K)
    return slot_bytes(K // 128, ksw * ksb, ksw, B)


def q8_ok(w, epi: str, B: int) -> bool:
    """Where a q8 kernel takes the GEMV: 1..8 tokens (gemv_w4q8_* for one, gemv_w4q8b_* for more: the same arithmetic
    per token), W4 in groups of 128 or 32 (q8_layout), store / resid / silu (the lm_head stays fp16), the block's x slots
    within 48 KB of shared memory (every shape at B = 1; at B = 8 the 3B's linears, not the 7B's / 14B's down nor
    the 14B's gate_up, whose plans have few K slices: those steps keep fp16 there)."""
    return (1 <= B <= 8 and epi in ("store", "resid", "silu") and q8_layout(w) is not None and w.K % 128 == 0
            and w.K // 128 <= Q8_SLOTS
            and w.N * w.K < 2 ** 32 and (epi != "silu" or w.N % 64 == 0) and w.N % 16 == 0
            and q8_smem(epi, w.N, w.K, B) <= SMEM_MAX)
