// The decode kernels' divisions without the IEEE slow path (decode_common.cu silu_d, norm_div, att_rcp, att_div)
// against the plain expressions they replace, input by input (kernels/div_check.py runs them; compiled after
// decode_common.cu with DECODE_DIV_FAST=7). Each kernel walks its inputs grid-stride from index i0 and counts into
// cnt[4 k ..]: [0] inputs, [1] fp32 results whose bits differ where they must not, [2] fp16 results that differ, [3]
// fp32 differences allowed (both below 2^-100 with one sign, or an input outside the claimed domain); first[k] holds
// the least index of a [1] / [2] mismatch (~0 for none).

__device__ __forceinline__ bool same_bits(float a, float b) { return __float_as_uint(a) == __float_as_uint(b); }
__device__ __forceinline__ bool tiny_alike(float a, float b) {
  return fabsf(a) < 0x1p-100f && fabsf(b) < 0x1p-100f && signbit(a) == signbit(b);
}
__device__ __forceinline__ void miss(unsigned long long* cnt, unsigned long long* first, int k, int slot,
                                     unsigned long long i) {
  atomicAdd(cnt + 4 * k + slot, 1ull);
  if (slot != 3) atomicMin(first + k, i);
}

// body(i) for i in [i0, i0 + n) grid-stride; it returns whether input i counts (false: skipped, e.g. a NaN)
template <class F>
__device__ __forceinline__ void walk(unsigned long long i0, unsigned long long n, unsigned long long* cnt, int k,
                                     F body) {
  unsigned long long seen = 0;
  for (unsigned long long i = i0 + blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < i0 + n;
       i += (unsigned long long)gridDim.x * blockDim.x)
    seen += body(i) ? 1 : 0;
  atomicAdd(cnt + 4 * k, seen);
}

// silu: g = every finite fp32 pattern: silu_f(g) vs g / (1 + __expf(-g)) (the gate_up epilogue before), and the fp16
// of silu * up for up in ups[0 .. nup). (g = +-inf differ: inf gives NaN, -inf -0; a GEMV's fp32 sums of fp16
// products times a finite scale are finite.)
extern "C" __global__ void chk_silu(unsigned long long i0, unsigned long long n, const float* ups, int nup,
                                    unsigned long long* cnt, unsigned long long* first, int k) {
  walk(i0, n, cnt, k, [&](unsigned long long i) {
    const float g = __uint_as_float((u32)i);
    if (!isfinite(g)) return false;
    const float ref = g / (1.f + __expf(-g)), got = silu_d(g);
    if (!same_bits(ref, got)) miss(cnt, first, k, tiny_alike(ref, got) ? 3 : 1, i);
    for (int u = 0; u < nup; u++)
      if (f2h(ref * ups[u]) != f2h(got * ups[u])) { miss(cnt, first, k, 2, i); break; }
    return true;
  });
}

// the deferred norm's mean square: x / D for x = v * 2^-20 (v an int64 sum of squares: 0 or [2^-20, 2^43]) and
// D = ds[blockIdx.y] (div_check.py: every multiple of 64 up to 8192, where every hidden size lies); i walks x's
// patterns from 2^-20 up
extern "C" __global__ void chk_rstd(unsigned long long i0, unsigned long long n, const float* ds,
                                    unsigned long long* cnt, unsigned long long* first, int k) {
  const float D = ds[blockIdx.y];
  walk(i0, n, cnt, k, [&](unsigned long long i) {
    const float x = i == 0 ? 0.f : __uint_as_float(0x35800000u + (u32)(i - 1));  // 0, then 2^-20 up
    if (!same_bits(x / D, norm_div(x, D))) miss(cnt, first, k, 1, i);
    return true;
  });
}

// the consumer's scale rstd(hi) / (rstd(lo) / 16): a, b drawn from i by a hash, both in [2^-24, 2^12) (rstd of a
// mean square in [2^-20 / 8192 + eps, 2^37] is in [2^-18.5, 1000], times 1/16 for b)
__device__ __forceinline__ u32 mix32(unsigned long long x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
  return (u32)x;
}
extern "C" __global__ void chk_ratio(unsigned long long i0, unsigned long long n, unsigned long long* cnt,
                                     unsigned long long* first, int k) {
  walk(i0, n, cnt, k, [&](unsigned long long i) {
    const float a = __uint_as_float(((103u + mix32(4 * i) % 36u) << 23) | (mix32(4 * i + 1) & 0x7fffffu));
    const float b = __uint_as_float(((103u + mix32(4 * i + 2) % 36u) << 23) | (mix32(4 * i + 3) & 0x7fffffu));
    if (!same_bits(a / b, norm_div(a, b))) miss(cnt, first, k, 1, i);
    return true;
  });
}

// the attention's 1 / den: d = every fp32 pattern; a difference counts as a miss where |d| is in [2^-126, 2^126)
// (exponent field 1 .. 252), as allowed elsewhere
extern "C" __global__ void chk_rcp(unsigned long long i0, unsigned long long n, unsigned long long* cnt,
                                   unsigned long long* first, int k) {
  walk(i0, n, cnt, k, [&](unsigned long long i) {
    const float d = __uint_as_float((u32)i);
    if (isnan(d)) return false;
    const u32 e = ((u32)i >> 23) & 255u;
    if (!same_bits(1.f / d, att_rcp(d))) miss(cnt, first, k, e >= 1u && e <= 252u ? 1 : 3, i);
    return true;
  });
}

// the attention's single-split output f2h(o / den): o = every finite fp32 pattern, den = dens[blockIdx.y] (>= 1);
// fp16 results must match everywhere, fp32 quotients unless both are below 2^-100 (where the fast path's quotient of a
// tiny o may differ in its last bits: fp16 keeps none of them)
extern "C" __global__ void chk_attn(unsigned long long i0, unsigned long long n, const float* dens,
                                    unsigned long long* cnt, unsigned long long* first, int k) {
  const float den = dens[blockIdx.y];
  walk(i0, n, cnt, k, [&](unsigned long long i) {
    const float o = __uint_as_float((u32)i);
    if (!isfinite(o)) return false;
    const float ref = o / den, got = att_div(o, den);
    if (f2h(ref) != f2h(got)) miss(cnt, first, k, 2, i);
    else if (!same_bits(ref, got)) miss(cnt, first, k, tiny_alike(ref, got) ? 3 : 1, i);
    return true;
  });
}
