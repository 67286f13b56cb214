/* For the standalone CUDA programs only (tests/gpu/, bench/), never library
 * code: a failed CUDA runtime call or qd_status call prints the call, the file
 * and the line (and the status and qd_last_error) and exits with status 2. */
#ifndef QD_CUDA_DIE_H
#define QD_CUDA_DIE_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
extern "C" {
#include "quant/status.h"
}

#define QD_CUDA_DIE(call)                                                                   \
    do {                                                                                    \
        cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess) {                                                            \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                   \
                    cudaGetErrorString(e_));                                                \
            exit(2);                                                                        \
        }                                                                                   \
    } while (0)

#define QD_STATUS_DIE(call)                                                                 \
    do {                                                                                    \
        qd_status s_ = (call);                                                              \
        if (s_ != QD_OK) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call,               \
                    qd_status_str(s_), qd_last_error());                                    \
            exit(2);                                                                        \
        }                                                                                   \
    } while (0)

#endif
