/* The exact-mode kernels (cuda_kernels.h): each one the CPU backend's
 * function of the same name, line for line in its arithmetic. Most are one
 * thread per output; qdk_matmul tiles through shared memory but keeps every
 * output's sum in one thread, k ascending, so the tiling changes no bit. */
#include <cuda_runtime.h>
#include <cub/device/device_radix_sort.cuh>
#include <limits.h>
#include <stdlib.h>
#include <math.h>
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_rows.cuh"
#include "backends/exact_math.h"
#include "backends/philox.h"
#include "backends/router.h"
extern "C" {
#include "backends/cuda/cuda_kernels.h"
#include "backends/sampling.h"
}

#define QD_LAUNCH(kernel, grid, block, ...)                                          \
    do {                                                                             \
        qd_launch(kernel, (grid), (block), 0, __VA_ARGS__);                          \
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
        qd_launch(kernel, (grid), (block), (smem), __VA_ARGS__);                     \
        QD_CUDA_CHECK(cudaGetLastError());                                           \
    } while (0)

/* One thread per item of n (n > 0). */
#define QD_LAUNCH_N(kernel, n, ...) QD_LAUNCH(kernel, blocks((n), TPB), TPB, __VA_ARGS__)

__global__ void k_round_bf16(float *dst, const float *src, size_t n)
{
    QD_PDL_ENTRY();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] = qd_round_bf16(src[i]);
}

/* Four values a thread (16-byte loads and stores: the weight sync rounds the
 * whole master, 3.1B floats for a3b at 4 layers), each as k_round_bf16. */
__global__ void k_round_bf16_x4(float4 *dst, const float4 *src, size_t n4)
{
    QD_PDL_ENTRY();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 v = src[i];
        dst[i] = make_float4(qd_round_bf16(v.x), qd_round_bf16(v.y), qd_round_bf16(v.z), qd_round_bf16(v.w));
    }
}

extern "C" qd_status qdk_round_bf16(float *dst, const float *src, size_t n)
{
    size_t n4 = qd_aligned(dst, 16) && qd_aligned(src, 16) ? n / 4 : 0;
    if (n4)
        QD_LAUNCH(k_round_bf16_x4, blocks(n4, TPB), TPB, (float4 *)dst, (const float4 *)src, n4);
    if (n > 4 * n4)
        QD_LAUNCH_N(k_round_bf16, (n - 4 * n4), dst + 4 * n4, src + 4 * n4, n - 4 * n4);
    return QD_OK;
}

static __device__ uint32_t bf16_hi(float x) { return qd_f32_bits(qd_round_bf16(x)) >> 16; }
/* The BF16 bits of four floats, packed in order (16-byte loads, 8-byte stores). */
static __device__ uint2 bf16x4(float4 v)
{
    return make_uint2(bf16_hi(v.x) | bf16_hi(v.y) << 16, bf16_hi(v.z) | bf16_hi(v.w) << 16);
}

__global__ void k_bf16_bits(uint16_t *dst, const float *src, size_t n)
{
    QD_PDL_ENTRY();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] = (uint16_t)bf16_hi(src[i]);
}

/* Four values a thread: a 16-byte load, an 8-byte store. */
__global__ void k_bf16_bits_x4(uint2 *dst, const float4 *src, size_t n4)
{
    QD_PDL_ENTRY();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 v = src[i];
        dst[i] = bf16x4(v);
    }
}

extern "C" qd_status qdk_bf16_bits(uint16_t *dst, const float *src, size_t n)
{
    size_t n4 = qd_aligned(dst, 8) && qd_aligned(src, 16) ? n / 4 : 0;
    if (n4)
        QD_LAUNCH(k_bf16_bits_x4, blocks(n4, TPB), TPB, (uint2 *)dst, (const float4 *)src, n4);
    if (n > 4 * n4)
        QD_LAUNCH_N(k_bf16_bits, (n - 4 * n4), dst + 4 * n4, src + 4 * n4, n - 4 * n4);
    return QD_OK;
}

/* dst = BF16 bits of src / *s (0 where *s is 0): a fake-quant weight's E2M1 x
 * E4M3 part, a BF16 value (at most 6 significant bits), recovered exactly from
 * (e2m1 * e4m3) * s_dec rounded to float32. */
static __device__ __forceinline__ uint16_t bits_div(float x, float d)
{
    return (uint16_t)bf16_hi(d == 0.0f ? 0.0f : x / d);
}

__global__ void k_bf16_bits_div(uint16_t *dst, const float *src, size_t n, const float *s)
{
    QD_PDL_ENTRY();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    float d = *s;
    if (i < n)
        dst[i] = bits_div(src[i], d);
}

extern "C" qd_status qdk_bf16_bits_div(uint16_t *dst, const float *src, size_t n, const float *s)
{
    if (n)
        QD_LAUNCH_N(k_bf16_bits_div, n, dst, src, n, s);
    return QD_OK;
}

/* k_bf16_bits_div over the ranges of a group, range blockIdx.y. */
__global__ void k_bf16_bits_div_group(const __grid_constant__ qdk_div_group g)
{
    QD_PDL_ENTRY();
    int y = blockIdx.y;
    float d = *g.s[y];
    size_t n = g.n[y];
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        g.dst[y][i] = bits_div(g.src[y][i], d);
}

extern "C" qd_status qdk_bf16_bits_div_group(const qdk_div_group *g, int m)
{
    size_t most = 0;
    for (int j = 0; j < m; j++)
        most = g->n[j] > most ? g->n[j] : most;
    if (m <= 0 || most == 0)
        return QD_OK;
    size_t cap = (size_t)qd_sm_count() * 16 / (size_t)m, nb = blocks(most, 256);
    nb = nb < cap ? nb : cap;
    QD_LAUNCH(k_bf16_bits_div_group, dim3((unsigned)(nb ? nb : 1), (unsigned)m), 256, *g);
    return QD_OK;
}

/* A column block: dst (rows, cols) compact from src rows of stride ld, four
 * values a thread (cols, ld multiples of 4, pointers aligned: the caller checks). */
__global__ void k_bf16_bits_cols_x4(uint2 *dst, const float4 *src, int64_t rows, int64_t cols4, int64_t ld4)
{
    QD_PDL_ENTRY();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols4) {
        float4 v = src[i / cols4 * ld4 + i % cols4];
        dst[i] = bf16x4(v);
    }
}

__global__ void k_bf16_bits_cols(uint16_t *dst, const float *src, int64_t rows, int64_t cols, int64_t ld)
{
    QD_PDL_ENTRY();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols)
        dst[i] = (uint16_t)bf16_hi(src[i / cols * ld + i % cols]);
}

extern "C" qd_status qdk_bf16_bits_cols(uint16_t *dst, const float *src, int64_t rows, int64_t cols, int64_t ld)
{
    if (rows <= 0 || cols <= 0)
        return QD_OK;
    if (cols == ld)
        return qdk_bf16_bits(dst, src, (size_t)(rows * cols));
    if (cols % 4 == 0 && ld % 4 == 0 && qd_aligned(dst, 8) && qd_aligned(src, 16))
        QD_LAUNCH_N(k_bf16_bits_cols_x4, ((size_t)(rows * cols / 4)), (uint2 *)dst, (const float4 *)src, rows,
                    cols / 4, ld / 4);
    else
        QD_LAUNCH_N(k_bf16_bits_cols, ((size_t)(rows * cols)), dst, src, rows, cols, ld);
    return QD_OK;
}

/* IX: the flat index's type. Elementwise kernels over row-major (rows, C)
 * arrays split their index into a row and a column; with 32-bit indices
 * (where n fits: fits32) that is a 32-bit division, not a 64-bit one (a
 * subroutine of some 60 instructions: at 16 x 1,024 tokens an ALU cost of
 * the order of the bytes' time). The same elements, so the same bits. */
static int fits32(size_t n) { return n <= (size_t)INT_MAX; }

template <typename IX> __global__ void k_embed(float *x, const float *emb, const int32_t *tok, int N, int C)
{
    QD_PDL_ENTRY();
    IX i = (IX)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (IX)N * (IX)C)
        x[i] = emb[(size_t)tok[i / (IX)C] * C + i % (IX)C];
}

extern "C" qd_status qdk_embed(float *x, const float *emb, const int32_t *tok, int N, int C)
{
    if (N && fits32((size_t)N * C))
        QD_LAUNCH_N(k_embed<unsigned>, ((size_t)N * C), x, emb, tok, N, C);
    else if (N)
        QD_LAUNCH_N(k_embed<size_t>, ((size_t)N * C), x, emb, tok, N, C);
    return QD_OK;
}

__global__ void k_embed_w16(float *x, const uint16_t *emb, const int32_t *tok, int N, int C)
{
    QD_PDL_ENTRY();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)N * C)
        x[i] = qd_bf16_to_f32(emb[(size_t)tok[i / C] * C + i % C]);
}

extern "C" qd_status qdk_embed_w16(float *x, const uint16_t *emb, const int32_t *tok, int N, int C)
{
    if (N)
        QD_LAUNCH_N(k_embed_w16, ((size_t)N * C), x, emb, tok, N, C);
    return QD_OK;
}

/* One thread per column i, tokens ascending: each row of gemb receives its
 * tokens' additions in the CPU's order. Tokens go EB_U at a time so that the
 * loads of a batch are in flight together (and the next batch's tokens and
 * dres are loaded before this one's adds): a token repeated within a batch
 * adds to its previous occurrence's new value in registers, and the stores
 * run in token order, so the last one leaves the final sum. */
#define EB_U 16

static __device__ __forceinline__ void eb_load(int *t, float *d, const float *dres, const int32_t *tok, int n0,
                                               int N, int C, int i)
{
#pragma unroll
    for (int u = 0; u < EB_U; u++) {
        t[u] = n0 + u < N ? __ldg(tok + n0 + u) : 0;
        d[u] = n0 + u < N ? dres[(size_t)(n0 + u) * C + i] : 0.0f;
    }
}

__global__ void k_embed_backward(float *gemb, const float *dres, const int32_t *tok, int N, int C)
{
    QD_PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= C)
        return;
    int t[EB_U], tn[EB_U];
    float d[EB_U], dn[EB_U], g[EB_U];
    eb_load(t, d, dres, tok, 0, N, C, i);
    for (int n0 = 0; n0 < N; n0 += EB_U) {
        int m = min(EB_U, N - n0);
#pragma unroll
        for (int u = 0; u < EB_U; u++)
            g[u] = u < m ? gemb[(size_t)t[u] * C + i] : 0.0f;
        if (n0 + EB_U < N)
            eb_load(tn, dn, dres, tok, n0 + EB_U, N, C, i);
#pragma unroll
        for (int u = 0; u < EB_U; u++) {
            float v = g[u];
#pragma unroll
            for (int a = 0; a < u; a++)
                if (t[a] == t[u])
                    v = g[a];
            g[u] = v + d[u];
        }
#pragma unroll
        for (int u = 0; u < EB_U; u++)
            if (u < m)
                gemb[(size_t)t[u] * C + i] = g[u];
#pragma unroll
        for (int u = 0; u < EB_U; u++) {
            t[u] = tn[u];
            d[u] = dn[u];
        }
    }
}

/* The same sums with the tokens grouped first: a stable sort of (token,
 * position) pairs (CUB's radix sort: equal tokens keep their positions
 * ascending), then a thread per (token, column) at the head of each token's
 * run adds that run's rows into its gemb value in position order: each sum
 * the CPU's chain, so the same bits. k_embed_backward walks all N tokens in
 * one thread a column, C threads in all (a3b: 2,048 on 132 SMs, each waiting
 * on a gather of gemb rows every 16 tokens: ~1 ms for 16 x 1,024 tokens). */
#define EB_COLS 128

__global__ void k_iota(int32_t *v, int n)
{
    QD_PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        v[i] = i;
}

__global__ void __launch_bounds__(EB_COLS) k_embed_backward_runs(float *gemb, const float *dres, const int32_t *stok,
                                                                 const int32_t *spos, int N, int C)
{
    QD_PDL_ENTRY();
    int k = blockIdx.x, i = blockIdx.y * EB_COLS + threadIdx.x, t = stok[k];
    if ((k > 0 && stok[k - 1] == t) || i >= C)
        return;
    float *g = gemb + (size_t)t * C + i, v = *g;
    /* EB_U rows' loads in flight at once (a frequent token's run is long),
     * added in order */
    for (int m0 = k, more = 1; more; m0 += EB_U) {
        float d[EB_U];
        int in[EB_U];
#pragma unroll
        for (int u = 0; u < EB_U; u++) {
            int m = m0 + u;
            in[u] = m < N && __ldg(stok + m) == t;
            d[u] = in[u] ? dres[(size_t)__ldg(spos + m) * C + i] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < EB_U; u++)
            if (in[u])
                v = v + d[u];
        more = in[EB_U - 1];
    }
    *g = v;
}

/* work: the sorted tokens, the positions before and after, CUB's storage */
static size_t eb_cub_bytes(int N)
{
    size_t b = 0;
    cub::DeviceRadixSort::SortPairs(NULL, b, (const int32_t *)NULL, (int32_t *)NULL, (const int32_t *)NULL,
                                    (int32_t *)NULL, N);
    return b;
}

extern "C" size_t qdk_embed_backward_work_bytes(int N)
{
    return N > QDK_EMBED_SORT_MIN ? 3 * (((size_t)N * sizeof(int32_t) + 255) & ~(size_t)255) + eb_cub_bytes(N) : 0;
}

extern "C" qd_status qdk_embed_backward(float *gemb, const float *dres, const int32_t *tok, int N, int C, void *work)
{
    if (!N)
        return QD_OK;
    if (work && N > QDK_EMBED_SORT_MIN && N <= INT_MAX / 2) {
        size_t a = ((size_t)N * sizeof(int32_t) + 255) & ~(size_t)255, cb = eb_cub_bytes(N);
        int32_t *stok = (int32_t *)work, *pos = (int32_t *)((char *)work + a), *spos = (int32_t *)((char *)work + 2 * a);
        void *tmp = (char *)work + 3 * a;
        QD_LAUNCH_N(k_iota, (N), pos, N);
        QD_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(tmp, cb, tok, stok, pos, spos, N));
        QD_LAUNCH(k_embed_backward_runs, dim3((unsigned)N, blocks((size_t)C, EB_COLS)), EB_COLS, gemb, dres, stok,
                  spos, N, C);
        return QD_OK;
    }
    QD_LAUNCH(k_embed_backward, blocks((size_t)C, 64), 64, gemb, dres, tok, N, C);
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
    QD_PDL_ENTRY();
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
    QD_PDL_ENTRY();
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

/* Where row `row` of stage column k sits in S[k][.]: groups of 4 rows stay
 * together (the float4 reads), group g at g ^ (k/4 mod 8) (within the tile),
 * so that a warp's stores of 4 rows x 8 k land in 32 banks, not 4. */
template <int ROWS>
static __device__ __forceinline__ int mw_swz(int row, int k)
{
    constexpr int G = ROWS / 4, M = (G < 8 ? G : 8) - 1;
    return (((row >> 2) ^ ((k >> 2) & M)) << 2) | (row & 3);
}

/* A stage's operands through registers: mp_fetch loads thread t's share of
 * rows r0 .. r0+ROWS-1 of x (R, K), columns k0 .. k0+MW_BK-1 (out of range:
 * 0), mp_store puts them at S[k][mw_swz(row, k)] and summarizes them. W's stage
 * (float32 or BF16 bits) and A's. */
template <int ROWS> struct mp_regs {
    float4 v[(ROWS * (MW_BK / 4) + 127) / 128];
};
struct mp_regs16 {
    uint4 v[MW_BN * (MW_BK / 8) / 128];
};

template <int ROWS>
static __device__ __forceinline__ void mp_fetch(mp_regs<ROWS> &r, const float *x, int r0, int R, int K, int k0)
{
#pragma unroll
    for (int i = 0; i < (ROWS * (MW_BK / 4) + 127) / 128; i++) {
        int idx = threadIdx.x + 128 * i, row = idx >> 3, k = k0 + (idx & 7) * 4;
        r.v[i] = idx < ROWS * (MW_BK / 4) && r0 + row < R && k < K
                     ? __ldg((const float4 *)(x + (size_t)(r0 + row) * K + k))
                     : make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

static __device__ __forceinline__ void mp_fetch(mp_regs16 &r, const uint16_t *w, int n0, int N, int K, int k0)
{
#pragma unroll
    for (int i = 0; i < MW_BN * (MW_BK / 8) / 128; i++) {
        int idx = threadIdx.x + 128 * i, row = idx >> 2, k = k0 + (idx & 3) * 8;
        r.v[i] = n0 + row < N && k < K ? __ldg((const uint4 *)(w + (size_t)(n0 + row) * K + k))
                                       : make_uint4(0, 0, 0, 0);
    }
}

/* Zeros (padding) leave a summary as it is. */
template <int ROWS>
static __device__ __forceinline__ void mp_store(float (*S)[ROWS], const mp_regs<ROWS> &r, mw_sum *sum)
{
#pragma unroll
    for (int i = 0; i < (ROWS * (MW_BK / 4) + 127) / 128; i++) {
        int idx = threadIdx.x + 128 * i, row = idx >> 3, k = (idx & 7) * 4;
        if (idx >= ROWS * (MW_BK / 4))
            break;
        float4 v = r.v[i];
        mw_see(sum, __float_as_uint(v.x));
        mw_see(sum, __float_as_uint(v.y));
        mw_see(sum, __float_as_uint(v.z));
        mw_see(sum, __float_as_uint(v.w));
        int col = mw_swz<ROWS>(row, k);
        S[k][col] = v.x;
        S[k + 1][col] = v.y;
        S[k + 2][col] = v.z;
        S[k + 3][col] = v.w;
    }
}

static __device__ __forceinline__ void mp_store(float (*Ws)[MW_BN], const mp_regs16 &r, mw_sum *sw)
{
#pragma unroll
    for (int i = 0; i < MW_BN * (MW_BK / 8) / 128; i++) {
        int idx = threadIdx.x + 128 * i, row = idx >> 2, k = (idx & 3) * 8;
        uint32_t u[4] = {r.v[i].x, r.v[i].y, r.v[i].z, r.v[i].w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint32_t lo = u[j] << 16, hi = u[j] & 0xffff0000u;
            mw_see(sw, lo);
            mw_see(sw, hi);
            Ws[k + 2 * j][mw_swz<MW_BN>(row, k + 2 * j)] = __uint_as_float(lo);
            Ws[k + 2 * j + 1][mw_swz<MW_BN>(row, k + 2 * j + 1)] = __uint_as_float(hi);
        }
    }
}

template <typename TW> struct mp_wregs;
template <> struct mp_wregs<float> {
    typedef mp_regs<MW_BN> type;
};
template <> struct mp_wregs<uint16_t> {
    typedef mp_regs16 type;
};

template <int TM, bool FMA>
static __device__ __forceinline__ void mw_step(float (&acc)[TM][8], const float (*Ws)[MW_BN],
                                               const float (*As)[8 * TM], int kk, int tx, int ty)
{
    float4 w0 = *(const float4 *)&Ws[kk][mw_swz<MW_BN>(4 * tx, kk)];
    float4 w1 = *(const float4 *)&Ws[kk][mw_swz<MW_BN>(64 + 4 * tx, kk)];
    float wv[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w}, av[TM];
    if constexpr (TM % 4 == 0) {
#pragma unroll
        for (int i = 0; i < TM; i += 4) {
            float4 a4 = *(const float4 *)&As[kk][mw_swz<8 * TM>(ty * TM + i, kk)];
            av[i] = a4.x;
            av[i + 1] = a4.y;
            av[i + 2] = a4.z;
            av[i + 3] = a4.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < TM; i++)
            av[i] = As[kk][mw_swz<8 * TM>(ty * TM + i, kk)];
    }
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < 8; j++)
            acc[i][j] = FMA ? fmaf(av[i], wv[j], acc[i][j]) : acc[i][j] + av[i] * wv[j];
}

/* A whole stage of fmaf steps unrolled (the swizzled addresses then fold to
 * constants a thread; QUADS_MATMUL_UNROLL=0, benchmarks only, keeps the loop). */
template <int TM, bool FMA>
static __device__ __forceinline__ void mw_tile(float (&acc)[TM][8], const float (*Ws)[MW_BN],
                                               const float (*As)[8 * TM], int kmax, int tx, int ty, int unroll)
{
    if (FMA && unroll && kmax == MW_BK) {
#pragma unroll
        for (int kk = 0; kk < MW_BK; kk++)
            mw_step<TM, FMA>(acc, Ws, As, kk, tx, ty);
        return;
    }
    for (int kk = 0; kk < kmax; kk++)
        mw_step<TM, FMA>(acc, Ws, As, kk, tx, ty);
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

/* Whether a stage may use fmaf (see above): the CTA's summaries of the A and W
 * elements it staged, combined over its 4 warps (a block barrier inside). */
static __device__ __forceinline__ int mw_stage_fma(mw_sum sa, mw_sum sw, mw_sum (*s_sum)[4], int check)
{
    int wid = threadIdx.x >> 5;
    if (check) {
        mw_reduce(&sa);
        mw_reduce(&sw);
        if ((threadIdx.x & 31) == 0) {
            s_sum[0][wid] = sa;
            s_sum[1][wid] = sw;
        }
    }
    __syncthreads();
    if (!check)
        return 0;
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
        return !bad; /* one operand all zeros: every product is a zero */
    int la = (int)(x[0].emin >> 23), lw = (int)(x[1].emin >> 23);
    la = (la > 1 ? la : 1) - 134;
    lw = (lw > 1 ? lw : 1) - 134;
    return !bad && la + lw >= -149 && ea + ew <= 378;
}

/* PF: the next stage's operands are loaded into registers while the current
 * one computes (global latency off the critical path, 48 more registers a
 * thread at TM = 8); else each stage loads, then computes. Same stages, same
 * rule, same bits. */
template <int TM, typename TW, bool PF>
__global__ void __launch_bounds__(128) k_matmul_wt(float *c, const float *a, const TW *w, int M, int N, int K,
                                                   int check, int unroll)
{
    QD_PDL_ENTRY();
    constexpr int BM = 8 * TM;
    __shared__ __align__(16) float Ws[MW_BK][MW_BN];
    __shared__ __align__(16) float As[MW_BK][BM];
    __shared__ mw_sum s_sum[2][4];
    int tx = threadIdx.x & 15, ty = threadIdx.x >> 4, n0 = blockIdx.x * MW_BN, m0 = blockIdx.y * BM;
    float acc[TM][8];
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < 8; j++)
            acc[i][j] = 0.0f;
    typename mp_wregs<TW>::type rw;
    mp_regs<BM> ra;
    if (PF) {
        mp_fetch(rw, w, n0, N, K, 0);
        mp_fetch<BM>(ra, a, m0, M, K, 0);
    }
    for (int k0 = 0; k0 < K; k0 += MW_BK) {
        mw_sum sa = {0u, 0xffffffffu, 0u}, sw = {0u, 0xffffffffu, 0u};
        if (!PF) {
            mp_fetch(rw, w, n0, N, K, k0);
            mp_fetch<BM>(ra, a, m0, M, K, k0);
        }
        __syncthreads();
        mp_store(Ws, rw, &sw);
        mp_store<BM>(As, ra, &sa);
        if (PF && k0 + MW_BK < K) {
            mp_fetch(rw, w, n0, N, K, k0 + MW_BK);
            mp_fetch<BM>(ra, a, m0, M, K, k0 + MW_BK);
        }
        int kmax = K - k0 < MW_BK ? K - k0 : MW_BK, fma = mw_stage_fma(sa, sw, s_sum, check);
        if (fma)
            mw_tile<TM, true>(acc, Ws, As, kmax, tx, ty, unroll);
        else
            mw_tile<TM, false>(acc, Ws, As, kmax, tx, ty, 0);
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

/* The same products for outputs too few to fill the H200 with k_matmul_wt's
 * 128-column tiles (the MoE router: 128 outputs): a CTA owns 32 weight rows
 * and 4 activation rows, one output a thread, the next stage's operands
 * fetched into registers while this one computes (the chains are long and
 * latency-bound: 2048 k for 64 x 128 outputs took 0.62 ms in one wide CTA).
 * Same sums from 0, k ascending, same stage rule: same bits. */
#define MT_BN 32
#define MT_BM 4
#define MT_SUB 4 /* a stage: MT_SUB x MW_BK = 128 k */
template <typename TW> struct mt_regs;
template <> struct mt_regs<float> {
    float4 w[MT_SUB][2], a[MT_SUB];
};
template <> struct mt_regs<uint16_t> {
    uint4 w[MT_SUB];
    float4 a[MT_SUB];
};

static __device__ __forceinline__ float4 mt_ld4(const float *x, int r, int R, int K, int k)
{
    return r < R && k < K ? __ldg((const float4 *)(x + (size_t)r * K + k)) : make_float4(0.f, 0.f, 0.f, 0.f);
}

/* Thread t, for each 32-k part p of the stage: W rows t/8 and t/8 + 16 at k
 * 4(t%8) (float) or row t/4 at k 8(t%4) (BF16 bits); threads 0..31 also A
 * row t/8 at k 4(t%8). */
static __device__ __forceinline__ void mt_fetch(mt_regs<float> &r, const float *w, const float *a, int n0, int m0,
                                                int N, int M, int K, int k0)
{
    int t = threadIdx.x;
#pragma unroll
    for (int p = 0; p < MT_SUB; p++) {
        int k = k0 + p * MW_BK + (t & 7) * 4;
        r.w[p][0] = mt_ld4(w, n0 + (t >> 3), N, K, k);
        r.w[p][1] = mt_ld4(w, n0 + (t >> 3) + 16, N, K, k);
        if (t < 32)
            r.a[p] = mt_ld4(a, m0 + (t >> 3), M, K, k);
    }
}

static __device__ __forceinline__ void mt_fetch(mt_regs<uint16_t> &r, const uint16_t *w, const float *a, int n0,
                                                int m0, int N, int M, int K, int k0)
{
    int t = threadIdx.x, row = n0 + (t >> 2);
#pragma unroll
    for (int p = 0; p < MT_SUB; p++) {
        int k = k0 + p * MW_BK + (t & 3) * 8;
        r.w[p] = row < N && k < K ? __ldg((const uint4 *)(w + (size_t)row * K + k)) : make_uint4(0, 0, 0, 0);
        if (t < 32)
            r.a[p] = mt_ld4(a, m0 + (t >> 3), M, K, k0 + p * MW_BK + (t & 7) * 4);
    }
}

/* Zeros (padding) leave a summary as it is, so they are summarized too. */
static __device__ __forceinline__ void mt_put4(float (*S)[MT_BN + 1], int k, int row, float4 v, mw_sum *s)
{
    float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        S[k + i][row] = e[i];
        mw_see(s, __float_as_uint(e[i]));
    }
}

static __device__ __forceinline__ void mt_store_a(float (*As)[MT_BN + 1], const float4 *a, mw_sum *sa)
{
    int t = threadIdx.x;
    if (t < 32)
#pragma unroll
        for (int p = 0; p < MT_SUB; p++)
            mt_put4(As, p * MW_BK + (t & 7) * 4, t >> 3, a[p], sa);
}

static __device__ __forceinline__ void mt_store(float (*Ws)[MT_BN + 1], float (*As)[MT_BN + 1],
                                                const mt_regs<float> &r, mw_sum *sw, mw_sum *sa)
{
    int t = threadIdx.x;
#pragma unroll
    for (int p = 0; p < MT_SUB; p++) {
        int k = p * MW_BK + (t & 7) * 4;
        mt_put4(Ws, k, t >> 3, r.w[p][0], sw);
        mt_put4(Ws, k, (t >> 3) + 16, r.w[p][1], sw);
    }
    mt_store_a(As, r.a, sa);
}

static __device__ __forceinline__ void mt_store(float (*Ws)[MT_BN + 1], float (*As)[MT_BN + 1],
                                                const mt_regs<uint16_t> &r, mw_sum *sw, mw_sum *sa)
{
    int t = threadIdx.x, row = t >> 2;
#pragma unroll
    for (int p = 0; p < MT_SUB; p++) {
        int k = p * MW_BK + (t & 3) * 8;
        uint32_t u[4] = {r.w[p].x, r.w[p].y, r.w[p].z, r.w[p].w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t lo = u[i] << 16, hi = u[i] & 0xffff0000u;
            Ws[k + 2 * i][row] = __uint_as_float(lo);
            Ws[k + 2 * i + 1][row] = __uint_as_float(hi);
            mw_see(sw, lo);
            mw_see(sw, hi);
        }
    }
    mt_store_a(As, r.a, sa);
}

template <typename TW>
__global__ void __launch_bounds__(128) k_matmul_wt_thin(float *c, const float *a, const TW *w, int M, int N, int K,
                                                        int check)
{
    QD_PDL_ENTRY();
    constexpr int BK = MT_SUB * MW_BK;
    __shared__ float Ws[BK][MT_BN + 1];
    __shared__ float As[BK][MT_BN + 1]; /* rows 0..MT_BM-1 used */
    __shared__ mw_sum s_sum[2][4];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, n0 = blockIdx.x * MT_BN, m0 = blockIdx.y * MT_BM;
    mt_regs<TW> r;
    mt_fetch(r, w, a, n0, m0, N, M, K, 0);
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += BK) {
        mw_sum sa = {0u, 0xffffffffu, 0u}, sw = {0u, 0xffffffffu, 0u};
        __syncthreads();
        mt_store(Ws, As, r, &sw, &sa);
        if (k0 + BK < K)
            mt_fetch(r, w, a, n0, m0, N, M, K, k0 + BK);
        int kmax = K - k0 < BK ? K - k0 : BK;
        if (mw_stage_fma(sa, sw, s_sum, check)) {
#pragma unroll 8
            for (int kk = 0; kk < kmax; kk++)
                acc = fmaf(As[kk][wid], Ws[kk][lane], acc);
        } else {
#pragma unroll 8
            for (int kk = 0; kk < kmax; kk++)
                acc = acc + As[kk][wid] * Ws[kk][lane];
        }
    }
    if (m0 + wid < M && n0 + lane < N)
        c[(size_t)(m0 + wid) * N + n0 + lane] = acc;
}

/* x . W^T for at most 8 activation rows (decode at small batch; the lm_head
 * and the router at batch 1): one output a thread, each thread's sum from 0,
 * k ascending, mul then add (the CPU's order and roundings; where k_matmul_wt
 * takes fmaf its products are exact, so this is the same number). A CTA of
 * ROWS threads owns ROWS weight rows; K goes in chunks of KB bytes a row,
 * copied by cp.async (each thread 16 contiguous bytes, a warp 512 contiguous
 * bytes) into a ring of MV_S stages, MV_S - 1 chunks in flight while one is
 * summed: a thread streaming its own row directly, or the wide tiles' 8-row
 * stages, left the H200's HBM mostly idle at batch 1 (0.54 ms for the a3b
 * lm_head, 622 MB). */
#define MV_S 4 /* ring stages */

static __device__ __forceinline__ void mv_cp16(void *dst, const void *src)
{
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src));
}
static __device__ __forceinline__ void mv_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> static __device__ __forceinline__ void mv_wait()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

static __device__ __forceinline__ void mv_unpack(float (&f)[8], uint4 u, const uint16_t *)
{
    uint32_t v[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(v[i] << 16);
        f[2 * i + 1] = __uint_as_float(v[i] & 0xffff0000u);
    }
}

static __device__ __forceinline__ void mv_unpack(float (&f)[8], uint4 u, const float *)
{
    f[0] = __uint_as_float(u.x);
    f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z);
    f[3] = __uint_as_float(u.w);
}

/* One ring stage of the x.Wᵀ kernels (k_matvec_wt, k_matmul_wt_ring): WR
 * weight rows from n0, WB bytes of each from k0, into Ws (rows WLD bytes
 * apart), and AR activation rows from m0, KC floats of each from k0, into As;
 * NT threads, 16 bytes a copy; nothing past N, M or K is copied. */
template <typename TW, int WR, int WB, int WLD, int AR, int KC, int NT>
static __device__ __forceinline__ void mv_stage(unsigned char (*Ws)[WLD], float (*As)[KC], const TW *w, const float *a,
                                                int n0, int N, int m0, int M, int K, int k0, int tid)
{
    constexpr int EU = 16 / (int)sizeof(TW); /* elements a 16-byte unit */
#pragma unroll
    for (int j = 0; j < WR * (WB / 16) / NT; j++) {
        int i = tid + NT * j, row = i / (WB / 16), u = i % (WB / 16), k = k0 + u * EU;
        if (n0 + row < N && k < K)
            mv_cp16(&Ws[row][u * 16], w + (size_t)(n0 + row) * K + k);
    }
    for (int i = tid; i < AR * (KC / 4); i += NT) {
        int m = i / (KC / 4), k = k0 + (i % (KC / 4)) * 4;
        if (m0 + m < M && k < K)
            mv_cp16(&As[m][k - k0], a + (size_t)(m0 + m) * K + k);
    }
}

/* ROWS weight rows a CTA (its threads), KB weight bytes a row a chunk: 128 and
 * 128 for wide outputs; 32 and 512 where 128-row CTAs would be a handful (the
 * router's 128 outputs: one CTA streamed 4 KB rows 128 bytes a chunk, 22 us
 * at batch 1, where a chain of 2,048 adds takes 4). */
template <typename TW, int MR, int ROWS, int KB>
__global__ void __launch_bounds__(ROWS) k_matvec_wt(float *c, const float *a, const TW *w, int M, int N, int K)
{
    QD_PDL_ENTRY();
    constexpr int MV_ROWS = ROWS, MV_KB = KB, MV_WLD = KB + 16; /* padded: a quarter warp's 16-byte reads hit 32 banks */
    constexpr int KC = MV_KB / (int)sizeof(TW), EU = 16 / (int)sizeof(TW); /* elements a chunk, a 16-byte unit */
    extern __shared__ __align__(16) unsigned char mv_smem[];
    unsigned char(*Ws)[MV_ROWS][MV_WLD] = (unsigned char(*)[MV_ROWS][MV_WLD])mv_smem;
    float(*As)[MR][KC] = (float(*)[MR][KC])(mv_smem + (size_t)MV_S * MV_ROWS * MV_WLD);
    int tid = threadIdx.x, n0 = blockIdx.x * MV_ROWS, nchunk = (K + KC - 1) / KC;
    auto issue = [&](int ch) {
        if (ch < nchunk)
            mv_stage<TW, MV_ROWS, MV_KB, MV_WLD, MR, KC, MV_ROWS>(Ws[ch % MV_S], As[ch % MV_S], w, a, n0, N, 0, M, K,
                                                                 ch * KC, tid);
        mv_commit();
    };
#pragma unroll
    for (int s = 0; s < MV_S - 1; s++)
        issue(s);
    float acc[MR];
#pragma unroll
    for (int m = 0; m < MR; m++)
        acc[m] = 0.0f;
    for (int ch = 0; ch < nchunk; ch++) {
        mv_wait<MV_S - 2>();
        __syncthreads(); /* chunk ch landed for every thread; chunk ch - 1's slot is free */
        issue(ch + MV_S - 1);
        int s = ch % MV_S, ku = (K - ch * KC < KC ? K - ch * KC : KC) / EU;
        const unsigned char *wr = Ws[s][tid];
#pragma unroll 4
        for (int u = 0; u < ku; u++) {
            float f[8];
            mv_unpack(f, *(const uint4 *)(wr + 16 * u), (const TW *)0);
#pragma unroll
            for (int m = 0; m < MR; m++) {
                const float *ar = &As[s][m][u * EU];
                float av[8];
                *(float4 *)&av[0] = *(const float4 *)ar;
                if (EU == 8)
                    *(float4 *)&av[4] = *(const float4 *)(ar + 4);
                float x = acc[m];
#pragma unroll
                for (int e = 0; e < EU; e++)
                    x = x + av[e] * f[e];
                acc[m] = x;
            }
        }
    }
    int n = n0 + tid;
    if (n < N)
#pragma unroll
        for (int m = 0; m < MR; m++)
            if (m < M)
                c[(size_t)m * N + n] = acc[m];
}

template <typename TW, int MR, int ROWS, int KB>
static qd_status launch_matvec_wt(float *c, const float *a, const TW *w, int M, int N, int K)
{
    constexpr int KC = KB / (int)sizeof(TW);
    size_t smem = (size_t)MV_S * ROWS * (KB + 16) + sizeof(float) * MV_S * MR * KC;
    QD_LAUNCH_SMEM((k_matvec_wt<TW, MR, ROWS, KB>), (unsigned)((N + ROWS - 1) / ROWS), (unsigned)ROWS, smem, c, a,
                   w, M, N, K);
    return QD_OK;
}

template <typename TW, int MR>
static qd_status launch_matvec_wt(float *c, const float *a, const TW *w, int M, int N, int K)
{
    if ((N + 127) / 128 * 4 <= qd_sm_count())
        return launch_matvec_wt<TW, MR, 32, 512>(c, a, w, M, N, K);
    return launch_matvec_wt<TW, MR, 128, 128>(c, a, w, M, N, K);
}

/* x . W^T for one activation row and few outputs (the router at batch 1: 128
 * outputs, each a chain of 2,048 adds): a CTA of MC_ROWS weight rows loads
 * them and x at once (one HBM latency), its 256 threads write every product
 * a * w (rounded, as the chain's mul) to shared memory, and thread r then adds
 * row r's products in ascending k from 0: the same operations as k_matvec_wt's
 * thread, the chain no longer waiting on loads (18.7 -> 6 us at a3b's router:
 * 2,048 dependent adds at 4 cycles are its floor). */
#define MC_ROWS 4
#define MC_THREADS 256
#define MC_BATCH 8 /* 16-byte weight loads a thread in flight */
template <typename TW>
__global__ void __launch_bounds__(MC_THREADS) k_matvec_chain(float *c, const float *a, const TW *w, int N, int K)
{
    QD_PDL_ENTRY();
    extern __shared__ __align__(16) float mc_prod[]; /* [MC_ROWS][K + 4] */
    constexpr int EU = 16 / (int)sizeof(TW);
    int n0 = blockIdx.x * MC_ROWS, ld = K + 4, units = K / EU, total = MC_ROWS * units;
    for (int i0 = threadIdx.x; i0 < total; i0 += MC_BATCH * MC_THREADS) {
        uint4 wu[MC_BATCH];
#pragma unroll
        for (int j = 0; j < MC_BATCH; j++) {
            int i = i0 + j * MC_THREADS, r = i / units, u = i - r * units;
            wu[j] = i < total && n0 + r < N ? __ldg((const uint4 *)(w + (size_t)(n0 + r) * K) + u)
                                            : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int j = 0; j < MC_BATCH; j++) {
            int i = i0 + j * MC_THREADS, r = i / units, u = i - r * units;
            if (i >= total)
                break;
            float f[8], av[8];
            mv_unpack(f, wu[j], (const TW *)0);
            const float4 *ap = (const float4 *)(a + (size_t)u * EU);
            *(float4 *)&av[0] = __ldg(ap);
            if (EU == 8)
                *(float4 *)&av[4] = __ldg(ap + 1);
            float *p = mc_prod + (size_t)r * ld + u * EU;
#pragma unroll
            for (int e = 0; e < EU; e += 4)
                *(float4 *)&p[e] = make_float4(av[e] * f[e], av[e + 1] * f[e + 1], av[e + 2] * f[e + 2],
                                               av[e + 3] * f[e + 3]);
        }
    }
    __syncthreads();
    int r = threadIdx.x;
    if (r < MC_ROWS && n0 + r < N)
        c[n0 + r] = qd_sum_up(mc_prod + (size_t)r * ld, K);
}

/* The thin tiles' outputs (MT_BN weight rows x MT_BM activation rows a CTA:
 * lane l of warp w owns output (m0 + w, n0 + l)) with the operands streamed
 * by cp.async through a ring of MV_S stages of TR_KB weight bytes a row (MV_S
 * - 1 in flight while one is summed). Each output is one chain from 0, k
 * ascending, mul then add: the CPU's order and roundings, and the bits of
 * k_matmul_wt_thin (whose fmaf, where it takes it, has exact products). The
 * thin kernel staged one 128-k slice at a time through registers, an HBM
 * latency a slice on the critical path: 30 us for the a3b router at batch 64
 * (H200, ncu), where its 2,048-add chains take about 4. */
#define TR_KB 256                 /* weight bytes a row a stage */
#define TR_WLD (TR_KB + 16)       /* padded: a quarter warp's 16-byte reads of 8 rows hit 32 banks */

template <typename TW> static __host__ __device__ constexpr int tr_kc() { return TR_KB / (int)sizeof(TW); } /* k a stage */

template <typename TW, int S = MV_S> static size_t matmul_ring_smem()
{
    return (size_t)S * (MT_BN * TR_WLD + sizeof(float) * MT_BM * tr_kc<TW>());
}

/* S: the ring's stages (MV_S, or RING_DEEP with QUADS_RING_DEEP=1: every
 * stage of a K of up to 16 x 128 BF16 values in flight from the start, so that
 * no chunk waits for its copies behind the chain: the router at batch 64 took
 * 17.8 us a layer on an H100's ncu (2026-12-07) where its 2,048-add chains take
 * about 4.5). The same operations in the same order whatever S. */
#define RING_DEEP 16
template <typename TW, int S>
__global__ void __launch_bounds__(128) k_matmul_wt_ring(float *c, const float *a, const TW *w, int M, int N, int K)
{
    QD_PDL_ENTRY();
    constexpr int KC = tr_kc<TW>(), EU = 16 / (int)sizeof(TW);
    extern __shared__ __align__(16) unsigned char tr_smem[];
    unsigned char(*Ws)[MT_BN][TR_WLD] = (unsigned char(*)[MT_BN][TR_WLD])tr_smem;
    float(*As)[MT_BM][KC] = (float(*)[MT_BM][KC])(tr_smem + (size_t)S * MT_BN * TR_WLD);
    int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, n0 = blockIdx.x * MT_BN, m0 = blockIdx.y * MT_BM;
    int nchunk = (K + KC - 1) / KC;
    auto issue = [&](int ch) {
        if (ch < nchunk)
            mv_stage<TW, MT_BN, TR_KB, TR_WLD, MT_BM, KC, 128>(Ws[ch % S], As[ch % S], w, a, n0, N, m0, M, K,
                                                               ch * KC, tid);
        mv_commit();
    };
#pragma unroll
    for (int st = 0; st < S - 1; st++)
        issue(st);
    float acc = 0.0f;
    for (int ch = 0; ch < nchunk; ch++) {
        mv_wait<S - 2>();
        __syncthreads(); /* chunk ch landed for every thread; chunk ch - 1's slot is free */
        issue(ch + S - 1);
        int st = ch % S, ku = (K - ch * KC < KC ? K - ch * KC : KC) / EU;
        const unsigned char *wr = Ws[st][lane];
        const float *ar = As[st][wid];
#pragma unroll 4
        for (int u = 0; u < ku; u++) {
            float f[8], av[8];
            mv_unpack(f, *(const uint4 *)(wr + 16 * u), (const TW *)0);
            *(float4 *)&av[0] = *(const float4 *)(ar + u * EU);
            if (EU == 8)
                *(float4 *)&av[4] = *(const float4 *)(ar + u * EU + 4);
#pragma unroll
            for (int e = 0; e < EU; e++)
                acc = acc + av[e] * f[e];
        }
    }
    if (m0 + wid < M && n0 + lane < N)
        c[(size_t)(m0 + wid) * N + n0 + lane] = acc;
}

/* QUADS_MATVEC_CHAIN=0 (benchmarks and tests): k_matvec_wt for every row count. */
static int matvec_chain_on(void);

template <typename TW>
static qd_status matvec_wt(float *c, const float *a, const TW *w, int M, int N, int K)
{
    if (M == 1 && N <= 1024 && K <= 4096 && matvec_chain_on()) {
        size_t smem = sizeof(float) * MC_ROWS * ((size_t)K + 4);
        QD_LAUNCH_SMEM((k_matvec_chain<TW>), (unsigned)((N + MC_ROWS - 1) / MC_ROWS), (unsigned)MC_THREADS, smem, c,
                       a, w, N, K);
        return QD_OK;
    }
    if (M == 1)
        return launch_matvec_wt<TW, 1>(c, a, w, M, N, K);
    if (M == 2)
        return launch_matvec_wt<TW, 2>(c, a, w, M, N, K);
    if (M <= 4)
        return launch_matvec_wt<TW, 4>(c, a, w, M, N, K);
    return launch_matvec_wt<TW, 8>(c, a, w, M, N, K);
}

/* An on-unless-"0" switch from the environment, read once into *cache. */
static int env_on(int *cache, const char *name)
{
    if (*cache < 0) {
        const char *e = getenv(name);
        *cache = !(e && e[0] == '0');
    }
    return *cache;
}

/* An off-unless-"1" switch (an opt-in until run on a GPU), read once into *cache. */
static int env_opt_in(int *cache, const char *name)
{
    if (*cache < 0) {
        const char *e = getenv(name);
        *cache = e && e[0] == '1';
    }
    return *cache;
}

static int matvec_chain_on(void)
{
    static int v = -1;
    return env_on(&v, "QUADS_MATVEC_CHAIN");
}

/* The wide tiles prefetch (H200, a3b decode at batch 64: 10,662 -> 11,378
 * tokens/s end to end); QUADS_MATMUL_PF=0 (benchmarks only) turns it off for
 * the side-by-side. */
static int matmul_pf(void)
{
    static int pf = -1;
    return env_on(&pf, "QUADS_MATMUL_PF");
}

/* The thin tiles through the cp.async ring (k_matmul_wt_ring); QUADS_MATMUL_RING=0
 * (benchmarks and tests): k_matmul_wt_thin, the same bits. */
static int matmul_ring_on(void)
{
    static int v = -1;
    return env_on(&v, "QUADS_MATMUL_RING");
}

static int matmul_unroll(void)
{
    static int u = -1;
    return env_on(&u, "QUADS_MATMUL_UNROLL");
}

template <int TM>
static qd_status launch_matmul_wt(float *c, const float *a, const void *w, qdk_elem w_elem, int M, int N, int K,
                                  int check)
{
    dim3 grid((unsigned)((N + MW_BN - 1) / MW_BN), (unsigned)((M + 8 * TM - 1) / (8 * TM)));
    if (matmul_pf() && w_elem == QDK_BF16)
        QD_LAUNCH((k_matmul_wt<TM, uint16_t, true>), grid, 128u, c, a, (const uint16_t *)w, M, N, K, check, matmul_unroll());
    else if (matmul_pf())
        QD_LAUNCH((k_matmul_wt<TM, float, true>), grid, 128u, c, a, (const float *)w, M, N, K, check, matmul_unroll());
    else if (w_elem == QDK_BF16)
        QD_LAUNCH((k_matmul_wt<TM, uint16_t, false>), grid, 128u, c, a, (const uint16_t *)w, M, N, K, check, matmul_unroll());
    else
        QD_LAUNCH((k_matmul_wt<TM, float, false>), grid, 128u, c, a, (const float *)w, M, N, K, check, matmul_unroll());
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
        return w_elem == QDK_BF16 ? matvec_wt(c, a, (const uint16_t *)w, M, N, K)
                                  : matvec_wt(c, a, (const float *)w, M, N, K);
    /* fewer than 16 wide CTAs even at TM = 1: the thin tiles */
    if ((long)((N + MW_BN - 1) / MW_BN) * ((M + 7) / 8) < 16) {
        dim3 grid((unsigned)((N + MT_BN - 1) / MT_BN), (unsigned)((M + MT_BM - 1) / MT_BM));
        static int deep_env = -1;
        bool deep = env_opt_in(&deep_env, "QUADS_RING_DEEP") && K <= RING_DEEP * tr_kc<uint16_t>();
        if (matmul_ring_on() && w_elem == QDK_BF16 && deep)
            QD_LAUNCH_SMEM((k_matmul_wt_ring<uint16_t, RING_DEEP>), grid, 128u,
                           (matmul_ring_smem<uint16_t, RING_DEEP>()), c, a, (const uint16_t *)w, M, N, K);
        else if (matmul_ring_on() && w_elem == QDK_BF16)
            QD_LAUNCH_SMEM((k_matmul_wt_ring<uint16_t, MV_S>), grid, 128u, matmul_ring_smem<uint16_t>(), c, a,
                           (const uint16_t *)w, M, N, K);
        else if (matmul_ring_on())
            QD_LAUNCH_SMEM((k_matmul_wt_ring<float, MV_S>), grid, 128u, matmul_ring_smem<float>(), c, a,
                           (const float *)w, M, N, K);
        else if (w_elem == QDK_BF16)
            QD_LAUNCH((k_matmul_wt_thin<uint16_t>), grid, 128u, c, a, (const uint16_t *)w, M, N, K, check);
        else
            QD_LAUNCH((k_matmul_wt_thin<float>), grid, 128u, c, a, (const float *)w, M, N, K, check);
        return QD_OK;
    }
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

/* One block a row: the row goes to shared memory (coalesced loads), warp 0
 * adds its squares in the warp order (rms_warp_sumsq: the CPU's bits), then
 * the block writes the normalized row. (Until 2026-12-06 the order was one
 * chain, i ascending, one thread adding 2,048 squares: 9 us a launch at any
 * batch on an H100, against a few for the warp's 64 each.) In place (out ==
 * inp) allowed. */
__global__ void k_rmsnorm(float *out, float *rstd, const float *inp, const float *w, int C, float eps)
{
    QD_PDL_ENTRY();
    extern __shared__ __align__(16) float xs[]; /* x (C) */
    size_t n = blockIdx.x;
    const float *x = inp + n * C;
    /* 8 loads a thread in flight before their stores (a store to shared
     * memory between two loads through generic pointers keeps them apart) */
    for (int i0 = threadIdx.x; i0 < C; i0 += 8 * blockDim.x) {
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int i = i0 + u * blockDim.x;
            v[u] = i < C ? __ldg(x + i) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int i = i0 + u * blockDim.x;
            if (i < C)
                xs[i] = v[u];
        }
    }
    __syncthreads();
    float r = rms_block_rstd(xs, C, eps, rstd + n);
    for (int i0 = threadIdx.x; i0 < C; i0 += 8 * blockDim.x) { /* w's loads before the stores, as above */
        float wv[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int i = i0 + u * blockDim.x;
            wv[u] = i < C ? __ldg(w + i) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int i = i0 + u * blockDim.x;
            if (i < C)
                out[n * C + i] = wv[u] * (xs[i] * r);
        }
    }
}

/* Rows of at most RN_MAXC (q_norm and k_norm: a head's 128 values, N x H
 * rows): RN_ROWS rows a block, loaded coalesced by its warps into shared
 * memory (rows padded to C + 1 floats), then each warp adds its rows'
 * squares (rms_warp_sumsq), and the block writes the rows: k_rmsnorm's
 * operations on each row, so its bits. One block a row left one
 * thread adding while 127 waited, 16 rows an SM at a time: 0.25 ms for a3b's
 * 16 x 1024 x 32 query heads where the bytes take 0.12. Default since
 * 2026-12-05 (QUADS_RMSNORM_ROWS=0: one block a row). */
#define RN_ROWS 32
#define RN_MAXC 256
#define RN_THREADS 256

__global__ void __launch_bounds__(RN_THREADS) k_rmsnorm_rows(float *out, float *rstd, const float *inp,
                                                             const float *w, int rows, int C, float eps)
{
    QD_PDL_ENTRY();
    extern __shared__ float xr[]; /* RN_ROWS x (C + 1) */
    __shared__ float r_sh[RN_ROWS];
    const int ld = C + 1, lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = RN_THREADS / 32;
    const int n0 = blockIdx.x * RN_ROWS, nr = min(RN_ROWS, rows - n0);
    for (int r = warp; r < nr; r += nw) {
        const float *x = inp + (size_t)(n0 + r) * C;
#pragma unroll 4
        for (int i = lane; i < C; i += 32)
            xr[r * ld + i] = __ldg(x + i);
    }
    __syncthreads();
    for (int r = warp; r < nr; r += nw) {
        float ss = rms_warp_sumsq(xr + r * ld, C, lane);
        if (lane == 0) {
            float rr = qd_rsqrtf(ss / (float)C + eps);
            r_sh[r] = rr;
            rstd[n0 + r] = rr;
        }
    }
    __syncthreads();
    for (int r = warp; r < nr; r += nw) {
        float *o = out + (size_t)(n0 + r) * C, rr = r_sh[r];
#pragma unroll 4
        for (int i = lane; i < C; i += 32)
            o[i] = __ldg(w + i) * (xr[r * ld + i] * rr);
    }
}

extern "C" qd_status qdk_rmsnorm(float *out, float *rstd, const float *inp, const float *w, int rows, int C,
                                 float eps)
{
    static int rows_on = -1;
    if (rows >= RN_ROWS && C <= RN_MAXC && env_on(&rows_on, "QUADS_RMSNORM_ROWS")) {
        QD_LAUNCH_SMEM(k_rmsnorm_rows, blocks((size_t)rows, RN_ROWS), RN_THREADS,
                       sizeof(float) * (size_t)RN_ROWS * (size_t)(C + 1), out, rstd, inp, w, rows, C, eps);
        return QD_OK;
    }
    if (rows)
        QD_LAUNCH_SMEM(k_rmsnorm, (unsigned)rows, C < 128 ? 32u : C < 1024 ? 128u : 256u,
                       sizeof(float) * (size_t)C,
                       out, rstd, inp, w, C, eps);
    return QD_OK;
}

/* dinp: each row's dot is one chain, i ascending (the CPU's order). A block
 * owns RXR rows and walks them in tiles of RX_COLS columns: the threads
 * load a tile coalesced and store its products (w[i] * dy[i]) * x[i] (the
 * CPU's roundings) in shared memory, then thread r adds its row's products in
 * order. The update of dinp is elementwise, so it runs coalesced over the
 * block's rows. RXR 32 (the default), or 8 (QUADS_RX8=1): four times the
 * blocks, every row's loads of a tile in flight at once (at moe8's training
 * shape the 32-row blocks made one wave of 4 warps an SM, 287 us a launch on
 * an H100 for ~130 us of bytes); a row's operations are the same either way,
 * so its bits. */
#define RX_ROWS 32
#define RX_COLS 128 /* = the block size */

template <int RXR>
__global__ void __launch_bounds__(RX_COLS) k_rmsnorm_bwd_x(float *dinp, const float *dout, const float *inp,
                                                           const float *w, const float *rstd, int rows, int C,
                                                           int set)
{
    QD_PDL_ENTRY();
    __shared__ float s_p[RXR][RX_COLS + 1]; /* +1: row r's walk hits bank (r + i) % 32 */
    __shared__ float s_r[RXR], s_k[RXR];
    const int t = threadIdx.x, n0 = blockIdx.x * RXR, nr = min(RXR, rows - n0);
    float dot = 0.0f;
    for (int i0 = 0; i0 < C; i0 += RX_COLS) {
        int i = i0 + t;
        if (i < C) {
            float wi = __ldg(w + i);
            if constexpr (RXR == RX_ROWS) { /* the loop as before 2026-12-08 (its SASS) */
#pragma unroll 8
                for (int r = 0; r < nr; r++) {
                    size_t e = (size_t)(n0 + r) * C + i;
                    s_p[r][t] = (wi * dout[e]) * inp[e];
                }
            } else {
#pragma unroll
                for (int r = 0; r < RXR; r++) {
                    size_t e = (size_t)(n0 + r) * C + i;
                    if (r < nr)
                        s_p[r][t] = (wi * dout[e]) * inp[e];
                }
            }
        }
        __syncthreads();
        if (t < nr) {
            int m = min(RX_COLS, C - i0);
#pragma unroll 8
            for (int c = 0; c < m; c++)
                dot = dot + s_p[t][c];
        }
        __syncthreads();
    }
    if (t < nr) {
        float r = rstd[n0 + t];
        s_r[t] = r;
        s_k[t] = ((r * r) * r) * (dot / (float)C);
    }
    __syncthreads();
    for (int i = t; i < C; i += RX_COLS) {
        float wi = __ldg(w + i);
        if constexpr (RXR == RX_ROWS) {
#pragma unroll 4
            for (int r = 0; r < nr; r++) {
                size_t e = (size_t)(n0 + r) * C + i;
                float v = s_r[r] * (wi * dout[e]) - inp[e] * s_k[r];
                dinp[e] = set ? 0.0f + v : dinp[e] + v; /* set: the bits of adding into zeros, not read */
            }
        } else {
#pragma unroll
            for (int r = 0; r < RXR; r++) {
                size_t e = (size_t)(n0 + r) * C + i;
                if (r < nr) {
                    float v = s_r[r] * (wi * dout[e]) - inp[e] * s_k[r];
                    dinp[e] = set ? 0.0f + v : dinp[e] + v;
                }
            }
        }
    }
}

/* QUADS_RX8=1 (opt-in until timed): k_rmsnorm_bwd_x and k_moe_dy in blocks
 * of 8 rows, not 32 */
static bool rx8_on(void)
{
    static int env = -2;
    return qd_env_pick(&env, "QUADS_RX8", 0, 1) == 1;
}

/* k_rmsnorm_bwd_x in blocks of 32 rows, or of 8 (rx8_on) */
static qd_status rx_launch(float *dinp, const float *dout, const float *inp, const float *w, const float *rstd,
                           int rows, int C, int set)
{
    if (rx8_on())
        QD_LAUNCH(k_rmsnorm_bwd_x<8>, blocks((size_t)rows, 8), RX_COLS, dinp, dout, inp, w, rstd, rows, C, set);
    else
        QD_LAUNCH(k_rmsnorm_bwd_x<RX_ROWS>, blocks((size_t)rows, RX_ROWS), RX_COLS, dinp, dout, inp, w, rstd, rows,
                  C, set);
    return QD_OK;
}

/* dw: each column's sum is one chain, rows ascending (the CPU's order), and
 * that chain is the only serial work. A block owns RW_COLS columns (one 32-byte
 * sector of a row) and walks the rows in stages of RW_ROWS: every thread loads
 * its share of the next stage while the first RW_COLS threads add the current
 * stage's products, and the products dout * (inp * rstd) (the CPU's roundings)
 * are formed in parallel into shared memory, column-major so that the adding
 * thread reads 4 rows at once (double-buffered: one barrier a stage). */
#define RW_COLS 8
#define RW_ROWS 1024
#define RW_LD (RW_ROWS + 4) /* a column's stride: the 8 columns' float4 reads hit distinct banks */
#define RW_THREADS 512
#define RW_PER (RW_ROWS * RW_COLS / RW_THREADS) /* rows a thread loads a stage */

static __device__ __forceinline__ void rw_load(float *dy, float *x, float *rs, const float *dout,
                                               const float *inp, const float *rstd, int n0, int rows, int C,
                                               int i, int r0)
{
#pragma unroll
    for (int j = 0; j < RW_PER; j++) {
        int n = n0 + r0 + j * (RW_THREADS / RW_COLS);
        bool in = n < rows && i < C;
        size_t e = (size_t)n * C + i;
        dy[j] = in ? dout[e] : 0.0f;
        x[j] = in ? inp[e] : 0.0f;
        rs[j] = in ? rstd[n] : 0.0f;
    }
}

__global__ void __launch_bounds__(RW_THREADS) k_rmsnorm_bwd_w(float *dw, const float *dout, const float *inp,
                                                              const float *rstd, int rows, int C)
{
    QD_PDL_ENTRY();
    extern __shared__ float4 s_w4[]; /* [2][RW_COLS][RW_LD] floats */
    float *s_w = (float *)s_w4;
    const int c = threadIdx.x % RW_COLS, r0 = threadIdx.x / RW_COLS, i = blockIdx.x * RW_COLS + c;
    float dy[RW_PER], x[RW_PER], rs[RW_PER], acc = 0.0f;
    rw_load(dy, x, rs, dout, inp, rstd, 0, rows, C, i, r0);
    for (int n0 = 0, s = 0; n0 < rows; n0 += RW_ROWS, s ^= 1) {
        float *buf = s_w + (s * RW_COLS + c) * RW_LD;
#pragma unroll
        for (int j = 0; j < RW_PER; j++)
            buf[r0 + j * (RW_THREADS / RW_COLS)] = dy[j] * (x[j] * rs[j]);
        __syncthreads();
        if (n0 + RW_ROWS < rows)
            rw_load(dy, x, rs, dout, inp, rstd, n0 + RW_ROWS, rows, C, i, r0);
        if (threadIdx.x < RW_COLS) {
            int m = min(RW_ROWS, rows - n0), r = 0;
#pragma unroll 4
            for (; r + 4 <= m; r += 4) {
                float4 p = *(const float4 *)(buf + r);
                acc = acc + p.x;
                acc = acc + p.y;
                acc = acc + p.z;
                acc = acc + p.w;
            }
            for (; r < m; r++)
                acc = acc + buf[r];
        }
    }
    if (threadIdx.x < RW_COLS && i < C)
        dw[i] = dw[i] + acc;
}

extern "C" qd_status qdk_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
                                          const float *w, const float *rstd, int rows, int C, int set)
{
    if (rows == 0)
        return QD_OK;
    QD_TRY(rx_launch(dinp, dout, inp, w, rstd, rows, C, set));
    QD_LAUNCH_SMEM(k_rmsnorm_bwd_w, blocks((size_t)C, RW_COLS), RW_THREADS, sizeof(float) * 2 * RW_COLS * RW_LD,
                   dw, dout, inp, rstd, rows, C);
    return QD_OK;
}

/* Fast mode's dw (qdk_rmsnorm_backward_fast): part[k][i] = the sum of chunk k's
 * products, 8 row lanes each adding every 8th row ascending, then the 8 lanes
 * in order; dw[i] += the chunks' sums, k ascending. A fixed order whatever the
 * device, so fast mode stays deterministic. */
#define RF_LANES 8

__global__ void __launch_bounds__(32 * RF_LANES) k_rmsnorm_bwd_w_part(float *part, const float *dout,
                                                                       const float *inp, const float *rstd,
                                                                       int rows, int C)
{
    QD_PDL_ENTRY();
    __shared__ float s_l[RF_LANES][32];
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32, i = blockIdx.x * 32 + tx;
    const int n0 = blockIdx.y * QDK_RMSNORM_CHUNK, n1 = min(n0 + QDK_RMSNORM_CHUNK, rows);
    float acc = 0.0f;
    if (i < C) {
#pragma unroll 8
        for (int n = n0 + ty; n < n1; n += RF_LANES) {
            size_t e = (size_t)n * C + i;
            acc = acc + dout[e] * (inp[e] * rstd[n]);
        }
    }
    s_l[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && i < C) {
        float s = s_l[0][tx];
#pragma unroll
        for (int l = 1; l < RF_LANES; l++)
            s = s + s_l[l][tx];
        part[(size_t)blockIdx.y * C + i] = s;
    }
}

__global__ void k_rmsnorm_bwd_w_sum(float *dw, const float *part, int nch, int C)
{
    QD_PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= C)
        return;
    float acc = 0.0f;
#pragma unroll 8
    for (int k = 0; k < nch; k++)
        acc = acc + part[(size_t)k * C + i];
    dw[i] = dw[i] + acc;
}

extern "C" qd_status qdk_rmsnorm_backward_fast(float *dinp, float *dw, float *work, const float *dout,
                                               const float *inp, const float *w, const float *rstd, int rows,
                                               int C, int set)
{
    if (rows == 0)
        return QD_OK;
    int nch = (rows + QDK_RMSNORM_CHUNK - 1) / QDK_RMSNORM_CHUNK;
    if (nch > 65535) /* the grid's y limit */
        return qdk_rmsnorm_backward(dinp, dw, dout, inp, w, rstd, rows, C, set);
    QD_TRY(rx_launch(dinp, dout, inp, w, rstd, rows, C, set));
    QD_LAUNCH(k_rmsnorm_bwd_w_part, dim3(blocks((size_t)C, 32), (unsigned)nch), 32 * RF_LANES, work, dout, inp,
              rstd, rows, C);
    QD_LAUNCH_N(k_rmsnorm_bwd_w_sum, (C), dw, work, nch, C);
    return QD_OK;
}

/* pair i of a row y (pairs i, i + h2) rotated by (cs, sn), or back */
static __device__ __forceinline__ void rope_pair(float *y, int i, int h2, float cs, float sn, qd_rope_dir dir)
{
    float a = y[i], b = y[i + h2];
    if (dir == QD_ROPE_INVERSE) {
        y[i] = a * cs + b * sn;
        y[i + h2] = b * cs - a * sn;
    } else {
        y[i] = a * cs - b * sn;
        y[i + h2] = b * cs + a * sn;
    }
}

__global__ void k_rope(float *x, const int32_t *pos, const float *cosb, const float *sinb, int N, int nh, int D,
                       qd_rope_dir dir)
{
    QD_PDL_ENTRY();
    int h2 = D / 2;
    size_t id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (size_t)N * nh * h2)
        return;
    int i = (int)(id % h2);
    size_t nhh = id / h2;
    int n = (int)(nhh / nh);
    float *y = x + nhh * D;
    rope_pair(y, i, h2, cosb[(size_t)pos[n] * h2 + i], sinb[(size_t)pos[n] * h2 + i], dir);
}

/* k_rope's rotations with a warp's lanes along a (token, head) row's pairs
 * and 8 rows a block: one 32-bit division a thread (the row's token) where
 * k_rope takes two 64-bit ones (a3b's queries: 33.5M threads a call, four
 * calls a layer and step). The same operations on each pair, so the same bits;
 * QUADS_ROPE_ROWS=1, opt-in until run on a GPU. */
#define RP_ROWS 8

__global__ void __launch_bounds__(32 * RP_ROWS) k_rope_rows(float *x, const int32_t *pos, const float *cosb,
                                                            const float *sinb, int rows, int nh, int h2,
                                                            qd_rope_dir dir)
{
    QD_PDL_ENTRY();
    int r = blockIdx.x * RP_ROWS + threadIdx.y;
    if (r >= rows)
        return;
    int n = r / nh;
    float *y = x + (size_t)r * 2 * h2;
    const float *cr = cosb + (size_t)pos[n] * h2, *sr = sinb + (size_t)pos[n] * h2;
    for (int i = threadIdx.x; i < h2; i += 32)
        rope_pair(y, i, h2, cr[i], sr[i], dir);
}

extern "C" qd_status qdk_rope(float *x, const int32_t *pos, const float *cosb, const float *sinb, int N, int nh,
                              int D, qd_rope_dir dir)
{
    static int rows_on = -1;
    size_t rows = (size_t)N * nh;
    if (N && env_opt_in(&rows_on, "QUADS_ROPE_ROWS") && rows <= INT_MAX && D % 2 == 0) {
        QD_LAUNCH(k_rope_rows, blocks(rows, RP_ROWS), dim3(32, RP_ROWS), x, pos, cosb, sinb, (int)rows, nh, D / 2,
                  dir);
        return QD_OK;
    }
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
    QD_PDL_ENTRY();
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

/* The same values, one block per (query n, kv head, head part): the part's GH
 * = H / KV / HS query heads of the group share each key and value the block
 * reads (HS > 1 where N * KV blocks would leave most SMs idle: decode at small
 * batch). Scores: thread s takes position s for every head of the part, its
 * key row loaded 16 x 16 bytes at a time from global memory, each head's dot
 * product over i ascending; max per head by a warp (fmaxf: any order);
 * exponentials per element; each head's sum of exponentials one lane's chain
 * over s ascending, its operands staged through shared memory by the warp;
 * quotients per element; outputs: thread (c, r) owns columns 4c .. 4c + 3 of
 * head r (GH D <= 4 ATT_THREADS: one head a thread), each column one chain over
 * s ascending, with the values and probabilities of ATT_VS positions a stage
 * copied by cp.async into a ring of ATT_VN stages (ATT_VN - 1 in flight while
 * one is summed): a position's four values one 16-byte read, four positions'
 * probabilities one (one column a thread, the kernel before 2026-12-06e,
 * spent 13 instructions a position for 8 FP operations and was issue-bound:
 * 76% of the H100's issue slots at 256 rows x 1,024 positions, ncu). At GH 4
 * and 8 the scores' keys come the same way (att_scores_staged,
 * QUADS_ATT_KSTAGE): each thread reading its own key row from global memory
 * (att_score_row) touched 32 lines a warp load and left the kernel at 1.4
 * TB/s on an H100 (64 rows x 8,320 positions, 50% of DRAM, L1 hits 32%).
 * The probabilities live in att (N, H, Tm). Key and value tiles staged one
 * at a time (the kernel before) left an HBM latency a 32-position tile on the
 * critical path: 58 us a layer at batch 1, 78 at batch 64 (a3b, H200). */
#define ATT_THREADS 256
#define ATT_SUMB 256 /* the sum's staged operands a warp */
#define ATT_VS 32    /* positions a value stage */
#define ATT_VN 4     /* value stages in the ring */

static __device__ __forceinline__ void att_cp4(void *dst, const void *src)
{
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src));
}

#define ATT_KS 64 /* positions a key stage (the staged scores: GH 4 or 8) */

/* floats of the ring region: the value ring, or the staged scores' two key
 * stages of ATT_KS rows padded to D + 4 floats (conflict-free 16-byte reads
 * of eight rows at one column), whichever is larger */
static __host__ __device__ __forceinline__ size_t att_ring_floats(int D)
{
    size_t v = (size_t)ATT_VN * ATT_VS * D, k = (size_t)2 * ATT_KS * (D + 4);
    return v > k ? v : k;
}

static size_t attend_gqa_smem(int GH, int D)
{
    return sizeof(float) * ((size_t)GH * D + att_ring_floats(D) + (size_t)ATT_VN * GH * ATT_VS);
}

/* A score's chain over four more elements: d + q.x k.x, then + q.y k.y, ...
 * (each product rounded, then each add: the exact order of both score kernels) */
static __device__ __forceinline__ float att_dot4(float d, float4 q, float4 k)
{
    d = d + q.x * k.x;
    d = d + q.y * k.y;
    d = d + q.z * k.z;
    d = d + q.w * k.w;
    return d;
}

/* The scores of position s for the GH heads whose queries are qs (GH x D in
 * shared memory): key row k4 (D4 float4s) loaded 16 x 16 bytes at a time, each
 * head's dot product one chain over i ascending, times scale, to pa[g * Tm + s]. */
template <int GH>
static __device__ __forceinline__ void att_score_row(float *pa, const float *qs, const float4 *k4, int D, int D4,
                                                     int Tm, int s, float scale)
{
    float dot[GH];
#pragma unroll
    for (int g = 0; g < GH; g++)
        dot[g] = 0.0f;
    for (int i0 = 0; i0 < D4; i0 += 16) {
        float4 kv[16];
#pragma unroll
        for (int j = 0; j < 16; j++)
            kv[j] = i0 + j < D4 ? __ldg(k4 + i0 + j) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            if (i0 + j >= D4)
                break;
#pragma unroll
            for (int g = 0; g < GH; g++)
                dot[g] = att_dot4(dot[g], *(const float4 *)(qs + g * D + 4 * (i0 + j)), kv[j]);
        }
    }
#pragma unroll
    for (int g = 0; g < GH; g++)
        pa[(size_t)g * Tm + s] = dot[g] * scale;
}

/* One value stage's products for four columns of one head: a += p[s] v[s]
 * for s ascending (v: row s at vt + s D, 16 bytes; p: the head's ns
 * probabilities, four a 16-byte load). */
static __device__ __forceinline__ void att_v_step(float4 &a, float p, const float *v)
{
    float4 x = *(const float4 *)v;
    a.x = a.x + p * x.x;
    a.y = a.y + p * x.y;
    a.z = a.z + p * x.z;
    a.w = a.w + p * x.w;
}

static __device__ __forceinline__ void att_v_chain(float4 &a, const float *vt, const float *pp, int D, int ns)
{
    int s = 0;
#pragma unroll 2
    for (; s + 4 <= ns; s += 4) {
        float4 p = *(const float4 *)(pp + s);
        att_v_step(a, p.x, vt + (size_t)s * D);
        att_v_step(a, p.y, vt + (size_t)(s + 1) * D);
        att_v_step(a, p.z, vt + (size_t)(s + 2) * D);
        att_v_step(a, p.w, vt + (size_t)(s + 3) * D);
    }
    for (; s < ns; s++)
        att_v_step(a, pp[s], vt + (size_t)s * D);
}

/* The staged scores (STAGED): the keys of ATT_KS positions a stage copied by
 * cp.async, coalesced, into one of two padded tiles (the next stage in flight
 * while one is used); thread (p, w) takes position p of the stage for heads
 * w GH/4 .. w GH/4 + GH/4 - 1, each head's dot product one chain over i
 * ascending as att_score_row's: the same values. */
template <int GH>
static __device__ __forceinline__ void att_scores_staged(float *pa, const float *qs, const float *kr, size_t KD,
                                                         int D, int Tm, int t, float scale, float *kring,
                                                         float (*mxp)[ATT_KS / 32])
{
    constexpr int HT = GH / 4;
    int D4 = D / 4, KP = D + 4, nks = t / ATT_KS + 1, p = threadIdx.x % ATT_KS, w = threadIdx.x / ATT_KS;
    float mxr[HT];
#pragma unroll
    for (int g = 0; g < HT; g++)
        mxr[g] = -INFINITY;
    auto issue = [&](int st) {
        if (st < nks) {
            int s0 = st * ATT_KS, ns = t + 1 - s0 < ATT_KS ? t + 1 - s0 : ATT_KS;
            float *kt = kring + (size_t)(st & 1) * ATT_KS * KP;
            for (int j = threadIdx.x; j < ns * D4; j += ATT_THREADS) {
                int s = j / D4, u = j - s * D4;
                mv_cp16(kt + s * KP + 4 * u, kr + (size_t)(s0 + s) * KD + 4 * u);
            }
        }
        mv_commit();
    };
    issue(0);
    const float *qw = qs + (size_t)w * HT * D;
    for (int st = 0; st < nks; st++) {
        issue(st + 1);
        mv_wait<1>();
        __syncthreads(); /* stage st landed for every thread */
        int s = st * ATT_KS + p;
        if (s <= t) {
            const float4 *k4 = (const float4 *)(kring + (size_t)(st & 1) * ATT_KS * KP + (size_t)p * KP);
            float dot[HT];
#pragma unroll
            for (int g = 0; g < HT; g++)
                dot[g] = 0.0f;
#pragma unroll 4
            for (int j = 0; j < D4; j++) {
                float4 kv = k4[j];
#pragma unroll
                for (int g = 0; g < HT; g++)
                    dot[g] = att_dot4(dot[g], *(const float4 *)(qw + g * D + 4 * j), kv);
            }
#pragma unroll
            for (int g = 0; g < HT; g++) {
                float x = dot[g] * scale;
                pa[(size_t)(w * HT + g) * Tm + s] = x;
                mxr[g] = fmaxf(mxr[g], x);
            }
        }
        __syncthreads(); /* stage st read by every thread before its tile is refilled */
    }
    /* each head's maximum (fmaxf: any order gives the same value) from the
     * ATT_KS / 32 warps of its slot */
#pragma unroll
    for (int g = 0; g < HT; g++) {
        float m = mxr[g];
        for (int o = 16; o; o >>= 1)
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if ((threadIdx.x & 31) == 0)
            mxp[w * HT + g][p / 32] = m;
    }
}

/* QUADS_ATT_KSTAGE=0: the scores' keys loaded by each thread from global
 * memory (att_score_row), the kernel before 2026-12-06e, not the staged tiles */
static int att_kstage_env(void)
{
    static int v = -2;
    return qd_env_pick(&v, "QUADS_ATT_KSTAGE", 0, 1);
}

template <int GH, bool STAGED>
__global__ void __launch_bounds__(ATT_THREADS) k_attend_gqa(float *out, float *att, const float *q, const float *kb,
                                                            const float *vb, const int32_t *kbase,
                                                            const int32_t *pos, int H, int KV, int HS, int D, int Tm,
                                                            float scale)
{
    QD_PDL_ENTRY();
    extern __shared__ __align__(16) float att_sm[]; /* q (GH, D), value ring (VN, VS, D), p ring (VN, GH, VS) */
    __shared__ __align__(16) float sumb[ATT_THREADS / 32][ATT_SUMB];
    /* STAGED: each head's maximum's parts, its maximum and its sum of exponentials */
    __shared__ float mxp[STAGED ? GH : 1][ATT_KS / 32], mxh[GH], sums[GH];
    int n = blockIdx.x / (KV * HS), kh = blockIdx.x % (KV * HS) / HS, hs = blockIdx.x % HS;
    int t = pos[n], h0 = kh * (H / KV) + hs * GH; /* the part's first head */
    float *qs = att_sm, *vring = qs + GH * D, *pring = vring + att_ring_floats(D);
    size_t KD = (size_t)KV * D;
    const float *kr = kb + (size_t)kbase[n] * KD + (size_t)kh * D, *vr = vb + (size_t)kbase[n] * KD + (size_t)kh * D;
    float *pa = att + ((size_t)n * H + (size_t)h0) * Tm; /* head g's row: pa + g * Tm */
    int D4 = D / 4;
    for (int j = threadIdx.x; j < GH * D; j += ATT_THREADS)
        qs[j] = q[(size_t)n * H * D + (size_t)h0 * D + j];
    __syncthreads();
    if constexpr (STAGED)
        att_scores_staged<GH>(pa, qs, kr, KD, D, Tm, t, scale, vring, mxp);
    else
        for (int s = threadIdx.x; s <= t; s += ATT_THREADS)
            att_score_row<GH>(pa, qs, (const float4 *)(kr + (size_t)s * KD), D, D4, Tm, s, scale);
    __syncthreads();
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    for (int g = wid; g < GH; g += ATT_THREADS / 32) {
        float *p = pa + (size_t)g * Tm, mx = -INFINITY;
        if constexpr (STAGED) {
#pragma unroll
            for (int k = 0; k < ATT_KS / 32; k++)
                mx = fmaxf(mx, mxp[g][k]);
        } else {
            for (int s = lane; s <= t; s += 32)
                mx = fmaxf(mx, p[s]);
            for (int o = 16; o; o >>= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        }
        float sum = 0.0f;
        for (int s0 = 0; s0 <= t; s0 += ATT_SUMB) {
            int ns = t + 1 - s0 < ATT_SUMB ? t + 1 - s0 : ATT_SUMB;
            float e[ATT_SUMB / 32];
#pragma unroll
            for (int u = 0; u < ATT_SUMB / 32; u++)
                e[u] = lane + 32 * u < ns ? p[s0 + lane + 32 * u] : 0.0f;
#pragma unroll
            for (int u = 0; u < ATT_SUMB / 32; u++)
                if (lane + 32 * u < ns) {
                    float v = qd_expf(e[u] - mx);
                    if constexpr (!STAGED) /* STAGED: the quotients are made from the scores again */
                        p[s0 + lane + 32 * u] = v;
                    sumb[wid][lane + 32 * u] = v;
                }
            __syncwarp();
            if (lane == 0) {
                int s = 0;
                for (; s + 4 <= ns; s += 4) {
                    float4 v = *(const float4 *)&sumb[wid][s];
                    sum = sum + v.x;
                    sum = sum + v.y;
                    sum = sum + v.z;
                    sum = sum + v.w;
                }
                for (; s < ns; s++)
                    sum = sum + sumb[wid][s];
            }
            __syncwarp();
        }
        if constexpr (STAGED) {
            if (lane == 0) {
                mxh[g] = mx;
                sums[g] = sum;
            }
        } else {
            sum = __shfl_sync(0xffffffffu, sum, 0);
            for (int s = lane; s <= t; s += 32)
                p[s] = p[s] / sum;
        }
    }
    __syncthreads(); /* the probabilities in att, read back by the ring's copies */
    int nst = t / ATT_VS + 1;
    auto issue = [&](int st) {
        if (st < nst) {
            int s0 = st * ATT_VS, ns = t + 1 - s0 < ATT_VS ? t + 1 - s0 : ATT_VS, b = st % ATT_VN;
            float *vt = vring + (size_t)b * ATT_VS * D, *pt = pring + b * GH * ATT_VS;
            for (int j = threadIdx.x; j < ns * D4; j += ATT_THREADS) {
                int s = j / D4, u = j - s * D4;
                mv_cp16(vt + s * D + 4 * u, vr + (size_t)(s0 + s) * KD + 4 * u);
            }
            if (!STAGED) {
                for (int j = threadIdx.x; j < GH * ns; j += ATT_THREADS) {
                    int g = j / ns, s = j - g * ns;
                    att_cp4(pt + g * ATT_VS + s, pa + (size_t)g * Tm + s0 + s);
                }
            }
        }
        mv_commit();
    };
    /* STAGED: a stage's probabilities made by its threads from the scores
     * (GH ATT_VS <= ATT_THREADS: one each), qd_expf(x - max) / sum as the
     * softmax above would have stored them: the score read a stage ahead
     * (score_of) and its quotient stored after the stage in hand is summed,
     * to the ring and to att (att's scores read twice and written twice in
     * all, not six times: the maximum came with the scores, the exponentials
     * and quotients are not stored and read back) */
    auto score_of = [&](int st) -> float {
        int s0 = st * ATT_VS, ns = t + 1 - s0 < ATT_VS ? t + 1 - s0 : ATT_VS;
        if (st < nst && (int)threadIdx.x < GH * ns) {
            int g = threadIdx.x / ns, s = threadIdx.x - g * ns;
            return pa[(size_t)g * Tm + s0 + s];
        }
        return 0.0f;
    };
    auto put_p = [&](int st, float x) {
        int s0 = st * ATT_VS, ns = t + 1 - s0 < ATT_VS ? t + 1 - s0 : ATT_VS;
        if (st < nst && (int)threadIdx.x < GH * ns) {
            int g = threadIdx.x / ns, s = threadIdx.x - g * ns;
            float pv = qd_expf(x - mxh[g]) / sums[g];
            pring[(st % ATT_VN) * GH * ATT_VS + g * ATT_VS + s] = pv;
            pa[(size_t)g * Tm + s0 + s] = pv; /* att: the probabilities, as the op says */
        }
    };
#pragma unroll
    for (int st = 0; st < ATT_VN - 1; st++) {
        issue(st);
        if constexpr (STAGED)
            put_p(st, score_of(st));
    }
    /* thread (c, r): columns 4c .. 4c + 3 of head r (D / 4 column groups,
     * ATT_THREADS / (D / 4) >= GH head slots: qdk_attend's condition), each
     * column one chain over s ascending */
    int c = threadIdx.x % D4, r = threadIdx.x / D4;
    bool has0 = r < GH;
    float4 a0 = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int st = 0; st < nst; st++) {
        mv_wait<ATT_VN - 2>();
        __syncthreads(); /* stage st landed for every thread; stage st - 1's slot is free */
        issue(st + ATT_VN - 1);
        float x = STAGED ? score_of(st + ATT_VN - 1) : 0.0f;
        int b = st % ATT_VN, ns = t + 1 - st * ATT_VS < ATT_VS ? t + 1 - st * ATT_VS : ATT_VS;
        const float *vt = vring + (size_t)b * ATT_VS * D + 4 * c, *pt = pring + b * GH * ATT_VS;
        if (has0)
            att_v_chain(a0, vt, pt + r * ATT_VS, D, ns);
        if constexpr (STAGED)
            put_p(st + ATT_VN - 1, x); /* its slot, stage st - 1's, was freed by the barrier above */
    }
    float *o = out + (size_t)n * H * D + (size_t)h0 * D + 4 * c;
    if (has0)
        *(float4 *)(o + (size_t)r * D) = a0;
}

template <int GH>
static qd_status launch_attend_gqa(float *out, float *att, const float *q, const float *kb, const float *vb,
                                   const int32_t *kbase, const int32_t *pos, int N, int H, int KV, int HS, int D,
                                   int Tm)
{
    size_t smem = attend_gqa_smem(GH, D);
    auto k = k_attend_gqa<GH, false>;
    if constexpr (GH >= 4)
        if (att_kstage_env() != 0)
            k = k_attend_gqa<GH, true>;
    QD_LAUNCH_SMEM(k, (unsigned)(N * KV * HS), (unsigned)ATT_THREADS, smem, out, att, q, kb, vb, kbase, pos, H, KV, HS,
                   D, Tm, qd_attn_scale(D));
    return QD_OK;
}

extern "C" qd_status qdk_attend(float *out, float *att, const float *q, const float *kb, const float *vb,
                                const int32_t *kbase, const int32_t *pos, int N, int H, int KV, int D, int Tm)
{
    if (N == 0)
        return QD_OK;
    int G = KV > 0 && H % KV == 0 ? H / KV : 0, HS = 1;
    /* split each group's heads while the blocks would fill at most a quarter
     * of the SMs (decode at batch <= 8 for a3b's heads); each part re-reads
     * the group's keys and values */
    while (G && G % (2 * HS) == 0 && 4L * N * KV * (2 * HS) <= qd_sm_count())
        HS *= 2;
    int GH = G ? G / HS : 0;
    if (GH && D % 4 == 0 && D <= ATT_THREADS && ATT_THREADS % D == 0 && (GH == 1 || GH == 2 || GH == 4 || GH == 8) &&
        GH * D <= 4 * ATT_THREADS && attend_gqa_smem(GH, D) <= 100 * 1024) {
        return GH == 1 ? launch_attend_gqa<1>(out, att, q, kb, vb, kbase, pos, N, H, KV, HS, D, Tm)
             : GH == 2 ? launch_attend_gqa<2>(out, att, q, kb, vb, kbase, pos, N, H, KV, HS, D, Tm)
             : GH == 4 ? launch_attend_gqa<4>(out, att, q, kb, vb, kbase, pos, N, H, KV, HS, D, Tm)
                       : launch_attend_gqa<8>(out, att, q, kb, vb, kbase, pos, N, H, KV, HS, D, Tm);
    }
    QD_LAUNCH(k_attend, (unsigned)(N * H), 64u, out, att, q, kb, vb, kbase, pos, N, H, KV, D, Tm, qd_attn_scale(D));
    return QD_OK;
}

/* ---- the exact prefill's attention, its queries' keys read once a tile ---- */
/* QUADS_ATT_PREFILL=1 (opt-in: on an H100, bench_quant --prefill-attn, the
 * same bits, 1.19x at 64 x 128 tokens but 0.98x at 16 x 1,024 and 0.91x at
 * 1 x 4,096: bound by its shared-memory reads, one CTA of 8 warps an SM;
 * the per-query kernel was not bound by L2 as assumed): a prefill's queries share
 * their sequence's keys and values, which k_attend_gqa (one CTA a query and KV
 * head) reads once a query: 1.88 ms a layer of a3b's batch-64 prefill on an
 * H100 (2 GB of keys and values from L2 for 8,192 queries). Here one CTA takes
 * a tile of APF_P (query, head) pairs of one sequence and KV head (APF_P / GH
 * consecutive queries, each with the GH heads of the group; pair p = query
 * p / GH, head p % GH) and stages each APF_S positions' keys, then values,
 * once for all of them. The same bits as attend (cpu_ops.c) a pair: each
 * score one chain over i ascending (att_dot4), times scale, to att; the
 * maximum over s <= t (fmaxf: any order); the exponentials qd_expf(x - max)
 * summed by one thread over s ascending; p = e / sum to att; each output
 * column one chain over s ascending (a = a + p v, s <= t only). Head width
 * APF_D; the tile's positions come from the host's seq_off (apf_tiles). */
#define APF_P 128                /* (query, head) pairs a tile */
#define APF_S 64                 /* positions a stage */
#define APF_D 128                /* head width */
#define APF_KP (APF_D + 4)       /* a staged key row's floats (conflict-free 16-byte reads) */
#define APF_PP (APF_P + 4)       /* a staged probability row's floats */
#define APF_THREADS 256
#define APF_MAXT 960             /* tiles a launch (4 KB of kernel parameters) */
#define APF_SMEM ((size_t)(APF_P * APF_D + 2 * APF_S * APF_KP) * sizeof(float))

struct apf_tiles {
    int t[APF_MAXT]; /* first row << 8 | rows */
};

__global__ void __launch_bounds__(APF_THREADS, 1)
    k_attend_prefill(float *out, float *att, const float *q, const float *kb, const float *vb,
                     const int32_t *kbase, const int32_t *pos, int H, int KV, int Tm, float scale, apf_tiles tl)
{
    QD_PDL_ENTRY();
    /* scores: queries (APF_P, APF_D), key ring (2, APF_S, APF_KP);
     * outputs: value ring (2, APF_S, APF_D), probability ring (2, APF_S, APF_PP) */
    extern __shared__ __align__(16) float apf_sm[];
    __shared__ int tq[APF_P], tmaxs;
    __shared__ float mxs[APF_P], sms[APF_P];
    int code = tl.t[blockIdx.x], r0 = code >> 8, nq = code & 255, kh = blockIdx.y;
    int GH = H / KV, NP = nq * GH, tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
    size_t KD = (size_t)KV * APF_D, HD = (size_t)H * APF_D;
    const float *kr = kb + (size_t)kbase[r0] * KD + (size_t)kh * APF_D;
    const float *vr = vb + (size_t)kbase[r0] * KD + (size_t)kh * APF_D;
    float *Qs = apf_sm, *Ks = apf_sm + APF_P * APF_D;
    if (tid < nq)
        tq[tid] = pos[r0 + tid];
    for (int j = tid; j < NP * (APF_D / 4); j += APF_THREADS) {
        int p = j / (APF_D / 4), u = j % (APF_D / 4);
        mv_cp16(Qs + p * APF_D + 4 * u,
                q + (size_t)(r0 + p / GH) * HD + (size_t)(kh * GH + p % GH) * APF_D + 4 * u);
    }
    __syncthreads();
    if (tid == 0) {
        int m = -1;
        for (int i = 0; i < nq; i++)
            m = max(m, tq[i]);
        tmaxs = m;
    }
    __syncthreads();
    int tmax = tmaxs, nst = tmax / APF_S + 1;
    /* this thread's pairs pg * 8 .. pg * 8 + 7 and their positions (-1: none) */
    int pg = wid * 2 + (lane >> 4), cg = lane & 15, tp[8], tpmin = 0x7fffffff, tpmax = -1;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int p = pg * 8 + i;
        tp[i] = p < NP ? tq[p / GH] : -1;
        tpmin = min(tpmin, tp[i]);
        tpmax = max(tpmax, tp[i]);
    }
    auto pair_row = [&](int p) -> size_t { return ((size_t)(r0 + p / GH) * H + (size_t)(kh * GH + p % GH)) * Tm; };
    auto stage_rows = [&](int st) { return min(APF_S, tmax + 1 - st * APF_S); };
    /* stage st's rows of src (kr or vr) by cp.async into ring's slot st & 1
     * (rows of ld floats), one group committed */
    auto issue = [&](float *ring, int ld, const float *src, int st) {
        if (st < nst) {
            int ns = stage_rows(st);
            float *dt = ring + (size_t)(st & 1) * APF_S * ld;
            for (int j = tid; j < ns * (APF_D / 4); j += APF_THREADS) {
                int s = j / (APF_D / 4), u = j % (APF_D / 4);
                mv_cp16(dt + s * ld + 4 * u, src + (size_t)(st * APF_S + s) * KD + 4 * u);
            }
        }
        mv_commit();
    };
    auto issue_k = [&](int st) { issue(Ks, APF_KP, kr, st); };
    /* the scores: thread (pg, cg) pairs pg * 8 + i, positions cg + 16 u of each
     * stage (a quarter warp reads 8 consecutive key rows: conflict-free) */
    float mx[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
        mx[i] = -INFINITY;
    issue_k(0); /* with the queries' copies */
    for (int st = 0; st < nst; st++) {
        issue_k(st + 1);
        mv_wait<1>();
        __syncthreads(); /* stage st (and the queries) landed for every thread */
        const float *kt = Ks + (size_t)(st & 1) * APF_S * APF_KP;
        float d[8][4];
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int u = 0; u < 4; u++)
                d[i][u] = 0.0f;
        if (st * APF_S <= tpmax) {
#pragma unroll 2
            for (int j = 0; j < APF_D / 4; j++) {
                float4 kv[4];
#pragma unroll
                for (int u = 0; u < 4; u++)
                    kv[u] = *(const float4 *)(kt + (cg + 16 * u) * APF_KP + 4 * j);
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    float4 qv = *(const float4 *)(Qs + (pg * 8 + i) * APF_D + 4 * j);
#pragma unroll
                    for (int u = 0; u < 4; u++)
                        d[i][u] = att_dot4(d[i][u], qv, kv[u]);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int s = st * APF_S + cg + 16 * u;
                if (s <= tp[i]) {
                    float x = d[i][u] * scale;
                    att[pair_row(pg * 8 + i) + s] = x;
                    mx[i] = fmaxf(mx[i], x);
                }
            }
        __syncthreads(); /* stage st read by every thread before its slot is refilled */
    }
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float m = mx[i];
        for (int o = 8; o; o >>= 1) /* the 16 lanes of pair group pg */
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (cg == 0)
            mxs[pg * 8 + i] = m;
    }
    __syncthreads(); /* the maxima, and every score in att */
    /* each pair's exponentials and their sum, one thread over s ascending */
    if (tid < NP) {
        float *pa = att + pair_row(tid), m = mxs[tid], sum = 0.0f;
        int t = tq[tid / GH], s = 0;
        for (; s + 8 <= t + 1; s += 8) {
            float e[8];
#pragma unroll
            for (int u = 0; u < 8; u++)
                e[u] = qd_expf(pa[s + u] - m);
#pragma unroll
            for (int u = 0; u < 8; u++) {
                pa[s + u] = e[u];
                sum = sum + e[u];
            }
        }
        for (; s <= t; s++) {
            float e = qd_expf(pa[s] - m);
            pa[s] = e;
            sum = sum + e;
        }
        sms[tid] = sum;
    }
    __syncthreads(); /* the sums, every exponential in att; the key ring free */
    /* the outputs: thread (pg, cg) pairs pg * 8 + i, columns 4 cg .. 4 cg + 3
     * and 64 + 4 cg .. 64 + 4 cg + 3 */
    float *Vs = apf_sm, *Ps = apf_sm + 2 * APF_S * APF_D;
    auto issue_v = [&](int st) { issue(Vs, APF_D, vr, st); };
    /* a stage's probabilities e / sum (0 past a pair's position) into the
     * ring and to att; a warp takes 4 pairs x 8 positions (32-byte reads of
     * att, conflict-free stores) */
    auto fill_p = [&](int st) {
        if (st >= nst)
            return;
        float *pt = Ps + (size_t)(st & 1) * APF_S * APF_PP;
        for (int j = tid; j < APF_P * APF_S; j += APF_THREADS) {
            int g = j >> 5, p = (g % (APF_P / 4)) * 4 + ((j & 31) >> 3), sl = (g / (APF_P / 4)) * 8 + (j & 7);
            int s = st * APF_S + sl;
            float pv = 0.0f;
            if (p < NP && s <= tq[p / GH]) {
                float *pa = att + pair_row(p) + s;
                pv = *pa / sms[p];
                *pa = pv;
            }
            pt[sl * APF_PP + p] = pv;
        }
    };
    float4 a0[8], a1[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
        a0[i] = a1[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    issue_v(0);
    fill_p(0);
    for (int st = 0; st < nst; st++) {
        issue_v(st + 1); /* its slot last read at stage st - 1, before the barrier that ended it */
        fill_p(st + 1);
        mv_wait<1>();
        __syncthreads(); /* stage st's values and probabilities in place for every thread */
        int s0 = st * APF_S, ns = min(APF_S, tpmax + 1 - s0), nall = min(ns, tpmin + 1 - s0);
        const float *vt = Vs + (size_t)(st & 1) * APF_S * APF_D + 4 * cg;
        const float *pt = Ps + (size_t)(st & 1) * APF_S * APF_PP + pg * 8;
        int s = 0;
        for (; s < nall; s++) { /* every pair of the thread at s */
            float4 v0 = *(const float4 *)(vt + s * APF_D), v1 = *(const float4 *)(vt + s * APF_D + 64);
            float4 p0 = *(const float4 *)(pt + s * APF_PP), p1 = *(const float4 *)(pt + s * APF_PP + 4);
            float pv[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
#pragma unroll
            for (int i = 0; i < 8; i++) {
                att_v_step(a0[i], pv[i], (const float *)&v0);
                att_v_step(a1[i], pv[i], (const float *)&v1);
            }
        }
        for (; s < ns; s++) { /* the pairs whose position is s0 + s or later */
            float4 v0 = *(const float4 *)(vt + s * APF_D), v1 = *(const float4 *)(vt + s * APF_D + 64);
            float4 p0 = *(const float4 *)(pt + s * APF_PP), p1 = *(const float4 *)(pt + s * APF_PP + 4);
            float pv[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
#pragma unroll
            for (int i = 0; i < 8; i++)
                if (s0 + s <= tp[i]) {
                    att_v_step(a0[i], pv[i], (const float *)&v0);
                    att_v_step(a1[i], pv[i], (const float *)&v1);
                }
        }
        __syncthreads(); /* stage st read by every thread before its slots are refilled */
    }
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int p = pg * 8 + i;
        if (p < NP) {
            float *o = out + (size_t)(r0 + p / GH) * HD + (size_t)(kh * GH + p % GH) * APF_D + 4 * cg;
            *(float4 *)o = a0[i];
            *(float4 *)(o + 64) = a1[i];
        }
    }
}

/* QUADS_ATT_PREFILL: 1 the kernel above for the exact prefill (opt-in, not
 * faster past short prompts), else k_attend_gqa a query at a time */
static int att_prefill_env(void)
{
    static int v = -2;
    return qd_env_pick(&v, "QUADS_ATT_PREFILL", 0, 1);
}

/* Whether this device gives a block APF_SMEM bytes of shared memory. */
static int apf_smem_ok(void)
{
    static int ok = -1;
    if (ok < 0) {
        int dev = 0, n = 0;
        ok = cudaGetDevice(&dev) == cudaSuccess &&
             cudaDeviceGetAttribute(&n, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
             (size_t)n >= APF_SMEM + 4 * 1024;
    }
    return ok;
}

extern "C" qd_status qdk_attend_prefill(float *out, float *att, const float *q, const float *kb, const float *vb,
                                        const int32_t *kbase, const int32_t *pos, const int32_t *seq_off, int nseq,
                                        int N, int H, int KV, int D, int Tm)
{
    int GH = KV > 0 && H % KV == 0 ? H / KV : 0;
    if (att_prefill_env() != 1 || !seq_off || D != APF_D || !GH || GH > APF_P || N >= (1 << 23) || !apf_smem_ok())
        return qdk_attend(out, att, q, kb, vb, kbase, pos, N, H, KV, D, Tm);
    int QT = APF_P / GH, nt = 0;
    apf_tiles tl;
    auto launch = [&]() -> qd_status {
        QD_LAUNCH_SMEM(k_attend_prefill, dim3((unsigned)nt, (unsigned)KV), (unsigned)APF_THREADS, APF_SMEM, out,
                       att, q, kb, vb, kbase, pos, H, KV, Tm, qd_attn_scale(D), tl);
        nt = 0;
        return QD_OK;
    };
    for (int b = 0; b < nseq; b++)
        for (int r = seq_off[b]; r < seq_off[b + 1]; r += QT) {
            tl.t[nt++] = r << 8 | min(QT, seq_off[b + 1] - r);
            if (nt == APF_MAXT)
                QD_TRY(launch());
        }
    if (nt)
        QD_TRY(launch());
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
    QD_PDL_ENTRY();
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
                  D, Tm, qd_attn_scale(D));
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
    QD_PDL_ENTRY();
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
    QD_PDL_ENTRY();
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
    QD_PDL_ENTRY();
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
    QD_LAUNCH(k_attn_ds, (unsigned)(N * H), 64u, ds, dout, att, v, pos, N, H, KV, D, Tm, qd_attn_scale(D));
    QD_LAUNCH_N(k_attn_dq, ((size_t)N * H * D), dq, ds, k, pos, N, H, KV, D, Tm);
    QD_LAUNCH_N(k_attn_dkv, ((size_t)N * KV * D), dk, dv, ds, att, q, dout, pos, slen, N, H, KV, D, Tm);
    return QD_OK;
}

__global__ void k_store_kv(float *kc, float *vc, const float *kr, const float *v, const int32_t *row,
                           const int32_t *pos, int N, int Tc, int KD)
{
    QD_PDL_ENTRY();
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
    QD_PDL_ENTRY();
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

/* backends/router.h's qd_router_softmax and qd_router_select, one warp a
 * token, the same bits: the max (fmaxf: any order gives the same value for
 * the subtraction, +0 and -0 included), each exponential and each quotient are
 * per element; the sum of exponentials and the top-k weights' sum are one
 * lane's chains in the CPU's order. Selection j takes the lowest-index largest
 * untaken probability by a warp reduction, which is what the CPU's scan
 * (strict >, from the first untaken index) returns, except when the first
 * untaken probability is NaN: the scan then never moves, so neither do we.
 * (One thread a token ran 0.22 ms a launch at E = 128, K = 8, N = 64.) */
#define QD_ROUTE_WARPS 4
#define QD_ROUTE_PER_LANE 8

/* k_route's selection where no probability is NaN or negative (so their bits
 * order them as unsigned integers, -0 taken as +0): lane l holds experts l + 32i and
 * a bit a taken expert; selection j is the warp's largest (bits + 1) of the
 * lanes' best untaken (strict >, ascending index: the lowest index of their
 * largest), then the lowest index holding it: the CPU's scan's answer, in two
 * warp reductions instead of a shuffle tree of three values. */
static __device__ __forceinline__ void route_select_fast(int32_t *ix, const float *ps, int E, int K, int lane)
{
    float v[QD_ROUTE_PER_LANE];
#pragma unroll
    for (int i = 0; i < QD_ROUTE_PER_LANE; i++)
        v[i] = lane + 32 * i < E ? ps[lane + 32 * i] : 0.0f;
    unsigned taken = 0;
    for (int j = 0; j < K; j++) {
        unsigned key = 0, idx = 0x7fffffffu;
#pragma unroll
        for (int i = 0; i < QD_ROUTE_PER_LANE; i++) {
            unsigned k = v[i] == 0.0f ? 1u : (unsigned)__float_as_int(v[i]) + 1u; /* -0 as +0 */
            if (lane + 32 * i < E && !(taken >> i & 1u) && k > key) {
                key = k;
                idx = (unsigned)(lane + 32 * i);
            }
        }
        unsigned best = __reduce_max_sync(0xffffffffu, key);
        unsigned bi = __reduce_min_sync(0xffffffffu, key == best && best ? idx : 0x7fffffffu);
        if (best && (int)(bi & 31u) == lane)
            taken |= 1u << (bi >> 5);
        if (lane == 0)
            ix[j] = best ? (int32_t)bi : -1;
    }
    __syncwarp();
}

__global__ void __launch_bounds__(32 * QD_ROUTE_WARPS) k_route(int32_t *topk, float *topw, float *probs, int N, int E,
                                                              int K, qd_topk_norm norm)
{
    QD_PDL_ENTRY();
    extern __shared__ float route_sm[];
    int wid = threadIdx.x >> 5, lane = threadIdx.x & 31;
    size_t n = (size_t)blockIdx.x * QD_ROUTE_WARPS + wid;
    if (n >= (size_t)N)
        return; /* warps are independent: no block barrier below */
    float *ps = route_sm + (size_t)wid * (E + K);
    int32_t *ix = (int32_t *)(ps + E);
    float *row = probs + n * E;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) {
        ps[e] = row[e];
        mx = fmaxf(mx, ps[e]);
    }
    for (int o = 16; o; o >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    for (int e = lane; e < E; e += 32)
        ps[e] = qd_expf(ps[e] - mx);
    __syncwarp();
    float sum = 0.0f;
    if (lane == 0)
        for (int e = 0; e < E; e++)
            sum = sum + ps[e];
    sum = __shfl_sync(0xffffffffu, sum, 0);
    for (int e = lane; e < E; e += 32) {
        ps[e] = ps[e] / sum;
        row[e] = ps[e];
    }
    __syncwarp();
    int nan = 0;
    for (int e = lane; e < E; e += 32)
        nan |= !(ps[e] >= 0.0f); /* NaN (or, never from a softmax, negative) */
    if (!__any_sync(0xffffffffu, nan) && E <= 32 * QD_ROUTE_PER_LANE) {
        route_select_fast(ix, ps, E, K, lane);
    } else {
    for (int j = 0; j < K; j++) {
        int first = INT_MAX, bi = INT_MAX;
        float bv = 0.0f;
        for (int e = lane; e < E; e += 32) {
            int taken = 0;
            for (int i = 0; i < j; i++)
                taken |= ix[i] == e;
            if (taken)
                continue;
            first = e < first ? e : first;
            float v = ps[e];
            if (v == v && (bi == INT_MAX || v > bv)) {
                bv = v;
                bi = e;
            }
        }
        for (int o = 16; o; o >>= 1) {
            int of = __shfl_xor_sync(0xffffffffu, first, o), oi = __shfl_xor_sync(0xffffffffu, bi, o);
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            first = of < first ? of : first;
            if (oi != INT_MAX && (bi == INT_MAX || ov > bv || (ov == bv && oi < bi))) {
                bv = ov;
                bi = oi;
            }
        }
        int best = first == INT_MAX ? -1 : ps[first] != ps[first] ? first : bi;
        if (lane == 0)
            ix[j] = best;
        __syncwarp();
    }
    }
    if (lane == 0) {
        float s = 0.0f;
        for (int j = 0; j < K; j++)
            s = s + ps[ix[j]];
        for (int j = 0; j < K; j++) {
            topk[n * K + j] = ix[j];
            topw[n * K + j] = norm == QD_TOPK_RENORM ? ps[ix[j]] / s : ps[ix[j]];
        }
    }
}

extern "C" qd_status qdk_route(int32_t *topk, float *topw, float *probs, int N, int E, int K, qd_topk_norm norm)
{
    if (N)
        QD_LAUNCH_SMEM(k_route, (unsigned)((N + QD_ROUTE_WARPS - 1) / QD_ROUTE_WARPS), 32u * QD_ROUTE_WARPS,
                       sizeof(float) * QD_ROUTE_WARPS * ((size_t)E + (size_t)K), topk, topw, probs, N, E, K,
                       norm);
    return QD_OK;
}

/* qd_moe_group (backends/layout.c) on the device, the same rows: block e
 * walks the tokens in ascending order, 1024 at a time, and numbers the ones
 * that chose e with a block-wide exclusive scan (slot: a token's position
 * among expert e's rows); cnt[e] their count. */
__global__ void __launch_bounds__(1024) k_moe_slots(int32_t *slot, int32_t *cnt, const int32_t *topk, int N, int K)
{
    QD_PDL_ENTRY();
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

/* off (E + 1) = 0, then the running sums of cnt (E), ascending expert index,
 * by one warp: lane l adds a run of ceil(E/32) counts, a shuffle scan gives
 * each run's start (integers: any order, the same sums). */
static __device__ __forceinline__ void warp_offsets(int32_t *off, const int32_t *cnt, int E, int lane)
{
    int per = (E + 31) / 32, e0 = lane * per, e1 = e0 + per < E ? e0 + per : E;
    int32_t run = 0;
    for (int e = e0; e < e1; e++)
        run += cnt[e];
    int32_t at = qd_warp_incl_sum(run, lane) - run;
    if (lane == 0)
        off[0] = 0;
    for (int e = e0; e < e1; e++) {
        at += cnt[e];
        off[e + 1] = at;
    }
}

/* exp_off (E + 1) from the counts (warp_offsets; a single thread's chain of
 * global loads and stores took 9 us at E = 128). */
__global__ void k_moe_offsets(int32_t *exp_off, const int32_t *cnt, int E)
{
    QD_PDL_ENTRY();
    warp_offsets(exp_off, cnt, E, threadIdx.x);
}

/* One thread per (token, choice): its row, and its place among the token's
 * rows in ascending expert order (the experts of a token are distinct). */
__global__ void k_moe_rows(int32_t *row_tok, float *row_w, int32_t *row_rank, int32_t *tok_rows,
                           const int32_t *slot, const int32_t *exp_off, const int32_t *topk, const float *topw, int N,
                           int K)
{
    QD_PDL_ENTRY();
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
    QD_PDL_ENTRY();
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

/* k_moe_slots, k_moe_offsets and k_moe_rows in one launch of one block, for
 * the few tokens of a decode (the default since 2026-12-07, QUADS_MOE_GROUP1=0
 * for the three launches: 5.3 us a layer against 11.3 on an H100's ncu at
 * batch 64; qdk_moe_group says where it applies): a bit a token in a mask an expert in
 * shared memory (mask[e][n / 32], bit n % 32: set by atomicOr, which no order
 * changes), expert e's count the popcount of its mask, the offsets
 * k_moe_offsets' scan (warp_offsets), and a (token, choice)'s slot among e's
 * rows the popcount of e's bits below its token: the tokens that chose e in
 * ascending order, k_moe_slots' numbering, so the same rows. The three
 * launches took ~10 us a MoE layer at batch 64 in the last per-kernel
 * profiles (k_moe_slots' 1,024-thread scans of 64 tokens ~3.8, k_moe_rows
 * ~3.3, the offsets' warp). */
#define QD_MOE1_THREADS 1024
__global__ void __launch_bounds__(QD_MOE1_THREADS)
    k_moe_group1(int32_t *exp_off, int32_t *row_tok, float *row_w, int32_t *row_rank, int32_t *tok_rows,
                 const int32_t *topk, const float *topw, int N, int E, int K)
{
    QD_PDL_ENTRY();
    extern __shared__ uint32_t mask[]; /* E x W words, then E + 1 offsets, then E counts */
    const int W = (N + 31) / 32, NK = N * K, t = threadIdx.x;
    int32_t *off = (int32_t *)(mask + (size_t)E * W), *cnt = off + E + 1;
    for (int i = t; i < E * W; i += blockDim.x)
        mask[i] = 0u;
    __syncthreads();
    for (int id = t; id < NK; id += blockDim.x) {
        int n = id / K, e = topk[id];
        atomicOr(&mask[e * W + n / 32], 1u << (n % 32));
    }
    __syncthreads();
    for (int e = t; e < E; e += blockDim.x) { /* expert e's count: its mask's bits */
        int32_t c = 0;
        for (int w = 0; w < W; w++)
            c += __popc(mask[e * W + w]);
        cnt[e] = c;
    }
    __syncthreads();
    if (t < 32)
        warp_offsets(off, cnt, E, t);
    __syncthreads();
    for (int id = t; id < NK; id += blockDim.x) {
        int n = id / K, i = id % K, e = topk[id], j = 0;
        const uint32_t *m = mask + e * W;
        int r = off[e] + __popc(m[n / 32] & ((1u << (n % 32)) - 1u));
        for (int w = 0; w < n / 32; w++)
            r += __popc(m[w]);
        for (int q = 0; q < K; q++)
            j += topk[(size_t)n * K + q] < e;
        row_tok[r] = n;
        row_w[r] = topw[id];
        row_rank[r] = i;
        tok_rows[(size_t)n * K + j] = r;
    }
    for (int e = t; e <= E; e += blockDim.x)
        exp_off[e] = off[e];
}

extern "C" qd_status qdk_moe_group(int32_t *exp_off, int32_t *row_tok, float *row_w, int32_t *row_rank,
                                   int32_t *tok_rows, int32_t *scratch, const int32_t *topk, const float *topw, int N,
                                   int E, int K)
{
    if (!topk) {
        QD_LAUNCH(k_moe_dense, blocks((size_t)N + 1, TPB), TPB, exp_off, row_tok, row_w, row_rank, tok_rows, N);
        return QD_OK;
    }
    static int one = -1;
    size_t smem1 = sizeof(uint32_t) * ((size_t)E * (size_t)((N + 31) / 32) + 2 * (size_t)E + 1);
    if (smem1 <= 48 * 1024 && (size_t)N * K <= 8 * QD_MOE1_THREADS && env_on(&one, "QUADS_MOE_GROUP1")) {
        QD_LAUNCH_SMEM(k_moe_group1, 1, QD_MOE1_THREADS, smem1, exp_off, row_tok, row_w, row_rank, tok_rows, topk,
                       topw, N, E, K);
        return QD_OK;
    }
    int32_t *slot = scratch, *cnt = scratch + (size_t)N * K;
    QD_LAUNCH(k_moe_slots, E, 1024, slot, cnt, topk, N, K);
    QD_LAUNCH(k_moe_offsets, 1, 32, exp_off, cnt, E);
    if (N)
        QD_LAUNCH_N(k_moe_rows, (size_t)N * K, row_tok, row_w, row_rank, tok_rows, slot, exp_off, topk, topw, N, K);
    return QD_OK;
}

__global__ void k_gather(float *xe, const float *x, const int32_t *row_tok, int R, int C)
{
    QD_PDL_ENTRY();
    size_t id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id < (size_t)R * C)
        xe[id] = x[(size_t)row_tok[id / C] * C + id % C];
}

/* k_gather four values a thread (a float4 of a row; C a multiple of 4, rows on
 * 16 bytes), its index in 32 bits where the float4s fit: k_gather divides a
 * 64-bit index by C for every value (the QUADS recipe's gate/up input at batch
 * 64, 512 rows of 2,048: 12.2 us a layer on an H100 for 4 MB). */
template <typename IX> __global__ void k_gather4(float4 *xe, const float4 *x, const int32_t *row_tok, int R, int C4)
{
    QD_PDL_ENTRY();
    IX id = (IX)blockIdx.x * blockDim.x + threadIdx.x;
    if (id < (IX)R * (IX)C4)
        xe[id] = x[(size_t)row_tok[id / (IX)C4] * C4 + id % (IX)C4];
}

/* k_gather4 where C and the pointers allow (the default since 2026-12-08,
 * with QUADS_ROW_WIDE; QUADS_GATHER4=0 for k_gather); a copy, the same values */
static int gather4_env(void)
{
    static int v = -2;
    return qd_env_pick(&v, "QUADS_GATHER4", 0, 1);
}

extern "C" qd_status qdk_gather(float *xe, const float *x, const int32_t *row_tok, int R, int C)
{
    if (!R || !C)
        return QD_OK;
    if (gather4_env() != 0 && C % 4 == 0 && qd_aligned(x, 16) && qd_aligned(xe, 16)) {
        if (fits32((size_t)R * (C / 4)))
            QD_LAUNCH_N(k_gather4<unsigned>, ((size_t)R * (C / 4)), (float4 *)xe, (const float4 *)x, row_tok, R,
                        C / 4);
        else
            QD_LAUNCH_N(k_gather4<size_t>, ((size_t)R * (C / 4)), (float4 *)xe, (const float4 *)x, row_tok, R,
                        C / 4);
        return QD_OK;
    }
    QD_LAUNCH_N(k_gather, ((size_t)R * C), xe, x, row_tok, R, C);
    return QD_OK;
}

/* k_gather's values as BF16 bits (fast mode's experts, BF16 activations):
 * four a thread where C is a multiple of 4 (rows on 16 bytes), else one. */
template <typename IX> __global__ void k_gather16x4(uint2 *xe, const float4 *x, const int32_t *row_tok, int R, int C4)
{
    QD_PDL_ENTRY();
    IX id = (IX)blockIdx.x * blockDim.x + threadIdx.x;
    if (id < (IX)R * (IX)C4) {
        float4 v = x[(size_t)row_tok[id / (IX)C4] * C4 + id % (IX)C4];
        xe[id] = bf16x4(v);
    }
}

template <typename IX> __global__ void k_gather16(uint16_t *xe, const float *x, const int32_t *row_tok, int R, int C)
{
    QD_PDL_ENTRY();
    IX id = (IX)blockIdx.x * blockDim.x + threadIdx.x;
    if (id < (IX)R * (IX)C)
        xe[id] = (uint16_t)bf16_hi(x[(size_t)row_tok[id / (IX)C] * C + id % (IX)C]);
}

extern "C" qd_status qdk_gather16(uint16_t *xe, const float *x, const int32_t *row_tok, int R, int C)
{
    if (!R || !C)
        return QD_OK;
    int f = fits32((size_t)R * C);
    if (C % 4 == 0 && qd_aligned(x, 16) && qd_aligned(xe, 8) && f)
        QD_LAUNCH_N(k_gather16x4<unsigned>, ((size_t)R * (C / 4)), (uint2 *)xe, (const float4 *)x, row_tok, R,
                    C / 4);
    else if (C % 4 == 0 && qd_aligned(x, 16) && qd_aligned(xe, 8))
        QD_LAUNCH_N(k_gather16x4<size_t>, ((size_t)R * (C / 4)), (uint2 *)xe, (const float4 *)x, row_tok, R,
                    C / 4);
    else if (f)
        QD_LAUNCH_N(k_gather16<unsigned>, ((size_t)R * C), xe, x, row_tok, R, C);
    else
        QD_LAUNCH_N(k_gather16<size_t>, ((size_t)R * C), xe, x, row_tok, R, C);
    return QD_OK;
}

/* k_swiglu's values as BF16 bits */
__global__ void k_swiglu16(uint16_t *h, const float *g, const float *u, size_t n)
{
    QD_PDL_ENTRY();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        h[i] = (uint16_t)bf16_hi(qd_siluf(g[i]) * u[i]);
}

/* QUADS_SWIGLU4=1 (opt-in until timed): fast mode's SwiGLU forward and
 * backward on BF16 outputs four values a thread (float4 loads, 8-byte
 * stores) where the widths and pointers allow; each value's operations are
 * the one-value kernels', so their bits. At moe8's training shape on an H100
 * the one-value kernels took 318 us a launch each for ~110 and ~180 us of
 * bytes. */
static bool swiglu4_on(void)
{
    static int env = -2;
    return qd_env_pick(&env, "QUADS_SWIGLU4", 0, 1) == 1;
}

/* k_swiglu16 four values a thread (QUADS_SWIGLU4=1) */
__global__ void k_swiglu16x4(uint2 *h, const float4 *g, const float4 *u, size_t n4)
{
    QD_PDL_ENTRY();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 a = g[i], b = u[i];
        h[i] = bf16x4(make_float4(qd_siluf(a.x) * b.x, qd_siluf(a.y) * b.y, qd_siluf(a.z) * b.z, qd_siluf(a.w) * b.w));
    }
}

extern "C" qd_status qdk_swiglu16(uint16_t *h, const float *g, const float *u, size_t n)
{
    if (n && swiglu4_on() && n % 4 == 0 && qd_aligned(g, 16) && qd_aligned(u, 16) && qd_aligned(h, 8)) {
        QD_LAUNCH_N(k_swiglu16x4, (n / 4), (uint2 *)h, (const float4 *)g, (const float4 *)u, n / 4);
        return QD_OK;
    }
    if (n)
        QD_LAUNCH_N(k_swiglu16, (n), h, g, u, n);
    return QD_OK;
}

/* out = the float32 values of n BF16 bit patterns */
__global__ void k_bf16_float(float *out, const uint16_t *x, size_t n)
{
    QD_PDL_ENTRY();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = qd_bf16_to_f32(x[i]);
}

extern "C" qd_status qdk_bf16_float(float *out, const uint16_t *x, size_t n)
{
    if (n)
        QD_LAUNCH_N(k_bf16_float, (n), out, x, n);
    return QD_OK;
}

__global__ void k_swiglu(float *h, const float *g, const float *u, size_t n)
{
    QD_PDL_ENTRY();
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

/* An output value as stored: the float, or its BF16 bits (bf16_hi: qdk_bf16_bits's
 * rounding, so a 16-bit output holds what converting the float output would) */
static __device__ __forceinline__ void st_out(float *p, float v) { *p = v; }
static __device__ __forceinline__ void st_out(uint16_t *p, float v) { *p = (uint16_t)bf16_hi(v); }

/* SwiGLU's gradients of one element: qd_sigmoidf's and qd_siluf's
 * expressions with their one e^-g computed once (the same bits as calling
 * both: a qd_expf of ~25 operations fewer an element, 100M elements a layer
 * at a3b's 16 x 1,024 tokens) */
static __device__ __forceinline__ void swiglu_grads(float dh, float g, float u, float *dg, float *du)
{
    float d = 1.0f + qd_expf(-g);
    float s = 1.0f / d;
    *dg = (dh * u) * (s * (1.0f + g * (1.0f - s)));
    *du = dh * (g / d);
}

template <typename T>
__global__ void k_swiglu_bwd(T *dg, T *du, const float *dh, const float *g, const float *u, size_t n)
{
    QD_PDL_ENTRY();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float a, b;
    swiglu_grads(dh[i], g[i], u[i], &a, &b);
    st_out(dg + i, a);
    st_out(du + i, b);
}

extern "C" qd_status qdk_swiglu_backward(float *dg, float *du, const float *dh, const float *g, const float *u,
                                         size_t n)
{
    if (n)
        QD_LAUNCH_N(k_swiglu_bwd<float>, (n), dg, du, dh, g, u, n);
    return QD_OK;
}

/* k_swiglu_bwd's bits with dg's and du's rows ld apart (ld = cols: k_swiglu_bwd) */
template <typename IX>
__global__ void k_swiglu_bwd16_ld(uint16_t *dg, uint16_t *du, const float *dh, const float *g, const float *u,
                                  size_t n, int cols, int ld)
{
    QD_PDL_ENTRY();
    IX i = (IX)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (IX)n)
        return;
    size_t o = (size_t)(i / (IX)cols) * (size_t)ld + i % (IX)cols;
    float a, b;
    swiglu_grads(dh[i], g[i], u[i], &a, &b);
    st_out(dg + o, a);
    st_out(du + o, b);
}

/* dg, du rows of cols4 float4-wide values ld4 apart (ld4 = cols4: dense) */
template <typename IX>
__global__ void k_swiglu_bwd16x4(uint2 *dg, uint2 *du, const float4 *dh, const float4 *g, const float4 *u, size_t n4,
                                 int cols4, int ld4)
{
    QD_PDL_ENTRY();
    IX i = (IX)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (IX)n4)
        return;
    size_t o = (size_t)(i / (IX)cols4) * (size_t)ld4 + i % (IX)cols4;
    float4 x = dh[i], y = g[i], z = u[i], a, b;
    swiglu_grads(x.x, y.x, z.x, &a.x, &b.x);
    swiglu_grads(x.y, y.y, z.y, &a.y, &b.y);
    swiglu_grads(x.z, y.z, z.z, &a.z, &b.z);
    swiglu_grads(x.w, y.w, z.w, &a.w, &b.w);
    dg[o] = bf16x4(a);
    du[o] = bf16x4(b);
}

extern "C" qd_status qdk_swiglu_backward16(uint16_t *dg, uint16_t *du, const float *dh, const float *g,
                                           const float *u, size_t rows, int cols, int ld)
{
    size_t n = rows * (size_t)cols;
    if (n && swiglu4_on() && cols % 4 == 0 && ld % 4 == 0 && qd_aligned(dh, 16) && qd_aligned(g, 16) &&
        qd_aligned(u, 16) && qd_aligned(dg, 8) && qd_aligned(du, 8)) {
        if (fits32(n / 4))
            QD_LAUNCH_N(k_swiglu_bwd16x4<unsigned>, (n / 4), (uint2 *)dg, (uint2 *)du, (const float4 *)dh,
                        (const float4 *)g, (const float4 *)u, n / 4, cols / 4, ld / 4);
        else
            QD_LAUNCH_N(k_swiglu_bwd16x4<size_t>, (n / 4), (uint2 *)dg, (uint2 *)du, (const float4 *)dh,
                        (const float4 *)g, (const float4 *)u, n / 4, cols / 4, ld / 4);
        return QD_OK;
    }
    if (n && ld == cols)
        QD_LAUNCH_N(k_swiglu_bwd<uint16_t>, (n), dg, du, dh, g, u, n);
    else if (n && fits32(n))
        QD_LAUNCH_N(k_swiglu_bwd16_ld<unsigned>, (n), dg, du, dh, g, u, n, cols, ld);
    else if (n)
        QD_LAUNCH_N(k_swiglu_bwd16_ld<size_t>, (n), dg, du, dh, g, u, n, cols, ld);
    return QD_OK;
}

template <typename IX>
__global__ void k_combine(float *out, const float *y, const float *row_w, const int32_t *tok_rows, int N, int K,
                          int C)
{
    QD_PDL_ENTRY();
    IX id = (IX)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (IX)N * (IX)C)
        return;
    int n = (int)(id / (IX)C), i = (int)(id % (IX)C);
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
    if (N && fits32((size_t)N * C))
        QD_LAUNCH_N(k_combine<unsigned>, ((size_t)N * C), out, y, row_w, tok_rows, N, K, C);
    else if (N)
        QD_LAUNCH_N(k_combine<size_t>, ((size_t)N * C), out, y, row_w, tok_rows, N, K, C);
    return QD_OK;
}

/* ------------------------------------------------------------------------ */
/* fused rows (ops.h: qk_norm_rope; add_rmsnorm, combine_add_rmsnorm and
 * swiglu_nvfp4 are cuda_quant.cu's, beside the quantizer they end with): the
 * operations of the kernels they stand for (k_rmsnorm, k_rope, k_store_kv) on
 * each value, so their bits, in one launch. */

/* qk_norm_rope: a warp a (token, head) row of D, FR_WARPS rows a block, the
 * query rows (N H) then the key rows (N KV): the row into shared memory,
 * rms_warp_sumsq, k_rmsnorm's w * (x * r) in place, then k_rope's rope_pair
 * on each pair (i, i + D/2), out to qr / kr; a key row to the caches with
 * its v row (k_store_kv's copies). */
#define FR_WARPS 8

/* PF (QUADS_FR_ILP=1, D <= 128): every load of the row (its values, the norm
 * weights, the position and its cos/sin, a key row's v) issued at the start,
 * held in registers (at most 4 values and 2 pairs a lane), not each after the
 * step before it: a warp waited for four loads in turn (decode at batch 64
 * 7.2 us a layer on an H100, moe8's training shape 149 us a launch). The
 * same operations on each value in the same order: the same bits. */
template <bool PF = false>
__global__ void __launch_bounds__(32 * FR_WARPS) k_qk_norm_rope(const __grid_constant__ qd_qk_args p)
{
    QD_PDL_ENTRY();
    extern __shared__ __align__(16) float xq[]; /* FR_WARPS x D */
    int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, D = p.D, h2 = D / 2;
    int64_t r = (int64_t)blockIdx.x * FR_WARPS + wp, nq = (int64_t)p.N * p.H, nk = (int64_t)p.N * p.KV;
    if (r >= nq + nk)
        return;
    bool isq = r < nq;
    int64_t rr = isq ? r : r - nq;
    int nh = isq ? p.H : p.KV, n = (int)(rr / nh), h = (int)(rr % nh);
    const float *x = (isq ? p.q : p.k) + rr * D, *w = isq ? p.wq : p.wk;
    float *y = xq + wp * D, *o = (isq ? p.qr : p.kr) + rr * D;
    if constexpr (PF) {
        const bool kv = !isq && p.kc;
        const int64_t KD = (int64_t)p.KV * D;
        float xv[4], wv[4], vv[4], cs[2], sn[2];
        int ps = p.pos[n];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int i = lane + 32 * u;
            xv[u] = i < D ? __ldg(x + i) : 0.0f;
            wv[u] = i < D ? __ldg(w + i) : 0.0f;
            vv[u] = kv && i < D ? __ldg(p.v + (int64_t)n * KD + (int64_t)h * D + i) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 2; u++) {
            int i = lane + 32 * u;
            cs[u] = i < h2 ? __ldg(p.cosb + (size_t)ps * h2 + i) : 0.0f;
            sn[u] = i < h2 ? __ldg(p.sinb + (size_t)ps * h2 + i) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (lane + 32 * u < D)
                y[lane + 32 * u] = xv[u];
        __syncwarp();
        float ss = rms_warp_sumsq(y, D, lane);
        float rs = qd_rsqrtf(__shfl_sync(0xffffffffu, ss, 0) / (float)D + p.eps);
        if (lane == 0)
            (isq ? p.rstd_q : p.rstd_k)[rr] = rs;
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (lane + 32 * u < D)
                y[lane + 32 * u] = wv[u] * (y[lane + 32 * u] * rs);
        __syncwarp();
#pragma unroll
        for (int u = 0; u < 2; u++)
            if (lane + 32 * u < h2)
                rope_pair(y, lane + 32 * u, h2, cs[u], sn[u], QD_ROPE_FORWARD);
        __syncwarp();
        int64_t at = kv ? ((int64_t)p.row[n] * p.Tc + ps) * KD + (int64_t)h * D : 0;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int i = lane + 32 * u;
            if (i < D) {
                o[i] = y[i];
                if (kv) {
                    p.kc[at + i] = y[i];
                    p.vc[at + i] = vv[u];
                }
            }
        }
        return;
    }
    for (int i = lane; i < D; i += 32)
        y[i] = __ldg(x + i);
    __syncwarp();
    float ss = rms_warp_sumsq(y, D, lane);
    float rs = qd_rsqrtf(__shfl_sync(0xffffffffu, ss, 0) / (float)D + p.eps);
    if (lane == 0)
        (isq ? p.rstd_q : p.rstd_k)[rr] = rs;
    for (int i = lane; i < D; i += 32)
        y[i] = __ldg(w + i) * (y[i] * rs);
    __syncwarp();
    int ps = p.pos[n];
    for (int i = lane; i < h2; i += 32)
        rope_pair(y, i, h2, __ldg(p.cosb + (size_t)ps * h2 + i), __ldg(p.sinb + (size_t)ps * h2 + i),
                  QD_ROPE_FORWARD);
    __syncwarp();
    for (int i = lane; i < D; i += 32)
        o[i] = y[i];
    if (!isq && p.kc) {
        int64_t KD = (int64_t)p.KV * D, at = ((int64_t)p.row[n] * p.Tc + ps) * KD + (int64_t)h * D;
        for (int i = lane; i < D; i += 32) {
            p.kc[at + i] = y[i];
            p.vc[at + i] = __ldg(p.v + (int64_t)n * KD + (int64_t)h * D + i);
        }
    }
}

extern "C" qd_status qdk_qk_norm_rope(const qd_qk_args *a)
{
    int64_t rows = (int64_t)a->N * (a->H + a->KV);
    if (a->D % 2)
        return qd_error(QD_ERR_SHAPE, "cuda backend: qk_norm_rope: head_dim %d is odd", a->D);
    bool pf = a->D <= 128 && qd_fr_ilp();
    if (rows)
        QD_LAUNCH_SMEM(pf ? k_qk_norm_rope<true> : k_qk_norm_rope<false>,
                       (unsigned)((rows + FR_WARPS - 1) / FR_WARPS), 32u * FR_WARPS,
                       sizeof(float) * FR_WARPS * (size_t)a->D, *a);
    return QD_OK;
}

/* Per (token, slot) row: dy[r] = dout[n] * row_w[r] elementwise and dL/dweight
 * = sum over i ascending of dout[n][i] * y[r][i] (one chain, the CPU's order).
 * A block takes MD_ROWS rows: its threads read MD_COLS columns of them
 * coalesced, write dy and put the products into shared memory, then thread t
 * adds row t's products in column order. MDR 32 rows a block, or 8 with
 * QUADS_RX8=1 (as k_rmsnorm_bwd_x: four times the blocks, every row's loads of
 * a tile in flight at once; a row's operations the same, so its bits). */
#define MD_ROWS 32
#define MD_COLS 128 /* = the block size */

template <typename T, int MDR = MD_ROWS>
__global__ void __launch_bounds__(MD_COLS) k_moe_dy(T *dy, float *dwt, const float *dout, const float *y,
                                                    const float *row_w, const int32_t *row_rank,
                                                    const int32_t *tok_rows, int N, int K, int C)
{
    QD_PDL_ENTRY();
    __shared__ float s_p[MDR][MD_COLS + 1]; /* +1: row t's walk hits bank (t + c) % 32 */
    __shared__ int s_r[MDR];
    __shared__ float s_w[MDR];
    const int t = threadIdx.x, id0 = blockIdx.x * MDR, nr = min(MDR, N * K - id0);
    if (t < nr) {
        int r = tok_rows[id0 + t];
        s_r[t] = r;
        s_w[t] = row_w[r];
    }
    __syncthreads();
    float acc = 0.0f;
    for (int i0 = 0; i0 < C; i0 += MD_COLS) {
        int i = i0 + t;
        if (i < C) {
            if constexpr (MDR == MD_ROWS) { /* the loop as before 2026-12-08 (its SASS) */
#pragma unroll 8
                for (int j = 0; j < nr; j++) {
                    int r = s_r[j], n = (id0 + j) / K;
                    float d = dout[(size_t)n * C + i];
                    st_out(dy + (size_t)r * C + i, d * s_w[j]);
                    s_p[j][t] = d * y[(size_t)r * C + i];
                }
            } else {
#pragma unroll
                for (int j = 0; j < MDR; j++) {
                    if (j < nr) {
                        int r = s_r[j], n = (id0 + j) / K;
                        float d = dout[(size_t)n * C + i];
                        st_out(dy + (size_t)r * C + i, d * s_w[j]);
                        s_p[j][t] = d * y[(size_t)r * C + i];
                    }
                }
            }
        }
        __syncthreads();
        if (t < nr) {
            int m = min(MD_COLS, C - i0);
#pragma unroll 8
            for (int c = 0; c < m; c++)
                acc = acc + s_p[t][c];
        }
        __syncthreads();
    }
    if (t < nr)
        dwt[id0 + t - (id0 + t) % K + row_rank[s_r[t]]] = acc;
}

/* k_moe_dy in blocks of MD_ROWS rows, or of 8 (rx8_on) */
template <typename T>
static qd_status md_launch(T *dy, float *dwt, const float *dout, const float *y, const float *row_w,
                           const int32_t *row_rank, const int32_t *tok_rows, int N, int K, int C)
{
    if (rx8_on())
        QD_LAUNCH((k_moe_dy<T, 8>), blocks((size_t)N * K, 8), MD_COLS, dy, dwt, dout, y, row_w, row_rank, tok_rows, N,
                  K, C);
    else
        QD_LAUNCH((k_moe_dy<T, MD_ROWS>), blocks((size_t)N * K, MD_ROWS), MD_COLS, dy, dwt, dout, y, row_w, row_rank,
                  tok_rows, N, K, C);
    return QD_OK;
}

extern "C" qd_status qdk_moe_dy(float *dy, float *dwt, const float *dout, const float *y, const float *row_w,
                                const int32_t *row_rank, const int32_t *tok_rows, int N, int K, int C)
{
    return N ? md_launch(dy, dwt, dout, y, row_w, row_rank, tok_rows, N, K, C) : QD_OK;
}

extern "C" qd_status qdk_moe_dy16(uint16_t *dy, float *dwt, const float *dout, const float *y, const float *row_w,
                                  const int32_t *row_rank, const int32_t *tok_rows, int N, int K, int C)
{
    return N ? md_launch(dy, dwt, dout, y, row_w, row_rank, tok_rows, N, K, C) : QD_OK;
}

template <typename IX>
__global__ void k_unroute(float *dinp, const float *dxe, const int32_t *tok_rows, int N, int K, int C)
{
    QD_PDL_ENTRY();
    IX id = (IX)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (IX)N * (IX)C)
        return;
    int n = (int)(id / (IX)C), i = (int)(id % (IX)C);
    float v = dinp[id];
    for (int j = 0; j < K; j++)
        v = v + dxe[(size_t)tok_rows[n * K + j] * C + i];
    dinp[id] = v;
}

extern "C" qd_status qdk_unroute(float *dinp, const float *dxe, const int32_t *tok_rows, int N, int K, int C)
{
    if (N && fits32((size_t)N * C))
        QD_LAUNCH_N(k_unroute<unsigned>, ((size_t)N * C), dinp, dxe, tok_rows, N, K, C);
    else if (N)
        QD_LAUNCH_N(k_unroute<size_t>, ((size_t)N * C), dinp, dxe, tok_rows, N, K, C);
    return QD_OK;
}

__global__ void k_router_bwd(float *dlog, const float *dwt, const float *probs, const int32_t *topk,
                             const float *topw, int N, int E, int K, qd_topk_norm norm)
{
    QD_PDL_ENTRY();
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
    QD_PDL_ENTRY();
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

/* Fast mode's log-probs: a block of LP_FAST threads a row reads it once
 * (k_logprob reads it twice, the max then the sum: 20 GB a step at a3b's 16 x
 * 1,024 x 151,936 logits, as the second pass misses the L2), each thread
 * keeping the running max m of its values and the sum s of exp(x - m),
 * rescaled when m grows; the threads' pairs then combine in a tree. */
#define LP_FAST 512

static __device__ __forceinline__ void lp_merge(float *m, float *s, float m2, float s2)
{
    float M = fmaxf(*m, m2);
    if (M == -INFINITY) /* both empty */
        return;
    *s = *s * expf(*m - M) + s2 * expf(m2 - M);
    *m = M;
}

__global__ void __launch_bounds__(LP_FAST) k_logprob_fast(float *logp, float *lse, const float *logits,
                                                          const int32_t *tgt, int V, float T, int *bad)
{
    QD_PDL_ENTRY();
    __shared__ float wm[LP_FAST / 32], ws[LP_FAST / 32];
    int n = blockIdx.x, j = threadIdx.x;
    const float *l = logits + (size_t)n * V;
    float m = -INFINITY, s = 0.0f;
    int over = 0;
    for (int i = j; i < V; i += LP_FAST) {
        float x = T != 1.0f ? l[i] / T : l[i];
        over |= !isfinite(x) && isfinite(l[i]);
        if (x > m) {
            s = s * expf(m - x); /* 0 * exp(-inf) = 0 on the first */
            m = x;
        }
        if (x != -INFINITY) /* exp(-inf - -inf) would be NaN while every value so far is -inf */
            s += expf(x - m);
    }
    if (over)
        *bad = n + 1;
    for (int o = 16; o; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lp_merge(&m, &s, m2, s2);
    }
    if ((j & 31) == 0) {
        wm[j >> 5] = m;
        ws[j >> 5] = s;
    }
    __syncthreads();
    if (j == 0) {
        for (int w = 1; w < LP_FAST / 32; w++)
            lp_merge(&m, &s, wm[w], ws[w]);
        float z = m + logf(s);
        lse[n] = z;
        int t = tgt[n];
        logp[n] = t >= 0 ? (T != 1.0f ? l[t] / T : l[t]) - z : 0.0f;
    }
}

extern "C" qd_status qdk_logprob_fast(float *logp, float *lse, const float *logits, const int32_t *tgt, int N, int V,
                                      float T, int *bad)
{
    if (N)
        QD_LAUNCH(k_logprob_fast, N, LP_FAST, logp, lse, logits, tgt, V, T, bad);
    return QD_OK;
}

/* The sampler of backends/sampling.c (steps 1-6, 9, 10) for rows with no
 * top-k / top-p cut (and greedy rows), in four launches, each spread over the
 * whole GPU at any batch (a row's lanes as 1,024 threads each walking its 149
 * tokens took 0.14 ms a step at batch 1 and at batch 64 alike: latency):
 *   k_sample_max: each block of QD_SAMPLE_PT threads takes QD_SAMPLE_CH
 *     consecutive tokens of a row and finds the max of s_i = x_i / T and its
 *     lowest id (a non-finite logit or scaled logit sets *bad);
 *   k_sample_exp: the row's max and lowest id attaining it from the blocks'
 *     pairs (any reduction order gives that pair for finite values), then
 *     e_i = exp(s_i - m) for the block's tokens, stored (B x V floats);
 *   k_sample_lanes: lane j's sum of e_i over i = j, j + 1024, ..., ascending
 *     (the lane definition), the loads ahead of the chain;
 *   k_sample_draw: one block a row builds the lane tree (the classic
 *     shared-memory halving kept in tree[] at the CPU's offsets), and thread 0
 *     descends it and walks the leaf lane's stored e_i as the CPU does.
 * The caller redoes a batch with *bad set on the host (for the message). */
#define QD_SAMPLE_PARTS 4
#define QD_SAMPLE_PT (QD_SAMPLE_LANES / QD_SAMPLE_PARTS)
#define QD_SAMPLE_CH (8 * QD_SAMPLE_PT) /* tokens a block of k_sample_max / k_sample_exp */

static __device__ __forceinline__ void sample_better(float *m, int *a, float m2, int a2)
{
    if (m2 > *m || (m2 == *m && a2 < *a)) {
        *m = m2;
        *a = a2;
    }
}

/* The block's best (m, a) to every thread. */
static __device__ __forceinline__ void sample_block_best(float *m, int *a)
{
    __shared__ float wm[QD_SAMPLE_PT / 32];
    __shared__ int wa[QD_SAMPLE_PT / 32];
    int t = threadIdx.x;
    for (int o = 16; o; o >>= 1)
        sample_better(m, a, __shfl_xor_sync(0xffffffffu, *m, o), __shfl_xor_sync(0xffffffffu, *a, o));
    if ((t & 31) == 0) {
        wm[t >> 5] = *m;
        wa[t >> 5] = *a;
    }
    __syncthreads();
    *m = wm[0];
    *a = wa[0];
    for (int w = 1; w < QD_SAMPLE_PT / 32; w++)
        sample_better(m, a, wm[w], wa[w]);
}

/* Row b's max of s_i and lowest id attaining it from k_sample_max's P block
 * pairs (any order gives that pair for finite values), to every thread; the
 * row's first block stores them in rm, ra. */
static __device__ __forceinline__ float sample_row_best(float *rm, int32_t *ra, const float *pm, const int32_t *pa,
                                                        int b, int P)
{
    int t = threadIdx.x;
    float m = -INFINITY;
    int a = INT_MAX;
    for (int u = t; u < P; u += QD_SAMPLE_PT)
        sample_better(&m, &a, pm[(size_t)b * P + u], pa[(size_t)b * P + u]);
    sample_block_best(&m, &a);
    m = m + 0.0f;
    if (blockIdx.x == 0 && t == 0) {
        rm[b] = m;
        ra[b] = a;
    }
    return m;
}

__global__ void __launch_bounds__(QD_SAMPLE_PT) k_sample_max(float *pm, int32_t *pa, const float *logits, int V,
                                                            float T, int *bad)
{
    QD_PDL_ENTRY();
    int b = blockIdx.y, i0 = blockIdx.x * QD_SAMPLE_CH + threadIdx.x;
    const float *x = logits + (size_t)b * V;
    float xv[QD_SAMPLE_CH / QD_SAMPLE_PT];
#pragma unroll
    for (int u = 0; u < QD_SAMPLE_CH / QD_SAMPLE_PT; u++) {
        int i = i0 + u * QD_SAMPLE_PT;
        xv[u] = i < V ? x[i] : 0.0f;
    }
    float m = -INFINITY;
    int a = INT_MAX, nb = 0;
#pragma unroll
    for (int u = 0; u < QD_SAMPLE_CH / QD_SAMPLE_PT; u++) {
        int i = i0 + u * QD_SAMPLE_PT;
        if (i >= V)
            break;
        float si = xv[u] / T;
        nb |= !isfinite(xv[u]) || !isfinite(si);
        sample_better(&m, &a, si, i);
    }
    if (nb)
        *bad = 1;
    sample_block_best(&m, &a);
    if (threadIdx.x == 0) {
        pm[(size_t)b * gridDim.x + blockIdx.x] = m;
        pa[(size_t)b * gridDim.x + blockIdx.x] = a;
    }
}

__global__ void __launch_bounds__(QD_SAMPLE_PT) k_sample_exp(float *e, float *rm, int32_t *ra, const float *pm,
                                                            const int32_t *pa, const float *logits, int V, float T)
{
    QD_PDL_ENTRY();
    int b = blockIdx.y, t = threadIdx.x, P = gridDim.x, i0 = blockIdx.x * QD_SAMPLE_CH + t;
    float m = sample_row_best(rm, ra, pm, pa, b, P);
    const float *x = logits + (size_t)b * V;
    float *eb = e + (size_t)b * V;
#pragma unroll
    for (int u = 0; u < QD_SAMPLE_CH / QD_SAMPLE_PT; u++) {
        int i = i0 + u * QD_SAMPLE_PT;
        if (i < V)
            eb[i] = qd_expf(x[i] / T - m);
    }
}

/* Lane j's sum of f(src_i) over i = j, j + 1024, ... < V, ascending, the
 * loads ahead of the chain. */
template <typename F> static __device__ __forceinline__ float sample_lane_sum(const float *src, int j, int V, F f)
{
    enum { L = QD_SAMPLE_LANES, U = 8 };
    float acc = 0.0f;
    int i = j;
    for (; i + (U - 1) * L < V; i += U * L) {
        float v[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            v[u] = src[i + u * L];
#pragma unroll
        for (int u = 0; u < U; u++)
            v[u] = f(v[u]);
#pragma unroll
        for (int u = 0; u < U; u++)
            acc = acc + v[u];
    }
    for (; i < V; i += L)
        acc = acc + f(src[i]);
    return acc;
}

__global__ void __launch_bounds__(QD_SAMPLE_PT) k_sample_lanes(float *lsum, const float *e, int V)
{
    QD_PDL_ENTRY();
    int b = blockIdx.y, j = blockIdx.x * QD_SAMPLE_PT + threadIdx.x;
    lsum[(size_t)b * QD_SAMPLE_LANES + j] = sample_lane_sum(e + (size_t)b * V, j, V, [](float v) { return v; });
}

/* k_sample_exp and k_sample_lanes in one pass (QUADS_SAMPLE_FUSED=1, opt-in:
 * check_ops equal on an H100, 2026-12-06, but a3b-4 exact rollouts only
 * 0.98-1.014x; else the three): every block takes the row's max and lowest id from
 * k_sample_max's pairs, as k_sample_exp does, and lane j adds
 * e_i = exp(x_i / T - m) over i = j, j + 1024, ..., ascending, computing each
 * e_i where it is added instead of reading it back: the same operations on
 * the same values, so the same sums, without writing and reading B x V floats
 * (at batch 64, 39 MB each way a step). k_sample_draw then computes the drawn
 * lane's e_i again (fused != 0). */
__global__ void __launch_bounds__(QD_SAMPLE_PT) k_sample_lanes_exp(float *lsum, float *rm, int32_t *ra,
                                                                  const float *pm, const int32_t *pa,
                                                                  const float *logits, int V, int P, float T)
{
    QD_PDL_ENTRY();
    int b = blockIdx.y, j = blockIdx.x * QD_SAMPLE_PT + threadIdx.x;
    float m = sample_row_best(rm, ra, pm, pa, b, P);
    lsum[(size_t)b * QD_SAMPLE_LANES + j] =
        sample_lane_sum(logits + (size_t)b * V, j, V, [=](float v) { return qd_expf(v / T - m); });
}

__global__ void __launch_bounds__(QD_SAMPLE_LANES) k_sample_draw(int32_t *tok, float *lp, float *lpk,
                                                                 const float *lsum, const float *rm,
                                                                 const int32_t *ra, const float *e,
                                                                 const float *logits, int V,
                                                                 float T, int greedy, uint64_t seed,
                                                                 const uint64_t *sid, const uint32_t *spos,
                                                                 int fused)
{
    QD_PDL_ENTRY();
    enum { L = QD_SAMPLE_LANES, LEAF = 256 };
    __shared__ float tree[2 * L - 1];
    __shared__ float leaf[LEAF]; /* e_i of the drawn lane's tokens k, k + L, ... (V <= LEAF * L) */
    __shared__ float r_k[2];
    int b = blockIdx.x, j = threadIdx.x;
    const float *x = logits + (size_t)b * V;
    float m = rm[b];
    int a = ra[b];
    tree[j] = lsum[(size_t)b * L + j];
    __syncthreads();
    for (int n = L; n > 1; n /= 2) {
        const float *child = tree + 2 * L - 2 * n;
        float *parent = tree + 2 * L - n;
        if (j < n / 2)
            parent[j] = child[j] + child[j + n / 2];
        __syncthreads();
    }
    float Z = tree[2 * L - 2], logZ = qd_logf(Z);
    if (greedy) {
        if (j == 0) {
            tok[b] = a;
            lp[b] = (x[a] / T - m) - logZ;
            lpk[b] = 0.0f;
        }
        return;
    }
    /* step 9: the draw, descending the tree of Z (no cut: Z_kept = Z) */
    if (j == 0) {
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
        r_k[0] = r;
        r_k[1] = __int_as_float(k);
    }
    __syncthreads();
    float r = r_k[0];
    int k = __float_as_int(r_k[1]), nleaf = (V - k + L - 1) / L;
    /* the lane's stored e_i, loaded by all threads at once, so that thread 0's
     * walk below waits on no load */
    const float *eb = e + (size_t)b * V;
    if (nleaf <= LEAF)
        for (int u = j; u < nleaf; u += L)
            leaf[u] = fused ? qd_expf(x[k + (size_t)u * L] / T - m) : eb[k + (size_t)u * L];
    __syncthreads();
    if (j != 0)
        return;
    float c = 0.0f;
    int t = -1;
    for (int i = k, u = 0; i < V; i += L, u++) {
        float w = nleaf <= LEAF ? leaf[u] : fused ? qd_expf(x[i] / T - m) : eb[i];
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
                                uint64_t seed, const uint64_t *sid, const uint32_t *spos, int *bad, void *work)
{
    int greedy = T == 0.0f;
    float Ts = greedy ? 1.0f : T;
    if (B == 0)
        return QD_OK;
    unsigned P = (unsigned)((V + QD_SAMPLE_CH - 1) / QD_SAMPLE_CH);
    size_t nl = (size_t)B * QD_SAMPLE_LANES;
    float *e = (float *)work, *lsum = e + (size_t)B * V, *rm = lsum + nl, *pm = rm + B;
    int32_t *ra = (int32_t *)(pm + (size_t)B * P), *pa = ra + B;
    dim3 grid(P, (unsigned)B), lanes(QD_SAMPLE_PARTS, (unsigned)B);
    static int fused_on = -1;
    int fused = env_opt_in(&fused_on, "QUADS_SAMPLE_FUSED");
    QD_LAUNCH(k_sample_max, grid, QD_SAMPLE_PT, pm, pa, logits, V, Ts, bad);
    if (fused) {
        QD_LAUNCH(k_sample_lanes_exp, lanes, QD_SAMPLE_PT, lsum, rm, ra, pm, pa, logits, V, (int)P, Ts);
    } else {
        QD_LAUNCH(k_sample_exp, grid, QD_SAMPLE_PT, e, rm, ra, pm, pa, logits, V, Ts);
        QD_LAUNCH(k_sample_lanes, lanes, QD_SAMPLE_PT, lsum, e, V);
    }
    QD_LAUNCH(k_sample_draw, (unsigned)B, QD_SAMPLE_LANES, tok, lp, lpk, lsum, rm, ra, e, logits, V, Ts, greedy,
              seed, sid, spos, fused);
    return QD_OK;
}

extern "C" size_t qdk_sample_work_bytes(int B, int V)
{
    size_t P = ((size_t)V + QD_SAMPLE_CH - 1) / QD_SAMPLE_CH;
    return (size_t)B * (sizeof(float) * ((size_t)V + QD_SAMPLE_LANES + 1 + P) + sizeof(int32_t) * (1 + P));
}

/* Block (n, column block): the row's values read once a thread, no 64-bit division. */
/* dlogits[n][j] = dlogp[n] (onehot(tgt[n]) - softmax(logits[n] / T))[j] / T */
static __device__ __forceinline__ float dlogit(const float *dlogp, const float *logits, const float *lse,
                                               const int32_t *tgt, int n, int j, int V, float T)
{
    int g = tgt[n];
    float d = g >= 0 ? dlogp[n] / T : 0.0f;
    float p = qd_expf(logits[(size_t)n * V + j] / T - lse[n]);
    return d * ((j == g ? 1.0f : 0.0f) - p);
}

__global__ void k_logprob_bwd(float *dlogits, const float *dlogp, const float *logits, const float *lse,
                              const int32_t *tgt, int N, int V, float T)
{
    QD_PDL_ENTRY();
    int n = blockIdx.x, j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j < V)
        dlogits[(size_t)n * V + j] = dlogit(dlogp, logits, lse, tgt, n, j, V, T);
}

extern "C" qd_status qdk_logprob_backward(float *dlogits, const float *dlogp, const float *logits,
                                          const float *lse, const int32_t *tgt, int N, int V, float T)
{
    if (N && V)
        QD_LAUNCH(k_logprob_bwd, dim3((unsigned)N, blocks((size_t)V, 256u)), 256u, dlogits, dlogp, logits, lse, tgt,
                  N, V, T);
    return QD_OK;
}

/* The BF16 bits of k_logprob_bwd's values in columns c0 .. c0 + nc - 1 of
 * every row, into dy16 (N, nc): the fast lm_head backward's block (no float32
 * N x V array). Block (n, column block), as k_logprob_bwd. */
__global__ void k_logprob_bwd16(uint16_t *dy16, const float *dlogp, const float *logits, const float *lse,
                                const int32_t *tgt, int N, int V, float T, int c0, int nc)
{
    QD_PDL_ENTRY();
    int n = blockIdx.x, jj = blockIdx.y * blockDim.x + threadIdx.x;
    if (jj < nc)
        dy16[(size_t)n * nc + jj] = (uint16_t)bf16_hi(dlogit(dlogp, logits, lse, tgt, n, c0 + jj, V, T));
}

/* The same block with fast mode's arithmetic: four columns a thread (16-byte
 * loads of the logits, 8-byte stores of the bits), the row's dlogp / T once,
 * x / T as x * (1 / T) and exp by the hardware's exp2 (__expf: a relative
 * error of a few 1e-7 against qd_expf's correctly rounded result, below the
 * BF16 rounding of the bits it feeds). k_logprob_bwd16 spent ~50 operations a
 * value (a division, qd_expf's polynomial) on a pass that should be bound by
 * its bytes: 2.5 G values a step at a3b's 16 x 1,024 x 151,936. */
__global__ void k_logprob_bwd16_fast(uint2 *dy16, const float *dlogp, const float *logits, const float *lse,
                                     const int32_t *tgt, int V, float T, float invT, int c0, int nc4)
{
    QD_PDL_ENTRY();
    int n = blockIdx.x, q = blockIdx.y * blockDim.x + threadIdx.x;
    if (q >= nc4)
        return;
    int g = tgt[n], j = c0 + 4 * q;
    float d = g >= 0 ? dlogp[n] / T : 0.0f, l = lse[n];
    float4 x = __ldcs((const float4 *)(logits + (size_t)n * V + j));
    float4 r;
    r.x = d * ((j == g ? 1.0f : 0.0f) - __expf(x.x * invT - l));
    r.y = d * ((j + 1 == g ? 1.0f : 0.0f) - __expf(x.y * invT - l));
    r.z = d * ((j + 2 == g ? 1.0f : 0.0f) - __expf(x.z * invT - l));
    r.w = d * ((j + 3 == g ? 1.0f : 0.0f) - __expf(x.w * invT - l));
    dy16[(size_t)n * nc4 + q] = bf16x4(r);
}

extern "C" qd_status qdk_logprob_backward_bf16_cols(uint16_t *dy16, const float *dlogp, const float *logits,
                                                    const float *lse, const int32_t *tgt, int N, int V, float T,
                                                    int c0, int nc, int fast)
{
    if (!N || nc <= 0)
        return QD_OK;
    if (fast && V % 4 == 0 && c0 % 4 == 0 && nc % 4 == 0 && qd_aligned(logits, 16) && qd_aligned(dy16, 8)) {
        QD_LAUNCH(k_logprob_bwd16_fast, dim3((unsigned)N, blocks((size_t)nc / 4, 256u)), 256u, (uint2 *)dy16, dlogp,
                  logits, lse, tgt, V, T, 1.0f / T, c0, nc / 4);
        return QD_OK;
    }
    QD_LAUNCH(k_logprob_bwd16, dim3((unsigned)N, blocks((size_t)nc, 256u)), 256u, dy16, dlogp, logits, lse, tgt, N,
              V, T, c0, nc);
    return QD_OK;
}

/* ------------------------------------------------------------------------ */
/* statistics and AdamW                                                      */

__global__ void k_sqerr_rows(double *err, double *nrm, const float *x, const float *xh, int rows, int cols)
{
    QD_PDL_ENTRY();
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


/* A warp a segment: its rows come through shared memory 256 at a time
 * (coalesced), then lane k adds them in order into set k's sums, as the host
 * adds them (a segment of a dense linear is a whole batch's rows: one
 * thread's loads from global memory would be a chain of latencies). */
#define DIAG_CHUNK 256
__global__ void __launch_bounds__(32) k_diag_add(double *acc, const double *e, int rows, const int32_t *off,
                                                 const int32_t *slot, int nseg, int nsets, int set)
{
    QD_PDL_ENTRY();
    __shared__ double se[DIAG_CHUNK], sn[DIAG_CHUNK];
    int g = blockIdx.x, lane = threadIdx.x, r0 = off[g], r1 = off[g + 1];
    double *a = NULL, err = 0.0, nrm = 0.0;
    if (lane < nsets) {
        a = acc + 2 * (size_t)slot[(size_t)lane * nseg + g];
        if (!set)
            err = a[0], nrm = a[1];
    }
    for (int c0 = r0; c0 < r1; c0 += DIAG_CHUNK) {
        int n = r1 - c0 < DIAG_CHUNK ? r1 - c0 : DIAG_CHUNK;
        for (int i = lane; i < n; i += 32) {
            se[i] = e[c0 + i];
            sn[i] = e[(size_t)rows + c0 + i];
        }
        __syncwarp();
        if (lane < nsets)
            for (int i = 0; i < n; i++) {
                err = err + se[i];
                nrm = nrm + sn[i];
            }
        __syncwarp();
    }
    if (lane < nsets) {
        a[0] = err;
        a[1] = nrm;
    }
}

extern "C" qd_status qdk_diag_add(double *acc, const double *e, int rows, const int32_t *off, const int32_t *slot,
                                  int nseg, int nsets, int set)
{
    if (nsets < 1 || nsets > 32)
        return qd_error(QD_ERR_ARG, "qdk_diag_add: %d sets (1 to 32)", nsets);
    if (nseg > 0)
        QD_LAUNCH(k_diag_add, (unsigned)nseg, 32, acc, e, rows, off, slot, nseg, nsets, set);
    return QD_OK;
}

/* sqerr_rows / sqerr_weights: a thread a row, 128 rows a block; the rows' x
 * (and xh) come through shared memory 32 columns at a time (a warp reads one
 * row's 128 bytes, where a thread walking its own row reads 32 rows' lines at
 * once), then each thread adds its row's columns in order: the sums of the
 * row-serial loop, bit for bit. Rows r0 .. r0+127 of weight w (xh, or its
 * codes dequantized) into err[r], nrm[r]. */
#define SQW_ROWS 128
#define SQW_TW 32
__device__ __forceinline__ void sqerr_tile_rows(double *err_out, double *nrm_out, const qdk_sqw &w, int r0, int N,
                                                int K)
{
    __shared__ float sx[SQW_TW][SQW_ROWS + 1], sh[SQW_TW][SQW_ROWS + 1];
    int tid = threadIdx.x, r = r0 + tid;
    float sd = w.xh ? 0.0f : w.s_dec[0];
    double err = 0.0, nrm = 0.0;
    for (int c0 = 0; c0 < K; c0 += SQW_TW) {
        int tw = K - c0 < SQW_TW ? K - c0 : SQW_TW;
        for (int k = tid; k < SQW_ROWS * SQW_TW; k += SQW_ROWS) {
            int rr = k / SQW_TW, cc = k % SQW_TW, gr = r0 + rr;
            float vx = 0.0f, vh = 0.0f;
            if (gr < N && cc < tw) {
                size_t o = (size_t)gr * (size_t)K + (size_t)(c0 + cc);
                vx = w.x[o];
                if (w.xh)
                    vh = w.xh[o];
            }
            sx[cc][rr] = vx;
            sh[cc][rr] = vh;
        }
        __syncthreads();
        if (r < N)
            for (int j = 0; j < tw; j++) {
                float xv = sx[j][tid], hv;
                if (w.xh) {
                    hv = sh[j][tid];
                } else {
                    int col = c0 + j;
                    uint8_t byte = w.codes[(size_t)r * (size_t)(w.cols / 2) + (size_t)(col / 2)];
                    hv = qd_nvfp4_dequant1(col & 1 ? byte >> 4 : byte & 0xf,
                                           w.scales[(size_t)r * (size_t)(w.cols / 16) + (size_t)(col / 16)], sd);
                }
                double d = (double)xv - (double)hv;
                err = err + d * d;
                nrm = nrm + (double)xv * (double)xv;
            }
        __syncthreads();
    }
    if (r < N) {
        err_out[r] = err;
        nrm_out[r] = nrm;
    }
}

__global__ void __launch_bounds__(SQW_ROWS) k_sqerr_weights(double *e, const qdk_sqw *t, int count, int N, int K)
{
    QD_PDL_ENTRY();
    size_t rows = (size_t)count * (size_t)N, base = (size_t)blockIdx.y * (size_t)N;
    sqerr_tile_rows(e + base, e + rows + base, t[blockIdx.y], blockIdx.x * SQW_ROWS, N, K);
}

__global__ void __launch_bounds__(SQW_ROWS) k_sqerr_rows_tiled(double *err, double *nrm, const float *x,
                                                               const float *xh, int rows, int cols)
{
    QD_PDL_ENTRY();
    qdk_sqw w = {x, xh, NULL, NULL, NULL, 0};
    sqerr_tile_rows(err, nrm, w, blockIdx.x * SQW_ROWS, rows, cols);
}

/* QUADS_SQERR_TILED=0: a thread walking its own row (the same sums) */
extern "C" qd_status qdk_sqerr_rows(double *err, double *nrm, const float *x, const float *xh, int rows, int cols)
{
    static int tiled = -1;
    if (rows && env_on(&tiled, "QUADS_SQERR_TILED"))
        QD_LAUNCH(k_sqerr_rows_tiled, blocks((size_t)rows, SQW_ROWS), SQW_ROWS, err, nrm, x, xh, rows, cols);
    else if (rows)
        QD_LAUNCH_N(k_sqerr_rows, (rows), err, nrm, x, xh, rows, cols);
    return QD_OK;
}

extern "C" qd_status qdk_sqerr_weights(double *e, const qdk_sqw *t, int count, int N, int K)
{
    if (count > 0 && N > 0)
        QD_LAUNCH(k_sqerr_weights, dim3(blocks((size_t)N, SQW_ROWS), (unsigned)count), SQW_ROWS, e, t, count, N, K);
    return QD_OK;
}

__global__ void k_rac_error(double *err, const float *x, const float *xh, int rows, int K)
{
    QD_PDL_ENTRY();
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
    QD_PDL_ENTRY();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)rows * K)
        out[i] = deq[(i / K) * kc + i % K];
}

__global__ void k_rac_add_residual(float *out, const float *deq, const int64_t *ch, int rows, int K, int64_t n)
{
    QD_PDL_ENTRY();
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
    QD_PDL_ENTRY();
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

/* Thread k owns chunk k (SQ_CHUNK floats) and adds its squares in order, as
 * the CPU does. The block's SQ_BLOCK chunks go through shared memory SQ_T
 * floats of each at a time, loaded coalesced (a warp reads 32 consecutive
 * floats of one chunk), the next stage's loads in flight during the adds. */
#define SQ_CHUNK 4096
#define SQ_BLOCK 128
#define SQ_T 32
#define SQ_PER (SQ_BLOCK * SQ_T / SQ_BLOCK) /* floats a thread loads a stage (= SQ_T) */

/* Thread t's share of a stage: float t % SQ_T of chunks t / SQ_T + j * (SQ_BLOCK / SQ_T). */
static __device__ __forceinline__ void sq_load(float *v, const float *g, size_t n, size_t at)
{
#pragma unroll
    for (int j = 0; j < SQ_PER; j++, at += (size_t)(SQ_BLOCK / SQ_T) * SQ_CHUNK)
        v[j] = at < n ? g[at] : 0.0f;
}

__global__ void __launch_bounds__(SQ_BLOCK) k_sumsq_chunks(double *part, const float *g, size_t n)
{
    QD_PDL_ENTRY();
    __shared__ float s_g[SQ_BLOCK][SQ_T + 1]; /* +1: chunk t's walk hits bank (t + i) % 32 */
    const int t = threadIdx.x;
    const size_t k0 = (size_t)blockIdx.x * SQ_BLOCK, k = k0 + t;
    const size_t mine = (k0 + t / SQ_T) * SQ_CHUNK + t % SQ_T; /* where thread t's loads start */
    const size_t end = (k + 1) * SQ_CHUNK < n ? (k + 1) * SQ_CHUNK : n;
    float v[SQ_PER];
    double s = 0.0;
    sq_load(v, g, n, mine);
    for (int i0 = 0; i0 < SQ_CHUNK; i0 += SQ_T) {
#pragma unroll
        for (int j = 0; j < SQ_PER; j++)
            s_g[t / SQ_T + j * (SQ_BLOCK / SQ_T)][t % SQ_T] = v[j];
        __syncthreads();
        if (i0 + SQ_T < SQ_CHUNK)
            sq_load(v, g, n, mine + i0 + SQ_T);
        size_t at = k * SQ_CHUNK + i0;
        int m = at >= end ? 0 : end - at < SQ_T ? (int)(end - at) : SQ_T;
#pragma unroll 8
        for (int i = 0; i < m; i++)
            s = s + (double)s_g[t][i] * (double)s_g[t][i];
        __syncthreads();
    }
    if (k * SQ_CHUNK < n)
        part[k] = s;
}

extern "C" qd_status qdk_sumsq_chunks(double *part, const float *g, size_t n)
{
    if (n)
        QD_LAUNCH(k_sumsq_chunks, blocks((n + SQ_CHUNK - 1) / SQ_CHUNK, SQ_BLOCK), SQ_BLOCK, part, g, n);
    return QD_OK;
}

/* One parameter's AdamW update (the CPU's expression, operation for operation). */
static __device__ __forceinline__ void adamw_one(float &p, float g, float &m, float &v, float lr, float beta1,
                                                 float beta2, float eps, float wd, float gscale, float bc1, float bc2)
{
    float gi = g * gscale;
    m = beta1 * m + (1.0f - beta1) * gi;
    v = beta2 * v + (1.0f - beta2) * (gi * gi);
    float mh = m / bc1, vh = v / bc2;
    p = p - lr * (mh / (sqrtf(vh) + eps) + wd * p);
}

/* Four parameters a thread with 16-byte loads and stores, a grid-stride loop
 * (one launch serves a run of tensors: 3.1B parameters for a3b at 4 layers);
 * k_adamw takes the n % 4 left and unaligned arrays. */
/* wk (where not NULL) gets round_bf16 of the updated p, bits (where not NULL)
 * its BF16 bits: a BF16 recipe's working copies in the same pass. */
__global__ void k_adamw4(float4 *p, const float4 *g, float4 *m, float4 *v, float4 *wk, uint2 *bits, size_t n4,
                         float lr, float beta1, float beta2, float eps, float wd, float gscale, float bc1, float bc2)
{
    QD_PDL_ENTRY();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        float4 pp = p[i], gg = g[i], mm = m[i], vv = v[i];
        adamw_one(pp.x, gg.x, mm.x, vv.x, lr, beta1, beta2, eps, wd, gscale, bc1, bc2);
        adamw_one(pp.y, gg.y, mm.y, vv.y, lr, beta1, beta2, eps, wd, gscale, bc1, bc2);
        adamw_one(pp.z, gg.z, mm.z, vv.z, lr, beta1, beta2, eps, wd, gscale, bc1, bc2);
        adamw_one(pp.w, gg.w, mm.w, vv.w, lr, beta1, beta2, eps, wd, gscale, bc1, bc2);
        p[i] = pp, m[i] = mm, v[i] = vv;
        if (wk)
            wk[i] = make_float4(qd_round_bf16(pp.x), qd_round_bf16(pp.y), qd_round_bf16(pp.z), qd_round_bf16(pp.w));
        if (bits)
            bits[i] = bf16x4(pp);
    }
}

/* k_adamw4 with two float4 of each array loaded before either is updated
 * (8 loads of 16 bytes in flight a thread) and streaming cache hints (each
 * byte is touched once): the same update of each element, so the same bits.
 * Opt-in (QUADS_ADAMW_U2=1) until timed against k_adamw4 on the H200. */
__global__ void __launch_bounds__(256) k_adamw4u2(float4 *p, const float4 *g, float4 *m, float4 *v, float4 *wk,
                                                  uint2 *bits, size_t n4, float lr, float beta1, float beta2,
                                                  float eps, float wd, float gscale, float bc1, float bc2)
{
    QD_PDL_ENTRY();
    size_t st = (size_t)gridDim.x * blockDim.x, i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i < n4; i += 2 * st) {
        size_t i2 = i + st;
        int two = i2 < n4;
        float4 pp[2], gg[2], mm[2], vv[2];
        pp[0] = __ldcs(p + i), gg[0] = __ldcs(g + i), mm[0] = __ldcs(m + i), vv[0] = __ldcs(v + i);
        if (two)
            pp[1] = __ldcs(p + i2), gg[1] = __ldcs(g + i2), mm[1] = __ldcs(m + i2), vv[1] = __ldcs(v + i2);
#pragma unroll
        for (int u = 0; u < 2; u++) {
            if (u == 1 && !two)
                break;
            adamw_one(pp[u].x, gg[u].x, mm[u].x, vv[u].x, lr, beta1, beta2, eps, wd, gscale, bc1, bc2);
            adamw_one(pp[u].y, gg[u].y, mm[u].y, vv[u].y, lr, beta1, beta2, eps, wd, gscale, bc1, bc2);
            adamw_one(pp[u].z, gg[u].z, mm[u].z, vv[u].z, lr, beta1, beta2, eps, wd, gscale, bc1, bc2);
            adamw_one(pp[u].w, gg[u].w, mm[u].w, vv[u].w, lr, beta1, beta2, eps, wd, gscale, bc1, bc2);
            size_t j = u ? i2 : i;
            __stcs(p + j, pp[u]);
            __stcs(m + j, mm[u]);
            __stcs(v + j, vv[u]);
            if (wk)
                wk[j] = make_float4(qd_round_bf16(pp[u].x), qd_round_bf16(pp[u].y), qd_round_bf16(pp[u].z),
                                    qd_round_bf16(pp[u].w));
            if (bits)
                bits[j] = bf16x4(pp[u]);
        }
    }
}

__global__ void k_adamw(float *p, const float *g, float *m, float *v, float *wk, uint16_t *bits, size_t n, float lr,
                        float beta1, float beta2, float eps, float wd, float gscale, float bc1, float bc2)
{
    QD_PDL_ENTRY();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        adamw_one(p[i], g[i], m[i], v[i], lr, beta1, beta2, eps, wd, gscale, bc1, bc2);
        if (wk)
            wk[i] = qd_round_bf16(p[i]);
        if (bits)
            bits[i] = (uint16_t)bf16_hi(p[i]);
    }
}

extern "C" qd_status qdk_adamw_round(float *p, const float *g, float *m, float *v, float *wk, uint16_t *bits,
                                     size_t n, float lr, float beta1, float beta2, float eps, float wd, float gscale,
                                     float bc1, float bc2)
{
    int vec = qd_aligned(p, 16) && qd_aligned(g, 16) && qd_aligned(m, 16) && qd_aligned(v, 16) &&
              (!wk || qd_aligned(wk, 16)) && (!bits || qd_aligned(bits, 8));
    size_t n4 = vec ? n / 4 : 0;
    static int u2 = -1;
    if (n4 && env_opt_in(&u2, "QUADS_ADAMW_U2")) {
        size_t cap = (size_t)qd_sm_count() * 8, nb = blocks((n4 + 1) / 2, 256); /* every thread two float4 */
        QD_LAUNCH(k_adamw4u2, (unsigned)(nb < cap ? nb : cap), 256, (float4 *)p, (const float4 *)g, (float4 *)m,
                  (float4 *)v, (float4 *)wk, (uint2 *)bits, n4, lr, beta1, beta2, eps, wd, gscale, bc1, bc2);
    } else if (n4) {
        size_t cap = (size_t)qd_sm_count() * 16, nb = blocks(n4, 256);
        QD_LAUNCH(k_adamw4, (unsigned)(nb < cap ? nb : cap), 256, (float4 *)p, (const float4 *)g, (float4 *)m,
                  (float4 *)v, (float4 *)wk, (uint2 *)bits, n4, lr, beta1, beta2, eps, wd, gscale, bc1, bc2);
    }
    size_t r = n - 4 * n4, o = 4 * n4;
    if (r)
        QD_LAUNCH_N(k_adamw, (r), p + o, g + o, m + o, v + o, wk ? wk + o : NULL, bits ? bits + o : NULL, r, lr,
                    beta1, beta2, eps, wd, gscale, bc1, bc2);
    return QD_OK;
}

extern "C" qd_status qdk_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                               float beta2, float eps, float wd, float gscale, float bc1, float bc2)
{
    return qdk_adamw_round(p, g, m, v, NULL, NULL, n, lr, beta1, beta2, eps, wd, gscale, bc1, bc2);
}
