// Small decode kernels: embedding gather (dequantized), RMSNorm, and the argmax-key reset.
// References: kernels/decode_reference.py (embed_ref, rmsnorm_ref). Compiled after decode_common.cu
// (h16, u32, h2f, f2h and the PDL macros come from there).

// h[b, :] = dequant(embed row tokens[b]) (fp32 residual stream); also clears the argmax keys of this step.
// grid B, block 256. bits 4 | 3 | 6 | 8 | 16 (fp16 weight in `dense`); gs: group size along D (128, 32, 16); kq 1: the
// K-quants' integer sub-scales in sc and their fp16 factors per 256 in mn (kernels/pack.py KQ); kq 2: no mins (SYM).
// meta != null: a greedy chain step (GPUModel.decode_chain): row b's token is the previous step's argmax (keys[b],
// decoded as keys_to_ids does; an id outside the vocab -- a key never set -- reads row 0) and the row moves one
// position on: meta[0][b] = that id, meta[1][b] += 1 (cache row), meta[3][b] += 1 (sequence position); meta is
// int32 [5, mstride]. Block b alone reads and clears keys[b], so blocks do not race.
// nw != null: the decode step's deferred rmsnorm starts here (decode_norm.cu defer_norm_row: x, ss [P, 8]).
// EMBED_TRIGGER_LATE (default 1; 0 the old early trigger): the PDL trigger after the chain step's meta writes instead
// of first thing. The attention kernels read pos (meta[1]) BEFORE their PDL wait, to prefetch the K/V rows of earlier
// steps (the long-context merge launch reads it there too, for its run lengths), and a dependent grid may start once
// its predecessor has triggered, not finished: embed (trigger) -> qkv GEMV (starts, triggers) -> layer 0's attention
// (starts, reads pos) can run while this kernel has yet to move the position on. The window is small (thread 0 writes
// meta within one L2 round trip of the block's start, the two launches in between take longer; chained tokens have
// always equalled the host loop's on the device), but only the late trigger closes it by construction, at the cost of
// the qkv GEMV's weight loads starting that much later: not measurable (H100 replay ms, decode_ab_epi_h100.json: 3B W4
// 1.229 both ways, 7B W4 1.975 vs 1.957 alone, and within the others' noise together with them).
#ifndef EMBED_TRIGGER_LATE
#define EMBED_TRIGGER_LATE 1
#endif
extern "C" __global__ void embed_rows(const int* tokens, const u32* __restrict__ qw,
                                      const h16* __restrict__ sc, const h16* __restrict__ mn,
                                      const h16* __restrict__ dense, int bits, int gs, int kq, int D,
                                      float* __restrict__ h,
                                      unsigned long long* __restrict__ keys, int* meta, int mstride, int vocab,
                                      const float* __restrict__ nw, float eps, h16* __restrict__ xn,
                                      unsigned long long* ss, int P) {
#if !EMBED_TRIGGER_LATE
  PDL_TRIGGER();
#endif
  PDL_WAIT();
  const int b = blockIdx.x;
  size_t r;
  if (meta != nullptr) {
    const u32 id = 0xFFFFFFFFu - (u32)(keys[b] & 0xFFFFFFFFull);
    r = id < (u32)vocab ? (size_t)id : 0;
    __syncthreads();  // every thread read keys[b] before thread 0 clears it below
    if (threadIdx.x == 0) {
      meta[b] = (int)r;
      meta[mstride + b] += 1;
      meta[3 * mstride + b] += 1;
#if EMBED_TRIGGER_LATE
      __threadfence();  // the moved positions visible before any dependent grid can start (below)
#endif
    }
  } else {
    r = (size_t)tokens[b];
  }
#if EMBED_TRIGGER_LATE
  __syncthreads();
  PDL_TRIGGER();
#endif
  if (threadIdx.x == 0) keys[b] = 0ull;
  for (int k = threadIdx.x; k < D; k += blockDim.x) {
    float v;
    if (bits == 16) {
      v = h2f(dense[r * D + k]);
    } else {
      const int G = D / gs;
      u32 q;
      if (bits == 8) {
        q = (qw[r * (D >> 2) + (k >> 2)] >> (8 * (k & 3))) & 0xFF;
      } else if (bits == 4) {
        q = (qw[r * (D >> 3) + (k >> 3)] >> (4 * (k & 7))) & 0xF;
      } else if (bits == 6) {
        // W6 (kernels/pack.py): block k / 128 is 24 words; the nibble as W4 in words 0..15, the high bits of
        // k = 32 t + 16 h + 8 u + 4 v + j in word 16 + 2 t + h at bit 16 v + 2 slot(4 u + j)
        const u32* w = qw + (r * (size_t)(D >> 7) + (k >> 7)) * 24;
        const int kk = k & 127, i = kk & 15, l = 4 * (i >> 3) + (i & 3);
        const int bit = 16 * ((i >> 2) & 1) + 2 * ((l >> 1) + 4 * (l & 1));
        q = ((w[kk >> 3] >> (4 * (kk & 7))) & 0xF) | (((w[16 + (kk >> 4)] >> bit) & 3) << 4);
      } else {
        // layout 3 (kernels/pack.py): row r is half hh of pair (r / 16) * 8 + r % 8; its group grp = k / 128 is 24
        // words: block t = (k / 32) % 4's w0, w1 at 4 t + 2 hh (+1), its w2 at 16 + 2 t + hh
        const int hh = (int)((r >> 3) & 1), t = (k >> 5) & 3;
        const u32* w = qw + (((r >> 4) * 8 + (r & 7)) * (size_t)(D >> 7) + (k >> 7)) * 24;
        const int j = k & 31, p = j & 15, hs = j & 16;
        const u32 w0 = w[4 * t + 2 * hh], w1 = w[4 * t + 2 * hh + 1], w2 = w[16 + 2 * t + hh];
        if (p < 15) {
          q = ((p < 5 ? w0 : p < 10 ? w1 : w2) >> (3 * (p % 5) + hs)) & 7;
        } else {
          q = ((w0 >> (15 + hs)) & 1) | (((w1 >> (15 + hs)) & 1) << 1) | (((w2 >> (15 + hs)) & 1) << 2);
        }
      }
      if (kq == 2) {  // kernels/pack.py SYM: the min made from the scale (exact)
        const float s = h2f(sc[r * G + k / gs]);
        v = (float)q * s + s * -(float)(1 << (bits - 1));
      } else if (kq) {  // kernels/pack.py KQ: the group's scale and min made from the integer sub-scales (as kq_scales)
        const size_t sb = r * (size_t)(D >> 8) + (k >> 8);
        float s, m;
        if (gs == 32) {  // uint8 (sc, m) per 32, (d, dmin) per 256 (Q4_K / Q5_K)
          const unsigned char* p = reinterpret_cast<const unsigned char*>(sc) + (r * (size_t)(D >> 5) + (k >> 5)) * 2;
          s = h2f(f2h(h2f(mn[2 * sb]) * (float)p[0]));
          m = h2f(f2h(-(h2f(mn[2 * sb + 1]) * (float)p[1])));
        } else {  // int8 sc per 16, d per 256 (Q6_K)
          const signed char* p = reinterpret_cast<const signed char*>(sc) + r * (size_t)(D >> 4);
          const float a = h2f(mn[sb]) * (float)p[k >> 4];
          s = h2f(f2h(a));
          m = h2f(f2h(-32.f * a));
        }
        v = (float)q * s + m;
      } else {
        v = (float)q * h2f(sc[r * G + k / gs]) + h2f(mn[r * G + k / gs]);
      }
    }
    h[(size_t)b * D + k] = v;
  }
  if (nw != nullptr) defer_norm_row(h, nw, D, eps, xn, ss, P, b);
}

// x[b] = fp16(h[b] * rsqrt(mean(h[b]^2) + eps) * w): grid B (a block per row), block 256 (decode_norm.cu).
// NORM_ROW1 (default): rmsnorm_row1, the weight loaded before the PDL wait and h read once (same bits); 0: the
// shared rmsnorm_rows_block (timing comparisons).
#ifndef NORM_ROW1
#define NORM_ROW1 1
#endif
extern "C" __global__ void rmsnorm_rows(const float* __restrict__ h, const float* __restrict__ w, int D, float eps,
                                        int B, h16* __restrict__ x) {
  PDL_TRIGGER();
#if NORM_ROW1
  if (D <= 1024 * NORM1_MAXI) {
    if ((int)blockIdx.x < B) rmsnorm_row1(h, w, D, eps, x, blockIdx.x);
    else PDL_WAIT();
    return;
  }
#endif
  PDL_WAIT();
  if ((int)blockIdx.x < B) rmsnorm_rows_block(h, w, D, eps, x, blockIdx.x, 1);
}

// host[(meta[mstride] & 1) * hstride + b] = keys[b], b < B: a greedy chain step's last kernel (GPUModel.decode_chain,
// chain_keys "kernel"): its argmax keys straight into pinned host memory (a cudaHostAlloc pointer, usable in kernels
// under unified addressing), in the row of its cache row's parity (embed_rows moved meta[1] on: steps alternate), so
// no device -> host copy sits between two chained graphs. At 16k cached rows that copy and its event cost the 3B step
// 11 us on an H100 (chain_gap_h100.json: 1.385 ms replayed back to back, 1.396 with the copy). grid 1, block 32.
extern "C" __global__ void keys_host(const unsigned long long* __restrict__ keys, unsigned long long* host,
                                     const int* __restrict__ meta, int mstride, int hstride, int B) {
  PDL_TRIGGER();
  PDL_WAIT();  // the lm_head's argmax atomics complete
  const int b = threadIdx.x;
  if (b < B) host[(size_t)(meta[mstride] & 1) * hstride + b] = keys[b];
}

// h[b, :] = src[b, :] (fp32 rows staged from the host: the embedding kept in host RAM, engine/host_embed.py);
// also clears the argmax keys of this step. grid B, block 256. First kernel of a step, like embed_rows (and like it
// starts the deferred rmsnorm where nw != null).
extern "C" __global__ void copy_rows(const float* __restrict__ src, int D, float* __restrict__ h,
                                     unsigned long long* __restrict__ keys, const float* __restrict__ nw, float eps,
                                     h16* __restrict__ xn, unsigned long long* ss, int P) {
  PDL_TRIGGER();
  PDL_WAIT();
  const int b = blockIdx.x;
  if (threadIdx.x == 0) keys[b] = 0ull;
  const float4* s = reinterpret_cast<const float4*>(src + (size_t)b * D);
  float4* d = reinterpret_cast<float4*>(h + (size_t)b * D);
  for (int k = threadIdx.x; k < D / 4; k += blockDim.x) d[k] = s[k];
  if (nw != nullptr) defer_norm_row(h, nw, D, eps, xn, ss, P, b);
}
