/* Bit-exactness of backends/cuda against the CPU reference quant/ (docs/numerics.md
 * §1-§5), on a machine with a GPU. Standalone (Check does not run there):
 *
 *     tests/gpu/check_quant [ROWS] [GOLDEN]
 *
 * ROWS (default 4096) is the rows of each random (ROWS, 4096) tensor: at 4096 the
 * quantizers see 7 distributions x 2^24 values each (over 10^8); GOLDEN is
 * tests/fixtures/nvfp4_golden.bin, the numpy + ml_dtypes vectors.
 * Prints one table (op, distribution, count, mismatches, bits equal) and exits
 * non-zero on any mismatch or on a non-finite input that raised no error. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>
#include "backends/cuda/cuda_die.h"
#include "backends/cuda/cuda_quant.h"
#include "quant/splitmix64.h"

#define K_COLS 4096

static int failures;

/* ---- one row of the table */
static void report(const char *op, const char *dist, long long count, long long bad)
{
    printf("| %-22s | %-14s | %12lld | %10lld | %-3s |\n", op, dist, count, bad, bad ? "NO" : "yes");
    fflush(stdout);
    if (bad)
        failures++;
}

/* Elements of size sz that differ between a and b (bitwise). */
static long long diff(const void *a, const void *b, size_t n, size_t sz)
{
    const unsigned char *p = (const unsigned char *)a, *q = (const unsigned char *)b;
    long long bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += memcmp(p + i * sz, q + i * sz, sz) != 0;
    return bad;
}

/* ---- random numbers: splitmix64 */
static uint64_t rng_state = 0x5eed1234abcdULL;
static uint64_t rnd(void) { return qd_splitmix64_next(&rng_state); }
static double unif(void) { return qd_splitmix64_unit(&rng_state); }
static int64_t below(int64_t n) { return (int64_t)(rnd() % (uint64_t)n); }
static double normal(void)
{
    double u = unif(), v = unif();
    return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}
static float sgn(float v) { return (rnd() & 1) ? -v : v; }

/* ---- the distributions: x (rows, K_COLS) */
static void fill_normal(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)normal();
}

/* log-normal magnitudes: values over ~15 decades in one tensor */
static void fill_heavy(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(normal() * exp(3.0 * normal()));
}

/* subnormal and tiny normal floats, block by block */
static void fill_tiny(float *x, int64_t n)
{
    for (int64_t b = 0; b < n / 16; b++) {
        double s = ldexp(1.0, -149 + (int)below(50));
        for (int i = 0; i < 16; i++)
            x[b * 16 + i] = (float)(normal() * s);
    }
}

/* up to FLT_MAX */
static void fill_huge(float *x, int64_t n)
{
    for (int64_t b = 0; b < n / 16; b++) {
        double s = ldexp(1.0, 90 + (int)below(37));
        for (int i = 0; i < 16; i++) {
            double v = normal() * s;
            x[b * 16 + i] = (float)(fabs(v) < 3.0e38 ? v : (v < 0 ? -3.0e38 : 3.0e38));
        }
        if (below(64) == 0)
            x[b * 16 + below(16)] = sgn(FLT_MAX);
    }
}

/* half the blocks zero (+0 or -0), a twentieth of the rows all zero */
static void fill_zero_blocks(float *x, int64_t rows)
{
    fill_normal(x, rows * K_COLS);
    for (int64_t r = 0; r < rows; r++) {
        int zrow = below(20) == 0;
        for (int64_t b = 0; b < K_COLS / 16; b++)
            if (zrow || (rnd() & 1))
                for (int i = 0; i < 16; i++)
                    x[r * K_COLS + b * 16 + i] = (rnd() & 1) ? -0.0f : 0.0f;
    }
}

/* Exact ties of both encoders: every row's amax is 2688, so S_enc = S_dec = 1;
 * a block with amax 6*2^e has scale 2^e and its values land exactly on E2M1
 * grid points and midpoints; some blocks put amax/6 on an E4M3 midpoint. */
static void fill_ties(float *x, int64_t rows)
{
    static const float pts[15] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 0.0f,
                                  0.5f,  1.0f,  1.5f,  2.0f,  3.0f, 4.0f, 6.0f};
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < K_COLS / 16; b++) {
            float *blk = x + r * K_COLS + b * 16;
            float s = ldexpf(1.0f, -9 + (int)below(18));
            for (int i = 0; i < 16; i++)
                blk[i] = sgn(pts[below(15)] * s);
            blk[below(16)] = sgn(6.0f * s);
            if (below(4) == 0) /* amax/6 halfway between two E4M3 values */
                blk[below(16)] = sgn(6.0f * s * (1.0f + (float)(2 * below(8) + 1) / 16.0f));
        }
    for (int64_t r = 0; r < rows; r++)
        x[r * K_COLS + below(K_COLS)] = sgn(2688.0f);
}

/* -0.0, tiny negatives that round to a negative zero code, and normals */
static void fill_negzero(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        int64_t k = below(10);
        x[i] = k < 3 ? -0.0f : (k < 5 ? (float)(-1e-3 * fabs(normal())) : (float)normal());
    }
}

static const char *const dist_names[] = {"normal", "heavy-tailed", "tiny", "huge",
                                         "zero-blocks", "exact-ties", "-0.0"};
#define NDIST 7

static void fill(int d, float *x, int64_t rows)
{
    int64_t n = rows * K_COLS;
    switch (d) {
    case 0: fill_normal(x, n); break;
    case 1: fill_heavy(x, n); break;
    case 2: fill_tiny(x, n); break;
    case 3: fill_huge(x, n); break;
    case 4: fill_zero_blocks(x, rows); break;
    case 5: fill_ties(x, rows); break;
    default: fill_negzero(x, n); break;
    }
}

/* ---- device helpers */
template <typename T>
static T *to_dev(const T *h, size_t n)
{
    T *d;
    QD_CUDA_DIE(cudaMalloc((void **)&d, (n ? n : 1) * sizeof(T)));
    QD_CUDA_DIE(cudaMemcpy(d, h, n * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

template <typename T>
static std::vector<T> to_host(const T *d, size_t n)
{
    std::vector<T> h(n);
    QD_CUDA_DIE(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

/* Mismatched codes + scales + decode scales of a device matrix against a host one. */
static long long diff_nvfp4(const qd_nvfp4 *g, const qd_nvfp4 *c)
{
    size_t nc = (size_t)(c->rows * c->cols / 2), ns = (size_t)(c->rows * c->cols / 16);
    size_t nd = (size_t)(c->per_row ? c->rows : 1);
    std::vector<uint8_t> gc = to_host(g->codes, nc), gs = to_host(g->scales, ns);
    std::vector<float> gd = to_host(g->s_dec, nd);
    return diff(gc.data(), c->codes, nc, 1) + diff(gs.data(), c->scales, ns, 1) +
           diff(gd.data(), c->s_dec, nd, 4);
}

/* A host qd_nvfp4 copied to the device. */
static qd_nvfp4 nvfp4_to_dev(const qd_nvfp4 *c)
{
    qd_nvfp4 g;
    QD_STATUS_DIE(qd_cuda_nvfp4_alloc(&g, c->rows, c->cols, c->per_row));
    QD_CUDA_DIE(cudaMemcpy(g.codes, c->codes, (size_t)(c->rows * c->cols / 2), cudaMemcpyHostToDevice));
    QD_CUDA_DIE(cudaMemcpy(g.scales, c->scales, (size_t)(c->rows * c->cols / 16), cudaMemcpyHostToDevice));
    QD_CUDA_DIE(cudaMemcpy(g.s_dec, c->s_dec, sizeof(float) * (size_t)(c->per_row ? c->rows : 1),
                        cudaMemcpyHostToDevice));
    return g;
}

/* ---- the ops, one distribution's tensor x (rows, K) at a time */

/* quantize (per tensor / per row), dequantize, fake-quant. */
static void check_quantize(const char *dist, const float *x, const float *dx, int64_t rows,
                           int64_t K, qd_scale_kind per_row)
{
    qd_nvfp4 c, g;
    int64_t n = rows * K;
    QD_STATUS_DIE(qd_nvfp4_alloc(&c, rows, K, per_row));
    QD_STATUS_DIE(qd_cuda_nvfp4_alloc(&g, rows, K, per_row));
    QD_STATUS_DIE(qd_nvfp4_quantize(&c, x));
    QD_STATUS_DIE(qd_cuda_nvfp4_quantize(&g, dx));
    report(per_row ? "quantize per-row" : "quantize per-tensor", dist, n, diff_nvfp4(&g, &c));

    std::vector<float> cd((size_t)n);
    float *gd;
    QD_CUDA_DIE(cudaMalloc((void **)&gd, (size_t)n * sizeof(float)));
    qd_nvfp4_dequantize(cd.data(), &c);
    QD_STATUS_DIE(qd_cuda_nvfp4_dequantize(gd, &g));
    report(per_row ? "dequantize per-row" : "dequantize per-tensor", dist, n,
           diff(to_host(gd, (size_t)n).data(), cd.data(), (size_t)n, 4));

    QD_STATUS_DIE(qd_nvfp4_fake_quant(cd.data(), x, rows, K, per_row));
    QD_STATUS_DIE(qd_cuda_nvfp4_fake_quant(gd, dx, rows, K, per_row));
    report(per_row ? "fake-quant per-row" : "fake-quant per-tensor", dist, n,
           diff(to_host(gd, (size_t)n).data(), cd.data(), (size_t)n, 4));
    cudaFree(gd);
    qd_nvfp4_free(&c);
    qd_cuda_nvfp4_free(&g);
}

static void check_fp8(const char *dist, const float *x, const float *dx, int64_t rows, int64_t K)
{
    int64_t n = rows * K;
    std::vector<uint8_t> cq((size_t)n);
    std::vector<float> cs((size_t)rows);
    uint8_t *gq;
    float *gs;
    QD_CUDA_DIE(cudaMalloc((void **)&gq, (size_t)n));
    QD_CUDA_DIE(cudaMalloc((void **)&gs, (size_t)rows * sizeof(float)));
    QD_STATUS_DIE(qd_fp8_quantize_rows(cq.data(), cs.data(), x, rows, K));
    QD_STATUS_DIE(qd_cuda_fp8_quantize_rows(gq, gs, dx, rows, K));
    report("fp8 quantize per-row", dist, n,
           diff(to_host(gq, (size_t)n).data(), cq.data(), (size_t)n, 1) +
               diff(to_host(gs, (size_t)rows).data(), cs.data(), (size_t)rows, 4));
    cudaFree(gq);
    cudaFree(gs);
}

/* n random distinct channels of K, ascending (as qd_rac_select returns them). */
static std::vector<int64_t> random_channels(int64_t K, int64_t n)
{
    std::vector<int64_t> all((size_t)K), ch;
    for (int64_t i = 0; i < K; i++)
        all[(size_t)i] = i;
    for (int64_t i = 0; i < n; i++)
        std::swap(all[(size_t)i], all[(size_t)(i + below(K - i))]);
    ch.assign(all.begin(), all.begin() + n);
    std::sort(ch.begin(), ch.end());
    return ch;
}

static void check_rac(const char *dist, const float *x, const float *dx, int64_t rows, int64_t K)
{
    int64_t n = K / 8;
    std::vector<int64_t> ch = random_channels(K, n);
    int64_t *dch = to_dev(ch.data(), ch.size());
    for (int w = 0; w < 3; w++) { /* act per row, act per tensor, weight (per tensor) */
        qd_nvfp4 c, g;
        qd_scale_kind per_row = w == 0 ? QD_SCALE_PER_ROW : QD_SCALE_PER_TENSOR;
        QD_STATUS_DIE(qd_nvfp4_alloc(&c, rows, K + n, per_row));
        QD_STATUS_DIE(qd_cuda_nvfp4_alloc(&g, rows, K + n, per_row));
        if (w == 2) {
            QD_STATUS_DIE(qd_rac_augment_weight(&c, x, rows, K, ch.data(), n));
            QD_STATUS_DIE(qd_cuda_rac_augment_weight(&g, dx, rows, K, dch, n));
        } else {
            QD_STATUS_DIE(qd_rac_augment_act(&c, x, rows, K, ch.data(), n));
            QD_STATUS_DIE(qd_cuda_rac_augment_act(&g, dx, rows, K, dch, n));
        }
        report(w == 2 ? "RAC augment weight" : w ? "RAC augment act p-t" : "RAC augment act", dist,
               rows * (K + n), diff_nvfp4(&g, &c));
        qd_nvfp4_free(&c);
        qd_cuda_nvfp4_free(&g);
    }
    cudaFree(dch);
}

static void check_distribution(int d, int64_t rows)
{
    int64_t n = rows * K_COLS;
    std::vector<float> x((size_t)n);
    fill(d, x.data(), rows);
    float *dx = to_dev(x.data(), (size_t)n);
    check_quantize(dist_names[d], x.data(), dx, rows, K_COLS, QD_SCALE_PER_TENSOR);
    check_quantize(dist_names[d], x.data(), dx, rows, K_COLS, QD_SCALE_PER_ROW);
    check_fp8(dist_names[d], x.data(), dx, rows, K_COLS);
    check_rac(dist_names[d], x.data(), dx, rows / 4, K_COLS);
    cudaFree(dx);
}

/* ---- every finite BF16 pattern */

/* The 65280 finite BF16 patterns as floats, in pattern order. */
static std::vector<float> finite_bf16(std::vector<uint16_t> *bits)
{
    std::vector<float> v;
    for (uint32_t h = 0; h < 65536; h++)
        if (((h >> 7) & 0xffu) != 0xffu) {
            v.push_back(qd_bf16_to_f32((uint16_t)h));
            bits->push_back((uint16_t)h);
        }
    return v;
}

/* quantize from float and from BF16 against the CPU, x (rows, cols). */
static void check_bf16_case(const char *name, const std::vector<float> &x,
                            const std::vector<uint16_t> &bits, int64_t rows, int64_t cols,
                            qd_scale_kind per_row)
{
    qd_nvfp4 c, g, gb;
    float *dx = to_dev(x.data(), x.size());
    uint16_t *dbits = to_dev(bits.data(), bits.size());
    QD_STATUS_DIE(qd_nvfp4_alloc(&c, rows, cols, per_row));
    QD_STATUS_DIE(qd_cuda_nvfp4_alloc(&g, rows, cols, per_row));
    QD_STATUS_DIE(qd_cuda_nvfp4_alloc(&gb, rows, cols, per_row));
    QD_STATUS_DIE(qd_nvfp4_quantize(&c, x.data()));
    QD_STATUS_DIE(qd_cuda_nvfp4_quantize(&g, dx));
    QD_STATUS_DIE(qd_cuda_nvfp4_quantize_bf16(&gb, dbits));
    char op[64];
    snprintf(op, sizeof op, "quantize %s", per_row ? "per-row" : "per-tensor");
    report(op, name, rows * cols, diff_nvfp4(&g, &c));
    snprintf(op, sizeof op, "quantize bf16-in %s", per_row ? "per-row" : "per-tensor");
    report(op, name, rows * cols, diff_nvfp4(&gb, &c));

    std::vector<float> cf(x.size());
    float *gf;
    QD_CUDA_DIE(cudaMalloc((void **)&gf, x.size() * sizeof(float)));
    QD_STATUS_DIE(qd_nvfp4_fake_quant(cf.data(), x.data(), rows, cols, per_row));
    QD_STATUS_DIE(qd_cuda_nvfp4_fake_quant(gf, dx, rows, cols, per_row));
    report(per_row ? "fake-quant per-row" : "fake-quant per-tensor", name, rows * cols,
           diff(to_host(gf, x.size()).data(), cf.data(), x.size(), 4));
    cudaFree(gf);
    cudaFree(dx);
    cudaFree(dbits);
    qd_nvfp4_free(&c);
    qd_cuda_nvfp4_free(&g);
    qd_cuda_nvfp4_free(&gb);
}

static void check_all_bf16(void)
{
    std::vector<uint16_t> bits;
    std::vector<float> x = finite_bf16(&bits);
    int64_t n = (int64_t)x.size(); /* 65280 = 4080 blocks */
    check_bf16_case("bf16 all, in order", x, bits, n / 256, 256, QD_SCALE_PER_TENSOR);
    check_bf16_case("bf16 all, in order", x, bits, n / 16, 16, QD_SCALE_PER_ROW);
    /* shuffled: each pattern among random neighbours */
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = below(i + 1);
        std::swap(x[(size_t)i], x[(size_t)j]);
        std::swap(bits[(size_t)i], bits[(size_t)j]);
    }
    check_bf16_case("bf16 all, shuffled", x, bits, n / 16, 16, QD_SCALE_PER_ROW);
    check_bf16_case("bf16 all, shuffled", x, bits, n / 256, 256, QD_SCALE_PER_TENSOR);
    /* alone: each pattern the only non-zero of its block, so it sets both scales */
    std::vector<float> xs((size_t)n * 16, 0.0f);
    std::vector<uint16_t> bs((size_t)n * 16, 0);
    for (int64_t i = 0; i < n; i++) {
        xs[(size_t)(i * 16 + i % 16)] = x[(size_t)i];
        bs[(size_t)(i * 16 + i % 16)] = bits[(size_t)i];
    }
    check_bf16_case("bf16 all, alone", xs, bs, n, 16, QD_SCALE_PER_ROW);
    /* FP8 of every finite pattern, 16 a row */
    float *dx = to_dev(x.data(), x.size());
    check_fp8("bf16 all", x.data(), dx, n / 16, 16);
    cudaFree(dx);
}

/* ---- the quantizer at the benchmark's shapes (bench/bench_quant.cu) and at the
 * edges of its kernels' layouts: odd row counts, rows of 1 block and of more
 * blocks than a CTA holds in registers (1024), per tensor and per row, from
 * float32 and from BF16, and fake-quant */

/* One NVFP4 block of the shape tests, its kind by the block's hash: exact ties
 * (E2M1 points and midpoints times 2^e, amax 6 * 2^e, so with S_enc = 1 the
 * scale is 2^e and every product lands on a point or a midpoint), normals over
 * 2^-30 .. 2^10, all zero (either sign), values near 2^-140 (the block scale
 * E4M3-subnormal or zero), BF16-exact normals. Each row holds one 2688, so
 * S_enc = 1 per row and per tensor and the ties stay exact. */
static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static float unit(uint64_t h) { return (float)((h >> 40) & 0xffffff) / 16777216.0f; } /* [0, 1) */

static void fill_block(float *b, uint64_t blk)
{
    static const float pts[15] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 0.0f,
                                  0.5f,  1.0f,  1.5f,  2.0f,  3.0f, 4.0f, 6.0f};
    uint64_t h = mix(blk * 0x9e3779b97f4a7c15ULL + 1);
    int kind = (int)(h % 10), e = (int)((h >> 8) % 40) - 30;
    for (int i = 0; i < 16; i++) {
        uint64_t g = mix(h + (uint64_t)i);
        float sgn = (g >> 63) ? -1.0f : 1.0f, u = unit(g);
        switch (kind) {
        case 0: case 1: /* ties */
            b[i] = sgn * ldexpf(pts[g % 15], e % 18 - 9);
            break;
        case 2: /* zeros */
            b[i] = sgn * 0.0f;
            break;
        case 3: /* tiny */
            b[i] = sgn * ldexpf(u, -140 + (int)(g % 16));
            break;
        default: /* normals over 40 binades; some BF16-exact */
            b[i] = sgn * ldexpf(1.0f + u, e);
            if (kind == 9)
                b[i] = qd_round_bf16(b[i]);
            break;
        }
    }
    if (kind < 2)
        b[(h >> 20) % 16] = ((h >> 30) & 1 ? -6.0f : 6.0f) * ldexpf(1.0f, e % 18 - 9);
}

static void fill_shape(float *x, int64_t rows, int64_t cols)
{
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < cols / 16; b++)
            fill_block(x + r * cols + b * 16, (uint64_t)(r * (cols / 16) + b));
        x[r * cols + (int64_t)(mix((uint64_t)r) % (uint64_t)cols)] = (r & 1) ? -2688.0f : 2688.0f;
    }
}

/* quantize (float32 and BF16 in) and fake-quant of one shape, both scopes. */
static void check_shape(int64_t rows, int64_t cols)
{
    size_t n = (size_t)(rows * cols);
    std::vector<float> x(n);
    std::vector<uint16_t> xb(n);
    fill_shape(x.data(), rows, cols);
    char name[64];
    snprintf(name, sizeof name, "%lld x %lld", (long long)rows, (long long)cols);
    float *dx = to_dev(x.data(), n), *dout;
    QD_CUDA_DIE(cudaMalloc((void **)&dout, n * sizeof(float)));
    for (qd_scale_kind per_row : {QD_SCALE_PER_TENSOR, QD_SCALE_PER_ROW}) {
        qd_nvfp4 c, g;
        QD_STATUS_DIE(qd_nvfp4_alloc(&c, rows, cols, per_row));
        QD_STATUS_DIE(qd_cuda_nvfp4_alloc(&g, rows, cols, per_row));
        QD_STATUS_DIE(qd_nvfp4_quantize(&c, x.data()));
        QD_STATUS_DIE(qd_cuda_nvfp4_quantize(&g, dx));
        report(per_row ? "quantize per-row" : "quantize per-tensor", name, (long long)n, diff_nvfp4(&g, &c));
        std::vector<float> cf(n);
        qd_nvfp4_dequantize(cf.data(), &c);
        QD_STATUS_DIE(qd_cuda_nvfp4_fake_quant(dout, dx, rows, cols, per_row));
        report(per_row ? "fake-quant per-row" : "fake-quant per-tensor", name, (long long)n,
               diff(to_host(dout, n).data(), cf.data(), n, 4));
        /* BF16 in: the CPU quantizes the rounded floats */
        for (size_t i = 0; i < n; i++) {
            xb[i] = qd_bf16_from_f32(x[i]);
            cf[i] = qd_bf16_to_f32(xb[i]);
        }
        QD_STATUS_DIE(qd_nvfp4_quantize(&c, cf.data()));
        uint16_t *dxb = to_dev(xb.data(), n);
        QD_STATUS_DIE(qd_cuda_nvfp4_quantize_bf16(&g, dxb));
        report(per_row ? "quantize bf16-in per-row" : "quantize bf16-in per-tensor", name, (long long)n,
               diff_nvfp4(&g, &c));
        cudaFree(dxb);
        qd_nvfp4_free(&c);
        qd_cuda_nvfp4_free(&g);
    }
    cudaFree(dx);
    cudaFree(dout);
}

static void check_shapes(int big)
{
    static const int64_t shapes[][2] = {
        {2048, 768}, {4096, 14336}, {151936, 2048}, /* bench_quant's: expert, FFN, lm_head */
        {1, 16},     {3, 48},       {37, 2064},     /* odd rows, 129 blocks a row */
        {5, 16400},  {2, 65536},    {1000, 64},     /* 1025 and 4096 blocks a row: read twice */
        {333, 4112},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (big || shapes[i][0] * shapes[i][1] <= ((int64_t)1 << 26))
            check_shape(shapes[i][0], shapes[i][1]);
}

/* ---- the branch-free encoders (quant/numerics.h's twins) on every float */
__global__ void rn_twins_kernel(unsigned long long *bad, uint32_t hi)
{
    unsigned long long n = 0;
    for (uint32_t lo = blockIdx.x * blockDim.x + threadIdx.x; lo < 65536u; lo += gridDim.x * blockDim.x) {
        uint32_t u = hi << 16 | lo;
        float v = __uint_as_float(u), a = fabsf(v), val;
        if (v != v)
            continue;
        n += (qd_e2m1_index_rn(v) | ((u >> 28) & 8u)) != qd_e2m1_from_f32(v);
        if (a <= QD_E4M3_MAX) {
            uint8_t c = qd_e4m3_scale_rn(a, &val);
            n += c != qd_e4m3_from_f32(a) || __float_as_uint(val) != __float_as_uint(qd_e4m3_to_f32(c));
        }
    }
    if (n)
        atomicAdd(bad, n);
}

static void check_rn_twins(void)
{
    unsigned long long *dbad, bad = 0;
    QD_CUDA_DIE(cudaMalloc((void **)&dbad, sizeof bad));
    QD_CUDA_DIE(cudaMemset(dbad, 0, sizeof bad));
    for (uint32_t hi = 0; hi < 65536u; hi++)
        rn_twins_kernel<<<64, 256>>>(dbad, hi);
    QD_CUDA_DIE(cudaMemcpy(&bad, dbad, sizeof bad, cudaMemcpyDeviceToHost));
    cudaFree(dbad);
    report("e2m1/e4m3 rn encoders", "all 2^32 floats", 1LL << 32, (long long)bad);
}

/* ---- the canonical W4A4 product */

static void quantize_host(qd_nvfp4 *q, int d, int64_t rows, int64_t K, qd_scale_kind per_row)
{
    std::vector<float> x((size_t)(rows * K));
    if (K == K_COLS) {
        fill(d, x.data(), rows);
    } else {
        for (auto &v : x)
            v = (float)(d == 1 ? normal() * exp(3.0 * normal()) : normal());
    }
    QD_STATUS_DIE(qd_nvfp4_alloc(q, rows, K, per_row));
    QD_STATUS_DIE(qd_nvfp4_quantize(q, x.data()));
}

static void check_gemm_case(int64_t M, int64_t N, int64_t K, int da, int dw, qd_scale_kind w_per_row)
{
    qd_nvfp4 a, w;
    quantize_host(&a, da, M, K, QD_SCALE_PER_ROW);
    quantize_host(&w, dw, N, K, w_per_row);
    qd_nvfp4 ga = nvfp4_to_dev(&a), gw = nvfp4_to_dev(&w);
    std::vector<float> cy((size_t)(M * N));
    float *gy;
    QD_CUDA_DIE(cudaMalloc((void **)&gy, cy.size() * sizeof(float)));
    QD_STATUS_DIE(qd_w4a4_gemm(cy.data(), &a, &w));
    QD_STATUS_DIE(qd_cuda_w4a4_gemm(gy, &ga, &gw));
    char op[64], dist[64];
    snprintf(op, sizeof op, "W4A4 %lldx%lldx%lld", (long long)M, (long long)N, (long long)K);
    snprintf(dist, sizeof dist, "A %s W %s%s", da == 1 ? "heavy" : "norm", dw == 2 ? "tiny" : "norm",
             w_per_row ? " pr" : "");
    report(op, dist, M * N, diff(to_host(gy, cy.size()).data(), cy.data(), cy.size(), 4));
    QD_CUDA_DIE(cudaMemset(gy, 0xff, cy.size() * sizeof(float)));
    QD_STATUS_DIE(qd_cuda_w4a4_gemm_tc(gy, &ga, &gw));
    snprintf(op, sizeof op, "W4A4-TC %lldx%lldx%lld", (long long)M, (long long)N, (long long)K);
    report(op, dist, M * N, diff(to_host(gy, cy.size()).data(), cy.data(), cy.size(), 4));
    cudaFree(gy);
    qd_cuda_nvfp4_free(&ga);
    qd_cuda_nvfp4_free(&gw);
    qd_nvfp4_free(&a);
    qd_nvfp4_free(&w);
}

/* The grouped product of the MoE experts (qd_cuda_w4a4_gemm_grouped_async):
 * G groups of uneven row counts (some empty) over one activation matrix, each
 * against its own weight, equal bit for bit to qd_w4a4_gemm per group. */
static void check_gemm_grouped(int G, int64_t N, int64_t K, int64_t maxrows)
{
    std::vector<int64_t> off((size_t)G + 1, 0);
    for (int g = 0; g < G; g++)
        off[(size_t)g + 1] = off[(size_t)g] + (g % 5 == 3 ? 0 : 1 + below(maxrows));
    int64_t M = off[(size_t)G];
    qd_nvfp4 a;
    quantize_host(&a, 1, M, K, QD_SCALE_PER_ROW);
    qd_nvfp4 ga = nvfp4_to_dev(&a);
    std::vector<qd_nvfp4> w((size_t)G), gw((size_t)G);
    std::vector<const qd_nvfp4 *> pw((size_t)G);
    std::vector<float> cy((size_t)(M * N));
    for (int g = 0; g < G; g++) {
        quantize_host(&w[(size_t)g], 0, N, K, QD_SCALE_PER_TENSOR);
        gw[(size_t)g] = nvfp4_to_dev(&w[(size_t)g]);
        pw[(size_t)g] = &gw[(size_t)g];
        int64_t m = off[(size_t)g + 1] - off[(size_t)g];
        if (m == 0)
            continue;
        qd_nvfp4 ag = a; /* a view of the group's rows */
        ag.rows = m;
        ag.codes = a.codes + off[(size_t)g] * (K / 2);
        ag.scales = a.scales + off[(size_t)g] * (K / 16);
        ag.s_dec = a.s_dec + off[(size_t)g];
        QD_STATUS_DIE(qd_w4a4_gemm(cy.data() + off[(size_t)g] * N, &ag, &w[(size_t)g]));
    }
    float *gy;
    QD_CUDA_DIE(cudaMalloc((void **)&gy, cy.size() * sizeof(float)));
    QD_CUDA_DIE(cudaMemset(gy, 0xff, cy.size() * sizeof(float)));
    QD_STATUS_DIE(qd_cuda_w4a4_gemm_grouped_async(gy, &ga, pw.data(), off.data(), G));
    QD_CUDA_DIE(cudaDeviceSynchronize());
    char op[64], dist[64];
    snprintf(op, sizeof op, "W4A4 grouped %dx%lldx%lld", G, (long long)N, (long long)K);
    snprintf(dist, sizeof dist, "%lld rows", (long long)M);
    report(op, dist, M * N, diff(to_host(gy, cy.size()).data(), cy.data(), cy.size(), 4));
    cudaFree(gy);
    for (int g = 0; g < G; g++) {
        qd_cuda_nvfp4_free(&gw[(size_t)g]);
        qd_nvfp4_free(&w[(size_t)g]);
    }
    qd_cuda_nvfp4_free(&ga);
    qd_nvfp4_free(&a);
}

static void check_gemm(void)
{
    static const int64_t shapes[][3] = {
        {1, 14336, 4096}, {2, 4096, 4096}, {3, 1000, 4112}, {5, 300, 48},     {8, 2048, 4096},
        {16, 1024, 1024}, {17, 777, 272},  {33, 512, 2048}, {64, 14336, 4096}, {100, 256, 512},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        check_gemm_case(shapes[i][0], shapes[i][1], shapes[i][2], (int)(i % 2), 0, QD_SCALE_PER_TENSOR);
    check_gemm_case(8, 4096, 4096, 0, 2, QD_SCALE_PER_TENSOR);
    check_gemm_case(12, 1024, 4096, 1, 0, QD_SCALE_PER_ROW);
    check_gemm_grouped(32, 512, 1024, 9);    /* moe8's gate/up at decode */
    check_gemm_grouped(32, 1024, 512, 70);   /* moe8's down at prefill */
    check_gemm_grouped(130, 64, 64, 3);      /* more groups than one launch holds */
    check_gemm_grouped(128, 768, 2048, 12);  /* Qwen3-30B-A3B gate/up, batch 64 decode */
    check_gemm_grouped(128, 2048, 768, 12);  /* its down */
    check_gemm_grouped(64, 768, 2144, 40);   /* RAC-augmented K (134 blocks), batch 256 */
    check_gemm_grouped(16, 200, 1040, 90);   /* N not a multiple of 64, rows over 64 */
    check_gemm_case(64, 4096, 2048, 1, 0, QD_SCALE_PER_TENSOR); /* attention linears at batch 64 */
    check_gemm_case(40, 520, 2144, 0, 0, QD_SCALE_PER_ROW);
    check_gemm_case(256, 4096, 2048, 0, 0, QD_SCALE_PER_TENSOR); /* attention linears at batch 256 */
    check_gemm_case(1000, 512, 4096, 1, 0, QD_SCALE_PER_TENSOR); /* a prefill's rows */
}

/* ---- non-finite inputs must raise QD_ERR_NONFINITE, and the flag must clear */

static long long expect_nonfinite(qd_status st) { return st != QD_ERR_NONFINITE; }

static void check_nonfinite(void)
{
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    int64_t rows = 64, K = 256, n = rows * K;
    std::vector<float> x((size_t)n);
    std::vector<int64_t> ch = random_channels(K, 32);
    int64_t *dch = to_dev(ch.data(), ch.size());
    long long misses = 0, cases = 0;
    qd_nvfp4 g, ga, gw;
    QD_STATUS_DIE(qd_cuda_nvfp4_alloc(&g, rows, K, QD_SCALE_PER_TENSOR));
    QD_STATUS_DIE(qd_cuda_nvfp4_alloc(&ga, rows, K + 32, QD_SCALE_PER_ROW));
    QD_STATUS_DIE(qd_cuda_nvfp4_alloc(&gw, rows, K + 32, QD_SCALE_PER_TENSOR));
    float *dout, *s_enc, one = 1.0f;
    uint8_t *dq;
    QD_CUDA_DIE(cudaMalloc((void **)&dout, (size_t)n * sizeof(float)));
    QD_CUDA_DIE(cudaMalloc((void **)&dq, (size_t)n));
    s_enc = to_dev(&one, 1);
    for (int t = 0; t < 30; t++) {
        fill_normal(x.data(), n);
        x[(size_t)below(n)] = bad[t % 3];
        float *dx = to_dev(x.data(), (size_t)n), amax;
        uint16_t hb[16];
        for (int i = 0; i < 16; i++)
            hb[i] = qd_bf16_from_f32(x[(size_t)i]);
        hb[below(16)] = qd_bf16_from_f32(bad[t % 3]);
        uint16_t *dhb = to_dev(hb, 16);
        qd_nvfp4 gb;
        qd_scale_kind scale = t & 1 ? QD_SCALE_PER_ROW : QD_SCALE_PER_TENSOR;
        QD_STATUS_DIE(qd_cuda_nvfp4_alloc(&gb, 1, 16, scale));
        g.per_row = scale;
        misses += expect_nonfinite(qd_cuda_amax(&amax, dx, n));
        misses += expect_nonfinite(qd_cuda_nvfp4_quantize(&g, dx));
        misses += expect_nonfinite(qd_cuda_nvfp4_quantize_bf16(&gb, dhb));
        misses += expect_nonfinite(qd_cuda_nvfp4_quantize_with(&g, dx, s_enc));
        misses += expect_nonfinite(qd_cuda_nvfp4_fake_quant(dout, dx, rows, K, scale));
        misses += expect_nonfinite(qd_cuda_fp8_quantize_rows(dq, dout, dx, rows, K));
        misses += expect_nonfinite(qd_cuda_rac_augment_act(&ga, dx, rows, K, dch, 32));
        misses += expect_nonfinite(qd_cuda_rac_augment_weight(&gw, dx, rows, K, dch, 32));
        cases += 8;
        /* the flag is cleared: a clean input passes again */
        fill_normal(x.data(), n);
        QD_CUDA_DIE(cudaMemcpy(dx, x.data(), (size_t)n * sizeof(float), cudaMemcpyHostToDevice));
        misses += qd_cuda_nvfp4_quantize(&g, dx) != QD_OK;
        cases++;
        qd_cuda_nvfp4_free(&gb);
        cudaFree(dx);
        cudaFree(dhb);
    }
    report("non-finite -> error", "NaN/+Inf/-Inf", cases, misses);
    g.per_row = QD_SCALE_PER_TENSOR;
    qd_cuda_nvfp4_free(&g);
    qd_cuda_nvfp4_free(&ga);
    qd_cuda_nvfp4_free(&gw);
    cudaFree(dout);
    cudaFree(dq);
    cudaFree(s_enc);
    cudaFree(dch);
}

/* ---- RAC channel selection: qd_cuda_rac_select_async (and the kernel before
 * it, qd_cuda_quant_legacy) against qd_rac_select */

#define RAC_DISTS 8

/* Errors of one linear by kind d: all equal (zero, as at a sync without
 * statistics, and 0.75), the cut inside a tie of 1s, a few values, +0 against
 * -0 (equal) with subnormals of both signs, huge and tiny magnitudes of both
 * signs, runs of 37 equal values rising with the channel (the cut inside a
 * run, the picked at the top), all distinct. */
static void fill_rac_err(double *e, int64_t K, int d)
{
    for (int64_t k = 0; k < K; k++) {
        double u = unif();
        switch (d) {
        case 0: e[k] = 0.0; break;
        case 1: e[k] = 0.75; break;
        case 2: e[k] = below(10) == 0 ? 2.0 : below(2) ? 1.0 : 0.0; break;
        case 3: e[k] = 0.5 * (double)below(4); break;
        case 4: e[k] = below(3) ? (below(2) ? -0.0 : 0.0) : below(2) ? 4.9e-324 : -4.9e-324; break;
        case 5: e[k] = below(50) == 0 ? 1e300 * u : below(50) == 0 ? -1e300 * u : 1e-310 * u; break;
        case 6: e[k] = (double)(k / 37); break;
        default: e[k] = u * u; break;
        }
    }
}

/* Linears whose picked entries (the first qd_rac_count) differ from
 * qd_rac_select's, or whose other entries lost their sentinel. */
static long long rac_select_misses(const std::vector<int64_t> &got, const std::vector<double> &err,
                                   const std::vector<size_t> &off, const std::vector<int> &K, double ratio)
{
    long long bad = 0;
    std::vector<int64_t> want;
    for (size_t i = 0; i < K.size(); i++) {
        want.assign((size_t)K[i] + 1, 0);
        int64_t n = qd_rac_select(want.data(), err.data() + off[i], K[i], ratio);
        int miss = n < 0 || memcmp(want.data(), got.data() + off[i], sizeof(int64_t) * (size_t)(n < 0 ? 0 : n));
        for (int64_t k = n < 0 ? 0 : n; k < K[i]; k++)
            miss |= got[off[i] + (size_t)k] != -1 - (int64_t)(off[i] + (size_t)k);
        bad += miss;
    }
    return bad;
}

/* 450 linears (three launches with the keys in shared memory, one without): widths from 0 to 20000
 * (over the shared-memory keys' 5120 too, the a3b widths 768, 2048 and 4096
 * among them), errors of every kind; at each ratio one call over all of them,
 * new kernels and legacy; then a NaN or Inf error raises QD_ERR_NONFINITE at
 * the check and a clean call passes. */
static void check_rac_select(void)
{
    const double ratios[] = {0.0, 0.0625, 0.25, 0.29, 0.5, 1.0};
    const int fixed[] = {768, 2048, 4096, 5120, 5136, 16, 272, 1040};
    int nl = 450;
    std::vector<int> K((size_t)nl);
    std::vector<size_t> off((size_t)nl);
    size_t total = 0;
    for (int i = 0; i < nl; i++) {
        K[(size_t)i] = i < 8 * RAC_DISTS ? fixed[i / RAC_DISTS] : (int)(16 * below(i % 10 ? 300 : 1251));
        off[(size_t)i] = total;
        total += (size_t)K[(size_t)i];
    }
    std::vector<double> err(total);
    std::vector<int64_t> sentinel(total);
    for (int i = 0; i < nl; i++)
        fill_rac_err(err.data() + off[(size_t)i], K[(size_t)i], i % RAC_DISTS);
    for (size_t k = 0; k < total; k++)
        sentinel[k] = -1 - (int64_t)k;
    double *derr = to_dev(err.data(), total);
    int64_t *dch = to_dev(sentinel.data(), total);
    for (int legacy = 0; legacy < 2; legacy++) {
        long long bad = 0, count = 0;
        for (double r : ratios) {
            QD_CUDA_DIE(cudaMemcpy(dch, sentinel.data(), total * sizeof(int64_t), cudaMemcpyHostToDevice));
            qd_cuda_quant_legacy = legacy;
            QD_STATUS_DIE(qd_cuda_rac_select_async(dch, derr, off.data(), K.data(), nl, r));
            qd_cuda_quant_legacy = 0;
            QD_STATUS_DIE(qd_cuda_nonfinite_check());
            bad += rac_select_misses(to_host(dch, total), err, off, K, r);
            count += nl;
        }
        report(legacy ? "RAC select (legacy)" : "RAC select", "8 kinds, ties", count, bad);
    }
    const double nonfinite[3] = {NAN, INFINITY, -INFINITY};
    long long misses = 0;
    for (int t = 0; t < 6; t++) {
        size_t li = (size_t)(9 * t + 1), at = off[li] + (size_t)below(K[li]); /* fixed widths: K >= 16 */
        double keep = err[at];
        QD_CUDA_DIE(cudaMemcpy(derr + at, &nonfinite[t % 3], sizeof(double), cudaMemcpyHostToDevice));
        QD_STATUS_DIE(qd_cuda_rac_select_async(dch, derr, off.data(), K.data(), nl, 0.25));
        misses += expect_nonfinite(qd_cuda_nonfinite_check());
        QD_CUDA_DIE(cudaMemcpy(derr + at, &keep, sizeof(double), cudaMemcpyHostToDevice));
        QD_STATUS_DIE(qd_cuda_rac_select_async(dch, derr, off.data(), K.data(), nl, 0.25));
        misses += qd_cuda_nonfinite_check() != QD_OK;
    }
    report("RAC select non-finite", "NaN/+Inf/-Inf", 12, misses);
    cudaFree(derr);
    cudaFree(dch);
}

/* The grouped RAC weights of a sync (qd_cuda_nvfp4_quantize_weights_async, a
 * warp's 32 copied blocks staged through shared memory) against
 * qd_rac_augment_weight per tensor: a3b's expert shapes and one whose rows'
 * copies straddle the warps' chunks, 3 tensors each (normal, heavy-tailed,
 * zero blocks), random channels each. */
static void check_rac_weights_grouped(void)
{
    const int64_t shapes[3][3] = {{768, 2048, 512}, {2048, 768, 192}, {100, 768, 192}};
    for (const auto &s : shapes) {
        int64_t N = s[0], K = s[1], n = s[2];
        qd_nvfp4 c[3], g[3], *gp[3];
        const float *dx[3];
        const int64_t *dch[3];
        long long bad = 0;
        std::vector<float> x[3];
        std::vector<int64_t> ch[3];
        for (int t = 0; t < 3; t++) {
            x[t].resize((size_t)(N * K));
            if (t == 0)
                fill_normal(x[t].data(), N * K);
            else if (t == 1)
                fill_heavy(x[t].data(), N * K);
            else
                fill_zero_blocks(x[t].data(), N * K / K_COLS ? N * K / K_COLS : 1);
            ch[t] = random_channels(K, n);
            QD_STATUS_DIE(qd_nvfp4_alloc(&c[t], N, K + n, QD_SCALE_PER_TENSOR));
            QD_STATUS_DIE(qd_rac_augment_weight(&c[t], x[t].data(), N, K, ch[t].data(), n));
            QD_STATUS_DIE(qd_cuda_nvfp4_alloc(&g[t], N, K + n, QD_SCALE_PER_TENSOR));
            gp[t] = &g[t];
            dx[t] = to_dev(x[t].data(), x[t].size());
            dch[t] = to_dev(ch[t].data(), ch[t].size());
        }
        QD_STATUS_DIE(qd_cuda_nvfp4_quantize_weights_async(gp, dx, dch, 3, N, K, n));
        QD_STATUS_DIE(qd_cuda_nonfinite_check());
        for (int t = 0; t < 3; t++) {
            bad += diff_nvfp4(&g[t], &c[t]);
            qd_nvfp4_free(&c[t]);
            qd_cuda_nvfp4_free(&g[t]);
            cudaFree((void *)dx[t]);
            cudaFree((void *)dch[t]);
        }
        char dist[32];
        snprintf(dist, sizeof dist, "%lldx%lld+%lld", (long long)N, (long long)K, (long long)n);
        report("RAC weights grouped", dist, 3 * N * (K + n), bad);
    }
}

/* ---- the golden vectors of tests/ref/nvfp4_golden.py (numpy + ml_dtypes) */

static int read_u32(FILE *f, uint32_t *v) { return fread(v, 4, 1, f) == 1; }

static void check_golden(const char *path)
{
    FILE *f = fopen(path, "rb");
    char magic[4];
    uint32_t ncase;
    long long count = 0, bad = 0;
    if (!f || fread(magic, 1, 4, f) != 4 || memcmp(magic, "QDG1", 4) || !read_u32(f, &ncase)) {
        fprintf(stderr, "%s: missing or not a QDG1 file\n", path);
        report("golden (numpy)", "file", 0, 1);
        if (f)
            fclose(f);
        return;
    }
    for (uint32_t c = 0; c < ncase; c++) {
        uint32_t rows, cols, per_row, nl;
        char name[256];
        if (!read_u32(f, &rows) || !read_u32(f, &cols) || !read_u32(f, &per_row) ||
            !read_u32(f, &nl) || nl >= sizeof name || fread(name, 1, nl, f) != nl) {
            bad++;
            break;
        }
        size_t n = (size_t)rows * cols, nd = per_row ? rows : 1;
        qd_nvfp4 want;
        QD_STATUS_DIE(qd_nvfp4_alloc(&want, rows, cols, per_row ? QD_SCALE_PER_ROW : QD_SCALE_PER_TENSOR));
        std::vector<float> x(n);
        if (fread(x.data(), 4, n, f) != n || fread(want.codes, 1, n / 2, f) != n / 2 ||
            fread(want.scales, 1, n / 16, f) != n / 16 || fread(want.s_dec, 4, nd, f) != nd) {
            bad++;
            qd_nvfp4_free(&want);
            break;
        }
        qd_nvfp4 g;
        float *dx = to_dev(x.data(), n);
        QD_STATUS_DIE(qd_cuda_nvfp4_alloc(&g, rows, cols, want.per_row));
        QD_STATUS_DIE(qd_cuda_nvfp4_quantize(&g, dx));
        bad += diff_nvfp4(&g, &want);
        count += (long long)n;
        cudaFree(dx);
        qd_cuda_nvfp4_free(&g);
        qd_nvfp4_free(&want);
    }
    fclose(f);
    report("quantize vs golden", "numpy+ml_dtypes", count, bad);
}

int main(int argc, char **argv)
{
    int64_t rows = argc > 1 ? atoll(argv[1]) : 4096;
    if (rows < 64)
        rows = 64;
    printf("| %-22s | %-14s | %12s | %10s | %-3s |\n", "op", "distribution", "count", "mismatches",
           "bits equal");
    printf("|%s|%s|%s|%s|%s|\n", "------------------------", "----------------", "--------------",
           "------------", "-----");
    check_rn_twins();
    check_shapes(getenv("CHECK_QUANT_SMALL") == NULL);
    for (int d = 0; d < NDIST; d++)
        check_distribution(d, rows);
    check_all_bf16();
    check_gemm();
    check_nonfinite();
    check_rac_select();
    check_rac_weights_grouped();
    if (argc > 2)
        check_golden(argv[2]);
    printf("%s: %d row(s) with mismatches\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
