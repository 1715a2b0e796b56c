// Tensor-core building blocks shared by the mma kernels (sm_80 and newer): cp.async copies,
// ldmatrix loads, mma m16n8k16 with fp32 accumulation in the activation type (bf16, or fp16
// where ACT_KIND is 1), and the packing of two floats into one register of that type.
#pragma once
#include "common.cuh"

#if ACT_KIND == 1
#define PF_MMA "f16"
#define PF_CVT "cvt.rn.f16x2.f32"
#else
#define PF_MMA "bf16"
#define PF_CVT "cvt.rn.bf16x2.f32"
#endif

__device__ __forceinline__ unsigned pf_smem(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; `bytes` 0 writes zeros (cp.async's source size).
__device__ __forceinline__ void pf_copy(unsigned dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void pf_ldsm(unsigned* r, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void pf_ldsm_t(unsigned* r, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void pf_mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PF_MMA "." PF_MMA ".f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as one register of two 16-bit values, `lo` in the low half.
__device__ __forceinline__ unsigned pf_pack(float lo, float hi) {
  unsigned r;
  asm(PF_CVT " %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
