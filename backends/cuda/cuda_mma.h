/* backends/cuda: the shared-memory helpers of the tensor-core kernels
 * (cuda_grouped.cu, cuda_flash.cu, cuda_bfp.cu): a generic pointer's shared
 * address, a 16-byte cp.async copy, and ldmatrix's four 8 x 8 matrices of
 * 16-bit elements (plain and transposed). CUDA sources only. */
#ifndef QD_CUDA_MMA_H
#define QD_CUDA_MMA_H

#include <stdint.h>
#include <cuda_runtime.h>

static __device__ __forceinline__ unsigned smem_u32(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, zero-filled where !valid (src then unread) */
static __device__ __forceinline__ void cp16(void *dst, const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}

/* 4 bytes global -> shared, zero-filled where !valid (src then unread) */
static __device__ __forceinline__ void cp4(void *dst, const void *src, bool valid)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_u32(dst)), "l"(src), "r"(valid ? 4 : 0));
}

static __device__ __forceinline__ void ldm_x4(uint32_t r[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

static __device__ __forceinline__ void ldm_x4_t(uint32_t r[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

#endif
