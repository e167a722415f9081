"""The decode attention kernel's split schedule (kernels/decode_attn.cu, mirrored by
kernels/decode_reference.attention_split_ref) equals plain softmax attention for every split count,
including runs that end mid-chunk and splits past the end; and the split-count rule fills one wave."""
import torch

from kernels.decode_kernels import attn_splits
from kernels.decode_reference import attention_split_ref


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
