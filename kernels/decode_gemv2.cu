// GEMV v2: the same math as decode_gemv.cu (compute_frag), with the weights streamed through shared memory
// by cp.async (sm_80+) in a GEMV2_STAGES-deep per-warp ring, so many more bytes are in flight per SM than a
// register pipeline allows, and x staged once per block in shared memory. Each lane copies exactly the 16
// (W4) or 12 (W3) bytes per row it later feeds to the mma, so a warp needs no barrier for its ring.
// Reference: kernels/decode_reference.py gemv_ref. Compiled after decode_gemv.cu.

#ifndef GEMV2_STAGES
#define GEMV2_STAGES 4
#endif
#define XROW 136   // halves per token row of a staged x group (128 + 8 padding)
#define XGRP (8 * XROW)  // halves per staged x group (8 tokens)

__device__ __forceinline__ u32 smem_u32(const void* p) {
  u32 a;
  asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}
__device__ __forceinline__ void cp16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(dst)), "l"(src));
}
__device__ __forceinline__ void cp8(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(smem_u32(dst)), "l"(src));
}
__device__ __forceinline__ void cp4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_u32(dst)), "l"(src));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

// one group's weights of this lane's rows (MT tiles x rows g, g+8) into its ring slot
template <int BITS, int MT>
__device__ __forceinline__ void issue_w(uint4* slot, const u32* __restrict__ qw, int row0, int ts, int K, int grp,
                                        int g, int t, int lane) {
#pragma unroll
  for (int j = 0; j < MT; j++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int r = row0 + j * ts + g + 8 * h;
      uint4* d = slot + (j * 2 + h) * 32 + lane;
      if (BITS == 4) {
        cp16(d, qw + (size_t)r * (K >> 3) + grp * 16 + t * 4);
      } else {
        const u32* p = qw + (size_t)r * (K / 32 * 3) + grp * 12 + 3 * t;
        if (t & 1) { cp4(d, p); cp8(reinterpret_cast<u32*>(d) + 2, p + 1); }  // c | . | a.x a.y
        else { cp8(d, p); cp4(reinterpret_cast<u32*>(d) + 2, p + 2); }        // a.x a.y | c | .
      }
    }
}

template <int BITS, int MT, int EPI>
__device__ void gemv2_body(const u32* __restrict__ qw, const h16* __restrict__ sc, const h16* __restrict__ mn,
                           const h16* __restrict__ bias, const h16* __restrict__ x, int N, int K, int B, int KSW,
                           int tile_stride, h16* __restrict__ out_h, float* __restrict__ out_f,
                           unsigned long long* __restrict__ keys, float* ws, u32* cnt) {
  constexpr int S = GEMV2_STAGES;
  extern __shared__ uint4 dyn[];
  __shared__ float red[8][MT * 4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int tiles_per_block = (blockDim.x >> 5) / KSW;
  const int tile = blockIdx.x * tiles_per_block + warp / KSW;
  const int ks = warp % KSW, KSB = gridDim.y, KS = KSB * KSW;
  const int row_step = (EPI == EPI_SILU) ? 16 : 16 * MT;
  const int ntiles = ((EPI == EPI_SILU) ? tile_stride : N) / row_step;
  const int row0 = tile * row_step;
  const bool live = tile < ntiles;
  const int G = K >> 7;
  const int ts = (EPI == EPI_SILU) ? tile_stride : 16;
  // x groups of this block: block-local index bl = i * KSW + k' <-> grp = i * KS + blockIdx.y * KSW + k'
  const int nbl = ((G + KS - 1) / KS) * KSW;
  h16* xs = reinterpret_cast<h16*>(dyn);
  uint4* ring = dyn + (nbl * XGRP * 2) / 16 + warp * (S * MT * 2 * 32);
  PDL_WAIT();
  for (int idx = threadIdx.x; idx < nbl * 8 * 16; idx += blockDim.x) {
    const int bl = idx >> 7, tok = (idx >> 4) & 7, c = idx & 15;
    const int grp = (bl / KSW) * KS + blockIdx.y * KSW + bl % KSW;
    if (grp < G) cp16(xs + bl * XGRP + tok * XROW + c * 8, x + (size_t)tok * K + grp * 128 + c * 8);
  }
  cp_commit();
  const int sid = blockIdx.y * KSW + ks;
  const int n_my = (live && sid < G) ? (G - sid + KS - 1) / KS : 0;  // groups of this warp
#pragma unroll
  for (int i = 0; i < S - 1; i++) {
    if (i < n_my) issue_w<BITS, MT>(ring + i * (MT * 2 * 32), qw, row0, ts, K, sid + i * KS, g, t, lane);
    cp_commit();
  }
  cp_wait<S - 1>();
  __syncthreads();  // x staged by every thread
  float acc[MT][4];
#pragma unroll
  for (int j = 0; j < MT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  Frag<BITS, MT> f;
  h16 sn[MT][2], mnx[MT][2];
  if (n_my > 0) {
#pragma unroll
    for (int j = 0; j < MT; j++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const size_t r = row0 + j * ts + g + 8 * h;
        sn[j][h] = __ldg(sc + r * G + sid);
        mnx[j][h] = __ldg(mn + r * G + sid);
      }
  }
  for (int i = 0; i < n_my; i++) {
    const int nxt = i + S - 1;
    if (nxt < n_my) issue_w<BITS, MT>(ring + (nxt % S) * (MT * 2 * 32), qw, row0, ts, K, sid + nxt * KS, g, t, lane);
    cp_commit();
#pragma unroll
    for (int j = 0; j < MT; j++)
#pragma unroll
      for (int h = 0; h < 2; h++) { f.s[j][h] = sn[j][h]; f.m[j][h] = mnx[j][h]; }
    if (i + 1 < n_my) {  // next group's scales, one group ahead
      const int gn = sid + (i + 1) * KS;
#pragma unroll
      for (int j = 0; j < MT; j++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
          const size_t r = row0 + j * ts + g + 8 * h;
          sn[j][h] = __ldg(sc + r * G + gn);
          mnx[j][h] = __ldg(mn + r * G + gn);
        }
    }
    const uint4* xp = reinterpret_cast<const uint4*>(xs + (i * KSW + ks) * XGRP + g * XROW + t * 32);
#pragma unroll
    for (int q = 0; q < 4; q++) f.x[q] = xp[q];
    cp_wait<S - 1>();
    const uint4* slot = ring + (i % S) * (MT * 2 * 32);
#pragma unroll
    for (int j = 0; j < MT; j++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const uint4 v = slot[(j * 2 + h) * 32 + lane];
        if (BITS == 4) {
          f.w[j][h][0] = v.x; f.w[j][h][1] = v.y; f.w[j][h][2] = v.z; f.w[j][h][3] = v.w;
        } else {
          f.w[j][h][0] = v.x;
          f.w[j][h][1] = (t & 1) ? v.z : v.y;
          f.w[j][h][2] = (t & 1) ? v.w : v.z;
        }
      }
    compute_frag<BITS, MT>(f, acc);
  }
  cp_wait<0>();
  if (KSW > 1) {
#pragma unroll
    for (int j = 0; j < MT; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) red[warp][j * 4 + e][lane] = acc[j][e];
    __syncthreads();
    if (ks != 0) return;
    for (int w = 1; w < KSW; w++)
#pragma unroll
      for (int j = 0; j < MT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] += red[warp + w][j * 4 + e][lane];
  }
  if (!live) return;
  if (KSB > 1) {
    float* mine = ws + ((size_t)blockIdx.y * ntiles + tile) * (MT * 4 * 32);
#pragma unroll
    for (int j = 0; j < MT; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) mine[(j * 4 + e) * 32 + lane] = acc[j][e];
    __threadfence();
    u32 prev = 0;
    if (lane == 0) prev = atomicAdd(cnt + tile, 1u);
    prev = __shfl_sync(0xffffffffu, prev, 0);
    if (prev != (u32)(KSB - 1)) return;
    __threadfence();
    const volatile float* all = ws;
#pragma unroll
    for (int j = 0; j < MT; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[j][e] = 0.f;
    for (int y = 0; y < KSB; y++) {
      const volatile float* p = all + ((size_t)y * ntiles + tile) * (MT * 4 * 32);
#pragma unroll
      for (int j = 0; j < MT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] += p[(j * 4 + e) * 32 + lane];
    }
    if (lane == 0) cnt[tile] = 0u;
  }
  const int tok0 = 2 * t;
  if (EPI == EPI_SILU) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int n = row0 + g + 8 * (e >> 1), b = tok0 + (e & 1);
      if (b < B) {
        const float gt = acc[0][e], up = acc[1][e];
        out_h[(size_t)b * tile_stride + n] = f2h(gt / (1.f + __expf(-gt)) * up);
      }
    }
    return;
  }
  float best0 = -3.0e38f, best1 = -3.0e38f;
  int bi0 = 0, bi1 = 0;
#pragma unroll
  for (int j = 0; j < MT; j++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int n = row0 + j * 16 + g + 8 * (e >> 1), b = tok0 + (e & 1);
      float y = acc[j][e];
      if (EPI == EPI_STORE) {
        if (bias) y += h2f(bias[n]);
        if (b < B) out_h[(size_t)b * N + n] = f2h(y);
      } else if (EPI == EPI_RESID) {
        if (b < B) out_f[(size_t)b * N + n] += y;
      } else {
        if (b < B) out_f[(size_t)b * N + n] = y;
        if (e & 1) { if (y > best1) { best1 = y; bi1 = n; } }
        else { if (y > best0 || (y == best0 && n < bi0)) { best0 = y; bi0 = n; } }
      }
    }
  }
  if (EPI == EPI_LOGITS) {
    unsigned long long k0 = argmax_key(best0, bi0), k1 = argmax_key(best1, bi1);
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      unsigned long long o0 = __shfl_xor_sync(0xffffffffu, k0, o), o1 = __shfl_xor_sync(0xffffffffu, k1, o);
      k0 = o0 > k0 ? o0 : k0;
      k1 = o1 > k1 ? o1 : k1;
    }
    if (g == 0) {
      if (tok0 < B) atomicMax(keys + tok0, k0);
      if (tok0 + 1 < B) atomicMax(keys + tok0 + 1, k1);
    }
  }
}

#define GEMV2(NAME, BITS, MT, EPI)                                                                         \
  extern "C" __global__ void __launch_bounds__(256) NAME(                                                  \
      const u32* qw, const h16* sc, const h16* mn, const h16* bias, const h16* x, int N, int K, int B,     \
      int KSW, int tile_stride, h16* out_h, float* out_f, unsigned long long* keys, float* ws, u32* cnt) { \
    gemv2_body<BITS, MT, EPI>(qw, sc, mn, bias, x, N, K, B, KSW, tile_stride, out_h, out_f, keys, ws, cnt); \
  }

GEMV2(gemv2_w4_store, 4, 1, EPI_STORE)
GEMV2(gemv2_w4_resid, 4, 1, EPI_RESID)
GEMV2(gemv2_w4_silu, 4, 2, EPI_SILU)
GEMV2(gemv2_w4_logits, 4, 2, EPI_LOGITS)
GEMV2(gemv2_w3_store, 3, 1, EPI_STORE)
GEMV2(gemv2_w3_resid, 3, 1, EPI_RESID)
GEMV2(gemv2_w3_silu, 3, 2, EPI_SILU)
GEMV2(gemv2_w3_logits, 3, 2, EPI_LOGITS)
