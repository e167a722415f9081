// Shared by the decode kernels (decode_gemv.cu, decode_misc.cu, decode_attn.cu): fp16 helpers and the
// programmatic-dependent-launch macros. decode_kernels.py compiles it first, then the kernel files.

typedef unsigned short h16;
typedef unsigned int u32;

__device__ __forceinline__ float h2f(h16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ h16 f2h(float f) { h16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }

// a / b as div.rn.f32's fast path alone: rcp + five FMAs, the instructions `a / b` compiles to, without the range check
// (FCHK) and the branch to the slow-path subroutine (a CALL, its convergence barrier) that every IEEE division in a
// kernel otherwise carries. The same bits as a / b wherever FCHK sends a / b down that path (operands and quotient
// normal and far from the range's ends): each caller's domain lies there, checked on the GPU bit for bit against
// a / b (kernels/div_check.py: every fp32 input where it is one variable).
__device__ __forceinline__ float div_rn_fast(float a, float b) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));
  r = __fmaf_rn(r, __fmaf_rn(-b, r, 1.f), r);  // the reciprocal refined
  const float q = __fmaf_rn(a, r, 0.f);
  return __fmaf_rn(r, __fmaf_rn(-b, q, a), q);  // the quotient corrected by its residual
}
// 1 / d as rcp.rn.f32's fast path alone (rcp + two FMAs, what `1.f / d` runs where d's exponent is away from the
// range's ends): the bits of 1.f / d for |d| in [2^-126, 2^126) (checked on every such fp32). The attention's softmax
// sums are >= 1 (the largest key's own exp(0)) and below 2^16.
__device__ __forceinline__ float rcp_rn_fast(float d) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  return __fmaf_rn(r, -__fmaf_rn(d, r, -1.f), r);
}
// silu(g) = g / (1 + e^-g) with the division above: the bits of `g / (1.f + __expf(-g))` for every finite g (checked
// on each of them), the fp16 rounding of silu(g) * up equal for every up as well. Where 1 + e^-g >= 2^126 (g <
// -87.3, the reciprocal flushes) the quotient's |value| < 1e-36 is written as a zero of g's sign: fp16 keeps neither.
__device__ __forceinline__ float silu_f(float g) {
  const float d = 1.f + __expf(-g);
  return copysignf(d < 0x1p126f ? div_rn_fast(g, d) : 0.f, g);
}
// Where the step uses them, by DECODE_DIV_FAST's bits (an A/B knob; 0: the plain divisions everywhere):
// 1 gate_up's silu, 2 the deferred norm's scales (x / D and rstd_hi / (rstd_lo / 16), decode_norm.cu / decode_gemv.cu),
// 4 the attention's 1 / den and single-split o / den (its fp16 output equal for every finite o; decode_attn.cu).
// Default 3: on an H100 the 3B step's replay 1.128 -> 1.124 (silu) / 1.106 (norm) ms, 1.101 -> 1.093 both (-0.7%; 7B
// level), while the attention's bit made the short attention's tail 0.3 -> 1.7 us (replay 1.140: slower; traced,
// decode_ab_divbits_h100.json, gemv_phases_div*_h100.json). The same bits either way (greedy tokens equal).
#ifndef DECODE_DIV_FAST
#define DECODE_DIV_FAST 3
#endif
__device__ __forceinline__ float silu_d(float g) { return (DECODE_DIV_FAST & 1) ? silu_f(g) : g / (1.f + __expf(-g)); }
__device__ __forceinline__ float norm_div(float a, float b) { return (DECODE_DIV_FAST & 2) ? div_rn_fast(a, b) : a / b; }
__device__ __forceinline__ float att_rcp(float d) { return (DECODE_DIV_FAST & 4) ? rcp_rn_fast(d) : 1.f / d; }
__device__ __forceinline__ float att_div(float o, float den) {  // den >= 1: a zero of o's sign where o / den underflows
  return (DECODE_DIV_FAST & 4) ? copysignf(div_rn_fast(o, den), o) : o / den;
}

// Rotary (neox halves) of one k pair (x1 = dim d, x2 = dim d + HD/2) at cos c / sin s, rounded to fp16 as the KV
// cache stores it. Explicit roundings (no contraction left to the compiler): every kernel that writes a k row or
// rebuilds one from qkv (decode_attn.cu) gets the same bits.
__device__ __forceinline__ h16 rope_lo(float x1, float x2, float c, float s) { return f2h(__fmaf_rn(x1, c, -__fmul_rn(x2, s))); }
__device__ __forceinline__ h16 rope_hi(float x1, float x2, float c, float s) { return f2h(__fmaf_rn(x2, c, __fmul_rn(x1, s))); }

// D += A B on the tensor cores, m16n8k16 fp16 -> fp32 (sm_80+): lane (g = lane / 4, t = lane % 4) holds
// a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]; b0 = B[2t..2t+1][g], b1 = B[2t+8..][g];
// d = D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1] (decode_gemv.cu, decode_attn.cu)
__device__ __forceinline__ void mma16816(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Programmatic dependent launch (kernels/pdl.py): sm_90+ only; no-ops elsewhere and without the attribute.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define PDL_TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define PDL_WAIT()
#define PDL_TRIGGER()
#endif

// The split-K "last block" handshakes (decode_gemv.cu KSB > 1, decode_attn.cu's in-kernel merge): stores, fence,
// atomic on the tile's counter; the last block: fence, loads. __threadfence is fence.sc.gpu (MEMBAR.SC.GPU), stronger
// than the handshake needs; GEMV_FENCE_AR=1 (an experiment) uses fence.acq_rel.gpu (MEMBAR.ALL.GPU):
// release before the atomic, acquire after it, what the PTX memory model asks of message passing. Level on the H100
// (decode_ab_epi_h100.json, replay ms: 3B W4 1.232 vs 1.229, 7B W4 1.972 vs 1.957): left off.
#ifndef GEMV_FENCE_AR
#define GEMV_FENCE_AR 0
#endif
#if GEMV_FENCE_AR
#define SPLITK_FENCE() asm volatile("fence.acq_rel.gpu;" ::: "memory")
#else
#define SPLITK_FENCE() __threadfence()
#endif

// Thread block clusters (sm_90+): a split-K GEMV launched with cluster dims (1, KSB, 1) (kernels/pdl.py, DecodeKernels
// gemv_cluster) reduces its K slices' partials through distributed shared memory instead of the global handshake
// (decode_gemv.cu). cluster_size() is 1 for any other launch and on older GPUs, so one kernel runs both ways.
// Compiled in with -DGEMV_CLUSTER=1 only (an A/B build: measured level at best on an H100, docs/gpu.md thirty-fifth
// session; compiled in, it added 160-304 SASS instructions to every sm_90 GEMV kernel; the block sits after the K loop).
#ifndef GEMV_CLUSTER
#define GEMV_CLUSTER 0
#endif
// 1: the K slice 0 block waits at the second barrier (arrive + wait) as the others do; 0: it only arrives (its loads
// released) and goes on to the epilogue: an A/B knob
#ifndef GEMV_CLUSTER_B0WAIT
#define GEMV_CLUSTER_B0WAIT 1
#endif
#if GEMV_CLUSTER && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define CLUSTER_OK 1
__device__ __forceinline__ u32 cluster_size() { u32 n; asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n)); return n; }
// every non-exited thread of the cluster: release this thread's earlier accesses (shared memory stores, remote loads),
// then wait for all the others' (exited threads do not hold the barrier up)
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
// the float at this CTA's shared address `local`, in the shared memory of the cluster's CTA `rank`
__device__ __forceinline__ float cluster_ld(u32 local, u32 rank) {
  u32 a;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(local), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(a));  // after the barrier (volatile: in order)
  return v;
}
#else
#define CLUSTER_OK 0
#endif

// L2 prefetch of the step's next weights (engine/model/l2_prefetch.py): pf = [n, ptr_0, bytes_0, ...] (int64), the
// grid's threads take 128-byte lines round robin. Fire and forget: no register is written, nothing waits on it.
// Only weights (never written by the step), so it may run before the PDL wait. L2PF 0 compiles it out.
#ifndef L2PF
#define L2PF 1
#endif
__device__ __noinline__ void l2_prefetch(const long long* __restrict__ pf) {
#if L2PF
  if (pf == nullptr) return;
  const int n = (int)__ldg(pf);
  const long long nthr = (long long)gridDim.x * gridDim.y * gridDim.z * blockDim.x;
  const long long me = (((long long)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * blockDim.x +
                       threadIdx.x;
  for (int r = 0; r < n; r++) {
    const char* p = (const char*)__ldg(pf + 1 + 2 * r);
    const long long lines = (__ldg(pf + 2 + 2 * r) + 127) >> 7;
    for (long long l = me; l < lines; l += nthr) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + (l << 7)));
  }
#endif
}
