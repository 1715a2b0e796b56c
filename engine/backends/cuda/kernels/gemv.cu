// Decode-sized projections y[m, :] = x[m, :] @ W.T for 1 <= m <= 8 rows.
// W is either MLX affine-quantized (BITS 4 or 8: uint32 codes [out, in*BITS/32], scales and
// biases [out, in/G] in the activation type) or dense in the activation type (BITS 0).
// One warp owns RPW output rows; each lane streams 16 bytes of a row per step and
// dequantizes them in registers (w = s*q + b, fp32), then dots them with every input row.
// Input rows are read in 16-byte loads (x 16-byte aligned, in * sizeof(act_t) a multiple
// of 16: gemv_plan.gemv_fits).
#include "common.cuh"

// Values per 32-bit word: 32/BITS codes, or 4/sizeof(act_t) dense values.
template <int BITS> struct Word { static constexpr int N = BITS ? 32 / BITS : 4 / (int)sizeof(act_t); };

template <int BITS>
__device__ __forceinline__ float wval(unsigned word, int k, float s, float b) {
  if constexpr (BITS == 0) {
    const act_t* e = reinterpret_cast<const act_t*>(&word);
    return cv(e[k]);
  } else {
    unsigned q = (word >> (k * BITS)) & ((1u << BITS) - 1u);
    return fmaf(__uint_as_float(0x4B000000u | q) - 8388608.f, s, b);  // exact small integer
  }
}

// Each lane keeps U 16-byte chunks of each of its RPW rows per row in flight before it computes, so enough bytes are
// outstanding per SM to cover memory latency; words are dequantized as they are used.
// SWIGLU: two matrices (gate W0, up W1), one output row each; y = silu(gate) * up.
template <int BITS, int M, int RPW, bool SWIGLU, int U>
__global__ void __launch_bounds__(256)
gemv(const void* __restrict__ W0, const act_t* __restrict__ S0, const act_t* __restrict__ B0,
     const void* __restrict__ W1, const act_t* __restrict__ S1, const act_t* __restrict__ B1,
     const act_t* __restrict__ X, int ldx, act_t* __restrict__ Y, int ldy, int out, int in, int G) {
  constexpr int VPW = Word<BITS>::N, CPC = 4 * VPW;
  const int lane = threadIdx.x & 31;
  const int gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int nwarps = (gridDim.x * blockDim.x) >> 5;
  const int nc = in / CPC, ng = in / G;
  const int ngr = SWIGLU ? out : (out + RPW - 1) / RPW;
  if (gw < ngr) {  // this warp's first weights move toward L2 while the previous kernel ends
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      const long row = SWIGLU ? gw : min(gw * RPW + r, out - 1);
      const uint4* wr = reinterpret_cast<const uint4*>(SWIGLU && r == 1 ? W1 : W0) + row * nc;
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (lane + 32 * u < nc) prefetch_l2(wr + lane + 32 * u);
    }
  }
  pdl_start();
  for (int rg = gw; rg < ngr; rg += nwarps) {
    float acc[RPW][M];
    long rows[RPW];
    const uint4* wp[RPW];
    const act_t* sp[RPW];
    const act_t* bp[RPW];
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
#pragma unroll
      for (int m = 0; m < M; ++m) acc[r][m] = 0.f;
      rows[r] = SWIGLU ? rg : min(rg * RPW + r, out - 1);
      const bool second = SWIGLU && r == 1;
      wp[r] = reinterpret_cast<const uint4*>(second ? W1 : W0) + rows[r] * nc;
      sp[r] = (second ? S1 : S0) + rows[r] * ng;
      bp[r] = (second ? B1 : B0) + rows[r] * ng;
    }
    for (int c0 = lane; c0 < nc; c0 += 32 * U) {
      uint4 raw[U][RPW];
      float sc[U][RPW], bi[U][RPW];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + 32 * u;
#pragma unroll
        for (int r = 0; r < RPW; ++r) {
          if (c < nc) {
            raw[u][r] = __ldcs(wp[r] + c);
            if (BITS) { sc[u][r] = ld(sp[r] + c * CPC / G); bi[u][r] = ld(bp[r] + c * CPC / G); }
          }
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + 32 * u;
        if (BITS == 0 && c < nc) {
          // Dense: the chunk's CPC activations of each input row in one 16-byte load (the
          // path below reads a word's VPW of them at a time, 4 bytes); the same sums in the
          // same order.
#pragma unroll
          for (int m = 0; m < M; ++m) {
            float x[CPC];
            load_vec<CPC>(X + (long)m * ldx + c * CPC, x);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
#pragma unroll
              for (int r = 0; r < RPW; ++r) {
                const unsigned word = i == 0 ? raw[u][r].x : i == 1 ? raw[u][r].y : i == 2 ? raw[u][r].z : raw[u][r].w;
                float a = acc[r][m];
#pragma unroll
                for (int k = 0; k < VPW; ++k) a = fmaf(wval<BITS>(word, k, 0.f, 0.f), x[i * VPW + k], a);
                acc[r][m] = a;
              }
            }
          }
        } else if (c < nc) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
#pragma unroll
            for (int m = 0; m < M; ++m) {
              float x[VPW];
              load_acts<VPW>(X + (long)m * ldx + c * CPC + i * VPW, x);
#pragma unroll
              for (int r = 0; r < RPW; ++r) {
                const unsigned word = i == 0 ? raw[u][r].x : i == 1 ? raw[u][r].y : i == 2 ? raw[u][r].z : raw[u][r].w;
                float a = acc[r][m];
#pragma unroll
                for (int k = 0; k < VPW; ++k) a = fmaf(wval<BITS>(word, k, BITS ? sc[u][r] : 0.f, BITS ? bi[u][r] : 0.f), x[k], a);
                acc[r][m] = a;
              }
            }
          }
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
