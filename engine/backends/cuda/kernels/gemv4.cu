// Decode-sized projections y[m, :] = x[m, :] @ W.T (1 <= m <= 8) for MLX affine 4-bit weights
// with group size 64 and half-precision activations (bf16 or fp16), on tensor cores.
//
// Layout: MLX's codes (LSB-first nibbles) and scales/biases, w = s*q + b, with the rows in
// blocks of 8 (weights.py, to_blocks): per block and group, the 8 rows' 32-byte code runs
// one after another (256 bytes), and their 8 scales (biases) likewise.
//
// Per warp a tile of 16 weight rows (SWIGLU: 8 gate rows over 8 up rows) times a slice of the
// column groups. Each lane reads 8 bytes of a group of two rows (rows g and g+8, g = lane/4):
// each of the two loads covers one block's 256 contiguous bytes of the group, so a warp's
// request touches two whole 128-byte lines (in MLX's row order it touched eight rows' lines
// for 32 bytes each, and streamed about a third slower). The nibbles are
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
// entries; sx, 8 floats per group; red, 4 floats per thread; ASYNC: 20 bytes per lane and
// group; PRO != 0: the norm weight, up to `in` floats.
template <int M, bool SWIGLU, int TPB, int UG, bool PIPE, int MAXT, int PRO, bool ASYNC>
__global__ void __launch_bounds__(MAXT, ((PIPE && UG <= 2) || ASYNC ? 1024 : 768) / MAXT)
gemv4(const unsigned* __restrict__ W0, const act_t* __restrict__ S0, const act_t* __restrict__ B0,
      const unsigned* __restrict__ W1, const act_t* __restrict__ S1, const act_t* __restrict__ B1,
      const act_t* __restrict__ X, int ldx, act_t* __restrict__ Y, int ldy, int out, int in,
      const act_t* __restrict__ pd, const float* __restrict__ pnw, act_t* __restrict__ ph,
      const float* __restrict__ po, int phd, float peps, int late) {
  const int NT = blockDim.x, KS = NT / (32 * TPB);
  Stamps stamps;
  stamps.at(0, threadIdx.x);
  constexpr int ROWS = SWIGLU ? 8 : 16;
  // bf16: prologue 1 stages h * nw in one pass and the norm's scale multiplies the products
  // (prologue 4). fp16 keeps two passes: h * nw could leave its range.
  constexpr int SP = PRO == 1 && ACT_KIND != 1 ? 4 : PRO;
  extern __shared__ uint4 smem[];
  __shared__ float pss[PRO ? 256 : 1], invs[8];
  const int ng = in >> 6, nw = in >> 3, xstride = nw + 1;
  uint4* xs = smem;
  float* sx = reinterpret_cast<float*>(xs + M * xstride);
  float* red = sx + ng * 8;

  const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, tig = lane & 3;
  const int wid = tid >> 5, tl = wid / KS, ks = wid % KS;
  // Blocks loop over virtual blocks vb (TPB tiles each): the grid is at most what fits on
  // the GPU at once, so the activations are staged once per block and the next tile's
  // first weights are in flight while the current tile is reduced and stored.
  const int VB = ((out + ROWS - 1) / ROWS + TPB - 1) / TPB;
  // Weights in 8-row blocks (weights.py, to_blocks): block b, group gr holds rows 8b..8b+7
  // of the group (32 bytes each) at word (b * ng + gr) * 64, and their scales (biases) at
  // (b * ng + gr) * 8. A tile's rows g and g+8 are blocks 2t and 2t+1 (SWIGLU: block t of
  // the gate and of the up weights); blocks past the last one are read again, not stored.
  const int nb = (out + 7) >> 3;
  auto rows_of = [&](int vb) {
    const int tile = vb * TPB + tl;
    const int blo = min(SWIGLU ? tile : 2 * tile, nb - 1);
    const int bhi = min(SWIGLU ? tile : 2 * tile + 1, nb - 1);
    const uint2* wlo = reinterpret_cast<const uint2*>(W0) + (long)blo * ng * 32 + g * 4 + tig;
    const uint2* whi = reinterpret_cast<const uint2*>(SWIGLU ? W1 : W0) + (long)bhi * ng * 32 + g * 4 + tig;
    const act_t* sb = tig == 0 ? S0 + (long)blo * ng * 8
                    : tig == 1 ? B0 + (long)blo * ng * 8
                    : tig == 2 ? (SWIGLU ? S1 : S0) + (long)bhi * ng * 8
                               : (SWIGLU ? B1 : B0) + (long)bhi * ng * 8;
    return Rows{wlo, whi, sb + g};
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
  // late (a measurement; the engine passes 0): the first weights are requested after the
  // activations are staged, not before the wait, so the staging does not queue behind them.
  auto first_weights = [&]() {
    if constexpr (ASYNC) {
      fetch_async<UG>(wa, wb, wq, rw, ga, gb, lane);  // the whole slice in flight
    } else {
      fetch(A, rw, ga, gb);  // weights in flight while the activations are staged
    }
  };
  // The prologue's norm weight goes to shared memory before the wait (nothing writes it),
  // so the staging needs no read from device memory after the previous kernel: read there,
  // it cost a round trip to a memory busy with weights (0.4 to 1 us of each staging).
  float* const nws = reinterpret_cast<float*>(wbase) + (ASYNC ? NT * UG * 5 : 0);
  if constexpr (PRO != 0) {
    const int nn = PRO == 1 ? in : phd;
    if ((reinterpret_cast<unsigned long>(pnw) & 15) == 0)
      for (int i = 4 * tid; i < nn; i += 4 * NT) cp_async(nws + i, pnw + i, 16);
    else
      for (int i = tid; i < nn; i += NT) cp_async(nws + i, pnw + i, 4);
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  if (!late) first_weights();
  const Pro pr{pd, PRO != 0 ? nws : pnw, ph, po, phd, peps};
  pdl_start();  // from here on, activations of the previous kernel are readable
  stamps.at(1, tid);

  if constexpr (PRO != 0) {
    if (ASYNC && !late)  // the newest group is the weights'
      asm volatile("cp.async.wait_group 1;" ::: "memory");
    else
      asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncthreads();
    if constexpr (SP != 4 && SP != 5) {
      pro_sums<M, PRO>(X, ldx, pr, xs, xstride, nw, in, pss, tid, NT);
      __syncthreads();
    }
    if constexpr (SP == 1) {  // each row's scale, the warps' sums added in warp order
      if (tid < M) invs[tid] = rsqrtf(warp_rows_sum(pss, tid, NT) / in + peps);
      __syncthreads();
    }
  }
  stamps.at(5, tid);
  stage_x<M, SP>(X, ldx, pr, xs, xstride, sx, nw, in, SP == 1 ? invs : pss, tid, NT);
  __syncthreads();
  // PRO 5: one scale per (group, row) after the norm weight, read by every tile's groups.
  float* const gs = nws + phd;
  if constexpr (SP == 5) {
    const int heads = in / phd;
    for (int i = tid; i < ng * 8; i += NT) {
      const int gr = i >> 3, m = i & 7;
      gs[i] = m < M ? rsqrtf(pss[m * heads + gr * 64 / phd] / phd + peps) : 0.f;
    }
    __syncthreads();
  }
  if constexpr (SP == 4) {  // read after the next barrier (the one before the tile's sums)
    if (tid < M) {
      float ss = 0.f;
#ifdef SNUG_BATCH_INVARIANT
      for (int j = 0; j < nw >> 5; ++j) ss += pss[tid * (nw >> 5) + j];  // the row's slots
#else
      ss = warp_rows_sum(pss, tid, NT);
#endif
      invs[tid] = rsqrtf(ss / in + peps);
    }
  }
  stamps.at(2, tid);
  if (late) first_weights();

  const uint4* xrow = xs + (g < M ? g : 0) * xstride + 2 * tig;
  for (; vb < VB; vb += gridDim.x) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    if constexpr (ASYNC) {
      asm volatile("cp.async.wait_all;" ::: "memory");
      constexpr int CH = 4;
      for (int g0 = ga; g0 < gb; g0 += CH) {
        Batch<CH> C;
        unstage(C, wa, wb, wq, g0 - ga, g0, gb, lane);
        compute<M, CH, SP == 5>(C, g0, gb, xrow, sx, g, tig, acc, gs);
      }
    } else if constexpr (PIPE) {
      for (int g0 = ga; g0 < gb; g0 += 2 * UG) {
        fetch(B, rw, g0 + UG, gb);
        compute<M, RG, SP == 5>(A, g0, gb, xrow, sx, g, tig, acc, gs);
        fetch(A, rw, g0 + 2 * UG, gb);
        compute<M, UG, SP == 5>(B, g0 + UG, gb, xrow, sx, g, tig, acc, gs);
      }
    } else {
      for (int g0 = ga; g0 < gb; g0 += UG) {
        if (g0 != ga) fetch(A, rw, g0, gb);
        compute<M, RG, SP == 5>(A, g0, gb, xrow, sx, g, tig, acc, gs);
      }
    }

    if (vb == static_cast<int>(blockIdx.x)) stamps.at(3, tid);
    // Next tile's first weights (nothing is fetched past the last tile).
    const int nvb = vb + gridDim.x;
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
      if constexpr (SP == 4) {
        v0 *= invs[m];
        v1 *= invs[m];
      }
      st(Y + (long)m * ldy + row, SWIGLU ? silu_f(v0) * v1 : v0);
    }
    __syncthreads();  // red is rewritten by the next tile
  }
  // The record's flags: prologue (bits 0-3), SwiGLU (4), pipelined (5), tiles a block
  // (6-11), groups a load (12-15), warps a block (16-23).
  stamps.write(W0, out, in,
               (SWIGLU ? 16u : 0u) | PRO | (PIPE ? 32u : 0u) | (TPB << 6) | (UG << 12) | ((NT / 32) << 16), tid);
}
