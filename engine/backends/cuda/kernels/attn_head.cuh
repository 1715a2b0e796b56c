// A head's RMSNorm and partial RoPE, shared by attn_prep (attention.cu) and the decode step
// that does its work (attn_decode.cuh).
#pragma once
#include "common.cuh"

// The RoPE factors (cos, sin) of dim d at position p; (1, 0) past the rotary dims. Computed
// before the wait (positions are written before the step, and by no kernel of the last two).
__device__ __forceinline__ float2 rope_cs(int p, int d, int rot, double theta) {
  if (d >= rot) return make_float2(1.f, 0.f);
  const int half = rot / 2, j = d < half ? d : d - half;
  const double inv_freq = 1.0 / pow(theta, (double)(2 * j) / rot);
  const double a = (double)p * inv_freq;
  return make_float2((float)cos(a), (float)sin(a));
}
// A head's q/k RMSNorm and RoPE in one order of operations wherever it runs, so that a step
// whose attention does its own (attn_decode_prep: a lane holds DPL = hd / 32 dims) writes the
// same keys and scores the same queries as attn_prep (a thread a dim) bit for bit: lane l
// adds the squares of dims l * DPL .. l * DPL + DPL - 1 in turn, the lanes' sums fold by
// warp_sum, and lane 0's total is the head's; every product is rounded alone (no fused
// multiply-add the compiler may or may not form).
__device__ __forceinline__ float lane_sumsq(const float* x, int n) {
  float a = 0.f;
  for (int i = 0; i < n; ++i) a = __fadd_rn(a, __fmul_rn(x[i], x[i]));
  return a;
}
__device__ __forceinline__ float head_scale(float lane_ss, int hd, float eps) {
  const float ss = __shfl_sync(0xffffffffu, warp_sum(lane_ss), 0);
  return rsqrtf(ss / hd + eps);
}
__device__ __forceinline__ float norm_dim(float x, float inv, float w) { return __fmul_rn(__fmul_rn(x, inv), w); }
// Dim d after RoPE, from its normed value x and its partner's (d + rot / 2 where lo, the
// first half of the rotary dims; else d - rot / 2).
__device__ __forceinline__ float rope_dim(float x, float partner, float2 cs, bool lo) {
  const float ps = __fmul_rn(partner, cs.y);
  return fmaf(x, cs.x, lo ? -ps : ps);
}
