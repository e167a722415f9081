// RMSNorm rows for the decode step, as one warp per row: shared by rmsnorm_rows (decode_misc.cu) and the
// norm tail of the "resid" GEMVs (decode_gemv.cu), so the two give the same bits.
// Reference: kernels/decode_reference.py rmsnorm_ref. Compiled after decode_common.cu.
//
// x[k] = fp16(h[k] * rsqrt(mean(h^2) + eps) * w[k]). The sum of squares keeps the order of the former
// 256-thread block kernel: "thread" vt = 32 u + lane (u = 0..7, one accumulator each) sums k = vt + 256 i with
// fmaf, each warp's 32 partials are summed by an xor butterfly, and the 8 warp sums by the same butterfly
// over 8 values ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)). Any D (no 16-per-thread cap: 14B's 5120).
// h is read with ld.global.cg: in the GEMV tail other blocks of the same grid wrote it (L1 is not coherent).

#define NORM_VT 8  // 8 "threads" of 32 per lane: the 256-thread block order

__device__ __forceinline__ void rmsnorm_row_warp(const float* h, const float* __restrict__ w, int D, float eps,
                                                 h16* __restrict__ x) {
  const int lane = threadIdx.x & 31;
  float ss[NORM_VT];
#pragma unroll
  for (int u = 0; u < NORM_VT; u++) ss[u] = 0.f;
  const int n_i = (D + 255) >> 8;
  for (int i = 0; i < n_i; i++) {
#pragma unroll
    for (int u = 0; u < NORM_VT; u++) {
      const int k = 32 * u + lane + 256 * i;
      const float v = k < D ? __ldcg(h + k) : 0.f;
      ss[u] = fmaf(v, v, ss[u]);
    }
  }
#pragma unroll
  for (int u = 0; u < NORM_VT; u++)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss[u] += __shfl_xor_sync(0xffffffffu, ss[u], o);
  const float s = ((ss[0] + ss[4]) + (ss[2] + ss[6])) + ((ss[1] + ss[5]) + (ss[3] + ss[7]));
  const float r = rsqrtf(s / (float)D + eps);
  for (int k = lane; k < D; k += 32) x[k] = f2h(__ldcg(h + k) * r * w[k]);
}

// The last block of a grid to get here normalizes rows 0..B-1 of h (one warp per row) into x, then resets the
// arrival counter `done` for the next launch. Every thread of every block must call it (after its writes to h).
__device__ __forceinline__ void rmsnorm_tail(const float* h, const float* __restrict__ w, int D, float eps,
                                             h16* __restrict__ x, int B, u32* done) {
  __shared__ u32 last;
  __threadfence();  // this thread's writes to h, before the block's arrival is counted
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(done, 1u) == gridDim.x * gridDim.y - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int b = threadIdx.x >> 5; b < B; b += blockDim.x >> 5)
    rmsnorm_row_warp(h + (size_t)b * D, w, D, eps, x + (size_t)b * D);
  if (threadIdx.x == 0) *done = 0u;
}
