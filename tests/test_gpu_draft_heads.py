"""Draft heads on a CUDA GPU (engine/runtime/draft_heads.py): the same checks as tests/test_draft_heads.py's step-path
test, on the real kernels (fp16 heads, the decode GEMV's fused argmax over K rows, verify graphs)."""
from __future__ import annotations

import pytest

from tests.test_draft_heads import check_heads_on_step_path


@pytest.mark.gpu
def test_heads_on_the_cuda_step_path_keep_greedy_output(tmp_path):
    check_heads_on_step_path(tmp_path, "cuda")
