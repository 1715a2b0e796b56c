// Diagnostics for tools/profile_step.py --stamps, compiled in only with -DSNUG_STAMPS: thread
// 0 of every block of a projection notes the global time (ns) at entry (0), when the previous
// kernel's outputs became readable (1), when its activations were staged (2), after its first
// tile's products (3), at exit (4), when the prologue's barrier let the staging start (5), and
// when its own first staged entry was loaded and folded (6), and appends them with the weight
// pointer, shape and the caller's flags (gemv4.cu: prologue and variant) as one record of 10
// words.
#pragma once
#ifdef SNUG_STAMPS
#define SNUG_STAMP_RECORDS (1 << 16)
#define SNUG_STAMP_CLOCKS 7
#define SNUG_STAMP_WORDS (3 + SNUG_STAMP_CLOCKS)  // weight, shape, flags | SM | block; clocks
__device__ unsigned long long snug_stamps[SNUG_STAMP_RECORDS * SNUG_STAMP_WORDS];
__device__ unsigned snug_nstamps;

__device__ __forceinline__ unsigned long long snug_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__shared__ unsigned long long snug_t[SNUG_STAMP_CLOCKS];  // in shared memory: no registers held

__shared__ unsigned snug_dep;

// Stamp i once `dep` (a value computed from loaded data) is there: the store of dep before
// the clock read waits for it (an operand the read only names would not make it wait: a
// plain input's first entry read 0.2 us that way, where its load takes 0.4 to 1.4).
__device__ __forceinline__ void stamp_after(int i, unsigned dep) {
  unsigned long long t;
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(&snug_dep));
  asm volatile("st.shared.u32 [%1], %2;\n\tmov.u64 %0, %%globaltimer;" : "=l"(t) : "r"(a), "r"(dep) : "memory");
  snug_t[i] = t;
}

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
    unsigned long long* r = snug_stamps + (unsigned long long)SNUG_STAMP_WORDS * i;
    r[0] = reinterpret_cast<unsigned long long>(w);
    r[1] = (static_cast<unsigned long long>(out) << 32) | static_cast<unsigned>(in);
    r[2] = (static_cast<unsigned long long>(flags) << 40) | (static_cast<unsigned long long>(smid) << 24) |
           blockIdx.x;
    for (int k = 0; k < SNUG_STAMP_CLOCKS; ++k) r[3 + k] = snug_t[k];
  }
};
#else
__device__ __forceinline__ void stamp_after(int, unsigned) {}
struct Stamps {
  __device__ __forceinline__ void at(int, int) {}
  __device__ __forceinline__ void write(const void*, int, int, unsigned, int) {}
};
#endif
