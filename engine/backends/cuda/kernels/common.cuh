// Shared helpers. ACT_KIND picks the activation storage type at compile time:
// 0 = float, 1 = fp16, 2 = bf16. Half types are stored as raw 16-bit words and converted
// with PTX cvt, so no CUDA headers are needed under NVRTC. All math is fp32.
#pragma once
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef ACT_KIND
#define ACT_KIND 2
#endif

__device__ __forceinline__ float h2f(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ unsigned short f2h(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
__device__ __forceinline__ float b2f(unsigned short h) {
  return __uint_as_float(((unsigned)h) << 16);
}
__device__ __forceinline__ unsigned short f2b(float f) {
  unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}

#if ACT_KIND == 0
typedef float act_t;
__device__ __forceinline__ float ld(const act_t* p) { return *p; }
__device__ __forceinline__ float cv(act_t v) { return v; }
__device__ __forceinline__ act_t mk(float v) { return v; }
#elif ACT_KIND == 1
typedef unsigned short act_t;
__device__ __forceinline__ float cv(act_t v) { return h2f(v); }
__device__ __forceinline__ float ld(const act_t* p) { return h2f(*p); }
__device__ __forceinline__ act_t mk(float v) { return f2h(v); }
#else
typedef unsigned short act_t;
__device__ __forceinline__ float cv(act_t v) { return b2f(v); }
__device__ __forceinline__ float ld(const act_t* p) { return b2f(*p); }
__device__ __forceinline__ act_t mk(float v) { return f2b(v); }
#endif
__device__ __forceinline__ void st(act_t* p, float v) { *p = mk(v); }

// Load N consecutive activations (16-byte aligned, N * sizeof(act_t) a multiple of 16).
template <int N>
__device__ __forceinline__ void load_vec(const act_t* __restrict__ p, float* out) {
  constexpr int PER = 16 / sizeof(act_t);
#pragma unroll
  for (int i = 0; i < N / PER; ++i) {
    uint4 u = __ldg(reinterpret_cast<const uint4*>(p) + i);
    const act_t* e = reinterpret_cast<const act_t*>(&u);
#pragma unroll
    for (int j = 0; j < PER; ++j) out[i * PER + j] = cv(e[j]);
  }
}

// Load N consecutive activations: 16-byte loads where N of them fill whole vectors, else one
// by one (a lane's share of a row that is not a multiple of 16 bytes).
template <int N>
__device__ __forceinline__ void load_acts(const act_t* __restrict__ p, float* out) {
  if constexpr ((N * sizeof(act_t)) % 16 == 0) {
    load_vec<N>(p, out);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = ld(p + i);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// Inclusive prefix sum over a warp's lanes: lane i (`lane`, the caller's) gets the sum of
// lanes 0..i.
__device__ __forceinline__ float warp_inclusive_sum(float v, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float up = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += up;
  }
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum; every thread gets the result. `red` needs 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* red) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = lane < nw ? red[lane] : 0.f;
  return warp_sum(t);
}
__device__ __forceinline__ float block_max(float v, float* red) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = lane < nw ? red[lane] : -INFINITY;
  return warp_max(t);
}

// Programmatic dependent launch (launch.py): wait until the previous kernel in the stream has
// completed and its writes are visible; then let the next kernel's blocks start. Every kernel
// calls pdl_wait() before it reads an activation or writes anything; both are no-ops without
// the launch attribute and before sm_90.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_start() { pdl_wait(); pdl_launch(); }
// A hint: bring the 16 bytes at p toward L2 (issued before pdl_wait for weights, which no
// earlier kernel writes).
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}
// This block's share (part `part` of `parts`) of [p, p + bytes) brought toward L2 by bulk
// prefetches of up to 8 KiB, one a thread at a time (p 16-byte aligned, bytes a multiple of 16;
// compute capability 9.0, else nothing). For weights a later kernel will read, issued by a
// kernel that leaves memory idle (the DeltaNet step, attn_prep).
__device__ __forceinline__ void prefetch_share(const unsigned char* p, long long bytes, int part, int parts) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (p == nullptr || bytes <= 0) return;
  const long long per = ((bytes + parts - 1) / parts + 15) & ~15LL;
  const long long hi = min(bytes, (part + 1) * per);
  for (long long o = part * per + threadIdx.x * 8192LL; o < hi; o += blockDim.x * 8192LL) {
    const unsigned n = static_cast<unsigned>(min(8192LL, hi - o));
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + o), "r"(n) : "memory");
  }
#endif
}
// The three spans of launch.ahead_spans (the weights read next: the first one whole, the heads
// of the MLP's gate and up codes), this block's share of each; null spans are skipped.
__device__ __forceinline__ void prefetch_ahead(const unsigned char* p1, long long n1, const unsigned char* p2,
                                               long long n2, const unsigned char* p3, long long n3,
                                               int part, int parts) {
  prefetch_share(p1, n1, part, parts);
  prefetch_share(p2, n2, part, parts);
  prefetch_share(p3, n3, part, parts);
}

__device__ __forceinline__ float silu_f(float x) { return x / (1.f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.f / (1.f + expf(-x)); }
