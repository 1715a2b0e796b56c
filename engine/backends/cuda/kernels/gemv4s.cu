// Decode-sized projections y[m, :] = x[m, :] @ W.T (1 <= m <= 8) for MLX affine 4-bit g64
// weights, with the weights streamed into shared memory by one warp while the others compute.
//
// Why: a decode step is a chain of projections, each needing the previous one's output. When
// each warp loads its own weights into registers (gemv4.cu), memory traffic can only start
// once a kernel's blocks are resident, and only a few groups per warp can be in flight before
// the previous kernel ends. Here warp 0 of every block is a producer: from the moment the block
// is resident (before the previous kernel has finished: weights are never written by a decode
// step) it copies the block's weight rows into a ring of shared-memory stages with bulk
// asynchronous copies (TMA, `cp.async.bulk`), which cost no registers and keep a whole ring in
// flight. The block calls `launch_dependents` first thing, and is sized so that two of them fit
// on one SM: the next projection's blocks become resident while this one computes, and fill
// their rings with its weights. The consumer warps wait for the previous kernel, stage the
// activations (with the same prologues as gemv4), then compute each stage as it lands, with the
// tensor-core step of gemv4_parts.cuh, and hand the slot back to the producer.
//
// Work: a tile is TR output rows over all the columns (TR = 16, or 8 for matrices with few rows,
// so the blocks share them more evenly; SWIGLU: 8 gate rows over 8 up rows); block b owns a
// contiguous run of tiles, balanced to within one, and a ring stage holds one tile.
//
// Stage layout, chosen so that the consumers' shared-memory reads are free of bank conflicts
// (a conflicted layout made shared memory, not DRAM, the limit):
//  - codes: per 8-row part (rows 0-7, rows 8-15), one tensor copy through a tensor map (a 3-D
//    view: 128-byte column blocks x rows x blocks) with the 128-byte swizzle, which lands as
//    [in/256 blocks][8 rows][128 bytes] with 16-byte chunk c of row r stored at chunk c ^ r.
//    Lane g of a warp reads tile row pi(g) = 2*(g%4) + g/4 (and pi(g) + 8), so the 8 lanes of a
//    quarter warp always hit 8 different chunks. Two copies per stage: the copy engine's cost
//    per copy, not per byte, is what limits many small ones.
//  - scales and biases: 8-byte asynchronous copies (cp.async) by the producer's lanes into
//    [in/256 quads of groups][8 lanes g][4 lanes tig][8 bytes], so the four groups of scales a
//    lane needs are one conflict-free 8-byte read: tig 0 the scale of row pi(g), 1 its bias,
//    2 the scale of row pi(g) + 8, 3 its bias.
// Requirements (checked by the wrapper): in % 256 == 0; the tensor maps made by gemv.py.
#include "gemv4_parts.cuh"

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
  unsigned done;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
// A tensor map (CUtensorMap) passed by value as a kernel parameter.
struct __align__(64) TMap {
  unsigned long long v[16];
};
// Box at coordinates (0, row, 0) of a 3-D tensor map to shared memory (1024-byte aligned).
__device__ __forceinline__ void tensor_copy(void* dst, const TMap& map, int row, unsigned long long* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<unsigned long long>(&map)), "r"(0), "r"(row), "r"(0), "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
// The barrier receives one arrival once this thread's earlier cp.async copies have landed.
__device__ __forceinline__ void cp_async_arrive(unsigned long long* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ int pi_row(int g) { return 2 * (g & 3) + (g >> 2); }

// Consumer warps only (the producer may have left): named barrier 1.
__device__ __forceinline__ void consumers_sync(int n) {
  asm volatile("bar.sync 1, %0;" ::"r"(n) : "memory");
}

constexpr int MAX_STAGES = 8;

// Dynamic shared memory, in order (the wrapper sizes it the same way): xs, M * (in/8 + 1)
// 16-byte entries; sx, 8 floats per group; red, 2 x 4 floats per consumer thread; then,
// 1024-byte aligned, NS stages of TR/8 * 4*in code bytes + in bytes of scales, each rounded up
// to 1024. Block: one producer warp and CW = blockDim/32 - 1 consumer warps.
template <int M, bool SWIGLU, int PRO, int TR>
__global__ void __launch_bounds__(512, 1)
gemv4s(const __grid_constant__ TMap map0, const __grid_constant__ TMap map1,
       const act_t* __restrict__ S0, const act_t* __restrict__ B0, const act_t* __restrict__ S1,
       const act_t* __restrict__ B1, const act_t* __restrict__ X, int ldx, act_t* __restrict__ Y,
       int ldy, int out, int in, const act_t* __restrict__ pd, const float* __restrict__ pnw,
       act_t* __restrict__ ph, const float* __restrict__ po, int phd, float peps, int NS) {
  static_assert(TR == 16 || (TR == 8 && !SWIGLU), "tiles of 16 rows, or 8 without SwiGLU");
  pdl_launch();  // the next kernel may take the room this block leaves on its SM
  constexpr int ROWS = SWIGLU ? 8 : TR, PARTS = TR / 8;
  const int CW = blockDim.x / 32 - 1, CT = 32 * CW;
  extern __shared__ __align__(128) uint4 smem[];
  __shared__ float pss[PRO ? 256 : 1];
  __shared__ unsigned long long full[MAX_STAGES], empty[MAX_STAGES];
  const int ng = in >> 6, nw = in >> 3, xstride = nw + 1, nq = ng >> 2;
  uint4* xs = smem;
  float* sx = reinterpret_cast<float*>(xs + M * xstride);
  float* red = sx + ng * 8;
  const int part_bytes = 4 * in;  // 8 rows of codes
  const int stage_bytes = (PARTS * part_bytes + in + 1023) & ~1023;
  unsigned char* ring = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<size_t>(red + 2 * CT * 4) + 1023) & ~static_cast<size_t>(1023));

  const int tiles = (out + ROWS - 1) / ROWS;
  const int t0 = static_cast<int>(static_cast<long>(tiles) * blockIdx.x / gridDim.x);
  const int t1 = static_cast<int>(static_cast<long>(tiles) * (blockIdx.x + 1) / gridDim.x);
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
  const int g = lane >> 2, tig = lane & 3, prow = pi_row(g);

  if (tid == 0) {
    for (int s = 0; s < NS; ++s) {
      mbar_init(&full[s], 33);  // the copy engine's bytes plus one cp.async arrival per lane
      mbar_init(&empty[s], CW);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wid == 0) {  // producer: weights only, so it need not wait for the previous kernel
    // This lane's scale (tig even) or bias (odd) row, relative to the tile's first row, and
    // its matrix: rows pi(g) and pi(g) + 8 (SWIGLU: the gate and the up row pi(g)).
    const bool upper = tig >= 2;
    const act_t* Q = SWIGLU && upper ? ((tig & 1) ? B1 : S1) : ((tig & 1) ? B0 : S0);
    const int qrow = prow + (!SWIGLU && upper ? 8 : 0);
    const bool copies_q = TR == 16 || !upper;
    for (int t = t0; t < t1; ++t) {
      const int s = t - t0, slot = s % NS, use = s / NS;
      if (use > 0) mbar_wait(&empty[slot], (use - 1) & 1);
      unsigned char* stage = ring + slot * stage_bytes;
      const int r0 = t * ROWS;
      if (lane == 0) {
        mbar_expect_tx(&full[slot], PARTS * part_bytes);
        tensor_copy(stage, map0, r0, &full[slot]);
        if (PARTS == 2) tensor_copy(stage + part_bytes, SWIGLU ? map1 : map0, SWIGLU ? r0 : r0 + 8, &full[slot]);
      }
      if (copies_q) {
        const act_t* src = Q + (long)min(r0 + qrow, out - 1) * ng;  // past the end: never stored
        unsigned char* dst = stage + PARTS * part_bytes + lane * 8;
        for (int k = 0; k < nq; ++k) cp_async8(dst + k * 256, src + 4 * k);
      }
      cp_async_arrive(&full[slot]);
    }
    return;
  }

  // Consumers: thread ct of CT.
  const int ct = tid - 32, cw = wid - 1;
  const Pro pr{pd, pnw, ph, po, phd, peps};
  if constexpr (PRO != 0)
    for (int i = ct; i < 256; i += CT) pss[i] = 0.f;
  pdl_wait();  // from here on, the previous kernel's outputs are readable
  if constexpr (PRO != 0) {
    consumers_sync(CT);
    pro_sums<M, PRO>(X, ldx, pr, xs, xstride, nw, in, pss, ct, CT);
    consumers_sync(CT);
  }
  stage_x<M, PRO>(X, ldx, pr, xs, xstride, sx, nw, in, pss, ct, CT);
  consumers_sync(CT);

  const uint4* xrow = xs + (g < M ? g : 0) * xstride + 2 * tig;
  const bool qok = TR == 16 || tig < 2;  // 8-row tiles: no rows pi(g) + 8
  for (int t = t0; t < t1; ++t) {
    const int s = t - t0, slot = s % NS, use = s / NS;
    const unsigned char* stage = ring + slot * stage_bytes;
    const uint2* qs = reinterpret_cast<const uint2*>(stage + PARTS * part_bytes) + lane;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    mbar_wait(&full[slot], use & 1);
    for (int kq = cw; kq < nq; kq += CW) {  // quads of groups cw, cw + CW, ...
      Batch<4> b;
      const uint2 qv = qok ? qs[kq * 32] : make_uint2(0u, 0u);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int k = 4 * kq + u;
        // Row prow's 8 bytes of group k: 16-byte chunk (k%4)*2 + tig/2 of its 128-byte line,
        // swizzled by the row.
        const int off = (k >> 2) * 1024 + prow * 128 + ((((k & 3) * 2 + (tig >> 1)) ^ prow) << 4) +
                        (tig & 1) * 8;
        b.a[u] = *reinterpret_cast<const uint2*>(stage + off);
        b.b[u] = TR == 16 ? *reinterpret_cast<const uint2*>(stage + part_bytes + off) : make_uint2(0u, 0u);
        const unsigned w = u < 2 ? qv.x : qv.y;
        b.q[u] = (u & 1) ? w >> 16 : w & 0xffffu;
      }
      compute<M, 4>(b, 4 * kq, ng, xrow, sx, g, tig, acc);
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[slot]);
    // acc[i] is row pi(g) + 8*(i>>1) of the tile, activation row 2*tig + (i&1); sum over warps.
    float* rt = red + (s & 1) * CT * 4;  // two buffers: one barrier per tile
    *reinterpret_cast<float4*>(rt + ct * 4) = make_float4(acc[0], acc[1], acc[2], acc[3]);
    consumers_sync(CT);
    for (int idx = ct; idx < ROWS * M; idx += CT) {
      const int lr = idx / M, m = idx - lr * M;
      const int row = t * ROWS + lr;
      if (row >= out) continue;
      const int gl = (lr & 1) * 4 + ((lr & 7) >> 1);  // the lane group g with pi(g) = lr % 8
      const int src = (gl * 4 + (m >> 1)) * 4 + (m & 1);
      float v0 = 0.f, v1 = 0.f;
      for (int k = 0; k < CW; ++k) {
        v0 += rt[k * 128 + src + (lr >> 3) * 2];
        if (SWIGLU) v1 += rt[k * 128 + src + 2];
      }
      st(Y + (long)m * ldy + row, SWIGLU ? silu_f(v0) * v1 : v0);
    }
  }
}
