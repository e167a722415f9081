// RMSNorm rows for the decode step, one 256-thread block for up to 8 rows: shared by rmsnorm_rows
// (decode_misc.cu) and the norm tail of the "resid" GEMVs (decode_gemv.cu), so the two give the same bits.
// Reference: kernels/decode_reference.py rmsnorm_ref. Compiled after decode_common.cu.
//
// x[k] = fp16(h[k] * rsqrt(mean(h^2) + eps) * w[k]). Thread vt (0..255) sums k = vt + 256 i with fmaf, each
// warp's 32 partials are summed by an xor butterfly, and the 8 warp sums by the same butterfly over 8 values
// ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)) (the first block kernel's order). Any D.
// All rows' loads are issued together (independent), so the cost is about two L2 round trips, not one per
// element: the first version gave each row to one warp and took 23 us per norm on the H200 (a chain of
// 64 dependent loads per lane), which halved the decode rate.
// h is read with ld.global.cg: in the GEMV tail other blocks of the same grid wrote it (L1 is not coherent).

#define NORM_ROWS 8   // rows per call (MAX_TOKENS)

__device__ __forceinline__ void rmsnorm_rows_block(const float* h, const float* __restrict__ w, int D, float eps,
                                                   h16* __restrict__ x, int B) {
  __shared__ float part[NORM_ROWS][8];
  __shared__ float rs[NORM_ROWS];
  const int vt = threadIdx.x, lane = vt & 31, warp = vt >> 5;  // blockDim.x == 256
  const int n_i = (D + 255) >> 8;
  float ss[NORM_ROWS];
#pragma unroll
  for (int b = 0; b < NORM_ROWS; b++) ss[b] = 0.f;
  for (int i = 0; i < n_i; i++) {
    const int k = vt + 256 * i;
#pragma unroll
    for (int b = 0; b < NORM_ROWS; b++) {
      if (b < B) {
        const float v = k < D ? __ldcg(h + (size_t)b * D + k) : 0.f;
        ss[b] = fmaf(v, v, ss[b]);
      }
    }
  }
#pragma unroll
  for (int b = 0; b < NORM_ROWS; b++) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss[b] += __shfl_xor_sync(0xffffffffu, ss[b], o);
    if (lane == 0) part[b][warp] = ss[b];
  }
  __syncthreads();
  if (warp < B) {  // warp b finishes row b
    float s = lane < 8 ? part[warp][lane] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) rs[warp] = rsqrtf(s / (float)D + eps);
  }
  __syncthreads();
  for (int i = 0; i < n_i; i++) {
    const int k = vt + 256 * i;
    if (k < D) {
      const float wk = w[k];
#pragma unroll
      for (int b = 0; b < NORM_ROWS; b++)
        if (b < B) x[(size_t)b * D + k] = f2h(__ldcg(h + (size_t)b * D + k) * rs[b] * wk);
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
  rmsnorm_rows_block(h, w, D, eps, x, B);
  if (threadIdx.x == 0) *done = 0u;
}
