// Token selection on the device: greedy argmax and top-k / top-p sampling, one block per row.
// Results go to an int32 buffer that the next decode step reads as its input ids, so a
// graph-replayed decode loop needs no host round trip.
#include "common.cuh"

__device__ __forceinline__ unsigned okey(float f) {
  unsigned u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// grid (S), 1024 threads. out[s] = argmax_j<vocab_rows logits[s, j] (lowest index on ties).
extern "C" __global__ void argmax_rows(const act_t* __restrict__ logits, int ldl, int vocab_rows,
                                       int* __restrict__ out) {
  pdl_start();
  __shared__ float sv[32];
  __shared__ int si[32];
  const act_t* row = logits + (long)blockIdx.x * ldl;
  float best = -INFINITY;
  int bi = 0x7fffffff;
  for (int j = threadIdx.x; j < vocab_rows; j += blockDim.x) {
    float x = ld(row + j);
    if (x > best) { best = x; bi = j; }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, best, o);
    int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) { sv[warp] = best; si[warp] = bi; }
  __syncthreads();
  if (warp == 0) {
    best = lane < (int)(blockDim.x >> 5) ? sv[lane] : -INFINITY;
    bi = lane < (int)(blockDim.x >> 5) ? si[lane] : 0x7fffffff;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      float ov = __shfl_xor_sync(0xffffffffu, best, o);
      int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
    }
    if (lane == 0) out[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
  }
}

// grid (NB, S), 256 threads: the same argmax split over NB blocks per row (a 248K vocabulary
// is too long for one block to read quickly). Each block folds its stretch into one 64-bit key,
// (ordered value << 32) | ~index, so the largest key is the largest value at its lowest index,
// and merges it into work[2s] with atomicMax; the last block of the row (ticket work[2s+1])
// writes out[s] and zeroes both words for the next call. A graph replays it as it is.
extern "C" __global__ void __launch_bounds__(256)
argmax_split(const act_t* __restrict__ logits, int ldl, int vocab_rows, int* __restrict__ out,
             unsigned long long* __restrict__ work) {
  pdl_start();
  __shared__ unsigned long long sk[8];
  const act_t* row = logits + (long)blockIdx.y * ldl;
  const int per = (vocab_rows + gridDim.x - 1) / gridDim.x;
  const int j0 = blockIdx.x * per, j1 = min(vocab_rows, j0 + per);
  unsigned long long best = 0;  // below every real key (okey(-inf) > 0)
  // U logits a thread requested together, then folded: read one at a time, each waited for
  // the one before (eight round trips to L2 for a stretch of 2,048). The wrapper sizes the
  // grid so that a stretch is at most U * blockDim.x logits: one round.
  constexpr int U = 8;
  for (int j = j0 + (int)threadIdx.x; j < j1; j += U * (int)blockDim.x) {
    act_t raw[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int jj = j + u * (int)blockDim.x;
      raw[u] = jj < j1 ? row[jj] : act_t();
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int jj = j + u * (int)blockDim.x;
      const float x = cv(raw[u]);
      if (jj < j1 && x == x) {  // NaN is never the largest
        const unsigned long long k = ((unsigned long long)okey(x) << 32) | (0xffffffffu - (unsigned)jj);
        best = k > best ? k : best;
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long v = __shfl_xor_sync(0xffffffffu, best, o);
    best = v > best ? v : best;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sk[warp] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < (int)(blockDim.x >> 5); ++w) best = sk[w] > best ? sk[w] : best;
    unsigned long long* slot = work + 2 * blockIdx.y;
    if (best) atomicMax(slot, best);
    __threadfence();
    if (atomicAdd(slot + 1, 1ull) == gridDim.x - 1) {  // the row's last block
      const unsigned long long k = atomicExch(slot, 0ull);
      out[blockIdx.y] = k ? (int)(0xffffffffu - (unsigned)(k & 0xffffffffu)) : 0;
      slot[1] = 0;
    }
  }
}

// Every position advances by one (decode chaining inside a graph), and the step's picks go
// to row pos[0] % PICK_RING of `ring` (pinned host memory mapped into the device, PICK_RING
// rows of n), where the host reads them once the step's event has passed: no copy between
// two steps' graphs. One block.
constexpr int PICK_RING = 4;
extern "C" __global__ void advance_positions(int* __restrict__ pos, int n, const int* __restrict__ picks,
                                             int* __restrict__ ring) {
  pdl_start();
  const int row = pos[0] % PICK_RING;
  __syncthreads();  // every thread has read pos[0] before thread 0 advances it
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    ring[row * n + i] = picks[i];
    pos[i] += 1;
  }
}

// After draws replaced a launched step's greedy picks: the picks again to the ring's row of
// that step (its positions already advanced), as advance_positions wrote them. One block.
extern "C" __global__ void publish_picks(const int* __restrict__ pos, int n, const int* __restrict__ picks,
                                         int* __restrict__ ring) {
  pdl_start();
  const int row = (pos[0] - 1) % PICK_RING;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ring[row * n + i] = picks[i];
}

__device__ __forceinline__ unsigned long long mix64(unsigned long long x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

#define CAP 1024
// grid (1), 1024 threads: clear a row's bitmap of seen ids (when `clear`), then set the bits of
// ids[0..n). The presence penalty's memory of what a reply has said, kept on the device.
extern "C" __global__ void mark_seen(unsigned* __restrict__ seen, int words, const int* __restrict__ ids,
                                     int n, int clear) {
  pdl_start();
  if (clear)
    for (int i = threadIdx.x; i < words; i += blockDim.x) seen[i] = 0u;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) atomicOr(seen + (ids[i] >> 5), 1u << (ids[i] & 31));
}

// Logits j0..j0+7 of a row, the presence penalty taken off (seen null: none), NaN past
// vocab_rows: one 16-byte load (two in fp32) where all eight are there. j0 is a multiple of 8,
// so the eight share one word of the bitmap.
__device__ __forceinline__ void chunk8(const act_t* __restrict__ row, int j0, int vocab_rows,
                                       const unsigned* __restrict__ seen, float penalty, float* x) {
  if (j0 + 8 <= vocab_rows) {
    load_vec<8>(row + j0, x);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] = j0 + e < vocab_rows ? ld(row + j0 + e) : __int_as_float(0x7fffffff);
  }
  if (seen != nullptr) {
    const unsigned w = seen[j0 >> 5] >> (j0 & 31);
#pragma unroll
    for (int e = 0; e < 8; ++e)
      if ((w >> e) & 1u) x[e] -= penalty;
  }
}

// The lanes' values in descending order (lane l ends with the warp's l-th largest).
__device__ __forceinline__ float sort32_desc(float s) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int size = 2; size <= 32; size <<= 1)
#pragma unroll
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      const float o = __shfl_xor_sync(0xffffffffu, s, stride);
      s = (((lane & size) == 0) == ((lane & stride) == 0)) ? fmaxf(s, o) : fminf(s, o);
    }
  return s;
}

// The k-th largest (1 <= k <= 32) of the block's values, one a thread. Two bounds that at
// least k values reach: the largest of the warps' k-th largest (that warp has k values at or
// above it) and, where k is at most the number of warps, the k-th largest of the warps'
// maxima (k warps have one each). Only the values at or above the higher bound are ranked, in
// `vals` (shared, a float a thread). The second bound is what keeps that set small where
// most values are -inf (the split draw's candidate slots: a warp there sees four blocks'
// 20-odd candidates among 256 slots, so every warp's 20th largest was -inf, all 1,024 values
// were ranked against each other and the draw took 43 us on an H200 instead of 6).
// warp_kth (2 floats a warp), count and result are shared scratch.
__device__ float kth_largest32(float v, int k, float* vals, float* warp_kth, unsigned* count,
                               float* result) {
  const int tid = threadIdx.x, lane = tid & 31, nw = blockDim.x >> 5;
  const float s = sort32_desc(v);
  const float wk = __shfl_sync(0xffffffffu, s, k - 1), wmax = __shfl_sync(0xffffffffu, s, 0);
  if (lane == 0) {
    warp_kth[tid >> 5] = wk;
    warp_kth[nw + (tid >> 5)] = wmax;
  }
  if (tid == 0) { *count = 0; *result = -INFINITY; }
  __syncthreads();
  if (tid < 32 && k <= nw) {  // the k-th largest of the warps' maxima
    const float m = sort32_desc(lane < nw ? warp_kth[nw + lane] : -INFINITY);
    if (lane == k - 1) warp_kth[2 * nw] = m;
  }
  __syncthreads();
  float t0 = k <= nw ? warp_kth[2 * nw] : -INFINITY;
  for (int w = 0; w < nw; ++w) t0 = fmaxf(t0, warp_kth[w]);
  if (v >= t0) vals[atomicAdd(count, 1u)] = v;
  __syncthreads();
  const int c = (int)*count;  // at least k
  if (tid < c) {  // the value with fewer than k above it and at least k at or above it
    const float x = vals[tid];
    int above = 0, reach = 0;
    for (int j = 0; j < c; ++j) {
      above += vals[j] > x;
      reach += vals[j] >= x;
    }
    if (above < k && reach >= k) *result = x;  // every such thread writes the same value
  }
  __syncthreads();
  return *result;
}

// The first half of a top-k draw (k <= 32) of one row, spread over the GPU: one block of 1,024
// threads reading a 248K vocabulary took about 64 us on an H200, most of it issuing the
// per-logit work on one SM. grid (DRAW_NB), 256 threads; the row 16-byte aligned. Block b takes
// a stretch of chunks of eight logits (presence penalty taken off) and keeps every logit at or
// above the k-th largest of its threads' maxima in cand_v/cand_i[b * DRAW_CAP, ...): the
// block's top k are among them (k of its logits reach that bound), so the row's top k are
// among all the blocks' candidates. cand_n[b] counts them, past DRAW_CAP where they did not
// fit (then the draw reads the whole row itself).
#define DRAW_NB 128
#define DRAW_CAP 64
extern "C" __global__ void __launch_bounds__(256)
draw_candidates(const act_t* __restrict__ row, int vocab_rows, int k, const unsigned* __restrict__ seen,
                float penalty, float* __restrict__ cand_v, int* __restrict__ cand_i,
                unsigned* __restrict__ cand_n) {
  pdl_start();
  __shared__ float vals[256], warp_kth[2 * 8 + 1], sh_t;
  __shared__ unsigned sh_count, sh_n;
  const int nch = (vocab_rows + 7) >> 3, per = (nch + gridDim.x - 1) / gridDim.x;
  const int c0 = blockIdx.x * per, c1 = min(nch, c0 + per);
  float mx = -INFINITY;
  for (int c = c0 + (int)threadIdx.x; c < c1; c += blockDim.x) {
    float x[8];
    chunk8(row, 8 * c, vocab_rows, seen, penalty, x);
#pragma unroll
    for (int e = 0; e < 8; ++e) mx = x[e] > mx ? x[e] : mx;  // NaN never wins
  }
  const float t = kth_largest32(mx, k, vals, warp_kth, &sh_count, &sh_t);
  if (threadIdx.x == 0) sh_n = 0;
  __syncthreads();
  float* bv = cand_v + blockIdx.x * DRAW_CAP;
  int* bi = cand_i + blockIdx.x * DRAW_CAP;
  for (int c = c0 + (int)threadIdx.x; c < c1; c += blockDim.x) {  // the stretch again (L1/L2)
    float x[8];
    chunk8(row, 8 * c, vocab_rows, seen, penalty, x);
#pragma unroll
    for (int e = 0; e < 8; ++e)
      if (x[e] == x[e] && x[e] >= t) {
        const unsigned p = atomicAdd(&sh_n, 1u);
        if (p < DRAW_CAP) { bv[p] = x[e]; bi[p] = 8 * c + e; }
      }
  }
  __syncthreads();
  if (threadIdx.x == 0) cand_n[blockIdx.x] = sh_n;
}

// f(value, index) for every logit of the row, warp-uniform: WIDE through `chunks` (U chunks of
// eight a thread a round), else `val` one a thread a round; NaN stands for what is past it.
template <bool WIDE, int U, class F, class Chunks, class Val>
__device__ __forceinline__ void each_logit(F&& f, Chunks& chunks, Val& val, const act_t* row,
                                           int vocab_rows) {
  const int lane = threadIdx.x & 31, NT = blockDim.x;
  if constexpr (WIDE) {
    for (int c0 = threadIdx.x - lane; c0 < (vocab_rows + 7) >> 3; c0 += NT * U) {
      float x[U][8];
      chunks(c0, x);
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int e = 0; e < 8; ++e) f(x[u][e], 8 * (c0 + lane + u * NT) + e);
    }
  } else {
    for (int base = threadIdx.x - lane; base < vocab_rows; base += NT) {
      const int j = base + lane;
      f(j < vocab_rows ? val(row, j) : __int_as_float(0x7fffffff), j);
    }
  }
}

// grid (S), 1024 threads. Keeps the top_k (1..1024) logits, scales by 1/temperature, keeps the
// smallest prefix whose probability reaches top_p, draws one. counter[s] advances per call;
// with counter null the draw depends on the seed alone (a caller that seeds every call).
// WIDE: the two reads of the row take 32 logits a thread at a time (four 16-byte loads in
// flight, rows 16-byte aligned: the wrapper checks), not one, so each read waits for memory
// 8 times on a 248K vocabulary instead of 243; the same candidates come out, so the same draw.
// cand_v non-null (WIDE, one row, k <= 32): draw_candidates ran first, and the threshold path
// reads its candidates instead of the row (the whole row where a block's did not fit).
template <bool WIDE>
__global__ void __launch_bounds__(1024, 1)
sample_topk_topp(const act_t* __restrict__ logits, int ldl, int vocab_rows, int top_k, float top_p,
                 float temperature, unsigned long long seed, unsigned* __restrict__ counter,
                 int* __restrict__ out, unsigned* __restrict__ seen, float penalty,
                 const float* __restrict__ cand_v, const int* __restrict__ cand_i,
                 const unsigned* __restrict__ cand_n) {
  static_assert(DRAW_NB * DRAW_CAP == 8 * CAP, "eight candidates a thread");
  pdl_start();
  // The presence penalty, in fp32 as the logit is read: `penalty` off every id whose bit is set
  // in `seen` (this row's bitmap; null: none). The drawn id's bit is set at the end.
  auto val = [&](const act_t* row, int j) -> float {
    const float x = ld(row + j);
    return seen != nullptr && ((seen[j >> 5] >> (j & 31)) & 1u) ? x - penalty : x;
  };
  __shared__ unsigned hist[256];
  __shared__ unsigned sh_prefix, sh_krem, sh_n;
  __shared__ float cv_[CAP];
  __shared__ int ci[CAP];
  const act_t* row = logits + (long)blockIdx.x * ldl;
  const int tid = threadIdx.x;
  const int k = max(1, min(top_k, min(CAP, vocab_rows)));
  // Fast path: one histogram of the keys' top 11 bits (counts aggregated per warp: most
  // logits share a few bins), then every logit in the bins at and above the one holding the
  // k-th largest goes straight into cv_/ci when they fit (CAP); the sort below orders them.
  // Two reads of the row. Where more than CAP share those bins, the radix select after it
  // narrows down to exactly k (four more reads).
  __shared__ unsigned wide[2048];
  __shared__ unsigned sh_bin, sh_taken;
  const float qnan = __int_as_float(0x7fffffff);
  const int lane = tid & 31;
  auto count = [&](float x) {  // warp-aggregated: most logits share a few bins
    const bool ok = x == x;    // NaN is never drawn
    const unsigned bin = ok ? okey(x) >> 21 : 2048u;
    const unsigned peers = __match_any_sync(0xffffffffu, bin);
    if (ok && lane == __ffs(peers) - 1) atomicAdd(&wide[bin], (unsigned)__popc(peers));
  };
  constexpr int U = 4;  // WIDE: chunks of 8 logits a thread per round
  const int nch = (vocab_rows + 7) >> 3, NT = blockDim.x;
  // Chunks c0 + lane + u * NT: every whole chunk's 16-byte loads and bitmap word are issued
  // before any is used (through chunk8 each load waited behind the previous chunk's branch
  // and penalty, per the SASS); the row's last, partial chunk goes through chunk8.
  constexpr int PV = 8 * sizeof(act_t) / 16;  // 16-byte loads a chunk
  auto chunks = [&](int c0, float (&x)[U][8]) {
    uint4 raw[U][PV];
    unsigned sw[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + lane + u * NT;
      const bool whole = 8 * c + 8 <= vocab_rows;
#pragma unroll
      for (int i = 0; i < PV; ++i)
        raw[u][i] = whole ? __ldg(reinterpret_cast<const uint4*>(row + 8 * c) + i) : make_uint4(0u, 0u, 0u, 0u);
      sw[u] = whole && seen != nullptr ? seen[c >> 2] >> ((8 * c) & 31) : 0u;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + lane + u * NT;
      if (8 * c + 8 <= vocab_rows) {
#pragma unroll
        for (int i = 0; i < PV; ++i) {
          const act_t* e = reinterpret_cast<const act_t*>(&raw[u][i]);
#pragma unroll
          for (int j = 0; j < 8 / PV; ++j) x[u][i * (8 / PV) + j] = cv(e[j]);
        }
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if ((sw[u] >> e) & 1u) x[u][e] -= penalty;
      } else if (c < nch) {
        chunk8(row, 8 * c, vocab_rows, seen, penalty, x[u]);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) x[u][e] = qnan;
      }
    }
  };
  // Bitonic sort of cv_/ci, descending by value (ties: lower index first).
  auto sort_desc = [&]() {
    for (int size = 2; size <= CAP; size <<= 1) {
      for (int stride = size >> 1; stride > 0; stride >>= 1) {
        int p = tid ^ stride;
        if (p > tid) {
          bool desc = (tid & size) == 0;
          float a = cv_[tid], b = cv_[p];
          int ia = ci[tid], ib = ci[p];
          bool a_first = a > b || (a == b && ia < ib);
          if (desc != a_first) { cv_[tid] = b; cv_[p] = a; ci[tid] = ib; ci[p] = ia; }
        }
        __syncthreads();
      }
    }
  };
  // cv_/ci[0, m) into descending order by (value, index), by rank: each of the first m threads
  // counts the entries ahead of its own (broadcast reads of shared memory) and moves it there.
  // Two barriers where the bitonic sort takes 55, but m rounds of reads (the bitonic sort
  // where m is large); the entries are distinct (every logit is taken at most once), so the
  // ranks are a permutation.
  auto rank_sort = [&](int m) {
    float v = 0.f;
    int i = 0, r = 0;
    if (tid < m) {
      v = cv_[tid];
      i = ci[tid];
      for (int j = 0; j < m; ++j) {
        const float w = cv_[j];
        r += w > v || (w == v && ci[j] < i);
      }
    }
    __syncthreads();
    if (tid < m) { cv_[r] = v; ci[r] = i; }
    __syncthreads();
  };
  // Logit x (index j) goes to cv_/ci where `take` (sh_taken counts them, even past CAP).
  auto collect = [&](bool take, float x, int j) {
    const unsigned votes = __ballot_sync(0xffffffffu, take);
    unsigned first = 0;
    if (lane == 0 && votes) first = atomicAdd(&sh_taken, (unsigned)__popc(votes));
    first = __shfl_sync(0xffffffffu, first, 0);
    const unsigned pos = first + __popc(votes & ((1u << lane) - 1u));
    if (take && pos < CAP) { cv_[pos] = x; ci[pos] = j; }
  };
  // WIDE, threshold path: each thread's largest logit; the k-th largest of those
  // maxima is a bound that at least k logits reach (one in each of k threads), and usually
  // few more. Every logit at or above it is kept when they fit (CAP): two reads of the row
  // and no histogram (its per-logit warp match and shared atomics on a few hot bins: on an
  // H200 the app's defaults went from 538 to 590 tok/s on the 4B without them). Otherwise the
  // histogram path below runs as before. Either way the sort below orders a superset of the
  // top k by (value, index), so the draw is the same.
  bool kept = false;
  if constexpr (WIDE) {
    // candidate mode: this thread's eight of draw_candidates' DRAW_NB * DRAW_CAP slots
    // (-inf past a block's count); `over` where some block had more than it could keep.
    const int e0 = tid * 8;
    const unsigned nb = cand_v != nullptr ? cand_n[e0 / DRAW_CAP] : 0u;
    auto cands = [&](float (&x)[8], int (&j)[8]) {
      const float4* v4 = reinterpret_cast<const float4*>(cand_v + e0);
      const int4* i4 = reinterpret_cast<const int4*>(cand_i + e0);
      const float4 va = v4[0], vb = v4[1];
      const int4 ia = i4[0], ib = i4[1];
      const float vv[8] = {va.x, va.y, va.z, va.w, vb.x, vb.y, vb.z, vb.w};
      const int ii[8] = {ia.x, ia.y, ia.z, ia.w, ib.x, ib.y, ib.z, ib.w};
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const bool ok = (unsigned)((e0 % DRAW_CAP) + q) < nb;
        x[q] = ok ? vv[q] : -INFINITY;
        j[q] = ok ? ii[q] : 0x7fffffff;
      }
    };
    float mx = -INFINITY;
    if (cand_v != nullptr) {
      float x[8];
      int j[8];
      cands(x, j);
#pragma unroll
      for (int q = 0; q < 8; ++q) mx = fmaxf(mx, x[q]);
    } else {
      each_logit<WIDE, U>([&](float v, int) { mx = v > mx ? v : mx; }, chunks, val, row, vocab_rows);
    }
    const bool over = __syncthreads_or(nb > DRAW_CAP);
    // The k-th largest of the threads' maxima (a bitonic sort of all 1,024 for k > 32).
    __shared__ float sh_warp[2 * 32 + 1], sh_t;
    float t = -INFINITY;
    if (!over && k <= 32) {
      t = kth_largest32(mx, k, cv_, sh_warp, &sh_taken, &sh_t);
    } else if (!over) {
      cv_[tid] = mx; ci[tid] = tid;
      __syncthreads();
      sort_desc();
      t = cv_[k - 1];
      __syncthreads();
    }
    if (tid == 0) sh_taken = 0;
    cv_[tid] = -INFINITY; ci[tid] = 0x7fffffff;
    __syncthreads();
    if (t > -INFINITY && cand_v != nullptr) {  // uniform
      float x[8];
      int j[8];
      cands(x, j);
#pragma unroll
      for (int q = 0; q < 8; ++q) collect(x[q] >= t, x[q], j[q]);
    } else if (t > -INFINITY) {
      each_logit<WIDE, U>([&](float v, int j) { collect(v == v && v >= t, v, j); }, chunks, val,
                          row, vocab_rows);
    }
    __syncthreads();
    kept = t > -INFINITY && sh_taken <= CAP;
  }
  if (!kept) {  // the histogram path
  for (int b = tid; b < 2048; b += blockDim.x) wide[b] = 0;
  __syncthreads();
  each_logit<WIDE, U>([&](float v, int) { count(v); }, chunks, val, row, vocab_rows);
  __syncthreads();
  if (tid == 0) {
    unsigned cum = 0;
    int b = 2047;
    for (; b > 0 && cum + wide[b] < (unsigned)k; --b) cum += wide[b];
    sh_bin = b;
    sh_taken = 0;
  }
  cv_[tid] = -INFINITY; ci[tid] = 0x7fffffff;
  __syncthreads();
  const unsigned bstar = sh_bin;
  auto gather = [&](float x, int j) {  // the logits in the bins at and above bstar
    collect(x == x && (okey(x) >> 21) >= bstar, x, j);
  };
  each_logit<WIDE, U>(gather, chunks, val, row, vocab_rows);
  __syncthreads();
  if (sh_taken > CAP) {
    unsigned prefix = 0, mask = 0, krem = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int b = tid; b < 256; b += blockDim.x) hist[b] = 0;
      __syncthreads();
      for (int j = tid; j < vocab_rows; j += blockDim.x) {
        unsigned key = okey(val(row, j));
        if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
      }
      __syncthreads();
      if (tid == 0) {
        unsigned cum = 0;
        for (int b = 255; b >= 0; --b) {
          if (cum + hist[b] >= krem) { sh_prefix = prefix | ((unsigned)b << shift); sh_krem = krem - cum; break; }
          cum += hist[b];
        }
        sh_n = 0;
      }
      __syncthreads();
      prefix = sh_prefix; krem = sh_krem; mask |= 255u << shift;
      __syncthreads();
    }
    // prefix is the k-th largest key: take every key above it and krem keys equal to it.
    __shared__ unsigned sh_eq;
    if (tid == 0) sh_eq = 0;
    cv_[tid] = -INFINITY; ci[tid] = 0x7fffffff;
    __syncthreads();
    for (int j = tid; j < vocab_rows; j += blockDim.x) {
      float x = val(row, j);
      unsigned key = okey(x);
      bool take = key > prefix;
      if (key == prefix) take = atomicAdd(&sh_eq, 1u) < krem;
      if (take) { unsigned p = atomicAdd(&sh_n, 1u); if (p < CAP) { cv_[p] = x; ci[p] = j; } }
    }
  }  // radix select
  }  // histogram path
  __syncthreads();
  // The candidates: sh_taken of them (at most CAP) unless the radix select ran (sh_n, k).
  const int m = (int)min(sh_taken > CAP ? sh_n : sh_taken, (unsigned)CAP);
  if (m <= 128)
    rank_sort(m);
  else
    sort_desc();
  // Probabilities (unnormalised) and their inclusive prefix sum, in place.
  float top = cv_[0];
  float pr = tid < k ? expf((cv_[tid] - top) / temperature) : 0.f;
  __syncthreads();
  cv_[tid] = pr;
  __syncthreads();
  for (int off = 1; off < k; off <<= 1) {  // entries from k on are never read
    float add = tid >= off ? cv_[tid - off] : 0.f;
    __syncthreads();
    cv_[tid] += add;
    __syncthreads();
  }
  const float total = cv_[k - 1];
  // Smallest n with cum[n-1] >= top_p * total.
  if (tid == 0) sh_n = k;
  __syncthreads();
  if (tid < k && cv_[tid] >= top_p * total && (tid == 0 || cv_[tid - 1] < top_p * total)) sh_n = tid + 1;
  __syncthreads();
  const int n = sh_n;
  const unsigned c = counter != nullptr ? counter[blockIdx.x] : 0u;
  unsigned long long h = mix64(seed ^ mix64(((unsigned long long)blockIdx.x << 32) | c));
  float u = (float)((h >> 40) * (1.0 / 16777216.0)) * cv_[n - 1];
  float lo = tid == 0 ? 0.f : cv_[tid - 1];
  if (tid < n && u >= lo && (u < cv_[tid] || tid == n - 1)) {
    out[blockIdx.x] = ci[tid];
    if (seen != nullptr && ci[tid] < vocab_rows) atomicOr(seen + (ci[tid] >> 5), 1u << (ci[tid] & 31));
  }
  __syncthreads();
  if (tid == 0 && counter != nullptr) counter[blockIdx.x] = c + 1;
}
