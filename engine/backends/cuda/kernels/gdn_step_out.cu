// A decode step's DeltaNet layer through out_proj in one launch (compute capability 9.0):
// gdn_step_split's conv, gates and delta rule over a cluster of P blocks a key head, then the
// gated output norm and this block's share of out_proj (MLX affine 4-bit, group size 64),
// summed over the cluster through distributed shared memory and over the key heads by the
// last cluster to finish. Where it runs (deltanet.py, `fused_out`), out_proj is no launch of
// its own: one wait and one staging fewer in every DeltaNet layer of a step.
//
// Block p of key head kh owns the CB value columns c0 = kh * (Hv/Hk) * dv + p * CB, inside
// one value head and one group of out_proj's columns. Before the wait for the previous
// kernel it copies its columns of out_proj's codes, scales and biases into shared memory
// (cp.async: hidden * CB / 2 bytes of codes, read by no one else), so the products after the
// delta rule read no device memory. Then:
//   y_c   = round(o_c * rsqrt(mean over the head of o^2 + eps) * nw[c % dv] * silu(z_c)),
//           the head's sum of squares gathered from the blocks that share the head;
//   part  = W[:, c0:c0+CB] . y (per row: s * sum(q y) + b * sum(y), fp32);
//   block p sums slice p of the cluster's parts (rows [p * hidden/P, (p+1) * hidden/P)) in
//   rank order and stores it to gpart[s][kh]; the last cluster to count itself in for slice
//   p (count[s * P + p], a ticket reset to 0 by that cluster) adds the key heads' slices in
//   order and stores out[r][slice] in the activation type.
// Every sum runs in a fixed order, so the result is the same on every run.
// Out_proj's codes are in gemv4's 8-row blocks (weights.py, to_blocks): rows 8b..8b+7 of
// group gr at byte (b * ng + gr) * 256 + 32 * row, their scales (biases) at (b * ng + gr) * 8.
// grid (Hk * P, S), threads as gdn_step_split; dynamic shared memory gdn_out_smem (deltanet.py).
#include "gdn_step.cuh"

// Cluster-wide barrier: every block's shared-memory writes before it are visible to the
// cluster after it (and no block leaves while another may still read its shared memory).
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// The float at p in the shared memory of the cluster's block `rank`.
__device__ __forceinline__ float cluster_ld(const float* p, unsigned rank) {
  float v = 0.f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned local = static_cast<unsigned>(__cvta_generic_to_shared(p));
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
#endif
  return v;
}

__device__ __forceinline__ void copy16_async(void* dst, const void* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}

// This block's columns of out_proj into shared memory: per 8-row block b, 8 rows of CB / 2
// code bytes (codes), then the 8 scales (sc) and 8 biases (bi). Nothing earlier writes them.
template <int CB>
__device__ __forceinline__ void fetch_out_cols(const unsigned char* __restrict__ W, const act_t* __restrict__ Ws,
                                               const act_t* __restrict__ Wb, int nb, int ng, int gr,
                                               int off, unsigned char* codes, act_t* sc, act_t* bi) {
  constexpr int CPR = CB / 32;  // 16-byte pieces of a row's codes
  for (int i = threadIdx.x; i < nb * 8 * CPR; i += blockDim.x) {
    const int b = i / (8 * CPR), rem = i - b * 8 * CPR, row = rem / CPR, k = rem - row * CPR;
    copy16_async(codes + 16 * i, W + ((long)b * ng + gr) * 256 + 32 * row + off / 2 + 16 * k);
  }
  constexpr int SP = 8 * sizeof(act_t) / 16;  // 16-byte pieces of a block's 8 scales
  for (int i = threadIdx.x; i < nb * SP; i += blockDim.x) {
    const int b = i / SP, k = i - b * SP;
    copy16_async(reinterpret_cast<unsigned char*>(sc) + 16 * i,
                 reinterpret_cast<const unsigned char*>(Ws + ((long)b * ng + gr) * 8) + 16 * k);
    copy16_async(reinterpret_cast<unsigned char*>(bi) + 16 * i,
                 reinterpret_cast<const unsigned char*>(Wb + ((long)b * ng + gr) * 8) + 16 * k);
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// part[row] = sum over this block's CB columns of W[row, c] y[c], for every row (hidden of
// them): warp w takes 8-row blocks w, w + warps, ...; lane (row & 7) * 4 + quarter reads its
// quarter of the row's codes (CB / 8 bytes) and the quarters are summed by two shuffles.
template <int CB>
__device__ __forceinline__ void out_products(const unsigned char* codes, const act_t* sc, const act_t* bi,
                                             const float* yv, float ysum, int nb, float* part) {
  constexpr int NQ = CB / 4;  // columns of a quarter
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int row = lane >> 2, qd = lane & 3;
  float yl[NQ];
#pragma unroll
  for (int j = 0; j < NQ; ++j) yl[j] = yv[qd * NQ + j];
  for (int b = warp; b < nb; b += nwarps) {
    const unsigned char* cp = codes + (b * 8 + row) * (CB / 2) + qd * (NQ / 2);
    unsigned words[NQ / 8];
#pragma unroll
    for (int k = 0; k < NQ / 8; ++k) words[k] = reinterpret_cast<const unsigned*>(cp)[k];
    float acc = 0.f;
#pragma unroll
    for (int k = 0; k < NQ / 8; ++k)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc = fmaf(static_cast<float>((words[k] >> (4 * j)) & 15u), yl[8 * k + j], acc);
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    acc += __shfl_xor_sync(0xffffffffu, acc, 2);
    if (qd == 0) part[b * 8 + row] = fmaf(cv(sc[b * 8 + row]), acc, cv(bi[b * 8 + row]) * ysum);
  }
}

#if __CUDA_ARCH__ >= 900
template <int NC, int P, int CB>
__global__ void __cluster_dims__(P, 1, 1) __launch_bounds__(1024)
gdn_step_out(const act_t* __restrict__ mixed, const float* __restrict__ conv_w, act_t* __restrict__ cstate,
             const act_t* __restrict__ a, const act_t* __restrict__ b, const float* __restrict__ A_log,
             const float* __restrict__ dt_bias, float* __restrict__ state, const int* __restrict__ seg_slot,
             const int* __restrict__ seg_row0, int Hk, int Hv, int dv, int K, const act_t* __restrict__ z,
             int ldz, const float* __restrict__ nw, float eps, const unsigned char* __restrict__ W,
             const act_t* __restrict__ Ws, const act_t* __restrict__ Wb, int hidden,
             float* __restrict__ gpart, unsigned* __restrict__ count, act_t* __restrict__ out, int ldo,
             const unsigned char* __restrict__ ahead2, long long bytes2,
             const unsigned char* __restrict__ ahead3, long long bytes3) {
  constexpr int DK = STEP_DK;
  __shared__ float sq[DK], sk[DK], sv[CB], yv[CB], sgb[2], red[32], head_ss[1], yfac[1];
  __shared__ unsigned last[1];
  extern __shared__ uint4 dyn[];
  const int nb = hidden >> 3;
  unsigned char* const codes = reinterpret_cast<unsigned char*>(dyn);
  act_t* const sc = reinterpret_cast<act_t*>(codes + nb * 8 * (CB / 2));
  act_t* const bi = sc + nb * 8;
  float* const part = reinterpret_cast<float*>(bi + nb * 8);

  const int p = blockIdx.x % P, kh = blockIdx.x / P, s = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gv = Hv / Hk, cols = gv * dv, KD = Hk * DK, VD = Hv * dv, C = 2 * KD + VD;
  const long r = seg_row0[s];
  const int slot = seg_slot[s];
  const int c0 = kh * cols + p * CB;  // this block's first column of o (and of out_proj)
  const int col = p * CB + warp * NC, h = kh * gv + col / dv, j0 = col % dv;
  fetch_out_cols<CB>(W, Ws, Wb, nb, VD >> 6, c0 >> 6, c0 & 63, codes, sc, bi);
  float4 S[NC];
  float* const sp = load_state<NC>(state, slot, Hv, h, dv, j0, lane, S);
  const bool conv = tid < 2 * DK + CB, gate = tid == 2 * DK + CB;
  const int c = tid < DK       ? kh * DK + tid
                : tid < 2 * DK ? KD + kh * DK + tid - DK
                               : 2 * KD + c0 + tid - 2 * DK;
  const int hg = kh * gv + p * CB / dv;  // the one value head of this block's columns
  act_t* cs = cstate + (long)slot * (K - 1) * C;
  float wk[STEP_MAXK - 1], tap[STEP_MAXK - 1], a_log = 0.f, dtb = 0.f;
  const float wnew = conv_taps(conv, c, K, C, conv_w, cs, wk, tap);
  float nwc = 0.f;
  if (gate) {
    a_log = A_log[hg];
    dtb = dt_bias[hg];
  }
  if (tid < CB) nwc = nw[(c0 + tid) % dv];
  prefetch_ahead(nullptr, 0, ahead2, bytes2, ahead3, bytes3, blockIdx.x + blockIdx.y * gridDim.x,
                 gridDim.x * gridDim.y);
  pdl_start();

  float val = 0.f, zc = 0.f;
  act_t newest = mk(0.f);
  if (tid < CB) zc = ld(z + r * ldz + c0 + tid);  // the gate of column tid, read early
  if (conv) {
    newest = mixed[r * C + c];
    const float acc = conv_acc(wk, tap, wnew, newest, K);
    if (tid >= 2 * DK) shift_taps(cs, c, C, K, tap, newest);  // this block's own v channels
    val = silu_f(acc);
  } else if (gate) {
    step_gates(a, b, r * Hv + hg, a_log, dtb, sgb[0], sgb[1]);
  }
  stage_qkv(val, tid, lane, warp, CB, red, sq, sk, sv);

  const float decay = expf(sgb[0]), bt = sgb[1];
  const float o = delta_columns<NC>(S, sq, sk, sv + warp * NC, decay, bt, lane);
  if (lane < NC) yv[warp * NC + lane] = o;
  store_state<NC>(sp, S, lane);
  __syncthreads();
  if (warp == 0) {  // this block's share of its head's sum of squares
    float q = 0.f;
    for (int i = lane; i < CB; i += 32) q = fmaf(yv[i], yv[i], q);
    q = warp_sum(q);
    if (lane == 0) head_ss[0] = q;
  }
  cluster_sync();  // every block's head_ss is written
  if (tid < CB) {
    const int per_head = dv / CB, first = p - p % per_head;
    float ss = 0.f;
    for (int k = 0; k < per_head; ++k) ss += cluster_ld(head_ss, first + k);
    const float y = cv(mk(yv[tid] * rsqrtf(ss / dv + eps) * nwc * silu_f(zc)));
    yv[tid] = y;  // only thread tid reads and writes entry tid here
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();
  if (warp == 0) {
    float t = 0.f;
    for (int i = lane; i < CB; i += 32) t += yv[i];
    t = warp_sum(t);
    if (lane == 0) yfac[0] = t;
  }
  __syncthreads();
  out_products<CB>(codes, sc, bi, yv, yfac[0], nb, part);
  cluster_sync();  // every block's part is written
  const int hs = hidden / P, lo = p * hs;
  float* const gp = gpart + ((long)s * Hk + kh) * hidden;
  for (int i = tid; i < hs; i += blockDim.x) {
    float t = 0.f;
    for (int k = 0; k < P; ++k) t += cluster_ld(part + lo + i, k);
    gp[lo + i] = t;
  }
  cluster_sync();  // no block leaves while another may still read its part
  // Every block of the cluster has read the q and k taps (before its wait): block 0 shifts them.
  if (p == 0 && tid < 2 * DK) shift_taps(cs, c, C, K, tap, newest);
  __threadfence();
  __syncthreads();
  if (tid == 0) last[0] = atomicAdd(count + s * P + p, 1u) == static_cast<unsigned>(Hk - 1);
  __syncthreads();
  if (last[0]) {  // every key head's slice p is stored: their sum, in key head order
    __threadfence();
    for (int i = tid; i < hs; i += blockDim.x) {
      float t = 0.f;
      for (int k = 0; k < Hk; ++k) t += __ldcg(gpart + ((long)s * Hk + k) * hidden + lo + i);
      out[r * ldo + lo + i] = mk(t);
    }
    if (tid == 0) count[s * P + p] = 0u;
  }
}
#endif
