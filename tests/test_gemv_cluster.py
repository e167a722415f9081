"""Split-K GEMVs launched as thread block clusters (kernels/decode_gemv.cu, sm_90+): the K slices' partials summed
through distributed shared memory give the same bits as the global handshake (same partials, same order), for every
epilogue that splits K and for the GGUF forms; on the CPU, the launch attribute's layout (kernels/pdl.py)."""
import ctypes

import pytest
import torch

from kernels import pdl


def test_cluster_attribute_layout_matches_cuLaunchAttribute():
    # CUlaunchAttribute: id (4 bytes), pad to 8, a 64-byte value union; CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4 with
    # the value's first 12 bytes x, y, z
    assert ctypes.sizeof(pdl._Attr) == 72 and pdl._Attr.value.offset == 8
    a = pdl._Attr()
    a.id = pdl._ATTR_CLUSTER_DIMENSION
    a.value.dim = pdl._Dim3(1, 4, 1)
    raw = bytes(a)[8:20]
    assert [int.from_bytes(raw[i:i + 4], "little") for i in (0, 4, 8)] == [1, 4, 1]
    assert pdl._ATTR_CLUSTER_DIMENSION == 4 and pdl._ATTR_PROGRAMMATIC_STREAM_SERIALIZATION == 6


def test_cluster_knob_reads_policy_and_ksb(monkeypatch):
    from kernels.decode_kernels import DecodeKernels
    kn = DecodeKernels.__new__(DecodeKernels)  # no GPU: the knob's logic only
    kn.cluster_ok = True
    for v, want2, want4 in (("0", None, None), ("1", 0, 0), ("spread", 1, 1), ("lb", 2, 2), ("pairs", 0, None)):
        monkeypatch.setenv("DEEPINFER_GEMV_CLUSTER", v)
        assert (kn.gemv_cluster(2), kn.gemv_cluster(4)) == (want2, want4), v
    monkeypatch.setenv("DEEPINFER_GEMV_CLUSTER", "balanced")
    with pytest.raises(ValueError, match="one of 0, 1, pairs, spread, lb"):
        kn.gemv_cluster(2)
    kn.cluster_ok = False  # below sm_90, or the module built with -DGEMV_CLUSTER=0: never
    monkeypatch.setenv("DEEPINFER_GEMV_CLUSTER", "1")
    assert kn.gemv_cluster(4) is None


def _sm90():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm_90+ GPU (thread block clusters)")
def test_cluster_reduction_equals_the_handshake(monkeypatch):
    from kernels.checks import rand_qweight
    from kernels.checks_gguf import rand_layout
    from kernels.decode_kernels import DecodeKernels

    monkeypatch.setenv("DEEPINFER_KERNEL_DEFINES", "-DGEMV_CLUSTER=1")  # the path is compiled in on request only
    kn, dev = DecodeKernels.get(), torch.device("cuda")
    assert kn.cluster_ok
    gen = torch.Generator().manual_seed(7)
    # the 3B / 7B / 14B down_proj (KSB 4 / 2 / 3 in the tuned plans), the 0.5B's (gemv_plan's rule), a Q4_K-form down
    weights = [rand_qweight(N, K, bits, dev, gen, bias=True) for bits in (4, 3)
               for (N, K) in [(2048, 11008), (3584, 18944), (5120, 13824), (896, 4864)]]
    weights.append(rand_layout(2048, 11008, 4, 32, gen, dev, bias=True, form="kq")[0])
    checked = 0
    for w in weights:
        for B in (1, 3, 8):
            x = torch.zeros(8, w.K, dtype=torch.float16, device=dev)
            x[:B] = torch.randn(B, w.K, generator=gen).half().to(dev)
            h0 = torch.randn(8, w.N, generator=gen).to(dev)
            for epi in ("resid", "store"):
                name, grid, _, _ = kn.gemv_call(w, x, B, epi, h0.clone() if epi == "resid" else
                                                torch.empty(B, w.N, dtype=torch.float16, device=dev))
                if grid[1] == 1:
                    continue
                outs = []
                for on in ("0", "1", "lb"):
                    monkeypatch.setenv("DEEPINFER_GEMV_CLUSTER", on)
                    out = h0.clone() if epi == "resid" else torch.full((B, w.N), float("nan"), dtype=torch.float16,
                                                                        device=dev)
                    kn.ws.fill_(float("nan"))
                    kn.gemv(w, x, B, epi, out)
                    torch.cuda.synchronize()
                    # the handshake stores every block's partial in ws; clusters keep them in shared memory
                    assert bool(kn.ws[:grid[1] * 64].isnan().all()) == (on != "0"), (name, on)
                    outs.append(out)
                assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2]), (name, w.N, w.K, B, epi)
                checked += 1
    assert kn.cluster_ok and checked >= 20
