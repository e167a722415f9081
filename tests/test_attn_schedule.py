"""The decode attention kernel's split schedule (kernels/decode_attn.cu, mirrored by
kernels/decode_reference.attention_split_ref) equals plain softmax attention for every split count,
including runs that end mid-chunk and splits past the end; and the split-count rule fills one wave."""
import torch

from kernels.decode_kernels import attn_splits
from kernels.decode_reference import attention_mma_ref, attention_split_ref, mma16816_lanes, mma_run, split_runs


def plain(q, k, v):
    return torch.softmax(q.double() @ k.double().T, -1) @ v.double()


def test_split_schedule_matches_plain_attention():
    g = torch.Generator().manual_seed(0)
    for L, nsplit, chunk, rpw in [(1, 66, 64, 2), (64, 66, 64, 2), (65, 66, 64, 2), (1000, 7, 64, 2),
                                  (3001, 66, 64, 2), (777, 3, 128, 4), (4096, 256, 64, 2)]:
        q = torch.randn(8, 128, generator=g) * 0.3
        k, v = torch.randn(L, 128, generator=g), torch.randn(L, 128, generator=g)
        got = attention_split_ref(q, k, v, nsplit, chunk, rows_per_warp=rpw)
        assert torch.allclose(got.double(), plain(q, k, v), atol=1e-5), (L, nsplit)


def test_split_count_is_one_wave():
    assert attn_splits(132, 2, 1) == 66  # H200, 3B: 66 x 2 KV heads = 132 blocks
    assert attn_splits(132, 4, 8) == 4
    assert attn_splits(20, 2, 8) == 1  # RTX 3050 at batch 8: never 0
    assert attn_splits(10_000, 1, 1) == 256


def test_mma_schedule_matches_plain_attention():
    """ATT_MMA's schedule (16-row tiles per warp, fp16 q and weights) within fp16 rounding of plain attention."""
    g = torch.Generator().manual_seed(1)
    for L, nsplit, run in [(257, 66, 64), (1000, 7, 64), (3001, 66, 64), (4096, 256, 64), (16384, 66, 64),
                           (300, 1, 64), (4096, 66, 128), (777, 66, 128)]:  # run: ATT_MRUN
        q = torch.randn(8, 128, generator=g) * 0.3
        k, v = torch.randn(L, 128, generator=g), torch.randn(L, 128, generator=g)
        got, want = attention_mma_ref(q, k, v, nsplit, run).double(), plain(q, k, v)
        assert float((got - want).norm() / want.norm()) < 2e-3, (L, nsplit)


def test_mma_run_by_length():
    """The run unit is the chunk below 2,048 rows and 128 from there on (head dim 128); with 66 splits at 4,096 rows
    that is 32 runs of 128 rows (every warp of a block holds a tile) instead of 64 runs of 64."""
    assert mma_run(2047, 128) == 64 and mma_run(2048, 128) == 128 and mma_run(512, 64) == 128
    assert len(split_runs(4096, 66, mma_run(4096, 128))) == 32
    assert len(split_runs(1024, 66, mma_run(1024, 128))) == 16
    g = torch.Generator().manual_seed(2)
    for L in (2047, 2048, 3072):
        q = torch.randn(8, 128, generator=g) * 0.3
        k, v = torch.randn(L, 128, generator=g), torch.randn(L, 128, generator=g)
        got, want = attention_mma_ref(q, k, v, 66, mma_run(L, 128)).double(), plain(q, k, v)
        assert float((got - want).norm() / want.norm()) < 2e-3, L


def test_mma_tile_fragments():
    """decode_attn.cu att_load_tile / att_tile_mma's lane mapping, emulated lane by lane on mma16816's register
    layout: the score fragments are q K^T at the tile rows the kernel masks, the PV fragments are P V at the dims
    the kernel stores, for head dims 64 and 128."""
    for HD in (64, 128):
        gen = torch.Generator().manual_seed(HD)
        q, K, V = (torch.randn(n, HD, generator=gen).half().double() for n in (8, 16, 16))
        P = torch.rand(8, 16, generator=gen).half().double()

        def kdim(lane, w):  # K / q word w of lane (g, t): dims d, d + 1
            i, c = divmod(w, 4)
            return 8 * (4 * i + lane % 4) + 2 * c

        sc = [[[0.0] * 4 for _ in range(32)] for _ in range(2)]
        for j in range(2):
            for s in range(HD // 16):
                a, b = [], []
                for lane in range(32):
                    g, d0, d1 = lane // 4, kdim(lane, 2 * s), kdim(lane, 2 * s + 1)
                    a.append([(q[g, d0], q[g, d0 + 1]), (0, 0), (q[g, d1], q[g, d1 + 1]), (0, 0)])
                    r = 8 * j + g
                    b.append([(K[r, d0], K[r, d0 + 1]), (K[r, d1], K[r, d1 + 1])])
                mma16816_lanes(a, b, sc[j])
        S = q @ K.T
        for j in range(2):
            for lane in range(32):
                g, t = lane // 4, lane % 4
                assert abs(sc[j][lane][0] - S[g, 8 * j + 2 * t]) < 1e-9
                assert abs(sc[j][lane][1] - S[g, 8 * j + 2 * t + 1]) < 1e-9
        O = P @ V
        for w in range(HD // 16):
            i, c = divmod(w, 4)
            acc = [[0.0] * 4 for _ in range(32)]
            a, b = [], []
            for lane in range(32):
                g, t = lane // 4, lane % 4
                d = 8 * (8 * i + g) + 2 * c
                v = [V[2 * t + (jr & 1) + 8 * (jr >> 1)] for jr in range(4)]  # the lane's rows 2t, 2t+1, 2t+8, 2t+9
                a.append([(v[0][d], v[1][d]), (v[0][d + 1], v[1][d + 1]), (v[2][d], v[3][d]), (v[2][d + 1], v[3][d + 1])])
                b.append([(P[g, 2 * t], P[g, 2 * t + 1]), (P[g, 2 * t + 8], P[g, 2 * t + 9])])
            mma16816_lanes(a, b, acc)
            for lane in range(32):
                g, t = lane // 4, lane % 4
                d = 8 * (8 * i + g) + 2 * c
                want = [O[2 * t, d], O[2 * t + 1, d], O[2 * t, d + 1], O[2 * t + 1, d + 1]]
                assert all(abs(x - y) < 1e-9 for x, y in zip(acc[lane], want)), (HD, w, lane)
