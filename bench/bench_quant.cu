/* Benchmarks of backends/cuda on one GPU (printed tables, not tests):
 *   (a) NVFP4 quantize (float32 and BF16 in, per tensor and per row, fake-quant) at
 *       an expert's, a dense FFN's, the lm_head's and a square shape, against the
 *       device-to-device copy bandwidth measured in the same run, the kernels of
 *       issue 13 beside the ones before (qd_cuda_quant_legacy), bits compared;
 *       then the RAC pick of a weight sync (qd_cuda_rac_select_async) at a3b's
 *       4-layer linears beside the kernel before it, picks compared;
 *   (b) the canonical W4A4 GEMV/GEMM (K = 4096, N = 14336, M = 1..64) in achieved
 *       weight bandwidth, beside cuBLASLt BF16 and FP8 E4M3 (per-tensor scales);
 *   (c) --attention: fast mode's prefill attention under the BF16 recipes, the
 *       fused kernels (cuda_flash.cu) beside the batched TF32 products
 *       (qd_cuda_attend_gemm), forward and backward, at a3b's training shape
 *       (16 x 1,024 tokens, 32 / 4 heads of 128) and at 4 x 4,096, in TFLOP/s
 *       of the causal half's useful products (forward 4 D P, backward 8 D P
 *       for P query-key pairs: neither the batched route's upper triangle nor
 *       the fused backward's recomputed S counted).
 * Each time is the median of REPS launches timed with CUDA events after warm-up;
 * the L2 (60 MB on the H200) is flushed before every timed launch, so weights come
 * from HBM as in a decode step.
 *   (e) --experts: the MoE experts' BF16 products (forward, dx, dW) at a3b's
 *       training shape: cuBLASLt, cuda_grouped.cu's mma.sync kernel and each
 *       configuration of its wgmma kernel, outputs compared with cuBLASLt's.
 *   (f) --lt: the trainer's large dense BF16 products (the lm_head's forward and
 *       backward blocks, q's and o's) on each of cuBLASLt's heuristic candidates.
 *   (g) --bfp: the lm_head's exact product, today's float32 chain beside the
 *       row block-floating-point product (docs/numerics.md §3b).
 *   (h) --moe: the experts' grouped W4A4 table alone (the FP16 kernel, its
 *       wgmma twin (QUADS_W4A4_HWG_NA picks its tile; --moe-prefill: the
 *       prefill's 8,192 rows alone), the
 *       product two blocks an MMA and one), then the attention linears' at
 *       decode's rows (the FP16 kernel on activations made FP16 first beside
 *       the kernels before it); exits 1 where their bits differ.
 *   (i) --fp8: the FP8 recipe's experts in fast mode: the E4M3 tensor-core
 *       kernel beside the exact chain kernel and the W4A4 product of the
 *       same rows.
 *   (c3) --decode-attn: the exact decode attention at a3b's heads, rows x
 *       positions, in TB/s of its KV cache.
 *   (c4) --prefill-attn: the exact prefill attention at a3b's heads, a CTA a
 *       query beside the tiled kernel (QUADS_ATT_PREFILL), bits compared.
 *   (j) --stream: the decode experts' weight reads alone (no arithmetic) in
 *       the W4A4 MMA kernel's order and others, against a plain read.
 *   (k) --copy: the device-to-device copy bandwidth alone ("copy_tbs X", TB/s).
 *     bench/bench_quant [REPS] [--quantize | --attention | --decode-attn | --prefill-attn | --experts | --lt | --bfp | --moe | --moe-prefill | --fp8 | --stream | --copy] [--json FILE] [--commit ID]
 * --quantize: table (a) only; --json: its rows as JSON lines (model, engine, recipe,
 * mode, op, ms, bandwidth_fraction, commit, ...), for docs/results/train-h200.jsonl.
 * Exits 1 when a quantize output or a RAC pick of the new kernels differs from the
 * old ones'. */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>
#include "backends/cuda/cuda_blas.h"
#include "backends/cuda/cuda_die.h"
#include "backends/cuda/cuda_mma.h"
#include "backends/cuda/cuda_quant.h"
#include "quant/numerics.h"
extern "C" {
#include "backends/cuda/cuda_kernels.h"
}

static int reps = 30;
static void *flush_buf;
static const size_t flush_bytes = 256u << 20;
static cudaEvent_t ev0, ev1;

/* Median milliseconds of f() over reps launches, each after an L2 flush. */
template <typename F>
static float time_ms(F f)
{
    std::vector<float> t;
    for (int i = 0; i < 3; i++)
        f();
    QD_CUDA_DIE(cudaDeviceSynchronize());
    for (int i = 0; i < reps; i++) {
        QD_CUDA_DIE(cudaMemsetAsync(flush_buf, i & 0xff, flush_bytes));
        QD_CUDA_DIE(cudaEventRecord(ev0));
        f();
        QD_CUDA_DIE(cudaEventRecord(ev1));
        QD_CUDA_DIE(cudaEventSynchronize(ev1));
        float ms;
        QD_CUDA_DIE(cudaEventElapsedTime(&ms, ev0, ev1));
        t.push_back(ms);
    }
    QD_CUDA_DIE(cudaGetLastError());
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

/* Random N(0,1)-ish data, filled on the device. */
__global__ void fill_kernel(float *x, int64_t n, uint32_t seed)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15; h *= 0x2c1b3c6du; h ^= h >> 12; h *= 0x297a2d39u; h ^= h >> 15;
        x[i] = ((float)(h & 0xffffff) / 16777216.0f - 0.5f) * 3.4641f;
    }
}

__global__ void to_bf16_kernel(__nv_bfloat16 *y, const float *x, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(x[i]);
}

__global__ void to_fp8_kernel(__nv_fp8_e4m3 *y, const float *x, int64_t n, float scale)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __nv_fp8_e4m3(x[i] * scale);
}

static float *random_dev(int64_t n, uint32_t seed)
{
    float *x;
    QD_CUDA_DIE(cudaMalloc((void **)&x, (size_t)n * sizeof(float)));
    fill_kernel<<<1024, 256>>>(x, n, seed);
    QD_CUDA_DIE(cudaGetLastError());
    return x;
}

/* ---- (a) quantize */
static double copy_bandwidth(void)
{
    size_t bytes = 1u << 30;
    void *a, *b;
    QD_CUDA_DIE(cudaMalloc(&a, bytes));
    QD_CUDA_DIE(cudaMalloc(&b, bytes));
    QD_CUDA_DIE(cudaMemset(a, 1, bytes));
    float ms =
        time_ms([&] { QD_CUDA_DIE(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); });
    QD_CUDA_DIE(cudaFree(a));
    QD_CUDA_DIE(cudaFree(b));
    return 2.0 * bytes / (ms * 1e-3) / 1e9;
}

/* --copy: the copy bandwidth alone, one line "copy_tbs X" (TB/s of bytes read
 * + written), for bench/run_decode_h200.sh's roofline on whatever GPU it runs */
static void bench_copy(void) { printf("copy_tbs %.3f\n", copy_bandwidth() / 1e3); }

static int quant_mismatch;

__global__ void diff_kernel(unsigned long long *bad, const unsigned char *a, const unsigned char *b, size_t n)
{
    unsigned long long mine = 0;
    size_t words = n / 4, stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < words; i += stride)
        mine += ((const uint32_t *)a)[i] != ((const uint32_t *)b)[i];
    if (blockIdx.x == 0 && threadIdx.x == 0)
        for (size_t i = 4 * words; i < n; i++)
            mine += a[i] != b[i];
    if (mine)
        atomicAdd(bad, mine);
}

/* The 4-byte words (and tail bytes) that differ between two device buffers
 * (4-byte aligned), counted on the device. */
static long long dev_diff(const void *a, const void *b, size_t n)
{
    unsigned long long *d, h = 0;
    QD_CUDA_DIE(cudaMalloc((void **)&d, sizeof h));
    QD_CUDA_DIE(cudaMemset(d, 0, sizeof h));
    diff_kernel<<<1024, 256>>>(d, (const unsigned char *)a, (const unsigned char *)b, n);
    QD_CUDA_DIE(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
    QD_CUDA_DIE(cudaFree(d));
    return (long long)h;
}

/* One quantize configuration: input type (float32 or BF16), scope, or fake-quant
 * (float32 in, float32 out, per tensor). */
struct qcase {
    const char *input, *scope;
    int bf16, per_row, fake;
};

static const qcase qcases[] = {
    {"f32", "per-tensor", 0, 0, 0}, {"f32", "per-row", 0, 1, 0},   {"bf16", "per-tensor", 1, 0, 0},
    {"bf16", "per-row", 1, 1, 0},   {"f32", "fake-quant", 0, 0, 1},
};

/* Bytes a quantize must move, as counted here: x read once per pass over it
 * (per tensor: the amax pass and the quantize pass, so twice; per row: once,
 * each row held on chip between its amax and its blocks), codes (1/2 byte a
 * value), E4M3 scales (1/16) and the S_dec floats written; fake-quant writes
 * 4 bytes a value instead of codes and scales. */
static double quant_bytes(const qcase &c, int64_t rows, int64_t n, int *reads)
{
    double in = (c.bf16 ? 2.0 : 4.0) * n;
    *reads = c.per_row ? 1 : 2;
    double out = c.fake ? 4.0 * n : n / 2.0 + n / 16.0 + 4.0 * (c.per_row ? rows : 1);
    return *reads * in + out;
}

static const char *commit_id = "unknown";
static FILE *json_out;

/* The quantize table: per shape and case, the kernels of issue 13 beside the ones
 * before (qd_cuda_quant_legacy), their outputs compared bit for bit. */
static void bench_quantize(const char *model, int64_t rows, int64_t cols, double copy_gbs)
{
    int64_t n = rows * cols;
    float *x = random_dev(n, 7), *fq[2];
    uint16_t *xb;
    QD_CUDA_DIE(cudaMalloc((void **)&xb, (size_t)n * 2));
    QD_CUDA_DIE(cudaMalloc((void **)&fq[0], (size_t)n * 4));
    QD_CUDA_DIE(cudaMalloc((void **)&fq[1], (size_t)n * 4));
    to_bf16_kernel<<<1024, 256>>>((__nv_bfloat16 *)xb, x, n);
    for (const qcase &c : qcases) {
        qd_nvfp4 q[2];
        float ms[2];
        for (int legacy = 0; legacy < 2; legacy++) {
            qd_nvfp4 *qq = &q[legacy];
            float *out = fq[legacy];
            QD_STATUS_DIE(qd_cuda_nvfp4_alloc(qq, rows, cols, c.per_row ? QD_SCALE_PER_ROW : QD_SCALE_PER_TENSOR));
            qd_cuda_quant_legacy = legacy;
            ms[legacy] = time_ms([&] {
                if (c.fake)
                    QD_STATUS_DIE(qd_cuda_nvfp4_fake_quant_async(out, x, rows, cols, QD_SCALE_PER_TENSOR));
                else if (c.bf16)
                    QD_STATUS_DIE(qd_cuda_nvfp4_quantize_bf16_async(qq, xb));
                else
                    QD_STATUS_DIE(qd_cuda_nvfp4_quantize_async(qq, x));
            });
            qd_cuda_quant_legacy = 0;
            QD_STATUS_DIE(qd_cuda_nonfinite_check());
        }
        long long bad = 0;
        if (c.fake) {
            bad = dev_diff(fq[0], fq[1], (size_t)n * 4);
        } else {
            bad = dev_diff(q[0].codes, q[1].codes, (size_t)n / 2) +
                  dev_diff(q[0].scales, q[1].scales, (size_t)n / 16) +
                  dev_diff(q[0].s_dec, q[1].s_dec, 4 * (size_t)(c.per_row ? rows : 1));
        }
        int reads;
        double bytes = quant_bytes(c, rows, n, &reads), tbs = bytes / (ms[0] * 1e-3) / 1e12;
        double frac = tbs * 1e3 / copy_gbs, frac_old = bytes / (ms[1] * 1e-3) / 1e9 / copy_gbs;
        printf("| %-7s %6lld x %-5lld | %-4s | %-10s | %6.0f | %8.1f | %5.2f | %5.1f%% | %8.1f | %5.1f%% | %5.2fx | %s |\n",
               model, (long long)rows, (long long)cols, c.input, c.scope, bytes / 1e6, ms[0] * 1e3, tbs,
               100.0 * frac, ms[1] * 1e3, 100.0 * frac_old, ms[1] / ms[0], bad ? "NO" : "yes");
        fflush(stdout);
        if (json_out)
            fprintf(json_out,
                    "{\"model\": \"%s %lldx%lld\", \"engine\": \"quads\", \"recipe\": \"nvfp4\", \"mode\": \"exact\", "
                    "\"op\": \"quantize\", \"input\": \"%s\", \"scope\": \"%s\", \"ms\": %.4f, \"bytes\": %.0f, "
                    "\"x_reads\": %d, \"tb_per_s\": %.3f, \"copy_tb_per_s\": %.3f, \"bandwidth_fraction\": %.4f, "
                    "\"before_ms\": %.4f, \"before_bandwidth_fraction\": %.4f, \"bits_equal_before\": %s, "
                    "\"commit\": \"%s\"}\n",
                    model, (long long)rows, (long long)cols, c.input, c.scope, ms[0], bytes, reads, tbs,
                    copy_gbs / 1e3, frac, ms[1], frac_old, bad ? "false" : "true", commit_id);
        if (bad)
            quant_mismatch = 1;
        qd_cuda_nvfp4_free(&q[0]);
        qd_cuda_nvfp4_free(&q[1]);
    }
    QD_CUDA_DIE(cudaFree(x));
    QD_CUDA_DIE(cudaFree(xb));
    QD_CUDA_DIE(cudaFree(fq[0]));
    QD_CUDA_DIE(cudaFree(fq[1]));
}

/* ---- (b) GEMV: cuBLASLt baselines. y^T (N, M) = W (N, K) . A^T, column-major:
 * W is (K, N) with op T, A (K, M) with op N ("TN", as FP8 requires). */
struct lt_gemm {
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    void *ws;
    size_t ws_bytes;
};

static cublasStatus_t lt_run(lt_gemm *g, const void *w, const void *a, void *y)
{
    float one = 1.0f, zero = 0.0f;
    return cublasLtMatmul(g->h, g->op, &one, w, g->la, a, g->lb, &zero, y, g->lc, y, g->lc,
                          &g->algo, g->ws, g->ws_bytes, 0);
}

/* Describes the product and keeps the first heuristic algorithm that runs;
 * returns its status (the last failure when none runs). */
static cublasStatus_t lt_setup(lt_gemm *g, cublasLtHandle_t h, cudaDataType_t in,
                               cudaDataType_t out, int64_t M, int64_t N, int64_t K, const float *sa,
                               const float *sw, const void *w, const void *a, void *y)
{
    cublasOperation_t tr = CUBLAS_OP_T, nt = CUBLAS_OP_N;
    g->h = h;
    g->ws_bytes = 32u << 20;
    QD_CUDA_DIE(cudaMalloc(&g->ws, g->ws_bytes));
    cublasLtMatmulDescCreate(&g->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSA, &tr, sizeof tr);
    cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt);
    if (sa) {
        cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof sw);
        cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sa, sizeof sa);
    }
    cublasLtMatrixLayoutCreate(&g->la, in, K, N, K);
    cublasLtMatrixLayoutCreate(&g->lb, in, K, M, K);
    cublasLtMatrixLayoutCreate(&g->lc, out, N, M, N);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                         &g->ws_bytes, sizeof g->ws_bytes);
    cublasLtMatmulHeuristicResult_t res[8];
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, g->op, g->la, g->lb, g->lc, g->lc, pref,
                                                       8, res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0)
        fprintf(stderr, "cuBLASLt heuristic: status %d, %d algorithm(s)\n", (int)st, found);
    if (st == CUBLAS_STATUS_SUCCESS && found == 0)
        st = CUBLAS_STATUS_NOT_SUPPORTED;
    for (int i = 0; st == CUBLAS_STATUS_SUCCESS && i < found; i++) {
        g->algo = res[i].algo;
        st = lt_run(g, w, a, y);
        if (st == CUBLAS_STATUS_SUCCESS)
            break;
        if (i + 1 < found)
            st = CUBLAS_STATUS_SUCCESS;
    }
    cudaGetLastError();
    return st;
}

static void lt_free(lt_gemm *g)
{
    cublasLtMatrixLayoutDestroy(g->la);
    cublasLtMatrixLayoutDestroy(g->lb);
    cublasLtMatrixLayoutDestroy(g->lc);
    cublasLtMatmulDescDestroy(g->op);
    QD_CUDA_DIE(cudaFree(g->ws));
}

/* Median ms of a cuBLASLt product of M activation rows, BF16 out (or float32 out
 * where cuBLASLt takes no BF16 out); where it takes no such M, the smallest
 * multiple of 16 above it. *m_run says which M ran; -1 when nothing ran. */
static float lt_time(cublasLtHandle_t h, cudaDataType_t in, int64_t M, int64_t N, int64_t K,
                     const void *w, const void *a, void *y, const float *sa, const float *sw,
                     int64_t *m_run)
{
    int64_t ms_try[2] = {M, (M + 15) / 16 * 16};
    cudaDataType_t outs[2] = {CUDA_R_16BF, CUDA_R_32F};
    for (int t = 0; t < 4; t++) {
        lt_gemm g;
        int64_t m = ms_try[t / 2];
        cublasStatus_t st = lt_setup(&g, h, in, outs[t % 2], m, N, K, sa, sw, w, a, y);
        float ms = -1.0f;
        if (st == CUBLAS_STATUS_SUCCESS)
            ms = time_ms([&] {
                if (lt_run(&g, w, a, y) != CUBLAS_STATUS_SUCCESS)
                    exit(2);
            });
        else
            fprintf(stderr, "cuBLASLt %s M=%lld out %s: status %d\n",
                    in == CUDA_R_16BF ? "BF16" : "FP8", (long long)m,
                    t % 2 ? "F32" : "BF16", (int)st);
        lt_free(&g);
        if (ms > 0) {
            *m_run = m;
            return ms;
        }
    }
    return -1.0f;
}

static void bench_gemv(cublasLtHandle_t h)
{
    const int64_t N = 14336, K = 4096, Ms[] = {1, 2, 4, 8, 16, 32, 64};
    float *w = random_dev(N * K, 11), *a = random_dev(64 * K, 13);
    qd_nvfp4 qw, qa;
    void *wb, *ab, *w8, *a8, *yb;
    float *y, *scales;
    QD_STATUS_DIE(qd_cuda_nvfp4_alloc(&qw, N, K, QD_SCALE_PER_TENSOR));
    QD_STATUS_DIE(qd_cuda_nvfp4_quantize(&qw, w));
    QD_CUDA_DIE(cudaMalloc(&wb, (size_t)(N * K) * 2));
    QD_CUDA_DIE(cudaMalloc(&ab, (size_t)(64 * K) * 2));
    QD_CUDA_DIE(cudaMalloc(&w8, (size_t)(N * K)));
    QD_CUDA_DIE(cudaMalloc(&a8, (size_t)(64 * K)));
    QD_CUDA_DIE(cudaMalloc(&yb, (size_t)(64 * N) * 4));
    QD_CUDA_DIE(cudaMalloc((void **)&y, (size_t)(64 * N) * sizeof(float)));
    /* one allocation a scale: cuBLASLt may want its scale pointers aligned */
    float *scale_w;
    QD_CUDA_DIE(cudaMalloc((void **)&scales, sizeof(float)));
    QD_CUDA_DIE(cudaMalloc((void **)&scale_w, sizeof(float)));
    to_bf16_kernel<<<1024, 256>>>((__nv_bfloat16 *)wb, w, N * K);
    to_bf16_kernel<<<1024, 256>>>((__nv_bfloat16 *)ab, a, 64 * K);
    /* FP8 per-tensor: data in [-1.74, 1.74] times 256 stays inside E4M3's 448 */
    to_fp8_kernel<<<1024, 256>>>((__nv_fp8_e4m3 *)w8, w, N * K, 256.0f);
    to_fp8_kernel<<<1024, 256>>>((__nv_fp8_e4m3 *)a8, a, 64 * K, 256.0f);
    float inv = 1.0f / 256.0f;
    QD_CUDA_DIE(cudaMemcpy(scales, &inv, sizeof inv, cudaMemcpyHostToDevice));
    QD_CUDA_DIE(cudaMemcpy(scale_w, &inv, sizeof inv, cudaMemcpyHostToDevice));
    double wbytes4 = N * K / 2.0 + N * K / 16.0;
    printf("\n| M | W4A4 us | W4A4 weight TB/s | W4A4-TC us | W4A4-TC TB/s | BF16 us | BF16 TB/s | "
           "FP8 us | FP8 TB/s | BF16/W4A4 | BF16/W4A4-TC | BF16/FP8 |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int64_t M : Ms) {
        QD_STATUS_DIE(qd_cuda_nvfp4_alloc(&qa, M, K, QD_SCALE_PER_ROW));
        QD_STATUS_DIE(qd_cuda_nvfp4_quantize(&qa, a));
        float t4 = time_ms([&] { QD_STATUS_DIE(qd_cuda_w4a4_gemm_async(y, &qa, &qw)); });
        float tc = time_ms([&] { QD_STATUS_DIE(qd_cuda_w4a4_gemm_tc_async(y, &qa, &qw)); });
        int64_t mb = M, m8 = M;
        float tb = lt_time(h, CUDA_R_16BF, M, N, K, wb, ab, yb, NULL, NULL, &mb);
        float t8 = lt_time(h, CUDA_R_8F_E4M3, M, N, K, w8, a8, yb, scales, scale_w, &m8);
        double bw4 = wbytes4 / (t4 * 1e-3) / 1e12, bwb = 2.0 * N * K / (tb * 1e-3) / 1e12;
        double bw8 = (double)N * K / (t8 * 1e-3) / 1e12;
        printf("| %lld | %.1f | %.2f | %.1f | %.2f | ", (long long)M, t4 * 1e3, bw4, tc * 1e3,
               wbytes4 / (tc * 1e-3) / 1e12);
        if (tb > 0)
            printf("%.1f%s | %.2f | ", tb * 1e3, mb != M ? " (M=16)" : "", bwb);
        else
            printf("n/a | n/a | ");
        if (t8 > 0)
            printf("%.1f%s | %.2f | ", t8 * 1e3, m8 != M ? " (M=16)" : "", bw8);
        else
            printf("n/a | n/a | ");
        if (tb > 0)
            printf("%.2fx | %.2fx | ", tb / t4, tb / tc);
        else
            printf("n/a | n/a | ");
        if (tb > 0 && t8 > 0)
            printf("%.2fx |\n", tb / t8);
        else
            printf("n/a |\n");
        qd_cuda_nvfp4_free(&qa);
    }
    qd_cuda_nvfp4_free(&qw);
    QD_CUDA_DIE(cudaFree(w)); QD_CUDA_DIE(cudaFree(a)); QD_CUDA_DIE(cudaFree(wb));
    QD_CUDA_DIE(cudaFree(ab)); QD_CUDA_DIE(cudaFree(w8)); QD_CUDA_DIE(cudaFree(a8));
    QD_CUDA_DIE(cudaFree(yb)); QD_CUDA_DIE(cudaFree(y)); QD_CUDA_DIE(cudaFree(scales));
    QD_CUDA_DIE(cudaFree(scale_w));
}

/* (c) The MoE experts' grouped W4A4 product at Qwen3-30B-A3B's shapes (128
 * experts, gate/up 768 x 2048, down 2048 x 768) with the rows a decode step of
 * batch B routes top-8 (uniform random routing; B 8,192 is a prefill of 64
 * prompts of 128 tokens): the FP16 kernel (qd_cuda_w4a4_h16 forced), the MMA
 * kernel two blocks an MMA (qd_cuda_w4a4_pair) and one block an MMA (the
 * FP16 kernel off), outputs compared bit for bit; weight bytes are those of
 * the experts that got rows. Exits 1 where the outputs differ. */
static int grouped_mismatch;
/* off (E + 1): the experts' row offsets of a uniform top-k routing of B
 * tokens (a fixed LCG stream a batch); returns the experts touched. */
static int route_rows(int B, int E, int topk, std::vector<int64_t> &off)
{
    std::vector<int> cnt((size_t)E, 0);
    uint32_t r = 12345u + (uint32_t)B;
    for (int b = 0; b < B; b++) {
        int chosen[8], n = 0;
        while (n < topk) {
            r = r * 1664525u + 1013904223u;
            int e = (int)((r >> 8) % (uint32_t)E), dup = 0;
            for (int i = 0; i < n; i++)
                dup |= chosen[i] == e;
            if (!dup)
                chosen[n++] = e;
        }
        for (int i = 0; i < topk; i++)
            cnt[(size_t)chosen[i]]++;
    }
    off.assign((size_t)E + 1, 0);
    int touched = 0;
    for (int e = 0; e < E; e++) {
        off[(size_t)e + 1] = off[(size_t)e] + cnt[(size_t)e];
        touched += cnt[(size_t)e] > 0;
    }
    return touched;
}

/* E experts' NVFP4 copies of wf (N, K), an allocation each: a decode step
 * reads every expert it touches from HBM. */
static void nvfp4_experts(std::vector<qd_nvfp4> &w, std::vector<const qd_nvfp4 *> &pw, int E, int64_t N,
                          int64_t K, const float *wf)
{
    w.assign((size_t)E, qd_nvfp4{});
    pw.assign((size_t)E, nullptr);
    for (int e = 0; e < E; e++) {
        QD_STATUS_DIE(qd_cuda_nvfp4_alloc(&w[(size_t)e], N, K, QD_SCALE_PER_TENSOR));
        QD_STATUS_DIE(qd_cuda_nvfp4_quantize(&w[(size_t)e], wf));
        pw[(size_t)e] = &w[(size_t)e];
    }
}

static int moe_prefill_only; /* --moe-prefill: batch 8,192 only, no linears */

static void bench_grouped(void)
{
    const int E = 128, topk = 8, Bs_all[] = {1, 16, 64, 256, 8192}, Bs_pre[] = {8192};
    const int *Bs = moe_prefill_only ? Bs_pre : Bs_all, nB = moe_prefill_only ? 1 : 5;
    /* gate / up, down, and the QUADS recipe's down with its RAC channels
     * (768 + 192 at ratio 0.25: K not a multiple of 128 or 256, the wgmma and
     * streaming kernels' PART twins since 2026-12-07d) */
    const int64_t shapes[3][2] = {{768, 2048}, {2048, 768}, {2048, 960}};
    printf("\n| experts N x K | batch | rows | experts touched | fp16 us | hwg us | hwg TFLOP/s | pair us | pair TB/s "
           "| k16 us | k16 TB/s | dec us | stream us | stream TB/s | pair / fp16 | hwg / fp16 | k16 / pair | dec / pair "
           "| stream / pair | bits |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int s = 0; s < 3; s++) {
        int64_t N = shapes[s][0], K = shapes[s][1];
        std::vector<qd_nvfp4> w;
        std::vector<const qd_nvfp4 *> pw;
        float *wf = random_dev(N * K, 21);
        nvfp4_experts(w, pw, E, N, K, wf);
        for (int bi = 0; bi < nB; bi++) {
            int B = Bs[bi];
            std::vector<int64_t> off;
            int touched = route_rows(B, E, topk, off);
            int64_t R = off[(size_t)E];
            float *af = random_dev(R * K, 23), *y[6];
            qd_nvfp4 a;
            QD_STATUS_DIE(qd_cuda_nvfp4_alloc(&a, R, K, QD_SCALE_PER_ROW));
            QD_STATUS_DIE(qd_cuda_nvfp4_quantize(&a, af));
            float t[6] = {0, 0, 0, 0, 0, 0};
            /* the decode kernel (tiles of 8 rows) and the streaming one (groups of at most
             * 32 rows, else the default) at decode's batches only */
            int nv = B <= 256 ? 5 : 3;
            for (int v = 0; v < 6; v++) { /* 0 k16, 1 pair, 2 fp16, 3 dec, 4 stream, 5 fp16 on wgmma */
                if (v >= nv && v < 5)
                    continue;
                QD_CUDA_DIE(cudaMalloc((void **)&y[v], (size_t)(R * N) * sizeof(float)));
                QD_CUDA_DIE(cudaMemset(y[v], 0xff, (size_t)(R * N) * sizeof(float)));
                qd_cuda_w4a4_pair = v == 1 || v >= 3;
                qd_cuda_w4a4_h16 = v == 2 || v == 5;
                qd_cuda_w4a4_hwg = v == 5;
                qd_cuda_w4a4_dec = v == 3;
                qd_cuda_w4a4_stream = v == 4;
                t[v] = time_ms(
                    [&] { QD_STATUS_DIE(qd_cuda_w4a4_gemm_grouped_async(y[v], &a, pw.data(), off.data(), E)); });
            }
            qd_cuda_w4a4_pair = -1;
            qd_cuda_w4a4_h16 = -1;
            qd_cuda_w4a4_hwg = -1;
            qd_cuda_w4a4_dec = -1;
            qd_cuda_w4a4_stream = -1;
            long long nd = 0;
            for (int v = 1; v < 6; v++)
                if (v < nv || v == 5)
                    nd += dev_diff(y[0], y[v], (size_t)(R * N) * sizeof(float));
            grouped_mismatch |= nd != 0;
            double bytes = (double)touched * (N * K / 2.0 + N * K / 16.0);
            char dus[32] = "-", drat[32] = "-", sus[32] = "-", stb[32] = "-", srat[32] = "-";
            if (nv == 5) {
                snprintf(dus, sizeof dus, "%.1f", t[3] * 1e3);
                snprintf(drat, sizeof drat, "%.2fx", t[3] / t[1]);
                snprintf(sus, sizeof sus, "%.1f", t[4] * 1e3);
                snprintf(stb, sizeof stb, "%.2f", bytes / (t[4] * 1e-3) / 1e12);
                snprintf(srat, sizeof srat, "%.2fx", t[4] / t[1]);
            }
            double flop = 2.0 * (double)R * (double)N * (double)K;
            printf("| %lld x %lld | %d | %lld | %d | %.1f | %.1f | %.1f | %.1f | %.2f | %.1f | %.2f | %s | %s | %s "
                   "| %.2fx | %.2fx | %.2fx | %s | %s | %s |\n",
                   (long long)N, (long long)K, B, (long long)R, touched, t[2] * 1e3, t[5] * 1e3,
                   flop / (t[5] * 1e-3) / 1e12, t[1] * 1e3, bytes / (t[1] * 1e-3) / 1e12, t[0] * 1e3,
                   bytes / (t[0] * 1e-3) / 1e12, dus, sus, stb, t[1] / t[2], t[5] / t[2], t[0] / t[1], drat, srat,
                   nd ? "DIFFER" : "equal");
            qd_cuda_nvfp4_free(&a);
            QD_CUDA_DIE(cudaFree(af));
            for (int v = 0; v < 6; v++)
                if (v < nv || v == 5)
                    QD_CUDA_DIE(cudaFree(y[v]));
        }
        for (auto &q : w)
            qd_cuda_nvfp4_free(&q);
        QD_CUDA_DIE(cudaFree(wf));
    }
}

/* (c2) The attention linears' W4A4 products at a3b's shapes (q, k, v: N 4096,
 * 512, 512 of K 2048 from one activation, one call; o: N 2048, K 4096) at
 * decode's row counts: the FP16 kernel with the activations made FP16 first
 * (qd_cuda_w4a4_hpre forced) beside the kernels without it, bits compared
 * (exit 1 where they differ). */
static void bench_linears(void)
{
    const int Ms[] = {16, 64, 128, 256};
    const int64_t Nq[3] = {4096, 512, 512}, K = 2048, No = 2048, Ko = 4096;
    printf("\n| product | rows | weight MB | hpre us | hpre TB/s | before us | before TB/s | stream us | stream TB/s "
           "| before / hpre | before / stream | bits |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    qd_nvfp4 wq[3], wo;
    for (int i = 0; i < 3; i++) {
        float *f = random_dev(Nq[i] * K, 41 + i);
        QD_STATUS_DIE(qd_cuda_nvfp4_alloc(&wq[i], Nq[i], K, QD_SCALE_PER_TENSOR));
        QD_STATUS_DIE(qd_cuda_nvfp4_quantize(&wq[i], f));
        QD_CUDA_DIE(cudaFree(f));
    }
    float *fo = random_dev(No * Ko, 45);
    QD_STATUS_DIE(qd_cuda_nvfp4_alloc(&wo, No, Ko, QD_SCALE_PER_TENSOR));
    QD_STATUS_DIE(qd_cuda_nvfp4_quantize(&wo, fo));
    QD_CUDA_DIE(cudaFree(fo));
    for (int M : Ms) {
        for (int prod = 0; prod < 2; prod++) {
            int64_t KK = prod ? Ko : K, outs = prod ? No : Nq[0] + Nq[1] + Nq[2];
            float *x = random_dev(M * KK, 47), *y[3];
            qd_nvfp4 a;
            QD_STATUS_DIE(qd_cuda_nvfp4_alloc(&a, M, KK, QD_SCALE_PER_ROW));
            QD_STATUS_DIE(qd_cuda_nvfp4_quantize(&a, x));
            float t[3];
            for (int v = 0; v < 3; v++) { /* 0 hpre, 1 before it, 2 the streaming kernel (up to 64 rows) */
                QD_CUDA_DIE(cudaMalloc((void **)&y[v], (size_t)(M * outs) * sizeof(float)));
                QD_CUDA_DIE(cudaMemset(y[v], 0xff, (size_t)(M * outs) * sizeof(float)));
                qd_cuda_w4a4_hpre = v == 0;
                qd_cuda_w4a4_stream = v == 2;
                float *yy[3] = {y[v], y[v] + M * Nq[0], y[v] + M * (Nq[0] + Nq[1])};
                const qd_nvfp4 *aa[3] = {&a, &a, &a}, *ww[3] = {&wq[0], &wq[1], &wq[2]};
                t[v] = time_ms([&] {
                    if (prod)
                        QD_STATUS_DIE(qd_cuda_w4a4_gemm_tc_async(y[v], &a, &wo));
                    else
                        QD_STATUS_DIE(qd_cuda_w4a4_gemm_multi_async(yy, aa, ww, 3));
                });
            }
            qd_cuda_w4a4_hpre = -1;
            qd_cuda_w4a4_stream = -1;
            long long nd = dev_diff(y[0], y[1], (size_t)(M * outs) * sizeof(float)) +
                           dev_diff(y[0], y[2], (size_t)(M * outs) * sizeof(float));
            grouped_mismatch |= nd != 0;
            double bytes = (double)outs * KK * (0.5 + 1.0 / 16);
            printf("| %s | %d | %.1f | %.1f | %.2f | %.1f | %.2f | %.1f | %.2f | %.2fx | %.2fx | %s |\n",
                   prod ? "o 2048 x 4096" : "q,k,v x 2048", M, bytes / 1e6, t[0] * 1e3, bytes / (t[0] * 1e-3) / 1e12,
                   t[1] * 1e3, bytes / (t[1] * 1e-3) / 1e12, t[2] * 1e3, bytes / (t[2] * 1e-3) / 1e12, t[1] / t[0],
                   t[1] / t[2], nd ? "DIFFER" : "equal");
            qd_cuda_nvfp4_free(&a);
            QD_CUDA_DIE(cudaFree(x));
            for (int v = 0; v < 3; v++)
                QD_CUDA_DIE(cudaFree(y[v]));
        }
    }
    for (int i = 0; i < 3; i++)
        qd_cuda_nvfp4_free(&wq[i]);
    qd_cuda_nvfp4_free(&wo);
}

/* (d) The exact forward product x . W^T at the lm_head's shape (vocab 151936,
 * hidden 2048, float32 weights holding BF16 values as the exact path keeps
 * them): qdk_matmul_wt (fmaf where exact) beside qdk_matmul. */
__global__ void round_bf16_kernel(float *x, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = qd_round_bf16(x[i]);
}

static void bench_lm_head(void)
{
    const int64_t N = 151936, K = 2048;
    const int Ms[] = {1, 16, 64, 256};
    float *w = random_dev(N * K, 31), *a = random_dev(256 * K, 33), *y;
    round_bf16_kernel<<<1024, 256>>>(w, N * K);
    round_bf16_kernel<<<1024, 256>>>(a, 256 * K);
    QD_CUDA_DIE(cudaMalloc((void **)&y, (size_t)(256 * N) * sizeof(float)));
    printf("\n| lm_head x . W^T exact, M | new us | new TFLOP/s | new weight TB/s | before us | speedup |\n"
           "|---|---|---|---|---|---|\n");
    for (int M : Ms) {
        float tn = time_ms([&] { QD_STATUS_DIE(qdk_matmul_wt(y, a, w, QDK_F32, M, (int)N, (int)K, QD_PREC_BF16)); });
        float to = time_ms([&] { QD_STATUS_DIE(qdk_matmul(y, a, w, M, (int)N, (int)K, QDK_NT, QDK_OVERWRITE)); });
        printf("| %d | %.1f | %.2f | %.2f | %.1f | %.2fx |\n", M, tn * 1e3, 2.0 * M * N * K / (tn * 1e-3) / 1e12,
               4.0 * N * K / (tn * 1e-3) / 1e12, to * 1e3, to / tn);
    }
    QD_CUDA_DIE(cudaFree(w));
    QD_CUDA_DIE(cudaFree(a));
    QD_CUDA_DIE(cudaFree(y));
}

/* Shapes of the quantize table: a Qwen3-30B-A3B expert, a dense FFN weight, the
 * lm_head, and a square matrix. */
static void quantize_table(double copy)
{
    printf("| shape | in | scope | MB moved | us | TB/s | of copy | before us | before of copy | speedup | bits equal |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|\n");
    bench_quantize("expert", 2048, 768, copy);
    bench_quantize("ffn", 4096, 14336, copy);
    bench_quantize("lm_head", 151936, 2048, copy);
    bench_quantize("square", 8192, 8192, copy);
}

/* ---- (a) cont.: the RAC pick of a weight sync (qd_cuda_rac_select_async) at a3b's
 * 4-layer RAC linears (each layer: q, k, v of K 2048, o of 4096, 128 experts'
 * gate and up of 2048 and down of 768; 1552 in all), ratio 0.25, beside the
 * kernel before (qd_cuda_quant_legacy), the picks compared. Errors all zero
 * (a sync with no statistics since the last, as bench_backend's weight sync)
 * or all distinct. */
static void bench_rac_select(void)
{
    std::vector<int> K;
    std::vector<size_t> off;
    size_t total = 0;
    for (int l = 0; l < 4; l++) {
        for (int w : {2048, 2048, 2048, 4096})
            K.push_back(w);
        for (int e = 0; e < 128; e++)
            for (int w : {2048, 2048, 768})
                K.push_back(w);
    }
    for (int w : K) {
        off.push_back(total);
        total += (size_t)w;
    }
    std::vector<double> err(total);
    double *derr;
    int64_t *ch[2];
    QD_CUDA_DIE(cudaMalloc((void **)&derr, total * sizeof(double)));
    for (int i = 0; i < 2; i++)
        QD_CUDA_DIE(cudaMalloc((void **)&ch[i], total * sizeof(int64_t)));
    printf("\n| RAC pick, a3b 4 layers | linears | channels | us | before us | speedup | picks equal |\n"
           "|---|---|---|---|---|---|---|\n");
    for (int distinct = 0; distinct < 2; distinct++) {
        for (size_t k = 0; k < total; k++) {
            uint64_t h = (uint64_t)k * 0x9e3779b97f4a7c15ull;
            h = (h ^ (h >> 31)) * 0xbf58476d1ce4e5b9ull;
            err[k] = distinct ? (double)(h >> 11) * 0x1.0p-53 : 0.0;
        }
        QD_CUDA_DIE(cudaMemcpy(derr, err.data(), total * sizeof(double), cudaMemcpyHostToDevice));
        float ms[2];
        for (int legacy = 0; legacy < 2; legacy++) {
            QD_CUDA_DIE(cudaMemset(ch[legacy], 0xff, total * sizeof(int64_t)));
            qd_cuda_quant_legacy = legacy;
            ms[legacy] = time_ms([&] {
                QD_STATUS_DIE(qd_cuda_rac_select_async(ch[legacy], derr, off.data(), K.data(), (int)K.size(), 0.25));
            });
            qd_cuda_quant_legacy = 0;
            QD_STATUS_DIE(qd_cuda_nonfinite_check());
        }
        long long bad = dev_diff(ch[0], ch[1], total * sizeof(int64_t));
        printf("| errors %-8s | %7zu | %8zu | %8.1f | %9.1f | %6.1fx | %s |\n", distinct ? "distinct" : "zero",
               K.size(), total, ms[0] * 1e3, ms[1] * 1e3, ms[1] / ms[0], bad ? "NO" : "yes");
        fflush(stdout);
        if (json_out)
            fprintf(json_out,
                    "{\"model\": \"a3b-4\", \"engine\": \"quads\", \"recipe\": \"quads\", \"mode\": \"exact\", "
                    "\"op\": \"rac_select\", \"errors\": \"%s\", \"linears\": %zu, \"ms\": %.4f, \"before_ms\": %.4f, "
                    "\"bits_equal_before\": %s, \"commit\": \"%s\"}\n",
                    distinct ? "distinct" : "zero", K.size(), ms[0], ms[1], bad ? "false" : "true", commit_id);
        if (bad)
            quant_mismatch = 1;
    }
    QD_CUDA_DIE(cudaFree(derr));
    QD_CUDA_DIE(cudaFree(ch[0]));
    QD_CUDA_DIE(cudaFree(ch[1]));
}

/* max |a - b| / max |b| over n floats on the device */
__global__ void absdiff_kernel(unsigned *out, const float *a, const float *b, int64_t n)
{
    float d = 0.f, m = 0.f;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        d = fmaxf(d, fabsf(a[i] - b[i]));
        m = fmaxf(m, fabsf(b[i]));
        if (a[i] != a[i])
            d = INFINITY;
    }
    atomicMax(&out[0], __float_as_uint(d)); /* non-negative floats order as their bits */
    atomicMax(&out[1], __float_as_uint(m));
}

static double rel_diff(const float *a, const float *b, int64_t n)
{
    unsigned *d, h[2];
    QD_CUDA_DIE(cudaMalloc((void **)&d, sizeof h));
    QD_CUDA_DIE(cudaMemset(d, 0, sizeof h));
    absdiff_kernel<<<1024, 256>>>(d, a, b, n);
    QD_CUDA_DIE(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    QD_CUDA_DIE(cudaFree(d));
    float fd, fm;
    memcpy(&fd, &h[0], 4);
    memcpy(&fm, &h[1], 4);
    return fm > 0 ? fd / fm : fd;
}

static int wg_ok; /* compute capability 9.0: the wgmma kernels run */

/* ---- (c) the prefill attention: B sequences of T tokens, H / KV heads of D */
static void attention_row(int B, int T, int H, int KV, int D)
{
    int N = B * T;
    if (!qd_cuda_flash_fits(N, D, H, KV, T)) {
        printf("| %d x %d, %d / %d x %d | the fused kernels do not take this shape |\n", B, T, H, KV, D);
        return;
    }
    std::vector<int32_t> seq(B + 1), pos(N);
    for (int b = 0; b <= B; b++)
        seq[b] = b * T;
    for (int n = 0; n < N; n++)
        pos[n] = n % T;
    int32_t *dpos;
    QD_CUDA_DIE(cudaMalloc((void **)&dpos, sizeof(int32_t) * N));
    QD_CUDA_DIE(cudaMemcpy(dpos, pos.data(), sizeof(int32_t) * N, cudaMemcpyHostToDevice));
    int64_t nq = (int64_t)N * H * D, nk = (int64_t)N * KV * D, na = (int64_t)N * H * T;
    float *q = random_dev(nq, 1), *k = random_dev(nk, 2), *v = random_dev(nk, 3), *dout = random_dev(nq, 4);
    float *out, *att, *ds, *dq, *dk, *dv;
    QD_CUDA_DIE(cudaMalloc((void **)&out, sizeof(float) * nq));
    QD_CUDA_DIE(cudaMalloc((void **)&dq, sizeof(float) * nq));
    QD_CUDA_DIE(cudaMalloc((void **)&dk, sizeof(float) * nk));
    QD_CUDA_DIE(cudaMalloc((void **)&dv, sizeof(float) * nk));
    QD_CUDA_DIE(cudaMalloc((void **)&att, sizeof(float) * na));
    QD_CUDA_DIE(cudaMalloc((void **)&ds, sizeof(float) * na));
    double pairs = (double)B * H * T * (T + 1) / 2, ff = 4.0 * D * pairs, fb = 8.0 * D * pairs;
    const int32_t *so = seq.data();
    auto ok = [](qd_status st) {
        if (st != QD_OK) {
            fprintf(stderr, "bench_quant: attention: %s\n", qd_last_error());
            exit(1);
        }
    };
    float t[4], tw[2] = {0.f, 0.f};
    qd_cuda_flash_wg = 0; /* the mma.sync kernels */
    t[0] = time_ms([&] { ok(qd_cuda_flash_attend(out, att, q, k, v, so, B, N, H, KV, D, T)); });
    t[1] = time_ms([&] { /* dq, dk, dv stored, as the trainer's attention backward does (QD_BWD_DX_SET) */
        ok(qd_cuda_flash_attend_backward(dq, dk, dv, ds, dout, out, att, q, k, v, so, B, N, H, KV, D, T, 1));
    });
    double dwg[2] = {-1.0, -1.0}; /* the wgmma kernels' outputs against the mma.sync ones' (out; dq) */
    if (wg_ok) {
        float *o1, *g1;
        QD_CUDA_DIE(cudaMalloc((void **)&o1, sizeof(float) * nq));
        QD_CUDA_DIE(cudaMalloc((void **)&g1, sizeof(float) * nq));
        QD_CUDA_DIE(cudaMemset(dq, 0, sizeof(float) * nq));
        ok(qd_cuda_flash_attend(out, att, q, k, v, so, B, N, H, KV, D, T));
        ok(qd_cuda_flash_attend_backward(dq, dk, dv, ds, dout, out, att, q, k, v, so, B, N, H, KV, D, T, 0));
        qd_cuda_flash_wg = 1;
        QD_CUDA_DIE(cudaMemset(g1, 0, sizeof(float) * nq));
        ok(qd_cuda_flash_attend(o1, att, q, k, v, so, B, N, H, KV, D, T));
        ok(qd_cuda_flash_attend_backward(g1, dk, dv, ds, dout, o1, att, q, k, v, so, B, N, H, KV, D, T, 0));
        dwg[0] = rel_diff(o1, out, nq);
        dwg[1] = rel_diff(g1, dq, nq);
        tw[0] = time_ms([&] { ok(qd_cuda_flash_attend(out, att, q, k, v, so, B, N, H, KV, D, T)); });
        tw[1] = time_ms([&] {
            ok(qd_cuda_flash_attend_backward(dq, dk, dv, ds, dout, out, att, q, k, v, so, B, N, H, KV, D, T, 1));
        });
        qd_cuda_flash_wg = -1;
        QD_CUDA_DIE(cudaFree(o1));
        QD_CUDA_DIE(cudaFree(g1));
    }
    t[2] = time_ms([&] { ok(qd_cuda_attend_gemm(out, att, q, k, v, dpos, so, B, N, H, KV, D, T, QD_GEMM_TF32)); });
    t[3] = time_ms([&] {
        ok(qd_cuda_attend_gemm_backward(dq, dk, dv, ds, dout, att, q, k, v, dpos, so, B, N, H, KV, D, T,
                                        QD_GEMM_TF32));
    });
    const char *dir[2] = {"forward", "backward"};
    for (int i = 0; i < 2; i++) {
        double f = i ? fb : ff;
        printf("| %d x %d, %d / %d x %d | %s | %.3f | %.0f | %.3f | %.0f | %.2f |", B, T, H, KV, D, dir[i], t[i],
               f / t[i] * 1e-9, t[2 + i], f / t[2 + i] * 1e-9, t[2 + i] / t[i]);
        if (wg_ok)
            printf(" %.3f | %.0f | %.2f | %.1e |\n", tw[i], f / tw[i] * 1e-9, t[i] / tw[i], dwg[i]);
        else
            printf(" - | - | - | - |\n");
    }
    float *bufs[] = {q, k, v, dout, out, dq, dk, dv, att, ds};
    for (float *b : bufs)
        QD_CUDA_DIE(cudaFree(b));
    QD_CUDA_DIE(cudaFree(dpos));
}

static void bench_attention(void)
{
    printf("\nprefill attention (causal), fused BF16 kernels vs cuBLAS batched TF32 products; TFLOP/s of the\n"
           "causal half's useful products (forward 4 D P, backward 8 D P, P query-key pairs)\n\n");
    printf("wgmma = the same fused kernels on Hopper's warpgroup MMA (QUADS_FLASH_WG=1); diff = max |wgmma -\n"
           "fused| / max |fused| of out (forward) and dq (backward)\n\n");
    printf("| shape (B x T, H / KV x D) | direction | fused ms | fused TFLOP/s | batched ms | batched TFLOP/s | "
           "fused speed-up | wgmma ms | wgmma TFLOP/s | wgmma / fused | diff |\n"
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    attention_row(16, 1024, 32, 4, 128);
    attention_row(4, 4096, 32, 4, 128);
}

/* (c3) --decode-attn: the exact decode attention (qdk_attend: k_attend_gqa) at
 * a3b's heads (32 query / 4 KV heads of 128) for B rows each at position T - 1
 * of its own float32 KV cache, the bytes its keys and values are (B T 4 128 4
 * x 2) in TB/s: a decode step at batch 64 spent about 35 us a layer here on
 * the H200 (ncu), for 42 MB at T 192. T 8,320: the last step of the 48-layer
 * row (128 + 8,192 tokens), whose generate took more than 51 ms a step on
 * average on the H200 (2026-12-06): ~2.2 GB a layer at batch 64. */
static void bench_decode_attn(void)
{
    const int H = 32, KV = 4, D = 128, Bs[] = {1, 64, 256}, Ts[] = {192, 1024, 4096, 8320};
    printf("\n| rows | positions | KV MB | us | TB/s |\n|---|---|---|---|---|\n");
    for (int B : Bs)
        for (int T : Ts) {
            size_t kd = (size_t)KV * D, cache = (size_t)B * T * kd;
            float *q = random_dev((int64_t)B * H * D, 71), *kb = random_dev((int64_t)cache, 73);
            float *vb = random_dev((int64_t)cache, 79), *out, *att;
            int32_t *kbase, *pos;
            std::vector<int32_t> hb((size_t)B), hp((size_t)B, T - 1);
            for (int b = 0; b < B; b++)
                hb[(size_t)b] = b * T;
            QD_CUDA_DIE(cudaMalloc((void **)&out, sizeof(float) * (size_t)B * H * D));
            QD_CUDA_DIE(cudaMalloc((void **)&att, sizeof(float) * (size_t)B * H * T));
            QD_CUDA_DIE(cudaMalloc((void **)&kbase, sizeof(int32_t) * (size_t)B));
            QD_CUDA_DIE(cudaMalloc((void **)&pos, sizeof(int32_t) * (size_t)B));
            QD_CUDA_DIE(cudaMemcpy(kbase, hb.data(), sizeof(int32_t) * (size_t)B, cudaMemcpyHostToDevice));
            QD_CUDA_DIE(cudaMemcpy(pos, hp.data(), sizeof(int32_t) * (size_t)B, cudaMemcpyHostToDevice));
            float ms = time_ms([&] { QD_STATUS_DIE(qdk_attend(out, att, q, kb, vb, kbase, pos, B, H, KV, D, T)); });
            double bytes = 2.0 * (double)cache * sizeof(float);
            printf("| %d | %d | %.1f | %.1f | %.2f |\n", B, T, bytes / 1e6, ms * 1e3, bytes / (ms * 1e-3) / 1e12);
            QD_CUDA_DIE(cudaFree(q));
            QD_CUDA_DIE(cudaFree(kb));
            QD_CUDA_DIE(cudaFree(vb));
            QD_CUDA_DIE(cudaFree(out));
            QD_CUDA_DIE(cudaFree(att));
            QD_CUDA_DIE(cudaFree(kbase));
            QD_CUDA_DIE(cudaFree(pos));
        }
}

/* (c4) --prefill-attn: the exact prefill attention at a3b's heads (32 query /
 * 4 KV heads of 128) over B sequences of T tokens (the packing of model.c:
 * kbase the sequence's first row, pos the position in it): k_attend_gqa a
 * CTA a query (qdk_attend) beside the tiled kernel (qdk_attend_prefill with
 * QUADS_ATT_PREFILL=1: 16 queries x 8 heads a CTA), out and att compared bit
 * for bit (exits 1 where they differ); GFLOP/s of the useful products
 * (4 D a query-key pair, the causal half). */
static void bench_prefill_attn(void)
{
    setenv("QUADS_ATT_PREFILL", "1", 0); /* read at qdk_attend_prefill's first call */
    const int H = 32, KV = 4, D = 128, shapes[][2] = {{64, 128}, {16, 1024}, {1, 4096}};
    printf("\nexact prefill attention, a3b heads: per query (k_attend_gqa) vs tiles (QUADS_ATT_PREFILL=%s)\n\n",
           getenv("QUADS_ATT_PREFILL"));
    printf("| B x T | per query ms | GFLOP/s | tiles ms | GFLOP/s | speed-up | bits |\n|---|---:|---:|---:|---:|---:|---|\n");
    for (auto &sh : shapes) {
        int B = sh[0], T = sh[1], N = B * T;
        std::vector<int32_t> seq(B + 1), pos(N), kb(N);
        for (int b = 0; b <= B; b++)
            seq[b] = b * T;
        for (int n = 0; n < N; n++)
            pos[n] = n % T, kb[n] = n / T * T;
        int32_t *dpos, *dkb;
        QD_CUDA_DIE(cudaMalloc((void **)&dpos, sizeof(int32_t) * N));
        QD_CUDA_DIE(cudaMalloc((void **)&dkb, sizeof(int32_t) * N));
        QD_CUDA_DIE(cudaMemcpy(dpos, pos.data(), sizeof(int32_t) * N, cudaMemcpyHostToDevice));
        QD_CUDA_DIE(cudaMemcpy(dkb, kb.data(), sizeof(int32_t) * N, cudaMemcpyHostToDevice));
        int64_t nq = (int64_t)N * H * D, nk = (int64_t)N * KV * D, na = (int64_t)N * H * T;
        float *q = random_dev(nq, 81), *k = random_dev(nk, 83), *v = random_dev(nk, 85), *o[2], *a[2];
        for (int i = 0; i < 2; i++) {
            QD_CUDA_DIE(cudaMalloc((void **)&o[i], sizeof(float) * nq));
            QD_CUDA_DIE(cudaMalloc((void **)&a[i], sizeof(float) * na));
            QD_CUDA_DIE(cudaMemset(o[i], 0, sizeof(float) * nq));
            QD_CUDA_DIE(cudaMemset(a[i], 0, sizeof(float) * na));
        }
        float t0 = time_ms([&] { QD_STATUS_DIE(qdk_attend(o[0], a[0], q, k, v, dkb, dpos, N, H, KV, D, T)); });
        float t1 = time_ms([&] {
            QD_STATUS_DIE(qdk_attend_prefill(o[1], a[1], q, k, v, dkb, dpos, seq.data(), B, N, H, KV, D, T));
        });
        int same = !dev_diff(o[0], o[1], (size_t)nq * sizeof(float)) && !dev_diff(a[0], a[1], (size_t)na * sizeof(float));
        if (!same)
            grouped_mismatch = 1;
        double f = 4.0 * D * (double)B * H * T * (T + 1) / 2;
        printf("| %d x %d | %.3f | %.0f | %.3f | %.0f | %.2f | %s |\n", B, T, t0, f / t0 * 1e-6, t1, f / t1 * 1e-6,
               t0 / t1, same ? "equal" : "DIFFER");
        float *bufs[] = {q, k, v, o[0], o[1], a[0], a[1]};
        for (float *b : bufs)
            QD_CUDA_DIE(cudaFree(b));
        QD_CUDA_DIE(cudaFree(dpos));
        QD_CUDA_DIE(cudaFree(dkb));
    }
}

/* ---- (e) --experts: the MoE experts' BF16 products at a3b's training shape
 * (128 experts, 16 x 1,024 tokens x top-8 = 131,072 rows, uneven: 768 to 1,280
 * an expert; hidden 2,048, expert width 768; gate and up are two products of
 * the gate|up shape each; the fast trainer runs gate's and up's backward as one
 * product of twice the rows, QUADS_GATE_UP), forward, dx and dW: cuBLASLt (one
 * matmul an expert over 4 streams, the backward's default), our mma.sync kernel
 * (QUADS_EXPERT_GEMM=mma) and each wgmma configuration (QUADS_EXPERT_GEMM=wgmma,
 * QUADS_WGMMA_CFG; the forward's default on Hopper: 0 where K >= N, else 2);
 * each output compared with cuBLASLt's (max |diff| / max |lt|). */
static void bench_experts(void)
{
    /* the lt column is cuBLASLt's: the default path would take the wgmma kernel
     * for the forward (cuda_blas.cu's expert_path reads this at its first call) */
    setenv("QUADS_EXPERT_GEMM", "lt", 1);
    const int E = 128;
    std::vector<int32_t> off(E + 1, 0);
    int64_t R = 16 * 1024 * 8;
    for (int e = 0; e < E; e++) {
        uint32_t h = (uint32_t)e * 2654435761u;
        h ^= h >> 13;
        off[e + 1] = off[e] + 768 + (int32_t)(h % 513);
    }
    R = off[E]; /* about 131,000 */
    const int64_t maxNK = 2048 * 768; /* N K of every product */
    uint16_t *x, *dy, *w;
    float *out[2];
    {
        float *t = random_dev(R * 2048, 41);
        QD_CUDA_DIE(cudaMalloc((void **)&x, sizeof(uint16_t) * R * 2048));
        QD_CUDA_DIE(cudaMalloc((void **)&dy, sizeof(uint16_t) * R * 2048));
        to_bf16_kernel<<<1024, 256>>>((__nv_bfloat16 *)x, t, R * 2048);
        fill_kernel<<<1024, 256>>>(t, R * 2048, 43);
        to_bf16_kernel<<<1024, 256>>>((__nv_bfloat16 *)dy, t, R * 2048);
        QD_CUDA_DIE(cudaFree(t));
        t = random_dev(E * maxNK, 47);
        QD_CUDA_DIE(cudaMalloc((void **)&w, sizeof(uint16_t) * E * maxNK));
        to_bf16_kernel<<<1024, 256>>>((__nv_bfloat16 *)w, t, E * maxNK);
        QD_CUDA_DIE(cudaFree(t));
    }
    size_t out_n = std::max((size_t)R * 2048, (size_t)E * maxNK);
    for (int i = 0; i < 2; i++)
        QD_CUDA_DIE(cudaMalloc((void **)&out[i], sizeof(float) * out_n));
    static const struct {
        const char *name;
        int kind; /* 0 y = x.W^T, 1 dx += dy.W, 2 dW += dy^T.x */
        int64_t N, K; /* the linear's out and in features */
    } ops[] = {{"gate|up y=x.W^T", 0, 768, 2048}, {"down y=x.W^T", 0, 2048, 768},
               {"gate|up dx+=dy.W", 1, 768, 2048}, {"down dx+=dy.W", 1, 2048, 768},
               {"gate|up dW+=dy^T.x", 2, 768, 2048}, {"down dW+=dy^T.x", 2, 2048, 768}};
    int ncfg = qd_cuda_grouped_wgmma_configs();
    printf("\nMoE experts' BF16 products, a3b training shape: %d experts, %lld rows (768..1,280 an expert); TFLOP/s\n"
           "of 2 rows N K; lt = cuBLASLt an expert over 4 streams (the backward's default), mma = our mma.sync kernel,\n"
           "wgN = its wgmma kernel in configuration N (QUADS_WGMMA_CFG); diff = max|out - lt| / max|lt|\n\n",
           E, (long long)R);
    printf("| op | N x K | lt ms | lt TFLOP/s | mma ms | mma TFLOP/s |");
    for (int c = 0; c < ncfg; c++)
        printf(" wg%d ms | wg%d TFLOP/s | wg%d diff |", c, c, c);
    printf(" best / lt |\n|---|---|---:|---:|---:|---:|");
    for (int c = 0; c < ncfg; c++)
        printf("---:|---:|---:|");
    printf("---:|\n");
    for (const auto &op : ops) {
        int64_t N = op.N, K = op.K;
        std::vector<const uint16_t *> wp(E);
        for (int e = 0; e < E; e++)
            wp[e] = w + (size_t)e * N * K;
        std::vector<float *> dwp[2];
        for (int i = 0; i < 2; i++)
            for (int e = 0; e < E; e++)
                dwp[i].push_back(out[i] + (size_t)e * N * K);
        /* the products as cuda_blas.cu's experts_forward / experts_backward list them */
        std::vector<qd_grp_gemm> g[2];
        int ta = op.kind == 2, tb = op.kind == 0;
        float beta = op.kind ? 1.0f : 0.0f;
        for (int i = 0; i < 2; i++)
            for (int e = 0; e < E; e++) {
                int64_t r0 = off[e], m = off[e + 1] - r0;
                if (op.kind == 0)
                    g[i].push_back({x + r0 * K, wp[e], out[i] + r0 * N, (int)m, (int)N, (int)K, 1.0f});
                else if (op.kind == 1)
                    g[i].push_back({dy + r0 * N, wp[e], out[i] + r0 * K, (int)m, (int)K, (int)N, 1.0f});
                else
                    g[i].push_back({dy + r0 * N, x + r0 * K, dwp[i][e], (int)N, (int)K, (int)m, 1.0f});
            }
        auto lt = [&](int i) {
            if (op.kind == 0)
                QD_STATUS_DIE(qd_cuda_gemm_grouped_bf16(out[i], x, wp.data(), NULL, off.data(), E, N, K));
            else
                QD_STATUS_DIE(qd_cuda_gemm_grouped_bf16_backward(op.kind == 1 ? out[i] : NULL,
                                                                 op.kind == 2 ? dwp[i].data() : NULL, dy, x,
                                                                 wp.data(), NULL, off.data(), E, N, K));
        };
        size_t n_out = op.kind == 2 ? (size_t)E * N * K : (size_t)R * (op.kind == 1 ? K : N);
        double flop = 2.0 * R * N * K;
        QD_CUDA_DIE(cudaMemset(out[0], 0, sizeof(float) * n_out));
        lt(0); /* the reference output, from zero */
        float t_lt = time_ms([&] { lt(1); });
        float t_mma = time_ms([&] { QD_STATUS_DIE(qd_cuda_grouped_mma_bf16(g[1].data(), E, ta, tb, beta)); });
        printf("| %s | %lld x %lld | %.3f | %.0f | %.3f | %.0f |", op.name, (long long)N, (long long)K, t_lt,
               flop / t_lt * 1e-9, t_mma, flop / t_mma * 1e-9);
        float best = t_mma < t_lt ? t_mma : t_lt;
        for (int c = 0; c < ncfg; c++) {
            QD_CUDA_DIE(cudaMemset(out[1], 0, sizeof(float) * n_out));
            qd_status st = qd_cuda_grouped_wgmma_bf16(g[1].data(), E, ta, tb, beta, c);
            if (st != QD_OK) {
                printf(" - | - | %s |", qd_status_str(st));
                continue;
            }
            double diff = rel_diff(out[1], out[0], (int64_t)n_out);
            float t = time_ms([&] { QD_STATUS_DIE(qd_cuda_grouped_wgmma_bf16(g[1].data(), E, ta, tb, beta, c)); });
            printf(" %.3f | %.0f | %.1e |", t, flop / t * 1e-9, diff);
            best = t < best ? t : best;
        }
        printf(" %.2fx |\n", t_lt / best);
        fflush(stdout);
    }
    QD_CUDA_DIE(cudaFree(x));
    QD_CUDA_DIE(cudaFree(dy));
    QD_CUDA_DIE(cudaFree(w));
    QD_CUDA_DIE(cudaFree(out[0]));
    QD_CUDA_DIE(cudaFree(out[1]));
}

/* ---- (f) --lt: the trainer's large dense BF16 products at a3b's training
 * shape (16 x 1,024 tokens; hidden 2,048, q 4,096, vocab 151,936), each on
 * cuBLASLt's heuristic candidates 0..7 (qd_cuda_lt_force; fast mode takes the
 * first that runs): the lm_head's forward, and its backward as backward16 runs
 * it, in blocks of 16,384 vocab columns (dx += dy_b . W_b, dW_b = dy_b^T . x),
 * then q's and o's products. Whether another candidate than the first is
 * faster, and by how much. */
static void bench_lt(void)
{
    const int64_t T = 16 * 1024, C = 2048, Q = 4096, V = 151936, NB = 16384;
    static const struct {
        const char *name;
        int kind; /* 0 y = x.W^T, 1 dx += dy.W, 2 dW = dy^T.x */
        int64_t N, K; /* out, in features of the product's linear */
    } ops[] = {{"lm_head y=x.W^T", 0, V, C},       {"lm_head dx+=dy_b.W_b", 1, NB, C},
               {"lm_head dW_b=dy_b^T.x", 2, NB, C}, {"q y=x.W^T", 0, Q, C},
               {"q dx+=dy.W", 1, Q, C},              {"q dW+=dy^T.x", 2, Q, C},
               {"o y=x.W^T", 0, C, Q},              {"o dx+=dy.W", 1, C, Q},
               {"o dW+=dy^T.x", 2, C, Q}};
    size_t maxa = (size_t)T * Q, maxw = (size_t)V * C, maxo = (size_t)T * V;
    uint16_t *a16, *w16, *d16;
    float *out;
    {
        float *t = random_dev((int64_t)maxw, 51);
        QD_CUDA_DIE(cudaMalloc((void **)&w16, sizeof(uint16_t) * maxw));
        to_bf16_kernel<<<1024, 256>>>((__nv_bfloat16 *)w16, t, (int64_t)maxw);
        QD_CUDA_DIE(cudaFree(t));
        t = random_dev((int64_t)(T * NB), 53);
        QD_CUDA_DIE(cudaMalloc((void **)&a16, sizeof(uint16_t) * maxa));
        QD_CUDA_DIE(cudaMalloc((void **)&d16, sizeof(uint16_t) * T * NB));
        to_bf16_kernel<<<1024, 256>>>((__nv_bfloat16 *)a16, t, (int64_t)maxa);
        to_bf16_kernel<<<1024, 256>>>((__nv_bfloat16 *)d16, t, (int64_t)(T * NB));
        QD_CUDA_DIE(cudaFree(t));
        QD_CUDA_DIE(cudaMalloc((void **)&out, sizeof(float) * maxo));
        QD_CUDA_DIE(cudaMemset(out, 0, sizeof(float) * maxo));
    }
    printf("\nDense BF16 products (cuBLASLt), a3b training shape (%lld tokens); ms and TFLOP/s of each of the\n"
           "heuristic's candidates (c0: fast mode's choice)\n\n| op | M x N x K |",
           (long long)T);
    for (int i = 0; i < 8; i++)
        printf(" c%d ms | c%d TFLOP/s |", i, i);
    printf(" best / c0 |\n|---|---|");
    for (int i = 0; i < 8; i++)
        printf("---:|---:|");
    printf("---:|\n");
    for (const auto &op : ops) {
        int64_t N = op.N, K = op.K;
        double flop = 2.0 * T * N * K;
        auto run = [&]() -> qd_status {
            if (op.kind == 0)
                return qd_cuda_gemm_bf16(out, a16, w16, T, N, K, 0.0f);
            if (op.kind == 1)
                return qd_cuda_gemm_bf16_dx_scaled(out, d16, w16, T, N, K, 1.0f, 1.0f);
            return qd_cuda_gemm_bf16_dw(out, d16, a16, T, N, K, op.N == NB ? 0.0f : 1.0f);
        };
        printf("| %s | %lld x %lld x %lld |", op.name, (long long)T, (long long)N, (long long)K);
        float t0 = 0, best = 0;
        for (int i = 0; i < 8; i++) {
            qd_cuda_lt_force(i);
            qd_status st = run();
            QD_CUDA_DIE(cudaDeviceSynchronize());
            if (st != QD_OK) {
                printf(" - | - |");
                continue;
            }
            float t = time_ms([&] { QD_STATUS_DIE(run()); });
            printf(" %.3f | %.0f |", t, flop / t * 1e-9);
            if (i == 0)
                t0 = t;
            best = best == 0 || t < best ? t : best;
        }
        qd_cuda_lt_force(-1);
        printf(" %.2fx |\n", t0 > 0 && best > 0 ? t0 / best : 0.0);
        fflush(stdout);
    }
    QD_CUDA_DIE(cudaFree(a16));
    QD_CUDA_DIE(cudaFree(w16));
    QD_CUDA_DIE(cudaFree(d16));
    QD_CUDA_DIE(cudaFree(out));
}

/* ---- (g) --bfp: the lm_head's exact product at a3b's shape (K 2,048, vocab
 * 151,936): the float32 chain of today's exact mode (qdk_matmul_wt on the BF16
 * weight bits, x float32) beside the row block-floating-point product
 * (qdk_matmul_bfp, docs/numerics.md §3b; x's conversion included; the
 * weights' conversion, once a weight sync, timed alone), at decode's rows (1,
 * 16, 64, 256) and a training micro-batch's 1,024 and 16,384. Bytes: the
 * weights at their stored width (2 a weight either way: BF16 bits, or the
 * mantissas' two bytes) and x; "of copy" against the copy bandwidth of the
 * same run; diff: max |bfp - chain| / max |chain|. */
static void bench_bfp(double copy)
{
    const int64_t N = 151936, K = 2048, MMAX = 16384;
    const int Ms[] = {1, 16, 64, 256, 1024, 16384};
    float *wf = random_dev(N * K, 61), *x = random_dev(MMAX * K, 63), *y[3];
    uint16_t *w16;
    void *wq, *ws;
    QD_CUDA_DIE(cudaMalloc((void **)&w16, sizeof(uint16_t) * N * K));
    to_bf16_kernel<<<1024, 256>>>((__nv_bfloat16 *)w16, wf, N * K);
    QD_CUDA_DIE(cudaFree(wf));
    QD_CUDA_DIE(cudaMalloc(&wq, qd_bfp_bytes((int)N, (int)K)));
    QD_CUDA_DIE(cudaMalloc(&ws, qdk_bfp_rows_bytes((int)MMAX, (int)K)));
    for (int i = 0; i < 3; i++)
        QD_CUDA_DIE(cudaMalloc((void **)&y[i], sizeof(float) * MMAX * N));
    float tw = time_ms([&] { QD_STATUS_DIE(qdk_bfp_weights(wq, w16, NULL, (int)N, (int)K)); });
    printf("\nThe lm_head's exact product, K %lld x vocab %lld: the float32 chain (today) and the row BFP product;\n"
           "bfp_weights (once a sync): %.3f ms, %.0f GB/s (%.0f%% of copy)\n\n"
           "| M | chain ms | chain TFLOP/s | bfp ms | bfp TFLOP/s | bfp GB/s | of copy | chain / bfp | diff "
           "| bfp wgmma ms | of copy | bfp / wgmma | bits |\n"
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
           (long long)K, (long long)N, tw, 4.0 * N * K / (tw * 1e-3) / 1e9, 4.0 * N * K / (tw * 1e-3) / 1e9 / copy * 100);
    for (int M : Ms) {
        double flop = 2.0 * M * N * K, bytes = 2.0 * N * K + 4.0 * M * K + 4.0 * M * N;
        float tc = time_ms([&] { QD_STATUS_DIE(qdk_matmul_wt(y[0], x, w16, QDK_BF16, M, (int)N, (int)K, QD_PREC_F32)); });
        qd_cuda_bfp_wgmma = 0;
        float tb = time_ms([&] { QD_STATUS_DIE(qdk_matmul_bfp(y[1], x, wq, ws, M, (int)K, (int)N)); });
        qd_cuda_bfp_wgmma = wg_ok; /* past 4 rows, k_matmul_bfp_wg (compute capability 9.0) */
        float tg = time_ms([&] { QD_STATUS_DIE(qdk_matmul_bfp(y[2], x, wq, ws, M, (int)K, (int)N)); });
        qd_cuda_bfp_wgmma = -1;
        long long nd = dev_diff(y[1], y[2], sizeof(float) * (size_t)M * (size_t)N);
        grouped_mismatch |= nd != 0;
        printf("| %d | %.3f | %.1f | %.3f | %.1f | %.0f | %.0f%% | %.2fx | %.1e | %.3f | %.0f%% | %.2fx | %s |\n", M, tc,
               flop / (tc * 1e-3) / 1e12, tb, flop / (tb * 1e-3) / 1e12, bytes / (tb * 1e-3) / 1e9,
               bytes / (tb * 1e-3) / 1e9 / copy * 100, tc / tb, rel_diff(y[1], y[0], (int64_t)M * N), tg,
               bytes / (tg * 1e-3) / 1e9 / copy * 100, tb / tg, nd ? "DIFFER" : "equal");
        fflush(stdout);
    }
    QD_CUDA_DIE(cudaFree(w16));
    QD_CUDA_DIE(cudaFree(wq));
    QD_CUDA_DIE(cudaFree(ws));
    QD_CUDA_DIE(cudaFree(x));
    for (int i = 0; i < 3; i++)
        QD_CUDA_DIE(cudaFree(y[i]));
}

/* (j) --stream: how the decode experts' weight reads meet HBM, without their
 * arithmetic. The gate's codes of a3b (128 experts x 768 rows x 1,024 bytes,
 * 96 MB) read by CTAs of 128 threads that each own a tile of ROWS rows, in
 * pieces of ROWS x CHUNK bytes copied by cp.async (16 bytes a copy) into a
 * ring of STAGES pieces (STAGES - 1 in flight while one is "used": a word of
 * it read), either chunk by chunk across the tile's rows (RM false: the
 * W4A4 MMA kernels' order, 128 bytes of each of 64 rows 1 KB apart) or
 * contiguous (RM true: the tile's bytes front to back), with PAD bytes of
 * shared memory a CTA to hold the residency of the real kernel (about 42 KB:
 * 4-5 CTAs an SM). Which of bytes in flight, access order and residency
 * holds the kernel near 1.2 TB/s is then a table, not a guess. */
template <int ROWS, int CHUNK, int STAGES, bool RM>
__global__ void __launch_bounds__(128) k_stream(const uint8_t *src, int64_t L, unsigned *sink)
{
    extern __shared__ __align__(16) unsigned char st_sm[];
    constexpr int PB = ROWS * CHUNK, COPIES = PB / 16, PER_ROW = CHUNK / 16;
    const uint8_t *base = src + (int64_t)blockIdx.x * ROWS * L;
    const int pieces = (int)(L / CHUNK);
    auto issue = [&](int p, int s) {
        for (int i = threadIdx.x; i < COPIES; i += 128) {
            const uint8_t *g = RM ? base + (int64_t)p * PB + i * 16
                                  : base + (int64_t)(i / PER_ROW) * L + (int64_t)p * CHUNK + (i % PER_ROW) * 16;
            cp16(st_sm + s * PB + i * 16, g, true);
        }
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < pieces)
            issue(s, s);
        asm volatile("cp.async.commit_group;");
    }
    unsigned x = 0;
    for (int p = 0; p < pieces; p++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2));
        __syncthreads();
        if (p + STAGES - 1 < pieces)
            issue(p + STAGES - 1, (p + STAGES - 1) % STAGES);
        asm volatile("cp.async.commit_group;");
        x ^= *(const unsigned *)(st_sm + (p % STAGES) * PB + (threadIdx.x * 4) % PB);
    }
    asm volatile("cp.async.wait_group 0;");
    if (x == 0x9e3779b9u)
        atomicAdd(sink, 1u);
}

/* The plain read: every thread 4 loads of 16 bytes in flight, grid-stride. */
__global__ void __launch_bounds__(256) k_stream_ldg(const uint4 *src, int64_t n, unsigned *sink)
{
    unsigned x = 0;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++)
            v[u] = i + u * stride < n ? __ldcs(src + i + u * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < 4; u++)
            x ^= v[u].x ^ v[u].w;
    }
    if (x == 0x9e3779b9u)
        atomicAdd(sink, 1u);
}

template <int ROWS, int CHUNK, int STAGES, bool RM>
static void stream_row(const uint8_t *src, int64_t rows, int64_t L, unsigned *sink, int pad, const char *what)
{
    int smem = STAGES * ROWS * CHUNK > pad ? STAGES * ROWS * CHUNK : pad, per_sm = 0;
    auto k = k_stream<ROWS, CHUNK, STAGES, RM>;
    QD_CUDA_DIE(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    QD_CUDA_DIE(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, 128, smem));
    float ms = time_ms([&] { k<<<(unsigned)(rows / ROWS), 128, smem>>>(src, L, sink); });
    double bytes = (double)rows * L;
    printf("| %s | %d | %d | %d | %s | %.1f | %d | %.1f | %.2f |\n", what, ROWS, CHUNK, STAGES,
           RM ? "contiguous" : "chunk by chunk", smem / 1024.0, per_sm, ms * 1e3, bytes / (ms * 1e-3) / 1e12);
}

static void bench_stream(void)
{
    const int64_t rows = 128 * 768, L = 1024;
    uint8_t *src;
    unsigned *sink;
    QD_CUDA_DIE(cudaMalloc((void **)&src, (size_t)(rows * L)));
    QD_CUDA_DIE(cudaMalloc((void **)&sink, sizeof(unsigned)));
    QD_CUDA_DIE(cudaMemset(src, 0x5a, (size_t)(rows * L)));
    int sms = 0;
    QD_CUDA_DIE(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    float ms = time_ms([&] { k_stream_ldg<<<sms * 8, 256>>>((const uint4 *)src, rows * L / 16, sink); });
    printf("\nthe a3b gate's codes (%lld rows x %lld bytes, %.0f MB), read only:\n"
           "plain 16-byte loads, 4 in flight a thread: %.1f us, %.2f TB/s\n\n",
           (long long)rows, (long long)L, rows * L / 1e6, ms * 1e3, rows * L / (ms * 1e-3) / 1e12);
    printf("| what | rows a CTA | chunk bytes | stages | order | smem KB | CTAs / SM | us | TB/s |\n"
           "|---|---|---|---|---|---|---|---|---|\n");
    const int pad = 42 * 1024;
    stream_row<64, 128, 2, false>(src, rows, L, sink, pad, "the MMA kernel's reads (1 chunk in flight)");
    stream_row<64, 128, 4, false>(src, rows, L, sink, pad, "3 chunks in flight");
    stream_row<64, 128, 2, true>(src, rows, L, sink, pad, "1 piece in flight, contiguous");
    stream_row<64, 128, 4, true>(src, rows, L, sink, pad, "3 pieces in flight, contiguous");
    stream_row<64, 128, 2, false>(src, rows, L, sink, 0, "1 chunk in flight, no pad");
    stream_row<64, 128, 4, false>(src, rows, L, sink, 0, "3 chunks in flight, no pad");
    stream_row<64, 128, 4, true>(src, rows, L, sink, 0, "3 pieces contiguous, no pad");
    stream_row<16, 128, 4, false>(src, rows, L, sink, 0, "a warp's 16 rows, 3 chunks in flight");
    stream_row<16, 256, 4, false>(src, rows, L, sink, 0, "16 rows, 256-byte chunks");
    stream_row<16, 128, 8, false>(src, rows, L, sink, 0, "16 rows, 7 chunks in flight");
    stream_row<64, 256, 4, false>(src, rows, L, sink, 0, "64 rows, 256-byte chunks");
    stream_row<16, 128, 4, true>(src, rows, L, sink, 0, "16 rows repacked: 2 KB pieces, 3 in flight");
    stream_row<16, 128, 8, true>(src, rows, L, sink, 0, "16 rows repacked: 2 KB pieces, 7 in flight");
    stream_row<64, 256, 4, true>(src, rows, L, sink, 0, "64 rows repacked: 16 KB pieces, 3 in flight");
    stream_row<16, 1024, 2, true>(src, rows, L, sink, 0, "a tile of 16 whole rows at once (16 KB)");
    stream_row<32, 1024, 2, true>(src, rows, L, sink, 0, "a tile of 32 whole rows at once (32 KB)");
    QD_CUDA_DIE(cudaFree(src));
    QD_CUDA_DIE(cudaFree(sink));
}

static double rel_diff(const float *a, const float *b, int64_t n);

/* (i) --fp8: the FP8 recipe's experts (fast mode) at (h)'s shapes and
 * routings: the E4M3 tensor-core kernel (qd_cuda_gemm_fp8_grouped,
 * fast mode's default since 2026-12-06) beside the exact chain kernel that ran them before in
 * both modes (qdk_matmul_grouped E4M3; batch 8,192 run once, not timed) and
 * the default W4A4 product of the same rows (the NVFP4 recipe's); TB/s of
 * the weight bytes of the experts touched (FP8: N K + 4 N; NVFP4: N K / 2 +
 * N K / 16); the tensor cores' largest |y - exact| / max |exact|. */
static void bench_fp8(void)
{
    const int E = 128, topk = 8, Bs[] = {1, 16, 64, 256, 8192};
    const int64_t shapes[2][2] = {{768, 2048}, {2048, 768}};
    printf("\n| experts N x K | batch | rows | experts touched | fp8 tc us | fp8 tc TB/s | fp8 exact us | "
           "exact / tc | w4a4 us | w4a4 TB/s | fp8 tc / w4a4 | max rel diff |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int s = 0; s < 2; s++) {
        int64_t N = shapes[s][0], K = shapes[s][1];
        std::vector<uint8_t *> qw((size_t)E);
        std::vector<float *> sw((size_t)E);
        std::vector<qd_nvfp4> w;
        std::vector<const qd_nvfp4 *> pw;
        float *wf = random_dev(N * K, 21);
        nvfp4_experts(w, pw, E, N, K, wf);
        for (int e = 0; e < E; e++) {
            QD_CUDA_DIE(cudaMalloc((void **)&qw[(size_t)e], (size_t)(N * K)));
            QD_CUDA_DIE(cudaMalloc((void **)&sw[(size_t)e], (size_t)N * sizeof(float)));
            QD_STATUS_DIE(qd_cuda_fp8_quantize_rows_async(qw[(size_t)e], sw[(size_t)e], wf, N, K));
        }
        for (int B : Bs) {
            std::vector<int64_t> off;
            int touched = route_rows(B, E, topk, off);
            int64_t R = off[(size_t)E];
            std::vector<int32_t> off32((size_t)E + 1);
            for (int e = 0; e <= E; e++)
                off32[(size_t)e] = (int32_t)off[(size_t)e];
            float *af = random_dev(R * K, 23), *sa, *y[3];
            uint8_t *qa;
            QD_CUDA_DIE(cudaMalloc((void **)&qa, (size_t)(R * K)));
            QD_CUDA_DIE(cudaMalloc((void **)&sa, (size_t)R * sizeof(float)));
            QD_STATUS_DIE(qd_cuda_fp8_quantize_rows_async(qa, sa, af, R, K));
            qd_nvfp4 a;
            QD_STATUS_DIE(qd_cuda_nvfp4_alloc(&a, R, K, QD_SCALE_PER_ROW));
            QD_STATUS_DIE(qd_cuda_nvfp4_quantize(&a, af));
            for (int v = 0; v < 3; v++)
                QD_CUDA_DIE(cudaMalloc((void **)&y[v], (size_t)(R * N) * sizeof(float)));
            std::vector<qdk_mm_item> it((size_t)E);
            for (int e = 0; e < E; e++) {
                int64_t r0 = off[(size_t)e], m = off[(size_t)e + 1] - r0;
                it[(size_t)e] = qdk_mm_item{qa + r0 * K, qw[(size_t)e], y[1] + r0 * N, sa + r0, sw[(size_t)e],
                                            (int)m, m ? (int)N : 0, (int)K};
            }
            auto exact = [&] { QD_STATUS_DIE(qdk_matmul_grouped(it.data(), E, QDK_NT, QDK_OVERWRITE, QDK_E4M3)); };
            float tc = time_ms([&] {
                QD_STATUS_DIE(qd_cuda_gemm_fp8_grouped(y[0], qa, sa, (const uint8_t *const *)qw.data(),
                                                       (const float *const *)sw.data(), off32.data(), E, N, K));
            });
            float tx = 0.f;
            if (B <= 256)
                tx = time_ms(exact);
            else
                exact();
            float t4 = time_ms([&] { QD_STATUS_DIE(qd_cuda_w4a4_gemm_grouped_async(y[2], &a, pw.data(), off.data(), E)); });
            QD_CUDA_DIE(cudaDeviceSynchronize());
            double rd = rel_diff(y[0], y[1], R * N);
            double b8 = (double)touched * (N * K + 4.0 * N), b4 = (double)touched * (N * K / 2.0 + N * K / 16.0);
            char txs[32] = "-", rat[32] = "-";
            if (tx > 0) {
                snprintf(txs, sizeof txs, "%.1f", tx * 1e3);
                snprintf(rat, sizeof rat, "%.2fx", tx / tc);
            }
            printf("| %lld x %lld | %d | %lld | %d | %.1f | %.2f | %s | %s | %.1f | %.2f | %.2fx | %.2e |\n",
                   (long long)N, (long long)K, B, (long long)R, touched, tc * 1e3, b8 / (tc * 1e-3) / 1e12, txs, rat,
                   t4 * 1e3, b4 / (t4 * 1e-3) / 1e12, tc / t4, rd);
            qd_cuda_nvfp4_free(&a);
            QD_CUDA_DIE(cudaFree(af));
            QD_CUDA_DIE(cudaFree(qa));
            QD_CUDA_DIE(cudaFree(sa));
            for (int v = 0; v < 3; v++)
                QD_CUDA_DIE(cudaFree(y[v]));
        }
        for (int e = 0; e < E; e++) {
            QD_CUDA_DIE(cudaFree(qw[(size_t)e]));
            QD_CUDA_DIE(cudaFree(sw[(size_t)e]));
            qd_cuda_nvfp4_free(&w[(size_t)e]);
        }
        QD_CUDA_DIE(cudaFree(wf));
    }
}

int main(int argc, char **argv)
{
    cudaDeviceProp p;
    cublasLtHandle_t h;
    /* the tables that run alone, print nothing else and exit 0 */
    static const struct {
        const char *arg;
        void (*run)(void);
    } alone[] = {{"--attention", bench_attention}, {"--decode-attn", bench_decode_attn}, {"--prefill-attn", bench_prefill_attn}, {"--experts", bench_experts},
                 {"--lt", bench_lt},               {"--fp8", bench_fp8},                 {"--stream", bench_stream},
                 {"--copy", bench_copy}};
    void (*solo)(void) = NULL;
    int only_quantize = 0, only_bfp = 0, only_moe = 0;
    for (int i = 1; i < argc; i++) {
        int k = 0;
        while (k < (int)(sizeof alone / sizeof alone[0]) && strcmp(argv[i], alone[k].arg))
            k++;
        if (k < (int)(sizeof alone / sizeof alone[0]))
            solo = alone[k].run;
        else if (!strcmp(argv[i], "--quantize"))
            only_quantize = 1;
        else if (!strcmp(argv[i], "--bfp"))
            only_bfp = 1;
        else if (!strcmp(argv[i], "--moe"))
            only_moe = 1;
        else if (!strcmp(argv[i], "--moe-prefill"))
            only_moe = moe_prefill_only = 1;
        else if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json_out = fopen(argv[++i], "w");
        else if (!strcmp(argv[i], "--commit") && i + 1 < argc)
            commit_id = argv[++i];
        else if (atoi(argv[i]) > 0)
            reps = atoi(argv[i]);
        else {
            fprintf(stderr, "usage: bench/bench_quant [REPS] [--quantize | --attention | --decode-attn | --prefill-attn | --experts | --lt | --bfp | --moe | --moe-prefill | --fp8 | --stream | --copy] "
                            "[--json FILE] [--commit ID]\n");
            return 2;
        }
    }
    QD_CUDA_DIE(cudaGetDeviceProperties(&p, 0));
    QD_CUDA_DIE(cudaMalloc(&flush_buf, flush_bytes));
    QD_CUDA_DIE(cudaEventCreate(&ev0));
    QD_CUDA_DIE(cudaEventCreate(&ev1));
    wg_ok = p.major == 9 && p.minor == 0;
    printf("device: %s, %d SMs, L2 %d MB; median of %d reps, L2 flushed before each\n", p.name,
           p.multiProcessorCount, p.l2CacheSize >> 20, reps);
    if (solo) {
        solo();
        return grouped_mismatch;
    }
    if (only_moe) {
        bench_grouped();
        if (!moe_prefill_only)
            bench_linears();
        return grouped_mismatch;
    }
    double copy = copy_bandwidth();
    printf("device-to-device copy (1 GiB, bytes read + written): %.0f GB/s\n", copy);
    if (only_bfp) {
        bench_bfp(copy);
        return grouped_mismatch;
    }
    printf("quantize bytes: x read once per pass (per-tensor twice: amax pass + quantize pass; per-row once,\n"
           "the row held on chip), + codes (n/2) + E4M3 scales (n/16) + S_dec; fake-quant writes 4n instead\n\n");
    quantize_table(copy);
    bench_rac_select();
    if (json_out)
        fclose(json_out);
    if (only_quantize)
        return quant_mismatch;
    if (cublasLtCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasLtCreate failed\n");
        return 2;
    }
    bench_gemv(h);
    bench_grouped();
    bench_lm_head();
    cublasLtDestroy(h);
    return quant_mismatch | grouped_mismatch;
}
