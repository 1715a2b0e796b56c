// Chunked gated delta rule for windows (prefill): the WY form of engine/backends/gdn.py,
// chunks of GC rows turned into small matrix products instead of GC dependent steps.
//
// With G the inclusive cumulative sum of g inside the chunk, S the state entering it
// (S[i][j]: key dim i, value dim j) and the chunk's rows t, s:
//   A[t][s]  = b_t e^{G_t - G_s} k_t.k_s           (s < t)
//   Qm[t][s] = e^{G_t - G_s} q_t.k_s               (s <= t)
//   R        = b (v - e^G (K S))                   then V' = (I + A)^-1 R, by substitution
//   O        = e^G (Q S) + Qm V'
//   S_next   = e^{G_last} S + (K e^{G_last - G})^T V'
// Rows past the segment's end are zero with g = b = 0, so they change nothing.
//
// grid (Hv, dv / 32, S), 256 threads. A block owns 32 value columns of one head's state and
// keeps them in shared memory over the segment's chunks; the four blocks of a head each form
// A and Qm (k and q are shared by the head). dk = 128. Layouts as gdn.cu: q, k [R, Hk*128],
// v and o [R, Hv*dv], g and beta [R, Hv] (fp32), state [slots, Hv, dv, 128].
#include "common.cuh"

// Dynamic shared memory: 4 * (2*GC*LDK + 2*GC*LDV + 2*GC*(GC+1) + GDK*LDV + 4*GC) bytes
// (ops._chunk_smem): 134 KB at GC = 64, 67 KB at 32, 40 KB at 16.
constexpr int GDK = 128, GDV = 32, LDK = GDK + 1, LDV = GDV + 1;

template <int GC>
__global__ void __launch_bounds__(256)
gdn_chunk(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
          const float* __restrict__ g, const float* __restrict__ beta, float* __restrict__ state,
          const int* __restrict__ seg_slot, const int* __restrict__ seg_row0,
          const int* __restrict__ seg_rows, float* __restrict__ o, int Hk, int Hv, int dv) {
  pdl_start();
  constexpr int LDC = GC + 1, TR = GC / 16, P = GC > 32 ? GC / 32 : 1;
  extern __shared__ float sm[];
  float* Kc = sm;              // [GC][LDK]
  float* Qc = Kc + GC * LDK;   // [GC][LDK]
  float* Vc = Qc + GC * LDK;   // [GC][LDV]: v, then R, then V'
  float* Oc = Vc + GC * LDV;   // [GC][LDV]: e^G (Q S)
  float* Am = Oc + GC * LDV;   // [GC][LDC]
  float* Qm = Am + GC * LDC;   // [GC][LDC]
  float* Ss = Qm + GC * LDC;   // [GDK][LDV]
  float* Gc = Ss + GDK * LDV;  // [GC] cumulative g
  float* Bc = Gc + GC;         // [GC] beta
  float* Eg = Bc + GC;         // [GC] e^{G_t}
  float* El = Eg + GC;         // [GC] e^{G_last - G_t}
  const int h = blockIdx.x, c0 = blockIdx.y * GDV, s = blockIdx.z, tid = threadIdx.x;
  const int rows = seg_rows[s];
  const long row0 = seg_row0[s];
  const int kh = h / (Hv / Hk), KD = Hk * GDK, VD = Hv * dv;
  float* sp = state + ((long)seg_slot[s] * Hv + h) * dv * GDK;
  for (int idx = tid; idx < GDV * GDK; idx += 256) {
    const int j = idx / GDK, i = idx % GDK;
    Ss[i * LDV + j] = sp[(long)(c0 + j) * GDK + i];
  }
  for (int t0 = 0; t0 < rows; t0 += GC) {
    const int n = min(GC, rows - t0);
    const long rbase = row0 + t0;
    __syncthreads();  // the previous chunk is done with every buffer; Ss is updated
    for (int idx = tid; idx < GC * GDK; idx += 256) {
      const int t = idx / GDK, i = idx % GDK;
      const bool in = t < n;
      Kc[t * LDK + i] = in ? k[(rbase + t) * KD + kh * GDK + i] : 0.f;
      Qc[t * LDK + i] = in ? q[(rbase + t) * KD + kh * GDK + i] : 0.f;
    }
    for (int idx = tid; idx < GC * GDV; idx += 256) {
      const int t = idx / GDV, j = idx % GDV;
      Vc[t * LDV + j] = t < n ? v[(rbase + t) * VD + h * dv + c0 + j] : 0.f;
    }
    if (tid < 32) {  // inclusive scan of g: lane holds rows [lane*P, lane*P + P)
      float gv[P], run = 0.f;
#pragma unroll
      for (int u = 0; u < P; ++u) {
        const int t = tid * P + u;
        gv[u] = t < n ? g[(rbase + t) * Hv + h] : 0.f;
        run += gv[u];
      }
      run = warp_inclusive_sum(run, tid);  // warp 0: tid is the lane
      const float last = __shfl_sync(0xffffffffu, run, 31);
      float cum = run;
#pragma unroll
      for (int u = P - 1; u >= 0; --u) {  // walk back from the lane's inclusive total
        const int t = tid * P + u;
        if (t < GC) {
          Gc[t] = cum;
          Eg[t] = expf(cum);
          El[t] = expf(last - cum);
          Bc[t] = t < n ? beta[(rbase + t) * Hv + h] : 0.f;
        }
        cum -= gv[u];
      }
    }
    __syncthreads();
    const int ty = tid / 16, tx = tid % 16;
    {  // A and Qm: a TR x TR tile per thread; tiles above the diagonal are zero
      float kk[TR][TR], qk[TR][TR];
#pragma unroll
      for (int a = 0; a < TR; ++a)
#pragma unroll
        for (int b = 0; b < TR; ++b) kk[a][b] = qk[a][b] = 0.f;
      for (int i = 0; i < (tx <= ty ? GDK : 0); ++i) {
        float ka[TR], qa[TR], kb[TR];
#pragma unroll
        for (int a = 0; a < TR; ++a) {
          ka[a] = Kc[(ty * TR + a) * LDK + i];
          qa[a] = Qc[(ty * TR + a) * LDK + i];
          kb[a] = Kc[(tx * TR + a) * LDK + i];
        }
#pragma unroll
        for (int a = 0; a < TR; ++a)
#pragma unroll
          for (int b = 0; b < TR; ++b) {
            kk[a][b] = fmaf(ka[a], kb[b], kk[a][b]);
            qk[a][b] = fmaf(qa[a], kb[b], qk[a][b]);
          }
      }
#pragma unroll
      for (int a = 0; a < TR; ++a)
#pragma unroll
        for (int b = 0; b < TR; ++b) {
          const int t = ty * TR + a, c = tx * TR + b;
          const float d = c <= t ? expf(Gc[t] - Gc[c]) : 0.f;
          Am[t * LDC + c] = c < t ? Bc[t] * d * kk[a][b] : 0.f;
          Qm[t * LDC + c] = d * qk[a][b];
        }
    }
    {  // R = b (v - e^G K S) in place of v, Oc = e^G Q S: TR rows x 2 columns per thread
      float ks[TR][2], qs[TR][2];
#pragma unroll
      for (int a = 0; a < TR; ++a) ks[a][0] = ks[a][1] = qs[a][0] = qs[a][1] = 0.f;
      for (int i = 0; i < GDK; ++i) {
        const float s0 = Ss[i * LDV + tx * 2], s1 = Ss[i * LDV + tx * 2 + 1];
#pragma unroll
        for (int a = 0; a < TR; ++a) {
          const float kv = Kc[(ty * TR + a) * LDK + i], qv = Qc[(ty * TR + a) * LDK + i];
          ks[a][0] = fmaf(kv, s0, ks[a][0]);
          ks[a][1] = fmaf(kv, s1, ks[a][1]);
          qs[a][0] = fmaf(qv, s0, qs[a][0]);
          qs[a][1] = fmaf(qv, s1, qs[a][1]);
        }
      }
#pragma unroll
      for (int a = 0; a < TR; ++a)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int t = ty * TR + a, j = tx * 2 + c;
          Vc[t * LDV + j] = Bc[t] * (Vc[t * LDV + j] - Eg[t] * ks[a][c]);
          Oc[t * LDV + j] = Eg[t] * qs[a][c];
        }
    }
    __syncthreads();
    if (tid < GDV) {  // V' = (I + A)^-1 R: each lane solves its own column, top to bottom
      const int j = tid;
      for (int t = 1; t < n; ++t) {
        float a0 = Vc[t * LDV + j], a1 = 0.f, a2 = 0.f, a3 = 0.f;
        int c = 0;
        for (; c + 3 < t; c += 4) {
          a0 = fmaf(-Am[t * LDC + c], Vc[c * LDV + j], a0);
          a1 = fmaf(-Am[t * LDC + c + 1], Vc[(c + 1) * LDV + j], a1);
          a2 = fmaf(-Am[t * LDC + c + 2], Vc[(c + 2) * LDV + j], a2);
          a3 = fmaf(-Am[t * LDC + c + 3], Vc[(c + 3) * LDV + j], a3);
        }
        for (; c < t; ++c) a0 = fmaf(-Am[t * LDC + c], Vc[c * LDV + j], a0);
        Vc[t * LDV + j] = (a0 + a1) + (a2 + a3);
      }
    }
    __syncthreads();
    {  // O = Oc + Qm V' (rows past n are not stored)
      float acc[TR][2];
#pragma unroll
      for (int a = 0; a < TR; ++a) {
        acc[a][0] = Oc[(ty * TR + a) * LDV + tx * 2];
        acc[a][1] = Oc[(ty * TR + a) * LDV + tx * 2 + 1];
      }
      const int cmax = min(n, ty * TR + TR);  // Qm is zero above the diagonal
      for (int c = 0; c < cmax; ++c) {
        const float v0 = Vc[c * LDV + tx * 2], v1 = Vc[c * LDV + tx * 2 + 1];
#pragma unroll
        for (int a = 0; a < TR; ++a) {
          const float m = Qm[(ty * TR + a) * LDC + c];
          acc[a][0] = fmaf(m, v0, acc[a][0]);
          acc[a][1] = fmaf(m, v1, acc[a][1]);
        }
      }
#pragma unroll
      for (int a = 0; a < TR; ++a) {
        const int t = ty * TR + a;
        if (t < n) {
          float* orow = o + (rbase + t) * VD + h * dv + c0 + tx * 2;
          orow[0] = acc[a][0];
          orow[1] = acc[a][1];
        }
      }
    }
    {  // S = e^{G_last} S + (K e^{G_last - G})^T V': 4 key rows x 4 value columns per thread
      const int ti = tid / 8, tj = tid % 8;
      const float el = expf(Gc[GC - 1]);
      float acc[4][4];
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) acc[a][b] = el * Ss[(ti * 4 + a) * LDV + tj * 4 + b];
      for (int t = 0; t < n; ++t) {
        const float w = El[t];
        float kv[4], vv[4];
#pragma unroll
        for (int a = 0; a < 4; ++a) {
          kv[a] = Kc[t * LDK + ti * 4 + a] * w;
          vv[a] = Vc[t * LDV + tj * 4 + a];
        }
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int b = 0; b < 4; ++b) acc[a][b] = fmaf(kv[a], vv[b], acc[a][b]);
      }
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) Ss[(ti * 4 + a) * LDV + tj * 4 + b] = acc[a][b];
    }
  }
  __syncthreads();
  for (int idx = tid; idx < GDV * GDK; idx += 256) {
    const int j = idx / GDK, i = idx % GDK;
    sp[(long)(c0 + j) * GDK + i] = Ss[i * LDV + j];
  }
}
