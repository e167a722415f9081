"""The int8-activation GEMV probe's kernels (kernels/decode_q8.cu; references in kernels/q8_reference.py): compiled
for the device's arch through NVRTC and launched on torch's current stream. Used by engine/bench/q8_probe.py and, as a
timing probe only, by the decode step (engine/model/ops_step.py DEEPINFER_TIMING_Q8)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from kernels.q8_plan import Q8_PLANS, q8_plan, w4g128

SOURCES = ("decode_common.cu", "decode_q8dot.cu", "decode_q8.cu")  # also compiled by kernels/nvrtc_check.py and sass_mix


eligible = w4g128  # a weight the probe's kernels take (kernels/q8_plan.py)


def grid_blocks(N: int, mt: int, ksw: int) -> int:
    """Blocks along N of a probe GEMV: tiles of 16 MT rows, 8 / KSW tiles per block of 8 warps."""
    return -(-(N // (16 * mt)) // (8 // ksw))


class Q8Kernels:
    """The probe's module (NVRTC for the device's arch) and its launches on torch's current stream, with PDL where
    the device has it (kernels/pdl.py), as the step's kernels launch."""

    def __init__(self, index: int = 0, defines: tuple[str, ...] = ()):
        import cupy as cp

        from kernels.pdl import PDLLauncher
        major, minor = torch.cuda.get_device_capability(index)
        src = "\n".join((Path(__file__).parent / s).read_text() for s in SOURCES)
        with cp.cuda.Device(index):
            self.module = cp.RawModule(code=src, options=(f"-arch=sm_{major}{minor}", "-std=c++17", *defines))
            self.fn = {n: self.module.get_function(n) for n in ("q8_quant_x", "gemv_q8_w4_mt1", "gemv_q8_w4_mt2",
                                                                "gemv_q8m_w4_mt1", "gemv_q8m_w4_mt2")}
        self.launcher = PDLLauncher()
        self.pdl = major >= 9
        self.sms = torch.cuda.get_device_properties(index).multi_processor_count

    def _launch(self, name, grid, block, args):
        ptr = torch.cuda.current_stream().cuda_stream
        self.launcher.launch(self.fn[name].kernel.ptr, grid, block, 0, ptr, args, pdl=self.pdl)

    def quant_x(self, x: torch.Tensor, xq: torch.Tensor, dx: torch.Tensor, sx: torch.Tensor):
        K = x.numel()
        assert K % 32 == 0 and x.dtype == torch.float16 and xq.dtype == torch.int8
        self._launch("q8_quant_x", ((K + 255) // 256,), (256,),
                     tuple(np.uint64(t.data_ptr()) for t in (x, xq, dx, sx)) + (np.int32(K),))

    def gemv(self, w, xq, dx, sx, out: torch.Tensor, ksw: int, ksb: int, mt: int):
        """out fp32 [N] (= for KSB 1, += for KSB > 1) = the probe's GEMV of QWeight w (W4 g128) on the quantized x."""
        N, K = w.N, w.K
        assert eligible(w) and N % (16 * mt) == 0 and K % 128 == 0
        blocks = grid_blocks(N, mt, ksw)
        args = tuple(np.uint64(t.data_ptr()) for t in (w.qweight, w.scales, w.mins, xq, dx, sx)) + (
            np.int32(N), np.int32(K), np.int32(ksw), np.int32(16), np.uint64(out.data_ptr()))
        self._launch(f"gemv_q8_w4_mt{mt}", (blocks, ksb), (256,), args)

    def gemv_mma(self, w, qw_mma: torch.Tensor, xq, dx, sx, out: torch.Tensor, B: int, ksw: int, ksb: int, mt: int):
        """The mma form (one arithmetic for B = 1..8): out fp32 [B, N] (= or += as gemv) from QWeight w's scales with
        its words in the mma packing (q8_reference.mma_pack); xq int8 [8, K], dx / sx fp32 [8, K/32] per token."""
        N, K = w.N, w.K
        assert w.bits == 4 and w.group == 128 and N % (16 * mt) == 0 and 1 <= B <= 8
        blocks = grid_blocks(N, mt, ksw)
        args = tuple(np.uint64(t.data_ptr()) for t in (qw_mma, w.scales, w.mins, xq, dx, sx)) + (
            np.int32(N), np.int32(K), np.int32(B), np.int32(ksw), np.uint64(out.data_ptr()))
        self._launch(f"gemv_q8m_w4_mt{mt}", (blocks, ksb), (256,), args)


# the probe's plans: the step's q8 GEMVs' table (kernels/q8_plan.py, from this probe's sweep on an H100)
BEST = Q8_PLANS


def plan(N: int, K: int) -> tuple[int, int, int]:
    """The probe's plan for an (N, K) GEMV: the step's q8 plan (its table, cut to two groups per warp)."""
    return q8_plan("store", N, K)
