/* One check after every CUDA runtime call (CUDA sources only): a failure becomes
 * QD_ERR_DEVICE with a message naming the call, the file and the line. */
#ifndef QD_CUDA_CHECK_H
#define QD_CUDA_CHECK_H

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
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

/* Bumped wherever the backend frees a device buffer that a recorded step
 * graph (ops.h graph_begin) may read: a recording made before is not run. */
extern unsigned long qd_cuda_buf_gen;

/* Whether this thread's default stream (every op's: Makefile.am's
 * --default-stream per-thread) is being recorded into a graph. */
static inline bool qd_cuda_recording(void)
{
    cudaStreamCaptureStatus s = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(cudaStreamPerThread, &s) == cudaSuccess && s != cudaStreamCaptureStatusNone;
}

/* What an op does not do while recording (a copy to or from the host, an
 * allocation, a free): it returns QD_ERR_UNSUPPORTED (no message), the
 * recording fails, and qd_cuda_refused names the function (the log of
 * QUADS_CUDA_GRAPH=1). */
extern const char *qd_cuda_refused;
#define QD_REFUSE_RECORDING()                                                        \
    do {                                                                             \
        if (qd_cuda_recording()) {                                                   \
            qd_cuda_refused = __func__;                                              \
            return QD_ERR_UNSUPPORTED;                                               \
        }                                                                            \
    } while (0)

/* Programmatic dependent launch (QUADS_PDL=1, Hopper and later). Every
 * kernel of the backend starts with QD_PDL_ENTRY: griddepcontrol.wait (until
 * the kernel before it on the stream has finished and its writes are
 * visible; at once after an ordinary launch), then launch_dependents (the
 * next kernel's CTAs may be launched now). qd_launch launches with the
 * attribute that lets a kernel start before its predecessor ends, so the
 * next kernel's launch and its CTAs' start overlap this one's tail (in a
 * recorded step graph too) instead of following it. Nothing a kernel reads
 * or writes comes before its wait, so the bits are those of ordinary
 * launches; tests/pdl_entry.sh checks that every __global__ function of
 * backends/cuda starts with the macro (a kernel launched early without the
 * wait would race its predecessor). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define QD_PDL_ENTRY() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define QD_PDL_ENTRY() ((void)0)
#endif

/* Whether launches take the attribute: QUADS_PDL=1 on a device of compute
 * capability 9 or more (read once a translation unit). */
static inline bool qd_pdl_on(void)
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("QUADS_PDL");
        int dev = 0, major = 0;
        on = e && e[0] == '1' && !e[1] && cudaGetDevice(&dev) == cudaSuccess &&
             cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
    }
    return on == 1;
}

/* The kernel's own parameter types, not deduced from the call (so that NULL
 * or 0 converts to the pointer the kernel takes, as with <<< >>>). */
template <typename T> struct qd_same {
    typedef T type;
};

/* kernel<<<grid, block, smem>>>(args...) on this thread's default stream,
 * with programmatic stream serialization where qd_pdl_on(); a failure is
 * left for the caller's cudaGetLastError, as a <<< >>> launch's is. */
template <typename... KArgs>
static inline void qd_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                             typename qd_same<KArgs>::type... args)
{
    if (!qd_pdl_on()) {
        kernel<<<grid, block, smem>>>(args...);
        return;
    }
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = cudaStreamPerThread;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    (void)cudaLaunchKernelEx(&cfg, kernel, args...);
}

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

/* A kernel-choice switch read once from the environment into *cache: a or b
 * where the variable is that number, else -1 (unset or anything else). */
static inline int qd_env_pick(int *cache, const char *name, int a, int b)
{
    if (*cache == -2) {
        const char *e = getenv(name);
        int v = e && e[0] && !e[1] ? e[0] - '0' : -1;
        *cache = v == a || v == b ? v : -1;
    }
    return *cache;
}

/* QUADS_FR_ILP=1 (opt-in until timed): the fused rows kernels of
 * cuda_quant.cu and cuda_kernels.cu with a row's loads issued together (read
 * once a translation unit). */
static inline bool qd_fr_ilp(void)
{
    static int env = -2;
    return qd_env_pick(&env, "QUADS_FR_ILP", 0, 1) == 1;
}

/* A 0/1 kernel-choice switch with a program override: forced where it is 0
 * or 1 (tests and benchmarks set it), else as the variable says (0 or 1),
 * else -1 (unset: the caller's default). */
static inline int qd_switch(int forced, int *cache, const char *name)
{
    return forced >= 0 ? forced : qd_env_pick(cache, name, 0, 1);
}

/* The inclusive prefix sum of v over a full warp's lanes (lane: this
 * thread's), by shuffles: integers, so any order gives the same sums. */
static __device__ __forceinline__ int qd_warp_incl_sum(int v, int lane)
{
    for (int o = 1; o < 32; o *= 2) {
        int u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o)
            v += u;
    }
    return v;
}

/* The sum from 0 of p[0] .. p[n-1] in ascending order, one add at a time (the
 * chains of the decode kernels; p 16-byte aligned, read 4 floats at a time). */
static __device__ __forceinline__ float qd_sum_up(const float *p, int n)
{
    const float4 *q = (const float4 *)p;
    float acc = 0.0f;
#pragma unroll 4
    for (int u = 0; u < n / 4; u++) {
        float4 v = q[u];
        acc = acc + v.x;
        acc = acc + v.y;
        acc = acc + v.z;
        acc = acc + v.w;
    }
    for (int k = n / 4 * 4; k < n; k++)
        acc = acc + p[k];
    return acc;
}

#endif
