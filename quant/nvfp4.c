/* NVFP4 quantization on the CPU: the reference definition of docs/numerics.md §2.
 * Every scope (a tensor, or one row) gets its global scale from its amax; each
 * 16-element block goes through qd_nvfp4_quantize_block (quant/numerics.h), so
 * the CUDA kernels, which call the same function, give the same bits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "quant/quant.h"

/* Checks the shape rules every NVFP4 matrix follows (cols = K along the blocks). */
static qd_status check_shape(int64_t rows, int64_t cols, const char *who)
{
    if (rows < 1 || cols < QD_NVFP4_BLOCK || cols % QD_NVFP4_BLOCK != 0)
        return qd_error(QD_ERR_SHAPE, "%s: shape (%lld, %lld): rows must be >= 1 and cols a "
                        "positive multiple of 16", who, (long long)rows, (long long)cols);
    if (rows > INT64_MAX / cols)
        return qd_error(QD_ERR_SHAPE, "%s: shape (%lld, %lld) overflows", who,
                        (long long)rows, (long long)cols);
    return QD_OK;
}

qd_status qd_nvfp4_alloc(qd_nvfp4 *q, int64_t rows, int64_t cols, qd_scale_kind scale)
{
    memset(q, 0, sizeof *q);
    if (scale != QD_SCALE_PER_TENSOR && scale != QD_SCALE_PER_ROW)
        return qd_error(QD_ERR_ARG, "qd_nvfp4_alloc: scale kind %d", (int)scale);
    qd_status st = check_shape(rows, cols, "qd_nvfp4_alloc");
    if (st != QD_OK)
        return st;
    q->rows = rows;
    q->cols = cols;
    q->per_row = scale;
    q->codes = malloc((size_t)(rows * cols / 2));
    q->scales = malloc((size_t)(rows * cols / QD_NVFP4_BLOCK));
    q->s_dec = malloc(sizeof(float) * (size_t)(scale == QD_SCALE_PER_ROW ? rows : 1));
    if (!q->codes || !q->scales || !q->s_dec) {
        qd_nvfp4_free(q);
        return qd_error(QD_ERR_NOMEM, "qd_nvfp4_alloc: (%lld, %lld) matrix",
                        (long long)rows, (long long)cols);
    }
    return QD_OK;
}

void qd_nvfp4_free(qd_nvfp4 *q)
{
    free(q->codes);
    free(q->scales);
    free(q->s_dec);
    memset(q, 0, sizeof *q);
}

qd_status qd_amax(float *amax, const float *x, int64_t n)
{
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i]))
            return qd_error(QD_ERR_NONFINITE, "qd_amax: element %lld is %s (NVFP4/FP8 "
                            "input must be finite)", (long long)i, isnan(x[i]) ? "NaN" : "Inf");
        m = qd_absmax_acc(m, x[i]);
    }
    *amax = m;
    return QD_OK;
}

/* The first non-finite of one piece: the OR first (vectorized), the search
 * only where it found something. */
static int64_t piece_first_nonfinite(const float *x, int64_t n)
{
    uint32_t any = 0;
#pragma omp simd reduction(| : any)
    for (int64_t i = 0; i < n; i++)
        any |= (qd_f32_bits(x[i]) & 0x7f800000u) == 0x7f800000u;
    for (int64_t i = 0; any && i < n; i++)
        if (!isfinite(x[i]))
            return i;
    return -1;
}

int64_t qd_first_nonfinite(const float *x, int64_t n)
{
    const int64_t piece = (int64_t)1 << 16;
    int64_t pieces = (n + piece - 1) / piece, first = INT64_MAX;
#pragma omp parallel for schedule(static) reduction(min : first) if (pieces > 16)
    for (int64_t k = 0; k < pieces; k++) {
        int64_t b = k * piece, i = piece_first_nonfinite(x + b, n - b < piece ? n - b : piece);
        if (i >= 0 && b + i < first)
            first = b + i;
    }
    return first == INT64_MAX ? -1 : first;
}

/* Absolute maximum of a row already known to be finite. */
static float row_amax(const float *x, int64_t n)
{
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++)
        m = qd_absmax_acc(m, x[i]);
    return m;
}

/* One row (k elements) with the scope's encode scale: codes (k/2), scales (k/16). */
void qd_quantize_row_nvfp4_ref(uint8_t *codes, uint8_t *scales, const float *x, int64_t k,
                            float s_enc)
{
    float s_dec = qd_nvfp4_s_dec(s_enc);
    for (int64_t b = 0; b < k / QD_NVFP4_BLOCK; b++)
        scales[b] = qd_nvfp4_quantize_block(codes + b * (QD_NVFP4_BLOCK / 2),
                                            x + b * QD_NVFP4_BLOCK, s_enc, s_dec);
}

/* x_hat (k) of one row: (e2m1 * s_b) * S_dec. */
void qd_dequantize_row_nvfp4(float *out, const uint8_t *codes, const uint8_t *scales, int64_t k,
                          float s_dec)
{
    for (int64_t i = 0; i < k; i += 2) {
        uint8_t sc = scales[i / QD_NVFP4_BLOCK], byte = codes[i / 2];
        out[i] = qd_nvfp4_dequant1(byte & 0xf, sc, s_dec);
        out[i + 1] = qd_nvfp4_dequant1(byte >> 4, sc, s_dec);
    }
}

/* Quantizes every row with s_enc[r] (or s_enc[0] for a per-tensor q); x was checked. */
static void quantize_rows(qd_nvfp4 *q, const float *x, const float *s_enc)
{
    int64_t k = q->cols;
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < q->rows; r++)
        qd_quantize_row_nvfp4_ref(q->codes + r * (k / 2), q->scales + r * (k / QD_NVFP4_BLOCK),
                               x + r * k, k, s_enc[q->per_row ? r : 0]);
    for (int64_t r = 0; r < (q->per_row ? q->rows : 1); r++)
        q->s_dec[r] = qd_nvfp4_s_dec(s_enc[r]);
}

qd_status qd_nvfp4_quantize(qd_nvfp4 *q, const float *x)
{
    float amax;
    /* validate the whole input first: a non-finite value leaves q untouched */
    qd_status st = qd_amax(&amax, x, q->rows * q->cols);
    if (st != QD_OK)
        return st;
    int64_t nscope = q->per_row ? q->rows : 1;
    float *s_enc = malloc(sizeof(float) * (size_t)nscope);
    if (!s_enc)
        return qd_error(QD_ERR_NOMEM, "qd_nvfp4_quantize: %lld scales", (long long)nscope);
    if (q->per_row)
        for (int64_t r = 0; r < q->rows; r++)
            s_enc[r] = qd_nvfp4_s_enc(row_amax(x + r * q->cols, q->cols));
    else
        s_enc[0] = qd_nvfp4_s_enc(amax);
    quantize_rows(q, x, s_enc);
    free(s_enc);
    return QD_OK;
}

qd_status qd_nvfp4_quantize_with(qd_nvfp4 *q, const float *x, const float *s_enc)
{
    float amax;
    int64_t nscope = q->per_row ? q->rows : 1;
    for (int64_t r = 0; r < nscope; r++)
        if (!isfinite(s_enc[r]) || !(s_enc[r] > 0.0f))
            return qd_error(QD_ERR_ARG, "qd_nvfp4_quantize_with: s_enc[%lld] = %g must be "
                            "finite and > 0", (long long)r, (double)s_enc[r]);
    qd_status st = qd_amax(&amax, x, q->rows * q->cols);
    if (st != QD_OK)
        return st;
    quantize_rows(q, x, s_enc);
    return QD_OK;
}

void qd_nvfp4_dequantize(float *out, const qd_nvfp4 *q)
{
    int64_t k = q->cols;
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < q->rows; r++)
        qd_dequantize_row_nvfp4(out + r * k, q->codes + r * (k / 2),
                             q->scales + r * (k / QD_NVFP4_BLOCK), k,
                             q->s_dec[q->per_row ? r : 0]);
}

qd_status qd_nvfp4_fake_quant(float *out, const float *x, int64_t rows, int64_t cols, qd_scale_kind scale)
{
    qd_nvfp4 q;
    qd_status st = qd_nvfp4_alloc(&q, rows, cols, scale);
    if (st == QD_OK)
        st = qd_nvfp4_quantize(&q, x);
    if (st == QD_OK)
        qd_nvfp4_dequantize(out, &q);
    qd_nvfp4_free(&q);
    return st;
}
