/* Check suite of backends/philox.h and backends/sampling.c: Philox4x32-10
 * known answers (Random123) and an independent numpy implementation, the
 * uniform mapping, greedy and top-k/top-p edge cases, bit equality with a
 * numpy float32 re-implementation of the rule, the tree descent
 * against a float64 inverse CDF in the documented order, chi-square tests of
 * the sampled frequencies, batch-size and thread-count invariance of the
 * bits, log-probs against float64 log_softmax, and refused input. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "tests/suites.h"
#include "backends/philox.h"
#include "backends/sampling.h"
#include "quant/splitmix64.h"

/* ---- helpers */

static uint64_t rng_state;

static double urand(void) { return qd_splitmix64_unit(&rng_state); } /* [0, 1) */

static double gauss(void) /* Box-Muller */
{
    double a = urand(), b = urand();
    return sqrt(-2.0 * log(1.0 - a)) * cos(6.283185307179586 * b);
}

static float *random_logits(int n, double scale, uint64_t seed)
{
    rng_state = seed;
    float *x = malloc((size_t)n * sizeof *x);
    for (int i = 0; i < n; i++)
        x[i] = (float)(scale * gauss());
    return x;
}

static qd_sample_params params(float T, int k, float p, uint64_t seed)
{
    return (qd_sample_params){.temperature = T, .top_k = k, .top_p = p, .seed = seed};
}

static qd_sample_result sample1(const float *x, int V, qd_sample_params p, uint64_t q, uint32_t n)
{
    qd_sample_ws *ws = qd_sample_ws_new(V);
    ck_assert_ptr_nonnull(ws);
    qd_sample_result r;
    qd_status st = qd_sample_row(&r, ws, x, V, &p, q, n);
    ck_assert_msg(st == QD_OK, "%s", qd_last_error());
    qd_sample_ws_free(ws);
    return r;
}

/* Counts of tokens drawn at positions 0..N-1 of sequence q. */
static long *draw_counts(const float *x, int V, qd_sample_params p, uint64_t q, int N)
{
    qd_sample_ws *ws = qd_sample_ws_new(V);
    long *cnt = calloc((size_t)V, sizeof *cnt);
    for (int n = 0; n < N; n++) {
        qd_sample_result r;
        ck_assert_int_eq(qd_sample_row(&r, ws, x, V, &p, q, (uint32_t)n), QD_OK);
        ck_assert(r.token >= 0 && r.token < V);
        cnt[r.token]++;
    }
    qd_sample_ws_free(ws);
    return cnt;
}

/* float64 softmax of (float)(x / T) (the scaled logits are rounded as in step 1). */
static double *softmax_f64(const float *x, int V, float T)
{
    double *p = malloc((size_t)V * sizeof *p), m = -INFINITY, z = 0.0;
    for (int i = 0; i < V; i++)
        m = fmax(m, (double)(x[i] / T));
    for (int i = 0; i < V; i++)
        z += p[i] = exp((double)(x[i] / T) - m);
    for (int i = 0; i < V; i++)
        p[i] /= z;
    return p;
}

/* Pearson chi-square of counts against probabilities (both over V cells). */
static double chi_square(const long *cnt, const double *prob, int V, long N)
{
    double chi = 0.0;
    for (int i = 0; i < V; i++) {
        double ex = prob[i] * (double)N;
        if (ex > 0.0)
            chi += ((double)cnt[i] - ex) * ((double)cnt[i] - ex) / ex;
        else
            ck_assert_msg(cnt[i] == 0, "token %d drawn %ld times with probability 0", i, cnt[i]);
    }
    return chi;
}

/* ---- Philox */

/* Random123 (D. E. Shaw Research), tests/kat_vectors, the three
 * "philox4x32 10" lines (as at github.com/DEShawResearch/random123 commit
 * 9545ff64), and four lines of the same generator's examples/kat_vectors
 * (github.com/girving/random123-manual, commit 61e84792). Columns: counter
 * (4 words), key (2 words), expected output (4 words). */
static const uint32_t philox_kat[][10] = {
    { 0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8 },
    { 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff,
      0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd },
    { 0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0,
      0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1 },
    { 1, 0, 0, 0, 1, 0, 0xac08141b, 0xdfc5ccbe, 0x79c07a47, 0xa7f66093 },
    { 0, 0, 0, 0x80000000, 0, 1, 0x0436a39b, 0x31be9efa, 0x6abd0c76, 0xe7a68f83 },
    { 0xa4093822, 0x299f31d0, 0x082efa98, 0xec4e6c89, 0, 0xffffffff,
      0x9fcce05d, 0x837d3f3c, 0x5cdf3e61, 0xdb2544c0 },
    { 0, 0, 0x80000000, 0, 0, 0x80000000, 0xae56ca02, 0x7609ba67, 0x25abd7df, 0x46ce39a3 },
};

START_TEST(test_philox_kat)
{
    for (size_t t = 0; t < sizeof philox_kat / sizeof philox_kat[0]; t++) {
        const uint32_t *v = philox_kat[t];
        uint32_t out[4];
        qd_philox4x32_10(out, v, v + 4);
        for (int w = 0; w < 4; w++)
            ck_assert_msg(out[w] == v[6 + w], "vector %zu word %d: %08x != %08x", t, w, out[w], v[6 + w]);
    }
}
END_TEST

/* tests/ref/philox_ref.py: 256 random (key, counter) pairs and 64 token
 * draws (seed, sequence, position -> u bits) from a numpy implementation. */
START_TEST(test_philox_numpy_ref)
{
    FILE *f = fopen(qd_test_path("tests/fixtures/sampling/philox_ref.txt"), "r");
    ck_assert_ptr_nonnull(f);
    char line[256];
    int np = 0, nu = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == 'P') {
            uint32_t k[2], c[4], o[4], got[4];
            ck_assert_int_eq(sscanf(line + 2, "%x %x %x %x %x %x %x %x %x %x", &k[0], &k[1], &c[0], &c[1],
                                    &c[2], &c[3], &o[0], &o[1], &o[2], &o[3]), 10);
            qd_philox4x32_10(got, c, k);
            ck_assert_msg(memcmp(got, o, sizeof o) == 0, "line %d", np + nu + 1);
            np++;
        } else {
            unsigned long long seed, seq;
            uint32_t pos, ub;
            ck_assert_int_eq(sscanf(line + 2, "%llx %llx %x %x", &seed, &seq, &pos, &ub), 4);
            ck_assert_uint_eq(qd_f32_bits(qd_philox_sample_u(seed, seq, pos)), ub);
            nu++;
        }
    }
    fclose(f);
    ck_assert_int_eq(np, 256);
    ck_assert_int_eq(nu, 64);
}
END_TEST

START_TEST(test_uniform_mapping)
{
    ck_assert(qd_philox_u01(0) == 0.0f);
    ck_assert(qd_philox_u01(0xff) == 0.0f); /* the low 8 bits are dropped */
    ck_assert(qd_philox_u01(0x100) == 0x1.0p-24f);
    ck_assert(qd_philox_u01(0x80000000u) == 0.5f);
    ck_assert(qd_philox_u01(0xffffffffu) == 1.0f - 0x1.0p-24f);
    /* every output is k * 2^-24 exactly, k = x >> 8 */
    rng_state = 7;
    for (int i = 0; i < 10000; i++) {
        uint32_t x = (uint32_t)(urand() * 4294967296.0);
        ck_assert((double)qd_philox_u01(x) == ldexp((double)(x >> 8), -24));
    }
    /* draws of different positions / sequences / seeds differ; one is repeatable */
    float a = qd_philox_sample_u(1, 2, 3);
    ck_assert(a == qd_philox_sample_u(1, 2, 3));
    ck_assert(a != qd_philox_sample_u(1, 2, 4));
    ck_assert(a != qd_philox_sample_u(1, 3, 3));
    ck_assert(a != qd_philox_sample_u(2, 2, 3));
    ck_assert(a != qd_philox_sample_u(1, 2 + (1ull << 32), 3));
}
END_TEST

/* ---- greedy and truncation edge cases */

START_TEST(test_greedy_ties)
{
    float x[6] = { 0.5f, 2.0f, -1.0f, 2.0f, 2.0f, 1.0f };
    for (uint32_t n = 0; n < 50; n++) {
        qd_sample_result r = sample1(x, 6, params(0.0f, 0, 1.0f, 9), 4, n);
        ck_assert_int_eq(r.token, 1);
        ck_assert(r.logprob_kept == 0.0f);
        /* log_softmax at T = 1 in float64 */
        double z = 0.0;
        for (int i = 0; i < 6; i++)
            z += exp((double)x[i] - 2.0);
        ck_assert_double_le(fabs((double)r.logprob + log(z)), 1e-6);
    }
    /* -0 and +0 tie too: the lowest id wins, and the bits do not depend on which came first */
    float y[3] = { -0.0f, 0.0f, -1.0f }, y2[3] = { 0.0f, -0.0f, -1.0f };
    qd_sample_result a = sample1(y, 3, params(0.0f, 0, 1.0f, 1), 0, 0);
    qd_sample_result b = sample1(y2, 3, params(0.0f, 0, 1.0f, 1), 0, 0);
    ck_assert_int_eq(a.token, 0);
    ck_assert_int_eq(b.token, 0);
    ck_assert_uint_eq(qd_f32_bits(a.logprob), qd_f32_bits(b.logprob));
}
END_TEST

START_TEST(test_topk_topp_edges)
{
    float x[8] = { 0.1f, 1.5f, 1.5f, 1.5f, -2.0f, 0.7f, 1.2f, -0.3f };
    long *c;
    /* k = 1: always the argmax (lowest id of the tie), kept log-prob 0 */
    for (uint32_t n = 0; n < 200; n++) {
        qd_sample_result r = sample1(x, 8, params(1.3f, 1, 1.0f, 5), 1, n);
        ck_assert_int_eq(r.token, 1);
        ck_assert(r.logprob_kept == 0.0f);
    }
    /* tiny p: only rank 0 is kept */
    c = draw_counts(x, 8, params(1.0f, 0, 1e-6f, 5), 2, 300);
    ck_assert_int_eq(c[1], 300);
    free(c);
    /* k = 2 among a three-way tie: tokens 1 and 2 only, about half each */
    c = draw_counts(x, 8, params(1.0f, 2, 1.0f, 6), 3, 2000);
    ck_assert_int_eq(c[1] + c[2], 2000);
    ck_assert(c[1] > 900 && c[2] > 900);
    free(c);
    /* k > V, k = V, k = 0, k < 0 and p = 1: identical to no truncation */
    for (uint32_t n = 0; n < 200; n++) {
        qd_sample_result r0 = sample1(x, 8, params(0.9f, 0, 1.0f, 8), 4, n);
        int ks[3] = { 8, 100, -1 };
        for (int i = 0; i < 3; i++) {
            qd_sample_result r = sample1(x, 8, params(0.9f, ks[i], 1.0f, 8), 4, n);
            ck_assert_int_eq(r.token, r0.token);
            ck_assert_uint_eq(qd_f32_bits(r.logprob_kept), qd_f32_bits(r0.logprob_kept));
        }
        ck_assert_uint_eq(qd_f32_bits(r0.logprob), qd_f32_bits(r0.logprob_kept));
    }
    /* uniform logits: p = 0.5 keeps exactly tokens 0, 1 (c = 1, 2 >= 0.5 * 4);
     * p = 0.51 keeps 0, 1, 2; the kept log-prob is log(1/2), log(1/3) */
    float u[4] = { 0.25f, 0.25f, 0.25f, 0.25f };
    c = draw_counts(u, 4, params(1.0f, 0, 0.5f, 1), 5, 1000);
    ck_assert(c[0] > 400 && c[1] > 400 && c[2] == 0 && c[3] == 0);
    free(c);
    c = draw_counts(u, 4, params(1.0f, 0, 0.51f, 1), 5, 1500);
    ck_assert(c[0] > 400 && c[1] > 400 && c[2] > 400 && c[3] == 0);
    free(c);
    qd_sample_result r = sample1(u, 4, params(1.0f, 0, 0.51f, 1), 5, 0);
    ck_assert_double_le(fabs((double)r.logprob_kept - log(1.0 / 3.0)), 1e-7);
    ck_assert_double_le(fabs((double)r.logprob - log(0.25)), 1e-7);
    /* V = 1 */
    float one = 3.0f;
    r = sample1(&one, 1, params(0.7f, 5, 0.3f, 1), 0, 0);
    ck_assert_int_eq(r.token, 0);
    ck_assert(r.logprob == 0.0f && r.logprob_kept == 0.0f);
}
END_TEST

/* ---- distribution */

/* The descent picks what a float64 inverse CDF picks over the documented
 * order (lanes in bit-reversed index order, tokens ascending inside a lane),
 * except within rounding of a boundary. V > lanes, so every level is used. */
static int bitrev10(int j)
{
    int r = 0;
    for (int b = 0; b < 10; b++)
        r |= ((j >> b) & 1) << (9 - b);
    return r;
}

START_TEST(test_descent_order)
{
    const int V = 5000, N = 4000;
    float *x = random_logits(V, 2.0, 11);
    double *p = softmax_f64(x, V, 1.0f);
    int *order = malloc((size_t)V * sizeof *order), n = 0;
    for (int rev = 0; rev < QD_SAMPLE_LANES; rev++)
        for (int i = bitrev10(rev); i < V; i += QD_SAMPLE_LANES)
            order[n++] = i;
    ck_assert_int_eq(n, V);
    int mismatch = 0;
    qd_sample_ws *ws = qd_sample_ws_new(V);
    qd_sample_params sp = params(1.0f, 0, 1.0f, 77);
    for (int t = 0; t < N; t++) {
        qd_sample_result r;
        ck_assert_int_eq(qd_sample_row(&r, ws, x, V, &sp, 3, (uint32_t)t), QD_OK);
        double u = qd_philox_sample_u(77, 3, (uint32_t)t), cum = 0.0;
        int ref = order[V - 1];
        for (int i = 0; i < V; i++) {
            cum += p[order[i]];
            if (cum > u) {
                ref = order[i];
                break;
            }
        }
        mismatch += r.token != ref;
    }
    qd_sample_ws_free(ws);
    ck_assert_msg(mismatch <= 2, "%d of %d draws differ from the float64 inverse CDF", mismatch, N);
    free(order);
    free(p);
    free(x);
}
END_TEST

/* chi-square with 9 degrees of freedom: 0.999 quantile 27.88. */
START_TEST(test_chi_square_small)
{
    float x[10] = { 1.0f, 0.2f, -0.5f, 2.0f, 1.7f, 0.0f, -1.0f, 0.9f, 0.4f, 1.1f };
    const long N = 40000;
    double *p = softmax_f64(x, 10, 0.8f);
    long *c = draw_counts(x, 10, params(0.8f, 0, 1.0f, 2026), 12, (int)N);
    double chi = chi_square(c, p, 10, N);
    ck_assert_msg(chi < 27.88, "chi-square %.2f", chi);
    free(c);
    /* top-k 6 then top-p 0.8 of the renormalized top 6 (tokens 3 4 9 0 7 8,
     * cumulative 0.372 0.628 0.749 0.856 ...) -> kept {3, 4, 9, 0}; chi-square
     * df 3: 0.999 quantile 16.27 */
    double q[10] = { 0 }, z = 0.0;
    int keep[4] = { 3, 4, 9, 0 };
    for (int i = 0; i < 4; i++)
        z += p[keep[i]];
    for (int i = 0; i < 4; i++)
        q[keep[i]] = p[keep[i]] / z;
    c = draw_counts(x, 10, params(0.8f, 6, 0.8f, 2027), 13, (int)N);
    chi = chi_square(c, q, 10, N);
    ck_assert_msg(chi < 16.27, "chi-square %.2f (truncated)", chi);
    free(c);
    free(p);
}
END_TEST

/* V = 4000 > lanes: tokens grouped into 20 cells of about equal probability
 * (in id order); chi-square df 19: 0.999 quantile 43.82. */
START_TEST(test_chi_square_large)
{
    const int V = 4000, cells = 20;
    const long N = 20000;
    float *x = random_logits(V, 1.5, 21);
    double *p = softmax_f64(x, V, 1.3f);
    long *c = draw_counts(x, V, params(1.3f, 0, 1.0f, 99), 7, (int)N);
    long cc[20] = { 0 };
    double cp[20] = { 0 }, cum = 0.0;
    for (int i = 0; i < V; i++) {
        int cell = (int)(cum * cells);
        cell = cell < cells ? cell : cells - 1;
        cum += p[i];
        cc[cell] += c[i];
        cp[cell] += p[i];
    }
    double chi = chi_square(cc, cp, cells, N);
    ck_assert_msg(chi < 43.82, "chi-square %.2f", chi);
    free(c);
    free(p);
    free(x);
}
END_TEST

/* tests/ref/sampling_ref.py: the rule re-implemented in numpy float32 from
 * its description; tokens and log-prob bits must be equal. */
static void read_exact(void *dst, size_t n, FILE *f) { ck_assert_uint_eq(fread(dst, 1, n, f), n); }

START_TEST(test_numpy_rule)
{
    FILE *f = fopen(qd_test_path("tests/fixtures/sampling/sampling_ref.bin"), "rb");
    ck_assert_ptr_nonnull(f);
    uint32_t hdr[2];
    read_exact(hdr, sizeof hdr, f);
    ck_assert_uint_eq(hdr[0], 0x51445350u);
    int total = 0;
    for (uint32_t c = 0; c < hdr[1]; c++) {
        int32_t V, k, draws;
        float T, p;
        uint64_t seed;
        read_exact(&V, 4, f);
        read_exact(&T, 4, f);
        read_exact(&k, 4, f);
        read_exact(&p, 4, f);
        read_exact(&seed, 8, f);
        read_exact(&draws, 4, f);
        ck_assert(V > 0 && V <= 100000 && draws > 0);
        float *x = malloc((size_t)V * sizeof *x);
        read_exact(x, (size_t)V * sizeof *x, f);
        for (int d = 0; d < draws; d++) {
            uint64_t q;
            uint32_t n;
            int32_t tok;
            float lp, lpk;
            read_exact(&q, 8, f);
            read_exact(&n, 4, f);
            read_exact(&tok, 4, f);
            read_exact(&lp, 4, f);
            read_exact(&lpk, 4, f);
            qd_sample_result r = sample1(x, V, params(T, k, p, seed), q, n);
            ck_assert_msg(r.token == tok, "case %u draw %d: token %d, numpy %d", c, d, r.token, tok);
            ck_assert_msg(qd_f32_bits(r.logprob) == qd_f32_bits(lp) && qd_f32_bits(r.logprob_kept) == qd_f32_bits(lpk),
                          "case %u draw %d: log-probs %.9g %.9g, numpy %.9g %.9g", c, d, (double)r.logprob,
                          (double)r.logprob_kept, (double)lp, (double)lpk);
            total++;
        }
        free(x);
    }
    fclose(f);
    ck_assert_int_eq(total, 240);
}
END_TEST

/* ---- log-probs */

/* |logprob - float64 log_softmax(x / T)| <= 1e-6 * max(1, |ref|): float32
 * holds |ref| ~ 10 only to ~1e-6 absolute. */
static double logprob_err(int V, float T, uint64_t seed)
{
    float *x = random_logits(V, 3.0, seed);
    double m = -INFINITY, z = 0.0, worst = 0.0;
    for (int i = 0; i < V; i++)
        m = fmax(m, (double)x[i] / T);
    for (int i = 0; i < V; i++)
        z += exp((double)x[i] / T - m);
    qd_sample_ws *ws = qd_sample_ws_new(V);
    qd_sample_params sp = params(T, 0, 1.0f, seed);
    for (uint32_t n = 0; n < 200; n++) {
        qd_sample_result r;
        ck_assert_int_eq(qd_sample_row(&r, ws, x, V, &sp, 1, n), QD_OK);
        double ref = (double)x[r.token] / T - m - log(z);
        double err = fabs((double)r.logprob - ref) / fmax(1.0, fabs(ref));
        worst = fmax(worst, err);
    }
    qd_sample_ws_free(ws);
    free(x);
    return worst;
}

START_TEST(test_logprob_f64)
{
    double e1 = logprob_err(64, 1.0f, 31), e2 = logprob_err(1000, 0.7f, 32), e3 = logprob_err(151936, 1.0f, 33);
    ck_assert_msg(e1 <= 1e-6 && e2 <= 1e-6 && e3 <= 1e-6, "relative errors %.3g %.3g %.3g", e1, e2, e3);
}
END_TEST

/* ---- batch and thread invariance */

static void batch_run(qd_sample_result *out, const float *x, int B, int V, qd_sample_params sp,
                      const uint64_t *q, const uint32_t *n, int threads)
{
#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
    qd_status st = qd_sample_batch(out, x, B, V, &sp, q, n);
    ck_assert_msg(st == QD_OK, "%s", qd_last_error());
}

START_TEST(test_batch_invariance)
{
    enum { B = 16, V = 3000 };
    float *x = random_logits(B * V, 2.5, 41);
    uint64_t q[B];
    uint32_t n[B];
    for (int b = 0; b < B; b++) {
        q[b] = 1000 + (uint64_t)b * 7;
        n[b] = (uint32_t)(20 + b);
    }
    qd_sample_params cases[3] = { params(1.0f, 0, 1.0f, 5), params(0.7f, 40, 0.9f, 6), params(1.2f, 0, 0.95f, 7) };
#ifdef _OPENMP
    int threads = omp_get_max_threads();
#endif
    for (int c = 0; c < 3; c++) {
        qd_sample_result one[B], b1[B], b2[B];
        for (int b = 0; b < B; b++)
            batch_run(&one[b], x + (size_t)b * V, 1, V, cases[c], &q[b], &n[b], 1);
        batch_run(b1, x, B, V, cases[c], q, n, 1);
        batch_run(b2, x, B, V, cases[c], q, n, 2);
        ck_assert(memcmp(one, b1, sizeof one) == 0);
        ck_assert(memcmp(one, b2, sizeof one) == 0);
        for (int b = 0; b < B; b++) {
            qd_sample_result r = sample1(x + (size_t)b * V, V, cases[c], q[b], n[b]);
            ck_assert(memcmp(&r, &one[b], sizeof r) == 0);
        }
    }
#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
    free(x);
}
END_TEST

/* ---- refused input */

START_TEST(test_refused)
{
    enum { B = 5, V = 40 };
    float *x = random_logits(B * V, 1.0, 51);
    uint64_t q[B] = { 0, 1, 2, 3, 4 };
    uint32_t n[B] = { 0 };
    qd_sample_result out[B];
    qd_sample_params sp = params(1.0f, 0, 1.0f, 1);
    x[3 * V + 17] = NAN;
    x[4 * V + 2] = INFINITY;
    ck_assert_int_eq(qd_sample_batch(out, x, B, V, &sp, q, n), QD_ERR_NONFINITE);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "row 3"));
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "logits[17] is nan"));
    x[3 * V + 17] = 0.0f;
    ck_assert_int_eq(qd_sample_batch(out, x, B, V, &sp, q, n), QD_ERR_NONFINITE);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "row 4: logits[2] is inf"));
    x[4 * V + 2] = 1e30f;
    qd_sample_params tiny = params(1e-10f, 0, 1.0f, 1);
    ck_assert_int_eq(qd_sample_batch(out, x, B, V, &tiny, q, n), QD_ERR_NONFINITE);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "row 4: logits[2] / temperature"));
    qd_sample_params bad[5] = { params(-1.0f, 0, 1.0f, 1), params(NAN, 0, 1.0f, 1), params(1.0f, 0, 0.0f, 1),
                                params(1.0f, 0, 1.5f, 1), params(1.0f, 0, NAN, 1) };
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(qd_sample_batch(out, x, B, V, &bad[i], q, n), QD_ERR_ARG);
    ck_assert_int_eq(qd_sample_batch(out, x, B, 0, &sp, q, n), QD_ERR_SHAPE);
    ck_assert_int_eq(qd_sample_batch(out, x, -1, V, &sp, q, n), QD_ERR_SHAPE);
    qd_sample_ws *ws = qd_sample_ws_new(10);
    ck_assert_int_eq(qd_sample_row(out, ws, x, V, &sp, 0, 0), QD_ERR_ARG);
    qd_sample_ws_free(ws);
    ck_assert_ptr_null(qd_sample_ws_new(0));
    free(x);
}
END_TEST

Suite *suite_sampling(void)
{
    Suite *s = suite_create("sampling");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_philox_kat);
    tcase_add_test(tc, test_philox_numpy_ref);
    tcase_add_test(tc, test_uniform_mapping);
    tcase_add_test(tc, test_greedy_ties);
    tcase_add_test(tc, test_topk_topp_edges);
    tcase_add_test(tc, test_descent_order);
    tcase_add_test(tc, test_chi_square_small);
    tcase_add_test(tc, test_chi_square_large);
    tcase_add_test(tc, test_numpy_rule);
    tcase_add_test(tc, test_logprob_f64);
    tcase_add_test(tc, test_batch_invariance);
    tcase_add_test(tc, test_refused);
    suite_add_tcase(s, tc);
    return s;
}
