// Pieces of the decode projection kernel for MLX 4-bit g64 weights in 8-row blocks (gemv4.cu):
// the weight loads, the nibble-to-half conversion, the tensor-core step per group, and the
// prologues that compute a projection's input from the previous kernel's outputs.
#pragma once
#include "common.cuh"
#include "stamps.cuh"

#if ACT_KIND == 1
#define MMA_TYPE "f16"
#define Q_MAGIC 0x64006400u
#define Q_BASE 1024.f
#else
#define MMA_TYPE "bf16"
#define Q_MAGIC 0x43004300u
#define Q_BASE 128.f
#endif

__device__ __forceinline__ unsigned qpair(unsigned w) {
  unsigned r;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(w), "r"(0x000F000Fu), "r"(Q_MAGIC));  // (a & b) | c
  return r;
}

__device__ __forceinline__ void mma16816(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                         unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." MMA_TYPE "." MMA_TYPE ".f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned prmt(unsigned a, unsigned b, unsigned sel) {
  unsigned r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// One warp's weight rows (g and g+8 of its tile, this lane's 8 bytes of each group) and the
// one scale/bias this lane fetches: lanes tig = 0..3 of a quad load the scale of row g, its
// bias, the scale of row g+8, its bias; the quad shares them by shuffles. Weights are in
// 8-row blocks (gemv4.cu): from one group to the next, codes move 32 uint2 and scales 8.
constexpr int CODE_STEP = 32, SB_STEP = 8;
struct Rows {
  const uint2 *lo, *hi;
  const act_t* sb;
};

// UG groups of codes and (one per lane) scales or biases in registers.
template <int UG> struct Batch {
  uint2 a[UG], b[UG];
  unsigned q[UG];
};

template <int UG>
__device__ __forceinline__ void fetch(Batch<UG>& t, const Rows& r, int g0, int gb) {
#pragma unroll
  for (int u = 0; u < UG; ++u) {
    const int gr = g0 + u;
    if (gr < gb) {
      t.a[u] = __ldcs(r.lo + gr * CODE_STEP);
      t.b[u] = __ldcs(r.hi + gr * CODE_STEP);
      t.q[u] = __ldg(r.sb + gr * SB_STEP);
    }
  }
}

// ASYNC variants: the same pieces go to shared memory with cp.async (slot [u][lane] of the
// warp's area, so each lane reads back only what it copied), which costs no registers: a warp
// can have its whole slice in flight and more warps fit on an SM. Scales/biases are copied as
// the aligned 4-byte pair that holds the lane's 16-bit value (rows g & ~1 and g | 1).
__device__ __forceinline__ void cp_async(void* dst, const void* src, int bytes) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if (bytes == 16)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
  else if (bytes == 8)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(d), "l"(src) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src) : "memory");
}

template <int UG>
__device__ __forceinline__ void fetch_async(uint2* wa, uint2* wb, unsigned* wq, const Rows& r, int ga,
                                            int gb, int lane) {
#pragma unroll
  for (int u = 0; u < UG; ++u) {
    const int gr = ga + u;
    if (gr < gb) {
      cp_async(wa + u * 32 + lane, r.lo + gr * CODE_STEP, 8);
      cp_async(wb + u * 32 + lane, r.hi + gr * CODE_STEP, 8);
      const unsigned* pair = reinterpret_cast<const unsigned*>(r.sb - ((lane >> 2) & 1));
      cp_async(wq + u * 32 + lane, pair + gr * (SB_STEP / 2), 4);
    }
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int UG>
__device__ __forceinline__ void unstage(Batch<UG>& t, const uint2* wa, const uint2* wb, const unsigned* wq,
                                        int u0, int g0, int gb, int lane) {
#pragma unroll
  for (int u = 0; u < UG; ++u) {
    if (g0 + u < gb) {
      t.a[u] = wa[(u0 + u) * 32 + lane];
      t.b[u] = wb[(u0 + u) * 32 + lane];
      t.q[u] = wq[(u0 + u) * 32 + lane] >> (((lane >> 2) & 1) * 16);
    }
  }
}

// SC: each group's sum is multiplied by gs[group * 8 + m] (prologue 5's per-head norm).
// WHOLE: all UG groups are in the slice (no test a group, so the compiler can interleave
// their tensor-core chains; the same products); compute() picks it for whole batches.
template <int M, int UG, bool SC, bool WHOLE>
__device__ __forceinline__ void compute_groups(const Batch<UG>& t, int g0, int gb, const uint4* xrow,
                                               const float* sx, int g, int tig, float* acc, const float* gs) {
#pragma unroll
  for (int u = 0; u < UG; ++u) {
    const int gr = g0 + u;
    if (WHOLE || gr < gb) {
      float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const unsigned wa = j ? t.a[u].y : t.a[u].x, wb = j ? t.b[u].y : t.b[u].x;
        uint4 xv = make_uint4(0u, 0u, 0u, 0u);
        if (g < M) xv = xrow[gr * 8 + j];
        mma16816(c, qpair(wa), qpair(wb), qpair(wa >> 4), qpair(wb >> 4), xv.x, xv.y);
        mma16816(c, qpair(wa >> 8), qpair(wb >> 8), qpair(wa >> 12), qpair(wb >> 12), xv.z, xv.w);
      }
      const float2 sxv = *reinterpret_cast<const float2*>(sx + gr * 8 + 2 * tig);
      const int q0 = g * 4;
      const float s0 = cv((act_t)__shfl_sync(0xffffffffu, t.q[u], q0));
      const float s1 = cv((act_t)__shfl_sync(0xffffffffu, t.q[u], q0 + 2));
      const float b0 = fmaf(-Q_BASE, s0, cv((act_t)__shfl_sync(0xffffffffu, t.q[u], q0 + 1)));
      const float b1 = fmaf(-Q_BASE, s1, cv((act_t)__shfl_sync(0xffffffffu, t.q[u], q0 + 3)));
      if constexpr (SC) {
        const float2 f = *reinterpret_cast<const float2*>(gs + gr * 8 + 2 * tig);
        acc[0] = fmaf(f.x, fmaf(s0, c[0], b0 * sxv.x), acc[0]);
        acc[1] = fmaf(f.y, fmaf(s0, c[1], b0 * sxv.y), acc[1]);
        acc[2] = fmaf(f.x, fmaf(s1, c[2], b1 * sxv.x), acc[2]);
        acc[3] = fmaf(f.y, fmaf(s1, c[3], b1 * sxv.y), acc[3]);
      } else {
        acc[0] = fmaf(s0, c[0], fmaf(b0, sxv.x, acc[0]));
        acc[1] = fmaf(s0, c[1], fmaf(b0, sxv.y, acc[1]));
        acc[2] = fmaf(s1, c[2], fmaf(b1, sxv.x, acc[2]));
        acc[3] = fmaf(s1, c[3], fmaf(b1, sxv.y, acc[3]));
      }
    }
  }
}

template <int M, int UG, bool SC = false>
__device__ __forceinline__ void compute(const Batch<UG>& t, int g0, int gb, const uint4* xrow,
                                        const float* sx, int g, int tig, float* acc,
                                        const float* gs = nullptr) {
  if (g0 + UG <= gb) compute_groups<M, UG, SC, true>(t, g0, gb, xrow, sx, g, tig, acc, gs);
  else compute_groups<M, UG, SC, false>(t, g0, gb, xrow, sx, g, tig, acc, gs);
}

// Pack 8 floats into 8 activations (one 16-byte entry).
__device__ __forceinline__ uint4 pack8(const float* f) {
  uint4 r;
  act_t* e = reinterpret_cast<act_t*>(&r);
#pragma unroll
  for (int j = 0; j < 8; ++j) e[j] = mk(f[j]);
  return r;
}

__device__ __forceinline__ void unpack8(uint4 v, float* f) {
  const act_t* e = reinterpret_cast<const act_t*>(&v);
#pragma unroll
  for (int j = 0; j < 8; ++j) f[j] = cv(e[j]);
}

// Add this warp's sums of q per row into qa (whole warps; the lanes' rows m may change
// within a warp, m is 0 where !ok): a fixed order, the same bits every run, which adding
// the warps' sums into shared memory by atomics is not.
template <int M>
__device__ __forceinline__ void warp_row_sums(float q, bool ok, int m, float* qa) {
  const int mlo = __shfl_sync(0xffffffffu, m, 0);
  const int mhi = static_cast<int>(__reduce_max_sync(0xffffffffu, ok ? m : 0));
  for (int mm = mlo; mm <= mhi; ++mm) {
    const float t = warp_sum(ok && m == mm ? q : 0.f);
#pragma unroll
    for (int r = 0; r < M; ++r)
      if (r == mm) qa[r] += t;
  }
}

// Slot (warp, row) of pss gets the warp's sum qa[row], 8 slots a warp (the caller sums a
// row's slots in warp order).
template <int M>
__device__ __forceinline__ void store_warp_rows(const float* qa, float* pss, int tid) {
  if ((tid & 31) == 0)
#pragma unroll
    for (int r = 0; r < M; ++r) pss[(tid >> 5) * 8 + r] = qa[r];
}

// Row m's sum of the slots store_warp_rows left in pss, added in warp order.
__device__ __forceinline__ float warp_rows_sum(const float* pss, int m, int NT) {
  float ss = 0.f;
  for (int w = 0; w < NT / 32; ++w) ss += pss[w * 8 + m];
  return ss;
}

// What the block stages as its activations (PRO):
//   0  x itself;
//   1  rms_norm(h) * nw with h = x + d (d may be null; block 0 stores h to H when H is set):
//      the residual add and norm that precede every projection, fused into it;
//   2  rms_norm_head(o) * nw * silu(x) per head of `hd` values (o fp32 [M, in], rows of in):
//      the DeltaNet output norm gated by z (x = z), fused into out_proj;
//   4  prologue 1 with the norm's scale left to the caller (fold_value below);
//   5  prologue 2 with the per-head scale left to the tensor-core step (fold_gated_value).
struct Pro {
  const act_t* d;
  const float* nw;
  act_t* h;
  const float* o;
  int hd;
  float eps;
};

// Entry p (8 values) of row m of h = x + d (d may be null) into f, rounded as the residual
// stream is stored; block 0 stores it to H when H is set. Returns the packed entry.
__device__ __forceinline__ uint4 residual_entry(const act_t* __restrict__ X, int ldx, const Pro& pr,
                                                int in, int m, int p, float* f) {
  // Both loads before either is used: with d's load behind the branch on d, the warp waited
  // for x before it asked for d, two round trips to L2 in every staging.
  uint4 hv = __ldg(reinterpret_cast<const uint4*>(X + (long)m * ldx) + p);
  const uint4 dv = pr.d != nullptr ? __ldg(reinterpret_cast<const uint4*>(pr.d + (long)m * in) + p)
                                   : make_uint4(0u, 0u, 0u, 0u);
  unpack8(hv, f);
  if (pr.d != nullptr) {
    float dd[8];
    unpack8(dv, dd);
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] += dd[j];
    hv = pack8(f);
    unpack8(hv, f);
  }
  if (pr.h != nullptr && blockIdx.x == 0) reinterpret_cast<uint4*>(pr.h + (long)m * in)[p] = hv;
  return hv;
}

// Phase 1 of PRO 1/2: sums of squares into pss, per (warp, row) slot for PRO 1
// (store_warp_rows) and per (row, head) for PRO 2; for PRO 1 the unnormalised h is parked in
// xs (raw order) for phase 2.
template <int M, int PRO>
__device__ __forceinline__ void pro_sums(const act_t* __restrict__ X, int ldx, const Pro& pr, uint4* xs,
                                         int xstride, int nw, int in, float* pss, int tid, int NT) {
  const int lane = tid & 31;
  float qa[M];
#pragma unroll
  for (int r = 0; r < M; ++r) qa[r] = 0.f;
  for (int base = tid - lane; base < M * nw; base += NT) {
    const int it = base + lane;
    const bool ok = it < M * nw;
    const int m = ok ? it / nw : 0, p = it - m * nw;
    float s = 0.f, f[8];
    if (ok) {
      if constexpr (PRO == 1) {
        xs[m * xstride + p] = residual_entry(X, ldx, pr, in, m, p, f);
      } else {
        const float4* op = reinterpret_cast<const float4*>(pr.o + (long)m * in) + 2 * p;
        const float4 a = __ldg(op), b = __ldg(op + 1);
        f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w; f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) s = fmaf(f[j], f[j], s);
    }
    if constexpr (PRO == 1) {
      warp_row_sums<M>(s, ok, m, qa);
    } else {
      // Entries per head: a power of two <= 32 (the wrapper checks), so each head's entries
      // lie in one warp's pass and one segment of lanes sums them: one store, no atomics.
      const int seg = pr.hd >> 3;
      for (int off = seg >> 1; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
      if (ok && (p & (seg - 1)) == 0) pss[m * (in / pr.hd) + p / seg] = s;
    }
  }
  if constexpr (PRO == 1) store_warp_rows<M>(qa, pss, tid);
}

// Phase 2: the staged entry (raw order) of row m, entry p. PRO 1: sums[m] is row m's norm
// scale (gemv4 adds up the warps' slots); PRO 2: sums holds each (row, head)'s squares.
template <int PRO>
__device__ __forceinline__ uint4 pro_value(const act_t* __restrict__ X, int ldx, const Pro& pr,
                                           const uint4* xs, int xstride, int in, const float* sums,
                                           int m, int p) {
  if constexpr (PRO == 0) {
    return __ldg(reinterpret_cast<const uint4*>(X + (long)m * ldx) + p);
  } else if constexpr (PRO == 1) {
    float f[8];
    unpack8(xs[m * xstride + p], f);
    const float inv = sums[m];
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = f[j] * inv * pr.nw[8 * p + j];
    return pack8(f);
  } else {
    float f[8], z[8];
    const float4* op = reinterpret_cast<const float4*>(pr.o + (long)m * in) + 2 * p;
    const float4 a = __ldg(op), b = __ldg(op + 1);
    f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w; f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
    unpack8(__ldg(reinterpret_cast<const uint4*>(X + (long)m * ldx) + p), z);
    const int seg = pr.hd >> 3, c0 = (8 * p) % pr.hd;
    const float inv = rsqrtf(sums[m * (in / pr.hd) + p / seg] / pr.hd + pr.eps);
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = f[j] * inv * pr.nw[c0 + j] * silu_f(z[j]);
    return pack8(f);
  }
}

// PRO 4 (prologue 1 with the norm's scale left to the caller): the staged entry is
// h * nw with h = x + d (rounded, as the residual stream is stored; block 0 stores it to H);
// q gets the entry's sum of squares of h (stage_x leaves each warp's sums per row in pss,
// 8 slots a warp, summed by the caller in a fixed order: the same result every run). The
// products come out scaled by rsqrt(mean(h^2) + eps) per row, which the caller applies: one
// pass over the input, where prologue 1 needs the sums before it can stage anything.
__device__ __forceinline__ uint4 fold_value(const act_t* __restrict__ X, int ldx, const Pro& pr, int in,
                                            int m, int p, float& q) {
  float f[8];
  residual_entry(X, ldx, pr, in, m, p, f);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    q = fmaf(f[j], f[j], q);
    f[j] *= pr.nw[8 * p + j];
  }
  return pack8(f);
}

// PRO 5 (prologue 2 with the per-head norm's scale left to the tensor-core step): the
// staged entry is o * nw * silu(z); q gets the entry's sum of squares of o. Each head's sum
// comes from one segment of lanes (stage_x stores it, no atomics), and the caller turns the
// sums into one scale per (group, row): a group of 64 columns lies inside one head.
__device__ __forceinline__ uint4 fold_gated_value(const act_t* __restrict__ X, int ldx, const Pro& pr,
                                                  int in, int m, int p, float& q) {
  float f[8], z[8];
  const float4* op = reinterpret_cast<const float4*>(pr.o + (long)m * in) + 2 * p;
  const uint4 zv = __ldg(reinterpret_cast<const uint4*>(X + (long)m * ldx) + p);  // all three first
  const float4 a = __ldg(op), b = __ldg(op + 1);
  f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w; f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
  unpack8(zv, z);
  const int c0 = (8 * p) % pr.hd;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    q = fmaf(f[j], f[j], q);
    f[j] = f[j] * pr.nw[c0 + j] * silu_f(z[j]);
  }
  return pack8(f);
}

// Stage the activations of M rows (threads tid of NT, whole warps): entry p of row m holds
// x[8p..8p+7] (after the prologue PRO) as pairs (0,4) (1,5) (2,6) (3,7), the order the code
// words' nibbles come out of qpair(); sx[group * 8 + m] is the group's sum of x (0 for rows
// m >= M). The caller synchronises afterwards.
template <int M, int PRO>
__device__ __forceinline__ void stage_x(const act_t* __restrict__ X, int ldx, const Pro& pr, uint4* xs,
                                        int xstride, float* sx, int nw, int in, float* pss, int tid,
                                        int NT) {
  const int lane = tid & 31, ng = nw >> 3;
  float qa[M];
#pragma unroll
  for (int r = 0; r < M; ++r) qa[r] = 0.f;
  for (int base = tid - lane; base < M * nw; base += NT) {
    const int it = base + lane;
    float s = 0.f, q = 0.f;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    const int mi = it < M * nw ? it / nw : 0;
    if (it < M * nw) {
      const int m = mi, p = it - m * nw;
      if constexpr (PRO == 4)
        v = fold_value(X, ldx, pr, in, m, p, q);
      else if constexpr (PRO == 5)
        v = fold_gated_value(X, ldx, pr, in, m, p, q);
      else
        v = pro_value<PRO>(X, ldx, pr, xs, xstride, in, pss, m, p);  // PRO 1: reads its own entry
      if (it == 0) stamp_after(6, v.x);  // thread 0's first entry (a -DSNUG_STAMPS build)
      const act_t* e = reinterpret_cast<const act_t*>(&v);
#pragma unroll
      for (int j = 0; j < 8; ++j) s += cv(e[j]);
      xs[m * xstride + p] = make_uint4(prmt(v.x, v.z, 0x5410), prmt(v.x, v.z, 0x7632),
                                       prmt(v.y, v.w, 0x5410), prmt(v.y, v.w, 0x7632));
    }
    if constexpr (PRO == 5) {  // one segment of lanes per head: its sum, stored once
      const int seg = pr.hd >> 3;
      for (int off = seg >> 1; off > 0; off >>= 1) q += __shfl_xor_sync(0xffffffffu, q, off);
      const int p = it - mi * nw;
      if (it < M * nw && (p & (seg - 1)) == 0) pss[mi * (in / pr.hd) + p / seg] = q;
    }
#ifdef SNUG_BATCH_INVARIANT
    // Batch-invariant mode (in % 256 == 0: a warp's pass is 32 entries of one row): each
    // 32 entries of a row sum into a slot of their own, whichever warp or batch row takes
    // them, and the caller adds a row's slots in order (the same sums at any batch size).
    if constexpr (PRO == 4) {
      const float t = warp_sum(q);
      if (lane == 0 && it < M * nw) pss[mi * (nw >> 5) + ((it - mi * nw) >> 5)] = t;
    }
#else
    if constexpr (PRO == 4) warp_row_sums<M>(q, it < M * nw, mi, qa);  // this warp's, per row
#endif
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    s += __shfl_xor_sync(0xffffffffu, s, 4);
    if (it < M * nw && (lane & 7) == 0) {
      const int m = it / nw, p = it - m * nw;
      sx[(p >> 3) * 8 + m] = s;
    }
  }
#ifndef SNUG_BATCH_INVARIANT
  if constexpr (PRO == 4) store_warp_rows<M>(qa, pss, tid);
#endif
  if (M < 8)
    for (int i = tid; i < ng * 8; i += NT)
      if ((i & 7) >= M) sx[i] = 0.f;
}
