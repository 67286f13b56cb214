/* The CPU ops of backends/ops.h (backends/cpu/cpu_ops.c) against references
 * written here from each op's definition: the products and the MoE row ops
 * bit for bit against plain loops in the documented order (NUMERICS.md §6),
 * the transcendental ones against double-precision math within a stated
 * relative error; and every op case of tests/op_cases.c giving the same bytes
 * at 1 and 3 threads. The GPU half (CUDA vs these ops) is tests/gpu/check_ops. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "tests/suites.h"
#include "tests/op_cases.h"
#include "backends/exact_math.h"
#include "backends/layout.h"
#include "quant/splitmix64.h"

static const qd_ops *O;
static void *dev1;

static void setup(void)
{
    O = qd_cpu_ops();
    dev1 = qd_cpu_dev_new(1);
}

static void teardown(void) { free(dev1); }

static float *rnd(size_t n, float lo, float hi, uint64_t seed)
{
    float *x = malloc(sizeof(float) * n);
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * (float)qd_splitmix64_unit(&s);
    return x;
}

static void assert_bits(const float *a, const float *b, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(memcmp(&a[i], &b[i], sizeof(float)) == 0, "%s[%zu]: %.9g vs reference %.9g", what, i,
                      (double)a[i], (double)b[i]);
}

static void assert_close(const float *a, const double *ref, size_t n, double bound, const char *what)
{
    double mx = 0, err = 0;
    for (size_t i = 0; i < n; i++)
        mx = fmax(mx, fabs(ref[i]));
    for (size_t i = 0; i < n; i++)
        err = fmax(err, fabs((double)a[i] - ref[i]));
    ck_assert_msg(err <= bound * fmax(mx, 1e-30), "%s: max error %.3g relative to %.3g > %.1g", what, err, mx, bound);
}

/* the products: acc = 0, acc += a_k b_k, k ascending */
START_TEST(test_matmul_definition)
{
    int N = 37, IC = 72, OC = 45;
    float *x = rnd((size_t)N * IC, -1, 1, 1), *w = rnd((size_t)OC * IC, -1, 1, 2), *dy = rnd((size_t)N * OC, -1, 1, 3);
    float *y = malloc(sizeof(float) * N * OC), *ref = malloc(sizeof(float) * N * OC);
    float *dx = calloc((size_t)N * IC, sizeof(float)), *dw = calloc((size_t)OC * IC, sizeof(float));
    float *rdx = malloc(sizeof(float) * N * IC), *rdw = malloc(sizeof(float) * OC * IC);
    ck_assert_int_eq(O->matmul(dev1, y, x, w, N, IC, OC, QD_PREC_F32), QD_OK);
    ck_assert_int_eq(O->matmul_backward(dev1, dx, dw, dy, x, w, N, IC, OC, 0), QD_OK);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            float acc = 0;
            for (int i = 0; i < IC; i++)
                acc += x[n * IC + i] * w[o * IC + i];
            ref[n * OC + o] = acc;
        }
    for (int n = 0; n < N; n++)
        for (int i = 0; i < IC; i++) {
            float acc = 0;
            for (int o = 0; o < OC; o++)
                acc += dy[n * OC + o] * w[o * IC + i];
            rdx[n * IC + i] = 0.0f + acc;
        }
    for (int o = 0; o < OC; o++)
        for (int i = 0; i < IC; i++) {
            float acc = 0;
            for (int n = 0; n < N; n++)
                acc += dy[n * OC + o] * x[n * IC + i];
            rdw[o * IC + i] = 0.0f + acc;
        }
    assert_bits(y, ref, (size_t)N * OC, "matmul");
    assert_bits(dx, rdx, (size_t)N * IC, "matmul_backward dinp");
    assert_bits(dw, rdw, (size_t)OC * IC, "matmul_backward dw");
    /* grouped: one matmul per group, an empty group included */
    int32_t off[4] = {0, 10, 10, N};
    const float *ws[3] = {w, w, rnd((size_t)OC * IC, -1, 1, 4)};
    float *yg = malloc(sizeof(float) * N * OC);
    ck_assert_int_eq(O->matmul_grouped(dev1, yg, x, ws, off, 3, IC, OC, QD_PREC_F32), QD_OK);
    ck_assert_int_eq(O->matmul(dev1, ref + 10 * OC, x + 10 * IC, ws[2], N - 10, IC, OC, QD_PREC_F32), QD_OK);
    assert_bits(yg, ref, (size_t)N * OC, "matmul_grouped");
    free((void *)ws[2]);
    free(x), free(w), free(dy), free(y), free(ref), free(dx), free(dw), free(rdx), free(rdw), free(yg);
}
END_TEST

/* The row block-floating-point product (docs/numerics.md §3b) against its
 * definition in libm's double arithmetic: E = floor(log2 max|x|) by frexp,
 * mantissas by ldexp and nearbyint (to nearest even), the dot product in
 * __int128, the output (float)S scaled by ldexp in double and rounded once.
 * The ops compute it with integer bit work (quant/numerics.h). Then its
 * accuracy against the double product of the values, non-finite rows, and
 * the shapes it refuses. */
static int ref_bfp_exp(const double *v, int n, int *nonfinite)
{
    double m = 0;
    *nonfinite = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(v[i]))
            *nonfinite = 1;
        m = fmax(m, fabs(v[i]));
    }
    int e = 0;
    if (m > 0)
        frexp(m, &e), e -= 1;
    return e;
}

START_TEST(test_matmul_bfp_definition)
{
    int N = 23, IC = 96, OC = 57;
    float *x = rnd((size_t)N * IC, -1, 1, 11), *wf = rnd((size_t)OC * IC, -1, 1, 12);
    uint16_t *w = malloc(sizeof(uint16_t) * OC * IC);
    uint64_t s = 13;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < IC; i++) /* rows from 2^-140 (subnormal) to 2^100, elements over 2^30 */
            x[n * IC + i] = ldexpf(x[n * IC + i], n * 11 - 140 - (int)(qd_splitmix64_next(&s) % 31));
    for (int o = 0; o < OC; o++)
        for (int i = 0; i < IC; i++) /* weights down to 2^-20 of their rows' largest */
            w[o * IC + i] = qd_bf16_from_f32(ldexpf(wf[o * IC + i], (o % 9) * 4 - 20 - (int)(qd_splitmix64_next(&s) % 21)));
    x[5 * IC + 3] = NAN, w[7 * IC + 2] = 0x7f80; /* x row 5, w row 7: NaN outputs */
    for (int i = 0; i < IC; i++)
        x[9 * IC + i] = 0.0f; /* a zero row: +0 */
    void *wq = malloc(qd_bfp_bytes(OC, IC));
    float *y = malloc(sizeof(float) * N * OC);
    ck_assert_int_eq(O->bfp_weights(dev1, wq, w, NULL, OC, IC), QD_OK);
    ck_assert_int_eq(O->matmul_bfp(dev1, y, x, wq, N, IC, OC), QD_OK);
    double *xv = malloc(sizeof(double) * IC), *wv = malloc(sizeof(double) * IC);
    double worst = 0;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            int xbad, wbad;
            for (int i = 0; i < IC; i++)
                xv[i] = x[n * IC + i], wv[i] = qd_bf16_to_f32(w[o * IC + i]);
            int E = ref_bfp_exp(xv, IC, &xbad), F = ref_bfp_exp(wv, IC, &wbad);
            float got = y[n * OC + o];
            if (xbad || wbad) {
                uint32_t u;
                memcpy(&u, &got, 4);
                ck_assert_msg(u == 0x7fc00000u, "y[%d][%d] of a non-finite row: %g", n, o, (double)got);
                continue;
            }
            __int128 S = 0;
            double dot = 0, mag = 0, xmax = 0, wmax = 0;
            for (int i = 0; i < IC; i++) {
                long long X = (long long)nearbyint(ldexp(xv[i], 21 - E));
                long long W = (long long)nearbyint(ldexp(wv[i], 14 - F));
                ck_assert(llabs(X) <= (1 << 22) && llabs(W) < (1 << 15));
                S += (__int128)X * W;
                dot += xv[i] * wv[i], mag += fabs(xv[i] * wv[i]);
                xmax = fmax(xmax, fabs(xv[i])), wmax = fmax(wmax, fabs(wv[i]));
            }
            float want = (float)ldexp((double)(float)(long long)S, E + F - 35);
            ck_assert_msg(memcmp(&got, &want, 4) == 0, "y[%d][%d] = %.9g, its definition %.9g", n, o, (double)got,
                          (double)want);
            /* accuracy: x's mantissas to 2^-22 of its row's largest, w's to
             * 2^-15 of its, one rounding of the sum */
            double bound = 0x1p-22 * xmax * IC * wmax + 0x1p-15 * wmax * IC * xmax + 0x1p-23 * fabs(dot);
            if (n == 9)
                ck_assert_msg(memcmp(&got, &(float){0.0f}, 4) == 0, "a zero row gives +0");
            else if (isnormal(dot) && fabs(dot) > 1e-30)
                ck_assert_msg(fabs(got - dot) <= bound, "y[%d][%d] = %.9g, the double product %.9g", n, o, (double)got,
                              dot);
            (void)mag;
        }
    /* values of one scale (uniform in (-1, 1)): within IC 2^-24 of sum |x w|
     * of the double product, the float32 chain's own bound */
    float *xu = rnd((size_t)N * IC, -1, 1, 14), *wu = rnd((size_t)OC * IC, -1, 1, 15);
    for (int i = 0; i < OC * IC; i++)
        w[i] = qd_bf16_from_f32(wu[i]);
    ck_assert_int_eq(O->bfp_weights(dev1, wq, w, NULL, OC, IC), QD_OK);
    ck_assert_int_eq(O->matmul_bfp(dev1, y, xu, wq, N, IC, OC), QD_OK);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double dot = 0, mag = 0;
            for (int i = 0; i < IC; i++) {
                double p = (double)xu[n * IC + i] * qd_bf16_to_f32(w[o * IC + i]);
                dot += p, mag += fabs(p);
            }
            worst = fmax(worst, fabs(y[n * OC + o] - dot) / mag);
        }
    ck_assert_double_le(worst, IC * 0x1p-24);
    free(xu), free(wu);
    /* the weights as floats of the same BF16 values: the same mantissas */
    float *wv16 = malloc(sizeof(float) * OC * IC);
    void *wq2 = malloc(qd_bfp_bytes(OC, IC));
    for (int i = 0; i < OC * IC; i++)
        wv16[i] = qd_bf16_to_f32(w[i]);
    ck_assert_int_eq(O->bfp_weights(dev1, wq, w, NULL, OC, IC), QD_OK);
    ck_assert_int_eq(O->bfp_weights(dev1, wq2, NULL, wv16, OC, IC), QD_OK);
    ck_assert(memcmp(wq, wq2, qd_bfp_bytes(OC, IC)) == 0);
    free(wv16), free(wq2);
    /* the shapes it refuses: in-features not a multiple of 16, past 16384 */
    ck_assert_int_eq(O->matmul_bfp(dev1, y, x, wq, N, 40, OC), QD_ERR_SHAPE);
    ck_assert_int_eq(O->bfp_weights(dev1, wq, w, NULL, OC, 16400), QD_ERR_SHAPE);
    free(x), free(wf), free(w), free(wq), free(y), free(xv), free(wv);
}
END_TEST

/* grouped quantized products: the quant/ product per group */
START_TEST(test_grouped_quant_definition)
{
    int R = 20, N = 24, K = 64;
    int32_t off[4] = {0, 7, 7, R};
    float *x = rnd((size_t)R * K, -2, 2, 5), *w[3], *y = malloc(sizeof(float) * R * N);
    float *ref = malloc(sizeof(float) * R * N);
    qd_nvfp4 a, q[3];
    const qd_nvfp4 *qp[3];
    ck_assert_int_eq(qd_nvfp4_alloc(&a, R, K, QD_SCALE_PER_ROW), QD_OK);
    ck_assert_int_eq(qd_nvfp4_quantize(&a, x), QD_OK);
    uint8_t *qa = malloc((size_t)R * K), *qw[3];
    float *sa = malloc(sizeof(float) * R), *sw[3];
    ck_assert_int_eq(qd_fp8_quantize_rows(qa, sa, x, R, K), QD_OK);
    for (int e = 0; e < 3; e++) {
        w[e] = rnd((size_t)N * K, -1, 1, 10 + e);
        ck_assert_int_eq(qd_nvfp4_alloc(&q[e], N, K, QD_SCALE_PER_TENSOR), QD_OK);
        ck_assert_int_eq(qd_nvfp4_quantize(&q[e], w[e]), QD_OK);
        qp[e] = &q[e];
        qw[e] = malloc((size_t)N * K);
        sw[e] = malloc(sizeof(float) * N);
        ck_assert_int_eq(qd_fp8_quantize_rows(qw[e], sw[e], w[e], N, K), QD_OK);
    }
    ck_assert_int_eq(O->w4a4_gemm_grouped(dev1, y, &a, qp, off, 3), QD_OK);
    for (int e = 0; e < 3; e++) {
        int m = off[e + 1] - off[e];
        if (!m)
            continue;
        qd_nvfp4 ae;
        ck_assert_int_eq(qd_nvfp4_alloc(&ae, m, K, QD_SCALE_PER_ROW), QD_OK);
        ck_assert_int_eq(qd_nvfp4_quantize(&ae, x + (size_t)off[e] * K), QD_OK);
        ck_assert_int_eq(qd_w4a4_gemm(ref + (size_t)off[e] * N, &ae, &q[e]), QD_OK);
        qd_nvfp4_free(&ae);
    }
    assert_bits(y, ref, (size_t)R * N, "w4a4_gemm_grouped");
    ck_assert_int_eq(O->fp8_gemm_grouped(dev1, y, qa, sa, (const uint8_t *const *)qw, (const float *const *)sw, off, 3,
                                         N, K), QD_OK);
    for (int e = 0; e < 3; e++)
        if (off[e + 1] > off[e])
            qd_fp8_gemm(ref + (size_t)off[e] * N, qa + (size_t)off[e] * K, sa + off[e], qw[e], sw[e],
                        off[e + 1] - off[e], N, K);
    assert_bits(y, ref, (size_t)R * N, "fp8_gemm_grouped");
    for (int e = 0; e < 3; e++) {
        free(w[e]), free(qw[e]), free(sw[e]);
        qd_nvfp4_free(&q[e]);
    }
    qd_nvfp4_free(&a);
    free(x), free(y), free(ref), free(qa), free(sa);
}
END_TEST

/* RAC over experts: quant/'s statistics and augmentation of each expert's rows */
START_TEST(test_rac_grouped_definition)
{
    int R = 20, K = 64, n = 16;
    int32_t off[4] = {0, 7, 7, R};
    float *x = rnd((size_t)R * K, -3, 3, 70);
    double err[3][64] = {{0}}, ref[3][64] = {{0}};
    int64_t ch[3][16];
    for (int e = 0; e < 3; e++)
        for (int i = 0; i < n; i++)
            ch[e][i] = 4 * i + e;
    double *errp[3] = {err[0], err[1], err[2]};
    const int64_t *chp[3] = {ch[0], ch[1], ch[2]};
    qd_nvfp4 a, b;
    ck_assert_int_eq(qd_nvfp4_alloc(&a, R, K + n, QD_SCALE_PER_ROW), QD_OK);
    ck_assert_int_eq(O->rac_grouped(dev1, &a, errp, chp, off, 3, x, K, n), QD_OK);
    for (int e = 0; e < 3; e++) {
        int m = off[e + 1] - off[e];
        if (!m)
            continue;
        ck_assert_int_eq(qd_rac_error_accumulate(ref[e], x + (size_t)off[e] * K, m, K), QD_OK);
        ck_assert_int_eq(qd_nvfp4_alloc(&b, m, K + n, QD_SCALE_PER_ROW), QD_OK);
        ck_assert_int_eq(qd_rac_augment_act(&b, x + (size_t)off[e] * K, m, K, ch[e], n), QD_OK);
        ck_assert_mem_eq(a.codes + (size_t)off[e] * (K + n) / 2, b.codes, (size_t)m * (K + n) / 2);
        ck_assert_mem_eq(a.scales + (size_t)off[e] * (K + n) / 16, b.scales, (size_t)m * (K + n) / 16);
        ck_assert_mem_eq(a.s_dec + off[e], b.s_dec, sizeof(float) * m);
        qd_nvfp4_free(&b);
    }
    ck_assert_mem_eq(err, ref, sizeof err);
    ck_assert(err[0][0] > 0 && err[1][0] == 0);  /* expert 1 has no rows */
    qd_nvfp4_free(&a);
    free(x);
}
END_TEST

/* RAC of two linears of one input (gate, up) over experts: quant/'s
 * statistics and augmentation of each linear's and expert's rows, the
 * linears' channel counts different; more linears than QD_RAC_MULTI refused */
START_TEST(test_rac_multi_definition)
{
    int R = 12, K = 64;
    int32_t off[3] = {0, 5, R};
    int64_t n[2] = {16, 32};
    float *x = rnd((size_t)R * K, -3, 3, 71);
    double err[2][2][64] = {{{0}}}, ref[2][64] = {{0}};
    int64_t ch[2][2][32];
    double *errp[2][2];
    const int64_t *chp[2][2];
    double *const *errs[2];
    const int64_t *const *chs[2];
    qd_nvfp4 a[2], *ap[2], b;
    for (int i = 0; i < 2; i++) {
        for (int e = 0; e < 2; e++) {
            for (int j = 0; j < n[i]; j++)
                ch[i][e][j] = 2 * j + e;
            errp[i][e] = err[i][e];
            chp[i][e] = ch[i][e];
        }
        errs[i] = errp[i];
        chs[i] = chp[i];
        ck_assert_int_eq(qd_nvfp4_alloc(&a[i], R, K + n[i], QD_SCALE_PER_ROW), QD_OK);
        ap[i] = &a[i];
    }
    ck_assert_int_eq(O->rac_multi(dev1, ap, errs, chs, n, 2, off, 2, x, K), QD_OK);
    for (int i = 0; i < 2; i++) {
        int64_t W = K + n[i];
        for (int e = 0; e < 2; e++) {
            int m = off[e + 1] - off[e];
            memset(ref, 0, sizeof ref);
            ck_assert_int_eq(qd_rac_error_accumulate(ref[0], x + (size_t)off[e] * K, m, K), QD_OK);
            ck_assert_mem_eq(err[i][e], ref[0], sizeof ref[0]);
            ck_assert_int_eq(qd_nvfp4_alloc(&b, m, W, QD_SCALE_PER_ROW), QD_OK);
            ck_assert_int_eq(qd_rac_augment_act(&b, x + (size_t)off[e] * K, m, K, ch[i][e], n[i]), QD_OK);
            ck_assert_mem_eq(a[i].codes + (size_t)off[e] * W / 2, b.codes, (size_t)m * W / 2);
            ck_assert_mem_eq(a[i].scales + (size_t)off[e] * W / 16, b.scales, (size_t)m * W / 16);
            ck_assert_mem_eq(a[i].s_dec + off[e], b.s_dec, sizeof(float) * m);
            qd_nvfp4_free(&b);
        }
    }
    ck_assert(err[0][0][0] > 0);
    qd_nvfp4 *many[QD_RAC_MULTI + 1];
    for (int i = 0; i <= QD_RAC_MULTI; i++)
        many[i] = &a[0];
    ck_assert_int_eq(O->rac_multi(dev1, many, NULL, chs, n, QD_RAC_MULTI + 1, off, 2, x, K), QD_ERR_ARG);
    qd_nvfp4_free(&a[0]);
    qd_nvfp4_free(&a[1]);
    free(x);
}
END_TEST

/* W4A4 products of one activation shape: quant/'s product of each */
START_TEST(test_w4a4_multi_definition)
{
    int M = 3, K = 64, N[3] = {20, 8, 12};
    qd_nvfp4 a[3], w[3];
    const qd_nvfp4 *ap[3], *wp[3];
    float *y[3], *ref = malloc(sizeof(float) * 3 * 20);
    for (int i = 0; i < 3; i++) {
        float *x = rnd((size_t)M * K, -3, 3, 80 + i), *wf = rnd((size_t)N[i] * K, -1, 1, 90 + i);
        ck_assert_int_eq(qd_nvfp4_alloc(&a[i], M, K, QD_SCALE_PER_ROW), QD_OK);
        ck_assert_int_eq(qd_nvfp4_alloc(&w[i], N[i], K, QD_SCALE_PER_TENSOR), QD_OK);
        ck_assert_int_eq(qd_nvfp4_quantize(&a[i], x), QD_OK);
        ck_assert_int_eq(qd_nvfp4_quantize(&w[i], wf), QD_OK);
        ap[i] = &a[i], wp[i] = &w[i];
        y[i] = malloc(sizeof(float) * M * N[i]);
        free(x), free(wf);
    }
    ck_assert_int_eq(O->w4a4_gemm_multi(dev1, y, ap, wp, 3), QD_OK);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(qd_w4a4_gemm(ref, &a[i], &w[i]), QD_OK);
        ck_assert_mem_eq(y[i], ref, sizeof(float) * M * N[i]);
    }
    ck_assert_int_eq(O->w4a4_gemm_multi(dev1, y, ap, wp, QD_RAC_MULTI + 1), QD_ERR_ARG);
    for (int i = 0; i < 3; i++) {
        qd_nvfp4_free(&a[i]);
        qd_nvfp4_free(&w[i]);
        free(y[i]);
    }
    free(ref);
}
END_TEST

/* RMSNorm's sum of squares in the warp order (docs/numerics.md section 6),
 * written out here the long way: 32 lane sums, lane j taking x_i^2 for i = j
 * mod 32 in ascending i, then h = 16, 8, 4, 2, 1: lane j += lane j + h. Its
 * rstd bits are the op's, on rows of 2,050 (not a multiple of 32), 80 and 5
 * (lanes left empty); and they differ from the one-chain order's on some row,
 * so the test tells the two apart. */
START_TEST(test_rmsnorm_warp_order)
{
    const int shapes[3][2] = {{6, 2050}, {9, 80}, {4, 5}};
    int chain_differs = 0;
    for (int k = 0; k < 3; k++) {
        int rows = shapes[k][0], C = shapes[k][1];
        float *x = rnd((size_t)rows * C, -3, 3, 40 + k), *w = rnd(C, 0.5f, 1.5f, 50 + k);
        float *y = malloc(sizeof(float) * rows * C), *r = malloc(sizeof(float) * rows);
        ck_assert_int_eq(O->rmsnorm(dev1, y, r, x, w, rows, C, 1e-6f), QD_OK);
        for (int n = 0; n < rows; n++) {
            const float *xr = x + (size_t)n * C;
            float lane[32], chain = 0.0f;
            for (int j = 0; j < 32; j++) {
                lane[j] = 0.0f;
                for (int i = j; i < C; i += 32) {
                    float sq = xr[i] * xr[i];
                    lane[j] = lane[j] + sq;
                }
            }
            for (int h = 16; h >= 1; h /= 2)
                for (int j = 0; j < h; j++)
                    lane[j] = lane[j] + lane[j + h];
            for (int i = 0; i < C; i++) {
                float sq = xr[i] * xr[i];
                chain = chain + sq;
            }
            float want = qd_rsqrtf(lane[0] / (float)C + 1e-6f);
            ck_assert_msg(memcmp(&want, &r[n], sizeof want) == 0, "rmsnorm %dx%d row %d: rstd %a, warp order %a",
                          rows, C, n, (double)r[n], (double)want);
            chain_differs |= lane[0] != chain;
            for (int i = 0; i < C; i++) {
                float o = w[i] * (xr[i] * want);
                ck_assert(memcmp(&o, &y[(size_t)n * C + i], sizeof o) == 0);
            }
        }
        free(x);
        free(w);
        free(y);
        free(r);
    }
    ck_assert_msg(chain_differs, "no row where the one-chain sum differs: the test cannot tell the orders apart");
}
END_TEST

/* rmsnorm, rope, swiglu against double math */
START_TEST(test_elementwise_double)
{
    int rows = 9, C = 80;
    float *x = rnd((size_t)rows * C, -2, 2, 20), *w = rnd(C, 0.5f, 1.5f, 21), *y = malloc(sizeof(float) * rows * C);
    float *r = malloc(sizeof(float) * rows);
    double *ref = malloc(sizeof(double) * rows * C * 2);
    ck_assert_int_eq(O->rmsnorm(dev1, y, r, x, w, rows, C, 1e-6f), QD_OK);
    for (int n = 0; n < rows; n++) {
        double ss = 0;
        for (int i = 0; i < C; i++)
            ss += (double)x[n * C + i] * x[n * C + i];
        double rs = 1.0 / sqrt(ss / C + 1e-6);
        for (int i = 0; i < C; i++)
            ref[n * C + i] = w[i] * x[n * C + i] * rs;
    }
    assert_close(y, ref, (size_t)rows * C, 1e-6, "rmsnorm");
    /* rope: a rotation by the table's (cos, sin) per pair (i, i + D/2) */
    int N = 3, nh = 2, D = 8;
    int32_t pos[3] = {2, 0, 1};
    float cs[12], sn[12];
    for (int p = 0; p < 3; p++)
        for (int i = 0; i < D / 2; i++) {
            cs[p * 4 + i] = (float)cos(0.3 * (p + 1) * (i + 1));
            sn[p * 4 + i] = (float)sin(0.3 * (p + 1) * (i + 1));
        }
    float *q = rnd((size_t)N * nh * D, -1, 1, 22), *q0 = malloc(sizeof(float) * N * nh * D);
    memcpy(q0, q, sizeof(float) * N * nh * D);
    ck_assert_int_eq(O->rope(dev1, q, pos, cs, sn, N, nh, D, QD_ROPE_FORWARD), QD_OK);
    for (int n = 0; n < N; n++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < D / 2; i++) {
                const float *a = q0 + (n * nh + h) * D;
                double c = cs[pos[n] * 4 + i], s = sn[pos[n] * 4 + i];
                ref[(n * nh + h) * D + i] = a[i] * c - a[i + D / 2] * s;
                ref[(n * nh + h) * D + i + D / 2] = a[i + D / 2] * c + a[i] * s;
            }
    assert_close(q, ref, (size_t)N * nh * D, 1e-6, "rope");
    ck_assert_int_eq(O->rope(dev1, q, pos, cs, sn, N, nh, D, QD_ROPE_INVERSE), QD_OK); /* the inverse rotation */
    for (int i = 0; i < N * nh * D; i++)
        ref[i] = q0[i];
    assert_close(q, ref, (size_t)N * nh * D, 1e-6, "rope inverse");
    /* swiglu h = silu(g) u */
    size_t n = 500;
    float *g = rnd(n, -8, 8, 23), *u = rnd(n, -2, 2, 24), *h = malloc(sizeof(float) * n);
    ck_assert_int_eq(O->swiglu(dev1, h, g, u, n), QD_OK);
    for (size_t i = 0; i < n; i++)
        ref[i] = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
    assert_close(h, ref, n, 1e-6, "swiglu");
    free(x), free(w), free(y), free(r), free(ref), free(q), free(q0), free(g), free(u), free(h);
}
END_TEST

/* attention: softmax(q.k / sqrt(D)) v over keys 0..pos, GQA head mapping */
START_TEST(test_attend_double)
{
    int N = 8, H = 4, KV = 2, D = 16, Tm = 5, KD = KV * D;
    int32_t kbase[8] = {0, 0, 0, 0, 0, 5, 5, 5}, pos[8] = {0, 1, 2, 3, 4, 0, 1, 2};
    float *q = rnd((size_t)N * H * D, -1, 1, 30), *k = rnd((size_t)N * KD, -1, 1, 31), *v = rnd((size_t)N * KD, -1, 1, 32);
    float *o = malloc(sizeof(float) * N * H * D), *att = malloc(sizeof(float) * N * H * Tm);
    double *ref = malloc(sizeof(double) * N * H * D);
    ck_assert_int_eq(O->attend(dev1, o, att, q, k, v, kbase, pos, N, H, KV, D, Tm, NULL, 0), QD_OK);
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++) {
            int kh = h / (H / KV);
            double p[8], mx = -1e300, sum = 0;
            for (int s = 0; s <= pos[n]; s++) {
                double dot = 0;
                for (int i = 0; i < D; i++)
                    dot += (double)q[(n * H + h) * D + i] * k[(kbase[n] + s) * KD + kh * D + i];
                p[s] = dot / sqrt((double)D);
                mx = fmax(mx, p[s]);
            }
            for (int s = 0; s <= pos[n]; s++)
                sum += p[s] = exp(p[s] - mx);
            for (int i = 0; i < D; i++) {
                double acc = 0;
                for (int s = 0; s <= pos[n]; s++)
                    acc += p[s] / sum * v[(kbase[n] + s) * KD + kh * D + i];
                ref[(n * H + h) * D + i] = acc;
            }
        }
    assert_close(o, ref, (size_t)N * H * D, 2e-6, "attend");
    free(q), free(k), free(v), free(o), free(att), free(ref);
}
END_TEST

/* router softmax and top-k; log-probs against a double log-softmax */
START_TEST(test_route_logprob_double)
{
    int N = 13, E = 16, K = 4, V = 300;
    float *p = rnd((size_t)N * E, -3, 3, 40), *l0 = malloc(sizeof(float) * N * E), tw[13 * 4];
    int32_t tk[13 * 4];
    memcpy(l0, p, sizeof(float) * N * E);
    ck_assert_int_eq(O->route(dev1, tk, tw, p, N, E, K, QD_TOPK_RENORM), QD_OK);
    for (int n = 0; n < N; n++) {
        double mx = -1e300, s = 0, e[16], kept = 0;
        for (int j = 0; j < E; j++)
            mx = fmax(mx, l0[n * E + j]);
        for (int j = 0; j < E; j++)
            s += e[j] = exp(l0[n * E + j] - mx);
        for (int j = 0; j < E; j++)
            ck_assert_double_le(fabs(p[n * E + j] - e[j] / s), 1e-6);
        for (int j = 0; j < K; j++) {  /* rank j: the j-th largest */
            int above = 0;
            for (int i = 0; i < E; i++)
                above += l0[n * E + i] > l0[n * E + tk[n * K + j]];
            ck_assert_int_eq(above, j);
            kept += e[tk[n * K + j]];
        }
        for (int j = 0; j < K; j++)
            ck_assert_double_le(fabs(tw[n * K + j] - e[tk[n * K + j]] / kept), 1e-6);
    }
    float *lg = rnd((size_t)6 * V, -8, 8, 41), lp[6], lse[6];
    int32_t tgt[6] = {5, -1, 299, 0, 17, -1};
    for (int t = 0; t < 2; t++) {
        float T = t ? 0.7f : 1.0f;
        ck_assert_int_eq(O->logprob(dev1, lp, lse, lg, tgt, 6, V, T), QD_OK);
        for (int n = 0; n < 6; n++) {
            double mx = -1e300, s = 0;
            for (int j = 0; j < V; j++)
                mx = fmax(mx, lg[n * V + j] / (double)T);
            for (int j = 0; j < V; j++)
                s += exp(lg[n * V + j] / (double)T - mx);
            double ref = tgt[n] < 0 ? 0 : lg[n * V + tgt[n]] / (double)T - mx - log(s);
            ck_assert_msg(fabs(lp[n] - ref) <= 2e-6 * fmax(1, fabs(ref)), "logprob T=%g row %d: %g vs %g", (double)T,
                          n, (double)lp[n], ref);
        }
    }
    free(p), free(l0), free(lg);
}
END_TEST

/* QD_BWD_DX_SET (the driver's first writer of a gradient buffer): on a
 * buffer of garbage, the bytes of the same op adding into zeros, for
 * matmul_backward, rmsnorm_backward and attend_backward (whose dq, dk, dv
 * have rows nobody adds to twice and rows a group's heads add into) */
START_TEST(test_backward_set_is_add_into_zeros)
{
    enum { N = 11, IC = 24, OC = 16, H = 4, KV = 2, D = 8, Tm = 7 };
    float *x = rnd(N * IC, -1, 1, 61), *w = rnd(OC * IC, -1, 1, 62), *dy = rnd(N * OC, -1, 1, 63);
    float *dx0 = calloc(N * IC, sizeof(float)), *dx1 = rnd(N * IC, -50, 50, 64);
    float *dw0 = calloc(OC * IC, sizeof(float)), *dw1 = calloc(OC * IC, sizeof(float));
    ck_assert_int_eq(O->matmul_backward(dev1, dx0, dw0, dy, x, w, N, IC, OC, 0), QD_OK);
    ck_assert_int_eq(O->matmul_backward(dev1, dx1, dw1, dy, x, w, N, IC, OC, QD_BWD_DX_SET), QD_OK);
    assert_bits(dx1, dx0, N * IC, "matmul_backward set dinp");
    assert_bits(dw1, dw0, OC * IC, "matmul_backward set dw (still added to)");
    /* rmsnorm over rows of IC, its dout dx0 (some exact zeros: -0.0 products) */
    float *nw = rnd(IC, 0.5f, 1.5f, 65), *y = malloc(sizeof(float) * N * IC), *r = malloc(sizeof(float) * N);
    float *g0 = calloc(N * IC, sizeof(float)), *g1 = rnd(N * IC, -50, 50, 66);
    float *gw0 = calloc(IC, sizeof(float)), *gw1 = calloc(IC, sizeof(float));
    for (int i = 0; i < N * IC; i += 5)
        dx0[i] = 0.0f;
    ck_assert_int_eq(O->rmsnorm(dev1, y, r, x, nw, N, IC, 1e-6f), QD_OK);
    ck_assert_int_eq(O->rmsnorm_backward(dev1, g0, gw0, dx0, x, nw, r, N, IC, 0), QD_OK);
    ck_assert_int_eq(O->rmsnorm_backward(dev1, g1, gw1, dx0, x, nw, r, N, IC, QD_BWD_DX_SET), QD_OK);
    assert_bits(g1, g0, N * IC, "rmsnorm_backward set dinp");
    assert_bits(gw1, gw0, IC, "rmsnorm_backward set dw");
    /* attention: two sequences of 6 and 5 tokens */
    int32_t kbase[N], pos[N], slen[N], seq[3] = {0, 6, N};
    for (int n = 0; n < N; n++) {
        kbase[n] = n < 6 ? 0 : 6;
        pos[n] = n - kbase[n];
        slen[n] = n < 6 ? 6 : N - 6;
    }
    float *q = rnd(N * H * D, -1, 1, 67), *k = rnd(N * KV * D, -1, 1, 68), *v = rnd(N * KV * D, -1, 1, 69);
    float *o = malloc(sizeof(float) * N * H * D), *att = calloc(N * H * Tm, sizeof(float));
    float *ds = calloc(N * H * Tm, sizeof(float)), *dout = rnd(N * H * D, -1, 1, 70);
    float *d0[3] = {calloc(N * H * D, sizeof(float)), calloc(N * KV * D, sizeof(float)), calloc(N * KV * D, sizeof(float))};
    float *d1[3] = {rnd(N * H * D, -50, 50, 71), rnd(N * KV * D, -50, 50, 72), rnd(N * KV * D, -50, 50, 73)};
    ck_assert_int_eq(O->attend(dev1, o, att, q, k, v, kbase, pos, N, H, KV, D, Tm, seq, 2), QD_OK);
    ck_assert_int_eq(O->attend_backward(dev1, d0[0], d0[1], d0[2], ds, dout, o, att, q, k, v, pos, slen, N, H, KV, D,
                                        Tm, seq, 2, 0),
                     QD_OK);
    ck_assert_int_eq(O->attend_backward(dev1, d1[0], d1[1], d1[2], ds, dout, o, att, q, k, v, pos, slen, N, H, KV, D,
                                        Tm, seq, 2, QD_BWD_DX_SET),
                     QD_OK);
    assert_bits(d1[0], d0[0], N * H * D, "attend_backward set dq");
    assert_bits(d1[1], d0[1], N * KV * D, "attend_backward set dk");
    assert_bits(d1[2], d0[2], N * KV * D, "attend_backward set dv");
    free(x), free(w), free(dy), free(dx0), free(dx1), free(dw0), free(dw1), free(nw), free(y), free(r), free(g0);
    free(g1), free(gw0), free(gw1), free(q), free(k), free(v), free(o), free(att), free(ds), free(dout);
    for (int i = 0; i < 3; i++)
        free(d0[i]), free(d1[i]);
}
END_TEST

/* combine, unroute and moe_dy: loops over each token's rows in rank order */
START_TEST(test_moe_rows_definition)
{
    enum { N = 9, E = 6, K = 2, C = 40, R = N * K };
    int32_t topk[N * K], tok_rows[R], row_rank[R], row_tok[R], exp_off[E + 1], cnt[E];
    float topw[N * K], row_w[R];
    for (int n = 0; n < N; n++)
        for (int j = 0; j < K; j++) {
            topk[n * K + j] = (n + 3 * j) % E;
            topw[n * K + j] = 0.25f + 0.5f * j;
        }
    ck_assert_int_eq(O->moe_group(dev1, exp_off, row_tok, row_w, row_rank, tok_rows, topk, topw, N, E, K), QD_OK);
    int32_t r_off[E + 1], r_tok[R], r_rank[R], r_rows[R];
    float r_w[R];
    qd_moe_group(r_off, r_tok, r_w, r_rank, r_rows, cnt, topk, topw, N, E, K);
    ck_assert_mem_eq(exp_off, r_off, sizeof r_off);
    ck_assert_mem_eq(row_tok, r_tok, sizeof r_tok);
    ck_assert_mem_eq(tok_rows, r_rows, sizeof r_rows);
    for (int e = 0; e < E; e++)  /* rows grouped by expert, tokens ascending */
        for (int r = exp_off[e]; r < exp_off[e + 1]; r++) {
            ck_assert_int_eq(topk[row_tok[r] * K + row_rank[r]], e);
            ck_assert(r == exp_off[e] || row_tok[r - 1] < row_tok[r]);
        }
    float *y = rnd((size_t)R * C, -1, 1, 50), out[N * C], ref[N * C], dout[N * C], dy[R * C], dwt[N * K];
    ck_assert_int_eq(O->combine(dev1, out, y, row_w, tok_rows, N, K, C), QD_OK);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < C; i++) {
            float acc = 0;
            for (int j = 0; j < K; j++)
                acc += y[tok_rows[n * K + j] * C + i] * row_w[tok_rows[n * K + j]];
            ref[n * C + i] = acc;
        }
    assert_bits(out, ref, (size_t)N * C, "combine");
    for (int i = 0; i < N * C; i++)
        dout[i] = (float)(i % 7) - 3;
    ck_assert_int_eq(O->moe_dy(dev1, dy, dwt, dout, y, row_w, row_rank, tok_rows, N, K, C), QD_OK);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < K; j++) {
            int r = tok_rows[n * K + j];
            float acc = 0;
            for (int i = 0; i < C; i++) {
                ck_assert(dy[r * C + i] == dout[n * C + i] * row_w[r]);
                acc += dout[n * C + i] * y[r * C + i];
            }
            ck_assert(dwt[n * K + row_rank[r]] == acc);
        }
    memset(out, 0, sizeof out);
    ck_assert_int_eq(O->unroute(dev1, out, dy, tok_rows, N, K, C), QD_OK);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < C; i++) {
            float acc = 0;
            for (int j = 0; j < K; j++)
                acc += dy[tok_rows[n * K + j] * C + i];
            ref[n * C + i] = acc;
        }
    assert_bits(out, ref, (size_t)N * C, "unroute");
    free(y);
}
END_TEST

/* AdamW and the gradient-norm chunks against double math */
START_TEST(test_adamw_double)
{
    size_t n = 10000, nch = 3;
    float *g = rnd(n, -1, 1, 60), *p = rnd(n, -1, 1, 61), *m = rnd(n, -0.1f, 0.1f, 62), *v = rnd(n, 0, 0.01f, 63);
    float *p0 = malloc(sizeof(float) * n), *m0 = malloc(sizeof(float) * n), *v0 = malloc(sizeof(float) * n);
    memcpy(p0, p, sizeof(float) * n), memcpy(m0, m, sizeof(float) * n), memcpy(v0, v, sizeof(float) * n);
    double part[3], *ref = malloc(sizeof(double) * n);
    qd_adamw o = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    ck_assert_int_eq(O->sumsq_chunks(dev1, part, g, n), QD_OK);
    for (size_t k = 0; k < nch; k++) {
        double s = 0;
        for (size_t i = k * 4096; i < n && i < (k + 1) * 4096; i++)
            s += (double)g[i] * g[i];
        ck_assert_double_eq(part[k], s);
    }
    ck_assert_int_eq(O->adamw(dev1, p, g, m, v, n, &o, 0.1f, 0.5f, 0.1f, 0.0975f), QD_OK);
    for (size_t i = 0; i < n; i++) {
        double gi = 0.5 * g[i], mi = 0.9 * m0[i] + 0.1 * gi, vi = 0.95 * v0[i] + 0.05 * gi * gi;
        ref[i] = p0[i] - 1e-3 * ((mi / 0.1) / (sqrt(vi / 0.0975) + 1e-8) + 0.1 * p0[i]);
    }
    assert_close(p, ref, n, 1e-6, "adamw");
    free(g), free(p), free(m), free(v), free(p0), free(m0), free(v0), free(ref);
}
END_TEST

/* every op case: the same bytes at 1 and 3 threads (OpenMP splits outputs only) */
START_TEST(test_cases_thread_independent)
{
    void *dev3 = qd_cpu_dev_new(3);
    for (int i = 0; i < qd_op_case_count(); i++) {
        qd_op_result a, b;
        ck_assert_msg(qd_op_case_run(i, O, dev1, 1, &a) == QD_OK, "%s: %s", qd_op_case(i).name, qd_last_error());
        ck_assert_msg(qd_op_case_run(i, O, dev3, 1, &b) == QD_OK, "%s: %s", qd_op_case(i).name, qd_last_error());
        double err;
        char what[64];
        ck_assert_msg(a.nout > 0, "%s has no outputs", qd_op_case(i).name);
        ck_assert_msg(qd_op_result_compare(&a, &b, -1, &err, what), "%s: %s differs at 3 threads",
                      qd_op_case(i).name, what);
        qd_op_result_free(&a);
        qd_op_result_free(&b);
    }
    free(dev3);
}
END_TEST

/* the BF16-weight twins (embed_w16, matmul_w16) give the bytes of embed and
 * matmul with the same weights as float32 (case outputs "y" and "ref") */
START_TEST(test_w16_twins_equal_float_ops)
{
    int seen = 0;
    for (int i = 0; i < qd_op_case_count(); i++) {
        qd_op_case_info ci = qd_op_case(i);
        if (strcmp(ci.slot, "embed_w16") && strcmp(ci.slot, "matmul_w16"))
            continue;
        qd_op_result a;
        ck_assert_msg(qd_op_case_run(i, O, dev1, 7, &a) == QD_OK, "%s: %s", ci.name, qd_last_error());
        ck_assert_str_eq(a.out[0].name, "y");
        ck_assert_str_eq(a.out[1].name, "ref");
        ck_assert_uint_eq(a.out[0].bytes, a.out[1].bytes);
        ck_assert_msg(memcmp(a.out[0].data, a.out[1].data, a.out[0].bytes) == 0, "%s: the twin differs", ci.name);
        seen++;
        qd_op_result_free(&a);
    }
    ck_assert_int_eq(seen, 6);
}
END_TEST

/* adamw_round gives adamw's bytes and round_bf16 of the result */
START_TEST(test_adamw_round_is_adamw_then_round)
{
    size_t n = 1003;
    float *p = malloc(sizeof(float) * n), *g = malloc(sizeof(float) * n), *m = malloc(sizeof(float) * n);
    float *v = malloc(sizeof(float) * n), *wk = malloc(sizeof(float) * n), *p2 = malloc(sizeof(float) * n);
    float *m2 = malloc(sizeof(float) * n), *v2 = malloc(sizeof(float) * n);
    ck_assert(p && g && m && v && wk && p2 && m2 && v2);
    for (size_t i = 0; i < n; i++) {
        p[i] = p2[i] = sinf((float)i) * 0.3f;
        g[i] = cosf((float)i * 0.7f);
        m[i] = m2[i] = 0.01f * sinf((float)i * 1.3f);
        v[i] = v2[i] = 0.001f * (1.0f + cosf((float)i));
    }
    qd_adamw o = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    ck_assert_ptr_nonnull(O->adamw_round);
    ck_assert_int_eq(O->adamw_round(dev1, p, g, m, v, wk, n, &o, 0.1f, 0.5f, 0.1f, 0.0975f), QD_OK);
    ck_assert_int_eq(O->adamw(dev1, p2, g, m2, v2, n, &o, 0.1f, 0.5f, 0.1f, 0.0975f), QD_OK);
    ck_assert(memcmp(p, p2, sizeof(float) * n) == 0 && memcmp(m, m2, sizeof(float) * n) == 0 &&
              memcmp(v, v2, sizeof(float) * n) == 0);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(wk[i] == qd_round_bf16(p[i]), "wk[%zu] %g, round_bf16(p) %g", i, wk[i], qd_round_bf16(p[i]));
    free(p), free(g), free(m), free(v), free(wk), free(p2), free(m2), free(v2);
}
END_TEST

/* the per-tensor fake-quants of one shape in one call (nvfp4_fake_quant_weights,
 * or its per-tensor fallback) give the bytes of the op per tensor ("out" = "ref") */
START_TEST(test_fake_quant_weights_equal_per_tensor)
{
    int seen = 0;
    for (int i = 0; i < qd_op_case_count(); i++) {
        qd_op_case_info ci = qd_op_case(i);
        if (strcmp(ci.slot, "nvfp4_fake_quant_weights"))
            continue;
        qd_op_result a;
        ck_assert_msg(qd_op_case_run(i, O, dev1, 7, &a) == QD_OK, "%s: %s", ci.name, qd_last_error());
        ck_assert_int_eq(a.nout, 2);
        ck_assert_str_eq(a.out[0].name, "out");
        ck_assert_str_eq(a.out[1].name, "ref");
        ck_assert_msg(memcmp(a.out[0].data, a.out[1].data, a.out[0].bytes) == 0, "%s differs", ci.name);
        seen++;
        qd_op_result_free(&a);
    }
    ck_assert_int_eq(seen, 1);
}
END_TEST

/* sqerr_weights against the codes (a RAC-augmented weight's first K columns
 * too) gives the bytes of it against the per-tensor fake-quants (fake-quant =
 * dequant(quantize)); the error is a plausible NVFP4 weight error */
START_TEST(test_sqerr_weights_codes_equal_fake_quant)
{
    int seen = 0;
    for (int i = 0; i < qd_op_case_count(); i++) {
        qd_op_case_info ci = qd_op_case(i);
        if (strcmp(ci.slot, "sqerr_weights"))
            continue;
        qd_op_result a;
        ck_assert_msg(qd_op_case_run(i, O, dev1, 7, &a) == QD_OK, "%s: %s", ci.name, qd_last_error());
        ck_assert_int_eq(a.nout, 2);
        ck_assert_uint_eq(a.out[0].bytes, a.out[1].bytes);
        ck_assert_msg(memcmp(a.out[0].data, a.out[1].data, a.out[0].bytes) == 0, "%s: codes vs fake-quant", ci.name);
        const double *e = a.out[0].data;
        size_t n = a.out[0].bytes / sizeof(double) / 2;
        double se = 0, sn = 0;
        for (size_t r = 0; r < n; r++)
            se += e[r], sn += e[n + r];
        ck_assert_msg(se > 1e-4 * sn && se < 0.05 * sn, "%s: relative error %g", ci.name, se / sn);
        seen++;
        qd_op_result_free(&a);
    }
    ck_assert_int_eq(seen, 1);
}
END_TEST

/* the weights of one shape quantized in one call (nvfp4_quantize_weights)
 * give the bytes of the per-tensor ops (case outputs 0-2 and "ref.*" 3-5) */
START_TEST(test_quantize_weights_equal_per_tensor)
{
    int seen = 0;
    for (int i = 0; i < qd_op_case_count(); i++) {
        qd_op_case_info ci = qd_op_case(i);
        if (strcmp(ci.slot, "nvfp4_quantize_weights"))
            continue;
        qd_op_result a;
        ck_assert_msg(qd_op_case_run(i, O, dev1, 7, &a) == QD_OK, "%s: %s", ci.name, qd_last_error());
        ck_assert_int_eq(a.nout, 6);
        for (int k = 0; k < 3; k++) {
            ck_assert_str_eq(a.out[3 + k].name + 4, a.out[k].name);
            ck_assert_uint_eq(a.out[k].bytes, a.out[3 + k].bytes);
            ck_assert_msg(memcmp(a.out[k].data, a.out[3 + k].data, a.out[k].bytes) == 0, "%s: %s differs", ci.name,
                          a.out[k].name);
        }
        seen++;
        qd_op_result_free(&a);
    }
    ck_assert_int_eq(seen, 3);
}
END_TEST

/* the comparison itself: one flipped bit is a difference, and a bound admits it */
START_TEST(test_compare_finds_a_bit)
{
    qd_op_result a, b;
    int k = 0;
    while (k < qd_op_case_count() && strcmp(qd_op_case(k).name, "matmul f32 37x72x45"))
        k++;
    ck_assert_int_lt(k, qd_op_case_count());
    ck_assert_int_eq(qd_op_case_run(k, O, dev1, 1, &a), QD_OK);
    ck_assert_int_eq(qd_op_case_run(k, O, dev1, 1, &b), QD_OK);
    double err;
    char what[64];
    ck_assert(qd_op_result_compare(&a, &b, -1, &err, what));
    ((uint32_t *)b.out[0].data)[3] ^= 1;
    ck_assert(!qd_op_result_compare(&a, &b, -1, &err, what));
    ck_assert_str_eq(what, "y");
    ck_assert(qd_op_result_compare(&a, &b, 1e-5, &err, what));
    ck_assert(err > 0 && err < 1e-6);
    qd_op_result_free(&a);
    qd_op_result_free(&b);
}
END_TEST

Suite *suite_ops(void)
{
    Suite *s = suite_create("ops");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_matmul_definition);
    tcase_add_test(tc, test_matmul_bfp_definition);
    tcase_add_test(tc, test_backward_set_is_add_into_zeros);
    tcase_add_test(tc, test_grouped_quant_definition);
    tcase_add_test(tc, test_rac_grouped_definition);
    tcase_add_test(tc, test_rac_multi_definition);
    tcase_add_test(tc, test_w4a4_multi_definition);
    tcase_add_test(tc, test_elementwise_double);
    tcase_add_test(tc, test_rmsnorm_warp_order);
    tcase_add_test(tc, test_attend_double);
    tcase_add_test(tc, test_route_logprob_double);
    tcase_add_test(tc, test_moe_rows_definition);
    tcase_add_test(tc, test_adamw_double);
    tcase_add_test(tc, test_cases_thread_independent);
    tcase_add_test(tc, test_w16_twins_equal_float_ops);
    tcase_add_test(tc, test_quantize_weights_equal_per_tensor);
    tcase_add_test(tc, test_fake_quant_weights_equal_per_tensor);
    tcase_add_test(tc, test_sqerr_weights_codes_equal_fake_quant);
    tcase_add_test(tc, test_adamw_round_is_adamw_then_round);
    tcase_add_test(tc, test_compare_finds_a_bit);
    suite_add_tcase(s, tc);
    return s;
}
