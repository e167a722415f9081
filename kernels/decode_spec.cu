// The GPU-resident speculative step (engine/runtime/speculative.py burst, engine/runtime/draft_heads.py): after a
// draft tree's verify step, accept its longest right path and set up the next step, with no host round trip.
// Reference: kernels/decode_reference.py accept_ref. Compiled after decode_common.cu.
//
// Inputs: meta int32 [5, M] (row 0: the tree's tokens, root first; row 1: cache rows start + b; row 2: slots),
// keys u64 [M] (the verify step's argmax keys), parents (node b's parent, 3 bits at 3(b-1), b = 1..B-1),
// x fp16 [M, H] (the step's final normed rows).
// Greedy walk (thread 0): from the root, the child whose token is the argmax of the current node's row, while
// there is one. Outputs: out int32 [8] = kept count c, the c kept tokens (the path's, then the argmax after it),
// pad; margs int32 [4] = (start, accepted nodes packed 3 bits each, their number, slot) for move_rows_dev; meta
// row 0 col 0 = the last kept token (the next root), rows 1 and 3 = the next tree's cache rows and positions
// (start + c + b, start + c + depth(b)); hh fp16 [H] = x[last row], htok[0] = the next root (the draft heads'
// inputs). grid 1, block 256.
extern "C" __global__ void __launch_bounds__(256) spec_accept(int* meta, int M, const unsigned long long* keys,
                                                             int parents, int B, const h16* __restrict__ x, int H,
                                                             int* out, int* margs, h16* hh, int* htok) {
  __shared__ int last_row;
  if (threadIdx.x == 0) {
    int ids[8], toks[8], par[8], depth[8];
    for (int b = 0; b < B; b++) {
      ids[b] = (int)(0xFFFFFFFFu - (u32)(keys[b] & 0xFFFFFFFFull));
      toks[b] = meta[b];
      par[b] = b == 0 ? -1 : (parents >> (3 * (b - 1))) & 7;
      depth[b] = b == 0 ? 0 : depth[par[b]] + 1;
    }
    int cur = 0, d = 0, path = 0;
    for (;;) {
      int nxt = -1;
      for (int c = 1; c < B; c++)
        if (par[c] == cur && toks[c] == ids[cur]) { nxt = c; break; }
      if (nxt < 0) break;
      out[1 + d] = toks[nxt];
      path |= nxt << (3 * d);
      d++;
      cur = nxt;
    }
    out[1 + d] = ids[cur];
    out[0] = d + 1;
    for (int i = d + 2; i < 8; i++) out[i] = 0;
    const int start = meta[M], ns = start + d + 1;
    margs[0] = start; margs[1] = path; margs[2] = d; margs[3] = meta[2 * M];
    meta[0] = ids[cur];
    for (int b = 0; b < B; b++) { meta[M + b] = ns + b; meta[3 * M + b] = ns + depth[b]; }
    htok[0] = ids[cur];
    last_row = cur;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < H; i += blockDim.x) hh[i] = x[(size_t)last_row * H + i];
}
