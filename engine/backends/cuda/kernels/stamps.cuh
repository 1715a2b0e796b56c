// Diagnostics for tools/profile_step.py --stamps, compiled in only with -DSNUG_STAMPS: thread
// 0 of every block of a projection notes the global time (ns) at entry, when the previous kernel's
// outputs became readable, when its activations were staged, after its first tile's products
// and at exit, and appends them with the weight pointer and shape as one record of 8 words.
#pragma once
#ifdef SNUG_STAMPS
#define SNUG_STAMP_RECORDS (1 << 16)
__device__ unsigned long long snug_stamps[SNUG_STAMP_RECORDS * 8];
__device__ unsigned snug_nstamps;

__device__ __forceinline__ unsigned long long snug_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__shared__ unsigned long long snug_t[5];  // in shared memory: no registers held

struct Stamps {
  __device__ __forceinline__ void at(int i, int tid) {
    if (tid == 0) snug_t[i] = snug_now();
  }
  __device__ __forceinline__ void write(const void* w, int out, int in, unsigned flags, int tid) {
    if (tid != 0) return;
    snug_t[4] = snug_now();
    const unsigned i = atomicAdd(&snug_nstamps, 1u);
    if (i >= SNUG_STAMP_RECORDS) return;
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    unsigned long long* r = snug_stamps + 8ull * i;
    r[0] = reinterpret_cast<unsigned long long>(w);
    r[1] = (static_cast<unsigned long long>(out) << 32) | static_cast<unsigned>(in);
    r[2] = (static_cast<unsigned long long>(flags) << 40) | (static_cast<unsigned long long>(smid) << 24) |
           blockIdx.x;
    for (int k = 0; k < 5; ++k) r[3 + k] = snug_t[k];
  }
};
#else
struct Stamps {
  __device__ __forceinline__ void at(int, int) {}
  __device__ __forceinline__ void write(const void*, int, int, unsigned, int) {}
};
#endif
