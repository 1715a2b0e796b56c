// Dequantization (prefill workspace), embedding row gather, the 8-row block layout of 4-bit
// weights, and dtype conversions.
#include "common.cuh"

// Where word j of row `row` of a quantized matrix is: MLX's row order (BLK 0), or 8-row blocks
// (BLK 1, 4-bit g64 only: block b, group gr holds the group's 8 words of each of its 8 rows,
// one row after another; weights.py, to_blocks). `sb` gets the row's scale/bias index.
template <int BLK>
__device__ __forceinline__ long word_at(long row, int j, int wpr, int ng, int G, int PW, long& sb) {
  if constexpr (BLK == 0) {
    sb = row * ng + j * PW / G;
    return row * wpr + j;
  } else {
    const long b = row >> 3;
    const int r = row & 7, gr = j >> 3;
    sb = (b * ng + gr) * 8 + r;
    return ((b * ng + gr) * 8 + r) * 8 + (j & 7);
  }
}

// Write N consecutive values with the widest stores their bytes and `o`'s alignment allow
// (one 16-byte store for a 4-bit word's 8 half-precision columns): the narrow stores of
// one value each kept the prefill's dequantization far under the memory's bandwidth.
template <int N>
__device__ __forceinline__ void store_run(act_t* o, const act_t (&v)[N]) {
  constexpr int BYTES = N * (int)sizeof(act_t);
  const unsigned long long at = reinterpret_cast<unsigned long long>(o);
  if constexpr (BYTES % 16 == 0) {
    if ((at & 15) == 0) {
#pragma unroll
      for (int i = 0; i < BYTES / 16; ++i)
        reinterpret_cast<uint4*>(o)[i] = reinterpret_cast<const uint4*>(v)[i];
      return;
    }
  }
  if constexpr (BYTES % 8 == 0) {
    if ((at & 7) == 0) {
#pragma unroll
      for (int i = 0; i < BYTES / 8; ++i)
        reinterpret_cast<uint2*>(o)[i] = reinterpret_cast<const uint2*>(v)[i];
      return;
    }
  }
#pragma unroll
  for (int k = 0; k < N; ++k) o[k] = v[k];
}

// One thread per uint32 word of the first `rows` rows: writes its 32/BITS columns.
template <int BITS, int BLK>
__global__ void dequant(const unsigned* __restrict__ W, const act_t* __restrict__ S,
                        const act_t* __restrict__ B, act_t* __restrict__ out, long rows, int in,
                        int G) {
  pdl_start();
  constexpr int PW = 32 / BITS;
  constexpr unsigned MASK = (1u << BITS) - 1u;
  const int wpr = in / PW, ng = in / G;
  const long nwords = rows * wpr;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < nwords; i += (long)gridDim.x * blockDim.x) {
    const long row = i / wpr;
    const int j = (int)(i % wpr), col = j * PW;
    long si;
    const unsigned w = W[word_at<BLK>(row, j, wpr, ng, G, PW, si)];
    const float s = ld(S + si), b = ld(B + si);
    alignas(16) act_t v[PW];
#pragma unroll
    for (int k = 0; k < PW; ++k) v[k] = mk(fmaf((float)((w >> (k * BITS)) & MASK), s, b));
    store_run<PW>(out + row * in + col, v);
  }
}

// out[r, :] = dequant(W[ids[r], :]); grid.x = rows.
template <int BITS, int BLK>
__global__ void embed_q(const unsigned* __restrict__ W, const act_t* __restrict__ S,
                        const act_t* __restrict__ B, const int* __restrict__ ids,
                        act_t* __restrict__ out, int in, int G) {
  pdl_start();
  constexpr int PW = 32 / BITS;
  constexpr unsigned MASK = (1u << BITS) - 1u;
  const long row = ids[blockIdx.x];
  const int wpr = in / PW, ng = in / G;
  for (int j = threadIdx.x; j < wpr; j += blockDim.x) {
    const int col = j * PW;
    long si;
    const unsigned w = W[word_at<BLK>(row, j, wpr, ng, G, PW, si)];
    const float s = ld(S + si), b = ld(B + si);
    act_t* o = out + (long)blockIdx.x * in + col;
#pragma unroll
    for (int k = 0; k < PW; ++k) o[k] = mk(fmaf((float)((w >> (k * BITS)) & MASK), s, b));
  }
}

// In place, an [8 * gridDim.x, n] array (n = groups * U elements) into 8-row blocks: element
// (8b + r, gr * U + k) moves to (gr * 8 + r) * U + k of block b's 8n elements (4-bit g64
// codes: U = 8 words; their scales or biases: U = 1). The block passes through shared memory.
template <typename T, int U>
__global__ void to_blocks(T* __restrict__ a, int n) {
  pdl_start();
  extern __shared__ unsigned char tb_smem[];
  T* s = reinterpret_cast<T*>(tb_smem);
  T* blk = a + (long)blockIdx.x * 8 * n;
  for (int i = threadIdx.x; i < 8 * n; i += blockDim.x) s[i] = blk[i];
  __syncthreads();
  for (int i = threadIdx.x; i < 8 * n; i += blockDim.x) {
    const int k = i % U, r = (i / U) & 7, gr = i / (8 * U);
    blk[i] = s[r * n + gr * U + k];
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
