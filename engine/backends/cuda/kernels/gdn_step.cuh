// Pieces of gdn.cu's recurrent kernels: the state of a warp's value columns (gdn_scan and
// the step kernels), and what the decode step kernels (gdn_step, gdn_step_split and their
// verify forms) share: the conv taps, the gates, the staged q, k and v, the delta rule for
// one row.
#pragma once
#include "common.cuh"

__device__ __forceinline__ float dot4(float4 a, float4 b) {
  return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

// The key head size the recurrent kernels take (dk = 128) and the most conv taps a step takes.
constexpr int STEP_DK = 128, STEP_MAXK = 4;

// This warp's NC columns' recurrent states (value head h, columns j0..: dk values each, a
// float4 a lane) into S; returns where they live, for store_state.
template <int NC>
__device__ __forceinline__ float* load_state(float* state, long slot, int Hv, int h, int dv, int j0, int lane,
                                             float4 (&S)[NC]) {
  float* sp = state + ((slot * Hv + h) * dv + j0) * STEP_DK;
#pragma unroll
  for (int c = 0; c < NC; ++c) S[c] = reinterpret_cast<float4*>(sp + c * STEP_DK)[lane];
  return sp;
}
template <int NC>
__device__ __forceinline__ void store_state(float* sp, const float4 (&S)[NC], int lane) {
#pragma unroll
  for (int c = 0; c < NC; ++c) reinterpret_cast<float4*>(sp + c * STEP_DK)[lane] = S[c];
}

// The conv channel of thread tid in a block of key head kh: q (threads 0-127), k (128-255),
// then v channels from column v0 of the whole value width (the block's first value column).
__device__ __forceinline__ int step_channel(int tid, int kh, int KD, int v0) {
  constexpr int DK = STEP_DK;
  return tid < DK ? kh * DK + tid : tid < 2 * DK ? KD + kh * DK + tid - DK : 2 * KD + v0 + tid - 2 * DK;
}

// Conv channel c's K-1 older taps and their weights (zeros where the thread has no channel,
// conv false); returns the newest tap's weight. Nothing earlier in the step writes them.
__device__ __forceinline__ float conv_taps(bool conv, int c, int K, int C, const float* __restrict__ conv_w,
                                           const act_t* cs, float (&wk)[STEP_MAXK - 1],
                                           float (&tap)[STEP_MAXK - 1]) {
  const float wnew = conv ? conv_w[(long)c * K + K - 1] : 0.f;
#pragma unroll
  for (int j = 0; j + 1 < STEP_MAXK; ++j) {
    wk[j] = conv && j + 1 < K ? conv_w[(long)c * K + j] : 0.f;
    tap[j] = conv && j + 1 < K ? ld(cs + (long)j * C + c) : 0.f;
  }
  return wnew;
}

// The conv of K taps: K-1 from the state, the newest from this row (before SiLU).
__device__ __forceinline__ float conv_acc(const float (&wk)[STEP_MAXK - 1], const float (&tap)[STEP_MAXK - 1],
                                          float wnew, act_t newest, int K) {
  float acc = 0.f;
#pragma unroll
  for (int j = 0; j + 1 < STEP_MAXK; ++j)
    if (j + 1 < K) acc = fmaf(wk[j], tap[j], acc);
  return fmaf(wnew, cv(newest), acc);
}

// Channel c's conv taps shifted by one in place: the older ones down, the newest last.
__device__ __forceinline__ void shift_taps(act_t* cs, int c, int C, int K, const float (&tap)[STEP_MAXK - 1],
                                           act_t newest) {
#pragma unroll
  for (int j = 0; j + 2 < STEP_MAXK; ++j)
    if (j + 2 < K) cs[(long)j * C + c] = mk(tap[j + 1]);
  cs[(long)(K - 2) * C + c] = newest;
}

// A value head's gates from row entry i: beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias).
__device__ __forceinline__ void step_gates(const act_t* __restrict__ a, const act_t* __restrict__ b, long i,
                                           float a_log, float dtb, float& g, float& beta) {
  const act_t bi = b[i], ai = a[i];  // both requested before either is used: one round trip
  beta = sigmoid_f(cv(bi));
  const float x = cv(ai) + dtb;
  const float sp1 = x > 20.f ? x : log1pf(expf(x));
  g = -expf(a_log) * sp1;
}

// The block's conv outputs to shared memory: q (threads 0-127) and k (128-255) l2-normalised
// (q also by 1/sqrt(dk)), summed as gdn_prep's block_sum sums them; nv v channels after them.
__device__ __forceinline__ void stage_qkv(float val, int tid, int lane, int warp, int nv, float* red, float* sq,
                                          float* sk, float* sv) {
  constexpr int DK = STEP_DK;
  const float ss = warp_sum(val * val);
  if (lane == 0) red[warp] = ss;
  __syncthreads();
  if (tid < DK) {
    sq[tid] = val * (rsqrtf((red[0] + red[2]) + (red[1] + red[3]) + 1e-6f) * rsqrtf((float)DK));
  } else if (tid < 2 * DK) {
    sk[tid - DK] = val * rsqrtf((red[4] + red[6]) + (red[5] + red[7]) + 1e-6f);
  } else if (tid < 2 * DK + nv) {
    sv[tid - 2 * DK] = val;
  }
  __syncthreads();
}

// The delta rule for a warp's NC value columns (their states S, their values sv[0..NC)), one
// column at a time (fewer registers than gdn_scan's order); returns lane c's output of column c.
template <int NC>
__device__ __forceinline__ float delta_columns(float4 (&S)[NC], const float* sq, const float* sk, const float* sv,
                                               float decay, float bt, int lane) {
  const float4 kk = reinterpret_cast<const float4*>(sk)[lane];
  const float4 qq = reinterpret_cast<const float4*>(sq)[lane];
  const float kq = warp_sum(dot4(kk, qq));
  float out = 0.f;
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    const float skc = warp_sum(dot4(S[c], kk)), sqc = warp_sum(dot4(S[c], qq));
    const float delta = bt * (sv[c] - decay * skc);
    S[c].x = fmaf(kk.x, delta, decay * S[c].x);
    S[c].y = fmaf(kk.y, delta, decay * S[c].y);
    S[c].z = fmaf(kk.z, delta, decay * S[c].z);
    S[c].w = fmaf(kk.w, delta, decay * S[c].w);
    const float oc = decay * sqc + delta * kq;
    if (lane == c) out = oc;
  }
  return out;
}
