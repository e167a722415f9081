// W4A16 / W3A16 GEMV for 1..8 tokens on the tensor cores (mma.sync m16n8k16, sm_80+; no Hopper-only code).
// Reference: kernels/decode_reference.py gemv_ref. Layout: engine/quant/pack.py (group 128 along K).
//
// y[b, n] = sum_k x[b, k] * (q[n, k] * s[n, k/GS] + m[n, k/GS])      GS = group size: 128, 32 or 16
//
// Bits x group: (4, 128) and (3, 128) (our checkpoints), (4, 32) and (8, 32) / (8, 16) (GGUF K-quants and Q8_0
// repacked exactly, engine/formats/gguf_kquant.py), (6, 32) / (6, 16) (the 5- and 6-bit types as 6-bit codes), and
// the KQ forms of (4, 32) / (6, 32) / (6, 16) (the K-quants' integer sub-scales, kq_scales) and the SYM forms of
// (4, 32) / (6, 32) / (8, 32) (Q4_0 / Q5_0 / Q8_0: one fp16 scale per 32, the min made from it). The K loop steps
// over blocks of 128 in every case.
//
// One warp owns MT tiles of 16 rows and a share of the groups (KSW warps of a block split K).
// Lane (g = lane/4, t = lane%4) loads, per group, 32 codes of rows g and g+8 (one 16-byte load each for
// W4; 12 bytes each for W3, as one 16-byte and one 8-byte load for both rows) and x[token g][32 t .. 32 t + 31].
// Codes become fp16 (off + q) with one LOP3 per pair (OR'ed into the exponent of a power of two whose mantissa
// ulp is the code's unit: 0x6400 = 1024 for bits 0..3, 0x5400 = 64 for bits 4..7, ...: exact, and most pairs need
// no shift), and x pairs are built with PRMT so that the k order inside the mma is a permutation shared by A and B
// (a dot product does not care about the order). Per group:
//   C = sum_k (off_k + q) x (fp32 in the mma), S = sum_k x and T = sum_k off_k x (one mma: A = ones in rows
//   0..7, the offsets in rows 8..15), and  y += s * (C - T) + m * S   (fp32).
// With GS < 128 a lane's 32 codes of a block are one group of 32 (or two of 16), but an mma sums k across the
// 4 lanes of a quad, so each lane dequantizes its own A pairs to fp16 first (sub.f16x2 + fma.f16x2:
// w = q * s + m, one rounding to fp16) and the mma accumulates sum_k w x straight into fp32.
// Tokens >= B are computed on whatever the rows of x hold and never stored (mma columns are independent).


#define MAGIC 0x64006400u
#define ONES 0x3C003C00u

// ---- code pairs ------------------------------------------------------------------------------------
// (a & mask) | c in ONE lop3: written in C, ptxas splits (a & mask) | MAGIC into an AND and an OR (a LOP3 takes one
// immediate), which made the W4 code pairs cost 2.75 instructions each instead of 1.75 (SASS of gemv_w4_silu).
#ifndef GEMV_LOP3
#define GEMV_LOP3 1  // 0: the C expression (two instructions; timing comparisons only, same bits; for W4 only
                     // with GEMV_UNPACK2=0, whose unpack is the one that goes through and_or_magic)
#endif
__device__ __forceinline__ u32 and_or(u32 a, u32 mask, u32 c) {
  u32 d;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(d) : "r"(a), "r"(mask), "r"(c));  // 0xea: (a & b) | c
  return d;
}
__device__ __forceinline__ u32 and_or_magic(u32 a, u32 mask) {
#if GEMV_LOP3
  return and_or(a, mask, MAGIC);
#else
  return (a & mask) | MAGIC;
#endif
}
// W4: word w of a lane's chunk covers k = 8w..8w+7; pair p = 4w + j is (k = 8w + j, 8w + j + 4).
// GEMV_UNPACK2 (default): a byte's high nibble needs no shift: OR'ed into 0x5400 (= 64, whose mantissa ulp is 1/16)
// bits 4..7 read as 64 + q exactly. So per word (v = w for j = 0, 1 and w >> 8 for j = 2, 3): even j is
// v & 0x000F000F | 0x6400 (1024 + q), odd j is v & 0x00F000F0 | 0x5400 (64 + q): 4 LOP3 + 1 SHF per 4 pairs (1.25
// per pair, was 1.75). Even pairs sit in k 0..7 of every mma (A regs a0, a1), odd pairs in k 8..15 (a2, a3), so the offsets'
// sum T = sum_k off_k x_k is one more row of the ones-mma (compute_frag). 0: every pair 1024 + q (timing).
#ifndef GEMV_UNPACK2
#define GEMV_UNPACK2 1
#endif
#define MAGIC64 0x54005400u
__device__ __forceinline__ u32 w4_pair(const u32* wd, int p) {
#if GEMV_UNPACK2
  const u32 w = (p & 2) ? wd[p >> 2] >> 8 : wd[p >> 2];
  return (p & 1) ? and_or(w, 0x00F000F0u, MAGIC64) : and_or(w, 0x000F000Fu, MAGIC);
#else
  return and_or_magic(wd[p >> 2] >> (4 * (p & 3)), 0x000F000Fu);
#endif
}
// the fp16 offset pair that w4_pair(., p) adds to the codes
__host__ __device__ constexpr u32 w4_off(int p) { return (GEMV_UNPACK2 && (p & 1)) ? MAGIC64 : MAGIC; }
// x pairs for W4 from 4 uint4 (8 halves each): pair p = (8w + j, 8w + j + 4), w = p/4, j = p%4
__device__ __forceinline__ u32 w4_xpair(const uint4* X, int p) {
  const uint4 v = X[p >> 2];
  const int j = p & 3;
  const u32 lo = (j < 2) ? v.x : v.y, hi = (j < 2) ? v.z : v.w;
  return __byte_perm(lo, hi, (j & 1) ? 0x7632 : 0x5410);
}
// W3 (kernels/pack.py): 3 words of a 32-k block; pair p (0..15) is (k = p, p + 16). Pairs 0..14 sit in
// 3-bit slots j = p % 5 (bits 3j..3j+2) of the two halves of word p / 5; pair 15's three bits are bit 15 / 31
// of the three words (3 shifts + 3 LOP3s). GEMV_UNPACK2 = 0: every slot shifted down and OR'ed into 0x6400 (one
// shift + one LOP3, as W4; 33 instructions per 16 pairs; the 2+1-bit split of layout 1 took ~70).
// GEMV_UNPACK2 (default): a slot at bits 3..5 OR'ed into 0x5800 (128, mantissa ulp 1/8) reads 128 + q, so
//   slot 0: w & 7 | 0x6400 (1024 + q)      slot 1: w & 0x38 | 0x5800 (128 + q)
//   slot 3: (w >> 9) & 7 | 0x6400          slot 4: (w >> 9) & 0x38 | 0x5800
//   slot 2: (w >> 3) & 0x38 | 0x5800 in words 0 and 1, (w >> 6) & 7 | 0x6400 in word 2
// (27 instructions per 16 pairs), which gives 8 pairs of offset 1024 and 8 of offset 128. The mmas pair them up
// (w3_lo / w3_hi: k 0..7 of mma i from an offset-1024 pair, k 8..15 from an offset-128 one), so the offsets' sum T
// is one constant row of the ones-mma, as W4's 1024 / 64 (compute_frag).
__device__ __forceinline__ u32 w3_pair(u32 w0, u32 w1, u32 w2, int p) {
  if (p < 15) {
    const u32 w = p < 5 ? w0 : p < 10 ? w1 : w2;
#if GEMV_UNPACK2
    const int j = p % 5;
    if (j == 2) return p < 10 ? and_or(w >> 3, 0x00380038u, 0x58005800u) : and_or(w >> 6, 0x00070007u, MAGIC);
    const u32 v = j >= 3 ? w >> 9 : w;
    return (j == 0 || j == 3) ? and_or(v, 0x00070007u, MAGIC) : and_or(v, 0x00380038u, 0x58005800u);
#else
    return and_or_magic(w >> (3 * (p % 5)), 0x00070007u);
#endif
  }
  const u32 b0 = and_or_magic(w0 >> 15, 0x00010001u);
  const u32 b1 = and_or(w1 >> 14, 0x00020002u, b0);
  return and_or(w2 >> 13, 0x00040004u, b1);
}
// the pairs of mma i: k 0..7 from pair w3_lo(i) (offset 1024), k 8..15 from w3_hi(i) (offset 128, GEMV_UNPACK2)
__host__ __device__ constexpr int w3_lo(int i) {
  constexpr int lo[8] = {0, 3, 5, 8, 10, 13, 12, 15};
  return GEMV_UNPACK2 ? lo[i] : 2 * i;
}
__host__ __device__ constexpr int w3_hi(int i) {
  constexpr int hi[8] = {1, 4, 6, 9, 11, 14, 2, 7};
  return GEMV_UNPACK2 ? hi[i] : 2 * i + 1;
}
#define W3_OFF_HI 0x58005800u  // the offset of every w3_hi pair (GEMV_UNPACK2)
__device__ __forceinline__ u32 w3_xpair(const uint4* X, int p) {
  // pair p: x[p] and x[p + 16]; X[0] = k 0..7, X[1] = 8..15, X[2] = 16..23, X[3] = 24..31
  const uint4 a = X[p >> 3], c = X[2 + (p >> 3)];
  const int wi = (p & 7) >> 1;
  const u32 lo = wi == 0 ? a.x : wi == 1 ? a.y : wi == 2 ? a.z : a.w;
  const u32 hi = wi == 0 ? c.x : wi == 1 ? c.y : wi == 2 ? c.z : c.w;
  return __byte_perm(lo, hi, (p & 1) ? 0x7632 : 0x5410);
}

// W8: word w covers k = 4w..4w+3 (one byte each); pair p = 2w + j is (k = 4w + j, 4w + j + 2).
__device__ __forceinline__ u32 w8_pair(const u32* wd, int p) {
  return and_or_magic(wd[p >> 1] >> (8 * (p & 1)), 0x00FF00FFu);
}
__device__ __forceinline__ u32 w8_xpair(const uint4* X, int p) {
  const int w = p >> 1;
  const uint4 v = X[w >> 1];
  const u32 lo = (w & 1) ? v.z : v.x, hi = (w & 1) ? v.w : v.y;
  return __byte_perm(lo, hi, (p & 1) ? 0x7632 : 0x5410);
}
// W6 (kernels/pack.py): words 0..3 of a lane's six are its nibbles as W4, words 4, 5 the high two bits of its pairs
// 0..7 / 8..15, pair p's at slot l / 2 + 4 (l % 2) (l = p % 8: bits 2 slot and 16 + 2 slot). W4's unpack leaves the
// nibble at bits 0..3 of 1024 + q (even p) or 4..7 of 64 + q / 16 (odd p): the high bits go to bits 4..5 (weight
// 16) or 8..9 (weight 16 at ulp 1/16), one shift and one LOP3, so the pair reads off + q6 with W4's offsets.
__device__ __forceinline__ u32 w6_pair(const u32* wd, int p) {
  const u32 lo = w4_pair(wd, p), h = wd[4 + (p >> 3)];
  const int l = p & 7;
  if (l & 1) {
    const int sh = 2 * (l >> 1);  // slots 4..7 (bits 8..15) -> bits 8..9
    return and_or(h >> sh, 0x03000300u, lo);
  }
  const int sh = 2 * (l >> 1) - 4;  // slots 0..3 (bits 0..7) -> bits 4..5
  return and_or(sh >= 0 ? h >> sh : h << -sh, 0x00300030u, lo);
}
// (1024 + q) pair -> fp16 pair q * s + m (s2, m2: the same half in both lanes of the pair)
#ifndef GEMV_DEQ1
#define GEMV_DEQ1 0  // 1: timing only, wrong values: one fma on (1024 + q), no sub (what an integer-scale layout costs)
#endif
__device__ __forceinline__ u32 deq_pair(u32 c, u32 s2, u32 m2, u32 off = MAGIC) {  // off: the pair's offset
  u32 q = c, w;
#if !GEMV_DEQ1
  asm("sub.f16x2 %0, %1, %2;" : "=r"(q) : "r"(c), "r"(off));
#endif
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(w) : "r"(q), "r"(s2), "r"(m2));
  return w;
}
__device__ __forceinline__ u32 bcast(h16 h) { return (u32)h | ((u32)h << 16); }

// ---- one group's data for one lane --------------------------------------------------------------------
#define WORDS(BITS) ((BITS) == 8 ? 8 : (BITS) == 6 ? 6 : (BITS) == 4 ? 4 : 3)  // words per lane per block of 128
#define SUBS(GS) ((GS) == 16 ? 2 : 1)                           // groups per lane per block (GS < 128)

template <int BITS, int MT, int GS>
struct Frag {
  u32 w[MT][2][WORDS(BITS)];  // [tile][row g / g+8][words]
  h16 s[MT][2][SUBS(GS)], m[MT][2][SUBS(GS)];
  uint4 x[4] = {};  // zeros: lanes of tokens >= B never load theirs (load_x)
};

// GEMV_TILED (experiment, decode_profile.py variants): the weights stored 16-row-tile-major, [N/16][G][16][words
// of one row's block of 128] (and scales/mins [N/16][G][16][128/GS]): the 16 rows a warp reads for one block are
// 1 KB contiguous (W4) instead of 16 separate 64-byte pieces. Same values in the same lanes: same results. W4 / W8
// only: W3 words have their own tile layout (layout 3), which this would misread together with tiled scales.
#ifndef GEMV_TILED
#define GEMV_TILED 0
#endif
// (row, block) -> element offset. 32-bit: every operand of a GEMV has < 2^32 elements (DecodeKernels.gemv asserts
// it), and the 64-bit products made a third of the K loop's instructions address arithmetic (SASS of gemv_w4_silu).
__device__ __forceinline__ u32 blk_index(u32 r, u32 grp, u32 G, u32 per) {
#if GEMV_TILED
  return ((r >> 4) * G + grp) * (16 * per) + (r & 15) * per;
#else
  return (r * G + grp) * per;
#endif
}

// GEMV_LDHINT: the weight loads' PTX cache qualifiers (same values). Q4: every weight load (each byte read once by
// one lane; W3 too since layout 3). Q3 was W3 layout 2's 8- and 4-byte loads (two per 12-byte chunk, in one 128-byte
// line, so the second hit L1): gone with layout 3, whose loads take Q4's.
//   0: plain (__ldg)                     1: .L2::256B for both (the L2 fetches the 256-byte block around an access)
//   2: .L1::no_allocate.L2::256B both   3: Q4 .L1::no_allocate.L2::256B, Q3 .L2::256B
//   4: Q4 .L1::no_allocate, Q3 plain    5: .L1::no_allocate.L2::128B / .L2::128B
// (the Q4 column is what each value still sets). Measured with layout 2's W3 on the H200
// (docs/results/decode_ab_hints_h200.json, decode_ab_ldna7b_h200.json): 2 made W4 2.8-3.9% faster and W3 5%
// slower (its second load of a line no longer hits L1); 1 helped W3 1.5%. 5, the default, was best or level
// everywhere (decode_ab_ldhint_h200.json, step replay: 3B W4 -3.5%, 7B W4 -3.6%, 7B W3 -2.0%, 14B W4 -4.7%).
// An L2 evict-first policy on the 16-byte loads, and .L1::evict_first for W3's, were level with 5 (04a5981,
// decode_ab_ldhint67.txt).
#ifndef GEMV_LDHINT
#define GEMV_LDHINT 5
#endif
#if GEMV_LDHINT == 0  // = __ldg
#define LDW_Q4 ""
#elif GEMV_LDHINT == 1
#define LDW_Q4 ".L2::256B"
#elif GEMV_LDHINT == 2
#define LDW_Q4 ".L1::no_allocate.L2::256B"
#elif GEMV_LDHINT == 3
#define LDW_Q4 ".L1::no_allocate.L2::256B"
#elif GEMV_LDHINT == 4
#define LDW_Q4 ".L1::no_allocate"
#elif GEMV_LDHINT == 5
#define LDW_Q4 ".L1::no_allocate.L2::128B"
#endif
// (non-volatile asm: the compiler may schedule these loads like __ldg's; weights are never written by the step)
__device__ __forceinline__ uint4 ldw4(const void* p) {
  uint4 v;
  asm("ld.global.nc" LDW_Q4 ".v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ldw2na(const void* p) {  // W3's 8-byte loads: also read once by one lane
  uint2 v;
  asm("ld.global.nc" LDW_Q4 ".v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
// KQ (kernels/pack.py): the group scales and mins made from the K-quants' integer sub-scales and fp16 factors per
// 256, as the repack rounds them: fp16(d sc) and fp16(-(dmin m)) (Q4_K / Q5_K, groups of 32) or fp16(-32 d sc)
// (Q6_K, groups of 16); the fp32 products are exact (an 11-bit mantissa times a <= 8-bit integer), so these are the
// plain layouts' bits. sc: the sub-scales as 16-bit words: word (r, grp, t) holds the lane's (sc, m) (groups of 32)
// or the sc of its two groups (groups of 16); mn: the factors per 256 ((d, dmin) pairs or d), two blocks of 128.
template <int GS>
__device__ __forceinline__ void kq_scales(h16* s, h16* m, const h16* __restrict__ sc, const h16* __restrict__ mn,
                                          u32 r, u32 grp, u32 G, int t) {
  const u32 v = __ldg(sc + (r * G + grp) * 4u + (u32)t);
  const u32 sb = r * (G >> 1) + (grp >> 1);  // the row's super-block holding this block
  if constexpr (GS == 32) {
    const u32 dd = __ldg(reinterpret_cast<const u32*>(mn) + sb);  // (d, dmin)
    s[0] = f2h(h2f((h16)(dd & 0xFFFFu)) * (float)(v & 0xFFu));
    m[0] = f2h(-(h2f((h16)(dd >> 16)) * (float)(v >> 8)));
  } else {
    const float d = h2f(__ldg(mn + sb));
#pragma unroll
    for (int e = 0; e < 2; e++) {
      const float a = d * (float)(signed char)((v >> (8 * e)) & 0xFFu);
      s[e] = f2h(a);
      m[e] = f2h(-32.f * a);
    }
  }
}

// The scales' form (kernels/pack.py; QWeight.form): fp16 scale and min per group, KQ, or SYM (no mins stored:
// min = -2^(BITS-1) scale, exact in fp16, so the plain layout's bits)
#define SF_PLAIN 0
#define SF_KQ 1
#define SF_SYM 2
template <int BITS, int MT, int GS, int SF = SF_PLAIN>
__device__ __forceinline__ void load_frag(Frag<BITS, MT, GS>& f, const u32* __restrict__ qw, const h16* __restrict__ sc,
                                          const h16* __restrict__ mn, const h16* __restrict__ x, int row0,
                                          int tile_stride, int K, int grp, int g, int t) {
  const int G = K >> 7;
#pragma unroll
  for (int j = 0; j < MT; j++) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int r = row0 + j * tile_stride + g + 8 * h;
      if constexpr (BITS == 8) {
        const uint4* p = reinterpret_cast<const uint4*>(qw + (blk_index(r, grp, G, 32) + t * 8u));
        const uint4 v = ldw4(p), u = ldw4(p + 1);
        f.w[j][h][0] = v.x; f.w[j][h][1] = v.y; f.w[j][h][2] = v.z; f.w[j][h][3] = v.w;
        f.w[j][h][4] = u.x; f.w[j][h][5] = u.y; f.w[j][h][6] = u.z; f.w[j][h][7] = u.w;
      } else if constexpr (BITS == 4) {
        const uint4 v = ldw4(qw + (blk_index(r, grp, G, 16) + t * 4u));
        f.w[j][h][0] = v.x; f.w[j][h][1] = v.y; f.w[j][h][2] = v.z; f.w[j][h][3] = v.w;
      } else if constexpr (BITS == 6) {  // 24 words per row and block: nibbles at 4 t (16 bytes), high bits at 16 + 2 t
        const u32* p = qw + blk_index(r, grp, G, 24);
        const uint4 v = ldw4(p + 4 * t);
        const uint2 u = ldw2na(p + 16 + 2 * t);
        f.w[j][h][0] = v.x; f.w[j][h][1] = v.y; f.w[j][h][2] = v.z; f.w[j][h][3] = v.w;
        f.w[j][h][4] = u.x; f.w[j][h][5] = u.y;
      } else if (h == 0) {
        // W3 layout 3 (kernels/pack.py): rows g and g + 8 of a tile are pair (r / 16) * 8 + g, whose group grp is 24
        // words: lane t's w0, w1 of both rows at 4 t (16 bytes), then its w2 of both rows at 16 + 2 t (8 bytes):
        // two loads per lane for both rows, each 32-byte sector read by one instruction (so no L1 line either)
        const u32* p = qw + ((u32)((r >> 4) * 8 + (r & 7)) * (u32)G + (u32)grp) * 24u;
        const uint4 v = ldw4(p + 4 * t);
        const uint2 u = ldw2na(p + 16 + 2 * t);
        f.w[j][0][0] = v.x; f.w[j][0][1] = v.y; f.w[j][1][0] = v.z; f.w[j][1][1] = v.w;
        f.w[j][0][2] = u.x; f.w[j][1][2] = u.y;
      }
      if constexpr (SF == SF_KQ) {
        kq_scales<GS>(f.s[j][h], f.m[j][h], sc, mn, r, grp, G, t);
      } else if constexpr (SF == SF_SYM) {  // groups of 32: the lane's one scale; mn unused
        const h16 s = __ldg(sc + blk_index(r, grp, G, 4) + t);
        f.s[j][h][0] = s;
        f.m[j][h][0] = f2h(h2f(s) * -(float)(1 << (BITS - 1)));
      } else if constexpr (GS == 128) {
        f.s[j][h][0] = __ldg(sc + blk_index(r, grp, G, 1));
        f.m[j][h][0] = __ldg(mn + blk_index(r, grp, G, 1));
      } else {
#pragma unroll
        for (int e = 0; e < SUBS(GS); e++) {  // this lane's groups: (128 / GS) per block, SUBS(GS) per lane
          const u32 i = blk_index(r, grp, G, 128 / GS) + t * SUBS(GS) + e;
          f.s[j][h][e] = __ldg(sc + i);
          f.m[j][h][e] = __ldg(mn + i);
        }
      }
    }
  }
}

// GEMV_XPRED: the x rows of tokens >= B are not loaded (zeros; their mma columns are never stored), so at batch 1 a
// warp's x loads touch one row's 64 bytes instead of 8 rows' 512.
#ifndef GEMV_XPRED
#define GEMV_XPRED 1
#endif
template <int BITS, int MT, int GS, bool VB = false>
__device__ __forceinline__ void load_x(Frag<BITS, MT, GS>& f, const h16* __restrict__ x, int K, int grp, int g, int t,
                                      int B) {
  const uint4* xp = reinterpret_cast<const uint4*>(x + ((u32)g * (u32)K + (u32)grp * 128u + (u32)t * 32u));
  if (!GEMV_XPRED || g < B) {  // other lanes keep the zeros their Frag was made with (no register clears per group)
#pragma unroll
    for (int i = 0; i < 4; i++) f.x[i] = VB ? __ldcg(xp + i) : __ldg(xp + i);  // VB: written in this launch
  }
}

#ifndef GEMV_VARIANT
#define GEMV_VARIANT 0  // 0: real; 1: no ones-mma (wrong mins, timing only); 2: loads only (timing only); 3: no K loop
// at all (timing only: the fp16 GEMVs' waits, reductions, handshakes and epilogues without a weight load: what the
// structure around the K loop costs in the step; the q8 kernels keep theirs)
#endif

template <int BITS, int MT, int GS>
__device__ __forceinline__ void compute_frag(const Frag<BITS, MT, GS>& f, float (*acc)[4]) {
#if GEMV_VARIANT == 2
#pragma unroll
  for (int j = 0; j < MT; j++) {
    u32 v = f.x[0].x ^ f.x[3].w;
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
      for (int i = 0; i < WORDS(BITS); i++) v ^= f.w[j][h][i];
    acc[j][0] += __uint_as_float(v & 0x3FFFFFFFu) + h2f(f.s[j][0][0]) + h2f(f.m[j][1][0]);
  }
  return;
#endif
  if constexpr (GS < 128) {  // dequantize A per lane, accumulate sum_k w x in the mma
#pragma unroll
    for (int i = 0; i < 8; i++) {
      const u32 b0 = BITS == 8 ? w8_xpair(f.x, 2 * i) : w4_xpair(f.x, 2 * i);
      const u32 b1 = BITS == 8 ? w8_xpair(f.x, 2 * i + 1) : w4_xpair(f.x, 2 * i + 1);
      const int e = (GS == 16) ? (i >> 2) : 0;  // pairs 0..7: k 0..15 of the lane's 32; 8..15: k 16..31
#pragma unroll
      for (int j = 0; j < MT; j++) {
        const u32 s0 = bcast(f.s[j][0][e]), m0 = bcast(f.m[j][0][e]);
        const u32 s1 = bcast(f.s[j][1][e]), m1 = bcast(f.m[j][1][e]);
        u32 c0, c1, c2, c3;
        if constexpr (BITS == 8) {
          c0 = w8_pair(f.w[j][0], 2 * i); c2 = w8_pair(f.w[j][0], 2 * i + 1);
          c1 = w8_pair(f.w[j][1], 2 * i); c3 = w8_pair(f.w[j][1], 2 * i + 1);
        } else if constexpr (BITS == 6) {
          c0 = w6_pair(f.w[j][0], 2 * i); c2 = w6_pair(f.w[j][0], 2 * i + 1);
          c1 = w6_pair(f.w[j][1], 2 * i); c3 = w6_pair(f.w[j][1], 2 * i + 1);
        } else {
          c0 = w4_pair(f.w[j][0], 2 * i); c2 = w4_pair(f.w[j][0], 2 * i + 1);
          c1 = w4_pair(f.w[j][1], 2 * i); c3 = w4_pair(f.w[j][1], 2 * i + 1);
        }
        constexpr u32 o0 = MAGIC;  // pair 2i: even (w8: every pair 1024 + q)
        const u32 o1 = BITS == 8 ? MAGIC : w4_off(2 * i + 1);  // W4 and W6: W4's unpack, W4's offsets
        mma16816(acc[j], deq_pair(c0, s0, m0, o0), deq_pair(c1, s1, m1, o0), deq_pair(c2, s0, m0, o1),
                 deq_pair(c3, s1, m1, o1), b0, b1);
      }
    }
    return;
  }
  float S[4] = {0.f, 0.f, 0.f, 0.f};
  float C[MT][4];
#pragma unroll
  for (int j = 0; j < MT; j++) C[j][0] = C[j][1] = C[j][2] = C[j][3] = 0.f;
#pragma unroll
  for (int i = 0; i < 8; i++) {
    // mma i's pairs: k 0..7 from pair p0, k 8..15 from p1 (any pairing works: A and B follow the same k order)
    const int p0 = BITS == 4 ? 2 * i : w3_lo(i), p1 = BITS == 4 ? 2 * i + 1 : w3_hi(i);
    const u32 b0 = BITS == 4 ? w4_xpair(f.x, p0) : w3_xpair(f.x, p0);
    const u32 b1 = BITS == 4 ? w4_xpair(f.x, p1) : w3_xpair(f.x, p1);
    // S: rows g (A = ones) = sum_k x; with GEMV_UNPACK2 rows g + 8 = T = sum_k off_k x_k: A's k 0..7 = 1024 (the
    // offset of every p0), k 8..15 = 64 (W4) or 128 (W3), the offset of every p1. The same four registers in
    // every mma (a quad of constants per i would be rematerialized each group: 4 moves per mma)
    if (GEMV_VARIANT != 1) {
      if (GEMV_UNPACK2) mma16816(S, ONES, MAGIC, ONES, BITS == 4 ? MAGIC64 : W3_OFF_HI, b0, b1);
      else mma16816(S, ONES, ONES, ONES, ONES, b0, b1);
    }
#pragma unroll
    for (int j = 0; j < MT; j++) {
      u32 a0, a1, a2, a3;
      if (BITS == 4) {
        a0 = w4_pair(f.w[j][0], p0); a2 = w4_pair(f.w[j][0], p1);
        a1 = w4_pair(f.w[j][1], p0); a3 = w4_pair(f.w[j][1], p1);
      } else {
        a0 = w3_pair(f.w[j][0][0], f.w[j][0][1], f.w[j][0][2], p0);
        a2 = w3_pair(f.w[j][0][0], f.w[j][0][1], f.w[j][0][2], p1);
        a1 = w3_pair(f.w[j][1][0], f.w[j][1][1], f.w[j][1][2], p0);
        a3 = w3_pair(f.w[j][1][0], f.w[j][1][1], f.w[j][1][2], p1);
      }
      mma16816(C[j], a0, a1, a2, a3, b0, b1);
    }
  }
#pragma unroll
  for (int j = 0; j < MT; j++) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const float s = h2f(f.s[j][h][0]), m = h2f(f.m[j][h][0]);
      if (GEMV_UNPACK2) {  // y += s (C - T) + m S
        acc[j][2 * h] = fmaf(s, C[j][2 * h], fmaf(m, S[0], fmaf(-s, S[2], acc[j][2 * h])));
        acc[j][2 * h + 1] = fmaf(s, C[j][2 * h + 1], fmaf(m, S[1], fmaf(-s, S[3], acc[j][2 * h + 1])));
      } else {  // y += s C + (m - 1024 s) S
        const float mm = fmaf(-1024.f, s, m);
        acc[j][2 * h] = fmaf(s, C[j][2 * h], fmaf(mm, S[0], acc[j][2 * h]));
        acc[j][2 * h + 1] = fmaf(s, C[j][2 * h + 1], fmaf(mm, S[1], acc[j][2 * h + 1]));
      }
    }
  }
}

// ---- int8 activations at batch 1 (EngineConfig.decode_q8; the gemv_w4q8_* kernels) -------------------------------
// llama.cpp's batch-1 numerics (decode_q8dot.cu; reference kernels/q8_reference.py): the block quantizes the x of the
// groups it reads into shared memory right after its wait (q8_quant_cta: no launch of its own, nothing changes in the
// kernels that write x), then each lane's 32 codes of a row and group cost 8 LOP3 + 8 dp4a (q8_dot) instead of the
// fp16 unpack, pairing and mma (~153 instructions per group at MT = 2 against 217; docs/gpu.md). The weights, their
// loads and the two-stage pipeline are the fp16 kernels' (Frag, load_frag); lane (g, t) sums its rows g, g + 8 over
// k quarter t of each group, and the quad's four quarters are added (in a fixed order) into the mma layout's token 0
// (acc[j][0] row g, acc[j][2] row g + 8), so the split-K reduction and every epilogue after it are the fp16 GEMV's.
// NB = 8 (gemv_w4*q8b_*, 2..8 tokens): each token's sums as NB = 1's, lane t keeping tokens 2 t, 2 t + 1. GS = 128 or
// 32 in any scale form (SF): load_frag gives each lane its own group's scale and min, which at GS = 32 is its x block's.
template <int MT, int NB, int GS, int SF, class W, class E>
__device__ __forceinline__ void q8_kloop(const u32* __restrict__ qw, const h16* __restrict__ sc,
                                         const h16* __restrict__ mn, const h16* __restrict__ x, int K, int KSW, int KS,
                                         int by, int ks, int row0, int ts, bool live, int g, int t, int B,
                                         float (*acc)[4], W wait, E early) {
  // the block's slots (q8_quant_cta) in dynamic shared memory sized by the launch to this plan's (DecodeKernels.gemv:
  // 160 bytes a slot and token): a static Q8_SLOTS-sized array (25.6 KB) made the 3B step 12% slower than the fp16
  // one where the probe's K loop was 25% faster (H100, decode_ab_q8bound_h100.json): presumably the SMs' shared-memory
  // carveout, which the fp16 kernels around it did not share, so blocks of neighbouring launches could not overlap.
  // Token b's slots at b ns 128, its (dx, sx) after every token's slots.
  extern __shared__ __align__(16) unsigned char q8_dyn[];
  const int G = K >> 7, ns = q8_slots(G, KS, KSW, 0);
  signed char* xs = reinterpret_cast<signed char*>(q8_dyn);
  float2* ds = reinterpret_cast<float2*>(q8_dyn + B * ns * 128);
  float a2[MT][2][NB];  // [tile][row g / g + 8][token]: this lane's k quarter
#pragma unroll
  for (int j = 0; j < MT; j++)
#pragma unroll
    for (int b = 0; b < NB; b++) a2[j][0][b] = a2[j][1][b] = 0.f;
  int xslot = ks;  // the slot of the next group this warp loads x for (groups in order: q8_pipeline)
  const auto load_w = [&](Frag<4, MT, GS>& f, int grp) {
    load_frag<4, MT, GS, SF>(f, qw, sc, mn, x, row0, ts, K, grp, g, t);
  };
  // NB = 1: x[0], x[1] the lane's 32 xq bytes of token 0, x[2] its dx, sx (loaded with the weights' stage);
  // NB > 1: x[2].z the slot, each token's bytes read from shared memory in compute
  const auto load_xq = [&](Frag<4, MT, GS>& f, int) {
    if constexpr (NB == 1) {
      const uint4* p = reinterpret_cast<const uint4*>(xs + xslot * 128 + t * 32);
      f.x[0] = p[0];
      f.x[1] = p[1];
      const float2 d = ds[xslot * 4 + t];
      f.x[2].x = __float_as_uint(d.x);
      f.x[2].y = __float_as_uint(d.y);
    } else {
      f.x[2].z = (u32)xslot;
    }
    xslot += KSW;
  };
  // one token's sums of the stage: the same operations in the same order for every NB (a token's bits do not depend
  // on how many are in the step: verify rows and batches get the batch-1 step's)
  const auto dot = [&](const Frag<4, MT, GS>& f, uint4 x0, uint4 x1, float dx, float sx, int b) {
#pragma unroll
    for (int j = 0; j < MT; j++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const int I = q8_dot(make_uint4(f.w[j][h][0], f.w[j][h][1], f.w[j][h][2], f.w[j][h][3]), x0, x1);
        a2[j][h][b] = __fmaf_rn(h2f(f.m[j][h][0]), sx, __fmaf_rn(h2f(f.s[j][h][0]), __fmul_rn(dx, (float)I),
                                                                  a2[j][h][b]));
      }
  };
  const auto compute = [&](const Frag<4, MT, GS>& f) {
    if constexpr (NB == 1) {
      dot(f, f.x[0], f.x[1], __uint_as_float(f.x[2].x), __uint_as_float(f.x[2].y), 0);
    } else {
#pragma unroll
      for (int b = 0; b < NB; b++)
        if (b < B) {
          const int sl = b * ns + (int)f.x[2].z;
          const uint4* p = reinterpret_cast<const uint4*>(xs + sl * 128 + t * 32);
          const float2 d = ds[sl * 4 + t];
          dot(f, p[0], p[1], d.x, d.y, b);
        }
    }
  };
  Frag<4, MT, GS> fa, fb;
  q8_pipeline(fa, fb, by * KSW + ks, G, KS, live, load_w, load_xq, compute, [&]() {
    wait();
#if !defined(Q8_NOQUANT) || !Q8_NOQUANT  // -DQ8_NOQUANT=1: timing only, the slots unwritten (what this loop costs);
    for (int b = 0; b < (NB == 1 ? 1 : B); b++)  // each token's x (NB = 1: token 0 only, no loop)
      q8_quant_cta(x + (u32)b * (u32)K, G, KS, KSW, by, xs + b * ns * 128, ds + b * ns * 4);
#endif
#if !defined(Q8_NOQUANT) || Q8_NOQUANT < 2  // 2: the barrier too (what x quantized by its producer would leave)
    __syncthreads();
#endif
    if (live) early();
  });
  // the quad's four quarters per token, then lane t keeps tokens 2 t, 2 t + 1 (the mma layout's columns)
#pragma unroll
  for (int j = 0; j < MT; j++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      float v[NB];
#pragma unroll
      for (int b = 0; b < NB; b++) {
        v[b] = a2[j][h][b];
        v[b] = __fadd_rn(v[b], __shfl_xor_sync(0xffffffffu, v[b], 1));
        v[b] = __fadd_rn(v[b], __shfl_xor_sync(0xffffffffu, v[b], 2));
      }
      if constexpr (NB == 1) {
        acc[j][2 * h] = v[0];  // token 0 (lanes t > 0 hold it too: their tokens 2 t are never stored)
      } else {
#pragma unroll
        for (int i = 0; i < 2; i++) {
          float r = 0.f;
#pragma unroll
          for (int b = 0; b < NB; b++) r = b == 2 * t + i ? v[b] : r;
          acc[j][2 * h + i] = r;
        }
      }
    }
}

#ifndef GEMV_RESID_LOADS
#define GEMV_RESID_LOADS 1  // 0: load-add-store per element (the previous epilogue; timing comparisons only)
#endif
#define EPI_STORE 0   // out fp16 [B, N] = y (+ bias fp16)
#define EPI_RESID 1   // resid fp32 [B, N] += y
#define EPI_SILU 2    // MT = 2: tile 0 gate rows, tile 1 up rows (tile_stride = ffn); out fp16 [B, ffn]
#define EPI_LOGITS 3  // out fp32 [B, N] = y; keys[b] = atomicMax(orderable(y) << 32 | ~n)

__device__ __forceinline__ unsigned long long argmax_key(float v, int n) {
  u32 u = __float_as_uint(v);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ((unsigned long long)u << 32) | (unsigned long long)(0xFFFFFFFFu - (u32)n);
}

// grid (row tiles / (WPB / KSW), KSB); block = WPB warps; warp w: tile w / KSW, K slice (blockIdx.y * KSW + w % KSW)
// of KS = KSB * KSW slices (group grp goes to slice grp % KS). With KSB > 1 every block stores its partial
// fragment in ws and the last block of a tile (arrival counter cnt[tile], reset by it) sums the KSB
// partials in a fixed order (deterministic) and runs the epilogue.
// Pipeline depth (groups of 128 in registers per warp) and blocks per SM; -D overrides are for plan sweeps
// (engine/bench/decode_profile.py): MT = 1 kernels hold fewer registers than MT = 2 ones.
#ifndef GEMV_NST1
#define GEMV_NST1 2
#endif
#ifndef GEMV_NST2
#define GEMV_NST2 2
#endif
#ifndef GEMV_MINB2
#define GEMV_MINB2 2
#endif
// Units the balanced gate_up's warps load before the PDL wait (2: both of its two-stage pipeline, the default; 1 or
// 0 move them after it; an A/B knob, same values). Why it might have mattered: with the 3B's o in 64 blocks ~200 of
// gate_up's 264 blocks are resident while the attention and o still run, and o's wait returned 2.0-2.2 us after the
// attention's last block (0.96 with o in 128 blocks). Measured (decode_ab_balpre_h100.json): 0 brings o's gap back to
// 0.9 us but gate_up's span grows 2.6 us (3B 0.968x); 1 leaves the gap (0.989x). Kept off.
#ifndef GEMV_SPLITK_NOHS
// 1: a timing probe, wrong values (the split-K handshake left out: see its use): at most 1.8% / 3.3% / 2.4% of a 3B /
// 7B / 14B step (decode_ab_nohs_h100.json)
#define GEMV_SPLITK_NOHS 0
#endif
// Split-K partials the last block of a tile loads in one batch (0: one at a time in a loop; an A/B knob: the same bits,
// timed level on an H100, decode_ab_redbatch_h100.json, so kept off)
#ifndef GEMV_RED_BATCH
#define GEMV_RED_BATCH 0
#endif
#ifndef GEMV_BAL_PRE
#define GEMV_BAL_PRE 2
#endif
// o_proj's PDL trigger after its own wait instead of first (1; an A/B knob, 0 the default; o_proj is the resid GEMV
// with K == N): gate_up's blocks then launch only once the attention has ended, and preload their weights while o
// runs instead of while the attention still does (GEMV_BAL_PRE = 0 showed that their early loads cost o ~1 us of
// wait per layer).
#ifndef GEMV_TRIG_O_LATE
#define GEMV_TRIG_O_LATE 0
#endif
// A/B knobs (0: off, the default): a register cap for the balanced gate_up and for the one-tile (MT = 1) GEMVs, so that
// an SM holding one of o_proj's blocks can also hold two of gate_up's (65,536 registers: 256 threads x (o + 2 x gate_up))
#ifndef GEMV_BAL_MAXNREG
#define GEMV_BAL_MAXNREG 0
#endif
#ifndef GEMV_MAXNREG1
#define GEMV_MAXNREG1 0
#endif
#define NST_OF(MT) ((MT) == 1 ? GEMV_NST1 : GEMV_NST2)

// GEMV_TRACE (timing builds only, engine/bench/gemv_phases.py): thread 0 of every block records %globaltimer (ns) at
// its start, when its wait returns, after its K loop, when its epilogue starts (after the split-K reduction; 0 for a
// block that left its partial to another) and at its end, with the launch's N, K, epilogue, grid position and SM,
// into gemv_trace (a slot per block from gemv_trace_n). Same values; a few instructions and one atomic per block more.
#ifndef GEMV_TRACE
#define GEMV_TRACE 0
#endif
#if GEMV_TRACE
#define GEMV_TRACE_CAP 131072  // records (8 x 8 bytes): a 14B step has ~100k blocks
__device__ unsigned long long gemv_trace[GEMV_TRACE_CAP * 8];
__device__ unsigned int gemv_trace_n;
__device__ __forceinline__ unsigned long long gtimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// record: t_start, t_wait, t_loop, t_end, N | K << 32, t_epi (0: none), EPI | MT << 4 | done << 8 (done: this block
// ran the epilogue), blockIdx.x | blockIdx.y << 20 | smid << 40
// one record: thread 0's start, wait and loop times (t[0..2]), now, and the launch's fields; the attention's blocks
// write theirs through it too (decode_attn.cu att_trace)
__device__ __forceinline__ void gemv_trace_write(const unsigned long long* t, unsigned long long n,
                                                 unsigned long long k, unsigned long long flags,
                                                 unsigned long long t_epi = 0) {
  const unsigned long long t3 = gtimer();
  const unsigned slot = atomicAdd(&gemv_trace_n, 1u);
  if (slot < GEMV_TRACE_CAP) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    unsigned long long* r = gemv_trace + 8ull * slot;
    r[0] = t[0]; r[1] = t[1]; r[2] = t[2]; r[3] = t3; r[4] = n | (k << 32); r[5] = t_epi; r[6] = flags;
    r[7] = (unsigned long long)blockIdx.x | ((unsigned long long)blockIdx.y << 20) | ((unsigned long long)smid << 40);
  }
}
#define GEMV_TRACE_MARK(i) \
  if (!VB && threadIdx.x == 0) gtr[i] = gtimer();
#define GEMV_TRACE_EPI() \
  if (!VB && threadIdx.x == 0) t_epi = gtimer();
#define GEMV_TRACE_END(done)                                                     \
  if (!VB && threadIdx.x == 0)                                                   \
    gemv_trace_write(gtr, (unsigned long long)N, (unsigned long long)K,          \
                     (unsigned long long)(EPI | (MT << 4) | ((done) << 8)), t_epi);
#else
#define GEMV_TRACE_MARK(i)
#define GEMV_TRACE_EPI()
#define GEMV_TRACE_END(done)
#endif

// The wait before a GEMV's first x load: PDL's, or (VB) thread 0 polls the persistent launch's arrival counter.
// trig: the launch's dependents triggered right after the PDL wait instead of at the start (GEMV_TRIG_O_LATE)
template <bool VB>
__device__ __forceinline__ void gemv_wait(const u32* bar, u32 target, bool trig = false) {
  if constexpr (VB) {
    if (bar != nullptr && target > 0) {
      if (threadIdx.x == 0) {
        u32 v, spins = 0;
        do {
          asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(bar) : "memory");
          if (++spins > (1u << 28)) __trap();  // a block not resident: never, unless the launch was too large
        } while (v < target);
      }
      __syncthreads();
    }
  } else {
    PDL_WAIT();
    if (trig) PDL_TRIGGER();
  }
}

// GEMV_EPI_EARLY (default 1 since timed, 0 the old placement; same values): the epilogue's operands that exist before
// the kernel's inputs do are loaded before the wait instead of after the K loop, where ptxas scheduled them and
// each was a dependent round trip in the launch's tail (SASS of gemv_w4_store: the two bias loads of a lane sit
// between its last stores; the weights of 1.6 GB per step have long evicted a 5 KB bias from L2): 1 the store's
// bias and the next norm's weights (resid with nw) before the wait, the resid's norm scales sc right after it
// (lanes 0..B-1 of each warp, as the consumers' early scales), and the resid's h values before the split-K
// handshake (under its fence and atomic, not after the partials); 2 a one-tile resid's h right after the wait.
// H100, whole batch-1 steps (docs/results/decode_ab_epi_h100.json, replay ms): 3B W4 1.227 vs 1.229 alone, 1.198
// with GEMV_SS_PAIR=2 (1.209 that alone); 7B W4 1.936 vs 1.957 alone. 2 was not timed.
#ifndef GEMV_EPI_EARLY
#define GEMV_EPI_EARLY 1
#endif

// The deferred rmsnorm (decode_norm.cu): the scale rstd / sc of token b for a GEMV whose x is a deferred norm's
// output; ss = the point's rows ss[p], ss[p + 1] (written by the previous kernels).
// GEMV_SS_PAIR (default 2 since timed; 0 the old loads; same values): a token's two sums are loaded before either
// is used. __ldcg's loads are strong (LDG.E.64.STRONG.GPU) and keep their program order, and ptxas placed the second
// after the first's rstd arithmetic: two L2 round trips in a row right after the PDL wait, and the warp's first mma
// waits for both at the __syncwarp (SASS of gemv_w4_store); the same in the resid epilogue's scales.
// 2: a consumer's sums are copied into shared memory by cp.async (16 bytes: two tokens of one row; sm_80+) right
// after the wait, and each lane computes its tokens' scales after the K loop: the round trip under the loop, no
// register held across it, nothing before the first mma (the resid's scales as at 1).
// H100 replay ms (decode_ab_epi_h100.json): 3B W4 1.229 -> 1.235 (1) / 1.209 (2); 7B W4 1.957 -> 1.948 / 1.964.
#ifndef GEMV_SS_PAIR
#define GEMV_SS_PAIR 2
#endif
// a consumer's scale rstd / sc from its norm point's sums hi (ss[p + 1]) and lo (ss[p])
__device__ __forceinline__ float defer_ratio(unsigned long long hi, unsigned long long lo, int K, float eps) {
  return norm_div(rstd_fix(hi, K, eps), rstd_fix(lo, K, eps) * DEFER_SC);
}
__device__ __forceinline__ float defer_scale(const unsigned long long* ss, int b, int K, float eps) {
#if GEMV_SS_PAIR
  return defer_ratio(__ldcg(ss + 8 + b), __ldcg(ss + b), K, eps);  // both loads issued before either is used
#else
  return norm_div(rstd_fix(__ldcg(ss + 8 + b), K, eps), rstd_fix(__ldcg(ss + b), K, eps) * DEFER_SC);
#endif
}
// DEFER_EARLY 1: lanes 0..B-1 of each warp compute their token's scale into shared memory right after the PDL wait
// (the round trip under the x loads' and with no register held across the K loop); 0: each lane loads its two
// tokens' after the loop (timing comparisons)
#ifndef DEFER_EARLY
#define DEFER_EARLY 1
#endif

// BAL (the *_silu_bal kernels, compiled with GEMV_BAL=1, the default; #16): the balanced schedule. A GEMV of more tiles
// than resident blocks (3B gate_up: 344 blocks of 2 tiles for 264 slots; its second wave of 80 blocks streams at a
// third of the bandwidth while most SMs wait for it) runs as gridDim.x blocks (one wave) of ceil or floor(tiles /
// blocks) consecutive tiles each; the block's tiles x groups (tile-major) are cut into 8 equal runs, one per warp (U <=
// G groups per run, so a run spans at most two tiles: the first tile's part goes to red[warp], the second's to red[8 +
// warp]); after a barrier warp i sums tile i's parts in warp order (deterministic; the groups summed in a different
// order than the KSW schedule, so other bits) and runs the epilogue as a KSW = 1 warp. KSB = 1. 3B gate_up: 6 groups
// per warp in one wave instead of 4 in each of two waves. The host passes KSW = -1 (decode_kernels.bal_plan). As a
// runtime branch of the one kernel (9941a8c, H100, decode_ab_bal_branch_h100.json) the schedule made the 3B W4 step
// 3.3% shorter and the 7B's 2.9%, while the unused branch alone cost 1.4-2%: hence kernels of their own.
#ifndef GEMV_BAL
#define GEMV_BAL 1
#endif

// The balanced schedule's first tile of block b of nb (b = nb: ntiles). c = 0: equal shares, floor(b * ntiles / nb).
// c = E << 9 | f (BAL_LATE, DEEPINFER_GEMV_BAL_LATE, an A/B knob): blocks from E on take f / 256 of an early block's
// share: they become resident only when the GEMV before leaves its slots (3B gate_up after o_proj's 128 blocks,
// engine/bench/gemv_phases.py late_blocks). Reference: decode_reference.bal_schedule(late=(E, f)).
// Compiled in only with -DGEMV_BAL_LATE=1 (DEEPINFER_KERNEL_DEFINES): the default kernels' SASS stays as timed.
#ifndef GEMV_BAL_LATE
#define GEMV_BAL_LATE 0
#endif
__device__ __forceinline__ int bal_first(u32 b, int ntiles, u32 nb, u32 c) {
  const u32 e = c >> 9, f = c & 511u;
  // b <= nb <= 2 x SMs and ntiles <= 8 nb (bal_plan): the product fits 32 bits, and an unsigned 32-bit division
  // has no branch to the 64-bit division's subroutine
  if (!GEMV_BAL_LATE || f == 0u) return (int)((b * (u32)ntiles) / nb);
  const long long cb = 256ll * min(b, e) + (long long)f * (b > e ? b - e : 0u);
  const long long cn = 256ll * min(nb, e) + (long long)f * (nb > e ? nb - e : 0u);
  return (int)((cb * ntiles) / cn);
}

// ss (the deferred rmsnorm, decode_norm.cu; null: off): "store" / "silu" scale their sums by defer_scale; "resid"
// with nw also writes xn = fp16(h * nw * sc) (sc from ss[p]) and adds its rows' sums of squares into ss[p + 1].
// VB (kernels/decode_persist.cu, an experiment): the block is virtual block (vbx, vby) of a grid (., vksb) run inside
// a persistent launch, and instead of the PDL wait thread 0 waits until *bar >= bar_target (every block of the
// launch done with the previous GEMV); operands written earlier in the launch are read through L2.
template <int BITS, int MT, int EPI, int GS, int SF = SF_PLAIN, int NST = NST_OF(MT), bool VB = false,
          bool BAL = false, int Q8 = 0>
__device__ void gemv_body(const u32* __restrict__ qw, const h16* __restrict__ sc, const h16* __restrict__ mn,
                          const h16* __restrict__ bias, const h16* __restrict__ x, int N, int K, int B, int KSW,
                          int tile_stride, h16* __restrict__ out_h, float* __restrict__ out_f,
                          unsigned long long* __restrict__ keys, float* ws, u32* cnt, const float* __restrict__ nw,
                          float eps, h16* __restrict__ xn, unsigned long long* ss, const long long* pf,
                          int vbx = 0, int vby = 0, int vksb = 1, const u32* bar = nullptr, u32 bar_target = 0) {
  __shared__ float red[BAL ? 16 : 8][MT * 4][32];  // BAL: [8 + warp] a run's second tile
  __shared__ float rsw[8][8];  // [warp][token]: the deferred norm's scales (DEFER_EARLY)
#if GEMV_SS_PAIR == 2
  __shared__ __align__(16) unsigned long long ssw[8][2][8];  // [warp][row p + 1 / p][token]: the raw sums
#endif
#if GEMV_TRACE
  __shared__ unsigned long long gtr[3];  // thread 0's start, wait and loop times (GEMV_TRACE)
  unsigned long long t_epi = 0;          // thread 0's epilogue start
#endif
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  constexpr bool bal = BAL && !VB;  // the balanced schedule (KSW = -1)
  const int ksw = bal ? 1 : KSW;
  const int tiles_per_block = (blockDim.x >> 5) / ksw;
  const u32 bx = VB ? (u32)vbx : blockIdx.x, by = VB ? (u32)vby : blockIdx.y;  // unsigned, as blockIdx
  const int ks = warp % ksw, KSB = VB ? vksb : (int)gridDim.y, KS = KSB * ksw;
  const int row_step = (EPI == EPI_SILU) ? 16 : 16 * MT;
  const int ntiles = ((EPI == EPI_SILU) ? tile_stride : N) / row_step;
  // BAL: this block's tiles [bt0, bt0 + bnt); warp i runs tile bt0 + i's epilogue. The host's KSW = -1 - c (bal_first)
  const u32 bc = bal ? (u32)(-1 - KSW) : 0u;
  const int bt0 = bal ? bal_first(bx, ntiles, gridDim.x, bc) : 0;
  const int bnt = bal ? bal_first(bx + 1, ntiles, gridDim.x, bc) - bt0 : 0;
  const int tile = bal ? bt0 + warp : bx * tiles_per_block + warp / ksw;
  const int row0 = tile * row_step;
  const bool live = bal ? warp < bnt : tile < ntiles;
  const int G = K >> 7;
  float acc[MT][4];
#pragma unroll
  for (int j = 0; j < MT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  // GEMV_TRIG_O_LATE: o_proj triggers its dependents in gemv_wait, right after its PDL wait, instead of here
  const bool trig_late = GEMV_TRIG_O_LATE && EPI == EPI_RESID && !VB && K == N;
  if (!VB) {
    if (!trig_late) PDL_TRIGGER();
    GEMV_TRACE_MARK(0)
    l2_prefetch(pf);  // the next linears' weights (first: few registers are live here)
  }
  const int ts = (EPI == EPI_SILU) ? tile_stride : 16;
  int grp = GEMV_VARIANT == 3 ? G : by * ksw + ks;  // (3: no group is loaded or computed)
  constexpr bool CONSUMER = EPI == EPI_STORE || EPI == EPI_SILU;
#if GEMV_EPI_EARLY
  // the store's bias / the next norm's weights of this lane's rows (GEMV_EPI_EARLY), before the wait
  float epc[MT][2];
  if ((EPI == EPI_STORE && bias != nullptr) || (EPI == EPI_RESID && nw != nullptr)) {
#pragma unroll
    for (int j = 0; j < MT; j++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const int n = row0 + j * 16 + g + 8 * h;
        epc[j][h] = !live ? 0.f : EPI == EPI_STORE ? h2f(__ldg(bias + n)) : __ldg(nw + n);
      }
  }
#endif
  // resid: every h value this lane adds to, loaded in one batch before the first store (the compiler cannot tell the
  // (b, n) addresses apart, so a load-add-store per element made B rows B dependent L2 round trips); loaded after
  // the split-K reduction, or with GEMV_EPI_EARLY before its handshake (1) or right after the wait (2, one tile)
  float prev[MT][4];
  const auto load_prev = [&]() {
    if (EPI == EPI_RESID && GEMV_RESID_LOADS) {
#pragma unroll
      for (int j = 0; j < MT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int n = row0 + j * 16 + g + 8 * (e >> 1), b = 2 * t + (e & 1);
          prev[j][e] = b < B ? (VB ? __ldcg(out_f + (size_t)b * N + n) : out_f[(size_t)b * N + n]) : 0.f;
        }
    }
  };
  constexpr bool PREV_AT_WAIT = GEMV_EPI_EARLY >= 2 && MT == 1 && !VB;
  const auto early_scales = [&]() {  // after the PDL wait and the first x loads
#if GEMV_SS_PAIR == 2
    if (CONSUMER && ss != nullptr) {  // lanes 0..7: tokens k, k + 1 (k = 2 (lane % 4)) of row p + 1 or p
      if (lane < 8 && 2 * (lane & 3) < B) {
        const int r = lane >> 2, k = 2 * (lane & 3);  // r 0: ss + 8 (row p + 1), 1: ss (row p)
        const u32 dst = (u32)__cvta_generic_to_shared(&ssw[warp][r][k]);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(ss + 8 * (1 - r) + k) : "memory");
      }
      asm volatile("cp.async.commit_group;" ::: "memory");
    } else
#endif
    if (DEFER_EARLY && CONSUMER && ss != nullptr) {
      if (lane < B) rsw[warp][lane] = defer_scale(ss, lane, K, eps);
      __syncwarp();
    }
#if GEMV_EPI_EARLY
    if (EPI == EPI_RESID && nw != nullptr) {  // the resid's norm scales sc (rsw is free: not a consumer)
      if (lane < B) rsw[warp][lane] = rstd_fix(__ldcg(ss + lane), N, eps) * DEFER_SC;
      __syncwarp();
    }
    if (PREV_AT_WAIT) load_prev();
#endif
  };

  bool split = false;  // BAL: this warp's run crossed into a second tile (its first part is in red[warp])
  if constexpr (Q8 > 0) {  // int8 activations, tokens 0 .. B - 1 <= Q8 - 1 (q8_kloop)
    static_assert(BITS == 4 && (GS == 128 || GS == 32) && !BAL && !VB, "the q8 K loop: W4 g128 / g32, plain schedule");
    q8_kloop<MT, Q8, GS, SF>(qw, sc, mn, x, K, ksw, KS, (int)by, ks, row0, ts, live, g, t, B, acc, [&]() {
      gemv_wait<VB>(bar, bar_target, trig_late);
      GEMV_TRACE_MARK(1)
    }, [&]() { early_scales(); });
  } else if constexpr (bal) {
    // the block's bnt x G units (tile-major), U per warp; unit (ta, ga) in fa, (tb, gb) in fb, two apart
    const int units = bnt * G, U = (units + 7) >> 3;
    int u = warp * U;
    const int ue = GEMV_VARIANT == 3 ? u : min(units, u + U);
    int ta = u / G, ga = u - ta * G;
    int tb = ga + 1 < G ? ta : ta + 1, gb = ga + 1 < G ? ga + 1 : 0;
    const auto adv2 = [&](int& tt, int& gg) {
      gg += 2;
      if (gg >= G) { gg -= G; tt++; }
    };
    const auto flush = [&]() {  // the first tile's part of the run done: to red[warp], acc from zero
#pragma unroll
      for (int j = 0; j < MT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) { red[warp][j * 4 + e][lane] = acc[j][e]; acc[j][e] = 0.f; }
      split = true;
    };
    Frag<BITS, MT, GS> fa, fb;
    // the run's first two units' weights, GEMV_BAL_PRE of them before the wait and the rest after it
    const auto first_a = [&]() {
      if (u < ue) load_frag<BITS, MT, GS, SF>(fa, qw, sc, mn, x, (bt0 + ta) * row_step, ts, K, ga, g, t);
    };
    const auto first_b = [&]() {
      if (u + 1 < ue) load_frag<BITS, MT, GS, SF>(fb, qw, sc, mn, x, (bt0 + tb) * row_step, ts, K, gb, g, t);
    };
    if (GEMV_BAL_PRE >= 1) first_a();
    if (GEMV_BAL_PRE >= 2) first_b();
    gemv_wait<VB>(bar, bar_target, trig_late);
    GEMV_TRACE_MARK(1)
    if (GEMV_BAL_PRE < 1) first_a();
    if (GEMV_BAL_PRE < 2) first_b();
    if (u < ue) {
      load_x<BITS, MT, GS, VB>(fa, x, K, ga, g, t, B);
      if (u + 1 < ue) load_x<BITS, MT, GS, VB>(fb, x, K, gb, g, t, B);
      early_scales();
      // unit v in f at (tt, gg): compute it, flush where its tile ends inside the run, load unit v + 2 into f
      const auto step = [&](Frag<BITS, MT, GS>& f, int& tt, int& gg, int v) {
        compute_frag<BITS, MT, GS>(f, acc);
        if (gg == G - 1 && v + 1 < ue) flush();
        adv2(tt, gg);
        if (v + 2 < ue) {
          load_frag<BITS, MT, GS, SF>(f, qw, sc, mn, x, (bt0 + tt) * row_step, ts, K, gg, g, t);
          load_x<BITS, MT, GS, VB>(f, x, K, gg, g, t, B);
        }
      };
      for (; u < ue; u += 2) {
        step(fa, ta, ga, u);
        if (u + 1 >= ue) break;
        step(fb, tb, gb, u + 1);
      }
    }
  } else if constexpr (NST == 2) {
    Frag<BITS, MT, GS> fa, fb;
    // the first two groups' weights are independent of the previous kernel: load them before waiting
    if (live && grp < G) load_frag<BITS, MT, GS, SF>(fa, qw, sc, mn, x, row0, ts, K, grp, g, t);
    if (live && grp + KS < G) load_frag<BITS, MT, GS, SF>(fb, qw, sc, mn, x, row0, ts, K, grp + KS, g, t);
    gemv_wait<VB>(bar, bar_target, trig_late);
    GEMV_TRACE_MARK(1)
    if (live) {
      if (grp < G) load_x<BITS, MT, GS, VB>(fa, x, K, grp, g, t, B);
      if (grp + KS < G) load_x<BITS, MT, GS, VB>(fb, x, K, grp + KS, g, t, B);
      early_scales();
      // two-stage register pipeline: one group's loads are in flight while the other computes
      for (; grp < G; grp += 2 * KS) {
        compute_frag<BITS, MT, GS>(fa, acc);
        const int na = grp + 2 * KS;
        if (na < G) {
          load_frag<BITS, MT, GS, SF>(fa, qw, sc, mn, x, row0, ts, K, na, g, t);
          load_x<BITS, MT, GS, VB>(fa, x, K, na, g, t, B);
        }
        if (grp + KS >= G) break;
        compute_frag<BITS, MT, GS>(fb, acc);
        const int nb = grp + 3 * KS;
        if (nb < G) {
          load_frag<BITS, MT, GS, SF>(fb, qw, sc, mn, x, row0, ts, K, nb, g, t);
          load_x<BITS, MT, GS, VB>(fb, x, K, nb, g, t, B);
        }
      }
    }
  } else {
    Frag<BITS, MT, GS> f[NST];
    // the first NST groups' weights are independent of the previous kernel: load them before waiting
#pragma unroll
    for (int s = 0; s < NST; s++)
      if (live && grp + s * KS < G) load_frag<BITS, MT, GS, SF>(f[s], qw, sc, mn, x, row0, ts, K, grp + s * KS, g, t);
    gemv_wait<VB>(bar, bar_target, trig_late);
    GEMV_TRACE_MARK(1)
    if (live) {
#pragma unroll
      for (int s = 0; s < NST; s++)
        if (grp + s * KS < G) load_x<BITS, MT, GS, VB>(f[s], x, K, grp + s * KS, g, t, B);
      early_scales();
      // NST-stage register pipeline: NST - 1 groups' loads are in flight while one computes (groups in order,
      // so the sum does not depend on NST)
      for (; grp < G; grp += NST * KS) {
#pragma unroll
        for (int s = 0; s < NST; s++) {
          const int cur = grp + s * KS, nx = cur + NST * KS;
          if (cur < G) {
            compute_frag<BITS, MT, GS>(f[s], acc);
            if (nx < G) {
              load_frag<BITS, MT, GS, SF>(f[s], qw, sc, mn, x, row0, ts, K, nx, g, t);
              load_x<BITS, MT, GS, VB>(f[s], x, K, nx, g, t, B);
            }
          }
        }
      }
    }
  }
  GEMV_TRACE_MARK(2)
  // the deferred norm's scale of tokens 2 t, 2 t + 1 (store / silu); DEFER_EARLY 0: loaded here, after the loop
  // (two more registers across it made gemv_w4_silu spill), its round trip under the split-K reduction below
  float rs[2] = {1.f, 1.f};
#if GEMV_SS_PAIR == 2
  if (CONSUMER && ss != nullptr && live) {
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncwarp();  // lanes 0..7's copies visible to the warp
#pragma unroll
    for (int i = 0; i < 2; i++)
      if (2 * t + i < B)
        rs[i] = defer_ratio(ssw[warp][0][2 * t + i], ssw[warp][1][2 * t + i], K, eps);
  }
#else
  if (CONSUMER && ss != nullptr && live) {
#pragma unroll
    for (int i = 0; i < 2; i++)
      if (2 * t + i < B) rs[i] = DEFER_EARLY ? rsw[warp][2 * t + i] : defer_scale(ss, 2 * t + i, K, eps);
  }
#endif
  if constexpr (bal) {  // each run's last part to red[warp] or red[8 + warp]; warp i sums tile i's parts in warp order
    const int U = (bnt * G + 7) >> 3;  // as above (hoisted, it changed the timed kernels' SASS)
#pragma unroll
    for (int j = 0; j < MT; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) red[split ? 8 + warp : warp][j * 4 + e][lane] = acc[j][e];
    __syncthreads();
    if (live) {
#pragma unroll
      for (int j = 0; j < MT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] = 0.f;
      for (int w = warp * G / U; w <= ((warp + 1) * G - 1) / U; w++) {
        const int slot = (w * U) / G == warp ? w : 8 + w;  // tile i is run w's first tile, or its second
#pragma unroll
        for (int j = 0; j < MT; j++)
#pragma unroll
          for (int e = 0; e < 4; e++) acc[j][e] += red[slot][j * 4 + e][lane];
      }
    }
  } else if (KSW > 1) {
#pragma unroll
    for (int j = 0; j < MT; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) red[warp][j * 4 + e][lane] = acc[j][e];
    __syncthreads();
    if (ks != 0) return;
    for (int w = 1; w < KSW; w++)
#pragma unroll
      for (int j = 0; j < MT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] += red[warp + w][j * 4 + e][lane];
  }
  if (!live) {
    GEMV_TRACE_END(0)
    return;
  }
#if GEMV_EPI_EARLY
  // the h values before the split-K handshake, so that their round trip runs under the fence and the counter's
  // atomic instead of after the partials' loads (no other block writes these rows, and this one only below)
  if (!PREV_AT_WAIT) load_prev();
#endif
#if CLUSTER_OK
  if (!VB && KSB > 1 && cluster_size() == (u32)KSB) {
    // launched as clusters of the tile's KSB blocks (DecodeKernels gemv_cluster; rank = blockIdx.y): each block's
    // partial to its own red[warp] (this warp's slot, no other warp reads it now), one cluster barrier, and the K
    // slice 0 block sums the KSB partials from the blocks' shared memory in y order, as the handshake below sums
    // them from ws: the same bits, without the global fence, the counter's atomic and the L2 round trips. A second
    // barrier keeps every block's shared memory alive until those loads are done.
#pragma unroll
    for (int j = 0; j < MT; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) red[warp][j * 4 + e][lane] = acc[j][e];
    cluster_sync();
    if (by == 0) {
      const u32 base = (u32)__cvta_generic_to_shared(&red[warp][0][lane]);
#pragma unroll
      for (int j = 0; j < MT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] = 0.f;
      for (int y = 0; y < KSB; y++)
#pragma unroll
        for (int j = 0; j < MT; j++)
#pragma unroll
          for (int e = 0; e < 4; e++) acc[j][e] += cluster_ld(base + (u32)((j * 4 + e) * 32 * 4), (u32)y);
    }
    if (GEMV_CLUSTER_B0WAIT || by != 0) cluster_sync();
    else cluster_arrive();
    if (by != 0) {
      GEMV_TRACE_END(0)
      return;
    }
  } else
#endif
  if (KSB > 1) {
    float* mine = ws + ((size_t)by * ntiles + tile) * (MT * 4 * 32);
#pragma unroll
    for (int j = 0; j < MT; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) mine[(j * 4 + e) * 32 + lane] = acc[j][e];
#if GEMV_SPLITK_NOHS
    // timing probe (wrong values): no handshake; the partials stored, the K slice 0 block runs the epilogue on its own
    // part: what a consumer-side reduction (the next kernel summing the partials after its PDL wait) could save here
    if (by != 0) {
      GEMV_TRACE_END(0)
      return;
    }
#else
    SPLITK_FENCE();
    u32 prev = 0;
    if (lane == 0) prev = atomicAdd(cnt + tile, 1u);
    prev = __shfl_sync(0xffffffffu, prev, 0);
    if (prev != (u32)(KSB - 1)) {
      GEMV_TRACE_END(0)
      return;
    }
    SPLITK_FENCE();
    const volatile float* all = ws;
#pragma unroll
    for (int j = 0; j < MT; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[j][e] = 0.f;
#if GEMV_RED_BATCH
    // GEMV_RED_BATCH partials' loads issued together, then added in y order (the same sums in the same order as one
    // at a time): with the loop below ptxas unrolled by 2, so KSB 3-4 (the 3B's / 14B's down) waited for two L2
    // round trips in a row on the step's path (gemv_phases: down's last block ended ~2 us after its loop)
    for (int y0 = 0; y0 < KSB; y0 += GEMV_RED_BATCH) {
      float pv[GEMV_RED_BATCH][MT * 4];
#pragma unroll
      for (int i = 0; i < GEMV_RED_BATCH; i++) {
        const volatile float* p = all + ((size_t)(y0 + i) * ntiles + tile) * (MT * 4 * 32);
#pragma unroll
        for (int k = 0; k < MT * 4; k++) pv[i][k] = y0 + i < KSB ? p[k * 32 + lane] : 0.f;
      }
#pragma unroll
      for (int i = 0; i < GEMV_RED_BATCH; i++)
        if (y0 + i < KSB) {
#pragma unroll
          for (int j = 0; j < MT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[j][e] += pv[i][j * 4 + e];
        }
    }
#else
    for (int y = 0; y < KSB; y++) {
      const volatile float* p = all + ((size_t)y * ntiles + tile) * (MT * 4 * 32);
#pragma unroll
      for (int j = 0; j < MT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] += p[(j * 4 + e) * 32 + lane];
    }
#endif
    if (lane == 0) cnt[tile] = 0u;
#endif
  }
  GEMV_TRACE_EPI()
  const int tok0 = 2 * t;
  if (EPI == EPI_SILU) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int n = row0 + g + 8 * (e >> 1), b = tok0 + (e & 1);
      if (b < B) {
        const float gt = __fmul_rn(acc[0][e], rs[e & 1]), up = __fmul_rn(acc[1][e], rs[e & 1]);
        out_h[(size_t)b * tile_stride + n] = f2h(silu_d(gt) * up);
      }
    }
    GEMV_TRACE_END(1)
    return;
  }
  float best0 = -3.0e38f, best1 = -3.0e38f;
  int bi0 = 0, bi1 = 0;
#if !GEMV_EPI_EARLY
  load_prev();
#endif
  // deferred norm (resid with nw): the next norm's weight of this lane's rows and sc of its tokens, in the same
  // round trip as the h loads; q = this lane's sums of squares of the new h per token
  const bool defer = EPI == EPI_RESID && nw != nullptr;
  float nwv[MT][2], scv[2], q[2] = {0.f, 0.f};
  if (defer) {
#if GEMV_EPI_EARLY
#pragma unroll
    for (int j = 0; j < MT; j++)
#pragma unroll
      for (int h = 0; h < 2; h++) nwv[j][h] = epc[j][h];
#pragma unroll
    for (int i = 0; i < 2; i++) scv[i] = tok0 + i < B ? rsw[warp][tok0 + i] : 0.f;
#else
#pragma unroll
    for (int j = 0; j < MT; j++)
#pragma unroll
      for (int h = 0; h < 2; h++) nwv[j][h] = nw[row0 + j * 16 + g + 8 * h];
#if GEMV_SS_PAIR
    unsigned long long sv[2] = {0ull, 0ull};  // both tokens' sums loaded before either is used (GEMV_SS_PAIR)
#pragma unroll
    for (int i = 0; i < 2; i++)
      if (tok0 + i < B) sv[i] = __ldcg(ss + tok0 + i);
#pragma unroll
    for (int i = 0; i < 2; i++) scv[i] = tok0 + i < B ? rstd_fix(sv[i], N, eps) * DEFER_SC : 0.f;
#else
#pragma unroll
    for (int i = 0; i < 2; i++) scv[i] = tok0 + i < B ? rstd_fix(__ldcg(ss + tok0 + i), N, eps) * DEFER_SC : 0.f;
#endif
#endif
  }
#pragma unroll
  for (int j = 0; j < MT; j++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int n = row0 + j * 16 + g + 8 * (e >> 1), b = tok0 + (e & 1);
      float y = acc[j][e];
      if (EPI == EPI_STORE) {
        // explicit roundings: left to the compiler, y * rs + bias became an FMUL and an FADD for e = 0 and FFMAs for
        // e = 1..3, so a token in an odd column (a verify row) rounded differently from column 0 (the one-token
        // step) under the deferred norm (rs != 1; with rs = 1 both give round(y + bias)): the H200's parting
#if GEMV_EPI_EARLY
        y = bias ? __fmaf_rn(y, rs[e & 1], epc[j][e >> 1]) : __fmul_rn(y, rs[e & 1]);
#else
        y = bias ? __fmaf_rn(y, rs[e & 1], h2f(bias[n])) : __fmul_rn(y, rs[e & 1]);
#endif
        if (b < B) out_h[(size_t)b * N + n] = f2h(y);
      } else if (EPI == EPI_RESID) {
        if (b < B) {
          const float hn = (GEMV_RESID_LOADS ? prev[j][e] : out_f[(size_t)b * N + n]) + y;
          out_f[(size_t)b * N + n] = hn;
          if (defer) {
            xn[(size_t)b * N + n] = f2h(hn * nwv[j][e >> 1] * scv[e & 1]);
            q[e & 1] = fmaf(hn, hn, q[e & 1]);
          }
        }
      } else {
        if (b < B) out_f[(size_t)b * N + n] = y;
        if (e & 1) { if (y > best1) { best1 = y; bi1 = n; } }
        else { if (y > best0 || (y == best0 && n < bi0)) { best0 = y; bi0 = n; } }
      }
    }
  }
  if (defer) {  // the tile's sums of squares per token: lanes of one t hold the same tokens (xor over g)
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      q[0] += __shfl_xor_sync(0xffffffffu, q[0], o);
      q[1] += __shfl_xor_sync(0xffffffffu, q[1], o);
    }
    if (g == 0) {
      if (tok0 < B) atomicAdd(ss + 8 + tok0, to_fix(q[0]));
      if (tok0 + 1 < B) atomicAdd(ss + 8 + tok0 + 1, to_fix(q[1]));
    }
  }
  if (EPI == EPI_LOGITS) {
    unsigned long long k0 = argmax_key(best0, bi0), k1 = argmax_key(best1, bi1);
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      unsigned long long o0 = __shfl_xor_sync(0xffffffffu, k0, o), o1 = __shfl_xor_sync(0xffffffffu, k1, o);
      k0 = o0 > k0 ? o0 : k0;
      k1 = o1 > k1 ? o1 : k1;
    }
    if (g == 0) {
      if (tok0 < B) atomicMax(keys + tok0, k0);
      if (tok0 + 1 < B) atomicMax(keys + tok0 + 1, k1);
    }
  }
  GEMV_TRACE_END(1)
}

// W8 with two tiles per warp needs more than 128 registers (it spilled at 2 blocks per SM): 1 block per SM.
// nw, eps, xn, ss: the deferred rmsnorm (gemv_body; ss null: off). pf: an L2 prefetch descriptor or null
// (decode_common.cu l2_prefetch).
// launch bounds by tile count (MT = 1 or 2, pasted) and for the balanced gate_up
#define GEMV_BOUNDS(BITS, MT) GEMV_BOUNDS_MT##MT(BITS)
#define GEMV_BOUNDS_MT2(BITS) __launch_bounds__(256, BITS == 8 ? 1 : GEMV_MINB2)
#if GEMV_MAXNREG1
#define GEMV_BOUNDS_MT1(BITS) __maxnreg__(GEMV_MAXNREG1)
#else
#define GEMV_BOUNDS_MT1(BITS) __launch_bounds__(256, 2)
#endif
#if GEMV_BAL_MAXNREG
#define GEMV_BOUNDS_BAL(BITS, MT) __maxnreg__(GEMV_BAL_MAXNREG)
#else
#define GEMV_BOUNDS_BAL(BITS, MT) GEMV_BOUNDS(BITS, MT)
#endif
#define GEMVGKB(NAME, BITS, MT, EPI, GS, SF, BAL) GEMVGKBB(NAME, BITS, MT, EPI, GS, SF, BAL, GEMV_BOUNDS)
#define GEMVGKBB(NAME, BITS, MT, EPI, GS, SF, BAL, BOUNDS)                                                 \
  extern "C" __global__ void BOUNDS(BITS, MT) NAME(                                                        \
      const u32* qw, const h16* sc, const h16* mn, const h16* bias, const h16* x, int N, int K, int B,     \
      int KSW, int tile_stride, h16* out_h, float* out_f, unsigned long long* keys, float* ws, u32* cnt,   \
      const float* nw, float eps, h16* xn, unsigned long long* ss, const long long* pf) {                  \
    gemv_body<BITS, MT, EPI, GS, SF, NST_OF(MT), false, BAL>(qw, sc, mn, bias, x, N, K, B, KSW, tile_stride, \
                                                            out_h, out_f, keys, ws, cnt, nw, eps, xn, ss, pf); \
  }
#define GEMVGK(NAME, BITS, MT, EPI, GS, SF) GEMVGKB(NAME, BITS, MT, EPI, GS, SF, false)
// the balanced schedule's gate_up (BAL above): NAME_bal beside each silu GEMV
#if GEMV_BAL
#define GEMV_SILU(NAME, BITS, GS, SF) \
  GEMVGK(NAME, BITS, 2, EPI_SILU, GS, SF) GEMVGKBB(NAME##_bal, BITS, 2, EPI_SILU, GS, SF, true, GEMV_BOUNDS_BAL)
#else
#define GEMV_SILU(NAME, BITS, GS, SF) GEMVGK(NAME, BITS, 2, EPI_SILU, GS, SF)
#endif
#define GEMVG(NAME, BITS, MT, EPI, GS) GEMVGK(NAME, BITS, MT, EPI, GS, SF_PLAIN)
#define GEMV(NAME, BITS, MT, EPI) GEMVG(NAME, BITS, MT, EPI, 128)
// GGUF layouts (bits, group): names gemv_w{bits}g{group}_{epi}[_mt2]
#define GEMV_GGUF(B, G)                                 \
  GEMVG(gemv_w##B##g##G##_store, B, 1, EPI_STORE, G)    \
  GEMVG(gemv_w##B##g##G##_resid, B, 1, EPI_RESID, G)    \
  GEMV_SILU(gemv_w##B##g##G##_silu, B, G, SF_PLAIN)     \
  GEMVG(gemv_w##B##g##G##_logits, B, 2, EPI_LOGITS, G)  \
  GEMVG(gemv_w##B##g##G##_store_mt2, B, 2, EPI_STORE, G) \
  GEMVG(gemv_w##B##g##G##_resid_mt2, B, 2, EPI_RESID, G)
// the KQ forms (kq_scales): names gemv_w{bits}k{group}_{epi}[_mt2]; the SYM forms (F = s): gemv_w{bits}s{group}_..
#define GEMV_SF(B, G, F, SF)                                        \
  GEMVGK(gemv_w##B##F##G##_store, B, 1, EPI_STORE, G, SF)    \
  GEMVGK(gemv_w##B##F##G##_resid, B, 1, EPI_RESID, G, SF)    \
  GEMV_SILU(gemv_w##B##F##G##_silu, B, G, SF)               \
  GEMVGK(gemv_w##B##F##G##_logits, B, 2, EPI_LOGITS, G, SF)  \
  GEMVGK(gemv_w##B##F##G##_store_mt2, B, 2, EPI_STORE, G, SF) \
  GEMVGK(gemv_w##B##F##G##_resid_mt2, B, 2, EPI_RESID, G, SF)
#define GEMV_KQ(B, G) GEMV_SF(B, G, k, SF_KQ)
#define GEMV_SYM(B, G) GEMV_SF(B, G, s, SF_SYM)

// Which GEMVs a module holds. The engine's module (DecodeKernels) has our W4 / W3 and the GGUF byte layouts; the GGUF
// packings' W6, KQ and SYM GEMVs (EngineConfig.gguf_pack "6bit" / "kquant", 56 kernels with their balanced gate_ups)
// come in a second module compiled on first use with GEMV_ONLY_PACKS=1 (this file with decode_common.cu and
// decode_norm.cu), so a first start does not compile them for nobody (NVRTC + ptxas of the whole module: ~8 s without
// them, ~13 s with them on two cores). GEMV_PACKS=1 puts them in the engine's module too (nvrtc_check, sass_same: every
// kernel in one pass).
#ifndef GEMV_PACKS
#define GEMV_PACKS 0
#endif
#ifndef GEMV_ONLY_PACKS
#define GEMV_ONLY_PACKS 0
#endif
// The int8-activation GEMVs (q8_kloop; EngineConfig.decode_q8, off by default) likewise: a module of their own
// compiled on first use with GEMV_ONLY_Q8=1 (DecodeKernels.load_q8; ~1.2 s of NVRTC + ptxas that a first start would
// otherwise pay for a switch few turn on); GEMV_Q8=1 puts them in the engine's module (nvrtc_check, sass_mix).
#ifndef GEMV_Q8
#define GEMV_Q8 0
#endif
#ifndef GEMV_ONLY_Q8
#define GEMV_ONLY_Q8 0
#endif
#if !GEMV_ONLY_PACKS && !GEMV_ONLY_Q8
GEMV(gemv_w4_store, 4, 1, EPI_STORE)
GEMV(gemv_w4_resid, 4, 1, EPI_RESID)
GEMV_SILU(gemv_w4_silu, 4, 128, SF_PLAIN)
GEMV(gemv_w4_logits, 4, 2, EPI_LOGITS)
GEMV(gemv_w3_store, 3, 1, EPI_STORE)
GEMV(gemv_w3_resid, 3, 1, EPI_RESID)
GEMV_SILU(gemv_w3_silu, 3, 128, SF_PLAIN)
GEMV(gemv_w3_logits, 3, 2, EPI_LOGITS)
GEMV(gemv_w4_store_mt2, 4, 2, EPI_STORE)
GEMV(gemv_w4_resid_mt2, 4, 2, EPI_RESID)
GEMV(gemv_w3_store_mt2, 3, 2, EPI_STORE)
GEMV(gemv_w3_resid_mt2, 3, 2, EPI_RESID)

GEMV_GGUF(4, 32)
GEMV_GGUF(8, 32)
GEMV_GGUF(8, 16)

#endif
#if GEMV_Q8 || GEMV_ONLY_Q8
// int8 activations (q8_kloop; EngineConfig.decode_q8): gemv_w4q8_* for one token, gemv_w4q8b_* for 2..8 (the same
// arithmetic per token: a token's bits whatever the batch)
#define GEMVQ8G(NAME, MT, EPI, NB, GS, SF)                                                                 \
  extern "C" __global__ void GEMV_BOUNDS(4, MT) NAME(                                                      \
      const u32* qw, const h16* sc, const h16* mn, const h16* bias, const h16* x, int N, int K, int B,     \
      int KSW, int tile_stride, h16* out_h, float* out_f, unsigned long long* keys, float* ws, u32* cnt,   \
      const float* nw, float eps, h16* xn, unsigned long long* ss, const long long* pf) {                  \
    gemv_body<4, MT, EPI, GS, SF, NST_OF(MT), false, false, NB>(                                           \
        qw, sc, mn, bias, x, N, K, B, KSW, tile_stride, out_h, out_f, keys, ws, cnt, nw, eps, xn, ss, pf); \
  }
// one layout's ten: names gemv_w4{L}q8_{epi}[_mt2] (one token) and gemv_w4{L}q8b_.. (2..8), L = "" (g128), g32 (the
// plain GGUF Q4 repack), k32 (Q4_K's KQ form), s32 (Q4_0's SYM form): in groups of 32 a lane's 32 codes of a block are
// one group, so its scale and min (load_frag: the lane's own) meet its own x block's (dx, sx) in the same sum
#define GEMVQ8L(L, GS, SF)                                              \
  GEMVQ8G(gemv_w4##L##q8_store, 1, EPI_STORE, 1, GS, SF)                \
  GEMVQ8G(gemv_w4##L##q8_resid, 1, EPI_RESID, 1, GS, SF)                \
  GEMVQ8G(gemv_w4##L##q8_silu, 2, EPI_SILU, 1, GS, SF)                  \
  GEMVQ8G(gemv_w4##L##q8_store_mt2, 2, EPI_STORE, 1, GS, SF)            \
  GEMVQ8G(gemv_w4##L##q8_resid_mt2, 2, EPI_RESID, 1, GS, SF)            \
  GEMVQ8G(gemv_w4##L##q8b_store, 1, EPI_STORE, 8, GS, SF)               \
  GEMVQ8G(gemv_w4##L##q8b_resid, 1, EPI_RESID, 8, GS, SF)               \
  GEMVQ8G(gemv_w4##L##q8b_silu, 2, EPI_SILU, 8, GS, SF)                 \
  GEMVQ8G(gemv_w4##L##q8b_store_mt2, 2, EPI_STORE, 8, GS, SF)           \
  GEMVQ8G(gemv_w4##L##q8b_resid_mt2, 2, EPI_RESID, 8, GS, SF)
GEMVQ8L(, 128, SF_PLAIN)
GEMVQ8L(g32, 32, SF_PLAIN)
GEMVQ8L(k32, 32, SF_KQ)
GEMVQ8L(s32, 32, SF_SYM)
#endif
#if GEMV_PACKS || GEMV_ONLY_PACKS
GEMV_GGUF(6, 32)  // the 6-bit repacks (EngineConfig.gguf_pack "6bit", "kquant")
GEMV_GGUF(6, 16)
GEMV_KQ(4, 32)  // the KQ forms (EngineConfig.gguf_pack "kquant")
GEMV_KQ(6, 32)
GEMV_KQ(6, 16)
GEMV_SYM(4, 32)  // the SYM forms (EngineConfig.gguf_pack "kquant": Q4_0 / Q5_0 / Q8_0)
GEMV_SYM(6, 32)
GEMV_SYM(8, 32)
#endif
