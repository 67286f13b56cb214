/* Check suite of the quant module: the codecs against tables and references
 * written here from docs/numerics.md (by a different algorithm: nearest-value
 * search), NVFP4 against golden vectors from numpy + ml_dtypes
 * (tests/ref/nvfp4_golden.py), the W4A4 and FP8 products against float64, RAC,
 * and the crash-safe file writes of quant/fileio.h. */
#include <float.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "tests/suites.h"
#include "quant/fileio.h"
#include "quant/quant.h"
#include "quant/splitmix64.h"

/* ---- helpers */

static uint64_t rng_state;

static uint64_t rng_next(void) { return qd_splitmix64_next(&rng_state); }

static double rng_uniform(void) { return ((double)(rng_next() >> 11) + 0.5) / 9007199254740992.0; }

static float rng_normal(void)
{
    return (float)(sqrt(-2.0 * log(rng_uniform())) * cos(6.283185307179586 * rng_uniform()));
}

static float *normal_matrix(int64_t n, uint64_t seed)
{
    float *x = malloc(sizeof(float) * (size_t)n);
    ck_assert_ptr_nonnull(x);
    rng_state = seed;
    for (int64_t i = 0; i < n; i++)
        x[i] = rng_normal();
    return x;
}

/* Thread count of the OpenMP loops in quant/ (a no-op in a build without OpenMP). */
static void set_threads(int n)
{
#ifdef _OPENMP
    omp_set_num_threads(n);
#else
    (void)n;
#endif
}

static uint8_t code_at(const qd_nvfp4 *q, int64_t r, int64_t c)
{
    uint8_t byte = q->codes[r * (q->cols / 2) + c / 2];
    return (c & 1) ? byte >> 4 : byte & 0xf;
}

static qd_nvfp4 quantized(const float *x, int64_t rows, int64_t cols, qd_scale_kind scale)
{
    qd_nvfp4 q;
    ck_assert_int_eq(qd_nvfp4_alloc(&q, rows, cols, scale), QD_OK);
    ck_assert_int_eq(qd_nvfp4_quantize(&q, x), QD_OK);
    return q;
}

/* ---- reference codecs from the spec: nearest value of the format, ties to the even code */

static const double e2m1_mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

static uint8_t ref_e2m1(float v)
{
    double a = fabs((double)v);
    int best = 0;
    if (a > 6.0) /* saturation; also keeps huge values away from double rounding ties */
        return (uint8_t)((signbit(v) ? 8 : 0) | 7);
    for (int i = 1; i < 8; i++) {
        double d = fabs(a - e2m1_mag[i]), db = fabs(a - e2m1_mag[best]);
        if (d < db || (d == db && (i & 1) == 0))
            best = i;
    }
    return (uint8_t)((signbit(v) ? 8 : 0) | best);
}

/* E4M3 magnitude of code c (0..126) from the definition: bias 7, subnormals m * 2^-9. */
static double e4m3_mag(int c)
{
    int e = c >> 3, m = c & 7;
    return e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
}

static uint8_t ref_e4m3(float v)
{
    if (isnan(v))
        return (uint8_t)((signbit(v) ? 0x80 : 0) | 0x7f);
    double a = fabs((double)v);
    int best = 0;
    for (int c = 1; c <= 126; c++) {
        double d = fabs(a - e4m3_mag(c)), db = fabs(a - e4m3_mag(best));
        if (d < db || (d == db && (c & 1) == 0))
            best = c;
    }
    return (uint8_t)((signbit(v) ? 0x80 : 0) | best);
}

/* ---- E2M1 */

START_TEST(test_e2m1_boundaries)
{
    static const struct { float v; uint8_t code; } t[] = {
        {0.0f, 0x0}, {0.25f, 0x0}, {0.2500001f, 0x1}, {0.5f, 0x1},
        {0.7499999f, 0x1}, {0.75f, 0x2}, {1.0f, 0x2}, {1.25f, 0x2}, {1.2500001f, 0x3},
        {1.5f, 0x3}, {1.7499999f, 0x3}, {1.75f, 0x4}, {2.0f, 0x4}, {2.5f, 0x4},
        {2.5000002f, 0x5}, {3.0f, 0x5}, {3.4999998f, 0x5}, {3.5f, 0x6}, {4.0f, 0x6},
        {5.0f, 0x6}, {5.0000005f, 0x7}, {6.0f, 0x7}, {6.5f, 0x7}, {1e30f, 0x7},
        {FLT_MAX, 0x7}, {INFINITY, 0x7}, {1e-45f, 0x0},
        {-0.0f, 0x8}, {-1e-45f, 0x8}, {-0.1f, 0x8}, {-0.25f, 0x8}, {-0.2500001f, 0x9},
        {-0.75f, 0xa}, {-1.25f, 0xa}, {-1.75f, 0xc}, {-2.5f, 0xc}, {-3.5f, 0xe},
        {-5.0f, 0xe}, {-6.0f, 0xf}, {-100.0f, 0xf}, {-INFINITY, 0xf},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        ck_assert_msg(qd_e2m1_from_f32(t[i].v) == t[i].code, "e2m1(%a) = 0x%x, want 0x%x",
                      (double)t[i].v, qd_e2m1_from_f32(t[i].v), t[i].code);
        ck_assert_int_eq(ref_e2m1(t[i].v), t[i].code); /* the reference agrees with the table */
    }
    for (int c = 0; c < 16; c++) {
        double want = (c & 8 ? -1 : 1) * e2m1_mag[c & 7];
        ck_assert(qd_e2m1_to_f32((uint8_t)c) == (float)want);
        ck_assert_int_eq(qd_e2m1_from_f32(qd_e2m1_to_f32((uint8_t)c)), c);
    }
}
END_TEST

/* ---- E4M3 */

START_TEST(test_e4m3_boundaries)
{
    const float sub = 0x1p-9f;
    static struct { float v; uint8_t code; } t[] = {
        {0.0f, 0x00}, {-0.0f, 0x80}, {0x1p-9f, 0x01}, {0x1p-10f, 0x00},
        {0x1.000002p-10f, 0x01}, {0x1.8p-9f, 0x02}, {0x1.4p-8f, 0x02}, /* 1.5 and 2.5 ulps: ties */
        {0x1.cp-7f, 0x07}, {0x1.ep-7f, 0x08}, /* 7.5 * 2^-9: tie between 0x07 and the min normal */
        {0x1p-6f, 0x08}, {0x1.1p-6f, 0x08}, {0x1.3p-6f, 0x0a}, {0x1.18p-6f, 0x09}, /* ties at 1/2 and 3/2 ulp */
        {1.0f, 0x38}, {1.0625f, 0x38}, {1.0625001f, 0x39}, {1.1875f, 0x3a},
        {-1.0f, 0xb8}, {-1.0625f, 0xb8}, {240.0f, 0x77}, {248.0f, 0x78}, {256.0f, 0x78},
        {416.0f, 0x7d}, {432.0f, 0x7e}, {431.99997f, 0x7d}, {448.0f, 0x7e}, {449.0f, 0x7e},
        {464.0f, 0x7e}, {480.0f, 0x7e}, {1e9f, 0x7e}, {FLT_MAX, 0x7e}, {INFINITY, 0x7e},
        {-448.0f, 0xfe}, {-1e30f, 0xfe}, {-INFINITY, 0xfe}, {1e-45f, 0x00}, {-1e-45f, 0x80},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        ck_assert_msg(qd_e4m3_from_f32(t[i].v) == t[i].code, "e4m3(%a) = 0x%02x, want 0x%02x",
                      (double)t[i].v, qd_e4m3_from_f32(t[i].v), t[i].code);
    ck_assert_int_eq(qd_e4m3_from_f32(NAN) & 0x7f, 0x7f);
    ck_assert(isnan(qd_e4m3_to_f32(0x7f)) && isnan(qd_e4m3_to_f32(0xff)));
    ck_assert(qd_e4m3_to_f32(0x01) == sub && qd_e4m3_to_f32(0x7e) == 448.0f);
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f)
            continue;
        double want = (c & 0x80 ? -1 : 1) * e4m3_mag(c & 0x7f);
        ck_assert((double)qd_e4m3_to_f32((uint8_t)c) == want);
        ck_assert_int_eq(qd_e4m3_from_f32(qd_e4m3_to_f32((uint8_t)c)), c);
    }
}
END_TEST

/* ---- every BF16 bit pattern through both encoders, and BF16 rounding */

START_TEST(test_bf16_all_patterns)
{
    int64_t checked = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float v = qd_bf16_to_f32((uint16_t)h);
        ck_assert_int_eq(qd_f32_bits(v), h << 16);
        if (isnan(v))
            continue;
        uint8_t e2 = qd_e2m1_from_f32(v), e4 = qd_e4m3_from_f32(v);
        ck_assert_msg(e2 == ref_e2m1(v), "e2m1(bf16 0x%04x = %a) = 0x%x, ref 0x%x", h,
                      (double)v, e2, ref_e2m1(v));
        ck_assert_msg(e4 == ref_e4m3(v), "e4m3(bf16 0x%04x = %a) = 0x%02x, ref 0x%02x", h,
                      (double)v, e4, ref_e4m3(v));
        checked++;
    }
    ck_assert_int_eq(checked, 65536 - 2 * 127); /* the 254 NaN patterns are skipped */
}
END_TEST

/* Random float32 values (every mantissa bit, so sticky bits below BF16 matter):
 * exponents spread over the formats' ranges, and raw bit patterns. */
START_TEST(test_f32_random_encoders)
{
    rng_state = 77;
    for (int i = 0; i < 200000; i++) {
        uint64_t z = rng_next();
        uint32_t bits = (uint32_t)z;
        if (i % 2 == 0) /* exponent in [-14, 10]: E4M3 subnormals to past saturation */
            bits = (bits & 0x807fffffu) | (uint32_t)(127 - 14 + (int)((z >> 32) % 25)) << 23;
        float v = qd_bits_f32(bits);
        if (isnan(v))
            continue;
        ck_assert_msg(qd_e2m1_from_f32(v) == ref_e2m1(v), "e2m1(%a)", (double)v);
        ck_assert_msg(qd_e4m3_from_f32(v) == ref_e4m3(v), "e4m3(%a)", (double)v);
    }
}
END_TEST

/* One value through the branch-free twins of quant/numerics.h (the CUDA
 * quantizer's encoders) against the canonical encoders: the E2M1 code, the
 * rounded magnitude (a + M) - M the fake-quant kernel uses, and for |v| <= 448
 * the block-scale code and value. Counts mismatches (ck_assert per value is
 * slow), the first one printed. */
static int64_t rn_bad;

static void check_rn_twins(float v)
{
    if (isnan(v))
        return;
    uint32_t e, t, idx = qd_e2m1_index_rn(v);
    uint8_t code = qd_e2m1_from_f32(v), c = 0;
    qd_e2m1_rn_parts(v, &e, &t);
    int bad = (idx | ((qd_f32_bits(v) >> 28) & 8u)) != code ||
              qd_bits_f32(t) - qd_bits_f32((e + 22u) << 23) != fabsf(qd_e2m1_to_f32(code));
    float a = fabsf(v), val = 0.0f;
    if (a <= QD_E4M3_MAX) {
        c = qd_e4m3_scale_rn(a, &val);
        bad |= c != qd_e4m3_from_f32(a) || qd_f32_bits(val) != qd_f32_bits(qd_e4m3_to_f32(c));
    }
    if (bad && rn_bad++ == 0)
        fprintf(stderr, "rn twins: v = %a: e2m1 %u (want 0x%x), e4m3 0x%02x = %a (want 0x%02x)\n",
                (double)v, idx, code, c, (double)val, qd_e4m3_from_f32(a));
}

/* Each float within `ulps` of v, both signs. */
static void check_rn_window(float v, int ulps)
{
    uint32_t b = qd_f32_bits(v);
    for (int d = -ulps; d <= ulps; d++) {
        if ((int64_t)b + d < 0)
            continue;
        check_rn_twins(qd_bits_f32(b + (uint32_t)d));
        check_rn_twins(-qd_bits_f32(b + (uint32_t)d));
    }
}

/* The twins on every BF16 pattern with low halves that set the round, tie and
 * sticky bits, around every E2M1 value and midpoint and every E4M3 value and
 * midpoint, and on random bit patterns. (Every float was compared once when
 * they were written; tests/gpu/check_quant compares every float on the GPU.) */
START_TEST(test_rn_twins)
{
    static const uint32_t low[] = {0x0000, 0x0001, 0x3fff, 0x7fff, 0x8000, 0x8001, 0xffff};
    rn_bad = 0;
    static const float e2m1_pts[] = {0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f,
                                     3.0f,  3.5f, 4.0f,  5.0f, 6.0f, 7.0f, 8.0f, FLT_MIN, 0.0f};
    for (uint32_t h = 0; h < 65536; h++)
        for (size_t i = 0; i < sizeof low / sizeof low[0]; i++)
            check_rn_twins(qd_bits_f32(h << 16 | low[i]));
    for (size_t i = 0; i < sizeof e2m1_pts / sizeof e2m1_pts[0]; i++)
        check_rn_window(e2m1_pts[i], 4096);
    for (int c = 0; c < 0x7e; c++) {
        float lo = qd_e4m3_to_f32((uint8_t)c), hi = qd_e4m3_to_f32((uint8_t)(c + 1));
        check_rn_window(lo, 64);
        check_rn_window(0.5f * (lo + hi), 256); /* exact: the midpoint has one more bit */
    }
    check_rn_window(QD_E4M3_MAX, 64);
    rng_state = 1301;
    for (int i = 0; i < 300000; i++)
        check_rn_twins(qd_bits_f32((uint32_t)rng_next()));
    ck_assert_int_eq(rn_bad, 0);
}
END_TEST

/* Reference BF16 rounding: the nearer of the two neighbours, ties to the even one. */
static uint16_t ref_bf16(float f)
{
    uint32_t u = qd_f32_bits(f);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    double dl = fabs((double)f - (double)qd_bf16_to_f32(lo));
    /* the neighbour above the largest finite BF16 is 2^128 for rounding purposes */
    double vh = ((hi & 0x7fff) == 0x7f80) ? copysign(ldexp(1.0, 128), f) : qd_bf16_to_f32(hi);
    double dh = fabs((double)f - vh);
    if (dl < dh || (dl == dh && (lo & 1) == 0))
        return lo;
    return hi;
}

START_TEST(test_bf16_rounding)
{
    static const uint32_t low[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff};
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7fff) >= 0x7f80)
            continue; /* inf and NaN patterns */
        for (size_t i = 0; i < sizeof low / sizeof low[0]; i++) {
            float f = qd_bits_f32((h << 16) | low[i]);
            ck_assert_msg(qd_bf16_from_f32(f) == ref_bf16(f), "bf16(0x%08x)",
                          (h << 16) | low[i]);
        }
    }
    ck_assert_int_eq(qd_bf16_from_f32(qd_bits_f32(0x3f808000u)), 0x3f80); /* tie, even */
    ck_assert_int_eq(qd_bf16_from_f32(qd_bits_f32(0x3f818000u)), 0x3f82); /* tie, odd: up */
    ck_assert_int_eq(qd_bf16_from_f32(qd_bits_f32(0x7f7fffffu)), 0x7f80); /* FLT_MAX -> inf */
    ck_assert_int_eq(qd_bf16_from_f32(INFINITY), 0x7f80);
    ck_assert(isnan(qd_bf16_to_f32(qd_bf16_from_f32(NAN))));
    ck_assert(qd_round_bf16(1.00390625f) == 1.0f && qd_round_bf16(1.01171875f) == 1.015625f);
}
END_TEST

/* ---- golden vectors from numpy + ml_dtypes */

static uint32_t read_u32(FILE *f)
{
    uint8_t b[4];
    ck_assert_int_eq(fread(b, 1, 4, f), 4);
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static void read_bytes(void *dst, size_t n, FILE *f) { ck_assert_uint_eq(fread(dst, 1, n, f), n); }

/* One golden case: quantize x and compare codes, scales, s_dec with the file's bits. */
static void check_golden_case(FILE *f)
{
    uint32_t rows = read_u32(f), cols = read_u32(f), per_row = read_u32(f), len = read_u32(f);
    char name[128] = {0};
    ck_assert_uint_lt(len, sizeof name);
    read_bytes(name, len, f);
    size_t n = (size_t)rows * cols, nsd = per_row ? rows : 1;
    float *x = malloc(n * sizeof(float)), *sd = malloc(nsd * sizeof(float));
    uint8_t *codes = malloc(n / 2), *scales = malloc(n / 16);
    read_bytes(x, n * sizeof(float), f); /* little-endian file, little-endian host */
    read_bytes(codes, n / 2, f);
    read_bytes(scales, n / 16, f);
    read_bytes(sd, nsd * sizeof(float), f);
    qd_nvfp4 q = quantized(x, rows, cols, per_row ? QD_SCALE_PER_ROW : QD_SCALE_PER_TENSOR);
    ck_assert_msg(memcmp(q.scales, scales, n / 16) == 0, "%s: block scales differ", name);
    ck_assert_msg(memcmp(q.codes, codes, n / 2) == 0, "%s: codes differ", name);
    ck_assert_msg(memcmp(q.s_dec, sd, nsd * sizeof(float)) == 0, "%s: s_dec differs", name);
    qd_nvfp4_free(&q);
    free(x), free(sd), free(codes), free(scales);
}

/* A golden fixture of tests/ref (path under the source tree), its 4-byte
 * magic checked. */
static FILE *open_golden(const char *path, const char *magic)
{
    FILE *f = fopen(qd_test_path(path), "rb");
    ck_assert_msg(f != NULL, "missing %s", path);
    char m[4];
    read_bytes(m, 4, f);
    ck_assert_msg(memcmp(m, magic, 4) == 0, "%s: not a %.4s file", path, magic);
    return f;
}

START_TEST(test_golden_vectors)
{
    FILE *f = open_golden("tests/fixtures/nvfp4_golden.bin", "QDG1");
    uint32_t ncases = read_u32(f);
    ck_assert_uint_ge(ncases, 20);
    for (uint32_t i = 0; i < ncases; i++)
        check_golden_case(f);
    ck_assert_int_eq(fgetc(f), EOF);
    fclose(f);
}
END_TEST

/* ---- the FP16 W4A4 kernels' operands (docs/numerics.md §3, w4a4_h16_kernel) */

/* An IEEE half's value (any finite bits), by its fields. */
static double half_value(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    ck_assert_int_ne(e, 31);
    return (h & 0x8000) ? -v : v;
}

/* qd_e2m1x8_h16 against ml_dtypes' FP16 of e2m1 * 2^-14 (tests/ref/h16_golden.py)
 * for every code in every nibble, the other halves zero; and every finite
 * product e2m1 * e4m3 (the activation operand) exact in FP16 by the same reference. */
START_TEST(test_h16_operands)
{
    FILE *f = open_golden("tests/fixtures/h16_golden.bin", "QDH1");
    uint16_t w[16];
    read_bytes(w, sizeof w, f);
    for (uint32_t c = 0; c < 16; c++) {
        ck_assert_msg(half_value(w[c]) == ldexp(qd_e2m1_to_f32((uint8_t)c), -14), "code %u", c);
        for (int j = 0; j < 8; j++) {
            uint32_t r[4];
            qd_e2m1x8_h16(r, c << (4 * j));
            for (int q = 0; q < 4; q++)
                for (int hi = 0; hi < 2; hi++) {
                    uint16_t got = (uint16_t)(r[q] >> (16 * hi)), want = q == j % 4 && hi == j / 4 ? w[c] : 0;
                    ck_assert_msg(got == want, "code %u in nibble %d: pair %d half %d 0x%04x, not 0x%04x", c, j, q,
                                  hi, got, want);
                }
        }
    }
    int exact = 0;
    for (int sc = 0; sc < 256; sc++)
        for (int c = 0; c < 16; c++) {
            uint8_t b[3];
            read_bytes(b, 3, f);
            uint16_t bits = (uint16_t)(b[0] | b[1] << 8);
            float sa = qd_e4m3_to_f32((uint8_t)sc);
            if (isnan(sa)) {
                ck_assert_uint_eq(bits, 0xFFFF);
                continue;
            }
            float prod = qd_e2m1_to_f32((uint8_t)c) * sa;
            ck_assert_msg(b[2] == 1 && half_value(bits) == (double)prod, "scale 0x%02x code %d", sc, c);
            exact++;
        }
    ck_assert_int_eq(exact, 16 * 254);
    ck_assert_int_eq(fgetc(f), EOF);
    fclose(f);
}
END_TEST

/* The kernel's algebra on random blocks: the FP16 products' sum (in double:
 * exact) is p * sa * 2^-14 and a float, and fmaf(d, sw * 2^14, acc) has the bits
 * of the canonical fmaf(p, sa * sw, acc); the scales from their whole range,
 * the codes uniform or all +-6 (the largest sums). */
START_TEST(test_h16_block_algebra)
{
    rng_state = 0x4816;
    for (int it = 0; it < 200000; it++) {
        uint8_t sa_code = (uint8_t)(rng_next() % 127), sw_code = (uint8_t)(rng_next() % 127); /* positive, finite */
        float sa = qd_e4m3_to_f32(sa_code), sw = qd_e4m3_to_f32(sw_code);
        int big = it % 7 == 0;
        double p = 0, d = 0;
        for (int i = 0; i < 16; i++) {
            uint8_t cw = big ? (uint8_t)(7 | (rng_next() & 8)) : (uint8_t)(rng_next() & 15);
            uint8_t ca = big ? (uint8_t)(7 | (rng_next() & 8)) : (uint8_t)(rng_next() & 15);
            double wv = qd_e2m1_to_f32(cw), av = qd_e2m1_to_f32(ca);
            p += wv * av;
            d += ldexp(wv, -14) * (double)(qd_e2m1_to_f32(ca) * sa); /* the FP16 operands' values */
        }
        ck_assert(d == p * (double)sa * ldexp(1.0, -14));
        float df = (float)d;
        ck_assert((double)df == d);
        float acc = (float)((rng_uniform() - 0.5) * ldexp(1.0, (int)(rng_next() % 40) - 20));
        if (it % 11 == 0)
            acc = 0.0f;
        float got = fmaf(df, sw * 16384.0f, acc), want = fmaf((float)p, sa * sw, acc);
        ck_assert_msg(qd_f32_bits(got) == qd_f32_bits(want), "block %d: 0x%08x vs 0x%08x", it, qd_f32_bits(got),
                      qd_f32_bits(want));
    }
}
END_TEST

/* ---- NVFP4 quantizer: the TE quirks *//* ---- NVFP4 quantizer: the TE quirks */

START_TEST(test_nvfp4_zero_tensor)
{
    float x[32] = {0};
    x[3] = -0.0f;
    x[20] = -0.0f;
    qd_nvfp4 q = quantized(x, 1, 32, QD_SCALE_PER_TENSOR);
    ck_assert(q.s_dec[0] == 1.0f); /* amax 0 -> S_enc = 1 */
    ck_assert_int_eq(q.scales[0], 0);
    ck_assert_int_eq(q.scales[1], 0);
    for (int i = 0; i < 32; i++)
        ck_assert_int_eq(code_at(&q, 0, i), (i == 3 || i == 20) ? 0x8 : 0x0);
    float out[32];
    qd_nvfp4_dequantize(out, &q);
    ck_assert(out[0] == 0.0f && !signbit(out[0]) && out[3] == 0.0f && signbit(out[3]));
    qd_nvfp4_free(&q);
}
END_TEST

START_TEST(test_nvfp4_zero_block_and_saturation)
{
    /* block 0 is all zero (with a -0.0), block 1 holds the tensor amax */
    float x[32] = {0};
    x[7] = -0.0f;
    for (int i = 16; i < 32; i++)
        x[i] = (float)(i - 24) * 0.5f;
    x[31] = 12.0f;
    qd_nvfp4 q = quantized(x, 1, 32, QD_SCALE_PER_TENSOR);
    ck_assert(q.s_dec[0] == (float)(1.0 / (double)(2688.0f / 12.0f)));
    ck_assert_int_eq(q.scales[0], 0x00);  /* s_b = 0, inv = FLT_MAX, codes 0 */
    ck_assert_int_eq(q.scales[1], 0x7e);  /* the amax block saturates the E4M3 scale at 448 */
    for (int i = 0; i < 16; i++)
        ck_assert_int_eq(code_at(&q, 0, i), i == 7 ? 0x8 : 0x0);
    ck_assert_int_eq(code_at(&q, 0, 31), 0x7);
    ck_assert_int_eq(code_at(&q, 0, 16), 0xc); /* -4 * (6/12) = -2 */
    float inv = 1.0f / (448.0f * q.s_dec[0]); /* §2 step 5, by hand */
    for (int i = 16; i < 32; i++)
        ck_assert_int_eq(code_at(&q, 0, i), ref_e2m1(x[i] * inv));
    qd_nvfp4_free(&q);
}
END_TEST

START_TEST(test_nvfp4_quantize_with_saturates)
{
    /* S_enc = 1 for values near 1e4: s_b clamps to 448, x * (1/448) > 6 saturates */
    float x[16], s_enc = 1.0f;
    for (int i = 0; i < 16; i++)
        x[i] = (i & 1 ? -1.0f : 1.0f) * (1e4f + (float)i);
    qd_nvfp4 q;
    ck_assert_int_eq(qd_nvfp4_alloc(&q, 1, 16, QD_SCALE_PER_TENSOR), QD_OK);
    ck_assert_int_eq(qd_nvfp4_quantize_with(&q, x, &s_enc), QD_OK);
    ck_assert_int_eq(q.scales[0], 0x7e);
    ck_assert(q.s_dec[0] == 1.0f);
    for (int i = 0; i < 16; i++)
        ck_assert_int_eq(code_at(&q, 0, i), i & 1 ? 0xf : 0x7);
    float bad = 0.0f;
    ck_assert_int_eq(qd_nvfp4_quantize_with(&q, x, &bad), QD_ERR_ARG);
    qd_nvfp4_free(&q);
}
END_TEST

START_TEST(test_nvfp4_tiny_and_huge_scales)
{
    /* amax 1e-40 (subnormal): 2688/amax overflows, S_enc = FLT_MAX, S_dec subnormal */
    float x[16] = {0};
    x[0] = 1e-40f;
    x[5] = -3e-41f;
    qd_nvfp4 q = quantized(x, 1, 16, QD_SCALE_PER_TENSOR);
    ck_assert(q.s_dec[0] == (float)(1.0 / (double)FLT_MAX));
    ck_assert_int_eq(fpclassify(q.s_dec[0]), FP_SUBNORMAL);
    ck_assert_int_eq(q.scales[0], qd_e4m3_from_f32(1e-40f * (FLT_MAX * (1.0f / 6.0f))));
    ck_assert_int_ne(q.scales[0], 0);
    float out[16];
    qd_nvfp4_dequantize(out, &q);
    /* 1e-40 * FLT_MAX/6 = 2.9 * 2^-9 -> s_b = 3 * 2^-9, but 1/(s_b * S_dec) overflows and
     * clamps to FLT_MAX, so x * inv = 0.034 rounds to 0: blocks this small vanish (the
     * spec's arithmetic, as TransformerEngine's; the golden vectors agree) */
    ck_assert_int_eq(q.scales[0], 0x03);
    ck_assert(qd_nvfp4_block_inv(0x03, q.s_dec[0]) == FLT_MAX);
    ck_assert_int_eq(code_at(&q, 0, 0), 0x0);
    ck_assert_int_eq(code_at(&q, 0, 5), 0x8);
    ck_assert(out[0] == 0.0f);
    qd_nvfp4_free(&q);

    /* amax FLT_MAX: S_enc tiny, S_dec ~ 1.27e35, the amax element stays finite-ish */
    x[0] = FLT_MAX;
    x[5] = -1e38f;
    q = quantized(x, 1, 16, QD_SCALE_PER_TENSOR);
    ck_assert(q.s_dec[0] == (float)(1.0 / (double)(2688.0f / FLT_MAX)));
    ck_assert_int_eq(q.scales[0], 0x7e);
    ck_assert_int_eq(code_at(&q, 0, 0), 0x7);
    ck_assert_int_eq(code_at(&q, 0, 5), ref_e2m1(-1e38f * (1.0f / (448.0f * q.s_dec[0]))));
    qd_nvfp4_dequantize(out, &q);
    ck_assert(out[0] == FLT_MAX); /* (6 * 448) * S_dec rounds to FLT_MAX, not Inf */
    qd_nvfp4_free(&q);
}
END_TEST

/* qd_first_nonfinite against a plain isfinite loop: every non-finite kind
 * (NaNs with payloads and both signs, both infinities) at the edges of its
 * 65,536-element pieces, the first of several, none, the largest finite
 * values; 3M elements (parallel) and 1000 (serial), at 1 and 3 threads. */
static int64_t first_nonfinite_ref(const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return i;
    return -1;
}

START_TEST(test_first_nonfinite)
{
    const int64_t N = 3 << 20;
    float *x = malloc(sizeof(float) * (size_t)N);
    ck_assert_ptr_nonnull(x);
    for (int64_t i = 0; i < N; i++)
        x[i] = (i & 1 ? -1.0f : 1.0f) * (i % 3 ? FLT_MAX : (float)i);
    const float bad[] = {NAN, -NAN, INFINITY, -INFINITY, qd_bits_f32(0x7f800001u), qd_bits_f32(0xffc00123u)};
    const int64_t at[] = {0, 1, 65535, 65536, 65537, 1000000, N - 65536, N - 1};
    int threads[2] = {1, 3}, saved = omp_get_max_threads();
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(threads[t]);
        ck_assert_int_eq(qd_first_nonfinite(x, N), -1);
        ck_assert_int_eq(qd_first_nonfinite(x, 0), -1);
        for (size_t b = 0; b < sizeof bad / sizeof *bad; b++)
            for (size_t a = 0; a < sizeof at / sizeof *at; a++) {
                float keep = x[at[a]];
                x[at[a]] = bad[b];
                ck_assert_int_eq(qd_first_nonfinite(x, N), first_nonfinite_ref(x, N));
                ck_assert_int_eq(qd_first_nonfinite(x, N), at[a]);
                ck_assert_int_eq(qd_first_nonfinite(x, 1000), at[a] < 1000 ? at[a] : -1);
                int64_t other = N - 1 - at[a]; /* a second one: the first still wins */
                float keep2 = x[other];
                x[other] = bad[(b + 1) % 6];
                ck_assert_int_eq(qd_first_nonfinite(x, N), at[a] < other ? at[a] : other);
                x[other] = keep2;
                x[at[a]] = keep;
            }
    }
    omp_set_num_threads(saved);
    free(x);
}
END_TEST

START_TEST(test_nvfp4_nonfinite)
{
    float x[64];
    for (int i = 0; i < 64; i++)
        x[i] = (float)i;
    const float bad[] = {NAN, INFINITY, -INFINITY};
    for (int b = 0; b < 3; b++) {
        x[37] = bad[b];
        qd_nvfp4 q;
        ck_assert_int_eq(qd_nvfp4_alloc(&q, 2, 32, b & 1 ? QD_SCALE_PER_ROW : QD_SCALE_PER_TENSOR), QD_OK);
        memset(q.codes, 0xab, 32);
        memset(q.scales, 0xab, 4);
        ck_assert_int_eq(qd_nvfp4_quantize(&q, x), QD_ERR_NONFINITE);
        ck_assert_ptr_nonnull(strstr(qd_last_error(), "element 37"));
        for (int i = 0; i < 32; i++)
            ck_assert_int_eq(q.codes[i], 0xab); /* no codes written */
        for (int i = 0; i < 4; i++)
            ck_assert_int_eq(q.scales[i], 0xab);
        float s_enc[2] = {1.0f, 1.0f};
        ck_assert_int_eq(qd_nvfp4_quantize_with(&q, x, s_enc), QD_ERR_NONFINITE);
        ck_assert_int_eq(q.codes[0], 0xab);
        qd_nvfp4_free(&q);
        float out[64], amax = 123.0f;
        ck_assert_int_eq(qd_amax(&amax, x, 64), QD_ERR_NONFINITE);
        ck_assert(amax == 123.0f);
        ck_assert_int_eq(qd_nvfp4_fake_quant(out, x, 2, 32, QD_SCALE_PER_ROW), QD_ERR_NONFINITE);
        uint8_t q8[64];
        float sinv[2];
        ck_assert_int_eq(qd_fp8_quantize_rows(q8, sinv, x, 2, 32), QD_ERR_NONFINITE);
        double err[32] = {0};
        ck_assert_int_eq(qd_rac_error_accumulate(err, x, 2, 32), QD_ERR_NONFINITE);
        ck_assert(err[0] == 0.0);
    }
    qd_nvfp4 q;
    ck_assert_int_eq(qd_nvfp4_alloc(&q, 2, 24, QD_SCALE_PER_TENSOR), QD_ERR_SHAPE);
    ck_assert_int_eq(qd_nvfp4_alloc(&q, 0, 16, QD_SCALE_PER_TENSOR), QD_ERR_SHAPE);
    ck_assert_int_eq(qd_nvfp4_alloc(&q, 2, 32, (qd_scale_kind)2), QD_ERR_ARG);
}
END_TEST

/* Per-row scales: a row's codes do not depend on the other rows of the batch (§4);
 * per-tensor: one S_dec; dequantize(quantize(x)) == fake_quant(x). */
START_TEST(test_nvfp4_per_row_and_fake_quant)
{
    const int64_t R = 5, K = 64;
    float *x = normal_matrix(R * K, 11);
    for (int64_t i = 0; i < K; i++)
        x[2 * K + i] *= 1000.0f; /* a loud row */
    qd_nvfp4 all = quantized(x, R, K, QD_SCALE_PER_ROW);
    for (int64_t r = 0; r < R; r++) {
        qd_nvfp4 one = quantized(x + r * K, 1, K, QD_SCALE_PER_ROW);
        ck_assert(memcmp(one.codes, all.codes + r * K / 2, K / 2) == 0);
        ck_assert(memcmp(one.scales, all.scales + r * K / 16, K / 16) == 0);
        ck_assert(one.s_dec[0] == all.s_dec[r]);
        qd_nvfp4_free(&one);
    }
    qd_nvfp4 tensor = quantized(x, R, K, QD_SCALE_PER_TENSOR);
    ck_assert(tensor.s_dec[0] == all.s_dec[2]); /* the loud row holds the tensor amax */
    ck_assert(tensor.s_dec[0] != all.s_dec[0]);
    float *fq = malloc(sizeof(float) * R * K), *dq = malloc(sizeof(float) * R * K);
    ck_assert_int_eq(qd_nvfp4_fake_quant(fq, x, R, K, QD_SCALE_PER_ROW), QD_OK);
    qd_nvfp4_dequantize(dq, &all);
    ck_assert(memcmp(fq, dq, sizeof(float) * R * K) == 0);
    /* dequantization is (e2m1 * s_b) * S_dec, and is close to x */
    double num = 0, den = 0;
    for (int64_t i = 0; i < R * K; i++) {
        int64_t r = i / K, c = i % K;
        float want = (qd_e2m1_to_f32(code_at(&all, r, c)) *
                      qd_e4m3_to_f32(all.scales[r * K / 16 + c / 16])) * all.s_dec[r];
        ck_assert(dq[i] == want);
        num += ((double)dq[i] - x[i]) * ((double)dq[i] - x[i]);
        den += (double)x[i] * x[i];
    }
    ck_assert_msg(sqrt(num / den) < 0.15, "relative error %g", sqrt(num / den));
    qd_nvfp4_free(&all), qd_nvfp4_free(&tensor);
    free(x), free(fq), free(dq);
}
END_TEST

/* ---- swizzled scales */

START_TEST(test_swizzle_positions)
{
    /* the worked example of nvmath's get_block_scale_offset: M = K = 128 (8 scale columns) */
    uint8_t src[128 * 8], dst[1024], back[128 * 8];
    for (int i = 0; i < 128 * 8; i++)
        src[i] = (uint8_t)(i * 7 + 1);
    ck_assert_uint_eq(qd_scales_swizzled_size(128, 8), 1024);
    qd_scales_swizzle(dst, src, 128, 8);
    ck_assert_int_eq(dst[82], src[5 * 8 + 2]);
    ck_assert_int_eq(dst[593], src[5 * 8 + 5]);
    ck_assert_int_eq(dst[0], src[0]);
    ck_assert_int_eq(dst[16], src[1 * 8]);        /* row 1 at 16 */
    ck_assert_int_eq(dst[4], src[32 * 8]);        /* row 32 at 4 */
    ck_assert_int_eq(dst[511], src[127 * 8 + 3]); /* last of tile 0 */
    qd_scales_unswizzle(back, dst, 128, 8);
    ck_assert(memcmp(src, back, sizeof src) == 0);
}
END_TEST

START_TEST(test_swizzle_padding_round_trip)
{
    const int64_t rows = 300, sc = 6; /* pads to 384 x 8: 3 row tiles of 2 column tiles */
    uint8_t *src = malloc(rows * sc), *back = malloc(rows * sc);
    size_t size = qd_scales_swizzled_size(rows, sc);
    ck_assert_uint_eq(size, 384 * 8);
    uint8_t *dst = malloc(size);
    memset(dst, 0xcd, size);
    for (int64_t i = 0; i < rows * sc; i++)
        src[i] = (uint8_t)(1 + i % 251);
    qd_scales_swizzle(dst, src, rows, sc);
    /* (130, 1): tile (1, 0) is the third 512-byte tile; inside it row 2 -> 2*16, col 1 */
    ck_assert_int_eq(dst[2 * 512 + 2 * 16 + 1], src[130 * sc + 1]);
    /* (299, 5): tile (2, 1) -> 5th tile; r%128 = 43: 11*16 + 1*4 + 1 */
    ck_assert_int_eq(dst[5 * 512 + 11 * 16 + 4 + 1], src[299 * sc + 5]);
    size_t zeros = 0;
    for (size_t i = 0; i < size; i++)
        zeros += dst[i] == 0;
    ck_assert_uint_eq(zeros, size - (size_t)(rows * sc)); /* padding is 0, data never is */
    qd_scales_unswizzle(back, dst, rows, sc);
    ck_assert(memcmp(src, back, (size_t)(rows * sc)) == 0);
    free(src), free(back), free(dst);
}
END_TEST

/* ---- the W4A4 product */

/* The canonical definition (§3) written out with the float codecs, elements in
 * order; with reversed, the blocks are summed in descending order instead, which
 * differs from it when the test data make the float32 sum order-sensitive. */
static float block_dot(const qd_nvfp4 *a, int64_t m, const qd_nvfp4 *w, int64_t n, int reversed)
{
    float acc = 0.0f;
    int64_t nb = a->cols / 16;
    for (int64_t k = 0; k < nb; k++) {
        int64_t b = reversed ? nb - 1 - k : k;
        float p = 0.0f;
        for (int i = 0; i < 16; i++)
            p = p + qd_e2m1_to_f32(code_at(a, m, b * 16 + i)) *
                    qd_e2m1_to_f32(code_at(w, n, b * 16 + i));
        acc = acc + p * (qd_e4m3_to_f32(a->scales[m * nb + b]) *
                         qd_e4m3_to_f32(w->scales[n * nb + b]));
    }
    return acc * (a->s_dec[a->per_row ? m : 0] * w->s_dec[w->per_row ? n : 0]);
}

/* Normal data with block magnitudes 2^-12..1: block scales span most of E4M3, so
 * the float32 block sum rounds and its order matters. */
static float *wide_matrix(int64_t rows, int64_t cols, uint64_t seed)
{
    float *x = normal_matrix(rows * cols, seed);
    for (int64_t b = 0; b < rows * cols / 16; b++) {
        float s = ldexpf(1.0f, -(int)(rng_next() % 13));
        for (int i = 0; i < 16; i++)
            x[b * 16 + i] *= s;
    }
    return x;
}

/* The same block-scaled sum in float64, and the sum of its terms' magnitudes. */
static double f64_dot(const qd_nvfp4 *a, int64_t m, const qd_nvfp4 *w, int64_t n, double *mag)
{
    double acc = 0.0, abs_acc = 0.0;
    int64_t nb = a->cols / 16;
    for (int64_t b = 0; b < nb; b++) {
        double p = 0.0;
        for (int i = 0; i < 16; i++)
            p += (double)qd_e2m1_to_f32(code_at(a, m, b * 16 + i)) *
                 (double)qd_e2m1_to_f32(code_at(w, n, b * 16 + i));
        double t = p * qd_e4m3_to_f32(a->scales[m * nb + b]) * qd_e4m3_to_f32(w->scales[n * nb + b]);
        acc += t;
        abs_acc += fabs(t);
    }
    double s = (double)a->s_dec[a->per_row ? m : 0] * (double)w->s_dec[w->per_row ? n : 0];
    *mag = abs_acc * s;
    return acc * s;
}

START_TEST(test_w4a4_gemm_vs_f64)
{
    const int64_t M = 13, N = 11, K = 512, nb = K / 16;
    float *xa = wide_matrix(M, K, 1), *xw = wide_matrix(N, K, 2), *y = malloc(sizeof(float) * M * N);
    for (int64_t i = 0; i < M * K; i++)
        xa[i] *= (float)(1 + i / K); /* rows of different loudness */
    int order_sensitive = 0;
    qd_nvfp4 a = quantized(xa, M, K, QD_SCALE_PER_ROW), w = quantized(xw, N, K, QD_SCALE_PER_TENSOR);
    ck_assert_int_eq(qd_w4a4_gemm(y, &a, &w), QD_OK);
    double worst = 0.0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            float yc = block_dot(&a, m, &w, n, 0);
            ck_assert_msg(qd_f32_bits(y[m * N + n]) == qd_f32_bits(yc), "y[%lld][%lld] bits",
                          (long long)m, (long long)n);
            order_sensitive += qd_f32_bits(block_dot(&a, m, &w, n, 1)) != qd_f32_bits(yc);
            double mag, yr = f64_dot(&a, m, &w, n, &mag);
            /* nb rounded adds + two final multiplies, each at most 2^-24 relative */
            double bound = (double)(nb + 2) * 0x1p-24 * mag;
            double e = fabs((double)y[m * N + n] - yr);
            ck_assert_msg(e <= bound, "|y - y64| = %g > %g", e, bound);
            worst = fmax(worst, e / mag);
        }
    ck_assert(worst > 0.0); /* the float32 sum really rounds: the test can tell */
    ck_assert_int_gt(order_sensitive, M * N / 4); /* and a wrong block order would show */
    qd_nvfp4 wrong;
    ck_assert_int_eq(qd_nvfp4_alloc(&wrong, 2, 32, QD_SCALE_PER_TENSOR), QD_OK);
    ck_assert_int_eq(qd_w4a4_gemm(y, &a, &wrong), QD_ERR_SHAPE);
    qd_nvfp4_free(&wrong), qd_nvfp4_free(&a), qd_nvfp4_free(&w);
    free(xa), free(xw), free(y);
}
END_TEST

START_TEST(test_w4a4_gemm_threads)
{
    const int64_t M = 37, N = 29, K = 1024;
    float *xa = wide_matrix(M, K, 3), *xw = wide_matrix(N, K, 4);
    qd_nvfp4 a = quantized(xa, M, K, QD_SCALE_PER_ROW), w = quantized(xw, N, K, QD_SCALE_PER_TENSOR);
    float *y[3];
    const int threads[3] = {1, 2, 4};
    for (int t = 0; t < 3; t++) {
        y[t] = malloc(sizeof(float) * M * N);
        set_threads(threads[t]);
        ck_assert_int_eq(qd_w4a4_gemm(y[t], &a, &w), QD_OK);
    }
    ck_assert(memcmp(y[0], y[1], sizeof(float) * M * N) == 0);
    ck_assert(memcmp(y[0], y[2], sizeof(float) * M * N) == 0);
    for (int t = 0; t < 3; t++)
        free(y[t]);
    qd_nvfp4_free(&a), qd_nvfp4_free(&w);
    free(xa), free(xw);
}
END_TEST

/* ---- FP8 */

START_TEST(test_fp8_quantize)
{
    const float x[8] = {1.0f, -2.0f, 0.5f, 4.0f, 0, 0, 0, -0.0f};
    uint8_t q[8];
    float sinv[2];
    ck_assert_int_eq(qd_fp8_quantize_rows(q, sinv, x, 2, 4), QD_OK);
    /* amax 4: scale 112; 112 = 1.75*2^6 -> 0x6e, -224 -> 0xf6, 56 -> 0x66, 448 -> 0x7e */
    ck_assert_int_eq(q[0], 0x6e);
    ck_assert_int_eq(q[1], 0xf6);
    ck_assert_int_eq(q[2], 0x66);
    ck_assert_int_eq(q[3], 0x7e);
    ck_assert(sinv[0] == 1.0f / 112.0f);
    ck_assert(sinv[1] == 1.0f); /* all-zero row: scale 1 */
    ck_assert_int_eq(q[4], 0x00);
    ck_assert_int_eq(q[7], 0x80);
    float out[8];
    qd_fp8_dequantize_rows(out, q, sinv, 2, 4);
    for (int i = 0; i < 8; i++)
        ck_assert(fabsf(out[i] - x[i]) <= 1e-6f * fabsf(x[i]));
    /* random data: relative error of E4M3 is at most 2^-4 per element */
    const int64_t R = 4, K = 256;
    float *xr = normal_matrix(R * K, 5), *dr = malloc(sizeof(float) * R * K);
    uint8_t *qr = malloc(R * K);
    ck_assert_int_eq(qd_fp8_quantize_rows(qr, sinv, xr, 2, 2 * K), QD_OK);
    qd_fp8_dequantize_rows(dr, qr, sinv, 2, 2 * K);
    for (int64_t i = 0; i < R * K; i++)
        ck_assert(fabsf(dr[i] - xr[i]) <= 0.0625f * fabsf(xr[i]) + 0x1p-10f * sinv[i / (2 * K)]);
    free(xr), free(dr), free(qr);
}
END_TEST

START_TEST(test_fp8_gemm)
{
    const int64_t M = 9, N = 7, K = 300;
    float *xa = normal_matrix(M * K, 6), *xw = normal_matrix(N * K, 7);
    uint8_t *qa = malloc(M * K), *qw = malloc(N * K);
    float sa[9], sw[7], y1[63], y4[63];
    ck_assert_int_eq(qd_fp8_quantize_rows(qa, sa, xa, M, K), QD_OK);
    ck_assert_int_eq(qd_fp8_quantize_rows(qw, sw, xw, N, K), QD_OK);
    set_threads(1);
    qd_fp8_gemm(y1, qa, sa, qw, sw, M, N, K);
    set_threads(4);
    qd_fp8_gemm(y4, qa, sa, qw, sw, M, N, K);
    ck_assert(memcmp(y1, y4, sizeof y1) == 0);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            float acc = 0.0f;
            double r = 0.0, mag = 0.0;
            for (int64_t k = 0; k < K; k++) {
                float pa = qd_e4m3_to_f32(qa[m * K + k]), pw = qd_e4m3_to_f32(qw[n * K + k]);
                acc = acc + pa * pw;
                r += (double)pa * pw;
                mag += fabs((double)pa * pw);
            }
            ck_assert(y1[m * N + n] == acc * (sa[m] * sw[n]));
            double s = (double)sa[m] * sw[n];
            ck_assert(fabs(y1[m * N + n] - r * s) <= (double)(K + 2) * 0x1p-24 * mag * s);
        }
    free(xa), free(xw), free(qa), free(qw);
}
END_TEST

/* ---- RAC */

START_TEST(test_rac_select)
{
    double err[64];
    int64_t ch[64];
    for (int i = 0; i < 64; i++)
        err[i] = (double)(i % 8); /* ties: channels 7, 15, ..., 63 share the top error */
    ck_assert_int_eq(qd_rac_select(ch, err, 64, 0.0), 0);
    ck_assert_int_eq(qd_rac_select(ch, err, 64, 0.2), 0);   /* 12.8 channels -> 0 blocks */
    ck_assert_int_eq(qd_rac_select(ch, err, 64, 0.25), 16);
    /* 8 channels of error 7 (7, 15, .., 63), then error 6: lowest indices 6, 14, .., 62 */
    for (int j = 0; j < 16; j++)
        ck_assert_int_eq(ch[j], j / 2 * 8 + (j % 2 ? 7 : 6));
    ck_assert_int_eq(qd_rac_select(ch, err, 64, 0.49), 16);
    ck_assert_int_eq(qd_rac_select(ch, err, 64, 1.0), 64);
    for (int j = 0; j < 64; j++)
        ck_assert_int_eq(ch[j], j);
    for (int i = 0; i < 64; i++)
        err[i] = 1.0; /* all tied: the lowest indices */
    ck_assert_int_eq(qd_rac_select(ch, err, 64, 0.5), 32);
    ck_assert_int_eq(ch[0], 0);
    ck_assert_int_eq(ch[31], 31);
    for (int i = 0; i < 64; i++)
        err[i] = i >= 40 ? 2.0 : 1.0; /* 24 channels of error 2, then 8 of the tied rest */
    ck_assert_int_eq(qd_rac_select(ch, err, 64, 0.5), 32);
    for (int j = 0; j < 32; j++)
        ck_assert_int_eq(ch[j], j < 8 ? j : 32 + j);
    double *err1600 = calloc(1600, sizeof(double));
    int64_t *ch1600 = malloc(1600 * sizeof(int64_t));
    /* 0.29*1600/16 is 28.999999999999996 in binary: still 29 blocks */
    ck_assert_int_eq(qd_rac_select(ch1600, err1600, 1600, 0.29), 464);
    free(err1600), free(ch1600);
    ck_assert_int_eq(qd_rac_select(ch, err, 64, 1.5), -1);
    ck_assert_int_eq(qd_rac_select(ch, err, 64, NAN), -1);
    err[3] = NAN;
    ck_assert_int_eq(qd_rac_select(ch, err, 64, 0.5), -1);
}
END_TEST

START_TEST(test_rac_error_accumulate)
{
    const int64_t R = 6, K = 48;
    float *x = normal_matrix(R * K, 8), *xh = malloc(sizeof(float) * R * K);
    for (int64_t r = 0; r < R; r++)
        x[r * K + 20] *= 50.0f; /* an outlier channel: its block's other channels suffer */
    double err[48] = {0}, want[48] = {0};
    ck_assert_int_eq(qd_rac_error_accumulate(err, x, R, K), QD_OK);
    ck_assert_int_eq(qd_rac_error_accumulate(err, x, R, K), QD_OK); /* accumulates with += */
    ck_assert_int_eq(qd_nvfp4_fake_quant(xh, x, R, K, QD_SCALE_PER_ROW), QD_OK);
    for (int64_t r = 0; r < R; r++)
        for (int64_t k = 0; k < K; k++) {
            double d = (double)(x[r * K + k] - xh[r * K + k]);
            want[k] += d * d;
        }
    for (int64_t k = 0; k < K; k++)
        ck_assert(fabs(err[k] - 2 * want[k]) <= 1e-12 * want[k]);
    free(x), free(xh);
}
END_TEST

/* Gathers r[S] = x[:, S] - x_hat[:, S] (rows, n). */
static float *residual(const float *x, const float *xh, int64_t R, int64_t K, const int64_t *ch, int64_t n)
{
    float *r = malloc(sizeof(float) * (size_t)(R * n));
    for (int64_t i = 0; i < R; i++)
        for (int64_t j = 0; j < n; j++)
            r[i * n + j] = x[i * K + ch[j]] - xh[i * K + ch[j]];
    return r;
}

/* The residual r (R, n) quantized with the main scope's S_enc (each row's
 * amax of x): the columns RAC appends after K. */
static qd_nvfp4 residual_quantized(const float *x, const float *r, int64_t R, int64_t K, int64_t n)
{
    float *s_enc = malloc(sizeof(float) * (size_t)R);
    ck_assert(s_enc != NULL);
    for (int64_t i = 0; i < R; i++) {
        float amax;
        ck_assert_int_eq(qd_amax(&amax, x + i * K, K), QD_OK);
        s_enc[i] = qd_nvfp4_s_enc(amax);
    }
    qd_nvfp4 rq;
    ck_assert_int_eq(qd_nvfp4_alloc(&rq, R, n, QD_SCALE_PER_ROW), QD_OK);
    ck_assert_int_eq(qd_nvfp4_quantize_with(&rq, r, s_enc), QD_OK);
    free(s_enc);
    return rq;
}

/* Copies columns [c0, c0+cols) of q into a new matrix (a view for the residual-only product). */
static qd_nvfp4 columns(const qd_nvfp4 *q, int64_t c0, int64_t cols)
{
    qd_nvfp4 o;
    ck_assert_int_eq(qd_nvfp4_alloc(&o, q->rows, cols, q->per_row), QD_OK);
    for (int64_t r = 0; r < q->rows; r++) {
        memcpy(o.codes + r * cols / 2, q->codes + r * q->cols / 2 + c0 / 2, (size_t)cols / 2);
        memcpy(o.scales + r * cols / 16, q->scales + r * q->cols / 16 + c0 / 16, (size_t)cols / 16);
    }
    memcpy(o.s_dec, q->s_dec, sizeof(float) * (size_t)(q->per_row ? q->rows : 1));
    return o;
}

/* qd_rac_fake_quant: x_hat off the channels, x_hat + dequant(quantize_with(
 * S_enc(x), r[S])) on them (one float add), x_hat alone for n = 0; with
 * every channel compensated it is far closer to x than x_hat. */
START_TEST(test_rac_fake_quant)
{
    const int64_t R = 5, K = 64, n = 16;
    float *x = normal_matrix(R * K, 12);
    for (int64_t i = 0; i < R; i++)
        x[i * K + 9] *= 40.0f; /* an outlier: its block's other channels lose precision */
    int64_t ch[64];
    for (int64_t j = 0; j < K; j++)
        ch[j] = j < n ? 2 * j + 1 : j;
    float *xh = malloc(sizeof(float) * R * K), *out = malloc(sizeof(float) * R * K), rh[5 * 16];
    ck_assert_int_eq(qd_nvfp4_fake_quant(xh, x, R, K, QD_SCALE_PER_ROW), QD_OK);
    ck_assert_int_eq(qd_rac_fake_quant(out, x, R, K, ch, 0), QD_OK);
    ck_assert(memcmp(out, xh, sizeof(float) * R * K) == 0);
    float *r = residual(x, xh, R, K, ch, n);
    qd_nvfp4 rq = residual_quantized(x, r, R, K, n);
    qd_nvfp4_dequantize(rh, &rq);
    ck_assert_int_eq(qd_rac_fake_quant(out, x, R, K, ch, n), QD_OK);
    int moved = 0;
    for (int64_t i = 0; i < R; i++)
        for (int64_t k = 0, j = 0; k < K; k++) {
            float want = xh[i * K + k];
            if (j < n && ch[j] == k)
                want = want + rh[i * n + j++];
            ck_assert_msg(memcmp(&out[i * K + k], &want, sizeof want) == 0, "row %lld channel %lld",
                          (long long)i, (long long)k);
            moved += out[i * K + k] != xh[i * K + k];
        }
    ck_assert_int_gt(moved, R * n / 2);
    for (int64_t j = 0; j < K; j++)
        ch[j] = j;
    ck_assert_int_eq(qd_rac_fake_quant(out, x, R, K, ch, K), QD_OK);
    double e_main = 0, e_rac = 0;
    for (int64_t i = 0; i < R * K; i++) {
        e_main += ((double)xh[i] - x[i]) * ((double)xh[i] - x[i]);
        e_rac += ((double)out[i] - x[i]) * ((double)out[i] - x[i]);
    }
    ck_assert_msg(e_rac < e_main / 16, "squared error %g with every channel compensated, %g without", e_rac,
                  e_main);
    ck_assert_int_eq(qd_rac_fake_quant(out, x, 0, K, ch, n), QD_OK);
    qd_nvfp4_free(&rq);
    free(x), free(xh), free(out), free(r);
}
END_TEST

/* The augmented rows are [quantize(x), quantize_with(S_enc(x), r[S])] bit for bit,
 * the augmented weight [quantize(W), W[:, S] with W's scale]. */
START_TEST(test_rac_augment_structure)
{
    const int64_t R = 4, N = 6, K = 128, n = 32;
    float *x = normal_matrix(R * K, 9), *w = normal_matrix(N * K, 10);
    int64_t ch[32];
    for (int64_t j = 0; j < n; j++)
        ch[j] = j * 4 + 1;
    qd_nvfp4 act, wt, base = quantized(x, R, K, QD_SCALE_PER_ROW), wbase = quantized(w, N, K, QD_SCALE_PER_TENSOR);
    ck_assert_int_eq(qd_nvfp4_alloc(&act, R, K + n, QD_SCALE_PER_ROW), QD_OK);
    ck_assert_int_eq(qd_nvfp4_alloc(&wt, N, K + n, QD_SCALE_PER_TENSOR), QD_OK);
    ck_assert_int_eq(qd_rac_augment_act(&act, x, R, K, ch, n), QD_OK);
    ck_assert_int_eq(qd_rac_augment_weight(&wt, w, N, K, ch, n), QD_OK);
    float *xh = malloc(sizeof(float) * R * K);
    qd_nvfp4_dequantize(xh, &base);
    float *r = residual(x, xh, R, K, ch, n);
    qd_nvfp4 rq = residual_quantized(x, r, R, K, n);
    qd_nvfp4 act_main = columns(&act, 0, K), act_res = columns(&act, K, n);
    ck_assert(memcmp(act_main.codes, base.codes, R * K / 2) == 0);
    ck_assert(memcmp(act_main.scales, base.scales, R * K / 16) == 0);
    ck_assert(memcmp(act.s_dec, base.s_dec, sizeof(float) * R) == 0);
    ck_assert(memcmp(act_res.codes, rq.codes, R * n / 2) == 0);
    ck_assert(memcmp(act_res.scales, rq.scales, R * n / 16) == 0);
    qd_nvfp4 wt_main = columns(&wt, 0, K);
    ck_assert(memcmp(wt_main.codes, wbase.codes, N * K / 2) == 0);
    ck_assert(memcmp(wt_main.scales, wbase.scales, N * K / 16) == 0);
    ck_assert(wt.s_dec[0] == wbase.s_dec[0]);
    /* the augmented product = main product + residual product, up to float32 rounding */
    qd_nvfp4 wt_res = columns(&wt, K, n);
    float y_aug[24], y_main[24], y_res[24];
    ck_assert_int_eq(qd_w4a4_gemm(y_aug, &act, &wt), QD_OK);
    ck_assert_int_eq(qd_w4a4_gemm(y_main, &base, &wbase), QD_OK);
    ck_assert_int_eq(qd_w4a4_gemm(y_res, &act_res, &wt_res), QD_OK);
    for (int i = 0; i < R * N; i++)
        ck_assert(fabsf(y_aug[i] - (y_main[i] + y_res[i])) <= 1e-5f * (fabsf(y_main[i]) + 1.0f));
    ck_assert_int_eq(qd_rac_augment_act(&act, x, R, K, ch, 16), QD_ERR_SHAPE);
    ch[0] = K;
    ck_assert_int_eq(qd_rac_augment_act(&act, x, R, K, ch, n), QD_ERR_ARG);
    qd_nvfp4 *all[] = {&act, &wt, &base, &wbase, &rq, &act_main, &act_res, &wt_main, &wt_res};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        qd_nvfp4_free(all[i]);
    free(x), free(w), free(xh), free(r);
}
END_TEST

/* Error of y against x . W_hat (float64), the weight error being common to both. */
static double act_error(const float *y, const float *x, const float *wh, int64_t M, int64_t N, int64_t K)
{
    double num = 0.0, den = 0.0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double ref = 0.0;
            for (int64_t k = 0; k < K; k++)
                ref += (double)x[m * K + k] * wh[n * K + k];
            num += (y[m * N + n] - ref) * (y[m * N + n] - ref);
            den += ref * ref;
        }
    return sqrt(num / den);
}

/* RAC at ratio 1 corrects every channel: the activation error drops by far; ratio 0
 * is naive NVFP4 bit for bit. */
START_TEST(test_rac_reduces_error)
{
    const int64_t M = 8, N = 16, K = 256;
    float *x = normal_matrix(M * K, 12), *w = normal_matrix(N * K, 13);
    float *wh = malloc(sizeof(float) * N * K), y_naive[128], y_rac[128], y0[128];
    qd_nvfp4 a = quantized(x, M, K, QD_SCALE_PER_ROW), wq = quantized(w, N, K, QD_SCALE_PER_TENSOR);
    qd_nvfp4 a_aug, w_aug, a0, w0;
    qd_nvfp4_dequantize(wh, &wq);
    double err[256] = {0};
    int64_t ch[256];
    ck_assert_int_eq(qd_rac_error_accumulate(err, x, M, K), QD_OK);
    int64_t n = qd_rac_select(ch, err, K, 1.0);
    ck_assert_int_eq(n, K);
    ck_assert_int_eq(qd_nvfp4_alloc(&a_aug, M, K + n, QD_SCALE_PER_ROW), QD_OK);
    ck_assert_int_eq(qd_nvfp4_alloc(&w_aug, N, K + n, QD_SCALE_PER_TENSOR), QD_OK);
    ck_assert_int_eq(qd_rac_augment_act(&a_aug, x, M, K, ch, n), QD_OK);
    ck_assert_int_eq(qd_rac_augment_weight(&w_aug, w, N, K, ch, n), QD_OK);
    ck_assert_int_eq(qd_w4a4_gemm(y_naive, &a, &wq), QD_OK);
    ck_assert_int_eq(qd_w4a4_gemm(y_rac, &a_aug, &w_aug), QD_OK);
    double e_naive = act_error(y_naive, x, wh, M, N, K), e_rac = act_error(y_rac, x, wh, M, N, K);
    ck_assert_msg(e_rac < 0.25 * e_naive, "RAC error %g vs naive %g", e_rac, e_naive);
    /* ratio 0: the augmented pair is the naive pair */
    ck_assert_int_eq(qd_rac_select(ch, err, K, 0.0), 0);
    ck_assert_int_eq(qd_nvfp4_alloc(&a0, M, K, QD_SCALE_PER_ROW), QD_OK);
    ck_assert_int_eq(qd_nvfp4_alloc(&w0, N, K, QD_SCALE_PER_TENSOR), QD_OK);
    ck_assert_int_eq(qd_rac_augment_act(&a0, x, M, K, ch, 0), QD_OK);
    ck_assert_int_eq(qd_rac_augment_weight(&w0, w, N, K, ch, 0), QD_OK);
    ck_assert_int_eq(qd_w4a4_gemm(y0, &a0, &w0), QD_OK);
    ck_assert(memcmp(y0, y_naive, sizeof y0) == 0);
    qd_nvfp4 *all[] = {&a, &wq, &a_aug, &w_aug, &a0, &w0};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        qd_nvfp4_free(all[i]);
    free(x), free(w), free(wh);
}
END_TEST

/* ---- fileio: atomic replacement and directories */

static char io_dir[64];

static void io_setup(void) { qd_test_mkdtemp(io_dir, sizeof io_dir, "fileio"); }

static void io_teardown(void) { qd_test_rm_tree(io_dir); }

static const char *io_path(const char *name) { return qd_test_join(io_dir, name); }

/* Entries of io_dir (a leftover temp file shows here). */
static int io_entries(void) { return qd_test_dir_entries(io_dir); }

START_TEST(test_atomic_write)
{
    const char *p = io_path("f.txt");
    ck_assert_int_eq(qd_atomic_write(p, "hello\n", 6), QD_OK);
    ck_assert_str_eq(qd_test_read_file(p), "hello\n");
    ck_assert_int_eq(qd_atomic_write(p, "bye", 3), QD_OK);
    ck_assert_str_eq(qd_test_read_file(p), "bye");
    struct stat sb;
    ck_assert_int_eq(stat(p, &sb), 0);
    ck_assert_int_eq(sb.st_mode & 0777, 0644); /* not mkstemp's 0600 */
    ck_assert_int_eq(io_entries(), 1);
    ck_assert_int_eq(qd_atomic_write(p, "", 0), QD_OK);
    ck_assert_int_eq(stat(p, &sb), 0);
    ck_assert_int_eq(sb.st_size, 0);
    /* a missing directory is an error, not created */
    ck_assert_int_eq(qd_atomic_write(io_path("no/such/dir/f"), "x", 1), QD_ERR_IO);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "no/such/dir/f"));
    ck_assert_int_eq(io_entries(), 1);
}
END_TEST

static qd_status fill_then_fail(FILE *f, const char *path, void *ctx)
{
    fputs("partial new content", f);
    return qd_error(QD_ERR_FORMAT, "%s: the fill gave up", path);
}

/* Writes, then reads from the write-only stream: the error flag is set while
 * the fill still says QD_OK. */
static qd_status fill_ignoring_error(FILE *f, const char *path, void *ctx)
{
    fputs("new", f);
    ck_assert_int_eq(getc(f), EOF);
    return QD_OK;
}

/* Writes a first try, truncates it and writes again (as a retried download does). */
static qd_status fill_with_retry(FILE *f, const char *path, void *ctx)
{
    fputs("first attempt, longer than the second", f);
    ck_assert_int_eq(fflush(f), 0);
    ck_assert_int_eq(ftruncate(fileno(f), 0), 0);
    ck_assert_int_eq(fseek(f, 0, SEEK_SET), 0);
    fputs((const char *)ctx, f);
    return QD_OK;
}

/* On every failure the old file is untouched and no temp file remains. */
START_TEST(test_atomic_write_with_failures)
{
    char p[256];
    snprintf(p, sizeof p, "%s", io_path("keep.txt"));
    ck_assert_int_eq(qd_atomic_write(p, "old", 3), QD_OK);
    ck_assert_int_eq(qd_atomic_write_with(p, fill_then_fail, NULL), QD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "keep.txt: the fill gave up"));
    ck_assert_str_eq(qd_test_read_file(p), "old");
    ck_assert_int_eq(io_entries(), 1);
    ck_assert_int_eq(qd_atomic_write_with(p, fill_ignoring_error, NULL), QD_ERR_IO);
    ck_assert_str_eq(qd_test_read_file(p), "old");
    ck_assert_int_eq(io_entries(), 1);
    /* the rename fails: the target is a directory */
    ck_assert_int_eq(mkdir(io_path("blocked"), 0755), 0);
    ck_assert_int_eq(qd_atomic_write(io_path("blocked"), "x", 1), QD_ERR_IO);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), io_path("blocked")));
    ck_assert_int_eq(io_entries(), 2);
    ck_assert_int_eq(qd_atomic_write_with(p, fill_with_retry, "second"), QD_OK);
    ck_assert_str_eq(qd_test_read_file(p), "second");
    ck_assert_int_eq(io_entries(), 2);
}
END_TEST

/* Larger than the first 64 KiB buffer, with NULs inside; empty; missing. */
START_TEST(test_read_file)
{
    enum { N = 200000 };
    char *data = malloc(N), *text;
    ck_assert_ptr_nonnull(data);
    for (int i = 0; i < N; i++)
        data[i] = (char)(i * 7 % 251);
    ck_assert_int_eq(qd_atomic_write(io_path("big"), data, N), QD_OK);
    size_t len;
    ck_assert_int_eq(qd_read_file(io_path("big"), &text, &len), QD_OK);
    ck_assert_uint_eq(len, N);
    ck_assert(memcmp(text, data, N) == 0);
    ck_assert_int_eq(text[N], '\0');
    free(text);
    free(data);
    ck_assert_int_eq(qd_atomic_write(io_path("empty"), "", 0), QD_OK);
    ck_assert_int_eq(qd_read_file(io_path("empty"), &text, &len), QD_OK);
    ck_assert_uint_eq(len, 0);
    ck_assert_str_eq(text, "");
    free(text);
    ck_assert_int_eq(qd_read_file(io_path("missing"), &text, &len), QD_ERR_IO);
    ck_assert_ptr_null(text);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "missing"));
}
END_TEST

START_TEST(test_path_parts)
{
    const char *cases[][3] = {/* path, dir, base */
        {"a/b/c.txt", "a/b", "c.txt"}, {"c.txt", ".", "c.txt"}, {"/c.txt", "/", "c.txt"},
        {"/a/b/", "/a/b", ""}, {"./x", ".", "x"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *dir = qd_path_dir(cases[i][0]);
        ck_assert_str_eq(dir, cases[i][1]);
        ck_assert_str_eq(qd_path_base(cases[i][0]), cases[i][2]);
        free(dir);
    }
    ck_assert_int_eq(qd_str_ends_with("model.safetensors", ".safetensors"), 1);
    ck_assert_int_eq(qd_str_ends_with("a.json", ".json"), 1);
    ck_assert_int_eq(qd_str_ends_with("a.json.bak", ".json"), 0);
    ck_assert_int_eq(qd_str_ends_with("json", ".json"), 0); /* suffix longer than s */
    ck_assert_int_eq(qd_str_ends_with("x", ""), 1);
    ck_assert_int_eq(qd_str_ends_with("", "x"), 0);
}
END_TEST

START_TEST(test_mkdirs)
{
    struct stat sb;
    ck_assert_int_eq(qd_mkdirs(io_path("a/b/c")), QD_OK);
    ck_assert_int_eq(stat(io_path("a/b/c"), &sb), 0);
    ck_assert(S_ISDIR(sb.st_mode));
    ck_assert_int_eq(qd_mkdirs(io_path("a/b/c")), QD_OK); /* existing is fine */
    ck_assert_int_eq(qd_mkdirs(io_path("a/b/c/")), QD_OK);
    ck_assert_int_eq(qd_mkdirs(""), QD_ERR_ARG);
    ck_assert_int_eq(qd_atomic_write(io_path("file"), "x", 1), QD_OK);
    ck_assert_int_eq(qd_mkdirs(io_path("file")), QD_ERR_IO); /* a file, not a directory */
    ck_assert_int_eq(qd_mkdirs(io_path("file/sub")), QD_ERR_IO);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "file/sub"));
    /* the parent of a file path, not the file itself */
    ck_assert_int_eq(qd_mkdirs_parent(io_path("p/q/data.jsonl")), QD_OK);
    ck_assert_int_eq(stat(io_path("p/q"), &sb), 0);
    ck_assert(S_ISDIR(sb.st_mode));
    ck_assert_int_eq(access(io_path("p/q/data.jsonl"), F_OK), -1);
    ck_assert_int_eq(qd_mkdirs_parent("bare_name"), QD_OK);
    ck_assert_int_eq(qd_mkdirs_parent("/"), QD_OK);
    ck_assert_int_eq(qd_fsync_dir(io_dir), QD_OK);
    ck_assert_int_eq(qd_fsync_dir(io_path("missing")), QD_ERR_IO);
}
END_TEST

Suite *suite_quant(void)
{
    Suite *s = suite_create("quant");
    TCase *codecs = tcase_create("codecs");
    tcase_add_test(codecs, test_e2m1_boundaries);
    tcase_add_test(codecs, test_e4m3_boundaries);
    tcase_add_test(codecs, test_bf16_all_patterns);
    tcase_add_test(codecs, test_bf16_rounding);
    tcase_add_test(codecs, test_f32_random_encoders);
    tcase_add_test(codecs, test_rn_twins);
    suite_add_tcase(s, codecs);
    TCase *nvfp4 = tcase_create("nvfp4");
    tcase_add_test(nvfp4, test_golden_vectors);
    tcase_add_test(nvfp4, test_h16_operands);
    tcase_add_test(nvfp4, test_h16_block_algebra);
    tcase_add_test(nvfp4, test_nvfp4_zero_tensor);
    tcase_add_test(nvfp4, test_nvfp4_zero_block_and_saturation);
    tcase_add_test(nvfp4, test_nvfp4_quantize_with_saturates);
    tcase_add_test(nvfp4, test_nvfp4_tiny_and_huge_scales);
    tcase_add_test(nvfp4, test_nvfp4_nonfinite);
    tcase_add_test(nvfp4, test_first_nonfinite);
    tcase_add_test(nvfp4, test_nvfp4_per_row_and_fake_quant);
    tcase_add_test(nvfp4, test_swizzle_positions);
    tcase_add_test(nvfp4, test_swizzle_padding_round_trip);
    suite_add_tcase(s, nvfp4);
    TCase *gemm = tcase_create("gemm");
    tcase_add_test(gemm, test_w4a4_gemm_vs_f64);
    tcase_add_test(gemm, test_w4a4_gemm_threads);
    tcase_add_test(gemm, test_fp8_quantize);
    tcase_add_test(gemm, test_fp8_gemm);
    tcase_set_timeout(gemm, 60);
    suite_add_tcase(s, gemm);
    TCase *rac = tcase_create("rac");
    tcase_add_test(rac, test_rac_select);
    tcase_add_test(rac, test_rac_error_accumulate);
    tcase_add_test(rac, test_rac_augment_structure);
    tcase_add_test(rac, test_rac_fake_quant);
    tcase_add_test(rac, test_rac_reduces_error);
    suite_add_tcase(s, rac);
    TCase *io = tcase_create("fileio");
    tcase_add_checked_fixture(io, io_setup, io_teardown);
    tcase_add_test(io, test_atomic_write);
    tcase_add_test(io, test_atomic_write_with_failures);
    tcase_add_test(io, test_read_file);
    tcase_add_test(io, test_path_parts);
    tcase_add_test(io, test_mkdirs);
    suite_add_tcase(s, io);
    return s;
}
