/* backends/cuda/cuda_bfp.cu: the row block-floating-point product
 * (docs/numerics.md §3b), the twin of the CPU's cpu_bfp_weights and
 * cpu_matmul_bfp, on the int8 tensor cores.
 *
 * Why: the lm_head's exact product is a float32 chain a product (fmaf by
 * ascending k), bound by the FMA units: 1.19 ms of a ~3.5 ms decode step of
 * the a3b shape at batch 64 on the H200, 0.6 ms its floor. The row BFP order's
 * products are exact integers, and an exact integer sum has no order: the
 * integer tensor cores (mma.m16n8k32 s8/u8, int32 accumulation) compute it.
 *
 * Each row's mantissas are cut into bytes: an activation's X (|X| <= 2^22) as
 * X = 2^16 xh + 2^8 xm + xl (xh int8, xm and xl uint8), a weight's W (|W| <
 * 2^15) as W = 2^8 wh + wl (wh int8, wl uint8), so
 *     X W = 2^24 xh wh + 2^16 (xh wl + xm wh) + 2^8 (xm wl + xl wh) + xl wl,
 * six products into four int32 sums per output (each within int32 for
 * IC <= 16384: at most 16384 (255 255 + 255 128) < 2^31), which the epilogue
 * joins in int64 into the exact S and rounds once (qd_bfp_out).
 *
 * The product: a CTA of 8 warps (WM x WN) computes BM = 16 MT WM rows by
 * BN = 16 WN columns of out; each warp MT tiles of 16 rows by 16 columns. K in
 * steps of 64 bytes, three stages of cp.async copies in flight (rows past N or
 * OC, and k past IC, read as zero); operands by ldmatrix from rows of 80 bytes
 * (conflict-free, the copies' stores too). The row tiles of one column tile
 * run next to each other, BF_GROUP row tiles at a time (decode: all of them):
 * a weight tile is read from HBM once a group and from L2 by the others. */
#include <stdint.h>
#include <cuda_runtime.h>
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_mma.h"
#include "backends/cuda/cuda_wgmma.h"
extern "C" {
#include "quant/numerics.h"
}

#define BF_BK 64  /* k bytes a stage */
#define BF_ROW 80 /* a staged row's bytes (64 + 16: ldmatrix without bank conflicts) */
#define BF_STAGES 3
#define BF_THREADS 256
#define BF_GROUP 32 /* row tiles that share a pass over the column tiles (x: 6 MB of L2 at BM 64, K 2048) */

#define BF_MMA(TA, TB)                                                                                         \
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32." TA "." TB ".s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "      \
                 "{%8,%9}, {%0,%1,%2,%3};"                                                                     \
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])                                              \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))

static __device__ __forceinline__ void mma_ss(int c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    BF_MMA("s8", "s8");
}
static __device__ __forceinline__ void mma_su(int c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    BF_MMA("s8", "u8");
}
static __device__ __forceinline__ void mma_us(int c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    BF_MMA("u8", "s8");
}
static __device__ __forceinline__ void mma_uu(int c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    BF_MMA("u8", "u8");
}

/* The largest |v|'s bits over a warp (each lane's m). */
static __device__ __forceinline__ uint32_t bf_warp_max(uint32_t m)
{
    return __reduce_max_sync(0xffffffffu, m);
}

static __device__ __forceinline__ uint16_t bf_w16(const uint16_t *w16, const float *wf, size_t at)
{
    return w16 ? w16[at] : qd_bf16_from_f32(wf[at]);
}

/* cpu_bfp_weights: a warp a row of w (OC, IC), BF16 bits w16 or floats wf
 * rounded: F[o], then hi and lo. */
__global__ void k_bfp_weights(int32_t *F, int8_t *hi, uint8_t *lo, const uint16_t *w16, const float *wf, int OC,
                              int IC)
{
    QD_PDL_ENTRY();
    int o = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (o >= OC)
        return;
    size_t r = (size_t)o * IC;
    uint32_t m = 0;
    for (int i = lane; i < IC; i += 32) {
        uint32_t a = (uint32_t)(bf_w16(w16, wf, r + i) & 0x7fffu) << 16;
        m = a > m ? a : m;
    }
    int f = qd_bfp_exponent(bf_warp_max(m));
    if (lane == 0)
        F[o] = f;
    for (int i = lane; i < IC; i += 32) {
        int32_t W = f == QD_BFP_NONFINITE ? 0 : qd_bfp_mant((uint32_t)bf_w16(w16, wf, r + i) << 16, f, QD_BFP_PW);
        uint32_t l = (uint32_t)W & 255u;
        lo[(size_t)o * IC + i] = (uint8_t)l;
        hi[(size_t)o * IC + i] = (int8_t)((W - (int32_t)l) / 256);
    }
}

/* matmul_bfp's rows of x (N, IC): E[n], and X's three bytes a row. */
__global__ void k_bfp_rows(int32_t *E, int8_t *xh, uint8_t *xm, uint8_t *xl, const float *x, int N, int IC)
{
    QD_PDL_ENTRY();
    int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (n >= N)
        return;
    const float *r = x + (size_t)n * IC;
    uint32_t m = 0;
    for (int i = lane; i < IC; i += 32) {
        uint32_t a = __float_as_uint(r[i]) & 0x7fffffffu;
        m = a > m ? a : m;
    }
    int e = qd_bfp_exponent(bf_warp_max(m));
    if (lane == 0)
        E[n] = e;
    for (int i = lane; i < IC; i += 32) {
        int32_t X = e == QD_BFP_NONFINITE ? 0 : qd_bfp_mant(__float_as_uint(r[i]), e, QD_BFP_PX);
        uint32_t u = (uint32_t)X;
        size_t at = (size_t)n * IC + i;
        xl[at] = (uint8_t)(u & 255u);
        xm[at] = (uint8_t)((u >> 8) & 255u);
        xh[at] = (int8_t)((X - (int32_t)(u & 0xffffu)) / 65536);
    }
}

typedef struct {
    const int8_t *xh;
    const uint8_t *xm, *xl;
    const int32_t *E;
    const int8_t *wh;
    const uint8_t *wl;
    const int32_t *F;
    float *out;
    int N, IC, OC;
} bf_params;

template <int WM, int WN, int MT>
struct bf_shape {
    static constexpr int BM = 16 * MT * WM, BN = 16 * WN;
    static constexpr int A_BYTES = 3 * BM * BF_ROW, STAGE = (3 * BM + 2 * BN) * BF_ROW;
    static constexpr int SMEM = BF_STAGES * STAGE;
};

/* One stage: the three planes of BM rows of X and the two of BN rows of W,
 * bytes k0 .. k0 + 63 of each row, 16 bytes a copy. */
template <int WM, int WN, int MT>
static __device__ __forceinline__ void bf_load(unsigned char *s, const bf_params &p, int m0, int n0, int k0)
{
    typedef bf_shape<WM, WN, MT> S;
    constexpr int ROWS = 3 * S::BM + 2 * S::BN;
#pragma unroll 1
    for (int c = threadIdx.x; c < ROWS * 4; c += BF_THREADS) {
        /* 8 threads in a row copy one chunk of 8 rows: their 16-byte stores
         * land 80 bytes apart, on distinct banks */
        int row = (c >> 5) * 8 + (c & 7), kc = ((c >> 3) & 3) * 16, gk = k0 + kc;
        const void *src;
        bool ok;
        if (row < 3 * S::BM) {
            int plane = row / S::BM, r = m0 + row % S::BM;
            const unsigned char *base = plane == 0 ? (const unsigned char *)p.xh : plane == 1 ? p.xm : p.xl;
            ok = r < p.N && gk < p.IC;
            src = ok ? base + (size_t)r * p.IC + gk : (const void *)base;
        } else {
            int q = row - 3 * S::BM, plane = q / S::BN, r = n0 + q % S::BN;
            const unsigned char *base = plane == 0 ? (const unsigned char *)p.wh : p.wl;
            ok = r < p.OC && gk < p.IC;
            src = ok ? base + (size_t)r * p.IC + gk : (const void *)base;
        }
        cp16(s + row * BF_ROW + kc, src, ok);
    }
}

template <int WM, int WN, int MT>
__global__ void __launch_bounds__(BF_THREADS) k_matmul_bfp(const __grid_constant__ bf_params p)
{
    QD_PDL_ENTRY();
    typedef bf_shape<WM, WN, MT> S;
    extern __shared__ __align__(16) unsigned char bf_smem[];
    /* tile b of a 1-D grid: groups of BF_GROUP row tiles, column tile by
     * column tile; within a group its row tiles next to each other (they read
     * one weight tile: HBM once), and a group's rows of x stay in L2 while its
     * column tiles pass */
    const int tiles_m = (p.N + S::BM - 1) / S::BM, tiles_n = (p.OC + S::BN - 1) / S::BN;
    const int64_t b = blockIdx.x, per = (int64_t)BF_GROUP * tiles_n;
    const int first = (int)(b / per) * BF_GROUP, gm = min(BF_GROUP, tiles_m - first), local = (int)(b % per);
    const int m0 = (first + local % gm) * S::BM, n0 = (local / gm) * S::BN;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int wm0 = (warp % WM) * 16 * MT, wn0 = (warp / WM) * 16;
    int acc[MT][2][4][4]; /* [m tile][n tile][2^24, 2^16, 2^8, 1][fragment] */
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int s = 0; s < 4; s++)
                acc[i][j][s][0] = acc[i][j][s][1] = acc[i][j][s][2] = acc[i][j][s][3] = 0;
    const int KT = (p.IC + BF_BK - 1) / BF_BK;
#pragma unroll
    for (int s = 0; s < BF_STAGES - 1; s++) {
        if (s < KT)
            bf_load<WM, WN, MT>(bf_smem + s * S::STAGE, p, m0, n0, s * BF_BK);
        asm volatile("cp.async.commit_group;");
    }
    for (int kt = 0; kt < KT; kt++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(BF_STAGES - 2));
        __syncthreads(); /* stage kt landed for all; stage kt - 1 free for the next copy */
        int nk = kt + BF_STAGES - 1;
        if (nk < KT)
            bf_load<WM, WN, MT>(bf_smem + (nk % BF_STAGES) * S::STAGE, p, m0, n0, nk * BF_BK);
        asm volatile("cp.async.commit_group;");
        const unsigned char *sa = bf_smem + (kt % BF_STAGES) * S::STAGE, *sb = sa + S::A_BYTES;
#pragma unroll
        for (int kk = 0; kk < BF_BK; kk += 32) {
            uint32_t bh[4], bl[4]; /* n tile 0: [0], [1]; n tile 1: [2], [3] */
            int boff = (wn0 + (lane & 7) + (lane >> 4) * 8) * BF_ROW + kk + ((lane >> 3) & 1) * 16;
            ldm_x4(bh, sb + boff);
            ldm_x4(bl, sb + S::BN * BF_ROW + boff);
#pragma unroll
            for (int i = 0; i < MT; i++) {
                uint32_t ah[4], am[4], al[4];
                int aoff = (wm0 + 16 * i + (lane & 15)) * BF_ROW + kk + (lane >> 4) * 16;
                ldm_x4(ah, sa + aoff);
                ldm_x4(am, sa + S::BM * BF_ROW + aoff);
                ldm_x4(al, sa + 2 * S::BM * BF_ROW + aoff);
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    uint32_t h0 = bh[2 * j], h1 = bh[2 * j + 1], l0 = bl[2 * j], l1 = bl[2 * j + 1];
                    mma_ss(acc[i][j][0], ah, h0, h1); /* xh wh */
                    mma_su(acc[i][j][1], ah, l0, l1); /* xh wl */
                    mma_us(acc[i][j][1], am, h0, h1); /* xm wh */
                    mma_uu(acc[i][j][2], am, l0, l1); /* xm wl */
                    mma_us(acc[i][j][2], al, h0, h1); /* xl wh */
                    mma_uu(acc[i][j][3], al, l0, l1); /* xl wl */
                }
            }
        }
    }
    asm volatile("cp.async.wait_group 0;");
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int row = m0 + wm0 + 16 * i + g + 8 * h;
            if (row >= p.N)
                continue;
            int e = p.E[row];
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    int col = n0 + wn0 + 8 * j + 2 * t + q, f = 2 * h + q;
                    if (col >= p.OC)
                        continue;
                    int64_t Sv = (int64_t)acc[i][j][0][f] * 16777216 + (int64_t)acc[i][j][1][f] * 65536 +
                                 (int64_t)acc[i][j][2][f] * 256 + (int64_t)acc[i][j][3][f];
                    p.out[(size_t)row * p.OC + col] = qd_bfp_out(Sv, e, p.F[col]);
                }
        }
}

/* ---- At most BV_ROWS rows (decode at batch 1..4): the tensor cores' 16-row
 * tiles would be mostly empty, and the product is a read of the weights. A
 * warp a vocabulary row at a time: each lane's 16-byte chunks of its two
 * planes, dp4a against x's three planes (in shared memory, read as 16 bytes a
 * lane: no bank conflicts), the same four int32 sums per row of x, added over
 * the warp (an exact integer sum in any order: the same S). */
#define BV_ROWS 4

#define BF_DP4A(TA, TB) asm("dp4a." TA "." TB " %0, %1, %2, %0;" : "+r"(c) : "r"(a), "r"(b))
static __device__ __forceinline__ void dp_ss(int &c, uint32_t a, uint32_t b) { BF_DP4A("s32", "s32"); }
static __device__ __forceinline__ void dp_su(int &c, uint32_t a, uint32_t b) { BF_DP4A("s32", "u32"); }
static __device__ __forceinline__ void dp_us(int &c, uint32_t a, uint32_t b) { BF_DP4A("u32", "s32"); }
static __device__ __forceinline__ void dp_uu(int &c, uint32_t a, uint32_t b) { BF_DP4A("u32", "u32"); }

/* the six byte products of 4 k of one row: x (xh, xm, xl) . w (wh, wl) */
static __device__ __forceinline__ void bv_dot4(int acc[4], uint32_t xh, uint32_t xm, uint32_t xl, uint32_t wh,
                                               uint32_t wl)
{
    dp_ss(acc[0], xh, wh);
    dp_su(acc[1], xh, wl);
    dp_us(acc[1], xm, wh);
    dp_uu(acc[2], xm, wl);
    dp_us(acc[2], xl, wh);
    dp_uu(acc[3], xl, wl);
}

template <int R>
__global__ void __launch_bounds__(256) k_matvec_bfp(const __grid_constant__ bf_params p)
{
    QD_PDL_ENTRY();
    extern __shared__ __align__(16) uint4 bv_x[]; /* [plane][row][IC / 16] */
    const int KC = p.IC / 16;
    for (int i = threadIdx.x; i < 3 * R * KC; i += blockDim.x) {
        int plane = i / (R * KC), r = (i / KC) % R, k = i % KC;
        const unsigned char *src = plane == 0 ? (const unsigned char *)p.xh : plane == 1 ? p.xm : p.xl;
        bv_x[i] = r < p.N ? ((const uint4 *)(src + (size_t)r * p.IC))[k] : make_uint4(0, 0, 0, 0);
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, warps = gridDim.x * (blockDim.x >> 5);
    for (int o = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); o < p.OC; o += warps) {
        int acc[R][4];
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = 0;
        const uint4 *wh = (const uint4 *)(p.wh + (size_t)o * p.IC), *wl = (const uint4 *)(p.wl + (size_t)o * p.IC);
        for (int c0 = 0; c0 < KC; c0 += 4 * 32) { /* four chunks a lane in flight */
            uint4 h[4], l[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int c = c0 + u * 32 + lane;
                h[u] = c < KC ? __ldg(wh + c) : make_uint4(0, 0, 0, 0);
                l[u] = c < KC ? __ldg(wl + c) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int c = c0 + u * 32 + lane;
                if (c >= KC)
                    break;
#pragma unroll
                for (int r = 0; r < R; r++) {
                    uint4 a = bv_x[r * KC + c], b = bv_x[(R + r) * KC + c], d = bv_x[(2 * R + r) * KC + c];
                    bv_dot4(acc[r], a.x, b.x, d.x, h[u].x, l[u].x);
                    bv_dot4(acc[r], a.y, b.y, d.y, h[u].y, l[u].y);
                    bv_dot4(acc[r], a.z, b.z, d.z, h[u].z, l[u].z);
                    bv_dot4(acc[r], a.w, b.w, d.w, h[u].w, l[u].w);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            int s0 = __reduce_add_sync(0xffffffffu, acc[r][0]), s1 = __reduce_add_sync(0xffffffffu, acc[r][1]);
            int s2 = __reduce_add_sync(0xffffffffu, acc[r][2]), s3 = __reduce_add_sync(0xffffffffu, acc[r][3]);
            if (lane == r && r < p.N) {
                int64_t Sv = (int64_t)s0 * 16777216 + (int64_t)s1 * 65536 + (int64_t)s2 * 256 + (int64_t)s3;
                p.out[(size_t)r * p.OC + o] = qd_bfp_out(Sv, p.E[r], p.F[o]);
            }
        }
    }
}

template <int R>
static qd_status bv_launch(const bf_params &p)
{
    int smem = 3 * R * p.IC;
    int grid = qd_sm_count() * 4, need = (p.OC + 7) / 8;
    qd_launch(k_matvec_bfp<R>, grid < need ? grid : need, 256, smem, p);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

template <int WM, int WN, int MT>
static qd_status bf_launch(const bf_params &p)
{
    typedef bf_shape<WM, WN, MT> S;
    static int smem_set; /* the opt-in above 48 KB, once */
    int64_t tiles = (int64_t)((p.N + S::BM - 1) / S::BM) * ((p.OC + S::BN - 1) / S::BN);
    if (tiles > 0x7fffffff)
        return qd_error(QD_ERR_SHAPE, "cuda backend: matmul_bfp: %d x %d outputs: too many tiles", p.N, p.OC);
    if (S::SMEM > 48 * 1024 && !smem_set) {
        QD_CUDA_CHECK(cudaFuncSetAttribute(k_matmul_bfp<WM, WN, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           S::SMEM));
        smem_set = 1;
    }
    qd_launch(k_matmul_bfp<WM, WN, MT>, (unsigned)tiles, BF_THREADS, S::SMEM, p);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

/* ---- The same product on Hopper's warpgroup MMA (k_matmul_bfp_wg; by
 * default since 2026-12-06 where the device has it, QUADS_BFP_WGMMA=0 for the
 * kernel above: on an H100, bench_quant --bfp, 0.37 ms against 0.50 at batch
 * 64, 1.41 against 1.85 at 256, 0.28 against 0.36 at 16, the same bits; the
 * a3b-4 exact rollout at batch 64 1.034x). Past 16 rows the kernel
 * above runs at the int8 mma.sync rate (six MMAs a tile: the a3b lm_head at
 * batch 64 0.47 ms a decode step on the H200, its weights' read 0.13); wgmma
 * (m64nBNk32, s8/u8, int32 accumulators) reads both operands from shared
 * memory for a warpgroup and runs asynchronously at about twice that rate.
 * A CTA of two warpgroups takes 128 vocabulary rows (64 a warpgroup, the
 * weight planes as A) and BN rows of x (16, 32 or 64: its three planes as B,
 * shared by both), K in stages of 128 bytes, the 128-byte-swizzled K-major
 * tiles of cuda_wgmma.h (a k-step of 32 one-byte values starts 32 bytes along
 * a row, as a BF16 k-step of 16), three stages, two copies ahead. The same
 * four int32 sums per output (each an exact integer: any order), joined and
 * rounded by qd_bfp_out: the same bits. A CTA's x tiles run next to each
 * other, so the weights come from HBM once and from L2 after.
 * ST (stages): 4 (the default since 2026-12-06d), one stage's products left
 * in flight while the next stage's are issued (wgmma.wait_group 1), the
 * copies two stages ahead into the buffer whose products were waited for a
 * stage before (230,400 bytes of shared memory at BN 64); 3
 * (QUADS_BFP_WG_PIPE=0), each stage's products waited for before the next
 * stage's copies start over its buffer (the tensor cores idle from the last
 * product's end to the next stage's first). On an H100 (bench_quant --bfp,
 * the same bits): 64 rows 0.369 -> 0.353 ms, 256 1.418 -> 1.331, 16,384
 * 91.2 -> 87.4; the a3b-4 exact rollout at batch 64 1.011x. Still ~27% of
 * the int8 tensor peak past 256 rows: a stage's 56 KB of copies feed 6.3 M
 * multiply-adds, so the SM's loads (~2.3-3 TB/s over the GPU) hold it.
 * WGS (warpgroups a CTA): 2 (128 vocabulary rows), or 3 (QUADS_BFP_WG3=1,
 * opt-in until timed; 192 rows, 3 stages of 72 KB, 164 registers): at 64
 * rows of x a CTA reads 384 KB of x planes from L2 beside its 512 KB (2
 * warpgroups) or 768 KB (3) of weights, so 3 warpgroups read x a third fewer
 * times (the a3b lm_head: 466 -> 311 MB of L2-to-SM traffic a step beside
 * 622 MB of weights; 792 CTAs, 6 waves of 132). The same products, sums and
 * rounding: the same bits. */
#define BW_BK 128
#define BW_THREADS 256

template <int BN, int ST, int BK = BW_BK, int WGS = 2> struct bw_shape {
    static constexpr int W_PLANE = 64 * WGS * BK, X_PLANE = BN * BK;
    static constexpr int STAGE = 2 * W_PLANE + 3 * X_PLANE; /* a multiple of the 1,024-byte atom */
    static constexpr int SMEM = ST * STAGE + 1024;          /* + the alignment */
};

/* R rows (r0.., those past lim zero) of a plane (rows of IC bytes) at k0
 * into the swizzled tile at shared address s, rows of BK bytes (128 or 64)
 * in the BK-byte swizzle: 16-byte chunk c of row r at r * BK +
 * (c ^ (r / (128 / BK) % (BK / 16))) * 16 (128: c ^ (r % 8); 64: address
 * bits 4-5 XOR bits 7-8); bytes past IC zero */
template <int R, int BK = BW_BK, int THREADS = BW_THREADS>
static __device__ __forceinline__ void bw_load(uint32_t s, const uint8_t *src, int IC, int r0, int lim, int k0)
{
    static_assert(BK == 128 || BK == 64, "the 128- and 64-byte swizzles");
    constexpr int CL = BK == 128 ? 3 : 2; /* log2 of the 16-byte chunks a row */
    constexpr int RS = BK == 128 ? 0 : 1; /* log2 of the rows a swizzle phase */
    for (int i = threadIdx.x; i < R * (BK / 16); i += THREADS) {
        int r = i >> CL, c = i & (BK / 16 - 1), gr = r0 + r, gk = k0 + 16 * c;
        bool ok = gr < lim && gk < IC;
        uint32_t dst = s + r * BK + ((c ^ ((r >> RS) & (BK / 16 - 1))) << 4);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst),
                     "l"(ok ? src + (size_t)gr * IC + gk : src), "r"(ok ? 16 : 0));
    }
}

#if QD_WG_ARCH
/* d (m64nBN, int32) += A . B, both from shared memory (K-major); A s8 or u8 (TA), B too (TB) */
#define BW_MMA16(NAME, TA, TB) \
    static __device__ __forceinline__ void NAME(int(&d)[8], uint64_t da, uint64_t db) \
    { \
        asm volatile("wgmma.mma_async.sync.aligned.m64n16k32.s32." TA "." TB " {" \
                     "%0, %1, %2, %3, %4, %5, %6, %7" \
                     "}, %8, %9, 1;" \
                     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]) \
                     : "l"(da), "l"(db)); \
    }
#define BW_MMA32(NAME, TA, TB) \
    static __device__ __forceinline__ void NAME(int(&d)[16], uint64_t da, uint64_t db) \
    { \
        asm volatile("wgmma.mma_async.sync.aligned.m64n32k32.s32." TA "." TB " {" \
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" \
                     "}, %16, %17, 1;" \
                     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), \
                       "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]) \
                     : "l"(da), "l"(db)); \
    }
#define BW_MMA64(NAME, TA, TB) \
    static __device__ __forceinline__ void NAME(int(&d)[32], uint64_t da, uint64_t db) \
    { \
        asm volatile("wgmma.mma_async.sync.aligned.m64n64k32.s32." TA "." TB " {" \
                     "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
                     "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
                     "}, %32, %33, 1;" \
                     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), \
                       "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), \
                       "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), \
                       "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]) \
                     : "l"(da), "l"(db)); \
    }
BW_MMA16(bw_ss16, "s8", "s8")
BW_MMA16(bw_us16, "u8", "s8")
BW_MMA16(bw_su16, "s8", "u8")
BW_MMA16(bw_uu16, "u8", "u8")
BW_MMA32(bw_ss32, "s8", "s8")
BW_MMA32(bw_us32, "u8", "s8")
BW_MMA32(bw_su32, "s8", "u8")
BW_MMA32(bw_uu32, "u8", "u8")
BW_MMA64(bw_ss64, "s8", "s8")
BW_MMA64(bw_us64, "u8", "s8")
BW_MMA64(bw_su64, "s8", "u8")
BW_MMA64(bw_uu64, "u8", "u8")
#endif

template <int N>
static __device__ __forceinline__ void bw_fence_acc(int (&d)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++)
        asm volatile("" : "+r"(d[i])::"memory");
}

template <int BN, int ST, int BK = BW_BK, int WGS = 2>
__global__ void __launch_bounds__(128 * WGS, 1) k_matmul_bfp_wg(const __grid_constant__ bf_params p)
{
    QD_PDL_ENTRY();
#if QD_WG_ARCH
    static_assert((BK == BW_BK && (ST == 3 || ST == 4)) || (BK == 64 && ST == 8),
                  "128-byte stages: 3 (each waited for) or 4 (one in flight); 64-byte stages: 8");
    static_assert(WGS == 2 || (WGS == 3 && ST == 3 && BK == BW_BK), "three warpgroups: 3 stages of 128 bytes");
    constexpr int ROWS = 64 * WGS, THREADS = 128 * WGS; /* a CTA's vocabulary rows and threads */
    /* D: the stages whose copies are in flight ahead of the one computed (2
     * with 128-byte stages; 6 with 64-byte ones: half the bytes a stage, 1.5x
     * the bytes in flight); one stage's products left in flight where ST > 3 */
    constexpr int D = BK == BW_BK ? 2 : ST - 2;
    typedef bw_shape<BN, ST, BK, WGS> S;
    constexpr int NA = BN / 2; /* accumulators a thread, each of the four sums */
    extern __shared__ __align__(16) unsigned char bw_smem[];
    const uint32_t base = (smem_u32(bw_smem) + 1023) & ~1023u;
    const int tiles_n = (p.N + BN - 1) / BN;
    const int o0 = (int)(blockIdx.x / tiles_n) * ROWS, n0 = (int)(blockIdx.x % tiles_n) * BN;
    const int wg = threadIdx.x >> 7, KT = (p.IC + BK - 1) / BK;
    auto load = [&](int kt) {
        uint32_t s = base + (uint32_t)(kt % ST) * S::STAGE;
        int k0 = kt * BK;
        bw_load<ROWS, BK, THREADS>(s, (const uint8_t *)p.wh, p.IC, o0, p.OC, k0);
        bw_load<ROWS, BK, THREADS>(s + S::W_PLANE, p.wl, p.IC, o0, p.OC, k0);
        bw_load<BN, BK, THREADS>(s + 2 * S::W_PLANE, (const uint8_t *)p.xh, p.IC, n0, p.N, k0);
        bw_load<BN, BK, THREADS>(s + 2 * S::W_PLANE + S::X_PLANE, p.xm, p.IC, n0, p.N, k0);
        bw_load<BN, BK, THREADS>(s + 2 * S::W_PLANE + 2 * S::X_PLANE, p.xl, p.IC, n0, p.N, k0);
    };
    if constexpr (BK == BW_BK) {
        load(0);
        asm volatile("cp.async.commit_group;");
        if (KT > 1)
            load(1);
        asm volatile("cp.async.commit_group;");
    } else {
#pragma unroll 1
        for (int s0 = 0; s0 < D; s0++) {
            if (s0 < KT)
                load(s0);
            asm volatile("cp.async.commit_group;");
        }
    }
    int d0[NA], d1[NA], d2[NA], d3[NA]; /* 2^24 xh wh; 2^16 (xh wl + xm wh); 2^8 (xm wl + xl wh); xl wl */
#pragma unroll
    for (int i = 0; i < NA; i++)
        d0[i] = d1[i] = d2[i] = d3[i] = 0;
    for (int kt = 0; kt < KT; kt++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(D - 1) : "memory"); /* this thread's copies of stage kt */
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");    /* visible to wgmma's reads */
        __syncthreads(); /* everyone's; stage kt + D - ST's products done (waited below) */
        if (kt + D < KT)
            load(kt + D); /* into stage kt + D - ST's buffer */
        asm volatile("cp.async.commit_group;");
        uint32_t s = base + (uint32_t)(kt % ST) * S::STAGE;
        uint32_t swh = s + (uint32_t)wg * 64 * BK, swl = swh + S::W_PLANE;
        uint32_t sxh = s + 2 * S::W_PLANE, sxm = sxh + S::X_PLANE, sxl = sxm + S::X_PLANE;
        bw_fence_acc(d0), bw_fence_acc(d1), bw_fence_acc(d2), bw_fence_acc(d3);
        qd_wg_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 32; kk++) {
            /* K-major, 8-row groups 8 BK bytes apart, the BK-byte swizzle */
            auto desc = [&](uint32_t a) { return qd_wg_desc(a, 16, 8 * BK, BK == 128 ? 1 : 2); };
            uint64_t ah = desc(swh + kk * 32), al = desc(swl + kk * 32);
            uint64_t bh = desc(sxh + kk * 32), bm = desc(sxm + kk * 32);
            uint64_t bl = desc(sxl + kk * 32);
            if constexpr (BN == 16) {
                bw_ss16(d0, ah, bh), bw_us16(d1, al, bh), bw_su16(d1, ah, bm);
                bw_uu16(d2, al, bm), bw_su16(d2, ah, bl), bw_uu16(d3, al, bl);
            } else if constexpr (BN == 32) {
                bw_ss32(d0, ah, bh), bw_us32(d1, al, bh), bw_su32(d1, ah, bm);
                bw_uu32(d2, al, bm), bw_su32(d2, ah, bl), bw_uu32(d3, al, bl);
            } else {
                bw_ss64(d0, ah, bh), bw_us64(d1, al, bh), bw_su64(d1, ah, bm);
                bw_uu64(d2, al, bm), bw_su64(d2, ah, bl), bw_uu64(d3, al, bl);
            }
        }
        qd_wg_commit();
        qd_wg_wait<(ST > 3 ? 1 : 0)>(); /* ST > 3: stage kt's products may still run, kt - 1's are done */
        bw_fence_acc(d0), bw_fence_acc(d1), bw_fence_acc(d2), bw_fence_acc(d3);
    }
    if constexpr (ST > 3) {
        qd_wg_wait<0>();
        bw_fence_acc(d0), bw_fence_acc(d1), bw_fence_acc(d2), bw_fence_acc(d3);
    }
    asm volatile("cp.async.wait_group 0;");
    /* d[4 j + 2 h + u]: vocabulary row 64 wg + 16 w + l / 4 + 8 h of the CTA's,
     * row 8 j + 2 (l % 4) + u of its x tile */
    const int lane = threadIdx.x & 31, orow = o0 + 64 * wg + 16 * ((threadIdx.x >> 5) & 3) + (lane >> 2);
#pragma unroll
    for (int j = 0; j < BN / 8; j++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int u = 0; u < 2; u++) {
                int i = 4 * j + 2 * h + u, o = orow + 8 * h, n = n0 + 8 * j + 2 * (lane & 3) + u;
                if (o < p.OC && n < p.N) {
                    int64_t Sv = (int64_t)d0[i] * 16777216 + (int64_t)d1[i] * 65536 + (int64_t)d2[i] * 256 +
                                 (int64_t)d3[i];
                    p.out[(size_t)n * p.OC + o] = qd_bfp_out(Sv, p.E[n], p.F[o]);
                }
            }
#endif
}

template <int BN, int ST, int BK = BW_BK, int WGS = 2>
static qd_status bw_launch(const bf_params &p)
{
    typedef bw_shape<BN, ST, BK, WGS> S;
    constexpr int ROWS = 64 * WGS;
    int64_t tiles = (int64_t)((p.OC + ROWS - 1) / ROWS) * ((p.N + BN - 1) / BN);
    if (tiles > 0x7fffffff)
        return qd_error(QD_ERR_SHAPE, "cuda backend: matmul_bfp: %d x %d outputs: too many tiles", p.N, p.OC);
    /* every launch: the attribute is the current device's (a process may drive several) */
    QD_CUDA_CHECK(cudaFuncSetAttribute(k_matmul_bfp_wg<BN, ST, BK, WGS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       S::SMEM));
    qd_launch(k_matmul_bfp_wg<BN, ST, BK, WGS>, (unsigned)tiles, 128 * WGS, S::SMEM, p);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

/* bw_launch with the x tile (BN 16, 32 or 64 rows) that p.N needs */
template <int ST, int BK = BW_BK, int WGS = 2>
static qd_status bw_launch_n(const bf_params &p)
{
    return p.N <= 16 ? bw_launch<16, ST, BK, WGS>(p) : p.N <= 32 ? bw_launch<32, ST, BK, WGS>(p)
                     : bw_launch<64, ST, BK, WGS>(p);
}

/* The shapes and alignment the kernels need (the ops' wrappers check the shapes too). */
static qd_status bf_check(int IC, const void *a, const void *b)
{
    if (!qd_bfp_shape_ok(0, IC, 0))
        return qd_error(QD_ERR_SHAPE, "cuda backend: row BFP product: in-features %d: a multiple of 16 up to %d "
                        "wanted", IC, QD_BFP_MAX_IC);
    if (!qd_aligned(a, 16) || (b && !qd_aligned(b, 16)))
        return qd_error(QD_ERR_ARG, "cuda backend: row BFP product: buffers not on 16 bytes");
    return QD_OK;
}

extern "C" qd_status qdk_bfp_weights(void *wq, const uint16_t *w16, const float *wf, int OC, int IC)
{
    if (!OC)
        return QD_OK;
    QD_TRY(bf_check(IC, wq, NULL));
    int32_t *F = (int32_t *)wq;
    int8_t *hi = (int8_t *)((char *)wq + qd_bfp_hi_at(OC));
    uint8_t *lo = (uint8_t *)(hi + (size_t)OC * IC);
    QD_CUDA_CHECK(cudaMemsetAsync(F + OC, 0, qd_bfp_hi_at(OC) - sizeof(int32_t) * (size_t)OC));
    qd_launch(k_bfp_weights, (unsigned)((OC + 7) / 8), 256, 0, F, hi, lo, w16, wf, OC, IC);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

/* ws's layout: E (N int32), then the three planes of X (N x IC bytes each), each from a multiple of 256 bytes */
static size_t bf_up256(size_t n) { return (n + 255) & ~(size_t)255; }

extern "C" size_t qdk_bfp_rows_bytes(int N, int IC)
{
    return bf_up256((size_t)N * 4) + 3 * bf_up256((size_t)N * IC);
}

int qd_cuda_bfp_wgmma = -1;

extern "C" qd_status qdk_matmul_bfp(float *out, const float *x, const void *wq, void *ws, int N, int IC, int OC)
{
    if (!N || !OC)
        return QD_OK;
    QD_TRY(bf_check(IC, wq, ws));
    size_t plane = bf_up256((size_t)N * IC);
    bf_params p;
    p.E = (const int32_t *)ws;
    p.xh = (const int8_t *)((char *)ws + bf_up256((size_t)N * 4));
    p.xm = (const uint8_t *)p.xh + plane;
    p.xl = p.xm + plane;
    p.F = (const int32_t *)wq;
    p.wh = (const int8_t *)((const char *)wq + qd_bfp_hi_at(OC));
    p.wl = (const uint8_t *)(p.wh + (size_t)OC * IC);
    p.out = out;
    p.N = N, p.IC = IC, p.OC = OC;
    qd_launch(k_bfp_rows, (unsigned)((N + 7) / 8), 256, 0, (int32_t *)p.E, (int8_t *)p.xh, (uint8_t *)p.xm,
              (uint8_t *)p.xl, x, N, IC);
    QD_CUDA_CHECK(cudaGetLastError());
    static int bv_env = -2; /* QUADS_BFP_MATVEC=0: the tensor-core kernel for every row count (run_all.sh) */
    if (N <= BV_ROWS && 3 * N * IC <= 48 * 1024 && qd_env_pick(&bv_env, "QUADS_BFP_MATVEC", 0, 1) != 0) {
        if (N == 1)
            return bv_launch<1>(p);
        if (N == 2)
            return bv_launch<2>(p);
        if (N == 3)
            return bv_launch<3>(p);
        return bv_launch<4>(p);
    }
    static int wg_env = -2; /* past BV_ROWS rows on wgmma where the device has it (QUADS_BFP_WGMMA=0: mma.sync) */
    int wg = qd_switch(qd_cuda_bfp_wgmma, &wg_env, "QUADS_BFP_WGMMA") != 0;
    static int pipe_env = -2; /* QUADS_BFP_WG_PIPE=0: 3 stages, each waited for (the default until 2026-12-06d) */
    /* QUADS_BFP_WG_BK64=1 (opt-in): 8 stages of 64 bytes of K; the same bits, slower on an
     * H100 on 2026-12-07 (bench_quant --bfp: 16 rows 0.263 -> 0.344 ms, 64 0.351 -> 0.419) */
    static int bk_env = -2;
    /* QUADS_BFP_WG3=1 (opt-in until timed): three warpgroups a CTA, 192 vocabulary rows (3
     * stages of 72 KB): each x tile read from L2 by a third fewer CTAs (at 64 rows the x
     * planes are 384 KB a CTA beside its weights' 512 KB: 466 MB of the a3b lm_head's
     * ~1.09 GB of L2-to-SM traffic a step with two warpgroups, 311 MB with three) */
    static int wg3_env = -2;
    if (wg == 1 && qd_wg_device() && qd_env_pick(&wg3_env, "QUADS_BFP_WG3", 0, 1) == 1)
        return bw_launch_n<3, BW_BK, 3>(p);
    if (wg == 1 && qd_wg_device()) {
        if (qd_env_pick(&bk_env, "QUADS_BFP_WG_BK64", 0, 1) == 1)
            return bw_launch_n<8, 64>(p);
        if (qd_env_pick(&pipe_env, "QUADS_BFP_WG_PIPE", 0, 1) != 0)
            return bw_launch_n<4>(p);
        return bw_launch_n<3>(p);
    }
    if (N <= 16)
        return bf_launch<1, 8, 1>(p);
    if (N <= 32)
        return bf_launch<1, 8, 2>(p);
    return bf_launch<2, 4, 2>(p);
}
