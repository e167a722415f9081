"""What one dependency between two phases of a decode step costs: a kernel boundary (plain or PDL launches in a CUDA
graph) against a barrier or a flag inside one persistent kernel (device; #16's go / no-go for a persistent step).

    python -m engine.bench.boundary --out $OUT/boundary_h200.json

A "hop" is what every op of the step does between its producer and itself: wait until the producer's writes are
visible, read one value they wrote (an L2 round trip), write one value for the next hop. Optionally each hop also
streams `mb` MB of weights (a slice of a 1 GB buffer, so DRAM, not L2), the first two 16-byte loads per thread
before the wait (as the GEMVs do under PDL), the rest after it. L hops in a row, captured in one graph, replayed;
us per hop. Modes:
  plain    one launch per hop, ordinary stream order
  pdl      one launch per hop, programmatic dependent launch (griddepcontrol; sm_90)
  barrier  ONE launch for all hops; between hops every block arrives at a counter (red.release.gpu) and waits
           until all have (ld.acquire.gpu): a grid-wide barrier, the most a persistent step would pay per op
  flag     ONE launch; block i waits only for block i of the previous hop (its flag): the least a persistent
           step would pay (a consumer whose inputs one producer block wrote)
The grid is `blocks` blocks of 256 threads (2 per SM: the GEMVs' residency, so barrier / flag blocks are all
resident). No reference: nothing here computes a model value (the hop's read is checked: every hop adds 1).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from engine.bench.envinfo import emit_json

SRC = r"""
#if __CUDA_ARCH__ >= 900
#define PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define PDL_TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define PDL_WAIT()
#define PDL_TRIGGER()
#endif
typedef unsigned int u32;
__device__ __forceinline__ uint4 ldw(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ u32 ld_acquire(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release(u32* p, u32 v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
// the hop's weights: `per` uint4 per thread from this hop's slice; the first two before `wait_fn`
template <typename W>
__device__ __forceinline__ u32 stream_weights(const uint4* w, int per, W wait_fn) {
  const uint4* p = w + (size_t)blockIdx.x * blockDim.x * per + threadIdx.x;
  uint4 a = make_uint4(0, 0, 0, 0), b = a;
  if (per > 0) a = ldw(p);
  if (per > 1) b = ldw(p + blockDim.x);
  wait_fn();
  u32 acc = a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w;
  for (int i = 2; i < per; i++) {
    const uint4 v = ldw(p + (size_t)i * blockDim.x);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  return acc;
}
// one hop as a launch: dst[blk] = src[(blk * 7) % n] + 1 (+ 0 * weights, kept alive)
extern "C" __global__ void __launch_bounds__(256, 2) hop(const float* src, float* dst, const uint4* w, int per,
                                                         int n, u32* sink) {
  PDL_TRIGGER();
  const u32 acc = stream_weights(w, per, [] { PDL_WAIT(); });
  __shared__ u32 red;
  if (threadIdx.x == 0) red = 0;
  __syncthreads();
  if (acc == 0x9E3779B9u) atomicAdd(&red, 1u);  // practically never: keeps the loads
  __syncthreads();
  if (threadIdx.x == 0) {
    dst[blockIdx.x] = __ldcg(src + (blockIdx.x * 7) % n) + 1.f;
    if (red) sink[0] = red;
  }
}
// all hops in one launch; mode 0: grid barrier on cnt[0], 1: per-block flags cnt[1 + blk]. bufs: [hops + 1][n]
extern "C" __global__ void __launch_bounds__(256, 2) persist(float* bufs, const uint4* w, int per, int wstride,
                                                             int hops, int n, int mode, u32* cnt, u32* sink) {
  __shared__ u32 red;
  const u32 nb = gridDim.x;
  for (int hop = 0; hop < hops; hop++) {
    const u32 acc = stream_weights(w + (size_t)hop * wstride, per, [&] {
      if (hop > 0) {
        if (threadIdx.x == 0) {
          if (mode == 0) while (ld_acquire(cnt) < hop * nb) {}
          else while (ld_acquire(cnt + 1 + (blockIdx.x * 7) % n) < (u32)hop) {}
        }
        __syncthreads();
      }
    });
    if (threadIdx.x == 0) red = 0;
    __syncthreads();
    if (acc == 0x9E3779B9u) atomicAdd(&red, 1u);
    __syncthreads();
    if (threadIdx.x == 0) {
      const float* src = bufs + (size_t)hop * n;
      bufs[(size_t)(hop + 1) * n + blockIdx.x] = __ldcg(src + (blockIdx.x * 7) % n) + 1.f;
      if (red) sink[0] = red;
      red_release(mode == 0 ? cnt : cnt + 1 + blockIdx.x, 1u);  // release: this thread's store above
    }
  }
}
"""


class Boundary:
    """The module and 1 GB of weights, made once; `blocks` (the grid) may change between measurements."""

    def __init__(self, blocks: int):
        import cupy as cp
        major, minor = torch.cuda.get_device_capability()
        self.mod = cp.RawModule(code=SRC, options=(f"-arch=sm_{major}{minor}", "-std=c++17"))
        self.fn = {k: self.mod.get_function(k) for k in ("hop", "persist")}
        self.blocks = blocks
        self.dev = torch.device("cuda")
        self.w = torch.randint(0, 2 ** 31, (1 << 28,), dtype=torch.int32, device=self.dev)  # 1 GB of "weights"
        self.sink = torch.zeros(4, dtype=torch.int32, device=self.dev)
        from kernels.pdl import PDLLauncher
        self.launcher = PDLLauncher()
        self.pdl = self.launcher if major >= 9 else None

    def _per(self, mb: float) -> int:
        return int(mb * 2 ** 20 / 16 / (self.blocks * 256))

    def chain(self, hops: int, mb: float, pdl: bool):
        n, per = self.blocks, self._per(mb)
        bufs = torch.zeros(hops + 1, n, dtype=torch.float32, device=self.dev)
        wstride = per * 256 * n  # uint4 per hop
        assert wstride * hops * 4 <= self.w.numel() or mb == 0
        args = lambda i: (np.uint64(bufs[i].data_ptr()), np.uint64(bufs[i + 1].data_ptr()),  # noqa: E731
                          np.uint64(self.w.data_ptr() + 16 * ((i * wstride) % max(1, self.w.numel() // 4))),
                          np.int32(per), np.int32(n), np.uint64(self.sink.data_ptr()))

        def run():
            st = torch.cuda.current_stream().cuda_stream  # at run time: a capture runs on a stream of its own
            bufs[0].fill_(0.0)
            for i in range(hops):
                self.launcher.launch(self.fn["hop"].kernel.ptr, (n,), (256,), 0, st, args(i), pdl=pdl)
            return bufs
        return run, bufs

    def persistent(self, hops: int, mb: float, mode: int):
        n, per = self.blocks, self._per(mb)
        bufs = torch.zeros(hops + 1, n, dtype=torch.float32, device=self.dev)
        cnt = torch.zeros(1 + n, dtype=torch.int32, device=self.dev)
        wstride = per * 256 * n

        def run():
            st = torch.cuda.current_stream().cuda_stream
            bufs[0].fill_(0.0)
            cnt.zero_()
            self.launcher.launch(self.fn["persist"].kernel.ptr, (n,), (256,), 0, st,
                                 (np.uint64(bufs.data_ptr()), np.uint64(self.w.data_ptr()), np.int32(per),
                                  np.int32(wstride), np.int32(hops), np.int32(n), np.int32(mode),
                                  np.uint64(cnt.data_ptr()), np.uint64(self.sink.data_ptr())), pdl=False)
            return bufs
        return run, bufs


def time_hops(run, bufs, hops: int) -> float:
    """us per hop of run's graph (the fills before it included: ~2 us over L hops), after checking the values."""
    from engine.bench.tree_profile import replay_ms
    from engine.model.graph_capture import capture
    run()
    torch.cuda.synchronize()
    assert torch.all(bufs[hops] == hops), "a hop read a value its producer had not written yet"
    g, _ = capture(run, torch.cuda.graph_pool_handle())
    g.replay()
    torch.cuda.synchronize()
    assert torch.all(bufs[hops] == hops)
    return replay_ms(g.replay, 20) * 1e3 / hops


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hops", type=int, default=180, help="3B: 36 layers x 5 kernels")
    ap.add_argument("--mb", default="0,2.6,22.5", help="weights streamed per hop (3B: qkv 2.6, gate_up 22.5 MB)")
    ap.add_argument("--blocks-per-sm", default="1,2")
    ap.add_argument("--out", default="boundary.json")
    ap.add_argument("--commit", default="unknown")
    a = ap.parse_args(argv)
    from engine.bench.decode_ab import run_header
    res = run_header("engine.bench.boundary", argv, a.commit, __doc__.split("\n\n")[1].replace("\n", " "))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    res["sms"], res["rows"] = sms, []
    print("| blocks | MB per hop | plain | pdl | barrier | flag |  (us per hop)")
    b = Boundary(sms)
    for bps in (int(v) for v in a.blocks_per_sm.split(",")):
        b.blocks = sms * bps
        for mb in (float(v) for v in a.mb.split(",")):
            hops = a.hops if mb * a.hops <= 900 else max(8, int(900 // mb))
            row = {"blocks": b.blocks, "mb": mb, "hops": hops}
            for mode in ("plain", "pdl", "barrier", "flag"):
                if mode == "pdl" and b.pdl is None:
                    continue
                run, bufs = (b.chain(hops, mb, mode == "pdl") if mode in ("plain", "pdl")
                             else b.persistent(hops, mb, 0 if mode == "barrier" else 1))
                row[mode] = round(time_hops(run, bufs, hops), 3)
            if mb:
                row.update({f"{k}_gb_s": round(mb * 2 ** 20 / row[k] / 1e3, 1) for k in ("plain", "pdl", "barrier",
                                                                                          "flag") if k in row})
            res["rows"].append(row)
            print(f"| {b.blocks} | {mb} | {row['plain']} | {row.get('pdl', '-')} | {row['barrier']} | {row['flag']} |",
                  flush=True)
    emit_json(res, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
