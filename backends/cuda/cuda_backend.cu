/* The CUDA backend: the CPU backend (backends/cpu/cpu_backend.c) on one GPU,
 * in exact mode bit for bit (NUMERICS.md §6). The structure is the CPU's,
 * function for function: the same packed batch, the same per-recipe
 * linear_forward/linear_backward, MoE rows grouped by expert (qd_moe_group,
 * shared with the CPU), the same backward order, AdamW, generation (prefill,
 * then KV-cache decode steps) and diagnostics; each CPU loop nest became a
 * kernel of backends/cuda/cuda_kernels.cu, and the quantizers and the W4A4
 * product are backends/cuda/cuda_quant.cu's (themselves checked bit for bit
 * against quant/). What stays on the host, as in the CPU backend: the batch
 * packing, the MoE row bookkeeping (topk copied back once per MoE layer), the
 * RAC channel selection (qd_rac_select) and the sampler (qd_sample_batch on the
 * last logits of each row), so those are the CPU's own code.
 *
 * Master weights, gradients and AdamW moments are float32 on the device; the
 * working copy the forward reads is rebuilt at every sync, as the CPU's.
 *
 * Fast mode (options.mode, NUMERICS.md §7) changes only the products: BF16
 * linears through cuBLASLt's BF16 GEMM (float32 accumulate), other float
 * linears and every backward product through cuBLASLt float32 GEMMs, FP8
 * through cuBLASLt FP8, W4A4 through cuBLASLt's block-scaled FP4 on Blackwell
 * (the canonical kernels elsewhere), attention through one fused kernel. The
 * quantizers, norms, routing and sampling are the exact mode's. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backends/cuda/cuda_blas.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_quant.h"
extern "C" {
#include "backends/backend.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/layout.h"
#include "backends/sampling.h"
#include "backends/shared.h"
}

/* ------------------------------------------------------------------------ */
/* the context                                                               */

typedef struct {
    size_t w;              /* offset of the weight (out, in) in the flat buffers */
    int out, in;
    qd_linear_mode mode;
    int quantized;
    const char *name;
    /* rollout copies on the device, rebuilt at every sync */
    qd_nvfp4 wq;           /* W4A4: (out, in); RAC: (out, in + nrac) */
    uint8_t *w8;           /* FP8: (out, in) E4M3 codes */
    float *w8_inv;         /* FP8: (out) */
    int64_t *rac_ch;       /* RAC: host (in), nrac used, ascending */
    int64_t *d_rac_ch;     /* RAC: device copy */
    int64_t nrac;
    double *d_rac_err;     /* RAC: device (in) squared activation error since the last sync */
    double act_err, act_norm, weight_err; /* diagnostics (host) */
} linear;

typedef qd_layout_layer layer;

/* Device activations of one layer kept for backward (the CPU's layer_acts). */
typedef struct {
    float *x, *ln1, *rstd1, *q, *k, *v, *rstd_q, *rstd_k, *qr, *kr, *att, *ao, *xmid, *ln2, *rstd2;
    float *probs, *topw;
    int32_t *topk;
    int32_t *row_tok, *row_rank, *tok_rows;
    float *row_w;
    float *xe, *g, *u, *h, *y;
    int32_t *exp_off;      /* host (nexp + 1) */
} layer_acts;

/* Grow-only device scratch buffers. */
enum { S_XE, S_XH, S_ACT, S_FP8Q, S_FP8S, S_LOGP, S_BWD, S_DIAG, S_X16, S_RAC, S_NSCRATCH };

typedef struct cuda_ctx_tag {
    qd_model_config cfg;
    qd_backend_options opt;
    qd_backend base;
    qd_param_info *info;
    int ninfo;
    size_t nfloats;
    linear *lin;
    int nlin;
    layer *layers;
    size_t embed, final_norm;
    int lm_head;
    float *d_params, *d_grads, *d_m, *d_v, *d_wk;
    uint16_t *d_wk16;              /* fast mode, BF16 recipes: the working copy's BF16 bits */
    float *d_cos, *d_sin;
    /* the last forward */
    int N, Tm, B;
    int32_t *tok, *tgt, *pos, *src, *row, *seq_off; /* host (N), (B + 1) */
    int32_t *d_tok, *d_tgt, *d_pos, *d_row, *d_kbase, *d_slen; /* device (N) */
    layer_acts *acts;
    float *xf, *lnf, *rstdf, *logits, *lse; /* device */
    float temp;
    void *arena;                   /* device activations */
    size_t arena_cap;
    void *harena;                  /* host side of the batch */
    size_t harena_cap;
    int *d_bad;
    void *scratch[S_NSCRATCH];
    size_t scratch_cap[S_NSCRATCH];
    /* KV cache of a generation */
    float *kc, *vc;
    int cache_rows, Tc;
    int decode;
    int have_forward, have_diag;
    const char **dg_names;
    double *dg_act_err, *dg_act_norm, *dg_weight_err;
    int32_t *dg_topk;
    /* QUADS_CUDA_PROFILE=1: wall time per phase (synchronizing at each mark), printed at free */
    int prof, prof_sec;
    double prof_last, prof_t[16];
    long prof_n[16];
} cuda_ctx;

enum { PR_OTHER, PR_ATTN_LIN, PR_ATTN, PR_ROUTE, PR_EXPERTS, PR_HEAD, PR_LOGP, PR_SAMPLE, PR_BWD, PR_OPT,
       PR_SYNC, PR_N };
static const char *const prof_names[PR_N] = {"other", "attention linears", "attention", "routing", "experts",
                                              "lm_head", "log-probs", "logits to host + sampling",
                                              "backward", "AdamW", "weight sync"};

/* Charges the time since the last mark to the section it opened and opens sec. */
static void prof(struct cuda_ctx_tag *c, int sec);

#define P(c, off) ((c)->d_wk + (off))

static void prof(cuda_ctx *c, int sec)
{
    if (!c->prof)
        return;
    cudaDeviceSynchronize();
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    if (c->prof_last > 0)
        c->prof_t[c->prof_sec] += t - c->prof_last;
    c->prof_n[sec]++;
    c->prof_sec = sec;
    c->prof_last = t;
}

static void prof_print(const cuda_ctx *c)
{
    if (!c->prof)
        return;
    fprintf(stderr, "cuda backend profile (QUADS_CUDA_PROFILE):\n");
    for (int i = 0; i < PR_N; i++)
        fprintf(stderr, "  %-28s %8ld marks %10.3f ms\n", prof_names[i], c->prof_n[i], 1e3 * c->prof_t[i]);
}

static cuda_ctx *ctx_of(qd_backend *b) { return (cuda_ctx *)b->context; }

/* cudaMalloc with an out-of-memory message giving the sizes asked for and free. */
static qd_status dev_alloc(void **p, size_t bytes, const char *what)
{
    *p = NULL;
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e == cudaSuccess)
        return QD_OK;
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        return qd_error(QD_ERR_NOMEM, "cuda backend: out of GPU memory for %s: %zu bytes asked for, "
                        "%zu free of %zu", what, bytes, fr, tot);
    }
    return qd_error(QD_ERR_DEVICE, "%s:%d: cudaMalloc(%zu bytes, %s): %s", __FILE__, __LINE__, bytes, what,
                    cudaGetErrorString(e));
}

#define DEV_ALLOC(p, n, what) QD_TRY(dev_alloc((void **)&(p), sizeof(*(p)) * (size_t)(n), what))

/* A scratch buffer of at least bytes (contents undefined). */
static qd_status scratch(cuda_ctx *c, int slot, size_t bytes, void **out)
{
    if (c->scratch_cap[slot] < bytes) {
        cudaFree(c->scratch[slot]);
        c->scratch[slot] = NULL;
        c->scratch_cap[slot] = 0;
        QD_TRY(dev_alloc(&c->scratch[slot], bytes, "scratch"));
        c->scratch_cap[slot] = bytes;
    }
    *out = c->scratch[slot];
    return QD_OK;
}

static qd_status h2d(void *dst, const void *src, size_t bytes)
{
    QD_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    return QD_OK;
}

static qd_status d2h(void *dst, const void *src, size_t bytes)
{
    QD_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    return QD_OK;
}

/* An NVFP4 view of (rows, cols) on scratch memory (activations: per row). */
static qd_status act_nvfp4(cuda_ctx *c, qd_nvfp4 *a, int64_t rows, int64_t cols)
{
    size_t nc = (size_t)(rows * cols / 2), ns = (size_t)(rows * cols / 16);
    size_t bytes = ((nc + 15) & ~(size_t)15) + ((ns + 15) & ~(size_t)15) + sizeof(float) * (size_t)rows;
    void *p;
    QD_TRY(scratch(c, S_ACT, bytes, &p));
    a->rows = rows;
    a->cols = cols;
    a->codes = (uint8_t *)p;
    a->scales = a->codes + ((nc + 15) & ~(size_t)15);
    a->s_dec = (float *)(a->scales + ((ns + 15) & ~(size_t)15));
    a->per_row = 1;
    return QD_OK;
}

/* ------------------------------------------------------------------------ */
/* the linear layer of every recipe (the CPU's linear_forward/backward)      */

static qd_status fwd_w4a4(cuda_ctx *c, float *out, const float *inp, linear *L, int N)
{
    qd_nvfp4 a;
    int64_t K = L->in + (L->mode == QD_LINEAR_W4A4_RAC ? L->nrac : 0);
    QD_TRY(act_nvfp4(c, &a, N, K));
    if (L->mode == QD_LINEAR_W4A4_RAC) {
        void *xh, *ws;
        QD_TRY(scratch(c, S_XH, sizeof(float) * (size_t)N * L->in, &xh));
        QD_TRY(scratch(c, S_RAC, sizeof(float) * (((size_t)N + 63) / 64 * 64 + (size_t)N * L->nrac), &ws));
        QD_TRY(qd_cuda_nvfp4_fake_quant_async((float *)xh, inp, N, L->in, 1));
        QD_TRY(qdk_rac_error(L->d_rac_err, inp, (const float *)xh, N, L->in));
        QD_TRY(qd_cuda_rac_augment_act_async(&a, inp, N, L->in, L->d_rac_ch, L->nrac, (float *)ws));
    } else {
        /* a non-finite input is reported by model_forward's qd_cuda_nonfinite_check */
        QD_TRY(qd_cuda_nvfp4_quantize_async(&a, inp));
    }
    if (c->opt.mode == QD_MODE_FAST)
        return qd_cuda_w4a4_gemm_fast(out, &a, &L->wq);
    return qd_cuda_w4a4_gemm_tc_async(out, &a, &L->wq);
}

static qd_status fwd_fp8(cuda_ctx *c, float *out, const float *inp, const linear *L, int N)
{
    void *qa, *sa;
    QD_TRY(scratch(c, S_FP8Q, (size_t)N * L->in, &qa));
    QD_TRY(scratch(c, S_FP8S, sizeof(float) * (size_t)N, &sa));
    QD_TRY(qd_cuda_fp8_quantize_rows((uint8_t *)qa, (float *)sa, inp, N, L->in));
    if (c->opt.mode == QD_MODE_FAST && L->in % 16 == 0)
        return qd_cuda_gemm_fp8(out, (const uint8_t *)qa, (const float *)sa, L->w8, L->w8_inv, N, L->out, L->in);
    return qdk_fp8_gemm(out, (const uint8_t *)qa, (const float *)sa, L->w8, L->w8_inv, N, L->out, L->in);
}

/* The input a BF16/QAT linear multiplies (effective_input): x itself (FP32),
 * BF16-rounded, or fake-quantized per row (sym-QAT), in scratch. */
static qd_status effective_input(cuda_ctx *c, const float **xe, const float *inp, const linear *L, int N)
{
    *xe = inp;
    if (L->mode == QD_LINEAR_FP32)
        return QD_OK;
    void *p;
    size_t n = (size_t)N * L->in;
    QD_TRY(scratch(c, S_XE, sizeof(float) * n, &p));
    *xe = (const float *)p;
    if (L->mode == QD_LINEAR_SYM_QAT)
        return qd_cuda_nvfp4_fake_quant((float *)p, inp, N, L->in, 1);
    return qdk_round((float *)p, inp, n, 1);
}

/* Diagnostics: per-row NVFP4 error sums of the input rows (rows, in), then
 * segment g's rows off[g] .. off[g+1]-1 added in order to linear L[g]'s sums
 * (one linear, or the experts of a grouped projection). */
static qd_status measure_act_rows(cuda_ctx *c, linear *const *L, const int32_t *off, int nseg, const float *inp,
                                  int rows, int in)
{
    void *xh, *sums;
    QD_TRY(scratch(c, S_XH, sizeof(float) * (size_t)rows * in, &xh));
    QD_TRY(scratch(c, S_DIAG, sizeof(double) * 2 * (size_t)rows, &sums));
    QD_TRY(qd_cuda_nvfp4_fake_quant((float *)xh, inp, rows, in, 1));
    double *e = (double *)sums;
    QD_TRY(qdk_sqerr_rows(e, e + rows, inp, (const float *)xh, rows, in));
    double *h = (double *)malloc(sizeof(double) * 2 * (size_t)(rows ? rows : 1));
    if (!h)
        return qd_error(QD_ERR_NOMEM, "cuda backend: diagnostics");
    qd_status st = d2h(h, e, sizeof(double) * 2 * (size_t)rows);
    for (int g = 0; g < nseg && !st; g++)
        for (int r = off[g]; r < off[g + 1]; r++) {
            L[g]->act_err += h[r];
            L[g]->act_norm += h[rows + r];
        }
    free(h);
    return st;
}

static qd_status measure_act_error(cuda_ctx *c, linear *L, const float *inp, int N)
{
    int32_t off[2] = {0, N};
    return measure_act_rows(c, &L, off, 1, inp, N, L->in);
}

static qd_status linear_forward(cuda_ctx *c, float *out, const float *inp, linear *L, int N)
{
    if (N == 0)
        return QD_OK;
    if (c->opt.diagnostics && L->quantized && L->in % QD_NVFP4_BLOCK == 0)
        QD_TRY(measure_act_error(c, L, inp, N));
    if (L->mode == QD_LINEAR_W4A4 || L->mode == QD_LINEAR_W4A4_RAC)
        return fwd_w4a4(c, out, inp, L, N);
    if (L->mode == QD_LINEAR_FP8)
        return fwd_fp8(c, out, inp, L, N);
    if (c->opt.mode == QD_MODE_FAST && L->mode == QD_LINEAR_BF16 && c->d_wk16) {
        void *x16;
        QD_TRY(scratch(c, S_X16, sizeof(uint16_t) * (size_t)N * L->in, &x16));
        QD_TRY(qdk_bf16_bits((uint16_t *)x16, inp, (size_t)N * L->in));
        return qd_cuda_gemm_bf16(out, (const uint16_t *)x16, c->d_wk16 + L->w, N, L->out, L->in, 0.0f);
    }
    const float *xe;
    QD_TRY(effective_input(c, &xe, inp, L, N));
    if (c->opt.mode == QD_MODE_FAST)
        return qd_cuda_gemm_f32(out, xe, P(c, L->w), N, L->out, L->in, 0.0f);
    /* out (N, OC) = x (N, IC) . W (OC, IC)^T */
    return qdk_matmul(out, xe, L->in, 1, P(c, L->w), 1, L->in, N, L->out, L->in, 0);
}

/* dinp (N, in) += dout . W_eff; grad(W) += dout^T . x_eff (straight-through). */
static qd_status linear_backward(cuda_ctx *c, float *dinp, const float *dout, const float *inp,
                                 const linear *L, int N)
{
    if (N == 0)
        return QD_OK;
    const float *xe;
    QD_TRY(effective_input(c, &xe, inp, L, N));
    int IC = L->in, OC = L->out;
    if (c->opt.mode == QD_MODE_FAST) {
        QD_TRY(qd_cuda_gemm_f32_dx(dinp, dout, P(c, L->w), N, OC, IC, 1.0f));
        return qd_cuda_gemm_f32_dw(c->d_grads + L->w, dout, xe, N, OC, IC, 1.0f);
    }
    QD_TRY(qdk_matmul(dinp, dout, OC, 1, P(c, L->w), IC, 1, N, IC, OC, 1));
    return qdk_matmul(c->d_grads + L->w, dout, 1, OC, xe, IC, 1, OC, IC, N, 1);
}

/* ------------------------------------------------------------------------ */
/* weight sync                                                               */

static int is_rollout_quant(qd_linear_mode m)
{
    return m == QD_LINEAR_FP8 || m == QD_LINEAR_W4A4 || m == QD_LINEAR_W4A4_RAC;
}

/* (Re)allocates a weight NVFP4 matrix when its shape changes (RAC's width). */
static qd_status weight_nvfp4(qd_nvfp4 *q, int64_t rows, int64_t cols)
{
    if (q->codes && q->rows == rows && q->cols == cols)
        return QD_OK;
    qd_cuda_nvfp4_free(q);
    return qd_cuda_nvfp4_alloc(q, rows, cols, 0);
}

static qd_status upload_rac(linear *L)
{
    if (L->nrac > 0)
        QD_TRY(h2d(L->d_rac_ch, L->rac_ch, sizeof(int64_t) * (size_t)L->nrac));
    return QD_OK;
}

static qd_status sync_rollout_linear(cuda_ctx *c, linear *L)
{
    const float *w = c->d_params + L->w;
    if (L->mode == QD_LINEAR_FP8)
        return qd_cuda_fp8_quantize_rows(L->w8, L->w8_inv, w, L->out, L->in);
    if (L->mode == QD_LINEAR_W4A4) {
        QD_TRY(weight_nvfp4(&L->wq, L->out, L->in));
        return qd_cuda_nvfp4_quantize(&L->wq, w);
    }
    /* RAC: channels of largest activation error since the last sync, picked on the host */
    double *err = (double *)malloc(sizeof(double) * (size_t)L->in);
    if (!err)
        return qd_error(QD_ERR_NOMEM, "cuda backend: RAC statistics");
    qd_status st = d2h(err, L->d_rac_err, sizeof(double) * (size_t)L->in);
    if (!st)
        L->nrac = qd_rac_select(L->rac_ch, err, L->in, c->opt.rac_ratio);
    free(err);
    if (st)
        return st;
    if (L->nrac < 0)
        return QD_ERR_ARG;
    QD_CUDA_CHECK(cudaMemset(L->d_rac_err, 0, sizeof(double) * (size_t)L->in));
    QD_TRY(upload_rac(L));
    QD_TRY(weight_nvfp4(&L->wq, L->out, L->in + L->nrac));
    return qd_cuda_rac_augment_weight(&L->wq, w, L->out, L->in, L->d_rac_ch, L->nrac);
}

static qd_status measure_weight_error(cuda_ctx *c, linear *L)
{
    void *wh, *sums;
    QD_TRY(scratch(c, S_XH, sizeof(float) * (size_t)L->out * L->in, &wh));
    QD_TRY(scratch(c, S_DIAG, sizeof(double) * 2 * (size_t)L->out, &sums));
    const float *w = c->d_params + L->w;
    QD_TRY(qd_cuda_nvfp4_fake_quant((float *)wh, w, L->out, L->in, 0));
    double *e = (double *)sums;
    QD_TRY(qdk_sqerr_rows(e, e + L->out, w, (const float *)wh, L->out, L->in));
    double *h = (double *)malloc(sizeof(double) * 2 * (size_t)L->out), num = 0, den = 0;
    if (!h)
        return qd_error(QD_ERR_NOMEM, "cuda backend: diagnostics");
    qd_status st = d2h(h, e, sizeof(double) * 2 * (size_t)L->out);
    for (int r = 0; r < L->out && !st; r++) {
        num += h[r];
        den += h[L->out + r];
    }
    free(h);
    L->weight_err = den > 0 ? num / den : 0.0;
    return st;
}

static qd_status sync_linear(cuda_ctx *c, linear *L)
{
    if (c->opt.diagnostics && L->quantized && L->in % QD_NVFP4_BLOCK == 0)
        QD_TRY(measure_weight_error(c, L));
    if (is_rollout_quant(L->mode))
        return sync_rollout_linear(c, L);
    if (L->mode == QD_LINEAR_AQAT || L->mode == QD_LINEAR_SYM_QAT)
        return qd_cuda_nvfp4_fake_quant(c->d_wk + L->w, c->d_params + L->w, L->out, L->in, 0);
    return QD_OK;  /* BF16: rounded with everything else */
}

static qd_status sync_weights(cuda_ctx *c)
{
    if (c->d_wk != c->d_params)
        QD_TRY(qdk_round(c->d_wk, c->d_params, c->nfloats, 1));
    for (int i = 0; i < c->nlin; i++)
        QD_TRY(sync_linear(c, &c->lin[i]));
    if (c->d_wk16)
        QD_TRY(qdk_bf16_bits(c->d_wk16, c->d_wk, c->nfloats));
    QD_CUDA_CHECK(cudaDeviceSynchronize());
    return QD_OK;
}

/* ------------------------------------------------------------------------ */
/* activations                                                               */

typedef struct {
    char *base;
    size_t used;
} arena;

static void *take(arena *a, size_t bytes)
{
    void *p = a->base ? a->base + a->used : NULL;
    a->used += (bytes + 255) & ~(size_t)255;
    return p;
}

#define TAKE_F(a, n) ((float *)take((a), sizeof(float) * (size_t)(n)))
#define TAKE_I(a, n) ((int32_t *)take((a), sizeof(int32_t) * (size_t)(n)))

static void layout_layer(arena *a, layer_acts *s, const cuda_ctx *c, const layer *ly)
{
    const qd_model_config *g = &c->cfg;
    int N = c->N, C = g->hidden_size, H = g->num_attention_heads, KV = g->num_key_value_heads;
    int D = g->head_dim, K = ly->moe ? g->num_experts_per_tok : 1, R = N * K;
    s->x = TAKE_F(a, N * C);
    s->ln1 = TAKE_F(a, N * C);
    s->rstd1 = TAKE_F(a, N);
    s->q = TAKE_F(a, N * H * D);
    s->k = TAKE_F(a, N * KV * D);
    s->v = TAKE_F(a, N * KV * D);
    s->rstd_q = TAKE_F(a, N * H);
    s->rstd_k = TAKE_F(a, N * KV);
    s->qr = TAKE_F(a, N * H * D);
    s->kr = TAKE_F(a, N * KV * D);
    s->att = TAKE_F(a, (size_t)N * H * c->Tm);
    s->ao = TAKE_F(a, N * H * D);
    s->xmid = TAKE_F(a, N * C);
    s->ln2 = TAKE_F(a, N * C);
    s->rstd2 = TAKE_F(a, N);
    s->probs = TAKE_F(a, N * ly->nexp);
    s->topk = TAKE_I(a, N * K);
    s->topw = TAKE_F(a, N * K);
    s->row_tok = TAKE_I(a, R);
    s->row_w = TAKE_F(a, R);
    s->row_rank = TAKE_I(a, R);
    s->tok_rows = TAKE_I(a, R);
    s->xe = TAKE_F(a, (size_t)R * C);
    s->g = TAKE_F(a, (size_t)R * ly->ffn);
    s->u = TAKE_F(a, (size_t)R * ly->ffn);
    s->h = TAKE_F(a, (size_t)R * ly->ffn);
    s->y = TAKE_F(a, (size_t)R * C);
}

static void layout_acts(arena *a, cuda_ctx *c)
{
    int N = c->N, C = c->cfg.hidden_size;
    c->d_tok = TAKE_I(a, N);
    c->d_tgt = TAKE_I(a, N);
    c->d_pos = TAKE_I(a, N);
    c->d_row = TAKE_I(a, N);
    c->d_kbase = TAKE_I(a, N);
    c->d_slen = TAKE_I(a, N);
    for (int l = 0; l < c->cfg.num_hidden_layers; l++)
        layout_layer(a, &c->acts[l], c, &c->layers[l]);
    c->xf = TAKE_F(a, N * C);
    c->lnf = TAKE_F(a, N * C);
    c->rstdf = TAKE_F(a, N);
    c->logits = TAKE_F(a, (size_t)N * c->cfg.vocab_size);
    c->lse = TAKE_F(a, N);
}

/* Host side: tok, tgt, pos, src, row (N), seq_off (B + 1), and per layer
 * exp_off (nexp + 1). */
static size_t host_bytes(const cuda_ctx *c)
{
    size_t n = sizeof(int32_t) * (5 * (size_t)c->N + c->B + 1);
    for (int l = 0; l < c->cfg.num_hidden_layers; l++)
        n += sizeof(int32_t) * (size_t)(c->layers[l].nexp + 1);
    return n;
}

static qd_status alloc_acts(cuda_ctx *c)
{
    arena a = {NULL, 0};
    layout_acts(&a, c);
    if (a.used > c->arena_cap) {
        cudaFree(c->arena);
        c->arena = NULL;
        c->arena_cap = 0;
        QD_TRY(dev_alloc(&c->arena, a.used, "activations"));
        c->arena_cap = a.used;
    }
    a.base = (char *)c->arena;
    a.used = 0;
    layout_acts(&a, c);
    size_t hb = host_bytes(c);
    if (hb > c->harena_cap) {
        free(c->harena);
        c->harena = malloc(hb);
        c->harena_cap = c->harena ? hb : 0;
        if (!c->harena)
            return qd_error(QD_ERR_NOMEM, "cuda backend: batch of %d tokens", c->N);
    }
    int32_t *h = (int32_t *)c->harena;
    c->tok = h, h += c->N;
    c->tgt = h, h += c->N;
    c->pos = h, h += c->N;
    c->src = h, h += c->N;
    c->row = h, h += c->N;
    c->seq_off = h, h += c->B + 1;
    for (int l = 0; l < c->cfg.num_hidden_layers; l++)
        c->acts[l].exp_off = h, h += c->layers[l].nexp + 1;
    return QD_OK;
}

/* The per-token tables to the device: token, target, position, KV row, the
 * first key row of its attention (kbase) and its sequence's length. */
static qd_status upload_batch(cuda_ctx *c)
{
    int N = c->N;
    int32_t *t = (int32_t *)malloc(sizeof(int32_t) * 2 * (size_t)(N ? N : 1));
    if (!t)
        return qd_error(QD_ERR_NOMEM, "cuda backend: batch");
    for (int b = 0, n = 0; b < c->B; b++)
        for (; n < c->seq_off[b + 1]; n++) {
            t[n] = c->decode ? c->row[n] * c->Tc : c->seq_off[b];
            t[N + n] = c->seq_off[b + 1] - c->seq_off[b];
        }
    qd_status st = h2d(c->d_tok, c->tok, sizeof(int32_t) * N);
    if (!st)
        st = h2d(c->d_tgt, c->tgt, sizeof(int32_t) * N);
    if (!st)
        st = h2d(c->d_pos, c->pos, sizeof(int32_t) * N);
    if (!st)
        st = h2d(c->d_row, c->row, sizeof(int32_t) * N);
    if (!st)
        st = h2d(c->d_kbase, t, sizeof(int32_t) * N);
    if (!st)
        st = h2d(c->d_slen, t + N, sizeof(int32_t) * N);
    free(t);
    return st;
}

static qd_status pack_batch(cuda_ctx *c, const qd_batch *bt)
{
    c->N = 0;
    c->Tm = 0;
    for (int b = 0; b < bt->B; b++) {
        c->N += bt->lengths[b];
        if (bt->lengths[b] > c->Tm)
            c->Tm = bt->lengths[b];
    }
    if (c->Tm > c->cfg.max_position_embeddings)
        return qd_error(QD_ERR_SHAPE, "forward: length %d > max_position_embeddings %d", c->Tm,
                        c->cfg.max_position_embeddings);
    c->B = bt->B;
    c->temp = bt->temperature > 0.0f ? bt->temperature : 1.0f;
    QD_TRY(alloc_acts(c));
    QD_TRY(qd_pack_batch(c->tok, c->tgt, c->pos, c->row, c->src, c->seq_off, bt, c->cfg.vocab_size));
    return upload_batch(c);
}

/* ------------------------------------------------------------------------ */
/* forward                                                                   */

/* Router (on the device), then the rows grouped by expert (on the host, the
 * CPU's qd_moe_group), uploaded. */
static qd_status route(cuda_ctx *c, layer_acts *s, const layer *ly)
{
    int N = c->N, E = ly->nexp, K = ly->moe ? c->cfg.num_experts_per_tok : 1;
    if (ly->moe)
        QD_TRY(qdk_route(s->topk, s->topw, s->probs, N, E, K, c->cfg.norm_topk_prob));
    size_t nk = (size_t)N * K;
    int32_t *h = (int32_t *)malloc(sizeof(int32_t) * (5 * nk + (size_t)E + 1));
    if (!h)
        return qd_error(QD_ERR_NOMEM, "cuda backend: routing");
    int32_t *topk = h, *row_tok = h + nk, *row_rank = h + 2 * nk, *tok_rows = h + 3 * nk, *cnt = h + 5 * nk;
    float *topw = (float *)(h + 4 * nk), *row_w = NULL;
    qd_status st = QD_OK;
    if (ly->moe) {
        st = d2h(topk, s->topk, sizeof(int32_t) * nk);
        if (!st)
            st = d2h(topw, s->topw, sizeof(float) * nk);
    }
    float *rw = (float *)malloc(sizeof(float) * (nk ? nk : 1));
    row_w = rw;
    if (!st && !rw)
        st = qd_error(QD_ERR_NOMEM, "cuda backend: routing");
    if (!st) {
        qd_moe_group(s->exp_off, row_tok, row_w, row_rank, tok_rows, cnt, ly->moe ? topk : NULL, topw, N, E, K);
        st = h2d(s->row_tok, row_tok, sizeof(int32_t) * nk);
    }
    if (!st)
        st = h2d(s->row_rank, row_rank, sizeof(int32_t) * nk);
    if (!st)
        st = h2d(s->tok_rows, tok_rows, sizeof(int32_t) * nk);
    if (!st)
        st = h2d(s->row_w, row_w, sizeof(float) * nk);
    free(rw);
    free(h);
    return st;
}

static linear *expert_lin(cuda_ctx *c, const layer *ly, int e, int which)
{
    return &c->lin[ly->mlp0 + 3 * e + which];
}

/* ---- the experts of a layer in one launch per projection: the same rows and
 * operations as one linear_forward/backward per expert (each output has one
 * expert's operands), so the same bits, without 3 * nexp launches a layer */

/* One launch for all experts, in both modes (one cuBLASLt call per expert,
 * each of its own row count, was slower on the H200: a matmul plan per shape);
 * RAC layers go expert by expert (each has its own channel set and width). */
static int experts_grouped(const cuda_ctx *c, const layer *ly)
{
    return c->lin[ly->mlp0].mode != QD_LINEAR_W4A4_RAC;
}

/* out (R, OC) = rows of inp (R, IC) of each expert times its projection `which`. */
static qd_status experts_forward(cuda_ctx *c, float *out, const float *inp, const layer_acts *s, const layer *ly,
                                 int which)
{
    int E = ly->nexp, R = s->exp_off[E];
    linear *L0 = expert_lin(c, ly, 0, which);
    int IC = L0->in, OC = L0->out;
    if (R == 0)
        return QD_OK;
    linear **Ls = (linear **)malloc(sizeof(linear *) * E);
    qdk_mm_item *it = (qdk_mm_item *)calloc((size_t)E, sizeof *it);
    int64_t *roff = (int64_t *)malloc(sizeof(int64_t) * (E + 1));
    const qd_nvfp4 **wq = (const qd_nvfp4 **)malloc(sizeof(qd_nvfp4 *) * E);
    qd_status st = Ls && it && roff && wq ? QD_OK : qd_error(QD_ERR_NOMEM, "cuda backend: experts");
    for (int e = 0; e <= E && !st; e++) {
        roff[e] = s->exp_off[e];
        if (e < E) {
            Ls[e] = expert_lin(c, ly, e, which);
            wq[e] = &Ls[e]->wq;
        }
    }
    if (!st && c->opt.diagnostics && L0->quantized && IC % QD_NVFP4_BLOCK == 0)
        st = measure_act_rows(c, Ls, s->exp_off, E, inp, R, IC);
    if (!st && L0->mode == QD_LINEAR_W4A4) {
        qd_nvfp4 a;
        st = act_nvfp4(c, &a, R, IC);
        if (!st)
            st = qd_cuda_nvfp4_quantize_async(&a, inp);
        if (!st)
            st = qd_cuda_w4a4_gemm_grouped_async(out, &a, wq, roff, E);
    } else if (!st && L0->mode == QD_LINEAR_FP8) {
        void *qa, *sa;
        st = scratch(c, S_FP8Q, (size_t)R * IC, &qa);
        if (!st)
            st = scratch(c, S_FP8S, sizeof(float) * (size_t)R, &sa);
        if (!st)
            st = qd_cuda_fp8_quantize_rows((uint8_t *)qa, (float *)sa, inp, R, IC);
        for (int e = 0; e < E && !st; e++) {
            int r0 = s->exp_off[e], m = s->exp_off[e + 1] - r0;
            it[e] = (qdk_mm_item){(const uint8_t *)qa + (size_t)r0 * IC, Ls[e]->w8, out + (size_t)r0 * OC,
                                  (const float *)sa + r0, Ls[e]->w8_inv, m, m ? OC : 0, IC};
        }
        if (!st)
            st = qdk_matmul_grouped(it, E, IC, 1, 1, IC, 0, 1);
    } else if (!st) {
        const float *xe;
        st = effective_input(c, &xe, inp, L0, R);
        for (int e = 0; e < E && !st; e++) {
            int r0 = s->exp_off[e], m = s->exp_off[e + 1] - r0;
            it[e] = (qdk_mm_item){xe + (size_t)r0 * IC, P(c, Ls[e]->w), out + (size_t)r0 * OC, NULL, NULL, m,
                                  m ? OC : 0, IC};
        }
        if (!st)
            st = qdk_matmul_grouped(it, E, IC, 1, 1, IC, 0, 0);
    }
    free(Ls);
    free(it);
    free(roff);
    free(wq);
    return st;
}

/* dinp (R, IC) += dout . W_e; grad(W_e) += dout^T . x_eff over each expert's rows. */
static qd_status experts_backward(cuda_ctx *c, float *dinp, const float *dout, const float *inp,
                                  const layer_acts *s, const layer *ly, int which)
{
    int E = ly->nexp, R = s->exp_off[E];
    const linear *L0 = expert_lin(c, ly, 0, which);
    int IC = L0->in, OC = L0->out;
    if (R == 0)
        return QD_OK;
    qdk_mm_item *it = (qdk_mm_item *)calloc(2 * (size_t)E, sizeof *it);
    if (!it)
        return qd_error(QD_ERR_NOMEM, "cuda backend: experts");
    const float *xe;
    qd_status st = effective_input(c, &xe, inp, L0, R);
    for (int e = 0; e < E && !st; e++) {
        const linear *L = expert_lin(c, ly, e, which);
        int r0 = s->exp_off[e], m = s->exp_off[e + 1] - r0;
        it[e] = (qdk_mm_item){dout + (size_t)r0 * OC, P(c, L->w), dinp + (size_t)r0 * IC, NULL, NULL, m,
                              m ? IC : 0, OC};
        it[E + e] = (qdk_mm_item){dout + (size_t)r0 * OC, xe + (size_t)r0 * IC, c->d_grads + L->w, NULL, NULL,
                                  m ? OC : 0, IC, m};
    }
    if (!st)
        st = qdk_matmul_grouped(it, E, OC, 1, IC, 1, 1, 0);
    if (!st)
        st = qdk_matmul_grouped(it + E, E, 1, OC, IC, 1, 1, 0);
    free(it);
    return st;
}

static qd_status mlp_forward(cuda_ctx *c, float *out, layer_acts *s, const layer *ly)
{
    int N = c->N, C = c->cfg.hidden_size, I = ly->ffn, K = ly->moe ? c->cfg.num_experts_per_tok : 1;
    prof(c, PR_ROUTE);
    if (ly->moe)
        QD_TRY(linear_forward(c, s->probs, s->ln2, &c->lin[ly->router], N));
    QD_TRY(route(c, s, ly));
    int R = s->exp_off[ly->nexp];
    QD_TRY(qdk_gather(s->xe, s->ln2, s->row_tok, R, C));
    prof(c, PR_EXPERTS);
    if (experts_grouped(c, ly)) {
        QD_TRY(experts_forward(c, s->g, s->xe, s, ly, 0));
        QD_TRY(experts_forward(c, s->u, s->xe, s, ly, 1));
        QD_TRY(qdk_swiglu(s->h, s->g, s->u, (size_t)R * I));
        QD_TRY(experts_forward(c, s->y, s->h, s, ly, 2));
    } else {
        for (int e = 0; e < ly->nexp; e++) {
            int r0 = s->exp_off[e], m = s->exp_off[e + 1] - r0;
            size_t oi = (size_t)r0 * I, oc = (size_t)r0 * C;
            QD_TRY(linear_forward(c, s->g + oi, s->xe + oc, expert_lin(c, ly, e, 0), m));
            QD_TRY(linear_forward(c, s->u + oi, s->xe + oc, expert_lin(c, ly, e, 1), m));
            QD_TRY(qdk_swiglu(s->h + oi, s->g + oi, s->u + oi, (size_t)m * I));
            QD_TRY(linear_forward(c, s->y + oc, s->h + oi, expert_lin(c, ly, e, 2), m));
        }
    }
    QD_TRY(qdk_combine(out, s->y, s->row_w, s->tok_rows, N, K, C));
    prof(c, PR_OTHER);
    return QD_OK;
}

static qd_status attn_forward(cuda_ctx *c, float *out, layer_acts *s, const layer *ly, int l)
{
    const qd_model_config *g = &c->cfg;
    int N = c->N, H = g->num_attention_heads, KV = g->num_key_value_heads, D = g->head_dim;
    float eps = (float)g->rms_norm_eps;
    prof(c, PR_ATTN_LIN);
    QD_TRY(linear_forward(c, s->q, s->ln1, &c->lin[ly->q], N));
    QD_TRY(linear_forward(c, s->k, s->ln1, &c->lin[ly->k], N));
    QD_TRY(linear_forward(c, s->v, s->ln1, &c->lin[ly->v], N));
    QD_TRY(qdk_rmsnorm(s->qr, s->rstd_q, s->q, P(c, ly->q_norm), N * H, D, eps));
    QD_TRY(qdk_rmsnorm(s->kr, s->rstd_k, s->k, P(c, ly->k_norm), N * KV, D, eps));
    QD_TRY(qdk_rope(s->qr, c->d_pos, c->d_cos, c->d_sin, N, H, D, 0));
    QD_TRY(qdk_rope(s->kr, c->d_pos, c->d_cos, c->d_sin, N, KV, D, 0));
    size_t lsz = (size_t)c->cache_rows * c->Tc * KV * D;
    if (c->kc)
        QD_TRY(qdk_store_kv(c->kc + l * lsz, c->vc + l * lsz, s->kr, s->v, c->d_row, c->d_pos, N, c->Tc, KV * D));
    prof(c, PR_ATTN);
    const float *kb = c->decode ? c->kc + l * lsz : s->kr, *vb = c->decode ? c->vc + l * lsz : s->v;
    if (c->opt.mode == QD_MODE_FAST)
        QD_TRY(qdk_attend_fast(s->ao, s->att, s->qr, kb, vb, c->d_kbase, c->d_pos, N, H, KV, D, c->Tm));
    else
        QD_TRY(qdk_attend(s->ao, s->att, s->qr, kb, vb, c->d_kbase, c->d_pos, N, H, KV, D, c->Tm));
    prof(c, PR_ATTN_LIN);
    QD_TRY(linear_forward(c, out, s->ao, &c->lin[ly->o], N));
    prof(c, PR_OTHER);
    return QD_OK;
}

/* logp (N) on the device (lse saved); NONFINITE when a logit / T overflows. */
static qd_status logprob_forward(cuda_ctx *c, float *logp)
{
    int N = c->N, V = c->cfg.vocab_size;
    void *s = NULL;
    if (c->temp != 1.0f)
        QD_TRY(scratch(c, S_XE, sizeof(float) * (size_t)N * V, &s));
    QD_CUDA_CHECK(cudaMemset(c->d_bad, 0, sizeof(int)));
    QD_TRY(qdk_logprob(logp, c->lse, (float *)s, c->logits, c->d_tgt, N, V, c->temp, c->d_bad));
    int bad = 0;
    QD_TRY(d2h(&bad, c->d_bad, sizeof bad));
    if (bad)
        return qd_error(QD_ERR_NONFINITE, "forward: token %d: logits / temperature %g overflows", bad - 1,
                        (double)c->temp);
    return QD_OK;
}

/* logp: device (N). */
static qd_status model_forward(cuda_ctx *c, float *logp)
{
    const qd_model_config *g = &c->cfg;
    int N = c->N, C = g->hidden_size, L = g->num_hidden_layers;
    float eps = (float)g->rms_norm_eps;
    QD_TRY(qdk_embed(c->acts[0].x, P(c, c->embed), c->d_tok, N, C));
    for (int l = 0; l < L; l++) {
        layer_acts *s = &c->acts[l];
        const layer *ly = &c->layers[l];
        float *next = l + 1 < L ? c->acts[l + 1].x : c->xf;
        QD_TRY(qdk_rmsnorm(s->ln1, s->rstd1, s->x, P(c, ly->in_norm), N, C, eps));
        QD_TRY(attn_forward(c, next, s, ly, l));
        QD_TRY(qdk_add(s->xmid, s->x, next, (size_t)N * C));
        QD_TRY(qdk_rmsnorm(s->ln2, s->rstd2, s->xmid, P(c, ly->post_norm), N, C, eps));
        QD_TRY(mlp_forward(c, next, s, ly));
        QD_TRY(qdk_add(next, s->xmid, next, (size_t)N * C));
    }
    QD_TRY(qdk_rmsnorm(c->lnf, c->rstdf, c->xf, P(c, c->final_norm), N, C, eps));
    prof(c, PR_HEAD);
    QD_TRY(linear_forward(c, c->logits, c->lnf, &c->lin[c->lm_head], N));
    prof(c, PR_LOGP);
    QD_TRY(logprob_forward(c, logp));
    prof(c, PR_OTHER);
    QD_TRY(qd_cuda_nonfinite_check());
    return QD_OK;
}

/* ------------------------------------------------------------------------ */
/* backward                                                                  */

/* Zeroed device floats from the backward scratch, carved in order. */
typedef struct {
    float *base;
    size_t used;
} fcarve;

static float *carve(fcarve *f, size_t n)
{
    float *p = f->base + f->used;
    f->used += (n + 63) & ~(size_t)63;
    return p;
}

static qd_status zeroed(cuda_ctx *c, fcarve *f, size_t total)
{
    void *p;
    QD_TRY(scratch(c, S_BWD, sizeof(float) * total, &p));
    QD_CUDA_CHECK(cudaMemset(p, 0, sizeof(float) * total));
    f->base = (float *)p;
    f->used = 0;
    return QD_OK;
}

static size_t up64(size_t n) { return (n + 63) & ~(size_t)63; }

static qd_status mlp_backward(cuda_ctx *c, float *dinp, const float *dout, const layer_acts *s, const layer *ly,
                              float *buf)
{
    int N = c->N, C = c->cfg.hidden_size, I = ly->ffn, K = ly->moe ? c->cfg.num_experts_per_tok : 1;
    int R = s->exp_off[ly->nexp];
    fcarve f = {buf, 0};
    float *dy = carve(&f, (size_t)R * C), *dxe = carve(&f, (size_t)R * C), *dh = carve(&f, (size_t)R * I);
    float *dg = carve(&f, (size_t)R * I), *du = carve(&f, (size_t)R * I), *dw = carve(&f, (size_t)N * K);
    float *dlog = carve(&f, (size_t)N * ly->nexp);
    QD_TRY(qdk_moe_dy(dy, dw, dout, s->y, s->row_w, s->row_rank, s->tok_rows, N, K, C));
    /* backward runs in the trainer role, never under RAC: the experts are always grouped */
    QD_TRY(experts_backward(c, dh, dy, s->h, s, ly, 2));
    QD_TRY(qdk_swiglu_backward(dg, du, dh, s->g, s->u, (size_t)R * I));
    QD_TRY(experts_backward(c, dxe, dg, s->xe, s, ly, 0));
    QD_TRY(experts_backward(c, dxe, du, s->xe, s, ly, 1));
    QD_TRY(qdk_unroute(dinp, dxe, s->tok_rows, N, K, C));
    if (!ly->moe)
        return QD_OK;
    QD_TRY(qdk_router_backward(dlog, dw, s->probs, s->topk, s->topw, N, ly->nexp, K, c->cfg.norm_topk_prob));
    return linear_backward(c, dinp, dlog, s->ln2, &c->lin[ly->router], N);
}

static size_t mlp_backward_floats(const cuda_ctx *c, const layer *ly, int R)
{
    int N = c->N, C = c->cfg.hidden_size, I = ly->ffn, K = ly->moe ? c->cfg.num_experts_per_tok : 1;
    return 2 * up64((size_t)R * C) + 3 * up64((size_t)R * I) + up64((size_t)N * K) + up64((size_t)N * ly->nexp);
}

static qd_status attn_backward(cuda_ctx *c, float *dx, const float *dout, const layer_acts *s, const layer *ly,
                               float *buf)
{
    const qd_model_config *g = &c->cfg;
    int N = c->N, C = g->hidden_size, H = g->num_attention_heads, KV = g->num_key_value_heads, D = g->head_dim;
    size_t nq = (size_t)N * H * D, nk = (size_t)N * KV * D;
    fcarve f = {buf, 0};
    float *dao = carve(&f, nq), *dqr = carve(&f, nq), *dq = carve(&f, nq);
    float *dkr = carve(&f, nk), *dk = carve(&f, nk), *dv = carve(&f, nk), *dln = carve(&f, (size_t)N * C);
    float *ds = carve(&f, (size_t)N * H * c->Tm);
    QD_TRY(linear_backward(c, dao, dout, s->ao, &c->lin[ly->o], N));
    QD_TRY(qdk_attend_backward(dqr, dkr, dv, ds, dao, s->att, s->qr, s->kr, s->v, c->d_pos, c->d_slen, N, H, KV,
                               D, c->Tm));
    QD_TRY(qdk_rope(dqr, c->d_pos, c->d_cos, c->d_sin, N, H, D, 1));
    QD_TRY(qdk_rope(dkr, c->d_pos, c->d_cos, c->d_sin, N, KV, D, 1));
    QD_TRY(qdk_rmsnorm_backward(dq, c->d_grads + ly->q_norm, dqr, s->q, P(c, ly->q_norm), s->rstd_q, N * H, D));
    QD_TRY(qdk_rmsnorm_backward(dk, c->d_grads + ly->k_norm, dkr, s->k, P(c, ly->k_norm), s->rstd_k, N * KV, D));
    QD_TRY(linear_backward(c, dln, dq, s->ln1, &c->lin[ly->q], N));
    QD_TRY(linear_backward(c, dln, dk, s->ln1, &c->lin[ly->k], N));
    QD_TRY(linear_backward(c, dln, dv, s->ln1, &c->lin[ly->v], N));
    return qdk_rmsnorm_backward(dx, c->d_grads + ly->in_norm, dln, s->x, P(c, ly->in_norm), s->rstd1, N, C);
}

static size_t attn_backward_floats(const cuda_ctx *c)
{
    const qd_model_config *g = &c->cfg;
    size_t N = c->N, nq = N * g->num_attention_heads * g->head_dim, nk = N * g->num_key_value_heads * g->head_dim;
    return 3 * up64(nq) + 3 * up64(nk) + up64(N * g->hidden_size) + up64(N * g->num_attention_heads * c->Tm);
}

/* dlogp: device (N). The CPU's model_backward, each step a kernel. */
static qd_status model_backward(cuda_ctx *c, const float *dlogp)
{
    const qd_model_config *g = &c->cfg;
    int N = c->N, C = g->hidden_size, V = g->vocab_size;
    size_t layer_floats = attn_backward_floats(c);
    for (int l = 0; l < g->num_hidden_layers; l++) {
        size_t m = mlp_backward_floats(c, &c->layers[l], c->acts[l].exp_off[c->layers[l].nexp]);
        layer_floats = m > layer_floats ? m : layer_floats;
    }
    size_t total = up64((size_t)N * V) + 2 * up64((size_t)N * C) + layer_floats;
    prof(c, PR_BWD);
    fcarve f;
    QD_TRY(zeroed(c, &f, total));
    float *dlogits = carve(&f, (size_t)N * V), *dres = carve(&f, (size_t)N * C), *dln = carve(&f, (size_t)N * C);
    float *lbuf = carve(&f, layer_floats);
    QD_TRY(qdk_logprob_backward(dlogits, dlogp, c->logits, c->lse, c->d_tgt, N, V, c->temp));
    QD_TRY(linear_backward(c, dln, dlogits, c->lnf, &c->lin[c->lm_head], N));
    QD_TRY(qdk_rmsnorm_backward(dres, c->d_grads + c->final_norm, dln, c->xf, P(c, c->final_norm), c->rstdf, N, C));
    for (int l = g->num_hidden_layers - 1; l >= 0; l--) {
        const layer_acts *s = &c->acts[l];
        const layer *ly = &c->layers[l];
        QD_CUDA_CHECK(cudaMemset(dln, 0, sizeof(float) * (size_t)N * C));
        QD_CUDA_CHECK(cudaMemset(lbuf, 0, sizeof(float) * layer_floats));
        QD_TRY(mlp_backward(c, dln, dres, s, ly, lbuf));
        QD_TRY(qdk_rmsnorm_backward(dres, c->d_grads + ly->post_norm, dln, s->xmid, P(c, ly->post_norm), s->rstd2,
                                    N, C));
        QD_CUDA_CHECK(cudaMemset(lbuf, 0, sizeof(float) * layer_floats));
        QD_TRY(attn_backward(c, dres, dres, s, ly, lbuf));
    }
    QD_TRY(qdk_embed_backward(c->d_grads + c->embed, dres, c->d_tok, N, C));
    QD_CUDA_CHECK(cudaDeviceSynchronize());
    prof(c, PR_OTHER);
    return QD_OK;
}

/* ------------------------------------------------------------------------ */
/* generation: prefill, then KV-cache decode steps; sampling on the host     */

typedef struct {
    int32_t *seq, *len, *idx;
    float *lrow;                   /* (B, V) host: the last logits of each active row */
    qd_sample_result *sres;        /* (B) the sampler's results (qd_sample_batch, OpenMP over rows) */
    uint64_t *sid;                 /* (B) their sequence ids */
    uint32_t *spos;                /* (B) and positions */
    int *done;
    int Tmax;
} gen_state;

static qd_status decode_forward(cuda_ctx *c, gen_state *g, int na, float *d_lp)
{
    c->N = c->B = na;
    c->Tm = 0;
    for (int i = 0; i < na; i++)
        if (g->len[g->idx[i]] > c->Tm)
            c->Tm = g->len[g->idx[i]];
    QD_TRY(alloc_acts(c));
    qd_decode_pack(c->tok, c->pos, c->row, c->tgt, c->src, c->seq_off, g->seq, g->len, g->idx, na, g->Tmax);
    c->decode = 1;
    qd_status st = upload_batch(c);
    if (!st)
        st = model_forward(c, d_lp);
    c->decode = 0;
    return st;
}

static qd_status gen_step(cuda_ctx *c, gen_state *g, const qd_generate_request *rq, qd_generate_result *res,
                          int step, int *active)
{
    int na = 0, V = c->cfg.vocab_size, M = rq->max_new_tokens;
    for (int b = 0; b < rq->B; b++)
        if (!g->done[b])
            g->idx[na++] = b;
    *active = na;
    if (na == 0)
        return QD_OK;
    void *lp;
    QD_TRY(scratch(c, S_LOGP, sizeof(float) * (size_t)rq->B * rq->Tp + sizeof(float), &lp));
    if (step == 0) {
        qd_batch bt = {rq->B, rq->Tp, rq->prompt, rq->prompt_len, 1.0f};
        QD_TRY(pack_batch(c, &bt));
        QD_TRY(model_forward(c, (float *)lp));
    } else {
        QD_TRY(decode_forward(c, g, na, (float *)lp));
    }
    prof(c, PR_SAMPLE);
    if (step == 0)  /* the prefill's last logits of each row */
        for (int i = 0; i < na; i++) {
            int r = g->idx[i];
            QD_TRY(d2h(g->lrow + (size_t)i * V, c->logits + (size_t)(c->seq_off[r + 1] - 1) * V,
                       sizeof(float) * V));
        }
    else            /* a decode step's logits are the active rows' in order */
        QD_TRY(d2h(g->lrow, c->logits, sizeof(float) * (size_t)na * V));
    for (int i = 0; i < na; i++) {
        g->sid[i] = rq->seq_id[g->idx[i]];
        g->spos[i] = (uint32_t)g->len[g->idx[i]];
    }
    qd_sample_params sp = {rq->temperature, rq->top_k, rq->top_p < 1.0f ? rq->top_p : 1.0f, rq->seed};
    QD_TRY(qd_sample_batch(g->sres, g->lrow, na, V, &sp, g->sid, g->spos));
    for (int i = 0; i < na; i++) {
        int b = g->idx[i];
        int32_t tok = g->sres[i].token;
        g->seq[(size_t)b * g->Tmax + g->len[b]++] = tok;
        res->tokens[(size_t)b * M + step] = tok;
        res->logp[(size_t)b * M + step] = g->sres[i].logprob;
        res->lengths[b]++;
        g->done[b] = qd_generate_is_stop(rq, tok) || step + 1 == M;
    }
    prof(c, PR_OTHER);
    return QD_OK;
}

static void gen_free(cuda_ctx *c, gen_state *g, int M)
{
    free(g->seq);
    free(g->len);
    free(g->idx);
    free(g->lrow);
    free(g->sres);
    free(g->sid);
    free(g->spos);
    free(g->done);
    cudaFree(c->kc);
    cudaFree(c->vc);
    c->kc = c->vc = NULL;
    c->have_forward = 0;
    c->have_diag = M > 0;
}

static void reset_diag(cuda_ctx *c)
{
    c->have_diag = 0;
    for (int i = 0; i < c->nlin; i++)
        c->lin[i].act_err = c->lin[i].act_norm = 0.0;
}

static qd_status generate_run(cuda_ctx *c, gen_state *g, const qd_generate_request *rq, qd_generate_result *res)
{
    int B = rq->B, M = rq->max_new_tokens;
    size_t ncache = (size_t)c->cfg.num_hidden_layers * B * g->Tmax * c->cfg.num_key_value_heads * c->cfg.head_dim;
    if (!g->seq || !g->len || !g->idx || !g->lrow || !g->sres || !g->sid || !g->spos || !g->done)
        return qd_error(QD_ERR_NOMEM, "cuda backend: generate (host state)");
    QD_TRY(dev_alloc((void **)&c->kc, sizeof(float) * ncache, "KV cache (keys)"));
    QD_TRY(dev_alloc((void **)&c->vc, sizeof(float) * ncache, "KV cache (values)"));
    c->cache_rows = B;
    c->Tc = g->Tmax;
    qd_generate_begin(g->seq, g->len, g->done, rq, res, g->Tmax);
    reset_diag(c);
    int active = 1;
    for (int step = 0; step < M && active; step++)
        QD_TRY(gen_step(c, g, rq, res, step, &active));
    return QD_OK;
}

static qd_status cuda_generate(qd_backend *bk, const qd_generate_request *rq, qd_generate_result *res)
{
    cuda_ctx *c = ctx_of(bk);
    int B = rq->B, Tmax = rq->Tp + rq->max_new_tokens, V = c->cfg.vocab_size;
    if (Tmax > c->cfg.max_position_embeddings)
        return qd_error(QD_ERR_SHAPE, "generate: prompt + max_new_tokens = %d > max_position_embeddings %d",
                        Tmax, c->cfg.max_position_embeddings);
    gen_state g = {(int32_t *)calloc((size_t)B * Tmax, sizeof(int32_t)), (int32_t *)calloc((size_t)B, sizeof(int32_t)),
                   (int32_t *)calloc((size_t)B, sizeof(int32_t)), (float *)malloc(sizeof(float) * (size_t)B * V),
                   (qd_sample_result *)malloc(sizeof(qd_sample_result) * (size_t)B),
                   (uint64_t *)malloc(sizeof(uint64_t) * (size_t)B), (uint32_t *)malloc(sizeof(uint32_t) * (size_t)B),
                   (int *)calloc((size_t)B, sizeof(int)), Tmax};
    qd_status st = generate_run(c, &g, rq, res);
    gen_free(c, &g, rq->max_new_tokens);
    return st;
}

/* ------------------------------------------------------------------------ */
/* AdamW                                                                     */

static qd_status grad_norm(cuda_ctx *c, double *norm)
{
    size_t nch = (c->nfloats + 4095) / 4096;
    void *part;
    QD_TRY(scratch(c, S_DIAG, sizeof(double) * (nch ? nch : 1), &part));
    QD_TRY(qdk_sumsq_chunks((double *)part, c->d_grads, c->nfloats));
    double *h = (double *)malloc(sizeof(double) * (nch ? nch : 1)), total = 0.0;
    if (!h)
        return qd_error(QD_ERR_NOMEM, "cuda backend: gradient norm");
    qd_status st = d2h(h, part, sizeof(double) * nch);
    for (size_t k = 0; k < nch && !st; k++)
        total += h[k];
    free(h);
    *norm = sqrt(total);
    return st;
}

static qd_status cuda_optimizer_step(qd_backend *b, const qd_adamw *o, int step, float *norm_out)
{
    cuda_ctx *c = ctx_of(b);
    double norm;
    prof(c, PR_OPT);
    QD_TRY(grad_norm(c, &norm));
    if (!isfinite(norm))
        return qd_error(QD_ERR_NONFINITE, "optimizer: gradient norm is not finite");
    *norm_out = (float)norm;
    float gscale, bc1, bc2;
    qd_adamw_scalars(o, step, norm, &gscale, &bc1, &bc2);
    for (int t = 0; t < c->ninfo; t++) {
        const qd_param_info *pi = &c->info[t];
        size_t off = pi->offset;
        QD_TRY(qdk_adamw(c->d_params + off, c->d_grads + off, c->d_m + off, c->d_v + off,
                         (size_t)(pi->rows * pi->cols), o->lr, o->beta1, o->beta2, o->eps, qd_adamw_decay(o, pi),
                         gscale, bc1, bc2));
    }
    c->have_forward = 0;
    prof(c, PR_SYNC);
    qd_status st = sync_weights(c);
    prof(c, PR_OTHER);
    return st;
}

/* ------------------------------------------------------------------------ */
/* the vtable                                                                */

static const char *cuda_get_name(qd_backend *b)
{
    (void)b;
    return "cuda";
}

static void free_linear(linear *L)
{
    qd_cuda_nvfp4_free(&L->wq);
    cudaFree(L->w8);
    cudaFree(L->w8_inv);
    free(L->rac_ch);
    cudaFree(L->d_rac_ch);
    cudaFree(L->d_rac_err);
}

static void cuda_free(qd_backend *b)
{
    cuda_ctx *c = ctx_of(b);
    prof_print(c);
    for (int i = 0; c->lin && i < c->nlin; i++)
        free_linear(&c->lin[i]);
    free(c->lin);
    free(c->layers);
    free(c->acts);
    free(c->info);
    if (c->d_wk != c->d_params)
        cudaFree(c->d_wk);
    cudaFree(c->d_wk16);
    cudaFree(c->d_params);
    cudaFree(c->d_grads);
    cudaFree(c->d_m);
    cudaFree(c->d_v);
    cudaFree(c->d_cos);
    cudaFree(c->d_sin);
    cudaFree(c->arena);
    cudaFree(c->d_bad);
    for (int i = 0; i < S_NSCRATCH; i++)
        cudaFree(c->scratch[i]);
    free(c->harena);
    free(c->dg_names);
    free(c->dg_act_err);
    free(c->dg_act_norm);
    free(c->dg_weight_err);
    free(c->dg_topk);
    free(c);
}

static qd_status cuda_set_weights(qd_backend *b, const float *params, size_t n)
{
    cuda_ctx *c = ctx_of(b);
    QD_TRY(h2d(c->d_params, params, sizeof(float) * n));
    c->have_forward = 0;
    return sync_weights(c);
}

static qd_status cuda_get_weights(qd_backend *b, float *params, size_t n)
{
    return d2h(params, ctx_of(b)->d_params, sizeof(float) * n);
}

static qd_status forward_run(cuda_ctx *c, const qd_batch *bt, float *logp, float *logits, float *lp)
{
    int V = c->cfg.vocab_size;
    void *d_lp;
    QD_TRY(scratch(c, S_LOGP, sizeof(float) * (size_t)(c->N ? c->N : 1), &d_lp));
    QD_TRY(model_forward(c, (float *)d_lp));
    QD_TRY(d2h(lp, d_lp, sizeof(float) * (size_t)c->N));
    memset(logp, 0, sizeof(float) * (size_t)bt->B * bt->T);
    if (logits)
        memset(logits, 0, sizeof(float) * (size_t)bt->B * bt->T * V);
    for (int n = 0; n < c->N; n++) {
        logp[c->src[n]] = lp[n];
        if (logits)
            QD_TRY(d2h(logits + (size_t)c->src[n] * V, c->logits + (size_t)n * V, sizeof(float) * V));
    }
    return QD_OK;
}

static qd_status cuda_forward(qd_backend *b, const qd_batch *bt, float *logp, float *logits)
{
    cuda_ctx *c = ctx_of(b);
    c->have_forward = 0;
    reset_diag(c);
    QD_TRY(pack_batch(c, bt));
    float *lp = (float *)malloc(sizeof(float) * (size_t)(c->N ? c->N : 1));
    if (!lp)
        return qd_error(QD_ERR_NOMEM, "cuda backend: log-probs");
    qd_status st = forward_run(c, bt, logp, logits, lp);
    free(lp);
    if (!st)
        c->have_forward = c->have_diag = 1;
    return st;
}

static qd_status cuda_backward(qd_backend *b, const float *dlogp)
{
    cuda_ctx *c = ctx_of(b);
    if (!c->have_forward)
        return qd_error(QD_ERR_ARG, "backward: no forward since the last weight change");
    for (int i = 0; i < c->nlin; i++)
        if (is_rollout_quant(c->lin[i].mode))
            return qd_error(QD_ERR_UNSUPPORTED, "backward: recipe %s has no backward in the rollout role",
                            qd_recipe_name(c->opt.recipe));
    float *d = (float *)malloc(sizeof(float) * (size_t)(c->N ? c->N : 1));
    if (!d)
        return qd_error(QD_ERR_NOMEM, "cuda backend: dlogp");
    qd_status st = qd_gather_dlogp(d, dlogp, c->src, c->N);
    void *dd = NULL;
    if (!st)
        st = scratch(c, S_LOGP, sizeof(float) * (size_t)(c->N ? c->N : 1), &dd);
    if (!st)
        st = h2d(dd, d, sizeof(float) * (size_t)c->N);
    free(d);
    return st ? st : model_backward(c, (const float *)dd);
}

static void cuda_zero_grad(qd_backend *b)
{
    cuda_ctx *c = ctx_of(b);
    cudaMemset(c->d_grads, 0, sizeof(float) * c->nfloats);
}

static qd_status cuda_set_grads(qd_backend *b, const float *grads, size_t n)
{
    return h2d(ctx_of(b)->d_grads, grads, sizeof(float) * n);
}

static qd_status cuda_get_grads(qd_backend *b, float *grads, size_t n)
{
    return d2h(grads, ctx_of(b)->d_grads, sizeof(float) * n);
}

static qd_status cuda_diagnostics(qd_backend *b, qd_diagnostics *out)
{
    cuda_ctx *c = ctx_of(b);
    if (!c->opt.diagnostics || !c->have_diag)
        return qd_error(QD_ERR_ARG, "diagnostics: %s", c->opt.diagnostics ? "no forward yet"
                        : "not enabled in the backend options");
    int nq = 0, nmoe = 0, K = c->cfg.num_experts_per_tok;
    for (int l = 0; l < c->cfg.num_hidden_layers; l++)
        nmoe += c->layers[l].moe;
    free(c->dg_topk);
    c->dg_topk = (int32_t *)malloc(sizeof(int32_t) * ((size_t)nmoe * c->N * K + 1));
    if (!c->dg_topk)
        return qd_error(QD_ERR_NOMEM, "cuda backend: diagnostics");
    for (int l = 0, m = 0; l < c->cfg.num_hidden_layers; l++)
        if (c->layers[l].moe)
            QD_TRY(d2h(c->dg_topk + (size_t)(m++) * c->N * K, c->acts[l].topk, sizeof(int32_t) * c->N * K));
    for (int i = 0; i < c->nlin; i++) {
        const linear *L = &c->lin[i];
        if (!L->quantized)
            continue;
        c->dg_names[nq] = L->name;
        c->dg_act_err[nq] = L->act_err;
        c->dg_act_norm[nq] = L->act_norm;
        c->dg_weight_err[nq++] = L->weight_err;
    }
    *out = (qd_diagnostics){nq, c->dg_names, c->dg_act_err, c->dg_act_norm, c->dg_weight_err, c->N,
                            nmoe, K, c->dg_topk};
    return QD_OK;
}

static qd_status cuda_get_adam(qd_backend *b, float *m, float *v, size_t n)
{
    QD_TRY(d2h(m, ctx_of(b)->d_m, sizeof(float) * n));
    return d2h(v, ctx_of(b)->d_v, sizeof(float) * n);
}

static qd_status cuda_set_adam(qd_backend *b, const float *m, const float *v, size_t n)
{
    QD_TRY(h2d(ctx_of(b)->d_m, m, sizeof(float) * n));
    return h2d(ctx_of(b)->d_v, v, sizeof(float) * n);
}

/* RAC state blob: the CPU backend's layout (per RAC linear: int64 nrac,
 * int64 rac_ch[in], double rac_err[in]), so checkpoints move between them. */
static size_t cuda_rac_state_size(qd_backend *b)
{
    cuda_ctx *c = ctx_of(b);
    size_t n = 0;
    for (int i = 0; i < c->nlin; i++)
        if (c->lin[i].mode == QD_LINEAR_W4A4_RAC)
            n += qd_rac_state_bytes(c->lin[i].in);
    return n;
}

static qd_status cuda_get_rac_state(qd_backend *b, void *buf, size_t n)
{
    cuda_ctx *c = ctx_of(b);
    char *p = (char *)buf;
    (void)n;
    for (int i = 0; i < c->nlin; i++) {
        const linear *L = &c->lin[i];
        if (L->mode != QD_LINEAR_W4A4_RAC)
            continue;
        memcpy(p, &L->nrac, sizeof(int64_t));
        memcpy(p + sizeof(int64_t), L->rac_ch, sizeof(int64_t) * (size_t)L->in);
        p += sizeof(int64_t) * (1 + (size_t)L->in);
        QD_TRY(d2h(p, L->d_rac_err, sizeof(double) * (size_t)L->in));
        p += sizeof(double) * (size_t)L->in;
    }
    return QD_OK;
}

static qd_status set_rac_linear(cuda_ctx *c, linear *L, const char *p, int64_t *tmp)
{
    int64_t nrac;
    memcpy(&nrac, p, sizeof nrac);
    memcpy(tmp, p + sizeof(int64_t), sizeof(int64_t) * (size_t)L->in);
    QD_TRY(qd_rac_check_channels(L->name, L->in, nrac, tmp));
    memcpy(L->rac_ch, tmp, sizeof(int64_t) * (size_t)L->in);
    L->nrac = nrac;
    p += sizeof(int64_t) * (1 + (size_t)L->in);
    QD_TRY(h2d(L->d_rac_err, p, sizeof(double) * (size_t)L->in));
    QD_TRY(upload_rac(L));
    QD_TRY(weight_nvfp4(&L->wq, L->out, L->in + L->nrac));
    return qd_cuda_rac_augment_weight(&L->wq, c->d_params + L->w, L->out, L->in, L->d_rac_ch, L->nrac);
}

static qd_status cuda_set_rac_state(qd_backend *b, const void *buf, size_t n)
{
    cuda_ctx *c = ctx_of(b);
    const char *p = (const char *)buf;
    (void)n;
    for (int i = 0; i < c->nlin; i++) {
        linear *L = &c->lin[i];
        if (L->mode != QD_LINEAR_W4A4_RAC)
            continue;
        int64_t *tmp = (int64_t *)malloc(sizeof(int64_t) * (size_t)L->in);
        if (!tmp)
            return qd_error(QD_ERR_NOMEM, "set_rac_state");
        qd_status st = set_rac_linear(c, L, p, tmp);
        free(tmp);
        if (st)
            return st;
        p += (sizeof(int64_t) + sizeof(double)) * (size_t)L->in + sizeof(int64_t);
    }
    c->have_forward = 0;
    return QD_OK;
}

static const struct qd_backend_i cuda_iface = {
    cuda_get_name, cuda_free, cuda_set_weights, cuda_get_weights, cuda_forward, cuda_backward,
    cuda_zero_grad, cuda_get_grads, cuda_optimizer_step, cuda_generate, cuda_diagnostics,
    cuda_get_adam, cuda_set_adam, cuda_rac_state_size, cuda_get_rac_state, cuda_set_rac_state, cuda_set_grads,
};

/* ------------------------------------------------------------------------ */
/* init                                                                      */

static qd_status build_params(cuda_ctx *c)
{
    qd_model_layout m;
    QD_TRY(qd_model_layout_init(&m, &c->cfg));
    qd_linear_mode qm = qd_recipe_linear_mode(c->opt.recipe, c->opt.role);
    qd_linear_mode dm = qd_recipe_dense_mode(c->opt.recipe);
    c->lin = (linear *)calloc((size_t)m.nlin, sizeof *c->lin);
    if (!c->lin) {
        qd_model_layout_free(&m);
        return qd_error(QD_ERR_NOMEM, "cuda backend: parameter table");
    }
    for (int i = 0; i < m.nlin; i++) {
        linear *L = &c->lin[i];
        L->w = m.lin[i].w;
        L->out = m.lin[i].out;
        L->in = m.lin[i].in;
        L->quantized = m.lin[i].quantized;
        L->name = m.lin[i].name;
        L->mode = L->quantized ? qm : dm;
    }
    c->nlin = m.nlin;
    c->info = m.info;
    c->ninfo = m.ninfo;
    c->nfloats = m.nfloats;
    c->layers = m.layers;
    c->embed = m.embed;
    c->final_norm = m.final_norm;
    c->lm_head = m.lm_head;
    free(m.lin);
    return QD_OK;
}

/* The CPU's RoPE tables (qd_rope_tables, on the host), copied over. */
static qd_status upload_rope(cuda_ctx *c)
{
    size_t nr = (size_t)c->cfg.max_position_embeddings * (c->cfg.head_dim / 2);
    float *cs = (float *)malloc(sizeof(float) * nr), *sn = (float *)malloc(sizeof(float) * nr);
    qd_status st = cs && sn ? QD_OK : qd_error(QD_ERR_NOMEM, "cuda backend: RoPE table");
    if (!st)
        qd_rope_tables(cs, sn, &c->cfg);
    if (!st)
        st = dev_alloc((void **)&c->d_cos, sizeof(float) * nr, "RoPE cos");
    if (!st)
        st = dev_alloc((void **)&c->d_sin, sizeof(float) * nr, "RoPE sin");
    if (!st)
        st = h2d(c->d_cos, cs, sizeof(float) * nr);
    if (!st)
        st = h2d(c->d_sin, sn, sizeof(float) * nr);
    free(cs);
    free(sn);
    return st;
}

static qd_status alloc_linear(linear *L)
{
    if (L->mode == QD_LINEAR_FP8) {
        DEV_ALLOC(L->w8, (size_t)L->out * L->in, "fp8 weights");
        DEV_ALLOC(L->w8_inv, L->out, "fp8 weight scales");
    }
    if ((L->mode == QD_LINEAR_W4A4 || L->mode == QD_LINEAR_W4A4_RAC) && L->in % QD_NVFP4_BLOCK)
        return qd_error(QD_ERR_SHAPE, "cuda backend: NVFP4 needs in-features %% 16 == 0, got %d", L->in);
    if (L->mode == QD_LINEAR_W4A4_RAC) {
        L->rac_ch = (int64_t *)calloc((size_t)L->in, sizeof(int64_t));
        if (!L->rac_ch)
            return qd_error(QD_ERR_NOMEM, "cuda backend: RAC state");
        DEV_ALLOC(L->d_rac_ch, L->in, "RAC channels");
        DEV_ALLOC(L->d_rac_err, L->in, "RAC statistics");
        QD_CUDA_CHECK(cudaMemset(L->d_rac_err, 0, sizeof(double) * (size_t)L->in));
    }
    return QD_OK;
}

static qd_status alloc_model(cuda_ctx *c)
{
    size_t n = c->nfloats;
    DEV_ALLOC(c->d_params, n, "master weights");
    DEV_ALLOC(c->d_grads, n, "gradients");
    DEV_ALLOC(c->d_m, n, "AdamW first moments");
    DEV_ALLOC(c->d_v, n, "AdamW second moments");
    QD_CUDA_CHECK(cudaMemset(c->d_params, 0, sizeof(float) * n));
    QD_CUDA_CHECK(cudaMemset(c->d_grads, 0, sizeof(float) * n));
    QD_CUDA_CHECK(cudaMemset(c->d_m, 0, sizeof(float) * n));
    QD_CUDA_CHECK(cudaMemset(c->d_v, 0, sizeof(float) * n));
    if (c->opt.recipe == QD_RECIPE_FP32)
        c->d_wk = c->d_params;
    else
        DEV_ALLOC(c->d_wk, n, "working weights");
    if (c->opt.mode == QD_MODE_FAST && c->opt.recipe != QD_RECIPE_FP32)
        DEV_ALLOC(c->d_wk16, n, "working weights (BF16)");
    DEV_ALLOC(c->d_bad, 1, "flag");
    c->acts = (layer_acts *)calloc((size_t)c->cfg.num_hidden_layers, sizeof(layer_acts));
    c->dg_names = (const char **)calloc((size_t)c->nlin, sizeof(char *));
    c->dg_act_err = (double *)calloc((size_t)c->nlin, sizeof(double));
    c->dg_act_norm = (double *)calloc((size_t)c->nlin, sizeof(double));
    c->dg_weight_err = (double *)calloc((size_t)c->nlin, sizeof(double));
    if (!c->acts || !c->dg_names || !c->dg_act_err || !c->dg_act_norm || !c->dg_weight_err)
        return qd_error(QD_ERR_NOMEM, "cuda backend: tables");
    for (int i = 0; i < c->nlin; i++)
        QD_TRY(alloc_linear(&c->lin[i]));
    QD_TRY(upload_rope(c));
    return sync_weights(c);
}

static qd_status check_options(const qd_backend_options *opt)
{
    if ((unsigned)opt->recipe >= QD_RECIPE_COUNT || opt->rac_ratio < 0 || opt->rac_ratio > 1)
        return qd_error(QD_ERR_ARG, "cuda backend: bad recipe or rac_ratio");
    if (opt->mode != QD_MODE_EXACT && opt->mode != QD_MODE_FAST)
        return qd_error(QD_ERR_ARG, "cuda backend: bad mode %d", (int)opt->mode);
    return QD_OK;
}

static qd_status init_impl(cuda_ctx *c)
{
    QD_TRY(build_params(c));
    c->base.params = c->info;
    c->base.num_params = c->ninfo;
    c->base.num_floats = c->nfloats;
    return alloc_model(c);
}

extern "C" qd_backend *qd_backend_cuda_init(const qd_model_config *cfg, const qd_backend_options *opt)
{
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        cudaGetLastError();
        qd_error(QD_ERR_DEVICE, "cuda backend: no CUDA device (cudaGetDeviceCount: %s, %d devices)",
                 cudaGetErrorString(e), ndev);
        return NULL;
    }
    if (qd_model_config_check(cfg) || check_options(opt))
        return NULL;
    /* data parallel: this process's device, LOCAL_RANK modulo the visible ones
     * (so one GPU per task via CUDA_VISIBLE_DEVICES works too); per host thread */
    e = cudaSetDevice(opt->device % ndev);
    if (e != cudaSuccess) {
        qd_error(QD_ERR_DEVICE, "cuda backend: cudaSetDevice(%d of %d): %s", opt->device % ndev, ndev,
                 cudaGetErrorString(e));
        return NULL;
    }
    cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
    if (!c) {
        qd_error(QD_ERR_NOMEM, "cuda backend: context");
        return NULL;
    }
    c->cfg = *cfg;
    c->opt = *opt;
    const char *pe = getenv("QUADS_CUDA_PROFILE");
    c->prof = pe && *pe && strcmp(pe, "0") != 0;
    c->base.iface = &cuda_iface;
    c->base.context = c;
    if (init_impl(c)) {
        cuda_free(&c->base);
        return NULL;
    }
    return &c->base;
}
