// Rope + KV write of the B tokens of a decode step, run before the attention kernel's no-write mode
// (attn_decode_hd*_nw in decode_attn.cu). Speculative verification puts the k+1 tokens of ONE sequence at
// consecutive positions of one slot into one step; the default attention kernel writes each token's k/v inside
// the block that holds its position, so a token could read a row of the same step before it is written. Here
// every row is written first, then the attention kernel only reads.
// Reference: kernels/decode_reference.py kv_write_ref.
//
// grid (B, Hkv), block 64. Token b sits in row pos[b] of slot slots[b] at sequence position rpos[b]: k (roped at
// rpos[b], neox halves, fp32 math then fp16, the same expressions as the attention kernel's own write) and v of
// KV head blockIdx.y go to row pos[b] of the slot. A chain of drafts has rpos == pos; a tree of drafts
// (GPUModel.verify with parents) puts node b in row start + b at position start + depth(b). qkv fp16 [B, (H + 2 Hkv) HD] (bias included), caches fp16 [slots, Hkv, maxctx, HD].

extern "C" __global__ void __launch_bounds__(64) kv_write_rows(
    const h16* __restrict__ qkv, h16* kc, h16* vc, const int* __restrict__ slots, const int* __restrict__ pos,
    const int* __restrict__ rpos, const float* __restrict__ cosT, const float* __restrict__ sinT, int Hkv, int rep, int HD, int maxctx) {
  PDL_TRIGGER();
  const int b = blockIdx.x, kvh = blockIdx.y, tid = threadIdx.x;
  const int H = Hkv * rep, NQKV = (H + 2 * Hkv) * HD;
  const int pn = pos[b], rp = rpos[b];  // pos/rpos/slots come from the step's host copy (before the first kernel)
  const size_t row = (((size_t)slots[b] * Hkv + kvh) * (size_t)maxctx + pn) * HD;
  const float* cr = cosT + (size_t)rp * (HD / 2);
  const float* sr = sinT + (size_t)rp * (HD / 2);
  PDL_WAIT();  // qkv comes from the previous kernel
  const h16* kh = qkv + (size_t)b * NQKV + H * HD + kvh * HD;
  const h16* vh = qkv + (size_t)b * NQKV + (H + Hkv) * HD + kvh * HD;
  for (int d = tid; d < HD / 2; d += blockDim.x) {
    const float x1 = h2f(kh[d]), x2 = h2f(kh[d + HD / 2]), c = cr[d], s = sr[d];
    kc[row + d] = f2h(x1 * c - x2 * s);
    kc[row + d + HD / 2] = f2h(x2 * c + x1 * s);
  }
  for (int d = tid; d < HD; d += blockDim.x) vc[row + d] = vh[d];
}

// After a draft tree's verification (GPUModel.keep_path): the accepted path's K/V rows move to where one-token
// steps would have written them. For j = 1..d, node n_j = (path >> 3(j-1)) & 7 of the path: row start + n_j ->
// row start + j of `slot`, in every layer and KV head of both caches [layers, slots, Hkv, maxctx, HD].
// Reference: kernels/decode_reference.py move_rows_ref.
// grid (layers * Hkv, 2: k and v), block HD / 8 (one 16-byte chunk of a row per thread). Each thread walks j in
// order: n_j >= j, so a row is always read before any later j writes it (the same thread owns that chunk).
__device__ __forceinline__ void move_rows_body(h16* kc, h16* vc, int slot, int slots, int Hkv, int maxctx, int HD,
                                               int start, int path, int d) {
  const int lh = blockIdx.x, layer = lh / Hkv, h = lh % Hkv;
  h16* c = blockIdx.y == 0 ? kc : vc;
  uint4* base = reinterpret_cast<uint4*>(c + ((((size_t)layer * slots + slot) * Hkv + h) * (size_t)maxctx) * HD);
  const int row16 = HD / 8, t = threadIdx.x;
  if (t >= row16) return;
  for (int j = 1; j <= d; j++) {
    const int n = (path >> (3 * (j - 1))) & 7;
    if (n != j) base[(size_t)(start + j) * row16 + t] = base[(size_t)(start + n) * row16 + t];
  }
}
extern "C" __global__ void __launch_bounds__(32) move_rows(h16* kc, h16* vc, int slot, int slots, int Hkv, int maxctx,
                                                          int HD, int start, int path, int d) {
  move_rows_body(kc, vc, slot, slots, Hkv, maxctx, HD, start, path, d);
}
// the same with (start, path, d, slot) read from device memory (spec_accept's margs, inside a captured graph)
extern "C" __global__ void __launch_bounds__(32) move_rows_dev(h16* kc, h16* vc, int slots, int Hkv, int maxctx,
                                                              int HD, const int* __restrict__ margs) {
  move_rows_body(kc, vc, margs[3], slots, Hkv, maxctx, HD, margs[0], margs[1], margs[2]);
}
