// RMSNorm (weight already 1 + w, fp32), the residual add fused with the next norm, SwiGLU.
#include "common.cuh"

// One block per row. y = x / sqrt(mean(x^2) + eps) * w.
extern "C" __global__ void rms_norm(const act_t* __restrict__ x, const float* __restrict__ w,
                                    act_t* __restrict__ y, int n, float eps) {
  pdl_start();
  __shared__ float red[32];
  const act_t* xr = x + (long)blockIdx.x * n;
  float ss = 0.f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) { float v = ld(xr + j); ss += v * v; }
  float inv = rsqrtf(block_sum(ss, red) / n + eps);
  act_t* yr = y + (long)blockIdx.x * n;
  for (int j = threadIdx.x; j < n; j += blockDim.x) st(yr + j, ld(xr + j) * inv * w[j]);
}

// h = x + d (rounded to the activation type, as the residual stream is stored);
// y = rms_norm(h) * w. One block per row.
extern "C" __global__ void add_rms_norm(const act_t* __restrict__ x, const act_t* __restrict__ d,
                                        const float* __restrict__ w, act_t* __restrict__ y,
                                        act_t* __restrict__ h, int n, float eps) {
  pdl_start();
  __shared__ float red[32];
  const long base = (long)blockIdx.x * n;
  float ss = 0.f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    act_t hv = mk(ld(x + base + j) + ld(d + base + j));
    h[base + j] = hv;
    float v = cv(hv);
    ss += v * v;
  }
  float inv = rsqrtf(block_sum(ss, red) / n + eps);
  for (int j = threadIdx.x; j < n; j += blockDim.x) st(y + base + j, cv(h[base + j]) * inv * w[j]);
}

// y = silu(g) * u, elementwise over n values (g and u may have row strides: ld).
extern "C" __global__ void swiglu(const act_t* __restrict__ g, const act_t* __restrict__ u,
                                  act_t* __restrict__ y, long n) {
  pdl_start();
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
    st(y + i, silu_f(ld(g + i)) * ld(u + i));
}
