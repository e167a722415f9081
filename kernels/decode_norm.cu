// RMSNorm rows for the decode step, one 256-thread block for up to 8 rows: shared by rmsnorm_rows
// (decode_misc.cu, one block per row) and the norm tail of the "resid" GEMVs (decode_gemv.cu, the grid's last
// block does all B rows), so the two give the same bits. Reference: kernels/decode_reference.py rmsnorm_ref.
// Compiled after decode_common.cu.
//
// x[k] = fp16(h[k] * rsqrt(mean(h^2) + eps) * w[k]). Thread vt (0..255) reads float4 k = 4 vt + 1024 i and sums
// the squares with fmaf; the warp's 32 partials by an xor butterfly, the 8 warp sums by the same butterfly.
// D % 4 == 0 (every Qwen2.5 hidden size is a multiple of 128), any D.
// h is read with ld.global.cg (__ldcg): in the GEMV tail other blocks of the same grid wrote it (L1 is not
// coherent). __ldcg is ordered like volatile asm, so every row's load of one step i is issued before any sum uses
// them: one L2 round trip per 1024 values, not one per load. (The first version summed right after each load:
// a chain of 64 dependent round trips, 23 us per norm on the H200, which halved the decode rate.)

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

// The last block of a grid to get here normalizes rows 0..B-1 of h into x, then resets the arrival counter
// `done` for the next launch. Every thread of every block must call it (after its writes to h).
__device__ __forceinline__ void rmsnorm_tail(const float* h, const float* __restrict__ w, int D, float eps,
                                             h16* __restrict__ x, int B, u32* done) {
  __shared__ u32 last;
  __threadfence();  // this thread's writes to h, before the block's arrival is counted
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(done, 1u) == gridDim.x * gridDim.y - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  rmsnorm_rows_block(h, w, D, eps, x, 0, B);
  if (threadIdx.x == 0) *done = 0u;
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
