// GQA decode attention over the static KV cache, split-K (flash-decoding), with rotary and the KV write fused.
// Reference: kernels/decode_reference.py attention_ref (engine/layers.py Rotary + gqa_attention).
//
// grid (nsplit, Hkv, B), block 256 (8 warps). Token b sits at position pos[b] of cache slot slots[b]:
// the block whose split holds pos[b] ropes the new k, writes k and v into the cache, then every active
// block scores its positions for the rep = H / Hkv query heads of its KV head (q roped by each block).
// Split length = max(ATT_CH * PPI, ceil(L / nsplit) rounded to 64) <= 256 (host: nsplit = max_context/64,
// at most 256), so a short split is one chunk whose K and V loads are all issued at the kernel's start;
// so any length up to max_context works with one grid (CUDA-graph friendly); blocks past the end exit.
// With several active splits the last block to finish (atomic counter per (b, kv head), reset to 0 by
// that block) merges the partial results; with one split the block writes the output directly.

#define ATT_REPM 8
#define ATT_SLMAX 256
#define ATT_CH 4  // iterations whose K/V loads are issued together

template <int HD>
__device__ void attn_body(const h16* __restrict__ qkv, h16* kc, h16* vc, const int* __restrict__ slots,
                          const int* __restrict__ pos, const float* __restrict__ cosT, const float* __restrict__ sinT,
                          int Hkv, int rep, int maxctx, h16* __restrict__ out, float* part_o, float* part_ml,
                          u32* counters) {
  constexpr int LPR = HD / 8, RPW = 32 / LPR, PPI = 8 * RPW;
  __shared__ float qs[ATT_REPM][HD];
  __shared__ float sc[ATT_REPM][ATT_SLMAX];
  __shared__ float red[8][ATT_REPM * HD];
  __shared__ float ml[ATT_REPM][2];
  __shared__ int last;
  PDL_TRIGGER();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int split = blockIdx.x, nsplit = gridDim.x, kvh = blockIdx.y, b = blockIdx.z;
  const int H = Hkv * rep, NQKV = (H + 2 * Hkv) * HD;
  const int pn = pos[b], L = pn + 1;
  int sl = (L + nsplit - 1) / nsplit;
  sl = max(ATT_CH * PPI, (sl + 63) & ~63);
  const int nact = (L + sl - 1) / sl;
  if (split >= nact) return;
  const int s0 = split * sl, s1 = min(L, s0 + sl), n = s1 - s0;
  const size_t cbase = ((size_t)slots[b] * Hkv + kvh) * (size_t)maxctx * HD;
  h16* kcr = kc + cbase;
  h16* vcr = vc + cbase;
  const h16* qrow = qkv + (size_t)b * NQKV;
  const float* cr = cosT + (size_t)pn * (HD / 2);
  const float* sr = sinT + (size_t)pn * (HD / 2);
  const float scale = rsqrtf((float)HD);
  const int r = lane / LPR, l = lane % LPR;
  uint4 kpre[ATT_CH], vpre[ATT_CH], vfirst[ATT_CH];
#pragma unroll
  for (int i = 0; i < ATT_CH; i++) {  // first chunk's K/V rows, in flight during the rope below
    const int p = s0 + i * PPI + warp * RPW + r;
    kpre[i] = vpre[i] = make_uint4(0, 0, 0, 0);
    if (p < s1 && p != pn) {
      kpre[i] = *reinterpret_cast<const uint4*>(kcr + (size_t)p * HD + l * 8);
      vpre[i] = *reinterpret_cast<const uint4*>(vcr + (size_t)p * HD + l * 8);
    }
  }
  PDL_WAIT();  // everything above reads only what earlier steps wrote; qkv comes from the previous kernel
  for (int i = tid + rep * HD; i < ATT_REPM * HD; i += blockDim.x) (&qs[0][0])[i] = 0.f;
  for (int i = tid; i < rep * (HD / 2); i += blockDim.x) {
    const int h = i / (HD / 2), d = i % (HD / 2);
    const h16* qh = qrow + (kvh * rep + h) * HD;
    const float x1 = h2f(qh[d]), x2 = h2f(qh[d + HD / 2]), c = cr[d], s = sr[d];
    qs[h][d] = (x1 * c - x2 * s) * scale;
    qs[h][d + HD / 2] = (x2 * c + x1 * s) * scale;
  }
  if (pn >= s0 && pn < s1) {
    const h16* kh = qrow + H * HD + kvh * HD;
    const h16* vh = qrow + (H + Hkv) * HD + kvh * HD;
    for (int d = tid; d < HD / 2; d += blockDim.x) {
      const float x1 = h2f(kh[d]), x2 = h2f(kh[d + HD / 2]), c = cr[d], s = sr[d];
      kcr[(size_t)pn * HD + d] = f2h(x1 * c - x2 * s);
      kcr[(size_t)pn * HD + d + HD / 2] = f2h(x2 * c + x1 * s);
    }
    for (int d = tid; d < HD; d += blockDim.x) vcr[(size_t)pn * HD + d] = vh[d];
  }
  __syncthreads();

  // positions go in chunks of ATT_CH iterations of PPI; a chunk's K and V rows are loaded together
  const int iters = (n + PPI - 1) / PPI;
  for (int c0 = 0; c0 < iters; c0 += ATT_CH) {
    uint4 kk[ATT_CH], vv[ATT_CH];
    if (c0 == 0) {
#pragma unroll
      for (int i = 0; i < ATT_CH; i++) {
        kk[i] = kpre[i];
        vv[i] = vpre[i];
        const int p = s0 + i * PPI + warp * RPW + r;
        if (p == pn) {  // the row this block just wrote (prefetched before the write)
          kk[i] = *reinterpret_cast<const uint4*>(kcr + (size_t)p * HD + l * 8);
          vv[i] = *reinterpret_cast<const uint4*>(vcr + (size_t)p * HD + l * 8);
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < ATT_CH; i++) {
        const int p = s0 + (c0 + i) * PPI + warp * RPW + r;
        kk[i] = vv[i] = make_uint4(0, 0, 0, 0);
        if (p < s1) {
          kk[i] = *reinterpret_cast<const uint4*>(kcr + (size_t)p * HD + l * 8);
          vv[i] = *reinterpret_cast<const uint4*>(vcr + (size_t)p * HD + l * 8);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < ATT_CH; i++) {
      const int p = s0 + (c0 + i) * PPI + warp * RPW + r;
      const bool ok = p < s1;
      float k[8];
      const u32 kw[4] = {kk[i].x, kk[i].y, kk[i].z, kk[i].w};
#pragma unroll
      for (int j = 0; j < 4; j++) { k[2 * j] = h2f((h16)(kw[j] & 0xFFFF)); k[2 * j + 1] = h2f((h16)(kw[j] >> 16)); }
      float part[ATT_REPM];  // all heads at once (no early exit: the 8 shuffle chains interleave)
#pragma unroll
      for (int h = 0; h < ATT_REPM; h++) {
        part[h] = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) part[h] = fmaf(qs[h][l * 8 + j], k[j], part[h]);
      }
#pragma unroll
      for (int o = LPR / 2; o > 0; o >>= 1)
#pragma unroll
        for (int h = 0; h < ATT_REPM; h++) part[h] += __shfl_xor_sync(0xffffffffu, part[h], o);
      if (ok && l == 0) {
#pragma unroll
        for (int h = 0; h < ATT_REPM; h++)
          if (h < rep) sc[h][p - s0] = part[h];
      }
    }
    if (c0 == 0) {
#pragma unroll
      for (int i = 0; i < ATT_CH; i++) vfirst[i] = vv[i];
    }
  }
  __syncthreads();
  if (warp < rep) {  // softmax numerators of head `warp` over this split
    float m = -3.0e38f;
    for (int i = lane; i < n; i += 32) m = fmaxf(m, sc[warp][i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float sum = 0.f;
    for (int i = lane; i < n; i += 32) {
      const float e = __expf(sc[warp][i] - m);
      sc[warp][i] = e;
      sum += e;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) { ml[warp][0] = m; ml[warp][1] = sum; }
  }
  __syncthreads();
  {  // P @ V
    float acc[ATT_REPM][8];
#pragma unroll
    for (int h = 0; h < ATT_REPM; h++)
#pragma unroll
      for (int i = 0; i < 8; i++) acc[h][i] = 0.f;
    for (int c0 = 0; c0 < iters; c0 += ATT_CH) {
      uint4 vv[ATT_CH];
#pragma unroll
      for (int i = 0; i < ATT_CH; i++) {
        const int p = s0 + (c0 + i) * PPI + warp * RPW + r;
        if (c0 == 0) vv[i] = vfirst[i];
        else vv[i] = p < s1 ? *reinterpret_cast<const uint4*>(vcr + (size_t)p * HD + l * 8) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int i = 0; i < ATT_CH; i++) {
        const int p = s0 + (c0 + i) * PPI + warp * RPW + r;
        const bool ok = p < s1;
        float v[8];
        const u32 vw[4] = {vv[i].x, vv[i].y, vv[i].z, vv[i].w};
#pragma unroll
        for (int j = 0; j < 4; j++) { v[2 * j] = h2f((h16)(vw[j] & 0xFFFF)); v[2 * j + 1] = h2f((h16)(vw[j] >> 16)); }
#pragma unroll
        for (int h = 0; h < ATT_REPM; h++) {
          const float w = (ok && h < rep) ? sc[h][p - s0] : 0.f;
#pragma unroll
          for (int j = 0; j < 8; j++) acc[h][j] = fmaf(w, v[j], acc[h][j]);
        }
      }
    }
#pragma unroll
    for (int h = 0; h < ATT_REPM; h++)
#pragma unroll
      for (int i = 0; i < 8; i++)
#pragma unroll
        for (int o = LPR; o < 32; o <<= 1) acc[h][i] += __shfl_xor_sync(0xffffffffu, acc[h][i], o);
    if (r == 0) {
#pragma unroll
      for (int h = 0; h < ATT_REPM; h++)
        if (h < rep)
#pragma unroll
          for (int i = 0; i < 8; i++) red[warp][h * HD + l * 8 + i] = acc[h][i];
    }
  }
  __syncthreads();
  const int H0 = kvh * rep;
  for (int i = tid; i < rep * HD; i += blockDim.x) {
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < 8; w++) o += red[w][i];
    const int h = i / HD, d = i % HD;
    if (nact == 1) out[(size_t)b * H * HD + (H0 + h) * HD + d] = f2h(o / ml[h][1]);
    else part_o[(((size_t)b * H + H0 + h) * nsplit + split) * HD + d] = o;
  }
  if (nact == 1) return;
  if (tid < rep) {
    part_ml[(((size_t)b * H + H0 + tid) * nsplit + split) * 2] = ml[tid][0];
    part_ml[(((size_t)b * H + H0 + tid) * nsplit + split) * 2 + 1] = ml[tid][1];
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(counters + b * Hkv + kvh, 1u) == (u32)(nact - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  const volatile float* po = part_o;
  const volatile float* pm = part_ml;
  for (int i = tid; i < rep * HD; i += blockDim.x) {
    const int h = i / HD, d = i % HD;
    const size_t hb = ((size_t)b * H + H0 + h) * nsplit;
    float M = -3.0e38f;
    for (int s = 0; s < nact; s++) M = fmaxf(M, pm[(hb + s) * 2]);
    float num = 0.f, den = 0.f;
    for (int s = 0; s < nact; s++) {
      const float e = __expf(pm[(hb + s) * 2] - M);
      num = fmaf(e, po[(hb + s) * HD + d], num);
      den = fmaf(e, pm[(hb + s) * 2 + 1], den);
    }
    out[(size_t)b * H * HD + (H0 + h) * HD + d] = f2h(num / den);
  }
  if (tid == 0) counters[b * Hkv + kvh] = 0u;
}

extern "C" __global__ void __launch_bounds__(256) attn_decode_hd128(
    const h16* qkv, h16* kc, h16* vc, const int* slots, const int* pos, const float* cosT, const float* sinT,
    int Hkv, int rep, int maxctx, h16* out, float* part_o, float* part_ml, u32* counters) {
  attn_body<128>(qkv, kc, vc, slots, pos, cosT, sinT, Hkv, rep, maxctx, out, part_o, part_ml, counters);
}
extern "C" __global__ void __launch_bounds__(256) attn_decode_hd64(
    const h16* qkv, h16* kc, h16* vc, const int* slots, const int* pos, const float* cosT, const float* sinT,
    int Hkv, int rep, int maxctx, h16* out, float* part_o, float* part_ml, u32* counters) {
  attn_body<64>(qkv, kc, vc, slots, pos, cosT, sinT, Hkv, rep, maxctx, out, part_o, part_ml, counters);
}
