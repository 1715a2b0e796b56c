// The chunked gated delta rule of gdn_chunk.cu with its products on tensor cores: prefill
// where the model computes in bf16 or fp16 on sm_80 and newer (deltanet.chunk_tc_rows).
// Same math, layouts, arguments and grid (Hv, dv / 32, segments) x 256 threads; see the
// header of gdn_chunk.cu. Per chunk of GC rows, with S the block's 128 x 32 slice of the
// state:
//   phase 1  A = K K^T, Qm = Q K^T (lower tiles), K S, Q S      mma, TF32 in, fp32 out
//   phase 2  V' = (I + A)^-1 R                                 fp32 substitution
//   phase 3  O = e^G (Q S) + Qm V',  S = e^{G_last} S + K^T (e^{G_last - G} V')   mma
// Operands are rounded to TF32 (cvt.rna, 10 mantissa bits) on their way into shared memory
// or into a fragment; every sum is fp32. S itself stays fp32: warp w holds key rows
// [16w, 16w + 16) of the 32 columns as mma accumulators for the whole segment, and shared
// memory holds a TF32 copy as the B operand of K S and Q S.
//
// mma.m16n8k8.tf32 fragments (g = lane / 4, t = lane % 4): A 16x8 a0 (g, t), a1 (g+8, t),
// a2 (g, t+4), a3 (g+8, t+4); B 8x8 b0 (t, g), b1 (t+4, g); C 16x8 c0 (g, 2t), c1 (g, 2t+1),
// c2 (g+8, 2t), c3 (g+8, 2t+1). Row strides are 4 mod 32 floats where fragments read
// (row g, column t) and 8 mod 32 where they read (row t, column g): no bank conflicts,
// except K^T's fragments in the state update (two-way).
//
// The next chunk's q, k, v, g and beta are read into registers while this one computes.
// q, k and v rows must start on 16 bytes (the frame's buffers do).
#include "common.cuh"

constexpr int TK = 128, TV = 32;           // key dims; value columns a block
constexpr int TLK = TK + 4, TLV = TV + 8;  // row strides of K and Q; of V and S

__device__ __forceinline__ unsigned to_tf32(float x) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float round_tf32(float x) { return __uint_as_float(to_tf32(x)); }
__device__ __forceinline__ float4 round_tf32(float4 x) {
  return make_float4(round_tf32(x.x), round_tf32(x.y), round_tf32(x.z), round_tf32(x.w));
}

// d += a b on one 16x8x8 tile (fragments as in the header).
__device__ __forceinline__ void mma_tf32(float* d, unsigned a0, unsigned a1, unsigned a2,
                                         unsigned a3, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One chunk's inputs in registers. K and Q: warp w reads rows w, w + 8, ... (a lane 16 bytes
// of each); V: row tid / 8 + 32u, 16 bytes at column 4 (tid % 8); g and beta: warp 0, lane l
// rows l P .. l P + P - 1. Rows past the segment's end are zero.
template <int GC> struct Ahead {
  static constexpr int P = GC / 32;
  float4 k[GC / 8], q[GC / 8], v[GC / 32];
  float g[P], b[P];

  __device__ __forceinline__ void fetch(const float* __restrict__ qp, const float* __restrict__ kp,
                                        const float* __restrict__ vp, const float* __restrict__ gp,
                                        const float* __restrict__ bp, long rbase, int n, int KD,
                                        int kcol, int VD, int vcol, int Hv, int h, int tid) {
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int u = 0; u < GC / 8; ++u) {
      const int t = (tid >> 5) + 8 * u;
      const long at = (rbase + t) * KD + kcol + 4 * (tid & 31);
      k[u] = t < n ? *reinterpret_cast<const float4*>(kp + at) : zero;
      q[u] = t < n ? *reinterpret_cast<const float4*>(qp + at) : zero;
    }
#pragma unroll
    for (int u = 0; u < GC / 32; ++u) {
      const int t = (tid >> 3) + 32 * u;
      const long at = (rbase + t) * VD + vcol + 4 * (tid & 7);
      v[u] = t < n ? *reinterpret_cast<const float4*>(vp + at) : zero;
    }
    if (tid < 32) {
#pragma unroll
      for (int u = 0; u < P; ++u) {
        const int t = tid * P + u;
        g[u] = t < n ? gp[(rbase + t) * Hv + h] : 0.f;
        b[u] = t < n ? bp[(rbase + t) * Hv + h] : 0.f;
      }
    }
  }

  // Into shared memory: K and Q rounded to TF32, V as it is, and (warp 0) the inclusive
  // scan G of g with e^G, e^{G_last - G} and beta.
  __device__ __forceinline__ void store(float* Kc, float* Qc, float* Vc, float* Gc, float* Bc,
                                        float* Eg, float* El, int tid) const {
#pragma unroll
    for (int u = 0; u < GC / 8; ++u) {
      const int at = ((tid >> 5) + 8 * u) * TLK + 4 * (tid & 31);
      *reinterpret_cast<float4*>(Kc + at) = round_tf32(k[u]);
      *reinterpret_cast<float4*>(Qc + at) = round_tf32(q[u]);
    }
#pragma unroll
    for (int u = 0; u < GC / 32; ++u)
      *reinterpret_cast<float4*>(Vc + ((tid >> 3) + 32 * u) * TLV + 4 * (tid & 7)) = v[u];
    if (tid < 32) {
      float run = 0.f;
#pragma unroll
      for (int u = 0; u < P; ++u) run += g[u];
      run = warp_inclusive_sum(run, tid);  // warp 0: tid is the lane
      const float last = __shfl_sync(0xffffffffu, run, 31);
      float cum = run;
#pragma unroll
      for (int u = P - 1; u >= 0; --u) {  // walk back from the lane's inclusive total
        const int t = tid * P + u;
        Gc[t] = cum;
        Eg[t] = expf(cum);
        El[t] = expf(last - cum);
        Bc[t] = b[u];
        cum -= g[u];
      }
    }
  }
};

// Dynamic shared memory: 4 * (2*GC*TLK + GC*TLV + 2*GC*(GC+4) + TK*TLV + 4*GC) bytes
// (deltanet.chunk_tc_smem): 131 KiB at GC = 64, 67.5 KiB at 32.
template <int GC>
__global__ void __launch_bounds__(256, 1)
gdn_chunk_tc(const float* __restrict__ q, const float* __restrict__ k,
             const float* __restrict__ v, const float* __restrict__ g,
             const float* __restrict__ beta, float* __restrict__ state,
             const int* __restrict__ seg_slot, const int* __restrict__ seg_row0,
             const int* __restrict__ seg_rows, float* __restrict__ o, int Hk, int Hv, int dv) {
  static_assert(GC == 32 || GC == 64, "8 warps share the chunk's row tiles of 16");
  pdl_start();
  constexpr int MT = GC / 16;       // row tiles of 16
  constexpr int WPR = 8 / MT;       // warps a row tile in phases 1 and 3
  constexpr int NT = 4 / WPR;       // 8-column tiles of V a warp takes there
  constexpr int JT = 2 * MT / WPR;  // 8-row tiles of K a warp takes in A and Qm
  constexpr int LDC = GC + 4, MR = GC / 8;
  extern __shared__ float sm[];
  float* Kc = sm;              // [GC][TLK] k (TF32)
  float* Qc = Kc + GC * TLK;   // [GC][TLK] q (TF32)
  float* Vc = Qc + GC * TLK;   // [GC][TLV] v, then R, then V'
  float* Am = Vc + GC * TLV;   // [GC][LDC] A
  float* Qm = Am + GC * LDC;   // [GC][LDC] Qm (TF32)
  float* Ss = Qm + GC * LDC;   // [TK][TLV] S (TF32)
  float* Gc = Ss + TK * TLV;   // [GC] cumulative g
  float* Bc = Gc + GC;         // [GC] beta
  float* Eg = Bc + GC;         // [GC] e^{G_t}
  float* El = Eg + GC;         // [GC] e^{G_last - G_t}
  const unsigned* Ku = reinterpret_cast<const unsigned*>(Kc);
  const unsigned* Qu = reinterpret_cast<const unsigned*>(Qc);
  const unsigned* Su = reinterpret_cast<const unsigned*>(Ss);
  const unsigned* Mu = reinterpret_cast<const unsigned*>(Qm);

  const int h = blockIdx.x, c0 = blockIdx.y * TV, s = blockIdx.z, tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;
  const int rows = seg_rows[s];
  const long row0 = seg_row0[s];
  const int kh = h / (Hv / Hk), KD = Hk * TK, VD = Hv * dv;
  float* sp = state + ((long)seg_slot[s] * Hv + h) * dv * TK;

  // The state as accumulators: st[nt][c] is key 16w + g + 8 (c / 2), column 8 nt + 2t + c % 2.
  float st[4][4];
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c)
      st[nt][c] = sp[(long)(c0 + 8 * nt + 2 * tq + (c & 1)) * TK + 16 * warp + gq + 8 * (c >> 1)];
  auto copy_state = [&]() {  // the TF32 copy that K S and Q S read
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        *reinterpret_cast<float2*>(Ss + (16 * warp + gq + 8 * hf) * TLV + 8 * nt + 2 * tq) =
            make_float2(round_tf32(st[nt][2 * hf]), round_tf32(st[nt][2 * hf + 1]));
  };
  copy_state();

  Ahead<GC> ahead;
  const int kcol = kh * TK, vcol = h * dv + c0;
  if (rows > 0) ahead.fetch(q, k, v, g, beta, row0, min(GC, rows), KD, kcol, VD, vcol, Hv, h, tid);
  const int ti = warp / WPR, p = warp % WPR, r0 = 16 * ti;  // phases 1 and 3: rows r0 + [0, 16)
  for (int t0 = 0; t0 < rows; t0 += GC) {
    const int n = min(GC, rows - t0);
    const long rbase = row0 + t0;
    __syncthreads();  // the previous chunk is done with every buffer
    ahead.store(Kc, Qc, Vc, Gc, Bc, Eg, El, tid);
    if (t0 + GC < rows)
      ahead.fetch(q, k, v, g, beta, rbase + GC, min(GC, rows - t0 - GC), KD, kcol, VD, vcol, Hv,
                  h, tid);
    __syncthreads();

    // Phase 1. Warp (ti, p): K S and Q S on its rows and V tiles p NT + [0, NT); A and Qm on
    // its rows and K tiles j = p + WPR jj up to the diagonal (j <= 2 ti + 1).
    float ks[NT][4], qs[NT][4], kk[JT][4], qk[JT][4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) ks[nt][c] = qs[nt][c] = 0.f;
#pragma unroll
      for (int jj = 0; jj < JT; ++jj) kk[jj][c] = qk[jj][c] = 0.f;
    }
#pragma unroll
    for (int k0 = 0; k0 < TK; k0 += 8) {
      const unsigned* ka = Ku + (r0 + gq) * TLK + k0 + tq;
      const unsigned* qa = Qu + (r0 + gq) * TLK + k0 + tq;
      const unsigned a0 = ka[0], a1 = ka[8 * TLK], a2 = ka[4], a3 = ka[8 * TLK + 4];
      const unsigned e0 = qa[0], e1 = qa[8 * TLK], e2 = qa[4], e3 = qa[8 * TLK + 4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const unsigned* sb = Su + (k0 + tq) * TLV + 8 * (p * NT + nt) + gq;
        const unsigned b0 = sb[0], b1 = sb[4 * TLV];
        mma_tf32(ks[nt], a0, a1, a2, a3, b0, b1);
        mma_tf32(qs[nt], e0, e1, e2, e3, b0, b1);
      }
#pragma unroll
      for (int jj = 0; jj < JT; ++jj) {
        const int j = p + WPR * jj;
        if (j <= 2 * ti + 1) {  // the same for the whole warp
          const unsigned* kb = Ku + (8 * j + gq) * TLK + k0 + tq;
          mma_tf32(kk[jj], a0, a1, a2, a3, kb[0], kb[4]);
          mma_tf32(qk[jj], e0, e1, e2, e3, kb[0], kb[4]);
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {  // R = b (v - e^G K S) in place of v; e^G Q S stays here
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int t = r0 + gq + 8 * hf;
        float2* vr = reinterpret_cast<float2*>(Vc + t * TLV + 8 * (p * NT + nt) + 2 * tq);
        const float2 x = *vr;
        const float b = Bc[t], e = Eg[t];
        *vr = make_float2(b * (x.x - e * ks[nt][2 * hf]), b * (x.y - e * ks[nt][2 * hf + 1]));
        qs[nt][2 * hf] *= e;
        qs[nt][2 * hf + 1] *= e;
      }
    }
#pragma unroll
    for (int jj = 0; jj < JT; ++jj) {  // A (strictly lower) and Qm (lower) with their decay
      const int j = p + WPR * jj;
      if (j <= 2 * ti + 1) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int t = r0 + gq + 8 * hf, c = 8 * j + 2 * tq;
          const float d0 = c <= t ? expf(Gc[t] - Gc[c]) : 0.f;
          const float d1 = c + 1 <= t ? expf(Gc[t] - Gc[c + 1]) : 0.f;
          const float b = Bc[t];
          *reinterpret_cast<float2*>(Am + t * LDC + c) =
              make_float2(c < t ? b * d0 * kk[jj][2 * hf] : 0.f,
                          c + 1 < t ? b * d1 * kk[jj][2 * hf + 1] : 0.f);
          *reinterpret_cast<float2*>(Qm + t * LDC + c) =
              make_float2(round_tf32(d0 * qk[jj][2 * hf]), round_tf32(d1 * qk[jj][2 * hf + 1]));
        }
      }
    }
    __syncthreads();

    {  // Phase 2. V' = (I + A)^-1 R. Eight lanes a column, lane l holding rows l + 8u; for
       // each block of 8 rows the lanes solve its 8 x 8 triangle (each the whole block, from
       // the rows' values by shuffles), then take it out of their later rows.
      const int j = warp * 4 + (lane >> 3), l = lane & 7, base = lane & ~7;
      float r[MR];
#pragma unroll
      for (int u = 0; u < MR; ++u) r[u] = Vc[(l + 8 * u) * TLV + j];
#pragma unroll
      for (int u = 0; u < MR; ++u) {
        float x[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) x[e] = __shfl_sync(0xffffffffu, r[u], base + e);
        const float* ad = Am + 8 * u * LDC + 8 * u;
#pragma unroll
        for (int e = 1; e < 8; ++e) {
          const float4 lo = *reinterpret_cast<const float4*>(ad + e * LDC);
          const float4 hi = *reinterpret_cast<const float4*>(ad + e * LDC + 4);
          const float a[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
          for (int c = 0; c < e; ++c) x[e] = fmaf(-a[c], x[c], x[e]);
        }
        float mine = x[0];
#pragma unroll
        for (int e = 1; e < 8; ++e) mine = l == e ? x[e] : mine;
        r[u] = mine;
#pragma unroll
        for (int w = u + 1; w < MR; ++w) {
          const float* ar = Am + (l + 8 * w) * LDC + 8 * u;
          const float4 lo = *reinterpret_cast<const float4*>(ar);
          const float4 hi = *reinterpret_cast<const float4*>(ar + 4);
          const float a[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
          for (int c = 0; c < 8; ++c) r[w] = fmaf(-a[c], x[c], r[w]);
        }
      }
#pragma unroll
      for (int u = 0; u < MR; ++u) Vc[(l + 8 * u) * TLV + j] = r[u];
    }
    __syncthreads();

    // Phase 3. O = e^G Q S + Qm V' on warp (ti, p)'s tiles (Qm is zero past the diagonal).
#pragma unroll
    for (int kt = 0; kt < 2 * MT; ++kt) {
      if (kt <= 2 * ti + 1) {
        const unsigned* ma = Mu + (r0 + gq) * LDC + 8 * kt + tq;
        const unsigned a0 = ma[0], a1 = ma[8 * LDC], a2 = ma[4], a3 = ma[8 * LDC + 4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const float* vb = Vc + (8 * kt + tq) * TLV + 8 * (p * NT + nt) + gq;
          mma_tf32(qs[nt], a0, a1, a2, a3, to_tf32(vb[0]), to_tf32(vb[4 * TLV]));
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int t = r0 + gq + 8 * hf;
        if (t < n)
          *reinterpret_cast<float2*>(o + (rbase + t) * VD + vcol + 8 * (p * NT + nt) + 2 * tq) =
              make_float2(qs[nt][2 * hf], qs[nt][2 * hf + 1]);
      }
    // S = e^{G_last} S + K^T (e^{G_last - G} V'): warp w's 16 keys, all 32 columns.
    const float el = Eg[GC - 1];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) st[nt][c] *= el;
#pragma unroll
    for (int kt = 0; kt < GC / 8; ++kt) {
      if (8 * kt < n) {  // rows past the end add nothing
        const unsigned* ka = Ku + (8 * kt + tq) * TLK + 16 * warp + gq;
        const unsigned a0 = ka[0], a1 = ka[8], a2 = ka[4 * TLK], a3 = ka[4 * TLK + 8];
        const float w0 = El[8 * kt + tq], w1 = El[8 * kt + tq + 4];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const float* vb = Vc + (8 * kt + tq) * TLV + 8 * nt + gq;
          mma_tf32(st[nt], a0, a1, a2, a3, to_tf32(vb[0] * w0), to_tf32(vb[4 * TLV] * w1));
        }
      }
    }
    copy_state();  // read by the next chunk's phase 1, after two barriers
  }
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c)
      sp[(long)(c0 + 8 * nt + 2 * tq + (c & 1)) * TK + 16 * warp + gq + 8 * (c >> 1)] = st[nt][c];
}
