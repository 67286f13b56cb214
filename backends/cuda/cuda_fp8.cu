/* backends/cuda/cuda_fp8.cu: the FP8 baseline's experts in fast mode, every
 * expert in one launch on the FP8 tensor cores.
 *
 * Why: the FP8 recipe's experts went through the exact kernel in both modes
 * (an E4M3 x E4M3 product a multiply-add, k ascending, one float32 chain an
 * output), so fast FP8 rollouts ran at a tenth of fast BF16's (H200, a3b-4,
 * batch 64: 2,301 tok/s against 22,170) and were no baseline for NVFP4. FP8
 * engines on Hopper multiply E4M3 on the tensor cores; this is that product,
 * for the few rows an expert sees in decode and the many of a prefill.
 *
 * The product, for each group z (expert) with rows r0 .. r0 + M_z - 1:
 *     y[r][n] = (sum_k qa[r][k] qw_z[n][k]) * (sa_inv[r] * sw_inv_z[n]),
 * E4M3 codes row-major (K bytes a row, K a multiple of 16), the scales of
 * qd_fp8_quantize_rows. A CTA of 4 warps takes 64 weight rows (16 a warp) and
 * 8 NT activation rows of one group; K goes in stages of F8_KC bytes through
 * a ring of F8_STAGES cp.async copies (F8_STAGES - 1 in flight while one is
 * multiplied; bytes past K and rows past the group's read as zero). Each warp
 * runs mma.m16n8k32 (E4M3 x E4M3, float32 accumulators; sm_89 and later) with
 * its weight rows as A (ldmatrix) and an 8-row activation tile as B. On
 * Hopper ptxas lowers it to E4M3-to-FP16 conversions (F2FP, exact) and two
 * FP16 MMAs (HMMA.16816.F32; the SASS of sm_90a): Hopper's native FP8 MMA is
 * wgmma's, which decode's few rows a weight tile would leave mostly empty;
 * the products are exact either way. A stage's four MMAs start from zero and
 * their sum joins the output's float32 accumulator once a stage, so that
 * where an FP8 MMA accumulates with fewer bits than float32 (as reported of
 * Hopper's wgmma) at most 128 products are summed there. The scales
 * multiply once at the end, in the CPU's order. Fast mode only:
 * the sums' order and the MMA's rounding are not the exact chain's
 * (docs/numerics.md §7b; tests/gpu/check_ops bounds it). */
#include <stdint.h>
#include <stdlib.h>
#include <cuda_runtime.h>
#include "backends/cuda/cuda_blas.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_mma.h"

#define F8_KC 128           /* k (bytes) a stage */
#define F8_LD (F8_KC + 16)  /* a staged row's bytes: rows 36 words apart, conflict-free fragments */
#define F8_STAGES 4
#define F8_ROWS 64          /* weight rows a CTA, 16 a warp */
#define F8_THREADS 128
#define F8_GROUPS 128       /* groups a launch */

typedef struct {
    const uint8_t *w[F8_GROUPS];
    const float *sw[F8_GROUPS];
    int row0[F8_GROUPS], rows[F8_GROUPS];
} f8_groups;

template <int NT> struct f8_shape {
    static constexpr int W_BYTES = F8_ROWS * F8_LD, STAGE = (F8_ROWS + 8 * NT) * F8_LD;
    static constexpr int SMEM = F8_STAGES * STAGE;
};

/* D = A (16 x 32, E4M3) B (32 x 8, E4M3) + D */
static __device__ __forceinline__ void mma_e4m3(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Stage kt of the CTA's tile into st: its 64 weight rows and Tp activation
 * rows (T rounded up to 8; the rest of the stage is never read), bytes
 * kt * F8_KC .. + F8_KC - 1 of each, 16 bytes a copy. */
template <int NT>
static __device__ __forceinline__ void f8_load(unsigned char *st, const uint8_t *w, int n0, int N,
                                               const uint8_t *a, int Tp, int T, int K, int kt)
{
    const int k0 = kt * F8_KC;
#pragma unroll
    for (int i = 0; i < F8_ROWS * (F8_KC / 16) / F8_THREADS; i++) {
        int c = threadIdx.x + i * F8_THREADS, r = c >> 3, k = k0 + (c & 7) * 16;
        bool ok = n0 + r < N && k < K;
        cp16(st + r * F8_LD + (c & 7) * 16, ok ? w + (size_t)(n0 + r) * K + k : w, ok);
    }
    for (int c = threadIdx.x; c < Tp * (F8_KC / 16); c += F8_THREADS) {
        int r = c >> 3, k = k0 + (c & 7) * 16;
        bool ok = r < T && k < K;
        cp16(st + f8_shape<NT>::W_BYTES + r * F8_LD + (c & 7) * 16, ok ? a + (size_t)r * K + k : a, ok);
    }
}

template <int NT>
__global__ void __launch_bounds__(F8_THREADS) k_fp8_grouped(float *y, const uint8_t *qa, const float *sa,
                                                            const __grid_constant__ f8_groups g, int N, int K)
{
    QD_PDL_ENTRY();
    typedef f8_shape<NT> S;
    extern __shared__ __align__(16) unsigned char f8_smem[];
    const int z = blockIdx.z, t0 = blockIdx.y * 8 * NT, n0 = blockIdx.x * F8_ROWS;
    const int rows = g.rows[z];
    if (t0 >= rows)
        return;
    const int T = rows - t0 < 8 * NT ? rows - t0 : 8 * NT, Tp = (T + 7) & ~7, tiles = Tp / 8;
    const size_t r0 = (size_t)g.row0[z] + t0;
    const uint8_t *w = g.w[z], *a = qa + r0 * K;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, t = lane & 3;
    const int KT = (K + F8_KC - 1) / F8_KC;
    float acc[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++)
        acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
#pragma unroll
    for (int s = 0; s < F8_STAGES - 1; s++) {
        if (s < KT)
            f8_load<NT>(f8_smem + s * S::STAGE, w, n0, N, a, Tp, T, K, s);
        asm volatile("cp.async.commit_group;");
    }
    /* ldmatrix: lanes 0-7 rows 0-7 and lanes 8-15 rows 8-15 of bytes 0-15,
     * lanes 16-31 the same rows' bytes 16-31: a0..a3 of m16n8k32 */
    const int a_off = (16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1)) * F8_LD + 16 * (lane >> 4);
    const int b_off = S::W_BYTES + gq * F8_LD + 4 * t; /* B: activation row gq, k 4t.. and 16 + 4t.. */
    for (int kt = 0; kt < KT; kt++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(F8_STAGES - 2));
        __syncthreads(); /* stage kt landed for all; stage kt - 1 free for the next copy */
        if (kt + F8_STAGES - 1 < KT)
            f8_load<NT>(f8_smem + ((kt + F8_STAGES - 1) % F8_STAGES) * S::STAGE, w, n0, N, a, Tp, T, K,
                        kt + F8_STAGES - 1);
        asm volatile("cp.async.commit_group;");
        const unsigned char *st = f8_smem + (kt % F8_STAGES) * S::STAGE;
        float part[NT][4];
#pragma unroll
        for (int i = 0; i < NT; i++)
            part[i][0] = part[i][1] = part[i][2] = part[i][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < F8_KC / 32; ks++) {
            uint32_t A[4];
            ldm_x4(A, st + a_off + 32 * ks);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                if (nt >= tiles)
                    break;
                const unsigned char *b = st + b_off + nt * 8 * F8_LD + 32 * ks;
                mma_e4m3(part[nt], A, *(const uint32_t *)b, *(const uint32_t *)(b + 16));
            }
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[nt][i] += part[nt][i];
    }
    asm volatile("cp.async.wait_group 0;");
    /* acc[nt][i]: weight row 16 warp + gq (+ 8 for i >= 2), activation row 8 nt + 2t + (i & 1) */
    const float *sw = g.sw[z];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int m = 8 * nt + 2 * t + (i & 1), n = n0 + 16 * warp + gq + 8 * (i >> 1);
            if (m < T && n < N)
                y[(r0 + m) * N + n] = acc[nt][i] * (sa[r0 + m] * sw[n]);
        }
}

template <int NT>
static qd_status f8_launch(float *y, const uint8_t *qa, const float *sa, const f8_groups *g, int ng, int maxrows,
                           int N, int K)
{
    size_t smem = f8_shape<NT>::SMEM;
    /* every launch: the attribute is the current device's (a process may drive several) */
    if (smem > 48 * 1024)
        QD_CUDA_CHECK(cudaFuncSetAttribute(k_fp8_grouped<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((unsigned)((N + F8_ROWS - 1) / F8_ROWS), (unsigned)((maxrows + 8 * NT - 1) / (8 * NT)), (unsigned)ng);
    qd_launch(k_fp8_grouped<NT>, grid, F8_THREADS, smem, y, qa, sa, *g, N, K);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

/* The groups with rows, F8_GROUPS a launch; NT from the launch's most rows
 * (8 a tile, up to 64 rows a CTA). */
static qd_status f8_flush(float *y, const uint8_t *qa, const float *sa, const f8_groups *g, int ng, int maxrows,
                          int N, int K)
{
    if (ng == 0)
        return QD_OK;
    return maxrows <= 8    ? f8_launch<1>(y, qa, sa, g, ng, maxrows, N, K)
           : maxrows <= 16 ? f8_launch<2>(y, qa, sa, g, ng, maxrows, N, K)
           : maxrows <= 32 ? f8_launch<4>(y, qa, sa, g, ng, maxrows, N, K)
                           : f8_launch<8>(y, qa, sa, g, ng, maxrows, N, K);
}

int qd_cuda_fp8_grouped_ok(const uint8_t *qa, const uint8_t *const *qw, int E, int64_t K)
{
    if (K <= 0 || K % 16 || K > INT32_MAX || ((uintptr_t)qa & 15))
        return 0;
    for (int e = 0; e < E; e++)
        if ((uintptr_t)qw[e] & 15)
            return 0;
    return 1;
}

qd_status qd_cuda_gemm_fp8_grouped(float *y, const uint8_t *qa, const float *sa_inv, const uint8_t *const *qw,
                                   const float *const *sw_inv, const int32_t *off, int E, int64_t N, int64_t K)
{
    if (!qd_cuda_fp8_grouped_ok(qa, qw, E, K) || N <= 0 || N > INT32_MAX)
        return qd_error(QD_ERR_SHAPE, "qd_cuda_gemm_fp8_grouped: N %lld, K %lld (K a multiple of 16, rows on 16 bytes)",
                        (long long)N, (long long)K);
    f8_groups g;
    int ng = 0, maxrows = 0;
    for (int e = 0; e < E; e++) {
        int m = off[e + 1] - off[e];
        if (m <= 0)
            continue;
        g.w[ng] = qw[e];
        g.sw[ng] = sw_inv[e];
        g.row0[ng] = off[e];
        g.rows[ng] = m;
        maxrows = m > maxrows ? m : maxrows;
        if (++ng == F8_GROUPS) {
            QD_TRY(f8_flush(y, qa, sa_inv, &g, ng, maxrows, (int)N, (int)K));
            ng = maxrows = 0;
        }
    }
    return f8_flush(y, qa, sa_inv, &g, ng, maxrows, (int)N, (int)K);
}
