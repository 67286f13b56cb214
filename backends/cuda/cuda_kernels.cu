/* The exact-mode kernels (cuda_kernels.h): each one the CPU backend's
 * function of the same name, line for line in its arithmetic. Most are one
 * thread per output; qdk_matmul tiles through shared memory but keeps every
 * output's sum in one thread, k ascending, so the tiling changes no bit. */
#include <cuda_runtime.h>
#include <math.h>
#include "backends/cuda/cuda_check.h"
#include "backends/exact_math.h"
#include "backends/philox.h"
#include "backends/router.h"
extern "C" {
#include "backends/cuda/cuda_kernels.h"
#include "backends/sampling.h"
}

#define QD_LAUNCH(kernel, grid, block, ...)                                          \
    do {                                                                             \
        kernel<<<(grid), (block)>>>(__VA_ARGS__);                                    \
        QD_CUDA_CHECK(cudaGetLastError());                                           \
    } while (0)

#define TPB 128u

static unsigned blocks(size_t n, unsigned t) { return (unsigned)((n + t - 1) / t); }

/* With dynamic shared memory (bytes beyond 48 KB opted in first). */
#define QD_LAUNCH_SMEM(kernel, grid, block, smem, ...)                                \
    do {                                                                             \
        if ((smem) > 48 * 1024)                                                      \
            QD_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                               (int)(smem)));                        \
        kernel<<<(grid), (block), (smem)>>>(__VA_ARGS__);                            \
        QD_CUDA_CHECK(cudaGetLastError());                                           \
    } while (0)

/* One thread per item of n (n > 0). */
#define QD_LAUNCH_N(kernel, n, ...) QD_LAUNCH(kernel, blocks((n), TPB), TPB, __VA_ARGS__)

__global__ void k_round_bf16(float *dst, const float *src, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] = qd_round_bf16(src[i]);
}

extern "C" qd_status qdk_round_bf16(float *dst, const float *src, size_t n)
{
    if (n)
        QD_LAUNCH_N(k_round_bf16, (n), dst, src, n);
    return QD_OK;
}

__global__ void k_bf16_bits(uint16_t *dst, const float *src, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] = (uint16_t)(qd_f32_bits(qd_round_bf16(src[i])) >> 16);
}

extern "C" qd_status qdk_bf16_bits(uint16_t *dst, const float *src, size_t n)
{
    if (n)
        QD_LAUNCH_N(k_bf16_bits, n, dst, src, n);
    return QD_OK;
}

__global__ void k_embed(float *x, const float *emb, const int32_t *tok, int N, int C)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)N * C)
        x[i] = emb[(size_t)tok[i / C] * C + i % C];
}

extern "C" qd_status qdk_embed(float *x, const float *emb, const int32_t *tok, int N, int C)
{
    if (N)
        QD_LAUNCH_N(k_embed, ((size_t)N * C), x, emb, tok, N, C);
    return QD_OK;
}

/* One thread per column i, tokens ascending: repeated tokens add in the CPU's order. */
__global__ void k_embed_backward(float *gemb, const float *dres, const int32_t *tok, int N, int C)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= C)
        return;
    for (int n = 0; n < N; n++) {
        float *g = gemb + (size_t)tok[n] * C + i;
        *g = *g + dres[(size_t)n * C + i];
    }
}

extern "C" qd_status qdk_embed_backward(float *gemb, const float *dres, const int32_t *tok, int N, int C)
{
    if (N)
        QD_LAUNCH_N(k_embed_backward, (C), gemb, dres, tok, N, C);
    return QD_OK;
}

/* ------------------------------------------------------------------------ */
/* matrix products                                                           */

#define MM_B 64   /* output tile MM_B x MM_B, 256 threads of 4 x 4 outputs */
#define MM_K 16   /* k per shared-memory stage */

/* Loads a (MM_B rows) x (MM_K) stage of X(r, k) = x[r*sr + k*sk] into s[k][r],
 * with the unit-stride index fastest for coalescing; out of range -> 0 (never
 * multiplied: the k loop stops at K, and rows past the edge are not stored). */
template <typename T>
static __device__ void mm_stage(float (*s)[MM_B + 1], const T *x, long sr, long sk, int r0, int R, int k0,
                                int K)
{
    for (int idx = threadIdx.x; idx < MM_B * MM_K; idx += blockDim.x) {
        int r, k;
        if (sk == 1) {
            r = idx / MM_K;
            k = idx % MM_K;
        } else {
            r = idx % MM_B;
            k = idx / MM_B;
        }
        float v = 0.0f;
        if (r0 + r < R && k0 + k < K) {
            T e = x[(long)(r0 + r) * sr + (long)(k0 + k) * sk];
            if constexpr (sizeof(T) == 1)
                v = qd_e4m3_to_f32((uint8_t)e);
            else
                v = (float)e;
        }
        s[k][r] = v;
    }
}

/* op(A)(m, k) = a[m*am + k*ak] and op(B)(k, n) = b[k*bk + n*bn] of a layout. */
typedef struct {
    long am, ak, bk, bn;
} mm_strides;

static __host__ __device__ mm_strides mm_strides_of(qdk_layout layout, int M, int N, int K)
{
    mm_strides s;
    s.am = layout == QDK_TN ? 1 : K;
    s.ak = layout == QDK_TN ? M : 1;
    s.bk = layout == QDK_NT ? 1 : N;
    s.bn = layout == QDK_NT ? K : 1;
    return s;
}

/* The CTA's tile (m0, n0) of C (M, N) = A . B, each output acc = 0,
 * acc = acc + a_k * b_k, k ascending; with scales (FP8): times (sa[m] * sb[n]). */
template <typename T>
static __device__ void mm_tile(float *c, const T *a, const T *b, mm_strides st, int M, int N, int K,
                               qdk_store store, const float *sa, const float *sb, int m0, int n0)
{
    __shared__ float As[MM_K][MM_B + 1], Bs[MM_K][MM_B + 1];
    int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += MM_K) {
        mm_stage<T>(As, a, st.am, st.ak, m0, M, k0, K);
        mm_stage<T>(Bs, b, st.bn, st.bk, n0, N, k0, K);
        __syncthreads();
        int kmax = K - k0 < MM_K ? K - k0 : MM_K;
        for (int kk = 0; kk < kmax; kk++) {
            float av[4], bv[4];
            for (int i = 0; i < 4; i++) {
                av[i] = As[kk][ty + 16 * i];
                bv[i] = Bs[kk][tx + 16 * i];
            }
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++)
                    acc[i][j] = acc[i][j] + av[i] * bv[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            int m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
            if (m >= M || n >= N)
                continue;
            float v = acc[i][j];
            if (sa)
                v = v * (sa[m] * sb[n]);
            float *o = c + (size_t)m * N + n;
            *o = store == QDK_ACCUMULATE ? *o + v : v;
        }
}

template <typename T>
__global__ void __launch_bounds__(256) k_matmul(float *c, const T *a, const T *b, mm_strides st, int M, int N,
                                                int K, qdk_store store, const float *sa, const float *sb)
{
    mm_tile<T>(c, a, b, st, M, N, K, store, sa, sb, blockIdx.y * MM_B, blockIdx.x * MM_B);
}

/* Grouped: blockIdx.z picks one independent product of the table (one layout). */
#define QD_MM_GROUPS 128
typedef struct {
    const void *a[QD_MM_GROUPS], *b[QD_MM_GROUPS];
    float *c[QD_MM_GROUPS];
    const float *sa[QD_MM_GROUPS], *sb[QD_MM_GROUPS];
    int M[QD_MM_GROUPS], N[QD_MM_GROUPS], K[QD_MM_GROUPS];
} mm_groups;

template <typename T>
__global__ void __launch_bounds__(256) k_matmul_grouped(const __grid_constant__ mm_groups g, qdk_layout layout,
                                                        qdk_store store)
{
    int z = blockIdx.z, m0 = blockIdx.y * MM_B, n0 = blockIdx.x * MM_B;
    if (m0 >= g.M[z] || n0 >= g.N[z])
        return;
    mm_tile<T>(g.c[z], (const T *)g.a[z], (const T *)g.b[z], mm_strides_of(layout, g.M[z], g.N[z], g.K[z]),
               g.M[z], g.N[z], g.K[z], store, g.sa[z], g.sb[z], m0, n0);
}

static int mm_layout_ok(qdk_layout l) { return l == QDK_NN || l == QDK_NT || l == QDK_TN; }

extern "C" qd_status qdk_matmul_grouped(const qdk_mm_item *it, int n, qdk_layout layout, qdk_store store,
                                        qdk_elem elem)
{
    if (!mm_layout_ok(layout) || (elem != QDK_F32 && elem != QDK_E4M3))
        return qd_error(QD_ERR_ARG, "qdk_matmul_grouped: layout %d, element type %d", (int)layout, (int)elem);
    for (int g0 = 0; g0 < n; g0 += QD_MM_GROUPS) {
        mm_groups g;
        int ng = n - g0 < QD_MM_GROUPS ? n - g0 : QD_MM_GROUPS, maxm = 0, maxn = 0;
        for (int i = 0; i < ng; i++) {
            const qdk_mm_item *x = &it[g0 + i];
            g.a[i] = x->a;
            g.b[i] = x->b;
            g.c[i] = x->c;
            g.sa[i] = x->sa;
            g.sb[i] = x->sb;
            g.M[i] = x->M;
            g.N[i] = x->N;
            g.K[i] = x->K;
            maxm = x->M > maxm ? x->M : maxm;
            maxn = x->N > maxn ? x->N : maxn;
        }
        if (maxm == 0 || maxn == 0)
            continue;
        dim3 grid((maxn + MM_B - 1) / MM_B, (maxm + MM_B - 1) / MM_B, ng);
        if (elem == QDK_E4M3)
            QD_LAUNCH(k_matmul_grouped<uint8_t>, grid, 256u, g, layout, store);
        else
            QD_LAUNCH(k_matmul_grouped<float>, grid, 256u, g, layout, store);
    }
    return QD_OK;
}

extern "C" qd_status qdk_matmul(float *c, const float *a, const float *b, int M, int N, int K, qdk_layout layout,
                                qdk_store store)
{
    if (!mm_layout_ok(layout))
        return qd_error(QD_ERR_ARG, "qdk_matmul: layout %d", (int)layout);
    if (M == 0 || N == 0)
        return QD_OK;
    dim3 grid((N + MM_B - 1) / MM_B, (M + MM_B - 1) / MM_B);
    QD_LAUNCH(k_matmul<float>, grid, 256u, c, a, b, mm_strides_of(layout, M, N, K), M, N, K, store,
              (const float *)NULL, (const float *)NULL);
    return QD_OK;
}

/* ---- x . W^T for the forward linears (k_matmul's arithmetic, a faster shape).
 * C (M, N) = A (M, K) . W (N, K)^T, each output one thread's sum from 0, k
 * ascending (the CPU's order). A CTA of 128 threads owns 128 weight rows and
 * 8*TM activation rows; thread (tx, ty) owns columns 4tx..4tx+3 and 64+4tx..+3
 * and rows ty*TM..ty*TM+TM-1, reading its operands as float4 from shared memory
 * (K staged 32 at a time, transposed on the way in).
 *
 * When every product a*w of a stage is exact in float32, acc + a*w (two
 * roundings, the CPU's) and fmaf(a, w, acc) (one) are the same number, so the
 * stage may use fmaf: half the instructions. Products of BF16 values (8
 * significant bits each) have 16 bits, exact unless they fall off the bottom of
 * float32's subnormal grid or overflow. With check set, the threads summarize
 * the elements they stage (any non-BF16 or non-finite; the least and largest
 * exponent field over nonzero elements) and the CTA takes fmaf for the stage
 * only when both operands are finite BF16 values, lsb_a + lsb_w >= -149 (lsb =
 * max(E, 1) - 134, the exponent of a BF16 value's last significand bit) and
 * E_a + E_w <= 378 (every product below 2^127). The same bits either way. */
#define MW_BN 128
#define MW_BK 32

/* A staging thread's summary of the elements it loaded. */
struct mw_sum {
    uint32_t lo, emin, emax;
};

static __device__ __forceinline__ void mw_see(mw_sum *s, uint32_t b)
{
    uint32_t e = b & 0x7f800000u;
    s->lo |= b;
    s->emin = (b & 0x7fffffffu) && e < s->emin ? e : s->emin;
    s->emax = e > s->emax ? e : s->emax;
}

/* Rows r0 .. r0+ROWS-1 of the float32 matrix x (R, K), columns k0 .. k0+MW_BK-1,
 * into S[k][row] (out of range: 0, not summarized). W's stage and A's. */
template <int ROWS>
static __device__ __forceinline__ void mw_load(float (*S)[ROWS], const float *x, int r0, int R, int K, int k0,
                                               mw_sum *sum)
{
    for (int idx = threadIdx.x; idx < ROWS * (MW_BK / 4); idx += blockDim.x) {
        int row = idx >> 3, k = (idx & 7) * 4;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r0 + row < R && k0 + k < K) {
            v = __ldg((const float4 *)(x + (size_t)(r0 + row) * K + k0 + k));
            mw_see(sum, __float_as_uint(v.x));
            mw_see(sum, __float_as_uint(v.y));
            mw_see(sum, __float_as_uint(v.z));
            mw_see(sum, __float_as_uint(v.w));
        }
        S[k][row] = v.x;
        S[k + 1][row] = v.y;
        S[k + 2][row] = v.z;
        S[k + 3][row] = v.w;
    }
}

static __device__ __forceinline__ void mw_load_w(float (*Ws)[MW_BN], const float *w, int n0, int N, int K, int k0,
                                                 mw_sum *sw)
{
    mw_load<MW_BN>(Ws, w, n0, N, K, k0, sw);
}

static __device__ __forceinline__ void mw_load_w(float (*Ws)[MW_BN], const uint16_t *w, int n0, int N, int K,
                                                 int k0, mw_sum *sw)
{
    for (int idx = threadIdx.x; idx < MW_BN * (MW_BK / 8); idx += blockDim.x) {
        int row = idx >> 2, k = (idx & 3) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        bool in = n0 + row < N && k0 + k < K;
        if (in)
            v = __ldg((const uint4 *)(w + (size_t)(n0 + row) * K + k0 + k));
        uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t lo = u[i] << 16, hi = u[i] & 0xffff0000u;
            if (in) {
                mw_see(sw, lo);
                mw_see(sw, hi);
            }
            Ws[k + 2 * i][row] = __uint_as_float(lo);
            Ws[k + 2 * i + 1][row] = __uint_as_float(hi);
        }
    }
}

template <int TM, bool FMA>
static __device__ __forceinline__ void mw_tile(float (&acc)[TM][8], const float (*Ws)[MW_BN],
                                               const float (*As)[8 * TM], int kmax, int tx, int ty)
{
    for (int kk = 0; kk < kmax; kk++) {
        float4 w0 = *(const float4 *)&Ws[kk][4 * tx], w1 = *(const float4 *)&Ws[kk][64 + 4 * tx];
        float wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w}, av[TM];
        if constexpr (TM % 4 == 0) {
#pragma unroll
            for (int i = 0; i < TM; i += 4) {
                float4 a4 = *(const float4 *)&As[kk][ty * TM + i];
                av[i] = a4.x;
                av[i + 1] = a4.y;
                av[i + 2] = a4.z;
                av[i + 3] = a4.w;
            }
        } else {
#pragma unroll
            for (int i = 0; i < TM; i++)
                av[i] = As[kk][ty * TM + i];
        }
#pragma unroll
        for (int i = 0; i < TM; i++)
#pragma unroll
            for (int j = 0; j < 8; j++)
                acc[i][j] = FMA ? fmaf(av[i], wv[j], acc[i][j]) : acc[i][j] + av[i] * wv[j];
    }
}

static __device__ __forceinline__ void mw_reduce(mw_sum *s)
{
    for (int o = 16; o; o >>= 1) {
        uint32_t lo = __shfl_xor_sync(0xffffffffu, s->lo, o), mn = __shfl_xor_sync(0xffffffffu, s->emin, o);
        uint32_t mx = __shfl_xor_sync(0xffffffffu, s->emax, o);
        s->lo |= lo;
        s->emin = mn < s->emin ? mn : s->emin;
        s->emax = mx > s->emax ? mx : s->emax;
    }
}

template <int TM, typename TW>
__global__ void __launch_bounds__(128) k_matmul_wt(float *c, const float *a, const TW *w, int M, int N, int K,
                                                   int check)
{
    constexpr int BM = 8 * TM;
    __shared__ __align__(16) float Ws[MW_BK][MW_BN];
    __shared__ __align__(16) float As[MW_BK][BM];
    __shared__ mw_sum s_sum[2][4];
    int tx = threadIdx.x & 15, ty = threadIdx.x >> 4, n0 = blockIdx.x * MW_BN, m0 = blockIdx.y * BM;
    int wid = threadIdx.x >> 5;
    float acc[TM][8];
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < 8; j++)
            acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += MW_BK) {
        mw_sum sa = {0u, 0xffffffffu, 0u}, sw = {0u, 0xffffffffu, 0u};
        __syncthreads();
        mw_load_w(Ws, w, n0, N, K, k0, &sw);
        mw_load<BM>(As, a, m0, M, K, k0, &sa);
        if (check) {
            mw_reduce(&sa);
            mw_reduce(&sw);
            if ((threadIdx.x & 31) == 0) {
                s_sum[0][wid] = sa;
                s_sum[1][wid] = sw;
            }
        }
        __syncthreads();
        int kmax = K - k0 < MW_BK ? K - k0 : MW_BK, fma = 0;
        if (check) {
            mw_sum x[2] = {s_sum[0][0], s_sum[1][0]};
            for (int o = 0; o < 2; o++)
                for (int i = 1; i < 4; i++) {
                    x[o].lo |= s_sum[o][i].lo;
                    x[o].emin = s_sum[o][i].emin < x[o].emin ? s_sum[o][i].emin : x[o].emin;
                    x[o].emax = s_sum[o][i].emax > x[o].emax ? s_sum[o][i].emax : x[o].emax;
                }
            int ea = (int)(x[0].emax >> 23), ew = (int)(x[1].emax >> 23);
            int bad = ((x[0].lo | x[1].lo) & 0xffffu) || ea == 255 || ew == 255;
            if (x[0].emin == 0xffffffffu || x[1].emin == 0xffffffffu)
                fma = !bad; /* one operand all zeros: every product is a zero */
            else {
                int la = (int)(x[0].emin >> 23), lw = (int)(x[1].emin >> 23);
                la = (la > 1 ? la : 1) - 134;
                lw = (lw > 1 ? lw : 1) - 134;
                fma = !bad && la + lw >= -149 && ea + ew <= 378;
            }
        }
        if (fma)
            mw_tile<TM, true>(acc, Ws, As, kmax, tx, ty);
        else
            mw_tile<TM, false>(acc, Ws, As, kmax, tx, ty);
    }
#pragma unroll
    for (int i = 0; i < TM; i++) {
        int m = m0 + ty * TM + i;
        if (m >= M)
            continue;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int n = n0 + (j < 4 ? 4 * tx + j : 64 + 4 * tx + j - 4);
            if (n < N)
                c[(size_t)m * N + n] = acc[i][j];
        }
    }
}

template <int TM>
static qd_status launch_matmul_wt(float *c, const float *a, const void *w, qdk_elem w_elem, int M, int N, int K,
                                  int check)
{
    dim3 grid((unsigned)((N + MW_BN - 1) / MW_BN), (unsigned)((M + 8 * TM - 1) / (8 * TM)));
    if (w_elem == QDK_BF16)
        QD_LAUNCH((k_matmul_wt<TM, uint16_t>), grid, 128u, c, a, (const uint16_t *)w, M, N, K, check);
    else
        QD_LAUNCH((k_matmul_wt<TM, float>), grid, 128u, c, a, (const float *)w, M, N, K, check);
    return QD_OK;
}

extern "C" qd_status qdk_matmul_wt(float *c, const float *a, const void *w, qdk_elem w_elem, int M, int N, int K,
                                   qd_prec prec)
{
    if (w_elem != QDK_F32 && w_elem != QDK_BF16)
        return qd_error(QD_ERR_ARG, "qdk_matmul_wt: weight element type %d", (int)w_elem);
    if (M == 0 || N == 0)
        return QD_OK;
    if (K % 8)
        return qd_error(QD_ERR_SHAPE, "qdk_matmul_wt: K %d not a multiple of 8", K);
    int check = prec == QD_PREC_BF16;
    if (M <= 8)
        return launch_matmul_wt<1>(c, a, w, w_elem, M, N, K, check);
    if (M <= 16)
        return launch_matmul_wt<2>(c, a, w, w_elem, M, N, K, check);
    if (M <= 32)
        return launch_matmul_wt<4>(c, a, w, w_elem, M, N, K, check);
    return launch_matmul_wt<8>(c, a, w, w_elem, M, N, K, check);
}

extern "C" qd_status qdk_fp8_gemm(float *y, const uint8_t *qa, const float *sa_inv, const uint8_t *qw,
                                  const float *sw_inv, int M, int N, int K)
{
    if (M == 0 || N == 0)
        return QD_OK;
    dim3 grid((N + MM_B - 1) / MM_B, (M + MM_B - 1) / MM_B);
    QD_LAUNCH(k_matmul<uint8_t>, grid, 256u, y, qa, qw, mm_strides_of(QDK_NT, M, N, K), M, N, K, QDK_OVERWRITE,
              sa_inv, sw_inv);
    return QD_OK;
}

/* ------------------------------------------------------------------------ */
/* norms, RoPE, attention                                                    */

/* One block a row: the row goes to shared memory in coalesced loads, one
 * thread sums its squares in the CPU's order (ascending; the same bits), then
 * the block writes the normalized row. (One thread a row read each row
 * element by element from global memory: latency-bound, 0.27 ms a launch at
 * C = 2048 on the H200.) In place (out == inp) allowed. */
__global__ void k_rmsnorm(float *out, float *rstd, const float *inp, const float *w, int C, float eps)
{
    extern __shared__ float xs[];
    __shared__ float r_sh;
    size_t n = blockIdx.x;
    const float *x = inp + n * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        xs[i] = x[i];
    __syncthreads();
    if (threadIdx.x == 0) {
        float ss = 0.0f;
        for (int i = 0; i < C; i++)
            ss = ss + xs[i] * xs[i];
        r_sh = qd_rsqrtf(ss / (float)C + eps);
        rstd[n] = r_sh;
    }
    __syncthreads();
    float r = r_sh;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        out[n * C + i] = w[i] * (xs[i] * r);
}

extern "C" qd_status qdk_rmsnorm(float *out, float *rstd, const float *inp, const float *w, int rows, int C,
                                 float eps)
{
    if (rows)
        QD_LAUNCH_SMEM(k_rmsnorm, (unsigned)rows, C < 128 ? 32u : 128u, sizeof(float) * (size_t)C, out, rstd, inp,
                       w, C, eps);
    return QD_OK;
}

__global__ void k_rmsnorm_bwd_x(float *dinp, const float *dout, const float *inp, const float *w,
                                const float *rstd, int rows, int C)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= rows)
        return;
    const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
    float r = rstd[n], dot = 0.0f;
    for (int i = 0; i < C; i++)
        dot = dot + (w[i] * dy[i]) * x[i];
    float k = ((r * r) * r) * (dot / (float)C);
    for (int i = 0; i < C; i++) {
        float *d = dinp + (size_t)n * C + i;
        *d = *d + (r * (w[i] * dy[i]) - x[i] * k);
    }
}

__global__ void k_rmsnorm_bwd_w(float *dw, const float *dout, const float *inp, const float *rstd, int rows,
                                int C)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= C)
        return;
    float acc = 0.0f;
    for (int n = 0; n < rows; n++)
        acc = acc + dout[(size_t)n * C + i] * (inp[(size_t)n * C + i] * rstd[n]);
    dw[i] = dw[i] + acc;
}

extern "C" qd_status qdk_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
                                          const float *w, const float *rstd, int rows, int C)
{
    if (rows == 0)
        return QD_OK;
    QD_LAUNCH_N(k_rmsnorm_bwd_x, (rows), dinp, dout, inp, w, rstd, rows, C);
    QD_LAUNCH_N(k_rmsnorm_bwd_w, (C), dw, dout, inp, rstd, rows, C);
    return QD_OK;
}

__global__ void k_rope(float *x, const int32_t *pos, const float *cosb, const float *sinb, int N, int nh, int D,
                       qd_rope_dir dir)
{
    int h2 = D / 2;
    size_t id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (size_t)N * nh * h2)
        return;
    int i = (int)(id % h2);
    size_t nhh = id / h2;
    int n = (int)(nhh / nh);
    float *y = x + nhh * D;
    float cs = cosb[(size_t)pos[n] * h2 + i], sn = sinb[(size_t)pos[n] * h2 + i];
    float a = y[i], b = y[i + h2];
    if (dir == QD_ROPE_INVERSE) {
        y[i] = a * cs + b * sn;
        y[i + h2] = b * cs - a * sn;
    } else {
        y[i] = a * cs - b * sn;
        y[i + h2] = b * cs + a * sn;
    }
}

extern "C" qd_status qdk_rope(float *x, const int32_t *pos, const float *cosb, const float *sinb, int N, int nh,
                              int D, qd_rope_dir dir)
{
    if (N)
        QD_LAUNCH_N(k_rope, ((size_t)N * nh * (D / 2)), x, pos, cosb, sinb, N, nh, D, dir);
    return QD_OK;
}

/* One block per (query n, head h), the CPU's attend(): the scores (each one
 * dot product in one thread, i ascending) spread over the threads, the max and
 * the sum of exponentials by one thread in s order, the output elements (each
 * a sum over s ascending in one thread) spread over the threads. Every value
 * is computed exactly as in the CPU's loop; only who computes it changes. */
__global__ void k_attend(float *out, float *att, const float *q, const float *kb, const float *vb,
                         const int32_t *kbase, const int32_t *pos, int N, int H, int KV, int D, int Tm,
                         float scale)
{
    __shared__ float red[2];
    int id = blockIdx.x, n = id / H, h = id % H, t = pos[n], kh = h / (H / KV);
    size_t KD = (size_t)KV * D;
    const float *qv = q + (size_t)n * H * D + h * D;
    const float *kr = kb + (size_t)kbase[n] * KD + kh * D, *vr = vb + (size_t)kbase[n] * KD + kh * D;
    float *p = att + (size_t)id * Tm;
    for (int s = threadIdx.x; s <= t; s += blockDim.x) {
        const float *kv = kr + s * KD;
        float dot = 0.0f;
        for (int i = 0; i < D; i++)
            dot = dot + qv[i] * kv[i];
        p[s] = dot * scale;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float mx = -INFINITY;
        for (int s = 0; s <= t; s++)
            mx = fmaxf(mx, p[s]);
        red[0] = mx;
    }
    __syncthreads();
    float mx = red[0];
    for (int s = threadIdx.x; s <= t; s += blockDim.x)
        p[s] = qd_expf(p[s] - mx);
    __syncthreads();
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (int s = 0; s <= t; s++)
            sum = sum + p[s];
        red[1] = sum;
    }
    __syncthreads();
    float sum = red[1];
    for (int s = threadIdx.x; s <= t; s += blockDim.x)
        p[s] = p[s] / sum;
    __syncthreads();
    float *o = out + (size_t)n * H * D + h * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s <= t; s++)
            acc = acc + p[s] * vr[s * KD + i];
        o[i] = acc;
    }
}

static float attn_scale(int D) { return (float)(1.0 / sqrt((double)D)); }

extern "C" qd_status qdk_attend(float *out, float *att, const float *q, const float *kb, const float *vb,
                                const int32_t *kbase, const int32_t *pos, int N, int H, int KV, int D, int Tm)
{
    if (N)
        QD_LAUNCH(k_attend, (unsigned)(N * H), 64u, out, att, q, kb, vb, kbase, pos, N, H, KV, D, Tm, attn_scale(D));
    return QD_OK;
}

static __device__ float warp_max(float v)
{
    for (int o = 16; o > 0; o /= 2)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static __device__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__global__ void k_attend_fast(float *out, float *att, const float *q, const float *kb, const float *vb,
                              const int32_t *kbase, const int32_t *pos, int N, int H, int KV, int D, int Tm,
                              float scale)
{
    int id = (int)(((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
    if (id >= N * H)
        return;
    int n = id / H, h = id % H, t = pos[n], kh = h / (H / KV);
    size_t KD = (size_t)KV * D;
    const float *qv = q + (size_t)n * H * D + h * D;
    const float *kr = kb + (size_t)kbase[n] * KD + kh * D, *vr = vb + (size_t)kbase[n] * KD + kh * D;
    float *p = att + (size_t)id * Tm, mx = -INFINITY, sum = 0.0f;
    for (int s = lane; s <= t; s += 32) {
        const float4 *k4 = (const float4 *)(kr + s * KD), *q4 = (const float4 *)qv;
        float dot = 0.0f;
        for (int i = 0; i < D / 4; i++) {
            float4 a = q4[i], b = k4[i];
            dot = fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, fmaf(a.w, b.w, dot))));
        }
        p[s] = dot * scale;
        mx = fmaxf(mx, p[s]);
    }
    mx = warp_max(mx);
    for (int s = lane; s <= t; s += 32) {
        p[s] = __expf(p[s] - mx);
        sum += p[s];
    }
    float inv = 1.0f / warp_sum(sum);
    for (int s = lane; s <= t; s += 32)
        p[s] *= inv;
    __syncwarp();
    float *o = out + (size_t)n * H * D + h * D;
    for (int i = lane; i < D; i += 32) {
        float acc = 0.0f;
        for (int s = 0; s <= t; s++)
            acc = fmaf(p[s], vr[s * KD + i], acc);
        o[i] = acc;
    }
}

extern "C" qd_status qdk_attend_fast(float *out, float *att, const float *q, const float *kb, const float *vb,
                                     const int32_t *kbase, const int32_t *pos, int N, int H, int KV, int D, int Tm)
{
    if (D % 4)
        return qdk_attend(out, att, q, kb, vb, kbase, pos, N, H, KV, D, Tm);
    if (N)
        QD_LAUNCH(k_attend_fast, blocks((size_t)N * H * 32, TPB), TPB, out, att, q, kb, vb, kbase, pos, N, H, KV,
                  D, Tm, attn_scale(D));
    return QD_OK;
}

/* Per (query n, head h): dp[s] = dy . v_s, pdp = sum_s p[s] dp[s] (s ascending),
 * ds[s] = (p[s] (dp[s] - pdp)) scale, as attention_backward's first two loops. */
/* One block per (query n, head h): dp[s] = dy . v_s (each in one thread, i
 * ascending) spread over the threads; pdp = sum_s p[s] dp[s] in s order by one
 * thread; ds[s] = (p[s] (dp[s] - pdp)) scale spread again: attention_backward's
 * first two loops, value for value. */
__global__ void k_attn_ds(float *ds, const float *dout, const float *att, const float *v, const int32_t *pos,
                          int N, int H, int KV, int D, int Tm, float scale)
{
    __shared__ float red;
    int id = blockIdx.x, n = id / H, h = id % H, t = pos[n], off = n - t, kh = h / (H / KV);
    size_t KD = (size_t)KV * D, HD = (size_t)H * D;
    const float *p = att + (size_t)id * Tm, *dy = dout + (size_t)n * HD + h * D;
    float *d = ds + (size_t)id * Tm;
    for (int s = threadIdx.x; s <= t; s += blockDim.x) {
        const float *vv = v + (size_t)(off + s) * KD + kh * D;
        float acc = 0.0f;
        for (int i = 0; i < D; i++)
            acc = acc + dy[i] * vv[i];
        d[s] = acc;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float pdp = 0.0f;
        for (int s = 0; s <= t; s++)
            pdp = pdp + p[s] * d[s];
        red = pdp;
    }
    __syncthreads();
    float pdp = red;
    for (int s = threadIdx.x; s <= t; s += blockDim.x)
        d[s] = (p[s] * (d[s] - pdp)) * scale;
}

/* dq (n, h, i) = sum over s <= t ascending of ds * k_s[i] (from zero). */
__global__ void k_attn_dq(float *dq, const float *ds, const float *k, const int32_t *pos, int N, int H, int KV,
                          int D, int Tm)
{
    size_t id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (size_t)N * H * D)
        return;
    int i = (int)(id % D), h = (int)(id / D % H), n = (int)(id / D / H);
    int t = pos[n], off = n - t, kh = h / (H / KV);
    size_t KD = (size_t)KV * D;
    const float *d = ds + ((size_t)n * H + h) * Tm;
    float acc = 0.0f;
    for (int s = 0; s <= t; s++)
        acc = acc + d[s] * k[(size_t)(off + s) * KD + kh * D + i];
    dq[id] = acc;
}

/* dk, dv of key token m (position s) for kv head kh, element i: over the
 * group's heads ascending, then queries t = s..len-1 ascending (the CPU's
 * order of additions into dk[s], dv[s]). */
__global__ void k_attn_dkv(float *dk, float *dv, const float *ds, const float *att, const float *q,
                           const float *dout, const int32_t *pos, const int32_t *slen, int N, int H, int KV,
                           int D, int Tm)
{
    size_t id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (size_t)N * KV * D)
        return;
    int i = (int)(id % D), kh = (int)(id / D % KV), m = (int)(id / D / KV);
    int s = pos[m], off = m - s, len = slen[m], grp = H / KV;
    size_t HD = (size_t)H * D;
    float ak = 0.0f, av = 0.0f;
    for (int h = kh * grp; h < (kh + 1) * grp; h++)
        for (int t = s; t < len; t++) {
            size_t qi = ((size_t)(off + t) * H + h) * Tm + s;
            size_t xi = (size_t)(off + t) * HD + h * D + i;
            ak = ak + ds[qi] * q[xi];
            av = av + att[qi] * dout[xi];
        }
    dk[id] = ak;
    dv[id] = av;
}

extern "C" qd_status qdk_attend_backward(float *dq, float *dk, float *dv, float *ds, const float *dout,
                                         const float *att, const float *q, const float *k, const float *v,
                                         const int32_t *pos, const int32_t *slen, int N, int H, int KV, int D,
                                         int Tm)
{
    if (N == 0)
        return QD_OK;
    QD_LAUNCH(k_attn_ds, (unsigned)(N * H), 64u, ds, dout, att, v, pos, N, H, KV, D, Tm, attn_scale(D));
    QD_LAUNCH_N(k_attn_dq, ((size_t)N * H * D), dq, ds, k, pos, N, H, KV, D, Tm);
    QD_LAUNCH_N(k_attn_dkv, ((size_t)N * KV * D), dk, dv, ds, att, q, dout, pos, slen, N, H, KV, D, Tm);
    return QD_OK;
}

__global__ void k_store_kv(float *kc, float *vc, const float *kr, const float *v, const int32_t *row,
                           const int32_t *pos, int N, int Tc, int KD)
{
    size_t id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (size_t)N * KD)
        return;
    int n = (int)(id / KD), j = (int)(id % KD);
    size_t at = ((size_t)row[n] * Tc + pos[n]) * KD + j;
    kc[at] = kr[id];
    vc[at] = v[id];
}

extern "C" qd_status qdk_store_kv(float *kc, float *vc, const float *kr, const float *v, const int32_t *row,
                                  const int32_t *pos, int N, int Tc, int KD)
{
    if (N)
        QD_LAUNCH_N(k_store_kv, ((size_t)N * KD), kc, vc, kr, v, row, pos, N, Tc, KD);
    return QD_OK;
}

/* ------------------------------------------------------------------------ */
/* MLP and MoE                                                               */

__global__ void k_add(float *out, const float *a, const float *b, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = a[i] + b[i];
}

extern "C" qd_status qdk_add(float *out, const float *a, const float *b, size_t n)
{
    if (n)
        QD_LAUNCH_N(k_add, (n), out, a, b, n);
    return QD_OK;
}

/* One thread per token: backends/router.h, as the CPU's route(). */
/* One block a token: its router row goes to shared memory, one thread runs
 * backends/router.h's softmax and selection there (the CPU's code, so the
 * same bits), the block writes back. (One thread a token on global memory
 * was latency-bound: 0.39 ms a launch at E = 128, K = 8.) */
__global__ void k_route(int32_t *topk, float *topw, float *probs, int E, int K, qd_topk_norm norm)
{
    extern __shared__ float ps[];                 /* E probabilities, then K weights, then K indices */
    float *ws = ps + E;
    int32_t *ix = (int32_t *)(ws + K);
    size_t n = blockIdx.x;
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        ps[e] = probs[n * E + e];
    __syncthreads();
    if (threadIdx.x == 0) {
        qd_router_softmax(ps, E);
        qd_router_select(ix, ws, ps, E, K, norm);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        probs[n * E + e] = ps[e];
    for (int j = threadIdx.x; j < K; j += blockDim.x) {
        topk[n * K + j] = ix[j];
        topw[n * K + j] = ws[j];
    }
}

extern "C" qd_status qdk_route(int32_t *topk, float *topw, float *probs, int N, int E, int K, qd_topk_norm norm)
{
    if (N)
        QD_LAUNCH_SMEM(k_route, (unsigned)N, 32u, sizeof(float) * ((size_t)E + 2 * (size_t)K), topk, topw, probs,
                       E, K, norm);
    return QD_OK;
}

/* qd_moe_group (backends/layout.c) on the device, the same rows: block e
 * walks the tokens in ascending order, 1024 at a time, and numbers the ones
 * that chose e with a block-wide exclusive scan (slot: a token's position
 * among expert e's rows); cnt[e] their count. */
__global__ void __launch_bounds__(1024) k_moe_slots(int32_t *slot, int32_t *cnt, const int32_t *topk, int N, int K)
{
    __shared__ int32_t scan[1024];
    int e = blockIdx.x, t = threadIdx.x;
    int32_t run = 0;
    for (int base = 0; base < N; base += 1024) {
        int n = base + t, rank = -1;
        for (int i = 0; n < N && i < K; i++)
            if (topk[(size_t)n * K + i] == e)
                rank = i;
        scan[t] = rank >= 0;
        __syncthreads();
        for (int w = 1; w < 1024; w *= 2) {  /* inclusive Hillis-Steele scan */
            int32_t v = t >= w ? scan[t - w] : 0;
            __syncthreads();
            scan[t] += v;
            __syncthreads();
        }
        if (rank >= 0)
            slot[(size_t)n * K + rank] = run + scan[t] - 1;
        run += scan[1023];
        __syncthreads();
    }
    if (t == 0)
        cnt[e] = run;
}

/* exp_off (E + 1) from the counts, ascending expert index. */
__global__ void k_moe_offsets(int32_t *exp_off, const int32_t *cnt, int E)
{
    exp_off[0] = 0;
    for (int e = 0; e < E; e++)
        exp_off[e + 1] = exp_off[e] + cnt[e];
}

/* One thread per (token, choice): its row, and its place among the token's
 * rows in ascending expert order (the experts of a token are distinct). */
__global__ void k_moe_rows(int32_t *row_tok, float *row_w, int32_t *row_rank, int32_t *tok_rows,
                           const int32_t *slot, const int32_t *exp_off, const int32_t *topk, const float *topw, int N,
                           int K)
{
    size_t id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (size_t)N * K)
        return;
    int n = (int)(id / K), i = (int)(id % K), e = topk[id], j = 0;
    for (int q = 0; q < K; q++)
        j += topk[(size_t)n * K + q] < e;
    int r = exp_off[e] + slot[id];
    row_tok[r] = n;
    row_w[r] = topw[id];
    row_rank[r] = i;
    tok_rows[(size_t)n * K + j] = r;
}

/* A dense MLP: every token is row n of "expert 0", weight 1. */
__global__ void k_moe_dense(int32_t *exp_off, int32_t *row_tok, float *row_w, int32_t *row_rank, int32_t *tok_rows,
                            int N)
{
    size_t n = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (n == 0) {
        exp_off[0] = 0;
        exp_off[1] = N;
    }
    if (n >= (size_t)N)
        return;
    row_tok[n] = (int32_t)n;
    row_w[n] = 1.0f;
    row_rank[n] = 0;
    tok_rows[n] = (int32_t)n;
}

extern "C" qd_status qdk_moe_group(int32_t *exp_off, int32_t *row_tok, float *row_w, int32_t *row_rank,
                                   int32_t *tok_rows, int32_t *scratch, const int32_t *topk, const float *topw, int N,
                                   int E, int K)
{
    if (!topk) {
        QD_LAUNCH(k_moe_dense, blocks((size_t)N + 1, TPB), TPB, exp_off, row_tok, row_w, row_rank, tok_rows, N);
        return QD_OK;
    }
    int32_t *slot = scratch, *cnt = scratch + (size_t)N * K;
    QD_LAUNCH(k_moe_slots, E, 1024, slot, cnt, topk, N, K);
    QD_LAUNCH(k_moe_offsets, 1, 1, exp_off, cnt, E);
    if (N)
        QD_LAUNCH_N(k_moe_rows, (size_t)N * K, row_tok, row_w, row_rank, tok_rows, slot, exp_off, topk, topw, N, K);
    return QD_OK;
}

__global__ void k_gather(float *xe, const float *x, const int32_t *row_tok, int R, int C)
{
    size_t id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id < (size_t)R * C)
        xe[id] = x[(size_t)row_tok[id / C] * C + id % C];
}

extern "C" qd_status qdk_gather(float *xe, const float *x, const int32_t *row_tok, int R, int C)
{
    if (R)
        QD_LAUNCH_N(k_gather, ((size_t)R * C), xe, x, row_tok, R, C);
    return QD_OK;
}

__global__ void k_swiglu(float *h, const float *g, const float *u, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        h[i] = qd_siluf(g[i]) * u[i];
}

extern "C" qd_status qdk_swiglu(float *h, const float *g, const float *u, size_t n)
{
    if (n)
        QD_LAUNCH_N(k_swiglu, (n), h, g, u, n);
    return QD_OK;
}

__global__ void k_swiglu_bwd(float *dg, float *du, const float *dh, const float *g, const float *u, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float s = qd_sigmoidf(g[i]);
    dg[i] = (dh[i] * u[i]) * (s * (1.0f + g[i] * (1.0f - s)));
    du[i] = dh[i] * qd_siluf(g[i]);
}

extern "C" qd_status qdk_swiglu_backward(float *dg, float *du, const float *dh, const float *g, const float *u,
                                         size_t n)
{
    if (n)
        QD_LAUNCH_N(k_swiglu_bwd, (n), dg, du, dh, g, u, n);
    return QD_OK;
}

__global__ void k_combine(float *out, const float *y, const float *row_w, const int32_t *tok_rows, int N, int K,
                          int C)
{
    size_t id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (size_t)N * C)
        return;
    int n = (int)(id / C), i = (int)(id % C);
    float acc = 0.0f;
    for (int j = 0; j < K; j++) {
        int r = tok_rows[n * K + j];
        acc = acc + y[(size_t)r * C + i] * row_w[r];
    }
    out[id] = acc;
}

extern "C" qd_status qdk_combine(float *out, const float *y, const float *row_w, const int32_t *tok_rows, int N,
                                 int K, int C)
{
    if (N)
        QD_LAUNCH_N(k_combine, ((size_t)N * C), out, y, row_w, tok_rows, N, K, C);
    return QD_OK;
}

/* One thread per (token, slot): the slot's dy row and dL/dweight. */
__global__ void k_moe_dy(float *dy, float *dwt, const float *dout, const float *y, const float *row_w,
                         const int32_t *row_rank, const int32_t *tok_rows, int N, int K, int C)
{
    int id = blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= N * K)
        return;
    int n = id / K, r = tok_rows[id];
    const float *yr = y + (size_t)r * C, *d = dout + (size_t)n * C;
    float acc = 0.0f;
    for (int i = 0; i < C; i++) {
        dy[(size_t)r * C + i] = d[i] * row_w[r];
        acc = acc + d[i] * yr[i];
    }
    dwt[n * K + row_rank[r]] = acc;
}

extern "C" qd_status qdk_moe_dy(float *dy, float *dwt, const float *dout, const float *y, const float *row_w,
                                const int32_t *row_rank, const int32_t *tok_rows, int N, int K, int C)
{
    if (N)
        QD_LAUNCH_N(k_moe_dy, ((size_t)N * K), dy, dwt, dout, y, row_w, row_rank, tok_rows, N, K, C);
    return QD_OK;
}

__global__ void k_unroute(float *dinp, const float *dxe, const int32_t *tok_rows, int N, int K, int C)
{
    size_t id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (size_t)N * C)
        return;
    int n = (int)(id / C), i = (int)(id % C);
    float v = dinp[id];
    for (int j = 0; j < K; j++)
        v = v + dxe[(size_t)tok_rows[n * K + j] * C + i];
    dinp[id] = v;
}

extern "C" qd_status qdk_unroute(float *dinp, const float *dxe, const int32_t *tok_rows, int N, int K, int C)
{
    if (N)
        QD_LAUNCH_N(k_unroute, ((size_t)N * C), dinp, dxe, tok_rows, N, K, C);
    return QD_OK;
}

__global__ void k_router_bwd(float *dlog, const float *dwt, const float *probs, const int32_t *topk,
                             const float *topw, int N, int E, int K, qd_topk_norm norm)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N)
        return;
    float *dl = dlog + (size_t)n * E;
    const float *p = probs + (size_t)n * E;
    const int32_t *ix = topk + (size_t)n * K;
    for (int e = 0; e < E; e++)
        dl[e] = 0.0f;
    float sum = 0.0f, wdw = 0.0f;
    for (int j = 0; j < K; j++) {
        sum = sum + p[ix[j]];
        wdw = wdw + dwt[n * K + j] * topw[n * K + j];
    }
    for (int j = 0; j < K; j++)
        dl[ix[j]] = norm == QD_TOPK_RENORM ? (dwt[n * K + j] - wdw) / sum : dwt[n * K + j];
    float pdp = 0.0f;
    for (int e = 0; e < E; e++)
        pdp = pdp + p[e] * dl[e];
    for (int e = 0; e < E; e++)
        dl[e] = p[e] * (dl[e] - pdp);
}

extern "C" qd_status qdk_router_backward(float *dlog, const float *dwt, const float *probs, const int32_t *topk,
                                         const float *topw, int N, int E, int K, qd_topk_norm norm)
{
    if (N)
        QD_LAUNCH_N(k_router_bwd, (N), dlog, dwt, probs, topk, topw, N, E, K, norm);
    return QD_OK;
}

/* ------------------------------------------------------------------------ */
/* log-probs                                                                 */

/* One block of QD_SAMPLE_LANES threads per token: lane j sums exp(s_i - m) over
 * i = j mod lanes ascending, then qd_softmax_lognorm's pairwise lane tree. */
__global__ void __launch_bounds__(QD_SAMPLE_LANES) k_logprob(float *logp, float *lse, float *s,
                                                             const float *logits, const int32_t *tgt, int V,
                                                             float T, int *bad)
{
    __shared__ float lane[QD_SAMPLE_LANES];
    int n = blockIdx.x, j = threadIdx.x;
    const float *l = logits + (size_t)n * V;
    if (T != 1.0f) {
        float *sr = s + (size_t)n * V;
        for (int i = j; i < V; i += QD_SAMPLE_LANES) {
            sr[i] = l[i] / T;
            if (!isfinite(sr[i]) && isfinite(l[i]))
                *bad = n + 1;
        }
        __syncthreads();
        l = sr;
    }
    /* max: every lane starts at s[0] and keeps a strictly larger value, as the CPU's loop */
    float m = l[0];
    for (int i = j; i < V; i += QD_SAMPLE_LANES)
        if (l[i] > m)
            m = l[i];
    lane[j] = m;
    __syncthreads();
    if (j == 0) {
        for (int i = 1; i < QD_SAMPLE_LANES; i++)
            if (lane[i] > m)
                m = lane[i];
        lane[0] = m + 0.0f;
    }
    __syncthreads();
    m = lane[0];
    __syncthreads();
    float acc = 0.0f;
    for (int i = j; i < V; i += QD_SAMPLE_LANES)
        acc = acc + qd_expf(l[i] - m);
    lane[j] = acc;
    __syncthreads();
    for (int w = QD_SAMPLE_LANES; w > 1; w /= 2) {
        if (j < w / 2)
            lane[j] = lane[j] + lane[j + w / 2];
        __syncthreads();
    }
    if (j == 0) {
        float logz = qd_logf(lane[0]);
        lse[n] = m + logz;
        logp[n] = tgt[n] >= 0 ? (l[tgt[n]] - m) - logz : 0.0f;
    }
}

extern "C" qd_status qdk_logprob(float *logp, float *lse, float *s, const float *logits, const int32_t *tgt,
                                 int N, int V, float T, int *bad)
{
    if (N)
        QD_LAUNCH(k_logprob, N, QD_SAMPLE_LANES, logp, lse, s, logits, tgt, V, T, bad);
    return QD_OK;
}

/* The sampler of backends/sampling.c (steps 1-6, 9, 10) for rows with no
 * top-k / top-p cut (and greedy rows), one block of QD_SAMPLE_LANES threads a
 * row: lane j sums tokens j, j + 1024, ... ascending (the lane definition is
 * the thread's own loop), the levels of the lane tree are the classic
 * shared-memory halving kept in tree[] at the CPU's offsets, and thread 0
 * descends it and walks the leaf lane as the CPU does, recomputing
 * e_i = qd_expf(x_i / T - m). A non-finite logit or scaled logit sets *bad
 * (the caller redoes the batch on the host for the message). */
__global__ void __launch_bounds__(QD_SAMPLE_LANES) k_sample(int32_t *tok, float *lp, float *lpk, const float *logits,
                                                            int V, float T, int greedy, uint64_t seed,
                                                            const uint64_t *sid, const uint32_t *spos, int *bad)
{
    enum { L = QD_SAMPLE_LANES };
    __shared__ float tree[2 * L - 1];
    __shared__ float mx[L];
    __shared__ int am[L];
    int b = blockIdx.x, j = threadIdx.x;
    const float *x = logits + (size_t)b * V;
    /* steps 1-2: s_i = x_i / T, its max and the lowest id attaining it */
    float m = x[0] / T;
    int a = 0;
    for (int i = j; i < V; i += L) {
        float si = x[i] / T;
        if (!isfinite(x[i]) || !isfinite(si))
            *bad = 1;
        if (si > m || (si == m && i < a)) {
            m = si;
            a = i;
        }
    }
    mx[j] = m;
    am[j] = a;
    __syncthreads();
    for (int w = L / 2; w > 0; w /= 2) {
        if (j < w && (mx[j + w] > mx[j] || (mx[j + w] == mx[j] && am[j + w] < am[j]))) {
            mx[j] = mx[j + w];
            am[j] = am[j + w];
        }
        __syncthreads();
    }
    m = mx[0] + 0.0f;
    a = am[0];
    /* steps 3-5: the lane tree of e_i = exp(s_i - m) */
    float acc = 0.0f;
    for (int i = j; i < V; i += L)
        acc = acc + qd_expf(x[i] / T - m);
    tree[j] = acc;
    __syncthreads();
    for (int n = L; n > 1; n /= 2) {
        const float *child = tree + 2 * L - 2 * n;
        float *parent = tree + 2 * L - n;
        if (j < n / 2)
            parent[j] = child[j] + child[j + n / 2];
        __syncthreads();
    }
    if (j != 0)
        return;
    float Z = tree[2 * L - 2], logZ = qd_logf(Z);
    if (greedy) {
        tok[b] = a;
        lp[b] = (x[a] / T - m) - logZ;
        lpk[b] = 0.0f;
        return;
    }
    /* step 9: the draw, descending the tree of Z (no cut: Z_kept = Z) */
    float r = qd_philox_sample_u(seed, sid[b], spos[b]) * Z;
    int k = 0;
    for (int n = 2; n <= L; n *= 2) {
        const float *level = tree + 2 * L - 2 * n;
        float lo = level[k], hi = level[k + n / 2];
        if (!(r < lo || hi == 0.0f)) {
            r = r - lo;
            k += n / 2;
        }
    }
    float c = 0.0f;
    int t = -1;
    for (int i = k; i < V; i += L) {
        float w = qd_expf(x[i] / T - m);
        c = c + w;
        if (c > r) {
            t = i;
            break;
        }
        if (w > 0.0f)
            t = i;
    }
    float d = x[t] / T - m;
    tok[b] = t;
    lp[b] = d - logZ;
    lpk[b] = d - qd_logf(Z);
}

extern "C" qd_status qdk_sample(int32_t *tok, float *lp, float *lpk, const float *logits, int B, int V, float T,
                                uint64_t seed, const uint64_t *sid, const uint32_t *spos, int *bad)
{
    int greedy = T == 0.0f;
    if (B)
        QD_LAUNCH(k_sample, B, QD_SAMPLE_LANES, tok, lp, lpk, logits, V, greedy ? 1.0f : T, greedy, seed, sid, spos,
                  bad);
    return QD_OK;
}

__global__ void k_logprob_bwd(float *dlogits, const float *dlogp, const float *logits, const float *lse,
                              const int32_t *tgt, int N, int V, float T)
{
    size_t id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (size_t)N * V)
        return;
    int n = (int)(id / V), j = (int)(id % V);
    float d = tgt[n] >= 0 ? dlogp[n] / T : 0.0f;
    float p = qd_expf(logits[id] / T - lse[n]);
    dlogits[id] = d * ((j == tgt[n] ? 1.0f : 0.0f) - p);
}

extern "C" qd_status qdk_logprob_backward(float *dlogits, const float *dlogp, const float *logits,
                                          const float *lse, const int32_t *tgt, int N, int V, float T)
{
    if (N)
        QD_LAUNCH_N(k_logprob_bwd, ((size_t)N * V), dlogits, dlogp, logits, lse, tgt, N, V, T);
    return QD_OK;
}

/* ------------------------------------------------------------------------ */
/* statistics and AdamW                                                      */

__global__ void k_sqerr_rows(double *err, double *nrm, const float *x, const float *xh, int rows, int cols)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows)
        return;
    double e = 0.0, x2 = 0.0;
    for (size_t i = (size_t)r * cols; i < (size_t)(r + 1) * cols; i++) {
        double d = (double)x[i] - (double)xh[i];
        e = e + d * d;
        x2 = x2 + (double)x[i] * (double)x[i];
    }
    err[r] = e;
    nrm[r] = x2;
}

extern "C" qd_status qdk_sqerr_rows(double *err, double *nrm, const float *x, const float *xh, int rows, int cols)
{
    if (rows)
        QD_LAUNCH_N(k_sqerr_rows, (rows), err, nrm, x, xh, rows, cols);
    return QD_OK;
}

__global__ void k_rac_error(double *err, const float *x, const float *xh, int rows, int K)
{
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= K)
        return;
    double e = err[k];
    for (int r = 0; r < rows; r++) {
        float d = x[(size_t)r * K + k] - xh[(size_t)r * K + k];
        e = e + (double)d * (double)d;
    }
    err[k] = e;
}

extern "C" qd_status qdk_rac_error(double *err, const float *x, const float *xh, int rows, int K)
{
    if (rows)
        QD_LAUNCH_N(k_rac_error, (K), err, x, xh, rows, K);
    return QD_OK;
}

__global__ void k_rac_copy_main(float *out, const float *deq, int rows, int K, int64_t kc)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)rows * K)
        out[i] = deq[(i / K) * kc + i % K];
}

__global__ void k_rac_add_residual(float *out, const float *deq, const int64_t *ch, int rows, int K, int64_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * n)
        return;
    size_t r = i / n, j = i % n;
    out[r * K + ch[j]] = __fadd_rn(out[r * K + ch[j]], deq[r * (K + n) + K + j]);
}

extern "C" qd_status qdk_rac_fold(float *out, const float *deq, const int64_t *ch, int rows, int K, int64_t n)
{
    if (rows == 0 || K == 0)
        return QD_OK;
    QD_LAUNCH_N(k_rac_copy_main, (size_t)rows * K, out, deq, rows, K, K + n);
    if (n)
        QD_LAUNCH_N(k_rac_add_residual, (size_t)rows * n, out, deq, ch, rows, K, n);
    return QD_OK;
}

/* k_rac_error over the experts of a layer: block row e sums expert e's rows
 * off[e] .. off[e+1]-1 (device) into err[e] (a device array of E pointers). */
__global__ void k_rac_error_grouped(double *const *err, const float *x, const float *xh, const int32_t *off, int K)
{
    int e = blockIdx.y, k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= K || off[e] == off[e + 1])
        return;
    double acc = err[e][k];
    for (int r = off[e]; r < off[e + 1]; r++) {
        float d = x[(size_t)r * K + k] - xh[(size_t)r * K + k];
        acc = acc + (double)d * (double)d;
    }
    err[e][k] = acc;
}

extern "C" qd_status qdk_rac_error_grouped(double *const *err, const float *x, const float *xh, const int32_t *off,
                                           int E, int K)
{
    if (E && K)
        QD_LAUNCH(k_rac_error_grouped, dim3(blocks((size_t)K, TPB), (unsigned)E), TPB, err, x, xh, off, K);
    return QD_OK;
}

__global__ void k_sumsq_chunks(double *part, const float *g, size_t n)
{
    size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k * 4096 >= n)
        return;
    size_t end = (k + 1) * 4096 < n ? (k + 1) * 4096 : n;
    double s = 0.0;
    for (size_t i = k * 4096; i < end; i++)
        s = s + (double)g[i] * (double)g[i];
    part[k] = s;
}

extern "C" qd_status qdk_sumsq_chunks(double *part, const float *g, size_t n)
{
    if (n)
        QD_LAUNCH_N(k_sumsq_chunks, ((n + 4095) / 4096), part, g, n);
    return QD_OK;
}

__global__ void k_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                        float beta2, float eps, float wd, float gscale, float bc1, float bc2)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float gi = g[i] * gscale;
    m[i] = beta1 * m[i] + (1.0f - beta1) * gi;
    v[i] = beta2 * v[i] + (1.0f - beta2) * (gi * gi);
    float mh = m[i] / bc1, vh = v[i] / bc2;
    p[i] = p[i] - lr * (mh / (sqrtf(vh) + eps) + wd * p[i]);
}

extern "C" qd_status qdk_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                               float beta2, float eps, float wd, float gscale, float bc1, float bc2)
{
    if (n)
        QD_LAUNCH_N(k_adamw, (n), p, g, m, v, n, lr, beta1, beta2, eps, wd, gscale, bc1, bc2);
    return QD_OK;
}
