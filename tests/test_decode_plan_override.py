"""DEEPINFER_GEMV_PLAN (kernels/decode_kernels.py): a linear's decode GEMV plan set from the environment, for plan
A/Bs inside whole steps (engine/bench/decode_ab.py variants); unset, the tuned plans and the planner decide."""
import os
import types

import pytest

from engine.bench.decode_ab import variant_env
from kernels.decode_kernels import DecodeKernels, _plan_override


def test_plan_override_reads_bits_epilogue_and_shape(monkeypatch):
    monkeypatch.delenv("DEEPINFER_GEMV_PLAN", raising=False)
    assert _plan_override(3, "resid", 3584, 18944) is None
    monkeypatch.setenv("DEEPINFER_GEMV_PLAN", "3:resid:3584:18944=4x4x2/3:store:4608:3584=8x2x1")
    assert _plan_override(3, "resid", 3584, 18944) == (4, 4, 2)
    assert _plan_override(3, "store", 4608, 3584) == (8, 2, 1)
    assert _plan_override(4, "resid", 3584, 18944) is None  # another bit width: not this entry
    assert _plan_override(3, "silu", 37888, 3584) is None


def test_plan_override_refuses_an_mt_the_kernels_lack(monkeypatch):
    # the logits and silu kernels exist at MT 2 only: MT 4 launched the MT-2 kernel over half the tiles (wrong logits)
    from kernels.decode_kernels import mts
    assert mts("store") == mts("resid") == (1, 2) and mts("logits") == mts("silu") == (2,)
    for bad in ("4:logits:151936:2048=2x1x4", "4:silu:22016:2048=4x1x1", "4:resid:2048:2048=8x1x4",
                "4:store:2560:2048=8x1"):
        monkeypatch.setenv("DEEPINFER_GEMV_PLAN", bad)
        with pytest.raises(ValueError, match="KSWxKSBxMT"):
            _plan_override(4, "logits", 151936, 2048)
    monkeypatch.setenv("DEEPINFER_GEMV_PLAN", "4:logits:151936:2048=2x1x2")
    assert _plan_override(4, "logits", 151936, 2048) == (2, 1, 2)
    # malformed entries and unknown epilogues: the syntax in the message, not a bare unpacking error
    for bad, words in (("4:logits:151936=4x1x2", "bits:epi:N:K=KSWxKSBxMT"), ("4:logits:1:2=4x1", "KSWxKSBxMT"),
                       ("4:logits:151936:2048=4xax2", "bits:epi:N:K"), ("4:lm_head:151936:2048=4x1x2", "one of")):
        monkeypatch.setenv("DEEPINFER_GEMV_PLAN", bad)
        with pytest.raises(ValueError, match=words):
            _plan_override(4, "logits", 151936, 2048)


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


def test_decode_ab_keeps_a_variants_environment_until_it_is_measured(monkeypatch):
    # the plans are read when the graphs are captured, after the GPUModel is made: the env must last through both
    monkeypatch.delenv("DEEPINFER_GEMV_PLAN", raising=False)
    monkeypatch.setenv("DEEPINFER_PDL_OFF", "before")
    with variant_env({"DEEPINFER_GEMV_PLAN": "4:resid:5120:5120=8x1x2", "DEEPINFER_PDL_OFF": "embed_rows"}):
        assert _plan_override(4, "resid", 5120, 5120) == (8, 1, 2)  # what a capture inside the variant sees
        assert os.environ["DEEPINFER_PDL_OFF"] == "embed_rows"
    assert "DEEPINFER_GEMV_PLAN" not in os.environ and os.environ["DEEPINFER_PDL_OFF"] == "before"
    assert _plan_override(4, "resid", 5120, 5120) is None


def _kernels(sms: int):
    return types.SimpleNamespace(sms=sms, bal=True, bal_gain=None)  # what DecodeKernels.tuned reads


def _tuned(sms: int) -> dict:
    k = _kernels(sms)
    shapes = {"0.5b": (896, 4864, 1152), "3b": (2048, 11008, 2560), "7b": (3584, 18944, 4608),
              "14b": (5120, 13824, 7168)}  # hidden, ffn, qkv rows
    return {(s, lin): DecodeKernels.tuned(k, epi, N, K) for s, (H, F, Q) in shapes.items()
            for lin, epi, N, K in (("qkv", "store", Q, H), ("o", "resid", H, H), ("gate_up", "silu", 2 * F, H),
                                   ("down", "resid", H, F))}


def test_tuned_plans_fit_the_14b_in_one_wave_and_hold_fewer_slots_with_the_3b_o():
    t = _tuned(132)  # H100 / H200
    # the plans the 3B and 7B were measured with (their grids fit one wave, or the balanced schedule takes gate_up)
    assert t["3b", "gate_up"] == (4, 1, 2) and t["3b", "down"] == (8, 4, 2)
    assert t["3b", "o"] == (8, 1, 2)  # 64 blocks instead of 128: gate_up's blocks find slots sooner (-2.6% a step)
    assert DecodeKernels.tuned(_kernels(132), "resid", 2048, 2048, long=True) is None  # not in long-context graphs
    assert t["7b", "qkv"] == (8, 1, 2) and t["7b", "gate_up"] == (4, 1, 2) and t["7b", "down"] == (8, 2, 2)
    assert t["7b", "o"] is None and all(v is None for (s, _), v in t.items() if s == "0.5b")
    # the 14B's o, gate_up and down had 320 / 432 / 320 blocks (1.2-1.6 waves of 264): one wave now
    assert t["14b", "o"] == (8, 1, 2)  # 160 blocks of 32 rows
    assert t["14b", "gate_up"] == (2, 1, 2)  # 216 blocks of 4 tiles
    assert t["14b", "down"] == (4, 3, 2)  # 80 blocks of 2 tiles x 3 along K = 240
    # the lm_heads: 4 warps along K in blocks of 2 tiles, 9 waves instead of 2.25 (docs/gpu.md, thirty-third and
    # thirty-fourth sessions); the 0.5B's short K keeps gemv_plan's rule, as do many-wave grids (20 SMs)
    assert DecodeKernels.tuned(_kernels(132), "logits", 151936, 2048) == (4, 1, 2)
    assert DecodeKernels.tuned(_kernels(132), "logits", 152064, 5120) == (4, 1, 2)
    assert DecodeKernels.tuned(_kernels(132), "logits", 151936, 896) is None
    assert DecodeKernels.tuned(_kernels(20), "logits", 151936, 2048) is None
    # with 20 SMs (an RTX 3050) every one of these grids is many waves: nothing moves
    t20 = _tuned(20)
    assert t20["3b", "o"] is None and t20["14b", "o"] is None
    assert t20["14b", "gate_up"] == (4, 1, 2) and t20["14b", "down"] == (8, 2, 2)


def test_plan_override_whose_split_does_not_fit_says_so(monkeypatch, caplog):
    # gemv_call drops KSB to 1 where the partials would not fit the split-K workspace: for a DEEPINFER_GEMV_PLAN
    # variant that is a different plan from the one asked for, so it is logged (once per linear), and the launch's grid
    # shows the plan that runs. The launch arguments are made on the CPU (no kernel runs): a workspace of 1,024 floats
    # stands for the 8 MB one that the lm_head's 2 x 4,748 tiles overflow.
    import logging

    import torch

    from kernels import decode_kernels as dk
    from kernels.checks import rand_qweight

    kn = DecodeKernels.__new__(DecodeKernels)
    kn.sms, kn.bal, kn.bal_gain = 132, True, None
    kn.ws, kn.cnt = torch.empty(1024), torch.zeros(8192, dtype=torch.int32)
    kn.fn = {"gemv_w4_logits": None}
    monkeypatch.setattr(dk, "_PLAN_WARNED", set())
    w = rand_qweight(4096, 2048, 4, "cpu", torch.Generator().manual_seed(0))
    x = torch.zeros(8, 2048, dtype=torch.float16)
    out, keys = torch.zeros(1, 4096), torch.zeros(8, dtype=torch.int64)
    monkeypatch.setenv("DEEPINFER_GEMV_PLAN", "4:logits:4096:2048=4x2x2")
    with caplog.at_level(logging.WARNING, logger="deepinfer.kernels"):
        name, grid, _, _ = kn.gemv_call(w, x, 1, "logits", out, keys)
        kn.gemv_call(w, x, 1, "logits", out, keys)
    assert name == "gemv_w4_logits" and grid == (64, 1)  # 128 tiles of 32 rows, 2 per block; KSB 1, not 2
    assert [r.getMessage() for r in caplog.records].count(
        "DEEPINFER_GEMV_PLAN logits 4096x2048: KSB 2 runs as 1 (K groups per warp, or the split-K workspace / "
        "counters, do not hold it)") == 1
    kn.ws = torch.empty(2 << 20)  # room for the partials: the plan runs as asked, nothing logged
    monkeypatch.setattr(dk, "_PLAN_WARNED", set())
    caplog.clear()
    assert kn.gemv_call(w, x, 1, "logits", out, keys)[1] == (64, 2) and not caplog.records
    # an MT the logits kernel is not built with is refused at the launch too (not only in the knob)
    with pytest.raises(AssertionError, match="MT 4"):
        kn.gemv_call(w, x, 1, "logits", out, keys, plan=(2, 1), mt=4)
