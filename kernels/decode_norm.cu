// RMSNorm rows for the decode step, one 256-thread block for up to 8 rows (rmsnorm_rows, decode_misc.cu), and the
// deferred norm of the decode step's layers (below). Reference: kernels/decode_reference.py rmsnorm_ref.
// Compiled after decode_common.cu.
//
// x[k] = fp16(h[k] * rsqrt(mean(h^2) + eps) * w[k]). Thread vt (0..255) reads float4 k = 4 vt + 1024 i and sums
// the squares with fmaf; the warp's 32 partials by an xor butterfly, the 8 warp sums by the same butterfly.
// D % 4 == 0 (every Qwen2.5 hidden size is a multiple of 128), any D.
// h is read with ld.global.cg (__ldcg, L2; it was a must when the grid's last block of a GEMV normalized h that
// other blocks wrote). __ldcg is ordered like volatile asm, so every row's load of one step i is issued before any
// sum uses them: one L2 round trip per 1024 values, not one per load. (The first version summed right after each
// load: a chain of 64 dependent round trips, 23 us per norm on the H200, which halved the decode rate.)

#define NORM_ROWS 8  // rows per call (MAX_TOKENS)

__device__ __forceinline__ float sq4(float4 v, float s) {
  return fmaf(v.w, v.w, fmaf(v.z, v.z, fmaf(v.y, v.y, fmaf(v.x, v.x, s))));
}
__device__ __forceinline__ float warp_sum(float s) {  // xor butterfly: every lane ends with the sum
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}
// the row's 1 / rms from the 8 warps' partial sums (lane < 8 reads one each): one warp calls it
__device__ __forceinline__ float rstd8(const float* part, int lane, int D, float eps) {
  return rsqrtf(warp_sum(lane < 8 ? part[lane] : 0.f) / (float)D + eps);
}
// 4 halves k .. k + 3 of a normalized row: fp16(v * r * w), the one expression every norm kernel stores
__device__ __forceinline__ uint2 norm4(float4 v, float r, float4 w) {
  uint2 o;
  o.x = (u32)f2h(v.x * r * w.x) | ((u32)f2h(v.y * r * w.y) << 16);
  o.y = (u32)f2h(v.z * r * w.z) | ((u32)f2h(v.w * r * w.w) << 16);
  return o;
}

// rows b0 .. b0 + nb - 1 of h [*, D] -> the same rows of x [*, D] (nb <= NORM_ROWS)
__device__ __forceinline__ void rmsnorm_rows_block(const float* h, const float* __restrict__ w, int D, float eps,
                                                   h16* __restrict__ x, int b0, int nb) {
  __shared__ float part[NORM_ROWS][8];
  __shared__ float rs[NORM_ROWS];
  const int vt = threadIdx.x, lane = vt & 31, warp = vt >> 5;  // blockDim.x == 256
  const int n_i = (D + 1023) >> 10;
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  float ss[NORM_ROWS];
#pragma unroll
  for (int b = 0; b < NORM_ROWS; b++) ss[b] = 0.f;
  for (int i = 0; i < n_i; i++) {
    const int k = 4 * vt + 1024 * i;
    float4 v[NORM_ROWS];
#pragma unroll
    for (int b = 0; b < NORM_ROWS; b++)
      v[b] = (b < nb && k < D) ? __ldcg(reinterpret_cast<const float4*>(h + (size_t)(b0 + b) * D + k)) : zero;
#pragma unroll
    for (int b = 0; b < NORM_ROWS; b++) ss[b] = sq4(v[b], ss[b]);
  }
#pragma unroll
  for (int b = 0; b < NORM_ROWS; b++) {
    ss[b] = warp_sum(ss[b]);
    if (lane == 0) part[b][warp] = ss[b];
  }
  __syncthreads();
  if (warp < nb) {  // warp b finishes row b
    const float r = rstd8(part[warp], lane, D, eps);
    if (lane == 0) rs[warp] = r;
  }
  __syncthreads();
  for (int i = 0; i < n_i; i++) {
    const int k = 4 * vt + 1024 * i;
    if (k >= D) break;
    const float4 wk = *reinterpret_cast<const float4*>(w + k);
    float4 v[NORM_ROWS];
#pragma unroll
    for (int b = 0; b < NORM_ROWS; b++)
      v[b] = b < nb ? __ldcg(reinterpret_cast<const float4*>(h + (size_t)(b0 + b) * D + k)) : zero;
#pragma unroll
    for (int b = 0; b < NORM_ROWS; b++) {
      if (b < nb) *reinterpret_cast<uint2*>(x + (size_t)(b0 + b) * D + k) = norm4(v[b], rs[b], wk);
    }
  }
}

// ---- the deferred rmsnorm (decode step default; DEEPINFER_DEFER_NORM=0: the separate rmsnorm_rows launches) ----
// A decoder layer's two norms are not launches of their own. The kernel that updates h (the embedding, o_proj's and
// down_proj's "resid" GEMVs) also writes the next linear's input UNnormalized, x = fp16(h * w * sc), and adds the sum
// of squares of its rows of h into ss[p + 1][b]; the GEMV that consumes x (qkv, gate_up) multiplies its sums by
// rstd / sc, where rstd = rsqrt(ss[p + 1][b] / D + eps) (linear in x: the same y up to fp16 rounding of x).
// ss: int64 [2 L + 1, 8] per step; norm point p (layer i's input norm p = 2 i, its post-attention norm 2 i + 1)
// reads ss[p] and ss[p + 1]. The sums are fixed point (SS_ONE per unit) so that their atomic adds give the same bits
// in any order: deterministic, and a row's value does not depend on the other rows of the batch.
// sc = the previous point's rstd / 16 (ss[p]; the embedding: its own row's, kept in ss[0] and ss[1]): x stays
// near the normalized scale / 16, far from fp16's 65504 even where one layer multiplies h's scale.
#define SS_ONE 1048576.f     // 2^20: fixed-point units per 1.0 of a sum of squares (2^63 / 2^20 ~ 8.8e12)
#define DEFER_SC 0.0625f     // 1/16
__device__ __forceinline__ float rstd_fix(unsigned long long v, int D, float eps) {
  return rsqrtf(norm_div((float)(long long)v * (1.f / SS_ONE), (float)D) + eps);  // D: the hidden size
}
__device__ __forceinline__ unsigned long long to_fix(float q) { return (unsigned long long)__float2ll_rn(q * SS_ONE); }

// The embedding kernels' deferred norm for row b of h (this block wrote it, every thread calls this after its
// writes): ss[0][b] = ss[1][b] = the row's sum of squares, ss[2 .. P - 1][b] = 0 (the step's other points start
// from 0), x[b] = fp16(h[b] * w * sc) with sc = rstd_fix(ss[0][b]) / 16 (so the consumer's rstd / sc is 16).
__device__ __forceinline__ void defer_norm_row(const float* h, const float* __restrict__ w, int D, float eps,
                                               h16* __restrict__ x, unsigned long long* ss, int P, int b) {
  __shared__ float part2[8];
  const int vt = threadIdx.x, lane = vt & 31, warp = vt >> 5;  // blockDim.x == 256
  __syncthreads();  // the block's writes to h[b] (in any thread-to-element mapping) before they are read
  float q = 0.f;
  for (int k = vt; k < D; k += blockDim.x) {
    const float v = h[(size_t)b * D + k];
    q = fmaf(v, v, q);
  }
  q = warp_sum(q);
  if (lane == 0) part2[warp] = q;
  for (int i = 2 + vt; i < P; i += blockDim.x) ss[(size_t)i * 8 + b] = 0ull;
  __syncthreads();
  const unsigned long long f = to_fix(warp_sum(lane < 8 ? part2[lane] : 0.f));  // every thread: the same value
  if (vt == 0) ss[b] = ss[8 + b] = f;
  const float sc = rstd_fix(f, D, eps) * DEFER_SC;
  for (int k = vt; k < D; k += blockDim.x) x[(size_t)b * D + k] = f2h(h[(size_t)b * D + k] * w[k] * sc);
}

// One row (the rmsnorm_rows kernel: a block per row) with the same bits as rmsnorm_rows_block(.., b, 1): the norm
// weight (constant, written by no kernel) is loaded before the PDL wait, and each thread keeps its h values in
// registers between the sum and the scaling, so the row costs one dependent L2 round trip after the wait instead
// of two (h read twice). Sums and stores through rmsnorm_rows_block's helpers (warp_sum, rstd8, norm4).
// D <= 1024 * NORM1_MAXI.
#define NORM1_MAXI 8
__device__ __forceinline__ void rmsnorm_row1(const float* h, const float* __restrict__ w, int D, float eps,
                                             h16* __restrict__ x, int b) {
  __shared__ float part1[8];
  __shared__ float rs1;
  const int vt = threadIdx.x, lane = vt & 31, warp = vt >> 5;  // blockDim.x == 256
  const int n_i = (D + 1023) >> 10;
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
  float4 wk[NORM1_MAXI], v[NORM1_MAXI];
#pragma unroll
  for (int i = 0; i < NORM1_MAXI; i++) {
    const int k = 4 * vt + 1024 * i;
    wk[i] = (i < n_i && k < D) ? *reinterpret_cast<const float4*>(w + k) : zero;
  }
  PDL_WAIT();
#pragma unroll
  for (int i = 0; i < NORM1_MAXI; i++) {
    const int k = 4 * vt + 1024 * i;
    v[i] = (i < n_i && k < D) ? __ldcg(reinterpret_cast<const float4*>(h + (size_t)b * D + k)) : zero;
  }
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < NORM1_MAXI; i++)
    if (i < n_i) ss = sq4(v[i], ss);
  ss = warp_sum(ss);
  if (lane == 0) part1[warp] = ss;
  __syncthreads();
  if (warp == 0) {
    const float r = rstd8(part1, lane, D, eps);
    if (lane == 0) rs1 = r;
  }
  __syncthreads();
  const float r = rs1;
#pragma unroll
  for (int i = 0; i < NORM1_MAXI; i++) {
    const int k = 4 * vt + 1024 * i;
    if (i < n_i && k < D) *reinterpret_cast<uint2*>(x + (size_t)b * D + k) = norm4(v[i], r, wk[i]);
  }
}
