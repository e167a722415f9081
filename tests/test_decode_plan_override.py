"""DEEPINFER_GEMV_PLAN (kernels/decode_kernels.py): a linear's decode GEMV plan set from the environment, for plan
A/Bs inside whole steps (engine/bench/decode_ab.py variants); unset, the tuned plans and the planner decide."""
from kernels.decode_kernels import _plan_override


def test_plan_override_reads_bits_epilogue_and_shape(monkeypatch):
    monkeypatch.delenv("DEEPINFER_GEMV_PLAN", raising=False)
    assert _plan_override(3, "resid", 3584, 18944) is None
    monkeypatch.setenv("DEEPINFER_GEMV_PLAN", "3:resid:3584:18944=4x4x2/3:store:4608:3584=8x2x1")
    assert _plan_override(3, "resid", 3584, 18944) == (4, 4, 2)
    assert _plan_override(3, "store", 4608, 3584) == (8, 2, 1)
    assert _plan_override(4, "resid", 3584, 18944) is None  # another bit width: not this entry
    assert _plan_override(3, "silu", 37888, 3584) is None
