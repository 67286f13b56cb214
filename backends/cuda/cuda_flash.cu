/* backends/cuda/cuda_flash.cu: fast mode's fused prefill attention under the
 * BF16 recipes (the attend / attend_backward ops with a prefill's packing,
 * head dims 64 and 128; QUADS_FLASH=0 for the cuBLAS route of cuda_blas.cu).
 *
 * Why: the cuBLAS route writes every (sequence, head)'s L x L scores to
 * memory in float32, softmaxes them in place and reads them back for P V,
 * and its backward does the same for dP and dS (an a3b train step of 16 x
 * 1,024 tokens moves about 2 GB a layer each way and computes the whole
 * square, not the causal half): 28 ms of a 220 ms step. Here no score leaves
 * the chip (FlashAttention-2's scheme, written from its paper's equations):
 *
 * forward, a CTA a (sequence, head, 64 queries), 4 warps of 16 queries: for
 *   each tile of 64 keys up to the diagonal, S = Q K^T on the tensor cores
 *   (mma.m16n8k16, Q K V rounded to BF16, float32 accumulation), the running
 *   max m and sum l of exp2(S scale log2e - m) per query, O = O corr + P V
 *   (P rounded to BF16); out = O / l and att[(n, h), 0] = m + log2 l (the
 *   row's log-sum-exp in base 2: all the backward needs of the forward);
 * backward: delta[n, h] = dout . out (the forward's output) into ds; then a
 *   CTA a (sequence, kv head, 64 keys) recomputes P^T = exp2(K Q^T scale
 *   log2e - lse) and dP^T = V dout^T over the queries past its keys and the
 *   group's heads, dS^T = P^T (dP^T - delta) and sums dv += P^T dout, dk +=
 *   scale dS^T Q in registers (each key row written by one CTA: no atomics,
 *   the same sums every run); and a CTA a (sequence, head, 64 queries) sums
 *   dq += scale dS K over the keys up to the diagonal the same way.
 * exp2 is the hardware's (ex2.approx), as fast mode's other attention. The
 * bounds: tests/gpu/check_ops' fast16 attention rows (BF16 operands). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include "backends/cuda/cuda_blas.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_wgmma.h"
#include "backends/cuda/cuda_mma.h"
extern "C" {
#include "quant/numerics.h"
}

#define FL_M 64      /* queries (forward, dq) or keys (dk, dv) a CTA */
#define FL_N 64      /* keys (forward, dq) a step */
#define FL_QB 32     /* queries a step of the dk, dv kernel */
#define FL_THREADS 128

typedef __nv_bfloat16 bf16;

/* The tiles: (first row of the sequence, its length, first query or key of the tile). */
typedef struct {
    int o, L, t0, pad;
} fl_tile;

static __device__ __forceinline__ uint32_t pack2(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

static __device__ __forceinline__ uint32_t ld32(const bf16 *p) { return *reinterpret_cast<const uint32_t *>(p); }

static __device__ __forceinline__ float ex2(float x)
{
    float y;
    asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

static __device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ void cp_commit(void) { asm volatile("cp.async.commit_group;"); }

template <int N>
static __device__ __forceinline__ void cp_wait(void)
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

/* ROWS rows of D BF16 (gs halves apart in g, 16-byte aligned) into s (row
 * stride D + 8 halves: the fragment reads hit 32 banks) by cp.async; rows
 * past nvalid zero */
template <int D, int ROWS>
static __device__ __forceinline__ void stage(bf16 *s, const bf16 *g, int64_t gs, int nvalid)
{
    constexpr int LD = D + 8, C8 = D / 8;
    for (int i = threadIdx.x; i < ROWS * C8; i += FL_THREADS) {
        int r = i / C8, c = i % C8;
        bool ok = r < nvalid;
        cp16(s + r * LD + 8 * c, ok ? g + (int64_t)r * gs + 8 * c : g, ok);
    }
}

/* A fragments (16 rows from row0 of a staged tile, all D columns) */
template <int D>
static __device__ __forceinline__ void afrag(uint32_t a[D / 16][4], const bf16 *s, int row0)
{
    constexpr int LD = D + 8;
    int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        const bf16 *p = s + (row0 + g) * LD + 16 * kk + 2 * t;
        a[kk][0] = ld32(p);
        a[kk][1] = ld32(p + 8 * LD);
        a[kk][2] = ld32(p + 8);
        a[kk][3] = ld32(p + 8 * LD + 8);
    }
}

/* B fragments of two n-tiles (rows n0 .. n0 + 15) over k0 .. k0 + 15 of a tile
 * stored [n][k] (row stride ld): b[0], b[1] the first n-tile's, b[2], b[3] the
 * second's; one ldmatrix */
static __device__ __forceinline__ void ldb_nk(uint32_t b[4], const bf16 *s, int n0, int k0, int ld)
{
    int l = threadIdx.x & 31, m = l >> 3, r = l & 7;
    const bf16 *p = s + (n0 + r + 8 * (m >> 1)) * ld + k0 + 8 * (m & 1);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                 : "r"(smem_u32(p)));
}

/* the same from a tile stored [k][n] (rows k0 .. k0 + 15, columns n0 .. n0 + 15), transposed by ldmatrix */
static __device__ __forceinline__ void ldb_kn(uint32_t b[4], const bf16 *s, int k0, int n0, int ld)
{
    int l = threadIdx.x & 31, m = l >> 3, r = l & 7;
    const bf16 *p = s + (k0 + r + 8 * (m & 1)) * ld + n0 + 8 * (m >> 1);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                 : "r"(smem_u32(p)));
}

/* The score tile's 16 x 8n values (C layout, one n-tile of 8 a row of acc) as A
 * fragments of the next product (k over the tile's columns, 16 a step) */
static __device__ __forceinline__ void c2a(uint32_t a[4], const float c0[4], const float c1[4])
{
    a[0] = pack2(c0[0], c0[1]);
    a[1] = pack2(c0[2], c0[3]);
    a[2] = pack2(c1[0], c1[1]);
    a[3] = pack2(c1[2], c1[3]);
}

template <int N>
static __device__ __forceinline__ void zero(float a[N][4])
{
#pragma unroll
    for (int i = 0; i < N; i++)
        a[i][0] = a[i][1] = a[i][2] = a[i][3] = 0.f;
}

/* acc (16 x D, C layout) += the 16 x 16 KS score tile s (C layout, rounded to
 * BF16 as A fragments) times rows 0 .. 16 KS - 1 of the [k][n] tile sb */
template <int D, int KS>
static __device__ __forceinline__ void mma_sb(float acc[D / 8][4], float s[2 * KS][4], const bf16 *sb)
{
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        uint32_t pa[4];
        c2a(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
        for (int i = 0; i < D / 16; i++) {
            uint32_t b[4];
            ldb_kn(b, sb, 16 * kk, 16 * i, D + 8);
            mma16816(acc[2 * i], pa, b[0], b[1]);
            mma16816(acc[2 * i + 1], pa, b[2], b[3]);
        }
    }
}

/* Row half (0: C rows g, 1: g + 8) of acc times a into dst's columns 2t, 2t + 1 of
 * each n-tile: stored (add 0) or added (add 1). */
template <int D>
static __device__ __forceinline__ void put_row(float *dst, const float acc[D / 8][4], int half, float a, int add)
{
    int t = threadIdx.x & 3;
    dst += 2 * t;
#pragma unroll
    for (int i = 0; i < D / 8; i++) {
        float x = a * acc[i][2 * half], y = a * acc[i][2 * half + 1];
        dst[8 * i] = add ? dst[8 * i] + x : x;
        dst[8 * i + 1] = add ? dst[8 * i + 1] + y : y;
    }
}

/* One key tile of the forward's online softmax for a thread's two rows r0 and
 * r1 = r0 + 8 (its warp's rows g and g + 8): s holds the warp's 16 x 8 NT
 * scores in mma.m16n8k16's C layout (n-tile nt at s[4 nt ..], keys k0 + 8 nt
 * + 2 t (+ 1)); where mask, the keys past a row's position are cut (-inf).
 * Scaled by c2 (the softmax in base 2), the rows' running max m and sum l
 * updated, acc (16 x 8 NA, the same layout) rescaled, s replaced by
 * exp2(s c2 - m). */
template <int NT, int NA>
static __device__ __forceinline__ void softmax_tile(float (&s)[4 * NT], float (&acc)[4 * NA], int k0, int r0,
                                                    bool mask, float c2, float &m0, float &m1, float &l0, float &l1)
{
    int t = threadIdx.x & 3, r1 = r0 + 8;
    float x0 = m0, x1 = m1;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int key = k0 + 8 * nt + 2 * t + (e & 1), row = e < 2 ? r0 : r1;
            float z = !mask || key <= row ? s[4 * nt + e] * c2 : -INFINITY;
            s[4 * nt + e] = z;
            if (e < 2)
                x0 = fmaxf(x0, z);
            else
                x1 = fmaxf(x1, z);
        }
    }
    x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 1));
    x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 2));
    x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 1));
    x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 2));
    float f0 = ex2(m0 - x0), f1 = ex2(m1 - x1); /* 0 on the first tile (m = -inf) */
    m0 = x0;
    m1 = x1;
    l0 *= f0;
    l1 *= f1;
#pragma unroll
    for (int i = 0; i < NA; i++) {
        acc[4 * i] *= f0;
        acc[4 * i + 1] *= f0;
        acc[4 * i + 2] *= f1;
        acc[4 * i + 3] *= f1;
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        s[4 * nt] = ex2(s[4 * nt] - m0);
        s[4 * nt + 1] = ex2(s[4 * nt + 1] - m0);
        s[4 * nt + 2] = ex2(s[4 * nt + 2] - m1);
        s[4 * nt + 3] = ex2(s[4 * nt + 3] - m1);
        l0 += s[4 * nt] + s[4 * nt + 1];
        l1 += s[4 * nt + 2] + s[4 * nt + 3];
    }
}

/* The log-sum-exps and deltas of a thread's two rows r0 and r0 + 8 of the
 * sequence of tl (0 past its end): st = {lse0, lse1, delta0, delta1} */
static __device__ __forceinline__ void row_stats(float (&st)[4], const float *lse, const float *delta,
                                                 const fl_tile &tl, int r0, int H, int h)
{
    for (int i = 0; i < 2; i++) {
        int r = r0 + 8 * i;
        int64_t n = (int64_t)(tl.o + r) * H + h;
        st[i] = r < tl.L ? lse[n] : 0.f;
        st[2 + i] = r < tl.L ? delta[n] : 0.f;
    }
}

/* dS of a key tile for dq, in place of the scores s (layout as softmax_tile's;
 * dp the same tile of dP): P = exp2(s c2 - lse) on the causal keys of rows
 * inside the sequence (length L), else 0; dS = P (dP - delta) */
template <int NT>
static __device__ __forceinline__ void ds_tile(float (&s)[4 * NT], const float (&dp)[4 * NT], int k0, int r0, int L,
                                               float c2, const float (&st)[4])
{
    int t = threadIdx.x & 3;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int key = k0 + 8 * nt + 2 * t + (e & 1), h = e >> 1, row = r0 + 8 * h;
            float p = key <= row && row < L ? ex2(s[4 * nt + e] * c2 - st[h]) : 0.f;
            s[4 * nt + e] = p * (dp[4 * nt + e] - st[2 + h]);
        }
    }
}

/* The log-sum-exps and deltas of NQ queries from row n (H apart) into sl[0 ..
 * NQ) and sl[NQ .. 2 NQ) for dk, dv's step (0 from the valid-th on) */
template <int NQ>
static __device__ __forceinline__ void stage_stats(float *sl, const float *lse, const float *delta, int64_t n, int H,
                                                   int valid)
{
    if (threadIdx.x < NQ) {
        int e = threadIdx.x;
        bool ok = e < valid;
        sl[e] = ok ? lse[n + (int64_t)e * H] : 0.f;
        sl[NQ + e] = ok ? delta[n + (int64_t)e * H] : 0.f;
    }
}

/* A 64 x D wgmma accumulator (d[4 j + e]) as put_row's n-tiles (acc[j][e]): the same registers */
template <int D>
static __device__ __forceinline__ const float (&as_tiles(const float (&d)[D / 2]))[D / 8][4]
{
    return reinterpret_cast<const float(&)[D / 8][4]>(d);
}

/* dk, dv of a thread's two keys key0 and key0 + 8 (of kv head kh; past the
 * sequence's end none) added from the accumulators, dk times scale */
template <int D>
static __device__ __forceinline__ void put_dkv(float *dk, float *dv, const float (&adk)[D / 8][4],
                                               const float (&adv)[D / 8][4], const fl_tile &tl, int key0, int KV,
                                               int kh, float scale, int add)
{
    for (int half = 0; half < 2; half++) {
        int key = key0 + 8 * half;
        if (key < tl.L) {
            int64_t o = ((int64_t)(tl.o + key) * KV + kh) * D;
            put_row<D>(dk + o, adk, half, scale, add);
            put_row<D>(dv + o, adv, half, 1.0f, add);
        }
    }
}

/* dst = BF16 of src (n floats), four a thread where both are aligned */
__global__ void flash_bf16_kernel(bf16 *dst, const float *src, int64_t n, int vec)
{
    QD_PDL_ENTRY();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, step = (int64_t)gridDim.x * blockDim.x;
    if (vec) {
        for (int64_t j = i; 4 * j < n; j += step) {
            float4 v = reinterpret_cast<const float4 *>(src)[j];
            uint2 p;
            p.x = pack2(v.x, v.y);
            p.y = pack2(v.z, v.w);
            reinterpret_cast<uint2 *>(dst)[j] = p;
        }
        return;
    }
    for (int64_t j = i; j < n; j += step)
        dst[j] = __float2bfloat16_rn(src[j]);
}

/* Keys and values k0 .. k0 + FL_N - 1 (rows of ks halves in kg, vg; past L
 * zero) into a stage at st (K, then V FL_N rows later), one cp.async group. */
template <int D>
static __device__ __forceinline__ void stage_kv(bf16 *st, const bf16 *kg, const bf16 *vg, int64_t ks, int k0, int L)
{
    stage<D, FL_N>(st, kg + (int64_t)k0 * ks, ks, L - k0);
    stage<D, FL_N>(st + FL_N * (D + 8), vg + (int64_t)k0 * ks, ks, L - k0);
    cp_commit();
}

/* Step j of nkt over the key tiles (forward, dq): tile j + 1's copies issued
 * into the other stage, tile j's waited for; every thread past the barrier. */
template <int D>
static __device__ __forceinline__ void next_kv(bf16 *skv, const bf16 *kg, const bf16 *vg, int64_t ks, int j, int nkt,
                                               int L)
{
    if (j + 1 < nkt) {
        stage_kv<D>(skv + 2 * ((j + 1) & 1) * FL_N * (D + 8), kg, vg, ks, (j + 1) * FL_N, L);
        cp_wait<1>();
    } else {
        cp_wait<0>();
    }
    __syncthreads();
}

/* The tile of one CTA and its two stages of keys and values (forward, dq). */
template <int D>
__global__ void __launch_bounds__(FL_THREADS) flash_fwd_kernel(float *out, float *lse, const bf16 *q, const bf16 *k,
                                                               const bf16 *v, const fl_tile *tiles, int H, int KV,
                                                               float c2)
{
    QD_PDL_ENTRY();
    constexpr int LD = D + 8, ND = D / 8, TS = FL_N * LD;
    extern __shared__ __align__(16) unsigned char fl_smem[];
    bf16 *sq = reinterpret_cast<bf16 *>(fl_smem), *skv = sq + FL_M * LD; /* stage j: K at skv + 2 j TS, V after */
    fl_tile tl = tiles[blockIdx.x];
    int h = blockIdx.y, kh = h / (H / KV), w = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    int64_t ks = (int64_t)KV * D;
    const bf16 *kg = k + (int64_t)tl.o * ks + (int64_t)kh * D, *vg = v + (int64_t)tl.o * ks + (int64_t)kh * D;
    stage<D, FL_M>(sq, q + ((int64_t)(tl.o + tl.t0) * H + h) * D, (int64_t)H * D, tl.L - tl.t0);
    stage_kv<D>(skv, kg, vg, ks, 0, tl.L);
    uint32_t qa[D / 16][4];
    int r0 = tl.t0 + 16 * w + g, r1 = r0 + 8; /* this thread's two queries (positions) */
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    float acc[ND][4];
    zero<ND>(acc);
    int nkt = (min(tl.L, tl.t0 + FL_M) + FL_N - 1) / FL_N;
    for (int j = 0; j < nkt; j++) {
        next_kv<D>(skv, kg, vg, ks, j, nkt, tl.L);
        if (j == 0)
            afrag<D>(qa, sq, 16 * w);
        const bf16 *sk = skv + 2 * (j & 1) * TS, *sv = sk + TS;
        int k0 = j * FL_N;
        float s[FL_N / 8][4];
        zero<FL_N / 8>(s);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
            for (int np = 0; np < FL_N / 16; np++) {
                uint32_t b[4];
                ldb_nk(b, sk, 16 * np, 16 * kk, LD);
                mma16816(s[2 * np], qa[kk], b[0], b[1]);
                mma16816(s[2 * np + 1], qa[kk], b[2], b[3]);
            }
        }
        softmax_tile<FL_N / 8, ND>(reinterpret_cast<float(&)[FL_N / 2]>(s), reinterpret_cast<float(&)[D / 2]>(acc), k0,
                                   r0, true, c2, m0, m1, l0, l1);
        mma_sb<D, FL_N / 16>(acc, s, sv);
        __syncthreads(); /* the stage is free for the copy after next */
    }
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    float i0 = 1.0f / l0, i1 = 1.0f / l1;
    if (r0 < tl.L) {
        put_row<D>(out + ((int64_t)(tl.o + r0) * H + h) * D, acc, 0, i0, 0);
        if (t == 0)
            lse[(int64_t)(tl.o + r0) * H + h] = m0 + log2f(l0);
    }
    if (r1 < tl.L) {
        put_row<D>(out + ((int64_t)(tl.o + r1) * H + h) * D, acc, 1, i1, 0);
        if (t == 0)
            lse[(int64_t)(tl.o + r1) * H + h] = m1 + log2f(l1);
    }
}

/* delta[n * H + h] = dout[n, h, :] . out[n, h, :], a warp a row */
__global__ void flash_delta_kernel(float *delta, const float *dout, const float *out, int64_t rows, int D)
{
    QD_PDL_ENTRY();
    int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (r >= rows)
        return;
    float s = 0.f;
    for (int d = lane; d < D; d += 32)
        s += dout[r * D + d] * out[r * D + d];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0)
        delta[r] = s;
}

/* dk, dv of a tile of 64 keys of one kv head: warp w owns keys 16w .. 16w + 15;
 * the (head of the group, block of 32 queries) steps in two stages of q and dout */
template <int D>
__global__ void __launch_bounds__(FL_THREADS) flash_dkv_kernel(float *dk, float *dv, const bf16 *q, const bf16 *k,
                                                               const bf16 *v, const bf16 *dout, const float *lse,
                                                               const float *delta, const fl_tile *tiles, int H,
                                                               int KV, float c2, float scale, int add)
{
    QD_PDL_ENTRY();
    constexpr int LD = D + 8, ND = D / 8, QS = FL_QB * LD;
    extern __shared__ __align__(16) unsigned char fl_smem[];
    /* stage j: q at sqd + 2 j QS, dout QS after; lse at sld + 2 j FL_QB, delta FL_QB after */
    bf16 *sk = reinterpret_cast<bf16 *>(fl_smem), *sv = sk + FL_M * LD, *sqd = sv + FL_M * LD;
    float *sld = reinterpret_cast<float *>(sqd + 4 * QS);
    fl_tile tl = tiles[gridDim.x - 1 - blockIdx.x]; /* the first keys (the most queries) first */
    int kh = blockIdx.y, grp = H / KV, w = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    int64_t ks = (int64_t)KV * D, qs = (int64_t)H * D;
    stage<D, FL_M>(sk, k + ((int64_t)(tl.o + tl.t0) * KV + kh) * D, ks, tl.L - tl.t0);
    stage<D, FL_M>(sv, v + ((int64_t)(tl.o + tl.t0) * KV + kh) * D, ks, tl.L - tl.t0);
    int nqb = (tl.L - tl.t0 + FL_QB - 1) / FL_QB, nsteps = grp * nqb;
    /* step i: head kh grp + i / nqb, queries t0 + (i % nqb) FL_QB .. */
    auto issue = [&](int i) {
        int h = kh * grp + i / nqb, q0 = tl.t0 + (i % nqb) * FL_QB;
        bf16 *st = sqd + 2 * (i & 1) * QS;
        int64_t row = (int64_t)(tl.o + q0) * H + h;
        stage<D, FL_QB>(st, q + row * D, qs, tl.L - q0);
        stage<D, FL_QB>(st + QS, dout + row * D, qs, tl.L - q0);
        stage_stats<FL_QB>(sld + 2 * (i & 1) * FL_QB, lse, delta, row, H, tl.L - q0);
    };
    issue(0);
    cp_commit();
    int key0 = tl.t0 + 16 * w + g, key1 = key0 + 8;
    float adk[ND][4], adv[ND][4];
    zero<ND>(adk);
    zero<ND>(adv);
    for (int i = 0; i < nsteps; i++) {
        if (i + 1 < nsteps) {
            issue(i + 1);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        const bf16 *sq = sqd + 2 * (i & 1) * QS, *sd = sq + QS;
        const float *slse = sld + 2 * (i & 1) * FL_QB, *sdel = slse + FL_QB;
        int q0 = tl.t0 + (i % nqb) * FL_QB;
        /* S^T and dP^T: 16 keys x 32 queries */
        float st[FL_QB / 8][4], dp[FL_QB / 8][4];
        zero<FL_QB / 8>(st);
        zero<FL_QB / 8>(dp);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t ka[4], va[4];
            const bf16 *pk = sk + (16 * w + g) * LD + 16 * kk + 2 * t, *pv = sv + (16 * w + g) * LD + 16 * kk + 2 * t;
            ka[0] = ld32(pk);
            ka[1] = ld32(pk + 8 * LD);
            ka[2] = ld32(pk + 8);
            ka[3] = ld32(pk + 8 * LD + 8);
            va[0] = ld32(pv);
            va[1] = ld32(pv + 8 * LD);
            va[2] = ld32(pv + 8);
            va[3] = ld32(pv + 8 * LD + 8);
#pragma unroll
            for (int np = 0; np < FL_QB / 16; np++) {
                uint32_t bq[4], bd[4];
                ldb_nk(bq, sq, 16 * np, 16 * kk, LD);
                ldb_nk(bd, sd, 16 * np, 16 * kk, LD);
                mma16816(st[2 * np], ka, bq[0], bq[1]);
                mma16816(st[2 * np + 1], ka, bq[2], bq[3]);
                mma16816(dp[2 * np], va, bd[0], bd[1]);
                mma16816(dp[2 * np + 1], va, bd[2], bd[3]);
            }
        }
        /* P^T and dS^T in place (0 where the query is before the key or past the sequence) */
#pragma unroll
        for (int nt = 0; nt < FL_QB / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int qi = 8 * nt + 2 * t + (e & 1), qpos = q0 + qi, key = e < 2 ? key0 : key1;
                float p = qpos >= key && qpos < tl.L && key < tl.L ? ex2(st[nt][e] * c2 - slse[qi]) : 0.f;
                st[nt][e] = p;
                dp[nt][e] = p * (dp[nt][e] - sdel[qi]);
            }
        }
        /* dv += P^T dout, dk += dS^T q (k over the 32 queries, 16 a step) */
        mma_sb<D, FL_QB / 16>(adv, st, sd);
        mma_sb<D, FL_QB / 16>(adk, dp, sq);
        __syncthreads(); /* the stage is free for the copy after next */
    }
    put_dkv<D>(dk, dv, adk, adv, tl, key0, KV, kh, scale, add);
}

/* dq of a tile of 64 queries of one head: warp w owns queries 16w .. 16w + 15 */
template <int D>
__global__ void __launch_bounds__(FL_THREADS) flash_dq_kernel(float *dq, const bf16 *q, const bf16 *k, const bf16 *v,
                                                              const bf16 *dout, const float *lse,
                                                              const float *delta, const fl_tile *tiles, int H, int KV,
                                                              float c2, float scale, int add)
{
    QD_PDL_ENTRY();
    constexpr int LD = D + 8, ND = D / 8, TS = FL_N * LD;
    extern __shared__ __align__(16) unsigned char fl_smem[];
    bf16 *sq = reinterpret_cast<bf16 *>(fl_smem), *sd = sq + FL_M * LD, *skv = sd + FL_M * LD;
    fl_tile tl = tiles[blockIdx.x];
    int h = blockIdx.y, kh = h / (H / KV), w = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2;
    int64_t ks = (int64_t)KV * D;
    const bf16 *kg = k + (int64_t)tl.o * ks + (int64_t)kh * D, *vg = v + (int64_t)tl.o * ks + (int64_t)kh * D;
    int64_t row = (int64_t)(tl.o + tl.t0) * H + h;
    stage<D, FL_M>(sq, q + row * D, (int64_t)H * D, tl.L - tl.t0);
    stage<D, FL_M>(sd, dout + row * D, (int64_t)H * D, tl.L - tl.t0);
    stage_kv<D>(skv, kg, vg, ks, 0, tl.L);
    uint32_t qa[D / 16][4], da[D / 16][4];
    int r0 = tl.t0 + 16 * w + g, r1 = r0 + 8;
    float st[4]; /* lse0, lse1, del0, del1 */
    row_stats(st, lse, delta, tl, r0, H, h);
    float acc[ND][4];
    zero<ND>(acc);
    int nkt = (min(tl.L, tl.t0 + FL_M) + FL_N - 1) / FL_N;
    for (int j = 0; j < nkt; j++) {
        next_kv<D>(skv, kg, vg, ks, j, nkt, tl.L);
        if (j == 0) {
            afrag<D>(qa, sq, 16 * w);
            afrag<D>(da, sd, 16 * w);
        }
        const bf16 *sk = skv + 2 * (j & 1) * TS, *sv = sk + TS;
        int k0 = j * FL_N;
        float s[FL_N / 8][4], dp[FL_N / 8][4];
        zero<FL_N / 8>(s);
        zero<FL_N / 8>(dp);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
            for (int np = 0; np < FL_N / 16; np++) {
                uint32_t bk[4], bv[4];
                ldb_nk(bk, sk, 16 * np, 16 * kk, LD);
                ldb_nk(bv, sv, 16 * np, 16 * kk, LD);
                mma16816(s[2 * np], qa[kk], bk[0], bk[1]);
                mma16816(s[2 * np + 1], qa[kk], bk[2], bk[3]);
                mma16816(dp[2 * np], da[kk], bv[0], bv[1]);
                mma16816(dp[2 * np + 1], da[kk], bv[2], bv[3]);
            }
        }
        ds_tile<FL_N / 8>(reinterpret_cast<float(&)[FL_N / 2]>(s), reinterpret_cast<float(&)[FL_N / 2]>(dp), k0, r0,
                          tl.L, c2, st);
        mma_sb<D, FL_N / 16>(acc, s, sk);
        __syncthreads(); /* the stage is free for the copy after next */
    }
    if (r0 < tl.L)
        put_row<D>(dq + ((int64_t)(tl.o + r0) * H + h) * D, acc, 0, scale, add);
    if (r1 < tl.L)
        put_row<D>(dq + ((int64_t)(tl.o + r1) * H + h) * D, acc, 1, scale, add);
}

/* ---- the same three kernels on Hopper's warpgroup MMA (QUADS_FLASH_WG=1; sm_90a)
 *
 * Why: the kernels above issue mma.sync a warp at a time with both operands
 * through registers (~130 TFLOP/s forward, ~80 backward at a3b's shape);
 * wgmma reads its B operand (and A where it sits in shared memory) straight
 * from shared memory for four warps at once and runs asynchronously. A CTA is
 * two warpgroups of 64 rows (queries in the forward and dq, keys in dk, dv):
 * 128 rows a CTA, keys (or queries) 64 a step. Tiles of R rows x D are stored
 * in shared memory 128-byte swizzled, D split in blocks of 64 columns (R x 128
 * bytes each; row r's 16-byte chunk c at c ^ (r % 8)): read K-major (rows =
 * M or N, K = D: S = Q K^T, dP = dO V^T and their transposes) or MN-major
 * (K = rows, N = D: P V, dS K, P^T dO, dS^T Q) by the descriptor alone.
 * P, dS and their transposes go from the accumulators straight into wgmma's
 * register A operand (the layout of the m64 accumulator's 16 rows a warp is
 * mma.m16n8k16's A fragment, as in c2a). Same equations, masks and exp2 as
 * the kernels above, the same sums up to the order of the float32 additions
 * inside the tensor cores: fast16's bounds (check_ops' attention rows with
 * QUADS_FLASH_WG=1). */
#define FW_ROWS 128    /* rows a CTA (2 warpgroups of 64) */
#define FW_STEP 64     /* keys (queries in dk, dv) a step */
#define FW_THREADS 256

/* A tile of R rows x D at s (1,024-byte aligned) read K-major (K = D): rows
 * r0 .. r0 + 63 (A) or all R (B), the k-step ks of 16 columns */
template <int R>
static __device__ __forceinline__ uint64_t fw_kmaj(uint32_t s, int r0, int ks)
{
    return qd_wg_desc(s + (uint32_t)(ks >> 2) * (R * 128) + (uint32_t)r0 * 128 + (uint32_t)(ks & 3) * 32, 16, 1024);
}

/* The same tile read MN-major (K = its rows, N = D): rows 16 ks .. 16 ks + 15 */
template <int R>
static __device__ __forceinline__ uint64_t fw_mn(uint32_t s, int ks)
{
    return qd_wg_desc(s + (uint32_t)ks * 2048, R * 128, 1024);
}

/* R rows of D BF16 (gs halves apart in g) into the swizzled tile at s by
 * cp.async; rows past nvalid zero */
template <int D, int R>
static __device__ __forceinline__ void fw_stage(uint32_t s, const bf16 *g, int64_t gs, int nvalid)
{
    constexpr int C8 = D / 8;
#pragma unroll
    for (int j = 0; j < R * C8 / FW_THREADS; j++) {
        int i = threadIdx.x + j * FW_THREADS, r = i / C8, c = i % C8;
        bool ok = r < nvalid;
        uint32_t dst = s + (uint32_t)(c >> 3) * (R * 128) + (uint32_t)r * 128 + (uint32_t)(((c & 7) ^ (r & 7)) << 4);
        const bf16 *src = ok ? g + (int64_t)r * gs + 8 * c : g;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0));
    }
}

/* Key tile jt (keys and values 64 jt .., rows ks halves apart in kg, vg; past
 * L zero) into stage jt % 2 of skv (K, then V 64 D halves later), one
 * cp.async group */
template <int D>
static __device__ __forceinline__ void fw_stage_kv(uint32_t skv, const bf16 *kg, const bf16 *vg, int64_t ks, int jt,
                                                   int L)
{
    constexpr uint32_t KB = FW_STEP * D * 2;
    uint32_t st = skv + 2 * (jt & 1) * KB;
    int64_t o = (int64_t)jt * FW_STEP * ks;
    fw_stage<D, FW_STEP>(st, kg + o, ks, L - jt * FW_STEP);
    fw_stage<D, FW_STEP>(st + KB, vg + o, ks, L - jt * FW_STEP);
    cp_commit();
}

static __device__ __forceinline__ void fw_wait_copies(void)
{
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* the copies visible to wgmma */
    __syncthreads();
}

/* the products issued since qd_wg_fence committed and waited for */
static __device__ __forceinline__ void fw_mma_end(void)
{
    qd_wg_commit();
    qd_wg_wait<0>();
}

/* d (64 x 64 a warpgroup) = A . B^T over D, A rows a0 .. of the tile sa (RA
 * rows), B all of sb (64 rows), both K-major */
template <int D, int RA>
static __device__ __forceinline__ void fw_abt(float (&d)[32], uint32_t sa, int a0, uint32_t sb)
{
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++)
        qd_wgmma_ss64<0, 0>(d, fw_kmaj<RA>(sa, a0, ks), fw_kmaj<FW_STEP>(sb, 0, ks), ks > 0);
}

/* The 64 x 64 accumulator p (BF16) as wgmma's register A operand, a k-step
 * of 16 columns each (packed before the wgmma fence: no register of an
 * operand written while a product reads it) */
static __device__ __forceinline__ void fw_pack(uint32_t (&a)[FW_STEP / 16][4], const float (&p)[32])
{
#pragma unroll
    for (int ks = 0; ks < FW_STEP / 16; ks++) {
        a[ks][0] = pack2(p[8 * ks], p[8 * ks + 1]);
        a[ks][1] = pack2(p[8 * ks + 2], p[8 * ks + 3]);
        a[ks][2] = pack2(p[8 * ks + 4], p[8 * ks + 5]);
        a[ks][3] = pack2(p[8 * ks + 6], p[8 * ks + 7]);
    }
}

/* acc (64 x D a warpgroup) += P . B, P packed by fw_pack, B the 64-row tile sb
 * read MN-major */
template <int D>
static __device__ __forceinline__ void fw_pb(float (&acc)[D / 2], const uint32_t (&a)[FW_STEP / 16][4], uint32_t sb)
{
#pragma unroll
    for (int ks = 0; ks < FW_STEP / 16; ks++) {
        if constexpr (D == 128)
            qd_wgmma_rs128<1>(acc, a[ks], fw_mn<FW_STEP>(sb, ks));
        else
            qd_wgmma_rs64<1>(acc, a[ks], fw_mn<FW_STEP>(sb, ks));
    }
}

/* Forward: a CTA a (sequence, head, 128 queries); warpgroup w the queries 64 w ..;
 * two stages of 64 keys and values. */
template <int D>
__global__ void __launch_bounds__(FW_THREADS, 1) flash_fwd_wg(float *out, float *lse, const bf16 *q, const bf16 *k,
                                                            const bf16 *v, const fl_tile *tiles, int H, int KV,
                                                            float c2)
{
    QD_PDL_ENTRY();
#if QD_WG_ARCH
    constexpr uint32_t QB = FW_ROWS * D * 2, KB = FW_STEP * D * 2;
    extern __shared__ __align__(16) unsigned char fw_smem[];
    const uint32_t sq = (smem_u32(fw_smem) + 1023) & ~1023u, skv = sq + QB; /* stage j: K at skv + 2 j KB, V + KB */
    fl_tile tl = tiles[blockIdx.x];
    int h = blockIdx.y, kh = h / (H / KV), w = threadIdx.x >> 7, wi = (threadIdx.x >> 5) & 3;
    int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    int64_t ks = (int64_t)KV * D;
    const bf16 *kg = k + (int64_t)tl.o * ks + (int64_t)kh * D, *vg = v + (int64_t)tl.o * ks + (int64_t)kh * D;
    fw_stage<D, FW_ROWS>(sq, q + ((int64_t)(tl.o + tl.t0) * H + h) * D, (int64_t)H * D, tl.L - tl.t0);
    fw_stage_kv<D>(skv, kg, vg, ks, 0, tl.L);
    int q0 = tl.t0 + 64 * w, r0 = q0 + 16 * wi + g, r1 = r0 + 8; /* this thread's two queries */
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    float acc[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; i++)
        acc[i] = 0.f;
    int nkt = (min(tl.L, tl.t0 + FW_ROWS) + FW_STEP - 1) / FW_STEP;
    for (int j = 0; j < nkt; j++) {
        fw_wait_copies(); /* tile j landed; every warpgroup done with tile j - 1 */
        if (j + 1 < nkt)
            fw_stage_kv<D>(skv, kg, vg, ks, j + 1, tl.L);
        int k0 = j * FW_STEP;
        if (k0 > q0 + 63 || q0 >= tl.L) /* no key of the tile before any of this warpgroup's queries */
            continue;
        uint32_t sk = skv + 2 * (j & 1) * KB, sv = sk + KB;
        float s[32];
        qd_wg_fence();
        fw_abt<D, FW_ROWS>(s, sq, 64 * w, sk);
        fw_mma_end();
        qd_wg_fence_acc(s);
        qd_wg_fence_acc(acc);
        /* the causal cut only where a key of the tile passes the warpgroup's first query */
        softmax_tile<8, D / 8>(s, acc, k0, r0, k0 + FW_STEP - 1 > q0, c2, m0, m1, l0, l1);
        uint32_t pa[FW_STEP / 16][4];
        fw_pack(pa, s);
        qd_wg_fence();
        fw_pb<D>(acc, pa, sv);
        fw_mma_end();
        qd_wg_fence_acc(acc);
    }
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    if (r0 < tl.L) {
        put_row<D>(out + ((int64_t)(tl.o + r0) * H + h) * D, as_tiles<D>(acc), 0, 1.0f / l0, 0);
        if (t == 0)
            lse[(int64_t)(tl.o + r0) * H + h] = m0 + log2f(l0);
    }
    if (r1 < tl.L) {
        put_row<D>(out + ((int64_t)(tl.o + r1) * H + h) * D, as_tiles<D>(acc), 1, 1.0f / l1, 0);
        if (t == 0)
            lse[(int64_t)(tl.o + r1) * H + h] = m1 + log2f(l1);
    }
#endif
}

/* dq: a CTA a (sequence, head, 128 queries); warpgroup w the queries 64 w ..;
 * two stages of 64 keys and values. */
template <int D>
__global__ void __launch_bounds__(FW_THREADS, 1) flash_dq_wg(float *dq, const bf16 *q, const bf16 *k, const bf16 *v,
                                                           const bf16 *dout, const float *lse, const float *delta,
                                                           const fl_tile *tiles, int H, int KV, float c2,
                                                           float scale, int add)
{
    QD_PDL_ENTRY();
#if QD_WG_ARCH
    constexpr uint32_t QB = FW_ROWS * D * 2, KB = FW_STEP * D * 2;
    extern __shared__ __align__(16) unsigned char fw_smem[];
    const uint32_t sq = (smem_u32(fw_smem) + 1023) & ~1023u, sd = sq + QB, skv = sd + QB;
    fl_tile tl = tiles[blockIdx.x];
    int h = blockIdx.y, kh = h / (H / KV), w = threadIdx.x >> 7, wi = (threadIdx.x >> 5) & 3;
    int g = (threadIdx.x & 31) >> 2;
    int64_t ks = (int64_t)KV * D, row = (int64_t)(tl.o + tl.t0) * H + h;
    const bf16 *kg = k + (int64_t)tl.o * ks + (int64_t)kh * D, *vg = v + (int64_t)tl.o * ks + (int64_t)kh * D;
    fw_stage<D, FW_ROWS>(sq, q + row * D, (int64_t)H * D, tl.L - tl.t0);
    fw_stage<D, FW_ROWS>(sd, dout + row * D, (int64_t)H * D, tl.L - tl.t0);
    fw_stage_kv<D>(skv, kg, vg, ks, 0, tl.L);
    int q0 = tl.t0 + 64 * w, r0 = q0 + 16 * wi + g, r1 = r0 + 8;
    float st[4]; /* lse0, lse1, del0, del1 */
    row_stats(st, lse, delta, tl, r0, H, h);
    float acc[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; i++)
        acc[i] = 0.f;
    int nkt = (min(tl.L, tl.t0 + FW_ROWS) + FW_STEP - 1) / FW_STEP;
    for (int j = 0; j < nkt; j++) {
        fw_wait_copies();
        if (j + 1 < nkt)
            fw_stage_kv<D>(skv, kg, vg, ks, j + 1, tl.L);
        int k0 = j * FW_STEP;
        if (k0 > q0 + 63 || q0 >= tl.L)
            continue;
        uint32_t sk = skv + 2 * (j & 1) * KB, sv = sk + KB;
        float s[32], dp[32];
        qd_wg_fence();
        fw_abt<D, FW_ROWS>(s, sq, 64 * w, sk);
        fw_abt<D, FW_ROWS>(dp, sd, 64 * w, sv);
        fw_mma_end();
        qd_wg_fence_acc(s);
        qd_wg_fence_acc(dp);
        ds_tile<8>(s, dp, k0, r0, tl.L, c2, st);
        uint32_t pa[FW_STEP / 16][4];
        fw_pack(pa, s);
        qd_wg_fence_acc(acc);
        qd_wg_fence();
        fw_pb<D>(acc, pa, sk); /* dq += dS K: K read MN-major */
        fw_mma_end();
        qd_wg_fence_acc(acc);
    }
    if (r0 < tl.L)
        put_row<D>(dq + ((int64_t)(tl.o + r0) * H + h) * D, as_tiles<D>(acc), 0, scale, add);
    if (r1 < tl.L)
        put_row<D>(dq + ((int64_t)(tl.o + r1) * H + h) * D, as_tiles<D>(acc), 1, scale, add);
#endif
}

/* dk, dv: a CTA a (sequence, kv head, 128 keys); warpgroup w the keys 64 w ..;
 * steps over (head of the group, block of 64 queries) in two stages of q,
 * dout and their log-sum-exps and deltas. */
template <int D>
__global__ void __launch_bounds__(FW_THREADS, 1) flash_dkv_wg(float *dk, float *dv, const bf16 *q, const bf16 *k,
                                                            const bf16 *v, const bf16 *dout, const float *lse,
                                                            const float *delta, const fl_tile *tiles, int H, int KV,
                                                            float c2, float scale, int add)
{
    QD_PDL_ENTRY();
#if QD_WG_ARCH
    constexpr uint32_t TB = FW_ROWS * D * 2, QB = FW_STEP * D * 2;
    extern __shared__ __align__(16) unsigned char fw_smem[];
    /* K, V tiles; stage j: q at sqd + 2 j QB, dout QB after; lse, delta at sld + 2 j FW_STEP floats */
    const uint32_t sk = (smem_u32(fw_smem) + 1023) & ~1023u, sv = sk + TB, sqd = sv + TB;
    float *sld = reinterpret_cast<float *>(fw_smem + (sqd + 4 * QB - smem_u32(fw_smem)));
    fl_tile tl = tiles[gridDim.x - 1 - blockIdx.x]; /* the first keys (the most queries) first */
    int kh = blockIdx.y, grp = H / KV, w = threadIdx.x >> 7, wi = (threadIdx.x >> 5) & 3;
    int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    int64_t ks = (int64_t)KV * D, qs = (int64_t)H * D;
    fw_stage<D, FW_ROWS>(sk, k + ((int64_t)(tl.o + tl.t0) * KV + kh) * D, ks, tl.L - tl.t0);
    fw_stage<D, FW_ROWS>(sv, v + ((int64_t)(tl.o + tl.t0) * KV + kh) * D, ks, tl.L - tl.t0);
    int nqb = (tl.L - tl.t0 + FW_STEP - 1) / FW_STEP, nsteps = grp * nqb;
    auto issue = [&](int i) { /* step i: head kh grp + i / nqb, queries t0 + (i % nqb) FW_STEP .. */
        int hh = kh * grp + i / nqb, qq = tl.t0 + (i % nqb) * FW_STEP;
        uint32_t st = sqd + 2 * (i & 1) * QB;
        int64_t rw = (int64_t)(tl.o + qq) * H + hh;
        fw_stage<D, FW_STEP>(st, q + rw * D, qs, tl.L - qq);
        fw_stage<D, FW_STEP>(st + QB, dout + rw * D, qs, tl.L - qq);
        stage_stats<FW_STEP>(sld + 2 * (i & 1) * FW_STEP, lse, delta, rw, H, tl.L - qq);
        cp_commit();
    };
    issue(0);
    int kb = tl.t0 + 64 * w, key0 = kb + 16 * wi + g, key1 = key0 + 8;
    float adk[D / 2], adv[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; i++)
        adk[i] = adv[i] = 0.f;
    for (int i = 0; i < nsteps; i++) {
        fw_wait_copies(); /* step i's q, dout (and K, V); every warpgroup done with step i - 1 */
        if (i + 1 < nsteps)
            issue(i + 1);
        int qq = tl.t0 + (i % nqb) * FW_STEP;
        if (qq + FW_STEP - 1 < kb || kb >= tl.L) /* every query of the block before this warpgroup's keys */
            continue;
        uint32_t sq = sqd + 2 * (i & 1) * QB, sd = sq + QB;
        const float *slse = sld + 2 * (i & 1) * FW_STEP, *sdel = slse + FW_STEP;
        float st[32], dp[32]; /* S^T and dP^T: 64 keys x 64 queries a warpgroup */
        qd_wg_fence();
        fw_abt<D, FW_ROWS>(st, sk, 64 * w, sq);
        fw_abt<D, FW_ROWS>(dp, sv, 64 * w, sd);
        fw_mma_end();
        qd_wg_fence_acc(st);
        qd_wg_fence_acc(dp);
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int qi = 8 * nt + 2 * t + (e & 1), qpos = qq + qi, key = e < 2 ? key0 : key1;
                float p = qpos >= key && qpos < tl.L && key < tl.L ? ex2(st[4 * nt + e] * c2 - slse[qi]) : 0.f;
                st[4 * nt + e] = p;
                dp[4 * nt + e] = p * (dp[4 * nt + e] - sdel[qi]);
            }
        }
        uint32_t pa[FW_STEP / 16][4], da[FW_STEP / 16][4];
        fw_pack(pa, st);
        fw_pack(da, dp);
        qd_wg_fence_acc(adv);
        qd_wg_fence_acc(adk);
        qd_wg_fence();
        fw_pb<D>(adv, pa, sd); /* dv += P^T dout: dout read MN-major */
        fw_pb<D>(adk, da, sq); /* dk += dS^T q */
        fw_mma_end();
        qd_wg_fence_acc(adv);
        qd_wg_fence_acc(adk);
    }
    put_dkv<D>(dk, dv, as_tiles<D>(adk), as_tiles<D>(adv), tl, key0, KV, kh, scale, add);
#endif
}

/* ---- host: the tile table of a call, through cuda_blas.cu's pinned ring */

/* The tiles of M rows (FL_M, or FW_ROWS for the wgmma kernels) of every
 * sequence (in descending order of first row: the forward's and dq's longest
 * CTAs first), on the device in *out. */
static qd_status fl_tiles(const int32_t *seq_off, int nseq, int M, const fl_tile **out, int *ntiles)
{
    size_t n = 0;
    int maxl = 0;
    for (int b = 0; b < nseq; b++) {
        int L = seq_off[b + 1] - seq_off[b];
        n += (size_t)(L + M - 1) / M;
        maxl = L > maxl ? L : maxl;
    }
    *ntiles = (int)n;
    if (n == 0)
        return QD_OK;
    fl_tile *h;
    QD_TRY(qd_cuda_blas_table(sizeof(fl_tile) * n, (void **)&h));
    size_t i = 0;
    for (int t0 = (maxl - 1) / M * M; t0 >= 0; t0 -= M)
        for (int b = 0; b < nseq; b++) {
            int L = seq_off[b + 1] - seq_off[b];
            if (t0 < L)
                h[i++] = fl_tile{seq_off[b], L, t0, 0};
        }
    return qd_cuda_blas_table_upload(sizeof(fl_tile) * n, (void **)out);
}

static int flash_env(void)
{
    static int v = -2;
    return qd_env_pick(&v, "QUADS_FLASH", 0, 1) != 0;
}

int qd_cuda_flash_wg = -1;

/* The wgmma kernels (compute capability 9.0 only; the default there, QUADS_FLASH_WG=0
 * or qd_cuda_flash_wg 0 for the mma.sync ones). On the H200 (bench_quant
 * --attention, 2026-12-05) they take 0.70 / 2.36 ms for a3b's forward / backward at
 * 16 x 1024 against mma.sync's 1.03 / 3.21 (same bits in that run), and the a3b
 * train step (4 layers, 16 x 1024, bf16 fast) 198.9 against 203.9 ms. */
static int flash_wg(void)
{
    static int v = -2;
    return qd_wg_device() && qd_switch(qd_cuda_flash_wg, &v, "QUADS_FLASH_WG") != 0;
}

static size_t up64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Floats of att (forward) or ds (backward) the kernels use: the per-row
 * log-sum-exps or deltas (N H), then the BF16 copies of q, k, v (and dout in
 * the backward), the first on 16 bytes, each 64 floats after the one before. */
static size_t flash_floats(int64_t N, int H, int KV, int D, int bwd)
{
    size_t nq = (size_t)N * H * D, nk = (size_t)N * KV * D;
    return up64((size_t)N * H) + 4 + up64(nq / 2 + 1) * (bwd ? 2 : 1) + 2 * up64(nk / 2 + 1);
}

/* The first BF16 copy's start in a scratch of floats: past the N H row
 * values, on 16 bytes (the copies' rows are then too: cp.async's 16-byte reads) */
static float *copies_at(float *scratch, int64_t N, int H)
{
    uintptr_t a = (uintptr_t)(scratch + up64((size_t)N * H));
    return reinterpret_cast<float *>((a + 15) & ~(uintptr_t)15);
}

extern "C" int qd_cuda_flash_fits(int N, int D, int H, int KV, int Tm)
{
    return flash_env() && (D == 64 || D == 128) && KV > 0 && H % KV == 0 && Tm >= 1 &&
           flash_floats(N, H, KV, D, 1) <= (size_t)N * H * Tm;
}

/* The BF16 copies in the scratch past its first up64(N H) floats. */
static qd_status to_bf16(bf16 **dst, float **at, const float *src, size_t n)
{
    *dst = reinterpret_cast<bf16 *>(*at);
    *at += up64(n / 2 + 1);
    if (n == 0)
        return QD_OK;
    int vec = n % 4 == 0 && qd_aligned(src, 16) && qd_aligned(*dst, 8);
    size_t work = vec ? n / 4 : n;
    unsigned blocks = (unsigned)((work + 255) / 256);
    if (blocks > 4096)
        blocks = 4096;
    qd_launch(flash_bf16_kernel, blocks, 256, 0, *dst, src, (int64_t)n, vec);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

static size_t fwd_smem(int D) { return sizeof(bf16) * (FL_M + 4 * FL_N) * (size_t)(D + 8); }
static size_t dq_smem(int D) { return sizeof(bf16) * (2 * FL_M + 4 * FL_N) * (size_t)(D + 8); }
static size_t dkv_smem(int D)
{
    return sizeof(bf16) * (2 * FL_M + 4 * FL_QB) * (size_t)(D + 8) + sizeof(float) * 4 * FL_QB;
}

/* The wgmma kernels' shared memory: the 1,024-byte alignment, then the tiles */
static size_t fwd_wg_smem(int D) { return 1024 + 2 * (size_t)D * (FW_ROWS + 4 * FW_STEP); }
static size_t dq_wg_smem(int D) { return 1024 + 2 * (size_t)D * (2 * FW_ROWS + 4 * FW_STEP); }
static size_t dkv_wg_smem(int D) { return dq_wg_smem(D) + sizeof(float) * 4 * FW_STEP; }

typedef void (*fl_fwd_fn)(float *, float *, const bf16 *, const bf16 *, const bf16 *, const fl_tile *, int, int,
                          float);
typedef void (*fl_dkv_fn)(float *, float *, const bf16 *, const bf16 *, const bf16 *, const bf16 *, const float *,
                          const float *, const fl_tile *, int, int, float, float, int);
typedef void (*fl_dq_fn)(float *, const bf16 *, const bf16 *, const bf16 *, const bf16 *, const float *,
                         const float *, const fl_tile *, int, int, float, float, int);

/* The forward on the wgmma kernels (wg) or the mma.sync ones; the tiles of
 * FW_ROWS or FL_M rows (fl_tiles) */
template <int D>
static qd_status fwd_launch(float *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, const fl_tile *tl,
                            int nt, int H, int KV, int wg)
{
    fl_fwd_fn f = wg ? flash_fwd_wg<D> : flash_fwd_kernel<D>;
    size_t sm = wg ? fwd_wg_smem(D) : fwd_smem(D);
    QD_CUDA_CHECK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    float c2 = qd_attn_scale(D) * 1.4426950408889634f;
    qd_launch(f, dim3((unsigned)nt, (unsigned)H), wg ? FW_THREADS : FL_THREADS, sm, out, lse, q, k, v, tl, H, KV, c2);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

template <int D>
static qd_status bwd_launch(float *dq, float *dk, float *dv, const float *delta, const bf16 *dout, const float *lse,
                            const bf16 *q, const bf16 *k, const bf16 *v, const fl_tile *tl, int nt, int H, int KV,
                            int wg, int add)
{
    float scale = qd_attn_scale(D), c2 = scale * 1.4426950408889634f;
    fl_dkv_fn fkv = wg ? flash_dkv_wg<D> : flash_dkv_kernel<D>;
    fl_dq_fn fq = wg ? flash_dq_wg<D> : flash_dq_kernel<D>;
    size_t s1 = wg ? dkv_wg_smem(D) : dkv_smem(D), s2 = wg ? dq_wg_smem(D) : dq_smem(D);
    unsigned th = wg ? FW_THREADS : FL_THREADS;
    QD_CUDA_CHECK(cudaFuncSetAttribute(fkv, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s1));
    QD_CUDA_CHECK(cudaFuncSetAttribute(fq, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s2));
    qd_launch(fkv, dim3((unsigned)nt, (unsigned)KV), th, s1, dk, dv, q, k, v, dout, lse, delta, tl, H, KV, c2, scale,
              add);
    QD_CUDA_CHECK(cudaGetLastError());
    qd_launch(fq, dim3((unsigned)nt, (unsigned)H), th, s2, dq, q, k, v, dout, lse, delta, tl, H, KV, c2, scale, add);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

static qd_status shape_check(const char *fn, const int32_t *seq_off, int nseq, int N, int H, int KV, int D, int Tm)
{
    if (!qd_cuda_flash_fits(N, D, H, KV, Tm) || nseq < 0 || seq_off[0] != 0 || seq_off[nseq] != N)
        return qd_error(QD_ERR_SHAPE, "%s: %d sequences over %d rows, %d / %d heads of %d, Tm %d", fn, nseq, N, H, KV,
                        D, Tm);
    for (int b = 0; b < nseq; b++)
        if (seq_off[b + 1] < seq_off[b])
            return qd_error(QD_ERR_SHAPE, "%s: sequence %d ends before it starts", fn, b);
    return QD_OK;
}

extern "C" qd_status qd_cuda_flash_attend(float *out, float *att, const float *q, const float *k, const float *v,
                                          const int32_t *seq_off, int nseq, int N, int H, int KV, int D, int Tm)
{
    QD_TRY(shape_check("qd_cuda_flash_attend", seq_off, nseq, N, H, KV, D, Tm));
    const fl_tile *tl;
    int nt, wg = flash_wg();
    QD_TRY(fl_tiles(seq_off, nseq, wg ? FW_ROWS : FL_M, &tl, &nt));
    if (nt == 0)
        return QD_OK;
    float *at = copies_at(att, N, H);
    bf16 *q16, *k16, *v16;
    QD_TRY(to_bf16(&q16, &at, q, (size_t)N * H * D));
    QD_TRY(to_bf16(&k16, &at, k, (size_t)N * KV * D));
    QD_TRY(to_bf16(&v16, &at, v, (size_t)N * KV * D));
    return D == 64 ? fwd_launch<64>(out, att, q16, k16, v16, tl, nt, H, KV, wg)
                   : fwd_launch<128>(out, att, q16, k16, v16, tl, nt, H, KV, wg);
}

extern "C" qd_status qd_cuda_flash_attend_backward(float *dq, float *dk, float *dv, float *ds, const float *dout,
                                                   const float *out, const float *att, const float *q,
                                                   const float *k, const float *v, const int32_t *seq_off, int nseq,
                                                   int N, int H, int KV, int D, int Tm, int set)
{
    QD_TRY(shape_check("qd_cuda_flash_attend_backward", seq_off, nseq, N, H, KV, D, Tm));
    if (!out)
        return qd_error(QD_ERR_ARG, "qd_cuda_flash_attend_backward: the forward's output is needed");
    const fl_tile *tl;
    int nt, wg = flash_wg();
    QD_TRY(fl_tiles(seq_off, nseq, wg ? FW_ROWS : FL_M, &tl, &nt));
    if (nt == 0)
        return QD_OK;
    int64_t rows = (int64_t)N * H;
    qd_launch(flash_delta_kernel, (unsigned)((rows * 32 + 255) / 256), 256, 0, ds, dout, out, rows, D);
    QD_CUDA_CHECK(cudaGetLastError());
    float *at = copies_at(ds, N, H);
    bf16 *q16, *k16, *v16, *d16;
    QD_TRY(to_bf16(&q16, &at, q, (size_t)N * H * D));
    QD_TRY(to_bf16(&k16, &at, k, (size_t)N * KV * D));
    QD_TRY(to_bf16(&v16, &at, v, (size_t)N * KV * D));
    QD_TRY(to_bf16(&d16, &at, dout, (size_t)N * H * D));
    return D == 64 ? bwd_launch<64>(dq, dk, dv, ds, d16, att, q16, k16, v16, tl, nt, H, KV, wg, !set)
                   : bwd_launch<128>(dq, dk, dv, ds, d16, att, q16, k16, v16, tl, nt, H, KV, wg, !set);
}
