// Int8 activations for the batch-1 decode GEMV (llama.cpp's numerics for this case, Q8_1: x quantized per block of
// 32, integer dot products on dp4a): the pieces that decode_gemv.cu's q8 kernels (gemv_w4q8_*, EngineConfig.decode_q8)
// and the probe (decode_q8.cu) share. References: kernels/q8_reference.py. Compiled after decode_common.cu.
//
// x of one token as the GEMV reads it: xq int8, each run of 8 k stored as k 0 2 4 6 1 3 5 7, so that a code word's
// w & 0x0F0F0F0F (bytes = the codes of k 0, 2, 4, 6) and w & 0xF0F0F0F0 (16 x the codes of k 1, 3, 5, 7) meet their
// x bytes in one 32-bit word each; per block of 32: dx = amax / 127, xq = rint(x * (1 / dx)), sx = dx * sum(xq).
//   y[n] = sum over blocks b of s[n, b / 4] * (dx[b] * I[n, b]) + m[n, b / 4] * sx[b],  I = sum_k q[n, k] xq[k] (int32)
//   (weights in groups of 128; in groups of 32, s[n, b] and m[n, b])

__device__ __forceinline__ int dp4a_us(u32 a, u32 b, int c) {  // c + sum of 4 (unsigned byte of a) x (signed byte of b)
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// sum over a lane's 32 k of q * xq: w = its 4 code words (word i: k 8i..8i+7, nibble j = k 8i + j), x0 / x1 its 32
// x bytes (word 2i: the even k of code word i, 2i + 1: the odd ones). The odd codes stay at bits 4..7 (16 q): one
// shift of the sum instead of one per word.
__device__ __forceinline__ int q8_dot(uint4 w, uint4 x0, uint4 x1) {
  int lo = dp4a_us(w.x & 0x0F0F0F0Fu, x0.x, 0), hi = dp4a_us(w.x & 0xF0F0F0F0u, x0.y, 0);
  lo = dp4a_us(w.y & 0x0F0F0F0Fu, x0.z, lo); hi = dp4a_us(w.y & 0xF0F0F0F0u, x0.w, hi);
  lo = dp4a_us(w.z & 0x0F0F0F0Fu, x1.x, lo); hi = dp4a_us(w.z & 0xF0F0F0F0u, x1.y, hi);
  lo = dp4a_us(w.w & 0x0F0F0F0Fu, x1.z, lo); hi = dp4a_us(w.w & 0xF0F0F0F0u, x1.w, hi);
  return lo + (hi >> 4);  // hi is 16 x an integer: the shift is exact
}

// The K loop (decode_gemv.cu's two-stage register pipeline): groups grp, grp + KS, ... of G; the first two groups'
// weights loaded before wait() (independent of the previous kernel), then the x of each group (load_x is called in
// the groups' order, which the q8 GEMV's shared-memory slots rely on).
template <class F, class LW, class LX, class C, class W>
__device__ __forceinline__ void q8_pipeline(F& fa, F& fb, int grp, int G, int KS, bool live, LW load_w, LX load_x,
                                            C compute, W wait) {
  if (live && grp < G) load_w(fa, grp);
  if (live && grp + KS < G) load_w(fb, grp + KS);
  wait();
  if (!live) return;
  if (grp < G) load_x(fa, grp);
  if (grp + KS < G) load_x(fb, grp + KS);
  for (; grp < G; grp += 2 * KS) {
    compute(fa);
    if (grp + 2 * KS < G) { load_w(fa, grp + 2 * KS); load_x(fa, grp + 2 * KS); }
    if (grp + KS >= G) break;
    compute(fb);
    if (grp + 3 * KS < G) { load_w(fb, grp + 3 * KS); load_x(fb, grp + 3 * KS); }
  }
}

// One lane's 8 consecutive x values of a block of 32 (the block's 4 lanes consecutive in the warp; every lane of the
// warp calls it: shuffles over the quads) -> its 8 xq bytes in q8 order (q.x the even k, q.y the odd), and the
// block's dx and sx. Each fp32 operation rounded once, as q8_reference.quant_x_q8_ref.
__device__ __forceinline__ void q8_quant8(uint4 v, uint2& q, float& d, float& s) {
  const u32 wv[4] = {v.x, v.y, v.z, v.w};
  float f[8];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    f[2 * i] = h2f((h16)(wv[i] & 0xFFFFu));
    f[2 * i + 1] = h2f((h16)(wv[i] >> 16));
  }
  float a = 0.f;
#pragma unroll
  for (int i = 0; i < 8; i++) a = fmaxf(a, fabsf(f[i]));
  a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 1));
  a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 2));
  d = __fdiv_rn(a, 127.f);
  const float id = d > 0.f ? __frcp_rn(d) : 0.f;
  int qi[8], sum = 0;
#pragma unroll
  for (int i = 0; i < 8; i++) {
    qi[i] = __float2int_rn(__fmul_rn(f[i], id));  // |x| <= amax: |q| <= 127
    sum += qi[i];
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  q.x = (u32)(qi[0] & 0xFF) | (u32)(qi[2] & 0xFF) << 8 | (u32)(qi[4] & 0xFF) << 16 | (u32)qi[6] << 24;
  q.y = (u32)(qi[1] & 0xFF) | (u32)(qi[3] & 0xFF) << 8 | (u32)(qi[5] & 0xFF) << 16 | (u32)qi[7] << 24;
  s = __fmul_rn(d, (float)sum);  // |sum| <= 32 x 127: exact in fp32
}

// The q8 GEMV's x in shared memory: the groups one block reads (decode_gemv.cu's plan: group grp goes to K slice
// grp % KS, KS = KSB x KSW; this block's slices are by KSW .. by KSW + KSW - 1), slot s = i KSW + k holding group
// i KS + by KSW + k: 128 xq bytes and 4 (dx, sx) per slot. A warp's groups grp0, grp0 + KS, ... are its slots
// k, k + KSW, ... (k = its slice in the block). The launch sizes them (kernels/q8_plan.py slot_bytes: 160 bytes a
// slot and token, in dynamic shared memory).
__host__ __device__ __forceinline__ int q8_slots(int G, int KS, int KSW, int by) {
  const int first = by * KSW;
  return first < G ? ((G - first + KS - 1) / KS) * KSW : 0;
}
// x fp16 of one token -> the block's slots (xs, ds), by all its threads (whole warps: the quads' shuffles)
__device__ __forceinline__ void q8_quant_cta(const h16* __restrict__ x, int G, int KS, int KSW, int by,
                                             signed char* xs, float2* ds) {
  const int n = q8_slots(G, KS, KSW, by) * 16, lane = threadIdx.x & 31;  // 16 lanes of 8 values per slot
  const int kw = __popc(KSW - 1);  // KSW is a power of two (q8_plan): s / KSW and s % KSW as a shift and a mask
  for (int base = threadIdx.x & ~31; base < n; base += blockDim.x) {
    const int tau = base + lane, s = tau >> 4, part = tau & 15;
    const int grp = (s >> kw) * KS + by * KSW + (s & (KSW - 1));
    const bool ok = tau < n && grp < G;  // a quad is all in or all out (n and 16 are multiples of 4)
    const uint4 v = ok ? __ldg(reinterpret_cast<const uint4*>(x + (u32)grp * 128u + (u32)part * 8u))
                       : make_uint4(0u, 0u, 0u, 0u);
    uint2 q;
    float d, sm;
    q8_quant8(v, q, d, sm);
    if (tau < n) {
      *reinterpret_cast<uint2*>(xs + s * 128 + part * 8) = q;
      if ((lane & 3) == 0) ds[s * 4 + (part >> 2)] = make_float2(d, sm);
    }
  }
}
