// Gated DeltaNet: conv + SiLU + l2-norm + gates (gdn_prep), conv-state update
// (gdn_conv_state), the fp32 delta-rule scan (gdn_scan, one warp per NC state columns), the
// gated RMSNorm epilogue (gdn_out), and a decode step's prep and scan in one launch
// (gdn_step).
//
// Layouts: conv state of one layer [slots, K-1, C] (activation type, oldest tap first);
// recurrent state of one layer [slots, Hv, dv, dk] fp32 (each value column contiguous over dk).
// Segment metadata: seg_slot[s], seg_row0[s], seg_rows[s]; per row: row_slot[r], row_tl[r].
#include "gdn_step.cuh"

// grid (R, 2*Hk + Hv + 1), 128 threads. Blocks [0, Hk) write normalised, scaled q heads,
// [Hk, 2Hk) normalised k heads, then v heads; the last block computes g and beta.
// upd (a decode step: every segment is one row): each thread also shifts the conv state of
// its own channel by one row, after reading it, so no gdn_conv_state pass is needed.
extern "C" __global__ void gdn_prep(const act_t* __restrict__ mixed, const float* __restrict__ conv_w,
                                    act_t* __restrict__ cstate, const act_t* __restrict__ a,
                                    const act_t* __restrict__ b, const float* __restrict__ A_log,
                                    const float* __restrict__ dt_bias, const int* __restrict__ row_slot,
                                    const int* __restrict__ row_tl, float* __restrict__ qo,
                                    float* __restrict__ ko, float* __restrict__ vo,
                                    float* __restrict__ go, float* __restrict__ bo, int Hk, int Hv,
                                    int dk, int dv, int K, int upd) {
  pdl_start();
  __shared__ float red[32];
  const int r = blockIdx.x, y = blockIdx.y, tid = threadIdx.x;
  const int KD = Hk * dk, VD = Hv * dv, C = 2 * KD + VD;
  if (y == 2 * Hk + Hv) {
    for (int h = tid; h < Hv; h += blockDim.x) {
      bo[(long)r * Hv + h] = sigmoid_f(ld(b + (long)r * Hv + h));
      float x = ld(a + (long)r * Hv + h) + dt_bias[h];
      float sp = x > 20.f ? x : log1pf(expf(x));
      go[(long)r * Hv + h] = -expf(A_log[h]) * sp;
    }
    return;
  }
  int c0, n;
  float* dst;
  float post = 1.f;
  bool norm = true;
  if (y < Hk) { c0 = y * dk; n = dk; dst = qo + (long)r * KD + y * dk; post = rsqrtf((float)dk); }
  else if (y < 2 * Hk) { c0 = KD + (y - Hk) * dk; n = dk; dst = ko + (long)r * KD + (y - Hk) * dk; }
  else { c0 = 2 * KD + (y - 2 * Hk) * dv; n = dv; dst = vo + (long)r * VD + (y - 2 * Hk) * dv; norm = false; }
  const int tl = row_tl[r];
  act_t* cs = cstate + (long)row_slot[r] * (K - 1) * C;
  float vals[4];
  float ss = 0.f;
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    int i = tid + u * blockDim.x;
    vals[u] = 0.f;
    if (i < n) {
      int c = c0 + i;
      float acc = 0.f;
      for (int j = 0; j < K; ++j) {
        int tau = tl - (K - 1) + j;
        float val = tau >= 0 ? ld(mixed + (long)(r - tl + tau) * C + c) : ld(cs + (long)(K - 1 + tau) * C + c);
        acc = fmaf(conv_w[(long)c * K + j], val, acc);
      }
      if (upd) {  // ascending: tap j + 1 is read before it is overwritten
        for (int j = 0; j + 2 < K; ++j) cs[(long)j * C + c] = cs[(long)(j + 1) * C + c];
        cs[(long)(K - 2) * C + c] = mixed[(long)r * C + c];
      }
      vals[u] = silu_f(acc);
      ss += vals[u] * vals[u];
    }
  }
  float scale = 1.f;
  if (norm) scale = rsqrtf(block_sum(ss, red) + 1e-6f) * post;
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    int i = tid + u * blockDim.x;
    if (i < n) dst[i] = vals[u] * scale;
  }
}

// grid (ceil(C/256), S), 256 threads: keep the last K-1 pre-conv inputs of each segment.
extern "C" __global__ void gdn_conv_state(const act_t* __restrict__ mixed, act_t* __restrict__ cstate,
                                          const int* __restrict__ seg_slot, const int* __restrict__ seg_row0,
                                          const int* __restrict__ seg_rows, int C, int K) {
  pdl_start();
  const int c = blockIdx.x * blockDim.x + threadIdx.x, s = blockIdx.y;
  if (c >= C) return;
  const int rows = seg_rows[s];
  const long row0 = seg_row0[s];
  act_t* cs = cstate + (long)seg_slot[s] * (K - 1) * C;
  for (int i = 0; i < K - 1; ++i) {  // ascending: reads index rows + i >= i before it is written
    int tau = rows - (K - 1) + i;
    act_t val = tau >= 0 ? mixed[(row0 + tau) * C + c] : cs[(long)(K - 1 + tau) * C + c];
    cs[(long)i * C + c] = val;
  }
}


// grid (Hv*dv / (NC*4), S), 128 threads (4 warps). dk = 128: each lane holds 4 entries of each
// of the warp's NC columns. Per token: S <- e^g S; d = beta (v - S^T k); S += k d^T; o = S^T q.
// KEEP (gdn_scan_keep, a drafting verify): the state after each of a segment's first keep_rows
// rows is also stored, at keep[slot][t] ([slots, keep_rows, Hv, dv, dk]), so that the slot can
// be rewound to any of them.
template <int NC, bool KEEP>
__device__ __forceinline__ void scan_rows(const float* __restrict__ q, const float* __restrict__ k,
                                          const float* __restrict__ v, const float* __restrict__ g,
                                          const float* __restrict__ beta, float* __restrict__ state,
                                          const int* __restrict__ seg_slot,
                                          const int* __restrict__ seg_row0,
                                          const int* __restrict__ seg_rows, float* __restrict__ o,
                                          int Hk, int Hv, int dv, float* __restrict__ keep,
                                          int keep_rows) {
  constexpr int DK = 128;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int col = (blockIdx.x * 4 + warp) * NC;
  const int h = col / dv, j0 = col % dv, s = blockIdx.y;
  const int kh = h / (Hv / Hk), rows = seg_rows[s];
  const long row0 = seg_row0[s];
  float4 S[NC];
  float* const sp = load_state<NC>(state, seg_slot[s], Hv, h, dv, j0, lane, S);
  const int KD = Hk * DK, VD = Hv * dv;
  for (int t = 0; t < rows; ++t) {
    const long r = row0 + t;
    float4 kk = reinterpret_cast<const float4*>(k + r * KD + kh * DK)[lane];
    float4 qq = reinterpret_cast<const float4*>(q + r * KD + kh * DK)[lane];
    float decay = expf(g[r * Hv + h]), bt = beta[r * Hv + h];
    float vj[NC], sk[NC], sq[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      vj[c] = v[r * VD + h * dv + j0 + c];
      sk[c] = warp_sum(dot4(S[c], kk));
      sq[c] = warp_sum(dot4(S[c], qq));
    }
    float kq = warp_sum(dot4(kk, qq));
    float out = 0.f;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      float delta = bt * (vj[c] - decay * sk[c]);
      S[c].x = fmaf(kk.x, delta, decay * S[c].x);
      S[c].y = fmaf(kk.y, delta, decay * S[c].y);
      S[c].z = fmaf(kk.z, delta, decay * S[c].z);
      S[c].w = fmaf(kk.w, delta, decay * S[c].w);
      float oc = decay * sq[c] + delta * kq;
      if (lane == c) out = oc;
    }
    if (lane < NC) o[r * VD + h * dv + j0 + lane] = out;
    if (KEEP && t < keep_rows) {
      const long kept = (long)seg_slot[s] * keep_rows + t;
      store_state<NC>(keep + ((kept * Hv + h) * dv + j0) * STEP_DK, S, lane);
    }
  }
  store_state<NC>(sp, S, lane);
}

template <int NC>
__global__ void __launch_bounds__(128)
gdn_scan(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
         const float* __restrict__ g, const float* __restrict__ beta, float* __restrict__ state,
         const int* __restrict__ seg_slot, const int* __restrict__ seg_row0,
         const int* __restrict__ seg_rows, float* __restrict__ o, int Hk, int Hv, int dv) {
  pdl_start();
  scan_rows<NC, false>(q, k, v, g, beta, state, seg_slot, seg_row0, seg_rows, o, Hk, Hv, dv,
                       nullptr, 0);
}

template <int NC>
__global__ void __launch_bounds__(128)
gdn_scan_keep(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
              const float* __restrict__ g, const float* __restrict__ beta,
              float* __restrict__ state, const int* __restrict__ seg_slot,
              const int* __restrict__ seg_row0, const int* __restrict__ seg_rows,
              float* __restrict__ o, int Hk, int Hv, int dv, float* __restrict__ keep,
              int keep_rows) {
  pdl_start();
  scan_rows<NC, true>(q, k, v, g, beta, state, seg_slot, seg_row0, seg_rows, o, Hk, Hv, dv,
                      keep, keep_rows);
}

// grid (R, Hv), 128 threads: y = rms(o) * w * silu(z) per value head.
extern "C" __global__ void gdn_out(const float* __restrict__ o, const act_t* __restrict__ z,
                                   const float* __restrict__ w, act_t* __restrict__ y, int Hv, int dv,
                                   float eps) {
  pdl_start();
  __shared__ float red[32];
  const long base = (long)blockIdx.x * Hv * dv + (long)blockIdx.y * dv;
  float ss = 0.f;
  for (int i = threadIdx.x; i < dv; i += blockDim.x) { float x = o[base + i]; ss += x * x; }
  float inv = rsqrtf(block_sum(ss, red) / dv + eps);
  for (int i = threadIdx.x; i < dv; i += blockDim.x)
    st(y + base + i, o[base + i] * inv * w[i] * silu_f(ld(z + base + i)));
}

// A decode step of one DeltaNet layer in one launch: gdn_prep and gdn_scan for one row per
// segment. grid (Hk, S), (Hv/Hk)*dv/NC warps (at most 32): the block takes one key head, its
// Hv/Hk value heads and all their value columns, so it is the only reader of every conv-state
// channel it uses and can shift them in place, and its recurrent state is requested before
// the wait for the previous kernel, with everything else no earlier kernel of this step writes
// (the conv taps and their weights, the gate parameters). Needs dk = 128, K <= 4 and
// 2*128 + (Hv/Hk)*dv + Hv/Hk <= threads. `ahead` (null: none): the blocks also bring
// [ahead, ahead + ahead_bytes), the next projection's weights, toward L2 before the wait,
// while memory is otherwise idle (the step reads little beside its state), then likewise
// ahead2 and ahead3 (the heads of the MLP's gate and up codes; launch.ahead_spans).
// The arithmetic is gdn_prep's and gdn_scan's: the states come out bit for bit the same, the
// outputs to rounding (the delta rule takes one column at a time here).
template <int NC>
__global__ void __launch_bounds__(1024)
gdn_step(const act_t* __restrict__ mixed, const float* __restrict__ conv_w, act_t* __restrict__ cstate,
         const act_t* __restrict__ a, const act_t* __restrict__ b, const float* __restrict__ A_log,
         const float* __restrict__ dt_bias, float* __restrict__ state, const int* __restrict__ seg_slot,
         const int* __restrict__ seg_row0, float* __restrict__ o, int Hk, int Hv, int dv, int K,
         const unsigned char* __restrict__ ahead, long long ahead_bytes,
         const unsigned char* __restrict__ ahead2, long long bytes2,
         const unsigned char* __restrict__ ahead3, long long bytes3) {
  constexpr int DK = STEP_DK, MAXC = 256, MAXG = 8;
  __shared__ float sq[DK], sk[DK], sv[MAXC], sg[MAXG], sb[MAXG], red[32];
  const int kh = blockIdx.x, s = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gv = Hv / Hk, cols = gv * dv, KD = Hk * DK, VD = Hv * dv, C = 2 * KD + VD;
  const long r = seg_row0[s];
  const int slot = seg_slot[s];
  // This warp's NC columns: value head h, columns j0.. of it.
  const int col = warp * NC, h = kh * gv + col / dv, j0 = col % dv;
  float4 S[NC];
  float* const sp = load_state<NC>(state, slot, Hv, h, dv, j0, lane, S);
  // This thread's conv channel c: its K weights and K-1 older taps (the previous step's
  // gdn_step wrote them); or, for the gate threads, the head's A_log and dt_bias.
  const bool conv = tid < 2 * DK + cols, gate = !conv && tid < 2 * DK + cols + gv;
  const int c = step_channel(tid, kh, KD, kh * cols);
  const int hh = tid - 2 * DK - cols, hg = kh * gv + hh;
  act_t* cs = cstate + (long)slot * (K - 1) * C;
  float wk[STEP_MAXK - 1], tap[STEP_MAXK - 1], a_log = 0.f, dtb = 0.f;
  const float wnew = conv_taps(conv, c, K, C, conv_w, cs, wk, tap);
  if (gate) {
    a_log = A_log[hg];
    dtb = dt_bias[hg];
  }
  prefetch_ahead(ahead, ahead_bytes, ahead2, bytes2, ahead3, bytes3, blockIdx.x + blockIdx.y * gridDim.x,
                 gridDim.x * gridDim.y);
  pdl_start();

  // Conv (K taps: K-1 from the state, the newest from mixed) + SiLU for q, k and v channels.
  float val = 0.f;
  if (conv) {
    const act_t newest = mixed[r * C + c];
    const float acc = conv_acc(wk, tap, wnew, newest, K);
    shift_taps(cs, c, C, K, tap, newest);
    val = silu_f(acc);
  } else if (gate) {
    step_gates(a, b, r * Hv + hg, a_log, dtb, sg[hh], sb[hh]);
  }
  stage_qkv(val, tid, lane, warp, cols, red, sq, sk, sv);

  // The delta-rule step for this warp's columns (gdn_scan with one row).
  const float decay = expf(sg[col / dv]), bt = sb[col / dv];
  const float out = delta_columns<NC>(S, sq, sk, sv + col, decay, bt, lane);
  if (lane < NC) o[r * VD + h * dv + j0 + lane] = out;
  store_state<NC>(sp, S, lane);
}

// A verify's conv history: channel c's K-1 taps the verify started from, then each of its
// rows' newest taps (verify_rows.py's history, [slots, taps + rows, C] for this layer), so a
// rewind to any row finds the conv state there.
__device__ __forceinline__ void record_taps(act_t* hs, int c, int C, int K, const float (&tap)[STEP_MAXK - 1]) {
#pragma unroll
  for (int j = 0; j + 1 < STEP_MAXK; ++j)
    if (j + 1 < K) hs[(long)j * C + c] = mk(tap[j]);
}

// The taps after a row: the older ones down by one, the newest last (registers only).
__device__ __forceinline__ void shift_regs(float (&tap)[STEP_MAXK - 1], int K, act_t newest) {
#pragma unroll
  for (int j = 0; j + 2 < STEP_MAXK; ++j)
    if (j + 2 < K) tap[j] = tap[j + 1];
#pragma unroll
  for (int j = 0; j + 1 < STEP_MAXK; ++j)
    if (j == K - 2) tap[j] = cv(newest);
}

// Channel c's taps written back to the conv state.
__device__ __forceinline__ void store_taps(act_t* cs, int c, int C, int K, const float (&tap)[STEP_MAXK - 1]) {
#pragma unroll
  for (int j = 0; j + 1 < STEP_MAXK; ++j)
    if (j + 1 < K) cs[(long)j * C + c] = mk(tap[j]);
}

// A verify's row t for conv channel c: the newest tap into the history (where this thread
// owns the channel), the taps shifted in registers; returns the conv output after SiLU.
__device__ __forceinline__ float verify_conv(const act_t* __restrict__ mixed, long r, int t, int c, int C, int K,
                                             const float (&wk)[STEP_MAXK - 1], float (&tap)[STEP_MAXK - 1],
                                             float wnew, act_t* hs, bool owns) {
  const act_t newest = mixed[r * C + c];
  const float acc = conv_acc(wk, tap, wnew, newest, K);
  if (owns) hs[(long)(K - 1 + t) * C + c] = newest;
  shift_regs(tap, K, newest);
  return silu_f(acc);
}

// The state after a verify's row t, kept where t is among the first keep_rows rows.
template <int NC>
__device__ __forceinline__ void keep_row(float* keep, int keep_rows, int slot, int t, int Hv, int h, int dv, int j0,
                                         const float4 (&S)[NC], int lane) {
  if (t < keep_rows) {
    const long kept = (long)slot * keep_rows + t;
    store_state<NC>(keep + ((kept * Hv + h) * dv + j0) * STEP_DK, S, lane);
  }
}

// A drafting verify's DeltaNet layer in one launch: gdn_step for each row of a segment in
// turn (the recurrent state and the conv taps carried in registers from row to row), with
// the state after each of the first keep_rows rows stored at keep[slot][t] ([slots,
// keep_rows, Hv, dv, dk]) as gdn_scan_keep stores it, and the conv history at hist[slot]
// ([slots, hist_rows, C]: record_taps). Row by row it is gdn_step's arithmetic, so a
// verify's rows come out as the decode steps that would have fed them one at a time.
// grid (Hk, S) and threads as gdn_step.
template <int NC>
__global__ void __launch_bounds__(1024)
gdn_step_keep(const act_t* __restrict__ mixed, const float* __restrict__ conv_w, act_t* __restrict__ cstate,
              const act_t* __restrict__ a, const act_t* __restrict__ b, const float* __restrict__ A_log,
              const float* __restrict__ dt_bias, float* __restrict__ state, const int* __restrict__ seg_slot,
              const int* __restrict__ seg_row0, const int* __restrict__ seg_rows, float* __restrict__ o,
              int Hk, int Hv, int dv, int K, float* __restrict__ keep, int keep_rows,
              act_t* __restrict__ hist, int hist_rows) {
  constexpr int DK = STEP_DK, MAXC = 256, MAXG = 8;
  __shared__ float sq[DK], sk[DK], sv[MAXC], sg[MAXG], sb[MAXG], red[32];
  const int kh = blockIdx.x, s = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gv = Hv / Hk, cols = gv * dv, KD = Hk * DK, VD = Hv * dv, C = 2 * KD + VD;
  const int slot = seg_slot[s], rows = seg_rows[s];
  const int col = warp * NC, h = kh * gv + col / dv, j0 = col % dv;
  float4 S[NC];
  float* const sp = load_state<NC>(state, slot, Hv, h, dv, j0, lane, S);
  const bool conv = tid < 2 * DK + cols, gate = !conv && tid < 2 * DK + cols + gv;
  const int c = step_channel(tid, kh, KD, kh * cols);
  const int hh = tid - 2 * DK - cols, hg = kh * gv + hh;
  act_t* cs = cstate + (long)slot * (K - 1) * C;
  act_t* hs = hist + (long)slot * hist_rows * C;
  float wk[STEP_MAXK - 1], tap[STEP_MAXK - 1], a_log = 0.f, dtb = 0.f;
  const float wnew = conv_taps(conv, c, K, C, conv_w, cs, wk, tap);
  if (gate) {
    a_log = A_log[hg];
    dtb = dt_bias[hg];
  }
  pdl_start();
  if (conv) record_taps(hs, c, C, K, tap);

  for (int t = 0; t < rows; ++t) {
    const long r = seg_row0[s] + t;
    float val = 0.f;
    if (conv) {
      val = verify_conv(mixed, r, t, c, C, K, wk, tap, wnew, hs, true);
    } else if (gate) {
      step_gates(a, b, r * Hv + hg, a_log, dtb, sg[hh], sb[hh]);
    }
    stage_qkv(val, tid, lane, warp, cols, red, sq, sk, sv);
    const float decay = expf(sg[col / dv]), bt = sb[col / dv];
    const float out = delta_columns<NC>(S, sq, sk, sv + col, decay, bt, lane);
    if (lane < NC) o[r * VD + h * dv + j0 + lane] = out;
    keep_row<NC>(keep, keep_rows, slot, t, Hv, h, dv, j0, S, lane);
    __syncthreads();  // every warp is done with this row's q, k, v and gates
  }
  store_state<NC>(sp, S, lane);
  if (conv) store_taps(cs, c, C, K, tap);
}

// gdn_step spread over P blocks a key head, one thread block cluster (compute capability
// 9.0): block p takes value columns [p * cb, (p + 1) * cb) of the key head's Hv/Hk value heads
// (cb = (Hv/Hk) * dv / P, inside one head), so the recurrent state, the step's largest read
// and write, spreads over P SMs instead of one. Every block convolves the key head's q and k
// channels itself (256 of them) and its own v channels; it shifts its v channels' conv taps
// in place, and block 0 shifts the q and k taps once every block of the cluster has read them
// (barrier.cluster at the end). grid (Hk * P, S), cb / NC warps; needs dk = 128, K <= 4,
// dv % cb == 0, cb % NC == 0 and 2 * 128 + cb + 1 <= threads. Same arithmetic as gdn_step.
#if __CUDA_ARCH__ >= 900
template <int NC, int P>
__global__ void __cluster_dims__(P, 1, 1) __launch_bounds__(1024)
gdn_step_split(const act_t* __restrict__ mixed, const float* __restrict__ conv_w,
               act_t* __restrict__ cstate, const act_t* __restrict__ a, const act_t* __restrict__ b,
               const float* __restrict__ A_log, const float* __restrict__ dt_bias,
               float* __restrict__ state, const int* __restrict__ seg_slot,
               const int* __restrict__ seg_row0, float* __restrict__ o, int Hk, int Hv, int dv, int K,
               const unsigned char* __restrict__ ahead, long long ahead_bytes,
               const unsigned char* __restrict__ ahead2, long long bytes2,
               const unsigned char* __restrict__ ahead3, long long bytes3) {
  constexpr int DK = STEP_DK, MAXC = 256;
  __shared__ float sq[DK], sk[DK], sv[MAXC], sgb[2], red[32];
  const int p = blockIdx.x % P, kh = blockIdx.x / P, s = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gv = Hv / Hk, cols = gv * dv, cb = cols / P, KD = Hk * DK, VD = Hv * dv, C = 2 * KD + VD;
  const long r = seg_row0[s];
  const int slot = seg_slot[s];
  // This warp's NC columns (of the key head's value columns): value head h, columns j0..
  const int col = p * cb + warp * NC, h = kh * gv + col / dv, j0 = col % dv;
  float4 S[NC];
  float* const sp = load_state<NC>(state, slot, Hv, h, dv, j0, lane, S);
  const bool conv = tid < 2 * DK + cb, gate = tid == 2 * DK + cb;
  const int c = step_channel(tid, kh, KD, kh * cols + p * cb);
  const int hg = kh * gv + p * cb / dv;  // the one value head of this block's columns
  act_t* cs = cstate + (long)slot * (K - 1) * C;
  float wk[STEP_MAXK - 1], tap[STEP_MAXK - 1], a_log = 0.f, dtb = 0.f;
  const float wnew = conv_taps(conv, c, K, C, conv_w, cs, wk, tap);
  if (gate) {
    a_log = A_log[hg];
    dtb = dt_bias[hg];
  }
  prefetch_ahead(ahead, ahead_bytes, ahead2, bytes2, ahead3, bytes3, blockIdx.x + blockIdx.y * gridDim.x,
                 gridDim.x * gridDim.y);
  pdl_start();

  float val = 0.f;
  act_t newest = mk(0.f);
  if (conv) {
    newest = mixed[r * C + c];
    const float acc = conv_acc(wk, tap, wnew, newest, K);
    if (tid >= 2 * DK) shift_taps(cs, c, C, K, tap, newest);  // this block's own v channels
    val = silu_f(acc);
  } else if (gate) {
    step_gates(a, b, r * Hv + hg, a_log, dtb, sgb[0], sgb[1]);
  }
  stage_qkv(val, tid, lane, warp, cb, red, sq, sk, sv);

  const float decay = expf(sgb[0]), bt = sgb[1];
  const float out = delta_columns<NC>(S, sq, sk, sv + warp * NC, decay, bt, lane);
  if (lane < NC) o[r * VD + h * dv + j0 + lane] = out;
  store_state<NC>(sp, S, lane);
  // Every block of the cluster has read the q and k taps (before its wait): block 0 shifts them.
  // Those reads have returned (their values went into this step's conv), so the barrier
  // needs no memory ordering: a releasing arrive would first wait for every store above
  // (the state's) to reach memory, a round trip on each block's way out.
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
  if (p == 0 && tid < 2 * DK) shift_taps(cs, c, C, K, tap, newest);
}

// gdn_step_keep over gdn_step_split's cluster of P blocks a key head: the verify's rows in
// turn, each as gdn_step_split computes it, the conv taps in registers from row to row.
// Every block writes its own v channels' taps and history; block 0 the q and k channels'
// (their taps once every block of the cluster has read them). grid (Hk * P, S), threads as
// gdn_step_split; keep and hist as gdn_step_keep.
template <int NC, int P>
__global__ void __cluster_dims__(P, 1, 1) __launch_bounds__(1024)
gdn_step_split_keep(const act_t* __restrict__ mixed, const float* __restrict__ conv_w,
                    act_t* __restrict__ cstate, const act_t* __restrict__ a, const act_t* __restrict__ b,
                    const float* __restrict__ A_log, const float* __restrict__ dt_bias,
                    float* __restrict__ state, const int* __restrict__ seg_slot,
                    const int* __restrict__ seg_row0, const int* __restrict__ seg_rows,
                    float* __restrict__ o, int Hk, int Hv, int dv, int K, float* __restrict__ keep,
                    int keep_rows, act_t* __restrict__ hist, int hist_rows) {
  constexpr int DK = STEP_DK, MAXC = 256;
  __shared__ float sq[DK], sk[DK], sv[MAXC], sgb[2], red[32];
  const int p = blockIdx.x % P, kh = blockIdx.x / P, s = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gv = Hv / Hk, cols = gv * dv, cb = cols / P, KD = Hk * DK, VD = Hv * dv, C = 2 * KD + VD;
  const int slot = seg_slot[s], rows = seg_rows[s];
  const int col = p * cb + warp * NC, h = kh * gv + col / dv, j0 = col % dv;
  float4 S[NC];
  float* const sp = load_state<NC>(state, slot, Hv, h, dv, j0, lane, S);
  const bool conv = tid < 2 * DK + cb, gate = tid == 2 * DK + cb;
  const bool owns = conv && (tid >= 2 * DK || p == 0);  // writes this channel's taps and history
  const int c = step_channel(tid, kh, KD, kh * cols + p * cb);
  const int hg = kh * gv + p * cb / dv;
  act_t* cs = cstate + (long)slot * (K - 1) * C;
  act_t* hs = hist + (long)slot * hist_rows * C;
  float wk[STEP_MAXK - 1], tap[STEP_MAXK - 1], a_log = 0.f, dtb = 0.f;
  const float wnew = conv_taps(conv, c, K, C, conv_w, cs, wk, tap);
  if (gate) {
    a_log = A_log[hg];
    dtb = dt_bias[hg];
  }
  pdl_start();
  if (owns) record_taps(hs, c, C, K, tap);

  for (int t = 0; t < rows; ++t) {
    const long r = seg_row0[s] + t;
    float val = 0.f;
    if (conv) {
      val = verify_conv(mixed, r, t, c, C, K, wk, tap, wnew, hs, owns);
    } else if (gate) {
      step_gates(a, b, r * Hv + hg, a_log, dtb, sgb[0], sgb[1]);
    }
    stage_qkv(val, tid, lane, warp, cb, red, sq, sk, sv);
    const float decay = expf(sgb[0]), bt = sgb[1];
    const float out = delta_columns<NC>(S, sq, sk, sv + warp * NC, decay, bt, lane);
    if (lane < NC) o[r * VD + h * dv + j0 + lane] = out;
    keep_row<NC>(keep, keep_rows, slot, t, Hv, h, dv, j0, S, lane);
    __syncthreads();  // every warp is done with this row's q, k, v and gates
  }
  store_state<NC>(sp, S, lane);
  if (conv && tid >= 2 * DK) store_taps(cs, c, C, K, tap);
  // Every block of the cluster has read the q and k taps (before its wait): block 0 writes them
  // (no memory ordering needed, as in gdn_step_split).
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
  if (p == 0 && tid < 2 * DK) store_taps(cs, c, C, K, tap);
}
#endif
