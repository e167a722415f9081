"""The split-K prefill kernel's launch plan (kernels/splitk_plan.py; the kernel itself is Triton, GPU-only: checked in
tests/test_gpu_prefill.py): tiles by bit width, programs per SM by weight size, the partials cap."""
from kernels.splitk_plan import SPLITK, SPLITK_BY_BITS, splitk_plan, splitk_tiles

H200_SMS = 132


def _programs(M, N, K, sms=H200_SMS, cap=1 << 30):
    BM, S, kb = splitk_plan(M, N, K, sms, cap)
    return -(-N // SPLITK["BN"]) * -(-M // BM) * S, S, kb


def test_large_weights_get_more_programs_per_sm():
    # 3B gate_up / down (45M / 23M weights): 4 programs per SM; 7B down / gate_up (68M / 136M): 6
    for N, K, waves in ((22016, 2048, 4), (2048, 11008, 4), (3584, 18944, 6), (37888, 3584, 6)):
        progs, S, kb = _programs(48, N, K)
        nk = K // SPLITK["BK"]
        assert S * kb >= nk and (S - 1) * kb < nk  # the splits cover K, none empty
        # the split count rounds up to whole k-block runs, so the programs reach about `waves` per SM
        assert progs >= waves * H200_SMS * 0.8, (N, K, progs)
        assert progs < (waves + 2) * H200_SMS, (N, K, progs)


def test_partials_stay_within_the_cap_and_one_split_is_the_floor():
    M, N, K = 48, 3584, 18944
    _, S, _ = splitk_plan(M, N, K, H200_SMS, cap_floats=4 * M * N)
    assert S <= 4
    _, S, kb = splitk_plan(M, N, K, H200_SMS, cap_floats=0)
    assert S == 1 and kb == K // SPLITK["BK"]


def test_small_cards_split_less():
    # an RTX 3050's 20 SMs: the same weight in fewer splits than on the H200's 132
    assert splitk_plan(48, 3584, 18944, 20, 1 << 30)[1] < splitk_plan(48, 3584, 18944, H200_SMS, 1 << 30)[1]


def test_tiles_by_bit_width():
    assert splitk_tiles(3) is SPLITK and splitk_tiles(4) is SPLITK
    SPLITK_BY_BITS[3] = dict(SPLITK, waves=2)
    try:
        assert splitk_tiles(3)["waves"] == 2 and splitk_tiles(4) is SPLITK
    finally:
        SPLITK_BY_BITS.pop(3)
