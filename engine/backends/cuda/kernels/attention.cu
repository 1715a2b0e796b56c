// Gated full attention: q/k RMSNorm + partial RoPE + KV-cache append (attn_prep), split-KV
// decode (attn_decode + attn_combine, the output gate fused into the combine), and the prefill
// pieces around cuBLAS (softmax_causal between the two products, attn_gate after them).
//
// Per-row metadata (int32, device memory, written before launch so a captured graph replays
// with new values): pos[r] absolute position, row_slot[r] state slot, row_tl[r] index of the
// row inside its segment, row_n[r] rows of that segment.
// KV cache of one layer: [slots, Hkv, ctx, hd]. Query buffer: for the prefill kernels, per
// segment starting at row0, [Hq, rows, hd] at offset row0*Hq*hd; for the decode kernels (a
// step, or a short window attending row by row: attn_prep's `rowwise`), [R, Hq, hd].
//
// The 8-bit cache (engine/backends/kv_int8.py) holds int8 codes in the same layout and one
// fp32 scale per (slot, KV head, position), [slots, Hkv, ctx] for keys and for values. Its
// kernels: attn_prep_q8 writes codes and scales, attn_decode_q8 reads them (code * scale in
// fp32), and kv_dequant turns one KV head's into the activation type for cuBLAS in a prompt.
#include "common.cuh"

// Thread d's RoPE factors (cos, sin) of row r at position p (read from pos): computed before
// the wait, since positions are written before the step (and by no kernel of the last two).
// Threads past the rotary dims get (1, 0).
__device__ __forceinline__ float2 rope_factors(const int* __restrict__ pos, int rot, double theta, int& p) {
  const int d = threadIdx.x;
  p = pos[blockIdx.x];
  if (d >= rot) return make_float2(1.f, 0.f);
  const int half = rot / 2, j = d < half ? d : d - half;
  const double inv_freq = 1.0 / pow(theta, (double)(2 * j) / rot);
  const double a = (double)p * inv_freq;
  return make_float2((float)cos(a), (float)sin(a));
}

// Where attn_prep's block (r, h) reads its head: query head h below Hq, else KV head
// kvh = h - Hq (a query head's KV head is kvh); computed before the wait.
__device__ __forceinline__ const act_t* head_src(const act_t* __restrict__ qg, const act_t* __restrict__ k,
                                                 int Hq, int Hkv, int hd, int& kvh) {
  const int r = blockIdx.x, h = blockIdx.y;
  const bool isq = h < Hq;
  kvh = isq ? h / (Hq / Hkv) : h - Hq;
  return isq ? qg + (long)r * Hq * 2 * hd + (long)h * 2 * hd : k + (long)r * Hkv * hd + kvh * hd;
}

// Thread d of attn_prep's block: x, dim d of its head (read from head_src), after the RMSNorm
// (nwd: the norm weight's dim d) and RoPE (cs: rope_factors). `buf` holds hd floats, `red` 32.
__device__ __forceinline__ float prep_head(float x, float nwd, int hd, int rot, float2 cs, float eps, float* buf,
                                           float* red) {
  const int d = threadIdx.x;
  const float inv = rsqrtf(block_sum(x * x, red) / hd + eps);
  x = x * inv * nwd;
  buf[d] = x;
  __syncthreads();
  const int half = rot / 2;
  if (d < rot) x = d < half ? buf[d] * cs.x - buf[d + half] * cs.y : buf[d] * cs.x + buf[d - half] * cs.y;
  return x;
}

// Where row r's query head h goes in qout: rowwise, [R, Hq, hd] as the decode kernels read it
// (a step, or a short window attending row by row); else each segment's heads apart,
// [Hq, rows, hd] from the segment's first row, as the prefill kernels read them.
__device__ __forceinline__ long q_index(int r, int h, int Hq, int hd, const int* __restrict__ row_tl,
                                        const int* __restrict__ row_n, int rowwise) {
  if (rowwise) return ((long)r * Hq + h) * hd;
  const long row0 = r - row_tl[r];
  return row0 * Hq * hd + ((long)h * row_n[r] + row_tl[r]) * hd;
}

// What attn_prep's thread d reads and where it writes, none of it from the previous kernels,
// so all of it is computed before the wait (after it, x and v are read in one round trip):
// the RoPE factors, its head's x and (KV heads) v, the norm weight's dim d, the query's index
// in qout (query heads) or the KV cache row (KV heads).
struct PrepAt {
  float2 cs;
  const act_t *x, *v;
  float nwd;
  long qi, row;
};
__device__ __forceinline__ PrepAt prep_at(const act_t* __restrict__ qg, const act_t* __restrict__ k,
                                          const act_t* __restrict__ v, const float* __restrict__ qn,
                                          const float* __restrict__ kn, const int* __restrict__ pos,
                                          const int* __restrict__ row_slot, const int* __restrict__ row_tl,
                                          const int* __restrict__ row_n, int Hq, int Hkv, int hd, int rot,
                                          int ctx, double theta, int rowwise) {
  const int r = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
  int kvh, p;
  PrepAt at;
  at.cs = rope_factors(pos, rot, theta, p);
  at.x = head_src(qg, k, Hq, Hkv, hd, kvh) + d;
  at.v = v + (long)r * Hkv * hd + kvh * hd + d;
  at.nwd = (h < Hq ? qn : kn)[d];
  at.qi = h < Hq ? q_index(r, h, Hq, hd, row_tl, row_n, rowwise) + d : 0;
  at.row = h < Hq ? 0 : ((long)row_slot[r] * Hkv + kvh) * ctx + p;
  return at;
}

extern "C" __global__ void attn_prep(const act_t* __restrict__ qg, const act_t* __restrict__ k,
                                     const act_t* __restrict__ v, const float* __restrict__ qn,
                                     const float* __restrict__ kn, const int* __restrict__ pos,
                                     const int* __restrict__ row_slot, const int* __restrict__ row_tl,
                                     const int* __restrict__ row_n, act_t* __restrict__ qout,
                                     act_t* __restrict__ kc, act_t* __restrict__ vc, int Hq, int Hkv,
                                     int hd, int rot, int ctx, double theta, float eps, int rowwise,
                                     const unsigned char* __restrict__ ahead, long long ahead_bytes,
                                     const unsigned char* __restrict__ ahead2, long long bytes2,
                                     const unsigned char* __restrict__ ahead3, long long bytes3) {
  // The weights read after the attention (o_proj's, the heads of the MLP's gate and up codes)
  // toward L2 before the wait: the attention's kernels leave memory mostly idle (null: none).
  prefetch_ahead(ahead, ahead_bytes, ahead2, bytes2, ahead3, bytes3, blockIdx.x + gridDim.x * blockIdx.y,
                 gridDim.x * gridDim.y);
  extern __shared__ float buf[];
  __shared__ float red[32];
  const int h = blockIdx.y;
  const PrepAt at = prep_at(qg, k, v, qn, kn, pos, row_slot, row_tl, row_n, Hq, Hkv, hd, rot, ctx, theta,
                            rowwise);
  const long off = h < Hq ? at.qi : at.row * hd + threadIdx.x;
  pdl_start();
  const act_t vv = h < Hq ? act_t() : *at.v;
  const float x = prep_head(ld(at.x), at.nwd, hd, rot, at.cs, eps, buf, red);
  if (h < Hq) {
    qout[off] = mk(x);
  } else {
    kc[off] = mk(x);
    vc[off] = vv;
  }
}

// Thread d's element x of a row of hd (the block's threads) into the 8-bit cache: the row's
// scale amax / 127 to *scale (thread 0), code rint(x * 127 / amax) to *code.
__device__ __forceinline__ void store_q8(float x, signed char* __restrict__ code, float* __restrict__ scale,
                                         float* red) {
  const float amax = block_max(fabsf(x), red);
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  *code = static_cast<signed char>(max(-127, min(127, __float2int_rn(x * inv))));
  if (threadIdx.x == 0) *scale = amax / 127.f;
}

// attn_prep with the 8-bit cache: the same queries; each key and value row of a KV head
// quantized with its own scale (ks, vs: [slots, Hkv, ctx]).
extern "C" __global__ void attn_prep_q8(const act_t* __restrict__ qg, const act_t* __restrict__ k,
                                        const act_t* __restrict__ v, const float* __restrict__ qn,
                                        const float* __restrict__ kn, const int* __restrict__ pos,
                                        const int* __restrict__ row_slot, const int* __restrict__ row_tl,
                                        const int* __restrict__ row_n, act_t* __restrict__ qout,
                                        signed char* __restrict__ kc, signed char* __restrict__ vc,
                                        float* __restrict__ ks, float* __restrict__ vs, int Hq, int Hkv,
                                        int hd, int rot, int ctx, double theta, float eps, int rowwise,
                                        const unsigned char* __restrict__ ahead, long long ahead_bytes,
                                        const unsigned char* __restrict__ ahead2, long long bytes2,
                                        const unsigned char* __restrict__ ahead3, long long bytes3) {
  prefetch_ahead(ahead, ahead_bytes, ahead2, bytes2, ahead3, bytes3, blockIdx.x + gridDim.x * blockIdx.y,
                 gridDim.x * gridDim.y);
  extern __shared__ float buf[];
  __shared__ float red[32];
  const int h = blockIdx.y, d = threadIdx.x;
  const PrepAt at = prep_at(qg, k, v, qn, kn, pos, row_slot, row_tl, row_n, Hq, Hkv, hd, rot, ctx, theta,
                            rowwise);
  pdl_start();
  const float vv = h < Hq ? 0.f : ld(at.v);
  const float x = prep_head(ld(at.x), at.nwd, hd, rot, at.cs, eps, buf, red);
  if (h < Hq) {
    qout[at.qi] = mk(x);
    return;
  }
  store_q8(x, kc + at.row * hd + d, ks + at.row, red);
  store_q8(vv, vc + at.row * hd + d, vs + at.row, red);
}

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
template <int DPL, int GM, int KU, int NW, int Q8>
__device__ __forceinline__ void attn_decode_body(const act_t* __restrict__ q,
                                                 const typename KvCode<Q8>::type* __restrict__ kc,
                                                 const typename KvCode<Q8>::type* __restrict__ vc,
                                                 const float* __restrict__ ks, const float* __restrict__ vs,
                                                 const int* __restrict__ pos, const int* __restrict__ row_slot,
                                                 float* __restrict__ po, float* __restrict__ pml, int Hq, int Hkv,
                                                 int ctx, int least, int nsmax, float scale, int fresh) {
  constexpr int HD = DPL * 32;
  __shared__ float sm_o[NW][GM][HD];
  __shared__ float sm_m[NW][GM], sm_l[NW][GM];
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
  if (jfirst < k1) load_keys(jfirst, 2);
  float qv[GM][DPL], o[GM][DPL], m[GM], l[GM];
  RawRow<DPL, 0> qr[GM];
#pragma unroll
  for (int g = 0; g < GM; ++g)
    if (g < gq) load_raw<DPL, 0>(q + ((long)r * Hq + kvh * gq + g) * HD + lane * DPL, nullptr, qr[g]);
#pragma unroll
  for (int g = 0; g < GM; ++g) {
    m[g] = -INFINITY; l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) { o[g][i] = 0.f; qv[g][i] = 0.f; }
    if (g < gq) {
      raw_floats<DPL, 0>(qr[g], qv[g]);
#pragma unroll
      for (int i = 0; i < DPL; ++i) qv[g][i] *= scale;
    }
  }
  if (jfirst < k1) to_floats();
  for (int j0 = jfirst; j0 < k1; j0 += NW * KU) {
    if (j0 != jfirst) {
      load_keys(j0, 0);
      to_floats();
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

// grid (cdiv(n * hd / 4, 256), 2), 256 threads: rows [0, n) of one KV head's 8-bit keys
// (blockIdx.y 0) or values (1) as code * scale in the activation type, for a prompt's cuBLAS
// products (hd a multiple of 4, the codes 4-byte aligned).
extern "C" __global__ void kv_dequant(const signed char* __restrict__ kc, const float* __restrict__ ks,
                                      const signed char* __restrict__ vc, const float* __restrict__ vs,
                                      act_t* __restrict__ kout, act_t* __restrict__ vout, int n, int hd) {
  pdl_start();
  const bool values = blockIdx.y == 1;
  const signed char* __restrict__ codes = values ? vc : kc;
  const float* __restrict__ scales = values ? vs : ks;
  act_t* __restrict__ out = values ? vout : kout;
  const long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * 4;
  if (i >= (long)n * hd) return;
  float x[4];
  unpack_codes(*reinterpret_cast<const unsigned*>(codes + i), scales[i / hd], x);
#pragma unroll
  for (int b = 0; b < 4; ++b) out[i + b] = mk(x[b]);
}

// Row i of the scores is query (head h, local row t) = (i / tq, t0 + i % tq); it sees keys
// j <= start + t. P = softmax over the visible keys, zero elsewhere. One block per row.
extern "C" __global__ void softmax_causal(const float* __restrict__ S, act_t* __restrict__ P, int tq,
                                          int t0, int start, int L) {
  pdl_start();
  __shared__ float red[32];
  const long i = blockIdx.x;
  const int lim = min(L, start + t0 + (int)(i % tq) + 1);
  const float* sr = S + i * L;
  act_t* pr = P + i * L;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < lim; j += blockDim.x) mx = fmaxf(mx, sr[j]);
  mx = block_max(mx, red);
  float sum = 0.f;
  for (int j = threadIdx.x; j < lim; j += blockDim.x) sum += expf(sr[j] - mx);
  float inv = 1.f / block_sum(sum, red);
  for (int j = threadIdx.x; j < L; j += blockDim.x) st(pr + j, j < lim ? expf(sr[j] - mx) * inv : 0.f);
}

// grid (rows, Hq), hd threads: out[row0 + t, h, :] = O[h, t, :] * sigmoid(gate).
extern "C" __global__ void attn_gate(const act_t* __restrict__ O, const act_t* __restrict__ qg,
                                     act_t* __restrict__ out, int rows, int row0, int Hq, int hd) {
  pdl_start();
  const int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
  const long r = row0 + t;
  float gate = ld(qg + r * Hq * 2 * hd + (long)h * 2 * hd + hd + d);
  st(out + r * Hq * hd + (long)h * hd + d, ld(O + ((long)h * rows + t) * hd + d) * sigmoid_f(gate));
}
