// Top-4 token ids of each logits row in one launch (the draft heads' tree, engine/runtime/draft_heads.py):
// torch.topk on 4 x 151,936 logits took ~0.1 ms inside the draft graph on an H200, as long as the rest of the draft.
// Reference: kernels/decode_reference.py topk_ref (descending value, ties to the lower id, as argmax_key orders).
// Compiled after decode_gemv.cu (argmax_key: orderable(value) << 32 | ~index, unique per element).
//
// grid (nb, R), block 256. Block (x, r) scans elements x*256 + tid, stepping nb*256, of row r and keeps each
// thread's 4 largest keys (sorted, in registers); 4 rounds of a block max pick the block's 4, which go to ws
// [R, nb, 4]. The last block of a row to arrive (counter cnt[r], reset by it) picks the row's 4 from the nb*4
// <= 256 keys the same way and writes their ids to out int64 [R, 4].
#define TOPK 4

__device__ __forceinline__ void topk_insert(unsigned long long (&k)[TOPK], unsigned long long v) {
  if (v <= k[TOPK - 1]) return;
  k[TOPK - 1] = v;
#pragma unroll
  for (int i = TOPK - 1; i > 0; i--) {  // bubble the new key up
    if (k[i] > k[i - 1]) { const unsigned long long t = k[i]; k[i] = k[i - 1]; k[i - 1] = t; }
  }
}

// 4 rounds of a block-wide max over each thread's sorted keys; the owner of a winner drops it. -> best[0..3]
__device__ __forceinline__ void topk_block(unsigned long long (&k)[TOPK], unsigned long long* red,
                                           unsigned long long* best) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  for (int t = 0; t < TOPK; t++) {
    unsigned long long m = k[0];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const unsigned long long y = __shfl_xor_sync(0xffffffffu, m, o);
      m = y > m ? y : m;
    }
    if (lane == 0) red[warp] = m;
    __syncthreads();
    if (tid == 0) {
      unsigned long long b = red[0];
      for (int w = 1; w < (int)(blockDim.x >> 5); w++) b = red[w] > b ? red[w] : b;
      best[t] = b;
    }
    __syncthreads();
    if (k[0] == best[t] && best[t] != 0ull) {  // keys are unique: only the owner shifts
#pragma unroll
      for (int i = 0; i < TOPK - 1; i++) k[i] = k[i + 1];
      k[TOPK - 1] = 0ull;
    }
    __syncthreads();
  }
}

extern "C" __global__ void __launch_bounds__(256) topk_rows(const float* __restrict__ logits, int N,
                                                            unsigned long long* ws, u32* cnt, long long* out) {
  PDL_TRIGGER();
  PDL_WAIT();  // the logits come from the previous kernel
  __shared__ unsigned long long red[8], best[TOPK];
  __shared__ int last;
  const int r = blockIdx.y, nb = gridDim.x, tid = threadIdx.x;
  const float* row = logits + (size_t)r * N;
  unsigned long long k[TOPK] = {0ull, 0ull, 0ull, 0ull};
  for (int i = blockIdx.x * blockDim.x + tid; i < N; i += nb * blockDim.x) topk_insert(k, argmax_key(row[i], i));
  topk_block(k, red, best);
  if (tid < TOPK) ws[((size_t)r * nb + blockIdx.x) * TOPK + tid] = best[tid];
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(cnt + r, 1u) == (u32)(nb - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
#pragma unroll
  for (int i = 0; i < TOPK; i++) k[i] = 0ull;
  for (int i = tid; i < nb * TOPK; i += blockDim.x) topk_insert(k, __ldcg(ws + (size_t)r * nb * TOPK + i));
  topk_block(k, red, best);
  if (tid < TOPK) out[r * TOPK + tid] = (long long)(0xFFFFFFFFu - (u32)(best[tid] & 0xFFFFFFFFull));
  if (tid == 0) cnt[r] = 0u;
}
