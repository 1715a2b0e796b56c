// The split-KV decode step of attention.cu: attn_decode (partials per split over the cache),
// attn_decode_q8 (the 8-bit cache), attn_decode_prep (attn_prep's work in the same launch)
// and attn_combine (the splits merged, the output gate applied).
#pragma once
#include "attn_head.cuh"
#include "common.cuh"

// Keys per split of a row at len keys: at least `least`, and at most nsmax splits.
__device__ __forceinline__ int split_keys(int len, int least, int nsmax) {
  return max(least, (len + nsmax - 1) / nsmax);
}

// The 8-bit cache's code type where Q8 = 1, else the activation type.
template <int Q8> struct KvCode { typedef act_t type; };
template <> struct KvCode<1> { typedef signed char type; };

// Four int8 codes packed in w (lowest byte first), times s.
__device__ __forceinline__ void unpack_codes(unsigned w, float s, float* out) {
#pragma unroll
  for (int b = 0; b < 4; ++b) out[b] = static_cast<float>(static_cast<int>(w << (24 - 8 * b)) >> 24) * s;
}

// A lane's N consecutive cache entries (activations, or Q8's int8 codes and the row's scale)
// as loaded, not yet converted. A load whose result is converted as soon as it is issued
// holds the warp until it arrives, so a warp that loads several rows that way waits one
// round trip a row; loading every row raw first, then converting, waits one in all.
template <int N, int Q8> struct RawRow {
  static constexpr int BYTES = Q8 ? N : N * (int)sizeof(act_t);
  unsigned w[(BYTES + 3) / 4];
  float s;  // Q8: the row's scale
};

// The widest loads that cover BYTES (16, 8 or 4 bytes each; byte by byte only for fewer than
// 4 codes, a head dim under 128 in the 8-bit cache).
template <int N, int Q8>
__device__ __forceinline__ void load_raw(const void* __restrict__ p, const float* __restrict__ scale,
                                         RawRow<N, Q8>& r) {
  constexpr int B = RawRow<N, Q8>::BYTES;
  if constexpr (B % 16 == 0) {
#pragma unroll
    for (int i = 0; i < B / 16; ++i) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(p) + i);
      r.w[4 * i] = u.x; r.w[4 * i + 1] = u.y; r.w[4 * i + 2] = u.z; r.w[4 * i + 3] = u.w;
    }
  } else if constexpr (B % 8 == 0) {
#pragma unroll
    for (int i = 0; i < B / 8; ++i) {
      const uint2 u = __ldg(reinterpret_cast<const uint2*>(p) + i);
      r.w[2 * i] = u.x; r.w[2 * i + 1] = u.y;
    }
  } else if constexpr (B % 4 == 0) {
#pragma unroll
    for (int i = 0; i < B / 4; ++i) r.w[i] = __ldg(reinterpret_cast<const unsigned*>(p) + i);
  } else {
    const unsigned char* b = reinterpret_cast<const unsigned char*>(p);
    r.w[0] = 0u;
#pragma unroll
    for (int i = 0; i < B; ++i) r.w[0] |= static_cast<unsigned>(b[i]) << (8 * i);
  }
  if constexpr (Q8) r.s = __ldg(scale);
}

// A RawRow of N activations stored at p, as load_raw reads it.
template <int N>
__device__ __forceinline__ void store_raw(act_t* __restrict__ p, const RawRow<N, 0>& r) {
  constexpr int B = RawRow<N, 0>::BYTES;
  if constexpr (B % 16 == 0) {
#pragma unroll
    for (int i = 0; i < B / 16; ++i)
      reinterpret_cast<uint4*>(p)[i] = make_uint4(r.w[4 * i], r.w[4 * i + 1], r.w[4 * i + 2], r.w[4 * i + 3]);
  } else if constexpr (B % 8 == 0) {
#pragma unroll
    for (int i = 0; i < B / 8; ++i) reinterpret_cast<uint2*>(p)[i] = make_uint2(r.w[2 * i], r.w[2 * i + 1]);
  } else {
    const act_t* e = reinterpret_cast<const act_t*>(r.w);
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = e[i];
  }
}

// The N values of a RawRow as fp32 (Q8: code * scale).
template <int N, int Q8>
__device__ __forceinline__ void raw_floats(const RawRow<N, Q8>& r, float* out) {
  if constexpr (Q8 && N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) unpack_codes(r.w[i], r.s, out + 4 * i);
  } else if constexpr (Q8) {
    float four[4];
    unpack_codes(r.w[0], r.s, four);  // fewer than 4 codes: all in the first word
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = four[i];
  } else {
    const act_t* e = reinterpret_cast<const act_t*>(r.w);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = cv(e[i]);
  }
}

// grid (nsplit_max, Hkv, R), NW warps. Split s covers keys [s*split,
// (s+1)*split) of the row's len = pos + 1 keys (split = split_keys(len, least, nsmax), so it
// grows with the row, not with the context); splits past the end exit. Writes partial o and
// (max, sum). Each warp takes KU keys at a time: their K and V rows are requested together
// (one memory latency per KU keys, not per key), then the KU scores of each of the gq <= GM
// query heads sharing this KV head are folded into the running (max, sum, o) at once. A
// warp's first KU keys are requested before the wait for the previous kernel (attn_prep),
// except the `fresh` newest of the row, which attn_prep writes (1 in a step; in a window
// attending row by row, a drafting verify's, up to its rows); with NW * KU = 32, a split of
// the fewest (32) keys is requested whole before the wait, with no second round trip after it.
// Q8 = 1 reads the 8-bit cache: each key's and value's codes with its scale (ks, vs:
// [slots, Hkv, ctx]), dequantized to fp32 as they are loaded (attn_decode_q8).
// What attn_decode_prep does in place of attn_prep (PREP = 1): its queries and the row's new
// key come from the attention's input projections (qg: [R, Hq, 2, hd], queries then gates;
// k, v: [R, Hkv, hd]), normed and rotated as attn_prep would, and the new key and value go
// to the cache (kw, vw) as well as into the scores.
struct DecodePrep {
  const act_t *qg, *k, *v;
  const float *qn, *kn;
  act_t *kw, *vw;
  int rot;
  double theta;
  float eps;
};

// The lane's DPL dims of n <= N heads (x[g], as fp32) normed and rotated: w, the lane's
// norm weights; cs, its RoPE factors; wbuf, N * hd floats of the warp's own shared memory.
// The heads' sums fold side by side, so n heads wait for one chain of shuffles, not n.
template <int DPL, int N>
__device__ __forceinline__ void prep_lanes(float (*x)[DPL], const float* w, const float2* cs, float* wbuf, int n,
                                           int rot, float eps, int lane) {
  constexpr int HD = DPL * 32;
  const int half = rot / 2;
  float inv[N];
#pragma unroll
  for (int g = 0; g < N; ++g) inv[g] = g < n ? lane_sumsq(x[g], DPL) : 0.f;
#pragma unroll
  for (int g = 0; g < N; ++g) inv[g] = head_scale(inv[g], HD, eps);
#pragma unroll
  for (int g = 0; g < N; ++g) {
    if (g < n) {
#pragma unroll
      for (int i = 0; i < DPL; ++i) {
        x[g][i] = norm_dim(x[g][i], inv[g], w[i]);
        wbuf[g * HD + lane * DPL + i] = x[g][i];
      }
    }
  }
  __syncwarp();
#pragma unroll
  for (int g = 0; g < N; ++g) {
    if (g < n) {
#pragma unroll
      for (int i = 0; i < DPL; ++i) {
        const int d = lane * DPL + i;
        if (d < rot) x[g][i] = rope_dim(x[g][i], wbuf[g * HD + (d < half ? d + half : d - half)], cs[i], d < half);
      }
    }
  }
  __syncwarp();
}

template <int DPL, int GM, int KU, int NW, int Q8, int PREP = 0>
__device__ __forceinline__ void attn_decode_body(const act_t* __restrict__ q,
                                                 const typename KvCode<Q8>::type* __restrict__ kc,
                                                 const typename KvCode<Q8>::type* __restrict__ vc,
                                                 const float* __restrict__ ks, const float* __restrict__ vs,
                                                 const int* __restrict__ pos, const int* __restrict__ row_slot,
                                                 float* __restrict__ po, float* __restrict__ pml, int Hq, int Hkv,
                                                 int ctx, int least, int nsmax, float scale, int fresh,
                                                 const DecodePrep& pp = DecodePrep()) {
  constexpr int HD = DPL * 32;
  static_assert(!PREP || (GM >= 3 && !Q8), "attn_decode_prep keeps the new key in sm_o[warp][1, 2]");
  __shared__ float sm_o[NW][GM][HD];
  __shared__ float sm_m[NW][GM], sm_l[NW][GM];
  __shared__ float2 sm_cs[PREP ? HD : 1];   // PREP: the row's RoPE factors
  __shared__ float sm_w[PREP ? 2 : 1][HD];  // PREP: the q and k norm weights
  const int s = blockIdx.x, kvh = blockIdx.y, r = blockIdx.z;
  // Positions and slots: written before the step. The exit below tests the slot too, so
  // both are requested at once (else the compiler reads the slot after it, a second round
  // trip before any key is requested); a row has a slot, so the test changes nothing else.
  const int len = pos[r] + 1, slot = row_slot[r];
  const int split = split_keys(len, least, nsmax), k0 = s * split;
  if (k0 >= len || slot < 0) {
    pdl_start();
    return;
  }
  const int k1 = min(len, k0 + split);
  const int gq = Hq / Hkv, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long head = (long)slot * Hkv + kvh, base = head * ctx * HD;
  const int jfirst = k0 + warp * KU;
  // PREP: the row's new key (index jf) is this warp's where it falls in its runs of keys.
  const int jf = len - 1;
  const bool fresh_warp = PREP && jf >= k0 && jf < k1 && ((jf - k0) / KU) % NW == warp;
  if constexpr (PREP) {
    for (int t = threadIdx.x; t < HD; t += NW * 32) {
      sm_w[0][t] = pp.qn[t];
      sm_w[1][t] = pp.kn[t];
      sm_cs[t] = rope_cs(jf, t, pp.rot, pp.theta);
    }
    __syncthreads();
  }
  float kv[KU][DPL], vv[KU][DPL];
  RawRow<DPL, Q8> kr[KU], vr[KU];
  // Keys j0..j0+KU-1 of the split, raw: which = 0 all of them, 1 all but the fresh ones, 2
  // only those (attn_prep wrote them: read after the wait). to_floats() converts them all.
  auto load_keys = [&](int j0, int which) {
#pragma unroll
    for (int u = 0; u < KU; ++u) {
      const long j = min(j0 + u, k1 - 1);  // past the end: a repeated key, masked below
      if (which == 0 || (which == 1 ? j < len - fresh : j >= len - fresh)) {
        const long at = base + j * HD + lane * DPL;
        load_raw<DPL, Q8>(kc + at, Q8 ? ks + head * ctx + j : nullptr, kr[u]);
        load_raw<DPL, Q8>(vc + at, Q8 ? vs + head * ctx + j : nullptr, vr[u]);
      }
    }
  };
  auto to_floats = [&]() {
#pragma unroll
    for (int u = 0; u < KU; ++u) {
      raw_floats<DPL, Q8>(kr[u], kv[u]);
      raw_floats<DPL, Q8>(vr[u], vv[u]);
    }
  };
  if (jfirst < k1) load_keys(jfirst, 1);
  pdl_start();
  if (!PREP && jfirst < k1) load_keys(jfirst, 2);
  float qv[GM][DPL], o[GM][DPL], m[GM], l[GM];
  RawRow<DPL, 0> qr[GM], fk, fv;
#pragma unroll
  for (int g = 0; g < GM; ++g) {
    const long qh = (long)r * Hq + kvh * gq + g;
    if (g < gq) load_raw<DPL, 0>(PREP ? pp.qg + qh * 2 * HD + lane * DPL : q + qh * HD + lane * DPL, nullptr, qr[g]);
  }
  if (fresh_warp) {
    load_raw<DPL, 0>(pp.k + ((long)r * Hkv + kvh) * HD + lane * DPL, nullptr, fk);
    load_raw<DPL, 0>(pp.v + ((long)r * Hkv + kvh) * HD + lane * DPL, nullptr, fv);
  }
#pragma unroll
  for (int g = 0; g < GM; ++g) {
    m[g] = -INFINITY; l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) { o[g][i] = 0.f; qv[g][i] = 0.f; }
    if (g < gq) raw_floats<DPL, 0>(qr[g], qv[g]);
  }
  if constexpr (PREP) {  // as attn_prep stores them: rounded to the activation type
    prep_lanes<DPL, GM>(qv, &sm_w[0][lane * DPL], &sm_cs[lane * DPL], sm_o[warp][0], gq, pp.rot, pp.eps, lane);
#pragma unroll
    for (int g = 0; g < GM; ++g)
#pragma unroll
      for (int i = 0; i < DPL; ++i) qv[g][i] = cv(mk(qv[g][i]));
  }
#pragma unroll
  for (int g = 0; g < GM; ++g)
#pragma unroll
    for (int i = 0; i < DPL; ++i) qv[g][i] *= scale;
  if (fresh_warp) {  // the new key and value: to the cache, and to sm_o[warp][1, 2] for the scores
    float x[1][DPL];
    raw_floats<DPL, 0>(fk, x[0]);
    prep_lanes<DPL, 1>(x, &sm_w[1][lane * DPL], &sm_cs[lane * DPL], sm_o[warp][0], 1, pp.rot, pp.eps, lane);
    act_t* e = reinterpret_cast<act_t*>(fk.w);
#pragma unroll
    for (int i = 0; i < DPL; ++i) e[i] = mk(x[0][i]);
    const long at = base + (long)jf * HD + lane * DPL;
    store_raw<DPL>(pp.kw + at, fk);
    store_raw<DPL>(pp.vw + at, fv);
    raw_floats<DPL, 0>(fk, &sm_o[warp][1][lane * DPL]);
    raw_floats<DPL, 0>(fv, &sm_o[warp][2][lane * DPL]);
  }
  // PREP: the new key's entries of the run that holds it, from sm_o[warp][1, 2] (the cache's
  // copy may not be written yet); it is the row's last key, so the run's entries past the
  // split's end repeat it too, and must be finite where their zero weights multiply them.
  auto take_fresh = [&](int j0) {
    if (!fresh_warp || jf < j0 || jf >= j0 + KU) return;
#pragma unroll
    for (int u = 0; u < KU; ++u) {
      if (min(j0 + u, k1 - 1) == jf) {  // past the split's end: the repeated (masked) key
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
          kv[u][i] = sm_o[warp][1][lane * DPL + i];
          vv[u][i] = sm_o[warp][2][lane * DPL + i];
        }
      }
    }
  };
  if (jfirst < k1) {
    to_floats();
    take_fresh(jfirst);
  }
  for (int j0 = jfirst; j0 < k1; j0 += NW * KU) {
    if (j0 != jfirst) {
      load_keys(j0, 0);
      to_floats();
      take_fresh(j0);
    }
#pragma unroll
    for (int g = 0; g < GM; ++g) {
      if (g < gq) {
        float sc[KU];
#pragma unroll
        for (int u = 0; u < KU; ++u) {
          float a = 0.f;
#pragma unroll
          for (int i = 0; i < DPL; ++i) a = fmaf(qv[g][i], kv[u][i], a);
          sc[u] = a;
        }
#pragma unroll
        for (int u = 0; u < KU; ++u) sc[u] = warp_sum(sc[u]);
        float mn = m[g];
#pragma unroll
        for (int u = 0; u < KU; ++u) if (j0 + u < k1) mn = fmaxf(mn, sc[u]);
        const float corr = expf(m[g] - mn);  // 0 on the first chunk (m = -inf)
        float p[KU], psum = 0.f;
#pragma unroll
        for (int u = 0; u < KU; ++u) {
          p[u] = j0 + u < k1 ? expf(sc[u] - mn) : 0.f;
          psum += p[u];
        }
        l[g] = l[g] * corr + psum;
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
          float acc = o[g][i] * corr;
#pragma unroll
          for (int u = 0; u < KU; ++u) acc = fmaf(p[u], vv[u][i], acc);
          o[g][i] = acc;
        }
        m[g] = mn;
      }
    }
  }
#pragma unroll
  for (int g = 0; g < GM; ++g) {
    if (g < gq) {
      if (lane == 0) { sm_m[warp][g] = m[g]; sm_l[warp][g] = l[g]; }
#pragma unroll
      for (int i = 0; i < DPL; ++i) sm_o[warp][g][lane * DPL + i] = o[g][i];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < gq * HD; idx += blockDim.x) {
    int g = idx / HD, d = idx % HD;
    float M = -INFINITY;
    for (int w = 0; w < NW; ++w) M = fmaxf(M, sm_m[w][g]);
    float L = 0.f, acc = 0.f;
    for (int w = 0; w < NW; ++w) {
      float e = sm_m[w][g] == -INFINITY ? 0.f : expf(sm_m[w][g] - M);
      L += sm_l[w][g] * e;
      acc += sm_o[w][g][d] * e;
    }
    long hrow = ((long)r * Hq + kvh * gq + g) * nsmax + s;
    po[hrow * HD + d] = acc;
    if (d == 0) { pml[hrow * 2] = M; pml[hrow * 2 + 1] = L; }
  }
}

template <int DPL, int GM, int KU, int NW>
__global__ void __launch_bounds__(NW * 32)
attn_decode(const act_t* __restrict__ q, const act_t* __restrict__ kc, const act_t* __restrict__ vc,
            const int* __restrict__ pos, const int* __restrict__ row_slot, float* __restrict__ po,
            float* __restrict__ pml, int Hq, int Hkv, int ctx, int least, int nsmax, float scale, int fresh) {
  attn_decode_body<DPL, GM, KU, NW, 0>(q, kc, vc, nullptr, nullptr, pos, row_slot, po, pml, Hq, Hkv, ctx,
                                       least, nsmax, scale, fresh);
}

template <int DPL, int GM, int KU, int NW>
__global__ void __launch_bounds__(NW * 32)
attn_decode_q8(const act_t* __restrict__ q, const signed char* __restrict__ kc,
               const signed char* __restrict__ vc, const float* __restrict__ ks, const float* __restrict__ vs,
               const int* __restrict__ pos, const int* __restrict__ row_slot, float* __restrict__ po,
               float* __restrict__ pml, int Hq, int Hkv, int ctx, int least, int nsmax, float scale, int fresh) {
  attn_decode_body<DPL, GM, KU, NW, 1>(q, kc, vc, ks, vs, pos, row_slot, po, pml, Hq, Hkv, ctx, least, nsmax,
                                       scale, fresh);
}

// attn_decode with attn_prep's work for a step (one new key a row): the grid, splits and
// partials of attn_decode, its queries normed and rotated from qg by every warp, the row's
// new key and value (k, v) by the warp whose keys hold it, which also writes them to the
// cache; the weights read next toward L2 before the wait (attn_prep's `ahead` spans). One
// launch fewer a full-attention layer in a step. Not for the 8-bit cache, nor a window.
template <int DPL, int GM, int KU, int NW>
__global__ void __launch_bounds__(NW * 32)
attn_decode_prep(const act_t* __restrict__ qg, const act_t* __restrict__ k, const act_t* __restrict__ v,
                 const float* __restrict__ qn, const float* __restrict__ kn, act_t* __restrict__ kc,
                 act_t* __restrict__ vc, const int* __restrict__ pos, const int* __restrict__ row_slot,
                 float* __restrict__ po, float* __restrict__ pml, int Hq, int Hkv, int ctx, int least, int nsmax,
                 float scale, int rot, double theta, float eps, const unsigned char* __restrict__ ahead,
                 long long ahead_bytes, const unsigned char* __restrict__ ahead2, long long bytes2,
                 const unsigned char* __restrict__ ahead3, long long bytes3) {
  prefetch_ahead(ahead, ahead_bytes, ahead2, bytes2, ahead3, bytes3,
                 blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z), gridDim.x * gridDim.y * gridDim.z);
  const DecodePrep pp{qg, k, v, qn, kn, kc, vc, rot, theta, eps};
  attn_decode_body<DPL, GM, KU, NW, 0, 1>(nullptr, kc, vc, nullptr, nullptr, pos, row_slot, po, pml, Hq, Hkv, ctx,
                                          least, nsmax, scale, 1, pp);
}

// grid (R, Hq), hd threads: merge the splits, normalise, multiply by sigmoid(gate). Every
// load is issued as early as it may be, so the kernel costs about one round trip after its
// wait, not one a split: the row's position and thread d's gate before the wait (positions
// are written before the step, the gate by the input projection three kernels back); after
// it, lane i of every warp requests the (max, sum) of splits i, i + 32, ... while every
// thread requests dimension d of up to 32 splits' partial outputs at once. Each warp folds
// the pairs by shuffles (no barrier); the split weights go to the threads by shuffles too.
extern "C" __global__ void attn_combine(const float* __restrict__ po, const float* __restrict__ pml,
                                        const act_t* __restrict__ qg, const int* __restrict__ pos,
                                        act_t* __restrict__ out, int Hq, int hd, int least, int nsmax) {
  constexpr int CH = 32, MAXC = 4;  // splits a chunk; chunks (nsmax <= 128: scratch.ATTN_SPLITS)
  const int r = blockIdx.x, h = blockIdx.y, d = threadIdx.x, lane = d & 31;
  const int p = pos[r];
  const float gate = ld(qg + (long)r * Hq * 2 * hd + (long)h * 2 * hd + hd + d);
  pdl_start();
  const int split = split_keys(p + 1, least, nsmax);
  const int ns = (p + split) / split;  // ceil((p + 1) / split)
  const long hrow = ((long)r * Hq + h) * nsmax;
  float2 ml[MAXC];
#pragma unroll
  for (int c = 0; c < MAXC; ++c) {
    const int sp = c * CH + lane;
    ml[c] = sp < ns ? __ldg(reinterpret_cast<const float2*>(pml) + hrow + sp) : make_float2(-INFINITY, 0.f);
  }
  float v[CH];
#pragma unroll
  for (int j = 0; j < CH; ++j) v[j] = j < ns ? __ldg(po + (hrow + j) * hd + d) : 0.f;
  float M = -INFINITY;
#pragma unroll
  for (int c = 0; c < MAXC; ++c) M = fmaxf(M, ml[c].x);
  for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
  float e[MAXC], L = 0.f;
#pragma unroll
  for (int c = 0; c < MAXC; ++c) {
    e[c] = c * CH + lane < ns ? expf(ml[c].x - M) : 0.f;
    L = fmaf(ml[c].y, e[c], L);
  }
  L = warp_sum(L);
  float acc = 0.f;
#pragma unroll
  for (int c = 0; c < MAXC; ++c) {
    if (c * CH >= ns) break;
    if (c > 0) {
#pragma unroll
      for (int j = 0; j < CH; ++j) v[j] = c * CH + j < ns ? __ldg(po + (hrow + c * CH + j) * hd + d) : 0.f;
    }
#pragma unroll
    for (int j = 0; j < CH; ++j) acc = fmaf(v[j], __shfl_sync(0xffffffffu, e[c], j), acc);
  }
  st(out + (long)r * Hq * hd + (long)h * hd + d, acc / L * sigmoid_f(gate));
}
