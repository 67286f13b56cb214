/* One check after every CUDA runtime call (CUDA sources only): a failure becomes
 * QD_ERR_DEVICE with a message naming the call, the file and the line. */
#ifndef QD_CUDA_CHECK_H
#define QD_CUDA_CHECK_H

#include <cuda_runtime.h>
#include <stdint.h>
extern "C" {
#include "quant/status.h"
}

#define QD_CUDA_CHECK(call)                                                          \
    do {                                                                             \
        cudaError_t qd_cuda_err_ = (call);                                           \
        if (qd_cuda_err_ != cudaSuccess)                                             \
            return qd_error(QD_ERR_DEVICE, "%s:%d: %s: %s", __FILE__, __LINE__,      \
                            #call, cudaGetErrorString(qd_cuda_err_));                \
    } while (0)

/* Whether p starts on a multiple of n bytes (a power of two): the 16-byte
 * loads of the vectorized kernels, cuBLAS's pointer arrays. */
static inline int qd_aligned(const void *p, unsigned n) { return ((uintptr_t)p & (n - 1)) == 0; }

/* The current device's SM count (132 where it cannot be read), cached per
 * translation unit: launch shapes that fill the GPU. */
static inline int qd_sm_count(void)
{
    static int n;
    if (!n) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
            n = 132;
    }
    return n;
}

#endif
