/* backends/cuda/cuda_rows.cuh: device functions of row kernels shared by
 * cuda_kernels.cu (the norms) and cuda_quant.cu (the norms fused with the
 * activation quantizer): RMSNorm's sum of squares in the warp order. */
#ifndef QD_CUDA_ROWS_CUH
#define QD_CUDA_ROWS_CUH

#include "backends/exact_math.h"

/* The sum of squares of a row in the warp order (docs/numerics.md section 6,
 * the CPU's rmsnorm_forward): lane j adds x_i * x_i for i = j, j + 32, ...
 * ascending, then the lanes pairwise halving (lane j + lane j + h, h = 16, 8,
 * 4, 2, 1: shfl_down). x (C floats) in shared memory; lane 0 gets the sum. */
static __device__ __forceinline__ float rms_warp_sumsq(const float *x, int C, int lane)
{
    float s = 0.0f;
    int i = lane;
    for (; i + 32 * 7 < C; i += 32 * 8) { /* 8 loads in flight, the adds in order */
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; u++)
            v[u] = x[i + 32 * u];
#pragma unroll
        for (int u = 0; u < 8; u++)
            s = s + v[u] * v[u];
    }
    for (; i < C; i += 32)
        s = s + x[i] * x[i];
#pragma unroll
    for (int h = 16; h > 0; h /= 2)
        s = s + __shfl_down_sync(0xffffffffu, s, h);
    return s;
}

/* A block's row x (C, shared memory, complete): warp 0 adds its squares
 * (rms_warp_sumsq), thread 0 writes r = rsqrt(ss / C + eps) to *rstd; every
 * thread gets r. */
static __device__ __forceinline__ float rms_block_rstd(const float *xs, int C, float eps, float *rstd)
{
    __shared__ float r_sh;
    if (threadIdx.x < 32) {
        float ss = rms_warp_sumsq(xs, C, threadIdx.x);
        if (threadIdx.x == 0) {
            r_sh = qd_rsqrtf(ss / (float)C + eps);
            *rstd = r_sh;
        }
    }
    __syncthreads();
    return r_sh;
}

#endif
