// Fused prefill attention (flash form) for 16-bit activations on tensor cores (sm_80+).
//
// One block: BQ = 16 * NW query rows of one segment and one query head; each warp owns 16
// rows. The block walks the keys its rows may see (causal: row t at position start + t sees
// keys 0..start + t) in tiles of BK = 32, with one pass and an online softmax:
//   S = Q K^T * hd^-1/2 (mma m16n8k16, fp32 accumulate, in log2 units), masked past each
//   row's position; m = max(m, rowmax S); O = O * 2^(m_old - m) + 2^(S - m) V; l likewise.
// The probabilities enter the second product in the activation type (as the unfused path's
// probabilities do), O and l stay fp32, and the output gate is applied as O / l is stored:
//   out[r, h*hd + d] = O / l * sigmoid(gate[r, h, d])
// so no scores are ever written to memory.
//
// Layouts as attention.cu: the queries of a segment are [Hq, rows, hd] from row0 * Hq * hd,
// qg is [R, Hq, 2 * hd] (query, then gate, per head), out is [R, Hq * hd]. `kc` / `vc` point
// at the keys and values of KV head (h0 / gq) of the segment's slot, [keys, hd]; the next
// KV head's are `head_stride` elements on (the cache's context * hd; 0 where the caller
// passes one head, as the 8-bit cache's dequantized copy). Query head h = h0 + blockIdx.y.
//
// Shared memory (dynamic): Q [BQ][LD], then STAGES buffers of K [BK][LD] and V [BK][LD],
// LD = hd + 8 (16 bytes of padding: ldmatrix rows land in distinct banks). STAGES = 2 loads
// the next tile (cp.async) while this one is multiplied; 1 where a block's shared memory
// allows no more (attention.py, prefill_smem). Keys past the last one visible are loaded as
// zeros, so masked products never meet uninitialised values.
#include "mma.cuh"

// Keys [k0, k0 + BK) of this head into buffer `ks` / `vs` (zeros from `kend` on).
template <int HD, int BK, int NT>
__device__ __forceinline__ void pf_load_kv(act_t* ks, act_t* vs, const act_t* __restrict__ kh,
                                           const act_t* __restrict__ vh, int k0, int kend) {
  constexpr int CH = HD / 8, LD = HD + 8;
  for (int i = threadIdx.x; i < BK * CH; i += NT) {
    const int r = i / CH, c = (i % CH) * 8, key = k0 + r;
    const bool in = key < kend;
    const long off = (long)(in ? key : 0) * HD + c;
    pf_copy(pf_smem(ks + r * LD + c), kh + off, in ? 16 : 0);
    pf_copy(pf_smem(vs + r * LD + c), vh + off, in ? 16 : 0);
  }
}

template <int HD, int NW, int STAGES>
__global__ void __launch_bounds__(NW * 32)
attn_prefill(const act_t* __restrict__ q, const act_t* __restrict__ qg, const act_t* __restrict__ kc,
             const act_t* __restrict__ vc, act_t* __restrict__ out, int rows, int row0, int start,
             int Hq, int gq, int h0, long head_stride, float scale_log2) {
  pdl_start();
  constexpr int BQ = 16 * NW, BK = 32, LD = HD + 8, CH = HD / 8, NT = NW * 32, DT = HD / 8;
  extern __shared__ __align__(16) unsigned char pf_raw[];
  act_t* Qs = reinterpret_cast<act_t*>(pf_raw);  // [BQ][LD]
  act_t* Ks = Qs + BQ * LD;                        // [STAGES][BK][LD]
  act_t* Vs = Ks + STAGES * BK * LD;               // [STAGES][BK][LD]
  const int hl = blockIdx.y, h = h0 + hl, t0 = blockIdx.x * BQ;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int nq = min(BQ, rows - t0);
  const act_t* kh = kc + (long)(hl / gq) * head_stride;
  const act_t* vh = vc + (long)(hl / gq) * head_stride;
  const int kend = start + t0 + nq;  // keys any row of the block sees: [0, kend)
  const int ntiles = (kend + BK - 1) / BK;

  const act_t* qh = q + ((long)row0 * Hq + (long)h * rows + t0) * HD;
  for (int i = threadIdx.x; i < BQ * CH; i += NT) {
    const int r = i / CH, c = (i % CH) * 8;
    const bool in = r < nq;
    pf_copy(pf_smem(Qs + r * LD + c), qh + (long)(in ? r : 0) * HD + c, in ? 16 : 0);
  }
  pf_load_kv<HD, BK, NT>(Ks, Vs, kh, vh, 0, kend);
  asm volatile("cp.async.commit_group;" ::: "memory");

  float o[DT][4];
#pragma unroll
  for (int n = 0; n < DT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  const int r0 = warp * 16 + g;                  // this lane's rows: r0 and r0 + 8
  const int lim0 = start + t0 + r0, lim1 = lim0 + 8;  // the last key each may see
  const int lr = lane & 7, lm = lane >> 3;       // ldmatrix: row in matrix, matrix

  for (int j = 0; j < ntiles; ++j) {
    const int s = STAGES == 2 ? (j & 1) : 0;
    if (STAGES == 2) {
      if (j + 1 < ntiles) {
        __syncthreads();  // every warp is done with the buffer the next tile goes into
        const int n = (j + 1) & 1;
        pf_load_kv<HD, BK, NT>(Ks + n * BK * LD, Vs + n * BK * LD, kh, vh, (j + 1) * BK, kend);
      }
      asm volatile("cp.async.commit_group;" ::: "memory");
      asm volatile("cp.async.wait_group 1;" ::: "memory");
    } else {
      if (j > 0) {
        __syncthreads();
        pf_load_kv<HD, BK, NT>(Ks, Vs, kh, vh, j * BK, kend);
        asm volatile("cp.async.commit_group;" ::: "memory");
      }
      asm volatile("cp.async.wait_group 0;" ::: "memory");
    }
    __syncthreads();  // tile j (and the queries) are in shared memory for every warp
    const act_t* ks = Ks + s * BK * LD;
    const act_t* vs = Vs + s * BK * LD;
    const int k0 = j * BK;
    if (k0 > start + t0 + warp * 16 + 15) continue;  // all of this warp's rows end before it

    // S = Q K^T: this warp's 16 rows by the tile's 32 keys (four 8-key column tiles).
    float sc[4][4];
#pragma unroll
    for (int n = 0; n < 4; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      unsigned a[4];
      pf_ldsm(a, pf_smem(Qs + (warp * 16 + (lm & 1) * 8 + lr) * LD + kk * 16 + (lm >> 1) * 8));
#pragma unroll
      for (int n = 0; n < 4; n += 2) {
        unsigned b[4];
        pf_ldsm(b, pf_smem(ks + ((n + (lm >> 1)) * 8 + lr) * LD + kk * 16 + (lm & 1) * 8));
        pf_mma(sc[n], a, b[0], b[1]);
        pf_mma(sc[n + 1], a, b[2], b[3]);
      }
    }
    // Mask, the new row maxima (a row's four lanes share it), rescale.
    float x0 = m0, x1 = m1;
#pragma unroll
    for (int n = 0; n < 4; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + n * 8 + 2 * tq + (e & 1);
        const float v = key <= (e < 2 ? lim0 : lim1) ? sc[n][e] * scale_log2 : -INFINITY;
        sc[n][e] = v;
        if (e < 2) x0 = fmaxf(x0, v); else x1 = fmaxf(x1, v);
      }
    }
    x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 1));
    x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 2));
    x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 1));
    x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 2));
    const float ref0 = x0 == -INFINITY ? 0.f : x0, ref1 = x1 == -INFINITY ? 0.f : x1;
    const float al0 = exp2f(m0 - ref0), al1 = exp2f(m1 - ref1);  // 0 on the first tile
    m0 = x0;
    m1 = x1;
    l0 *= al0;
    l1 *= al1;
#pragma unroll
    for (int n = 0; n < DT; ++n) {
      o[n][0] *= al0;
      o[n][1] *= al0;
      o[n][2] *= al1;
      o[n][3] *= al1;
    }
    unsigned p[2][4];  // the probabilities as the A operand of two 16-key steps
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const float e0 = exp2f(sc[n][0] - ref0), e1 = exp2f(sc[n][1] - ref0);
      const float e2 = exp2f(sc[n][2] - ref1), e3 = exp2f(sc[n][3] - ref1);
      l0 += e0 + e1;
      l1 += e2 + e3;
      p[n >> 1][(n & 1) * 2] = pf_pack(e0, e1);
      p[n >> 1][(n & 1) * 2 + 1] = pf_pack(e2, e3);
    }
    // O += P V: two 16-key steps by hd / 8 column tiles (V transposed by ldmatrix).
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
#pragma unroll
      for (int n = 0; n < DT; n += 2) {
        unsigned b[4];
        pf_ldsm_t(b, pf_smem(vs + (kk * 16 + (lm & 1) * 8 + lr) * LD + (n + (lm >> 1)) * 8));
        pf_mma(o[n], p[kk], b[0], b[1]);
        pf_mma(o[n + 1], p[kk], b[2], b[3]);
      }
    }
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv[2] = {1.f / l0, 1.f / l1};
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = r0 + half * 8;
    if (r >= nq) continue;
    const long row = (long)row0 + t0 + r;
    const act_t* gate = qg + row * Hq * 2 * HD + (long)h * 2 * HD + HD;
    act_t* dst = out + row * Hq * HD + (long)h * HD;
#pragma unroll
    for (int n = 0; n < DT; ++n) {
      const int d = n * 8 + 2 * tq;
      const float y0 = o[n][half * 2] * inv[half] * sigmoid_f(ld(gate + d));
      const float y1 = o[n][half * 2 + 1] * inv[half] * sigmoid_f(ld(gate + d + 1));
      *reinterpret_cast<unsigned*>(dst + d) = pf_pack(y0, y1);
    }
  }
}
