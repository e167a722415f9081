// A token drawn from each of B logits rows already sorted (torch.sort, descending, stable: ties to the lower id),
// one block per row, in one launch: sampling.sample's semantics (temperature, top_k, top_p, one uniform by inverse
// CDF) after the sort, which the ~15 launches of sampling.pick_index took on the GPU (engine/model/chain_sampler.py).
// Reference: kernels/decode_reference.py sample_sorted_ref (the same steps in float64 on the CPU).
// A module of its own, compiled on first use (DecodeKernels.load_sample); plain CUDA C, any sm_80+.
//
// Row r (block r, 1024 threads): prm[r] = (T, k, p) as doubles; T == 0 leaves the row alone (a greedy row beside
// sampling rows: its argmax key stays). v_i = vals[r, i] / T (float), m = v_0 (the row's max: sorted), e_i =
// expf(v_i - m) for i < n = (0 < k < V ? k : V); masses in double, in a fixed order: thread t of chunk c sums
// elements c*CH + t*E .. + E - 1 serially, the block scans the 1024 sums (warp shuffles, then the warp totals), the
// chunks add in order. Z = all of it; top_p < 1 keeps the first c elements, c = 1 + the first i whose inclusive
// mass reaches p * Z (at least 1, at most n); the draw is the first i < c whose inclusive mass exceeds
// u * (mass of the first c), u = u[*at + r]; none (rounding) -> c - 1. keys[r] = 0xFFFFFFFF - idx[r, i]: an argmax
// key that keys_to_ids and the next chain step's embedding read as that id. Bits depend only on the row's own
// values (no other row, no grid size), so a row draws the same token alone or in a batch.
#define SMP_THREADS 1024
#define SMP_E 16  // elements per thread per chunk (consecutive)
#define SMP_CH (SMP_THREADS * SMP_E)  // elements per chunk
#define SMP_MAXCH 64  // chunks per row: V <= 1,048,576

// inclusive block scan of one double per thread (fixed order); -> the thread's inclusive and exclusive prefixes
// (exclusive = the previous thread's inclusive, not a subtraction) and, in *total, the chunk's sum.
__device__ __forceinline__ void smp_scan(double s, double* wsum, double& incl, double& excl, double* total) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  double x = s;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) wsum[warp] = x;
  __syncthreads();
  if (warp == 0) {
    double w = wsum[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const double y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    wsum[32 + lane] = w;  // inclusive over warps
  }
  __syncthreads();
  incl = (warp ? wsum[32 + warp - 1] : 0.0) + x;
  const double prev = __shfl_up_sync(0xffffffffu, incl, 1);
  excl = lane ? prev : (warp ? wsum[32 + warp - 1] : 0.0);
  if (total) *total = wsum[32 + 31];
  __syncthreads();  // wsum reused by the next scan
}

// the thread's E masses of chunk c, summed serially
__device__ __forceinline__ double smp_thread_sum(const float* v, int n, float T, float m, int c) {
  const int i0 = c * SMP_CH + threadIdx.x * SMP_E;
  double s = 0.0;
#pragma unroll 4
  for (int q = 0; q < SMP_E; q++) {
    const int i = i0 + q;
    if (i < n) s += (double)expf(v[i] / T - m);
  }
  return s;
}

// the first element i < n of chunk c whose inclusive mass (carry + the thread's exclusive prefix + its serial
// partial) reaches target (strict: exceeds it); n if none. Every thread returns the block's answer.
__device__ __forceinline__ int smp_first_in_chunk(const float* v, int n, float T, float m, int c, double carry,
                                                  double target, bool strict, double* wsum, int* found) {
  const double s = smp_thread_sum(v, n, T, m, c);
  double incl, excl;
  smp_scan(s, wsum, incl, excl, nullptr);
  if (threadIdx.x == 0) *found = n;
  __syncthreads();
  const int i0 = c * SMP_CH + threadIdx.x * SMP_E;
  double f = carry + excl;
  for (int q = 0; q < SMP_E; q++) {
    const int i = i0 + q;
    if (i >= n) break;
    f += (double)expf(v[i] / T - m);
    if (strict ? f > target : f >= target) {
      atomicMin(found, i);
      break;
    }
  }
  __syncthreads();
  const int r = *found;
  __syncthreads();
  return r;
}

// the first element whose inclusive mass reaches (strict: exceeds) target, searching chunk by chunk with the
// chunks' sums ct[] (carried in order); n if none
__device__ __forceinline__ int smp_first(const float* v, int n, float T, float m, const double* ct, int nch,
                                         double target, bool strict, double* wsum, int* found) {
  double carry = 0.0;
  for (int c = 0; c < nch; c++) {
    const double next = carry + ct[c];
    if (strict ? next > target : next >= target) {
      const int i = smp_first_in_chunk(v, n, T, m, c, carry, target, strict, wsum, found);
      if (i < n) return i;  // (else rounding put the crossing past this chunk: go on)
    }
    carry = next;
  }
  return n;
}

extern "C" __global__ void __launch_bounds__(SMP_THREADS) sample_sorted(
    const float* __restrict__ vals, const long long* __restrict__ idx, int V, const double* __restrict__ prm,
    const double* __restrict__ u, const int* __restrict__ at, long long* __restrict__ keys) {
  __shared__ double wsum[64];
  __shared__ double ct[SMP_MAXCH];
  __shared__ int found;
  const int r = blockIdx.x;
  const float T = (float)prm[r * 3 + 0];
  if (!(T > 0.f)) return;  // not a sampling row
  const int k = (int)prm[r * 3 + 1];
  const double p = prm[r * 3 + 2];
  const float* v = vals + (size_t)r * V;
  const int n = (k > 0 && k < V) ? k : V;
  const float m = v[0] / T;
  const int nch = (n + SMP_CH - 1) / SMP_CH;
  double Z = 0.0;
  for (int c = 0; c < nch; c++) {  // the chunks' masses, in order
    double incl, excl, tot;
    smp_scan(smp_thread_sum(v, n, T, m, c), wsum, incl, excl, &tot);
    if (threadIdx.x == 0) ct[c] = tot;
    Z += tot;
  }
  __syncthreads();
  int keep = n;  // top_p: the first `keep` elements
  double kept = Z;
  if (p < 1.0 && Z > 0.0) {
    const int j = smp_first(v, n, T, m, ct, nch, p * Z, false, wsum, &found);
    keep = j < n ? j + 1 : n;
    if (keep < n) {  // the kept mass: the chunks before keep's, then keep's own elements (the same order)
      kept = 0.0;
      const int cj = (keep - 1) / SMP_CH;
      for (int c = 0; c < cj; c++) kept += ct[c];
      // inclusive mass at element keep - 1, computed as smp_first_in_chunk does
      const double s = smp_thread_sum(v, n, T, m, cj);
      double incl, excl;
      smp_scan(s, wsum, incl, excl, nullptr);
      const int i0 = cj * SMP_CH + threadIdx.x * SMP_E;
      if (keep - 1 >= i0 && keep - 1 < i0 + SMP_E) {
        double f = kept + excl;
        for (int i = i0; i <= keep - 1; i++) f += (double)expf(v[i] / T - m);
        wsum[0] = f;  // (smp_scan's trailing barrier: wsum is free)
      }
      __syncthreads();
      kept = wsum[0];
      __syncthreads();
    }
  }
  int pick = 0;
  if (kept > 0.0) {
    const double t = u[*at + r] * kept;
    const int nk = (keep + SMP_CH - 1) / SMP_CH;
    const int j = smp_first(v, keep, T, m, ct, nk, t, true, wsum, &found);
    pick = j < keep ? j : keep - 1;
  }
  if (threadIdx.x == 0) keys[r] = 0xFFFFFFFFll - idx[(size_t)r * V + pick];
}
