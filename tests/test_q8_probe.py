"""The int8-activation GEMV probe (kernels/decode_q8.cu, engine/bench/q8_probe.py): its references on the CPU (the
quantization, the byte order, the mask-and-dp4a trick on real packed words, the integer GEMV against the float
product), and on a GPU the kernels against them."""
import random

import pytest
import torch

from kernels.pack import dequantize, pack_w4, quantize, unpack_w4
from kernels.q8_reference import gemv_q8_ref, permute_q8, q8_dot_words, quant_x_q8_ref, unpermute_q8


def test_quant_x_is_q8_1_blocks_of_32():
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(512, generator=gen) * 3).half()
    x[64:96] = 0  # an all-zero block: scale 0, codes 0
    xq, dx, sx = quant_x_q8_ref(x)
    assert xq.dtype == torch.int8 and dx.shape == sx.shape == (16,)
    assert int(xq.abs().max()) == 127 and dx[2] == 0 and not xq[64:96].any()
    v = x.float().reshape(16, 32)
    err = (v - dx[:, None] * xq.float().reshape(16, 32)).abs()
    assert bool((err <= dx[:, None] * 0.5001 + 1e-12).all())
    assert torch.equal(sx, dx * xq.float().reshape(16, 32).sum(1))
    assert torch.equal(unpermute_q8(permute_q8(xq)), xq)
    assert permute_q8(torch.arange(16, dtype=torch.int8)).tolist() == [0, 2, 4, 6, 1, 3, 5, 7,
                                                                       8, 10, 12, 14, 9, 11, 13, 15]


def test_mask_and_dp4a_trick_on_packed_words():
    # a lane's 32 codes of one row as pack_w4 stores them (4 words) against its 32 x bytes in the kernel's order
    rnd = random.Random(3)
    for _ in range(50):
        codes = torch.tensor([[rnd.randrange(16) for _ in range(32)]], dtype=torch.uint8)
        xs = torch.tensor([rnd.randrange(-127, 128) for _ in range(32)], dtype=torch.int8)
        words = [int(w) & 0xFFFFFFFF for w in pack_w4(codes)[0]]
        assert len(words) == 4
        got = q8_dot_words(words, permute_q8(xs).tolist())
        assert got == int((codes[0].long() * xs.long()).sum())


def test_mma_pack_gives_each_lane_8_codes_of_every_block():
    from kernels.q8_reference import mma_pack
    gen = torch.Generator().manual_seed(9)
    N, K = 4, 256
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8, generator=gen)
    words = mma_pack(pack_w4(q))
    for r in range(N):
        for grp in range(K // 128):
            for t in range(4):
                for i in range(4):  # lane t's word i holds block i's k 8t..8t+7, nibble j = k 8t + j
                    w = int(words[r, grp * 16 + 4 * t + i]) & 0xFFFFFFFF
                    k0 = grp * 128 + 32 * i + 8 * t
                    assert [(w >> (4 * j)) & 15 for j in range(8)] == q[r, k0:k0 + 8].tolist()


def test_gemv_ref_is_the_product_of_the_dequantized_operands():
    gen = torch.Generator().manual_seed(5)
    N, K = 48, 512
    q, s, m = quantize(torch.randn(N, K, generator=gen), 4)
    x = torch.randn(K, generator=gen).half()
    xq, dx, sx = quant_x_q8_ref(x)
    y = gemv_q8_ref(q, s, m, xq, dx, sx)
    xd = (dx.double().repeat_interleave(32) * xq.double())
    want = dequantize(q, s, m).double() @ xd
    # equal up to sx's one fp32 rounding (the reference keeps it, as the kernel stores it)
    assert float((y - want).abs().max() / want.abs().max()) < 1e-6
    # and int8 x is close to fp16 x (what the probe would cost in accuracy): well under 1% here
    exact = dequantize(q, s, m).double() @ x.double()
    assert float((y - exact).norm() / exact.norm()) < 1e-2
    assert torch.equal(unpack_w4(pack_w4(q), K), q)


def test_probe_plans_respect_the_kernel_limits():
    from engine.bench.q8_probe import plans
    for N, K in [(2560, 2048), (2048, 2048), (22016, 2048), (2048, 11008), (27648 * 2, 5120)]:
        ps = plans(N, K, 132)
        assert ps
        for ksw, ksb, mt in ps:
            assert N % (16 * mt) == 0 and (K // 128) // (ksw * ksb) >= 2 and 8 % ksw == 0


@pytest.mark.gpu
def test_q8_kernels_match_their_references():
    from engine.bench.q8_probe import plans
    from kernels.q8_kernels import Q8Kernels
    from kernels.checks import rand_qweight
    kq, dev = Q8Kernels(), torch.device("cuda")
    gen = torch.Generator().manual_seed(11)
    for N, K in [(2560, 2048), (2048, 11008), (896, 4864)]:
        w = rand_qweight(N, K, 4, dev, gen)
        x = torch.randn(K, generator=gen).half()
        xq = torch.empty(K, dtype=torch.int8, device=dev)
        dx = torch.empty(K // 32, dtype=torch.float32, device=dev)
        sx = torch.empty_like(dx)
        kq.quant_x(x.to(dev), xq, dx, sx)
        torch.cuda.synchronize()
        rq, rd, rs = quant_x_q8_ref(x)
        assert torch.equal(unpermute_q8(xq.cpu()), rq) and torch.equal(dx.cpu(), rd) and torch.equal(sx.cpu(), rs)
        ref = gemv_q8_ref(unpack_w4(w.qweight.cpu(), K), w.scales.cpu(), w.mins.cpu(), rq, rd, rs)
        out = torch.empty(N, dtype=torch.float32, device=dev)
        for ksw, ksb, mt in plans(N, K, kq.sms):
            out.zero_()
            kq.gemv(w, xq, dx, sx, out, ksw, ksb, mt)
            torch.cuda.synchronize()
            err = float((out.cpu().double() - ref).abs().max() / ref.abs().max())
            assert err < 1e-5, (N, K, ksw, ksb, mt, err)
        # the mma form (one arithmetic for every B): 3 tokens, each against the reference; batch 1 = row 0 of batch 3
        from kernels.q8_reference import mma_pack
        xs = torch.randn(3, K, generator=gen).half()
        xq8 = torch.zeros(8, K, dtype=torch.int8, device=dev)
        dx8 = torch.zeros(8, K // 32, device=dev)
        sx8 = torch.zeros_like(dx8)
        for b in range(3):
            kq.quant_x(xs[b].to(dev), xq8[b], dx8[b], sx8[b])
        packed = mma_pack(w.qweight)
        out8 = torch.empty(8, N, dtype=torch.float32, device=dev)
        for ksw, ksb, mt in plans(N, K, kq.sms):
            rows = {}
            for B in (1, 3):
                out8.zero_()
                kq.gemv_mma(w, packed, xq8, dx8, sx8, out8, B, ksw, ksb, mt)
                torch.cuda.synchronize()
                rows[B] = out8.cpu().clone()
            for b in range(3):
                rq, rd, rs = quant_x_q8_ref(xs[b])
                ref = gemv_q8_ref(unpack_w4(w.qweight.cpu(), K), w.scales.cpu(), w.mins.cpu(), rq, rd, rs)
                err = float((rows[3][b].double() - ref).abs().max() / ref.abs().max())
                assert err < 1e-5, (N, K, ksw, ksb, mt, b, err)
            if ksb == 1:
                assert torch.equal(rows[1][0], rows[3][0]), (N, K, ksw, mt)


def test_step_timing_knob_and_plans(monkeypatch):
    from engine.model.ops_step import timing_q8
    from kernels.q8_kernels import BEST, plan
    for v, want in (("", ""), ("0", ""), ("1", "1"), ("quant", "quant"), ("mma", "mma")):
        monkeypatch.setenv("DEEPINFER_TIMING_Q8", v)
        assert timing_q8() == want
    monkeypatch.setenv("DEEPINFER_TIMING_Q8", "yes")
    with pytest.raises(ValueError, match="0, 1, quant or mma"):
        timing_q8()
    # the table's plans as measured; any other shape (the 0.5B's) gets one the kernel can run
    for (N, K), p in BEST.items():
        assert plan(N, K) == p
    for N, K in [(1152, 896), (896, 896), (9728, 896), (896, 4864)]:
        ksw, ksb, mt = plan(N, K)
        assert N % (16 * mt) == 0 and (K // 128) // (ksw * ksb) >= 2


def test_quality_bench_rounds_as_the_kernels_quantize():
    # q8_quality's emulation (every linear's input through q8_round) is the probe's quantizer, dequantized
    from engine.bench.q8_quality import q8_round
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 256, generator=gen) * 4
    y = q8_round(x).reshape(-1, 256)
    for i, row in enumerate(x.reshape(-1, 256)):
        xq, dx, _ = quant_x_q8_ref(row)
        assert torch.equal(y[i], dx.repeat_interleave(32) * xq.float())
