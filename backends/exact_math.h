/* The transcendentals of the exact mode (NUMERICS.md §6): exp, log, sigmoid,
 * silu and rsqrt, built only from correctly rounded float32 operations (+, -,
 * *, /, sqrt) and exact bit manipulation, with every operation's order written
 * out. The same source compiled for the host and the device therefore gives
 * the same bits; libm's expf/logf (and CUDA's __expf) are not used because
 * their results differ between libraries. Compile with -ffp-contract=off
 * (nvcc -fmad=false): a contracted a*b+c would change the bits.
 *
 * Accuracy against libm in double (measured over every float, normal
 * results): exp 1.03 ulp, log 0.86 ulp, sigmoid and silu 2.5 ulp; exp, log
 * and sigmoid are monotonic. tests/test_backend_cpu.c checks a sample. */
#ifndef QD_EXACT_MATH_H
#define QD_EXACT_MATH_H

#include <stdint.h>
#include "quant/numerics.h"

/* ln 2 split so that n * QD_LN2_HI is exact for |n| < 2^9 (15 significant
 * bits) and QD_LN2_HI + QD_LN2_LO is ln 2 to about 40 bits (Cody-Waite). */
#define QD_LN2_HI 0.693145751953125f          /* 0x3f317200 */
#define QD_LN2_LO 1.428606765330187045e-06f   /* ln 2 - QD_LN2_HI */
#define QD_LOG2E 1.44269504088896341f

/* 2^n as a float, for -126 <= n <= 127. */
QD_HD float qd_exp2i(int n) { return qd_bits_f32((uint32_t)(n + 127) << 23); }

/* e^x. x = n ln2 + r with |r| <= ~ln2/2; e^r from its degree-7 Taylor
 * polynomial (truncation < 6e-9 relative), evaluated as 1 + (r + r^2 P(r)) so
 * that the final rounding dominates; then scaled by 2^n with one rounding. */
QD_HD float qd_expf(float x)
{
    if (x != x)
        return x + x;
    if (x > 89.0f)
        return qd_bits_f32(0x7f800000u);
    if (x < -104.0f)
        return 0.0f;
    float fn = floorf(x * QD_LOG2E + 0.5f);
    int n = (int)fn;
    float hi = x - fn * QD_LN2_HI;                  /* exact (Sterbenz) */
    float r = hi - fn * QD_LN2_LO;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    float er = 1.0f + (r + (r * r) * p);            /* e^r in [0.70, 1.42] */
    if (n > 127)
        return (er * qd_exp2i(127)) * 2.0f;         /* first product exact */
    if (n < -126)
        return (er * qd_exp2i(n + 126)) * qd_exp2i(-126); /* first product exact */
    return er * qd_exp2i(n);                        /* exact unless it overflows */
}

/* Natural logarithm. x = 2^e m with m in [sqrt(1/2), sqrt(2)), f = m - 1 (exact),
 * s = f/(2+f), log(1+f) = 2 atanh(s) = f - (f^2/2 - s (f^2/2 + R(s^2)))
 * with R(z) = 2z/3 + 2z^2/5 + 2z^3/7 + 2z^4/9 (|s| < 0.172, truncation < 1e-10);
 * the exact terms e*ln2_hi and f are added last. */
QD_HD float qd_logf(float x)
{
    uint32_t u = qd_f32_bits(x);
    if (x != x || u == 0x7f800000u)
        return x + x;                               /* NaN, +inf */
    if (x < 0.0f)
        return qd_bits_f32(0x7fc00000u);
    if (x == 0.0f)
        return qd_bits_f32(0xff800000u);
    int e = 0;
    if (u < 0x00800000u) {                          /* subnormal: scale by 2^25 */
        u = qd_f32_bits(x * 33554432.0f);
        e = -25;
    }
    e += (int)(u >> 23) - 127;
    uint32_t mu = (u & 0x7fffffu) | 0x3f800000u;    /* m in [1, 2) */
    if (mu > 0x3fb504f3u) {                         /* m > sqrt(2): halve it */
        mu -= 0x00800000u;
        e += 1;
    }
    float f = qd_bits_f32(mu) - 1.0f;
    float s = f / (2.0f + f);
    float z = s * s;
    float R = 2.0f / 9.0f;
    R = R * z + 2.0f / 7.0f;
    R = R * z + 2.0f / 5.0f;
    R = R * z + 2.0f / 3.0f;
    R = R * z;
    float hfsq = (0.5f * f) * f;
    float fe = (float)e;
    return fe * QD_LN2_HI - ((hfsq - (s * (hfsq + R) + fe * QD_LN2_LO)) - f);
}

/* 1 / (1 + e^-x); 0 for x below about -88 (e^-x = inf). */
QD_HD float qd_sigmoidf(float x) { return 1.0f / (1.0f + qd_expf(-x)); }

/* SiLU x * sigmoid(x), computed as x / (1 + e^-x) (one rounding fewer). */
QD_HD float qd_siluf(float x) { return x / (1.0f + qd_expf(-x)); }

/* 1/sqrt(x): two correctly rounded operations (not the hardware rsqrt). */
QD_HD float qd_rsqrtf(float x) { return 1.0f / sqrtf(x); }

#endif /* QD_EXACT_MATH_H */
