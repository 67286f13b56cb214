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
#include "backends/cuda/cuda_mma.h"
#include "backends/cuda/cuda_wgmma.h"

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
    int bulk; /* the wgmma kernel's EPI configurations: C's rows through the bulk copy engine (wg_bulk_ok) */
} gm_params;

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

/* The group of tile bid: tile0[g] <= bid < tile0[g + 1] (binary search) */
static __device__ __forceinline__ int gm_group(const gm_params &p, int bid)
{
    int lo = 0, hi = p.ng;
    while (hi - lo > 1) {
        int mid = (lo + hi) >> 1;
        if (p.tile0[mid] <= bid)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

template <int AT, int BT>
__global__ void __launch_bounds__(GM_THREADS) k_grouped_mma(const __grid_constant__ gm_params p)
{
    QD_PDL_ENTRY();
    extern __shared__ __align__(16) uint16_t gm_smem[];
    const int bid = blockIdx.x, g = gm_group(p, bid), M = p.M[g], K = p.K[g], N = p.N;
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


/* ---- the same products on Hopper's warpgroup MMA (QUADS_EXPERT_GEMM=wgmma)
 *
 * Why: mma.sync (above) reads both operands through registers, a warp at a
 * time; wgmma reads them from shared memory for a warpgroup of four warps and
 * runs asynchronously, the only way to the H200's BF16 peak. A CTA of two
 * warpgroups computes a 128 x BN tile (BN 128 or 256), each warpgroup 64 rows
 * (wgmma.m64nBNk16), over K in steps of 64 through a ring of STAGES shared
 * buffers filled by cp.async (every thread copies; rows past M, N or K read
 * as zero), INFLIGHT wgmma groups left running while the next step's copies
 * go out. Shared tiles are in the 128-byte swizzled layouts of cuda_wgmma.h:
 *   K-major (an operand stored along K: A when !ta, B when tb): a row of the
 *     tile is one M (or N) index's 64 K values;
 *   MN-major (stored along M or N: A when ta, B when !tb): blocks of 64 M (or
 *     N) x 64 K, a row one K index's 64 values; blocks 8 KB apart (LBO).
 * Sums: float32 accumulation of exact BF16 products on the tensor cores, the
 * arithmetic class of cuBLAS's BF16 GEMM and the kernel above (fast mode's
 * bounds; check_blas's "wgmma" rows). sm_90a only (wgmma does not exist on
 * Blackwell, whose other paths serve it): elsewhere QD_ERR_UNSUPPORTED. */
#define WG_BM 128
#define WG_BK 64
#define WG_THREADS 256

/* One operand's tile of R rows (M or N side) x WG_BK at shared address s for
 * the K step at k0: KMAJ as above; src stored (R_lim, K_lim) row-major when
 * KMAJ, else (K_lim, R_lim); ld its row stride. Rows >= R_lim or k >= K_lim
 * read as zero (the contiguous dimension is a multiple of 8: whole chunks). */
template <int R, int KMAJ>
static __device__ __forceinline__ void wg_load(uint32_t s, const uint16_t *src, int ld, int r0, int R_lim, int k0,
                                               int K_lim)
{
#pragma unroll
    for (int j = 0; j < R * 8 / WG_THREADS; j++) {
        int i = threadIdx.x + j * WG_THREADS;
        uint32_t dst;
        const uint16_t *p;
        bool ok;
        if (KMAJ) { /* 8 chunks a row */
            int r = i >> 3, c = i & 7, gr = r0 + r, gk = k0 + 8 * c;
            ok = gr < R_lim && gk < K_lim;
            dst = s + r * 128 + ((c ^ (r & 7)) << 4);
            p = src + (size_t)gr * ld + gk;
        } else { /* R / 8 chunks a K value */
            int k = i / (R / 8), cc = i % (R / 8), gk = k0 + k, gr = r0 + 8 * cc;
            ok = gk < K_lim && gr < R_lim;
            dst = s + (cc >> 3) * 8192 + k * 128 + (((cc & 7) ^ (k & 7)) << 4);
            p = src + (size_t)gk * ld + gr;
        }
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(ok ? p : src),
                     "r"(ok ? 16 : 0));
    }
}

/* CTAs an SM the shared memory allows (2 asks ptxas for at most 128 registers) */
#define WG_MINB(BN, STAGES) ((STAGES) * (WG_BM + (BN)) * WG_BK * 2 + 1024 <= 113 * 1024 ? 2 : 1)

/* The EPI configurations' epilogue: the tile (alpha applied) staged in shared
 * memory, rows of BN + 8 floats (a warp's float2 stores conflict-free in two
 * wavefronts), then one bulk copy a row to C (beta 0) or one bulk add (beta 1:
 * C + v, the float32 addition of the register path; the copy engine reads C,
 * not the SM's registers, and the CTA waits only until its shared rows are
 * read). Needs the stages' memory free (every wgmma and cp.async done). */
template <int BN>
static __device__ __forceinline__ void wg_bulk_store(unsigned char *smem, uint32_t base, const float (&d)[BN / 2],
                                                     float *C, int M, int N, int m0, int n0, float alpha,
                                                     float beta)
{
    constexpr int LD = BN + 8;
    float *st = (float *)(smem + (base - smem_u32(smem)));
    const int wg = threadIdx.x >> 7, lane = threadIdx.x & 31;
    const int r0 = 64 * wg + 16 * ((threadIdx.x >> 5) & 3) + (lane >> 2), c0 = 2 * (lane & 3);
    __syncthreads(); /* every thread's products and copies done: the stages are free */
#pragma unroll
    for (int j = 0; j < BN / 8; j++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            *reinterpret_cast<float2 *>(st + (r0 + 8 * h) * LD + c0 + 8 * j) =
                make_float2(alpha * d[4 * j + 2 * h], alpha * d[4 * j + 2 * h + 1]);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* the stores visible to the copy engine */
    __syncthreads();
    const int row = m0 + (int)threadIdx.x;
    if (threadIdx.x < WG_BM && row < M) {
        int ncol = N - n0 < BN ? N - n0 : BN;
        uint32_t src = base + threadIdx.x * LD * 4, bytes = (uint32_t)ncol * 4;
        float *dst = C + (size_t)row * N + n0;
        if (beta != 0.0f)
            asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(dst),
                         "r"(src), "r"(bytes)
                         : "memory");
        else
            asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(src),
                         "r"(bytes)
                         : "memory");
        asm volatile("cp.async.bulk.commit_group;");
        asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    }
}

template <int BN, int STAGES, int INFLIGHT, int AT, int BT, int EPI>
__global__ void __launch_bounds__(WG_THREADS, WG_MINB(BN, STAGES)) k_grouped_wgmma(const __grid_constant__ gm_params p)
{
    QD_PDL_ENTRY();
#if QD_WG_ARCH
    constexpr int A_BYTES = WG_BM * WG_BK * 2, B_BYTES = BN * WG_BK * 2, ST_BYTES = A_BYTES + B_BYTES;
    constexpr int AHEAD = STAGES - 1 - INFLIGHT; /* steps whose copies are in flight ahead of the product */
    static_assert(AHEAD >= 1, "a stage for the copies ahead");
    extern __shared__ __align__(16) unsigned char wg_shared[];
    const uint32_t base = (smem_u32(wg_shared) + 1023) & ~1023u;
    const int bid = blockIdx.x, g = gm_group(p, bid), M = p.M[g], K = p.K[g], N = p.N;
    const int tiles_n = (N + BN - 1) / BN, t = bid - p.tile0[g];
    const int m0 = (t / tiles_n) * WG_BM, n0 = (t % tiles_n) * BN;
    const uint16_t *A = p.A[g], *B = p.B[g];
    const int lda = AT ? M : K, ldb = BT ? N : K; /* BT: B stored (K, N), MN-major */
    const int wg = threadIdx.x >> 7;
    const int KT = (K + WG_BK - 1) / WG_BK;
    auto load = [&](int kt) {
        uint32_t sa = base + (uint32_t)(kt % STAGES) * ST_BYTES, sb = sa + A_BYTES;
        wg_load<WG_BM, !AT>(sa, A, lda, m0, M, kt * WG_BK, K);
        wg_load<BN, !BT>(sb, B, ldb, n0, N, kt * WG_BK, K);
    };
#pragma unroll
    for (int s = 0; s < AHEAD; s++) {
        if (s < KT)
            load(s);
        asm volatile("cp.async.commit_group;");
    }
    float d[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++)
        d[i] = 0.0f;
    for (int kt = 0; kt < KT; kt++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(AHEAD - 1)); /* this thread's copies of step kt */
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* visible to wgmma's reads */
        __syncthreads(); /* everyone's copies; step kt - 1 - INFLIGHT's products done in both warpgroups */
        if (kt + AHEAD < KT)
            load(kt + AHEAD); /* into the stage of step kt + AHEAD - STAGES = kt - 1 - INFLIGHT */
        asm volatile("cp.async.commit_group;");
        uint32_t sa = base + (uint32_t)(kt % STAGES) * ST_BYTES, sb = sa + A_BYTES;
        qd_wg_fence_acc(d);
        qd_wg_fence();
#pragma unroll
        for (int kk = 0; kk < WG_BK / 16; kk++) {
            uint64_t da = AT ? qd_wg_desc(sa + wg * 8192 + kk * 2048, 8192, 1024) /* rows 64 wg.. : block wg */
                             : qd_wg_desc(sa + wg * 64 * 128 + kk * 32, 16, 1024);
            uint64_t db = BT ? qd_wg_desc(sb + kk * 2048, 8192, 1024) : qd_wg_desc(sb + kk * 32, 16, 1024);
            if constexpr (BN == 256)
                qd_wgmma_ss256<AT, BT>(d, da, db, 1);
            else
                qd_wgmma_ss128<AT, BT>(d, da, db, 1);
        }
        qd_wg_commit();
        qd_wg_wait<INFLIGHT>();
        qd_wg_fence_acc(d);
    }
    qd_wg_wait<0>();
    qd_wg_fence_acc(d);
    asm volatile("cp.async.wait_group 0;");
    /* thread (warp w of its warpgroup, lane l): rows 16 w + l / 4 (+ 8) of the
     * warpgroup's 64, columns 8 j + 2 (l % 4) (+ 1): d[4 j + 2 h + u] */
    float *C = p.C[g];
    const float alpha = p.alpha[g], beta = p.beta;
    if constexpr (EPI) {
        if (p.bulk) {
            wg_bulk_store<BN>(wg_shared, base, d, C, M, N, m0, n0, alpha, beta);
            return;
        }
    }
    const int lane = threadIdx.x & 31, wr = m0 + 64 * wg + 16 * ((threadIdx.x >> 5) & 3) + (lane >> 2);
    const int c0 = n0 + 2 * (lane & 3);
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
        int col = c0 + 8 * j;
        if (col >= N)
            break;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int row = wr + 8 * h;
            if (row >= M)
                continue;
            float *c = C + (size_t)row * N + col;
            float v0 = alpha * d[4 * j + 2 * h], v1 = alpha * d[4 * j + 2 * h + 1];
            if (col + 1 < N) {
                float2 o = make_float2(v0, v1);
                if (beta != 0.0f) {
                    float2 q = *reinterpret_cast<float2 *>(c);
                    o.x += beta * q.x;
                    o.y += beta * q.y;
                }
                *reinterpret_cast<float2 *>(c) = o;
            } else {
                *c = beta == 0.0f ? v0 : v0 + beta * *c;
            }
        }
    }
#endif
}

template <int AT, int BT>
static qd_status launch(const gm_params *p)
{
    static bool ready;
    if (!ready) {
        QD_CUDA_CHECK(cudaFuncSetAttribute(k_grouped_mma<AT, BT>, cudaFuncAttributeMaxDynamicSharedMemorySize, GM_SMEM));
        ready = true;
    }
    qd_launch(k_grouped_mma<AT, BT>, p->tile0[p->ng], GM_THREADS, GM_SMEM, *p);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

/* The wgmma kernel's configurations (QUADS_WGMMA_CFG, bench_quant --experts
 * times each): tile width, stages, wgmma groups left in flight. */
static const struct {
    int bn, stages, inflight;
    int epi; /* the bulk epilogue (wg_bulk_store) where wg_bulk_ok */
} wg_cfgs[] = {{256, 4, 1, 0}, {128, 4, 1, 0}, {128, 3, 0, 0}, {256, 3, 0, 0}, {128, 3, 0, 1}, {256, 4, 1, 1}};
#define WG_NCFG ((int)(sizeof wg_cfgs / sizeof wg_cfgs[0]))

static size_t wg_smem(int cfg)
{
    size_t ring = (size_t)wg_cfgs[cfg].stages * (WG_BM + wg_cfgs[cfg].bn) * WG_BK * 2;
    size_t tile = wg_cfgs[cfg].epi ? (size_t)WG_BM * (wg_cfgs[cfg].bn + 8) * 4 : 0; /* wg_bulk_store's rows */
    return (ring > tile ? ring : tile) + 1024; /* + the 1,024-byte alignment */
}

template <int BN, int STAGES, int INFLIGHT, int AT, int BT, int EPI>
static qd_status wg_launch1(const gm_params *p, size_t smem)
{
    static bool ready;
    auto k = k_grouped_wgmma<BN, STAGES, INFLIGHT, AT, BT, EPI>;
    if (!ready) {
        QD_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        ready = true;
    }
    qd_launch(k, p->tile0[p->ng], WG_THREADS, smem, *p);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

template <int BN, int STAGES, int INFLIGHT, int EPI>
static qd_status wg_launch(const gm_params *p, int ta, int tb, size_t smem)
{
    /* AT: A MN-major (stored (K, M)); BT: B MN-major (stored (K, N), !tb) */
    return ta ? (tb ? wg_launch1<BN, STAGES, INFLIGHT, 1, 0, EPI>(p, smem)
                    : wg_launch1<BN, STAGES, INFLIGHT, 1, 1, EPI>(p, smem))
              : (tb ? wg_launch1<BN, STAGES, INFLIGHT, 0, 0, EPI>(p, smem)
                    : wg_launch1<BN, STAGES, INFLIGHT, 0, 1, EPI>(p, smem));
}

/* Whether the bulk epilogue takes these groups: beta 0 or 1 (a copy or an
 * add), C's rows whole 16-byte units on 16 bytes */
static int wg_bulk_ok(const qd_grp_gemm *g, int G, float beta)
{
    if (!(beta == 0.0f || beta == 1.0f) || G <= 0 || g[0].N % 4)
        return 0;
    for (int i = 0; i < G; i++)
        if (!qd_aligned(g[i].C, 16))
            return 0;
    return 1;
}

static qd_status wg_dispatch(const gm_params *p, int ta, int tb, int cfg)
{
    size_t sm = wg_smem(cfg);
    switch (cfg) {
    case 0:
        return wg_launch<256, 4, 1, 0>(p, ta, tb, sm);
    case 1:
        return wg_launch<128, 4, 1, 0>(p, ta, tb, sm);
    case 2:
        return wg_launch<128, 3, 0, 0>(p, ta, tb, sm);
    case 3:
        return wg_launch<256, 3, 0, 0>(p, ta, tb, sm);
    case 4:
        return wg_launch<128, 3, 0, 1>(p, ta, tb, sm);
    default:
        return wg_launch<256, 4, 1, 1>(p, ta, tb, sm);
    }
}

/* QD_ERR_UNSUPPORTED, nothing enqueued, where a problem's rows are not whole
 * 16-byte copies (the dimension an operand is contiguous along not a multiple
 * of 8, a pointer off 16 bytes) or the groups' N differ: the caller takes
 * another path. The groups go 64 a launch; launch_fn runs one with tiles of
 * bm x bn. */
static qd_status grouped_run(const char *fn, const qd_grp_gemm *g, int G, int ta, int tb, float beta, int bm, int bn,
                             int even_n, qd_status (*launch_fn)(const gm_params *, int, int, int), int arg)
{
    if (G <= 0)
        return QD_OK;
    int N = g[0].N;
    for (int i = 0; i < G; i++) {
        int contig_a = ta ? g[i].M : g[i].K, contig_b = tb ? g[i].K : N;
        if (g[i].N != N || g[i].M <= 0 || g[i].K <= 0 || N <= 0 || contig_a % 8 || contig_b % 8 ||
            !qd_aligned(g[i].A, 16) || !qd_aligned(g[i].B, 16) || !qd_aligned(g[i].C, even_n ? 8 : 4) ||
            (even_n && N % 2))
            return QD_ERR_UNSUPPORTED;
    }
    gm_params *p = (gm_params *)calloc(1, sizeof *p);
    if (!p)
        return qd_error(QD_ERR_NOMEM, "%s: %d groups", fn, G);
    qd_status st = QD_OK;
    int tiles_n = (N + bn - 1) / bn;
    p->N = N, p->beta = beta, p->bulk = wg_bulk_ok(g, G, beta);
    for (int g0 = 0; g0 < G && !st; g0 += GM_GROUPS) {
        int ng = G - g0 < GM_GROUPS ? G - g0 : GM_GROUPS;
        long long tiles = 0;
        p->ng = ng;
        for (int i = 0; i < ng; i++) {
            const qd_grp_gemm *q = &g[g0 + i];
            p->A[i] = (const uint16_t *)q->A, p->B[i] = (const uint16_t *)q->B, p->C[i] = q->C;
            p->M[i] = q->M, p->K[i] = q->K, p->alpha[i] = q->alpha;
            p->tile0[i] = (int)tiles;
            tiles += (long long)((q->M + bm - 1) / bm) * tiles_n;
        }
        if (tiles > 0x7fffffffLL) {
            st = qd_error(QD_ERR_SHAPE, "%s: %lld tiles", fn, tiles);
            break;
        }
        p->tile0[ng] = (int)tiles;
        st = launch_fn(p, ta, tb, arg);
    }
    free(p);
    return st;
}

static qd_status mma_launch_fn(const gm_params *p, int ta, int tb, int arg)
{
    (void)arg;
    return ta ? (tb ? launch<1, 0>(p) : launch<1, 1>(p)) : (tb ? launch<0, 0>(p) : launch<0, 1>(p));
}

extern "C" qd_status qd_cuda_grouped_mma_bf16(const qd_grp_gemm *g, int G, int ta, int tb, float beta)
{
    return grouped_run("qd_cuda_grouped_mma_bf16", g, G, ta, tb, beta, GM_BM, GM_BN, 0, mma_launch_fn, 0);
}

extern "C" int qd_cuda_grouped_wgmma_configs(void) { return WG_NCFG; }

extern "C" qd_status qd_cuda_grouped_wgmma_bf16(const qd_grp_gemm *g, int G, int ta, int tb, float beta, int cfg)
{
    static int env = -2;
    if (cfg < 0) {
        if (env == -2) {
            const char *e = getenv("QUADS_WGMMA_CFG");
            env = e && *e ? atoi(e) : 0;
        }
        cfg = env;
    }
    if (cfg < 0 || cfg >= WG_NCFG)
        return qd_error(QD_ERR_ARG, "qd_cuda_grouped_wgmma_bf16: configuration %d of %d (QUADS_WGMMA_CFG)", cfg,
                        WG_NCFG);
    if (!qd_wg_device())
        return QD_ERR_UNSUPPORTED;
    return grouped_run("qd_cuda_grouped_wgmma_bf16", g, G, ta, tb, beta, WG_BM, wg_cfgs[cfg].bn, 1,
                       wg_dispatch, cfg);
}
