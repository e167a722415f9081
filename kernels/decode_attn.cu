// GQA decode attention over the static KV cache: one-pass split-K flash-decoding, rotary and the KV write fused.
// Reference: kernels/decode_reference.py attention_ref (engine/layers.py Rotary + gqa_attention).
//
// grid (nsplit, Hkv, B), block 256 (8 warps). The host picks nsplit so that the grid is one wave of one
// block per SM (attn_splits in decode_kernels.py: SMs / (Hkv B)); each block then streams one long contiguous
// run of K/V rows with the next chunk's loads in flight while the current chunk is scored. (The earlier
// kernel used up to 256 splits of 64 rows: four waves of short blocks, each a chain of dependent latencies,
// about 260 GB/s at 16k tokens, estimated from its decode rate.)
//
// Token b sits at position pos[b] of cache slot slots[b]. Positions 0..pos[b] go in nact <= nsplit runs of sl
// rows (sl a multiple of CHUNK = ATT_CH * PPI rows); blocks past nact exit. The block whose run holds pos[b]
// ropes the new k and writes k and v into the cache. Lane (r = lane / LPR, l = lane % LPR) owns dims
// 8l..8l+7 of row r of its warp's RPW rows per iteration; PPI = 8 warps * RPW rows per iteration.
// (That lane layout is the FMA loop, -DATT_MMA=0; by default a run is scored on the tensor cores in 16-row tiles:
// "the split schedule on the tensor cores" below.)
// Softmax is online per warp: a running max m and sum per query head, the same in every lane of a warp (the
// chunk max is reduced across the warp's row groups), so a lane's acc only ever needs the warp's own scale.
// The 8 warps merge through shared memory; with nact == 1 the block writes the output, otherwise it writes
// its partial (o unnormalised, M, sum) and the last block to arrive (atomic counter per (b, kv head), reset
// to 0 by that block) merges the nact partials.
// TREE (the _tree entry points, speculative verification): the B rows of the step are tokens of ONE slot at
// consecutive cache rows (the last accepted token and its drafts, a chain or a tree). A row of this step is never
// read back from the cache: a block rebuilds it from qkv (rope at its logical position, rope_lo/rope_hi, the bits
// the write stores), so no block waits for another's write, and the block holding a token's logical position
// writes its row like the default kernel. Draft trees: row b of the step is node b of a tree whose root (b = 0)
// sits in cache row base = pos[b] - b; node b attends to its own ancestors only. rpos[b] = base + depth(b) is its
// sequence position (rope, and L = rpos[b] + 1 logical rows), and path[b] packs the node of each depth j = 1..depth(b)
// on its root path, 3 bits each (bits 3(j-1)..3j-1). Logical row q < base is cache row q; q >= base is node
// step_node(q) (the root, then the path) of this step, from qkv. The block streams exactly the rows, in the order
// and with the split schedule, of a one-token step at position rpos[b] after the path's tokens: the same bits. A
// chain (rpos = pos, path = the identity 1, 2, .., 7) is the plain verification. TREE = false is the default
// kernel, unchanged. (Before: a kv_write_rows kernel per layer wrote all rows first: one launch more per layer.)

#define ATT_REPM 8  // max query heads per KV head
#define ATT_MAX_SPLITS 256  // = decode_kernels.py ATT_MAX_SPLITS
#ifndef ATT_CH
#define ATT_CH 4  // iterations per chunk: a chunk's K/V loads are issued together
#endif
#ifndef ATT_SPLIT_MAJOR
#define ATT_SPLIT_MAJOR 1  // blocks in split-major order (attn_body); 0: (split, kvh, b) = blockIdx (timing A/B)
#endif
#define ATT_NEG -1.0e30f  // "no score yet" (finite: exp(NEG - NEG) must not be NaN)
// Short contexts (L = position + 1 <= ATT_SHORT rows): one block per QUERY head instead of one per (split, KV head),
// each over all L rows in one run (the schedule with nsplit = 1, attention_split_ref). At 64 rows the split kernel
// is one block per KV head doing all rep heads' work in one chain (5.4 us on the 3B where torch's flash takes 3.8);
// here rep blocks share it, each with a REPM = 1 body (a fraction of the instructions and registers), no block
// merges with another, and every block rebuilds the new row's k/v from qkv (step_row) instead of reading back the
// write, which only the head-0 block does. Same mode for a row of a plain step and of a verify step (both decide
// by L): same bits. 0: off.
#ifndef ATT_SHORT
#define ATT_SHORT 256
#endif
// 0 (an A/B): the short-context mode's blocks do not trigger the next launch (PDL) at their start, so o_proj's blocks
// are placed only once they have exited, on every SM, instead of beside them on the SMs they leave free (the 14B's o:
// 160 blocks on 92 SMs, 1.96 TB/s, while its 40 attention blocks ran: gemv_phases_14b_onewave_h100.json). Measured
// slower (decode_ab_hptrig_h100.json, step replay: 14B 3.418 vs 3.325 ms, 3B 1.120 vs 1.081, 7B level): o then spans
// 132 SMs but starts late (gemv_phases_14b_hpt0_h100.json: o 10.7 us instead of 7.1)
#ifndef ATT_HP_TRIGGER
#define ATT_HP_TRIGGER 1
#endif

__device__ __forceinline__ void unpack8(const uint4 u, float* f) {
  const u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int j = 0; j < 4; j++) { f[2 * j] = h2f((h16)(w[j] & 0xFFFF)); f[2 * j + 1] = h2f((h16)(w[j] >> 16)); }
}

// The cross-block merge's weights for one query head, by one warp: e[s] = exp(M_s - M) over the nact splits' (M, sum)
// pairs at pm (M their max), and den = sum_s e[s] sum_s, lane-strided and xor-reduced; lane 0's den is the one used.
// attn_body's in-kernel merge and attn_merge_body both call it, so both paths give the same bits.
__device__ __forceinline__ float merge_weights(const float* pm, int nact, float* e, int lane) {
  float M = ATT_NEG, den = 0.f;
  float2 ml[ATT_MAX_SPLITS / 32];  // every (M, sum) pair of the lane's splits in one round trip
#pragma unroll
  for (int u = 0; u < ATT_MAX_SPLITS / 32; u++) {
    const int s = lane + 32 * u;
    ml[u] = s < nact ? __ldcg(reinterpret_cast<const float2*>(pm) + s) : make_float2(ATT_NEG, 0.f);
    M = fmaxf(M, ml[u].x);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
#pragma unroll
  for (int u = 0; u < ATT_MAX_SPLITS / 32; u++) {
    const int s = lane + 32 * u;
    if (s < nact) {
      const float x = __expf(ml[u].x - M);
      e[s] = x;
      den = fmaf(x, ml[u].y, den);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) den += __shfl_xor_sync(0xffffffffu, den, o);
  return den;
}

// The grid merge (GPUModel's long-context graphs, DecodeKernels.attention(merge="grid")): instead of one block per
// (token, KV head) merging every split's partials (the in-kernel merge) or a launch of its own (attn_merge), the nact
// blocks of a (token, KV head) meet at a barrier and each merges a slice of its rep x HD outputs, so the merge costs
// one round trip of the slice's partials and no kernel boundary. A barrier inside a launch needs every block of the
// group resident at once: the plain decode grid is one wave (attn_splits: splits x KV heads x tokens <= SMs, one
// block per SM) and every block has started before the next kernel launches (PDL triggers at the start), so blocks
// that wait only wait for blocks that can run. The tree kernel (blocks looping over splits) never takes this path.
// Compiled in only with -DATT_GRID_MERGE=1 (DEEPINFER_KERNEL_DEFINES): its code raises attn_decode_hd128 from 245 to
// 255 registers, so the default kernel stays the one measured until the grid merge has been timed on a GPU (written
// in a session without one; engine/bench/device_gmerge.sh checks and times it).
// Barrier: arrival counter (reset by the last block) + a generation word the last block bumps; gen0 = the
// generation read after the PDL wait, before the __threadfence that precedes the arrival.
__device__ __forceinline__ void att_grid_barrier(u32* cnt, u32* gen, u32 gen0, int nact) {
  if (atomicAdd(cnt, 1u) == (u32)(nact - 1)) {
    *cnt = 0u;
    __threadfence();
    atomicAdd(gen, 1u);
  } else {
    while (*reinterpret_cast<volatile u32*>(gen) == gen0) __nanosleep(32);
  }
  __threadfence();
}

// Block `split`'s slice of the KV head's rep x HD outputs (o0 .. o1 of the flattened (head, dim)), with attn_merge's
// arithmetic operation for operation (merge_weights per head; each output's sum over s in order with fmaf; x (1 / den),
// then fp16): the same bits as the merge launch and the in-kernel merge. sm: >= 2048 + (ceil(rep HD / nact) + 1)
// x nact floats of shared memory (the weights [head][nact] at 0, the slice's partials [s][k] at 2048); dens: rep.
#ifndef ATT_GRID_MERGE
#define ATT_GRID_MERGE 0
#endif
#define ATT_GM_U 6  // partial loads per thread, in one round trip: ceil(rep HD / nact) x nact <= 1536 = 6 x 256
template <int HD>
__device__ __forceinline__ void attn_grid_merge(int b, int kvh, int split, int nact, int nsplit, int H, int rep,
                                                const float* part_o, const float* part_ml, h16* __restrict__ out,
                                                float* sm, float* dens, int tid) {
  const int tot = rep * HD, per = (tot + nact - 1) / nact;
  const int o0 = split * per, o1 = min(tot, o0 + per), nout = o1 - o0;
  if (nout <= 0) return;  // uniform across the block
  const int h0 = o0 / HD, nhb = (o1 - 1) / HD - h0 + 1;  // the slice's heads (kvh rep + h0 ..)
  const size_t hb0 = ((size_t)b * H + (size_t)kvh * rep) * nsplit;
  const int n = nout * nact;
  float v[ATT_GM_U];
#pragma unroll
  for (int u = 0; u < ATT_GM_U; u++) {  // item j = s nout + k: split s, output o0 + k (consecutive dims: coalesced)
    const int j = tid + 256 * u, s = j / nout, k = j - s * nout, oi = o0 + k;
    v[u] = j < n ? __ldcg(part_o + (hb0 + (size_t)(oi / HD) * nsplit + s) * HD + oi % HD) : 0.f;
  }
  const int warp = tid >> 5, lane = tid & 31;
  if (warp < nhb) {
    const float den = merge_weights(part_ml + (hb0 + (size_t)(h0 + warp) * nsplit) * 2, nact, sm + warp * nact, lane);
    if (lane == 0) dens[warp] = den;
  }
  float* pv = sm + 2048;
#pragma unroll
  for (int u = 0; u < ATT_GM_U; u++)
    if (tid + 256 * u < n) pv[tid + 256 * u] = v[u];
  __syncthreads();
  for (int k = tid; k < nout; k += 256) {
    const int oi = o0 + k, hl = oi / HD - h0;
    const float* eh = sm + hl * nact;
    float o = 0.f;
    for (int s = 0; s < nact; s++) o = fmaf(eh[s], pv[s * nout + k], o);
    const float inv = att_rcp(dens[hl]);
    out[((size_t)b * H + (size_t)kvh * rep) * HD + oi] = f2h(o * inv);
  }
}

// the node of this step that logical row q >= base of tree node b holds: the root (0), then b's root path
__device__ __forceinline__ int step_node(int q, int base, int path) {
  return q == base ? 0 : (path >> (3 * (q - base - 1))) & 7;
}

// k (roped at sequence position q) and v of node n's KV head kvh, dims 8l..8l+7, from the step's qkv: the fp16
// values the write below stores for that token (rope_lo / rope_hi), packed as unpack8 reads them
template <int HD>
__device__ __forceinline__ void step_row(const h16* __restrict__ qkv, int NQKV, int H, int Hkv, int kvh, int n, int q,
                                         const float* __restrict__ cosT, const float* __restrict__ sinT, int l,
                                         uint4& kout, uint4& vout) {
  const h16* kr = qkv + (size_t)n * NQKV + H * HD + kvh * HD;
  const bool lo = 8 * l < HD / 2;
  const int d0 = lo ? 8 * l : 8 * l - HD / 2;  // first dim of the pair's low half
  const uint4 a = *reinterpret_cast<const uint4*>(kr + d0), c = *reinterpret_cast<const uint4*>(kr + d0 + HD / 2);
  float x1[8], x2[8];
  unpack8(a, x1);
  unpack8(c, x2);
  const float* cr = cosT + (size_t)q * (HD / 2) + d0;
  const float* sr = sinT + (size_t)q * (HD / 2) + d0;
  u32 w[4];
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const int e = 2 * j, o = e + 1;
    const h16 ke = lo ? rope_lo(x1[e], x2[e], cr[e], sr[e]) : rope_hi(x1[e], x2[e], cr[e], sr[e]);
    const h16 ko = lo ? rope_lo(x1[o], x2[o], cr[o], sr[o]) : rope_hi(x1[o], x2[o], cr[o], sr[o]);
    w[j] = (u32)ke | ((u32)ko << 16);
  }
  kout = make_uint4(w[0], w[1], w[2], w[3]);
  vout = *reinterpret_cast<const uint4*>(qkv + (size_t)n * NQKV + (H + Hkv) * HD + kvh * HD + 8 * l);
}

// ---- the split schedule on the tensor cores (ATT_MMA; REPM = ATT_REPM only) --------------------------------------
// A warp takes 16-row tiles of its block's run (tiles warp, warp + 8, ..), two in flight (the next tile's loads are
// issued before the current one is scored). Per tile, with lane (g = lane / 4, t = lane % 4) and mma16816's layout:
//   scores S^T [heads (8; A rows 8..15 zero) x 8 rows] = q K^T per half tile j (rows 8j..8j+7), k = HD in HD/16 steps:
//     A = q of head g, B = K of tile row 8j + g; both over the SAME permuted dims, so the sum is the dot product:
//     the lane's uint4 i of a row holds dims 8 (4i + t) .. + 7 (one load instruction covers 64 contiguous bytes of
//     each of 8 rows), and k-step s takes its words 2s, 2s + 1.
//   C gives lane (g, t) head g's scores of tile rows 8j + 2t, 8j + 2t + 1: exactly PV's B fragment (k = tile row,
//     n = head) after exp and a round to fp16, with no shuffle.
//   O^T [dims x heads] += V^T P^T per 16 dims (m-tile w): A[slot][k] = V[tile row k][dim of the slot], slots g and
//     g + 8 = the low / high half of the lane's V word w (uint4 i = w / 4 of a row at dims 8 (8i + g) ..), two rows
//     per register by one PRMT; the lane loads rows 2t, 2t + 1, 2t + 8, 2t + 9.
// Online softmax as in the FMA loop (running max and sum per head, rescale before the PV mma); p is rounded to fp16
// for the mma and the sum adds the rounded values. q is the fp32 qs (roped, scaled) rounded once to fp16. One
// procedure for a plain step and a verify row (rows >= base rebuilt by step_row in both), so a verify row keeps a
// one-token step's bits. Reference: decode_reference.py attention_mma_ref (the roundings), attention_ref.
#ifndef ATT_MMA
#define ATT_MMA 1  // 0: the FMA loop below (timing A/B)
#endif
#ifndef ATT_KPRE
// the in-kernel merge's partials (float4) per thread loaded before its weights (0: all after them). Same process,
// step replay (docs/results/decode_ab_kpre_h200.json): 8 made the 3B 0.7% faster at 512-2k cached rows (1.7% at
// short ones, which never merge: the kernel's code and registers changed), the 7B level to 0.7% faster; 4 was slower
#define ATT_KPRE 8
#endif
#ifndef ATT_MU
#define ATT_MU 8  // partials loaded per unrolled step of the cross-block merge
#endif
#ifndef ATT_ROPE_PRE
// 1 (an experiment; same values): a thread's rope factors at the token's position loaded before the PDL wait
// (attn_body). Level on the H100 (decode_ab_epi_h100.json, replay ms: 3B W4 1.233 vs 1.229, 7B 1.964 vs 1.957): off.
#define ATT_ROPE_PRE 0
#endif
// GEMV_TRACE (timing builds only, engine/bench/gemv_phases.py): thread 0 of every attention block records its start,
// wait return, end of its K/V loop and end into decode_gemv.cu's gemv_trace, as the GEMVs do: N = L (the token's
// rows), K = nact (active splits), EPI 4 (the split kernel), 6 (the short-context mode) or 5 (the merge launch),
// done = the block wrote outputs (no partial left for another block). Same values.
#if GEMV_TRACE
__device__ __forceinline__ void att_trace(const unsigned long long* tt, int L, int nact, int epi, bool done) {
  gemv_trace_write(tt, (unsigned long long)L, (unsigned long long)nact,
                   (unsigned long long)(epi | ((done ? 1 : 0) << 8)));
}
#define ATT_MARK(i) \
  if (threadIdx.x == 0) att_tt[i] = gtimer();
#else
#define ATT_MARK(i)
#endif

#ifndef ATT_TIMING
// timing only (wrong outputs; docs/gpu.md "Where the split kernel's time goes"): 1 no cross-block merge (partials
// written, then exit), 2 tiles loaded but not scored, 3 exit after the preamble (launch, q rope, KV write; the first
// tile's loads are then dead code)
#define ATT_TIMING 0
#endif
#ifndef ATT_MRUN
// runs of the tensor-core split schedule are multiples of this many rows once L >= ATT_MRUN_FROM (0 or below that:
// CHUNK, the FMA loop's: 64 rows at head dim 128, 128 at 64). 128 gives every warp of a 3B / 7B block a tile (at 4k
// rows and 66 splits a 64-row run leaves 4 of 8 warps idle) and halves the partials merged there: 3B at 4k rows 9.4
// -> 8.5 us, but 512 rows 6.8 -> 7.4 (fewer blocks), 16k unchanged (docs/results/gpu_attn_mma_mrun_h200.json); from
// 2,048 rows on it wins or ties on the 3B (2k 7.6 -> 7.3, 3k 8.3 -> 7.6 us) and ties on the 7B within 0.2 us
// (gpu_attn_mrun_lens_h200.json). The run depends on L alone, so plain and verify rows at one position keep the same
// schedule (and bits).
#define ATT_MRUN 128
#endif
#ifndef ATT_MRUN_FROM
#define ATT_MRUN_FROM 2048
#endif

template <int HD>
struct AttTile {
  uint4 k[2][HD / 32];  // tile rows 8j + g, uint4 i = dims 8 (4i + t) .. + 7
  uint4 v[4][HD / 64];  // tile rows 2t, 2t + 1, 2t + 8, 2t + 9, uint4 i = dims 8 (8i + g) .. + 7
};

__device__ __forceinline__ u32 word_of(const uint4& u, int c) { return c == 0 ? u.x : c == 1 ? u.y : c == 2 ? u.z : u.w; }

// N uint4 of row p at octets o0, o0 + os, .. (dims 8 o ..): the cache's row (p < base), this step's row rebuilt from
// qkv (p >= base: its k when KV = 0, its v when 1; only when `rebuild`, else zeros to be loaded again after the PDL
// wait), zeros past the run (p >= s1)
template <int HD, bool TREE, int N, int KV>
__device__ __forceinline__ void att_load_row(uint4* dst, const h16* cache, int p, int o0, int os, int s1, int base,
                                             bool rebuild, const h16* __restrict__ qkv, int NQKV, int H, int Hkv,
                                             int kvh, int b, int pth, const float* __restrict__ cosT,
                                             const float* __restrict__ sinT) {
#pragma unroll
  for (int i = 0; i < N; i++) dst[i] = make_uint4(0, 0, 0, 0);
  if (p < s1 && p < base) {
#pragma unroll
    for (int i = 0; i < N; i++) dst[i] = *reinterpret_cast<const uint4*>(cache + (size_t)p * HD + 8 * (o0 + os * i));
  } else if (p < s1 && rebuild) {
    const int n = TREE ? step_node(p, base, pth) : b;
#pragma unroll
    for (int i = 0; i < N; i++) {
      uint4 k, v;
      step_row<HD>(qkv, NQKV, H, Hkv, kvh, n, p, cosT, sinT, o0 + os * i, k, v);
      dst[i] = KV ? v : k;
    }
  }
}

// the tile at run row r0: K rows 8j + g at octets 4i + t, V rows 2t, 2t + 1, 2t + 8, 2t + 9 at octets 8i + g
template <int HD, bool TREE>
__device__ __forceinline__ void att_load_tile(AttTile<HD>& T, int r0, int s1, int base, bool rebuild,
                                              const h16* kcr, const h16* vcr, const h16* __restrict__ qkv, int NQKV,
                                              int H, int Hkv, int kvh, int b, int pth, const float* __restrict__ cosT,
                                              const float* __restrict__ sinT, int g, int t) {
#pragma unroll
  for (int j = 0; j < 2; j++)
    att_load_row<HD, TREE, HD / 32, 0>(T.k[j], kcr, r0 + 8 * j + g, t, 4, s1, base, rebuild, qkv, NQKV, H, Hkv, kvh,
                                       b, pth, cosT, sinT);
#pragma unroll
  for (int j = 0; j < 4; j++)
    att_load_row<HD, TREE, HD / 64, 1>(T.v[j], vcr, r0 + 2 * t + (j & 1) + 8 * (j >> 1), g, 8, s1, base, rebuild, qkv,
                                       NQKV, H, Hkv, kvh, b, pth, cosT, sinT);
}

// one tile into the warp's running (m, sum) of head g and acc (O^T fragments: acc[w] = heads 2t, 2t + 1 at the
// dims of V word w's halves); qa = head g's q words in the K order
template <int HD>
__device__ __forceinline__ void att_tile_mma(const AttTile<HD>& T, const u32* qa, int r0, int s1, int t, float& m,
                                             float& sum, float (*acc)[4]) {
  float sc[2][4];
#pragma unroll
  for (int j = 0; j < 2; j++) {
    sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
#pragma unroll
    for (int s = 0; s < HD / 16; s++)
      mma16816(sc[j], qa[2 * s], 0u, qa[2 * s + 1], 0u, word_of(T.k[j][s / 2], (2 * s) % 4),
               word_of(T.k[j][s / 2], (2 * s) % 4 + 1));
  }
  const int ra = r0 + 2 * t;  // this lane's scores: rows ra, ra + 1 (j = 0), ra + 8, ra + 9 (j = 1)
  const float x0 = ra < s1 ? sc[0][0] : ATT_NEG, x1 = ra + 1 < s1 ? sc[0][1] : ATT_NEG;
  const float x2 = ra + 8 < s1 ? sc[1][0] : ATT_NEG, x3 = ra + 9 < s1 ? sc[1][1] : ATT_NEG;
  float mx = fmaxf(fmaxf(m, fmaxf(x0, x1)), fmaxf(x2, x3));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));  // head g's max: the same in lanes 4g .. 4g + 3
  const float alpha = __expf(m - mx);
  m = mx;
  const h16 e0 = f2h(__expf(x0 - mx)), e1 = f2h(__expf(x1 - mx)), e2 = f2h(__expf(x2 - mx)), e3 = f2h(__expf(x3 - mx));
  sum = fmaf(sum, alpha, (h2f(e0) + h2f(e1)) + (h2f(e2) + h2f(e3)));
  const u32 p01 = (u32)e0 | ((u32)e1 << 16), p23 = (u32)e2 | ((u32)e3 << 16);
  const float al = __shfl_sync(0xffffffffu, alpha, 8 * t), ah = __shfl_sync(0xffffffffu, alpha, 8 * t + 4);
#pragma unroll
  for (int w = 0; w < HD / 16; w++) {
    acc[w][0] *= al; acc[w][1] *= ah; acc[w][2] *= al; acc[w][3] *= ah;
    const int i = w / 4, c = w % 4;
    const u32 v0 = word_of(T.v[0][i], c), v1 = word_of(T.v[1][i], c), v2 = word_of(T.v[2][i], c),
              v3 = word_of(T.v[3][i], c);
    mma16816(acc[w], __byte_perm(v0, v1, 0x5410), __byte_perm(v0, v1, 0x7632), __byte_perm(v2, v3, 0x5410),
             __byte_perm(v2, v3, 0x7632), p01, p23);
  }
}

// REPM: query heads per block: ATT_REPM (the split schedule: a block does all rep heads of its KV head) or 1 (the
// short-context mode, ATT_SHORT); a launch runs both instantiations and each returns at once unless L is its case.
template <int HD, bool TREE, int REPM>
__device__ void attn_body(const h16* __restrict__ qkv, h16* kc, h16* vc, const int* __restrict__ slots,
                          const int* __restrict__ pos, const int* __restrict__ rpos, const int* __restrict__ tpath,
                          const float* __restrict__ cosT, const float* __restrict__ sinT,
                          int Hkv, int rep, int maxctx, h16* __restrict__ out, float* part_o, float* part_ml,
                          u32* counters, int nsched, u32* gen) {
  constexpr int LPR = HD / 8, RPW = 32 / LPR, PPI = 8 * RPW, CHUNK = ATT_CH * PPI;
  constexpr bool HP = REPM == 1;  // head-parallel: the short-context mode
  constexpr bool MM = ATT_MMA && !HP;  // the split schedule's run on the tensor cores (att_tile_mma)
  __shared__ __align__(16) float qs[REPM][HD];
  __shared__ __align__(16) float red[8][REPM * HD];  // per-warp o; the merge's weights afterwards
  __shared__ float wml[8][REPM][2];                   // per-warp (m, sum)
  __shared__ float hden[REPM];
  __shared__ int last;
  __shared__ u32 gen0;  // the grid merge's generation, read after the PDL wait (attn_grid_merge)
#if GEMV_TRACE
  __shared__ unsigned long long att_tt[3];  // thread 0's start, wait and loop-end times (GEMV_TRACE)
  bool att_done = false;
#endif
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
#if ATT_SPLIT_MAJOR
  // block -> (split, kvh, b) split-major: the blocks of the first splits are consecutive in launch order, so at
  // short contexts (one active split per (b, kvh)) the working blocks are the first ones launched instead of every
  // gridDim.x-th block; same work per (split, kvh, b), same bits. Measured: 7-row verify 0.718 -> 0.704 ms on the
  // 0.5B, 3B batch 1 unchanged; it does not remove the 8-row step's attention cost (docs/hotpath.md)
  const int pairs = gridDim.y * gridDim.z, lin = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const int bx = lin / pairs, kvh = (lin % pairs) % gridDim.y, b = (lin % pairs) / gridDim.y;
#else
  const int bx = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
#endif
  // pos/slots (/rpos/path) come from the step's host copy (before the first kernel); TREE: pn is the logical
  // position (tree nodes: base + depth), rows >= base are this step's (step_node, step_row)
  const int pn = TREE ? rpos[b] : pos[b], L = pn + 1;
  if (HP != (L <= ATT_SHORT)) return;  // the other instantiation's case
  if (!HP || ATT_HP_TRIGGER) PDL_TRIGGER();
  const int nsplit = HP ? 1 : nsched;
  const int H = Hkv * rep, NQKV = (H + 2 * Hkv) * HD, nh = HP ? 1 : rep;  // nh: heads of this block
  const int base = TREE ? pos[b] - b : pn, pth = TREE ? tpath[b] : 0;
  const int RUN = MM && ATT_MRUN > 0 && L >= ATT_MRUN_FROM ? ATT_MRUN : CHUNK;  // runs: multiples of RUN rows
  const int sl = ((L + nsplit - 1) / nsplit + RUN - 1) / RUN * RUN;
  const int nact = (L + sl - 1) / sl;
  // a block runs splits blockIdx.x, + gridDim.x, .. of the schedule's nsched (gridDim.x <= nsched: the tree step
  // keeps the batch-1 schedule, hence its bits, in one wave of blocks instead of B waves of mostly-idle ones);
  // HP: query heads blockIdx.x, + gridDim.x, .. of the KV head's rep, each over the one run
  for (int work = bx; work < (HP ? rep : nact); work += gridDim.x) {
    const int split = HP ? 0 : work, H0 = kvh * rep + (HP ? work : 0);
    ATT_MARK(0)
    [&]() {  // one split: `return` ends it (every return below is uniform across the block)
    const int s0 = split * sl, s1 = min(L, s0 + sl), nch = (s1 - s0 + CHUNK - 1) / CHUNK;
    const size_t cbase = ((size_t)slots[b] * Hkv + kvh) * (size_t)maxctx * HD;
    h16* kcr = kc + cbase;
    h16* vcr = vc + cbase;
    const int r = lane / LPR, l = lane % LPR;
    const int row0 = s0 + warp * RPW + r;  // this lane's row in iteration i of chunk c: row0 + (c ATT_CH + i) PPI
    const int g = lane >> 2, t = lane & 3, nt = (s1 - s0 + 15) / 16;  // MM: lane (g, t), 16-row tiles of the run
    uint4 kb[ATT_CH], vb[ATT_CH];
    AttTile<HD> cur;
    if constexpr (MM) {  // the warp's first tile, in flight during the rope below (rows of earlier steps)
      if (warp < nt)
        att_load_tile<HD, TREE>(cur, s0 + 16 * warp, s1, base, false, kcr, vcr, qkv, NQKV, H, Hkv, kvh, b, pth, cosT,
                                sinT, g, t);
    } else {
#pragma unroll
      for (int i = 0; i < ATT_CH; i++) {  // first chunk, in flight during the rope below (rows of earlier steps)
        const int p = row0 + i * PPI;
        kb[i] = vb[i] = make_uint4(0, 0, 0, 0);
        if (p < s1 && p < base) {  // default: base = pn, this token's row is written below
          kb[i] = *reinterpret_cast<const uint4*>(kcr + (size_t)p * HD + l * 8);
          vb[i] = *reinterpret_cast<const uint4*>(vcr + (size_t)p * HD + l * 8);
        }
      }
    }
#if ATT_ROPE_PRE
    // this thread's rope factors at pn, before the wait (the tables are constant; after it they were a DRAM round
    // trip beside qkv's L2 one): both rope loops below give a thread d = tid % (HD / 2) (blockDim.x = 256, a multiple
    // of HD / 2)
    const float c_pre = cosT[(size_t)pn * (HD / 2) + tid % (HD / 2)];
    const float s_pre = sinT[(size_t)pn * (HD / 2) + tid % (HD / 2)];
#endif
    PDL_WAIT();  // qkv comes from the previous kernel
    ATT_MARK(1)
    // the grid merge (below): the generation before any block of this launch arrives. Every earlier launch has
    // completed here (each kernel's wait covers its predecessor's), so no earlier barrier can still bump it
    if (ATT_GRID_MERGE && !HP && gen != nullptr && tid == 0)
      gen0 = *reinterpret_cast<volatile u32*>(gen + b * Hkv + kvh);
    const h16* qrow = qkv + (size_t)b * NQKV;
    const float* cr = cosT + (size_t)pn * (HD / 2);
    const float* sr = sinT + (size_t)pn * (HD / 2);
    const float scale = rsqrtf((float)HD);
    for (int i = tid + nh * HD; i < REPM * HD; i += blockDim.x) (&qs[0][0])[i] = 0.f;
    for (int i = tid; i < nh * (HD / 2); i += blockDim.x) {
      const int h = i / (HD / 2), d = i % (HD / 2);
      const h16* qh = qrow + (H0 + h) * HD;
#if ATT_ROPE_PRE
      const float x1 = h2f(qh[d]), x2 = h2f(qh[d + HD / 2]), c = c_pre, s = s_pre;
#else
      const float x1 = h2f(qh[d]), x2 = h2f(qh[d + HD / 2]), c = cr[d], s = sr[d];
#endif
      qs[h][d] = (x1 * c - x2 * s) * scale;
      qs[h][d + HD / 2] = (x2 * c + x1 * s) * scale;
    }
    if (pn >= s0 && pn < s1 && H0 == kvh * rep) {  // this token's k (roped at pn) and v into its cache row pos[b]
      const h16* kh = qrow + H * HD + kvh * HD;
      const h16* vh = qrow + (H + Hkv) * HD + kvh * HD;
      const size_t wr = (size_t)pos[b] * HD;
      for (int d = tid; d < HD / 2; d += blockDim.x) {
#if ATT_ROPE_PRE
        const float x1 = h2f(kh[d]), x2 = h2f(kh[d + HD / 2]), c = c_pre, s = s_pre;
#else
        const float x1 = h2f(kh[d]), x2 = h2f(kh[d + HD / 2]), c = cr[d], s = sr[d];
#endif
        kcr[wr + d] = rope_lo(x1, x2, c, s);
        kcr[wr + d + HD / 2] = rope_hi(x1, x2, c, s);
      }
      for (int d = tid; d < HD; d += blockDim.x) vcr[wr + d] = vh[d];
    }
    __syncthreads();  // qs ready; the new row is visible to the block
    if constexpr (MM) {
      if (ATT_TIMING == 3) return;
      if (warp < nt && s0 + 16 * warp + 15 >= base)  // the first tile holds rows of this step: load it again, rebuilt
        att_load_tile<HD, TREE>(cur, s0 + 16 * warp, s1, base, true, kcr, vcr, qkv, NQKV, H, Hkv, kvh, b, pth, cosT,
                                sinT, g, t);
      u32 qa[HD / 8];  // head g's q (fp16) at the K words' dims: word 4i + c = dims 8 (4i + t) + 2c, + 1
#pragma unroll
      for (int w = 0; w < HD / 8; w++) {
        const int d = 8 * (4 * (w / 4) + t) + 2 * (w % 4);
        qa[w] = (u32)f2h(qs[g][d]) | ((u32)f2h(qs[g][d + 1]) << 16);
      }
      float mm = ATT_NEG, ms = 0.f, acc[HD / 16][4];
#pragma unroll
      for (int w = 0; w < HD / 16; w++) acc[w][0] = acc[w][1] = acc[w][2] = acc[w][3] = 0.f;
      for (int ti = warp; ti < nt; ti += 8) {
        AttTile<HD> nxt;
        const bool more = ti + 8 < nt;
        if (more)
          att_load_tile<HD, TREE>(nxt, s0 + 16 * (ti + 8), s1, base, true, kcr, vcr, qkv, NQKV, H, Hkv, kvh, b, pth,
                                  cosT, sinT, g, t);
        if (ATT_TIMING == 2) {  // the loads kept alive, nothing scored
          u32 x = 0;
#pragma unroll
          for (int j = 0; j < 2; j++)
#pragma unroll
            for (int i = 0; i < HD / 32; i++) x ^= cur.k[j][i].x ^ cur.k[j][i].y ^ cur.k[j][i].z ^ cur.k[j][i].w;
#pragma unroll
          for (int j = 0; j < 4; j++)
#pragma unroll
            for (int i = 0; i < HD / 64; i++) x ^= cur.v[j][i].x ^ cur.v[j][i].y ^ cur.v[j][i].z ^ cur.v[j][i].w;
          ms += (float)(x & 1u);
        } else {
          att_tile_mma<HD>(cur, qa, s0 + 16 * ti, s1, t, mm, ms, acc);
        }
        if (more) cur = nxt;
      }
      ms += __shfl_xor_sync(0xffffffffu, ms, 1);
      ms += __shfl_xor_sync(0xffffffffu, ms, 2);
#pragma unroll
      for (int w = 0; w < HD / 16; w++) {  // acc[w]: heads 2t, 2t + 1 at dims d, d + 1
        const int d = 8 * (8 * (w / 4) + g) + 2 * (w % 4);
        *reinterpret_cast<float2*>(&red[warp][2 * t * HD + d]) = make_float2(acc[w][0], acc[w][2]);
        *reinterpret_cast<float2*>(&red[warp][(2 * t + 1) * HD + d]) = make_float2(acc[w][1], acc[w][3]);
      }
      if (t == 0) { wml[warp][g][0] = mm; wml[warp][g][1] = ms; }
    } else {
#pragma unroll
      for (int i = 0; i < ATT_CH; i++) {  // the first chunk's rows of this step
        const int p = row0 + i * PPI;
        if (!TREE && !HP && p == pn) {
          kb[i] = *reinterpret_cast<const uint4*>(kcr + (size_t)p * HD + l * 8);
          vb[i] = *reinterpret_cast<const uint4*>(vcr + (size_t)p * HD + l * 8);
        } else if (!TREE && HP && p == pn) {  // the row another block writes: rebuilt, the bits it stores
          step_row<HD>(qkv, NQKV, H, Hkv, kvh, b, p, cosT, sinT, l, kb[i], vb[i]);
        } else if (TREE && p < s1 && p >= base) {
          step_row<HD>(qkv, NQKV, H, Hkv, kvh, step_node(p, base, pth), p, cosT, sinT, l, kb[i], vb[i]);
        }
      }

      float m[REPM], sum[REPM], acc[REPM][8];
#pragma unroll
      for (int h = 0; h < REPM; h++) {
        m[h] = ATT_NEG;
        sum[h] = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) acc[h][j] = 0.f;
      }
      for (int c = 0; c < nch; c++) {
        uint4 kn[ATT_CH], vn[ATT_CH];
#pragma unroll
        for (int i = 0; i < ATT_CH; i++) {  // next chunk's rows (none past the run)
          const int p = row0 + ((c + 1) * ATT_CH + i) * PPI;
          kn[i] = vn[i] = make_uint4(0, 0, 0, 0);
          if (TREE && p < s1 && p >= base) {
            step_row<HD>(qkv, NQKV, H, Hkv, kvh, step_node(p, base, pth), p, cosT, sinT, l, kn[i], vn[i]);
          } else if (!TREE && HP && p == pn) {
            step_row<HD>(qkv, NQKV, H, Hkv, kvh, b, p, cosT, sinT, l, kn[i], vn[i]);
          } else if (p < s1) {
            kn[i] = *reinterpret_cast<const uint4*>(kcr + (size_t)p * HD + l * 8);
            vn[i] = *reinterpret_cast<const uint4*>(vcr + (size_t)p * HD + l * 8);
          }
        }
        float s[ATT_CH][REPM];  // scores of this lane's rows (summed over the row's LPR lanes below)
#pragma unroll
        for (int i = 0; i < ATT_CH; i++) {
          float k[8];
          unpack8(kb[i], k);
#pragma unroll
          for (int h = 0; h < REPM; h++) {
            float a = 0.f;
#pragma unroll
            for (int j = 0; j < 8; j++) a = fmaf(qs[h][l * 8 + j], k[j], a);
            s[i][h] = a;
          }
        }
#pragma unroll
        for (int o = LPR / 2; o > 0; o >>= 1)
#pragma unroll
          for (int i = 0; i < ATT_CH; i++)
#pragma unroll
            for (int h = 0; h < REPM; h++) s[i][h] += __shfl_xor_sync(0xffffffffu, s[i][h], o);
        bool ok[ATT_CH];
#pragma unroll
        for (int i = 0; i < ATT_CH; i++) ok[i] = row0 + (c * ATT_CH + i) * PPI < s1;
#pragma unroll
        for (int h = 0; h < REPM; h++) {  // new running max over the warp's rows; rescale sum and acc
          float mx = m[h];
#pragma unroll
          for (int i = 0; i < ATT_CH; i++) mx = ok[i] ? fmaxf(mx, s[i][h]) : mx;
#pragma unroll
          for (int o = LPR; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
          const float alpha = __expf(m[h] - mx);
          m[h] = mx;
          sum[h] *= alpha;
#pragma unroll
          for (int j = 0; j < 8; j++) acc[h][j] *= alpha;
        }
#pragma unroll
        for (int i = 0; i < ATT_CH; i++) {
          float v[8];
          unpack8(vb[i], v);
#pragma unroll
          for (int h = 0; h < REPM; h++) {
            const float w = ok[i] ? __expf(s[i][h] - m[h]) : 0.f;
            sum[h] += w;
#pragma unroll
            for (int j = 0; j < 8; j++) acc[h][j] = fmaf(w, v[j], acc[h][j]);
          }
        }
#pragma unroll
        for (int i = 0; i < ATT_CH; i++) {
          kb[i] = kn[i];
          vb[i] = vn[i];
        }
      }
      // the warp's row groups -> one (o, sum) per warp (lanes of a row group hold the same sum)
#pragma unroll
      for (int o = LPR; o < 32; o <<= 1)
#pragma unroll
        for (int h = 0; h < REPM; h++) {
          sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], o);
#pragma unroll
          for (int j = 0; j < 8; j++) acc[h][j] += __shfl_xor_sync(0xffffffffu, acc[h][j], o);
        }
      if (r == 0) {
#pragma unroll
        for (int h = 0; h < REPM; h++)
          if (h < nh)
#pragma unroll
            for (int j = 0; j < 8; j++) red[warp][h * HD + l * 8 + j] = acc[h][j];
      }
      if (lane == 0) {
#pragma unroll
        for (int h = 0; h < REPM; h++) { wml[warp][h][0] = m[h]; wml[warp][h][1] = sum[h]; }
      }
    }
    ATT_MARK(2)
    __syncthreads();
    for (int i = tid; i < nh * HD; i += blockDim.x) {  // the 8 warps -> the block's (o, M, sum)
      const int h = i / HD, d = i % HD;
      float M = ATT_NEG;
#pragma unroll
      for (int w = 0; w < 8; w++) M = fmaxf(M, wml[w][h][0]);
      float o = 0.f, den = 0.f;
#pragma unroll
      for (int w = 0; w < 8; w++) {
        const float e = __expf(wml[w][h][0] - M);
        o = fmaf(e, red[w][i], o);
        den = fmaf(e, wml[w][h][1], den);
      }
      if (nact == 1) {
        out[(size_t)b * H * HD + (H0 + h) * HD + d] = f2h(att_div(o, den));
      } else {
        const size_t ph = ((size_t)b * H + H0 + h) * nsplit + split;
        part_o[ph * HD + d] = o;
        if (d == 0) { part_ml[ph * 2] = M; part_ml[ph * 2 + 1] = den; }
      }
    }
    // counters null: the partials are all, attn_merge (below, its own launch) merges them with the same arithmetic
#if GEMV_TRACE
    att_done = nact == 1;
#endif
    if (nact == 1 || ATT_TIMING == 1 || counters == nullptr) return;
    SPLITK_FENCE();
    __syncthreads();
    if (ATT_GRID_MERGE && !HP && gen != nullptr) {  // the grid merge: each split's block merges a slice after a barrier
      if (tid == 0) att_grid_barrier(counters + b * Hkv + kvh, gen + b * Hkv + kvh, gen0, nact);
      __syncthreads();
      attn_grid_merge<HD>(b, kvh, split, nact, nsplit, H, rep, part_o, part_ml, out, &red[0][0], hden, tid);
      return;
    }
    if (tid == 0) last = atomicAdd(counters + b * Hkv + kvh, 1u) == (u32)(nact - 1);
    __syncthreads();
    if (!last) return;
#if GEMV_TRACE
    att_done = true;
#endif
    SPLITK_FENCE();
    // merge: weights e[h][s] = exp(M_s - M) in shared memory (red is free now), den[h] = sum_s e * sum_s
    float* e = &red[0][0];  // [rep][nact]; host keeps rep * nsplit <= 8 * ATT_REPM * HD
    const size_t hb0 = ((size_t)b * H + H0) * nsplit;
#if ATT_KPRE
    // the thread's first ATT_KPRE partials (its first q below) are loaded before the weights, as attn_merge's
    // ATT_MPRE: their round trip overlaps the (M, sum) loads instead of following the barrier; same fmaf order
    float4 pv[ATT_KPRE];
    {
      const bool qv = tid < rep * (HD / 4);
      const float4* po = reinterpret_cast<const float4*>(part_o + (hb0 + (size_t)(tid / (HD / 4)) * nsplit) * HD) +
                         tid % (HD / 4);
#pragma unroll
      for (int s = 0; s < ATT_KPRE; s++)
        pv[s] = qv && s < nact ? __ldcg(po + (size_t)s * (HD / 4)) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#endif
    if (warp < rep) {
      const float den = merge_weights(part_ml + (hb0 + (size_t)warp * nsplit) * 2, nact, e + warp * nact, lane);
      if (lane == 0) hden[warp] = den;
    }
    __syncthreads();
    for (int q = tid; q < rep * (HD / 4); q += blockDim.x) {  // 4 dims per thread: float4 loads of the partials
      const int h = q / (HD / 4), d4 = q % (HD / 4);
      const float* eh = e + h * nact;
      float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
      constexpr int MU = ATT_MU;
      const float4* po = reinterpret_cast<const float4*>(part_o + (hb0 + (size_t)h * nsplit) * HD) + d4;
      int s0 = 0;
#if ATT_KPRE
      if (q == tid) {
#pragma unroll
        for (int s = 0; s < ATT_KPRE; s++)
          if (s < nact) {
            const float w = eh[s];
            const float4 v = pv[s];
            o.x = fmaf(w, v.x, o.x); o.y = fmaf(w, v.y, o.y); o.z = fmaf(w, v.z, o.z); o.w = fmaf(w, v.w, o.w);
          }
        s0 = ATT_KPRE;
      }
#endif
#pragma unroll MU
      for (int s = s0; s < nact; s++) {
        const float w = eh[s];
        const float4 v = __ldcg(po + (size_t)s * (HD / 4));
        o.x = fmaf(w, v.x, o.x); o.y = fmaf(w, v.y, o.y); o.z = fmaf(w, v.z, o.z); o.w = fmaf(w, v.w, o.w);
      }
      const float inv = att_rcp(hden[h]);
      h16* dst = out + (size_t)b * H * HD + (H0 + h) * HD + d4 * 4;
      dst[0] = f2h(o.x * inv); dst[1] = f2h(o.y * inv); dst[2] = f2h(o.z * inv); dst[3] = f2h(o.w * inv);
    }
    if (tid == 0) counters[b * Hkv + kvh] = 0u;
    }();
#if GEMV_TRACE
    if (!TREE && tid == 0) att_trace(att_tt, L, nact, HP ? 6 : 4, att_done);
#endif
    __syncthreads();  // the next split reuses the shared memory
  }
}

#ifndef ATT_HP_ONLY
// 1: a timing probe only: the plain entries without the split schedule (wrong above ATT_SHORT rows), 128 registers, so
// that a GEMV block fits beside an attention block; measured slower on the 3B / 14B (decode_ab_hponly_h100.json)
#define ATT_HP_ONLY 0
#endif
// entry points: head dim 128 / 64; _tree = the tokens of one slot's draft chain or tree in one step (rpos/path above)
#define ATTN_ENTRY(NAME, HD)                                                                                 \
  extern "C" __global__ void __launch_bounds__(256, ATT_HP_ONLY ? 2 : 1) NAME(                               \
      const h16* qkv, h16* kc, h16* vc, const int* slots, const int* pos, const float* cosT, const float* sinT, \
      int Hkv, int rep, int maxctx, h16* out, float* part_o, float* part_ml, u32* counters, u32* gen) {      \
    attn_body<HD, false, 1>(qkv, kc, vc, slots, pos, pos, pos, cosT, sinT, Hkv, rep, maxctx, out, part_o,    \
                            part_ml, counters, gridDim.x, nullptr);                                          \
    if (!ATT_HP_ONLY)                                                                                         \
      attn_body<HD, false, ATT_REPM>(qkv, kc, vc, slots, pos, pos, pos, cosT, sinT, Hkv, rep, maxctx, out,   \
                                     part_o, part_ml, counters, gridDim.x, gen);                             \
  }
#define ATTN_ENTRY_TREE(NAME, HD)                                                                              \
  extern "C" __global__ void __launch_bounds__(256, 1) NAME(                                                 \
      const h16* qkv, h16* kc, h16* vc, const int* slots, const int* pos, const int* rpos, const int* tpath,  \
      const float* cosT, const float* sinT, int Hkv, int rep, int maxctx, h16* out, float* part_o,           \
      float* part_ml, u32* counters, int nsched) {                                                           \
    attn_body<HD, true, 1>(qkv, kc, vc, slots, pos, rpos, tpath, cosT, sinT, Hkv, rep, maxctx, out, part_o,  \
                           part_ml, counters, nsched, nullptr);                                              \
    attn_body<HD, true, ATT_REPM>(qkv, kc, vc, slots, pos, rpos, tpath, cosT, sinT, Hkv, rep, maxctx, out,   \
                                  part_o, part_ml, counters, nsched, nullptr);                               \
  }
ATTN_ENTRY(attn_decode_hd128, 128)
ATTN_ENTRY(attn_decode_hd64, 64)
ATTN_ENTRY_TREE(attn_decode_hd128_tree, 128)
ATTN_ENTRY_TREE(attn_decode_hd64_tree, 64)

// The cross-block merge as its own kernel (long contexts, GPUModel.merge_from): launched behind an attention
// kernel whose counters were null (it only wrote its partials), one block per (query head, token) and one thread
// per dim, so every partial load of every head is in flight at once on H x B SMs instead of nact x HD x rep loads
// from one block per KV head. The arithmetic is attn_body's merge, operation for operation (warp 0: M and den over
// lane-strided splits and the same xor reduction, lane 0's den; each dim's sum over s in order with fmaf; x (1 / den)
// then fp16), so a row's bits do not depend on which kernel merged it. L <= ATT_SHORT or nact == 1: the attention
// wrote the output itself; nothing to do. lpos: the rows' positions (the tree step's rpos); nsplit: the attention's.
// The merge launches' active splits of a row of L > ATT_SHORT positions: attn_body's schedule (runs of whole RUN-row
// multiples over nsplit blocks)
template <int HD>
__device__ __forceinline__ int merge_nact(int L, int nsplit) {
  constexpr int LPR = HD / 8, RPW = 32 / LPR, PPI = 8 * RPW, CHUNK = ATT_CH * PPI;
  const int RUN = ATT_MMA && ATT_MRUN > 0 && L >= ATT_MRUN_FROM ? ATT_MRUN : CHUNK;
  const int sl = ((L + nsplit - 1) / nsplit + RUN - 1) / RUN * RUN;
  return (L + sl - 1) / sl;
}
#ifndef ATT_MPRE
// partials per thread loaded before the merge weights (0: all after them, the earlier kernel). Same process, 3B / 7B
// W4 step replay at 4k and 16k cached (docs/results/decode_ab_mpre2_h200.json): 32 made 16k 3.8% / 2.0% faster and
// 7B 4k 2.7%, 3B 4k level; 64 (every split at 16k on the H200) was slower than 32 everywhere and 3.9% slower than 0
// at 3B 4k: its longer unrolled body costs more than the round trip it saves.
#define ATT_MPRE 32
#endif
template <int HD>
__device__ void attn_merge_body(const int* __restrict__ lpos, int Hkv, int rep, int nsplit, h16* __restrict__ out,
                                const float* part_o, const float* part_ml) {
  __shared__ float e[ATT_MAX_SPLITS];
  __shared__ float den_s;
  PDL_TRIGGER();
  const int hq = blockIdx.x, b = blockIdx.y, d = threadIdx.x, lane = d & 31;
#if GEMV_TRACE
  __shared__ unsigned long long att_tt[3];
  ATT_MARK(0)
#endif
  const int L = lpos[b] + 1;
  if (L <= ATT_SHORT) return;
  const int nact = merge_nact<HD>(L, nsplit);
  if (nact == 1) return;
  const int H = Hkv * rep;
  const size_t ph0 = ((size_t)b * H + hq) * nsplit;
  PDL_WAIT();
  ATT_MARK(1)
  const float* po = part_o + ph0 * HD + d;
#if ATT_MPRE
  // every thread's first ATT_MPRE partials are loaded before the weights, so their round trip overlaps warp 0's
  // (M, sum) loads and reduction instead of following the barrier (the same fmaf order below: the same bits)
  float v[ATT_MPRE];
#pragma unroll
  for (int s = 0; s < ATT_MPRE; s++) v[s] = s < nact ? __ldcg(po + (size_t)s * HD) : 0.f;
#endif
  if (d < 32) {
    const float den = merge_weights(part_ml + ph0 * 2, nact, e, lane);
    if (lane == 0) den_s = den;
  }
  __syncthreads();
  ATT_MARK(2)
  float o = 0.f;
#if ATT_MPRE
#pragma unroll
  for (int s = 0; s < ATT_MPRE; s++)
    if (s < nact) o = fmaf(e[s], v[s], o);
  for (int s = ATT_MPRE; s < nact; s++) o = fmaf(e[s], __ldcg(po + (size_t)s * HD), o);
#else
#pragma unroll 32
  for (int s = 0; s < nact; s++) o = fmaf(e[s], __ldcg(po + (size_t)s * HD), o);
#endif
  const float inv = att_rcp(den_s);
  out[(size_t)b * H * HD + hq * HD + d] = f2h(o * inv);
#if GEMV_TRACE
  if (d == 0) att_trace(att_tt, L, nact, 5, true);
#endif
}
// ATT_MERGE_P > 1: P threads per dim (blocks of P x HD threads, DecodeKernels.attn_merge), so a chunk of up to
// ATT_MERGE_CH splits' partials is loaded in one round trip (CH / P loads per thread, all in flight, warp 0's merge
// weights under them) into shared memory, and the P = 0 threads sum them from there, over s in order with fmaf as
// attn_merge_body: the same bits. The 16k step's trace (gemv_phases_16k_h100.json) had the one-thread-per-dim merge
// at 5.1 us per layer, 16 blocks in a chain of L2 round trips (32 partials before the weights, the rest in a loop).
#ifndef ATT_MERGE_P
// H100, same process, step replay ms at 16k cached (decode_ab_merge_h100.json): 3B W4 1.427 (1 thread per dim) ->
// 1.422 (P 2) -> 1.385 (4) -> 1.363 (8); 7B W4 2.173 -> 2.151 (4) / 2.153 (8); short contexts do not run it. Again
// on another H100 lease (decode_ab_merge_final_h100.json): 1.428 (1) / 1.391 (4) / 1.370 (8). 8: its bits checked on
// the device against the in-kernel merge (pytest_merge_p8_h100.txt; P 4's in pytest_merge_p4_h100.txt)
#define ATT_MERGE_P 8
#endif
#ifndef ATT_MERGE_DB
#define ATT_MERGE_DB 0  // dims per block (ATT_MERGE_P > 1): 0 = a head's HD; less spreads a head over HD / DB blocks
#endif
// a merge block's dims (= decode_kernels.merge_launch): ATT_MERGE_DB where P > 1 and it is below HD, else HD
__host__ __device__ constexpr int att_merge_db(int hd) {
  return ATT_MERGE_P > 1 && ATT_MERGE_DB > 0 && ATT_MERGE_DB < hd ? ATT_MERGE_DB : hd;
}
#ifndef ATT_MERGE_CH
// splits per shared-memory chunk (a multiple of P; at HD 128 and DB = HD 40 KB with 80, under the 48 KB of static
// shared memory). A 3B / 0.5B step has 65-66 active splits at 16k+ rows on a 132-SM GPU (2 KV heads, 66 splits of 256
// rows): with chunks of 64 the 65th took a second round trip and two barriers per layer, which the bench's 16k run
// (positions 16,385+) paid and the 16,000-row traces (63 splits) did not. 80 holds them in one chunk (same fmaf order
// in s: the same bits; checked on an H100 against the in-kernel merge, pytest_mergech_h100.txt); step replay at 16k
// cached, 3B W4, same process: 1.388 (64) -> 1.372 ms (80), short steps level (decode_ab_mergech_h100.json).
// P = 32 (80 % 32 != 0) keeps 64.
#define ATT_MERGE_CH (80 % ATT_MERGE_P == 0 ? 80 : 64)
#endif
template <int HD>
__device__ void attn_merge_body_p(const int* __restrict__ lpos, int Hkv, int rep, int nsplit, h16* __restrict__ out,
                                  const float* part_o, const float* part_ml) {
  constexpr int P = ATT_MERGE_P, CH = ATT_MERGE_CH, U = CH / P;
  constexpr int DB = att_merge_db(HD);
  static_assert(CH % P == 0 && HD % DB == 0 && DB % 32 == 0, "ATT_MERGE_P divides ATT_MERGE_CH, DB divides HD");
  __shared__ float e[ATT_MAX_SPLITS];
  __shared__ float den_s;
  __shared__ float pv[CH][DB];  // a chunk's partials [split][the block's dims]
  PDL_TRIGGER();
  const int hq = blockIdx.x, b = blockIdx.y, tid = threadIdx.x, dl = tid % DB, q = tid / DB, lane = tid & 31;
  const int d = blockIdx.z * DB + dl;  // grid z: HD / DB blocks per (query head, token)
#if GEMV_TRACE
  __shared__ unsigned long long att_tt[3];
  ATT_MARK(0)
#endif
  const int L = lpos[b] + 1;
  if (L <= ATT_SHORT) return;
  const int nact = merge_nact<HD>(L, nsplit);
  if (nact == 1) return;
  const int H = Hkv * rep;
  const size_t ph0 = ((size_t)b * H + hq) * nsplit;
  PDL_WAIT();
  ATT_MARK(1)
  const float* po = part_o + ph0 * HD + d;
  float o = 0.f;
  for (int c0 = 0; c0 < nact; c0 += CH) {
    float v[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int s = c0 + q + P * u;
      v[u] = s < nact ? __ldcg(po + (size_t)s * HD) : 0.f;
    }
    if (c0 == 0 && tid < 32) {
      const float den = merge_weights(part_ml + ph0 * 2, nact, e, lane);
      if (lane == 0) den_s = den;
    }
    if (c0 > 0) __syncthreads();  // the previous chunk's sums have read pv
#pragma unroll
    for (int u = 0; u < U; u++) pv[q + P * u][dl] = v[u];
    __syncthreads();
    if (q == 0) {
      const int n = min(CH, nact - c0);
#pragma unroll 16
      for (int s = 0; s < n; s++) o = fmaf(e[c0 + s], pv[s][dl], o);
    }
  }
  ATT_MARK(2)
  if (q == 0) {
    const float inv = att_rcp(den_s);
    out[(size_t)b * H * HD + hq * HD + d] = f2h(o * inv);
  }
#if GEMV_TRACE
  if (tid == 0) att_trace(att_tt, L, nact, 5, true);
#endif
}
#if ATT_MERGE_P > 1
#define ATT_MERGE_BODY attn_merge_body_p
#else
#define ATT_MERGE_BODY attn_merge_body
#endif
extern "C" __global__ void __launch_bounds__(att_merge_db(128) * ATT_MERGE_P) attn_merge_hd128(
    const int* lpos, int Hkv, int rep, int nsplit, h16* out, const float* part_o, const float* part_ml) {
  ATT_MERGE_BODY<128>(lpos, Hkv, rep, nsplit, out, part_o, part_ml);
}
extern "C" __global__ void __launch_bounds__(att_merge_db(64) * ATT_MERGE_P) attn_merge_hd64(
    const int* lpos, int Hkv, int rep, int nsplit, h16* out, const float* part_o, const float* part_ml) {
  ATT_MERGE_BODY<64>(lpos, Hkv, rep, nsplit, out, part_o, part_ml);
}
