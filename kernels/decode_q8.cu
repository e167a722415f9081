// A probe (#16, session thirty-six): the W4 g128 decode GEMV at batch 1 on int8 activations, llama.cpp's numerics for
// batch-1 decode (MMVQ: x quantized to Q8_1 blocks of 32, integer dot products on dp4a) instead of fp16 x in the mma.
// Not on any default path: engine/bench/q8_probe.py times it against the step's GEMVs, one launch per layer, cold.
// Reference: kernels/q8_reference.py (quant_x_q8_ref, gemv_q8_ref). Compiled after decode_common.cu and
// decode_q8dot.cu (q8_dot, q8_pipeline, q8_quant8: shared with the step's q8 GEMVs, decode_gemv.cu gemv_w4q8_*).
//
// Why it might pay: the production GEMV (decode_gemv.cu) spends ~217 instructions per W4 group of 128 and lane at
// MT = 2 (82 unpack, 24 HMMA, 16 PRMT, ...; docs/gpu.md item 0) and issues one every 2.4-2.7 cycles per scheduler;
// its loads alone run gate_up in ~60% of its time. Here a lane's 32 codes of a row cost 8 LOP3 + 8 dp4a + ~6 for the
// scales, and x needs no pairing: ~110 instructions per group at MT = 2.
//
// x (one token): xq int8 [K], each run of 8 k stored as k 0 2 4 6 1 3 5 7 (q8_quant_x), so that a code word's
// w & 0x0F0F0F0F (bytes = codes of k 0, 2, 4, 6) and w & 0xF0F0F0F0 (16 x codes of k 1, 3, 5, 7) meet their x bytes
// in one 32-bit word each; dx fp32 [K / 32] (block scales, amax / 127), sx fp32 [K / 32] (dx * sum of the block's xq).
//   y[n] = sum over blocks b (lane t of group grp: b = 4 grp + t) of  s[n, grp] * (dx[b] * I[n, b]) + m[n, grp] * sx[b]
// with I[n, b] = sum_k q[n, k] xq[k] exact in int32.

#ifndef Q8_PTRS
#define Q8_PTRS 0  // 1: each row's scale index computed once per launch, not per group (an A/B in q8_probe)
#endif
#ifndef Q8_LOADS_ONLY
#define Q8_LOADS_ONLY 0  // 1: the dp4a form's loads without its arithmetic (timing only, wrong values; q8_probe)
#endif
#ifndef Q8_LDHINT
#define Q8_LDHINT ".L1::no_allocate.L2::128B"  // decode_gemv.cu's default weight-load qualifiers (GEMV_LDHINT 5)
#endif

// x fp16 [K] -> xq, dx, sx; one thread per k, a warp per block of 32 (K % 32 == 0)
extern "C" __global__ void q8_quant_x(const h16* __restrict__ x, signed char* __restrict__ xq, float* __restrict__ dx,
                                      float* __restrict__ sx, int K) {
  PDL_TRIGGER();
  PDL_WAIT();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= K) return;  // whole warps (K % 32 == 0)
  const float v = h2f(x[i]);
  float a = fabsf(v);
#pragma unroll
  for (int o = 16; o; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
  const float d = __fdiv_rn(a, 127.f);
  const int q = d > 0.f ? __float2int_rn(__fmul_rn(v, __frcp_rn(d))) : 0;  // as q8_quant8 (decode_q8dot.cu)
  int s = q;
#pragma unroll
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  const int j = i & 7;
  xq[(i & ~7) + ((j & 1) ? 4 + (j >> 1) : (j >> 1))] = (signed char)q;
  if ((i & 31) == 0) {
    dx[i >> 5] = d;
    sx[i >> 5] = __fmul_rn(d, (float)s);
  }
}

__device__ __forceinline__ uint4 q8_ldw(const void* p) {
  uint4 v;
  asm("ld.global.nc" Q8_LDHINT ".v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
template <int MT>
struct Q8Frag {
  uint4 w[MT][2];   // [tile][row g / g + 8]: the lane's 32 codes
  h16 s[MT][2], m[MT][2];
  uint4 x0, x1;     // the lane's 32 x bytes
  float dx, sx;
};

// grid (blocks along N, KSB); 8 warps; warp w: tile blockIdx.x * (8 / KSW) + w / KSW, K slice blockIdx.y * KSW +
// w % KSW of KS = KSB * KSW (group grp goes to slice grp % KS), as decode_gemv.cu's plan. Tile j of a warp: rows
// row0 + j * ts + (0..15), row0 = tile * (ts == 16 ? 16 MT : 16). out fp32 [N]: KSB == 1 stores, KSB > 1 adds
// atomically (out zeroed first; a probe: no handshake, order not fixed).
template <int MT>
__device__ __forceinline__ void q8_body(const u32* __restrict__ qw, const h16* __restrict__ sc,
                                        const h16* __restrict__ mn, const signed char* __restrict__ xq,
                                        const float* __restrict__ dx, const float* __restrict__ sx, int N, int K,
                                        int KSW, int ts, float* __restrict__ out) {
  __shared__ float red[8][MT * 2][8];  // [warp][tile j, row half h][g]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int ks = warp % KSW, KS = (int)gridDim.y * KSW;
  const int row_step = ts == 16 ? 16 * MT : 16;
  const int ntiles = (ts == 16 ? N : ts) / row_step;
  const int tile = blockIdx.x * (8 / KSW) + warp / KSW, row0 = tile * row_step;
  const bool live = tile < ntiles;
  const u32 G = (u32)K >> 7;
  float acc[MT][2];
#pragma unroll
  for (int j = 0; j < MT; j++) acc[j][0] = acc[j][1] = 0.f;
  PDL_TRIGGER();
#if Q8_PTRS
  u32 rbase[MT][2];  // each row's first scale index (row * G): one add per row and group in load_w
#pragma unroll
  for (int j = 0; j < MT; j++)
#pragma unroll
    for (int h = 0; h < 2; h++) rbase[j][h] = (u32)(row0 + j * ts + g + 8 * h) * G;
  const u32* qwt = qw + t * 4;
#endif
  const auto load_w = [&](Q8Frag<MT>& f, int grp) {
#pragma unroll
    for (int j = 0; j < MT; j++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
#if Q8_PTRS
        const u32 i = rbase[j][h] + (u32)grp;
        f.w[j][h] = q8_ldw(qwt + i * 16u);
#else
        const u32 r = (u32)(row0 + j * ts + g + 8 * h), i = r * G + (u32)grp;
        f.w[j][h] = q8_ldw(qw + i * 16u + (u32)t * 4u);
#endif
        f.s[j][h] = __ldg(sc + i);
        f.m[j][h] = __ldg(mn + i);
      }
  };
  const auto load_x = [&](Q8Frag<MT>& f, int grp) {
    const uint4* p = reinterpret_cast<const uint4*>(xq + (u32)grp * 128u + (u32)t * 32u);
    f.x0 = __ldg(p);
    f.x1 = __ldg(p + 1);
    f.dx = __ldg(dx + grp * 4 + t);
    f.sx = __ldg(sx + grp * 4 + t);
  };
  const auto compute = [&](const Q8Frag<MT>& f) {
#pragma unroll
    for (int j = 0; j < MT; j++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
#if Q8_LOADS_ONLY  // timing only, wrong values: every loaded word used once, no dot product (the loads' own bound)
        const int I = (int)(f.w[j][h].x ^ f.w[j][h].y ^ f.w[j][h].z ^ f.w[j][h].w ^ f.x0.x ^ f.x1.w);
#else
        const int I = q8_dot(f.w[j][h], f.x0, f.x1);
#endif
        acc[j][h] = __fmaf_rn(h2f(f.m[j][h]), f.sx, __fmaf_rn(h2f(f.s[j][h]), __fmul_rn(f.dx, (float)I), acc[j][h]));
      }
  };
  Q8Frag<MT> fa, fb;
  q8_pipeline(fa, fb, (int)blockIdx.y * KSW + ks, (int)G, KS, live, load_w, load_x, compute, [] { PDL_WAIT(); });
  // the quad's 4 K quarters, then the block's KSW warps of a tile in warp order, then KSB blocks atomically
#pragma unroll
  for (int j = 0; j < MT; j++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      float v = acc[j][h];
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      if (t == 0) red[warp][j * 2 + h][g] = v;
    }
  __syncthreads();
  if (!live || ks != 0 || lane >= 16 * MT) return;
  const int j = lane >> 4, h = (lane >> 3) & 1, gg = lane & 7;  // lane -> (tile j, row g + 8 h)
  float v = 0.f;
  for (int w = warp; w < warp + KSW; w++) v += red[w][j * 2 + h][gg];
  float* o = out + row0 + j * ts + gg + 8 * h;
  if (gridDim.y == 1) *o = v;
  else atomicAdd(o, v);
}

extern "C" __global__ void __launch_bounds__(256, 2)
    gemv_q8_w4_mt1(const u32* qw, const h16* sc, const h16* mn, const signed char* xq, const float* dx,
                   const float* sx, int N, int K, int KSW, int ts, float* out) {
  q8_body<1>(qw, sc, mn, xq, dx, sx, N, K, KSW, ts, out);
}
extern "C" __global__ void __launch_bounds__(256, 2)
    gemv_q8_w4_mt2(const u32* qw, const h16* sc, const h16* mn, const signed char* xq, const float* dx,
                   const float* sx, int N, int K, int KSW, int ts, float* out) {
  q8_body<2>(qw, sc, mn, xq, dx, sx, N, K, KSW, ts, out);
}

// ---- the mma form (docs/gpu.md "What adopting it takes", 3a): one arithmetic for B = 1..8 ------------------------
// mma.m16n8k32 u8 x s8 -> s32 (sm_80+): lane (g, t) holds a0 = A[g][4t..4t+3], a1 = A[g+8][4t..], a2 = A[g][16+4t..],
// a3 = A[g+8][16+4t..], b0 = B[4t..4t+3][g], b1 = B[16+4t..][g]; d = D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1].
// Mma i of a group covers block i (k 32i..32i+31) whole, so its integers are the block's: lane t supplies the block's
// k 8t..8t+7, one code word per row (even k as a0 / a1, odd k as a2 / a3) and the matching 8 x bytes, which
// q8_quant_x already stores in that order. The weights in the mma packing (q8_reference.mma_pack: word 4t + i of a
// row's group = the natural word 4i + t) give a lane its 4 blocks' words in one 16-byte load, as in q8_body.
// x of token b at xq + b * K (tokens >= B read nothing: zeros), dx / sx at + b * K / 32. out fp32 [B, N].
__device__ __forceinline__ void mma_q8(int* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%10,%11,%12,%13};"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0), "r"(0), "r"(0), "r"(0));
}

template <int MT>
struct Q8MFrag {
  uint4 w[MT][2];
  h16 s[MT][2], m[MT][2];
  uint2 x[4];        // block i's 8 x bytes of token g
  float dx[4][2];    // block i's scale for tokens 2t, 2t + 1
  float sx[2];       // the group's sum over its blocks of sx, tokens 2t, 2t + 1 (blocks in order)
};

template <int MT>
__device__ __forceinline__ void q8m_body(const u32* __restrict__ qw, const h16* __restrict__ sc,
                                         const h16* __restrict__ mn, const signed char* __restrict__ xq,
                                         const float* __restrict__ dx, const float* __restrict__ sx, int N, int K,
                                         int B, int KSW, float* __restrict__ out) {
  __shared__ float red[8][MT * 4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int ks = warp % KSW, KS = (int)gridDim.y * KSW;
  const int ntiles = N / (16 * MT);
  const int tile = blockIdx.x * (8 / KSW) + warp / KSW, row0 = tile * 16 * MT;
  const bool live = tile < ntiles;
  const u32 G = (u32)K >> 7, KB = (u32)K >> 5;
  float acc[MT][4];
#pragma unroll
  for (int j = 0; j < MT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  PDL_TRIGGER();
  const auto load_w = [&](Q8MFrag<MT>& f, int grp) {
#pragma unroll
    for (int j = 0; j < MT; j++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const u32 i = (u32)(row0 + j * 16 + g + 8 * h) * G + (u32)grp;
        f.w[j][h] = q8_ldw(qw + i * 16u + (u32)t * 4u);
        f.s[j][h] = __ldg(sc + i);
        f.m[j][h] = __ldg(mn + i);
      }
  };
  const auto load_x = [&](Q8MFrag<MT>& f, int grp) {
#pragma unroll
    for (int i = 0; i < 4; i++)
      f.x[i] = g < B ? __ldg(reinterpret_cast<const uint2*>(xq + (u32)g * (u32)K + (u32)grp * 128u + 32u * i +
                                                             8u * t))
                     : make_uint2(0u, 0u);
#pragma unroll
    for (int e = 0; e < 2; e++) {  // a token's 4 block scales (and sums) of the group are 16 contiguous bytes
      const int b = 2 * t + e;
      const u32 o = (u32)b * KB + (u32)grp * 4u;
      const float4 d = b < B ? __ldg(reinterpret_cast<const float4*>(dx + o)) : make_float4(0.f, 0.f, 0.f, 0.f);
      const float4 q = b < B ? __ldg(reinterpret_cast<const float4*>(sx + o)) : make_float4(0.f, 0.f, 0.f, 0.f);
      f.dx[0][e] = d.x; f.dx[1][e] = d.y; f.dx[2][e] = d.z; f.dx[3][e] = d.w;
      f.sx[e] = ((q.x + q.y) + q.z) + q.w;
    }
  };
  const auto compute = [&](const Q8MFrag<MT>& f) {
#pragma unroll
    for (int j = 0; j < MT; j++) {
      float F[4] = {0.f, 0.f, 0.f, 0.f};
      const u32 wg[4] = {f.w[j][0].x, f.w[j][0].y, f.w[j][0].z, f.w[j][0].w};
      const u32 w8[4] = {f.w[j][1].x, f.w[j][1].y, f.w[j][1].z, f.w[j][1].w};
#pragma unroll
      for (int i = 0; i < 4; i++) {
        int d[4];
        mma_q8(d, wg[i] & 0x0F0F0F0Fu, w8[i] & 0x0F0F0F0Fu, (wg[i] >> 4) & 0x0F0F0F0Fu, (w8[i] >> 4) & 0x0F0F0F0Fu,
               f.x[i].x, f.x[i].y);
#pragma unroll
        for (int e = 0; e < 4; e++) F[e] = __fmaf_rn(f.dx[i][e & 1], (float)d[e], F[e]);
      }
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int h = e >> 1;
        acc[j][e] = __fmaf_rn(h2f(f.m[j][h]), f.sx[e & 1], __fmaf_rn(h2f(f.s[j][h]), F[e], acc[j][e]));
      }
    }
  };
  Q8MFrag<MT> fa, fb;
  q8_pipeline(fa, fb, (int)blockIdx.y * KSW + ks, (int)G, KS, live, load_w, load_x, compute, [] { PDL_WAIT(); });
#pragma unroll
  for (int j = 0; j < MT; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) red[warp][j * 4 + e][lane] = acc[j][e];
  __syncthreads();
  if (!live || ks != 0) return;
#pragma unroll
  for (int j = 0; j < MT; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      float v = 0.f;
      for (int w = warp; w < warp + KSW; w++) v += red[w][j * 4 + e][lane];
      const int b = 2 * t + (e & 1), n = row0 + j * 16 + g + 8 * (e >> 1);
      if (b < B) {
        if (gridDim.y == 1) out[(u32)b * (u32)N + n] = v;
        else atomicAdd(out + (u32)b * (u32)N + n, v);
      }
    }
}

extern "C" __global__ void __launch_bounds__(256, 2)
    gemv_q8m_w4_mt1(const u32* qw, const h16* sc, const h16* mn, const signed char* xq, const float* dx,
                    const float* sx, int N, int K, int B, int KSW, float* out) {
  q8m_body<1>(qw, sc, mn, xq, dx, sx, N, K, B, KSW, out);
}
extern "C" __global__ void __launch_bounds__(256, 2)
    gemv_q8m_w4_mt2(const u32* qw, const h16* sc, const h16* mn, const signed char* xq, const float* dx,
                    const float* sx, int N, int K, int B, int KSW, float* out) {
  q8m_body<2>(qw, sc, mn, xq, dx, sx, N, K, B, KSW, out);
}
