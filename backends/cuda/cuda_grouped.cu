/* backends/cuda/cuda_grouped.cu: the experts' BF16 products, every expert in
 * one launch (fast mode; QUADS_EXPERT_GEMM=mma).
 *
 * Why: a MoE layer's experts are many small products (a3b: 128 experts of about
 * 1,024 rows x 768 x 2048 in training). One cuBLAS call an expert gives each
 * only ~48 CTAs of 128 x 128, a third of the H200's SMs, and a host call an
 * expert (384 a layer forward); one grid over the tiles of every expert fills
 * the machine and costs one launch.
 *
 * The product, for each group g (row-major, contiguous rows):
 *     C_g (M_g, N) = alpha_g op(A_g) (M_g, K_g) . op(B_g) (K_g, N) + beta C_g,
 * op(A) = A stored (M, K), or A^T of A stored (K, M) when ta; op(B) = B^T of B
 * stored (N, K) when tb, else B stored (K, N): the forward (y = x.W^T: ta 0,
 * tb 1), dx (dx += dy.W: ta 0, tb 0) and dW (dW += dy^T.x: ta 1, tb 0) of the
 * experts. BF16 inputs, float32 accumulation on the tensor cores
 * (mma.m16n8k16), float32 C: the same arithmetic class as cuBLAS's BF16 GEMM
 * (only the order of the sums differs; fast mode's bounds, check_blas).
 *
 * A CTA of 8 warps computes a 128 x 128 tile of one group's C over K in steps
 * of 32, three stages of cp.async copies in flight (rows past M or K read as
 * zero); each warp owns 64 x 32 of the tile, its operands read by ldmatrix
 * (.trans for the operands stored K-major: A when ta, B when !tb). The tiles
 * of all groups form one grid; a CTA finds its group by binary search over the
 * groups' first tiles. */
#include <stdint.h>
#include <stdlib.h>
#include <cuda_runtime.h>
#include "backends/cuda/cuda_blas.h"
#include "backends/cuda/cuda_check.h"

#define GM_BM 128
#define GM_BN 128
#define GM_BK 32
#define GM_PAD 8                        /* halves a staged row is padded by: conflict-free ldmatrix */
#define GM_TILE ((GM_BM) * (GM_BK + GM_PAD)) /* halves an operand's stage (>= GM_BK * (GM_BM + GM_PAD)) */
#define GM_STAGES 3
#define GM_THREADS 256
#define GM_SMEM (GM_STAGES * 2 * GM_TILE * (int)sizeof(uint16_t))
#define GM_GROUPS 64 /* groups a launch (the parameter block stays under 4 KB) */

typedef struct {
    const uint16_t *A[GM_GROUPS], *B[GM_GROUPS];
    float *C[GM_GROUPS];
    int M[GM_GROUPS], K[GM_GROUPS];
    float alpha[GM_GROUPS];
    int tile0[GM_GROUPS + 1]; /* first tile of each group; tile0[ng] = the grid */
    int ng, N;
    float beta;
} gm_params;

static __device__ __forceinline__ unsigned smem_u32(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}

/* 16 bytes from global to shared, zero-filled where !valid (src then unread) */
static __device__ __forceinline__ void cp16(void *dst, const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
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

static __device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* One operand's tile for k-step k0 into s: R rows (M or N side) x GM_BK.
 * Stored row-contiguous along K (KM = 0: s[r][k], row stride GM_BK + GM_PAD)
 * or along the rows (KM = 1: s[k][r], row stride GM_BM + GM_PAD). src is the
 * operand, ld its row stride; rows >= R_lim or k >= K_lim read as zero. */
template <int KM>
static __device__ __forceinline__ void load_tile(uint16_t *s, const uint16_t *src, int ld, int r0, int R_lim, int k0,
                                                 int K_lim)
{
    int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < (GM_BM * GM_BK / 8) / GM_THREADS; i++) {
        int c = tid + i * GM_THREADS;
        if (KM == 0) { /* GM_BK / 8 = 4 chunks a row */
            int r = c >> 2, kc = (c & 3) * 8;
            int gr = r0 + r, gk = k0 + kc;
            bool ok = gr < R_lim && gk < K_lim;
            cp16(s + r * (GM_BK + GM_PAD) + kc, ok ? src + (size_t)gr * ld + gk : src, ok);
        } else { /* GM_BM / 8 = 16 chunks a row of k */
            int k = c >> 4, rc = (c & 15) * 8;
            int gk = k0 + k, gr = r0 + rc;
            bool ok = gk < K_lim && gr < R_lim;
            cp16(s + k * (GM_BM + GM_PAD) + rc, ok ? src + (size_t)gk * ld + gr : src, ok);
        }
    }
}

template <int AT, int BT>
__global__ void __launch_bounds__(GM_THREADS) k_grouped_mma(const __grid_constant__ gm_params p)
{
    extern __shared__ __align__(16) uint16_t gm_smem[];
    int bid = blockIdx.x, lo = 0, hi = p.ng;
    while (hi - lo > 1) { /* tile0[lo] <= bid < tile0[hi] */
        int mid = (lo + hi) >> 1;
        if (p.tile0[mid] <= bid)
            lo = mid;
        else
            hi = mid;
    }
    const int g = lo, M = p.M[g], K = p.K[g], N = p.N;
    const int tiles_n = (N + GM_BN - 1) / GM_BN, t = bid - p.tile0[g];
    const int m0 = (t / tiles_n) * GM_BM, n0 = (t % tiles_n) * GM_BN;
    const uint16_t *A = p.A[g], *B = p.B[g];
    const int lda = AT ? M : K, ldb = BT ? N : K; /* BT: B stored (K, N) */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm0 = (warp & 1) * 64, wn0 = (warp >> 1) * 32;
    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
    const int KT = (K + GM_BK - 1) / GM_BK;
#pragma unroll
    for (int s = 0; s < GM_STAGES - 1; s++) {
        if (s < KT) {
            uint16_t *sa = gm_smem + (2 * s) * GM_TILE, *sb = sa + GM_TILE;
            load_tile<AT>(sa, A, lda, m0, M, s * GM_BK, K);
            load_tile<BT>(sb, B, ldb, n0, N, s * GM_BK, K);
        }
        asm volatile("cp.async.commit_group;");
    }
    for (int kt = 0; kt < KT; kt++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(GM_STAGES - 2));
        __syncthreads(); /* stage kt landed for all; stage kt - 1 free for the next copy */
        int nk = kt + GM_STAGES - 1;
        if (nk < KT) {
            uint16_t *sa = gm_smem + (2 * (nk % GM_STAGES)) * GM_TILE, *sb = sa + GM_TILE;
            load_tile<AT>(sa, A, lda, m0, M, nk * GM_BK, K);
            load_tile<BT>(sb, B, ldb, n0, N, nk * GM_BK, K);
        }
        asm volatile("cp.async.commit_group;");
        const uint16_t *sa = gm_smem + (2 * (kt % GM_STAGES)) * GM_TILE, *sb = sa + GM_TILE;
#pragma unroll
        for (int kk = 0; kk < GM_BK; kk += 16) {
            uint32_t af[4][4], bf[4][2];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int mr = wm0 + 16 * i;
                if (AT == 0)
                    ldm_x4(af[i], sa + (mr + (lane & 15)) * (GM_BK + GM_PAD) + kk + (lane >> 4) * 8);
                else
                    ldm_x4_t(af[i], sa + (kk + (lane & 7) + (lane >> 4) * 8) * (GM_BM + GM_PAD) + mr +
                                        ((lane >> 3) & 1) * 8);
            }
#pragma unroll
            for (int q = 0; q < 2; q++) {
                int nr = wn0 + 16 * q;
                uint32_t r[4];
                if (BT == 0)
                    ldm_x4(r, sb + (nr + (lane & 7) + ((lane >> 4) << 3)) * (GM_BK + GM_PAD) + kk +
                                  ((lane >> 3) & 1) * 8);
                else
                    ldm_x4_t(r, sb + (kk + (lane & 7) + ((lane >> 3) & 1) * 8) * (GM_BN + GM_PAD) + nr +
                                    (lane >> 4) * 8);
                bf[2 * q][0] = r[0], bf[2 * q][1] = r[1], bf[2 * q + 1][0] = r[2], bf[2 * q + 1][1] = r[3];
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    mma_bf16(acc[i][j], af[i], bf[j][0], bf[j][1]);
        }
    }
    asm volatile("cp.async.wait_group 0;");
    float *C = p.C[g];
    const float alpha = p.alpha[g], beta = p.beta;
    const int gq = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int row = m0 + wm0 + 16 * i + gq + 8 * h, col = n0 + wn0 + 8 * j + 2 * tq;
                if (row >= M)
                    continue;
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    if (col + u >= N)
                        continue;
                    float *c = C + (size_t)row * N + col + u;
                    float v = alpha * acc[i][j][2 * h + u];
                    *c = beta == 0.0f ? v : v + beta * *c;
                }
            }
}

template <int AT, int BT>
static qd_status launch(const gm_params *p)
{
    static bool ready;
    if (!ready) {
        QD_CUDA_CHECK(cudaFuncSetAttribute(k_grouped_mma<AT, BT>, cudaFuncAttributeMaxDynamicSharedMemorySize, GM_SMEM));
        ready = true;
    }
    k_grouped_mma<AT, BT><<<p->tile0[p->ng], GM_THREADS, GM_SMEM>>>(*p);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

/* QD_ERR_UNSUPPORTED, nothing enqueued, where a problem's rows are not whole
 * 16-byte copies (the dimension an operand is contiguous along not a multiple
 * of 8, a pointer off 16 bytes) or the groups' N differ: the caller takes
 * another path. */
extern "C" qd_status qd_cuda_grouped_mma_bf16(const qd_grp_gemm *g, int G, int ta, int tb, float beta)
{
    if (G <= 0)
        return QD_OK;
    int N = g[0].N;
    for (int i = 0; i < G; i++) {
        int contig_a = ta ? g[i].M : g[i].K, contig_b = tb ? g[i].K : N;
        if (g[i].N != N || g[i].M <= 0 || g[i].K <= 0 || N <= 0 || contig_a % 8 || contig_b % 8 ||
            !qd_aligned(g[i].A, 16) || !qd_aligned(g[i].B, 16) || !qd_aligned(g[i].C, 4))
            return QD_ERR_UNSUPPORTED;
    }
    gm_params *p = (gm_params *)calloc(1, sizeof *p);
    if (!p)
        return qd_error(QD_ERR_NOMEM, "qd_cuda_grouped_mma_bf16: %d groups", G);
    qd_status st = QD_OK;
    int tiles_n = (N + GM_BN - 1) / GM_BN;
    for (int g0 = 0; g0 < G && !st; g0 += GM_GROUPS) {
        int ng = G - g0 < GM_GROUPS ? G - g0 : GM_GROUPS;
        long long tiles = 0;
        p->ng = ng, p->N = N, p->beta = beta;
        for (int i = 0; i < ng; i++) {
            const qd_grp_gemm *q = &g[g0 + i];
            p->A[i] = (const uint16_t *)q->A, p->B[i] = (const uint16_t *)q->B, p->C[i] = q->C;
            p->M[i] = q->M, p->K[i] = q->K, p->alpha[i] = q->alpha;
            p->tile0[i] = (int)tiles;
            tiles += (long long)((q->M + GM_BM - 1) / GM_BM) * tiles_n;
        }
        if (tiles > 0x7fffffffLL) {
            st = qd_error(QD_ERR_SHAPE, "qd_cuda_grouped_mma_bf16: %lld tiles", tiles);
            break;
        }
        p->tile0[ng] = (int)tiles;
        st = ta ? (tb ? launch<1, 0>(p) : launch<1, 1>(p)) : (tb ? launch<0, 0>(p) : launch<0, 1>(p));
    }
    free(p);
    return st;
}
