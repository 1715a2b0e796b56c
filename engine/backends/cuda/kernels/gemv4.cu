// Decode-sized projections y[m, :] = x[m, :] @ W.T (1 <= m <= 8) for MLX affine 4-bit weights
// with group size 64 and half-precision activations (bf16 or fp16), on tensor cores.
//
// Layout: codes uint32 [out, in/8], LSB-first nibbles; scales/biases [out, in/64]; w = s*q + b.
//
// Per warp a tile of 16 weight rows (SWIGLU: 8 gate rows over 8 up rows) times a slice of the
// column groups. Each lane reads 8 bytes of a group of two rows (rows g and g+8, g = lane/4):
// a quad of lanes covers one 32-byte group row, so every sector fetched is used. The nibbles are
// turned into half-precision pairs with one LOP3 each (the nibble goes under the mantissa of
// BASE = 128 (bf16) or 1024 (fp16), which is exact) and fed to mma.m16n8k16 as the A operand;
// the activations (the B operand, one column per activation row) are staged once per block in
// shared memory, pre-permuted so that a lane's fragment for one code word is one 16-byte load.
// Per group the mma gives C = sum((BASE+q) * x) in fp32, so
//     sum(w * x) = s * C + (b - BASE*s) * sum(x)
// with sum(x) per group and activation row computed once per block. Warps that share a tile
// (KS slices of the columns) are summed through shared memory at the end.
#include "gemv4_parts.cuh"
#include "stamps.cuh"

// KS = blockDim.x / (32 * TPB) warps share a tile (each takes a contiguous slice of the groups),
// TPB tiles per block, UG groups loaded per step. PIPE: the next UG groups are fetched while the
// current ones are computed; otherwise the wrapper makes the slices at most UG groups long (or
// close), so each warp issues all its loads at once, before the activations are staged (and,
// under programmatic dependent launch, before the previous kernel has finished).
// Register cap from MAXT (the largest block launched): 64 for pipelined UG <= 2 and for ASYNC,
// else 85. Dynamic shared memory (sized by the wrapper): xs, M rows of in/8 + 1 16-byte
// entries; sx, 8 floats per group; red, 4 floats per thread; ASYNC: 20 bytes per lane and group.
// DOWN (gemv4_mlp): the down projection is fused behind the SwiGLU gate/up. A virtual block's
// 8 * TPB = 64 intermediate rows are one column group of the down weights, so the block
// multiplies its own slice of h = silu(gate) * up (rounded to the activation type, as the
// separate kernels store it) by that group of every down row and adds the products into
// `acc`, fixed point with 32 fraction bits: integer sums do not depend on the order the
// blocks arrive in, so the result is the same on every run. The consumer (prologue PRO 3,
// add_rms_norm_fix) reads it back. Each launch also clears `zero`, the previous layer's
// accumulator, whose reader has finished by the time this kernel's wait returns.
struct Down {
  const unsigned* W;
  const act_t* S;
  const act_t* B;
  long long* acc;  // [M, out] rows `out` apart
  int out, in;     // the down weights' shape (hidden, intermediate)
  long long* zero;
  int nzero;
};

__device__ __forceinline__ void red_fix(long long* p, float v) {
#ifdef SNUG_PROBE_NO_RED
  if (v == 12345.f) *p = 1;
  return;
#endif
  atomicAdd(reinterpret_cast<unsigned long long*>(p),
            static_cast<unsigned long long>(__float2ll_rn(v * 4294967296.f)));
}

template <int M, bool SWIGLU, int TPB, int UG, bool PIPE, int PRO, bool ASYNC, bool DOWN>
__device__ __forceinline__ void
gemv4_body(const unsigned* __restrict__ W0, const act_t* __restrict__ S0, const act_t* __restrict__ B0,
           const unsigned* __restrict__ W1, const act_t* __restrict__ S1, const act_t* __restrict__ B1,
           const act_t* __restrict__ X, int ldx, act_t* __restrict__ Y, int ldy, int out, int in,
           const act_t* __restrict__ pd, const float* __restrict__ pnw, act_t* __restrict__ ph,
           const float* __restrict__ po, int phd, float peps, int late, const Down& dn) {
  static_assert(!DOWN || (SWIGLU && TPB == 8 && !ASYNC), "a fused down projection takes 64-row blocks");
  const int NT = blockDim.x, KS = NT / (32 * TPB);
  Stamps stamps;
  stamps.at(0, threadIdx.x);
  constexpr int ROWS = SWIGLU ? 8 : 16;
  extern __shared__ uint4 smem[];
  __shared__ float pss[PRO ? 256 : 1];
  const int ng = in >> 6, nw = in >> 3, xstride = nw + 1;
  uint4* xs = smem;
  float* sx = reinterpret_cast<float*>(xs + M * xstride);
  float* red = sx + ng * 8;
  // DOWN: the block's column group of every down row (codes, then the aligned 4-byte pairs
  // that hold its scale and its bias), h of its 64 rows, h staged as x is, sums of h.
  uint2* dcode = reinterpret_cast<uint2*>(red + NT * 4);  // [dn.out][4]
  unsigned* dsb = reinterpret_cast<unsigned*>(dcode + (DOWN ? dn.out * 4 : 0));  // [dn.out][2]
  float* hs = reinterpret_cast<float*>(dsb + (DOWN ? dn.out * 2 : 0));  // [M][64]
  uint4* xd = reinterpret_cast<uint4*>(hs + M * 64);  // [8][8]
  float* sxd = reinterpret_cast<float*>(xd + 64);  // [8]

  const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, tig = lane & 3;
  const int wid = tid >> 5, tl = wid / KS, ks = wid % KS;
  // Blocks loop over virtual blocks vb (TPB tiles each): the grid is at most what fits on
  // the GPU at once, so the activations are staged once per block and the next tile's
  // first weights are in flight while the current tile is reduced and stored.
  const int VB = ((out + ROWS - 1) / ROWS + TPB - 1) / TPB;
  auto rows_of = [&](int vb) {
    const int tile = vb * TPB + tl;
    const int rlo = min(tile * ROWS + g, out - 1);
    const int rhi = SWIGLU ? rlo : min(tile * ROWS + g + 8, out - 1);
    const uint2* wlo = reinterpret_cast<const uint2*>(W0 + (long)rlo * nw) + tig;
    const uint2* whi = reinterpret_cast<const uint2*>((SWIGLU ? W1 : W0) + (long)rhi * nw) + tig;
    const act_t* sb = tig == 0 ? S0 + (long)rlo * ng
                    : tig == 1 ? B0 + (long)rlo * ng
                    : tig == 2 ? (SWIGLU ? S1 : S0) + (long)rhi * ng
                               : (SWIGLU ? B1 : B0) + (long)rhi * ng;
    return Rows{wlo, whi, sb};
  };
  int vb = blockIdx.x;
  const int slice = (ng + KS - 1) / KS;
  const int ga = min(ng, ks * slice), gb = min(ng, ga + slice);

  constexpr int RG = ASYNC ? 1 : UG;  // groups held in registers
  Batch<RG> A;
  Batch<PIPE ? UG : 1> B;
  Rows rw = rows_of(vb);
  // ASYNC staging after red: codes of rows g (wa) and g+8 (wb), scale/bias pairs (wq).
  uint2* const wbase = reinterpret_cast<uint2*>(red + NT * 4);
  uint2* const wa = wbase + wid * UG * 32;
  uint2* const wb = wbase + (NT / 32 + wid) * UG * 32;
  unsigned* const wq = reinterpret_cast<unsigned*>(wbase + 2 * (NT / 32) * UG * 32) + wid * UG * 32;
  // late (a measurement, Ops.gemv_weights_late): the first weights are requested after the
  // activations are staged, not before the wait, so the staging does not queue behind them.
  auto first_weights = [&]() {
    if constexpr (ASYNC) {
      fetch_async<UG>(wa, wb, wq, rw, ga, gb, lane);  // the whole slice in flight
    } else {
      fetch(A, rw, ga, gb);  // weights in flight while the activations are staged
    }
  };
  if (!late) first_weights();
  if constexpr (DOWN) {  // weights: no earlier kernel writes them, so before the wait
    const int gi = blockIdx.x, nwd = dn.in >> 3, ngd = dn.in >> 6;
#ifdef SNUG_PROBE_NO_COPY
    for (int i = tid; i < 0; i += NT) {
#else
    for (int i = tid; i < dn.out * 2; i += NT) {
#endif
      const int row = i >> 1;
      cp_async16(reinterpret_cast<uint4*>(dcode) + i,
                 reinterpret_cast<const uint4*>(dn.W + (long)row * nwd + gi * 8) + (i & 1));
      cp_async(dsb + i, ((i & 1) ? dn.B : dn.S) + (long)row * ngd + (gi & ~1), 4);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  const Pro pr{pd, pnw, ph, po, phd, peps};
  if constexpr (PRO != 0)
    for (int i = tid; i < 256; i += NT) pss[i] = 0.f;
  pdl_start();  // from here on, activations of the previous kernel are readable
  stamps.at(1, tid);
  if constexpr (DOWN)
    for (int i = blockIdx.x * NT + tid; i < dn.nzero; i += gridDim.x * NT) dn.zero[i] = 0;

  if constexpr (PRO != 0) {
    __syncthreads();
    pro_sums<M, PRO>(X, ldx, pr, xs, xstride, nw, in, pss, tid, NT);
    __syncthreads();
  }
  stage_x<M, PRO>(X, ldx, pr, xs, xstride, sx, nw, in, pss, tid, NT);
  __syncthreads();
  stamps.at(2, tid);
  if (late) first_weights();

  const uint4* xrow = xs + (g < M ? g : 0) * xstride + 2 * tig;
  for (; vb < VB; vb += DOWN ? VB : gridDim.x) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    if constexpr (ASYNC) {
      asm volatile("cp.async.wait_all;" ::: "memory");
      constexpr int CH = 4;
      for (int g0 = ga; g0 < gb; g0 += CH) {
        Batch<CH> C;
        unstage(C, wa, wb, wq, g0 - ga, g0, gb, lane);
        compute<M>(C, g0, gb, xrow, sx, g, tig, acc);
      }
    } else if constexpr (PIPE) {
      for (int g0 = ga; g0 < gb; g0 += 2 * UG) {
        fetch(B, rw, g0 + UG, gb);
        compute<M>(A, g0, gb, xrow, sx, g, tig, acc);
        fetch(A, rw, g0 + 2 * UG, gb);
        compute<M>(B, g0 + UG, gb, xrow, sx, g, tig, acc);
      }
    } else {
      for (int g0 = ga; g0 < gb; g0 += UG) {
        if (g0 != ga) fetch(A, rw, g0, gb);
        compute<M>(A, g0, gb, xrow, sx, g, tig, acc);
      }
    }

    if (vb == static_cast<int>(blockIdx.x)) stamps.at(3, tid);
    // Next tile's first weights (nothing is fetched past the last tile).
    const int nvb = DOWN ? VB : vb + gridDim.x;  // DOWN: one virtual block per block
    if (nvb < VB) {
      rw = rows_of(nvb);
      if constexpr (ASYNC) fetch_async<UG>(wa, wb, wq, rw, ga, gb, lane);
      else fetch(A, rw, ga, gb);
    }
    // c layout: acc[i] is row g + 8*(i>>1) of the tile, activation row 2*tig + (i&1).
    *reinterpret_cast<float4*>(red + (wid * 32 + lane) * 4) = make_float4(acc[0], acc[1], acc[2], acc[3]);
    __syncthreads();
    for (int idx = tid; idx < TPB * ROWS * M; idx += NT) {
      const int t = idx / (ROWS * M), rem = idx - t * ROWS * M;
      const int lr = rem / M, m = rem - lr * M;
      const int row = (vb * TPB + t) * ROWS + lr;
      if (row >= out) continue;
      const int src = ((lr & 7) * 4 + (m >> 1)) * 4 + (m & 1);
      const float* r = red + t * KS * 128;
      float v0 = 0.f, v1 = 0.f;
      for (int k = 0; k < KS; ++k) {
        v0 += r[k * 128 + src + (lr >> 3) * 2];
        if (SWIGLU) v1 += r[k * 128 + src + 2];
      }
      if constexpr (DOWN) hs[m * 64 + t * ROWS + lr] = cv(mk(silu_f(v0) * v1));
      else st(Y + (long)m * ldy + row, SWIGLU ? silu_f(v0) * v1 : v0);
    }
    __syncthreads();  // red is rewritten by the next tile
    if constexpr (DOWN) {
      // Stage the block's h like stage_x stages x: one group of 64 per activation row.
      if (tid < 64) {
        const int m = tid >> 3, p = tid & 7;
        float f[8], s = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) f[j] = m < M ? hs[m * 64 + 8 * p + j] : 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) s += f[j];
        const uint4 v = pack8(f);
        xd[m * 8 + p] = make_uint4(prmt(v.x, v.z, 0x5410), prmt(v.x, v.z, 0x7632),
                                   prmt(v.y, v.w, 0x5410), prmt(v.y, v.w, 0x7632));
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        s += __shfl_xor_sync(0xffffffffu, s, 4);
        if (p == 0) sxd[m] = s;
      }
      asm volatile("cp.async.wait_all;" ::: "memory");
      __syncthreads();
      const uint4* hrow = xd + (g < M ? g : 0) * 8 + 2 * tig;
      const int shift = (vb & 1) * 16;  // the scale's half of its aligned pair
      for (int tile = wid; tile < (dn.out >> 4); tile += NT >> 5) {
        const int rlo = tile * 16 + g, m0 = 2 * tig;
        Batch<1> D;
        D.a[0] = dcode[rlo * 4 + tig];
        D.b[0] = dcode[(rlo + 8) * 4 + tig];
        D.q[0] = dsb[(tig < 2 ? rlo : rlo + 8) * 2 + (tig & 1)] >> shift;
        float c[4] = {0.f, 0.f, 0.f, 0.f};
        compute<M>(D, 0, 1, hrow, sxd, g, tig, c);
        if (m0 < M) {
          red_fix(dn.acc + (long)m0 * dn.out + rlo, c[0]);
          red_fix(dn.acc + (long)m0 * dn.out + rlo + 8, c[2]);
        }
        if (m0 + 1 < M) {
          red_fix(dn.acc + (long)(m0 + 1) * dn.out + rlo, c[1]);
          red_fix(dn.acc + (long)(m0 + 1) * dn.out + rlo + 8, c[3]);
        }
      }
      __syncthreads();  // xd and hs are rewritten by the next virtual block
    }
  }
  stamps.write(W0, out, in, (SWIGLU ? 16u : 0u) | PRO, tid);
}

template <int M, bool SWIGLU, int TPB, int UG, bool PIPE, int MAXT, int PRO, bool ASYNC>
__global__ void __launch_bounds__(MAXT, ((PIPE && UG <= 2) || ASYNC ? 1024 : 768) / MAXT)
gemv4(const unsigned* __restrict__ W0, const act_t* __restrict__ S0, const act_t* __restrict__ B0,
      const unsigned* __restrict__ W1, const act_t* __restrict__ S1, const act_t* __restrict__ B1,
      const act_t* __restrict__ X, int ldx, act_t* __restrict__ Y, int ldy, int out, int in,
      const act_t* __restrict__ pd, const float* __restrict__ pnw, act_t* __restrict__ ph,
      const float* __restrict__ po, int phd, float peps, int late) {
  gemv4_body<M, SWIGLU, TPB, UG, PIPE, PRO, ASYNC, false>(W0, S0, B0, W1, S1, B1, X, ldx, Y, ldy, out,
                                                          in, pd, pnw, ph, po, phd, peps, late, Down{});
}

// The gate/up projection with SwiGLU and the down projection after it in one launch (DOWN
// above): one warp per 16-row tile, 256 threads, one virtual block per block; the wrapper
// runs it where every block is resident at once (two an SM).
template <int M, int UG, bool PIPE>
__global__ void __launch_bounds__(256, 2)
gemv4_mlp(const unsigned* __restrict__ W0, const act_t* __restrict__ S0, const act_t* __restrict__ B0,
          const unsigned* __restrict__ W1, const act_t* __restrict__ S1, const act_t* __restrict__ B1,
          const act_t* __restrict__ X, int ldx, int out, int in, const act_t* __restrict__ pd,
          const float* __restrict__ pnw, act_t* __restrict__ ph, float peps, const unsigned* __restrict__ Wd,
          const act_t* __restrict__ Sd, const act_t* __restrict__ Bd, long long* __restrict__ acc, int dout,
          long long* __restrict__ zero, int nzero) {
  gemv4_body<M, true, 8, UG, PIPE, 1, false, true>(W0, S0, B0, W1, S1, B1, X, ldx, nullptr, 0, out, in, pd,
                                                   pnw, ph, nullptr, 0, peps, 0,
                                                   Down{Wd, Sd, Bd, acc, dout, out, zero, nzero});
}
