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
#include "attn_head.cuh"
#include "common.cuh"

// Thread d's factors of row r (blockIdx.x), its position read from pos.
__device__ __forceinline__ float2 rope_factors(const int* __restrict__ pos, int rot, double theta, int& p) {
  p = pos[blockIdx.x];
  return rope_cs(p, threadIdx.x, rot, theta);
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
  const int d = threadIdx.x, half = rot / 2;
  buf[d] = x;
  __syncthreads();
  if (d < 32) {
    const float inv = head_scale(lane_sumsq(buf + d * (hd / 32), hd / 32), hd, eps);
    if (d == 0) red[0] = inv;
  }
  __syncthreads();
  x = norm_dim(x, red[0], nwd);
  buf[d] = x;
  __syncthreads();
  if (d < rot) x = rope_dim(x, buf[d < half ? d + half : d - half], cs, d < half);
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

#include "attn_decode.cuh"

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
