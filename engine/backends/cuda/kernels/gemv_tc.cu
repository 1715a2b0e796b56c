// Decode-sized projections y[m, :] = x[m, :] @ W.T (1 <= m <= 8) for a dense matrix in the
// activation type (bf16 or fp16, sm_80 and newer), on tensor cores: the SIMT kernel
// (gemv.cu) does M fused multiply-adds per weight, which a drafting verify's 2 to 4 rows turn
// from a stream of weights into a stream of instructions; here M changes nothing but zeros.
//
// A block takes one tile of 16 weight rows (SWIGLU: 8 gate rows over the same 8 up rows) and
// its warps split the columns into contiguous slices (KS = blockDim.x / 32 of them). Per step
// of 32 columns lane l (g = l / 4, t = l % 4) reads 16 bytes of each of its two weight rows
// (g and g + 8 of the tile) and 16 bytes of activation row g (zeros past M), all at columns
// 32 s + 8 t .. + 7, and runs two mma.m16n8k16: the first on those chunks' words 0 and 1, the
// second on words 2 and 3. In the mma's fragments lane l holds k = 2t, 2t+1 (register 0 of
// A and B) and k = 2t+8, 2t+9 (A's register 2, B's register 1) of rows g / g+8 and of column
// g: so each mma's 16 values of k are the columns 32 s + 8 t' + 2 j + {0, 1} (t' = 0..3,
// j its word) in A and in B alike, and the product sums each column once. Each weight and
// activation is read with one 16-byte load and nothing is staged in shared memory.
//
// C's fragment gives lane l rows g and g + 8 of activation rows 2t and 2t + 1. The warps'
// partial sums are added in warp order through shared memory, so a row's sums do not depend
// on M. The first U steps' weights are requested before the wait for the previous kernel.
#include "mma.cuh"

constexpr int TC_MAX_WARPS = 8;

template <int M, bool SWIGLU, int U>
__global__ void __launch_bounds__(32 * TC_MAX_WARPS)
gemv_tc(const act_t* __restrict__ W0, const act_t* __restrict__ W1, const act_t* __restrict__ X, int ldx,
        act_t* __restrict__ Y, int ldy, int out, int in) {
  __shared__ float red[TC_MAX_WARPS][4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, KS = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3, tile = blockIdx.x;
  // This lane's two weight rows (past `out`: the last row, read and not stored).
  const act_t* wa;
  const act_t* wb;
  if (SWIGLU) {
    const long row = min(tile * 8 + g, out - 1);
    wa = W0 + row * in;
    wb = W1 + row * in;
  } else {
    wa = W0 + (long)min(tile * 16 + g, out - 1) * in;
    wb = W0 + (long)min(tile * 16 + g + 8, out - 1) * in;
  }
  const int steps = in >> 5, per = (steps + KS - 1) / KS;
  const int s0 = min(steps, warp * per), s1 = min(steps, s0 + per);
  const act_t* xr = X + (long)min(g, M - 1) * ldx;
  uint4 A[U], B[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (s0 + u < s1) {
      A[u] = __ldcs(reinterpret_cast<const uint4*>(wa + (s0 + u) * 32 + 8 * t));
      B[u] = __ldcs(reinterpret_cast<const uint4*>(wb + (s0 + u) * 32 + 8 * t));
    }
  }
  pdl_start();
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int s = s0; s < s1; s += U) {
    uint4 xv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      xv[u] = make_uint4(0u, 0u, 0u, 0u);
      if (s + u < s1 && g < M) xv[u] = __ldg(reinterpret_cast<const uint4*>(xr + (s + u) * 32 + 8 * t));
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (s + u < s1) {  // the same for the whole warp
        const unsigned a0[4] = {A[u].x, B[u].x, A[u].y, B[u].y};
        pf_mma(acc, a0, xv[u].x, xv[u].y);
        const unsigned a1[4] = {A[u].z, B[u].z, A[u].w, B[u].w};
        pf_mma(acc, a1, xv[u].z, xv[u].w);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {  // the next U steps' weights
      if (s + U + u < s1) {
        A[u] = __ldcs(reinterpret_cast<const uint4*>(wa + (s + U + u) * 32 + 8 * t));
        B[u] = __ldcs(reinterpret_cast<const uint4*>(wb + (s + U + u) * 32 + 8 * t));
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) red[warp][i][lane] = acc[i];
  __syncthreads();
  if (warp != 0) return;
  float v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[i] = red[0][i][lane];
    for (int w = 1; w < KS; ++w) v[i] += red[w][i][lane];
  }
  const int m0 = 2 * t, m1 = 2 * t + 1;
  if (SWIGLU) {
    const int row = tile * 8 + g;
    if (row < out) {
      if (m0 < M) st(Y + (long)m0 * ldy + row, silu_f(v[0]) * v[2]);
      if (m1 < M) st(Y + (long)m1 * ldy + row, silu_f(v[1]) * v[3]);
    }
  } else {
    const int ra = tile * 16 + g, rb = ra + 8;
    if (ra < out) {
      if (m0 < M) st(Y + (long)m0 * ldy + ra, v[0]);
      if (m1 < M) st(Y + (long)m1 * ldy + ra, v[1]);
    }
    if (rb < out) {
      if (m0 < M) st(Y + (long)m0 * ldy + rb, v[2]);
      if (m1 < M) st(Y + (long)m1 * ldy + rb, v[3]);
    }
  }
}
