// Decode-sized projections y[m, :] = x[m, :] @ W.T for 1 <= m <= 8 rows.
// W is either MLX affine-quantized (BITS 4 or 8: uint32 codes [out, in*BITS/32], scales and
// biases [out, in/G] in the activation type) or dense in the activation type (BITS 0).
// One warp owns RPW output rows; each lane streams 16 bytes of a row per step and
// dequantizes them in registers (w = s*q + b, fp32), then dots them with every input row.
#include "common.cuh"

template <int BITS> struct Chunk { static constexpr int CPC = BITS ? 128 / BITS : 16 / sizeof(act_t); };

template <int BITS>
__device__ __forceinline__ void decode_chunk(const void* __restrict__ W, const act_t* __restrict__ S,
                                             const act_t* __restrict__ B, long row, int c, int in,
                                             int G, float* w) {
  constexpr int CPC = Chunk<BITS>::CPC;
  if constexpr (BITS == 0) {
    const uint4* p = reinterpret_cast<const uint4*>(reinterpret_cast<const act_t*>(W) + row * in) + c * (CPC * sizeof(act_t) / 16);
    constexpr int PER = 16 / sizeof(act_t);
#pragma unroll
    for (int i = 0; i < CPC / PER; ++i) {
      uint4 u = __ldcs(p + i);
      const act_t* e = reinterpret_cast<const act_t*>(&u);
#pragma unroll
      for (int j = 0; j < PER; ++j) w[i * PER + j] = cv(e[j]);
    }
  } else {
    constexpr unsigned MASK = (1u << BITS) - 1u;
    constexpr int PW = 32 / BITS;
    uint4 u = __ldcs(reinterpret_cast<const uint4*>(W) + row * (long)(in / CPC) + c);
    int ng = in / G, g = (c * CPC) / G;
    float s = ld(S + row * ng + g), b = ld(B + row * ng + g);
    unsigned words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int k = 0; k < PW; ++k) {
        unsigned q = (words[i] >> (k * BITS)) & MASK;
        float fq = __uint_as_float(0x4B000000u | q) - 8388608.f;  // exact small integer
        w[i * PW + k] = fmaf(fq, s, b);
      }
    }
  }
}

// SWIGLU: two matrices (gate W0, up W1), one output row each; y = silu(gate) * up.
template <int BITS, int M, int RPW, bool SWIGLU>
__global__ void __launch_bounds__(256)
gemv(const void* __restrict__ W0, const act_t* __restrict__ S0, const act_t* __restrict__ B0,
     const void* __restrict__ W1, const act_t* __restrict__ S1, const act_t* __restrict__ B1,
     const act_t* __restrict__ X, int ldx, act_t* __restrict__ Y, int ldy, int out, int in, int G) {
  constexpr int CPC = Chunk<BITS>::CPC;
  const int lane = threadIdx.x & 31;
  const int gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int nwarps = (gridDim.x * blockDim.x) >> 5;
  const int nc = in / CPC;
  const int ngr = SWIGLU ? out : (out + RPW - 1) / RPW;
  for (int rg = gw; rg < ngr; rg += nwarps) {
    float acc[RPW][M];
#pragma unroll
    for (int r = 0; r < RPW; ++r)
#pragma unroll
      for (int m = 0; m < M; ++m) acc[r][m] = 0.f;
    for (int c = lane; c < nc; c += 32) {
      float w[RPW][CPC];
#pragma unroll
      for (int r = 0; r < RPW; ++r) {
        if (SWIGLU) {
          if (r == 0) decode_chunk<BITS>(W0, S0, B0, rg, c, in, G, w[r]);
          else decode_chunk<BITS>(W1, S1, B1, rg, c, in, G, w[r]);
        } else {
          int row = min(rg * RPW + r, out - 1);
          decode_chunk<BITS>(W0, S0, B0, row, c, in, G, w[r]);
        }
      }
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float x[CPC];
        load_vec<CPC>(X + (long)m * ldx + c * CPC, x);
#pragma unroll
        for (int r = 0; r < RPW; ++r) {
          float a = 0.f;
#pragma unroll
          for (int i = 0; i < CPC; ++i) a = fmaf(w[r][i], x[i], a);
          acc[r][m] += a;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < RPW; ++r)
#pragma unroll
      for (int m = 0; m < M; ++m) acc[r][m] = warp_sum(acc[r][m]);
    if (lane == 0) {
#pragma unroll
      for (int m = 0; m < M; ++m) {
        if (SWIGLU) {
          st(Y + (long)m * ldy + rg, silu_f(acc[0][m]) * acc[RPW - 1][m]);
        } else {
#pragma unroll
          for (int r = 0; r < RPW; ++r) {
            int row = rg * RPW + r;
            if (row < out) st(Y + (long)m * ldy + row, acc[r][m]);
          }
        }
      }
    }
  }
}
