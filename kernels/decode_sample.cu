// A token drawn from each of B logits rows already sorted (torch.sort, descending, stable: ties to the lower id),
// one block per row, in one launch: sample_reference.draw_sorted's semantics (temperature, top_k, top_p, one uniform by
// inverse CDF) after the sort, which the ~15 launches of the torch ops took on the GPU (engine/model/chain_sampler.py).
// Reference: kernels/sample_reference.py sample_sorted_ref (draw_sorted per row: the same arithmetic up to the
// order of the float64 sums). A module of its own, compiled on first use (DecodeKernels.load_sample); plain
// CUDA C for any sm_80+.
//
// Row r (block r, 1024 threads): prm[r] = (T, k, p) as doubles; T == 0 leaves the row alone (a greedy row beside
// sampling rows: its argmax key stays). n = (0 < k < V ? k : V); inv = float(1 / T); v_i = vals[r, i] * inv,
// e_i = expf(v_i - v_0) (float), masses in double. Thread t owns elements [t * S, (t + 1) * S) (S = V / 1024
// rounded up: a row's arithmetic depends on V alone, not on B) and sums them serially; a block scan gives each
// thread its exclusive prefix (the previous thread's inclusive one, bit for bit) and Z. A search for the first
// element whose inclusive mass reaches a target is done by the one thread whose range holds the crossing
// (excl < target <= incl), serially from its exclusive prefix; rounding that leaves the crossing past its last
// element takes that element. top_p < 1: keep = 1 + the first i whose mass reaches p * Z (else n); the kept mass is
// the mass at keep - 1 as that search computed it. The draw: the first i whose mass exceeds u * kept (u = u[*at + r];
// at most keep - 1; 0 if the kept mass is not positive). keys[r] = 0xFFFFFFFF - idx[r, i]: an argmax key that
// keys_to_ids and the next chain step's embedding read as that id. A row's bits depend only on its own values, so it
// draws the same token alone or in a batch.
#define SMP_THREADS 1024

// inclusive block scan of one double per thread (fixed order) -> incl; excl = the previous thread's incl (0 for
// thread 0); the block's total in wsum[63] (read before the next scan)
__device__ __forceinline__ void smp_scan(double s, double* wsum, double& incl, double& excl) {
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
}

__device__ __forceinline__ double smp_e(const float* v, int i, float inv, float m) {
  return (double)expf(v[i] * inv - m);
}

// the first element of [lo, hi) whose mass (excl + the serial partial) reaches target (strict: exceeds it), or
// hi - 1 if rounding leaves none; *mass = the mass there
__device__ __forceinline__ int smp_walk(const float* v, int lo, int hi, float inv, float m, double excl,
                                       double target, bool strict, double* mass) {
  double f = excl;
  for (int i = lo; i < hi; i++) {
    f += smp_e(v, i, inv, m);
    if (strict ? f > target : f >= target) {
      *mass = f;
      return i;
    }
  }
  *mass = f;
  return hi - 1;
}

extern "C" __global__ void __launch_bounds__(SMP_THREADS) sample_sorted(
    const float* __restrict__ vals, const long long* __restrict__ idx, int V, const double* __restrict__ prm,
    const double* __restrict__ u, const int* __restrict__ at, long long* __restrict__ keys) {
  __shared__ double wsum[64];
  __shared__ double kept_s;
  __shared__ int keep_s, pick_s;
  const int r = blockIdx.x, tid = threadIdx.x;
  const double T = prm[r * 3 + 0];
  if (!(T > 0.0)) return;  // not a sampling row (the whole block leaves)
  const int k = (int)prm[r * 3 + 1];
  const double p = prm[r * 3 + 2];
  const float* v = vals + (size_t)r * V;
  const int n = (k > 0 && k < V) ? k : V;
  const float inv = (float)(1.0 / T);
  const float m = v[0] * inv;
  const int S = (V + SMP_THREADS - 1) / SMP_THREADS;
  const int lo = min(tid * S, n), hi = min(lo + S, n);
  double s = 0.0;
  for (int i = lo; i < hi; i++) s += smp_e(v, i, inv, m);
  double incl, excl;
  smp_scan(s, wsum, incl, excl);
  const double Z = wsum[63];
  if (tid == 0) {
    keep_s = n;
    kept_s = Z;
  }
  __syncthreads();
  if (p < 1.0 && Z > 0.0) {  // top_p: the one thread whose range holds the crossing of p * Z
    const double target = p * Z;
    if (lo < hi && excl < target && target <= incl) {
      double mass;
      const int j = smp_walk(v, lo, hi, inv, m, excl, target, false, &mass);
      keep_s = j + 1;
      kept_s = mass;
    }
    __syncthreads();
  }
  const int keep = keep_s;
  const double kept = kept_s;
  __syncthreads();  // every thread has read keep_s / kept_s
  if (tid == 0) pick_s = kept > 0.0 ? keep - 1 : 0;  // (rounding that leaves no crossing: the last kept element)
  __syncthreads();
  if (kept > 0.0) {  // the draw: the one thread whose range holds the crossing of u * kept
    const double t = u[*at + r] * kept;
    const int h = min(hi, keep);
    if (lo < h && excl <= t && t < incl) {
      double mass;
      pick_s = smp_walk(v, lo, h, inv, m, excl, t, true, &mass);
    }
  }
  __syncthreads();
  if (tid == 0) {
    const int pick = min(pick_s, keep - 1);
    keys[r] = 0xFFFFFFFFll - idx[(size_t)r * V + pick];
  }
}
