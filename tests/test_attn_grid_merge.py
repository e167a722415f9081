"""The grid merge's slices (decode_attn.cu attn_grid_merge, emulated block by block by grid_merge_ref): every output
written once, from the right partials, equal to the plain merge of the splits. The kernel itself is checked against
the merge launch bit for bit on a GPU (kernels/checks.py, with -DATT_GRID_MERGE=1)."""
import pytest
import torch

from kernels.decode_reference import grid_merge_ref


@pytest.mark.parametrize("B,Hkv,rep,hd,nsplit,nact", [
    (1, 2, 8, 128, 66, [64]),      # 3B at 16k on an H200: 16 outputs per block
    (1, 4, 7, 128, 33, [32]),      # 7B: a slice of 28 crosses no head; 896 / 32
    (3, 2, 7, 64, 20, [3, 20, 7]),  # uneven: slices cross heads, the last block's slice is short or empty
    (8, 2, 8, 128, 8, [8] * 8),    # batch 8: one head per block
])
def test_grid_merge_slices_equal_the_plain_merge(B, Hkv, rep, hd, nsplit, nact):
    g = torch.Generator().manual_seed(0)
    H = Hkv * rep
    part_o = torch.randn(B * H * nsplit * hd, generator=g)
    ml = torch.stack([torch.randn(B * H * nsplit, generator=g) * 3, torch.rand(B * H * nsplit, generator=g) + 0.5], -1)
    out = grid_merge_ref(part_o, ml.reshape(-1), B, Hkv, rep, nsplit, nact, hd)
    assert not out.isnan().any()
    po = part_o.view(B, H, nsplit, hd).double()
    m = ml.view(B, H, nsplit, 2).double()
    for b in range(B):
        a = nact[b]
        e = torch.exp(m[b, :, :a, 0] - m[b, :, :a, 0].max(-1, keepdim=True).values)  # [H, a]
        want = (e[:, :, None] * po[b, :, :a]).sum(1) / (e * m[b, :, :a, 1]).sum(1, keepdim=True)
        torch.testing.assert_close(out[b].view(H, hd).double(), want, rtol=1e-5, atol=1e-6)
