"""The persistent GEMV chain experiment (#16; kernels/decode_persist.cu, engine/bench/persist_chain.py): the op table's
rows on the CPU, and on a GPU the chain's outputs equal to the step's PDL launches bit for bit (the barrier)."""
import numpy as np
import pytest

from engine.bench.persist_chain import CHAINS, KINDS, op_row


def _call(name, grid, bias=None):
    """A DecodeKernels.gemv_call tuple with recognisable values: pointers 1000 + i, sizes small."""
    args = (np.uint64(1000), np.uint64(1001), np.uint64(1002), None if bias is None else np.uint64(bias),
            np.uint64(1004), np.int32(2048), np.int32(4096), np.int32(1), np.int32(8), np.int32(16),
            np.uint64(1010), None, None, np.uint64(7), np.uint64(8), None, np.float32(0.0), None, None, None)
    return name, grid, (256,), args


def test_op_row_places_every_field_where_the_kernel_reads_it():
    # decode_persist.cu: qw, sc, mn, bias, x, out_h, out_f, N, K, B, KSW, tile_stride, kind, blocks, KSB, unused
    row = op_row(_call("gemv_w4_silu", (344, 1), bias=1003))
    assert row == [1000, 1001, 1002, 1003, 1004, 1010, 0, 2048, 4096, 1, 8, 16, KINDS["silu"], 344, 1, 0]
    assert op_row(_call("gemv_w4_resid_mt2", (32, 4)))[12:15] == [KINDS["resid_mt2"], 32, 4]
    assert op_row(_call("gemv_w4_store", (160, 1)))[3] == 0  # no bias: a null pointer
    assert CHAINS <= set(KINDS)


def test_op_row_refuses_other_layouts():
    with pytest.raises(AssertionError, match="W4 bodies only"):
        op_row(_call("gemv_w3_store", (160, 1)))


@pytest.mark.gpu
def test_persistent_chain_gives_the_launches_bits(monkeypatch):
    from engine.bench.persist_chain import run_shape
    monkeypatch.setenv("DEEPINFER_KERNEL_DEFINES", "-DGEMV_PERSIST=1")  # its own module; the env restored after
    res = run_shape("0.5b", reps=1)
    checked = [r for r in res.values() if "persist_1_equal" in r]
    assert checked, res
    for lin, r in res.items():
        for k, v in r.items():
            if k.endswith("_equal") or k.endswith("_equal_graph"):
                assert v, (lin, k, r)


def test_ensure_define_adds_a_flag_once(monkeypatch):
    from engine.bench.decode_ab import ensure_define
    monkeypatch.setenv("DEEPINFER_KERNEL_DEFINES", "-DGEMV_NST1=3")
    ensure_define("-DGEMV_PERSIST=1")
    ensure_define("-DGEMV_PERSIST=1")
    import os
    assert os.environ["DEEPINFER_KERNEL_DEFINES"].split() == ["-DGEMV_NST1=3", "-DGEMV_PERSIST=1"]


def test_layer_calls_are_the_steps_gemvs_of_every_layer(tmp_path):
    # the chain times the same four GEMVs per layer that tree_profile / l2_hot launch (one table: layer_gemv_args)
    import torch

    from engine.bench.persist_chain import layer_calls
    from engine.bench.tree_profile import layer_gemvs
    from engine.config import ModelConfig
    from engine.formats.load import load_spec
    from engine.model.gpu_load import load_checkpoint
    from engine.model.gpu_model import GPUModel
    from engine.quant.make_random import make_random
    cfg = ModelConfig(vocab_size=512, hidden_size=256, intermediate_size=384, num_layers=2, num_heads=4,
                      num_kv_heads=2)
    make_random(cfg, "w4", tmp_path, seed=1)
    m = GPUModel(load_checkpoint(load_spec(str(tmp_path)).checkpoint, "cpu"), 1, 32, "cpu")
    calls = layer_calls(m)
    assert list(calls) == ["qkv", "o", "gate_up", "down"] and all(len(v) == 2 for v in calls.values())
    L1 = m.w.layers[1]
    assert calls["down"][1][0] is L1.down and calls["down"][1][1] is m.act and calls["down"][1][4] is m.h
    assert calls["qkv"][0][3] == "store" and calls["gate_up"][1][3] == "silu"
    # tree_profile's launches run those calls (on the references here)
    m.x.copy_(torch.rand_like(m.x.float()).half())
    layer_gemvs(m)["qkv"](L1, 1)
    want = m.qkv[:1].clone()
    m.kn.gemv(*calls["qkv"][1])
    assert torch.equal(m.qkv[:1], want)
