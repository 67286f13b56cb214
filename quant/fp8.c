/* FP8 E4M3 with one scale per row: the FP8 baseline (docs/numerics.md, "FP8").
 * Weights get one scale per output channel, activations one per token; the
 * product sums exact E4M3 products in ascending k and scales once at the end. */
#include <float.h>
#include <math.h>
#include "quant/quant.h"

/* One row (k) of codes; returns the decode scale 1/scale. E4M3 saturates, so a
 * value that rounds just above 448 after the multiply still encodes as 448. */
float qd_quantize_row_fp8_ref(uint8_t *q, const float *x, int64_t k)
{
    float amax = 0.0f;
    for (int64_t i = 0; i < k; i++)
        amax = qd_absmax_acc(amax, x[i]);
    float scale = qd_fp8_row_scale(amax);
    for (int64_t i = 0; i < k; i++)
        q[i] = qd_e4m3_from_f32(x[i] * scale);
    return 1.0f / scale;
}

qd_status qd_fp8_quantize_rows(uint8_t *q, float *scale_inv, const float *x, int64_t rows, int64_t cols)
{
    float amax;
    if (rows < 1 || cols < 1)
        return qd_error(QD_ERR_SHAPE, "qd_fp8_quantize_rows: shape (%lld, %lld)",
                        (long long)rows, (long long)cols);
    qd_status st = qd_amax(&amax, x, rows * cols);
    if (st != QD_OK)
        return st;
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++)
        scale_inv[r] = qd_quantize_row_fp8_ref(q + r * cols, x + r * cols, cols);
    return QD_OK;
}

void qd_fp8_dequantize_rows(float *out, const uint8_t *q, const float *scale_inv, int64_t rows, int64_t cols)
{
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < cols; i++)
            out[r * cols + i] = qd_e4m3_to_f32(q[r * cols + i]) * scale_inv[r];
}

/* Dot product of two E4M3 rows: each product is exact in float32 (4+4
 * significant bits, exponents within range), the sum is sequential in k.
 * lut holds the 256 decoded codes (qd_e4m3_to_f32), so decoding costs a load. */
static float fp8_dot(const uint8_t *a, const uint8_t *w, int64_t k, const float *lut)
{
    float acc = 0.0f;
    for (int64_t i = 0; i < k; i++)
        acc = acc + lut[a[i]] * lut[w[i]];
    return acc;
}

void qd_fp8_gemm(float *y, const uint8_t *qa, const float *sa_inv, const uint8_t *qw,
                 const float *sw_inv, int64_t M, int64_t N, int64_t K)
{
    float lut[256];
    for (int c = 0; c < 256; c++)
        lut[c] = qd_e4m3_to_f32((uint8_t)c);
    #pragma omp parallel for collapse(2) schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++)
            y[m * N + n] = fp8_dot(qa + m * K, qw + n * K, K, lut) * (sa_inv[m] * sw_inv[n]);
}
