/* NVFP4/FP8 quantization, fake-quant, RAC augmentation and the canonical W4A4
 * product on CUDA (docs/numerics.md §1-§5). The scalar arithmetic is
 * quant/numerics.h's, called from device code, so each output equals the CPU
 * reference's bit for bit; only the parallel layout differs from quant/. */
#include <cuda_runtime.h>
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>
#include "backends/cuda/cuda_quant.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_mma.h"
#include "backends/cuda/cuda_wgmma.h"
#include "backends/cuda/cuda_rows.cuh"
#include "backends/cuda/cuda_kernels.h"

/* The hardware E2M1 encoder (cvt.rn.satfinite.e2m1x2.f32) exists on the Blackwell
 * arch-specific targets only. Selected at compile time; it cannot run on the
 * H200 (Hopper, sm_90a), where the software encoder of quant/numerics.h is used. */
#if defined(__CUDA_ARCH__) &&                                                        \
    (defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM101_ALL) ||   \
     defined(__CUDA_ARCH_FEAT_SM103_ALL) || defined(__CUDA_ARCH_FEAT_SM110_ALL) ||   \
     defined(__CUDA_ARCH_FEAT_SM120_ALL) || defined(__CUDA_ARCH_FEAT_SM121_ALL))
#define QD_CUDA_E2M1_CVT 1
#else
#define QD_CUDA_E2M1_CVT 0
#endif

#define QD_THREADS 256
#define QD_GEMV_THREADS 64

/* cuda_check.h's step-graph state (here: every CUDA program links this file) */
unsigned long qd_cuda_buf_gen;
const char *qd_cuda_refused;

/* Set by any kernel that met a NaN/Inf input; read and cleared by qd_cuda_nonfinite_check. */
__device__ int qd_cuda_nonfinite;

/* ---- loads of one 16-element block (16-byte aligned) as float */
static __device__ __forceinline__ void load_block(float v[16], const float *x)
{
    const float4 *p = (const float4 *)x;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float4 f = p[i];
        v[4 * i] = f.x; v[4 * i + 1] = f.y; v[4 * i + 2] = f.z; v[4 * i + 3] = f.w;
    }
}

static __device__ __forceinline__ void load_block(float v[16], const uint16_t *x)
{
    const uint4 *p = (const uint4 *)x;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        uint4 u = p[i];
        uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            v[8 * i + 2 * j] = qd_bf16_to_f32((uint16_t)(w[j] & 0xffffu));
            v[8 * i + 2 * j + 1] = qd_bf16_to_f32((uint16_t)(w[j] >> 16));
        }
    }
}

/* 1 if any of the 16 values is NaN or Inf. */
static __device__ __forceinline__ int block_nonfinite(const float v[16])
{
    int bad = 0;
#pragma unroll
    for (int i = 0; i < 16; i++)
        bad |= !(fabsf(v[i]) <= FLT_MAX);
    return bad;
}

static __device__ __forceinline__ float block_amax(const float v[16])
{
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; i++)
        m = fmaxf(m, fabsf(v[i]));
    return m;
}

#if QD_CUDA_E2M1_CVT
/* Two E2M1 codes, lo in the low nibble: round to nearest even, saturating to 6,
 * the sign kept for values that round to zero: the contract of qd_e2m1_from_f32. */
static __device__ __forceinline__ uint8_t e2m1x2(float lo, float hi)
{
    uint16_t r;
    asm("{\n\t.reg .b8 t;\n\tcvt.rn.satfinite.e2m1x2.f32 t, %2, %1;\n\tcvt.u16.u8 %0, t;\n\t}"
        : "=h"(r) : "f"(lo), "f"(hi));
    return (uint8_t)r;
}
#endif

/* quant/numerics.h's qd_nvfp4_quantize_block, with the hardware encoder where there is one. */
static __device__ __forceinline__ uint8_t quantize_block(uint8_t packed[8], const float v[16],
                                                         float s_enc, float s_dec)
{
#if QD_CUDA_E2M1_CVT
    uint8_t sc = qd_nvfp4_block_scale(block_amax(v), s_enc);
    float inv = qd_nvfp4_block_inv(sc, s_dec);
#pragma unroll
    for (int i = 0; i < 8; i++)
        packed[i] = e2m1x2(v[2 * i] * inv, v[2 * i + 1] * inv);
    return sc;
#else
    return qd_nvfp4_quantize_block(packed, v, s_enc, s_dec);
#endif
}

/* Where a quantizer writes: codes and scales with their row strides in bytes. */
struct qout {
    uint8_t *codes, *scales;
    int64_t codes_ld, scales_ld;
};

/* Writes one quantized block b of row r: packed codes, or (dq) 16 dequantized floats. */
static __device__ __forceinline__ void store_block(qout o, float *dq, const float v[16], int64_t r,
                                                   int64_t b, int64_t blk, float s_enc, float s_dec)
{
    uint8_t p[8];
    uint8_t sc = quantize_block(p, v, s_enc, s_dec);
    if (dq) {
        float4 *d = (float4 *)(dq + blk * 16);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float f[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int e = 4 * i + j;
                uint8_t c = (uint8_t)((e & 1) ? p[e / 2] >> 4 : p[e / 2] & 0xfu);
                f[j] = qd_nvfp4_dequant1(c, sc, s_dec);
            }
            d[i] = make_float4(f[0], f[1], f[2], f[3]);
        }
        return;
    }
    uint2 w;
    w.x = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    w.y = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
    *(uint2 *)(o.codes + r * o.codes_ld + b * 8) = w;
    o.scales[r * o.scales_ld + b] = sc;
}

static __device__ __forceinline__ float warp_max(float m)
{
#pragma unroll
    for (int d = 16; d > 0; d >>= 1)
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
    return m;
}

/* Max over the CTA (blockDim.x a multiple of 32); every thread gets it. */
static __device__ float cta_max(float m)
{
    __shared__ float part[32];
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = m;
    __syncthreads();
    /* every warp reduces the partial maxima, so every thread ends with the CTA's */
    m = (threadIdx.x & 31) < (blockDim.x >> 5) ? part[threadIdx.x & 31] : 0.0f;
    m = warp_max(m);
    __syncthreads();
    return m;
}

/* ---- kernels */

/* *amax_bits = bits of max |x| over nblk blocks of 16 (non-negative floats order
 * as their bits, so atomicMax on the bits is the float max, in any order). */
template <typename T>
__global__ void amax_kernel(uint32_t *amax_bits, const T *x, int64_t nblk)
{
    QD_PDL_ENTRY();
    float m = 0.0f;
    int bad = 0;
    for (int64_t blk = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; blk < nblk;
         blk += (int64_t)gridDim.x * blockDim.x) {
        float v[16];
        load_block(v, x + blk * 16);
        bad |= block_nonfinite(v);
        m = fmaxf(m, block_amax(v));
    }
    if (bad)
        qd_cuda_nonfinite = 1;
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0)
        atomicMax(amax_bits, __float_as_uint(m));
}

/* Blocks of x (rows, bpr*16), one per thread. The scope's S_enc comes from a
 * per-tensor amax (amax_bits) or from s_enc_in, one per row (per_row) or one. */
template <typename T>
__global__ void quant_flat_kernel(qout o, float *dq, const T *x, int64_t rows, int64_t bpr,
                                  const uint32_t *amax_bits, const float *s_enc_in, int per_row,
                                  float *s_dec_out)
{
    QD_PDL_ENTRY();
    float s_enc = amax_bits ? qd_nvfp4_s_enc(__uint_as_float(*amax_bits)) : s_enc_in[0];
    float s_dec = qd_nvfp4_s_dec(s_enc);
    int bad = 0;
    int64_t nblk = rows * bpr;
    /* row and block of blk only where needed: 64-bit division is slow on the GPU */
    int dense = !per_row && o.codes_ld == bpr * 8 && o.scales_ld == bpr;
    for (int64_t blk = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; blk < nblk;
         blk += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = 0, b = blk;
        if (per_row || (!dense && !dq)) {
            r = blk / bpr;
            b = blk - r * bpr;
        }
        if (per_row) {
            s_enc = s_enc_in[r];
            s_dec = qd_nvfp4_s_dec(s_enc);
            if (s_dec_out && b == 0)
                s_dec_out[r] = s_dec;
        }
        float v[16];
        load_block(v, x + blk * 16);
        bad |= block_nonfinite(v);
        store_block(o, dq, v, r, b, blk, s_enc, s_dec);
    }
    if (bad)
        qd_cuda_nonfinite = 1;
    if (!per_row && s_dec_out && blockIdx.x == 0 && threadIdx.x == 0)
        s_dec_out[0] = s_dec;
}

/* One CTA a row of x (rows, bpr*16): the row's amax (§4), then its blocks. */
template <typename T>
__global__ void quant_rows_kernel(qout o, float *dq, const T *x, int64_t bpr, float *s_dec_out,
                                  float *s_enc_out)
{
    QD_PDL_ENTRY();
    int64_t r = blockIdx.x;
    const T *xr = x + r * bpr * 16;
    float m = 0.0f;
    int bad = 0;
    for (int64_t b = threadIdx.x; b < bpr; b += blockDim.x) {
        float v[16];
        load_block(v, xr + b * 16);
        bad |= block_nonfinite(v);
        m = fmaxf(m, block_amax(v));
    }
    if (bad)
        qd_cuda_nonfinite = 1;
    float s_enc = qd_nvfp4_s_enc(cta_max(m));
    float s_dec = qd_nvfp4_s_dec(s_enc);
    if (threadIdx.x == 0) {
        if (s_dec_out)
            s_dec_out[r] = s_dec;
        if (s_enc_out)
            s_enc_out[r] = s_enc;
    }
    for (int64_t b = threadIdx.x; b < bpr; b += blockDim.x) {
        float v[16];
        load_block(v, xr + b * 16);
        store_block(o, dq, v, r, b, r * bpr + b, s_enc, s_dec);
    }
}

/* ---- The quantizer kernels (issue 13). The same bits as the kernels above (the
 * encoders of quant/numerics.h's branch-free section, equal to the canonical ones
 * on every input), laid out for bandwidth: 16-byte loads, the loads of several
 * blocks in flight before any arithmetic, a block scale per 16 values and a
 * handful of integer and float operations per value, the amax by NaN-propagating
 * max (so the finiteness test is one compare per block). qd_cuda_quant_legacy = 1
 * (benchmarks only) selects the kernels above, for the side-by-side table. */

/* max(m, |v|), NaN if either is NaN (PTX max.NaN, sm_80 and later). */
static __device__ __forceinline__ float absmax_nan(float m, float v)
{
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(m), "f"(fabsf(v)));
    return r;
}

/* One NVFP4 block as loaded: 16 float32, or 16 BF16 in 8 words (element 2i in
 * the low half of word i). */
template <typename T> struct qblock;

template <> struct qblock<float> {
    float4 d[4];
    __device__ __forceinline__ void load(const float *p)
    {
        const float4 *q = (const float4 *)p;
#pragma unroll
        for (int i = 0; i < 4; i++)
            d[i] = q[i];
    }
    __device__ __forceinline__ float at(int i) const
    {
        const float4 &f = d[i / 4];
        return (i & 3) == 0 ? f.x : (i & 3) == 1 ? f.y : (i & 3) == 2 ? f.z : f.w;
    }
    /* max |v|; NaN when any value is NaN, Inf when any is infinite */
    __device__ __forceinline__ float amax() const
    {
        float m = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; i++)
            m = absmax_nan(m, at(i));
        return m;
    }
};

template <> struct qblock<uint16_t> {
    uint4 d[2];
    __device__ __forceinline__ void load(const uint16_t *p)
    {
        const uint4 *q = (const uint4 *)p;
        d[0] = q[0];
        d[1] = q[1];
    }
    __device__ __forceinline__ uint32_t word(int i) const
    {
        const uint4 &u = d[i / 4];
        return (i & 3) == 0 ? u.x : (i & 3) == 1 ? u.y : (i & 3) == 2 ? u.z : u.w;
    }
    __device__ __forceinline__ float at(int i) const
    {
        uint32_t w = word(i / 2);
        return __uint_as_float((i & 1) ? w & 0xffff0000u : w << 16);
    }
    /* max |v| on the BF16 bits, two at a time (non-negative patterns order as
     * their values; NaN and Inf patterns order above every finite one) */
    __device__ __forceinline__ float amax() const
    {
        uint32_t m = 0;
#pragma unroll
        for (int i = 0; i < 8; i++)
            m = __vmaxu2(m, word(i) & 0x7fff7fffu);
        m = max(m & 0xffffu, m >> 16);
        return m > 0x7f80u ? __uint_as_float(0x7fc00000u) : __uint_as_float(m << 16);
    }
};

/* The sign bits of 8 values given as the top halves of 4 words (value 2j in the
 * low half of word j, 2j+1 in the high half, as BF16 pairs are) at bit 4i + 3,
 * the sign bit of an E2M1 code in nibble i: byte permutes that replicate a
 * byte's sign bit over the byte, then two masks. */
static __device__ __forceinline__ uint32_t sign_nibbles(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3)
{
    uint32_t a, b, even, odd;
    /* a = [s0, s2, s1, s3], b = [s4, s6, s5, s7], each byte 0x00 or 0xff */
    asm("prmt.b32 %0, %1, %2, 0xfbd9;" : "=r"(a) : "r"(w0), "r"(w1));
    asm("prmt.b32 %0, %1, %2, 0xfbd9;" : "=r"(b) : "r"(w2), "r"(w3));
    asm("prmt.b32 %0, %1, %2, 0x5410;" : "=r"(even) : "r"(a), "r"(b));
    asm("prmt.b32 %0, %1, %2, 0x7632;" : "=r"(odd) : "r"(a), "r"(b));
    return (even & 0x08080808u) | (odd & 0x80808080u);
}

/* The top halves of values 8h+2j and 8h+2j+1 in one word (the BF16 words as they are). */
static __device__ __forceinline__ uint32_t top_halves(const qblock<float> &v, int h, int j)
{
    uint32_t r;
    asm("prmt.b32 %0, %1, %2, 0x7632;" : "=r"(r)
        : "r"(__float_as_uint(v.at(8 * h + 2 * j))), "r"(__float_as_uint(v.at(8 * h + 2 * j + 1))));
    return r;
}

static __device__ __forceinline__ uint32_t top_halves(const qblock<uint16_t> &v, int h, int j)
{
    return v.word(4 * h + j);
}

/* Eight E2M1 codes, value i in nibble i, of x_i * inv for the values 8h..8h+7:
 * the index of qd_e2m1_index_rn summed into its nibble straight from the parts
 * (mod 2^32, the bias once a word), and the sign bits of x (inv > 0). */
template <typename T>
static __device__ __forceinline__ uint32_t e2m1x8(const qblock<T> &v, int h, float inv)
{
    uint32_t w = 0u - QD_E2M1_RN_BIAS * 0x11111111u;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        uint32_t e, t;
        qd_e2m1_rn_parts(v.at(8 * h + i) * inv, &e, &t);
        w += t * (1u << (4 * i)) + e * ((2u - (1u << 23)) << (4 * i));
    }
    return w | sign_nibbles(top_halves(v, h, 0), top_halves(v, h, 1), top_halves(v, h, 2),
                            top_halves(v, h, 3));
}

/* Quantizes one block (amax_b its max |x|, k = S_enc/6) and writes it: 8 bytes of
 * codes and the scale at (codes, scale), or (dq) the 16 values
 * (e2m1 * s_b) * S_dec, the E2M1 value being (a + M) - M of the rounding. */
template <typename T>
static __device__ __forceinline__ void qk_store(uint8_t *codes, uint8_t *scale, float *dq,
                                                const qblock<T> &v, float amax_b, float k, float s_dec,
                                                uint16_t *bits = NULL)
{
    float sb;
    uint8_t sc = qd_e4m3_scale_rn(fminf(amax_b * k, QD_E4M3_MAX), &sb);
    float inv = fminf(1.0f / (sb * s_dec), FLT_MAX);
    if (dq) {
        float4 *d = (float4 *)dq;
        uint32_t b[8];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float f[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float x = v.at(4 * i + j);
                uint32_t e, t;
                qd_e2m1_rn_parts(x * inv, &e, &t);
                float r = __uint_as_float(t) - __uint_as_float((e + 22u) << 23);
                float p = copysignf(r, x) * sb; /* E2M1 x E4M3: at most 6 significant bits, exact */
                f[j] = p * s_dec;
                /* the BF16 bits of dq / S_dec (k_bf16_bits_div's, AQAT16's E2M1 x E4M3 part):
                 * a normal dq is p (1 + d), |d| < 2^-23, whose BF16 rounding is p itself (p
                 * has 6 bits, BF16 8); a subnormal dq (or S_dec 0) takes the division */
                uint32_t h = s_dec == 0.0f ? 0u
                           : fabsf(f[j]) < FLT_MIN && f[j] != 0.0f ? (uint32_t)qd_bf16_from_f32(f[j] / s_dec)
                                                                  : __float_as_uint(p) >> 16;
                b[(4 * i + j) / 2] = (j & 1) ? b[(4 * i + j) / 2] | h << 16 : h;
            }
            d[i] = make_float4(f[0], f[1], f[2], f[3]);
        }
        if (bits) { /* 32 bytes a block (the caller gives 16-byte aligned rows) */
            ((uint4 *)bits)[0] = make_uint4(b[0], b[1], b[2], b[3]);
            ((uint4 *)bits)[1] = make_uint4(b[4], b[5], b[6], b[7]);
        }
        return;
    }
    *(uint2 *)codes = make_uint2(e2m1x8(v, 0, inv), e2m1x8(v, 1, inv));
    *scale = sc;
}

/* Max over the CTA of non-negative floats, NaN kept; every thread gets it. */
static __device__ float cta_absmax_nan(float m)
{
    __shared__ float part[32];
#pragma unroll
    for (int d = 16; d > 0; d >>= 1)
        m = absmax_nan(m, __shfl_xor_sync(0xffffffffu, m, d));
    if (blockDim.x == 32)
        return m;
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = m;
    __syncthreads();
    m = (threadIdx.x & 31) < (blockDim.x >> 5) ? part[threadIdx.x & 31] : 0.0f;
#pragma unroll
    for (int d = 16; d > 0; d >>= 1)
        m = absmax_nan(m, __shfl_xor_sync(0xffffffffu, m, d));
    __syncthreads();
    return m;
}

/* The per-tensor amax: CTAs fold their maxima into `bits` and count themselves
 * in `done`; the last one publishes the total in `amax` and zeroes the other
 * two, so no memset precedes the next tensor's amax, and `amax` stays readable
 * until then (RAC's residual blocks reuse the main blocks' scale). */
struct qk_amax {
    uint32_t bits, done, amax;
};

/* Running max |x| of 16-byte vectors: 4 float32 (max.NaN), or 8 BF16 patterns
 * two at a time (__vmaxu2 on the magnitudes; NaN and Inf patterns order above
 * every finite one). value() is NaN or Inf when x held either. */
template <typename T> struct qk_vmax;

template <> struct qk_vmax<float> {
    float m = 0.0f;
    __device__ __forceinline__ void add(uint4 u)
    {
        m = absmax_nan(absmax_nan(absmax_nan(absmax_nan(m, __uint_as_float(u.x)), __uint_as_float(u.y)),
                                  __uint_as_float(u.z)), __uint_as_float(u.w));
    }
    __device__ __forceinline__ float value() const { return m; }
};

template <> struct qk_vmax<uint16_t> {
    uint32_t m = 0;
    __device__ __forceinline__ void add(uint4 u)
    {
        m = __vmaxu2(__vmaxu2(m, u.x & 0x7fff7fffu), __vmaxu2(u.y & 0x7fff7fffu, u.z & 0x7fff7fffu));
        m = __vmaxu2(m, u.w & 0x7fff7fffu);
    }
    __device__ __forceinline__ float value() const
    {
        uint32_t h = max(m & 0xffffu, m >> 16);
        return h > 0x7f80u ? __uint_as_float(0x7fc00000u) : __uint_as_float(h << 16);
    }
};

#define QK_AMAX_VEC 4 /* 16-byte loads a thread has in flight */

/* a->amax = bits of max |x| over n values (n a multiple of 8), one atomicMax a
 * CTA; non-negative floats order as their bits. */
template <typename T>
static __device__ __forceinline__ void qk_amax_body(qk_amax *a, const T *x, int64_t n)
{
    const uint4 *xv = (const uint4 *)x;
    int64_t nv = n / (16 / sizeof(T)), step = (int64_t)gridDim.x * blockDim.x * QK_AMAX_VEC;
    qk_vmax<T> acc;
    for (int64_t i0 = (int64_t)blockIdx.x * blockDim.x * QK_AMAX_VEC + threadIdx.x; i0 < nv; i0 += step) {
        uint4 u[QK_AMAX_VEC];
#pragma unroll
        for (int j = 0; j < QK_AMAX_VEC; j++)
            u[j] = i0 + j * blockDim.x < nv ? xv[i0 + j * blockDim.x] : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < QK_AMAX_VEC; j++)
            acc.add(u[j]);
    }
    float m = cta_absmax_nan(acc.value());
    if (threadIdx.x == 0) {
        if (!(m <= FLT_MAX))
            qd_cuda_nonfinite = 1;
        atomicMax(&a->bits, __float_as_uint(m));
        __threadfence();
        if (atomicAdd(&a->done, 1u) == gridDim.x - 1) {
            a->amax = atomicExch(&a->bits, 0u);
            a->done = 0;
        }
    }
}

template <typename T>
__global__ void __launch_bounds__(QD_THREADS) qk_amax_kernel(qk_amax *a, const T *x, int64_t n)
{
    QD_PDL_ENTRY();
    qk_amax_body(a, x, n);
}

/* Tensors a grouped weight quantize takes in one launch: their pointers ride
 * in the kernel's parameters (under the 4 KB every CUDA version passes). */
#define QK_GROUP 64

/* Tensor i of a group: x (N, K), codes and scales (N, K + n) dense, S_dec,
 * and n RAC channels (NULL when n = 0). */
struct qk_wgroup {
    const float *x[QK_GROUP];
    uint8_t *codes[QK_GROUP], *scales[QK_GROUP];
    float *s_dec[QK_GROUP];
    const int64_t *ch[QK_GROUP];
};

/* Tensor i of a grouped fake-quant: x, its dequantized output dq, and where
 * its S_dec goes (NULL: nowhere). */
struct qk_fqgroup {
    const float *x[QK_GROUP];
    float *dq[QK_GROUP];
    float *s_dec[QK_GROUP];
    uint16_t *bits[QK_GROUP]; /* NULL, or the BF16 bits of dq / S_dec too */
};

/* a[y] = the amax of tensor y (blockIdx.y) of the group, n values each, over
 * gridDim.x CTAs a tensor. */
__global__ void __launch_bounds__(QD_THREADS) qk_amax_group_kernel(qk_amax *a, const __grid_constant__ qk_wgroup g,
                                                                   int64_t n)
{
    QD_PDL_ENTRY();
    qk_amax_body(a + blockIdx.y, g.x[blockIdx.y], n);
}

/* Where a quantizer's S_enc comes from: the published per-tensor amax, or s_enc
 * (per row, or one), or (neither) each row's own amax. */
struct qk_scope {
    const uint32_t *amax;
    const float *s_enc;
    int per_row;
};

#define QK_FLAT_UNROLL 2 /* blocks a thread has in flight in the flat kernel */

/* Blocks of a dense x (nblk blocks) under one S_enc (sc.amax or sc.s_enc[0]):
 * codes and scales dense, or dq; s_dec_out[0] = S_dec. */
template <typename T>
static __device__ __forceinline__ void qk_flat_body(uint8_t *codes, uint8_t *scales, float *dq, const T *x,
                                                    int64_t nblk, float s_enc, float *s_dec_out,
                                                    uint16_t *bits = NULL)
{
    float s_dec = qd_nvfp4_s_dec(s_enc), k = s_enc * (1.0f / 6.0f), all = 0.0f;
    int64_t step = (int64_t)gridDim.x * blockDim.x * QK_FLAT_UNROLL;
    for (int64_t b0 = (int64_t)blockIdx.x * blockDim.x * QK_FLAT_UNROLL + threadIdx.x; b0 < nblk; b0 += step) {
        qblock<T> v[QK_FLAT_UNROLL];
#pragma unroll
        for (int u = 0; u < QK_FLAT_UNROLL; u++)
            if (b0 + u * blockDim.x < nblk)
                v[u].load(x + (b0 + u * blockDim.x) * 16);
#pragma unroll
        for (int u = 0; u < QK_FLAT_UNROLL; u++) {
            int64_t blk = b0 + u * blockDim.x;
            if (blk < nblk) {
                float m = v[u].amax();
                all = absmax_nan(all, m);
                qk_store(codes + blk * 8, scales + blk, dq ? dq + blk * 16 : NULL, v[u], m, k, s_dec,
                         bits ? bits + blk * 16 : NULL);
            }
        }
    }
    if (!(all <= FLT_MAX))
        qd_cuda_nonfinite = 1;
    if (s_dec_out && blockIdx.x == 0 && threadIdx.x == 0)
        s_dec_out[0] = s_dec;
}

template <typename T>
__global__ void __launch_bounds__(QD_THREADS) qk_flat_kernel(uint8_t *codes, uint8_t *scales, float *dq,
                                                             const T *x, int64_t nblk, qk_scope sc,
                                                             float *s_dec_out)
{
    QD_PDL_ENTRY();
    float s_enc = sc.amax ? qd_nvfp4_s_enc(__uint_as_float(*sc.amax)) : sc.s_enc[0];
    qk_flat_body(codes, scales, dq, x, nblk, s_enc, s_dec_out);
}

/* Tensor y (blockIdx.y) of the group, n = 0: qk_flat_kernel's blocks under
 * the tensor's amax a[y]. */
__global__ void __launch_bounds__(QD_THREADS) qk_flat_group_kernel(const qk_amax *a,
                                                                   const __grid_constant__ qk_wgroup g,
                                                                   int64_t nblk)
{
    QD_PDL_ENTRY();
    int y = blockIdx.y;
    qk_flat_body(g.codes[y], g.scales[y], (float *)NULL, g.x[y], nblk,
                 qd_nvfp4_s_enc(__uint_as_float(a[y].amax)), g.s_dec[y]);
}

/* Tensor y of a grouped fake-quant: qk_flat_kernel's dequantized blocks under
 * the tensor's amax a[y]. */
__global__ void __launch_bounds__(QD_THREADS) qk_fq_amax_group_kernel(qk_amax *a,
                                                                      const __grid_constant__ qk_fqgroup g,
                                                                      int64_t n)
{
    QD_PDL_ENTRY();
    qk_amax_body(a + blockIdx.y, g.x[blockIdx.y], n);
}

__global__ void __launch_bounds__(QD_THREADS) qk_fq_group_kernel(const qk_amax *a,
                                                                 const __grid_constant__ qk_fqgroup g, int64_t nblk)
{
    QD_PDL_ENTRY();
    int y = blockIdx.y;
    qk_flat_body((uint8_t *)NULL, (uint8_t *)NULL, g.dq[y], g.x[y], nblk,
                 qd_nvfp4_s_enc(__uint_as_float(a[y].amax)), g.s_dec[y], g.bits[y]);
}

/* Stride of a warp's staging tile in qk_rac_group_kernel: a block's 16 values
 * 34 floats apart, so the half-warps' stores (two blocks) and the reads (a
 * value of 32 blocks) fall in distinct banks. */
#define QK_GATHER_STRIDE 34

/* Tensor y of the group with n RAC channels: the blocks of [W, W[:, ch]]
 * (bpr = (K + n) / 16 blocks a row, kb = K / 16 of them W's own), under W's
 * amax a[y] (the copies never raise it), the bits of quantizing the gathered
 * matrix with the flat kernel (qd_cuda_rac_augment_weight). W's own blocks a
 * thread each; the copied ones 32 a warp: each of 16 rounds reads 32
 * channels of two blocks (ascending in a row, so a few cache lines, and 32
 * consecutive channel indices) into a shared tile, from which each lane takes
 * its block's 16 values (a per-thread gather would touch 32 lines per load). */
__global__ void __launch_bounds__(QD_THREADS) qk_rac_group_kernel(const qk_amax *a,
                                                                  const __grid_constant__ qk_wgroup g,
                                                                  uint32_t N, uint32_t K, uint32_t bpr)
{
    QD_PDL_ENTRY();
    __shared__ float tile[QD_THREADS / 32][16 * QK_GATHER_STRIDE];
    int y = blockIdx.y;
    const float *x = g.x[y];
    const int64_t *ch = g.ch[y];
    uint8_t *codes = g.codes[y], *scales = g.scales[y];
    float s_enc = qd_nvfp4_s_enc(__uint_as_float(a[y].amax));
    float s_dec = qd_nvfp4_s_dec(s_enc), k = s_enc * (1.0f / 6.0f);
    uint32_t kb = K / 16, nb = bpr - kb, own = N * kb, copied = N * nb;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < own; i += gridDim.x * blockDim.x) {
        uint32_t r = i / kb, b = i - r * kb;
        qblock<float> v;
        v.load(x + (size_t)r * K + (size_t)b * 16);
        size_t blk = (size_t)r * bpr + b;
        qk_store(codes + blk * 8, scales + blk, (float *)NULL, v, v.amax(), k, s_dec);
    }
    uint32_t lane = threadIdx.x & 31, warps = gridDim.x * (blockDim.x / 32), p = lane & 15;
    float *t = tile[threadIdx.x / 32];
    for (uint32_t c0 = (blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * 32; c0 < copied; c0 += warps * 32) {
        /* copied block c0 + lane: row r, j-th of the row's copies */
        uint32_t r = (c0 + lane) / nb, j = c0 + lane - r * nb;
#pragma unroll 4
        for (uint32_t round = 0; round < 16; round++) {
            uint32_t tb = 2 * round + (lane >> 4); /* this lane reads value p of the chunk's block tb */
            uint32_t rt = __shfl_sync(0xffffffffu, r, tb), jt = __shfl_sync(0xffffffffu, j, tb);
            if (c0 + tb < copied)
                t[p * QK_GATHER_STRIDE + tb] = x[(size_t)rt * K + (size_t)ch[(size_t)jt * 16 + p]];
        }
        __syncwarp();
        if (c0 + lane < copied) {
            qblock<float> v;
#pragma unroll
            for (int q = 0; q < 4; q++)
                v.d[q] = make_float4(t[(4 * q) * QK_GATHER_STRIDE + lane], t[(4 * q + 1) * QK_GATHER_STRIDE + lane],
                                     t[(4 * q + 2) * QK_GATHER_STRIDE + lane], t[(4 * q + 3) * QK_GATHER_STRIDE + lane]);
            size_t blk = (size_t)r * bpr + kb + j;
            qk_store(codes + blk * 8, scales + blk, (float *)NULL, v, v.amax(), k, s_dec);
        }
        __syncwarp();
    }
    if (blockIdx.x == 0 && threadIdx.x == 0)
        g.s_dec[y][0] = s_dec;
}

#define QK_ROW_BLOCKS 4   /* blocks a thread holds in the row kernel */
#define QK_ROW_THREADS 256

/* One CTA a row of x (rows, bpr*16), its blocks into (o, row r) or dq. With a
 * row scope the row's amax (§4) comes from the blocks held in registers
 * (bpr <= blockDim.x * QK_ROW_BLOCKS; longer rows are read twice). s_dec_out
 * gets S_dec per row (row scopes) or once; s_enc_out, S_enc per row. src >= 0:
 * the values from row src of x instead (k_gather_rows without its copy). */
template <typename T>
static __device__ __forceinline__ void qk_row(qout o, float *dq, const T *x, int64_t r, int64_t bpr, qk_scope sc,
                                              float *s_dec_out, float *s_enc_out, int64_t src = -1)
{
    const T *xr = x + (src >= 0 ? src : r) * bpr * 16;
    uint8_t *cr = o.codes + r * o.codes_ld, *sr = o.scales + r * o.scales_ld;
    float *dr = dq ? dq + r * bpr * 16 : NULL;
    int hold = bpr <= (int64_t)blockDim.x * QK_ROW_BLOCKS, own = !sc.amax && !sc.s_enc;
    qblock<T> v[QK_ROW_BLOCKS];
    float mb[QK_ROW_BLOCKS], m = 0.0f;
    if (hold) {
#pragma unroll
        for (int j = 0; j < QK_ROW_BLOCKS; j++)
            if (threadIdx.x + j * blockDim.x < bpr)
                v[j].load(xr + (threadIdx.x + j * blockDim.x) * 16);
#pragma unroll
        for (int j = 0; j < QK_ROW_BLOCKS; j++) {
            mb[j] = threadIdx.x + j * blockDim.x < bpr ? v[j].amax() : 0.0f;
            m = absmax_nan(m, mb[j]);
        }
    } else {
        for (int64_t b = threadIdx.x; b < bpr; b += blockDim.x) {
            v[0].load(xr + b * 16);
            m = absmax_nan(m, v[0].amax());
        }
    }
    if (!(m <= FLT_MAX))
        qd_cuda_nonfinite = 1;
    float s_enc = sc.amax ? qd_nvfp4_s_enc(__uint_as_float(*sc.amax))
                : sc.s_enc ? sc.s_enc[sc.per_row ? r : 0] : qd_nvfp4_s_enc(cta_absmax_nan(m));
    float s_dec = qd_nvfp4_s_dec(s_enc), k = s_enc * (1.0f / 6.0f);
    if (threadIdx.x == 0) {
        int row_scope = own || (sc.s_enc && sc.per_row);
        if (s_dec_out && (row_scope || r == 0))
            s_dec_out[row_scope ? r : 0] = s_dec;
        if (s_enc_out)
            s_enc_out[r] = s_enc;
    }
    if (hold) {
#pragma unroll
        for (int j = 0; j < QK_ROW_BLOCKS; j++) {
            int64_t b = threadIdx.x + j * blockDim.x;
            if (b < bpr)
                qk_store(cr + b * 8, sr + b, dr ? dr + b * 16 : NULL, v[j], mb[j], k, s_dec);
        }
        return;
    }
    for (int64_t b = threadIdx.x; b < bpr; b += blockDim.x) {
        v[0].load(xr + b * 16);
        qk_store(cr + b * 8, sr + b, dr ? dr + b * 16 : NULL, v[0], v[0].amax(), k, s_dec);
    }
}

template <typename T>
__global__ void __launch_bounds__(QK_ROW_THREADS) qk_rows_kernel(qout o, float *dq, const T *x, int64_t bpr,
                                                                 qk_scope sc, float *s_dec_out,
                                                                 float *s_enc_out)
{
    QD_PDL_ENTRY();
    qk_row<T>(o, dq, x, blockIdx.x, bpr, sc, s_dec_out, s_enc_out);
}

/* The group of row r under the row offsets off (E + 1 ascending): the last e
 * with off[e] <= r (binary search). */
static __device__ __forceinline__ int group_of_row(const int32_t *off, int E, int64_t r)
{
    int lo = 0, hi = E;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (off[mid] <= r)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* RAC's residual (§5) of row r at channel c: x[r, c] minus the dequantization
 * of its main code, already written at o. */
static __device__ __forceinline__ float rac_residual1(qout o, const float *x, int64_t K, int64_t r, int64_t c,
                                                      float s_dec)
{
    uint8_t byte = o.codes[r * o.codes_ld + c / 2];
    uint8_t code = (uint8_t)((c & 1) ? byte >> 4 : byte & 0xfu);
    return x[r * K + c] - qd_nvfp4_dequant1(code, o.scales[r * o.scales_ld + c / 16], s_dec);
}

/* RAC's augmented activation row r (§5) by one CTA: the main blocks as
 * qk_rows_kernel with the row's own scope (S_dec and S_enc out), then the
 * residuals x[ch] - x_hat[ch] of the row's channels (rac_residual_kernel's
 * expression; under off, the row's expert's channels ch[e], else ch1) into
 * res, then their blocks with the row's S_enc: the three launches of
 * rac_main and rac_residual, the same operations. Global writes of the CTA
 * are visible to it after __syncthreads. */
static __device__ __forceinline__ void rac_row(qout o, const float *x, int64_t K, const int64_t *ch1,
                                               const int64_t *const *ch, const int32_t *off, int E, int64_t n,
                                               float *s_dec, float *s_enc, float *res, int64_t r)
{
    qk_scope own = {NULL, NULL, 0};
    qk_row<float>(o, NULL, x, r, K / 16, own, s_dec, s_enc);
    if (n == 0)
        return;
    __syncthreads();
    const int64_t *c = off ? ch[group_of_row(off, E, r)] : ch1;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
        res[r * n + j] = rac_residual1(o, x, K, r, c[j], s_dec[r]);
    __syncthreads();
    qout o2 = o;
    o2.codes += K / 2;
    o2.scales += K / 16;
    qk_scope sc = {NULL, s_enc, 1};
    qk_row<float>(o2, NULL, res, r, n / 16, sc, NULL, NULL);
}

/* RAC's augmented activation rows in one launch, a CTA a row. */
__global__ void __launch_bounds__(QK_ROW_THREADS) rac_rows_kernel(qout o, const float *x, int64_t K,
                                                                  const int64_t *ch1, const int64_t *const *ch,
                                                                  const int32_t *off, int E, int64_t n, float *s_dec,
                                                                  float *s_enc, float *res)
{
    QD_PDL_ENTRY();
    rac_row(o, x, K, ch1, ch, off, E, n, s_dec, s_enc, res, blockIdx.x);
}

/* The augmented rows of several linears of one input (q, k, v; the experts'
 * gate and up), linear blockIdx.y: each CTA quantizes its row's main blocks
 * for its own linear (the same codes for every linear) and then that
 * linear's residuals, so one launch does rac_rows_kernel's work of each. */
typedef struct {
    qout o[QD_CUDA_RAC_MULTI];
    const int64_t *const *ch[QD_CUDA_RAC_MULTI];
    int64_t n[QD_CUDA_RAC_MULTI];
    float *s_dec[QD_CUDA_RAC_MULTI], *s_enc[QD_CUDA_RAC_MULTI], *res[QD_CUDA_RAC_MULTI];
} rac_multi_args;

__global__ void __launch_bounds__(QK_ROW_THREADS) rac_rows_multi_kernel(const __grid_constant__ rac_multi_args m,
                                                                        const float *x, int64_t K,
                                                                        const int32_t *off, int E)
{
    QD_PDL_ENTRY();
    int i = blockIdx.y;
    rac_row(m.o[i], x, K, NULL, m.ch[i], off, E, m.n[i], m.s_dec[i], m.s_enc[i], m.res[i], blockIdx.x);
}

/* out (rows, bpr*16) = dequant(codes, scales); s_dec (rows) or (1). */
__global__ void dequant_kernel(float *out, const uint8_t *codes, const uint8_t *scales,
                               const float *s_dec, int per_row, int64_t rows, int64_t bpr)
{
    QD_PDL_ENTRY();
    int64_t nblk = rows * bpr;
    for (int64_t blk = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; blk < nblk;
         blk += (int64_t)gridDim.x * blockDim.x) {
        float sd = s_dec[per_row ? blk / bpr : 0];
        uint2 c = *(const uint2 *)(codes + blk * 8);
        uint8_t sc = scales[blk];
        uint32_t w[2] = {c.x, c.y};
        float4 *d = (float4 *)(out + blk * 16);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t h = w[i / 2] >> (16 * (i & 1));
            d[i] = make_float4(qd_nvfp4_dequant1((uint8_t)(h & 0xfu), sc, sd),
                               qd_nvfp4_dequant1((uint8_t)((h >> 4) & 0xfu), sc, sd),
                               qd_nvfp4_dequant1((uint8_t)((h >> 8) & 0xfu), sc, sd),
                               qd_nvfp4_dequant1((uint8_t)((h >> 12) & 0xfu), sc, sd));
        }
    }
}

/* One CTA a row of x (rows, cols): q = e4m3(x * scale). */
__global__ void fp8_rows_kernel(uint8_t *q, float *scale_inv, const float *x, int64_t cols)
{
    QD_PDL_ENTRY();
    int64_t r = blockIdx.x;
    const float *xr = x + r * cols;
    float m = 0.0f;
    int bad = 0;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
        float v = xr[i];
        bad |= !(fabsf(v) <= FLT_MAX);
        m = fmaxf(m, fabsf(v));
    }
    if (bad)
        qd_cuda_nonfinite = 1;
    float s = qd_fp8_row_scale(cta_max(m));
    if (threadIdx.x == 0)
        scale_inv[r] = 1.0f / s;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
        q[r * cols + i] = qd_e4m3_from_f32(xr[i] * s);
}

/* RAC residuals (§5): res (rows, n) = x[:, ch] - x_hat[:, ch], x_hat the
 * dequantization of the row's main blocks already written at (codes, scales). */
__global__ void rac_residual_kernel(float *res, const float *x, qout o, const float *s_dec,
                                    int per_row, const int64_t *ch, int64_t rows, int64_t K,
                                    int64_t n)
{
    QD_PDL_ENTRY();
    int64_t total = rows * n;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / n;
        res[i] = rac_residual1(o, x, K, r, ch[i - r * n], s_dec[per_row ? r : 0]);
    }
}

/* The same over the experts of a layer: row r belongs to the expert e with
 * off[e] <= r < off[e+1] (binary search) and takes that expert's channels ch[e]. */
__global__ void rac_residual_grouped_kernel(float *res, const float *x, qout o, const float *s_dec,
                                            const int64_t *const *ch, const int32_t *off, int E, int64_t rows,
                                            int64_t K, int64_t n)
{
    QD_PDL_ENTRY();
    int64_t total = rows * n;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / n;
        res[i] = rac_residual1(o, x, K, r, ch[group_of_row(off, E, r)][i - r * n], s_dec[r]);
    }
}

/* waug (N, K+n) = [W, W[:, ch]]. */
__global__ void rac_gather_kernel(float *waug, const float *w, const int64_t *ch, int64_t N,
                                  int64_t K, int64_t n)
{
    QD_PDL_ENTRY();
    int64_t ld = K + n, total = N * ld;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / ld, c = i - r * ld;
        waug[i] = w[r * K + (c < K ? c : ch[c - K])];
    }
}

/* ---- the canonical W4A4 product (§3) */

/* 4 E2M1 codes (the nibbles of c's low 16 bits) as 4 signed int8 holding twice
 * their values ({0,1,2,3,4,6,8,12} and negatives): integers, so a block's dot
 * product is exact in int32 and equals 4*p of §3. */
static __device__ __forceinline__ int e2m1x4_s8(uint32_t c)
{
    uint32_t idx = c & 0x7777u;
    uint32_t pos = __byte_perm(0x03020100u, 0x0C080604u, idx);
    uint32_t neg = __byte_perm(0xFDFEFF00u, 0xF4F8FAFCu, idx);
    /* the sign bits (3, 7 of byte 0; 3, 7 of byte 1) to the top of bytes 0..3:
     * w holds bytes 0, 0, 1, 1 of c, t keeps bits 3, 15, 19, 31, and t * 17
     * (t + t << 4) has bit 7 = bit 3, 15, 23 = bit 19, 31 as wanted (the one
     * carry, 19 + 19, only reaches bit 20); prmt's sign mode (selector bit 3)
     * then fills each byte with its top bit. 8 instructions, not 14. */
    uint32_t w = __byte_perm(c, 0u, 0x1100u), t = w & 0x80088008u, mask;
    asm("prmt.b32 %0, %1, 0, 0xBA98;" : "=r"(mask) : "r"(t * 17u));
    return (int)((pos & ~mask) | (neg & mask));
}

/* p of §3 for one block: the int8 dot product of 16 (2*E2M1) pairs is 4p, an
 * integer of magnitude <= 2304, accumulated onto the bits of 1.5*2^23 so that the
 * float read back minus 1.5*2^23 is exactly 4p (no int-to-float conversion). */
#define QD_MAGIC_BITS 0x4B400000
#define QD_MAGIC 12582912.0f
static __device__ __forceinline__ float block_dot4(int w0, int w1, int w2, int w3, int4 a)
{
    int p = __dp4a(w0, a.x, QD_MAGIC_BITS);
    p = __dp4a(w1, a.y, p);
    p = __dp4a(w2, a.z, p);
    p = __dp4a(w3, a.w, p);
    return __int_as_float(p) - QD_MAGIC;
}

/* 4 E2M1 codes as 4 unsigned bytes 12 + 2*value, in [0, 24]: two byte permutes
 * whose sign mode zeroes the bytes of the other sign, then one add without carries
 * between bytes. Cheaper than e2m1x4_s8; a block's dot product with it exceeds 4p
 * by 12 * (sum of the activation block), which the caller subtracts. */
/* tab: the permutes' table bytes 0-3, 0x03020100 (e2m1x4_off12), or a
 * register holding it that ptxas cannot prove constant (pair_terms' OC: it
 * otherwise copies the constant into a fresh register for every permute) */
static __device__ __forceinline__ int e2m1x4_off12t(uint32_t c, uint32_t tab)
{
    uint32_t pos, neg;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(pos) : "r"(tab), "r"(0x0C080604u), "r"(c));
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(neg) : "r"(tab), "r"(0x0C080604u), "r"(c ^ 0x8888u));
    return (int)(0x0C0C0C0Cu - neg + pos);
}

static __device__ __forceinline__ int e2m1x4_off12(uint32_t c)
{
    return e2m1x4_off12t(c, 0x03020100u);
}

/* block_dot4 for offset weights: init holds the magic bits minus 12 * sum(a). */
static __device__ __forceinline__ float block_dot4_off(int w0, int w1, int w2, int w3, int4 a,
                                                       int init)
{
    int p = __dp4a(w0, a.x, init);
    p = __dp4a(w1, a.y, p);
    p = __dp4a(w2, a.z, p);
    p = __dp4a(w3, a.w, p);
    return __int_as_float(p) - QD_MAGIC;
}

/* One block b of one weight row against the MT activation rows in shared memory:
 * acc[m] = acc[m] + p*(sa*sw), the product exact (4p an integer below 2^12 times
 * (sa/4)*sw with at most 8 significant bits), so one rounding, as on the CPU. */
template <int MT>
static __device__ __forceinline__ void w4a4_block(float acc[MT], uint32_t lo, uint32_t hi,
                                                  uint8_t sc, int64_t b, const int4 *s_a,
                                                  const float *s_sa, int64_t nb)
{
    int w0 = e2m1x4_s8(lo & 0xffffu), w1 = e2m1x4_s8(lo >> 16);
    int w2 = e2m1x4_s8(hi & 0xffffu), w3 = e2m1x4_s8(hi >> 16);
    float sw = qd_e4m3_to_f32(sc);
#pragma unroll
    for (int m = 0; m < MT; m++) {
        float v = block_dot4(w0, w1, w2, w3, s_a[m * nb + b]) * (s_sa[m * nb + b] * sw);
        acc[m] = acc[m] + v;
    }
}

/* Decodes the CTA's MT activation rows into shared memory: s_a [MT][nb] blocks of
 * 16 int8 (2*E2M1), s_sa [MT][nb] = block scale / 4. Rows past M are zero. */
template <int MT>
static __device__ void w4a4_load_act(int4 *s_a, float *s_sa, const uint8_t *a_codes,
                                     const uint8_t *a_scales, int64_t m0, int64_t M, int64_t K)
{
    int nb = (int)(K / 16), wpr = (int)(K / 4), words = MT * wpr;
    int *sw = (int *)s_a;
    for (int i = threadIdx.x; i < words; i += blockDim.x) {
        int m = i / wpr, j = i - m * wpr;
        uint32_t c = 0;
        if (m0 + m < M)
            c = *(const uint16_t *)(a_codes + (m0 + m) * (K / 2) + 2 * j);
        sw[i] = e2m1x4_s8(c);
    }
    for (int i = threadIdx.x; i < MT * nb; i += blockDim.x) {
        int m = i / nb;
        s_sa[i] = m0 + m < M ? 0.25f * qd_e4m3_to_f32(a_scales[(m0 + m) * nb + (i - m * nb)]) : 0.0f;
    }
}

/* y (M, N): one thread per weight row n and MT activation rows (blockIdx.y's tile),
 * the blocks of K in ascending order. With K % 256 == 0 the row is read 16 blocks
 * (128 bytes of codes, 16 of scales) a step, the next step's loads in flight. */
/* The rows m0 .. m0+MT-1 of y (M, N) against weight row n (the CTA's shared
 * activations loaded first): the body of w4a4_kernel and of its grouped twin. */
template <int MT>
static __device__ __forceinline__ void w4a4_rows(float *y, const uint8_t *a_codes, const uint8_t *a_scales,
                                                 const float *a_sdec, int a_per_row, const uint8_t *w_codes,
                                                 const uint8_t *w_scales, const float *w_sdec, int w_per_row,
                                                 int64_t M, int64_t N, int64_t K, int64_t m0)
{
    extern __shared__ int4 smem[];
    int64_t nb = K / 16;
    int4 *s_a = smem;
    float *s_sa = (float *)(smem + MT * nb);
    w4a4_load_act<MT>(s_a, s_sa, a_codes, a_scales, m0, M, K);
    __syncthreads();
    int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N)
        return;
    float acc[MT];
#pragma unroll
    for (int m = 0; m < MT; m++)
        acc[m] = 0.0f;
    const uint8_t *wc = w_codes + n * (K / 2), *ws = w_scales + n * nb;
    int64_t b = 0;
    if (K % 256 == 0) {
        const uint4 *pc = (const uint4 *)wc, *ps = (const uint4 *)ws;
        uint4 c[8], s = __ldg(ps);
#pragma unroll
        for (int i = 0; i < 8; i++)
            c[i] = __ldg(pc + i);
        for (; b < nb; b += 16) {
            uint4 cn[8], sn = s;
            int more = b + 16 < nb;
#pragma unroll
            for (int i = 0; i < 8; i++)
                cn[i] = more ? __ldg(pc + (b / 16 + 1) * 8 + i) : c[i];
            if (more)
                sn = __ldg(ps + b / 16 + 1);
            uint32_t sw[4] = {s.x, s.y, s.z, s.w};
#pragma unroll
            for (int i = 0; i < 8; i++) {
                uint32_t sv = sw[i / 2] >> (16 * (i & 1));
                w4a4_block<MT>(acc, c[i].x, c[i].y, (uint8_t)sv, b + 2 * i, s_a, s_sa, nb);
                w4a4_block<MT>(acc, c[i].z, c[i].w, (uint8_t)(sv >> 8), b + 2 * i + 1, s_a, s_sa, nb);
            }
#pragma unroll
            for (int i = 0; i < 8; i++)
                c[i] = cn[i];
            s = sn;
        }
    }
    for (; b < nb; b++) {
        uint2 c = *(const uint2 *)(wc + b * 8);
        w4a4_block<MT>(acc, c.x, c.y, ws[b], b, s_a, s_sa, nb);
    }
    float sdw = w_sdec[w_per_row ? n : 0];
#pragma unroll
    for (int m = 0; m < MT; m++)
        if (m0 + m < M)
            y[(m0 + m) * N + n] = acc[m] * (a_sdec[a_per_row ? m0 + m : 0] * sdw);
}

/* y (M, N): one thread per weight row n and MT activation rows (blockIdx.y's tile),
 * the blocks of K in ascending order. With K % 256 == 0 the row is read 16 blocks
 * (128 bytes of codes, 16 of scales) a step, the next step's loads in flight. */
template <int MT>
__global__ void __launch_bounds__(QD_GEMV_THREADS)
w4a4_kernel(float *y, const uint8_t *a_codes, const uint8_t *a_scales, const float *a_sdec,
            int a_per_row, const uint8_t *w_codes, const uint8_t *w_scales, const float *w_sdec,
            int w_per_row, int64_t M, int64_t N, int64_t K)
{
    QD_PDL_ENTRY();
    w4a4_rows<MT>(y, a_codes, a_scales, a_sdec, a_per_row, w_codes, w_scales, w_sdec, w_per_row, M, N, K,
                  (int64_t)blockIdx.y * MT);
}

/* Grouped (MoE experts): a table of groups, group g its rows [row0, row0 +
 * rows) of A and y and its own weight (the MMA kernels' blockIdx.z or items
 * pick one). */
#define QD_W4A4_GROUPS 128
typedef struct {
    int64_t row0[QD_W4A4_GROUPS], rows[QD_W4A4_GROUPS];
    const uint8_t *codes[QD_W4A4_GROUPS], *scales[QD_W4A4_GROUPS];
    const float *sdec[QD_W4A4_GROUPS];
} w4a4_groups;

/* Decodes blocks [b0, b0+nblk) of the CTA's MT activation rows (K % 32 == 0, nblk
 * even) into shared memory: s_a rows of lda int8x4 words (2*E2M1, 4 words a block),
 * s_sa rows of lds floats (block scale / 4). 16-byte loads; rows past M are zero. */
template <int MT>
static __device__ void load_act_chunk(int *s_a, int lda, float *s_sa, int lds,
                                      const uint8_t *a_codes, const uint8_t *a_scales, int64_t m0,
                                      int64_t M, int64_t K, int b0, int nblk, int *s_corr = NULL)
{
    int upr = nblk / 2, nb = (int)(K / 16);
#pragma unroll 4
    for (int i = threadIdx.x; i < MT * upr; i += blockDim.x) {
        int m = i / upr, u = i - m * upr;
        uint4 c = make_uint4(0, 0, 0, 0);
        if (m0 + m < M)
            c = __ldg((const uint4 *)(a_codes + (m0 + m) * (K / 2) + (int64_t)(b0 + 2 * u) * 8));
        int4 *d = (int4 *)(s_a + m * lda + 8 * u);
        d[0] = make_int4(e2m1x4_s8(c.x & 0xffffu), e2m1x4_s8(c.x >> 16), e2m1x4_s8(c.y & 0xffffu),
                         e2m1x4_s8(c.y >> 16));
        d[1] = make_int4(e2m1x4_s8(c.z & 0xffffu), e2m1x4_s8(c.z >> 16), e2m1x4_s8(c.w & 0xffffu),
                         e2m1x4_s8(c.w >> 16));
        if (s_corr) { /* magic bits - 12 * sum of each block's 16 int8 values */
            int4 a = d[0], b = d[1];
            int s0 = __dp4a(a.x, 0x01010101, __dp4a(a.y, 0x01010101, __dp4a(a.z, 0x01010101,
                            __dp4a(a.w, 0x01010101, 0))));
            int s1 = __dp4a(b.x, 0x01010101, __dp4a(b.y, 0x01010101, __dp4a(b.z, 0x01010101,
                            __dp4a(b.w, 0x01010101, 0))));
            s_corr[m * lds + 2 * u] = QD_MAGIC_BITS - 12 * s0;
            s_corr[m * lds + 2 * u + 1] = QD_MAGIC_BITS - 12 * s1;
        }
    }
    for (int i = threadIdx.x; i < MT * nblk; i += blockDim.x) {
        int m = i / nblk, j = i - m * nblk;
        s_sa[m * lds + j] =
            m0 + m < M ? 0.25f * qd_e4m3_to_f32(a_scales[(m0 + m) * nb + b0 + j]) : 0.0f;
    }
}

/* The 256 E4M3 values, filled from qd_e4m3_to_f32 (so the same bits), for
 * kernels that decode a block scale per block per thread. */
static __device__ void e4m3_table(float *lut)
{
    for (int i = threadIdx.x; i < 256; i += blockDim.x)
        lut[i] = qd_e4m3_to_f32((uint8_t)i);
}

/* The main W4A4 kernel (K % 512 == 0): a CTA of 256 threads takes 32 weight rows
 * and MT <= 8 activation rows, K in chunks of 32 blocks. Phase 1: thread (r, j)
 * takes blocks j, j+8, j+16, j+24 of the chunk of row r (8 threads read 64
 * contiguous bytes a step) and writes the exact products v = p*(sa*sw) of every
 * (m, block) to shared memory. Phase 2: thread (m, r) adds them to its accumulator
 * in ascending block order. The split keeps the order of §3 while every thread of
 * the GPU has work at M = 1. The next chunk's weights load during this one. */
#define QD_W4A4_ROWS 32
#define QD_W4A4_CHUNK 32
#define QD_W4A4_VLD (QD_W4A4_CHUNK + 1) /* padded rows: phase 2 reads conflict-free */
template <int MT>
__global__ void __launch_bounds__(256, MT <= 4 ? 4 : 3) /* all 448 CTAs of N = 14336 resident */
w4a4_split_kernel(float *y, const uint8_t *a_codes, const uint8_t *a_scales, const float *a_sdec,
                  int a_per_row, const uint8_t *w_codes, const uint8_t *w_scales,
                  const float *w_sdec, int w_per_row, int64_t M, int64_t N, int64_t K)
{
    QD_PDL_ENTRY();
    static_assert(MT <= 8, "phase 2 has one warp per activation row");
    extern __shared__ int4 smem[];
    int nb = (int)(K / 16), nchunk = nb / QD_W4A4_CHUNK;
    int64_t m0 = (int64_t)blockIdx.y * MT, n0 = (int64_t)blockIdx.x * QD_W4A4_ROWS;
    /* MT <= 4: weights decoded with e2m1x4_off12, the decode shared by few rows */
    constexpr bool OFF = MT <= 4;
    int *s_a = (int *)smem;
    float *s_sa = (float *)(s_a + MT * (K / 4));
    int *s_corr = (int *)(s_sa + MT * nb); /* (OFF) [MT][nb] */
    float *s_v = (float *)(s_corr + (OFF ? MT * nb : 0)); /* [MT][32 rows][33], swizzled by r%4 */
    __shared__ float lut[256];
    e4m3_table(lut);
    load_act_chunk<MT>(s_a, (int)(K / 4), s_sa, nb, a_codes, a_scales, m0, M, K, 0, nb,
                       OFF ? s_corr : NULL);
    int t = threadIdx.x, r = t >> 3, j = t & 7, sw8 = 8 * (r & 3);
    int64_t row = n0 + r < N ? n0 + r : N - 1; /* rows past N compute garbage, never stored */
    const uint2 *pc = (const uint2 *)(w_codes + row * (K / 2)) + j;
    const uint8_t *ps = w_scales + row * nb + j;
    /* two chunks of weights in flight: [0] is the next one to compute */
    uint2 cw[2][4];
    uint8_t sc[2][4];
#pragma unroll
    for (int k = 0; k < 2; k++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            int c = k < nchunk ? k : 0;
            cw[k][q] = __ldg(pc + c * QD_W4A4_CHUNK + 8 * q);
            sc[k][q] = __ldg(ps + c * QD_W4A4_CHUNK + 8 * q);
        }
    __syncthreads();
    int pm = t >> 5, pr = t & 31, psw = 8 * (pr & 3);
    float acc = 0.0f;
    for (int c = 0; c < nchunk; c++) {
        uint2 cur[4];
        uint8_t scur[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            cur[q] = cw[0][q];
            scur[q] = sc[0][q];
            cw[0][q] = cw[1][q];
            sc[0][q] = sc[1][q];
        }
        if (c + 2 < nchunk) {
#pragma unroll
            for (int q = 0; q < 4; q++) {
                cw[1][q] = __ldg(pc + (c + 2) * QD_W4A4_CHUNK + 8 * q);
                sc[1][q] = __ldg(ps + (c + 2) * QD_W4A4_CHUNK + 8 * q);
            }
        }
#pragma unroll
        for (int q = 0; q < 4; q++) {
            int bq = 8 * q + j, b = c * QD_W4A4_CHUNK + bq;
            float sw = lut[scur[q]];
            if constexpr (OFF) {
                int w0 = e2m1x4_off12(cur[q].x & 0xffffu), w1 = e2m1x4_off12(cur[q].x >> 16);
                int w2 = e2m1x4_off12(cur[q].y & 0xffffu), w3 = e2m1x4_off12(cur[q].y >> 16);
#pragma unroll
                for (int m = 0; m < MT; m++)
                    s_v[(m * QD_W4A4_ROWS + r) * QD_W4A4_VLD + (bq ^ sw8)] =
                        block_dot4_off(w0, w1, w2, w3, ((const int4 *)(s_a + m * (K / 4)))[b],
                                       s_corr[m * nb + b]) *
                        (s_sa[m * nb + b] * sw);
            } else {
                int w0 = e2m1x4_s8(cur[q].x & 0xffffu), w1 = e2m1x4_s8(cur[q].x >> 16);
                int w2 = e2m1x4_s8(cur[q].y & 0xffffu), w3 = e2m1x4_s8(cur[q].y >> 16);
#pragma unroll
                for (int m = 0; m < MT; m++)
                    s_v[(m * QD_W4A4_ROWS + r) * QD_W4A4_VLD + (bq ^ sw8)] =
                        block_dot4(w0, w1, w2, w3, ((const int4 *)(s_a + m * (K / 4)))[b]) *
                        (s_sa[m * nb + b] * sw);
            }
        }
        __syncthreads();
        if (pm < MT) {
            const float *v = s_v + (pm * QD_W4A4_ROWS + pr) * QD_W4A4_VLD;
#pragma unroll
            for (int q = 0; q < QD_W4A4_CHUNK; q++)
                acc = acc + v[q ^ psw];
        }
        __syncthreads();
    }
    int64_t n = n0 + pr;
    if (pm < MT && m0 + pm < M && n < N)
        y[(m0 + pm) * N + n] = acc * (a_sdec[a_per_row ? m0 + pm : 0] * w_sdec[w_per_row ? n : 0]);
}

/* The decode-shaped tensor-core kernel (any K % 16 == 0, up to 8*NT activation
 * rows a CTA): the tc kernel's arithmetic (p of each block from one int8 MMA,
 * promoted per output in ascending block order: acc = fmaf(4p, (sa/4)*sw, acc),
 * the product exact (§3), so one rounding as on the CPU), with the weights
 * staged through shared memory by coalesced cp.async copies so that every byte
 * of a weight row is read from HBM once, in 128-byte lines. A CTA of 4 warps owns
 * 64 weight rows of one group (blockIdx.z: an expert, or the one matrix) and 8*NT
 * activation rows (blockIdx.y); K goes in chunks of 16 blocks, the next chunk's
 * weights in flight (cp.async) and its activations and scales in registers while
 * the current one is multiplied (W = 1 warp and 16 rows a CTA where 4-warp CTAs
 * would leave SMs idle, mma_warps below). Warp w's thread (g = lane/4, t = lane%4) owns
 * weight rows 16w+g and 16w+g+8 and activation rows 2t, 2t+1 of each 8-row tile
 * (the MMA's accumulator layout). Padded shared rows make every fragment read of a
 * warp hit 32 banks. */
#define QD_MMA_WARPS 4       /* warps a CTA (W) by default; 1 for few CTAs (mma_warps) */
#define QD_MMA_ROWS (16 * W) /* weight rows a CTA of W warps (inside the templates) */
#define QD_MMA_CB 16                    /* blocks a chunk */
#define QD_MMA_WLD (QD_MMA_CB * 8 + 16)  /* bytes a staged weight row (codes) */
#define QD_MMA_ALD (QD_MMA_CB * 16 + 16) /* bytes a staged activation row (int8) */
#define QD_MMA_SLD (QD_MMA_CB + 1)       /* floats a staged scale row */

/* sc[pair][j] of activation rows 2*pair, 2*pair+1 and block j: their scales / 4
 * and the MMA's initial accumulators, the bits of 1.5*2^23 minus 12 * (sum of
 * the row's 16 int8 codes of the block), {sa0, sa1, c0, c1}: one 16-byte read
 * gives a thread both of its rows (the weights enter the MMA offset by 12,
 * e2m1x4_off12, and the offset's 12 * sum(a) is taken out of the start). */
template <int NT, int W>
struct mma_stage {
    static constexpr bool pair = false;
    uint8_t wc[QD_MMA_ROWS][QD_MMA_WLD];
    float sw[QD_MMA_ROWS][QD_MMA_SLD];
    __align__(16) int8_t a[8 * NT][QD_MMA_ALD];
    float4 sc[4 * NT][QD_MMA_CB + 1]; /* padded: the 4 pairs a warp reads, 4 bank groups */
};

/* The stage of the block-pair kernels (w4a4_mma_kernel's PAIR): the weight
 * codes as mma_stage's (ldmatrix reads 16 rows x 4 blocks at once), the
 * weight scales with rows of an even length (a thread reads two blocks' as
 * one float2), the activation rows 32 bytes longer than a chunk (the 4 rows a
 * warp's B fragments read fall in 4 bank groups), and sp[m][jp] of activation
 * row m and blocks 2jp, 2jp+1: {sa, sa', -(1.5*2^23 + 12*sum), the same of
 * 2jp+1} (scales / 4; the MMA starts at the magic bits and this takes the
 * start and the offset's 12 * sum(a) back out, exactly). */
template <int NT, int W>
struct pair_stage {
    static constexpr bool pair = true;
    uint8_t wc[QD_MMA_ROWS][QD_MMA_WLD];
    float sw[QD_MMA_ROWS][QD_MMA_CB + 2];
    __align__(16) int8_t a[8 * NT][QD_MMA_CB * 16 + 32];
    float4 sp[8 * NT][QD_MMA_CB / 2 + 1];
};

/* D = A (16 x 32, s8) B (32 x 8, s8) + c, c[0..3] the magic bits in every
 * element: constants, or registers ptxas cannot prove constant (pair_terms'
 * OC: not four moves into a quad before every MMA) */
static __device__ __forceinline__ void mma_s8k32c(int d[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                  uint32_t b0, uint32_t b1, const int c[4])
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
}

/* mma_s8 with the accumulator started at c0 (column 2t) and c1 (column 2t+1). */
static __device__ __forceinline__ void mma_s8c(int d[4], uint32_t a0, uint32_t a1, uint32_t b, int c0, int c1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%7,%8,%7,%8};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b), "r"(c0), "r"(c1));
}

static __device__ __forceinline__ void cp_async8(void *dst, const void *src)
{
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(d), "l"(src));
}

static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
static __device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

/* What one thread carries in registers for the next chunk: its share of the
 * weight scales (64 rows x cb blocks), activation codes (8*NT rows x cb blocks)
 * and activation scales. */
#define QD_MMA_WS_PER_THREAD (QD_MMA_CB / 2) /* 16W rows x CB blocks over 32W threads */
#define QD_MMA_AK(NT, W) ((NT) * 4 / (W))      /* activation items a thread: 8NT rows x CB blocks over 32W */
template <int NT, int W>
struct mma_regs {
    uint8_t ws[QD_MMA_WS_PER_THREAD];
    uint2 ac[QD_MMA_AK(NT, W)];
    uint8_t as[QD_MMA_AK(NT, W)];
};

/* Issues chunk c's weight codes (cp.async into st) and loads its scales and
 * activations into r. Rows past N read row N-1 (never stored); activation rows
 * past T read as zero. */
template <int NT, int W, typename S>
static __device__ __forceinline__ void mma_fetch(S *st, mma_regs<NT, W> *r, const uint8_t *wc,
                                                 const uint8_t *ws, int64_t n0, int64_t N, int nb,
                                                 const uint8_t *ac, const uint8_t *as, int T, int b0, int cb,
                                                 int tid)
{
    bool full = cb == QD_MMA_CB && n0 + QD_MMA_ROWS <= N;
    if (full) { /* a whole chunk of whole rows: thread tid's rows are tid/16 + 8k, one stride apart */
        constexpr int RS = 32 * W / QD_MMA_CB; /* rows between a thread's copies */
        int row = tid / QD_MMA_CB, u = tid % QD_MMA_CB;
        const uint8_t *p = wc + (n0 + row) * (int64_t)(nb * 8) + (int64_t)(b0 + u) * 8;
        const uint8_t *q = ws + (n0 + row) * (int64_t)nb + b0 + u;
#pragma unroll
        for (int k = 0; k < QD_MMA_WS_PER_THREAD; k++) {
            cp_async8(&st->wc[row + RS * k][u * 8], p + (int64_t)k * RS * nb * 8);
            r->ws[k] = __ldg(q + (int64_t)k * RS * nb);
        }
        cp_async_commit();
    } else if (cb == QD_MMA_CB) { /* every chunk of K % 256 == 0: no division */
#pragma unroll
        for (int k = 0; k < QD_MMA_ROWS * QD_MMA_CB / (32 * W); k++) {
            int i = tid + k * 32 * W, row = i / QD_MMA_CB, u = i % QD_MMA_CB;
            int64_t n = n0 + row < N ? n0 + row : N - 1;
            cp_async8(&st->wc[row][u * 8], wc + n * (int64_t)(nb * 8) + (int64_t)(b0 + u) * 8);
        }
    } else {
        for (int i = tid; i < QD_MMA_ROWS * cb; i += 32 * W) {
            int row = i / cb, u = i - row * cb;
            int64_t n = n0 + row < N ? n0 + row : N - 1;
            cp_async8(&st->wc[row][u * 8], wc + n * (int64_t)(nb * 8) + (int64_t)(b0 + u) * 8);
        }
    }
    if (!full) {
        cp_async_commit();
#pragma unroll
        for (int k = 0; k < QD_MMA_WS_PER_THREAD; k++) {
            int i = tid + k * 32 * W, row = i / QD_MMA_CB, u = i % QD_MMA_CB;
            int64_t n = n0 + row < N ? n0 + row : N - 1;
            r->ws[k] = u < cb ? __ldg(ws + n * nb + b0 + u) : 0;
        }
    }
#pragma unroll
    for (int k = 0; k < QD_MMA_AK(NT, W); k++) {
        if (2 * W * k >= T) /* rows 2Wk.. (this k's) past the CTA's: never read */
            break;
        int i = tid + k * 32 * W, row = i / QD_MMA_CB, u = i % QD_MMA_CB;
        bool in = row < T && u < cb;
        r->ac[k] = in ? __ldg((const uint2 *)(ac + (int64_t)row * (nb * 8) + (int64_t)(b0 + u) * 8))
                      : make_uint2(0, 0);
        r->as[k] = in ? __ldg(as + (int64_t)row * nb + b0 + u) : 0;
    }
}

/* The registers of mma_fetch into the stage: scales decoded to float (activation
 * scales / 4), activation codes to int8 (2*E2M1). */
template <int NT, int W, typename S>
static __device__ __forceinline__ void mma_store(S *st, const mma_regs<NT, W> *r, const float *lut, int T, int tid)
{
#pragma unroll
    for (int k = 0; k < QD_MMA_WS_PER_THREAD; k++) {
        int i = tid + k * 32 * W;
        st->sw[i / QD_MMA_CB][i % QD_MMA_CB] = lut[r->ws[k]];
    }
#pragma unroll
    for (int k = 0; k < QD_MMA_AK(NT, W); k++) {
        if (2 * W * k >= T)
            break;
        int i = tid + k * 32 * W, row = i / QD_MMA_CB, u = i % QD_MMA_CB;
        uint2 c = r->ac[k];
        int4 v = make_int4(e2m1x4_s8(c.x & 0xffffu), e2m1x4_s8(c.x >> 16), e2m1x4_s8(c.y & 0xffffu),
                           e2m1x4_s8(c.y >> 16));
        *(int4 *)&st->a[row][u * 16] = v;
        int sum = __dp4a(v.x, 0x01010101, __dp4a(v.y, 0x01010101, __dp4a(v.z, 0x01010101,
                                                                   __dp4a(v.w, 0x01010101, 0))));
        if constexpr (S::pair) {
            float *q = (float *)&st->sp[row][u >> 1];
            q[u & 1] = 0.25f * qd_e4m3_to_f32(r->as[k]);
            q[2 + (u & 1)] = -__int_as_float(QD_MAGIC_BITS + 12 * sum);
        } else {
            float *q = (float *)&st->sc[row >> 1][u];
            q[row & 1] = 0.25f * qd_e4m3_to_f32(r->as[k]);
            q[2 + (row & 1)] = __int_as_float(QD_MAGIC_BITS - 12 * sum);
        }
    }
}

/* One chunk (QD_MMA_CB blocks) of the block-pair kernels for warp w: the
 * MMA m16n8k32 takes blocks 2jp and 2jp+1 of 16 weight rows at once, and its
 * 8 columns are 4 activation rows x the two blocks: column (m, h) of B holds
 * row m's block 2jp+h in the 16 k-slots of that block's weights and zeros in
 * the other 16, so each column is one block's exact sum (as the k16 MMA's).
 * The k-slots of a block need not be in order (the sum is exact): ldmatrix
 * gives thread t bytes 4t..4t+3 of 16 weight bytes (blocks 2jp, 2jp+1), so
 * threads 0, 1 hold block 2jp's 16 codes and threads 2, 3 block 2jp+1's, and
 * B's columns put the activations where the weights are. Thread (g, t) adds,
 * for its activation row 4G + t of each group G (G < NG; rows past T are
 * never stored) and weight rows g, g+8, block 2jp's term and then 2jp+1's:
 * the ascending block order of the k16 kernels, so the same bits.
 * pair_terms is that chunk of NJQ * 4 blocks for one warp's 16 weight rows:
 * wa this lane's ldmatrix address, ab its B operand of row group 0 (groups
 * lda bytes x 4 apart), sw(jp, w0, w1) the weight scales of blocks 2jp, 2jp+1
 * of rows g and g+8, sp(row, jp) an activation row's float4 of pair jp; bon:
 * this thread's B slots hold block 2jp + (g & 1). pair_chunk reads them from
 * the CTA's stage, st_chunk (the streaming kernel) from a warp's own. */
template <int NG, int NJQ, bool OC = false, typename SW, typename SP>
static __device__ __forceinline__ void pair_terms(const uint8_t *wa, const int8_t *ab, int lda, SW sw, SP sp,
                                                  float (*acc)[4], int T, int t, bool bon, int njq = NJQ)
{
    /* OC: the permutes' table and the MMAs' starting accumulators held in
     * registers through the loop: or'ed with T >> 8, T >> 9, ... (0: T is
     * at most 64), which ptxas cannot know, so it neither rematerializes them
     * as constants nor merges the four (an MMA's accumulators are a quad) */
    uint32_t tab = 0x03020100u;
    int mc[4] = {QD_MAGIC_BITS, QD_MAGIC_BITS, QD_MAGIC_BITS, QD_MAGIC_BITS};
    if constexpr (OC) {
        tab |= (uint32_t)T >> 8;
#pragma unroll
        for (int i = 0; i < 4; i++)
            mc[i] |= T >> (8 + i);
    }
#pragma unroll 1
    for (int jq = 0; jq < njq; jq++) { /* njq: NJQ, or fewer in a stream's short last chunk */
        uint32_t R[4];
        ldm_x4(R, wa + 32 * jq);
#pragma unroll
        for (int s = 0; s < 2; s++) {
            int jp = 2 * jq + s;
            uint32_t a0 = (uint32_t)e2m1x4_off12t(R[2 * s], tab);
            uint32_t a2 = (uint32_t)e2m1x4_off12t(R[2 * s] >> 16, tab);
            uint32_t a1 = (uint32_t)e2m1x4_off12t(R[2 * s + 1], tab);
            uint32_t a3 = (uint32_t)e2m1x4_off12t(R[2 * s + 1] >> 16, tab);
            float2 w0, w1;
            sw(jp, w0, w1);
#pragma unroll
            for (int g = 0; g < NG; g++) {
                if (NG > 2 && 4 * g >= T)
                    break;
                uint2 b = *(const uint2 *)(ab + g * 4 * lda + jp * 32);
                if (!bon)
                    b = make_uint2(0, 0);
                float4 sc = sp(4 * g + t, jp);
                int d[4];
                mma_s8k32c(d, a0, a1, a2, a3, b.x, b.y, mc);
                float *ac = &acc[g >> 1][2 * (g & 1)];
                ac[0] = fmaf(__int_as_float(d[0]) + sc.z, sc.x * w0.x, ac[0]);
                ac[0] = fmaf(__int_as_float(d[1]) + sc.w, sc.y * w0.y, ac[0]);
                ac[1] = fmaf(__int_as_float(d[2]) + sc.z, sc.x * w1.x, ac[1]);
                ac[1] = fmaf(__int_as_float(d[3]) + sc.w, sc.y * w1.y, ac[1]);
            }
        }
    }
}

template <int NT, int W, int NG>
static __device__ __forceinline__ void pair_chunk(const pair_stage<NT, W> *cur, float (*acc)[4], int T, int lane, int w)
{
    int gq = lane >> 2, t = lane & 3;
    const float *sw0 = cur->sw[16 * w + gq], *sw1 = cur->sw[16 * w + gq + 8];
    pair_terms<NG, QD_MMA_CB / 4>(
        &cur->wc[16 * w + (lane & 7) + 8 * ((lane >> 3) & 1)][16 * (lane >> 4)],
        &cur->a[gq >> 1][(gq & 1) * 16 + 8 * (t & 1)], QD_MMA_CB * 16 + 32,
        [&](int jp, float2 &w0, float2 &w1) {
            w0 = *(const float2 *)&sw0[2 * jp];
            w1 = *(const float2 *)&sw1[2 * jp];
        },
        [&](int row, int jp) { return cur->sp[row][jp]; }, acc, T, t,
        (t >> 1) == (gq & 1) /* this thread's B slots hold block 2jp + (gq & 1) */);
}

/* DEV: the groups are *gd in device memory and the CTAs' (group, row tile)
 * pairs items[0 .. *nitems-1] (group | tile << 16, w4a4_items_from_dev from
 * the device offsets), blockIdx.y picking one; those past them exit.
 * PAIR: two blocks an MMA (pair_chunk; K a multiple of 16 * QD_MMA_CB), the
 * same bits. */
template <int NT, int W, bool DEV, bool PAIR>
__global__ void __launch_bounds__(32 * W, W == 1 ? 12 : NT <= 2 ? 4 : NT == 4 ? 3 : 2)
w4a4_mma_kernel(float *y, const uint8_t *a_codes, const uint8_t *a_scales, const float *a_sdec, int a_per_row,
                const __grid_constant__ w4a4_groups g, int w_per_row, int64_t N, int64_t K, const w4a4_groups *gd,
                const int *items, const int *nitems)
{
    QD_PDL_ENTRY();
    using S = typename std::conditional<PAIR, pair_stage<NT, W>, mma_stage<NT, W>>::type;
    extern __shared__ __align__(16) unsigned char mma_smem[];
    S *stage = (S *)mma_smem;
    __shared__ float lut[256]; /* the weight scales' E4M3 values */
    int z = blockIdx.z;
    int64_t tile = blockIdx.y;
    if constexpr (DEV) {
        if ((int)blockIdx.y >= *nitems)
            return;
        int v = items[blockIdx.y];
        z = v & 0xffff;
        tile = v >> 16;
    }
    const w4a4_groups &G = DEV ? *gd : g;
    int64_t rows = G.rows[z], t0 = tile * 8 * NT, n0 = (int64_t)blockIdx.x * QD_MMA_ROWS;
    if (t0 >= rows)
        return;
    e4m3_table(lut);
    __syncthreads();
    int T = rows - t0 < 8 * NT ? (int)(rows - t0) : 8 * NT, nb = (int)(K / 16), nchunk = (nb + QD_MMA_CB - 1) / QD_MMA_CB;
    int64_t r0 = G.row0[z] + t0;
    const uint8_t *ac = a_codes + r0 * (K / 2), *as = a_scales + r0 * nb;
    int lane = threadIdx.x & 31, gq = lane >> 2, t = lane & 3, w = threadIdx.x >> 5;
    float acc[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++)
        acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    mma_regs<NT, W> reg;
    int cb = nb < QD_MMA_CB ? nb : QD_MMA_CB;
    mma_fetch<NT, W>(&stage[0], &reg, G.codes[z], G.scales[z], n0, N, nb, ac, as, T, 0, cb, threadIdx.x);
    mma_store<NT, W>(&stage[0], &reg, lut, T, threadIdx.x);
    cp_async_wait_all();
    __syncthreads();
    int wr0 = 16 * w + gq, wr1 = wr0 + 8;
    for (int c = 0; c < nchunk; c++) {
        S *cur = &stage[c & 1], *nxt = &stage[(c + 1) & 1];
        int b0 = c * QD_MMA_CB, cbc = nb - b0 < QD_MMA_CB ? nb - b0 : QD_MMA_CB;
        int nb0 = b0 + QD_MMA_CB, cbn = nb - nb0 < QD_MMA_CB ? nb - nb0 : QD_MMA_CB;
        if (c + 1 < nchunk)
            mma_fetch<NT, W>(nxt, &reg, G.codes[z], G.scales[z], n0, N, nb, ac, as, T, nb0, cbn, threadIdx.x);
        if constexpr (PAIR) {
            if (T <= 4)
                pair_chunk<NT, W, 1>(cur, acc, T, lane, w);
            else if (T <= 8)
                pair_chunk<NT, W, 2>(cur, acc, T, lane, w);
            else
                pair_chunk<NT, W, 2 * NT>(cur, acc, T, lane, w);
        } else {
#pragma unroll 4
        for (int j = 0; j < cbc; j++) {
            uint32_t a0 = (uint32_t)e2m1x4_off12(*(const uint16_t *)&cur->wc[wr0][j * 8 + 2 * t]);
            uint32_t a1 = (uint32_t)e2m1x4_off12(*(const uint16_t *)&cur->wc[wr1][j * 8 + 2 * t]);
            float sw0 = cur->sw[wr0][j], sw1 = cur->sw[wr1][j];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                if (nt * 8 >= T)
                    break;
                int d[4];
                float4 sc = cur->sc[nt * 4 + t][j];
                mma_s8c(d, a0, a1, *(const uint32_t *)&cur->a[nt * 8 + gq][j * 16 + 4 * t], __float_as_int(sc.z),
                        __float_as_int(sc.w));
                float sa_lo = sc.x, sa_hi = sc.y;
                acc[nt][0] = fmaf(__int_as_float(d[0]) - QD_MAGIC, sa_lo * sw0, acc[nt][0]);
                acc[nt][1] = fmaf(__int_as_float(d[1]) - QD_MAGIC, sa_hi * sw0, acc[nt][1]);
                acc[nt][2] = fmaf(__int_as_float(d[2]) - QD_MAGIC, sa_lo * sw1, acc[nt][2]);
                acc[nt][3] = fmaf(__int_as_float(d[3]) - QD_MAGIC, sa_hi * sw1, acc[nt][3]);
            }
        }
        }
        if (c + 1 < nchunk)
            mma_store<NT, W>(nxt, &reg, lut, T, threadIdx.x);
        cp_async_wait_all();
        __syncthreads();
    }
    const float *sdw = G.sdec[z];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            /* PAIR: acc[nt][2h + r] is activation row 4 (2nt + h) + t, weight row r ? wr1 : wr0 */
            int m = PAIR ? 8 * nt + 4 * (i >> 1) + t : nt * 8 + 2 * t + (i & 1);
            int64_t n = n0 + (PAIR ? (i & 1 ? wr1 : wr0) : i < 2 ? wr0 : wr1);
            if (m < T && n < N)
                y[(r0 + m) * N + n] = acc[nt][i] * (a_sdec[a_per_row ? r0 + m : 0] * sdw[w_per_row ? n : 0]);
        }
}

/* The products of many activation rows (prefill: the experts' and the
 * attention linears') on the FP16 tensor cores, one MMA a block and one FFMA a
 * term. Each operand carries what makes the MMA's sum the term's product:
 * a weight code w as the FP16 of w * 2^-14 (its nibble's bits moved into
 * place: sign to bit 15, exponent and mantissa to bits 11..9; the code 0.5
 * is the subnormal 2^-15), an activation code a as the FP16 of a * sa (its
 * block's scale folded in: at most 6 significant bits, 2^-10 <= |a sa| <=
 * 2688, exact). An m16n8k16 started from zero then sums one block's 16
 * products, integers of at most 12 bits in units of a common power of two
 * below 2^16 units: exact, d = p * sa * 2^-14; and fmaf(d, sw * 2^14, acc) =
 * RN(acc + p * sa * sw) = fmaf(p, sa * sw, acc) of §3 (both products exact),
 * in ascending block order from 0: the same bits as the other kernels, with
 * one float operation a term where they take three (the int8 sum's
 * conversion, sa * sw, the fmaf).
 *
 * A CTA of 8 warps takes 128 weight rows (16 a warp) and 8 * NT activation
 * rows of a group, K in chunks of QD_H16_CB blocks: the weight codes by
 * cp.async, the weight scales (as float sw * 2^14) and the activations (as
 * FP16 a * sa) staged through registers, one chunk in flight while the last
 * one multiplies. A block's 16 k-slots need not hold its elements in order
 * (the sum is exact), so the weights come as they lie: thread (g, t) reads
 * bytes 2t, 2t+1 of weight rows g and g+8 (codes 4t .. 4t+3), and the
 * activations are stored in the matching slot order (4t, 4t+2 | 4t+1, 4t+3). */
#define QD_H16_W 8
#define QD_H16_ROWS (16 * QD_H16_W)
#define QD_H16_CB 8
#define QD_H16_WLD (QD_H16_CB * 8 + 8)   /* bytes a staged weight row: 8 rows' loads in 16 banks pairs */
#define QD_H16_SLD (QD_H16_CB + 1)       /* floats a staged weight-scale row */
#define QD_H16_ALD (QD_H16_CB * 32 + 32) /* bytes a staged activation row (FP16) */
template <int NT>
struct h16_stage {
    uint8_t wc[QD_H16_ROWS][QD_H16_WLD];
    float sw[QD_H16_ROWS][QD_H16_SLD];
    __align__(16) uint8_t a[8 * NT][QD_H16_ALD];
};
#define QD_H16_WK (QD_H16_ROWS * QD_H16_CB / (32 * QD_H16_W)) /* weight items (row, block) a thread */
#define QD_H16_AK(NT) ((NT) * QD_H16_CB / (4 * QD_H16_W))      /* activation items a thread */
template <int NT>
struct h16_regs {
    uint8_t ws[QD_H16_WK];
    uint2 ac[QD_H16_AK(NT)];
    uint8_t as[QD_H16_AK(NT)];
};

static __device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b)
{
    uint32_t d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

/* D = A (16 x 16, f16) B (16 x 8, f16), started from zero, float32 sums. */
static __device__ __forceinline__ void mma_h16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}

/* One activation block (16 codes c, scale sa) as 16 FP16 a * sa (exact), in
 * pairs: lo[q] codes (0,2) (1,3) (4,6) (5,7), hi[q] the same + 8 (a16_block
 * and a16wg_block lay them out for their kernels) */
static __device__ __forceinline__ void a16_pairs(uint32_t lo[4], uint32_t hi[4], uint2 c, float sa)
{
    const uint32_t two14 = 0x74007400u; /* 2^14, 2^14 */
    unsigned short hs;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(hs) : "f"(sa));
    uint32_t s2 = (uint32_t)hs * 0x10001u;
    qd_e2m1x8_h16(lo, __byte_perm(c.x, 0u, 0x3120)); /* (0,2) (1,3) (4,6) (5,7) */
    qd_e2m1x8_h16(hi, __byte_perm(c.y, 0u, 0x3120)); /* (8,10) (9,11) (12,14) (13,15) */
#pragma unroll
    for (int q = 0; q < 4; q++) {
        lo[q] = hmul2(hmul2(lo[q], two14), s2);
        hi[q] = hmul2(hmul2(hi[q], two14), s2);
    }
}

/* a16_pairs in the FP16 kernels' slot order: codes 4t, 4t+2, 4t+1, 4t+3 for t = 0..3 */
static __device__ __forceinline__ void a16_block(uint4 *d, uint2 c, float sa)
{
    uint32_t lo[4], hi[4];
    a16_pairs(lo, hi, c, sa);
    d[0] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    d[1] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
}

/* One chunk's cbc blocks of the FP16 kernels for one warp: weight rows wr0 and
 * wr0 + 8 (w0, w1: their codes' bytes 2t, 2t+1 of the chunk's block 0), the
 * activation rows 8 nt + g of the stage (act: row g's 8 bytes of block 0, rows
 * QD_H16_ALD bytes apart), the weight scales as sw * 2^14 from sf(j, s0, s1);
 * row tiles past T are left out. */
template <int NT, bool FULL, typename SF>
static __device__ __forceinline__ void h16_chunk(float (*acc)[4], const uint8_t *w0, const uint8_t *w1,
                                                 const uint8_t *act, int cbc, int T, SF sf)
{
#pragma unroll 2
    for (int j = 0; j < cbc; j++) {
        uint32_t xg = *(const uint16_t *)(w0 + j * 8), xh = *(const uint16_t *)(w1 + j * 8);
        uint32_t r[4], af[4];
        qd_e2m1x8_h16(r, __byte_perm(xg, xh, 0x5140));
        af[0] = r[0]; /* row g, slots 2t, 2t+1: codes 4t, 4t+2 */
        af[1] = r[2]; /* row g+8, the same slots */
        af[2] = r[1]; /* row g, slots 2t+8, 2t+9: codes 4t+1, 4t+3 */
        af[3] = r[3];
        float s0, s1;
        sf(j, s0, s1);
        if constexpr (FULL) { /* every tile holds rows: 4 tiles' loads, then MMAs, then FFMAs */
            constexpr int G = NT < 4 ? NT : 4;
#pragma unroll
            for (int n0 = 0; n0 < NT; n0 += G) {
                uint2 b[G];
                float d[G][4];
#pragma unroll
                for (int u = 0; u < G; u++)
                    b[u] = *(const uint2 *)(act + (n0 + u) * 8 * QD_H16_ALD + j * 32);
#pragma unroll
                for (int u = 0; u < G; u++)
                    mma_h16(d[u], af, b[u].x, b[u].y);
#pragma unroll
                for (int u = 0; u < G; u++) {
                    acc[n0 + u][0] = fmaf(d[u][0], s0, acc[n0 + u][0]);
                    acc[n0 + u][1] = fmaf(d[u][1], s0, acc[n0 + u][1]);
                    acc[n0 + u][2] = fmaf(d[u][2], s1, acc[n0 + u][2]);
                    acc[n0 + u][3] = fmaf(d[u][3], s1, acc[n0 + u][3]);
                }
            }
        } else {
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                if (nt * 8 >= T)
                    break;
                uint2 b = *(const uint2 *)(act + nt * 8 * QD_H16_ALD + j * 32);
                float d[4];
                mma_h16(d, af, b.x, b.y);
                acc[nt][0] = fmaf(d[0], s0, acc[nt][0]);
                acc[nt][1] = fmaf(d[1], s0, acc[nt][1]);
                acc[nt][2] = fmaf(d[2], s1, acc[nt][2]);
                acc[nt][3] = fmaf(d[3], s1, acc[nt][3]);
            }
        }
    }
}

/* The FP16 kernels' outputs: thread (g, t)'s acc[nt] holds weight rows wr0,
 * wr0 + 8 and activation rows 8 nt + 2t, 8 nt + 2t + 1 of the tile at y's row
 * 0 (T of them, N columns), times both decode scales. */
template <int NT>
static __device__ __forceinline__ void h16_out(float *y, const float (*acc)[4], int T, int t, int64_t n0, int wr0,
                                               int64_t N, const float *a_sdec, int a_per_row, const float *w_sdec,
                                               int w_per_row)
{
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int m = nt * 8 + 2 * t + (i & 1);
            int64_t n = n0 + wr0 + (i < 2 ? 0 : 8);
            if (m < T && n < N)
                y[m * N + n] = acc[nt][i] * (a_sdec[a_per_row ? m : 0] * w_sdec[w_per_row ? n : 0]);
        }
}

/* Chunk b0 .. b0+cb-1: the weight codes by cp.async into st, the weight scales
 * and activations into r (rows past N read row N-1, never stored; activation
 * rows past T read as zero). */
template <int NT>
static __device__ __forceinline__ void h16_fetch(h16_stage<NT> *st, h16_regs<NT> *r, const uint8_t *wc,
                                                 const uint8_t *ws, int64_t n0, int64_t N, int nb,
                                                 const uint8_t *ac, const uint8_t *as, int T, int b0, int cb)
{
    int tid = threadIdx.x;
#pragma unroll
    for (int k = 0; k < QD_H16_WK; k++) {
        int i = tid + k * 32 * QD_H16_W, row = i / QD_H16_CB, u = i % QD_H16_CB;
        int64_t n = n0 + row < N ? n0 + row : N - 1;
        if (u < cb)
            cp_async8(&st->wc[row][u * 8], wc + n * (int64_t)(nb * 8) + (int64_t)(b0 + u) * 8);
        r->ws[k] = u < cb ? __ldg(ws + n * nb + b0 + u) : 0;
    }
    cp_async_commit();
#pragma unroll
    for (int k = 0; k < QD_H16_AK(NT); k++) {
        int i = tid + k * 32 * QD_H16_W, row = i / QD_H16_CB, u = i % QD_H16_CB;
        bool in = row < T && u < cb;
        r->ac[k] = in ? __ldg((const uint2 *)(ac + (int64_t)row * (nb * 8) + (int64_t)(b0 + u) * 8))
                      : make_uint2(0, 0);
        r->as[k] = in ? __ldg(as + (int64_t)row * nb + b0 + u) : 0;
    }
}

/* The registers of h16_fetch into the stage: sw * 2^14 as float, the
 * activations as FP16 a * sa in thread t's slot order. */
template <int NT>
static __device__ __forceinline__ void h16_store(h16_stage<NT> *st, const h16_regs<NT> *r, const float *lut)
{
    int tid = threadIdx.x;
#pragma unroll
    for (int k = 0; k < QD_H16_WK; k++) {
        int i = tid + k * 32 * QD_H16_W;
        st->sw[i / QD_H16_CB][i % QD_H16_CB] = lut[r->ws[k]] * 16384.0f;
    }
#pragma unroll
    for (int k = 0; k < QD_H16_AK(NT); k++) {
        int i = tid + k * 32 * QD_H16_W, row = i / QD_H16_CB, u = i % QD_H16_CB;
        a16_block((uint4 *)&st->a[row][u * 32], r->ac[k], lut[r->as[k]]);
    }
}

template <int NT>
__global__ void __launch_bounds__(32 * QD_H16_W, 2)
w4a4_h16_kernel(float *y, const uint8_t *a_codes, const uint8_t *a_scales, const float *a_sdec, int a_per_row,
                const __grid_constant__ w4a4_groups g, int w_per_row, int64_t N, int64_t K, int ilp)
{
    QD_PDL_ENTRY();
    extern __shared__ __align__(16) unsigned char mma_smem[];
    h16_stage<NT> *stage = (h16_stage<NT> *)mma_smem;
    __shared__ float lut[256];
    int z = blockIdx.z;
    int64_t rows = g.rows[z], t0 = (int64_t)blockIdx.y * 8 * NT, n0 = (int64_t)blockIdx.x * QD_H16_ROWS;
    if (t0 >= rows)
        return;
    e4m3_table(lut);
    __syncthreads();
    int T = rows - t0 < 8 * NT ? (int)(rows - t0) : 8 * NT, nb = (int)(K / 16);
    int nchunk = (nb + QD_H16_CB - 1) / QD_H16_CB;
    int64_t r0 = g.row0[z] + t0;
    const uint8_t *ac = a_codes + r0 * (K / 2), *as = a_scales + r0 * nb;
    int lane = threadIdx.x & 31, gq = lane >> 2, t = lane & 3, w = threadIdx.x >> 5;
    int wr0 = 16 * w + gq, wr1 = wr0 + 8;
    float acc[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++)
        acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    h16_regs<NT> reg;
    h16_fetch<NT>(&stage[0], &reg, g.codes[z], g.scales[z], n0, N, nb, ac, as, T, 0,
                  nb < QD_H16_CB ? nb : QD_H16_CB);
    h16_store<NT>(&stage[0], &reg, lut);
    cp_async_wait_all();
    __syncthreads();
    for (int c = 0; c < nchunk; c++) {
        h16_stage<NT> *cur = &stage[c & 1], *nxt = &stage[(c + 1) & 1];
        int b0 = c * QD_H16_CB, cbc = nb - b0 < QD_H16_CB ? nb - b0 : QD_H16_CB;
        int nb0 = b0 + QD_H16_CB, cbn = nb - nb0 < QD_H16_CB ? nb - nb0 : QD_H16_CB;
        if (c + 1 < nchunk)
            h16_fetch<NT>(nxt, &reg, g.codes[z], g.scales[z], n0, N, nb, ac, as, T, nb0, cbn);
        auto sf = [&](int j, float &s0, float &s1) {
            s0 = cur->sw[wr0][j];
            s1 = cur->sw[wr1][j];
        };
        if (ilp && T >= 8 * NT)
            h16_chunk<NT, true>(acc, &cur->wc[wr0][2 * t], &cur->wc[wr1][2 * t], &cur->a[gq][8 * t], cbc, T, sf);
        else
            h16_chunk<NT, false>(acc, &cur->wc[wr0][2 * t], &cur->wc[wr1][2 * t], &cur->a[gq][8 * t], cbc, T, sf);
        if (c + 1 < nchunk)
            h16_store<NT>(nxt, &reg, lut);
        cp_async_wait_all();
        __syncthreads();
    }
    h16_out<NT>(y + r0 * N, acc, T, t, n0, wr0, N, a_sdec + (a_per_row ? r0 : 0), a_per_row, g.sdec[z], w_per_row);
}

/* The FP16 kernel for a few tens of activation rows (decode's attention
 * linears at batch 16-256; q, k and v in one launch): the activations made
 * FP16 a * sa once (a16_kernel, global scratch) and copied by cp.async, so
 * nothing is converted twice but the weights (once a CTA). A CTA of 4 warps
 * takes 64 weight rows (16 a warp) and 8 * NT activation rows (blockIdx.y's
 * tile), its weight scales copied whole into shared memory first, and K in
 * chunks of QD_H16_CB blocks through a ring of QD_HPRE_STAGES stages (the
 * chunks' weight codes and activations by cp.async, QD_HPRE_STAGES - 1 in
 * flight); the same MMAs and FFMAs in the same order as w4a4_h16_kernel:
 * the same bits. Products i < count of one M and K (each its own activation,
 * weights, N and output) take the CTAs start[i] .. start[i+1]-1 of blockIdx.x. */
#define QD_HPRE_MAX 4
#define QD_HPRE_STAGES 4
typedef struct {
    int count, start[QD_HPRE_MAX + 1], ilp;
    float *y[QD_HPRE_MAX];
    const uint8_t *a16[QD_HPRE_MAX], *codes[QD_HPRE_MAX], *scales[QD_HPRE_MAX];
    const float *a_sdec[QD_HPRE_MAX], *sdec[QD_HPRE_MAX];
    int64_t N[QD_HPRE_MAX];
} hpre_args;

__global__ void a16_kernel(uint4 *out, const uint8_t *codes, const uint8_t *scales, int64_t items)
{
    QD_PDL_ENTRY();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < items; i += (int64_t)gridDim.x * blockDim.x)
        a16_block(out + 2 * i, __ldg((const uint2 *)codes + i), qd_e4m3_to_f32(__ldg(scales + i)));
}

template <int NT>
struct hpre_stage {
    uint8_t wc[64][QD_H16_WLD];
    __align__(16) uint8_t a[8 * NT][QD_H16_ALD];
};

/* chunk b0 .. b0+cb-1 of the CTA's weight codes and activation rows (rows past
 * N read row N-1, never stored; activation rows past T zero-filled) */
template <int NT>
static __device__ __forceinline__ void hpre_fetch(hpre_stage<NT> *st, const uint8_t *wc, int64_t n0, int64_t N,
                                                  int nb, const uint8_t *a16, int T, int b0, int cb)
{
    int tid = threadIdx.x;
#pragma unroll
    for (int k = 0; k < 64 * QD_H16_CB / 128; k++) {
        int i = tid + k * 128, row = i / QD_H16_CB, u = i % QD_H16_CB;
        int64_t n = n0 + row < N ? n0 + row : N - 1;
        if (u < cb)
            cp_async8(&st->wc[row][u * 8], wc + n * (int64_t)(nb * 8) + (int64_t)(b0 + u) * 8);
    }
    if (cb == QD_H16_CB) { /* every chunk but a short last one: the division by a constant */
#pragma unroll
        for (int k = 0; k < (8 * NT * 2 * QD_H16_CB + 127) / 128; k++) {
            int i = tid + 128 * k, row = i / (2 * QD_H16_CB), v = i % (2 * QD_H16_CB);
            bool in = row < T;
            if (i < 8 * NT * 2 * QD_H16_CB)
                cp16(&st->a[row][v * 16], a16 + ((int64_t)(in ? row : 0) * nb + b0) * 32 + v * 16, in);
        }
        return;
    }
    for (int i = tid; i < 8 * NT * 2 * cb; i += 128) {
        int row = i / (2 * cb), v = i - row * 2 * cb;
        bool in = row < T;
        cp16(&st->a[row][v * 16], a16 + ((int64_t)(in ? row : 0) * nb + b0) * 32 + v * 16, in);
    }
}

template <int N>
static __device__ __forceinline__ void cp_async_wait_group() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

template <int NT>
__global__ void __launch_bounds__(128)
w4a4_hpre_kernel(const __grid_constant__ hpre_args p, int a_per_row, int w_per_row, int64_t M, int64_t K)
{
    QD_PDL_ENTRY();
    extern __shared__ __align__(16) unsigned char mma_smem[];
    constexpr int S = QD_HPRE_STAGES;
    hpre_stage<NT> *stage = (hpre_stage<NT> *)mma_smem;
    uint8_t *wsc_s = mma_smem + S * sizeof(hpre_stage<NT>); /* [64][nb + 4] the weight scales' bytes */
    __shared__ float lut[256];
    int pi = 0;
    while (pi + 1 < p.count && (int)blockIdx.x >= p.start[pi + 1])
        pi++;
    int64_t N = p.N[pi], n0 = (int64_t)(blockIdx.x - p.start[pi]) * 64, t0 = (int64_t)blockIdx.y * 8 * NT;
    int T = M - t0 < 8 * NT ? (int)(M - t0) : 8 * NT, nb = (int)(K / 16), nchunk = (nb + QD_H16_CB - 1) / QD_H16_CB;
    int sld = nb + 4;
    const uint8_t *a16 = p.a16[pi] + t0 * (K * 2), *wc = p.codes[pi], *wsc = p.scales[pi];
    /* the scales (in the first group of copies): 4 bytes a copy where rows allow */
    if (nb % 4 == 0 && ((uintptr_t)wsc & 3) == 0) {
        /* copy i: row i / (nb / 4), word i % (nb / 4); a thread's copies
         * 128 apart, so both step by a constant (no division a copy) */
        const int qw = nb / 4, dr = 128 / qw, dq = 128 - dr * qw;
        int row = (int)threadIdx.x / qw, q = (int)threadIdx.x - row * qw;
        for (int i = threadIdx.x; i < 16 * nb; i += 128) {
            int64_t n = n0 + row < N ? n0 + row : N - 1;
            unsigned d = (unsigned)__cvta_generic_to_shared(wsc_s + row * sld + 4 * q);
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(wsc + n * nb + 4 * q));
            row += dr;
            q += dq;
            if (q >= qw) {
                q -= qw;
                row++;
            }
        }
    } else {
        for (int i0 = threadIdx.x; i0 < 64 * nb; i0 += 128 * 8) {
            uint8_t v[8];
#pragma unroll
            for (int k = 0; k < 8; k++) {
                int i = i0 + 128 * k, row = i / nb;
                int64_t n = n0 + row < N ? n0 + row : N - 1;
                v[k] = i < 64 * nb ? __ldg(wsc + n * nb + (i - row * nb)) : 0;
            }
#pragma unroll
            for (int k = 0; k < 8; k++) {
                int i = i0 + 128 * k, row = i / nb;
                if (i < 64 * nb)
                    wsc_s[row * sld + (i - row * nb)] = v[k];
            }
        }
    }
#pragma unroll 1
    for (int s0 = 0; s0 < S - 1; s0++) {
        if (s0 < nchunk) {
            int b0 = s0 * QD_H16_CB;
            hpre_fetch<NT>(&stage[s0], wc, n0, N, nb, a16, T, b0, nb - b0 < QD_H16_CB ? nb - b0 : QD_H16_CB);
        }
        cp_async_commit();
    }
    e4m3_table(lut);
    int lane = threadIdx.x & 31, gq = lane >> 2, t = lane & 3, w = threadIdx.x >> 5;
    int wr0 = 16 * w + gq, wr1 = wr0 + 8;
    float acc[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++)
        acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    for (int c = 0; c < nchunk; c++) {
        cp_async_wait_group<S - 2>(); /* chunk c's copies (this thread's) are done */
        __syncthreads();              /* everyone's; and chunk c-1's stage is free */
        int cn = c + S - 1;
        if (cn < nchunk) {
            int b0 = cn * QD_H16_CB;
            hpre_fetch<NT>(&stage[cn % S], wc, n0, N, nb, a16, T, b0, nb - b0 < QD_H16_CB ? nb - b0 : QD_H16_CB);
        }
        cp_async_commit();
        const hpre_stage<NT> *cur = &stage[c % S];
        int b0 = c * QD_H16_CB, cbc = nb - b0 < QD_H16_CB ? nb - b0 : QD_H16_CB;
        auto sf = [&](int j, float &s0, float &s1) {
            s0 = lut[wsc_s[wr0 * sld + b0 + j]] * 16384.0f;
            s1 = lut[wsc_s[wr1 * sld + b0 + j]] * 16384.0f;
        };
        if (p.ilp && T >= 8 * NT)
            h16_chunk<NT, true>(acc, &cur->wc[wr0][2 * t], &cur->wc[wr1][2 * t], &cur->a[gq][8 * t], cbc, T, sf);
        else
            h16_chunk<NT, false>(acc, &cur->wc[wr0][2 * t], &cur->wc[wr1][2 * t], &cur->a[gq][8 * t], cbc, T, sf);
    }
    cp_async_wait_group<0>();
    h16_out<NT>(p.y[pi] + t0 * N, acc, T, t, n0, wr0, N, p.a_sdec[pi] + (a_per_row ? t0 : 0), a_per_row, p.sdec[pi],
                w_per_row);
}

/* The W4A4 FP16 product on Hopper's warpgroup MMA (w4a4_hwg_kernel;
 * the default on Hopper since 2026-12-07, QUADS_W4A4_HWG=0 for the mma.sync
 * kernel): w4a4_h16_kernel's operands and
 * order, each block's 16-slot sum by one wgmma m64nNAk16 started from zero
 * (the weight rows from registers, the activation rows from shared memory)
 * instead of NA / 8 mma.sync m16n8k16, then the same fmaf(d, sw * 2^14, acc)
 * an output, blocks ascending: the same bits. A CTA of WGS warpgroups (2, or
 * 4 with QUADS_W4A4_HWG_WGS=4: the activations converted once for twice the
 * weight rows) takes 64 * WGS weight rows (64 a warpgroup, 16 a warp as in
 * w4a4_h16_kernel) and NA (64 or 128) activation rows of a group; K in chunks of 8 blocks, double
 * buffered: the weight codes and scale bytes by cp.async, the activations'
 * codes and scales through registers, then written as FP16 a * sa into two
 * K-major 128-byte-swizzled tiles of 64 K values (cuda_wgmma.h's layout),
 * their k-slots in the weights' slot order (codes 4t, 4t+2 in slots 2t, 2t+1
 * and 4t+1, 4t+3 in slots 2t+8, 2t+9: a block's exact sum does not depend on
 * which slot holds which product, only that both operands agree). K a
 * multiple of 64 (since 2026-12-07d; 128 before): a short last chunk of 4
 * blocks ends the chain where K is not a multiple of 128 (the RAC down
 * projection's 768 + 192 at ratio 0.25). */
#define QD_HWG_CB 8                     /* blocks a chunk */
#define QD_HWG_WLD (QD_HWG_CB * 8 + 16) /* bytes a staged weight row (16-byte copies; g's 8 rows in distinct banks) */
template <int NA, int WGS>
struct __align__(1024) hwg_stage { /* a multiple of 1,024 bytes: each stage's tiles 1,024-aligned */
    uint8_t a[2][NA * 128];                /* FP16 a * sa: two tiles of NA rows x 64 K values, 128-byte swizzle */
    uint8_t wc[64 * WGS][QD_HWG_WLD];       /* the weight codes of 64 rows a warpgroup x 8 blocks */
    uint32_t ws[64 * WGS][QD_HWG_CB / 4];   /* their E4M3 scale bytes */
};
#define QD_HWG_AK(NA, WGS) ((NA) * QD_HWG_CB / (128 * (WGS))) /* activation items (row, block) a thread a chunk */

#if QD_WG_ARCH /* the wgmma kernel's alone (its body is empty elsewhere) */
/* One activation block (16 codes c, scale sa) as 16 FP16 a * sa in the
 * wgmma tiles' slot order: d0 slots 0-7 (codes 0, 2, 4, ..., 14), d1 slots
 * 8-15 (codes 1, 3, ..., 15); the values of a16_block. */
static __device__ __forceinline__ void a16wg_block(uint4 &d0, uint4 &d1, uint2 c, float sa)
{
    uint32_t lo[4], hi[4];
    a16_pairs(lo, hi, c, sa);
    d0 = make_uint4(lo[0], lo[2], hi[0], hi[2]);
    d1 = make_uint4(lo[1], lo[3], hi[1], hi[3]);
}
#endif

template <int NA, int PIPE, int WGS, int PART = 0>
__global__ void __launch_bounds__(128 * WGS, NA == 64 && PIPE != 1 && WGS == 2 ? 2 : 1)
w4a4_hwg_kernel(float *y, const uint8_t *a_codes, const uint8_t *a_scales, const float *a_sdec, int a_per_row,
                const __grid_constant__ w4a4_groups g, int w_per_row, int64_t N, int64_t K)
{
    QD_PDL_ENTRY();
#if QD_WG_ARCH
    constexpr int NACC = NA / 2, AK = QD_HWG_AK(NA, WGS), NT = 128 * WGS, WR = 64 * WGS;
    extern __shared__ __align__(16) unsigned char hwg_smem[];
    const uint32_t base = (smem_u32(hwg_smem) + 1023) & ~1023u;
    hwg_stage<NA, WGS> *stage = (hwg_stage<NA, WGS> *)(hwg_smem + (base - smem_u32(hwg_smem)));
    __shared__ float lut[256];
    int z = blockIdx.z;
    int64_t rows = g.rows[z], t0 = (int64_t)blockIdx.y * NA, n0 = (int64_t)blockIdx.x * WR;
    if (t0 >= rows)
        return;
    e4m3_table(lut);
    int T = rows - t0 < NA ? (int)(rows - t0) : NA, nb = (int)(K / 16),
        nchunk = PART ? (nb + QD_HWG_CB - 1) / QD_HWG_CB : nb / QD_HWG_CB;
    /* PART (K a multiple of 64, not of 128; no PIPE): a short last chunk of
     * 4 blocks, the scale rows (not on 8 bytes) copied 4 bytes at a time */
    static_assert(!PART || !PIPE, "PART without PIPE");
    auto blocks_of = [&](int c) { return PART && nb - c * QD_HWG_CB < QD_HWG_CB ? nb - c * QD_HWG_CB : QD_HWG_CB; };
    int64_t r0 = g.row0[z] + t0;
    const uint8_t *ac = a_codes + r0 * (K / 2), *as = a_scales + r0 * nb, *wc = g.codes[z], *ws = g.scales[z];
    int tid = threadIdx.x, lane = tid & 31, gq = lane >> 2, t = lane & 3, w = tid >> 5;
    int wr0 = 16 * w + gq, wr1 = wr0 + 8;
    uint2 rc[AK];
    uint8_t rs[AK];
    /* chunk c: the weights' codes and scale bytes by cp.async into st, the activations into rc, rs */
    auto fetch = [&](hwg_stage<NA, WGS> *st, int c) {
        int b0 = c * QD_HWG_CB, cb = blocks_of(c);
#pragma unroll
        for (int k = 0; k < 2; k++) { /* WR rows x 4 copies of 16 bytes */
            int i = tid + NT * k, row = i >> 2, u = i & 3;
            int64_t n = n0 + row < N ? n0 + row : N - 1;
            if constexpr (PART)
                cp16(&st->wc[row][16 * u], wc + n * (int64_t)(nb * 8) + (int64_t)(2 * u < cb ? b0 * 8 + 16 * u : 0),
                     2 * u < cb);
            else
                cp16(&st->wc[row][16 * u], wc + n * (int64_t)(nb * 8) + (int64_t)b0 * 8 + 16 * u, true);
        }
        if (tid < WR) {
            int64_t n = n0 + tid < N ? n0 + tid : N - 1;
            if constexpr (!PART)
                cp_async8(&st->ws[tid][0], ws + n * nb + b0);
            else
#pragma unroll
                for (int v = 0; v < 2; v++)
                    cp4(&st->ws[tid][v], ws + n * nb + (4 * v < cb ? b0 + 4 * v : 0), 4 * v < cb);
        }
        cp_async_commit();
#pragma unroll
        for (int k = 0; k < AK; k++) {
            int i = tid + NT * k, row = i / QD_HWG_CB, u = i % QD_HWG_CB;
            bool in = row < T && (!PART || u < cb);
            rc[k] = in ? __ldg((const uint2 *)(ac + (int64_t)row * (nb * 8) + (int64_t)(b0 + u) * 8)) : make_uint2(0, 0);
            rs[k] = in ? __ldg(as + (int64_t)row * nb + b0 + u) : 0;
        }
    };
    /* rc, rs as FP16 into st's swizzled tiles: row r's 16-byte unit v at v ^ (r % 8) */
    auto store = [&](hwg_stage<NA, WGS> *st) {
#pragma unroll
        for (int k = 0; k < AK; k++) {
            int i = tid + NT * k, row = i / QD_HWG_CB, u = i % QD_HWG_CB;
            uint4 d0, d1;
            a16wg_block(d0, d1, rc[k], lut[rs[k]]);
            uint8_t *rowp = st->a[u >> 2] + row * 128;
            int v = 2 * (u & 3);
            *(uint4 *)(rowp + 16 * (v ^ (row & 7))) = d0;
            *(uint4 *)(rowp + 16 * ((v + 1) ^ (row & 7))) = d1;
        }
    };
    __syncthreads(); /* the table */
    fetch(&stage[0], 0);
    store(&stage[0]);
    cp_async_wait_all();
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* the tiles visible to wgmma's reads */
    __syncthreads();
    float acc[NACC], d[PIPE ? 2 : 1][NACC];
#pragma unroll
    for (int i = 0; i < NACC; i++) {
        acc[i] = d[0][i] = 0.0f;
        if constexpr (PIPE)
            d[1][i] = 0.0f;
    }
    float sp0 = 0.0f, sp1 = 0.0f; /* PIPE: the scales of the block whose sums are in flight */
    uint32_t afp[4] = {0, 0, 0, 0}; /* PIPE: its A fragment, kept live (unreused) until its wgmma is waited for */
    /* a waited block's sums dd into the accumulators, the weight rows' scales a0, a1 (x 2^14) */
    auto add = [&](float(&dd)[NACC], float a0, float a1) {
        qd_wg_fence_acc(dd);
#pragma unroll
        for (int i = 0; i < NACC; i++)
            acc[i] = fmaf(dd[i], (i & 2) ? a1 : a0, acc[i]);
    };
    for (int c = 0; c < nchunk; c++) {
        hwg_stage<NA, WGS> *cur = &stage[c & 1];
        if (c + 1 < nchunk)
            fetch(&stage[(c + 1) & 1], c + 1);
        uint32_t ws0 = cur->ws[wr0][0], ws1 = cur->ws[wr0][1], wt0 = cur->ws[wr1][0], wt1 = cur->ws[wr1][1];
        uint32_t abase = smem_u32(cur->a[0]);
        const int cbc = blocks_of(c);
#pragma unroll
        for (int j = 0; j < QD_HWG_CB; j++) {
            if (PART && j >= cbc) /* the short last chunk */
                break;
            uint32_t xg = *(const uint16_t *)&cur->wc[wr0][8 * j + 2 * t];
            uint32_t xh = *(const uint16_t *)&cur->wc[wr1][8 * j + 2 * t];
            uint32_t r[4];
            qd_e2m1x8_h16(r, __byte_perm(xg, xh, 0x5140));
            const uint32_t af[4] = {r[0], r[2], r[1], r[3]};
            float s0 = lut[((j < 4 ? ws0 : ws1) >> (8 * (j & 3))) & 0xff] * 16384.0f;
            float s1 = lut[((j < 4 ? wt0 : wt1) >> (8 * (j & 3))) & 0xff] * 16384.0f;
            uint64_t db = qd_wg_desc(abase + (uint32_t)((j >> 2) * NA * 128 + (j & 3) * 32), 16, 1024);
            float(&dj)[NACC] = d[PIPE ? j & 1 : 0];
            qd_wg_fence();
            if constexpr (NA == 64)
                qd_wgmma_rs64_f16z(dj, af, db);
            else
                qd_wgmma_rs128_f16z(dj, af, db);
            qd_wg_commit();
            if constexpr (PIPE) { /* block j's sums in flight while block j - 1's are added */
                if (j > 0) {
                    qd_wg_wait<1>();
                    asm volatile("" ::"r"(afp[0]), "r"(afp[1]), "r"(afp[2]), "r"(afp[3]) : "memory");
                    add(d[(j - 1) & 1], sp0, sp1);
                }
                sp0 = s0;
                sp1 = s1;
#pragma unroll
                for (int q = 0; q < 4; q++)
                    afp[q] = af[q];
            } else {
                qd_wg_wait<0>();
                add(dj, s0, s1);
            }
        }
        if constexpr (PIPE) { /* the chunk's last block */
            qd_wg_wait<0>();
            asm volatile("" ::"r"(afp[0]), "r"(afp[1]), "r"(afp[2]), "r"(afp[3]) : "memory");
            add(d[(QD_HWG_CB - 1) & 1], sp0, sp1);
        }
        if (c + 1 < nchunk)
            store(&stage[(c + 1) & 1]);
        cp_async_wait_all();
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
    }
    /* acc[4 j + 2 h + u]: weight row wr0 + 8 h, activation row 8 j + 2 t + u */
    const float *asd = a_sdec + (a_per_row ? r0 : 0), *wsd = g.sdec[z];
    float *yz = y + r0 * N;
#pragma unroll
    for (int i = 0; i < NACC; i++) {
        int m = 8 * (i >> 2) + 2 * t + (i & 1);
        int64_t n = n0 + wr0 + ((i & 2) ? 8 : 0);
        if (m < T && n < N)
            yz[m * N + n] = acc[i] * (asd[a_per_row ? m : 0] * wsd[w_per_row ? n : 0]);
    }
#endif
}

/* The decode experts' products with every warp streaming its own weight rows
 * (w4a4_stream_kernel; QUADS_W4A4_STREAM=1, opt-in until run on a GPU). At
 * batch 64 the MMA kernel's CTAs walk K a chunk at a time, the weight
 * scales and activations staged through registers and a CTA barrier a chunk,
 * and the experts' product sits near 1.2 TB/s (H100 and H200) whatever its
 * instruction count or ring depth. Here a CTA of 4 warps takes 64 weight rows
 * and at most TR (8 or 16) activation rows of a group; the activations are
 * converted once for the whole of K into shared memory (pair_stage's layout:
 * int8 codes 2*E2M1, rows K + 32 bytes, and a float4 {sa, sa', -(magic + 12
 * sum), ...} a block pair), and each warp then streams its 16 weight rows, raw
 * codes and scale bytes, through a ring of its own (S stages of CB blocks,
 * S - 1 in flight, 16-byte cp.async copies, no CTA barrier past the first;
 * QUADS_W4A4_STREAM_CFG picks CB, S and how the weight scales are decoded;
 * QUADS_W4A4_STREAM_RG how many slabs of 64 rows a CTA takes). The products
 * are pair_chunk's: the same MMAs on the same operands and the same FFMA
 * chain an output in ascending block order, so the same bits. K a multiple of 64 (a short last chunk); a group
 * of more rows than TR takes a CTA per TR (the weights read again, from L2
 * where they run side by side). */
#define QD_ST_AB 8 /* activation blocks a thread loads at once */
template <int CB> struct st_warp { /* one warp's stage of CB blocks (16 or 32) */
    uint8_t wc[16][CB * 8 + 16];   /* codes: 16 rows x CB blocks (+16: ldmatrix without conflicts) */
    uint8_t ws[16][CB];            /* the scales' E4M3 bytes */
};

/* the activations of a tile of TR rows (8 or 16): int8 codes, rows K + 32
 * bytes, then a float4 a block pair */
static __host__ __device__ __forceinline__ size_t st_act_bytes(int64_t K, int TR)
{
    return (size_t)TR * (size_t)(K + 32) + (size_t)TR * (size_t)(K / 32 + 1) * 16;
}

/* two E4M3 bytes held in a register's low 16 bits (the lower first) as
 * floats by the hardware's conversion (every E4M3 value is a normal FP16 or
 * zero: the same values as the table) */
static __device__ __forceinline__ float2 e4m3x2_f32v(uint32_t v)
{
    float2 f;
    asm("{\n\t.reg .b16 lo, hi;\n\t.reg .b32 h;\n\tcvt.rn.f16x2.e4m3x2 h, %2;\n\tmov.b32 {lo, hi}, h;\n\t"
        "cvt.f32.f16 %0, lo;\n\tcvt.f32.f16 %1, hi;\n\t}"
        : "=f"(f.x), "=f"(f.y)
        : "h"((unsigned short)v));
    return f;
}

/* e4m3x2_f32v of the two bytes at p */
static __device__ __forceinline__ float2 e4m3x2_f32(const uint8_t *p)
{
    return e4m3x2_f32v(*(const unsigned short *)p);
}

/* pair_chunk for a warp's own stage: the weight scales as E4M3 bytes (their
 * values from the table lut, or with FC e4m3x2_f32's; FC 3: floats the warp
 * made of the stage's bytes, wf [16][CB]), the activations those
 * of the whole of K from the chunk's block on (rows ald bytes apart, sp's
 * rows spld float4 apart) */
template <int NG, int CB, int FC = 0>
static __device__ __forceinline__ void st_chunk(const st_warp<CB> *cur, const int8_t *act, const float4 *sp, int ald,
                                                int spld, const float *lut, float (*acc)[4], int T, int lane, int njq,
                                                const float *wf = nullptr)
{
    int gq = lane >> 2, t = lane & 3;
    const uint8_t *s0 = cur->ws[gq], *s1 = cur->ws[gq + 8];
    pair_terms<NG, CB / 4, FC >= 2>(
        &cur->wc[(lane & 7) + 8 * ((lane >> 3) & 1)][16 * (lane >> 4)], act + (gq >> 1) * ald + (gq & 1) * 16 + 8 * (t & 1),
        ald,
        [&](int jp, float2 &w0, float2 &w1) {
            if constexpr (FC == 3) {
                w0 = *(const float2 *)&wf[gq * CB + 2 * jp];
                w1 = *(const float2 *)&wf[(gq + 8) * CB + 2 * jp];
            } else if constexpr (FC > 0) {
                w0 = e4m3x2_f32(s0 + 2 * jp);
                w1 = e4m3x2_f32(s1 + 2 * jp);
            } else {
                w0 = make_float2(lut[s0[2 * jp]], lut[s0[2 * jp + 1]]);
                w1 = make_float2(lut[s1[2 * jp]], lut[s1[2 * jp + 1]]);
            }
        },
        [&](int row, int jp) { return sp[row * spld + jp]; }, acc, T, t, (t >> 1) == (gq & 1), njq);
}

/* The device offsets of w4a4_stream_kernel's DEV 2: d_off (E + 1, E <= 128)
 * and the experts' codes, scales and s_dec pointers (tab: E of each). */
typedef struct {
    const int32_t *d_off;
    const void *const *tab;
    int E;
} st_src;

/* DEV 1: the groups are *gd in device memory and the CTAs' (group, 8-row tile)
 * pairs items[0 .. *nitems-1] (w4a4_items_from_dev), blockIdx.y picking one;
 * those past them exit. DEV 2 (the default; QUADS_GFD_INLINE=0 for DEV 1): each CTA finds its own
 * (expert, tile) from src's offsets (a scan of the experts' tile counts, one
 * thread an expert), so no w4a4_items_from_dev launch comes before: the same
 * pairs in the same order (experts with rows ascending, tiles ascending), the
 * same bits. */
template <int DEV, int CB, int S, int TR, int FC = 0, int PART = 0, int CI = 0>
__global__ void __launch_bounds__(128)
w4a4_stream_kernel(float *y, const uint8_t *a_codes, const uint8_t *a_scales, const float *a_sdec, int a_per_row,
                   const __grid_constant__ w4a4_groups g, int w_per_row, int64_t N, int64_t K, const w4a4_groups *gd,
                   const int *items, const int *nitems, int rg, st_src src)
{
    QD_PDL_ENTRY();
    static_assert(FC != 3 || CI, "FC 3's conversion pass is in the counted loop");
    extern __shared__ __align__(16) unsigned char st_smem[];
    __shared__ float lut[256];
    int z = blockIdx.z;
    int64_t tile = blockIdx.y, rows, grow0;
    const uint8_t *wcodes, *wscales;
    const float *sdw;
    if constexpr (DEV == 2) {
        __shared__ int s_tot[4], s_hit[4];
        const int e = threadIdx.x, ln = e & 31;
        int er0 = e < src.E ? src.d_off[e] : 0, erows = e < src.E ? src.d_off[e + 1] - er0 : 0;
        int nt = erows > 0 ? (erows + TR - 1) / TR : 0, incl = qd_warp_incl_sum(nt, ln);
        if (ln == 31)
            s_tot[e >> 5] = incl;
        if (e == 0)
            s_hit[0] = -1;
        __syncthreads();
        int ex = incl - nt, yb = (int)blockIdx.y;
        for (int i = 0; i < (e >> 5); i++)
            ex += s_tot[i];
        if (nt && yb >= ex && yb < ex + nt) {
            s_hit[0] = e;
            s_hit[1] = yb - ex;
            s_hit[2] = er0;
            s_hit[3] = erows;
        }
        __syncthreads();
        if (s_hit[0] < 0)
            return;
        z = s_hit[0];
        tile = s_hit[1];
        grow0 = s_hit[2];
        rows = s_hit[3];
        wcodes = (const uint8_t *)src.tab[z];
        wscales = (const uint8_t *)src.tab[src.E + z];
        sdw = (const float *)src.tab[2 * src.E + z];
    } else {
        if constexpr (DEV == 1) {
            if ((int)blockIdx.y >= *nitems)
                return;
            int v = items[blockIdx.y];
            z = v & 0xffff;
            tile = v >> 16;
        }
        const w4a4_groups &G = DEV ? *gd : g;
        rows = G.rows[z];
        grow0 = G.row0[z];
        wcodes = G.codes[z];
        wscales = G.scales[z];
        sdw = G.sdec[z];
    }
    const int64_t t0 = tile * TR, n0 = (int64_t)blockIdx.x * 64 * rg;
    if (t0 >= rows)
        return;
    const int T = rows - t0 < TR ? (int)(rows - t0) : TR, nb = (int)(K / 16),
              nchunk = PART ? (nb + CB - 1) / CB : nb / CB, nq = rg * nchunk;
    const int ald = (int)K + 32, spld = nb / 2 + 1;
    /* PART (K a multiple of 64, not of 16 CB = 256): the last chunk holds
     * fewer than CB blocks (a multiple of 4), and the scale rows are not on
     * 16 bytes: they are copied 4 bytes at a time */
    auto blocks_of = [&](int c) { return PART && nb - c * CB < CB ? nb - c * CB : CB; };
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, gq = lane >> 2, t = lane & 3;
    int8_t *act = (int8_t *)st_smem;
    float4 *sp = (float4 *)(st_smem + (size_t)TR * ald);
    st_warp<CB> *ring = (st_warp<CB> *)(st_smem + st_act_bytes(K, TR)) + w * S;
    /* FC 3: the warp's float copy of a stage's weight scales, [16][CB] */
    float *wfw = (float *)(st_smem + st_act_bytes(K, TR) + 4 * (size_t)S * sizeof(st_warp<CB>)) + w * 16 * CB;
    /* the warp's rows in slab r of the CTA's rg slabs of 64: 16 from wrow0(r) */
    auto wrow = [&](int r) { return n0 + 64 * (int64_t)r + 16 * w; };
    /* stage q of this warp's rows (chunk c = q % nchunk of slab q / nchunk):
     * codes 16 x CB * 8 bytes (CB / 4 copies a lane, CB / 2 lanes a row),
     * scale bytes 16 x CB (CB / 16 copies a row); rows past N read as zero
     * (never stored) */
    constexpr int PR = CB / 2; /* 16-byte copies a row of codes */
    auto issue = [&](int q) {
        st_warp<CB> *st = &ring[q % S];
        const int c = q % nchunk, cbc = blocks_of(c);
        const int64_t wrow0 = wrow(q / nchunk);
#pragma unroll
        for (int u = 0; u < CB / 4; u++) {
            int i = lane + 32 * u, r = i / PR, v = i % PR;
            if constexpr (PART) {
                bool in = wrow0 + r < N && 2 * v < cbc;
                cp16(&st->wc[r][16 * v], wcodes + (in ? (wrow0 + r) * (K / 2) + (int64_t)c * CB * 8 + 16 * v : 0),
                     in);
            } else {
                bool in = wrow0 + r < N;
                cp16(&st->wc[r][16 * v], wcodes + (in ? wrow0 + r : 0) * (K / 2) + (int64_t)c * CB * 8 + 16 * v, in);
            }
        }
        if constexpr (!PART) {
            if (lane < CB) {
                int r = lane / (CB / 16), v = lane % (CB / 16);
                bool in = wrow0 + r < N;
                cp16(&st->ws[r][16 * v], wscales + (in ? wrow0 + r : 0) * nb + (int64_t)c * CB + 16 * v, in);
            }
        } else {
#pragma unroll
            for (int u = 0; u < CB / 8; u++) { /* 16 rows x CB / 4 words */
                int i = lane + 32 * u, r = i / (CB / 4), v = i % (CB / 4);
                bool in = wrow0 + r < N && 4 * v < cbc;
                cp4(&st->ws[r][4 * v], wscales + (in ? (wrow0 + r) * nb + (int64_t)c * CB + 4 * v : 0), in);
            }
        }
    };
    /* CI (by default in configuration 8; QUADS_W4A4_STREAM_CI=0 for the
     * indexed issue above), !PART: every
     * stage's copies are this lane's fixed ones, moved along the row by the
     * chunk: code copy u is row lane / PR + u * (64 / CB) of the
     * warp's 16, bytes 16 (lane % PR) of the chunk's; the scales' copy (lanes
     * below CB) row lane / (CB / 16), bytes 16 (lane % (CB / 16)). Their
     * sources are set once a slab (slab_src) and the next stage to issue is
     * chunk ic of slab is into ring slot iq, counted, not divided out of q
     * (the integer divisions and 64-bit row products of the indexed form
     * were most of a chunk's ~150 instructions of copy issue). */
    const uint8_t *csrc[CB / 4], *ssrc = wscales;
    bool cin[CB / 4], sin = false;
    int ic = 0, is = 0, iq = 0;
    auto slab_src = [&](int r) {
        const int64_t w0 = wrow(r);
#pragma unroll
        for (int u = 0; u < CB / 4; u++) {
            const int64_t row = w0 + lane / PR + u * (64 / CB);
            cin[u] = row < N;
            csrc[u] = wcodes + (cin[u] ? row * (K / 2) : 0) + 16 * (lane % PR);
        }
        const int64_t srow = w0 + lane / (CB / 16);
        sin = lane < CB && srow < N;
        ssrc = wscales + (sin ? srow * nb : 0) + 16 * (lane % (CB / 16));
    };
    /* the sources move on a chunk (CB blocks) a stage; a row past N keeps
     * reading row 0's place (no bytes: the copies zero-fill) */
    auto issue_next = [&]() {
        st_warp<CB> *st = &ring[iq];
#pragma unroll
        for (int u = 0; u < CB / 4; u++) {
            cp16(&st->wc[lane / PR + u * (64 / CB)][16 * (lane % PR)], csrc[u], cin[u]);
            csrc[u] += CB * 8;
        }
        if (lane < CB)
            cp16(&st->ws[lane / (CB / 16)][16 * (lane % (CB / 16))], ssrc, sin);
        ssrc += CB;
        if (++iq == S)
            iq = 0;
        if (++ic == nchunk) {
            ic = 0;
            if (++is < rg)
                slab_src(is);
        }
    };
    constexpr bool CIN = CI && !PART; /* the counted issue */
    if constexpr (CIN)
        slab_src(0);
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < nq) {
            if constexpr (CIN)
                issue_next();
            else
                issue(s);
        }
        cp_async_commit();
    }
    if constexpr (FC == 0)
        e4m3_table(lut);
    /* the activations, while the weights are in flight: the rows the chunks
     * read (4 or 8, zero past T) x nb blocks, QD_ST_AB blocks' loads a thread
     * in flight at once (they come from L2, a few hundred cycles each) */
    const int64_t r0 = grow0 + t0;
    const int nact = (T <= 4 ? 4 : T <= 8 ? 8 : 16) * nb;
    for (int i0 = threadIdx.x; i0 < nact; i0 += 128 * QD_ST_AB) {
        uint2 c[QD_ST_AB];
        uint8_t sc[QD_ST_AB];
#pragma unroll
        for (int k = 0; k < QD_ST_AB; k++) {
            int i = i0 + 128 * k, m = i / nb, u = i - m * nb;
            c[k] = make_uint2(0, 0);
            sc[k] = 0;
            if (i < nact && m < T) {
                c[k] = __ldg((const uint2 *)(a_codes + (r0 + m) * (K / 2) + (int64_t)u * 8));
                sc[k] = __ldg(a_scales + (r0 + m) * nb + u);
            }
        }
#pragma unroll
        for (int k = 0; k < QD_ST_AB; k++) {
            int i = i0 + 128 * k, m = i / nb, u = i - m * nb;
            if (i >= nact)
                break;
            int4 v = make_int4(e2m1x4_s8(c[k].x & 0xffffu), e2m1x4_s8(c[k].x >> 16), e2m1x4_s8(c[k].y & 0xffffu),
                               e2m1x4_s8(c[k].y >> 16));
            *(int4 *)(act + (size_t)m * ald + 16 * u) = v;
            int sum = __dp4a(v.x, 0x01010101, __dp4a(v.y, 0x01010101, __dp4a(v.z, 0x01010101,
                                                                       __dp4a(v.w, 0x01010101, 0))));
            float *q = (float *)&sp[m * spld + (u >> 1)];
            q[u & 1] = 0.25f * qd_e4m3_to_f32(sc[k]);
            q[2 + (u & 1)] = -__int_as_float(QD_MAGIC_BITS + 12 * sum);
        }
    }
    __syncthreads(); /* the table and the activations, for every warp */
    float acc[TR / 8][4];
#pragma unroll
    for (int i = 0; i < TR / 8; i++)
        acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    const int wr0 = 16 * w + gq, wr1 = wr0 + 8;
    /* a slab's outputs (its weight rows from ns), and the sums start again */
    auto store_slab = [&](int64_t ns) {
#pragma unroll
        for (int nt = 0; nt < TR / 8; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                /* acc[nt][2h + r]: activation row 8 nt + 4h + t, weight row r ? wr1 : wr0 */
                int m = 8 * nt + 4 * (i >> 1) + t;
                int64_t n = ns + (i & 1 ? wr1 : wr0);
                if (m < T && n < N)
                    y[(r0 + m) * N + n] = acc[nt][i] * (a_sdec[a_per_row ? r0 + m : 0] * sdw[w_per_row ? n : 0]);
                acc[nt][i] = 0.0f;
            }
    };
    if constexpr (CI) {
        /* stage q is chunk c of slab r in ring slot k (counted, as the issue's) */
        for (int q = 0, c = 0, r = 0, k = 0; q < nq; q++) {
            cp_async_wait_group<S - 2>(); /* stage q's copies (this lane's) done */
            __syncwarp();                 /* ... and every lane's; stage q - 1 read by all */
            if (q + S - 1 < nq) {
                if constexpr (CIN)
                    issue_next();
                else
                    issue(q + S - 1);
            }
            cp_async_commit();
            if constexpr (FC == 3) {
                /* the stage's 16 x CB scale bytes as floats, CB / 2 a lane (row
                 * lane / 2), each converted once where FC 2 converts each on
                 * the four lanes that read it; the previous chunk's reads of
                 * wfw are done (the warp barrier above) */
                constexpr int PER = CB / 2;
                const uint8_t *sb = &ring[k].ws[lane >> 1][(lane & 1) * PER];
                float *dst = wfw + (lane >> 1) * CB + (lane & 1) * PER;
#pragma unroll
                for (int i = 0; i < PER; i += 8) {
                    const uint2 b = *(const uint2 *)(sb + i);
                    const float2 f0 = e4m3x2_f32v(b.x), f1 = e4m3x2_f32v(b.x >> 16);
                    const float2 f2 = e4m3x2_f32v(b.y), f3 = e4m3x2_f32v(b.y >> 16);
                    *(float4 *)(dst + i) = make_float4(f0.x, f0.y, f1.x, f1.y);
                    *(float4 *)(dst + i + 4) = make_float4(f2.x, f2.y, f3.x, f3.y);
                }
                __syncwarp();
            }
            const int njq = blocks_of(c) / 4;
            const int8_t *ac = act + c * CB * 16;
            const float4 *spc = sp + c * (CB / 2);
            if (T <= 4)
                st_chunk<1, CB, FC>(&ring[k], ac, spc, ald, spld, lut, acc, T, lane, njq, wfw);
            else if (TR == 8 || T <= 8)
                st_chunk<2, CB, FC>(&ring[k], ac, spc, ald, spld, lut, acc, T, lane, njq, wfw);
            else
                st_chunk<TR / 4, CB, FC>(&ring[k], ac, spc, ald, spld, lut, acc, T, lane, njq, wfw);
            if (++k == S)
                k = 0;
            if (++c < nchunk)
                continue;
            c = 0;
            /* slab r done: its outputs, and the sums start again */
            store_slab(n0 + 64 * (int64_t)r++);
        }
    } else {
        for (int q = 0; q < nq; q++) {
            cp_async_wait_group<S - 2>(); /* stage q's copies (this lane's) done */
            __syncwarp();                 /* ... and every lane's; stage q - 1 read by all */
            if (q + S - 1 < nq)
                issue(q + S - 1);
            cp_async_commit();
            const int c = q % nchunk, njq = blocks_of(c) / 4;
            const int8_t *ac = act + c * CB * 16;
            const float4 *spc = sp + c * (CB / 2);
            if (T <= 4)
                st_chunk<1, CB, FC>(&ring[q % S], ac, spc, ald, spld, lut, acc, T, lane, njq);
            else if (TR == 8 || T <= 8)
                st_chunk<2, CB, FC>(&ring[q % S], ac, spc, ald, spld, lut, acc, T, lane, njq);
            else
                st_chunk<TR / 4, CB, FC>(&ring[q % S], ac, spc, ald, spld, lut, acc, T, lane, njq);
            if (c < nchunk - 1)
                continue;
            /* slab q / nchunk done: its outputs, and the sums start again */
            store_slab(n0 + 64 * (int64_t)(q / nchunk));
        }
    }
    cp_async_wait_group<0>();
}

/* The same products where the CTAs of w4a4_mma_kernel would be few (decode):
 * a CTA of QD_SK_W warps owns 16 weight rows and 8 activation rows of a
 * group and splits K between its warps, chunk w + QD_SK_W*i to
 * warp w, each warp staging and multiplying its chunk alone (one HBM latency
 * for the CTA's QD_SK_W chunks, where one warp walked them one after the
 * other); the exact block sums p and both scales go to shared memory, and
 * thread (row, token) then runs the output's chain acc = fmaf(p, sa * sw, acc)
 * over the round's blocks in ascending order: the same operations on the same
 * values in the same order as w4a4_mma_kernel, so the same bits. */
#define QD_SK_W 4
#define QD_SK_RB (QD_SK_W * QD_MMA_CB) /* blocks a round */
struct sk_round {
    float p[QD_SK_RB][16 * 8]; /* block sums of (weight row r, token m) at r * 8 + m */
    float sa[QD_SK_RB][8];     /* activation scales / 4 */
    float sw[QD_SK_RB][16];    /* weight scales */
};

__global__ void __launch_bounds__(32 * QD_SK_W)
w4a4_splitk_kernel(float *y, const uint8_t *a_codes, const uint8_t *a_scales, const float *a_sdec, int a_per_row,
                   const __grid_constant__ w4a4_groups g, int w_per_row, int64_t N, int64_t K)
{
    QD_PDL_ENTRY();
    extern __shared__ __align__(16) unsigned char mma_smem[];
    mma_stage<1, 1> *stages = (mma_stage<1, 1> *)mma_smem;
    sk_round *rd = (sk_round *)(mma_smem + QD_SK_W * sizeof(mma_stage<1, 1>));
    __shared__ float lut[256];
    int z = blockIdx.z;
    int64_t rows = g.rows[z], t0 = (int64_t)blockIdx.y * 8, n0 = (int64_t)blockIdx.x * 16;
    if (t0 >= rows)
        return;
    e4m3_table(lut);
    __syncthreads();
    int T = rows - t0 < 8 ? (int)(rows - t0) : 8, nb = (int)(K / 16), nchunk = (nb + QD_MMA_CB - 1) / QD_MMA_CB;
    int64_t r0 = g.row0[z] + t0;
    const uint8_t *ac = a_codes + r0 * (K / 2), *as = a_scales + r0 * nb;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, gq = lane >> 2, t = lane & 3;
    int orow = threadIdx.x >> 3, otok = threadIdx.x & 7; /* the output this thread sums */
    mma_stage<1, 1> *st = &stages[w];
    float acc = 0.0f;
    for (int c0 = 0; c0 < nchunk; c0 += QD_SK_W) {
        int c = c0 + w;
        if (c < nchunk) {
            int b0 = c * QD_MMA_CB, cbc = nb - b0 < QD_MMA_CB ? nb - b0 : QD_MMA_CB;
            mma_regs<1, 1> reg;
            mma_fetch<1, 1>(st, &reg, g.codes[z], g.scales[z], n0, N, nb, ac, as, T, b0, cbc, lane);
            mma_store<1, 1>(st, &reg, lut, T, lane);
            cp_async_wait_all();
            __syncwarp();
#pragma unroll 4
            for (int j = 0; j < cbc; j++) {
                uint32_t a0 = (uint32_t)e2m1x4_off12(*(const uint16_t *)&st->wc[gq][j * 8 + 2 * t]);
                uint32_t a1 = (uint32_t)e2m1x4_off12(*(const uint16_t *)&st->wc[gq + 8][j * 8 + 2 * t]);
                float4 sc = st->sc[t][j];
                int d[4];
                mma_s8c(d, a0, a1, *(const uint32_t *)&st->a[gq][j * 16 + 4 * t], __float_as_int(sc.z),
                        __float_as_int(sc.w));
                int bl = w * QD_MMA_CB + j;
                float *p = rd->p[bl];
                p[gq * 8 + 2 * t] = __int_as_float(d[0]) - QD_MAGIC;
                p[gq * 8 + 2 * t + 1] = __int_as_float(d[1]) - QD_MAGIC;
                p[(gq + 8) * 8 + 2 * t] = __int_as_float(d[2]) - QD_MAGIC;
                p[(gq + 8) * 8 + 2 * t + 1] = __int_as_float(d[3]) - QD_MAGIC;
                if (gq == 0) {
                    rd->sa[bl][2 * t] = sc.x;
                    rd->sa[bl][2 * t + 1] = sc.y;
                }
                if (t == 0) {
                    rd->sw[bl][gq] = st->sw[gq][j];
                    rd->sw[bl][gq + 8] = st->sw[gq + 8][j];
                }
            }
        }
        __syncthreads();
        int nbr = nb - c0 * QD_MMA_CB < QD_SK_RB ? nb - c0 * QD_MMA_CB : QD_SK_RB;
        if (otok < T) {
#pragma unroll 8
            for (int bl = 0; bl < nbr; bl++)
                acc = fmaf(rd->p[bl][threadIdx.x], rd->sa[bl][otok] * rd->sw[bl][orow], acc);
        }
        __syncthreads();
    }
    int64_t n = n0 + orow;
    if (otok < T && n < N)
        y[(r0 + otok) * N + n] = acc * (a_sdec[a_per_row ? r0 + otok : 0] * g.sdec[z][w_per_row ? n : 0]);
}

/* The same products for the few activation rows of decode (MT <= 8 a CTA):
 * no tensor cores and no K chunks, one HBM latency a CTA. Thread (s, q) of a
 * CTA loads blocks 4q .. 4q+3 (32 bytes of codes, 4 of scales; block by block
 * where K is not a multiple of 64, as RAC's widths) of RT weight
 * rows n0 + s + i * rs, i < RT (a row of K = 2048 is one warp; rs = 256 / (K /
 * 64) rows a CTA and step), before the activations are staged; it then computes
 * each block's term p * (sa * sw) for its MT tokens (p from dp4a on the offset
 * codes, as the MMA kernels' bits; the term is exact, see w4a4_block) into
 * shared memory, and thread (row, m) adds its row's terms in ascending block
 * order from 0: acc + term is fmaf(p, sa * sw, acc) when the product is exact,
 * so the same bits as w4a4_mma_kernel. */
#define QD_DEC_THREADS 256
static __host__ __device__ __forceinline__ int dec_rs(int64_t K) { return QD_DEC_THREADS / (int)((K + 63) / 64); }
static __host__ __device__ __forceinline__ size_t dec_smem(int mt, int rt, int64_t K)
{
    size_t nb = (size_t)(K / 16), nbp = (nb + 3) / 4 * 4;
    return (size_t)mt * nb * (16 + 8) + 256 * 4 + (size_t)dec_rs(K) * rt * mt * (nbp + 4) * 4;
}

/* Several products of one activation shape in one launch (MULTI: q, k and
 * v): linear i takes the CTAs start[i] .. start[i+1]-1 of blockIdx.x, with its
 * own output, activation, weight and N (group 0 of g gives the rows). */
#define QD_DEC_MULTI 4
typedef struct {
    int count, start[QD_DEC_MULTI + 1];
    float *y[QD_DEC_MULTI];
    const uint8_t *a_codes[QD_DEC_MULTI], *a_scales[QD_DEC_MULTI], *w_codes[QD_DEC_MULTI],
        *w_scales[QD_DEC_MULTI];
    const float *a_sdec[QD_DEC_MULTI], *w_sdec[QD_DEC_MULTI];
    int64_t N[QD_DEC_MULTI];
} dec_multi;

/* DEV: the groups are *gd, in device memory, *gd_n of them (written by
 * w4a4_groups_from_dev from the device offsets); blockIdx.z past them exits. */
template <int MT, int RT, bool MULTI, bool DEV>
__global__ void __launch_bounds__(QD_DEC_THREADS)
w4a4_dec_kernel(float *y, const uint8_t *a_codes, const uint8_t *a_scales, const float *a_sdec, int a_per_row,
                const __grid_constant__ w4a4_groups g, int w_per_row, int64_t N, int64_t K,
                const __grid_constant__ dec_multi mu, const w4a4_groups *gd, const int *gd_n)
{
    QD_PDL_ENTRY();
    extern __shared__ __align__(16) unsigned char dec_sm[];
    int z = blockIdx.z;
    if constexpr (DEV) {
        if (z >= *gd_n)
            return;
    }
    const w4a4_groups &G = DEV ? *gd : g;
    int64_t bx = blockIdx.x;
    const uint8_t *w_codes, *w_scales;
    const float *w_sdec;
    if constexpr (MULTI) {
        int i = 0;
        while (i + 1 < mu.count && (int)blockIdx.x >= mu.start[i + 1])
            i++;
        bx -= mu.start[i];
        y = mu.y[i], a_codes = mu.a_codes[i], a_scales = mu.a_scales[i], a_sdec = mu.a_sdec[i];
        w_codes = mu.w_codes[i], w_scales = mu.w_scales[i], w_sdec = mu.w_sdec[i], N = mu.N[i];
    } else {
        w_codes = G.codes[z], w_scales = G.scales[z], w_sdec = G.sdec[z];
    }
    int64_t rows = G.rows[z], t0 = (int64_t)blockIdx.y * MT;
    if (t0 >= rows)
        return;
    int nb = (int)(K / 16), tpr = (nb + 3) / 4, rs = QD_DEC_THREADS / tpr, T = rows - t0 < MT ? (int)(rows - t0) : MT;
    int s = threadIdx.x / tpr, q = threadIdx.x - s * tpr, ld = 4 * tpr + 4;
    bool vec = K % 64 == 0; /* else a block at a time (8-byte codes, 1-byte scales) */
    int64_t n0 = bx * rs * RT;
    /* the weights first: their latency overlaps the staging below */
    uint4 c[RT][2];
    uint32_t s4[RT];
#pragma unroll
    for (int i = 0; i < RT; i++) {
        int64_t n = n0 + s + i * rs;
        c[i][0] = c[i][1] = make_uint4(0, 0, 0, 0);
        s4[i] = 0;
        if (s < rs && n < N) {
            if (vec) {
                const uint4 *pc = (const uint4 *)(w_codes + n * (K / 2)) + 2 * q;
                c[i][0] = __ldg(pc);
                c[i][1] = __ldg(pc + 1);
                s4[i] = __ldg((const uint32_t *)(w_scales + n * nb) + q);
            } else {
                const uint2 *pc = (const uint2 *)(w_codes + n * (K / 2)) + 4 * q;
                const uint8_t *ps = w_scales + n * nb + 4 * q;
                uint2 u[4];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    u[j] = 4 * q + j < nb ? __ldg(pc + j) : make_uint2(0, 0);
                    s4[i] |= 4 * q + j < nb ? (uint32_t)__ldg(ps + j) << (8 * j) : 0u;
                }
                c[i][0] = make_uint4(u[0].x, u[0].y, u[1].x, u[1].y);
                c[i][1] = make_uint4(u[2].x, u[2].y, u[3].x, u[3].y);
            }
        }
    }
    int4 *s_a = (int4 *)dec_sm;                        /* [MT][nb] 16 int8 (2*E2M1) a block */
    float *lut = (float *)(s_a + MT * nb);             /* the weight scales' E4M3 values */
    float *s_t = lut + 256;                            /* [rs * RT * MT][ld] terms (16-byte rows) */
    int2 *s_is = (int2 *)(s_t + rs * RT * MT * ld);    /* [MT][nb] magic bits - 12 * block sum, scale / 4 */
    int64_t r0 = G.row0[z] + t0;
    lut[threadIdx.x] = qd_e4m3_to_f32((uint8_t)threadIdx.x);
    for (int i = threadIdx.x; i < MT * nb; i += QD_DEC_THREADS) {
        int m = i / nb, b = i - m * nb;
        int4 v = make_int4(0, 0, 0, 0);
        float sa = 0.0f;
        if (m < T) {
            uint2 cc = __ldg((const uint2 *)(a_codes + (r0 + m) * (K / 2)) + b);
            v = make_int4(e2m1x4_s8(cc.x & 0xffffu), e2m1x4_s8(cc.x >> 16), e2m1x4_s8(cc.y & 0xffffu),
                          e2m1x4_s8(cc.y >> 16));
            sa = 0.25f * qd_e4m3_to_f32(a_scales[(r0 + m) * nb + b]);
        }
        int sum = __dp4a(v.x, 0x01010101, __dp4a(v.y, 0x01010101, __dp4a(v.z, 0x01010101,
                                                                   __dp4a(v.w, 0x01010101, 0))));
        s_a[i] = v;
        s_is[i] = make_int2(QD_MAGIC_BITS - 12 * sum, __float_as_int(sa));
    }
    __syncthreads();
    if (s < rs) {
        float t[RT][MT * RT <= 4 ? MT : 1][4] = {};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int b = 4 * q + j;
            if (b >= nb) /* terms past nb: zero (never added) */
                break;
#pragma unroll
            for (int i = 0; i < RT; i++) {
                uint32_t lo = j < 2 ? (j ? c[i][0].z : c[i][0].x) : (j == 3 ? c[i][1].z : c[i][1].x);
                uint32_t hi = j < 2 ? (j ? c[i][0].w : c[i][0].y) : (j == 3 ? c[i][1].w : c[i][1].y);
                int w0 = e2m1x4_off12(lo & 0xffffu), w1 = e2m1x4_off12(lo >> 16);
                int w2 = e2m1x4_off12(hi & 0xffffu), w3 = e2m1x4_off12(hi >> 16);
                float sw = lut[(s4[i] >> (8 * j)) & 0xffu];
#pragma unroll
                for (int m = 0; m < MT; m++)
                    if (m < T) {
                        int2 is = s_is[m * nb + b];
                        float p = block_dot4_off(w0, w1, w2, w3, s_a[m * nb + b], is.x);
                        float v = p * (__int_as_float(is.y) * sw);
                        if constexpr (MT * RT <= 4) /* 16-byte stores below */
                            t[i][m][j] = v;
                        else
                            s_t[((s + i * rs) * MT + m) * ld + b] = v;
                    }
            }
        }
        if constexpr (MT * RT <= 4) {
#pragma unroll
            for (int i = 0; i < RT; i++)
#pragma unroll
                for (int m = 0; m < MT; m++)
                    if (m < T)
                        *(float4 *)&s_t[((s + i * rs) * MT + m) * ld + 4 * q] =
                            make_float4(t[i][m][0], t[i][m][1], t[i][m][2], t[i][m][3]);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < rs * RT * MT; i += QD_DEC_THREADS) {
        int rr = i / MT, m = i - rr * MT;
        int64_t nn = n0 + rr;
        if (m < T && nn < N) {
            float acc = qd_sum_up(s_t + i * ld, nb);
            y[(r0 + m) * N + nn] = acc * (a_sdec[a_per_row ? r0 + m : 0] * w_sdec[w_per_row ? nn : 0]);
        }
    }
}

/* ---- host side */


/* A grid-stride launch's CTA count for `work` items. */
static unsigned grid_for(int64_t work)
{
    int64_t g = (work + QD_THREADS - 1) / QD_THREADS, cap = (int64_t)qd_sm_count() * 16;
    return (unsigned)(g < 1 ? 1 : (g > cap ? cap : g));
}

/* Threads of a one-CTA-a-row kernel with `per_row` items a row. */
static unsigned row_threads(int64_t per_row)
{
    int64_t t = (per_row + 31) / 32 * 32;
    return (unsigned)(t < 32 ? 32 : (t > QD_THREADS ? QD_THREADS : t));
}

static qd_status check_shape(const char *fn, int64_t rows, int64_t cols)
{
    if (rows < 0 || cols < 0 || cols % QD_NVFP4_BLOCK)
        return qd_error(QD_ERR_SHAPE, "%s: cols %lld not a multiple of %d (rows %lld)", fn,
                        (long long)cols, QD_NVFP4_BLOCK, (long long)rows);
    return QD_OK;
}

static qd_status check_in(const char *fn, const void *x)
{
    if (!qd_aligned(x, 16))
        return qd_error(QD_ERR_ARG, "%s: input pointer not 16-byte aligned", fn);
    return QD_OK;
}

static qd_status check_scale(const char *fn, qd_scale_kind scale)
{
    if (scale != QD_SCALE_PER_TENSOR && scale != QD_SCALE_PER_ROW)
        return qd_error(QD_ERR_ARG, "%s: scale kind %d", fn, (int)scale);
    return QD_OK;
}

extern "C" qd_status qd_cuda_nvfp4_alloc(qd_nvfp4 *q, int64_t rows, int64_t cols, qd_scale_kind scale)
{
    QD_TRY(check_scale("qd_cuda_nvfp4_alloc", scale));
    QD_TRY(check_shape("qd_cuda_nvfp4_alloc", rows, cols));
    qd_nvfp4 z = {.rows = rows, .cols = cols, .codes = NULL, .scales = NULL, .s_dec = NULL, .per_row = scale};
    *q = z;
    size_t nc = (size_t)(rows * cols / 2), ns = (size_t)(rows * cols / 16);
    size_t nd = (size_t)(scale == QD_SCALE_PER_ROW ? rows : 1);
    if (cudaMalloc((void **)&q->codes, nc ? nc : 1) != cudaSuccess ||
        cudaMalloc((void **)&q->scales, ns ? ns : 1) != cudaSuccess ||
        cudaMalloc((void **)&q->s_dec, (nd ? nd : 1) * sizeof(float)) != cudaSuccess) {
        qd_cuda_nvfp4_free(q);
        return qd_error(QD_ERR_NOMEM, "qd_cuda_nvfp4_alloc: cudaMalloc of %lld x %lld failed",
                        (long long)rows, (long long)cols);
    }
    return QD_OK;
}

extern "C" void qd_cuda_nvfp4_free(qd_nvfp4 *q)
{
    cudaFree(q->codes);
    cudaFree(q->scales);
    cudaFree(q->s_dec);
    q->codes = q->scales = NULL;
    q->s_dec = NULL;
}

extern "C" qd_status qd_cuda_nonfinite_check(void)
{
    int flag = 0, zero = 0;
    QD_CUDA_CHECK(cudaGetLastError());
    QD_CUDA_CHECK(cudaDeviceSynchronize());
    QD_CUDA_CHECK(cudaMemcpyFromSymbol(&flag, qd_cuda_nonfinite, sizeof flag));
    if (flag) {
        QD_CUDA_CHECK(cudaMemcpyToSymbol(qd_cuda_nonfinite, &zero, sizeof zero));
        return qd_error(QD_ERR_NONFINITE, "backends/cuda: input holds a NaN or Inf");
    }
    return QD_OK;
}

/* Per-tensor amax of nblk blocks into the device word *bits. */
template <typename T>
static qd_status launch_amax(uint32_t *bits, const T *x, int64_t nblk)
{
    QD_CUDA_CHECK(cudaMemsetAsync(bits, 0, sizeof *bits));
    qd_launch(amax_kernel<T>, grid_for(nblk), QD_THREADS, 0, bits, x, nblk);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

/* A small device scratch word for per-tensor amax, made once. */
static qd_status amax_word(uint32_t **bits)
{
    static uint32_t *word;
    if (!word)
        QD_CUDA_CHECK(cudaMalloc((void **)&word, sizeof *word));
    *bits = word;
    return QD_OK;
}

/* QUADS_QUANT_LEGACY (bench only): 1 = the quantizer kernels before issue 13's. */
int qd_cuda_quant_legacy;

/* The per-tensor amax state of qk_amax_kernel, made (zeroed) once. */
static qd_status qk_amax_state(qk_amax **a)
{
    static qk_amax *state;
    if (!state) {
        qk_amax *s;
        QD_CUDA_CHECK(cudaMalloc((void **)&s, sizeof *s));
        QD_CUDA_CHECK(cudaMemset(s, 0, sizeof *s));
        state = s;
    }
    *a = state;
    return QD_OK;
}

/* Enqueues the per-tensor amax of n values of x; (*a)->amax holds it after. */
template <typename T>
static qd_status qk_launch_amax(qk_amax **a, const T *x, int64_t n)
{
    int64_t nv = n / (int64_t)(16 / sizeof(T));
    QD_TRY(qk_amax_state(a));
    qd_launch(qk_amax_kernel<T>, grid_for((nv + QK_AMAX_VEC - 1) / QK_AMAX_VEC), QD_THREADS, 0, *a, x, n);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

/* Threads of a qk_rows_kernel CTA for bpr blocks a row: QK_ROW_BLOCKS blocks a
 * thread, or one where the rows (CTAs) are fewer than the SMs (decode: a
 * row's blocks encoded by one warp took 4 us; the per-block work is the
 * same, the absolute maximum order-free, so the same bits).
 * By default (QUADS_ROW_WIDE=0 for the old choice) one block a thread too
 * wherever those CTAs' warps fit in half of every SM's 64 warp slots (decode
 * at batch 64: the experts' 512 input rows and QUADS's RAC rows, 1,024 CTAs of
 * one warp for gate and up, 8 warps an SM, 17.8 us a layer on an H100; with it
 * 4 warps a CTA), not in the prefill's thousands of rows. With QUADS_GATHER4
 * the default since 2026-12-08 (an H100, a3b-4 exact b64, 2 and 2 rounds:
 * quads 1.037x and 1.04x, nvfp4 1.001x). */
#define QK_WIDE_WARPS 32 /* warps an SM the wide CTAs may take in all */
static unsigned qk_row_threads(int64_t bpr, int64_t rows)
{
    static int wide_env = -2;
    int64_t sms = qd_sm_count(), w1 = (bpr + 31) / 32; /* warps a CTA at one block a thread */
    bool wide = qd_env_pick(&wide_env, "QUADS_ROW_WIDE", 0, 1) != 0 && rows * w1 <= sms * QK_WIDE_WARPS;
    int64_t per = rows < sms || wide ? 1 : QK_ROW_BLOCKS;
    int64_t t = ((bpr + per - 1) / per + 31) / 32 * 32;
    return (unsigned)(t > QK_ROW_THREADS ? QK_ROW_THREADS : t);
}

template <typename T>
static qd_status qk_launch_rows(qout o, float *dq, const T *x, int64_t rows, int64_t bpr, qk_scope sc,
                                float *s_dec, float *s_enc_out)
{
    if (rows == 0 || bpr == 0)
        return QD_OK;
    qd_launch(qk_rows_kernel<T>, (unsigned)rows, qk_row_threads(bpr, rows), 0, o, dq, x, bpr, sc, s_dec, s_enc_out);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

template <typename T>
static qd_status qk_launch_flat(uint8_t *codes, uint8_t *scales, float *dq, const T *x, int64_t nblk,
                                qk_scope sc, float *s_dec)
{
    if (nblk == 0)
        return QD_OK;
    qd_launch(qk_flat_kernel<T>, grid_for((nblk + QK_FLAT_UNROLL - 1) / QK_FLAT_UNROLL), QD_THREADS, 0, codes, scales,
              dq, x, nblk, sc, s_dec);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

/* launch_quantize with the qk_ kernels: per row, one CTA a row; per tensor, the
 * amax, then the flat kernel (dense output) or the row kernel (strided). */
template <typename T>
static qd_status qk_quantize(qout o, float *dq, float *s_dec, const T *x, int64_t rows, int64_t cols,
                             int per_row)
{
    int64_t bpr = cols / 16;
    qk_scope sc = {NULL, NULL, 0};
    qk_amax *a;
    if (per_row)
        return qk_launch_rows(o, dq, x, rows, bpr, sc, s_dec, NULL);
    QD_TRY(qk_launch_amax(&a, x, rows * cols));
    sc.amax = &a->amax;
    if (dq || (o.codes_ld == bpr * 8 && o.scales_ld == bpr))
        return qk_launch_flat(o.codes, o.scales, dq, x, rows * bpr, sc, s_dec);
    return qk_launch_rows(o, dq, x, rows, bpr, sc, s_dec, NULL);
}

extern "C" qd_status qd_cuda_amax(float *amax, const float *x, int64_t n)
{
    uint32_t *bits, h = 0;
    if (n % QD_NVFP4_BLOCK)
        return qd_error(QD_ERR_SHAPE, "qd_cuda_amax: n %lld not a multiple of 16", (long long)n);
    QD_TRY(check_in("qd_cuda_amax", x));
    if (qd_cuda_quant_legacy) {
        QD_TRY(amax_word(&bits));
        QD_TRY(launch_amax(bits, x, n / 16));
    } else {
        qk_amax *a;
        QD_TRY(qk_launch_amax(&a, x, n));
        bits = &a->amax;
    }
    QD_TRY(qd_cuda_nonfinite_check());
    QD_CUDA_CHECK(cudaMemcpy(&h, bits, sizeof h, cudaMemcpyDeviceToHost));
    *amax = qd_bits_f32(h);
    return QD_OK;
}

static qout qout_of(const qd_nvfp4 *q)
{
    qout o = {q->codes, q->scales, q->cols / 2, q->cols / 16};
    return o;
}

/* ------------------------------------------------------------------------ */
/* Fused rows (ops.h add_rmsnorm, combine_add_rmsnorm, swiglu_nvfp4): the
 * operations of k_add, k_combine, k_rmsnorm and k_swiglu (cuda_kernels.cu) on
 * each value, then (q) qk_row's quantization of the row just written, the
 * bits of qk_rows_kernel (a CTA's global writes are visible to it after
 * __syncthreads): one launch for two to four. */

/* the quantizer of a fused row: none (codes NULL), or q's codes, scales and S_dec */
struct fr_quant {
    qout o;
    float *s_dec;
};

static fr_quant fr_quant_of(const qd_nvfp4 *q)
{
    fr_quant f = {{NULL, NULL, 0, 0}, NULL};
    if (q) {
        f.o = qout_of(q);
        f.s_dec = q->s_dec;
    }
    return f;
}

/* One block a row n: sum = a + b (CB: a + the combine of y, k_combine's chain
 * over the token's K rows), into shared memory and out to sum; then
 * rms_block_rstd and k_rmsnorm's outputs; then (fq) the row quantized. */
/* The fused rows kernels' last step: the block's row (row of x, C values,
 * complete in global memory; or row src of x) quantized with its own per-row
 * scale into fq's row. */
static __device__ __forceinline__ void fr_quant_row(const fr_quant &fq, const float *x, int64_t row, int C,
                                                    int64_t src = -1)
{
    qk_scope own = {NULL, NULL, 0};
    qk_row<float>(fq.o, NULL, x, row, C / 16, own, fq.s_dec, NULL, src);
}

#define FR_THREADS 512 /* the fused rows kernels' largest CTA (fr_threads) */

/* k_res_rmsnorm's sum for the 4 values i0 + u * blockDim.x (u < 4) of row n:
 * a + b, or (CB) a + the combine of y over the KT rows s_r (KT 0: K of
 * them, a runtime count), each value's chain over j ascending as k_combine's.
 * Every load of the 4 values (and of all KT rows where KT is known) is
 * issued before the first add: the row loop of one value at a time waited
 * for each of its loads in turn (K x 4 of them a thread: 672 us a launch at
 * moe8's training shape on an H100 for ~160 us of bytes). */
template <bool CB, int KT>
static __device__ __forceinline__ void fr_sum4(float *v, const float *a, const float *b, const float *y,
                                               const int *s_r, const float *s_w, int K, int C, size_t o, int i0)
{
    const int bd = (int)blockDim.x;
    float av[4];
#pragma unroll
    for (int u = 0; u < 4; u++)
        av[u] = i0 + u * bd < C ? __ldg(a + o + i0 + u * bd) : 0.0f;
    if constexpr (!CB) {
#pragma unroll
        for (int u = 0; u < 4; u++)
            v[u] = av[u] + (i0 + u * bd < C ? __ldg(b + o + i0 + u * bd) : 0.0f);
        return;
    } else {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const int nk = KT > 0 ? KT : K; /* KT: a constant, the loop unrolled and its loads hoisted */
#pragma unroll
        for (int j = 0; j < nk; j++) {
            float t[4];
#pragma unroll
            for (int u = 0; u < 4; u++)
                t[u] = i0 + u * bd < C ? __ldg(y + (size_t)s_r[j] * C + i0 + u * bd) : 0.0f;
#pragma unroll
            for (int u = 0; u < 4; u++)
                acc[u] = acc[u] + t[u] * s_w[j];
        }
#pragma unroll
        for (int u = 0; u < 4; u++)
            v[u] = av[u] + acc[u];
    }
}

/* ILP (QUADS_FR_ILP=1): the sums 4 values a thread at once (fr_sum4, KT
 * experts known at compile time or 0); otherwise a value at a time. The same
 * operations on each value in the same order: the same bits. */
template <bool CB, bool ILP = false, int KT = 0>
__global__ void __launch_bounds__(FR_THREADS)
    k_res_rmsnorm(float *sum, float *out, float *rstd, const float *a, const float *b, const float *y,
                  const float *row_w, const int32_t *tok_rows, int K, const float *w, int C, float eps, fr_quant fq)
{
    QD_PDL_ENTRY();
    extern __shared__ __align__(16) float xs[]; /* the sum's row (C) */
    __shared__ int s_r[QDK_FR_MAXK];
    __shared__ float s_w[QDK_FR_MAXK];
    size_t n = blockIdx.x, o = n * (size_t)C;
    if (CB) {
        if (threadIdx.x < K) {
            int r = tok_rows[n * K + threadIdx.x];
            s_r[threadIdx.x] = r;
            s_w[threadIdx.x] = row_w[r];
        }
        __syncthreads();
    }
    if constexpr (ILP) {
        for (int i0 = threadIdx.x; i0 < C; i0 += 4 * blockDim.x) {
            float v[4];
            fr_sum4<CB, KT>(v, a, b, y, s_r, s_w, K, C, o, i0);
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int i = i0 + u * (int)blockDim.x;
                if (i < C) {
                    xs[i] = v[u];
                    sum[o + i] = v[u];
                }
            }
        }
    } else {
        for (int i = threadIdx.x; i < C; i += blockDim.x) {
            float v;
            if (CB) {
                float acc = 0.0f;
#pragma unroll 8
                for (int j = 0; j < K; j++)
                    acc = acc + __ldg(y + (size_t)s_r[j] * C + i) * s_w[j];
                v = __ldg(a + o + i) + acc;
            } else {
                v = __ldg(a + o + i) + __ldg(b + o + i);
            }
            xs[i] = v;
            sum[o + i] = v;
        }
    }
    __syncthreads();
    float r = rms_block_rstd(xs, C, eps, rstd + n);
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        out[o + i] = __ldg(w + i) * (xs[i] * r);
    if (fq.o.codes) {
        __syncthreads();
        fr_quant_row(fq, out, (int64_t)n, C);
    }
}

/* The fused kernels' CTA: qk_rows_kernel's threads for a row of C, or more
 * for the row's own elements (4 a thread, up to FR_THREADS; QUADS_FR_VPT=8
 * for 8 a thread up to 256, the first version: on an H100's ncu at batch 64
 * the SwiGLU's rows then took 11.8 us against k_swiglu's and qk_rows_kernel's
 * 4.6 + 6.6 apart, the combine's 15.5 against ~15 apart); the quantized bits
 * do not depend on the thread count (qk_rows_kernel's choice varies it). */
static unsigned fr_threads(int C, int rows)
{
    static int vpt_env = -2;
    int vpt = qd_env_pick(&vpt_env, "QUADS_FR_VPT", 4, 8) == 8 ? 8 : 4;
    unsigned t = qk_row_threads(C / 16 > 0 ? C / 16 : 1, rows), v = (unsigned)((C / vpt + 31) / 32 * 32);
    unsigned cap = vpt == 8 ? 256u : FR_THREADS;
    v = v > cap ? cap : v;
    return t > v ? t : v;
}

/* q: rows x C, per-row scales, C a multiple of 16 (the caller's quantize shape) */
static qd_status fr_check(const char *fn, const qd_nvfp4 *q, int rows, int C)
{
    if (q && (q->rows != rows || q->cols != C || C % 16 || !q->per_row))
        return qd_error(QD_ERR_SHAPE, "cuda backend: %s: quantized output %lld x %lld (per row %d) for %d x %d", fn,
                        (long long)q->rows, (long long)q->cols, (int)q->per_row, rows, C);
    return QD_OK;
}

extern "C" qd_status qdk_add_rmsnorm(float *sum, float *out, float *rstd, const float *a, const float *b,
                                     const float *w, int rows, int C, float eps, qd_nvfp4 *q)
{
    QD_TRY(fr_check("add_rmsnorm", q, rows, C));
    if (rows) {
        qd_launch(qd_fr_ilp() ? k_res_rmsnorm<false, true> : k_res_rmsnorm<false>, (unsigned)rows, fr_threads(C, rows),
                  sizeof(float) * (size_t)C, sum, out, rstd, a, b, NULL, NULL, NULL, 0, w, C, eps, fr_quant_of(q));
        QD_CUDA_CHECK(cudaGetLastError());
    }
    return QD_OK;
}

extern "C" qd_status qdk_combine_add_rmsnorm(float *sum, float *out, float *rstd, const float *res, const float *y,
                                             const float *row_w, const int32_t *tok_rows, int N, int K, int C,
                                             const float *w, float eps, qd_nvfp4 *q)
{
    QD_TRY(fr_check("combine_add_rmsnorm", q, N, C));
    if (K > QDK_FR_MAXK)
        return qd_error(QD_ERR_SHAPE, "cuda backend: combine_add_rmsnorm: %d experts a token (at most %d)", K,
                        QDK_FR_MAXK);
    if (N) {
        auto k = !qd_fr_ilp() ? k_res_rmsnorm<true> : K == 8 ? k_res_rmsnorm<true, true, 8>
                 : K == 4 ? k_res_rmsnorm<true, true, 4> : k_res_rmsnorm<true, true, 0>;
        qd_launch(k, (unsigned)N, fr_threads(C, N), sizeof(float) * (size_t)C, sum, out, rstd, res, NULL, y, row_w,
                  tok_rows, K, w, C, eps, fr_quant_of(q));
        QD_CUDA_CHECK(cudaGetLastError());
    }
    return QD_OK;
}

/* One block a row of h (I): k_swiglu's h = silu(g) * u, then the row
 * quantized. ILP (QUADS_FR_ILP=1): 4 values a thread, their 8 loads issued
 * before the first value is made (the same operations: the same bits). */
template <bool ILP = false>
__global__ void __launch_bounds__(FR_THREADS) k_swiglu_rows(float *h, const float *g, const float *u, int I, fr_quant fq)
{
    QD_PDL_ENTRY();
    size_t o = (size_t)blockIdx.x * I;
    if constexpr (ILP) {
        const int bd = (int)blockDim.x;
        for (int i0 = threadIdx.x; i0 < I; i0 += 4 * bd) {
            float gv[4], uv[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                int i = i0 + k * bd;
                gv[k] = i < I ? g[o + i] : 0.0f;
                uv[k] = i < I ? u[o + i] : 0.0f;
            }
#pragma unroll
            for (int k = 0; k < 4; k++)
                if (i0 + k * bd < I)
                    h[o + i0 + k * bd] = qd_siluf(gv[k]) * uv[k];
        }
    } else {
        for (int i = threadIdx.x; i < I; i += blockDim.x)
            h[o + i] = qd_siluf(g[o + i]) * u[o + i];
    }
    __syncthreads();
    fr_quant_row(fq, h, (int64_t)blockIdx.x, I);
}

extern "C" qd_status qdk_swiglu_nvfp4(qd_nvfp4 *q, float *h, const float *g, const float *u, int rows, int I)
{
    QD_TRY(fr_check("swiglu_nvfp4", q, rows, I));
    if (rows && I) {
        qd_launch(qd_fr_ilp() ? k_swiglu_rows<true> : k_swiglu_rows<false>, (unsigned)rows, fr_threads(I, rows), 0, h, g,
                  u, I, fr_quant_of(q));
        QD_CUDA_CHECK(cudaGetLastError());
    }
    return QD_OK;
}

/* One block a row r of xe (C): k_gather's xe[r] = x[row_tok[r]], then the
 * row quantized (the experts' gate/up input, a token's row once for each
 * of its K experts); xe NULL (gather_nvfp4's keep 0): no copy, the row
 * quantized from x[row_tok[r]] itself (the same values, the same bits). */
__global__ void __launch_bounds__(FR_THREADS) k_gather_rows(float *xe, const float *x, const int32_t *row_tok, int C,
                                                            fr_quant fq)
{
    QD_PDL_ENTRY();
    int64_t tok = row_tok[blockIdx.x];
    if (!xe) {
        fr_quant_row(fq, x, (int64_t)blockIdx.x, C, tok);
        return;
    }
    size_t o = (size_t)blockIdx.x * C, s = (size_t)tok * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        xe[o + i] = x[s + i];
    __syncthreads();
    fr_quant_row(fq, xe, (int64_t)blockIdx.x, C);
}

extern "C" qd_status qdk_gather_nvfp4(qd_nvfp4 *q, float *xe, const float *x, const int32_t *row_tok, int R, int C)
{
    QD_TRY(fr_check("gather_nvfp4", q, R, C));
    if (R && C) {
        unsigned nt = xe ? fr_threads(C, R) : qk_row_threads(C / 16 > 0 ? C / 16 : 1, R); /* no copy: qk_row's */
        qd_launch(k_gather_rows, (unsigned)R, nt, 0, xe, x, row_tok, C, fr_quant_of(q));
        QD_CUDA_CHECK(cudaGetLastError());
    }
    return QD_OK;
}

/* Enqueues quantize (dq == NULL) or fake-quant (dq) of x (rows, cols). */
template <typename T>
static qd_status launch_quantize(qout o, float *dq, float *s_dec, const T *x, int64_t rows,
                                 int64_t cols, int per_row)
{
    int64_t bpr = cols / 16;
    if (rows == 0 || cols == 0)
        return QD_OK;
    /* fake-quant (dq) stays on the kernels before: on the H200 they wrote the
     * float32 output at 75-82% of copy bandwidth, the qk kernels at 63% */
    if (!qd_cuda_quant_legacy && !dq)
        return qk_quantize(o, dq, s_dec, x, rows, cols, per_row);
    if (per_row) {
        qd_launch(quant_rows_kernel<T>, (unsigned)rows, row_threads(bpr), 0, o, dq, x, bpr, s_dec, NULL);
    } else {
        uint32_t *bits;
        QD_TRY(amax_word(&bits));
        QD_TRY(launch_amax(bits, x, rows * bpr));
        qd_launch(quant_flat_kernel<T>, grid_for(rows * bpr), QD_THREADS, 0, o, dq, x, rows, bpr, bits, NULL, 0, s_dec);
    }
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

template <typename T>
static qd_status quantize_async(const char *fn, qd_nvfp4 *q, const T *x)
{
    QD_TRY(check_shape(fn, q->rows, q->cols));
    QD_TRY(check_in(fn, x));
    return launch_quantize(qout_of(q), NULL, q->s_dec, x, q->rows, q->cols, q->per_row);
}

extern "C" qd_status qd_cuda_nvfp4_quantize_async(qd_nvfp4 *q, const float *x)
{
    return quantize_async("qd_cuda_nvfp4_quantize", q, x);
}

extern "C" qd_status qd_cuda_nvfp4_quantize_bf16_async(qd_nvfp4 *q, const uint16_t *x)
{
    return quantize_async("qd_cuda_nvfp4_quantize_bf16", q, x);
}

extern "C" qd_status qd_cuda_nvfp4_quantize(qd_nvfp4 *q, const float *x)
{
    QD_TRY(qd_cuda_nvfp4_quantize_async(q, x));
    return qd_cuda_nonfinite_check();
}

extern "C" qd_status qd_cuda_nvfp4_quantize_bf16(qd_nvfp4 *q, const uint16_t *x)
{
    QD_TRY(qd_cuda_nvfp4_quantize_bf16_async(q, x));
    return qd_cuda_nonfinite_check();
}

/* Enqueues quantize of x (rows, bpr*16) into o with given S_enc (rows) or (1). */
static qd_status launch_quantize_with(qout o, float *s_dec, const float *x, int64_t rows,
                                      int64_t bpr, const float *s_enc, int per_row)
{
    if (rows == 0 || bpr == 0)
        return QD_OK;
    if (!qd_cuda_quant_legacy) {
        qk_scope sc = {NULL, s_enc, per_row};
        return per_row ? qk_launch_rows(o, NULL, x, rows, bpr, sc, s_dec, NULL)
                       : qk_launch_flat(o.codes, o.scales, NULL, x, rows * bpr, sc, s_dec);
    }
    qd_launch(quant_flat_kernel<float>, grid_for(rows * bpr), QD_THREADS, 0, o, NULL, x, rows, bpr, NULL, s_enc,
              per_row, s_dec);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

extern "C" qd_status qd_cuda_nvfp4_quantize_with(qd_nvfp4 *q, const float *x, const float *s_enc)
{
    QD_TRY(check_shape("qd_cuda_nvfp4_quantize_with", q->rows, q->cols));
    QD_TRY(check_in("qd_cuda_nvfp4_quantize_with", x));
    QD_TRY(launch_quantize_with(qout_of(q), q->s_dec, x, q->rows, q->cols / 16, s_enc, q->per_row));
    return qd_cuda_nonfinite_check();
}

extern "C" qd_status qd_cuda_nvfp4_dequantize_async(float *out, const qd_nvfp4 *q)
{
    int64_t nblk = q->rows * (q->cols / 16);
    QD_TRY(check_shape("qd_cuda_nvfp4_dequantize", q->rows, q->cols));
    QD_TRY(check_in("qd_cuda_nvfp4_dequantize", out));
    if (nblk) {
        qd_launch(dequant_kernel, grid_for(nblk), QD_THREADS, 0, out, q->codes, q->scales, q->s_dec, q->per_row,
                  q->rows, q->cols / 16);
        QD_CUDA_CHECK(cudaGetLastError());
    }
    return QD_OK;
}

extern "C" qd_status qd_cuda_nvfp4_dequantize(float *out, const qd_nvfp4 *q)
{
    QD_TRY(qd_cuda_nvfp4_dequantize_async(out, q));
    QD_CUDA_CHECK(cudaDeviceSynchronize());
    return QD_OK;
}

extern "C" qd_status qd_cuda_nvfp4_fake_quant_async(float *out, const float *x, int64_t rows, int64_t cols,
                                                    qd_scale_kind scale)
{
    QD_TRY(check_scale("qd_cuda_nvfp4_fake_quant", scale));
    QD_TRY(check_shape("qd_cuda_nvfp4_fake_quant", rows, cols));
    QD_TRY(check_in("qd_cuda_nvfp4_fake_quant", x));
    QD_TRY(check_in("qd_cuda_nvfp4_fake_quant", out));
    qout none = {NULL, NULL, 0, 0};
    return launch_quantize(none, out, NULL, x, rows, cols, scale == QD_SCALE_PER_ROW);
}

extern "C" qd_status qd_cuda_nvfp4_fake_quant_sdec_async(float *out, float *s_dec, const float *x, int64_t rows,
                                                         int64_t cols)
{
    QD_TRY(check_shape("qd_cuda_nvfp4_fake_quant", rows, cols));
    QD_TRY(check_in("qd_cuda_nvfp4_fake_quant", x));
    QD_TRY(check_in("qd_cuda_nvfp4_fake_quant", out));
    qout none = {NULL, NULL, 0, 0};
    return launch_quantize(none, out, s_dec, x, rows, cols, 0);
}

extern "C" qd_status qd_cuda_nvfp4_fake_quant(float *out, const float *x, int64_t rows,
                                              int64_t cols, qd_scale_kind scale)
{
    QD_TRY(check_scale("qd_cuda_nvfp4_fake_quant", scale));
    QD_TRY(check_shape("qd_cuda_nvfp4_fake_quant", rows, cols));
    QD_TRY(check_in("qd_cuda_nvfp4_fake_quant", x));
    QD_TRY(check_in("qd_cuda_nvfp4_fake_quant", out));
    qout none = {NULL, NULL, 0, 0};
    QD_TRY(launch_quantize(none, out, NULL, x, rows, cols, scale == QD_SCALE_PER_ROW));
    return qd_cuda_nonfinite_check();
}

extern "C" qd_status qd_cuda_fp8_quantize_rows_async(uint8_t *q, float *scale_inv, const float *x,
                                                     int64_t rows, int64_t cols)
{
    if (rows < 0 || cols < 0)
        return qd_error(QD_ERR_SHAPE, "qd_cuda_fp8_quantize_rows: negative shape");
    if (rows && cols) {
        qd_launch(fp8_rows_kernel, (unsigned)rows, row_threads(cols), 0, q, scale_inv, x, cols);
        QD_CUDA_CHECK(cudaGetLastError());
    }
    return QD_OK;
}

extern "C" qd_status qd_cuda_fp8_quantize_rows(uint8_t *q, float *scale_inv, const float *x,
                                               int64_t rows, int64_t cols)
{
    QD_TRY(qd_cuda_fp8_quantize_rows_async(q, scale_inv, x, rows, cols));
    return qd_cuda_nonfinite_check();
}

/* Launches a W4A4 kernel with MT activation rows a CTA: the split kernel when K
 * is a multiple of 512 (its chunk), else the one-thread-a-row kernel. */
template <int MT>
static qd_status launch_w4a4(float *y, const qd_nvfp4 *a, const qd_nvfp4 *w, size_t smem, int split)
{
    dim3 grid((unsigned)((w->rows + QD_GEMV_THREADS - 1) / QD_GEMV_THREADS),
              (unsigned)((a->rows + MT - 1) / MT));
    if constexpr (MT <= 8) {
        if (split) {
            grid.x = (unsigned)((w->rows + QD_W4A4_ROWS - 1) / QD_W4A4_ROWS);
            if (smem > 48 * 1024)
                QD_CUDA_CHECK(cudaFuncSetAttribute(w4a4_split_kernel<MT>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   (int)smem));
            qd_launch(w4a4_split_kernel<MT>, grid, 256, smem, y, a->codes, a->scales, a->s_dec, a->per_row, w->codes,
                      w->scales, w->s_dec, w->per_row, a->rows, w->rows, a->cols);
            QD_CUDA_CHECK(cudaGetLastError());
            return QD_OK;
        }
    }
    if (smem > 48 * 1024)
        QD_CUDA_CHECK(cudaFuncSetAttribute(w4a4_kernel<MT>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    qd_launch(w4a4_kernel<MT>, grid, QD_GEMV_THREADS, smem, y, a->codes, a->scales, a->s_dec, a->per_row, w->codes,
              w->scales, w->s_dec, w->per_row, a->rows, w->rows, a->cols);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

/* Shared memory for MT activation rows of K (decoded codes and scales), plus the
 * split kernel's products. */
static size_t w4a4_smem(int mt, int64_t K, int split)
{
    size_t act = (size_t)mt * (size_t)K * 5 / 4, corr = split && mt <= 4 ? (size_t)mt * K / 4 : 0;
    return act + corr + (split ? (size_t)mt * QD_W4A4_ROWS * QD_W4A4_VLD * sizeof(float) : 0);
}

extern "C" qd_status qd_cuda_w4a4_gemm_async(float *y, const qd_nvfp4 *a, const qd_nvfp4 *w)
{
    int dev = 0, limit = 0, mt, split = a->cols % (16 * QD_W4A4_CHUNK) == 0;
    if (a->cols != w->cols || a->cols % QD_NVFP4_BLOCK)
        return qd_error(QD_ERR_SHAPE, "qd_cuda_w4a4_gemm: A cols %lld, W cols %lld",
                        (long long)a->cols, (long long)w->cols);
    if (a->rows == 0 || w->rows == 0)
        return QD_OK;
    QD_CUDA_CHECK(cudaGetDevice(&dev));
    QD_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    mt = a->rows <= 1 ? 1 : a->rows <= 2 ? 2 : a->rows <= 4 ? 4 : a->rows <= 8 || split ? 8 : 16;
    while (mt > 1 && w4a4_smem(mt, a->cols, split) > (size_t)limit)
        mt /= 2;
    size_t smem = w4a4_smem(mt, a->cols, split);
    if (smem > (size_t)limit)
        return qd_error(QD_ERR_SHAPE, "qd_cuda_w4a4_gemm: K %lld too large", (long long)a->cols);
    switch (mt) {
    case 1: return launch_w4a4<1>(y, a, w, smem, split);
    case 2: return launch_w4a4<2>(y, a, w, smem, split);
    case 4: return launch_w4a4<4>(y, a, w, smem, split);
    case 8: return launch_w4a4<8>(y, a, w, smem, split);
    default: return launch_w4a4<16>(y, a, w, smem, 0);
    }
}

/* QUADS_W4A4_PAIR=0|1 (benchmarks and tests): the MMA kernels two blocks an
 * MMA (PAIR) never, or wherever K allows it (a multiple of 16 * QD_MMA_CB:
 * every chunk whole); unset: the latter. The same bits either way. */
int qd_cuda_w4a4_pair = -1;

static int w4a4_pair(int64_t K)
{
    static int v = -2;
    int on = qd_switch(qd_cuda_w4a4_pair, &v, "QUADS_W4A4_PAIR") != 0;
    return on && K % (16 * QD_MMA_CB) == 0;
}

/* The MMA kernel (DEV, PAIR) with its shared memory and grid. */
template <int NT, int W, bool DEV, bool PAIR>
static qd_status mma_launch(dim3 grid, float *y, const qd_nvfp4 *a, const w4a4_groups *g, int w_per_row, int64_t N,
                            int64_t K, const w4a4_groups *gd, const int *items, const int *nitems)
{
    using S = typename std::conditional<PAIR, pair_stage<NT, W>, mma_stage<NT, W>>::type;
    size_t smem = 2 * sizeof(S);
    if (smem + 256 * sizeof(float) > 48 * 1024) /* the kernel's static e4m3 table counts too */
        QD_CUDA_CHECK(cudaFuncSetAttribute(w4a4_mma_kernel<NT, W, DEV, PAIR>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    qd_launch(w4a4_mma_kernel<NT, W, DEV, PAIR>, grid, 32 * W, smem, y, a->codes, a->scales, a->s_dec, a->per_row, *g,
              w_per_row, N, K, gd, items, nitems);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

/* The MMA kernel over a table of groups: NT (8-row activation tiles a CTA) as
 * large as the rows ask for, made smaller while the grid would not fill the GPU
 * three times over (more CTAs re-read the weights from L2, not HBM). */
template <int NT, int W>
static qd_status launch_w4a4_mma(float *y, const qd_nvfp4 *a, const w4a4_groups *g, int ng, int64_t maxrows,
                                 int w_per_row, int64_t N, int64_t K)
{
    dim3 grid((unsigned)((N + QD_MMA_ROWS - 1) / QD_MMA_ROWS), (unsigned)((maxrows + 8 * NT - 1) / (8 * NT)),
              (unsigned)ng);
    return w4a4_pair(K) ? mma_launch<NT, W, false, true>(grid, y, a, g, w_per_row, N, K, NULL, NULL, NULL)
                        : mma_launch<NT, W, false, false>(grid, y, a, g, w_per_row, N, K, NULL, NULL, NULL);
}

/* The same kernel over the device's (group, row tile) items, at most
 * max_items of them (the grid; CTAs past *nitems exit). */
template <int NT, int W>
static qd_status launch_w4a4_mma_dev(float *y, const qd_nvfp4 *a, const w4a4_groups *gd, const int *items,
                                     const int *nitems, int64_t max_items, int w_per_row, int64_t N, int64_t K)
{
    static w4a4_groups none; /* the by-value groups, unread under DEV */
    dim3 grid((unsigned)((N + QD_MMA_ROWS - 1) / QD_MMA_ROWS), (unsigned)max_items, 1);
    return w4a4_pair(K) ? mma_launch<NT, W, true, true>(grid, y, a, &none, w_per_row, N, K, gd, items, nitems)
                        : mma_launch<NT, W, true, false>(grid, y, a, &none, w_per_row, N, K, gd, items, nitems);
}

static qd_status launch_w4a4_splitk(float *y, const qd_nvfp4 *a, const w4a4_groups *g, int ng, int64_t maxrows,
                                    int w_per_row, int64_t N, int64_t K)
{
    size_t smem = QD_SK_W * sizeof(mma_stage<1, 1>) + sizeof(sk_round);
    dim3 grid((unsigned)((N + 15) / 16), (unsigned)((maxrows + 7) / 8), (unsigned)ng);
    /* every launch: the attribute is the current device's (a process may drive several) */
    QD_CUDA_CHECK(cudaFuncSetAttribute(w4a4_splitk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    qd_launch(w4a4_splitk_kernel, grid, 32 * QD_SK_W, smem, y, a->codes, a->scales, a->s_dec, a->per_row, *g, w_per_row,
              N, K);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

/* The FP16 kernels' full row tiles take h16_chunk's FULL path (4 tiles'
 * loads, then their MMAs, then their FFMAs: the other path's SASS runs load,
 * MMA, FFMA, branch one tile at a time); the same operations on every
 * output. By default since 2026-12-06 (H100, a3b-4 exact nvfp4 rollout at
 * batch 64, the prefill's products: 1.024x end to end); QUADS_W4A4_ILP=0 for
 * the other path. */
static int w4a4_ilp_env(void)
{
    static int v = -2;
    return qd_env_pick(&v, "QUADS_W4A4_ILP", 0, 1) != 0;
}

/* w4a4_stream_kernel (every warp streams its own weight rows; the same
 * bits). By default (QUADS_W4A4_STREAM unset) the grouped products whose
 * groups have at most 16 rows, past the decode kernel's few groups of at most
 * 8 (w4a4_stream_default): decode's experts at batch 16-64. On an H100
 * (bench_quant --moe, 2026-12-06) the experts at batch 64 take 76 us
 * (1.47 TB/s) against the MMA kernel's 92 (1.23), at batch 16 49 against 50;
 * at batch 256 (tiles of 16 rows) 183 against 145, and q, k, v at 64 rows 68
 * against 54 (FP16-activation kernel 32), so those stay off; one weight's
 * product of 9-64 rows too (w4a4_stream_default: the o projection).
 * QUADS_W4A4_STREAM=1 forces it wherever it applies (groups of at most 32
 * rows, one weight's products of at most 64 rows: then not the
 * FP16-activation kernel), =0 never. */
int qd_cuda_w4a4_stream = -1;

static int w4a4_stream_env(void)
{
    static int v = -2;
    return qd_switch(qd_cuda_w4a4_stream, &v, "QUADS_W4A4_STREAM");
}

/* The multiple of K the streaming kernel (whole 256) and the wgmma prefill
 * kernel (whole 128) take: 64 with their PART twins (a short last chunk; the
 * QUADS recipe's down projection, 768 + 192 RAC channels: by default since
 * 2026-12-07d), whole with QUADS_W4A4_PART=0 (the other kernels for the rest,
 * as before). */
static int w4a4_part_env(void)
{
    static int v = -2;
    return qd_env_pick(&v, "QUADS_W4A4_PART", 0, 1);
}
static int64_t w4a4_kmul(int64_t whole) { return w4a4_part_env() == 0 ? whole : 64; }

/* QUADS_W4A4_STREAM_CFG=0-9 (benchmarks): the streaming kernel's stage
 * width, ring depth and weight-scale decoding: 16 blocks x 4 stages (0, the
 * default until 2026-12-06), 16 x 8 (1), 32 x 4 (2, where K is a multiple of
 * 512; else 0's), 16 x 3 (3), 16 x 2 (4), each with the weight scales'
 * E4M3 bytes decoded through a shared-memory table; 16 x 3 (5), 16 x 4 (6)
 * and 16 x 2 (7) with them decoded by the hardware's E4M3 pair
 * conversion (cvt.rn.f16x2.e4m3x2: the same values, fewer instructions and
 * no table). The ring's shared memory sets the CTAs an SM (at K 2048: 3 at 4
 * stages, 4 at 3 or 2), and the kernel is issue-bound as much as
 * memory-bound (ncu, H100, the experts at batch 64: 57% of issue slots busy,
 * ALU the busiest pipe): on an H100 (bench_quant --moe) the gate's product
 * at batch 64 takes 82.9 us with 0, 71.9 with 5, 74.7 with 4, 68.1 with 7;
 * the down projection's 79.7 with 0, 63.2 with 7 (one slab a CTA: at 7 CTAs
 * an SM two slabs leave under 3 waves), 65.5 with 5 (two slabs); batch
 * 16 and 256 gain as much. 8 (the default since 2026-12-06): 7 with the
 * E2M1 permutes' table and the MMAs' starting accumulators held in registers
 * (pair_terms' OC: a loop of two block pairs 116 -> 97 instructions at one
 * row group): on an H100 the gate at batch 64 70.2 -> 65.5 us, the down
 * projection 63.5 -> 62.2, batch 16 52.0 -> 50.0 and 44.3 -> 43.7, the o
 * projection's 64 rows (one product) 31.0 -> 27.7; the a3b-4 rollout at
 * batch 64 1.026x. 9 (opt-in; also for the experts' device-offset
 * launches, which otherwise take 8 whatever the setting): 8 with the
 * counted issue (QUADS_W4A4_STREAM_CI below) and each stage's weight scales
 * converted once by the warp into a float copy in shared memory (1 KB a
 * warp), where 8 converts each scale pair on the four lanes that read it
 * (per block pair and lane 2 loads, 2 pair conversions and 4 widenings
 * become 2 float2 loads; the loop of two block pairs at one row group 96 ->
 * 86 instructions, plus 24 a stage for the conversion): on an H100
 * (2026-12-07) the same bits, but slower than 8 with the counted issue
 * alone (the gate at batch 64 64.4 us against 61.8, the down projection
 * 62.2 against 58.5; the a3b-4 rollout 1.01x against its 1.03x). The same
 * bits in every one. */
static int w4a4_stream_cfg(int64_t K)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("QUADS_W4A4_STREAM_CFG");
        v = e && e[0] >= '0' && e[0] <= '9' && !e[1] ? e[0] - '0' : 8;
    }
    return v == 2 && K % 512 ? 0 : v;
}

/* The streaming kernel's configuration 8 (the default, the experts'
 * device-offset launches too) with its copies issued from counters (CI):
 * each lane's sources set once a slab and moved a chunk a stage, the ring
 * slot, chunk and slab counted, where before they were divided out of the
 * stage index (two 32-bit divisions and 64-bit row products a stage: by the
 * SASS of the experts' batch-64 instance, 150 of a stage's ~550
 * instructions went to issuing its 5 copies; counted, 61). The same copies,
 * the same products: the same bits (H100, 2026-12-07: check_ops and
 * check_backend, every line of tests/gpu/run_all.sh with it forced). By
 * default since then: bench_quant --moe at batch 64, the gate's product
 * 64.9 -> 61.8 us, the down projection's 61.5 -> 58.5, at batch 16 49.4 ->
 * 46.2 and 43.6 -> 41.4, the o projection's 64 rows 28.1 -> 26.4; the a3b-4
 * exact rollout at batch 64, nvfp4 1.031x (median of 5 runs each, 156.3 ->
 * 151.6 ms), quads 1.018x (3 each). QUADS_W4A4_STREAM_CI=0 for the indexed
 * issue. */
static int w4a4_stream_ci_env(void)
{
    static int v = -2;
    return qd_env_pick(&v, "QUADS_W4A4_STREAM_CI", 0, 1) != 0;
}

static bool w4a4_stream_ok(const qd_nvfp4 *a, const w4a4_groups *g, int ng, int64_t maxrows, int64_t K)
{
    bool ok = maxrows <= (ng == 1 ? 64 : 32) && K % w4a4_kmul(256) == 0 && qd_aligned(a->codes, 8);
    for (int z = 0; ok && z < ng; z++)
        ok = qd_aligned(g->codes[z], 16) && qd_aligned(g->scales[z], 16);
    return ok;
}

/* Whether a grouped product with host offsets (ng groups of one launch, the
 * largest of maxrows rows) takes the streaming kernel with no kernel forced
 * (with device offsets it takes it only where forced): groups of 9-16 rows, or of at
 * most 8 where there are more than 16 groups (the decode kernel, faster for
 * batch 1's 8 experts of a row each, 11 us against 14, is twice the MMA
 * kernel's time at batch 16's ~84: 104 us against 50); and one weight's
 * product of 9-64 rows (decode's o projection; q, k, v take the
 * FP16-activation kernel): on an H100 (bench_quant --moe's linears, CFG 8)
 * o 2048 x 4096 at 16 rows 21.4 us against the MMA kernel's 24.4, at 64
 * 27.7 against 35.3. */
static bool w4a4_stream_default(int ng, int64_t maxrows)
{
    if (ng == 1)
        return maxrows > 8 && maxrows <= 64;
    return maxrows <= 16 && (maxrows > 8 || ng > 16);
}

/* QUADS_W4A4_STREAM_RG=1|2|4 (benchmarks): the streaming kernel's slabs of 64
 * weight rows a CTA, one after the other through each warp's ring (the
 * activations staged once for them all, fewer CTAs). Unset: 2 where the
 * CTAs of two slabs still make 3 waves or more of the GPU (ctas1, the CTAs
 * of one slab each, at per_sm CTAs an SM), else 1: on an H100, with 3
 * stages (QUADS_W4A4_STREAM_CFG=5), the down projection at batch 64 (16
 * CTAs an expert with 2) 69.0 -> 65.5 us, the gate's (6 an expert: 1.4
 * waves) 71.9 -> 83.5. The same bits. */
static int w4a4_stream_rg(int64_t ctas1, int per_sm)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("QUADS_W4A4_STREAM_RG");
        v = e && (!strcmp(e, "1") || !strcmp(e, "2") || !strcmp(e, "4")) ? atoi(e) : 0;
    }
    if (v)
        return v;
    return (ctas1 + 1) / 2 >= 3 * (int64_t)per_sm * qd_sm_count() ? 2 : 1;
}

/* w4a4_stream_kernel in one configuration: host tables (ng groups, tiles of
 * TR of maxrows) or, with gd, the device's items (at most max_items) */
template <int DEV, int CB, int S, int TR, int FC = 0, int PART = 0, int CI = 0>
static qd_status stream_launch(float *y, const qd_nvfp4 *a, const w4a4_groups *g, int ng, int64_t maxrows,
                               int w_per_row, int64_t N, int64_t K, const w4a4_groups *gd, const int *items,
                               const int *nitems, int64_t max_items, st_src src)
{
    static w4a4_groups none; /* the by-value groups, unread under DEV */
    size_t smem = st_act_bytes(K, TR) + 4 * (size_t)S * sizeof(st_warp<CB>) +
                  (FC == 3 ? 4 * (size_t)16 * CB * sizeof(float) : 0);
    auto k = w4a4_stream_kernel<DEV, CB, S, TR, FC, PART, CI>;
    if (smem + 256 * sizeof(float) > 48 * 1024)
        QD_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    /* CTAs an SM of this configuration at this shared memory (it depends on
     * K: the gate's 2,048 and the down projection's 768 differ), a few
     * footprints remembered */
    static size_t ps_smem[8];
    static int ps_val[8], ps_n;
    int ps = 0;
    for (int i = 0; i < ps_n; i++)
        if (ps_smem[i] == smem)
            ps = ps_val[i];
    if (!ps) {
        QD_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ps, k, 128, smem));
        ps = ps > 0 ? ps : 1;
        int slot = ps_n < 8 ? ps_n++ : 7;
        ps_smem[slot] = smem;
        ps_val[slot] = ps;
    }
    unsigned gy = (unsigned)(DEV ? max_items : (maxrows + TR - 1) / TR), gz = DEV ? 1u : (unsigned)ng;
    int rg = w4a4_stream_rg((N + 63) / 64 * (int64_t)gy * gz, ps);
    dim3 grid((unsigned)((N + 64 * rg - 1) / (64 * rg)), gy, gz);
    qd_launch(k, grid, 128, smem, y, a->codes, a->scales, a->s_dec, a->per_row, DEV ? none : *g, w_per_row, N, K, gd,
              items, nitems, rg, src);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

/* The configuration QUADS_W4A4_STREAM_CFG picks, in tiles of tr (8 or 16)
 * rows; DEV 2 (the CTAs' own scan of src) only in the default configuration */
template <int DEV, int TR>
static qd_status stream_cfg_launch(float *y, const qd_nvfp4 *a, const w4a4_groups *g, int ng, int64_t maxrows,
                                   int w_per_row, int64_t N, int64_t K, const w4a4_groups *gd, const int *items,
                                   const int *nitems, int64_t max_items, st_src src = st_src())
{
    if (K % 256) /* a short last chunk: the default configuration's PART twin */
        return stream_launch<DEV, 16, 2, TR, 2, 1>(y, a, g, ng, maxrows, w_per_row, N, K, gd, items, nitems, max_items,
                                                   src);
    if constexpr (DEV == 2) {
        if (w4a4_stream_cfg(K) == 9)
            return stream_launch<2, 16, 2, TR, 3, 0, 1>(y, a, g, ng, maxrows, w_per_row, N, K, gd, items, nitems,
                                                        max_items, src);
        if (w4a4_stream_ci_env())
            return stream_launch<2, 16, 2, TR, 2, 0, 1>(y, a, g, ng, maxrows, w_per_row, N, K, gd, items, nitems,
                                                        max_items, src);
        return stream_launch<2, 16, 2, TR, 2>(y, a, g, ng, maxrows, w_per_row, N, K, gd, items, nitems, max_items, src);
    } else {
        int cfg = w4a4_stream_cfg(K);
        if (cfg == 8 && w4a4_stream_ci_env())
            return stream_launch<DEV, 16, 2, TR, 2, 0, 1>(y, a, g, ng, maxrows, w_per_row, N, K, gd, items, nitems,
                                                          max_items, src);
        return cfg == 1 ? stream_launch<DEV, 16, 8, TR>(y, a, g, ng, maxrows, w_per_row, N, K, gd, items, nitems, max_items, src)
             : cfg == 2 ? stream_launch<DEV, 32, 4, TR>(y, a, g, ng, maxrows, w_per_row, N, K, gd, items, nitems, max_items, src)
             : cfg == 3 ? stream_launch<DEV, 16, 3, TR>(y, a, g, ng, maxrows, w_per_row, N, K, gd, items, nitems, max_items, src)
             : cfg == 4 ? stream_launch<DEV, 16, 2, TR>(y, a, g, ng, maxrows, w_per_row, N, K, gd, items, nitems, max_items, src)
             : cfg == 5 ? stream_launch<DEV, 16, 3, TR, 1>(y, a, g, ng, maxrows, w_per_row, N, K, gd, items, nitems, max_items, src)
             : cfg == 6 ? stream_launch<DEV, 16, 4, TR, 1>(y, a, g, ng, maxrows, w_per_row, N, K, gd, items, nitems, max_items, src)
             : cfg == 8 ? stream_launch<DEV, 16, 2, TR, 2>(y, a, g, ng, maxrows, w_per_row, N, K, gd, items, nitems, max_items, src)
             : cfg == 9 ? stream_launch<DEV, 16, 2, TR, 3, 0, 1>(y, a, g, ng, maxrows, w_per_row, N, K, gd, items, nitems, max_items, src)
             : cfg == 0 ? stream_launch<DEV, 16, 4, TR>(y, a, g, ng, maxrows, w_per_row, N, K, gd, items, nitems, max_items, src)
                        : stream_launch<DEV, 16, 2, TR, 1>(y, a, g, ng, maxrows, w_per_row, N, K, gd, items, nitems, max_items, src);
    }
}

/* w4a4_stream_kernel over g's groups (host tables; tiles of 16 rows where a
 * group has more than 16 and there are several, else 8), or with gd over the
 * device's items of tr rows (at most max_items) */
static qd_status launch_w4a4_stream(float *y, const qd_nvfp4 *a, const w4a4_groups *g, int ng, int64_t maxrows,
                                    int w_per_row, int64_t N, int64_t K, const w4a4_groups *gd = NULL,
                                    const int *items = NULL, const int *nitems = NULL, int64_t max_items = 0,
                                    int tr = 8, const st_src *src = NULL)
{
    if (src)
        return tr == 16 ? stream_cfg_launch<2, 16>(y, a, g, ng, maxrows, w_per_row, N, K, NULL, NULL, NULL, max_items, *src)
                        : stream_cfg_launch<2, 8>(y, a, g, ng, maxrows, w_per_row, N, K, NULL, NULL, NULL, max_items, *src);
    if (gd)
        return tr == 16 ? stream_cfg_launch<1, 16>(y, a, g, ng, maxrows, w_per_row, N, K, gd, items, nitems, max_items)
                        : stream_cfg_launch<1, 8>(y, a, g, ng, maxrows, w_per_row, N, K, gd, items, nitems, max_items);
    return ng > 1 && maxrows > 16
               ? stream_cfg_launch<0, 16>(y, a, g, ng, maxrows, w_per_row, N, K, NULL, NULL, NULL, 0)
               : stream_cfg_launch<0, 8>(y, a, g, ng, maxrows, w_per_row, N, K, NULL, NULL, NULL, 0);
}

/* w4a4_h16_kernel over g's groups: 128 weight rows a CTA, 8 * NT activation rows. */
template <int NT>
static qd_status launch_w4a4_h16(float *y, const qd_nvfp4 *a, const w4a4_groups *g, int ng, int64_t maxrows,
                                 int w_per_row, int64_t N, int64_t K)
{
    size_t smem = 2 * sizeof(h16_stage<NT>);
    dim3 grid((unsigned)((N + QD_H16_ROWS - 1) / QD_H16_ROWS), (unsigned)((maxrows + 8 * NT - 1) / (8 * NT)),
              (unsigned)ng);
    if (smem + 256 * sizeof(float) > 48 * 1024) /* the kernel's static e4m3 table counts too */
        QD_CUDA_CHECK(
            cudaFuncSetAttribute(w4a4_h16_kernel<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    qd_launch(w4a4_h16_kernel<NT>, grid, 32 * QD_H16_W, smem, y, a->codes, a->scales, a->s_dec, a->per_row, *g,
              w_per_row, N, K, w4a4_ilp_env() == 1);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

/* w4a4_hwg_kernel over g's groups: 64 * WGS weight rows a CTA, NA activation rows. */
template <int NA, int PIPE, int WGS = 2, int PART = 0>
static qd_status launch_w4a4_hwg(float *y, const qd_nvfp4 *a, const w4a4_groups *g, int ng, int64_t maxrows,
                                 int w_per_row, int64_t N, int64_t K)
{
    size_t smem = 2 * sizeof(hwg_stage<NA, WGS>) + 1024; /* + the stages' alignment */
    dim3 grid((unsigned)((N + 64 * WGS - 1) / (64 * WGS)), (unsigned)((maxrows + NA - 1) / NA), (unsigned)ng);
    QD_CUDA_CHECK(cudaFuncSetAttribute(w4a4_hwg_kernel<NA, PIPE, WGS, PART>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    qd_launch(w4a4_hwg_kernel<NA, PIPE, WGS, PART>, grid, 128 * WGS, smem, y, a->codes, a->scales, a->s_dec, a->per_row, *g,
              w_per_row, N, K);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

/* Where the FP16 kernel is chosen (forced or by default), w4a4_hwg_kernel
 * instead on a device with wgmma (compute capability 9.0), where K is a
 * multiple of 64 and the codes 16-byte aligned (scales 8): by default since
 * 2026-12-07 (H100, the same bits: the prefill's expert products 1,439 ->
 * 1,141 us and 1,526 -> 1,249 at 8,192 rows, a3b-4 exact b64 rollout 1.032x);
 * QUADS_W4A4_HWG=0 for w4a4_h16_kernel; QUADS_W4A4_HWG_NA=128 for 128
 * activation rows a CTA (default 64). */
int qd_cuda_w4a4_hwg = -1;

static int w4a4_hwg_env(void)
{
    static int v = -2;
    return qd_switch(qd_cuda_w4a4_hwg, &v, "QUADS_W4A4_HWG");
}

static bool w4a4_hwg_ok(const qd_nvfp4 *a, const w4a4_groups *g, int ng, int64_t K)
{
    if (w4a4_hwg_env() == 0 || !qd_wg_device() || K % w4a4_kmul(128) ||
        !qd_aligned(a->codes, 16) || !qd_aligned(a->scales, 8))
        return false;
    for (int z = 0; z < ng; z++)
        if (!qd_aligned(g->codes[z], 16) || !qd_aligned(g->scales[z], 8))
            return false;
    return true;
}

/* w4a4_hwg_kernel in the variant the variables pick: QUADS_W4A4_HWG_WGS=4
 * (64 activation rows, no pipelining), else QUADS_W4A4_HWG_NA (64 or 128) and
 * QUADS_W4A4_HWG_PIPE: 1 (one CTA an SM: 206 registers at 64 rows, slower on
 * the H100), 2 (64 rows, two CTAs an SM: held to 128 registers, ptxas spills
 * 136 bytes; opt-in: the same bits, slower on an H100 on 2026-12-07,
 * bench_quant --moe-prefill at 8,192 rows gate/up 1,123 -> 1,254 us, down
 * 1,230 -> 1,333, K 960 (its PART twin either way) 1,489 both) */
static qd_status w4a4_hwg(float *y, const qd_nvfp4 *a, const w4a4_groups *g, int ng, int64_t maxrows, int w_per_row,
                          int64_t N, int64_t K)
{
    static int na = -1, pipe = -2, wgs = -2;
    if (na < 0) {
        const char *e = getenv("QUADS_W4A4_HWG_NA");
        na = e && !strcmp(e, "128") ? 128 : 64;
    }
    if (K % 128) /* a short last chunk: the default variant's PART twin */
        return launch_w4a4_hwg<64, 0, 2, 1>(y, a, g, ng, maxrows, w_per_row, N, K);
    if (qd_env_pick(&wgs, "QUADS_W4A4_HWG_WGS", 2, 4) == 4)
        return launch_w4a4_hwg<64, 0, 4>(y, a, g, ng, maxrows, w_per_row, N, K);
    if (qd_env_pick(&pipe, "QUADS_W4A4_HWG_PIPE", 1, 2) == 2 && na == 64) /* 2 CTAs an SM: 128 registers */
        return launch_w4a4_hwg<64, 2>(y, a, g, ng, maxrows, w_per_row, N, K);
    if (pipe == 1)
        return na == 128 ? launch_w4a4_hwg<128, 1>(y, a, g, ng, maxrows, w_per_row, N, K)
                         : launch_w4a4_hwg<64, 1>(y, a, g, ng, maxrows, w_per_row, N, K);
    return na == 128 ? launch_w4a4_hwg<128, 0>(y, a, g, ng, maxrows, w_per_row, N, K)
                     : launch_w4a4_hwg<64, 0>(y, a, g, ng, maxrows, w_per_row, N, K);
}

/* The FP16 activations of w4a4_hpre_kernel: one scratch buffer a device,
 * grown to the largest asked for (a few MB: at most 256 rows). */
#define QD_HPRE_DEVS 16
static qd_status a16_scratch(uint8_t **buf, size_t bytes)
{
    static uint8_t *b[QD_HPRE_DEVS];
    static size_t cap[QD_HPRE_DEVS];
    int dev = 0;
    QD_CUDA_CHECK(cudaGetDevice(&dev));
    if (dev < 0 || dev >= QD_HPRE_DEVS)
        return QD_ERR_SHAPE;
    if (cap[dev] < bytes) {
        QD_REFUSE_RECORDING();
        qd_cuda_buf_gen++;
        if (b[dev])
            QD_CUDA_CHECK(cudaFree(b[dev])); /* waits for the kernels that read it */
        b[dev] = NULL;
        cap[dev] = 0;
        if (cudaMalloc((void **)&b[dev], bytes) != cudaSuccess) {
            (void)cudaGetLastError();
            b[dev] = NULL;
            return qd_error(QD_ERR_NOMEM, "cuda backend: W4A4 activation scratch of %zu bytes", bytes);
        }
        cap[dev] = bytes;
    }
    *buf = b[dev];
    return QD_OK;
}

/* QUADS_W4A4_HPRE=0|1 (benchmarks and tests): never, or for every product of
 * one weight matrix (and q, k, v together), the FP16 kernel with the
 * activations made FP16 first; unset: q, k, v together at 9 to 256 activation
 * rows, one product at 129 to 256 (H100, bench_quant --moe: q, k, v at 64
 * rows 33 us against 54; o at 64 rows 39 against 37, at 256 71 against 81). */
int qd_cuda_w4a4_hpre = -1;
static int w4a4_hpre_env(void)
{
    static int v = -2;
    return qd_switch(qd_cuda_w4a4_hpre, &v, "QUADS_W4A4_HPRE");
}

/* The products of w4a4_hpre_kernel: count of them, one M and K; a[i] the
 * activations (the same pointer: converted once), w[i] weights, y[i] outputs.
 * QD_ERR_SHAPE where it does not apply (alignment; the caller goes on). */
static qd_status w4a4_hpre(float *const *y, const qd_nvfp4 *const *a, const qd_nvfp4 *const *w, int count)
{
    int64_t M = a[0]->rows, K = a[0]->cols, nb = K / 16;
    if (count < 1 || count > QD_HPRE_MAX || M < 1 || K % 16 || K > 16384) /* the scales staged whole */
        return QD_ERR_SHAPE;
    for (int i = 0; i < count; i++)
        if (a[i]->rows != M || a[i]->cols != K || w[i]->cols != K || w[i]->rows < 1 ||
            a[i]->per_row != a[0]->per_row || w[i]->per_row != w[0]->per_row || !qd_aligned(a[i]->codes, 8) ||
            !qd_aligned(w[i]->codes, 8))
            return QD_ERR_SHAPE;
    int distinct = 0, which[QD_HPRE_MAX];
    for (int i = 0; i < count; i++) {
        which[i] = distinct;
        for (int j = 0; j < i; j++)
            if (a[j]->codes == a[i]->codes && a[j]->scales == a[i]->scales)
                which[i] = which[j];
        if (which[i] == distinct)
            distinct++;
    }
    size_t per = (size_t)M * (size_t)K * 2, stride = (per + 255) / 256 * 256;
    uint8_t *buf;
    QD_TRY(a16_scratch(&buf, stride * (size_t)distinct));
    hpre_args p;
    memset(&p, 0, sizeof p);
    p.count = count;
    p.ilp = w4a4_ilp_env() == 1;
    for (int i = 0, made = 0; i < count; i++) {
        p.y[i] = y[i];
        p.a16[i] = buf + stride * (size_t)which[i];
        p.a_sdec[i] = a[i]->s_dec;
        p.codes[i] = w[i]->codes;
        p.scales[i] = w[i]->scales;
        p.sdec[i] = w[i]->s_dec;
        p.N[i] = w[i]->rows;
        if (which[i] == made) { /* the first product of this activation: convert it */
            made++;
            int64_t items = M * nb;
            unsigned blocks = (unsigned)((items + 255) / 256 < 4096 ? (items + 255) / 256 : 4096);
            qd_launch(a16_kernel, blocks, 256, 0, (uint4 *)p.a16[i], a[i]->codes, a[i]->scales, items);
            QD_CUDA_CHECK(cudaGetLastError());
        }
    }
    /* NT: the most activation rows a CTA (8, 4, 2 tiles of 8) whose CTAs give
     * every SM two, else one tile */
    int64_t xs = 0;
    for (int i = 0; i < count; i++)
        xs += (p.N[i] + 63) / 64;
    auto ctas = [&](int nt) { return xs * ((M + 8 * nt - 1) / (8 * nt)); };
    int NT = ctas(8) >= 2 * qd_sm_count() ? 8 : ctas(4) >= 2 * qd_sm_count() ? 4 : ctas(2) >= 2 * qd_sm_count() ? 2 : 1;
    static int nt_env = -1; /* QUADS_HPRE_NT=1|2|4|8 (benchmarks): that many row tiles a CTA */
    if (nt_env < 0) {
        const char *e = getenv("QUADS_HPRE_NT");
        nt_env = e && (!strcmp(e, "1") || !strcmp(e, "2") || !strcmp(e, "4") || !strcmp(e, "8")) ? atoi(e) : 0;
    }
    if (nt_env)
        NT = nt_env;
    for (int i = 0; i < count; i++)
        p.start[i + 1] = p.start[i] + (int)((p.N[i] + 63) / 64);
    dim3 grid((unsigned)p.start[count], (unsigned)((M + 8 * NT - 1) / (8 * NT)), 1);
#define QD_HPRE_CASE(T_)                                                                                               \
    do {                                                                                                               \
        size_t smem = QD_HPRE_STAGES * sizeof(hpre_stage<T_>) + (size_t)64 * (size_t)(nb + 4);                         \
        if (smem + 256 * sizeof(float) > 48 * 1024)                                                                    \
            QD_CUDA_CHECK(                                                                                             \
                cudaFuncSetAttribute(w4a4_hpre_kernel<T_>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));   \
        qd_launch(w4a4_hpre_kernel<T_>, grid, 128, smem, p, a[0]->per_row, w[0]->per_row, M, K);                       \
    } while (0)
    if (NT == 8)
        QD_HPRE_CASE(8);
    else if (NT == 4)
        QD_HPRE_CASE(4);
    else if (NT == 2)
        QD_HPRE_CASE(2);
    else
        QD_HPRE_CASE(1);
#undef QD_HPRE_CASE
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

/* The decode kernel for MT activation rows a CTA and RT weight rows a thread;
 * with mu (ng = 1), the products of mu's linears in one launch, CTAs
 * start[i] .. start[i+1]-1 theirs (set here for RT). */
template <int MT, int RT>
static qd_status launch_w4a4_dec(float *y, const qd_nvfp4 *a, const w4a4_groups *g, int ng, int64_t maxrows,
                                 int w_per_row, int64_t N, int64_t K, const dec_multi *mu, const w4a4_groups *gd,
                                 const int *gd_n)
{
    size_t smem = dec_smem(MT, RT, K);
    int64_t rows = (int64_t)dec_rs(K) * RT;
    dim3 grid((unsigned)((N + rows - 1) / rows), (unsigned)((maxrows + MT - 1) / MT), (unsigned)ng);
    dec_multi m;
    memset(&m, 0, sizeof m);
    if (mu) {
        m = *mu;
        for (int i = 0; i < m.count; i++)
            m.start[i + 1] = m.start[i] + (int)((m.N[i] + rows - 1) / rows);
        grid.x = (unsigned)m.start[m.count];
    }
    auto kern = gd ? w4a4_dec_kernel<MT, RT, false, true>
                   : mu ? w4a4_dec_kernel<MT, RT, true, false> : w4a4_dec_kernel<MT, RT, false, false>;
    if (smem > 48 * 1024)
        QD_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    qd_launch(kern, grid, QD_DEC_THREADS, smem, y, a->codes, a->scales, a->s_dec, a->per_row, *g, w_per_row, N, K, m,
              gd, gd_n);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

/* QUADS_W4A4_DEC_RT=1|2 (benchmarks and tests): weight rows a thread of the
 * decode kernel; unset: 2 for up to 2 activation rows where the CTAs of 2 still
 * give every SM two. */
static int w4a4_dec_rt_env(void)
{
    static int v = -2;
    return qd_env_pick(&v, "QUADS_W4A4_DEC_RT", 1, 2);
}

/* The decode kernel where it applies (K up to 16384, weights aligned for its
 * loads, shared memory within the limit) and, unless forced, where its CTAs
 * fit the GPU at once (four a SM: decode at batch 1; with many experts at
 * batch 16 the MMA kernels, fewer instructions a byte, are faster), MT as
 * small as maxrows allows (tiles of 8 above); QD_ERR_SHAPE where it does not
 * (the caller falls back to the MMA kernels). */
static qd_status w4a4_dec(float *y, const qd_nvfp4 *a, const w4a4_groups *g, int ng, int64_t maxrows,
                          int w_per_row, int64_t N, int64_t K, int forced, const dec_multi *mu = NULL,
                          const w4a4_groups *gd = NULL, const int *gd_n = NULL)
{
    if (K > 16384 || !qd_aligned(a->codes, 8))
        return QD_ERR_SHAPE;
    for (int z = 0; !gd && z < ng; z++) /* gd: the caller checked every group's weights */
        if (!qd_aligned(g->codes[z], K % 64 ? 8 : 16) || !qd_aligned(g->scales[z], K % 64 ? 1 : 4))
            return QD_ERR_SHAPE;
    for (int i = 0; mu && i < mu->count; i++)
        if (!qd_aligned(mu->a_codes[i], 8) || !qd_aligned(mu->w_codes[i], K % 64 ? 8 : 16) ||
            !qd_aligned(mu->w_scales[i], K % 64 ? 1 : 4))
            return QD_ERR_SHAPE;
    int dev = 0, limit = 0;
    QD_CUDA_CHECK(cudaGetDevice(&dev));
    QD_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    int mt = maxrows <= 1 ? 1 : maxrows <= 2 ? 2 : maxrows <= 4 ? 4 : 8, rte = w4a4_dec_rt_env();
    auto ctas = [&](int rt) {
        int64_t x = (N + rt * dec_rs(K) - 1) / (rt * dec_rs(K));
        if (mu)
            for (int i = x = 0; i < mu->count; i++)
                x += (mu->N[i] + rt * dec_rs(K) - 1) / (rt * dec_rs(K));
        return x * ((maxrows + mt - 1) / mt) * ng;
    };
    int rt = rte > 0 ? rte : mt <= 2 && ctas(2) >= 2 * qd_sm_count() ? 2 : 1;
    while (mt > 1 && dec_smem(mt, rt, K) > (size_t)limit)
        mt /= 2;
    if (rt == 2 && dec_smem(mt, rt, K) > (size_t)limit)
        rt = 1;
    if (dec_smem(mt, rt, K) > (size_t)limit)
        return QD_ERR_SHAPE;
    if (!forced && ctas(rt) > 4 * qd_sm_count())
        return QD_ERR_SHAPE;
#define QD_DEC_CASE(M)                                                                                        \
    return rt == 2 ? launch_w4a4_dec<M, 2>(y, a, g, ng, maxrows, w_per_row, N, K, mu, gd, gd_n)              \
                   : launch_w4a4_dec<M, 1>(y, a, g, ng, maxrows, w_per_row, N, K, mu, gd, gd_n)
    switch (mt) {
    case 1: QD_DEC_CASE(1);
    case 2: QD_DEC_CASE(2);
    case 4: QD_DEC_CASE(4);
    default: QD_DEC_CASE(8);
    }
#undef QD_DEC_CASE
}

/* QUADS_W4A4_DEC=0|1 (benchmarks and tests): never, or always (in tiles of 8
 * activation rows), the decode kernel; unset: where no group has more than 8
 * rows and its CTAs are few (and the split-K kernel is not forced). */
int qd_cuda_w4a4_dec = -1;

static int w4a4_dec_env(void)
{
    static int v = -2;
    return qd_switch(qd_cuda_w4a4_dec, &v, "QUADS_W4A4_DEC");
}

/* QUADS_W4A4_SPLITK=0|1 (benchmarks and tests): never, or always, the split-K
 * kernel; unset: where K has two chunks or more and its CTAs fit the GPU at
 * once (three a SM: decode at batch 1 but an expert's down projection; the
 * k and v projections at batch 64). */
static int w4a4_splitk_env(void)
{
    static int v = -2;
    return qd_env_pick(&v, "QUADS_W4A4_SPLITK", 0, 1);
}

/* QUADS_W4A4_H16=0|1 (benchmarks and tests): never, or always (where the
 * activations' and weights' codes are 8-byte aligned), the FP16 kernel;
 * unset: where a group has 64 rows or more and its CTAs fill the GPU twice
 * (the prefill), unless another kernel is forced. */
int qd_cuda_w4a4_h16 = -1;

static int w4a4_h16_env(void)
{
    static int v = -2;
    return qd_switch(qd_cuda_w4a4_h16, &v, "QUADS_W4A4_H16");
}

/* Whether count products of M rows take w4a4_hpre_kernel: forced, or by
 * default (no other kernel forced) q, k, v together at 9-256 rows and one
 * product at 129-256. */
static bool w4a4_hpre_on(int64_t M, int count)
{
    int hp = w4a4_hpre_env();
    return M > 0 && (hp == 1 || (hp < 0 && M <= 256 && M > (count > 1 ? 8 : 128) && w4a4_dec_env() != 1 &&
                                 w4a4_splitk_env() != 1 && w4a4_h16_env() != 1 &&
                                 !(w4a4_stream_env() == 1 && M <= 64)));
}

/* Every group of g has rows (the callers leave out the others), maxrows the most. */
static qd_status w4a4_mma(float *y, const qd_nvfp4 *a, const w4a4_groups *g, int ng, int64_t maxrows, int w_per_row,
                          int64_t N, int64_t K)
{
    if (maxrows == 0 || N == 0)
        return QD_OK;
    int nt = maxrows <= 8 ? 1 : maxrows <= 16 ? 2 : maxrows <= 32 ? 4 : 8;
    int64_t tiles = (N + 16 * QD_MMA_WARPS - 1) / (16 * QD_MMA_WARPS);
    int sk = w4a4_splitk_env(), dec = w4a4_dec_env(), h16 = w4a4_h16_env();
    int stm = w4a4_stream_env();
    if ((stm == 1 || (stm < 0 && sk < 0 && dec < 0 && h16 < 0 && w4a4_stream_default(ng, maxrows))) &&
        w4a4_stream_ok(a, g, ng, maxrows, K))
        return launch_w4a4_stream(y, a, g, ng, maxrows, w_per_row, N, K);
    bool h16_ok = qd_aligned(a->codes, 8);
    for (int z = 0; h16_ok && z < ng; z++)
        h16_ok = qd_aligned(g->codes[z], 8);
    if (h16_ok && (h16 == 1 || (h16 < 0 && sk < 0 && dec < 0 && maxrows >= 64 &&
                                (N + QD_H16_ROWS - 1) / QD_H16_ROWS * ((maxrows + 63) / 64) * ng >=
                                    2 * qd_sm_count())))
        return w4a4_hwg_ok(a, g, ng, K) ? w4a4_hwg(y, a, g, ng, maxrows, w_per_row, N, K)
             : maxrows > 32             ? launch_w4a4_h16<8>(y, a, g, ng, maxrows, w_per_row, N, K)
                                        : launch_w4a4_h16<4>(y, a, g, ng, maxrows, w_per_row, N, K);
    if (sk != 1 && (dec == 1 || (dec < 0 && maxrows <= 8))) {
        qd_status st = w4a4_dec(y, a, g, ng, maxrows, w_per_row, N, K, dec == 1);
        if (st != QD_ERR_SHAPE)
            return st;
    }
    int64_t ctas_sk = (N + 15) / 16 * ((maxrows + 7) / 8) * ng;
    if (sk == 1 || (sk < 0 && K >= 2 * 16 * QD_MMA_CB && ctas_sk <= 3 * qd_sm_count()))
        return launch_w4a4_splitk(y, a, g, ng, maxrows, w_per_row, N, K);
    while (nt > 1 && tiles * ((maxrows + 8 * nt - 1) / (8 * nt)) * ng < 3 * qd_sm_count())
        nt /= 2;
    /* QUADS_W4A4_NT=1|2|4|8 (benchmarks only): that many 8-row tiles a CTA for
     * one-matrix products (the attention linears), to measure the trade of
     * weight decodes repeated per token tile against CTAs */
    static int forced = -1, forced_g = -1; /* QUADS_W4A4_NT_GROUPED: the same for grouped products (experts) */
    if (forced < 0) {
        const char *e = getenv("QUADS_W4A4_NT"), *eg = getenv("QUADS_W4A4_NT_GROUPED");
        forced = e && (!strcmp(e, "1") || !strcmp(e, "2") || !strcmp(e, "4") || !strcmp(e, "8")) ? atoi(e) : 0;
        forced_g = eg && (!strcmp(eg, "1") || !strcmp(eg, "2") || !strcmp(eg, "4") || !strcmp(eg, "8")) ? atoi(eg) : 0;
    }
    if (forced && ng == 1)
        nt = forced;
    if (forced_g && ng > 1)
        nt = forced_g;
    /* One-warp CTAs of 16 weight rows where 4-warp CTAs would not give every SM
     * one (decode at small batch): a CTA streams its rows a chunk at a time, one
     * HBM latency a chunk, so four times the CTAs is four times the bytes in
     * flight; the same products in the same order. QUADS_MMA_WARPS=1|4
     * (benchmarks and tests) forces it for NT <= 2. */
    static int warps = -1;
    if (warps < 0) {
        const char *e = getenv("QUADS_MMA_WARPS");
        warps = e && (!strcmp(e, "1") || !strcmp(e, "4")) ? atoi(e) : 0;
    }
    int64_t ctas4 = tiles * ((maxrows + 8 * nt - 1) / (8 * nt)) * ng;
    int one = nt <= 2 && (warps ? warps == 1 : ctas4 < qd_sm_count()); /* mma_warps */
    if (one)
        return nt == 1 ? launch_w4a4_mma<1, 1>(y, a, g, ng, maxrows, w_per_row, N, K)
                       : launch_w4a4_mma<2, 1>(y, a, g, ng, maxrows, w_per_row, N, K);
    return nt == 1 ? launch_w4a4_mma<1, QD_MMA_WARPS>(y, a, g, ng, maxrows, w_per_row, N, K)
         : nt == 2 ? launch_w4a4_mma<2, QD_MMA_WARPS>(y, a, g, ng, maxrows, w_per_row, N, K)
         : nt == 4 ? launch_w4a4_mma<4, QD_MMA_WARPS>(y, a, g, ng, maxrows, w_per_row, N, K)
                   : launch_w4a4_mma<8, QD_MMA_WARPS>(y, a, g, ng, maxrows, w_per_row, N, K);
}

/* The groups without rows are left out of the launches' tables (decode at
 * batch 1 touches 8 of 128 experts: a grid over all of them was 94% CTAs
 * that exit at once, which cost more than the products); a launch takes up
 * to QD_W4A4_GROUPS groups. */
extern "C" qd_status qd_cuda_w4a4_gemm_grouped_async(float *y, const qd_nvfp4 *a, const qd_nvfp4 *const *w,
                                                     const int64_t *row_off, int ngroups)
{
    if (ngroups <= 0)
        return QD_OK;
    int64_t N = w[0]->rows, K = a->cols, maxrows = 0;
    int wpr = w[0]->per_row, ng = 0;
    w4a4_groups g;
    for (int e = 0; e <= ngroups; e++) {
        if (e < ngroups) {
            const qd_nvfp4 *wi = w[e];
            if (wi->rows != N || wi->cols != K || wi->per_row != wpr || K % QD_NVFP4_BLOCK)
                return qd_error(QD_ERR_SHAPE, "qd_cuda_w4a4_gemm_grouped: group %d: W (%lld, %lld), A cols %lld", e,
                                (long long)wi->rows, (long long)wi->cols, (long long)K);
            int64_t rows = row_off[e + 1] - row_off[e];
            if (rows > 0) {
                g.row0[ng] = row_off[e];
                g.rows[ng] = rows;
                g.codes[ng] = wi->codes;
                g.scales[ng] = wi->scales;
                g.sdec[ng] = wi->s_dec;
                ng++;
                maxrows = rows > maxrows ? rows : maxrows;
            }
        }
        if (ng && (ng == QD_W4A4_GROUPS || e == ngroups)) {
            if (N > 0)
                QD_TRY(w4a4_mma(y, a, &g, ng, maxrows, wpr, N, K));
            ng = 0;
            maxrows = 0;
        }
    }
    return QD_OK;
}

/* Group z of the device offsets: expert e's first row r0 and rows, its
 * weights' pointers from tab, and its nt row tiles (z | tile << 16) into
 * items from slot k. */
static __device__ __forceinline__ void gfd_store(w4a4_groups *gd, int *items, const void *const *tab, int E, int e,
                                                 int z, int k, int r0, int rows, int nt)
{
    gd->row0[z] = r0;
    gd->rows[z] = rows;
    gd->codes[z] = (const uint8_t *)tab[e];
    gd->scales[z] = (const uint8_t *)tab[E + e];
    gd->sdec[z] = (const float *)tab[2 * E + e];
    for (int t = 0; t < nt; t++)
        items[k + t] = z | (t << 16);
}

/* The experts with rows of the device offsets d_off (E + 1, E <= QD_W4A4_GROUPS)
 * into *gd in ascending order (first row, rows, and their weights' codes,
 * scales and s_dec from tab: E pointers of each); returns their count. One
 * warp. With items (tr > 0), each group's row tiles of tr rows (group | tile
 * << 16) into items in group order, their count into *nitems: a lane each
 * group, its items' first slot by a warp scan of the tile counts (until
 * 2026-12-06 one thread walked every group's tiles after the warp: a chain of
 * ~110 dependent loads and stores a product at batch 64, 12 products a
 * 4-layer step). */
__device__ int groups_from_dev(w4a4_groups *gd, const int32_t *d_off, const void *const *tab, int E,
                               int *items = NULL, int *nitems = NULL, int tr = 0)
{
    int lane = threadIdx.x, base = 0, kbase = 0;
    for (int e0 = 0; e0 < E; e0 += 32) {
        int e = e0 + lane, r0 = e < E ? d_off[e] : 0, rows = e < E ? d_off[e + 1] - r0 : 0;
        unsigned m = __ballot_sync(0xffffffffu, rows > 0);
        int nt = items && rows > 0 ? (rows + tr - 1) / tr : 0, incl = qd_warp_incl_sum(nt, lane);
        if (rows > 0)
            gfd_store(gd, items, tab, E, e, base + __popc(m & ((1u << lane) - 1u)), kbase + incl - nt, r0, rows, nt);
        base += __popc(m);
        kbase += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (items && lane == 0)
        *nitems = kbase;
    return base;
}

/* groups_from_dev's outputs with one thread an expert: a CTA of
 * 32 * ceil(E / 32) threads (gfd_threads), each warp's ballot and scan, then
 * the warps' totals in order from shared memory; the count returned to every
 * thread. groups_from_dev's one warp walks the experts 32 at a time, its
 * loads and stores a chain of E / 32 rounds: 9.6 us a product on an H100's
 * ncu at batch 64 (a3b: 128 experts), 3 products a layer. QUADS_GFD_CTA=1
 * (opt-in until run on a GPU) takes this one: the same groups and items. */
__device__ int groups_from_dev_cta(w4a4_groups *gd, const int32_t *d_off, const void *const *tab, int E,
                               int *items = NULL, int *nitems = NULL, int tr = 0)
{
    __shared__ int w_groups[QD_W4A4_GROUPS / 32], w_tiles[QD_W4A4_GROUPS / 32];
    int e = threadIdx.x, lane = e & 31, wp = e >> 5, nw = (int)(blockDim.x + 31) / 32;
    int r0 = e < E ? d_off[e] : 0, rows = e < E ? d_off[e + 1] - r0 : 0;
    unsigned m = __ballot_sync(0xffffffffu, rows > 0);
    int nt = items && rows > 0 ? (rows + tr - 1) / tr : 0, incl = qd_warp_incl_sum(nt, lane);
    if (lane == 31) {
        w_groups[wp] = __popc(m);
        w_tiles[wp] = incl;
    }
    __syncthreads();
    int base = 0, kbase = 0, total = 0, ktotal = 0;
    for (int i = 0; i < nw; i++) {
        base += i < wp ? w_groups[i] : 0;
        kbase += i < wp ? w_tiles[i] : 0;
        total += w_groups[i];
        ktotal += w_tiles[i];
    }
    if (rows > 0)
        gfd_store(gd, items, tab, E, e, base + __popc(m & ((1u << lane) - 1u)), kbase + incl - nt, r0, rows, nt);
    if (items && threadIdx.x == 0)
        *nitems = ktotal;
    return total;
}

/* groups_from_dev's CTA for E experts */
static unsigned gfd_threads(int E) { return (unsigned)((E + 31) / 32 * 32); }

/* QUADS_GFD_CTA=1: groups_from_dev_cta, not the one warp's walk */
static int gfd_cta_env(void)
{
    static int v = -2;
    return qd_env_pick(&v, "QUADS_GFD_CTA", 0, 1) == 1;
}

/* The streaming kernel's CTAs find their (expert, row tile) from the device
 * offsets themselves (w4a4_stream_kernel's DEV 2; the default since
 * 2026-12-07), not from a w4a4_items_from_dev launch before each product
 * (QUADS_GFD_INLINE=0). On an H100's ncu at batch 64 the product takes 66.5 us
 * instead of 62.6 plus the listing's 9.6, three a layer; a3b-4 exact nvfp4
 * b64 1.033x (bench/ab_decode_h200.sh, 3 rounds). */
static int gfd_inline_env(void)
{
    static int v = -2;
    return qd_env_pick(&v, "QUADS_GFD_INLINE", 0, 1) != 0;
}

/* groups_from_dev's groups and their count into *gd_n (CTA: groups_from_dev_cta's). */
template <bool CTA>
__global__ void w4a4_groups_from_dev(w4a4_groups *gd, int *gd_n, const int32_t *d_off, const void *const *tab, int E)
{
    QD_PDL_ENTRY();
    int n = CTA ? groups_from_dev_cta(gd, d_off, tab, E) : groups_from_dev(gd, d_off, tab, E);
    if (threadIdx.x == 0)
        *gd_n = n;
}

/* groups_from_dev's groups, then the MMA kernel's items: each group's row
 * tiles of tr rows (group | tile << 16) in group order, their count into
 * *nitems. */
template <bool CTA>
__global__ void w4a4_items_from_dev(w4a4_groups *gd, int *items, int *nitems, const int32_t *d_off,
                                    const void *const *tab, int E, int tr)
{
    QD_PDL_ENTRY();
    if (CTA)
        groups_from_dev_cta(gd, d_off, tab, E, items, nitems, tr);
    else
        groups_from_dev(gd, d_off, tab, E, items, nitems, tr);
}

/* w4a4_items_from_dev in the configuration QUADS_GFD_CTA picks */
static qd_status items_from_dev(w4a4_groups *gd, int *items, int *nitems, const int32_t *d_off,
                                const void *const *tab, int E, int tr)
{
    if (gfd_cta_env())
        qd_launch(w4a4_items_from_dev<true>, 1, gfd_threads(E), 0, gd, items, nitems, d_off, tab, E, tr);
    else
        qd_launch(w4a4_items_from_dev<false>, 1, 32, 0, gd, items, nitems, d_off, tab, E, tr);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

/* The dev scratch of qd_cuda_w4a4_gemm_grouped_dev_async for R rows over E
 * experts: the groups, their count, and the MMA kernel's items (at most
 * E + R of them, tiles of 8 rows or more). */
extern "C" size_t qd_cuda_w4a4_grouped_dev_ws(int64_t R, int E)
{
    return (sizeof(w4a4_groups) + 255) / 256 * 256 + 256 + sizeof(int) * ((size_t)E + (size_t)R + 1);
}

/* The grouped product with the offsets on the device: the experts with rows
 * compacted there (w4a4_groups_from_dev), then one decode-kernel launch over
 * min(E, R) groups (those past the count exit); where an expert may have
 * more than 8 rows (maxrows, the caller's bound), one MMA-kernel launch over
 * the groups' row tiles (w4a4_items_from_dev; at most min(E, R) + R / tile
 * of them, those past the count exit), its tile from the mean rows an
 * expert with rows: the bits of qd_cuda_w4a4_gemm_grouped_async either way
 * (every tiling of the MMA and decode kernels sums in one order). w0 gives
 * the weights' shape (the caller checked every expert's against it and
 * their alignment), tab (dev) the experts' codes, scales and s_dec
 * pointers, ws qd_cuda_w4a4_grouped_dev_ws(R, E) bytes of dev scratch.
 * QD_ERR_SHAPE where the kernels do not take it (more than QD_W4A4_GROUPS
 * experts, K or the shared memory past their limits, more than 65,535 row
 * tiles): the caller takes the host offsets. al16: every expert's codes and
 * scales on 16 bytes (QUADS_W4A4_STREAM=1's kernel copies them 16 bytes at a
 * time; it takes groups of at most 16 rows on average, in tiles of 8). */

extern "C" qd_status qd_cuda_w4a4_gemm_grouped_dev_async(float *y, const qd_nvfp4 *a, const qd_nvfp4 *w0,
                                                         const void *const *tab, const int32_t *d_off, int E,
                                                         int64_t R, int64_t maxrows, void *ws, int al16)
{
    if (E <= 0 || R <= 0 || w0->rows == 0)
        return QD_OK;
    if (E > QD_W4A4_GROUPS || maxrows < 1 || a->cols != w0->cols ||
        a->cols % QD_NVFP4_BLOCK || a->rows != R || R > 65535 * 8)
        return QD_ERR_SHAPE;
    w4a4_groups *gd = (w4a4_groups *)ws;
    int *gd_n = (int *)((char *)ws + (sizeof(w4a4_groups) + 255) / 256 * 256);
    static w4a4_groups none; /* the kernel's by-value groups, unread under DEV */
    int ng = (int)(R < E ? R : E);
    int64_t N = w0->rows, K = a->cols;
    if (maxrows <= 8) {
        if (gfd_cta_env())
            qd_launch(w4a4_groups_from_dev<true>, 1, gfd_threads(E), 0, gd, gd_n, d_off, tab, E);
        else
            qd_launch(w4a4_groups_from_dev<false>, 1, 32, 0, gd, gd_n, d_off, tab, E);
        QD_CUDA_CHECK(cudaGetLastError());
        return w4a4_dec(y, a, &none, ng, maxrows, w0->per_row, N, K, 1, NULL, gd, gd_n);
    }
    int64_t mean = (R + ng - 1) / ng;
    int nt = mean <= 8 ? 1 : mean <= 16 ? 2 : mean <= 32 ? 4 : 8;
    int *items = gd_n + 1;
    /* the streaming kernel where QUADS_W4A4_STREAM=1, or by default where the
     * host offsets' rule (w4a4_stream_default) would take it for groups of
     * the mean rows: decode's experts at batch 16-64 (the MMA kernel here
     * until 2026-12-06e left QUADS_MOE_DEV_ROWS=4096 0.84x at batch 64) */
    int st_env = w4a4_stream_env();
    if (al16 && mean <= 32 && K % w4a4_kmul(256) == 0 && qd_aligned(a->codes, 8) &&
        (st_env == 1 || (st_env < 0 && w4a4_stream_default(ng, mean)))) {
        int tr = mean <= 8 ? 8 : 16;
        if (gfd_inline_env()) { /* each CTA its own (expert, tile): no items launch */
            st_src src = {d_off, tab, E};
            return launch_w4a4_stream(y, a, NULL, 0, 0, w0->per_row, N, K, NULL, NULL, NULL, ng + (R + tr - 1) / tr,
                                      tr, &src);
        }
        QD_TRY(items_from_dev(gd, items, gd_n, d_off, tab, E, tr));
        return launch_w4a4_stream(y, a, NULL, 0, 0, w0->per_row, N, K, gd, items, gd_n, ng + (R + tr - 1) / tr, tr);
    }
    QD_TRY(items_from_dev(gd, items, gd_n, d_off, tab, E, 8 * nt));
    int64_t max_items = ng + (R + 8 * nt - 1) / (8 * nt), tiles = (N + 16 * QD_MMA_WARPS - 1) / (16 * QD_MMA_WARPS);
    int one = nt <= 2 && tiles * (R + 8 * nt - 1) / (8 * nt) < qd_sm_count(); /* as w4a4_mma: few CTAs */
    if (one)
        return nt == 1 ? launch_w4a4_mma_dev<1, 1>(y, a, gd, items, gd_n, max_items, w0->per_row, N, K)
                       : launch_w4a4_mma_dev<2, 1>(y, a, gd, items, gd_n, max_items, w0->per_row, N, K);
    return nt == 1 ? launch_w4a4_mma_dev<1, QD_MMA_WARPS>(y, a, gd, items, gd_n, max_items, w0->per_row, N, K)
         : nt == 2 ? launch_w4a4_mma_dev<2, QD_MMA_WARPS>(y, a, gd, items, gd_n, max_items, w0->per_row, N, K)
         : nt == 4 ? launch_w4a4_mma_dev<4, QD_MMA_WARPS>(y, a, gd, items, gd_n, max_items, w0->per_row, N, K)
                   : launch_w4a4_mma_dev<8, QD_MMA_WARPS>(y, a, gd, items, gd_n, max_items, w0->per_row, N, K);
}

extern "C" qd_status qd_cuda_w4a4_gemm(float *y, const qd_nvfp4 *a, const qd_nvfp4 *w)
{
    QD_TRY(qd_cuda_w4a4_gemm_async(y, a, w));
    QD_CUDA_CHECK(cudaDeviceSynchronize());
    return QD_OK;
}

/* The groups of one product: all M rows against the one weight w. */
static w4a4_groups one_group(const qd_nvfp4 *w, int64_t M)
{
    w4a4_groups g;
    g.row0[0] = 0;
    g.rows[0] = M;
    g.codes[0] = w->codes;
    g.scales[0] = w->scales;
    g.sdec[0] = w->s_dec;
    return g;
}

extern "C" qd_status qd_cuda_w4a4_gemm_tc_async(float *y, const qd_nvfp4 *a, const qd_nvfp4 *w)
{
    if (a->cols == w->cols && a->cols % QD_NVFP4_BLOCK == 0) {
        if (w4a4_hpre_on(a->rows, 1)) {
            qd_status st = w4a4_hpre(&y, &a, &w, 1);
            if (st != QD_ERR_SHAPE)
                return st;
        }
        w4a4_groups g = one_group(w, a->rows);
        return w4a4_mma(y, a, &g, 1, a->rows, w->per_row, w->rows, a->cols);
    }
    return qd_cuda_w4a4_gemm_async(y, a, w); /* its shape error */
}

/* QUADS_W4A4_MULTI=0 (benchmarks and tests): products of one input one after
 * the other, never in one decode-kernel launch. */
static int w4a4_multi_on(void)
{
    static int v = -2;
    return qd_env_pick(&v, "QUADS_W4A4_MULTI", 0, 1) != 0;
}

/* y[i] = a[i] . w[i]^T for count products of one activation shape (q, k
 * and v): where the decode kernel takes them (at most 8 rows, one K, CTAs
 * that fit the GPU at once) one launch for all, else one product after the
 * other; the bits of qd_cuda_w4a4_gemm_tc_async per product either way. */
extern "C" qd_status qd_cuda_w4a4_gemm_multi_async(float *const *y, const qd_nvfp4 *const *a,
                                                   const qd_nvfp4 *const *w, int count)
{
    if (count < 1 || count > QD_DEC_MULTI)
        return qd_error(QD_ERR_ARG, "qd_cuda_w4a4_gemm_multi: %d products (1 to %d)", count, QD_DEC_MULTI);
    int64_t M = a[0]->rows, K = a[0]->cols;
    int dec = w4a4_dec_env();
    int one = count > 1 && M > 0 && M <= 8 && K % QD_NVFP4_BLOCK == 0 && dec != 0 &&
              w4a4_splitk_env() != 1 && w4a4_multi_on();
    for (int i = 0; one && i < count; i++)
        one = a[i]->rows == M && a[i]->cols == K && w[i]->cols == K && a[i]->per_row == a[0]->per_row &&
              w[i]->per_row == w[0]->per_row && w[i]->rows > 0;
    if (count <= QD_HPRE_MAX && w4a4_hpre_on(M, count)) {
        qd_status st = w4a4_hpre(y, a, w, count);
        if (st != QD_ERR_SHAPE)
            return st;
    }
    if (one) {
        w4a4_groups g = one_group(w[0], M);
        dec_multi mu;
        memset(&mu, 0, sizeof mu);
        mu.count = count;
        for (int i = 0; i < count; i++) {
            mu.y[i] = y[i];
            mu.a_codes[i] = a[i]->codes;
            mu.a_scales[i] = a[i]->scales;
            mu.a_sdec[i] = a[i]->s_dec;
            mu.w_codes[i] = w[i]->codes;
            mu.w_scales[i] = w[i]->scales;
            mu.w_sdec[i] = w[i]->s_dec;
            mu.N[i] = w[i]->rows;
        }
        qd_status st = w4a4_dec(y[0], a[0], &g, 1, M, w[0]->per_row, w[0]->rows, K, dec == 1, &mu);
        if (st != QD_ERR_SHAPE)
            return st;
    }
    for (int i = 0; i < count; i++)
        QD_TRY(qd_cuda_w4a4_gemm_tc_async(y[i], a[i], w[i]));
    return QD_OK;
}

extern "C" qd_status qd_cuda_w4a4_gemm_tc(float *y, const qd_nvfp4 *a, const qd_nvfp4 *w)
{
    QD_TRY(qd_cuda_w4a4_gemm_tc_async(y, a, w));
    QD_CUDA_CHECK(cudaDeviceSynchronize());
    return QD_OK;
}

static qd_status check_rac(const char *fn, const qd_nvfp4 *out, int64_t rows, int64_t K, int64_t n)
{
    QD_TRY(check_shape(fn, rows, K));
    QD_TRY(check_shape(fn, rows, n));
    if (n > K)
        return qd_error(QD_ERR_SHAPE, "%s: |S| = %lld > K = %lld", fn, (long long)n, (long long)K);
    if (out->rows != rows || out->cols != K + n)
        return qd_error(QD_ERR_SHAPE, "%s: out is %lld x %lld, want %lld x %lld", fn,
                        (long long)out->rows, (long long)out->cols, (long long)rows,
                        (long long)(K + n));
    return QD_OK;
}

/* The residual half of the augmented activation: r = (x - x_hat)[:, S], then
 * quantized with the main scope's S_enc (s_enc per row, or the per-tensor amax
 * still in the amax word) into the columns after K. */
static qd_status rac_residual(qd_nvfp4 *out, const float *x, int64_t rows, int64_t K,
                              const int64_t *channels, int64_t n, const float *s_enc, float *res)
{
    uint32_t *bits;
    qout o = qout_of(out);
    qd_launch(rac_residual_kernel, grid_for(rows * n), QD_THREADS, 0, res, x, o, out->s_dec, out->per_row, channels,
              rows, K, n);
    QD_CUDA_CHECK(cudaGetLastError());
    o.codes += K / 2;
    o.scales += K / 16;
    if (!qd_cuda_quant_legacy) {
        qk_amax *a;
        QD_TRY(qk_amax_state(&a));
        qk_scope sc = {out->per_row ? NULL : &a->amax, s_enc, out->per_row};
        return qk_launch_rows(o, NULL, res, rows, n / 16, sc, NULL, NULL);
    }
    QD_TRY(amax_word(&bits));
    qd_launch(quant_flat_kernel<float>, grid_for(rows * (n / 16)), QD_THREADS, 0, o, NULL, res, rows, n / 16,
              out->per_row ? NULL : bits, s_enc, out->per_row, NULL);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

/* QUADS_RAC_FUSED=0 (benchmarks and tests): RAC's activation rows in three
 * launches (main blocks, residuals, their blocks), not rac_rows_kernel's one. */
static int rac_fused_on(void)
{
    static int v = -2;
    return qd_env_pick(&v, "QUADS_RAC_FUSED", 0, 1) != 0 && !qd_cuda_quant_legacy;
}

/* RAC's augmented activation rows (per-row scales) by rac_rows_kernel. */
static qd_status rac_rows(qd_nvfp4 *out, const float *x, int64_t rows, int64_t K, const int64_t *ch1,
                          const int64_t *const *ch, const int32_t *off, int E, int64_t n, float *s_enc, float *res)
{
    qd_launch(rac_rows_kernel, (unsigned)rows, qk_row_threads(K / 16, rows), 0, qout_of(out), x, K, ch1, ch, off, E, n,
              out->s_dec, s_enc, res);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

/* The main half: quantize(x) into the first K columns of out, keeping S_enc. */
static qd_status rac_main(qd_nvfp4 *out, const float *x, int64_t rows, int64_t K, float *s_enc)
{
    if (!out->per_row)
        return launch_quantize(qout_of(out), NULL, out->s_dec, x, rows, K, 0);
    if (!qd_cuda_quant_legacy) {
        qk_scope own = {NULL, NULL, 0};
        return qk_launch_rows(qout_of(out), NULL, x, rows, K / 16, own, out->s_dec, s_enc);
    }
    qd_launch(quant_rows_kernel<float>, (unsigned)rows, row_threads(K / 16), 0, qout_of(out), NULL, x, K / 16,
              out->s_dec, s_enc);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

extern "C" qd_status qd_cuda_rac_augment_act(qd_nvfp4 *out, const float *x, int64_t rows,
                                             int64_t K, const int64_t *channels, int64_t n)
{
    float *s_enc = NULL, *res = NULL;
    qd_status st;
    QD_TRY(check_rac("qd_cuda_rac_augment_act", out, rows, K, n));
    QD_TRY(check_in("qd_cuda_rac_augment_act", x));
    if (rows == 0 || K == 0)
        return QD_OK;
    QD_CUDA_CHECK(cudaMalloc((void **)&s_enc, (size_t)rows * sizeof(float)));
    if (cudaMalloc((void **)&res, (size_t)(rows * (n ? n : 1)) * sizeof(float)) != cudaSuccess) {
        cudaFree(s_enc);
        return qd_error(QD_ERR_NOMEM, "qd_cuda_rac_augment_act: residual buffer");
    }
    st = rac_main(out, x, rows, K, s_enc);
    if (st == QD_OK && n)
        st = rac_residual(out, x, rows, K, channels, n, s_enc, res);
    if (st == QD_OK)
        st = qd_cuda_nonfinite_check();
    cudaFree(s_enc);
    cudaFree(res);
    return st;
}

extern "C" qd_status qd_cuda_rac_augment_act_async(qd_nvfp4 *out, const float *x, int64_t rows, int64_t K,
                                                   const int64_t *channels, int64_t n, float *ws)
{
    QD_TRY(check_rac("qd_cuda_rac_augment_act", out, rows, K, n));
    QD_TRY(check_in("qd_cuda_rac_augment_act", x));
    if (rows == 0 || K == 0)
        return QD_OK;
    /* the residual buffer starts 256-byte aligned: the quantizer reads it in 16-byte vectors */
    float *res = ws + ((rows + 63) & ~(int64_t)63);
    if (out->per_row && rac_fused_on())
        return rac_rows(out, x, rows, K, channels, NULL, NULL, 0, n, ws, res);
    QD_TRY(rac_main(out, x, rows, K, ws));
    return n ? rac_residual(out, x, rows, K, channels, n, ws, res) : QD_OK;
}

extern "C" qd_status qd_cuda_rac_augment_act_grouped_async(qd_nvfp4 *out, const float *x, int64_t rows, int64_t K,
                                                           const int64_t *const *channels, const int32_t *off, int E,
                                                           int64_t n, float *ws)
{
    QD_TRY(check_rac("qd_cuda_rac_augment_act_grouped", out, rows, K, n));
    QD_TRY(check_in("qd_cuda_rac_augment_act_grouped", x));
    if (!out->per_row)
        return qd_error(QD_ERR_ARG, "qd_cuda_rac_augment_act_grouped: activations take one scale per row");
    if (rows == 0 || K == 0)
        return QD_OK;
    float *res = ws + ((rows + 63) & ~(int64_t)63);
    if (rac_fused_on())
        return rac_rows(out, x, rows, K, NULL, channels, off, E, n, ws, res);
    QD_TRY(rac_main(out, x, rows, K, ws));
    if (!n)
        return QD_OK;
    qout o = qout_of(out);
    qd_launch(rac_residual_grouped_kernel, grid_for(rows * n), QD_THREADS, 0, res, x, o, out->s_dec, channels, off, E,
              rows, K, n);
    QD_CUDA_CHECK(cudaGetLastError());
    o.codes += K / 2;
    o.scales += K / 16;
    if (!qd_cuda_quant_legacy) {
        qk_scope sc = {NULL, ws, 1};
        return qk_launch_rows(o, NULL, res, rows, n / 16, sc, NULL, NULL);
    }
    qd_launch(quant_flat_kernel<float>, grid_for(rows * (n / 16)), QD_THREADS, 0, o, NULL, res, rows, n / 16, NULL, ws,
              1, NULL);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

/* The workspace rac_multi_async takes: for each linear S_enc (rows, rounded
 * up to 64 floats) and its residuals (rows, n[i], rounded up to 64 floats). */
extern "C" size_t qd_cuda_rac_multi_ws(int64_t rows, const int64_t *n, int count)
{
    size_t f = 0, r64 = ((size_t)rows + 63) & ~(size_t)63;
    for (int i = 0; i < count; i++)
        f += r64 + (((size_t)rows * (size_t)n[i] + 63) & ~(size_t)63);
    return f * sizeof(float);
}

extern "C" qd_status qd_cuda_rac_multi_async(qd_nvfp4 *const *out, const float *x, int64_t rows, int64_t K,
                                             const int64_t *const *const *ch, const int64_t *n, int count,
                                             const int32_t *off, int E, float *ws)
{
    if (count < 1 || count > QD_CUDA_RAC_MULTI)
        return qd_error(QD_ERR_ARG, "qd_cuda_rac_multi: %d linears (1 to %d)", count, QD_CUDA_RAC_MULTI);
    QD_TRY(check_in("qd_cuda_rac_multi", x));
    int fused = rac_fused_on();
    for (int i = 0; i < count; i++) {
        QD_TRY(check_rac("qd_cuda_rac_multi", out[i], rows, K, n[i]));
        if (!out[i]->per_row)
            return qd_error(QD_ERR_ARG, "qd_cuda_rac_multi: activations take one scale per row");
    }
    if (rows == 0 || K == 0)
        return QD_OK;
    size_t r64 = ((size_t)rows + 63) & ~(size_t)63;
    if (!fused) { /* QUADS_RAC_FUSED=0: the grouped op per linear */
        for (int i = 0; i < count; i++) {
            QD_TRY(qd_cuda_rac_augment_act_grouped_async(out[i], x, rows, K, ch[i], off, E, n[i], ws));
        }
        return QD_OK;
    }
    rac_multi_args m;
    memset(&m, 0, sizeof m);
    float *p = ws;
    for (int i = 0; i < count; i++) {
        m.o[i] = qout_of(out[i]);
        m.ch[i] = ch[i];
        m.n[i] = n[i];
        m.s_dec[i] = out[i]->s_dec;
        m.s_enc[i] = p;
        m.res[i] = p + r64;
        p += r64 + (((size_t)rows * (size_t)n[i] + 63) & ~(size_t)63);
    }
    qd_launch(rac_rows_multi_kernel, dim3((unsigned)rows, (unsigned)count), qk_row_threads(K / 16, rows * count), 0, m,
              x, K, off, E);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

extern "C" qd_status qd_cuda_rac_augment_weight(qd_nvfp4 *out, const float *w, int64_t N,
                                                int64_t K, const int64_t *channels, int64_t n)
{
    float *waug = NULL;
    qd_status st;
    QD_TRY(check_rac("qd_cuda_rac_augment_weight", out, N, K, n));
    QD_TRY(check_in("qd_cuda_rac_augment_weight", w));
    if (N == 0 || K == 0)
        return QD_OK;
    QD_CUDA_CHECK(cudaMalloc((void **)&waug, (size_t)(N * (K + n)) * sizeof(float)));
    qd_launch(rac_gather_kernel, grid_for(N * (K + n)), QD_THREADS, 0, waug, w, channels, N, K, n);
    st = cudaGetLastError() == cudaSuccess
             ? launch_quantize(qout_of(out), NULL, out->s_dec, (const float *)waug, N, K + n,
                               out->per_row)
             : qd_error(QD_ERR_DEVICE, "qd_cuda_rac_augment_weight: gather launch");
    if (st == QD_OK)
        st = qd_cuda_nonfinite_check();
    cudaFree(waug);
    return st;
}

/* The per-tensor amax states of a grouped launch, made (zeroed) once. */
static qd_status qk_group_amax_state(qk_amax **a)
{
    static qk_amax *state;
    if (!state) {
        qk_amax *s;
        QD_CUDA_CHECK(cudaMalloc((void **)&s, QK_GROUP * sizeof *s));
        QD_CUDA_CHECK(cudaMemset(s, 0, QK_GROUP * sizeof *s));
        state = s;
    }
    *a = state;
    return QD_OK;
}

/* CTAs a tensor of a grouped launch of m tensors gets: the launch about
 * sm_count * 16 CTAs in all, no more than the tensor has work for. */
static unsigned group_ctas(int m, int64_t work)
{
    int64_t g = (int64_t)qd_sm_count() * 16 / m, most = (work + QD_THREADS - 1) / QD_THREADS;
    return (unsigned)(g < 1 ? 1 : g > most ? (most < 1 ? 1 : most) : g);
}

static qd_status check_weights(const char *fn, qd_nvfp4 *const *q, const float *const *x, const int64_t *const *ch,
                               int count, int64_t N, int64_t K, int64_t n)
{
    for (int i = 0; i < count; i++) {
        QD_TRY(check_rac(fn, q[i], N, K, n));
        QD_TRY(check_in(fn, x[i]));
        if (q[i]->per_row)
            return qd_error(QD_ERR_ARG, "%s: tensor %d: weights take one scale per tensor", fn, i);
        if (n && !ch[i])
            return qd_error(QD_ERR_ARG, "%s: tensor %d: no RAC channels", fn, i);
    }
    if (N * ((K + n) / 16) > (int64_t)UINT32_MAX / 2)
        return qd_error(QD_ERR_SHAPE, "%s: %lld x %lld blocks a tensor, more than a launch indexes", fn,
                        (long long)N, (long long)((K + n) / 16));
    return QD_OK;
}

extern "C" qd_status qd_cuda_nvfp4_quantize_weights_async(qd_nvfp4 *const *q, const float *const *x,
                                                          const int64_t *const *ch, int count, int64_t N,
                                                          int64_t K, int64_t n)
{
    const char *fn = "qd_cuda_nvfp4_quantize_weights";
    QD_TRY(check_weights(fn, q, x, ch, count, N, K, n));
    if (N == 0 || K == 0)
        return QD_OK;
    if (qd_cuda_quant_legacy) {
        for (int i = 0; i < count; i++)
            QD_TRY(n ? qd_cuda_rac_augment_weight(q[i], x[i], N, K, ch[i], n)
                     : qd_cuda_nvfp4_quantize_async(q[i], x[i]));
        return QD_OK;
    }
    qk_amax *a;
    QD_TRY(qk_group_amax_state(&a));
    int64_t bpr = (K + n) / 16, nblk = N * bpr;
    for (int i0 = 0; i0 < count; i0 += QK_GROUP) {
        int m = count - i0 < QK_GROUP ? count - i0 : QK_GROUP;
        qk_wgroup g;
        memset(&g, 0, sizeof g);
        for (int j = 0; j < m; j++) {
            g.x[j] = x[i0 + j];
            g.codes[j] = q[i0 + j]->codes;
            g.scales[j] = q[i0 + j]->scales;
            g.s_dec[j] = q[i0 + j]->s_dec;
            g.ch[j] = n ? ch[i0 + j] : NULL;
        }
        unsigned amax_ctas = group_ctas(m, N * K / 4 / QK_AMAX_VEC); /* 16-byte vectors, QK_AMAX_VEC a thread */
        qd_launch(qk_amax_group_kernel, dim3(amax_ctas, (unsigned)m), QD_THREADS, 0, a, g, N * K);
        if (n)
            qd_launch(qk_rac_group_kernel, dim3(group_ctas(m, nblk), (unsigned)m), QD_THREADS, 0, a, g, (uint32_t)N,
                      (uint32_t)K, (uint32_t)bpr);
        else
            qd_launch(qk_flat_group_kernel,
                      dim3(group_ctas(m, (nblk + QK_FLAT_UNROLL - 1) / QK_FLAT_UNROLL), (unsigned)m), QD_THREADS, 0, a,
                      g, nblk);
        QD_CUDA_CHECK(cudaGetLastError());
    }
    return QD_OK;
}

extern "C" qd_status qd_cuda_nvfp4_fake_quant_weights_async(float *const *out, float *const *s_dec,
                                                            uint16_t *const *bits, const float *const *x, int count,
                                                            int64_t N, int64_t K)
{
    const char *fn = "qd_cuda_nvfp4_fake_quant_weights";
    QD_TRY(check_shape(fn, N, K));
    for (int i = 0; i < count; i++) {
        QD_TRY(check_in(fn, x[i]));
        QD_TRY(check_in(fn, out[i]));
    }
    if (N == 0 || K == 0)
        return QD_OK;
    if (qd_cuda_quant_legacy) {
        if (bits)
            return qd_error(QD_ERR_UNSUPPORTED, "%s: BF16 bits under the legacy quantizers", fn);
        for (int i = 0; i < count; i++)
            QD_TRY(s_dec && s_dec[i] ? qd_cuda_nvfp4_fake_quant_sdec_async(out[i], s_dec[i], x[i], N, K)
                                     : qd_cuda_nvfp4_fake_quant_async(out[i], x[i], N, K, QD_SCALE_PER_TENSOR));
        return QD_OK;
    }
    qk_amax *a;
    QD_TRY(qk_group_amax_state(&a));
    int64_t nblk = N * (K / 16);
    for (int i0 = 0; i0 < count; i0 += QK_GROUP) {
        int m = count - i0 < QK_GROUP ? count - i0 : QK_GROUP;
        qk_fqgroup g;
        memset(&g, 0, sizeof g);
        for (int j = 0; j < m; j++) {
            g.x[j] = x[i0 + j];
            g.dq[j] = out[i0 + j];
            g.s_dec[j] = s_dec ? s_dec[i0 + j] : NULL;
            g.bits[j] = bits ? bits[i0 + j] : NULL;
        }
        qd_launch(qk_fq_amax_group_kernel, dim3(group_ctas(m, N * K / 4 / QK_AMAX_VEC), (unsigned)m), QD_THREADS, 0, a,
                  g, N * K);
        qd_launch(qk_fq_group_kernel, dim3(group_ctas(m, (nblk + QK_FLAT_UNROLL - 1) / QK_FLAT_UNROLL), (unsigned)m),
                  QD_THREADS, 0, a, g, nblk);
        QD_CUDA_CHECK(cudaGetLastError());
    }
    return QD_OK;
}

/* Linears a RAC pick launch takes: their (offset, K, n) ride in the kernel's parameters. */
#define QK_RAC_GROUP 192
/* The largest K whose keys (8 bytes a channel, 40 KB) a pick CTA holds in
 * shared memory, under the 48 KB a launch gets without opting in; a wider
 * linear's CTA reads its errors from global memory (L1/L2) at every pass. */
#define QK_RAC_SMEM_K 5120

struct qk_rac_sets {
    int64_t off[QK_RAC_GROUP];
    int K[QK_RAC_GROUP], n[QK_RAC_GROUP];
};

/* qd_cuda_quant_legacy's pick (before issue 13's): one CTA a linear y, channel
 * k picked when fewer than n channels come before it in (err descending,
 * channel ascending), the order of qd_rac_select's sort, whose first n it
 * takes, by a scan of all K errors (O(K^2) a linear); picked channels are
 * written ascending (a CTA-wide count of the picked ones below each tile of
 * 256). */
__global__ void __launch_bounds__(256) rac_select_kernel(int64_t *ch, const double *err,
                                                         const __grid_constant__ qk_rac_sets g)
{
    QD_PDL_ENTRY();
    __shared__ int warp_count[8];
    int y = blockIdx.x, K = g.K[y], n = g.n[y], lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const double *e = err + g.off[y];
    int64_t *out = ch + g.off[y];
    int base = 0, bad = 0;
    for (int t0 = 0; t0 < K; t0 += 256) {
        int k = t0 + threadIdx.x, pick = 0;
        if (k < K) {
            double ek = e[k];
            bad |= !isfinite(ek);
            int rank = 0;
            for (int j = 0; j < K && rank < n; j++) {
                double ej = e[j];
                rank += ej > ek || (ej == ek && j < k);
            }
            pick = rank < n;
        }
        unsigned m = __ballot_sync(0xffffffffu, pick);
        if (lane == 0)
            warp_count[wid] = __popc(m);
        __syncthreads();
        int below = base + __popc(m & ((1u << lane) - 1u));
        for (int w = 0; w < wid; w++)
            below += warp_count[w];
        if (pick)
            out[below] = k;
        for (int w = 0; w < 8; w++)
            base += warp_count[w];
        __syncthreads();
    }
    if (bad)
        qd_cuda_nonfinite = 1;
}

/* A channel's error as a key whose unsigned order is the errors' order: -0
 * made +0 (the two compare equal, so they tie), a negative's bits flipped, a
 * positive's sign bit set. */
static __device__ __forceinline__ uint64_t rac_key(double e)
{
    uint64_t b = (uint64_t)__double_as_longlong(e == 0.0 ? 0.0 : e);
    return b >> 63 ? ~b : b | 0x8000000000000000ull;
}

/* Channel k's key: held in shared memory (SMEM), else made from its error. */
template <bool SMEM>
static __device__ __forceinline__ uint64_t rac_key_at(const uint64_t *keys, const double *e, int k)
{
    return SMEM ? keys[k] : rac_key(e[k]);
}

/* How many of the K keys are >= t, CTA-wide (256 threads, all of them call);
 * cnt: 8 ints of shared memory that the call before this one did not use (two
 * buffers taken in turn: a barrier lies between a buffer's reads and its next
 * writes). */
template <bool SMEM>
static __device__ __forceinline__ int rac_count_ge(const uint64_t *keys, const double *e, int K, uint64_t t,
                                                   int *cnt)
{
    int c = 0;
    for (int k = threadIdx.x; k < K; k += 256)
        c += rac_key_at<SMEM>(keys, e, k) >= t;
    c = __reduce_add_sync(0xffffffffu, c);
    if ((threadIdx.x & 31) == 0)
        cnt[threadIdx.x >> 5] = c;
    __syncthreads();
    int s = 0;
#pragma unroll
    for (int w = 0; w < 8; w++)
        s += cnt[w];
    return s;
}

/* One CTA a linear y picks qd_rac_select's channels in O(64 K): T, the n-th
 * largest key, found a bit at a time from the top (the largest T with at
 * least n keys >= T: 64 CTA-wide counts), then every channel of key above T
 * and the first n - #(key > T) channels of key T in channel order: the first
 * n of (err descending, channel ascending), qd_rac_select's order. Picked
 * channels are written ascending (CTA-wide counts of the picked ones below
 * each tile of 256). SMEM: the keys held in shared memory (K <=
 * QK_RAC_SMEM_K, dynamic, 8 bytes a channel), else made from err at every
 * pass. */
template <bool SMEM>
__global__ void __launch_bounds__(256) rac_pick_kernel(int64_t *ch, const double *err,
                                                       const __grid_constant__ qk_rac_sets g)
{
    QD_PDL_ENTRY();
    extern __shared__ uint64_t qk_rac_keys[];
    __shared__ int cnt[2][8], tile_gt[8], tile_eq[8];
    int y = blockIdx.x, K = g.K[y], n = g.n[y], lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const double *e = err + g.off[y];
    int64_t *out = ch + g.off[y];
    int bad = 0;
    for (int k = threadIdx.x; k < K; k += 256) {
        double v = e[k];
        bad |= !isfinite(v);
        if (SMEM)
            qk_rac_keys[k] = rac_key(v);
    }
    if (bad)
        qd_cuda_nonfinite = 1;
    if (n == 0) /* the whole CTA: nothing picked */
        return;
    __syncthreads();
    uint64_t t = 0;
    int pass = 0;
    for (int bit = 63; bit >= 0; bit--) {
        uint64_t c = t | 1ull << bit;
        if (rac_count_ge<SMEM>(qk_rac_keys, e, K, c, cnt[pass++ & 1]) >= n)
            t = c;
    }
    int gt = t == ~0ull ? 0 : rac_count_ge<SMEM>(qk_rac_keys, e, K, t + 1, cnt[pass & 1]), need = n - gt;
    int base_gt = 0, base_eq = 0;
    unsigned lt = (1u << lane) - 1u;
    for (int t0 = 0; t0 < K; t0 += 256) {
        int k = t0 + threadIdx.x;
        uint64_t key = k < K ? rac_key_at<SMEM>(qk_rac_keys, e, k) : 0;
        int is_gt = k < K && key > t, is_eq = k < K && key == t;
        unsigned mg = __ballot_sync(0xffffffffu, is_gt), me = __ballot_sync(0xffffffffu, is_eq);
        if (lane == 0) {
            tile_gt[wid] = __popc(mg);
            tile_eq[wid] = __popc(me);
        }
        __syncthreads();
        int below_gt = base_gt + __popc(mg & lt), below_eq = base_eq + __popc(me & lt);
        for (int w = 0; w < 8; w++) {
            if (w < wid) {
                below_gt += tile_gt[w];
                below_eq += tile_eq[w];
            }
            base_gt += tile_gt[w];
            base_eq += tile_eq[w];
        }
        if (is_gt || (is_eq && below_eq < need))
            out[below_gt + min(below_eq, need)] = k;
        __syncthreads();
    }
}

/* The linears of one pick launch being gathered: m of them, the widest K. */
struct qk_rac_batch {
    qk_rac_sets g;
    int m, kmax;
};

enum qk_pick_kind { QK_PICK_LEGACY, QK_PICK_SMEM, QK_PICK_GLOBAL };

/* Launches batch b's linears (if any) and empties it. */
static qd_status rac_pick_launch(int64_t *ch, const double *err, qk_rac_batch *b, qk_pick_kind kind)
{
    if (!b->m)
        return QD_OK;
    if (kind == QK_PICK_LEGACY)
        qd_launch(rac_select_kernel, (unsigned)b->m, 256, 0, ch, err, b->g);
    else if (kind == QK_PICK_SMEM)
        qd_launch(rac_pick_kernel<true>, (unsigned)b->m, 256, sizeof(uint64_t) * (size_t)b->kmax, ch, err, b->g);
    else
        qd_launch(rac_pick_kernel<false>, (unsigned)b->m, 256, 0, ch, err, b->g);
    memset(b, 0, sizeof *b);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

/* Every linear checked before any launch; then each to the launch of its
 * kind (keys in shared memory up to QK_RAC_SMEM_K, wider ones from global
 * memory; every one the O(K^2) kernel under qd_cuda_quant_legacy), up to
 * QK_RAC_GROUP linears a launch. */
extern "C" qd_status qd_cuda_rac_select_async(int64_t *ch, const double *err, const size_t *off, const int *K,
                                              int count, double ratio)
{
    for (int i = 0; i < count; i++) {
        int64_t n = qd_rac_count(ratio, K[i]);
        if (K[i] < 0 || K[i] % QD_NVFP4_BLOCK || n < 0 || n > K[i])
            return qd_error(QD_ERR_ARG, "qd_cuda_rac_select: linear %d: K %d, ratio %g", i, K[i], ratio);
    }
    qk_rac_batch b[2]; /* [0]: keys in shared memory (or legacy), [1]: wider */
    const qk_pick_kind kind[2] = {qd_cuda_quant_legacy ? QK_PICK_LEGACY : QK_PICK_SMEM, QK_PICK_GLOBAL};
    memset(b, 0, sizeof b);
    for (int i = 0; i < count; i++) {
        int w = !qd_cuda_quant_legacy && K[i] > QK_RAC_SMEM_K;
        qk_rac_batch *p = &b[w];
        p->g.off[p->m] = (int64_t)off[i];
        p->g.K[p->m] = K[i];
        p->g.n[p->m] = (int)qd_rac_count(ratio, K[i]);
        p->kmax = K[i] > p->kmax ? K[i] : p->kmax;
        if (++p->m == QK_RAC_GROUP)
            QD_TRY(rac_pick_launch(ch, err, p, kind[w]));
    }
    QD_TRY(rac_pick_launch(ch, err, &b[0], kind[0]));
    return rac_pick_launch(ch, err, &b[1], kind[1]);
}
