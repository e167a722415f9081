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


def test_pdl_off_reads_kernel_names(monkeypatch):
    # DEEPINFER_PDL_OFF: kernels launched without the PDL attribute (decode_ab variants; "/" as decode_ab's env lists
    # keep "," and "+" for themselves)
    from engine.bench.decode_ab import parse_variants
    from kernels.decode_kernels import pdl_off
    monkeypatch.delenv("DEEPINFER_PDL_OFF", raising=False)
    assert pdl_off() == frozenset()
    (name, env), = parse_variants("big:DEEPINFER_PDL_OFF=gemv_w4_silu/gemv_w4_resid_mt2")
    monkeypatch.setenv("DEEPINFER_PDL_OFF", env["DEEPINFER_PDL_OFF"])
    assert pdl_off() == {"gemv_w4_silu", "gemv_w4_resid_mt2"}
    monkeypatch.setenv("DEEPINFER_PDL_OFF", "gemv_w4_logits, embed_rows")
    assert pdl_off() == {"gemv_w4_logits", "embed_rows"}
