"""The split-K prefill kernel's tiles and launch plan (kernels/prefill_triton.py fused_splitk), without Triton, so the
plan is testable on any machine (tests/test_splitk_plan.py)."""
from __future__ import annotations

# split-K tiles for small M (the weight-read-bound prefill of a short prompt): the least summed time at 48 tokens over
# the 3B and 7B linears of 36 tiles swept on the H200 (engine/bench/splitk_bench.py, docs/results/splitk_h200.json)
# waves_big for weights of >= big weights: more splits pay when the weight is large (per linear at 48 tokens, us,
# waves 4 / 6 / 8, W4: 3B gate_up (45M weights) 51.2 / 56.0 / 60.3, 3B down (23M) 31.6 / 36.3 / 41.4, 7B down (68M)
# 83.0 / 72.7 / 78.0, 7B gate_up (136M) 133.5 / 127.1 / 126.0; W3 alike: docs/results/splitk_w{3,4}_grid_h200.json)
SPLITK = dict(BN=128, BK=64, num_warps=4, num_stages=3, waves=4, waves_big=6, big=56 << 20)
# a bit width's own tiles where a sweep finds better ones (none today: W3's best are W4's, splitk_w3*_h200.json);
# splitk_bench sets entries to time a sweep's choice
SPLITK_BY_BITS: dict[int, dict] = {}


def splitk_tiles(bits: int) -> dict:
    """The split-K tiles for weights of `bits` bits."""
    return SPLITK_BY_BITS.get(bits, SPLITK)


def splitk_plan(M: int, N: int, K: int, sms: int, cap_floats: int, c: dict | None = None) -> tuple[int, int, int]:
    """(BM, splits, k blocks per split) for fused_splitk: enough programs for `waves` programs per SM, the
    partials (splits x M x N fp32) within cap_floats."""
    c = c or SPLITK
    BM = 16 if M <= 16 else 32 if M <= 32 else 64
    BK = c["BK"] if K % c["BK"] == 0 else 32
    nk = K // BK
    tiles = -(-N // c["BN"]) * -(-M // BM)
    waves = c["waves_big"] if "waves_big" in c and N * K >= c["big"] else c["waves"]
    want = max(1, min(nk, -(-waves * sms // tiles), cap_floats // max(1, M * N)))
    kb = -(-nk // want)
    return BM, -(-nk // kb), kb
