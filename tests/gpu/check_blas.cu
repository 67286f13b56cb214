/* The fast mode's GEMMs (backends/cuda/cuda_blas.h) against exact references
 * on the CPU, on a machine with a GPU (docs/numerics.md §7: fast mode is
 * checked by relative error, never bit for bit):
 *
 *     tests/gpu/check_blas          (tests/gpu/check_blas.sh builds and runs it)
 *
 * Random normal data at the model's shapes: M (tokens) in {1, 7, 64, 300},
 * N (output features) in {64, 1024}, K (input features) in {64, 1024, 4096}.
 * One table: op, shape M x N x K, max abs error, max relative error
 * rel = max|got - ref| / max|ref| over the whole output, the bound, PASS/FAIL.
 * Also prints the W4A4 path and requires "emulated" on compute capability 9.x.
 * Exit 0 when every row passes, 1 on a FAIL, 2 on an error.
 *
 * References and bounds (u = 2^-24, float32's unit roundoff; L = the length of
 * the reduction: K for y = x.W^T, N for dx = dy.W, M for dw = dy^T.x):
 * - bf16 and f32: a plain loop in double over the same inputs (bf16 inputs as
 *   their exact float values), so the reference is exact to ~2^-53 and the
 *   error is cuBLASLt's float32 accumulation alone (bf16 x bf16 products are
 *   exact in float32; float32 x float32 ones round once). A sum of L terms
 *   rounds at most L times; with random signs those errors add like a random
 *   walk, |err| ~ u * sqrt(L) * |partial sums| ~ u * sqrt(L) * max|ref| / 2.
 *   Bound: rel <= 16 u sqrt(L) = 2^-20 sqrt(L) (7.6e-6 at L = 64, 6.1e-5 at
 *   4096), 30x the expected value. TF32 (10-bit mantissa inputs), which
 *   CUBLAS_COMPUTE_32F must not use, would give rel ~ 2^-11 = 4.9e-4 and fail.
 * - grp (the experts' products, qd_cuda_gemm_grouped_*): three experts over the
 *   M rows (rows [0, M/3) with W, none, the rest with a second W2; the empty
 *   expert's dw must stay as it was), x and W BF16 values as the BF16 recipes
 *   make them, dy float32 (BF16 values in the grp bf16 backward rows, as fast
 *   mode's BF16 recipes round it). bf16 and f32 rows: the bounds above. tf32 rows (the
 *   backward under the BF16 recipes): the tensor cores read dy as TF32, a
 *   relative change of at most 2^-10 an element (x and W unchanged), so a sum
 *   moves by at most about 2^-10 of its typical size (random part) plus 2^-11
 *   of itself (truncation's bias): bound 2^-9 = 2.0e-3; BF16 for dy (2^-8)
 *   would give ~2e-3 and could fail.
 * - wgmma (qd_cuda_grouped_wgmma_bf16, the experts' kernel on Hopper's warpgroup
 *   MMA): each configuration x the four operand layouts x beta 0 and 1, three
 *   groups whose rows and K are not multiples of the tile; the bf16 bound over
 *   the longest K. A swizzle or descriptor mistake gives rel ~ 1.
 * - fp8 (E4M3 codes from qd_fp8_quantize_rows, one scale a row): the reference
 *   is quant/'s qd_fp8_gemm, the exact mode's product (sequential float32 sum of
 *   exact products). Hopper's FP8 MMA adds products inside an instruction with
 *   fewer than float32's bits (about 14 retained, DeepSeek-V3 report §3.3);
 *   cuBLASLt promotes those partial sums into float32 periodically (FAST_ACCUM
 *   off), so the error is ~2^-14 of a short partial sum, a random walk over
 *   the rest: expected rel ~ 2^-14/2 = 3e-5. Bound: rel <= 2^-10 = 9.8e-4.
 *   Unpromoted accumulation (FAST_ACCUM on) reaches ~1e-2 at K = 4096 and fails;
 *   a wrong scale or layout gives rel ~ 1.
 * - w4a4 fast: quant/'s qd_w4a4_gemm. On the emulated path (Hopper) the kernel
 *   is the canonical one: bound 0, every bit equal. On the native path
 *   (Blackwell cuBLASLt NVFP4, "w4a4 native" rows too) block products and
 *   block scalings are exact and only the float32 accumulation order differs,
 *   with the same tensor-core caveat as FP8: rel <= 2^-10.
 * - swizzle: the device swizzle of the block scales against quant/'s
 *   qd_scales_swizzle, byte for byte (bound 0); its shape column reads
 *   rows x K/16 x K, for A's scales (rows = M) and W's (rows = N = 1024). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <string>
#include <thread>
#include <vector>
#include <cublasLt.h>
#include "backends/cuda/cuda_blas.h"
#include "backends/cuda/cuda_die.h"
#include "backends/cuda/cuda_quant.h"
#include "quant/splitmix64.h"

#define MAX_M 300
#define MAX_N 1024
#define MAX_K 4096

static int failures, rows_run;
static std::vector<std::string> failed_rows; /* listed again after the table */

/* ---- the table */
static void header(void)
{
    printf("| %-19s | %-18s | %10s | %10s | %10s | %-4s |\n", "op", "M x N x K", "max abs", "max rel",
           "bound", "ok");
    printf("|---------------------|--------------------|------------|------------|------------|------|\n");
}

static void row(const char *op, int64_t M, int64_t N, int64_t K, double abs_err, double rel,
                double bound, int pass)
{
    char shape[72];
    snprintf(shape, sizeof shape, "%lld x %lld x %lld", (long long)M, (long long)N, (long long)K);
    char line[160];
    snprintf(line, sizeof line, "| %-19s | %-18s | %10.3e | %10.3e | %10.3e | %-4s |", op, shape,
             abs_err, rel, bound, pass ? "PASS" : "FAIL");
    puts(line);
    fflush(stdout);
    rows_run++;
    failures += !pass;
    if (!pass)
        failed_rows.push_back(line);
}

/* Max |got - ref| (a NaN counts as infinite) and that over max|ref|. */
static void errors(const float *got, const double *ref, size_t n, double *abs_err, double *rel)
{
    double e = 0.0, r = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        e = d > e || d != d ? (d != d ? INFINITY : d) : e;
        r = std::max(r, fabs(ref[i]));
    }
    *abs_err = e;
    *rel = r > 0.0 ? e / r : e;
}

/* ---- random data */
static uint64_t rng_state = 0xb1a5c0ffee123ULL;
static double normal(void)
{
    double u = qd_splitmix64_unit(&rng_state), v = qd_splitmix64_unit(&rng_state);
    return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

static std::vector<float> normals(size_t n)
{
    std::vector<float> x(n);
    for (auto &v : x)
        v = (float)normal();
    return x;
}

/* The top-left (rows, cols) block of a (.., ld) row-major matrix, contiguous. */
static std::vector<float> block(const std::vector<float> &big, int64_t ld, int64_t rows, int64_t cols)
{
    std::vector<float> b((size_t)(rows * cols));
    for (int64_t r = 0; r < rows; r++)
        memcpy(&b[(size_t)(r * cols)], &big[(size_t)(r * ld)], sizeof(float) * (size_t)cols);
    return b;
}

static std::vector<float> transpose(const std::vector<float> &a, int64_t rows, int64_t cols)
{
    std::vector<float> t(a.size());
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            t[(size_t)(c * rows + r)] = a[(size_t)(r * cols + c)];
    return t;
}

/* bf16 bits of x, and x replaced by their exact values (what the GPU reads). */
static std::vector<uint16_t> to_bf16(std::vector<float> &x)
{
    std::vector<uint16_t> b(x.size());
    for (size_t i = 0; i < x.size(); i++) {
        b[i] = qd_bf16_from_f32(x[i]);
        x[i] = qd_bf16_to_f32(b[i]);
    }
    return b;
}

/* ---- the exact reference: out (I, J) = beta * c0 + A (I, L) . B (J, L)^T in double */
static std::vector<double> ref_abt(const std::vector<float> &A, const std::vector<float> &B, int64_t I,
                                   int64_t J, int64_t L, const std::vector<float> *c0, float beta)
{
    std::vector<double> out((size_t)(I * J));
    unsigned nt = std::max(1u, std::thread::hardware_concurrency());
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < nt; t++)
        pool.emplace_back([&, t] {
            for (int64_t i = t; i < I; i += nt)
                for (int64_t j = 0; j < J; j++) {
                    const float *a = &A[(size_t)(i * L)], *b = &B[(size_t)(j * L)];
                    double s = c0 ? (double)beta * (*c0)[(size_t)(i * J + j)] : 0.0;
                    for (int64_t l = 0; l < L; l++)
                        s += (double)a[l] * (double)b[l];
                    out[(size_t)(i * J + j)] = s;
                }
        });
    for (auto &th : pool)
        th.join();
    return out;
}

/* ---- device helpers */
template <typename T> static T *to_dev(const T *h, size_t n)
{
    T *d;
    QD_CUDA_DIE(cudaMalloc((void **)&d, (n ? n : 1) * sizeof(T)));
    QD_CUDA_DIE(cudaMemcpy(d, h, n * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

template <typename T> static T *to_dev(const std::vector<T> &h)
{
    return to_dev(h.data(), h.size());
}

static std::vector<float> to_host(const float *d, size_t n)
{
    std::vector<float> h(n);
    QD_CUDA_DIE(cudaDeviceSynchronize());
    QD_CUDA_DIE(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

static double sqrt_bound(int64_t L)
{
    return ldexp(1.0, -20) * sqrt((double)L);
}

/* One product against its reference: y starts as y0 (device copy), run(y) computes
 * it. With bits (the reference's float32 bits) every bit must be equal; else
 * rel <= bound. A failing call is a FAIL row with its message, and the check goes on. */
template <typename F>
static void check_op(const char *op, int64_t M, int64_t N, int64_t K, const std::vector<float> &y0,
                     const std::vector<double> &ref, double bound, F run, const float *bits = NULL)
{
    float *y = to_dev(y0);
    qd_status st = run(y);
    if (st != QD_OK) {
        row(op, M, N, K, NAN, NAN, bound, 0);
        printf("    %s: %s: %s\n", op, qd_status_str(st), qd_last_error());
        cudaGetLastError(); /* clear a non-sticky error for the next rows */
    } else {
        std::vector<float> got = to_host(y, y0.size());
        double e, rel;
        errors(got.data(), ref.data(), got.size(), &e, &rel);
        int pass = bits ? memcmp(got.data(), bits, sizeof(float) * got.size()) == 0 : rel <= bound;
        row(op, M, N, K, e, rel, bound, pass);
    }
    QD_CUDA_DIE(cudaFree(y));
}

/* ---- BF16 and float32: forward, dx and dw of one shape; beta 1 on some to test accumulation */
typedef struct {
    int64_t M, N, K;
    std::vector<float> x, w, dy, wt, dyt, xt, y0, dx0, dw0; /* wt = w^T (K, N), dyt (N, M), xt (K, M) */
    std::vector<float> w2;                                  /* a second weight (N, K): the experts */
} shape_data;

static void check_bf16(shape_data &s)
{
    int64_t M = s.M, N = s.N, K = s.K;
    std::vector<float> x = s.x, w = s.w, dy = s.dy;
    std::vector<uint16_t> xb = to_bf16(x), wb = to_bf16(w), dyb = to_bf16(dy);
    uint16_t *d_x = to_dev(xb), *d_w = to_dev(wb), *d_dy = to_dev(dyb);
    std::vector<float> wt = transpose(w, N, K), dyt = transpose(dy, M, N), xt = transpose(x, M, K);
    check_op("bf16 y+=x.W^T", M, N, K, s.y0, ref_abt(x, w, M, N, K, &s.y0, 1.0f), sqrt_bound(K),
             [&](float *y) { return qd_cuda_gemm_bf16(y, d_x, d_w, M, N, K, 1.0f); });
    check_op("bf16 dx=dy.W", M, N, K, s.dx0, ref_abt(dy, wt, M, K, N, NULL, 0.0f), sqrt_bound(N),
             [&](float *y) { return qd_cuda_gemm_bf16_dx(y, d_dy, d_w, M, N, K, 0.0f); });
    check_op("bf16 dw+=dy^T.x", M, N, K, s.dw0, ref_abt(dyt, xt, N, K, M, &s.dw0, 1.0f), sqrt_bound(M),
             [&](float *y) { return qd_cuda_gemm_bf16_dw(y, d_dy, d_x, M, N, K, 1.0f); });
    QD_CUDA_DIE(cudaFree(d_x));
    QD_CUDA_DIE(cudaFree(d_w));
    QD_CUDA_DIE(cudaFree(d_dy));
}

static void check_f32(shape_data &s)
{
    int64_t M = s.M, N = s.N, K = s.K;
    float *d_x = to_dev(s.x), *d_w = to_dev(s.w), *d_dy = to_dev(s.dy);
    check_op("f32 y=x.W^T", M, N, K, s.y0, ref_abt(s.x, s.w, M, N, K, NULL, 0.0f), sqrt_bound(K),
             [&](float *y) { return qd_cuda_gemm_f32(y, d_x, d_w, M, N, K, 0.0f); });
    check_op("f32 dx+=dy.W", M, N, K, s.dx0, ref_abt(s.dy, s.wt, M, K, N, &s.dx0, 1.0f), sqrt_bound(N),
             [&](float *y) { return qd_cuda_gemm_f32_dx(y, d_dy, d_w, M, N, K, 1.0f); });
    check_op("f32 dw+=dy^T.x", M, N, K, s.dw0, ref_abt(s.dyt, s.xt, N, K, M, &s.dw0, 1.0f),
             sqrt_bound(M), [&](float *y) { return qd_cuda_gemm_f32_dw(y, d_dy, d_x, M, N, K, 1.0f); });
    QD_CUDA_DIE(cudaFree(d_x));
    QD_CUDA_DIE(cudaFree(d_w));
    QD_CUDA_DIE(cudaFree(d_dy));
}

/* ---- the experts: rows [r0, r0 + n) of a (.., ld) row-major matrix */
static std::vector<float> rows_of(const std::vector<float> &a, int64_t ld, int64_t r0, int64_t n)
{
    return std::vector<float>(a.begin() + r0 * ld, a.begin() + (r0 + n) * ld);
}

/* out rows [r0, r0 + n) (ld) = ref */
static void put_rows(std::vector<double> &out, int64_t ld, int64_t r0, const std::vector<double> &ref)
{
    std::copy(ref.begin(), ref.end(), out.begin() + r0 * ld);
}

/* The references of the three experts (rows [0, m0) with w, none, [m0, M) with w2). */
typedef struct {
    std::vector<double> y, dx, dw; /* y (M, N), dx (M, K) += , dw (3, N, K) += */
} grouped_ref;

static grouped_ref grouped_refs(const shape_data &s, const std::vector<float> &x, const std::vector<float> &w,
                                const std::vector<float> &w2, int64_t m0)
{
    int64_t M = s.M, N = s.N, K = s.K, NK = N * K;
    grouped_ref r;
    r.y.resize((size_t)(M * N));
    r.dx.resize((size_t)(M * K));
    r.dw.resize((size_t)(3 * NK));
    for (int e = 0; e < 3; e++) /* an expert without rows keeps dw0 */
        std::copy(s.dw0.begin(), s.dw0.end(), r.dw.begin() + e * NK);
    const int64_t r0[2] = {0, m0}, n[2] = {m0, M - m0};
    const std::vector<float> *we[2] = {&w, &w2};
    for (int g = 0; g < 2; g++) {
        if (!n[g])
            continue;
        std::vector<float> xr = rows_of(x, K, r0[g], n[g]), dyr = rows_of(s.dy, N, r0[g], n[g]);
        std::vector<float> dx0 = rows_of(s.dx0, K, r0[g], n[g]);
        put_rows(r.y, N, r0[g], ref_abt(xr, *we[g], n[g], N, K, NULL, 0.0f));
        put_rows(r.dx, K, r0[g], ref_abt(dyr, transpose(*we[g], N, K), n[g], K, N, &dx0, 1.0f));
        put_rows(r.dw, K, g ? 2 * N : 0,
                 ref_abt(transpose(dyr, n[g], N), transpose(xr, n[g], K), N, K, n[g], &s.dw0, 1.0f));
    }
    return r;
}

static void check_grouped(const shape_data &s)
{
    int64_t M = s.M, N = s.N, K = s.K, NK = N * K, m0 = M / 3;
    const int32_t off[4] = {0, (int32_t)m0, (int32_t)m0, (int32_t)M};
    std::vector<float> x = s.x, w = s.w, w2 = s.w2; /* BF16 values below, as the recipes make them */
    std::vector<uint16_t> xb = to_bf16(x), wb = to_bf16(w), w2b = to_bf16(w2);
    grouped_ref r = grouped_refs(s, x, w, w2, m0);
    uint16_t *d_xb = to_dev(xb), *d_wb = to_dev(wb), *d_w2b = to_dev(w2b);
    float *d_x = to_dev(x), *d_w = to_dev(w), *d_w2 = to_dev(w2), *d_dy = to_dev(s.dy);
    const uint16_t *wb3[3] = {d_wb, d_wb, d_w2b};
    const float *w3[3] = {d_w, d_w, d_w2};
    std::vector<float> dw0x3(s.dw0);
    dw0x3.insert(dw0x3.end(), s.dw0.begin(), s.dw0.end());
    dw0x3.insert(dw0x3.end(), s.dw0.begin(), s.dw0.end());
    check_op("grp bf16 y=x.W^T", M, N, K, s.y0, r.y, sqrt_bound(K),
             [&](float *y) { return qd_cuda_gemm_grouped_bf16(y, d_xb, wb3, NULL, off, 3, N, K); });
    check_op("grp f32 y=x.W^T", M, N, K, s.y0, r.y, sqrt_bound(K),
             [&](float *y) { return qd_cuda_gemm_grouped_f32(y, d_x, w3, off, 3, N, K, QD_GEMM_F32); });
    {   /* the BF16 backward (dy's BF16 bits, as fast mode's BF16 recipes give it) */
        shape_data sb = s;
        std::vector<uint16_t> dyb = to_bf16(sb.dy);
        grouped_ref rb = grouped_refs(sb, x, w, w2, m0);
        uint16_t *d_dyb = to_dev(dyb);
        check_op("grp bf16 dx+=dy.W", M, N, K, s.dx0, rb.dx, sqrt_bound(N), [&](float *y) {
            return qd_cuda_gemm_grouped_bf16_backward(y, NULL, d_dyb, d_xb, wb3, NULL, off, 3, N, K);
        });
        check_op("grp bf16 dw+=dy^T.x", M, N, K, dw0x3, rb.dw, sqrt_bound(M - m0), [&](float *y) {
            float *dw3[3] = {y, y + NK, y + 2 * NK};
            return qd_cuda_gemm_grouped_bf16_backward(NULL, dw3, d_dyb, d_xb, wb3, NULL, off, 3, N, K);
        });
        QD_CUDA_DIE(cudaFree(d_dyb));
    }
    const qd_gemm_math maths[2] = {QD_GEMM_F32, QD_GEMM_TF32};
    for (qd_gemm_math m : maths) {
        int tf = m == QD_GEMM_TF32;
        check_op(tf ? "grp tf32 dx+=dy.W" : "grp f32 dx+=dy.W", M, N, K, s.dx0, r.dx,
                 tf ? ldexp(1.0, -9) : sqrt_bound(N), [&](float *y) {
                     return qd_cuda_gemm_grouped_f32_backward(y, NULL, d_dy, d_x, w3, off, 3, N, K, m);
                 });
        check_op(tf ? "grp tf32 dw+=dy^T.x" : "grp f32 dw+=dy^T.x", M, N, K, dw0x3, r.dw,
                 tf ? ldexp(1.0, -9) : sqrt_bound(M - m0), [&](float *y) {
                     float *dw3[3] = {y, y + NK, y + 2 * NK};
                     return qd_cuda_gemm_grouped_f32_backward(NULL, dw3, d_dy, d_x, w3, off, 3, N, K, m);
                 });
    }
    for (void *p : {(void *)d_xb, (void *)d_wb, (void *)d_w2b, (void *)d_x, (void *)d_w, (void *)d_w2, (void *)d_dy})
        QD_CUDA_DIE(cudaFree(p));
}

/* ---- the warpgroup-MMA grouped kernel itself (QUADS_EXPERT_GEMM=wgmma):
 * every configuration and all four operand layouts, three groups of
 * different rows and K (none a multiple of the 128 x BN x 64 tile, so the
 * zero-filled edges count), alpha per group, beta 0 or 1; BF16 inputs, the
 * bf16 rows' bound. Only on compute capability 9.0 (sm_90a). */
static void check_wgmma(void)
{
    int dev = 0, major = 0, minor = 0;
    QD_CUDA_DIE(cudaGetDevice(&dev));
    QD_CUDA_DIE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    QD_CUDA_DIE(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    if (major != 9 || minor != 0) {
        printf("(wgmma rows skipped: compute capability %d.%d)\n", major, minor);
        return;
    }
    static const struct {
        int N, M[3], K[3];
    } sets[2] = {{72, {8, 136, 304}, {24, 200, 1024}}, {1024, {256, 120, 64}, {512, 64, 1032}}};
    static const char *names[4] = {"x.W^T", "dy.W", "dy^T.x", "A^T.B^T"};
    static const int tas[4] = {0, 0, 1, 1}, tbs[4] = {1, 0, 0, 1};
    static const float alphas[3] = {1.0f, 0.5f, 2.0f};
    for (const auto &set : sets)
        for (int v = 0; v < 4; v++) {
            int ta = tas[v], tb = tbs[v], N = set.N, maxk = 0;
            size_t c_total = 0;
            std::vector<std::vector<float>> A(3), B(3);
            std::vector<uint16_t *> dA(3), dB(3);
            std::vector<size_t> c_at(3);
            for (int g = 0; g < 3; g++) {
                int M = set.M[g], K = set.K[g];
                A[g] = normals((size_t)M * K); /* stored (K, M) when ta, else (M, K) */
                B[g] = normals((size_t)N * K); /* stored (N, K) when tb, else (K, N) */
                std::vector<uint16_t> ab = to_bf16(A[g]), bb = to_bf16(B[g]);
                dA[g] = to_dev(ab);
                dB[g] = to_dev(bb);
                c_at[g] = c_total;
                c_total += (size_t)M * N;
                maxk = std::max(maxk, K);
            }
            std::vector<float> c0 = normals(c_total);
            std::vector<double> prod(c_total); /* alpha op(A) op(B), exact in double */
            for (int g = 0; g < 3; g++) {
                int M = set.M[g], K = set.K[g];
                std::vector<float> at = ta ? transpose(A[g], K, M) : A[g], bt = tb ? B[g] : transpose(B[g], K, N);
                std::vector<double> r = ref_abt(at, bt, M, N, K, NULL, 0.0f);
                for (size_t i = 0; i < r.size(); i++)
                    prod[c_at[g] + i] = alphas[g] * r[i];
            }
            for (int beta_i = 0; beta_i < 2; beta_i++) {
                float beta = (float)beta_i;
                std::vector<double> ref(c_total);
                for (size_t o = 0; o < c_total; o++)
                    ref[o] = prod[o] + beta * (double)c0[o];
                for (int cfg = 0; cfg < qd_cuda_grouped_wgmma_configs(); cfg++) {
                    char op[32];
                    snprintf(op, sizeof op, "wgmma%d %s b%d", cfg, names[v], beta_i);
                    check_op(op, set.M[2], N, maxk, c0, ref, sqrt_bound(maxk), [&](float *y) {
                        qd_grp_gemm gg[3];
                        for (int g = 0; g < 3; g++)
                            gg[g] = (qd_grp_gemm){dA[g], dB[g], y + c_at[g], set.M[g], N, set.K[g], alphas[g]};
                        return qd_cuda_grouped_wgmma_bf16(gg, 3, ta, tb, beta, cfg);
                    });
                }
            }
            for (int g = 0; g < 3; g++) {
                QD_CUDA_DIE(cudaFree(dA[g]));
                QD_CUDA_DIE(cudaFree(dB[g]));
            }
        }
}

/* ---- FP8 against qd_fp8_gemm */
static void check_fp8(const shape_data &s)
{
    int64_t M = s.M, N = s.N, K = s.K;
    std::vector<uint8_t> qa((size_t)(M * K)), qw((size_t)(N * K));
    std::vector<float> sa(M), sw(N), ref32((size_t)(M * N));
    QD_STATUS_DIE(qd_fp8_quantize_rows(qa.data(), sa.data(), s.x.data(), M, K));
    QD_STATUS_DIE(qd_fp8_quantize_rows(qw.data(), sw.data(), s.w.data(), N, K));
    qd_fp8_gemm(ref32.data(), qa.data(), sa.data(), qw.data(), sw.data(), M, N, K);
    std::vector<double> ref(ref32.begin(), ref32.end());
    uint8_t *dqa = to_dev(qa), *dqw = to_dev(qw);
    float *dsa = to_dev(sa), *dsw = to_dev(sw);
    check_op("fp8 y=x.W^T", M, N, K, std::vector<float>((size_t)(M * N)), ref, ldexp(1.0, -10),
             [&](float *y) { return qd_cuda_gemm_fp8(y, dqa, dsa, dqw, dsw, M, N, K); });
    QD_CUDA_DIE(cudaFree(dqa));
    QD_CUDA_DIE(cudaFree(dqw));
    QD_CUDA_DIE(cudaFree(dsa));
    QD_CUDA_DIE(cudaFree(dsw));
}

/* ---- W4A4 against qd_w4a4_gemm, and the scale swizzle against qd_scales_swizzle */
static qd_nvfp4 nvfp4_to_dev(const qd_nvfp4 *c)
{
    qd_nvfp4 g;
    QD_STATUS_DIE(qd_cuda_nvfp4_alloc(&g, c->rows, c->cols, c->per_row));
    QD_CUDA_DIE(cudaMemcpy(g.codes, c->codes, (size_t)(c->rows * c->cols / 2), cudaMemcpyHostToDevice));
    QD_CUDA_DIE(
        cudaMemcpy(g.scales, c->scales, (size_t)(c->rows * c->cols / 16), cudaMemcpyHostToDevice));
    QD_CUDA_DIE(cudaMemcpy(g.s_dec, c->s_dec, sizeof(float) * (size_t)(c->per_row ? c->rows : 1),
                           cudaMemcpyHostToDevice));
    return g;
}

static void check_swizzle(const qd_nvfp4 *c, const qd_nvfp4 *g, int64_t K)
{
    int64_t rows = c->rows, sc = c->cols / 16;
    size_t n = qd_scales_swizzled_size(rows, sc);
    std::vector<uint8_t> want(n), got(n);
    uint8_t *d;
    qd_scales_swizzle(want.data(), c->scales, rows, sc);
    QD_CUDA_DIE(cudaMalloc((void **)&d, n));
    QD_CUDA_DIE(cudaMemset(d, 0xAB, n)); /* padding must be written as 0 */
    QD_STATUS_DIE(qd_cuda_scales_swizzle(d, g->scales, rows, sc));
    QD_CUDA_DIE(cudaMemcpy(got.data(), d, n, cudaMemcpyDeviceToHost));
    QD_CUDA_DIE(cudaFree(d));
    double worst = 0.0;
    for (size_t i = 0; i < n; i++)
        worst = std::max(worst, fabs((double)got[i] - (double)want[i]));
    row("swizzle scales", rows, sc, K, worst, worst, 0.0, worst == 0.0);
}

static void check_w4a4(const shape_data &s, qd_w4a4_path path)
{
    int64_t M = s.M, N = s.N, K = s.K;
    qd_nvfp4 a, w;
    QD_STATUS_DIE(qd_nvfp4_alloc(&a, M, K, QD_SCALE_PER_ROW));
    QD_STATUS_DIE(qd_nvfp4_alloc(&w, N, K, QD_SCALE_PER_TENSOR));
    QD_STATUS_DIE(qd_nvfp4_quantize(&a, s.x.data()));
    QD_STATUS_DIE(qd_nvfp4_quantize(&w, s.w.data()));
    std::vector<float> ref32((size_t)(M * N));
    QD_STATUS_DIE(qd_w4a4_gemm(ref32.data(), &a, &w));
    std::vector<double> ref(ref32.begin(), ref32.end());
    qd_nvfp4 ga = nvfp4_to_dev(&a), gw = nvfp4_to_dev(&w);
    std::vector<float> zero((size_t)(M * N));
    int native = path == QD_W4A4_CUBLASLT_NVFP4;
    if (native) {
        check_op("w4a4 native", M, N, K, zero, ref, ldexp(1.0, -10),
                 [&](float *y) { return qd_cuda_w4a4_gemm_native(y, &ga, &gw); });
        check_op("w4a4 fast", M, N, K, zero, ref, ldexp(1.0, -10),
                 [&](float *y) { return qd_cuda_w4a4_gemm_fast(y, &ga, &gw); });
    } else { /* the canonical kernel: every bit equal */
        check_op("w4a4 fast (bits)", M, N, K, zero, ref, 0.0,
                 [&](float *y) { return qd_cuda_w4a4_gemm_fast(y, &ga, &gw); }, ref32.data());
    }
    if (N == MAX_N) /* each (rows, K/16) once: M with N = 1024, N = 1024 with M = 300 */
        check_swizzle(&a, &ga, K);
    if (N == MAX_N && M == MAX_M)
        check_swizzle(&w, &gw, K);
    qd_cuda_nvfp4_free(&ga);
    qd_cuda_nvfp4_free(&gw);
    qd_nvfp4_free(&a);
    qd_nvfp4_free(&w);
}

/* On a device without the native path, the native call must refuse, not compute. */
static void check_native_refused(void)
{
    qd_nvfp4 a, w;
    float *y;
    QD_STATUS_DIE(qd_cuda_nvfp4_alloc(&a, 1, 64, QD_SCALE_PER_ROW));
    QD_STATUS_DIE(qd_cuda_nvfp4_alloc(&w, 64, 64, QD_SCALE_PER_TENSOR));
    QD_CUDA_DIE(cudaMalloc((void **)&y, 64 * sizeof(float)));
    qd_status st = qd_cuda_w4a4_gemm_native(y, &a, &w);
    printf("qd_cuda_w4a4_gemm_native on this device: %s (%s)\n", qd_status_str(st), qd_last_error());
    if (st != QD_ERR_UNSUPPORTED) {
        printf("FAIL: expected QD_ERR_UNSUPPORTED\n");
        failures++;
    }
    qd_cuda_nvfp4_free(&a);
    qd_cuda_nvfp4_free(&w);
    QD_CUDA_DIE(cudaFree(y));
}

/* Prints the device and the W4A4 path; 1 when the path is wrong for the device. */
static int check_path(qd_w4a4_path *path)
{
    cudaDeviceProp p;
    QD_CUDA_DIE(cudaGetDeviceProperties(&p, 0));
    *path = qd_cuda_w4a4_path();
    printf("device: %s, compute capability %d.%d; cuBLASLt %zu; W4A4 path: %s\n", p.name, p.major,
           p.minor, cublasLtGetVersion(), qd_cuda_w4a4_path_name(*path));
    if (p.major == 9 && *path != QD_W4A4_EMULATED) {
        printf("FAIL: compute capability 9.x must use the emulated W4A4 path\n");
        return 1;
    }
    return 0;
}

int main(void)
{
    static const int64_t Ms[] = {1, 7, 64, MAX_M}, Ns[] = {64, MAX_N}, Ks[] = {64, 1024, MAX_K};
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "check_blas: no CUDA device\n");
        return 2;
    }
    QD_CUDA_DIE(cudaSetDevice(0));
    qd_w4a4_path path;
    failures += check_path(&path);
    if (path == QD_W4A4_EMULATED)
        check_native_refused();

    /* one draw of the largest tensors; each shape takes their top-left blocks */
    std::vector<float> X = normals(MAX_M * MAX_K), W = normals(MAX_N * MAX_K),
                       DY = normals(MAX_M * MAX_N), Y0 = normals(MAX_M * MAX_N),
                       DX0 = normals(MAX_M * MAX_K), DW0 = normals(MAX_N * MAX_K), W2 = normals(MAX_N * MAX_K);
    header();
    for (int64_t K : Ks)
        for (int64_t N : Ns)
            for (int64_t M : Ms) {
                shape_data s;
                s.M = M, s.N = N, s.K = K;
                s.x = block(X, MAX_K, M, K), s.w = block(W, MAX_K, N, K), s.dy = block(DY, MAX_N, M, N);
                s.y0 = block(Y0, MAX_N, M, N), s.dx0 = block(DX0, MAX_K, M, K),
                s.dw0 = block(DW0, MAX_K, N, K);
                s.wt = transpose(s.w, N, K), s.dyt = transpose(s.dy, M, N), s.xt = transpose(s.x, M, K);
                s.w2 = block(W2, MAX_K, N, K);
                check_bf16(s);
                check_f32(s);
                check_grouped(s);
                check_fp8(s);
                check_w4a4(s, path);
            }
    check_wgmma();
    qd_cuda_blas_release();
    if (!failed_rows.empty())
        printf("failed rows:\n");
    for (const std::string &l : failed_rows)
        printf("%s\n", l.c_str());
    printf("%s: %d failure(s); %d table row(s)\n", failures ? "FAIL" : "PASS", failures, rows_run);
    return failures ? 1 : 0;
}
