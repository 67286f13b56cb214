/* The fast mode's GEMMs through cuBLASLt (the experts' through cuBLAS), and
 * the native Blackwell NVFP4 W4A4 product (docs/numerics.md §3, §7). See
 * cuda_blas.h for the contract.
 *
 * cuBLASLt is column-major; our matrices are row-major, and a row-major (r, c)
 * matrix is the column-major (c, r) matrix with the same bytes. So a row-major
 * C = op(A) . op(B) is computed as the column-major C^T = op(B)^T . op(A)^T:
 * cuBLASLt's A is our B and its B is our A. The forward y = x . W^T becomes
 * cuBLASLt's "TN" (W transposed, x not), the only layout FP8 and FP4 take. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "backends/cuda/cuda_blas.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_quant.h"

#define MAX_DEVICES 16
#define MAX_PLANS 64 /* distinct (type, shape, alignment) products kept per device */
#define MAX_ALGOS 8  /* heuristic candidates kept per plan, tried in order */
#define WORKSPACE_BYTES ((size_t)32 << 20) /* NVIDIA's recommendation for Hopper/Blackwell */
#define THREADS 256
#define PTR_SLOTS 8 /* pointer uploads in flight before the host waits for the oldest */
#define MAX_XSTREAMS 16 /* side streams the experts' products may spread over */

/* The operand type of a product; the output is always float32. */
enum { KIND_F32, KIND_BF16, KIND_FP8, KIND_FP4 };
static const char *const kind_names[] = {"f32", "bf16", "fp8-e4m3", "nvfp4"};

/* What identifies a cuBLASLt plan. Compared with memcmp: always zero-filled first. */
typedef struct {
    int32_t kind, op_a, op_b;           /* cuBLASLt's (column-major) transposes */
    int64_t m, n, k, lda, ldb, ldc;     /* cuBLASLt's dimensions, in elements */
    uint32_t align_a, align_b, align_c; /* bytes, powers of two up to 256 */
} plan_key;

typedef struct {
    plan_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc; /* lc serves as C and D */
    cublasLtMatmulAlgo_t algo[MAX_ALGOS];
    int n_algo, use; /* candidates, and the one that ran last */
    int tuned;       /* QUADS_LT_TUNE=1: use is the fastest candidate (lt_tune) */
} plan;

typedef struct {
    int ready;
    cublasLtHandle_t h;
    cublasHandle_t bh; /* cuBLAS (the experts' products), made on first use */
    void *ws;         /* cuBLASLt's workspace */
    float *one;       /* device 1.0f: FP8's per-tensor scales */
    uint8_t *scratch; /* swizzled block scales of the native W4A4 */
    size_t scratch_bytes;
    struct {
        void **h, **d;  /* pinned host staging, device */
        size_t cap;
        cudaEvent_t ev; /* recorded after the slot's last upload */
        int live;
    } ring[PTR_SLOTS];  /* pointer arrays (attention's, grouped calls'), a slot a call in turn */
    int ring_next;
    void **dptr;        /* the device copy of the last upload */
    cublasLtMatrixLayout_t vl[3]; /* the experts' per-call layouts (A, B: BF16; C: float32) */
    int nxs;                      /* side streams made (expert_streams) */
    cudaStream_t xs[MAX_XSTREAMS];
    cudaEvent_t xev[MAX_XSTREAMS], xfork; /* a side stream's end; the fork on the default stream */
    void *xws[MAX_XSTREAMS];      /* a workspace each: their products run at once */
    plan plans[MAX_PLANS];
    int n_plans, evict; /* plans in use; the next one replaced when full */
} blas_ctx;

static blas_ctx ctxs[MAX_DEVICES];
/* qd_cuda_w4a4_path's answer per device, plus one; 0 before the first query */
static int path_known[MAX_DEVICES];

/* ---- errors: the call, the file and the line, and cuBLASLt's status name */
static qd_status lt_error(cublasStatus_t s, const char *call, const char *file, int line,
                          const plan_key *k)
{
    qd_status st = s == CUBLAS_STATUS_NOT_SUPPORTED ? QD_ERR_UNSUPPORTED : QD_ERR_DEVICE;
    if (!k)
        return qd_error(st, "%s:%d: %s: %s (%s)", file, line, call, cublasLtGetStatusName(s),
                        cublasLtGetStatusString(s));
    return qd_error(st, "%s:%d: %s: %s (%s) for %s, cuBLASLt m %lld n %lld k %lld op %c%c", file, line,
                    call, cublasLtGetStatusName(s), cublasLtGetStatusString(s), kind_names[k->kind],
                    (long long)k->m, (long long)k->n, (long long)k->k,
                    k->op_a == CUBLAS_OP_T ? 'T' : 'N', k->op_b == CUBLAS_OP_T ? 'T' : 'N');
}

#define LT_CHECK(call, key)                                                                            \
    do {                                                                                               \
        cublasStatus_t lt_st_ = (call);                                                                \
        if (lt_st_ != CUBLAS_STATUS_SUCCESS)                                                           \
            return lt_error(lt_st_, #call, __FILE__, __LINE__, (key));                                 \
    } while (0)

/* ---- per-device state */
/* Frees what a plan holds (a failed plan_make may leave some handles NULL). */
static void plan_destroy(plan *p)
{
    if (p->la)
        cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb)
        cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc)
        cublasLtMatrixLayoutDestroy(p->lc);
    if (p->desc)
        cublasLtMatmulDescDestroy(p->desc);
    memset(p, 0, sizeof *p);
}

static void ctx_release(blas_ctx *c)
{
    for (int i = 0; i < c->n_plans; i++)
        plan_destroy(&c->plans[i]);
    if (c->h)
        cublasLtDestroy(c->h);
    if (c->bh)
        cublasDestroy(c->bh);
    cudaFree(c->ws);
    cudaFree(c->one);
    cudaFree(c->scratch);
    for (int i = 0; i < PTR_SLOTS; i++) {
        cudaFreeHost(c->ring[i].h);
        cudaFree(c->ring[i].d);
        if (c->ring[i].ev)
            cudaEventDestroy(c->ring[i].ev);
    }
    for (int i = 0; i < 3; i++)
        if (c->vl[i])
            cublasLtMatrixLayoutDestroy(c->vl[i]);
    for (int i = 0; i < c->nxs; i++) {
        cudaStreamDestroy(c->xs[i]);
        cudaEventDestroy(c->xev[i]);
        cudaFree(c->xws[i]);
    }
    if (c->xfork)
        cudaEventDestroy(c->xfork);
    memset(c, 0, sizeof *c);
}

static qd_status ctx_init(blas_ctx *c)
{
    const float one = 1.0f;
    LT_CHECK(cublasLtCreate(&c->h), NULL);
    QD_CUDA_CHECK(cudaMalloc(&c->ws, WORKSPACE_BYTES));
    QD_CUDA_CHECK(cudaMalloc((void **)&c->one, sizeof(float)));
    QD_CUDA_CHECK(cudaMemcpy(c->one, &one, sizeof one, cudaMemcpyHostToDevice));
    c->ready = 1;
    return QD_OK;
}

/* The current device's state, made on first use. */
static qd_status get_ctx(blas_ctx **out)
{
    int dev;
    QD_CUDA_CHECK(cudaGetDevice(&dev));
    if (dev < 0 || dev >= MAX_DEVICES)
        return qd_error(QD_ERR_UNSUPPORTED, "cuda_blas: device %d (at most %d devices)", dev,
                        MAX_DEVICES);
    blas_ctx *c = &ctxs[dev];
    if (!c->ready) {
        qd_status st = ctx_init(c);
        if (st != QD_OK) {
            ctx_release(c);
            return st;
        }
    }
    *out = c;
    return QD_OK;
}

void qd_cuda_blas_release(void)
{
    int dev;
    if (cudaGetDevice(&dev) == cudaSuccess && dev >= 0 && dev < MAX_DEVICES && ctxs[dev].ready)
        ctx_release(&ctxs[dev]);
}

/* ---- plans */
static cudaDataType_t kind_type(int kind)
{
    switch (kind) {
    case KIND_BF16: return CUDA_R_16BF;
    case KIND_FP8: return CUDA_R_8F_E4M3;
    case KIND_FP4: return CUDA_R_4F_E2M1;
    default: return CUDA_R_32F;
    }
}

/* The largest power of two (up to 256) that divides the address. */
static uint32_t ptr_align(const void *p)
{
    uintptr_t a = (uintptr_t)p | 256u;
    return (uint32_t)(a & (~a + 1));
}

static qd_status set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const void *v,
                          size_t size, const plan_key *k)
{
    LT_CHECK(cublasLtMatmulDescSetAttribute(d, attr, v, size), k);
    return QD_OK;
}

/* Block-scaled FP4 reads its scales through A/B_SCALE_POINTER; FP8 gets 1.0f. */
static qd_status set_scale_ptrs(plan *p, const void *scale_a, const void *scale_b)
{
    const plan_key *k = &p->key;
    QD_TRY(set_attr(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale_a, sizeof scale_a, k));
    QD_TRY(set_attr(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale_b, sizeof scale_b, k));
    return QD_OK;
}

/* The descriptor: float32 compute and scale type; the FP8/FP4 attributes. */
static qd_status plan_desc(plan *p, const void *scale_a, const void *scale_b)
{
    const plan_key *k = &p->key;
    LT_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), k);
    QD_TRY(set_attr(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &k->op_a, sizeof k->op_a, k));
    QD_TRY(set_attr(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &k->op_b, sizeof k->op_b, k));
    if (k->kind == KIND_FP8) {
        int8_t fast = 0; /* keep the periodic promotion to float32 (the default, made explicit) */
        QD_TRY(set_attr(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast, k));
    }
    if (k->kind == KIND_FP4) {
        int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3;
        QD_TRY(set_attr(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode, k));
        QD_TRY(set_attr(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode, k));
    }
    if (k->kind == KIND_FP8 || k->kind == KIND_FP4)
        QD_TRY(set_scale_ptrs(p, scale_a, scale_b));
    return QD_OK;
}

/* The stored (before the op) rows and columns of cuBLASLt's A, B and C for a
 * product of its sizes m, n, k under the key's transposes. */
static void stored_dims(const plan_key *key, uint64_t m, uint64_t n, uint64_t k, uint64_t dims[3][2])
{
    int ta = key->op_a == CUBLAS_OP_T, tb = key->op_b == CUBLAS_OP_T;
    dims[0][0] = ta ? k : m, dims[0][1] = ta ? m : k;
    dims[1][0] = tb ? n : k, dims[1][1] = tb ? k : n;
    dims[2][0] = m, dims[2][1] = n;
}

/* Layouts describe the stored matrices (before the op); then the heuristic. */
static qd_status plan_make(blas_ctx *c, plan *p, const void *scale_a, const void *scale_b)
{
    const plan_key *k = &p->key;
    cudaDataType_t in = kind_type(k->kind);
    QD_TRY(plan_desc(p, scale_a, scale_b));
    uint64_t d[3][2];
    stored_dims(k, (uint64_t)k->m, (uint64_t)k->n, (uint64_t)k->k, d);
    LT_CHECK(cublasLtMatrixLayoutCreate(&p->la, in, d[0][0], d[0][1], k->lda), k);
    LT_CHECK(cublasLtMatrixLayoutCreate(&p->lb, in, d[1][0], d[1][1], k->ldb), k);
    LT_CHECK(cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, d[2][0], d[2][1], k->ldc), k);

    cublasLtMatmulPreference_t pref;
    size_t ws = WORKSPACE_BYTES;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref), k);
    /* the alignment the pointers have: the default (256 bytes) would let the
     * heuristic pick kernels that refuse a pointer into the middle of a tensor */
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof ws);
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    const uint32_t align[4] = {k->align_a, k->align_b, k->align_c, k->align_c};
    for (int i = 0; i < 4; i++)
        cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i], sizeof align[i]);
    cublasLtMatmulHeuristicResult_t res[MAX_ALGOS];
    int found = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(c->h, p->desc, p->la, p->lb, p->lc, p->lc, pref,
                                                      MAX_ALGOS, res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s == CUBLAS_STATUS_SUCCESS && found == 0)
        s = CUBLAS_STATUS_NOT_SUPPORTED;
    if (s != CUBLAS_STATUS_SUCCESS)
        return lt_error(s, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__, k);
    for (int i = 0; i < found; i++)
        p->algo[i] = res[i].algo;
    p->n_algo = found;
    return QD_OK;
}

/* The cached plan for key, made (replacing the oldest when full) on a miss. */
static qd_status plan_get(blas_ctx *c, const plan_key *key, const void *scale_a, const void *scale_b,
                          plan **out)
{
    for (int i = 0; i < c->n_plans; i++)
        if (memcmp(&c->plans[i].key, key, sizeof *key) == 0) {
            *out = &c->plans[i];
            return QD_OK;
        }
    plan *p;
    if (c->n_plans < MAX_PLANS) {
        p = &c->plans[c->n_plans++];
    } else {
        p = &c->plans[c->evict];
        c->evict = (c->evict + 1) % MAX_PLANS;
        plan_destroy(p);
    }
    memset(p, 0, sizeof *p);
    p->key = *key;
    qd_status st = plan_make(c, p, scale_a, scale_b);
    if (st != QD_OK) {
        plan_destroy(p);
        p->key.kind = -1; /* matches no key */
        return st;
    }
    *out = p;
    return QD_OK;
}

/* ---- small kernels */
static unsigned grid_for(int64_t n)
{
    int64_t g = (n + THREADS - 1) / THREADS;
    return (unsigned)(g < 4096 ? (g > 0 ? g : 1) : 4096);
}

/* y[i] *= beta, with 0 * NaN = 0 as in BLAS's beta = 0 */
static __global__ void scale_by_kernel(float *y, float beta, int64_t n)
{
    QD_PDL_ENTRY();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = beta == 0.0f ? 0.0f : __fmul_rn(y[i], beta);
}

static qd_status scale_by(float *y, float beta, int64_t n)
{
    if (beta == 1.0f)
        return QD_OK;
    qd_launch(scale_by_kernel, grid_for(n), THREADS, 0, y, beta, n);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

/* y[m][n] = y[m][n] * (r[m] * c[n]), r and c per row or one value (stride 0),
 * in the CPU's order (qd_fp8_gemm, qd_w4a4_gemm). */
static __global__ void scale_kernel(float *y, const float *r, int64_t r_stride, const float *c,
                                    int64_t c_stride, int64_t M, int64_t N)
{
    QD_PDL_ENTRY();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < M * N;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t m = i / N, n = i % N;
        y[i] = __fmul_rn(y[i], __fmul_rn(r[m * r_stride], c[n * c_stride]));
    }
}

static qd_status scale_rows_cols(float *y, const float *r, int r_per_row, const float *c, int c_per_row,
                                 int64_t M, int64_t N)
{
    qd_launch(scale_kernel, grid_for(M * N), THREADS, 0, y, r, r_per_row ? 1 : 0, c, c_per_row ? 1 : 0, M, N);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

/* The plan key of a row-major product C (M, N) = op(A) (M, K) . op(B) (K, N)
 * with contiguous rows, read as the column-major C^T = op(B)^T . op(A)^T
 * (cuBLASLt's A is our B); align_* are the operands' alignments in bytes. */
static plan_key key_rm(int kind, int ta, int tb, int64_t M, int64_t N, int64_t K, uint32_t align_A,
                       uint32_t align_B, uint32_t align_C)
{
    plan_key key;
    memset(&key, 0, sizeof key);
    key.kind = kind;
    key.op_a = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    key.op_b = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    key.m = N;
    key.n = M;
    key.k = K;
    key.lda = tb ? K : N;
    key.ldb = ta ? M : K;
    key.ldc = N;
    key.align_a = align_B;
    key.align_b = align_A;
    key.align_c = align_C;
    return key;
}

/* The heuristic's candidate every gemm_rm product takes (-1: the first that
 * runs, the default); qd_cuda_lt_force sets it for bench_quant --lt. */
static int lt_forced = -1;

extern "C" void qd_cuda_lt_force(int i) { lt_forced = i; }

/* QUADS_LT_TUNE=1 (opt-in until timed on a GPU): at a plan's first product
 * that overwrites its output (beta 0) outside a graph recording, each of the
 * heuristic's candidates runs twice (the second timed by events), each
 * overwriting C; the plan keeps the fastest (the first that runs unless
 * another is at least 3% faster, so that timing noise does not flip the
 * choice between processes), which then runs once more so that C holds its
 * result. Fast mode only takes these products; their algorithms sum in
 * their own orders, within fast mode's stated bounds. bench_quant --lt found
 * the first candidate 12-25% slower than the best on the trainer's lm_head
 * forward and dx and o's dx (an H100, 2026-12-05). */
static int lt_tune_on(void)
{
    static int v = -2;
    return qd_env_pick(&v, "QUADS_LT_TUNE", 0, 1) == 1;
}

static qd_status lt_tune(blas_ctx *c, plan *p, const float *alpha, const void *A, const void *B, float *C)
{
    const float beta0 = 0.0f;
    auto run = [&](int i) {
        return cublasLtMatmul(c->h, p->desc, alpha, B, p->la, A, p->lb, &beta0, C, p->lc, C, p->lc, &p->algo[i],
                              c->ws, WORKSPACE_BYTES, cudaStreamPerThread);
    };
    cudaEvent_t ev[2];
    QD_CUDA_CHECK(cudaEventCreate(&ev[0]));
    if (cudaEventCreate(&ev[1]) != cudaSuccess) {
        cudaEventDestroy(ev[0]);
        return qd_error(QD_ERR_DEVICE, "cuda_blas: QUADS_LT_TUNE: cudaEventCreate failed");
    }
    int first = -1, best = -1;
    float first_ms = 0.0f, best_ms = 0.0f;
    cublasStatus_t s = CUBLAS_STATUS_NOT_SUPPORTED;
    for (int i = 0; i < p->n_algo; i++) {
        s = run(i);
        if (s != CUBLAS_STATUS_SUCCESS)
            continue;
        float ms = 0.0f;
        cudaEventRecord(ev[0], cudaStreamPerThread);
        s = run(i);
        cudaEventRecord(ev[1], cudaStreamPerThread);
        if (s != CUBLAS_STATUS_SUCCESS || cudaEventSynchronize(ev[1]) != cudaSuccess ||
            cudaEventElapsedTime(&ms, ev[0], ev[1]) != cudaSuccess)
            continue;
        if (first < 0)
            first = i, first_ms = ms;
        if (best < 0 || ms < best_ms)
            best = i, best_ms = ms;
    }
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    QD_CUDA_CHECK(cudaGetLastError());
    if (first < 0)
        return lt_error(s, "cublasLtMatmul", __FILE__, __LINE__, &p->key);
    p->use = best_ms < 0.97f * first_ms ? best : first;
    p->tuned = 1;
    s = run(p->use);
    return s == CUBLAS_STATUS_SUCCESS ? QD_OK : lt_error(s, "cublasLtMatmul", __FILE__, __LINE__, &p->key);
}

/* Row-major C (M, N) = op(A) (M, K) . op(B) (K, N) + beta C. A is stored (M, K),
 * or (K, M) when ta; B is stored (K, N), or (N, K) when tb. scale_a/scale_b are
 * the block-scale pointers of A and B (FP4), NULL otherwise. */
static qd_status gemm_rm(int kind, float *C, const void *A, int ta, const void *B, int tb, int64_t M,
                         int64_t N, int64_t K, float alpha, float beta, const void *scale_a, const void *scale_b)
{
    if (M < 0 || N < 0 || K < 0)
        return qd_error(QD_ERR_SHAPE, "cuda_blas: %s GEMM of shape M %lld N %lld K %lld",
                        kind_names[kind], (long long)M, (long long)N, (long long)K);
    if (M == 0 || N == 0)
        return QD_OK;
    if (K == 0) /* an empty sum (dW of a batch without tokens): only beta * C remains */
        return scale_by(C, beta, M * N);
    blas_ctx *c;
    QD_TRY(get_ctx(&c));
    if (kind == KIND_FP8)
        scale_a = scale_b = c->one;

    plan_key key = key_rm(kind, ta, tb, M, N, K, ptr_align(A), ptr_align(B), ptr_align(C));
    plan *p;
    QD_TRY(plan_get(c, &key, scale_b, scale_a, &p));
    if (kind == KIND_FP4)
        QD_TRY(set_scale_ptrs(p, scale_b, scale_a));
    cublasStatus_t s = CUBLAS_STATUS_NOT_SUPPORTED;
    if (lt_forced >= 0) { /* a benchmark's pick (qd_cuda_lt_force) */
        if (lt_forced >= p->n_algo)
            return QD_ERR_UNSUPPORTED;
        s = cublasLtMatmul(c->h, p->desc, &alpha, B, p->la, A, p->lb, &beta, C, p->lc, C, p->lc,
                           &p->algo[lt_forced], c->ws, WORKSPACE_BYTES, cudaStreamPerThread);
        return s == CUBLAS_STATUS_SUCCESS ? QD_OK : QD_ERR_UNSUPPORTED;
    }
    if (!p->tuned && beta == 0.0f && p->n_algo > 1 && lt_tune_on() && !qd_cuda_recording())
        return lt_tune(c, p, &alpha, A, B, C);
    for (int t = 0; t < p->n_algo; t++) {
        int i = (p->use + t) % p->n_algo;
        s = cublasLtMatmul(c->h, p->desc, &alpha, B, p->la, A, p->lb, &beta, C, p->lc, C, p->lc,
                           &p->algo[i], c->ws, WORKSPACE_BYTES, cudaStreamPerThread);
        if (s == CUBLAS_STATUS_SUCCESS) {
            p->use = i;
            return QD_OK;
        }
    }
    return lt_error(s, "cublasLtMatmul", __FILE__, __LINE__, &p->key);
}

/* ---- BF16 and float32 */
qd_status qd_cuda_gemm_bf16(float *y, const uint16_t *x, const uint16_t *w, int64_t M, int64_t N,
                            int64_t K, float beta)
{
    return gemm_rm(KIND_BF16, y, x, 0, w, 1, M, N, K, 1.0f, beta, NULL, NULL);
}

qd_status qd_cuda_gemm_bf16_dx(float *dx, const uint16_t *dy, const uint16_t *w, int64_t M, int64_t N,
                               int64_t K, float beta)
{
    return gemm_rm(KIND_BF16, dx, dy, 0, w, 0, M, K, N, 1.0f, beta, NULL, NULL);
}

qd_status qd_cuda_gemm_bf16_scaled(float *y, const uint16_t *x, const uint16_t *w, int64_t M, int64_t N,
                                   int64_t K, float alpha, float beta)
{
    return gemm_rm(KIND_BF16, y, x, 0, w, 1, M, N, K, alpha, beta, NULL, NULL);
}

qd_status qd_cuda_gemm_bf16_dx_scaled(float *dx, const uint16_t *dy, const uint16_t *w, int64_t M, int64_t N,
                                      int64_t K, float alpha, float beta)
{
    return gemm_rm(KIND_BF16, dx, dy, 0, w, 0, M, K, N, alpha, beta, NULL, NULL);
}

qd_status qd_cuda_gemm_bf16_dw(float *dw, const uint16_t *dy, const uint16_t *x, int64_t M, int64_t N,
                               int64_t K, float beta)
{
    return gemm_rm(KIND_BF16, dw, dy, 1, x, 0, N, K, M, 1.0f, beta, NULL, NULL);
}

qd_status qd_cuda_gemm_f32(float *y, const float *x, const float *w, int64_t M, int64_t N, int64_t K,
                           float beta)
{
    return gemm_rm(KIND_F32, y, x, 0, w, 1, M, N, K, 1.0f, beta, NULL, NULL);
}

qd_status qd_cuda_gemm_f32_dx(float *dx, const float *dy, const float *w, int64_t M, int64_t N,
                              int64_t K, float beta)
{
    return gemm_rm(KIND_F32, dx, dy, 0, w, 0, M, K, N, 1.0f, beta, NULL, NULL);
}

qd_status qd_cuda_gemm_f32_dw(float *dw, const float *dy, const float *x, int64_t M, int64_t N,
                              int64_t K, float beta)
{
    return gemm_rm(KIND_F32, dw, dy, 1, x, 0, N, K, M, 1.0f, beta, NULL, NULL);
}

/* ---- the experts through cuBLAS */
#define BLAS_CHECK(call)                                                                               \
    do {                                                                                               \
        cublasStatus_t b_st_ = (call);                                                                 \
        if (b_st_ != CUBLAS_STATUS_SUCCESS)                                                            \
            return qd_error(b_st_ == CUBLAS_STATUS_NOT_SUPPORTED ? QD_ERR_UNSUPPORTED : QD_ERR_DEVICE,  \
                            "%s:%d: %s: %s", __FILE__, __LINE__, #call, cublasGetStatusName(b_st_));   \
    } while (0)

/* The current device's cuBLAS handle (on the legacy default stream, as cuBLASLt's calls). */
static qd_status get_blas(cublasHandle_t *out)
{
    blas_ctx *c;
    QD_TRY(get_ctx(&c));
    if (!c->bh) {
        BLAS_CHECK(cublasCreate(&c->bh));
        /* cuBLAS's stream 0 is the legacy default stream (the library is not
         * built per-thread): this thread's default stream, as every kernel of
         * ours (Makefile.am's --default-stream per-thread), and cuBLASLt's too */
        BLAS_CHECK(cublasSetStream(c->bh, cudaStreamPerThread));
    }
    *out = c->bh;
    return QD_OK;
}

/* Row-major C (M, N) = op(A) (M, K) . op(B) (K, N) + beta C, as gemm_rm's
 * (the same column-major reading), through cublasGemmEx; float32 C. */
static qd_status gemm_ex_rm(cublasHandle_t h, cudaDataType_t in, cublasComputeType_t ct, float *C,
                            const void *A, int ta, const void *B, int tb, int64_t M, int64_t N, int64_t K,
                            float alpha, float beta)
{
    if (M == 0 || N == 0)
        return QD_OK;
    if (K == 0)
        return scale_by(C, beta, M * N);
    BLAS_CHECK(cublasGemmEx_64(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K,
                               &alpha, B, in, tb ? K : N, A, in, ta ? M : K, &beta, C, CUDA_R_32F, N, ct,
                               CUBLAS_GEMM_DEFAULT));
    return QD_OK;
}

static qd_status check_groups(const char *fn, const int32_t *off, int E, int64_t N, int64_t K)
{
    if (E < 0 || N < 0 || K < 0)
        return qd_error(QD_ERR_SHAPE, "%s: %d experts, N %lld, K %lld", fn, E, (long long)N, (long long)K);
    for (int e = 0; e < E; e++)
        if (off[e] < 0 || off[e + 1] < off[e])
            return qd_error(QD_ERR_SHAPE, "%s: expert %d has rows %d .. %d", fn, e, (int)off[e],
                            (int)off[e + 1] - 1);
    return QD_OK;
}

static cublasComputeType_t compute_of(qd_gemm_math math)
{
    return math == QD_GEMM_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

/* ---- fast mode's prefill attention through cuBLAS (cuda_blas.h) */
/* count row-major products C[i] (M, N; row stride ldc) = alpha op(A[i]) (M, K)
 * . op(B[i]) (K, N) + beta C[i]: A[i] stored (M, K) with row stride lda, or
 * (K, M) when ta; B[i] stored (K, N) with ldb, or (N, K) when tb. The
 * column-major reading of gemm_ex_rm. */
static qd_status gemm_batched_rm(cublasHandle_t h, cublasComputeType_t ct, void *const *C, int64_t ldc,
                                 void *const *A, int64_t lda, int ta, void *const *B, int64_t ldb, int tb, int M,
                                 int N, int K, float alpha, float beta, int count)
{
    if (count == 0 || M == 0 || N == 0)
        return QD_OK;
    BLAS_CHECK(cublasGemmBatchedEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K,
                                   &alpha, (const void *const *)B, CUDA_R_32F, (int)ldb, (const void *const *)A,
                                   CUDA_R_32F, (int)lda, &beta, (void *const *)C, CUDA_R_32F, (int)ldc, count, ct,
                                   CUBLAS_GEMM_DEFAULT));
    return QD_OK;
}

/* n host pointers staged for upload in the next slot of the ring: waits only
 * for that slot's previous upload (PTR_SLOTS calls ago) to have left it, so
 * the host keeps enqueuing ahead of the device; grows the slot when needed. */
static qd_status ptrs_begin(blas_ctx *c, size_t n, void ***host)
{
    QD_REFUSE_RECORDING(); /* a step graph would copy from a slot the ring reuses */
    int i = c->ring_next;
    if (c->ring[i].live) {
        QD_CUDA_CHECK(cudaEventSynchronize(c->ring[i].ev));
        c->ring[i].live = 0;
    }
    if (!c->ring[i].ev)
        QD_CUDA_CHECK(cudaEventCreateWithFlags(&c->ring[i].ev, cudaEventDisableTiming));
    if (c->ring[i].cap < n) {
        QD_CUDA_CHECK(cudaFreeHost(c->ring[i].h));
        qd_cuda_buf_gen++;
        QD_CUDA_CHECK(cudaFree(c->ring[i].d)); /* waits for the device */
        c->ring[i].h = c->ring[i].d = NULL;
        c->ring[i].cap = 0;
        QD_CUDA_CHECK(cudaMallocHost((void **)&c->ring[i].h, sizeof(void *) * n));
        QD_CUDA_CHECK(cudaMalloc((void **)&c->ring[i].d, sizeof(void *) * n));
        c->ring[i].cap = n;
    }
    *host = c->ring[i].h;
    return QD_OK;
}

/* The staged pointers to the device (c->dptr), the slot's event recorded; the next call takes the next slot. */
static qd_status ptrs_upload(blas_ctx *c, size_t n)
{
    int i = c->ring_next;
    QD_CUDA_CHECK(cudaMemcpyAsync(c->ring[i].d, c->ring[i].h, sizeof(void *) * n, cudaMemcpyHostToDevice, 0));
    QD_CUDA_CHECK(cudaEventRecord(c->ring[i].ev, 0));
    c->ring[i].live = 1;
    c->dptr = c->ring[i].d;
    c->ring_next = (i + 1) % PTR_SLOTS;
    return QD_OK;
}

qd_status qd_cuda_blas_table(size_t bytes, void **host)
{
    blas_ctx *c;
    QD_TRY(get_ctx(&c));
    return ptrs_begin(c, (bytes + sizeof(void *) - 1) / sizeof(void *), (void ***)host);
}

qd_status qd_cuda_blas_table_upload(size_t bytes, void **dev)
{
    blas_ctx *c;
    QD_TRY(get_ctx(&c));
    QD_TRY(ptrs_upload(c, (bytes + sizeof(void *) - 1) / sizeof(void *)));
    *dev = c->dptr;
    return QD_OK;
}

static qd_status seqs_check(const char *fn, const int32_t *seq_off, int nseq, int N, int H, int KV, int Tm)
{
    if (nseq < 0 || H <= 0 || KV <= 0 || H % KV || seq_off[0] != 0 || seq_off[nseq] != N)
        return qd_error(QD_ERR_SHAPE, "%s: %d sequences over %d rows, %d heads / %d kv", fn, nseq, N, H, KV);
    for (int b = 0; b < nseq; b++)
        if (seq_off[b + 1] < seq_off[b] || seq_off[b + 1] - seq_off[b] > Tm)
            return qd_error(QD_ERR_SHAPE, "%s: sequence %d has rows %d .. %d (at most %d)", fn, b,
                            (int)seq_off[b], (int)seq_off[b + 1] - 1, Tm);
    return QD_OK;
}

/* The sequences in order of length (ties by index): the batched calls take
 * one length each. idx (nseq) host. */
static void seqs_by_length(int *idx, const int32_t *seq_off, int nseq)
{
    for (int b = 0; b < nseq; b++) {
        int L = seq_off[b + 1] - seq_off[b], j = b;
        while (j > 0 && seq_off[idx[j - 1] + 1] - seq_off[idx[j - 1]] > L) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = b;
    }
}

/* One warp a row (n, h): p[s] = exp(S[s] - max) / sum over s <= pos[n], 0 for pos[n] < s < Tm. */
static __global__ void attn_softmax_kernel(float *att, const int32_t *pos, int rows, int H, int Tm)
{
    QD_PDL_ENTRY();
    int r = (int)(((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
    if (r >= rows)
        return;
    int t = pos[r / H];
    float *p = att + (int64_t)r * Tm, mx = -INFINITY, sum = 0.0f;
    for (int s = lane; s <= t; s += 32)
        mx = fmaxf(mx, p[s]);
    for (int o = 16; o > 0; o /= 2)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    for (int s = lane; s <= t; s += 32) {
        float e = __expf(p[s] - mx);
        p[s] = e;
        sum += e;
    }
    for (int o = 16; o > 0; o /= 2)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    float inv = 1.0f / sum;
    for (int s = lane; s < Tm; s += 32)
        p[s] = s <= t ? p[s] * inv : 0.0f;
}

/* One warp a row: ds[s] = p[s] (dp[s] - sum_s' p dp) scale for s <= pos[n], 0 after. */
static __global__ void attn_softmax_bwd_kernel(float *ds, const float *att, const int32_t *pos, int rows, int H,
                                               int Tm, float scale)
{
    QD_PDL_ENTRY();
    int r = (int)(((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
    if (r >= rows)
        return;
    int t = pos[r / H];
    const float *p = att + (int64_t)r * Tm;
    float *d = ds + (int64_t)r * Tm, pdp = 0.0f;
    for (int s = lane; s <= t; s += 32)
        pdp = fmaf(p[s], d[s], pdp);
    for (int o = 16; o > 0; o /= 2)
        pdp += __shfl_xor_sync(0xffffffffu, pdp, o);
    for (int s = lane; s < Tm; s += 32)
        d[s] = s <= t ? (p[s] * (d[s] - pdp)) * scale : 0.0f;
}

/* One warp a row: p[s] = 0 for pos[n] < s < Tm. */
static __global__ void attn_zero_tail_kernel(float *att, const int32_t *pos, int rows, int H, int Tm)
{
    QD_PDL_ENTRY();
    int r = (int)(((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
    if (r >= rows)
        return;
    float *p = att + (int64_t)r * Tm;
    for (int s = pos[r / H] + 1 + lane; s < Tm; s += 32)
        p[s] = 0.0f;
}

static qd_status attn_rows(int kind, float *x, const float *att, const int32_t *pos, int N, int H, int Tm,
                           float scale)
{
    int64_t rows = (int64_t)N * H;
    unsigned g = (unsigned)((rows * 32 + THREADS - 1) / THREADS);
    if (kind == 0)
        qd_launch(attn_softmax_kernel, g, THREADS, 0, x, pos, (int)rows, H, Tm);
    else if (kind == 2)
        qd_launch(attn_zero_tail_kernel, g, THREADS, 0, x, pos, (int)rows, H, Tm);
    else
        qd_launch(attn_softmax_bwd_kernel, g, THREADS, 0, x, att, pos, (int)rows, H, Tm, scale);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

/* A run of sequences of one length: idx[i0 .. i1-1]. */
static int run_end(const int *idx, int i0, const int32_t *seq_off, int nseq)
{
    int L = seq_off[idx[i0] + 1] - seq_off[idx[i0]], i1 = i0 + 1;
    while (i1 < nseq && seq_off[idx[i1] + 1] - seq_off[idx[i1]] == L)
        i1++;
    return i1;
}

qd_status qd_cuda_attend_zero_tail(float *att, const int32_t *pos, int N, int H, int Tm)
{
    return N ? attn_rows(2, att, NULL, pos, N, H, Tm, 0.0f) : QD_OK;
}

#define PTR(p) ((void *)(p))

/* What both directions start from: the handles, the sequences in order of
 * length (idx, the caller frees it) and narrays pointer arrays of per = nseq *
 * H entries staged in hp. Nothing held on failure. */
typedef struct {
    blas_ctx *c;
    cublasHandle_t h;
    int *idx;
    size_t per;
    void **hp;
} attn_call;

static qd_status attn_begin(attn_call *a, const char *fn, const int32_t *seq_off, int nseq, int H, int narrays)
{
    QD_TRY(get_ctx(&a->c));
    QD_TRY(get_blas(&a->h));
    a->idx = (int *)malloc(sizeof(int) * (size_t)nseq);
    if (!a->idx)
        return qd_error(QD_ERR_NOMEM, "%s: %d sequences", fn, nseq);
    seqs_by_length(a->idx, seq_off, nseq);
    a->per = (size_t)nseq * H;
    qd_status st = ptrs_begin(a->c, (size_t)narrays * a->per, &a->hp);
    if (st)
        free(a->idx);
    return st;
}

qd_status qd_cuda_attend_gemm(float *out, float *att, const float *q, const float *k, const float *v,
                              const int32_t *pos, const int32_t *seq_off, int nseq, int N, int H, int KV, int D,
                              int Tm, qd_gemm_math math)
{
    QD_TRY(seqs_check("qd_cuda_attend_gemm", seq_off, nseq, N, H, KV, Tm));
    if (N == 0)
        return QD_OK;
    attn_call a;
    QD_TRY(attn_begin(&a, "qd_cuda_attend_gemm", seq_off, nseq, H, 5));
    blas_ctx *c = a.c;
    cublasHandle_t h = a.h;
    int *idx = a.idx, grp = H / KV;
    size_t per = a.per;
    void **hp = a.hp;
    /* arrays 0 att (S's C, P), 1 Q, 2 K, 3 out, 4 V at entry (sequence in length order, head) */
    for (int i = 0; i < nseq; i++) {
        int64_t o = seq_off[idx[i]];
        for (int hh = 0; hh < H; hh++) {
            size_t e = (size_t)i * H + hh;
            int kh = hh / grp;
            hp[0 * per + e] = PTR(att + (o * H + hh) * Tm);
            hp[1 * per + e] = PTR(q + (o * H + hh) * D);
            hp[2 * per + e] = PTR(k + (o * KV + kh) * D);
            hp[3 * per + e] = PTR(out + (o * H + hh) * D);
            hp[4 * per + e] = PTR(v + (o * KV + kh) * D);
        }
    }
    qd_status st = ptrs_upload(c, 5 * per);
    void **dp = c->dptr;
    cublasComputeType_t ct = compute_of(math);
    float scale = qd_attn_scale(D);
    int64_t lq = (int64_t)H * D, lk = (int64_t)KV * D, la = (int64_t)H * Tm;
    for (int i0 = 0, i1; !st && i0 < nseq; i0 = i1) { /* S = scale Q K^T */
        i1 = run_end(idx, i0, seq_off, nseq);
        int L = seq_off[idx[i0] + 1] - seq_off[idx[i0]], n = (i1 - i0) * H;
        size_t e = (size_t)i0 * H;
        st = gemm_batched_rm(h, ct, dp + e, la, dp + per + e, lq, 0, dp + 2 * per + e, lk, 1, L, L, D, scale, 0.0f,
                             n);
    }
    if (!st)
        st = attn_rows(0, att, NULL, pos, N, H, Tm, 0.0f);
    for (int i0 = 0, i1; !st && i0 < nseq; i0 = i1) { /* out = P V */
        i1 = run_end(idx, i0, seq_off, nseq);
        int L = seq_off[idx[i0] + 1] - seq_off[idx[i0]], n = (i1 - i0) * H;
        size_t e = (size_t)i0 * H;
        st = gemm_batched_rm(h, ct, dp + 3 * per + e, lq, dp + e, la, 0, dp + 4 * per + e, lk, 0, L, D, L, 1.0f,
                             0.0f, n);
    }
    free(idx);
    return st;
}

qd_status qd_cuda_attend_gemm_backward(float *dq, float *dk, float *dv, float *ds, const float *dout,
                                       const float *att, const float *q, const float *k, const float *v,
                                       const int32_t *pos, const int32_t *seq_off, int nseq, int N, int H, int KV,
                                       int D, int Tm, qd_gemm_math math)
{
    QD_TRY(seqs_check("qd_cuda_attend_gemm_backward", seq_off, nseq, N, H, KV, Tm));
    if (N == 0)
        return QD_OK;
    attn_call a;
    QD_TRY(attn_begin(&a, "qd_cuda_attend_gemm_backward", seq_off, nseq, H, 11));
    blas_ctx *c = a.c;
    cublasHandle_t h = a.h;
    int *idx = a.idx, grp = H / KV;
    size_t per = a.per;
    void **hp = a.hp;
    /* arrays 0 ds (dP's C, dq's A), 1 dY, 2 V, 3 dq, 4 K at entry (sequence in
     * length order, head); the dk, dv products sum over the group's heads, one
     * call per head r of each group (beta 1), so their arrays 5 ds, 6 Q, 7 dk,
     * 8 P, 9 dY, 10 dv run over (r, sequence, kv head) with head kh * grp + r:
     * a call takes a contiguous run of them */
    for (int i = 0; i < nseq; i++) {
        int64_t o = seq_off[idx[i]];
        for (int hh = 0; hh < H; hh++) {
            size_t e = (size_t)i * H + hh, f = ((size_t)(hh % grp) * nseq + i) * KV + hh / grp;
            int kh = hh / grp;
            hp[0 * per + e] = PTR(ds + (o * H + hh) * Tm);
            hp[1 * per + e] = PTR(dout + (o * H + hh) * D);
            hp[2 * per + e] = PTR(v + (o * KV + kh) * D);
            hp[3 * per + e] = PTR(dq + (o * H + hh) * D);
            hp[4 * per + e] = PTR(k + (o * KV + kh) * D);
            hp[5 * per + f] = PTR(ds + (o * H + hh) * Tm);
            hp[6 * per + f] = PTR(q + (o * H + hh) * D);
            hp[7 * per + f] = PTR(dk + (o * KV + kh) * D);
            hp[8 * per + f] = PTR(att + (o * H + hh) * Tm);
            hp[9 * per + f] = PTR(dout + (o * H + hh) * D);
            hp[10 * per + f] = PTR(dv + (o * KV + kh) * D);
        }
    }
    qd_status st = ptrs_upload(c, 11 * per);
    void **dp = c->dptr;
    cublasComputeType_t ct = compute_of(math);
    float scale = qd_attn_scale(D);
    int64_t lq = (int64_t)H * D, lk = (int64_t)KV * D, la = (int64_t)H * Tm;
    for (int i0 = 0, i1; !st && i0 < nseq; i0 = i1) { /* dP = dY V^T */
        i1 = run_end(idx, i0, seq_off, nseq);
        int L = seq_off[idx[i0] + 1] - seq_off[idx[i0]], n = (i1 - i0) * H;
        size_t e = (size_t)i0 * H;
        st = gemm_batched_rm(h, ct, dp + e, la, dp + per + e, lq, 0, dp + 2 * per + e, lk, 1, L, L, D, 1.0f, 0.0f,
                             n);
    }
    if (!st)
        st = attn_rows(1, ds, att, pos, N, H, Tm, scale);
    for (int i0 = 0, i1; !st && i0 < nseq; i0 = i1) {
        i1 = run_end(idx, i0, seq_off, nseq);
        int L = seq_off[idx[i0] + 1] - seq_off[idx[i0]], n = (i1 - i0) * H;
        size_t e = (size_t)i0 * H;
        /* dq += ds K */
        st = gemm_batched_rm(h, ct, dp + 3 * per + e, lq, dp + e, la, 0, dp + 4 * per + e, lk, 0, L, D, L, 1.0f,
                             1.0f, n);
        for (int r = 0; !st && r < grp; r++) {
            size_t f = ((size_t)r * nseq + i0) * KV;
            int m = (i1 - i0) * KV;
            /* dk += ds^T Q */
            st = gemm_batched_rm(h, ct, dp + 7 * per + f, lk, dp + 5 * per + f, la, 1, dp + 6 * per + f, lq, 0, L,
                                 D, L, 1.0f, 1.0f, m);
            /* dv += P^T dY */
            if (!st)
                st = gemm_batched_rm(h, ct, dp + 10 * per + f, lk, dp + 8 * per + f, la, 1, dp + 9 * per + f, lq,
                                     0, L, D, L, 1.0f, 1.0f, m);
        }
    }
    free(idx);
    return st;
}

/* ---- the experts' products, all in one grouped call */
/* One problem a group of cublasGemmGroupedBatchedEx: row-major C (M, N) =
 * op(A) (M, K) . op(B) (K, N) + beta C, contiguous rows (lda K, or M when ta;
 * ldb N, or K when tb; ldc N), as gemm_ex_rm reads it. */
typedef qd_grp_gemm grp_gemm; /* C = alpha op(A) op(B) + beta C */

/* How the experts' products of input type in are enqueued (QUADS_EXPERT_GEMM):
 * "mma" all of them in one launch of our kernel (qd_cuda_grouped_mma_bf16,
 * cuda_grouped.cu; BF16 inputs only), "wgmma" the same on Hopper's warpgroup
 * MMA (qd_cuda_grouped_wgmma_bf16; compute capability 9.0, else lt), "lt" one cublasLtMatmul each with one
 * algorithm for the shape family (lt_products; BF16 inputs only), "grouped" one
 * cublasGemmGroupedBatchedEx, "loop" one cublasGemmEx each. Default: for
 * BF16 inputs the forward's products (x.W^T) on wgmma where the device has it,
 * in configuration 0 where K >= N, else 2 (a short K loop leaves a CTA's
 * prologue and epilogue exposed unless two share an SM), the backward's on lt,
 * or with QUADS_WGMMA_BWD=1 on wgmma in configuration 4 (C added or stored by
 * the bulk copy engine: their C is read and written, the register epilogue's
 * loads left the tensor cores idle); QUADS_WGMMA_CFG overrides; elsewhere lt; loop
 * for float32; a problem mma or lt does not take goes to the loop. On the H200
 * (bench_quant --experts, a3b, 2026-12-05) the forward's gate|up / down took
 * 0.83 / 0.97 ms on wgmma against cuBLASLt's 1.37 / 1.29 ms; the backward's
 * with the register epilogue were slower than cuBLASLt's (dx of gate|up 1.71 vs
 * 1.22 ms at best), with the bulk epilogue (configuration 4) faster: dx gate|up /
 * down 1.05 / 0.88 ms vs 1.07 / 1.19, dW 0.98 / 0.98 vs 1.06 / 1.04. On the H200 (fast train step, B 16 x 1024, 2026-12-03) mma against lt:
 * a3b at 4 layers 300 vs 292 ms (its forward experts 32.0 vs 36.7 ms, its
 * backward slower), moe8 124.6 vs 134.2 ms.
 * On the H200 (a3b at 4 layers, B 16 x 1024, fast train step) the grouped call
 * with float32 inputs under TF32 took 566 ms a step against 484 ms for the
 * loop; with BF16 inputs the step spent most of its time on the host (a
 * kernel sum of about 270 ms in a 470 ms step): cuBLAS chooses kernels per
 * problem, and every expert's row count differs. */
enum { EX_LOOP, EX_GROUPED, EX_LT, EX_MMA, EX_WGMMA, EX_DEFAULT };
static int expert_path(cudaDataType_t in)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("QUADS_EXPERT_GEMM");
        v = !e || !*e ? EX_DEFAULT : !strcmp(e, "loop") ? EX_LOOP : !strcmp(e, "grouped") ? EX_GROUPED
          : !strcmp(e, "mma") ? EX_MMA : !strcmp(e, "wgmma") ? EX_WGMMA : EX_LT;
    }
    if ((v == EX_MMA || v == EX_WGMMA) && in == CUDA_R_16BF)
        return v;
    if ((v == EX_LT || v == EX_DEFAULT) && in == CUDA_R_16BF)
        return v;
    return v == EX_GROUPED ? EX_GROUPED : EX_LOOP;
}

/* All G products in one cublasGemmGroupedBatchedEx (one problem a group), the
 * pointer arrays uploaded as attention's. QD_ERR_UNSUPPORTED with nothing
 * enqueued where it does not apply (grouped_on says no, K = 0, a pointer off 16
 * bytes, types cuBLAS refuses): the caller loops over gemm_ex_rm instead. */
static qd_status gemm_grouped_rm(cublasHandle_t h, cudaDataType_t in, cublasComputeType_t ct, const grp_gemm *g,
                                 int G, int ta, int tb, float beta)
{
    if (G == 0)
        return QD_OK;
    for (int i = 0; i < G; i++)
        if (g[i].K == 0 || !qd_aligned(g[i].A, 16) || !qd_aligned(g[i].B, 16) || !qd_aligned(g[i].C, 16))
            return QD_ERR_UNSUPPORTED;
    blas_ctx *c;
    QD_TRY(get_ctx(&c));
    size_t hb = (size_t)G * (2 * sizeof(cublasOperation_t) + 7 * sizeof(int) + 2 * sizeof(float));
    char *hm = (char *)malloc(hb);
    if (!hm)
        return qd_error(QD_ERR_NOMEM, "cuda_blas: %d grouped products", G);
    cublasOperation_t *opa = (cublasOperation_t *)hm, *opb = opa + G;
    int *m = (int *)(opb + G), *n = m + G, *k = n + G, *lda = k + G, *ldb = lda + G, *ldc = ldb + G, *gs = ldc + G;
    float *al = (float *)(gs + G), *be = al + G;
    void **hp;
    qd_status st = ptrs_begin(c, 3 * (size_t)G, &hp);
    if (st) {
        free(hm);
        return st;
    }
    for (int i = 0; i < G; i++) { /* column-major: C^T = op(B)^T . op(A)^T */
        opa[i] = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
        opb[i] = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
        m[i] = g[i].N, n[i] = g[i].M, k[i] = g[i].K;
        lda[i] = tb ? g[i].K : g[i].N;
        ldb[i] = ta ? g[i].M : g[i].K;
        ldc[i] = g[i].N;
        gs[i] = 1, al[i] = g[i].alpha, be[i] = beta;
        hp[i] = (void *)g[i].B, hp[G + i] = (void *)g[i].A, hp[2 * G + i] = g[i].C;
    }
    st = ptrs_upload(c, 3 * (size_t)G);
    if (!st) {
        void **dp = c->dptr;
        cublasStatus_t b = cublasGemmGroupedBatchedEx(h, opa, opb, m, n, k, al, (const void *const *)dp, in, lda,
                                                      (const void *const *)(dp + G), in, ldb, be, dp + 2 * G,
                                                      CUDA_R_32F, ldc, G, gs, ct);
        if (b == CUBLAS_STATUS_NOT_SUPPORTED)
            st = QD_ERR_UNSUPPORTED;
        else if (b != CUBLAS_STATUS_SUCCESS)
            st = qd_error(QD_ERR_DEVICE, "%s:%d: cublasGemmGroupedBatchedEx: %s (%d products)", __FILE__, __LINE__,
                          cublasGetStatusName(b), G);
    }
    free(hm);
    return st;
}

/* How many streams the experts' cuBLASLt products spread over
 * (QUADS_EXPERT_STREAMS, 1 .. MAX_XSTREAMS, default XSTREAMS_DEFAULT). One
 * expert's product fills few of the GPU's SMs (a3b's 1,024 x 768 x 2,048 at
 * B 16 x 1,024 is 24 to 48 tiles of 132 SMs), so one after another on one
 * stream the GPU ran a quarter full; on several streams they overlap. Each
 * problem writes its own rows of C (or its own dW), so the order of their
 * ends does not matter: the bits are those of one stream. */
#define XSTREAMS_DEFAULT 4
static int expert_streams(void)
{
    static int v;
    if (!v) {
        const char *e = getenv("QUADS_EXPERT_STREAMS");
        int n = e && *e ? atoi(e) : XSTREAMS_DEFAULT;
        v = n < 1 ? 1 : n > MAX_XSTREAMS ? MAX_XSTREAMS : n;
    }
    return v;
}

/* n side streams (made on first use, a workspace each) after what the
 * default stream has enqueued so far. */
static qd_status xstreams_fork(blas_ctx *c, int n)
{
    if (!c->xfork)
        QD_CUDA_CHECK(cudaEventCreateWithFlags(&c->xfork, cudaEventDisableTiming));
    while (c->nxs < n) {
        int i = c->nxs;
        cudaStream_t s;
        cudaEvent_t ev;
        void *ws = NULL;
        QD_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
        if (e == cudaSuccess && (e = cudaMalloc(&ws, WORKSPACE_BYTES)) != cudaSuccess)
            cudaEventDestroy(ev);
        if (e != cudaSuccess) {
            cudaStreamDestroy(s);
            return qd_error(QD_ERR_DEVICE, "cuda_blas: side stream %d of the experts' products: %s", i,
                            cudaGetErrorString(e));
        }
        c->xs[i] = s, c->xev[i] = ev, c->xws[i] = ws;
        c->nxs++;
    }
    QD_CUDA_CHECK(cudaEventRecord(c->xfork, 0));
    for (int i = 0; i < n; i++)
        QD_CUDA_CHECK(cudaStreamWaitEvent(c->xs[i], c->xfork, 0));
    return QD_OK;
}

/* The default stream waits for the n side streams' work. */
static qd_status xstreams_join(blas_ctx *c, int n)
{
    for (int i = 0; i < n; i++) {
        QD_CUDA_CHECK(cudaEventRecord(c->xev[i], c->xs[i]));
        QD_CUDA_CHECK(cudaStreamWaitEvent(0, c->xev[i], 0));
    }
    return QD_OK;
}

/* The BF16 experts' products one cublasLtMatmul each (no host
 * synchronization, no per-problem heuristic): the G problems differ in one
 * dimension only (an expert's rows: M forward and in dx, K in dw), so the
 * algorithms cuBLASLt's heuristic gives for a representative problem (that
 * dimension's largest, rounded up to 256; the operands' smallest alignment)
 * are kept in the plan cache and serve every problem, the context's three
 * layouts set to each one's sizes. A problem no kept algorithm takes goes to
 * cublasGemmEx. */
static qd_status lt_enqueue(blas_ctx *c, cublasHandle_t h, plan *p, const plan_key *kp, const grp_gemm *g, int G,
                            int ta, int tb, float beta, int ns);
static qd_status lt_products(blas_ctx *c, cublasHandle_t h, const grp_gemm *g, int G, int ta, int tb, float beta)
{
    if (G == 0)
        return QD_OK;
    /* the dimension that may differ between problems: K in dW (its sum runs
     * over the rows), else M; neither may be a leading dimension */
    int kv = ta;
    if (ta && tb)
        return QD_ERR_UNSUPPORTED;
    int64_t M = g[0].M, K = g[0].K, N = g[0].N, rep = 0;
    uint32_t al_a = 256, al_b = 256, al_c = 256;
    for (int i = 0; i < G; i++) {
        if (g[i].N != N || (kv ? g[i].M != M : g[i].K != K) || g[i].K == 0)
            return QD_ERR_UNSUPPORTED;
        uint32_t a = ptr_align(g[i].A), b = ptr_align(g[i].B), cc = ptr_align(g[i].C);
        al_a = a < al_a ? a : al_a, al_b = b < al_b ? b : al_b, al_c = cc < al_c ? cc : al_c;
        int64_t v = kv ? g[i].K : g[i].M;
        rep = v > rep ? v : rep;
    }
    rep = (rep + 255) / 256 * 256; /* the varying dimension's largest, rounded up to 256 */
    if (kv)
        K = rep;
    else
        M = rep;
    /* the leading dimensions stay each problem's: the varying one is never one (K where tb, M where ta) */
    plan_key key = key_rm(KIND_BF16, ta, tb, M, N, K, al_a, al_b, al_c);
    plan *p;
    if (plan_get(c, &key, NULL, NULL, &p) != QD_OK) /* no algorithm for the family: the loop */
        return QD_ERR_UNSUPPORTED;
    for (int i = 0; i < 3; i++)
        if (!c->vl[i])
            LT_CHECK(cublasLtMatrixLayoutCreate(&c->vl[i], i < 2 ? CUDA_R_16BF : CUDA_R_32F, 1, 1, 1), NULL);
    int ns = expert_streams();
    ns = ns < G ? ns : G;
    if (ns > 1)
        QD_TRY(xstreams_fork(c, ns));
    qd_status st = lt_enqueue(c, h, p, &key, g, G, ta, tb, beta, ns);
    if (ns > 1) { /* joined also after a failure: nothing stays behind on a side stream */
        qd_status sj = xstreams_join(c, ns);
        st = st ? st : sj;
    }
    return st;
}

/* lt_products' enqueue: problem i on side stream i % ns (ns > 1) or the
 * default stream, each of its products with its stream's workspace. */
static qd_status lt_enqueue(blas_ctx *c, cublasHandle_t h, plan *p, const plan_key *kp, const grp_gemm *g, int G,
                            int ta, int tb, float beta, int ns)
{
    plan_key key = *kp;
    for (int i = 0; i < G; i++) {
        cudaStream_t s = ns > 1 ? c->xs[i % ns] : cudaStreamPerThread;
        void *ws = ns > 1 ? c->xws[i % ns] : c->ws;
        uint64_t dims[3][2]; /* cuBLASLt's m = N, n = M */
        stored_dims(&key, (uint64_t)g[i].N, (uint64_t)g[i].M, (uint64_t)g[i].K, dims);
        int64_t ld[3] = {key.lda, key.ldb, key.ldc};
        for (int j = 0; j < 3; j++) {
            LT_CHECK(cublasLtMatrixLayoutSetAttribute(c->vl[j], CUBLASLT_MATRIX_LAYOUT_ROWS, &dims[j][0],
                                                      sizeof dims[j][0]), &key);
            LT_CHECK(cublasLtMatrixLayoutSetAttribute(c->vl[j], CUBLASLT_MATRIX_LAYOUT_COLS, &dims[j][1],
                                                      sizeof dims[j][1]), &key);
            LT_CHECK(cublasLtMatrixLayoutSetAttribute(c->vl[j], CUBLASLT_MATRIX_LAYOUT_LD, &ld[j], sizeof ld[j]),
                     &key);
        }
        cublasStatus_t st = CUBLAS_STATUS_NOT_SUPPORTED;
        for (int t = 0; t < p->n_algo && st != CUBLAS_STATUS_SUCCESS; t++) {
            int a = (p->use + t) % p->n_algo;
            st = cublasLtMatmul(c->h, p->desc, &g[i].alpha, g[i].B, c->vl[0], g[i].A, c->vl[1], &beta, g[i].C, c->vl[2],
                                g[i].C, c->vl[2], &p->algo[a], ws, WORKSPACE_BYTES, s);
            if (st == CUBLAS_STATUS_SUCCESS)
                p->use = a;
        }
        if (st != CUBLAS_STATUS_SUCCESS) /* cuBLAS's handle runs on the default stream: joined after */
            QD_TRY(gemm_ex_rm(h, CUDA_R_16BF, CUBLAS_COMPUTE_32F, g[i].C, g[i].A, ta, g[i].B, tb, g[i].M, g[i].N,
                              g[i].K, g[i].alpha, beta));
    }
    return QD_OK;
}

/* The G products by expert_path: lt_products, one grouped call, else (and
 * where those do not apply) one gemm_ex_rm each. */
static qd_status run_products(cublasHandle_t h, cudaDataType_t in, cublasComputeType_t ct, const grp_gemm *g, int G,
                              int ta, int tb, float beta)
{
    int path = expert_path(in);
    qd_status st = QD_ERR_UNSUPPORTED;
    static int bwd = -2, cfg_set;
    if (bwd == -2) { /* default since 2026-12-05 (moe8 step 78.7 -> 73.0 ms on an H100); QUADS_WGMMA_BWD=0 */
        const char *e = getenv("QUADS_WGMMA_BWD"), *c = getenv("QUADS_WGMMA_CFG");
        bwd = !(e && !strcmp(e, "0"));
        cfg_set = c && *c; /* then -1: qd_cuda_grouped_wgmma_bf16 takes it */
    }
    if (path == EX_DEFAULT && ct == CUBLAS_COMPUTE_32F && G > 0 && ((!ta && tb) || bwd)) {
        int cfg = cfg_set ? -1 : !ta && tb ? (g[0].K >= g[0].N ? 0 : 2) : 4;
        st = qd_cuda_grouped_wgmma_bf16(g, G, ta, tb, beta, cfg);
    }
    if (st != QD_ERR_UNSUPPORTED)
        return st;
    if ((path == EX_LT || path == EX_DEFAULT) && ct == CUBLAS_COMPUTE_32F) {
        blas_ctx *c;
        QD_TRY(get_ctx(&c));
        st = lt_products(c, h, g, G, ta, tb, beta);
    } else if (path == EX_GROUPED) {
        st = gemm_grouped_rm(h, in, ct, g, G, ta, tb, beta);
    } else if (path == EX_MMA && ct == CUBLAS_COMPUTE_32F) {
        st = qd_cuda_grouped_mma_bf16(g, G, ta, tb, beta);
    } else if (path == EX_WGMMA && ct == CUBLAS_COMPUTE_32F) {
        st = qd_cuda_grouped_wgmma_bf16(g, G, ta, tb, beta, -1);
        if (st == QD_ERR_UNSUPPORTED) { /* another device or shape: cuBLASLt as by default */
            blas_ctx *c;
            QD_TRY(get_ctx(&c));
            st = lt_products(c, h, g, G, ta, tb, beta);
        }
    }
    if (st != QD_ERR_UNSUPPORTED)
        return st;
    for (int i = 0; i < G; i++)
        QD_TRY(gemm_ex_rm(h, in, ct, g[i].C, g[i].A, ta, g[i].B, tb, g[i].M, g[i].N, g[i].K, g[i].alpha, beta));
    return QD_OK;
}

/* y rows = x rows (elements of esz bytes, type in) . w[e]^T for the experts with rows */
static qd_status experts_forward(const char *fn, cudaDataType_t in, size_t esz, cublasComputeType_t ct, float *y,
                                 const void *x, const void *const *w, const float *alpha, const int32_t *off, int E,
                                 int64_t N, int64_t K)
{
    cublasHandle_t h;
    QD_TRY(check_groups(fn, off, E, N, K));
    QD_TRY(get_blas(&h));
    grp_gemm *g = (grp_gemm *)malloc(sizeof(grp_gemm) * (size_t)(E ? E : 1));
    if (!g)
        return qd_error(QD_ERR_NOMEM, "%s: %d experts", fn, E);
    int G = 0;
    for (int e = 0; e < E; e++) {
        int64_t r0 = off[e], m = off[e + 1] - r0;
        if (m)
            g[G++] = (grp_gemm){(const char *)x + r0 * K * esz, w[e], y + r0 * N, (int)m, (int)N, (int)K,
                                alpha ? alpha[e] : 1.0f};
    }
    qd_status st = run_products(h, in, ct, g, G, 0, 1, 0.0f);
    free(g);
    return st;
}

qd_status qd_cuda_gemm_grouped_bf16(float *y, const uint16_t *x, const uint16_t *const *w, const float *alpha,
                                    const int32_t *off, int E, int64_t N, int64_t K)
{
    return experts_forward("qd_cuda_gemm_grouped_bf16", CUDA_R_16BF, sizeof(uint16_t), CUBLAS_COMPUTE_32F, y, x,
                           (const void *const *)w, alpha, off, E, N, K);
}

qd_status qd_cuda_gemm_grouped_f32(float *y, const float *x, const float *const *w, const int32_t *off, int E,
                                   int64_t N, int64_t K, qd_gemm_math math)
{
    return experts_forward("qd_cuda_gemm_grouped_f32", CUDA_R_32F, sizeof(float), compute_of(math), y, x,
                           (const void *const *)w, NULL, off, E, N, K);
}

/* dx rows += dy rows . w[e]; dw[e] += dy rows^T . x rows (elements of esz
 * bytes, type in) for the experts with rows; dx or dw may be NULL. */
static qd_status experts_backward(const char *fn, cudaDataType_t in, size_t esz, cublasComputeType_t ct, float *dx,
                                  float *const *dw, const void *dy, const void *x, const void *const *w,
                                  const float *alpha, const int32_t *off, int E, int64_t N, int64_t K,
                                  float dx_beta, float dw_beta)
{
    cublasHandle_t h;
    QD_TRY(check_groups(fn, off, E, N, K));
    QD_TRY(get_blas(&h));
    grp_gemm *g = (grp_gemm *)malloc(sizeof(grp_gemm) * (size_t)(E ? E : 1));
    if (!g)
        return qd_error(QD_ERR_NOMEM, "%s: %d experts", fn, E);
    const char *dyb = (const char *)dy, *xb = (const char *)x;
    qd_status st = QD_OK;
    int G = 0;
    if (dx) { /* dx (m, K) += dy (m, N) . w (N, K) */
        for (int e = 0; e < E; e++) {
            int64_t r0 = off[e], m = off[e + 1] - r0;
            if (m)
                g[G++] = (grp_gemm){dyb + r0 * N * esz, w[e], dx + r0 * K, (int)m, (int)K, (int)N,
                                    alpha ? alpha[e] : 1.0f};
        }
        st = run_products(h, in, ct, g, G, 0, 0, dx_beta);
    }
    G = 0;
    if (!st && dw) { /* dw (N, K) += dy^T (N, m) . x (m, K) */
        for (int e = 0; e < E; e++) {
            int64_t r0 = off[e], m = off[e + 1] - r0;
            if (m)
                g[G++] = (grp_gemm){dyb + r0 * N * esz, xb + r0 * K * esz, dw[e], (int)N, (int)K, (int)m, 1.0f};
        }
        st = run_products(h, in, ct, g, G, 1, 0, dw_beta);
    }
    free(g);
    return st;
}

qd_status qd_cuda_gemm_grouped_f32_backward(float *dx, float *const *dw, const float *dy, const float *x,
                                            const float *const *w, const int32_t *off, int E, int64_t N,
                                            int64_t K, qd_gemm_math math)
{
    return experts_backward("qd_cuda_gemm_grouped_f32_backward", CUDA_R_32F, sizeof(float), compute_of(math), dx,
                            dw, dy, x, (const void *const *)w, NULL, off, E, N, K, 1.0f, 1.0f);
}

qd_status qd_cuda_gemm_grouped_bf16_backward(float *dx, float *const *dw, const uint16_t *dy, const uint16_t *x,
                                             const uint16_t *const *w, const float *alpha, const int32_t *off,
                                             int E, int64_t N, int64_t K)
{
    return experts_backward("qd_cuda_gemm_grouped_bf16_backward", CUDA_R_16BF, sizeof(uint16_t),
                            CUBLAS_COMPUTE_32F, dx, dw, dy, x, (const void *const *)w, alpha, off, E, N, K, 1.0f,
                            1.0f);
}

qd_status qd_cuda_gemm_grouped_bf16_backward_to(float *dx, float *const *dw, const uint16_t *dy, const uint16_t *x,
                                                const uint16_t *const *w, const float *alpha, const int32_t *off,
                                                int E, int64_t N, int64_t K, int add)
{
    return experts_backward("qd_cuda_gemm_grouped_bf16_backward_to", CUDA_R_16BF, sizeof(uint16_t),
                            CUBLAS_COMPUTE_32F, dx, dw, dy, x, (const void *const *)w, alpha, off, E, N, K,
                            add & 1 ? 1.0f : 0.0f, add & 2 ? 0.0f : 1.0f);
}

/* ---- FP8 */
qd_status qd_cuda_gemm_fp8(float *y, const uint8_t *qa, const float *sa_inv, const uint8_t *qw,
                           const float *sw_inv, int64_t M, int64_t N, int64_t K)
{
    if (K % 16 != 0)
        return qd_error(QD_ERR_SHAPE, "qd_cuda_gemm_fp8: K = %lld is not a multiple of 16",
                        (long long)K);
    QD_TRY(gemm_rm(KIND_FP8, y, qa, 0, qw, 1, M, N, K, 1.0f, 0.0f, NULL, NULL));
    if (M == 0 || N == 0)
        return QD_OK;
    return scale_rows_cols(y, sa_inv, 1, sw_inv, 1, M, N);
}

/* ---- scale swizzle: one thread per destination byte, padding written as 0 */
static __global__ void swizzle_kernel(uint8_t *dst, const uint8_t *src, int64_t rows,
                                      int64_t scale_cols, int64_t tiles_per_row, int64_t total)
{
    QD_PDL_ENTRY();
    for (int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; o < total;
         o += (int64_t)gridDim.x * blockDim.x) {
        int64_t tile = o / 512, in = o % 512;
        /* inverse of quant/swizzle.c: in = (r % 32)*16 + ((r % 128)/32)*4 + c % 4 */
        int64_t r = (tile / tiles_per_row) * 128 + ((in % 16) / 4) * 32 + in / 16;
        int64_t col = (tile % tiles_per_row) * 4 + in % 4;
        dst[o] = r < rows && col < scale_cols ? src[r * scale_cols + col] : 0;
    }
}

qd_status qd_cuda_scales_swizzle(uint8_t *dst, const uint8_t *src, int64_t rows, int64_t scale_cols)
{
    if (rows < 0 || scale_cols < 0)
        return qd_error(QD_ERR_SHAPE, "qd_cuda_scales_swizzle: shape (%lld, %lld)", (long long)rows,
                        (long long)scale_cols);
    int64_t total = (int64_t)qd_scales_swizzled_size(rows, scale_cols);
    if (total == 0)
        return QD_OK;
    qd_launch(swizzle_kernel, grid_for(total), THREADS, 0, dst, src, rows, scale_cols, (scale_cols + 3) / 4, total);
    QD_CUDA_CHECK(cudaGetLastError());
    return QD_OK;
}

/* ---- W4A4 path */
/* Its attributes tell which device code of this binary the device runs. */
static __global__ void arch_probe_kernel(void) { QD_PDL_ENTRY(); }

static qd_w4a4_path detect_path(void)
{
    int dev, major = 0;
    cudaFuncAttributes fa;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
        cudaGetLastError();
        return QD_W4A4_EMULATED;
    }
    if (major != 10 && major != 12)
        return QD_W4A4_EMULATED;
    /* binaryVersion is the SASS the device loaded: 100 or 120 when this binary
     * was built with the sm_100a / sm_120a target */
    if (cudaFuncGetAttributes(&fa, arch_probe_kernel) != cudaSuccess) {
        cudaGetLastError();
        return QD_W4A4_EMULATED;
    }
    if (fa.binaryVersion / 10 != major)
        return QD_W4A4_EMULATED;
    if (cublasLtGetVersion() < 120800) /* CUDA_R_4F_E2M1 and VEC16_UE4M3 came with 12.8 */
        return QD_W4A4_EMULATED;
    return QD_W4A4_CUBLASLT_NVFP4;
}

qd_w4a4_path qd_cuda_w4a4_path(void)
{
    int dev;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= MAX_DEVICES) {
        cudaGetLastError();
        return QD_W4A4_EMULATED;
    }
    if (!path_known[dev])
        path_known[dev] = 1 + (int)detect_path();
    return (qd_w4a4_path)(path_known[dev] - 1);
}

const char *qd_cuda_w4a4_path_name(qd_w4a4_path p)
{
    return p == QD_W4A4_CUBLASLT_NVFP4 ? "cublaslt-nvfp4" : "emulated";
}

/* Device scratch of at least n bytes (grows; cudaFree waits for the device). */
static qd_status scratch(blas_ctx *c, size_t n, uint8_t **out)
{
    if (c->scratch_bytes < n) {
        QD_REFUSE_RECORDING();
        qd_cuda_buf_gen++;
        QD_CUDA_CHECK(cudaFree(c->scratch));
        c->scratch = NULL;
        c->scratch_bytes = 0;
        QD_CUDA_CHECK(cudaMalloc((void **)&c->scratch, n));
        c->scratch_bytes = n;
    }
    *out = c->scratch;
    return QD_OK;
}

static qd_status w4a4_shape(const char *fn, const qd_nvfp4 *a, const qd_nvfp4 *w)
{
    if (a->cols != w->cols)
        return qd_error(QD_ERR_SHAPE, "%s: A has K = %lld, W has K = %lld", fn, (long long)a->cols,
                        (long long)w->cols);
    if (a->cols % 32 != 0)
        return qd_error(QD_ERR_SHAPE, "%s: K = %lld is not a multiple of 32 (16-byte FP4 rows)", fn,
                        (long long)a->cols);
    return QD_OK;
}

qd_status qd_cuda_w4a4_gemm_native(float *y, const qd_nvfp4 *a, const qd_nvfp4 *w)
{
    if (qd_cuda_w4a4_path() != QD_W4A4_CUBLASLT_NVFP4)
        return qd_error(QD_ERR_UNSUPPORTED,
                        "qd_cuda_w4a4_gemm_native: this device or build has no native NVFP4 "
                        "(compute capability 10.x/12.x with an sm_100a/sm_120a build needed)");
    QD_TRY(w4a4_shape("qd_cuda_w4a4_gemm_native", a, w));
    int64_t M = a->rows, N = w->rows, K = a->cols;
    if (M == 0 || N == 0)
        return QD_OK;
    blas_ctx *c;
    uint8_t *buf = NULL;
    QD_TRY(get_ctx(&c));
    /* (M, K/16) and (N, K/16) scales, each padded to 128 rows x 4 columns; the
     * second buffer starts on a 256-byte boundary (both sizes are multiples of 512) */
    size_t sa_bytes = qd_scales_swizzled_size(M, K / 16), sw_bytes = qd_scales_swizzled_size(N, K / 16);
    QD_TRY(scratch(c, sa_bytes + sw_bytes, &buf));
    QD_TRY(qd_cuda_scales_swizzle(buf, a->scales, M, K / 16));
    QD_TRY(qd_cuda_scales_swizzle(buf + sa_bytes, w->scales, N, K / 16));
    QD_TRY(gemm_rm(KIND_FP4, y, a->codes, 0, w->codes, 1, M, N, K, 1.0f, 0.0f, buf, buf + sa_bytes));
    return scale_rows_cols(y, a->s_dec, a->per_row, w->s_dec, w->per_row, M, N);
}

qd_status qd_cuda_w4a4_gemm_fast(float *y, const qd_nvfp4 *a, const qd_nvfp4 *w)
{
    if (qd_cuda_w4a4_path() == QD_W4A4_CUBLASLT_NVFP4 && a->cols == w->cols && a->cols % 32 == 0)
        return qd_cuda_w4a4_gemm_native(y, a, w);
    return qd_cuda_w4a4_gemm_tc_async(y, a, w); /* no host wait: the stream orders it */
}
