// An experiment for #16 (engine/bench/persist_chain.py): a chain of W4 GEMVs of one kind (one linear of every layer:
// qkv, o, gate_up or down) run by ONE persistent launch instead of one PDL launch each.
// Compiled only with -DGEMV_PERSIST=1 (DEEPINFER_KERNEL_DEFINES): the engine's module does not hold it.
//
// persist_ops: [nops][16] int64 in constant memory (persist_chain.py op_row): qw, sc, mn, bias, x, out_h, out_f, N,
// K, B, KSW, tile_stride, kind (0 store, 1 resid, 2 silu, 3 store MT 2, 4 resid MT 2; the kernel's own), blocks,
// KSB, unused. Op i's grid (blocks, KSB) is
// what its own launch would have been; the launch's blocks take its virtual blocks round robin. Between two ops
// every block arrives at *bar (release) and a block's first x load of op i + 1 waits until all have (acquire,
// gemv_wait): a grid-wide barrier where the PDL chain has a kernel boundary; each block loads its first weights of
// op i + 1 before that wait, as a PDL launch does before griddepcontrol.wait. The launch must be resident at once
// (persist_chain.py sizes it by the occupancy); bar starts at 0. Same arithmetic as the launches: same bits.
#if GEMV_PERSIST
// The op table lives in constant memory (persist_chain.py writes it before the launch). One kernel per GEMV kind:
// one inlined body compiles as the launch's own kernel does (silu: 128 registers, 4 bytes of spill; store: 120,
// none), where one kernel holding all kinds' bodies spilled 1.4 KB, most of it inside the K loops, and the bodies as
// __noinline__ calls 40-60 spill loads and stores per K loop (the chain then ran 1.9x slower than the PDL launches
// even without its waits: docs/results/persist_chain_multi_h200.json).
#define PERSIST_MAX_OPS 256
__constant__ long long persist_ops[PERSIST_MAX_OPS * 16];

template <int MT, int EPI>
__device__ __forceinline__ void gemv_chain(int nops, u32* bar, float* ws, u32* cnt) {
  u32 target = 0;
  for (int i = 0; i < nops; i++) {
    const long long* o = persist_ops + 16 * i;
    const int blocks = (int)o[13], ksb = (int)o[14], nvb = blocks * ksb;
    for (int vb = blockIdx.x; vb < nvb; vb += gridDim.x) {
      __syncthreads();  // the previous virtual block's warps are done with the shared reduction buffers
      gemv_body<4, MT, EPI, 128, SF_PLAIN, NST_OF(MT), true>(
          (const u32*)o[0], (const h16*)o[1], (const h16*)o[2], (const h16*)o[3], (const h16*)o[4], (int)o[7],
          (int)o[8], (int)o[9], (int)o[10], (int)o[11], (h16*)o[5], (float*)o[6], nullptr, ws, cnt, nullptr, 0.f,
          nullptr, nullptr, nullptr, vb % blocks, vb / blocks, ksb, bar, target);
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
#define GEMV_CHAIN(NAME, MT, EPI)                                                                   \
  extern "C" __global__ void __launch_bounds__(256, 2) NAME(int nops, u32* bar, float* ws, u32* cnt) { \
    gemv_chain<MT, EPI>(nops, bar, ws, cnt);                                                          \
  }
GEMV_CHAIN(gemv_chain_w4_store, 1, EPI_STORE)
GEMV_CHAIN(gemv_chain_w4_resid, 1, EPI_RESID)
GEMV_CHAIN(gemv_chain_w4_silu, 2, EPI_SILU)
GEMV_CHAIN(gemv_chain_w4_resid_mt2, 2, EPI_RESID)
#endif
