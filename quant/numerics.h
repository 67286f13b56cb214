/* The scalar numerics every backend shares: E2M1, E4M3 and BF16 codecs and the
 * NVFP4 scale arithmetic (docs/numerics.md §1-§2). One static inline definition
 * compiled for host and device, so the CPU reference and the CUDA kernels give
 * the same bits by construction. Only exact integer work and correctly rounded
 * float32 operations appear here; compile with -ffp-contract=off / -fmad=false. */
#ifndef QD_NUMERICS_H
#define QD_NUMERICS_H

#include <stdint.h>
#include <float.h>
#include <math.h>
#include <string.h>

#ifdef __CUDACC__
#define QD_HD __host__ __device__ __forceinline__
#else
#define QD_HD static inline
#endif

#define QD_NVFP4_BLOCK 16          /* elements sharing one E4M3 block scale */
#define QD_E2M1_MAX 6.0f
#define QD_E4M3_MAX 448.0f
#define QD_NVFP4_AMAX_TARGET 2688.0f /* E2M1_MAX * E4M3_MAX */

/* Attention's logit scale 1/sqrt(D): the root taken in double, rounded once
 * to float (the CPU's attention, the CUDA kernels and the fast prefill's products). */
QD_HD float qd_attn_scale(int D) { return (float)(1.0 / sqrt((double)D)); }

QD_HD uint32_t qd_f32_bits(float f)
{
#ifdef __CUDA_ARCH__
    return (uint32_t)__float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

QD_HD float qd_bits_f32(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* ---- BF16: the top 16 bits of float32, round to nearest even; NaN stays NaN. */
/* max(m, |v|) for an accumulator m that is not NaN: fmaxf's value (a NaN v
 * leaves m, as fmaxf does). The host compares instead of calling libm's
 * fmaxf, which the compiler does not inline (a call per element in every
 * amax loop); the device keeps its one-instruction fmaxf. */
QD_HD float qd_absmax_acc(float m, float v)
{
#ifdef __CUDA_ARCH__
    return fmaxf(m, fabsf(v));
#else
    float a = fabsf(v);
    return a > m ? a : m;
#endif
}

/* fminf(a, b) for b not NaN (a NaN a gives b, as fminf does), without the
 * host's libm call; the device keeps fminf. */
QD_HD float qd_min_nn(float a, float b)
{
#ifdef __CUDA_ARCH__
    return fminf(a, b);
#else
    return a < b ? a : b;
#endif
}

QD_HD uint16_t qd_bf16_from_f32(float f)
{
    uint32_t u = qd_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN, sign kept */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

QD_HD float qd_bf16_to_f32(uint16_t h) { return qd_bits_f32((uint32_t)h << 16); }

/* float32 rounded to the nearest BF16 value, kept in a float. */
QD_HD float qd_round_bf16(float f) { return qd_bf16_to_f32(qd_bf16_from_f32(f)); }

/* ---- E2M1 (FP4): code = sign<<3 | index, index of {0,.5,1,1.5,2,3,4,6}.
 * Round to nearest, ties to the even index; |v| > 6 (and inf) saturates to 6.
 * The sign is the float's sign bit, so -0.0 encodes as 0x8. NaN must not reach
 * this function (the quantizer refuses non-finite input first). */
QD_HD uint8_t qd_e2m1_from_f32(float v)
{
    uint8_t s = (uint8_t)((qd_f32_bits(v) >> 28) & 0x8u);
    float a = fabsf(v);
    uint8_t i;
    if (a <= 0.25f)      i = 0;
    else if (a < 0.75f)  i = 1;
    else if (a <= 1.25f) i = 2;
    else if (a < 1.75f)  i = 3;
    else if (a <= 2.5f)  i = 4;
    else if (a < 3.5f)   i = 5;
    else if (a <= 5.0f)  i = 6;
    else                 i = 7;
    return (uint8_t)(s | i);
}

QD_HD float qd_e2m1_to_f32(uint8_t code)
{
    /* magnitude = index/2 for 0..4, then 3, 4, 6 */
    uint8_t i = code & 7u;
    float m = i < 5 ? 0.5f * (float)i : (i == 5 ? 3.0f : (i == 6 ? 4.0f : 6.0f));
    return (code & 8u) ? -m : m;
}

/* ---- E4M3 ("fn"): bias 7, no inf, 0x7F/0xFF NaN, max 448, min subnormal 2^-9.
 * Round to nearest even on the float's bits, saturating |v| >= 448 to 448. */
QD_HD uint8_t qd_e4m3_from_f32(float v)
{
    uint32_t u = qd_f32_bits(v);
    uint8_t s = (uint8_t)((u >> 24) & 0x80u);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u)
        return (uint8_t)(s | 0x7fu);                /* NaN */
    if (u >= 0x43e00000u)
        return (uint8_t)(s | 0x7eu);                /* >= 448: saturate */
    int e = (int)(u >> 23) - 127;
    if (e >= -6) {                                  /* E4M3 normal range */
        uint32_t mant = u & 0x7fffffu;
        uint32_t q = mant >> 20, rem = mant & 0xfffffu;
        if (rem > 0x80000u || (rem == 0x80000u && (q & 1u)))
            q++;                                    /* q == 8 carries into the exponent */
        return (uint8_t)(s | (((uint32_t)(e + 7) << 3) + q));
    }
    /* subnormal result m * 2^-9, m in 0..8 (8 is the min normal, code 0x08) */
    uint32_t sig = (u >> 23) ? ((u & 0x7fffffu) | 0x800000u) : (u & 0x7fffffu);
    int shift = (u >> 23) ? 14 - e : 140;           /* value * 2^9 = sig * 2^-shift */
    if (shift >= 32)
        return s;
    uint32_t m = sig >> shift, rem = sig & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (m & 1u)))
        m++;
    return (uint8_t)(s | m);
}

QD_HD float qd_e4m3_to_f32(uint8_t code)
{
    uint32_t e = (code >> 3) & 0xfu, m = code & 7u;
    float mag;
    if ((code & 0x7fu) == 0x7fu)
        mag = qd_bits_f32(0x7fc00000u);             /* NaN */
    else if (e == 0)
        mag = (float)m * 0.001953125f;              /* m * 2^-9, exact */
    else
        mag = qd_bits_f32(((e + 120u) << 23) | (m << 20)); /* (1+m/8) * 2^(e-7) */
    return (code & 0x80u) ? -mag : mag;
}

/* ---- FP8 E4M3 per-row scales (the FP8 baseline, docs/numerics.md): the encode
 * scale of a row is 448/amax clamped to FLT_MAX, 1 for an all-zero row; the
 * stored decode scale is 1.0f/scale and a code is e4m3(x * scale). */
QD_HD float qd_fp8_row_scale(float amax)
{
    return amax == 0.0f ? 1.0f : fminf(QD_E4M3_MAX / amax, FLT_MAX);
}

/* ---- NVFP4 scale arithmetic (TransformerEngine's, docs/numerics.md §2). */

/* Global encode scale of a scope with absolute maximum amax. */
QD_HD float qd_nvfp4_s_enc(float amax)
{
    float s = fminf(QD_NVFP4_AMAX_TARGET / amax, FLT_MAX);
    if (amax == 0.0f || s == 0.0f)
        s = 1.0f;
    return s;
}

/* The stored global decode scale ("weight_scale_2"). */
QD_HD float qd_nvfp4_s_dec(float s_enc) { return (float)(1.0 / (double)s_enc); }

/* E4M3 code of a block's scale from the block's absolute maximum. */
QD_HD uint8_t qd_nvfp4_block_scale(float amax_b, float s_enc)
{
    return qd_e4m3_from_f32(qd_min_nn(amax_b * (s_enc * (1.0f / 6.0f)), QD_E4M3_MAX));
}

/* Multiplier taking a block's values onto the E2M1 grid. */
QD_HD float qd_nvfp4_block_inv(uint8_t scale_code, float s_dec)
{
    return qd_min_nn(1.0f / (qd_e4m3_to_f32(scale_code) * s_dec), FLT_MAX);
}

/* The FP16 W4A4 kernels' operand (docs/numerics.md §3, w4a4_h16_kernel): 8
 * E2M1 codes, the nibbles of u, as 4 FP16 pairs, pair j holding nibble j (low
 * half) and nibble j + 4 (high half), each the FP16 of its value * 2^-14: the
 * code's sign to bit 15 and its exponent and mantissa bits to bits 11..9 (code
 * 1, 0.5, becomes the subnormal 2^-15). */
QD_HD void qd_e2m1x8_h16(uint32_t r[4], uint32_t u)
{
    r[0] = ((u << 9) & 0x0E000E00u) | ((u << 12) & 0x80008000u);
    r[1] = ((u << 5) & 0x0E000E00u) | ((u << 8) & 0x80008000u);
    r[2] = ((u << 1) & 0x0E000E00u) | ((u << 4) & 0x80008000u);
    r[3] = ((u >> 3) & 0x0E000E00u) | (u & 0x80008000u);
}

/* One dequantized value: (e2m1 * s_b) is exact, so one rounding. */
QD_HD float qd_nvfp4_dequant1(uint8_t code, uint8_t scale_code, float s_dec)
{
    return (qd_e2m1_to_f32(code) * qd_e4m3_to_f32(scale_code)) * s_dec;
}

/* ---- Branch-free twins of the encoders, for the CUDA quantizer's inner loop.
 * IEEE addition rounds to nearest even: a + M, with M a power of two whose ulp
 * is the target format's spacing at a, rounds a onto that format's grid exactly
 * as the format does (ties to the even code); bits(a + M) - bits(M) counts the
 * grid steps and (a + M) - M is the rounded value. The spacing follows a's
 * binade, clamped at the bottom to the format's subnormal spacing. The same codes
 * as qd_e2m1_from_f32 and qd_e4m3_from_f32 on their domains (tests/test_quant.c
 * samples them; every float was compared once, and tests/gpu/check_quant.cu
 * compares every float on the GPU). */

/* E2M1: a = min(|v|, 6) (any non-NaN v), spacing 0.5 below 2 (M = 2^22), 1 in
 * [2, 4) (2^23), 2 in [4, 6] (2^24). *e = max(exponent bits of a, 127) and
 * *t = bits(a + M), M = (e + 22) << 23; the magnitude index is
 * t - M + 2 (e - 127): the steps past 0, plus 2 for each binade above 1. */
QD_HD void qd_e2m1_rn_parts(float v, uint32_t *e, uint32_t *t)
{
    float a = qd_min_nn(fabsf(v), QD_E2M1_MAX);
    uint32_t b = qd_f32_bits(a) >> 23;
    *e = b < 127u ? 127u : b;
    *t = qd_f32_bits(a + qd_bits_f32((*e + 22u) << 23));
}

/* t - M + 2 (e - 127) = t + e (2 - 2^23) - QD_E2M1_RN_BIAS (mod 2^32) */
#define QD_E2M1_RN_BIAS ((22u << 23) + 254u)

/* The E2M1 magnitude index (0..7) of v; qd_e2m1_from_f32(v) & 7. */
QD_HD uint32_t qd_e2m1_index_rn(float v)
{
    uint32_t e, t;
    qd_e2m1_rn_parts(v, &e, &t);
    return t + e * (2u - (1u << 23)) - QD_E2M1_RN_BIAS;
}

/* The E4M3 code of a block scale v in [0, 448] (qd_nvfp4_block_scale's domain),
 * and in *value its value: spacing 2^-9 below 2^-6 (M = 2^14), 2^(e-3) in binade
 * 2^e (M = 2^(e+20)); a value rounding up to the next binade gives 16 steps,
 * that binade's code. */
QD_HD uint8_t qd_e4m3_scale_rn(float v, float *value)
{
    uint32_t e = qd_f32_bits(v) >> 23;
    e = e < 121u ? 121u : e;
    uint32_t m = (e + 20u) << 23;
    float t = v + qd_bits_f32(m);
    *value = t - qd_bits_f32(m);
    return (uint8_t)(qd_f32_bits(t) - m + 8u * (e - 121u));
}

/* Quantize one 16-element block given the scope's S_enc/S_dec: writes 8 packed
 * bytes (element 2i low nibble, 2i+1 high nibble), returns the E4M3 scale code.
 * Inputs must be finite. */
QD_HD uint8_t qd_nvfp4_quantize_block(uint8_t *packed, const float *x, float s_enc, float s_dec)
{
    float amax_b = 0.0f;
    for (int i = 0; i < QD_NVFP4_BLOCK; i++)
        amax_b = qd_absmax_acc(amax_b, x[i]);
    uint8_t sc = qd_nvfp4_block_scale(amax_b, s_enc);
    float inv = qd_nvfp4_block_inv(sc, s_dec);
    for (int i = 0; i < QD_NVFP4_BLOCK; i += 2)
        packed[i / 2] = (uint8_t)(qd_e2m1_from_f32(x[i] * inv) |
                                  (qd_e2m1_from_f32(x[i + 1] * inv) << 4));
    return sc;
}

/* ---- The row block-floating-point product (docs/numerics.md §3b): a row's
 * values share one exponent, E = floor(log2 max |v|) of the row, and each
 * becomes an integer mantissa RN(v 2^(P - E)) (round to nearest even), P = 21
 * for an activation row (|X| <= 2^22), 14 for a BF16 weight row (|W| < 2^15;
 * a weight within 2^7 of its row's largest is kept exactly). The dot product
 * of two rows is then one exact integer S, rounded once to float32 and scaled
 * by 2^(E + F - 35). Integer work only: no libm, the same bits everywhere. */
#define QD_BFP_PX 21
#define QD_BFP_PW 14
#define QD_BFP_NONFINITE (-100000) /* a row holding a NaN or an infinity: its outputs are NaN */
#define QD_BFP_NAN 0x7fc00000u

QD_HD int qd_bfp_clz32(uint32_t v)
{
#ifdef __CUDA_ARCH__
    return __clz((int)v);
#else
    return __builtin_clz(v);
#endif
}

/* The row exponent of the largest |value|'s bits amax (sign cleared): the
 * value's floor(log2); 0 for a zero row, QD_BFP_NONFINITE for NaN or infinity. */
QD_HD int qd_bfp_exponent(uint32_t amax)
{
    if (amax >= 0x7f800000u)
        return QD_BFP_NONFINITE;
    if (amax == 0)
        return 0;
    uint32_t ef = amax >> 23;
    return ef ? (int)ef - 127 : -149 + (31 - qd_bfp_clz32(amax)); /* subnormal: m 2^-149 */
}

/* v >> s rounded to nearest even (v >= 0, s >= 1) */
QD_HD uint64_t qd_bfp_rshift_rn(uint64_t v, int s)
{
    if (s >= 63)
        return 0;
    uint64_t q = v >> s, r = v & ((1ull << s) - 1), half = 1ull << (s - 1);
    return q + (r > half || (r == half && (q & 1)));
}

/* The mantissa RN(v 2^(P - E)) of the finite float with bits u in a row of
 * exponent E (|v| < 2^(E + 1), so |result| <= 2^(P + 1); a BF16 v at P = 14:
 * < 2^15, its 8 significant bits fit). */
QD_HD int32_t qd_bfp_mant(uint32_t u, int E, int P)
{
    uint32_t ef = (u >> 23) & 0xffu, m = u & 0x7fffffu;
    if (!ef && !m)
        return 0;
    uint64_t sig = ef ? (m | 0x800000u) : m;    /* v = sig 2^(e - 23) */
    int k = (ef ? (int)ef - 127 : -126) - 23 + P - E;
    uint64_t a = k >= 0 ? sig << k : qd_bfp_rshift_rn(sig, -k);
    return (u >> 31) ? -(int32_t)a : (int32_t)a;
}

/* The output of an exact dot product S of two rows of exponents E and F:
 * (float)S (to nearest even), times 2^(E + F - P_X - P_W), exactly unless the
 * result is subnormal (rounded to nearest even again) or overflows (infinity). */
QD_HD float qd_bfp_out(int64_t S, int E, int F)
{
    if (E == QD_BFP_NONFINITE || F == QD_BFP_NONFINITE)
        return qd_bits_f32(QD_BFP_NAN);
    if (S == 0)
        return 0.0f;
#ifdef __CUDA_ARCH__
    uint32_t u = __float_as_uint(__ll2float_rn((long long)S));
#else
    uint32_t u = qd_f32_bits((float)S);
#endif
    uint32_t sign = u & 0x80000000u;
    int ef = (int)((u >> 23) & 0xffu) + E + F - QD_BFP_PX - QD_BFP_PW;
    if (ef >= 255)
        return qd_bits_f32(sign | 0x7f800000u);
    if (ef >= 1)
        return qd_bits_f32(sign | ((uint32_t)ef << 23) | (u & 0x7fffffu));
    uint64_t sig = (u & 0x7fffffu) | 0x800000u; /* value sig 2^(ef - 1 - 149 + ...): subnormal */
    return qd_bits_f32(sign | (uint32_t)qd_bfp_rshift_rn(sig, 1 - ef));
}

#endif /* QD_NUMERICS_H */
