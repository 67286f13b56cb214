/* The canonical W4A4 product (docs/numerics.md §3) on the CPU.
 *
 * Per output, blocks are visited in ascending order: the block sum p is exact
 * (a multiple of 1/4 below 2^10), p * (sa * sw) is exact (at most 20
 * significant bits), so the only roundings are the accumulating add, and the
 * final two multiplies. Any backend that keeps this block order gets these bits. */
#include <stdlib.h>
#include "quant/quant.h"

/* Signed E2M1 value of code c in halves: {0, .5, 1, 1.5, 2, 3, 4, 6} * 2. */
#define HALVES(c) (((c) & 8 ? -1 : 1) * \
                   ((c) % 8 < 5 ? (c) % 8 : (c) % 8 == 5 ? 6 : (c) % 8 == 6 ? 8 : 12))
/* prod_quarters[a << 4 | w]: the product of codes a and w in units of 1/4. */
#define PQ(i) (int16_t)(HALVES((i) >> 4) * HALVES((i) & 15))
#define PQ4(i) PQ(i), PQ((i) + 1), PQ((i) + 2), PQ((i) + 3)
#define PQ16(i) PQ4(i), PQ4((i) + 4), PQ4((i) + 8), PQ4((i) + 12)
#define PQ64(i) PQ16(i), PQ16((i) + 16), PQ16((i) + 32), PQ16((i) + 48)
static const int16_t prod_quarters[256] = {PQ64(0), PQ64(64), PQ64(128), PQ64(192)};

/* Sum of the 16 products of one block pair, in quarters: |sum| <= 16*144. */
static int block_sum_quarters(const uint8_t *a, const uint8_t *w)
{
    int s = 0;
    for (int i = 0; i < QD_NVFP4_BLOCK / 2; i++)
        s += prod_quarters[(a[i] & 0xf) << 4 | (w[i] & 0xf)] +
             prod_quarters[(a[i] & 0xf0) | w[i] >> 4];
    return s;
}

/* One output y[m][n]: the block-ordered sum, then the two global decode scales. */
static float w4a4_dot(const qd_nvfp4 *a, int64_t m, const qd_nvfp4 *w, int64_t n)
{
    int64_t nb = a->cols / QD_NVFP4_BLOCK;
    const uint8_t *ca = a->codes + m * (a->cols / 2), *cw = w->codes + n * (w->cols / 2);
    const uint8_t *sa = a->scales + m * nb, *sw = w->scales + n * nb;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        float p = (float)block_sum_quarters(ca + b * 8, cw + b * 8) * 0.25f;
        acc = acc + p * (qd_e4m3_to_f32(sa[b]) * qd_e4m3_to_f32(sw[b]));
    }
    float sdec_a = a->s_dec[a->per_row ? m : 0], sdec_w = w->s_dec[w->per_row ? n : 0];
    return acc * (sdec_a * sdec_w);
}

/* halves_pair[c]: the signed halves of code byte c's low and high nibbles. */
#define HP(i) {(int8_t)HALVES((i) & 15), (int8_t)HALVES((i) >> 4)}
#define HP4(i) HP(i), HP((i) + 1), HP((i) + 2), HP((i) + 3)
#define HP16(i) HP4(i), HP4((i) + 4), HP4((i) + 8), HP4((i) + 12)
#define HP64(i) HP16(i), HP16((i) + 16), HP16((i) + 32), HP16((i) + 48)
static const int8_t halves_pair[256][2] = {HP64(0), HP64(64), HP64(128), HP64(192)};

/* Row r of q widened: its codes to signed halves h (cols), its block scales
 * to float f (cols / 16). A table read a code byte (the nibbles decoded one
 * by one made this a quarter of a CPU decode's time). */
static void widen_row(int8_t *h, float *f, const qd_nvfp4 *q, int64_t r)
{
    int64_t K = q->cols, nb = K / QD_NVFP4_BLOCK;
    const uint8_t *c = q->codes + r * (K / 2);
    for (int64_t i = 0; i < K / 2; i++) {
        h[2 * i] = halves_pair[c[i]][0];
        h[2 * i + 1] = halves_pair[c[i]][1];
    }
    for (int64_t b = 0; b < nb; b++)
        f[b] = qd_e4m3_to_f32(q->scales[r * nb + b]);
}

/* The same outputs with the codes widened first: A's codes to signed halves
 * (int8) and its block scales to float once, each W row likewise once per
 * thread, so that a block sum is 16 int8 products (vectorized) rather than
 * 16 table reads, and no scale is decoded M x N times. The integers and the
 * float expression per block are w4a4_dot's: the same bits. 0 on an
 * allocation failure (the caller then takes w4a4_dot). */
static int w4a4_gemm_wide(float *y, const qd_nvfp4 *a, const qd_nvfp4 *w)
{
    int64_t M = a->rows, N = w->rows, K = a->cols, nb = K / QD_NVFP4_BLOCK;
    int8_t *ha = malloc((size_t)(M * K + 1));
    float *fa = malloc(sizeof(float) * (size_t)(M * nb + 1));
    int ok = ha && fa;
    if (ok) {
#pragma omp parallel for schedule(static)
        for (int64_t m = 0; m < M; m++)
            widen_row(ha + m * K, fa + m * nb, a, m);
#pragma omp parallel reduction(&& : ok)
        {
            int8_t *hw = malloc((size_t)(K + 1));
            float *fw = malloc(sizeof(float) * (size_t)(nb + 1));
            ok = hw && fw;
#pragma omp for schedule(static)
            for (int64_t n = 0; n < N; n++) {
                if (!hw || !fw)
                    continue;
                widen_row(hw, fw, w, n);
                float sdec_w = w->s_dec[w->per_row ? n : 0];
                for (int64_t m = 0; m < M; m++) {
                    const int8_t *xa = ha + m * K;
                    float acc = 0.0f;
                    for (int64_t b = 0; b < nb; b++) {
                        int s = 0;
                        for (int i = 0; i < QD_NVFP4_BLOCK; i++)
                            s += xa[b * QD_NVFP4_BLOCK + i] * hw[b * QD_NVFP4_BLOCK + i];
                        float p = (float)s * 0.25f;
                        acc = acc + p * (fa[m * nb + b] * fw[b]);
                    }
                    y[m * N + n] = acc * (a->s_dec[a->per_row ? m : 0] * sdec_w);
                }
            }
            free(hw);
            free(fw);
        }
    }
    free(ha);
    free(fa);
    return ok;
}

qd_status qd_w4a4_gemm(float *y, const qd_nvfp4 *a, const qd_nvfp4 *w)
{
    if (a->cols != w->cols)
        return qd_error(QD_ERR_SHAPE, "qd_w4a4_gemm: A has K = %lld, W has K = %lld",
                        (long long)a->cols, (long long)w->cols);
    int64_t M = a->rows, N = w->rows;
    if (M > 0 && N > 0 && w4a4_gemm_wide(y, a, w))
        return QD_OK;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++)
            y[m * N + n] = w4a4_dot(a, m, w, n);
    return QD_OK;
}
