// Dequantization (prefill workspace), embedding row gather and dtype conversions.
#include "common.cuh"

// One thread per uint32 word: writes its 32/BITS columns as activations.
template <int BITS>
__global__ void dequant(const unsigned* __restrict__ W, const act_t* __restrict__ S,
                        const act_t* __restrict__ B, act_t* __restrict__ out, long nwords, int in,
                        int G) {
  pdl_start();
  constexpr int PW = 32 / BITS;
  constexpr unsigned MASK = (1u << BITS) - 1u;
  const int wpr = in / PW, ng = in / G;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < nwords; i += (long)gridDim.x * blockDim.x) {
    long row = i / wpr;
    int col = (int)(i % wpr) * PW;
    float s = ld(S + row * ng + col / G), b = ld(B + row * ng + col / G);
    unsigned w = W[i];
    act_t* o = out + row * in + col;
#pragma unroll
    for (int k = 0; k < PW; ++k) o[k] = mk(fmaf((float)((w >> (k * BITS)) & MASK), s, b));
  }
}

// out[r, :] = dequant(W[ids[r], :]); grid.x = rows.
template <int BITS>
__global__ void embed_q(const unsigned* __restrict__ W, const act_t* __restrict__ S,
                        const act_t* __restrict__ B, const int* __restrict__ ids,
                        act_t* __restrict__ out, int in, int G) {
  pdl_start();
  constexpr int PW = 32 / BITS;
  constexpr unsigned MASK = (1u << BITS) - 1u;
  const long row = ids[blockIdx.x];
  const int wpr = in / PW, ng = in / G;
  for (int j = threadIdx.x; j < wpr; j += blockDim.x) {
    int col = j * PW;
    float s = ld(S + row * ng + col / G), b = ld(B + row * ng + col / G);
    unsigned w = W[row * wpr + j];
    act_t* o = out + (long)blockIdx.x * in + col;
#pragma unroll
    for (int k = 0; k < PW; ++k) o[k] = mk(fmaf((float)((w >> (k * BITS)) & MASK), s, b));
  }
}

extern "C" __global__ void embed_dense(const act_t* __restrict__ table, const int* __restrict__ ids,
                                       act_t* __restrict__ out, int in) {
  pdl_start();
  const long row = ids[blockIdx.x];
  for (int j = threadIdx.x; j < in; j += blockDim.x) out[(long)blockIdx.x * in + j] = table[row * in + j];
}

extern "C" __global__ void from_bf16(const unsigned short* __restrict__ x, act_t* __restrict__ y, long n) {
  pdl_start();
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
    y[i] = mk(b2f(x[i]));
}
extern "C" __global__ void from_f16(const unsigned short* __restrict__ x, act_t* __restrict__ y, long n) {
  pdl_start();
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
    y[i] = mk(h2f(x[i]));
}
extern "C" __global__ void from_f32(const float* __restrict__ x, act_t* __restrict__ y, long n) {
  pdl_start();
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
    y[i] = mk(x[i]);
}
extern "C" __global__ void to_f32(const act_t* __restrict__ x, float* __restrict__ y, long n) {
  pdl_start();
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
    y[i] = ld(x + i);
}
// 2-D gather of rows (host-chosen rows uploaded as ids): y[i, :] = x[rows[i], :].
extern "C" __global__ void gather_rows(const act_t* __restrict__ x, const int* __restrict__ rows,
                                       act_t* __restrict__ y, int n) {
  pdl_start();
  const long r = rows[blockIdx.x];
  for (int j = threadIdx.x; j < n; j += blockDim.x) y[(long)blockIdx.x * n + j] = x[r * n + j];
}
