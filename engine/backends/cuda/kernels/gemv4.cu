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
// under programmatic dependent launch, before the previous kernel has finished). RING > 0
// (compute capability 9.0 on): the weights come through a ring of RING stages of UG groups a
// warp in shared memory instead (gemv4_parts.cuh), the first RING stages requested before the
// wait. Register cap from MAXT (the largest block launched): 64 for pipelined UG <= 2 and for
// RING, else 85. Dynamic shared memory (sized by the wrapper): xs, M rows of in/8 + 1 16-byte
// entries; sx, 8 floats per group; red, 4 floats per thread; PRO != 0: the norm weight, up to
// `in` floats; RING: RING_GROUP_BYTES a group of each warp's stages, then its mbarriers.
// CL > 1 (gemv4c, compute capability 9.0 on): a thread-block cluster of CL blocks takes each
// round of tiles, block r of the cluster the r-th of CL slices of the groups (its warps split
// that); the blocks' sums go to block 0's shared memory (distributed shared memory), which
// adds them in order after a cluster barrier and stores. A projection with few tiles (the
// 4B's down: 160 for 132 SMs) spreads over every SM instead of two tiles on some.
template <int M, bool SWIGLU, int TPB, int UG, bool PIPE, int MAXT, int PRO, int RING, int CL>
__device__ __forceinline__ void
gemv4_body(const unsigned* __restrict__ W0, const act_t* __restrict__ S0, const act_t* __restrict__ B0,
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
  // CL > 1: block 0's inbox of the cluster's sums, two rounds (a barrier a round suffices).
  constexpr int XN = TPB * 16 * M;  // sums a block sends a round (SwiGLU: 8 rows' gate and up)
  constexpr int XS = SWIGLU ? 2 : 1;  // floats an output row's entry takes
  __shared__ float xch[CL > 1 ? 2 * CL * XN : 1];
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
  const int vb0 = blockIdx.x / CL, vstep = gridDim.x / CL, rank = blockIdx.x % CL;
  int vb = vb0;
  const int ngc = (ng + CL - 1) / CL, k0 = min(ng, rank * ngc), k1 = min(ng, k0 + ngc);
  const int slice = (k1 - k0 + KS - 1) / KS;
  const int ga = min(k1, k0 + ks * slice), gb = min(k1, ga + slice);

  Batch<RING ? 1 : UG> A;
  Batch<PIPE ? UG : 1> B;
  Rows rw = rows_of(vb);
  // The prologue's norm weight goes to shared memory before the wait (nothing writes it),
  // so the staging needs no read from device memory after the previous kernel: read there,
  // it cost a round trip to a memory busy with weights (0.4 to 1 us of each staging).
  float* const nws = red + NT * 4;
  // RING: this warp's stages and mbarriers. Chunk c of the warp's work is groups
  // ga + (c % nch) * UG.. of the block's tile round c / nch; chunk c goes to stage c % RING.
  constexpr int STAGE = RING_GROUP_BYTES * UG;
  [[maybe_unused]] unsigned char* const ring = reinterpret_cast<unsigned char*>(nws + (PRO != 0 ? in : 0)) + wid * RING * STAGE;
  [[maybe_unused]] unsigned long long* const bars =
      reinterpret_cast<unsigned long long*>(reinterpret_cast<unsigned char*>(nws + (PRO != 0 ? in : 0)) +
                                            (NT / 32) * RING * STAGE) + wid * RING;
  const int nch = (gb - ga + UG - 1) / UG;
  const int rounds = (VB - vb0 + vstep - 1) / vstep;
  [[maybe_unused]] auto ring_issue = [&](int c) {  // lane 0
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (RING != 0) {
      const int tile = (vb0 + (c / nch) * vstep) * TPB + tl;
      const long blo = min(SWIGLU ? tile : 2 * tile, nb - 1), bhi = min(SWIGLU ? tile : 2 * tile + 1, nb - 1);
      const int g0 = ga + (c % nch) * UG;
      ring_fill(ring + (c % RING) * STAGE, UG, W0, SWIGLU ? W1 : W0, S0, B0, SWIGLU ? S1 : S0,
                SWIGLU ? B1 : B0, blo * ng + g0, bhi * ng + g0, min(UG, gb - g0), bars + c % RING);
    }
#endif
  };
  // late (a measurement; the engine passes 0): the first weights are requested after the
  // activations are staged, not before the wait, so the staging does not queue behind them.
  auto first_weights = [&]() {
    if constexpr (RING != 0) {
      if (lane == 0)
        for (int c = 0; c < RING && c < nch * rounds; ++c) ring_issue(c);
    } else {
      fetch(A, rw, ga, gb);  // weights in flight while the activations are staged
    }
  };
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (RING != 0) {
    if (lane == 0) ring_init(bars, RING);
    __syncwarp();
  }
#else
  if constexpr (RING != 0) __trap();  // the wrapper offers RING variants from 9.0 on only
#endif
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
  if constexpr (PRO != 0)
    for (int i = tid; i < 256; i += NT) pss[i] = 0.f;
  pdl_start();  // from here on, activations of the previous kernel are readable
  stamps.at(1, tid);

  if constexpr (PRO != 0) {
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncthreads();
    if constexpr (SP != 4 && SP != 5) {
      pro_sums<M, PRO>(X, ldx, pr, xs, xstride, nw, in, pss, tid, NT);
      __syncthreads();
    }
  }
  stamps.at(5, tid);
  if constexpr (CL > 1 && SP == 0)  // a plain input: only the groups of this block's slice
    stage_x<M, 0>(X + 64 * k0, ldx, pr, xs + 8 * k0, xstride, sx + 8 * k0, 8 * (k1 - k0), in, pss, tid, NT);
  else
    stage_x<M, SP>(X, ldx, pr, xs, xstride, sx, nw, in, pss, tid, NT);
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
      for (int w = 0; w < NT / 32; ++w) ss += pss[w * 8 + tid];
#endif
      invs[tid] = rsqrtf(ss / in + peps);
    }
  }
  stamps.at(2, tid);
  if (late) first_weights();

  const uint4* xrow = xs + (g < M ? g : 0) * xstride + 2 * tig;
  [[maybe_unused]] int c = 0;  // RING: the warp's next chunk
  for (; vb < VB; vb += vstep) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    if constexpr (RING != 0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      constexpr int SUB = UG < 4 ? UG : 4;  // groups a warp holds in registers at once
      for (int g0 = ga; g0 < gb; g0 += UG, ++c) {
        const unsigned char* st = ring + (c % RING) * STAGE;
        ring_wait(bars + c % RING, (c / RING) & 1);
        for (int u0 = 0; u0 < UG && g0 + u0 < gb; u0 += SUB) {
          Batch<SUB> C;
          ring_take<SUB>(C, st, UG, u0, g0 + u0, gb, lane);
          compute<M, SUB, SP == 5>(C, g0 + u0, gb, xrow, sx, g, tig, acc, gs);
        }
        __syncwarp();
        if (lane == 0 && c + RING < nch * rounds) {
          ring_release();
          ring_issue(c + RING);
        }
      }
#endif
    } else if constexpr (PIPE) {
      for (int g0 = ga; g0 < gb; g0 += 2 * UG) {
        fetch(B, rw, g0 + UG, gb);
        compute<M, UG, SP == 5>(A, g0, gb, xrow, sx, g, tig, acc, gs);
        fetch(A, rw, g0 + 2 * UG, gb);
        compute<M, UG, SP == 5>(B, g0 + UG, gb, xrow, sx, g, tig, acc, gs);
      }
    } else {
      for (int g0 = ga; g0 < gb; g0 += UG) {
        if (g0 != ga) fetch(A, rw, g0, gb);
        compute<M, UG, SP == 5>(A, g0, gb, xrow, sx, g, tig, acc, gs);
      }
    }

    if (vb == vb0) stamps.at(3, tid);
    // Next tile's first weights (nothing is fetched past the last tile).
    const int nvb = vb + vstep;
    if (RING == 0 && nvb < VB) {
      rw = rows_of(nvb);
      fetch(A, rw, ga, gb);
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
      if constexpr (CL > 1) {  // to block 0's inbox; it stores after the barrier below
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        float* box = xch + (((vb - vb0) / vstep) & 1) * CL * XN + rank * XN + XS * idx;
        st_cluster(box, 0, v0);
        if (SWIGLU) st_cluster(box + 1, 0, v1);
#endif
        continue;
      }
      if constexpr (SP == 4) {
        v0 *= invs[m];
        v1 *= invs[m];
      }
      st(Y + (long)m * ldy + row, SWIGLU ? silu_f(v0) * v1 : v0);
    }
    if constexpr (CL > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
      if (rank == 0) {
        const float* inbox = xch + (((vb - vb0) / vstep) & 1) * CL * XN;
        for (int idx = tid; idx < TPB * ROWS * M; idx += NT) {
          const int t = idx / (ROWS * M), rem = idx - t * ROWS * M;
          const int lr = rem / M, m = rem - lr * M;
          const int row = (vb * TPB + t) * ROWS + lr;
          if (row >= out) continue;
          float v0 = 0.f, v1 = 0.f;
          for (int r = 0; r < CL; ++r) {
            v0 += inbox[r * XN + XS * idx];
            if (SWIGLU) v1 += inbox[r * XN + XS * idx + 1];
          }
          if constexpr (SP == 4) {
            v0 *= invs[m];
            v1 *= invs[m];
          }
          st(Y + (long)m * ldy + row, SWIGLU ? silu_f(v0) * v1 : v0);
        }
      }
#endif
    }
    __syncthreads();  // red is rewritten by the next tile
  }
  // The record's flags: prologue (bits 0-3), SwiGLU (4), pipelined (5), tiles a block
  // (6-11), groups a load (12-15), warps a block (16-23), ring stages (24-27).
  stamps.write(W0, out, in,
               (SWIGLU ? 16u : 0u) | PRO | (PIPE ? 32u : 0u) | (TPB << 6) | (UG << 12) | ((NT / 32) << 16) |
                   (RING << 24) | (CL << 28), tid);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GEMV4_CLUSTER(n) __cluster_dims__(n, 1, 1)
#else
#define GEMV4_CLUSTER(n)
#endif
#define GEMV4_PARAMS                                                                                        \
  const unsigned *__restrict__ W0, const act_t *__restrict__ S0, const act_t *__restrict__ B0,             \
      const unsigned *__restrict__ W1, const act_t *__restrict__ S1, const act_t *__restrict__ B1,         \
      const act_t *__restrict__ X, int ldx, act_t *__restrict__ Y, int ldy, int out, int in,               \
      const act_t *__restrict__ pd, const float *__restrict__ pnw, act_t *__restrict__ ph,                 \
      const float *__restrict__ po, int phd, float peps, int late
#define GEMV4_ARGS W0, S0, B0, W1, S1, B1, X, ldx, Y, ldy, out, in, pd, pnw, ph, po, phd, peps, late

template <int M, bool SWIGLU, int TPB, int UG, bool PIPE, int MAXT, int PRO, int RING>
__global__ void __launch_bounds__(MAXT, ((PIPE && UG <= 2) || RING ? 1024 : 768) / MAXT)
gemv4(GEMV4_PARAMS) {
  gemv4_body<M, SWIGLU, TPB, UG, PIPE, MAXT, PRO, RING, 1>(GEMV4_ARGS);
}

// The cluster variants (CL > 1); below 9.0 the wrapper never launches them.
template <int M, bool SWIGLU, int TPB, int UG, bool PIPE, int MAXT, int PRO, int RING, int CL>
__global__ void GEMV4_CLUSTER(CL) __launch_bounds__(MAXT, ((PIPE && UG <= 2) || RING ? 1024 : 768) / MAXT)
gemv4c(GEMV4_PARAMS) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  gemv4_body<M, SWIGLU, TPB, UG, PIPE, MAXT, PRO, RING, CL>(GEMV4_ARGS);
#else
  __trap();
#endif
}
