// A prompt window's product with a 4-bit MLX matrix on tensor cores (sm_80 and newer, 16-bit
// activations): out[M, N] = x[M, K] @ W^T, W [N, K] affine-quantized in groups of 64 columns
// (w = q * scale + bias), read as codes. The prefill's other route dequantizes every matrix
// into the workspace before a cuBLAS product: that writes and reads two bytes a weight per
// window, which on a card with little memory bandwidth costs a large share of a prompt.
//
// One block: a BM x BN tile of out (BM = 128 rows of x, BN = 128 rows of W), 8 warps as 2 (M) x
// 4 (N), each warp 64 x 32: 4 x 4 tiles of mma m16n8k16, fp32 accumulators. K advances one
// quantization group (64 columns) at a time through ST stages of dynamic shared memory filled
// by cp.async, ST - 1 groups ahead of the one multiplied (a group's products take less time
// than a load from device memory: with one group ahead the block waited for each), one barrier
// a group. A stage (W4Stage) holds
//   x   [BM][64] activations, 16-byte chunks XOR-swizzled by row (conflict-free ldmatrix);
//   W   [BN][12] words: each row's 8 code words of the group, rows 48 bytes apart (the 64-bit
//       reads of 8 rows land in distinct banks);
//   the group's scale and bias of each row (read into registers a stage ahead and stored once
//   the stage is free: in MLX's row order they are 2 bytes a row, too little for cp.async).
// A warp's B fragment (8 rows of W x 16 columns) is dequantized in registers as the mma takes
// it: lane l holds row l/4, columns 2(l%4), +1 and +8, +9 of the k-step, which are nibbles
// 2(l%4) and 2(l%4)+1 of the row's words 2s and 2s+1. A code becomes a float exactly by its
// bits under 2^23's (no integer conversion, a quarter-rate instruction); the weight is
// fmaf(q, scale, bias) rounded to the activation type once, as the dequantization kernel
// rounds it.
//
// BLK 0: W in MLX's row order ([N][K/8] words, scales [N][K/64]); BLK 1: 8-row blocks
// (weights.py, to_blocks: per block of 8 rows and group, the 8 rows' 8 words one after
// another, their scales likewise). Rows past M read zeros and are not stored; N is a multiple
// of 8 (rows past it read zeros), K of 64.
#include "mma.cuh"

constexpr int W4_BM = 128, W4_BN = 128, W4_LDW = 12;

struct W4Stage {  // 23,040 bytes with 16-bit activations (w4_mma.py, STAGE_BYTES)
  act_t x[W4_BM][64];
  unsigned w[W4_BN][W4_LDW];
  act_t s[W4_BN], b[W4_BN];
};

// Stage `st` <- group g of x rows [m0, m0 + BM) and W rows [n0, n0 + BN), by cp.async.
template <int BLK>
__device__ __forceinline__ void w4_copy(act_t (*xs)[64], unsigned (*ws)[W4_LDW], const act_t* __restrict__ x,
                                        const unsigned* __restrict__ W, int M, int N, int K, int m0, int n0,
                                        int g, int tid) {
  const int ng = K / 64;
#pragma unroll
  for (int j = 0; j < 4; ++j) {  // x: 128 rows x 8 chunks of 16 bytes
    const int i = tid + 256 * j, r = i >> 3, c = i & 7, m = m0 + r;
    const act_t* src = m < M ? x + (long)m * K + g * 64 + c * 8 : x;
    pf_copy(pf_smem(&xs[r][(c ^ (r & 7)) * 8]), src, m < M ? 16 : 0);
  }
  if constexpr (BLK == 1) {  // 16 blocks of 8 rows, 256 bytes each
    const int blk = tid >> 4, ch = tid & 15, n = n0 + blk * 8 + (ch >> 1);
    const unsigned* src = W + ((long)((n0 >> 3) + blk) * ng + g) * 64 + ch * 4;
    pf_copy(pf_smem(&ws[blk * 8 + (ch >> 1)][(ch & 1) * 4]), n < N ? src : W, n < N ? 16 : 0);
  } else {  // 128 rows x 2 chunks
    const int r = tid >> 1, ch = tid & 1, n = n0 + r;
    const unsigned* src = W + (long)n * (K / 8) + g * 8 + ch * 4;
    pf_copy(pf_smem(&ws[r][ch * 4]), n < N ? src : W, n < N ? 16 : 0);
  }
}

// Thread tid's part of group g's scales and biases: the scale (tid < 128) or the bias of W
// row n0 + tid % 128 (zero past N). Read a group ahead, so the load's latency passes while
// the current group is multiplied.
template <int BLK>
__device__ __forceinline__ act_t w4_scale(const act_t* __restrict__ S, const act_t* __restrict__ B, int N,
                                          int K, int n0, int g, int tid) {
  const int ng = K / 64, n = n0 + (tid & 127);
  if (n >= N || g >= ng) return mk(0.f);
  long si = (long)n * ng + g;
  if constexpr (BLK == 1) si = ((long)(n >> 3) * ng + g) * 8 + (n & 7);
  return tid < 128 ? S[si] : B[si];
}

// Code q at bit `sh` of w as a float: 2^23 + q by its bits, less 2^23 (exact).
__device__ __forceinline__ float w4_code(unsigned w, int sh) {
  return __uint_as_float(((w >> sh) & 15u) | 0x4B000000u) - 8388608.f;
}

// Two 4-bit codes (nibbles k and k + 1 of w) as one register of two weights.
__device__ __forceinline__ unsigned w4_pair(unsigned w, int k, float s, float b) {
  return pf_pack(fmaf(w4_code(w, 4 * k), s, b), fmaf(w4_code(w, 4 * k + 4), s, b));
}

template <int BLK, int ST>
__global__ void __launch_bounds__(256)
w4_mma(const act_t* __restrict__ x, const unsigned* __restrict__ W, const act_t* __restrict__ S,
       const act_t* __restrict__ B, act_t* __restrict__ out, int M, int N, int K) {
  extern __shared__ __align__(16) unsigned char w4_smem[];
  W4Stage* const stage = reinterpret_cast<W4Stage*>(w4_smem);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp & 1, wn = warp >> 1;
  const int m0 = blockIdx.y * W4_BM, n0 = blockIdx.x * W4_BN, ng = K / 64;
  float acc[4][4][4];
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[a][b][c] = 0.f;
  pdl_start();

  // This thread's scale (tid < 128) or bias of a stage.
  auto sb = [&](int st) -> act_t& { return tid < 128 ? stage[st].s[tid] : stage[st].b[tid - 128]; };
#pragma unroll
  for (int p = 0; p < ST - 1; ++p) {  // groups 0 .. ST - 2 requested (one commit each)
    if (p < ng) w4_copy<BLK>(stage[p].x, stage[p].w, x, W, M, N, K, m0, n0, p, tid);
    asm volatile("cp.async.commit_group;" ::: "memory");
    sb(p) = w4_scale<BLK>(S, B, N, K, n0, p, tid);
  }
  for (int g = 0; g < ng; ++g) {
    const int st = g % ST, gn = g + ST - 1, sn = gn % ST;
    asm volatile("cp.async.wait_group %0;" ::"n"(ST - 2) : "memory");  // group g is in
    __syncthreads();  // every thread's part of it; and stage sn (group g - 1's) is free
    if (gn < ng) w4_copy<BLK>(stage[sn].x, stage[sn].w, x, W, M, N, K, m0, n0, gn, tid);
    asm volatile("cp.async.commit_group;" ::: "memory");
    const act_t next = w4_scale<BLK>(S, B, N, K, n0, gn, tid);  // stored after the products
    const W4Stage& cur = stage[st];
    float sc[4], bi[4];
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int row = wn * 32 + nt * 8 + (lane >> 2);
      sc[nt] = cv(cur.s[row]);
      bi[nt] = cv(cur.b[row]);
    }
#pragma unroll
    for (int s = 0; s < 4; ++s) {  // k-steps of 16 columns
      unsigned a[4][4];
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        const int mat = lane >> 3, row = wm * 64 + mt * 16 + (lane & 7) + (mat & 1) * 8;
        const int chunk = s * 2 + (mat >> 1);
        pf_ldsm(a[mt], pf_smem(&cur.x[row][(chunk ^ (row & 7)) * 8]));
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int row = wn * 32 + nt * 8 + (lane >> 2), k = 2 * (lane & 3);
        const uint2 w = *reinterpret_cast<const uint2*>(&cur.w[row][2 * s]);
        const unsigned b0 = w4_pair(w.x, k, sc[nt], bi[nt]);
        const unsigned b1 = w4_pair(w.y, k, sc[nt], bi[nt]);
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) pf_mma(acc[mt][nt], a[mt], b0, b1);
      }
    }
    sb(sn) = next;  // read after the next barrier, ST - 1 groups on
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");

#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int col = n0 + wn * 32 + nt * 8 + 2 * (lane & 3);
      if (col >= N) continue;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = m0 + wm * 64 + mt * 16 + (lane >> 2) + half * 8;
        if (row < M)
          *reinterpret_cast<unsigned*>(out + (long)row * N + col) =
              pf_pack(acc[mt][nt][2 * half], acc[mt][nt][2 * half + 1]);
      }
    }
  }
}
