// A token drawn from each of B logits rows without sorting them: sample_reference.draw_sorted's semantics
// (temperature, top_k, top_p, one uniform by inverse CDF over the canonical order: descending, ties to the lower id)
// in five small launches after the step's lm_head, where a torch.sort of the rows (57 us for one 151,936-wide row on
// an H100) and a one-block-per-row walk (52 us) took 109 (engine/model/chain_sampler.py).
// Reference: kernels/sample_reference.py sample_rows_ref. A module of its own, compiled on first use
// (DecodeKernels.load_sample); plain CUDA C for any sm_80+, no float64 arithmetic per element (a consumer card runs
// float64 at 1/64 rate).
//
// The masses are integers: M_i = floor(e_i * 2^44), e_i = expf(x_i * inv - max * inv) (float32, each op rounded as
// torch rounds it; inv = float(1 / T)), so every sum is exact in any order and the kernel draws the reference's
// token bit for bit given the same expf. A row's order: the key K_i = okey(x_i) << 32 | (0xFFFFFFFF - i) (larger
// K first: the value descending, ties to the lower id); keys[r] = 0xFFFFFFFF - id = the low word of the pick's K.
//
//  smp_max (G blocks a row): the slice's max -> maxp, min -> minp; block 0 zeroes the row's candidate count, every
//    block its share of the row's histogram.
//  smp_stats (G blocks a row): Z = sum M over the row, and for each threshold D_j (d = x * inv - m >= -D_j: a prefix
//    of the canonical order, since d is monotone in x) its count and mass -> stats (partials per block).
//  smp_hist (G blocks a row; only rows where no prefix below fits: a flat row, the nucleus or the draw past SMP_CAP
//    tokens): counts and masses in SMP_NB bins of d, evenly over [dlo, 0] (dlo: the first threshold that holds every
//    crossing, or the row's least d if higher), each bin a band of the canonical order -> hist (integer atomics).
//  smp_compact (G blocks a row): every block sums the partials and chooses (smp_choose) the smallest prefix C_j that
//    holds every crossing the draw needs (top_k's k-th, top_p's, the draw's) with at most SMP_CAP elements, and
//    appends C_j's keys to cand (any order). Where none fits, the bins that can hold a crossing (smp_marks: up to
//    SMP_NR ranges, from the bins' exact sums) are gathered instead, if they hold at most SMP_CAP keys, and block 0
//    records the ranges (rec) for smp_pick.
//  smp_pick (one block of 512 a row): sorts the gathered keys in shared memory, scans their masses (across the bins
//    left out, by their recorded sums) and picks. When neither fits (a tie or a near-constant row past SMP_CAP keys
//    in one bin), the block finds each crossing itself by refining thresholds over the row (smp_find_d / smp_find;
//    slower, the same result).
// Rows with T == 0 are left alone (a greedy row beside sampling rows keeps its argmax key). prm[r] = (T, k, p)
// doubles; the uniform u[*at + r] (double in [0, 1)): U = floor(u * 2^53), P = floor(p * 2^53).
#define SMP_G 64        // blocks per row in the row-wide passes
#define SMP_T 256       // their threads
#define SMP_NT 8        // thresholds of smp_stats
#define SMP_NS (1 + 2 * SMP_NT)  // a block's partials: Z, counts[NT], masses[NT]
#define SMP_CAP 4096    // keys smp_pick sorts in shared memory
#define SMP_PT 512      // smp_pick's threads (128 registers each)
#define SMP_PER (SMP_CAP / SMP_PT)  // keys per thread in its scans
#define SMP_NB 2048     // bins of smp_hist's histogram (counts, then masses: 2 x NB u64 a row)
#define SMP_PB (SMP_NB / SMP_T)  // bins per thread in smp_marks
#define SMP_NR 3        // bin ranges gathered: the k-th's, top_p's, the draw's
#define SMP_RW (1 + 5 * SMP_NR)  // a row's route record: ranges | k-th binned << 8, then (lo, hi, start, offc, offm)

typedef unsigned long long u64;

__device__ __constant__ float SMP_D[SMP_NT] = {1.f, 2.f, 3.f, 5.f, 7.f, 10.f, 14.f, 20.f};

__device__ __forceinline__ unsigned smp_okey(float x) {  // larger float -> larger key; -0 and +0 alike
  const unsigned u = __float_as_uint(__fadd_rn(x, 0.0f));
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float smp_okey_inv(unsigned k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}
__device__ __forceinline__ u64 smp_key(float x, int i) {
  return ((u64)smp_okey(x) << 32) | (u64)(0xFFFFFFFFu - (unsigned)i);
}
__device__ __forceinline__ float smp_d(float x, float inv, float m) { return __fsub_rn(__fmul_rn(x, inv), m); }
// floor(expf(d) * 2^44): the scaling is exact (a power of two, e <= 1); NaN -> 0
__device__ __forceinline__ u64 smp_mass(float d) { return __float2ull_rz(__fmul_rn(expf(d), 17592186044416.0f)); }
// floor(a * b / 2^53) and its ceiling, exact (a < 2^53, b < 2^62)
__device__ __forceinline__ u64 smp_mulshr(u64 a, u64 b, bool up) {
  const u64 lo = a * b, hi = __umul64hi(a, b);
  const u64 q = (hi << 11) | (lo >> 53);
  return q + ((up && (lo & ((1ull << 53) - 1))) ? 1 : 0);
}

struct SmpRow {  // a row's parameters, as every kernel reads them
  float inv;
  int k;      // top_k if 0 < k < V else 0 (off)
  bool tp;    // top_p < 1
  u64 P;      // floor(top_p * 2^53)
  u64 U;      // floor(u * 2^53)
};

__device__ __forceinline__ bool smp_row(const double* prm, const double* u, const int* at, int r, int V, SmpRow& s) {
  const double T = prm[r * 3 + 0];
  if (!(T > 0.0)) return false;
  const int k = (int)prm[r * 3 + 1];
  const double p = prm[r * 3 + 2];
  s.inv = (float)(1.0 / T);
  s.k = (k > 0 && k < V) ? k : 0;
  s.tp = p < 1.0;
  s.P = s.tp ? (u64)(fmax(p, 0.0) * 9007199254740992.0) : 0ull;
  s.U = u ? (u64)(u[*at + r] * 9007199254740992.0) : 0ull;
  return true;
}

__device__ __forceinline__ float smp_rowmax(const float* maxp, int r) {
  float mx = -__int_as_float(0x7f800000);
  for (int g = 0; g < SMP_G; g++) mx = fmaxf(mx, maxp[r * SMP_G + g]);
  return mx;
}

__device__ __forceinline__ float smp_rowmin(const float* minp, int r) {
  float mn = __int_as_float(0x7f800000);
  for (int g = 0; g < SMP_G; g++) mn = fminf(mn, minp[r * SMP_G + g]);
  return mn;
}

// block-wide sum of one u64 per thread (any order: integers); every thread gets it. red: >= 32 u64 of shared memory
__device__ __forceinline__ u64 smp_bsum(u64 x, u64* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  __syncthreads();
  if (lane == 0) red[warp] = x;
  __syncthreads();
  u64 t = 0;
  for (int w = 0; w < nw; w++) t += red[w];
  return t;
}

extern "C" __global__ void __launch_bounds__(SMP_T) smp_max(const float* __restrict__ logits, int V,
                                                            const double* __restrict__ prm, float* __restrict__ maxp,
                                                            float* __restrict__ minp, int* __restrict__ cnt,
                                                            u64* __restrict__ hist) {
  const int g = blockIdx.x, r = blockIdx.y;
  if (!(prm[r * 3] > 0.0)) return;
  const int S = (V + SMP_G - 1) / SMP_G, lo = g * S, hi = min(lo + S, V);
  const float* x = logits + (size_t)r * V;
  float mx = -__int_as_float(0x7f800000), mn = __int_as_float(0x7f800000);
  for (int i = lo + threadIdx.x; i < hi; i += SMP_T) {
    mx = fmaxf(mx, x[i]);
    mn = fminf(mn, x[i]);
  }
#pragma unroll
  for (int o = 16; o; o >>= 1) {
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, o));
  }
  __shared__ float wm[SMP_T / 32], wn[SMP_T / 32];
  if ((threadIdx.x & 31) == 0) { wm[threadIdx.x >> 5] = mx; wn[threadIdx.x >> 5] = mn; }
  const int HS = 2 * SMP_NB / SMP_G;  // this block's share of the row's histogram
  for (int i = threadIdx.x; i < HS; i += SMP_T) hist[(size_t)r * 2 * SMP_NB + g * HS + i] = 0;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < SMP_T / 32; w++) { mx = fmaxf(mx, wm[w]); mn = fminf(mn, wn[w]); }
    maxp[r * SMP_G + g] = mx;
    minp[r * SMP_G + g] = mn;
    if (g == 0) cnt[r] = 0;
  }
}

extern "C" __global__ void __launch_bounds__(SMP_T) smp_stats(const float* __restrict__ logits, int V,
                                                              const double* __restrict__ prm,
                                                              const float* __restrict__ maxp, u64* __restrict__ stats) {
  const int g = blockIdx.x, r = blockIdx.y;
  SmpRow s;
  if (!smp_row(prm, nullptr, nullptr, r, V, s)) return;
  const float m = __fmul_rn(smp_rowmax(maxp, r), s.inv);
  const int S = (V + SMP_G - 1) / SMP_G, lo = g * S, hi = min(lo + S, V);
  const float* x = logits + (size_t)r * V;
  u64 z = 0, c[SMP_NT], ms[SMP_NT];
#pragma unroll
  for (int j = 0; j < SMP_NT; j++) c[j] = ms[j] = 0;
  for (int i = lo + threadIdx.x; i < hi; i += SMP_T) {
    const float d = smp_d(x[i], s.inv, m);
    const u64 M = smp_mass(d);
    z += M;
#pragma unroll
    for (int j = 0; j < SMP_NT; j++)
      if (d >= -SMP_D[j]) { c[j] += 1; ms[j] += M; }
  }
  __shared__ u64 red[SMP_T / 32];
  u64* out = stats + ((size_t)r * SMP_G + g) * SMP_NS;
  z = smp_bsum(z, red);
  if (threadIdx.x == 0) out[0] = z;
#pragma unroll
  for (int j = 0; j < SMP_NT; j++) {
    const u64 cj = smp_bsum(c[j], red), mj = smp_bsum(ms[j], red);
    if (threadIdx.x == 0) { out[1 + j] = cj; out[1 + SMP_NT + j] = mj; }
  }
}

// the row's totals (sum of the G partials) into tot[SMP_NS] (shared); every thread may read them after the call
__device__ __forceinline__ void smp_totals(const u64* stats, int r, u64* tot) {
  for (int t = threadIdx.x; t < SMP_NS; t += blockDim.x) {
    u64 a = 0;
    for (int g = 0; g < SMP_G; g++) a += stats[((size_t)r * SMP_G + g) * SMP_NS + t];
    tot[t] = a;
  }
  __syncthreads();
}

// the smallest prefix C_j (j < NT) that holds every crossing (and, if capped, at most SMP_CAP keys), or -1:
//   top_k on: its k-th is in C_j (count >= k), or C_j has all the mass (the k-th's mass is then 0: Z_k = Z);
//   else, with Z the row's mass: top_p's crossing ceil(P Z / 2^53) within C_j's mass (the draw, below the kept
//   mass, is then too), or without top_p the draw's floor(U Z / 2^53) + 1.
__device__ __forceinline__ int smp_reach(const u64* tot, const SmpRow& s, bool capped) {
  const u64 Z = tot[0];
  if (Z == 0) return -1;
  const u64 need = s.tp ? max(smp_mulshr(s.P, Z, true), 1ull) : smp_mulshr(s.U, Z, false) + 1;
  for (int j = 0; j < SMP_NT; j++) {
    const u64 cj = tot[1 + j], mj = tot[1 + SMP_NT + j];
    if (capped && cj > SMP_CAP) return -1;
    if (s.k ? (cj >= (u64)s.k || mj == Z) : mj >= need) return j;
  }
  return -1;
}
__device__ __forceinline__ int smp_choose(const u64* tot, const SmpRow& s) { return smp_reach(tot, s, true); }

// the histogram's span [dlo, 0]: the first threshold holding every crossing (below -31 every mass is 0, so a mass
// crossing lies above it), raised to the row's least d; sc: bins per unit of d (0 for a constant row: one bin)
__device__ __forceinline__ float smp_hist_lo(const u64* tot, const SmpRow& s, float dmin) {
  const int j = smp_reach(tot, s, false);
  return fmaxf(j >= 0 ? -SMP_D[j] : -31.f, dmin);
}
__device__ __forceinline__ float smp_hist_sc(float dlo) { return dlo < 0.f ? (float)SMP_NB / -dlo : 0.f; }
// d's bin (d in [dlo, 0]); bin 0 holds the largest d: bins follow the canonical order, each a band of it
__device__ __forceinline__ int smp_bin(float d, float sc) { return (int)fminf(__fmul_rn(-d, sc), (float)(SMP_NB - 1)); }

extern "C" __global__ void __launch_bounds__(SMP_T) smp_hist(const float* __restrict__ logits, int V,
                                                             const double* __restrict__ prm,
                                                             const double* __restrict__ u, const int* __restrict__ at,
                                                             const float* __restrict__ maxp,
                                                             const float* __restrict__ minp,
                                                             const u64* __restrict__ stats, u64* __restrict__ hist) {
  const int g = blockIdx.x, r = blockIdx.y;
  SmpRow s;
  if (!smp_row(prm, u, at, r, V, s)) return;
  __shared__ u64 tot[SMP_NS];
  smp_totals(stats, r, tot);
  if (tot[0] == 0 || smp_choose(tot, s) >= 0) return;  // masked, or a prefix fits: nothing to bin
  const float m = __fmul_rn(smp_rowmax(maxp, r), s.inv);
  const float dlo = smp_hist_lo(tot, s, smp_d(smp_rowmin(minp, r), s.inv, m)), sc = smp_hist_sc(dlo);
  __shared__ unsigned hc[SMP_NB];
  __shared__ u64 hm[SMP_NB];
  for (int b = threadIdx.x; b < SMP_NB; b += SMP_T) { hc[b] = 0; hm[b] = 0; }
  __syncthreads();
  const int S = (V + SMP_G - 1) / SMP_G, lo = g * S, hi = min(lo + S, V);
  const float* x = logits + (size_t)r * V;
  for (int i = lo + threadIdx.x; i < hi; i += SMP_T) {
    const float d = smp_d(x[i], s.inv, m);
    if (d >= dlo) {
      const int b = smp_bin(d, sc);
      atomicAdd(hc + b, 1u);
      atomicAdd(hm + b, smp_mass(d));
    }
  }
  __syncthreads();
  u64* h = hist + (size_t)r * 2 * SMP_NB;
  for (int b = threadIdx.x; b < SMP_NB; b += SMP_T)
    if (hc[b]) { atomicAdd(h + b, (u64)hc[b]); atomicAdd(h + SMP_NB + b, hm[b]); }
}

// block-wide exclusive prefix of one u64 per thread (in thread order); red: >= 33 u64 of shared memory
__device__ __forceinline__ u64 smp_bscan(u64 x, u64* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  u64 v = x;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const u64 y = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += y;
  }
  __syncthreads();
  if (lane == 31) red[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    u64 a = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) { const u64 t = red[w]; red[w] = a; a += t; }
  }
  __syncthreads();
  return red[warp] + v - x;
}

// A row's bins that can hold a crossing, from the histogram's exact sums (every thread of a block of SMP_T calls it
// with the same arguments and gets the same answer): the k-th's bin (top_k on and within the bins), the bins top_p's
// crossing can fall in for any Z_k the k-th's bin allows, the bins the draw's can fall in for any kept mass those
// allow; merged into at most SMP_NR ranges of bins [lo, hi] in order, each with the place of its first key among the
// gathered ones (start) and the count / mass of the row's elements before it that are not gathered (offc / offm).
// -> the number of ranges, 0 where a crossing lies past the bins or the ranges hold more than SMP_CAP keys (the
// row-wide search then); *kb: the k-th is binned (else Z_k = Z: the bins hold all the mass).
struct SmpRange {
  int lo, hi;
  u64 start, offc, offm;
};
__device__ int smp_marks(const u64* hist, int r, const u64* tot, const SmpRow& s, SmpRange* rg, bool* kb, u64* red,
                         u64* q) {
  const u64* hc = hist + (size_t)r * 2 * SMP_NB;
  const u64* hm = hc + SMP_NB;
  const int b0 = threadIdx.x * SMP_PB;
  u64 c[SMP_PB], mm[SMP_PB], sc = 0, sm = 0;
#pragma unroll
  for (int i = 0; i < SMP_PB; i++) {
    c[i] = hc[b0 + i];
    mm[i] = hm[b0 + i];
    sc += c[i];
    sm += mm[i];
  }
  const u64 pc = smp_bscan(sc, red), pm = smp_bscan(sm, red + 64);  // before this thread's bins
  const u64 Ct = smp_bsum(sc, red), Mt = smp_bsum(sm, red);
  // the bin where the running count (by_count) or mass first reaches need (1 <= need <= the bins' total)
  auto find = [&](u64 need, bool by_count) -> int {
    __syncthreads();
    u64 a = by_count ? pc : pm;
#pragma unroll
    for (int i = 0; i < SMP_PB; i++) {
      const u64 nx = a + (by_count ? c[i] : mm[i]);
      if (a < need && need <= nx) q[0] = (u64)(b0 + i);
      a = nx;
    }
    __syncthreads();
    return (int)q[0];
  };
  // the count and mass before bin b (b <= SMP_NB) -> q[1], q[2]
  auto before = [&](int b) {
    __syncthreads();
    if (b == SMP_NB) {
      if (threadIdx.x == 0) { q[1] = Ct; q[2] = Mt; }
    } else if (b / SMP_PB == (int)threadIdx.x) {
      u64 a = pc, w = pm;
#pragma unroll
      for (int i = 0; i < SMP_PB; i++)
        if (b0 + i < b) { a += c[i]; w += mm[i]; }
      q[1] = a;
      q[2] = w;
    }
    __syncthreads();
  };
  const u64 Z = tot[0];
  int lo[SMP_NR], hi[SMP_NR], n = 0;
  u64 zlo = Z, zhi = Z;  // Z_k's bounds
  *kb = false;
  if (s.k) {
    if (Ct >= (u64)s.k) {
      const int bk = find((u64)s.k, true);
      lo[n] = hi[n] = bk;
      n++;
      before(bk);
      zlo = q[2];
      before(bk + 1);
      zhi = q[2];
      *kb = true;
    } else if (Mt != Z) {
      return 0;
    }
  }
  u64 klo = zlo, khi = zhi;  // the kept mass's bounds
  if (s.tp) {
    const u64 nlo = max(smp_mulshr(s.P, zlo, true), 1ull), nhi = max(smp_mulshr(s.P, zhi, true), 1ull);
    if (nhi > Mt) return 0;
    lo[n] = find(nlo, false);
    hi[n] = find(nhi, false);
    before(lo[n]);
    klo = q[2];
    before(hi[n] + 1);
    khi = q[2];
    n++;
  }
  const u64 dl = smp_mulshr(s.U, klo, false) + 1, dh = smp_mulshr(s.U, khi, false) + 1;
  if (dh > Mt) return 0;
  lo[n] = find(dl, false);
  hi[n] = find(dh, false);
  n++;
  for (int i = 1; i < n; i++)  // in order of lo, then merged where they touch
    for (int j = i; j > 0 && lo[j] < lo[j - 1]; j--) {
      const int a = lo[j], b = hi[j];
      lo[j] = lo[j - 1]; hi[j] = hi[j - 1];
      lo[j - 1] = a; hi[j - 1] = b;
    }
  int nr = 0;
  for (int i = 0; i < n; i++) {
    if (nr && lo[i] <= rg[nr - 1].hi + 1) {
      if (threadIdx.x == 0) rg[nr - 1].hi = max(rg[nr - 1].hi, hi[i]);
    } else {
      if (threadIdx.x == 0) { rg[nr].lo = lo[i]; rg[nr].hi = hi[i]; }
      nr++;
    }
    __syncthreads();
  }
  u64 gc = 0, gm = 0;  // gathered before the range
  for (int t = 0; t < nr; t++) {
    before(rg[t].lo);
    const u64 c0 = q[1], m0 = q[2];
    before(rg[t].hi + 1);
    const u64 c1 = q[1], m1 = q[2];
    if (threadIdx.x == 0) { rg[t].start = gc; rg[t].offc = c0 - gc; rg[t].offm = m0 - gm; }
    gc += c1 - c0;
    gm += m1 - m0;
  }
  __syncthreads();
  return gc <= SMP_CAP ? nr : 0;
}

extern "C" __global__ void __launch_bounds__(SMP_T) smp_compact(const float* __restrict__ logits, int V,
                                                                const double* __restrict__ prm,
                                                                const double* __restrict__ u,
                                                                const int* __restrict__ at,
                                                                const float* __restrict__ maxp,
                                                                const float* __restrict__ minp,
                                                                const u64* __restrict__ stats,
                                                                const u64* __restrict__ hist, int* __restrict__ cnt,
                                                                u64* __restrict__ cand, u64* __restrict__ rec) {
  const int g = blockIdx.x, r = blockIdx.y;
  SmpRow s;
  if (!smp_row(prm, u, at, r, V, s)) return;
  __shared__ u64 tot[SMP_NS];
  smp_totals(stats, r, tot);
  const int j = smp_choose(tot, s);
  const float m = __fmul_rn(smp_rowmax(maxp, r), s.inv);
  const int S = (V + SMP_G - 1) / SMP_G, lo = g * S, hi = min(lo + S, V);
  const float* x = logits + (size_t)r * V;
  if (j >= 0) {
    const float D = -SMP_D[j];
    for (int i = lo + threadIdx.x; i < hi; i += SMP_T) {
      const float xi = x[i];
      if (smp_d(xi, s.inv, m) >= D) cand[(size_t)r * SMP_CAP + atomicAdd(cnt + r, 1)] = smp_key(xi, i);
    }
    return;
  }
  if (tot[0] == 0) return;
  __shared__ u64 red[128], q[4];
  __shared__ SmpRange rg[SMP_NR];
  __shared__ bool kb;
  const int nr = smp_marks(hist, r, tot, s, rg, &kb, red, q);
  if (g == 0 && threadIdx.x == 0) {
    u64* w = rec + (size_t)r * SMP_RW;
    w[0] = (u64)nr | (kb ? 256ull : 0ull);
    for (int t = 0; t < nr; t++) {
      w[1 + 5 * t] = (u64)rg[t].lo;
      w[2 + 5 * t] = (u64)rg[t].hi;
      w[3 + 5 * t] = rg[t].start;
      w[4 + 5 * t] = rg[t].offc;
      w[5 + 5 * t] = rg[t].offm;
    }
  }
  if (nr == 0) return;
  const float dlo = smp_hist_lo(tot, s, smp_d(smp_rowmin(minp, r), s.inv, m)), sc = smp_hist_sc(dlo);
  for (int i = lo + threadIdx.x; i < hi; i += SMP_T) {
    const float xi = x[i], d = smp_d(xi, s.inv, m);
    if (d >= dlo) {
      const int b = smp_bin(d, sc);
      bool in = false;
      for (int t = 0; t < nr; t++) in |= b >= rg[t].lo && b <= rg[t].hi;
      if (in) {
        const int w = atomicAdd(cnt + r, 1);  // (< SMP_CAP: smp_marks counted these bins; guarded all the same)
        if (w < SMP_CAP) cand[(size_t)r * SMP_CAP + w] = smp_key(xi, i);
      }
    }
  }
}

// --- smp_pick ------------------------------------------------------------------------------------------------------

// sort keys[0, n) descending in shared memory (n <= SMP_CAP; the rest of the padded power of two holds 0)
__device__ void smp_sort(u64* keys, int n) {
  int np = 64;
  while (np < n) np <<= 1;
  for (int i = n + threadIdx.x; i < np; i += SMP_PT) keys[i] = 0;
  __syncthreads();
  for (int k = 2; k <= np; k <<= 1) {
    for (int jj = k >> 1; jj > 0; jj >>= 1) {
      for (int i = threadIdx.x; i < np; i += SMP_PT) {
        const int l = i ^ jj;
        if (l > i) {
          const u64 a = keys[i], b = keys[l];
          const bool desc = (i & k) == 0;  // descending runs end as one descending sequence
          if (desc ? a < b : a > b) { keys[i] = b; keys[l] = a; }
        }
      }
      __syncthreads();
    }
  }
}

struct SmpHit {  // a crossing: its key and the mass through it
  u64 key, mass;
};

struct SmpJump {  // the histogram route: before the gathered key at place `at`, c elements of mass m left out
  u64 at, c, m;
};
__device__ __forceinline__ void smp_jump(const SmpJump* jp, int nj, int i, u64& c, u64& m) {
  c = m = 0;
  for (int t = 0; t < nj; t++)
    if (jp[t].at == (u64)i) { c = jp[t].c; m = jp[t].m; }
}

// over sorted keys[0, n), which follow `base` elements of mass `bmass` in the canonical order (and, before key
// jp[t].at, the jp[t].c elements of mass jp[t].m that were not gathered): the first element at which the count
// (by_count) or the mass through it reaches need -> *hit (its key, the mass through it); the band's last element if
// none does (the choices above make that impossible: every total is exact)
__device__ void smp_scan_band(const u64* keys, int n, u64 base, u64 bmass, u64 need, bool by_count, float inv,
                              float m, u64* red, SmpHit* hit, const SmpJump* jp = nullptr, int nj = 0) {
  const int t0 = threadIdx.x * SMP_PER;
  u64 mm[SMP_PER], sum = 0, csum = 0;
#pragma unroll
  for (int q = 0; q < SMP_PER; q++) {
    const int i = t0 + q;
    u64 jc, jm;
    smp_jump(jp, nj, i, jc, jm);
    mm[q] = i < n ? smp_mass(smp_d(smp_okey_inv((unsigned)(keys[i] >> 32)), inv, m)) : 0;
    sum += mm[q] + jm;
    csum += (i < n ? 1 : 0) + jc;
  }
  u64 mi = bmass + smp_bscan(sum, red), ci = base + smp_bscan(csum, red + 64);
  bool found = false;
  u64 hk = 0, hm = 0, lk = 0, lm = 0;
#pragma unroll
  for (int q = 0; q < SMP_PER; q++) {
    const int i = t0 + q;
    u64 jc, jm;
    smp_jump(jp, nj, i, jc, jm);
    mi += jm;
    ci += jc;
    const u64 prev = by_count ? ci : mi;
    mi += mm[q];
    ci += i < n ? 1 : 0;
    const u64 cur = by_count ? ci : mi;
    if (i < n && !found && cur >= need && prev < need) { found = true; hk = keys[i]; hm = mi; }
    if (i == n - 1) { lk = keys[i]; lm = mi; }
  }
  __syncthreads();
  if (n > 0 && t0 <= n - 1 && n - 1 < t0 + SMP_PER) { hit->key = lk; hit->mass = lm; }
  __syncthreads();
  if (found) { hit->key = hk; hit->mass = hm; }
  __syncthreads();
}

// One pass of the row-wide searches (smp_find in keys, smp_find_d in d): c[t] / ms[t] are this thread's count and
// mass of the bracket's elements at or above threshold th[t] (th[0] the largest: the smallest set). The first
// threshold whose count (by_count) or mass, after the hi_c / hi_m above the bracket, reaches need holds the
// crossing in [th[pick], the threshold before it) -> lo, lo_c; that threshold, or the old upper end where th[0]
// already reaches need, is the new upper end -> hi, top, hi_c, hi_m (none reaching it: still in [lo, th[NT-1])).
template <typename T>
__device__ __forceinline__ void smp_narrow(const u64 (&c)[SMP_NT], const u64 (&ms)[SMP_NT], const T (&th)[SMP_NT],
                                           u64 need, bool by_count, u64* red, T& lo, u64& lo_c, T& hi, bool& top,
                                           u64& hi_c, u64& hi_m) {
  int pick = -1;
  u64 pc = 0, qc = hi_c, qm = hi_m;  // the stat at the chosen threshold; at the one above it
  T prev = hi;
  bool prev_top = top;
  for (int t = 0; t < SMP_NT; t++) {
    const u64 ct = hi_c + smp_bsum(c[t], red), mt = hi_m + smp_bsum(ms[t], red);
    if (pick < 0) {
      if ((by_count ? ct : mt) >= need) {
        pick = t;
        pc = ct;
      } else {
        qc = ct;
        qm = mt;
        prev = th[t];
        prev_top = false;
      }
    }
  }
  if (pick >= 0) {
    lo = th[pick];
    lo_c = pc;
  }
  hi = prev;
  top = prev_top;
  hi_c = qc;
  hi_m = qm;
}

// Slow path: the first element of row x (canonical order) at which the count or the mass through it reaches need,
// by refining key thresholds: [lo, hi) brackets the crossing's key (stat(K >= hi) < need <= stat(K >= lo)); each
// pass counts SMP_NT thresholds inside the bracket, until the bracket holds <= SMP_CAP keys, which are sorted and
// scanned. total_c: the row's count (the bracket K >= 0 is the whole row).
__device__ SmpHit smp_find(const float* x, int V, float inv, float m, u64 need, bool by_count, u64 total_c, u64 kmax, u64* keys, u64* red, SmpHit* hit, int* nsh) {
  u64 lo = 0, hi_c = 0, hi_m = 0, lo_c = total_c;
  bool top = true;  // hi = +infinity (nothing above the bracket)
  u64 hi = kmax;    // (with top: every key <= kmax, so the thresholds sit in (lo, kmax])
  for (int pass = 0; pass < 64; pass++) {
    if (lo_c - hi_c <= SMP_CAP) {  // gather the bracket's keys, sort, scan
      if (threadIdx.x == 0) *nsh = 0;
      __syncthreads();
      for (int i = threadIdx.x; i < V; i += SMP_PT) {
        const u64 K = smp_key(x[i], i);
        if (K >= lo && (top || K < hi)) keys[atomicAdd(nsh, 1)] = K;
      }
      __syncthreads();
      const int n = *nsh;
      smp_sort(keys, n);
      smp_scan_band(keys, n, hi_c, hi_m, need, by_count, inv, m, red, hit);
      return *hit;
    }
    // SMP_NT thresholds evenly inside the bracket: th[j] = lo + (span / (NT + 1)) * (NT - j), the sets growing with j
    const u64 span = top ? kmax - lo : hi - lo;
    u64 th[SMP_NT], c[SMP_NT], ms[SMP_NT];
#pragma unroll
    for (int j = 0; j < SMP_NT; j++) {
      th[j] = lo + (span / (SMP_NT + 1)) * (SMP_NT - j);  // th[0] largest: the smallest set
      c[j] = ms[j] = 0;
    }
    for (int i = threadIdx.x; i < V; i += SMP_PT) {
      const float xi = x[i];
      const u64 K = smp_key(xi, i);
      if (K < lo || (!top && K >= hi)) continue;
      const u64 M = smp_mass(smp_d(xi, inv, m));  // (a count search too: the mass through its k-th is Z_k)
#pragma unroll
      for (int j = 0; j < SMP_NT; j++)
        if (K >= th[j]) { c[j] += 1; ms[j] += M; }
    }
    smp_narrow(c, ms, th, need, by_count, red, lo, lo_c, hi, top, hi_c, hi_m);
    __syncthreads();
  }
  return *hit;  // (not reached: each pass narrows the bracket's key span (NT + 1)-fold)
}

// The row-wide search, first in d (d = x * inv - m, the thresholds' own measure): the first element at which the
// count (by_count) or the mass through it reaches need, starting from the bracket smp_stats' totals give
// (tot: d >= -D_j's counts and masses), each pass splitting the bracket [dlo, dhi) at SMP_NT evenly spaced d
// thresholds (every {d >= t} is a prefix of the canonical order), until it holds <= SMP_CAP keys, which are sorted
// and scanned. A flat row's bracket shrinks ~(NT + 1)-fold a pass (the key-space search above took one pass per
// ~3 bits of a 64-bit key). Where d cannot split the bracket (keys sharing one d) or a count search's k-th lies
// below every threshold, the key-space search (smp_find) finishes it.
__device__ SmpHit smp_find_d(const float* x, int V, float inv, float m, u64 need, bool by_count, const u64* tot,
                             u64 kmax, u64* keys, u64* red, SmpHit* hit, int* nsh) {
  int j = 0;
  while (j < SMP_NT && (by_count ? tot[1 + j] : tot[1 + SMP_NT + j]) < need) j++;
  if (j == SMP_NT && by_count) return smp_find(x, V, inv, m, need, true, (u64)V, kmax, keys, red, hit, nsh);
  bool top = j == 0;  // no upper bound: the bracket starts at the row's first element
  float dhi = top ? 0.f : -SMP_D[j - 1];
  // below -31, expf(d) * 2^44 < 1: mass 0, so a mass search's crossing (an element of mass > 0) lies above it
  float dlo = j < SMP_NT ? -SMP_D[j] : -31.f;
  u64 hi_c = top ? 0 : tot[j], hi_m = top ? 0 : tot[SMP_NT + j];
  u64 lo_c = j < SMP_NT ? tot[1 + j] : (u64)V + 1;  // (unknown below the last threshold: the first pass counts it)
  for (int pass = 0; pass < 48; pass++) {
    if (lo_c - hi_c <= SMP_CAP) {  // gather the bracket's keys, sort, scan
      if (threadIdx.x == 0) *nsh = 0;
      __syncthreads();
      for (int i = threadIdx.x; i < V; i += SMP_PT) {
        const float xi = x[i], d = smp_d(xi, inv, m);
        if (d >= dlo && (top || d < dhi)) keys[atomicAdd(nsh, 1)] = smp_key(xi, i);
      }
      __syncthreads();
      const int n = *nsh;
      smp_sort(keys, n);
      smp_scan_band(keys, n, hi_c, hi_m, need, by_count, inv, m, red, hit);
      return *hit;
    }
    float th[SMP_NT];
    u64 c[SMP_NT], ms[SMP_NT], band = 0;
#pragma unroll
    for (int t = 0; t < SMP_NT; t++) {
      th[t] = dlo + (dhi - dlo) * (float)(SMP_NT - t) / (float)(SMP_NT + 1);  // th[0] largest: the smallest set
      c[t] = ms[t] = 0;
    }
    for (int i = threadIdx.x; i < V; i += SMP_PT) {
      const float d = smp_d(x[i], inv, m);
      if (!(d >= dlo) || (!top && d >= dhi)) continue;
      band += 1;
      const u64 M = smp_mass(d);
#pragma unroll
      for (int t = 0; t < SMP_NT; t++)
        if (d >= th[t]) { c[t] += 1; ms[t] += M; }
    }
    const u64 old_band = lo_c - hi_c;
    lo_c = hi_c + smp_bsum(band, red);
    smp_narrow(c, ms, th, need, by_count, red, dlo, lo_c, dhi, top, hi_c, hi_m);
    if (lo_c - hi_c >= old_band && lo_c - hi_c > SMP_CAP) break;  // d no longer splits the bracket
  }
  return smp_find(x, V, inv, m, need, by_count, (u64)V, kmax, keys, red, hit, nsh);
}

extern "C" __global__ void __launch_bounds__(SMP_PT) smp_pick(const float* __restrict__ logits, int V,
                                                              const double* __restrict__ prm,
                                                              const double* __restrict__ u,
                                                              const int* __restrict__ at,
                                                              const float* __restrict__ maxp,
                                                              const u64* __restrict__ stats,
                                                              const int* __restrict__ cnt,
                                                              const u64* __restrict__ cand,
                                                              const u64* __restrict__ rec,
                                                              long long* __restrict__ keys_out) {
  const int r = blockIdx.x;
  SmpRow s;
  if (!smp_row(prm, u, at, r, V, s)) return;
  __shared__ u64 keys[SMP_CAP];
  __shared__ u64 red[128];
  __shared__ u64 tot[SMP_NS];
  __shared__ SmpHit hit;
  __shared__ SmpJump jp[SMP_NR];
  __shared__ int nsh;
  smp_totals(stats, r, tot);
  const float mx = smp_rowmax(maxp, r), m = __fmul_rn(mx, s.inv);
  const float* x = logits + (size_t)r * V;
  const u64 Z = tot[0];
  const int j = smp_choose(tot, s);
  u64 pick;
  if (Z == 0) {  // nothing has mass (every logit -inf or NaN): the first key of the canonical order
    u64 best = 0;
    for (int i = threadIdx.x; i < V; i += SMP_PT) best = max(best, smp_key(x[i], i));
#pragma unroll
    for (int o = 16; o; o >>= 1) best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 0; w < SMP_PT / 32; w++) best = max(best, red[w]);
      keys_out[r] = (long long)(best & 0xFFFFFFFFull);
    }
    return;
  }
  const u64 route = j >= 0 ? 0 : rec[(size_t)r * SMP_RW];
  const int nj = min((int)(route & 255), SMP_NR);
  if (j >= 0 || nj > 0) {  // the gathered keys (a prefix C_j, or the histogram's ranges), sorted
    const int n = min(cnt[r], SMP_CAP);
    for (int i = threadIdx.x; i < n; i += SMP_PT) keys[i] = cand[(size_t)r * SMP_CAP + i];
    if (threadIdx.x < nj) {  // the ranges' offsets as jumps between them
      const u64* w = rec + (size_t)r * SMP_RW + 1 + 5 * threadIdx.x;
      const u64 pc = threadIdx.x ? w[-2] : 0, pm = threadIdx.x ? w[-1] : 0;
      jp[threadIdx.x] = SmpJump{w[2], w[3] - pc, w[4] - pm};
    }
    __syncthreads();
    smp_sort(keys, n);
    u64 Zk = Z;
    if (s.k && (j >= 0 ? n >= s.k : (route & 256) != 0)) {  // the k-th's mass-through: the top_k total
      smp_scan_band(keys, n, 0, 0, (u64)s.k, true, s.inv, m, red, &hit, jp, nj);
      Zk = hit.mass;
    }
    u64 kept = Zk;
    if (s.tp) {
      smp_scan_band(keys, n, 0, 0, max(smp_mulshr(s.P, Zk, true), 1ull), false, s.inv, m, red, &hit, jp, nj);
      kept = hit.mass;
    }
    smp_scan_band(keys, n, 0, 0, smp_mulshr(s.U, kept, false) + 1, false, s.inv, m, red, &hit, jp, nj);
    pick = hit.key;
  } else {  // the slow path: each crossing found over the whole row
    const u64 kmax = ((u64)smp_okey(mx) << 32) | 0xFFFFFFFFull;
    u64 Zk = Z;
    if (s.k) Zk = smp_find_d(x, V, s.inv, m, (u64)s.k, true, tot, kmax, keys, red, &hit, &nsh).mass;
    u64 kept = Zk;
    if (s.tp) kept = smp_find_d(x, V, s.inv, m, max(smp_mulshr(s.P, Zk, true), 1ull), false, tot, kmax, keys, red,
                                &hit, &nsh).mass;
    pick = smp_find_d(x, V, s.inv, m, smp_mulshr(s.U, kept, false) + 1, false, tot, kmax, keys, red, &hit,
                      &nsh).key;
  }
  if (threadIdx.x == 0) keys_out[r] = (long long)(pick & 0xFFFFFFFFull);
}
