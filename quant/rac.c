/* Residual Activation Compensation on the CPU (docs/numerics.md §5).
 *
 * A linear layer's input row x is augmented along K with the NVFP4 residual of a
 * channel set S, quantized with the row's own global scale; the weight gets the
 * matching copy of its columns S, quantized with the weight's global scale. One
 * canonical W4A4 product over K + |S| then adds x̂·w + r̂[S]·w[S], main blocks first. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "quant/quant.h"

qd_status qd_rac_error_accumulate(double *err, const float *x, int64_t rows, int64_t K)
{
    float *xhat = malloc(sizeof(float) * (size_t)(rows > 0 && K > 0 ? rows * K : 1));
    if (!xhat)
        return qd_error(QD_ERR_NOMEM, "qd_rac_error_accumulate: (%lld, %lld) buffer",
                        (long long)rows, (long long)K);
    qd_status st = qd_nvfp4_fake_quant(xhat, x, rows, K, QD_SCALE_PER_ROW);
    if (st == QD_OK) {
        /* per channel, rows in ascending order: the sums do not depend on threads */
        #pragma omp parallel for schedule(static)
        for (int64_t k = 0; k < K; k++)
            for (int64_t r = 0; r < rows; r++) {
                float d = x[r * K + k] - xhat[r * K + k];
                err[k] += (double)d * (double)d;
            }
    }
    free(xhat);
    return st;
}

typedef struct {
    double err;
    int64_t k;
} channel_err;

/* qsort order: larger error first, then the lower channel index. */
static int by_error_desc(const void *pa, const void *pb)
{
    const channel_err *a = pa, *b = pb;
    if (a->err != b->err)
        return a->err > b->err ? -1 : 1;
    return (a->k > b->k) - (a->k < b->k);
}

static int by_index(const void *pa, const void *pb)
{
    int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    return (a > b) - (a < b);
}

/* floor(ratio*K/16)*16 with a tolerance: ratio = 0.29, K = 1600 is 464 channels on
 * paper, but 0.29*1600/16 is 28.999999999999996 in binary. */
int64_t qd_rac_count(double ratio, int64_t K)
{
    double blocks = ratio * (double)K / QD_NVFP4_BLOCK;
    return (int64_t)floor(blocks + 1e-9) * QD_NVFP4_BLOCK;
}

int64_t qd_rac_select(int64_t *channels, const double *err, int64_t K, double ratio)
{
    if (!(ratio >= 0.0 && ratio <= 1.0) || K < 0 || K % QD_NVFP4_BLOCK != 0) {
        qd_error(QD_ERR_ARG, "qd_rac_select: ratio %g must be in [0, 1] and K = %lld a "
                 "multiple of 16", ratio, (long long)K);
        return -1;
    }
    for (int64_t k = 0; k < K; k++)
        if (!isfinite(err[k])) {
            qd_error(QD_ERR_NONFINITE, "qd_rac_select: err[%lld] is not finite", (long long)k);
            return -1;
        }
    int64_t n = qd_rac_count(ratio, K);
    channel_err *order = malloc(sizeof *order * (size_t)(K > 0 ? K : 1));
    if (!order) {
        qd_error(QD_ERR_NOMEM, "qd_rac_select: %lld channels", (long long)K);
        return -1;
    }
    for (int64_t k = 0; k < K; k++)
        order[k] = (channel_err){err[k], k};
    qsort(order, (size_t)K, sizeof *order, by_error_desc);
    for (int64_t j = 0; j < n; j++)
        channels[j] = order[j].k;
    qsort(channels, (size_t)n, sizeof *channels, by_index);
    free(order);
    return n;
}

/* Shape rules shared by both augmentations. */
static qd_status check_aug(const qd_nvfp4 *out, int64_t rows, int64_t K, const int64_t *channels,
                           int64_t n, const char *who)
{
    if (n < 0 || n % QD_NVFP4_BLOCK != 0 || n > K)
        return qd_error(QD_ERR_SHAPE, "%s: |S| = %lld must be a multiple of 16 in [0, K = %lld]",
                        who, (long long)n, (long long)K);
    if (out->rows != rows || out->cols != K + n)
        return qd_error(QD_ERR_SHAPE, "%s: out is (%lld, %lld), expected (%lld, %lld)", who,
                        (long long)out->rows, (long long)out->cols, (long long)rows,
                        (long long)(K + n));
    for (int64_t j = 0; j < n; j++)
        if (channels[j] < 0 || channels[j] >= K)
            return qd_error(QD_ERR_ARG, "%s: channels[%lld] = %lld is outside [0, %lld)", who,
                            (long long)j, (long long)channels[j], (long long)K);
    return QD_OK;
}

/* One augmented row: codes/scales of [quantize(x), quantize_with(s_enc, r[S])].
 * xhat (K) is scratch. */
static void augment_act_row(uint8_t *codes, uint8_t *scales, float *xhat, float *res,
                            const float *x, int64_t K, const int64_t *channels, int64_t n,
                            float s_enc)
{
    qd_quantize_row_nvfp4_ref(codes, scales, x, K, s_enc);
    qd_dequantize_row_nvfp4(xhat, codes, scales, K, qd_nvfp4_s_dec(s_enc));
    for (int64_t j = 0; j < n; j++)
        res[j] = x[channels[j]] - xhat[channels[j]];
    if (n > 0)
        qd_quantize_row_nvfp4_ref(codes + K / 2, scales + K / QD_NVFP4_BLOCK, res, n, s_enc);
}

/* Encode scale of row r: its own amax when per_row, else the tensor's. */
static float act_s_enc(const float *x, int64_t r, int64_t K, qd_scale_kind scale, float tensor_amax)
{
    if (scale == QD_SCALE_PER_TENSOR)
        return qd_nvfp4_s_enc(tensor_amax);
    float amax = 0.0f;
    for (int64_t i = 0; i < K; i++)
        amax = qd_absmax_acc(amax, x[r * K + i]);
    return qd_nvfp4_s_enc(amax);
}

qd_status qd_rac_augment_act(qd_nvfp4 *out, const float *x, int64_t rows, int64_t K,
                             const int64_t *channels, int64_t n)
{
    float amax;
    qd_status st = check_aug(out, rows, K, channels, n, "qd_rac_augment_act");
    if (st == QD_OK)
        st = qd_amax(&amax, x, rows * K);
    if (st != QD_OK)
        return st;
    float *scratch = malloc(sizeof(float) * (size_t)(rows * (K + n)));
    if (!scratch)
        return qd_error(QD_ERR_NOMEM, "qd_rac_augment_act: (%lld, %lld) buffer",
                        (long long)rows, (long long)(K + n));
    int64_t kc = K + n;
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float s_enc = act_s_enc(x, r, K, out->per_row, amax);
        augment_act_row(out->codes + r * (kc / 2), out->scales + r * (kc / QD_NVFP4_BLOCK),
                        scratch + r * kc, scratch + r * kc + K, x + r * K, K, channels, n, s_enc);
        if (out->per_row || r == 0)
            out->s_dec[out->per_row ? r : 0] = qd_nvfp4_s_dec(s_enc);
    }
    free(scratch);
    return QD_OK;
}

qd_status qd_rac_augment_weight(qd_nvfp4 *out, const float *w, int64_t N, int64_t K,
                                const int64_t *channels, int64_t n)
{
    qd_status st = check_aug(out, N, K, channels, n, "qd_rac_augment_weight");
    if (st != QD_OK)
        return st;
    int64_t kc = K + n;
    float *wa = malloc(sizeof(float) * (size_t)(N * kc));
    if (!wa)
        return qd_error(QD_ERR_NOMEM, "qd_rac_augment_weight: (%lld, %lld) buffer",
                        (long long)N, (long long)kc);
    /* [W, W[:, S]]: the copied columns never raise the amax, so quantizing the
     * augmented matrix uses exactly W's global scale(s) */
    for (int64_t r = 0; r < N; r++) {
        memcpy(wa + r * kc, w + r * K, sizeof(float) * (size_t)K);
        for (int64_t j = 0; j < n; j++)
            wa[r * kc + K + j] = w[r * K + channels[j]];
    }
    st = qd_nvfp4_quantize(out, wa);
    free(wa);
    return st;
}

qd_status qd_rac_fake_quant(float *out, const float *x, int64_t rows, int64_t K, const int64_t *channels,
                            int64_t n)
{
    qd_nvfp4 a;
    int64_t kc = K + n;
    if (rows == 0)
        return QD_OK;
    QD_TRY(qd_nvfp4_alloc(&a, rows, kc, QD_SCALE_PER_ROW));
    float *deq = malloc(sizeof(float) * (size_t)(rows * kc) + 1);
    qd_status st = deq ? qd_rac_augment_act(&a, x, rows, K, channels, n)
                       : qd_error(QD_ERR_NOMEM, "qd_rac_fake_quant: (%lld, %lld) buffer", (long long)rows,
                                  (long long)kc);
    if (st == QD_OK) {
        qd_nvfp4_dequantize(deq, &a);
        for (int64_t r = 0; r < rows; r++) {
            memcpy(out + r * K, deq + r * kc, sizeof(float) * (size_t)K);
            for (int64_t j = 0; j < n; j++)
                out[r * K + channels[j]] += deq[r * kc + K + j];
        }
    }
    free(deq);
    qd_nvfp4_free(&a);
    return st;
}
