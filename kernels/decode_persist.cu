// An experiment for #16 (engine/bench/persist_chain.py): a chain of W4 GEMVs (a step's qkv, o, gate_up, down of
// every layer, without the attention and norms) run by ONE persistent launch instead of one PDL launch each.
// Compiled only with -DGEMV_PERSIST=1 (DEEPINFER_KERNEL_DEFINES): the engine's module does not hold it.
//
// ops: [nops][16] int64 (persist_chain.py op_row): qw, sc, mn, bias, x, out_h, out_f, N, K, B, KSW, tile_stride,
// kind (0 store, 1 resid, 2 silu, 3 store MT 2, 4 resid MT 2), blocks, KSB, unused. Op i's grid (blocks, KSB) is
// what its own launch would have been; the launch's blocks take its virtual blocks round robin. Between two ops
// every block arrives at *bar (release) and a block's first x load of op i + 1 waits until all have (acquire,
// gemv_wait): a grid-wide barrier where the PDL chain has a kernel boundary; each block loads its first weights of
// op i + 1 before that wait, as a PDL launch does before griddepcontrol.wait. The launch must be resident at once
// (persist_chain.py sizes it by the occupancy); bar starts at 0. Same arithmetic as the launches: same bits.
#if GEMV_PERSIST
// one virtual block of op o, not inlined: the op's fields are read here and the body gets the kernel's whole
// register budget (inlined into the op loop, the fields live across it made ptxas spill 1.2 KB inside the K loop)
template <int MT, int EPI>
__device__ __noinline__ void persist_block(const long long* __restrict__ o, int vb, const u32* bar, u32 target,
                                           float* ws, u32* cnt) {
  const int blocks = (int)__ldg(o + 13), ksb = (int)__ldg(o + 14);
  gemv_body<4, MT, EPI, 128, SF_PLAIN, NST_OF(MT), true>(
      (const u32*)__ldg(o + 0), (const h16*)__ldg(o + 1), (const h16*)__ldg(o + 2), (const h16*)__ldg(o + 3),
      (const h16*)__ldg(o + 4), (int)__ldg(o + 7), (int)__ldg(o + 8), (int)__ldg(o + 9), (int)__ldg(o + 10),
      (int)__ldg(o + 11), (h16*)__ldg(o + 5), (float*)__ldg(o + 6), nullptr, ws, cnt, nullptr, 0.f, nullptr, nullptr,
      nullptr, vb % blocks, vb / blocks, ksb, bar, target);
}

extern "C" __global__ void __launch_bounds__(256, 2) gemv_chain_w4(const long long* __restrict__ ops, int nops,
                                                                   u32* bar, float* ws, u32* cnt) {
  u32 target = 0;
  for (int i = 0; i < nops; i++) {
    const long long* o = ops + 16 * i;
    const int kind = (int)__ldg(o + 12), nvb = (int)(__ldg(o + 13) * __ldg(o + 14));
    for (int vb = blockIdx.x; vb < nvb; vb += gridDim.x) {
      __syncthreads();  // the previous virtual block's warps are done with the shared reduction buffers
      if (kind == 0) persist_block<1, EPI_STORE>(o, vb, bar, target, ws, cnt);
      else if (kind == 1) persist_block<1, EPI_RESID>(o, vb, bar, target, ws, cnt);
      else if (kind == 2) persist_block<2, EPI_SILU>(o, vb, bar, target, ws, cnt);
      else if (kind == 3) persist_block<2, EPI_STORE>(o, vb, bar, target, ws, cnt);
      else persist_block<2, EPI_RESID>(o, vb, bar, target, ws, cnt);
    }
    // a block with no virtual block of op i still waits for op i - 1 before it arrives: the counter then means
    // "every block is done with op i", never "some block is ahead" (with 2 blocks per SM the 3B's qkv has 160
    // virtual blocks for 264 blocks, and without this wait a fast block's arrival stood in for a slow one's)
    if ((int)blockIdx.x >= nvb) gemv_wait<true>(bar, target);
    __syncthreads();  // every warp's stores of op i issued
    if (threadIdx.x == 0 && bar != nullptr) {
      __threadfence();
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar) : "memory");
    }
    target += gridDim.x;
  }
}
#endif
