// K/V rows of the cache moved after speculative verification (decode_attn.cu's _tree kernels wrote a draft
// tree's rows at start + node; the accepted path's rows go where one-token steps would have written them).

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
