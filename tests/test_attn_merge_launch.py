"""The merge launch's geometry (kernels/decode_kernels.py merge_launch): the blocks and threads attn_merge runs with
for each ATT_MERGE_P / ATT_MERGE_DB, and the Python defaults equal to decode_attn.cu's (the kernel's launch bounds
and its shared-memory chunk follow from them). The kernel's arithmetic is the reference's merge
(decode_reference.attention_split_ref, tested in test_gpu_step_reference.py); its bits against the in-kernel merge
are a GPU check (kernels/checks.py merge_launch_bits_equal)."""
import re
from pathlib import Path

import pytest

from kernels import decode_kernels as dk


def test_merge_launch_geometry():
    # one thread per dim, one block per (query head, token): the merge before ATT_MERGE_P
    assert dk.merge_launch(16, 1, 128, 1, 0) == ((16, 1, 1), (128,))
    assert dk.merge_launch(16, 1, 128, 1, 32) == ((16, 1, 1), (128,))  # DB only with P > 1
    # P threads per dim
    assert dk.merge_launch(16, 1, 128, 8, 0) == ((16, 1, 1), (1024,))
    # a head's dims over HD / DB blocks
    assert dk.merge_launch(28, 2, 128, 32, 32) == ((28, 2, 4), (1024,))
    assert dk.merge_launch(14, 1, 64, 16, 32) == ((14, 1, 2), (512,))
    assert dk.merge_launch(14, 1, 64, 16, 64) == ((14, 1, 1), (1024,))
    with pytest.raises(AssertionError):
        dk.merge_launch(16, 1, 128, 16, 0)  # 2,048 threads


def test_merge_defaults_match_the_kernel_source():
    src = (Path(dk.__file__).parent / "decode_attn.cu").read_text()
    for name in ("ATT_MERGE_P", "ATT_MERGE_DB"):
        m = re.search(rf"#ifndef {name}\n(?://[^\n]*\n)*#define {name} (\d+)", src)
        assert m and int(m.group(1)) == getattr(dk, name), name
    assert dk._define(("-DATT_MERGE_P=8", "-DX=1"), "ATT_MERGE_P", 1) == 8
    assert dk._define(("-DATT_MERGE_PX=8",), "ATT_MERGE_P", 1) == 1
