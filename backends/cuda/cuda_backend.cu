/* The CUDA backend, first increment (issue 6): weight load and sync and the
 * forward pass in exact mode for the recipes whose linear layers are FP32 or
 * BF16 (fp32 and bf16, both roles). Every output is computed with the CPU
 * backend's reduction order (backends/cpu/cpu_backend.c, its header comment),
 * so log-probs and logits are bit-identical to the CPU's:
 * - a linear output: acc = 0, acc += x_k * w_k for k ascending, one thread
 *   per output (BF16 mode rounds x_k to BF16 as it is read: the same value
 *   the CPU's rounded copy holds);
 * - RMSNorm: one thread per row, sum of squares ascending, / C, + eps, 1/sqrt;
 * - attention: one thread per (token, head), the CPU's attend() line for line;
 * - router softmax and top-k per token as the CPU's; each token's K expert
 *   slots are kept in ascending expert index, so the MoE sum adds the expert
 *   outputs in the CPU's order (a dense MLP is one slot of weight 1);
 * - vocab log-softmax: one block of QD_SAMPLE_LANES threads per token; lane j
 *   sums exp(s_i - m) over i = j mod lanes ascending, then the pairwise lane
 *   tree of qd_softmax_lognorm (backends/sampling.c), level by level.
 * Transcendentals come from backends/exact_math.h; nvcc runs with -fmad=false.
 * Backward, AdamW, generate and the quantized recipes are not here yet
 * (issue 6): their slots are NULL and init refuses those recipes. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backends/cuda/cuda_check.h"
#include "backends/exact_math.h"
extern "C" {
#include "backends/backend.h"
#include "backends/layout.h"
#include "backends/sampling.h"
#include "quant/quant.h"
}

/* ------------------------------------------------------------------------ */
/* the parameter table (the CPU backend's order, names and offsets)           */

typedef struct {
    size_t w;              /* offset of the weight (out, in) */
    int out, in;
    qd_linear_mode mode;
} linear;

typedef qd_layout_layer layer; /* backends/layout.h */

typedef struct {
    qd_model_config cfg;
    qd_backend_options opt;
    qd_backend base;
    qd_param_info *info;
    int ninfo;
    size_t nfloats;
    linear *lin;
    int nlin;
    layer *layers;
    size_t **d_eoff;               /* (L) device (nexp, 3) weight offsets of gate, up, down */
    size_t embed, final_norm;
    int lm_head;
    float *d_params, *d_wk;        /* (nfloats) master and working copy; d_wk aliases
                                      d_params under the fp32 recipe */
    float *d_cos, *d_sin;          /* (max_pos, D/2) */
} cuda_ctx;

static cuda_ctx *ctx_of(qd_backend *b) { return (cuda_ctx *)b->context; }

/* Takes over the shared table (backends/layout.h), the CPU backend's. */
static qd_status build_params(cuda_ctx *c)
{
    qd_model_layout m;
    qd_status st = qd_model_layout_init(&m, &c->cfg);
    if (st)
        return st;
    qd_linear_mode qm = qd_recipe_linear_mode(c->opt.recipe, c->opt.role);
    qd_linear_mode dm = qd_recipe_dense_mode(c->opt.recipe);
    c->lin = (linear *)calloc((size_t)m.nlin, sizeof *c->lin);
    c->d_eoff = (size_t **)calloc((size_t)c->cfg.num_hidden_layers, sizeof *c->d_eoff);
    if (!c->lin || !c->d_eoff) {
        qd_model_layout_free(&m);
        return qd_error(QD_ERR_NOMEM, "cuda backend: parameter table");
    }
    for (int i = 0; i < m.nlin; i++) {
        c->lin[i].w = m.lin[i].w;
        c->lin[i].out = m.lin[i].out;
        c->lin[i].in = m.lin[i].in;
        c->lin[i].mode = m.lin[i].quantized ? qm : dm;
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

/* ------------------------------------------------------------------------ */
/* device memory                                                             */

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

/* The launch check: a launch error names the kernel, file and line. */
#define QD_LAUNCH(kernel, grid, block, ...)                                          \
    do {                                                                             \
        kernel<<<(grid), (block)>>>(__VA_ARGS__);                                    \
        QD_CUDA_CHECK(cudaGetLastError());                                           \
    } while (0)

static unsigned blocks(size_t n, unsigned t) { return (unsigned)((n + t - 1) / t); }

/* ------------------------------------------------------------------------ */
/* kernels                                                                   */

/* dst (n) = BF16-rounded src, or a copy. */
__global__ void k_sync(float *dst, const float *src, size_t n, int bf16)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] = bf16 ? qd_round_bf16(src[i]) : src[i];
}

/* x (N, C) = embedding rows of tok. */
__global__ void k_embed(float *x, const float *emb, const int32_t *tok, int N, int C)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)N * C)
        x[i] = emb[(size_t)tok[i / C] * C + i % C];
}

/* out (rows, C) = w * (x * rstd), the CPU's rmsnorm_forward; one thread per row. */
__global__ void k_rmsnorm(float *out, const float *inp, const float *w, int rows, int C, float eps)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= rows)
        return;
    const float *x = inp + (size_t)n * C;
    float ss = 0.0f;
    for (int i = 0; i < C; i++)
        ss = ss + x[i] * x[i];
    float r = qd_rsqrtf(ss / (float)C + eps);
    for (int i = 0; i < C; i++)
        out[(size_t)n * C + i] = w[i] * (x[i] * r);
}

/* out (N, OC) = x (N, IC) . w (OC, IC)^T, ascending ic, one thread per output. */
__global__ void k_linear(float *out, const float *inp, const float *w, int N, int IC, int OC, int bf16)
{
    size_t id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (size_t)N * OC)
        return;
    int n = (int)(id / OC), o = (int)(id % OC);
    const float *x = inp + (size_t)n * IC, *wr = w + (size_t)o * IC;
    float acc = 0.0f;
    for (int i = 0; i < IC; i++)
        acc = acc + (bf16 ? qd_round_bf16(x[i]) : x[i]) * wr[i];
    out[id] = acc;
}

/* The expert linear of slot r = n*K + j (expert sel[r]): out (N*K, OC) =
 * inp row (in_per_slot ? r : n) . W_e^T, W_e at wk + eoff[sel[r]*3 + which]. */
__global__ void k_expert_linear(float *out, const float *inp, const float *wk, const size_t *eoff,
                                const int32_t *sel, int which, int in_per_slot, int N, int K, int IC,
                                int OC, int bf16)
{
    size_t id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (size_t)N * K * OC)
        return;
    int r = (int)(id / OC), o = (int)(id % OC);
    const float *x = inp + (size_t)(in_per_slot ? r : r / K) * IC;
    const float *wr = wk + eoff[sel[r] * 3 + which] + (size_t)o * IC;
    float acc = 0.0f;
    for (int i = 0; i < IC; i++)
        acc = acc + (bf16 ? qd_round_bf16(x[i]) : x[i]) * wr[i];
    out[id] = acc;
}

/* RoPE in place on x (N, nh, D), the CPU's rope_forward; one thread per pair. */
__global__ void k_rope(float *x, const int32_t *pos, const float *cosb, const float *sinb, int N, int nh, int D)
{
    int h2 = D / 2;
    size_t id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (size_t)N * nh * h2)
        return;
    int i = (int)(id % h2);
    size_t nhh = id / h2;
    int n = (int)(nhh / nh);
    float *y = x + nhh * D;
    float cs = cosb[(size_t)pos[n] * h2 + i], sn = sinb[(size_t)pos[n] * h2 + i];
    float a = y[i], b = y[i + h2];
    y[i] = a * cs - b * sn;
    y[i + h2] = b * cs + a * sn;
}

/* Causal GQA attention, the CPU's attend() for query (n, h): keys s = 0..pos[n]
 * of n's sequence (first token n - pos[n]); p scratch (N, H, Tm). */
__global__ void k_attend(float *out, float *pbuf, const float *q, const float *k, const float *v,
                         const int32_t *pos, int N, int H, int KV, int D, int Tm, float scale)
{
    int id = blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= N * H)
        return;
    int n = id / H, h = id % H, t = pos[n], off = n - t, kh = h / (H / KV);
    size_t KD = (size_t)KV * D;
    const float *qv = q + (size_t)n * H * D + h * D;
    const float *kb = k + off * KD + kh * D, *vb = v + off * KD + kh * D;
    float *p = pbuf + (size_t)id * Tm, mx = -INFINITY, sum = 0.0f;
    for (int s = 0; s <= t; s++) {
        const float *kv = kb + s * KD;
        float dot = 0.0f;
        for (int i = 0; i < D; i++)
            dot = dot + qv[i] * kv[i];
        p[s] = dot * scale;
        mx = fmaxf(mx, p[s]);
    }
    for (int s = 0; s <= t; s++) {
        p[s] = qd_expf(p[s] - mx);
        sum = sum + p[s];
    }
    for (int s = 0; s <= t; s++)
        p[s] = p[s] / sum;
    float *o = out + (size_t)n * H * D + h * D;
    for (int i = 0; i < D; i++) {
        float acc = 0.0f;
        for (int s = 0; s <= t; s++)
            acc = acc + p[s] * vb[s * KD + i];
        o[i] = acc;
    }
}

__global__ void k_add(float *out, const float *a, const float *b, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = a[i] + b[i];
}

/* Per token: router softmax of probs (N, E) in place, top-k (ties to the lower
 * index), renormalization in rank order; then the K slots in ascending expert
 * index: sel (N, K) experts, sw (N, K) their weights. */
__global__ void k_route(int32_t *sel, float *sw, float *probs, int N, int E, int K, int norm_topk)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N)
        return;
    float *r = probs + (size_t)n * E, mx = -INFINITY, sum = 0.0f;
    for (int e = 0; e < E; e++)
        mx = fmaxf(mx, r[e]);
    for (int e = 0; e < E; e++) {
        r[e] = qd_expf(r[e] - mx);
        sum = sum + r[e];
    }
    for (int e = 0; e < E; e++)
        r[e] = r[e] / sum;
    int32_t *idx = sel + (size_t)n * K;
    for (int j = 0; j < K; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++)
                taken |= idx[i] == e;
            if (!taken && (best < 0 || r[e] > r[best]))
                best = e;
        }
        idx[j] = best;
    }
    float tsum = 0.0f;
    for (int j = 0; j < K; j++)
        tsum = tsum + r[idx[j]];
    float *w = sw + (size_t)n * K;
    for (int j = 0; j < K; j++)
        w[j] = norm_topk ? r[idx[j]] / tsum : r[idx[j]];
    for (int a = 1; a < K; a++)  /* insertion sort by expert index, weights along */
        for (int b = a; b > 0 && idx[b - 1] > idx[b]; b--) {
            int32_t ti = idx[b]; idx[b] = idx[b - 1]; idx[b - 1] = ti;
            float tw = w[b]; w[b] = w[b - 1]; w[b - 1] = tw;
        }
}

/* A dense MLP: one slot per token, expert 0, weight 1. */
__global__ void k_route_dense(int32_t *sel, float *sw, int N)
{
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n < N) {
        sel[n] = 0;
        sw[n] = 1.0f;
    }
}

/* h (n) = silu(g) * u. */
__global__ void k_swiglu(float *h, const float *g, const float *u, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        h[i] = qd_siluf(g[i]) * u[i];
}

/* out (N, C): per token, y (N*K, C) of its slots times their weights, slots in
 * ascending expert order, from acc = 0. */
__global__ void k_combine(float *out, const float *y, const float *sw, int N, int K, int C)
{
    size_t id = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (size_t)N * C)
        return;
    int n = (int)(id / C), i = (int)(id % C);
    float acc = 0.0f;
    for (int j = 0; j < K; j++)
        acc = acc + y[((size_t)n * K + j) * C + i] * sw[n * K + j];
    out[id] = acc;
}

/* logp (N): log_softmax(logits / T)[tgt] with qd_softmax_lognorm's order; one
 * block of QD_SAMPLE_LANES threads per token; s (N, V) scratch when T != 1.
 * *bad receives 1 + the token of a logit whose division by T overflows. */
__global__ void __launch_bounds__(QD_SAMPLE_LANES) k_logprob(float *logp, float *s, const float *logits, const int32_t *tgt, int V, float T,
                          int *bad)
{
    __shared__ float lane[QD_SAMPLE_LANES];
    int n = blockIdx.x, j = threadIdx.x;
    const float *l = logits + (size_t)n * V;
    if (T != 1.0f) {
        float *sr = s + (size_t)n * V;
        for (int i = j; i < V; i += QD_SAMPLE_LANES) {
            sr[i] = l[i] / T;
            if (!isfinite(sr[i]) && isfinite(l[i]))
                *bad = n + 1;
        }
        __syncthreads();
        l = sr;
    }
    /* max: every lane starts at s[0] and keeps a strictly larger value, as the CPU's loop */
    float m = l[0];
    for (int i = j; i < V; i += QD_SAMPLE_LANES)
        if (l[i] > m)
            m = l[i];
    lane[j] = m;
    __syncthreads();
    if (j == 0) {
        for (int i = 1; i < QD_SAMPLE_LANES; i++)
            if (lane[i] > m)
                m = lane[i];
        lane[0] = m + 0.0f;
    }
    __syncthreads();
    m = lane[0];
    __syncthreads();
    float acc = 0.0f;
    for (int i = j; i < V; i += QD_SAMPLE_LANES)
        acc = acc + qd_expf(l[i] - m);
    lane[j] = acc;
    __syncthreads();
    for (int w = QD_SAMPLE_LANES; w > 1; w /= 2) {
        if (j < w / 2)
            lane[j] = lane[j] + lane[j + w / 2];
        __syncthreads();
    }
    if (j == 0) {
        float logz = qd_logf(lane[0]);
        logp[n] = tgt[n] >= 0 ? (l[tgt[n]] - m) - logz : 0.0f;
    }
}

/* ------------------------------------------------------------------------ */
/* the forward                                                               */

/* One forward's device buffers (packed tokens, one layer's activations). */
typedef struct {
    int N, B, Tm, K, Imax, E;
    int32_t *tok, *tgt, *pos;           /* (N) */
    float *x, *ln, *q, *k, *v, *ao, *tmp, *xmid, *att; /* (N,C) (N,C) (N,HD) (N,KD) (N,KD) (N,HD) (N,C) (N,C) (N,H,Tm) */
    float *probs, *sw, *g, *u, *h, *y;  /* (N,E) (N,K) (N*K,I) x3 (N*K,C) */
    int32_t *sel;                       /* (N,K) */
    float *logits, *logp, *s;           /* (N,V) (N) (N,V) or NULL */
    int *bad;
} fwd_bufs;

static void free_bufs(fwd_bufs *f)
{
    void *ps[] = {f->tok, f->tgt, f->pos, f->x, f->ln, f->q, f->k, f->v, f->ao, f->tmp, f->xmid, f->att,
                  f->probs, f->sw, f->g, f->u, f->h, f->y, f->sel, f->logits, f->logp, f->s, f->bad};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        cudaFree(ps[i]);
}

static qd_status alloc_bufs(cuda_ctx *c, fwd_bufs *f, int temp_scratch)
{
    const qd_model_config *g = &c->cfg;
    size_t N = f->N, C = g->hidden_size, HD = (size_t)g->num_attention_heads * g->head_dim;
    size_t KD = (size_t)g->num_key_value_heads * g->head_dim, NK = N * f->K, V = g->vocab_size;
    DEV_ALLOC(f->tok, N, "tokens");
    DEV_ALLOC(f->tgt, N, "targets");
    DEV_ALLOC(f->pos, N, "positions");
    DEV_ALLOC(f->x, N * C, "residual");
    DEV_ALLOC(f->ln, N * C, "norm output");
    DEV_ALLOC(f->q, N * HD, "queries");
    DEV_ALLOC(f->k, N * KD, "keys");
    DEV_ALLOC(f->v, N * KD, "values");
    DEV_ALLOC(f->ao, N * HD, "attention output");
    DEV_ALLOC(f->tmp, N * C, "block output");
    DEV_ALLOC(f->xmid, N * C, "residual");
    DEV_ALLOC(f->att, N * g->num_attention_heads * (size_t)f->Tm, "attention probabilities");
    DEV_ALLOC(f->probs, N * (size_t)(f->E > 0 ? f->E : 1), "router probabilities");
    DEV_ALLOC(f->sw, NK, "routing weights");
    DEV_ALLOC(f->sel, NK, "routing");
    DEV_ALLOC(f->g, NK * f->Imax, "expert gate");
    DEV_ALLOC(f->u, NK * f->Imax, "expert up");
    DEV_ALLOC(f->h, NK * f->Imax, "expert hidden");
    DEV_ALLOC(f->y, NK * C, "expert output");
    DEV_ALLOC(f->logits, N * V, "logits");
    DEV_ALLOC(f->logp, N, "log-probs");
    DEV_ALLOC(f->bad, 1, "flag");
    if (temp_scratch)
        DEV_ALLOC(f->s, N * V, "scaled logits");
    QD_CUDA_CHECK(cudaMemset(f->bad, 0, sizeof(int)));
    return QD_OK;
}

#define TPB 128u

static qd_status linear_fwd(cuda_ctx *c, float *out, const float *inp, int li, int N)
{
    const linear *L = &c->lin[li];
    QD_LAUNCH(k_linear, blocks((size_t)N * L->out, TPB), TPB, out, inp, c->d_wk + L->w, N, L->in, L->out,
              L->mode == QD_LINEAR_BF16);
    return QD_OK;
}

static qd_status attn_fwd(cuda_ctx *c, fwd_bufs *f, const layer *ly)
{
    const qd_model_config *g = &c->cfg;
    int N = f->N, H = g->num_attention_heads, KV = g->num_key_value_heads, D = g->head_dim;
    float eps = (float)g->rms_norm_eps, scale = (float)(1.0 / sqrt((double)D));
    QD_TRY(linear_fwd(c, f->q, f->ln, ly->q, N));
    QD_TRY(linear_fwd(c, f->k, f->ln, ly->k, N));
    QD_TRY(linear_fwd(c, f->v, f->ln, ly->v, N));
    /* q/k RMSNorm in place is safe: each thread reads its row before writing it */
    QD_LAUNCH(k_rmsnorm, blocks((size_t)N * H, TPB), TPB, f->q, f->q, c->d_wk + ly->q_norm, N * H, D, eps);
    QD_LAUNCH(k_rmsnorm, blocks((size_t)N * KV, TPB), TPB, f->k, f->k, c->d_wk + ly->k_norm, N * KV, D, eps);
    QD_LAUNCH(k_rope, blocks((size_t)N * H * (D / 2), TPB), TPB, f->q, f->pos, c->d_cos, c->d_sin, N, H, D);
    QD_LAUNCH(k_rope, blocks((size_t)N * KV * (D / 2), TPB), TPB, f->k, f->pos, c->d_cos, c->d_sin, N, KV, D);
    QD_LAUNCH(k_attend, blocks((size_t)N * H, TPB), TPB, f->ao, f->att, f->q, f->k, f->v, f->pos, N, H, KV, D,
              f->Tm, scale);
    return linear_fwd(c, f->tmp, f->ao, ly->o, N);
}

static qd_status mlp_fwd(cuda_ctx *c, fwd_bufs *f, const layer *ly)
{
    const qd_model_config *g = &c->cfg;
    int N = f->N, C = g->hidden_size, I = ly->ffn, K = ly->moe ? g->num_experts_per_tok : 1;
    int bf16 = c->lin[ly->mlp0].mode == QD_LINEAR_BF16;
    if (ly->moe) {
        QD_TRY(linear_fwd(c, f->probs, f->ln, ly->router, N));
        QD_LAUNCH(k_route, blocks(N, TPB), TPB, f->sel, f->sw, f->probs, N, ly->nexp, K, g->norm_topk_prob);
    } else {
        QD_LAUNCH(k_route_dense, blocks(N, TPB), TPB, f->sel, f->sw, N);
    }
    size_t nki = (size_t)N * K * I;
    const size_t *eoff = c->d_eoff[ly - c->layers];
    QD_LAUNCH(k_expert_linear, blocks(nki, TPB), TPB, f->g, f->ln, c->d_wk, eoff, f->sel, 0, 0, N, K, C,
              I, bf16);
    QD_LAUNCH(k_expert_linear, blocks(nki, TPB), TPB, f->u, f->ln, c->d_wk, eoff, f->sel, 1, 0, N, K, C,
              I, bf16);
    QD_LAUNCH(k_swiglu, blocks(nki, TPB), TPB, f->h, f->g, f->u, nki);
    QD_LAUNCH(k_expert_linear, blocks((size_t)N * K * C, TPB), TPB, f->y, f->h, c->d_wk, eoff, f->sel, 2,
              1, N, K, I, C, bf16);
    QD_LAUNCH(k_combine, blocks((size_t)N * C, TPB), TPB, f->tmp, f->y, f->sw, N, K, C);
    return QD_OK;
}

static qd_status model_fwd(cuda_ctx *c, fwd_bufs *f, float T)
{
    const qd_model_config *g = &c->cfg;
    int N = f->N, C = g->hidden_size;
    size_t NC = (size_t)N * C;
    float eps = (float)g->rms_norm_eps;
    QD_LAUNCH(k_embed, blocks(NC, TPB), TPB, f->x, c->d_wk + c->embed, f->tok, N, C);
    for (int l = 0; l < g->num_hidden_layers; l++) {
        const layer *ly = &c->layers[l];
        QD_LAUNCH(k_rmsnorm, blocks(N, TPB), TPB, f->ln, f->x, c->d_wk + ly->in_norm, N, C, eps);
        QD_TRY(attn_fwd(c, f, ly));
        QD_LAUNCH(k_add, blocks(NC, TPB), TPB, f->xmid, f->x, f->tmp, NC);
        QD_LAUNCH(k_rmsnorm, blocks(N, TPB), TPB, f->ln, f->xmid, c->d_wk + ly->post_norm, N, C, eps);
        QD_TRY(mlp_fwd(c, f, ly));
        QD_LAUNCH(k_add, blocks(NC, TPB), TPB, f->x, f->xmid, f->tmp, NC);
    }
    QD_LAUNCH(k_rmsnorm, blocks(N, TPB), TPB, f->ln, f->x, c->d_wk + c->final_norm, N, C, eps);
    QD_TRY(linear_fwd(c, f->logits, f->ln, c->lm_head, N));
    QD_LAUNCH(k_logprob, N, QD_SAMPLE_LANES, f->logp, f->s, f->logits, f->tgt, g->vocab_size, T, f->bad);
    int bad = 0;
    QD_CUDA_CHECK(cudaMemcpy(&bad, f->bad, sizeof bad, cudaMemcpyDeviceToHost));
    if (bad)
        return qd_error(QD_ERR_NONFINITE, "forward: token %d: a logit / temperature %g overflows", bad - 1,
                        (double)T);
    return QD_OK;
}

/* Packs the batch on the host as the CPU does: (tok, tgt, pos, src) per token. */
static qd_status pack_batch(const cuda_ctx *c, const qd_batch *bt, int32_t *tok, int32_t *tgt, int32_t *pos,
                            int32_t *src)
{
    int n = 0;
    for (int b = 0; b < bt->B; b++)
        for (int t = 0; t < bt->lengths[b]; t++, n++) {
            int32_t id = bt->tokens[(size_t)b * bt->T + t];
            if (id < 0 || id >= c->cfg.vocab_size)
                return qd_error(QD_ERR_ARG, "forward: tokens[%d][%d] = %d not in [0, %d)", b, t, id,
                                c->cfg.vocab_size);
            tok[n] = id;
            pos[n] = t;
            src[n] = b * bt->T + t;
            tgt[n] = t + 1 < bt->lengths[b] ? bt->tokens[(size_t)b * bt->T + t + 1] : -1;
        }
    return QD_OK;
}

static qd_status forward_impl(cuda_ctx *c, const qd_batch *bt, float *logp, float *logits, fwd_bufs *f,
                              int32_t *host)
{
    int V = c->cfg.vocab_size, N = f->N;
    int32_t *tok = host, *tgt = host + N, *pos = host + 2 * N, *src = host + 3 * N;
    float T = bt->temperature > 0.0f ? bt->temperature : 1.0f;
    QD_TRY(pack_batch(c, bt, tok, tgt, pos, src));
    QD_TRY(alloc_bufs(c, f, T != 1.0f));
    QD_CUDA_CHECK(cudaMemcpy(f->tok, tok, sizeof(int32_t) * N, cudaMemcpyHostToDevice));
    QD_CUDA_CHECK(cudaMemcpy(f->tgt, tgt, sizeof(int32_t) * N, cudaMemcpyHostToDevice));
    QD_CUDA_CHECK(cudaMemcpy(f->pos, pos, sizeof(int32_t) * N, cudaMemcpyHostToDevice));
    QD_TRY(model_fwd(c, f, T));
    float *lp = (float *)(host + 4 * N);
    QD_CUDA_CHECK(cudaMemcpy(lp, f->logp, sizeof(float) * N, cudaMemcpyDeviceToHost));
    memset(logp, 0, sizeof(float) * (size_t)bt->B * bt->T);
    for (int n = 0; n < N; n++)
        logp[src[n]] = lp[n];
    if (logits) {
        memset(logits, 0, sizeof(float) * (size_t)bt->B * bt->T * V);
        for (int n = 0; n < N; n++)
            QD_CUDA_CHECK(cudaMemcpy(logits + (size_t)src[n] * V, f->logits + (size_t)n * V, sizeof(float) * V,
                                     cudaMemcpyDeviceToHost));
    }
    return QD_OK;
}

static qd_status cuda_forward(qd_backend *b, const qd_batch *bt, float *logp, float *logits)
{
    cuda_ctx *c = ctx_of(b);
    fwd_bufs f;
    memset(&f, 0, sizeof f);
    f.B = bt->B;
    for (int i = 0; i < bt->B; i++) {
        f.N += bt->lengths[i];
        f.Tm = bt->lengths[i] > f.Tm ? bt->lengths[i] : f.Tm;
    }
    if (f.Tm > c->cfg.max_position_embeddings)
        return qd_error(QD_ERR_SHAPE, "forward: length %d > max_position_embeddings %d", f.Tm,
                        c->cfg.max_position_embeddings);
    f.K = 1;
    for (int l = 0; l < c->cfg.num_hidden_layers; l++) {
        const layer *ly = &c->layers[l];
        if (ly->moe) {
            f.K = c->cfg.num_experts_per_tok > f.K ? c->cfg.num_experts_per_tok : f.K;
            f.E = ly->nexp;
        }
        f.Imax = ly->ffn > f.Imax ? ly->ffn : f.Imax;
    }
    int32_t *host = (int32_t *)malloc(sizeof(int32_t) * 5 * (size_t)f.N);
    if (!host)
        return qd_error(QD_ERR_NOMEM, "cuda backend: %d tokens", f.N);
    qd_status st = forward_impl(c, bt, logp, logits, &f, host);
    free(host);
    free_bufs(&f);
    return st;
}

/* ------------------------------------------------------------------------ */
/* weights                                                                   */

static qd_status cuda_set_weights(qd_backend *b, const float *params, size_t n)
{
    cuda_ctx *c = ctx_of(b);
    float amax = 0.0f;
    qd_status st = qd_amax(&amax, params, (int64_t)n);
    if (st)
        return qd_error(st, "set_weights: non-finite master weight");
    QD_CUDA_CHECK(cudaMemcpy(c->d_params, params, sizeof(float) * n, cudaMemcpyHostToDevice));
    if (c->d_wk != c->d_params)  /* the CPU's sync: every tensor BF16-rounded (BF16 linears included) */
        QD_LAUNCH(k_sync, blocks(n, 256), 256u, c->d_wk, c->d_params, n, 1);
    QD_CUDA_CHECK(cudaDeviceSynchronize());
    return QD_OK;
}

static qd_status cuda_get_weights(qd_backend *b, float *params, size_t n)
{
    QD_CUDA_CHECK(cudaMemcpy(params, ctx_of(b)->d_params, sizeof(float) * n, cudaMemcpyDeviceToHost));
    return QD_OK;
}

static const char *cuda_get_name(qd_backend *b)
{
    (void)b;
    return "cuda";
}

static void cuda_free(qd_backend *b)
{
    cuda_ctx *c = ctx_of(b);
    for (int l = 0; c->d_eoff && l < c->cfg.num_hidden_layers; l++)
        cudaFree(c->d_eoff[l]);
    free(c->d_eoff);
    if (c->d_wk != c->d_params)
        cudaFree(c->d_wk);
    cudaFree(c->d_params);
    cudaFree(c->d_cos);
    cudaFree(c->d_sin);
    free(c->layers);
    free(c->lin);
    free(c->info);
    free(c);
}

static const struct qd_backend_i cuda_iface = {
    cuda_get_name, cuda_free, cuda_set_weights, cuda_get_weights, cuda_forward,
    NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
};

/* ------------------------------------------------------------------------ */
/* init                                                                      */

/* The CPU's build_rope on the host (double angle, then rounded), copied over. */
static qd_status upload_rope(cuda_ctx *c)
{
    int h2 = c->cfg.head_dim / 2, np = c->cfg.max_position_embeddings;
    size_t nr = (size_t)np * h2;
    float *cs = (float *)malloc(sizeof(float) * nr), *sn = (float *)malloc(sizeof(float) * nr);
    if (!cs || !sn) {
        free(cs);
        free(sn);
        return qd_error(QD_ERR_NOMEM, "cuda backend: RoPE table");
    }
    for (int i = 0; i < h2; i++) {
        float inv = (float)(1.0 / pow(c->cfg.rope_theta, (double)(2 * i) / c->cfg.head_dim));
        for (int p = 0; p < np; p++) {
            double a = (double)p * (double)inv;
            cs[(size_t)p * h2 + i] = (float)cos(a);
            sn[(size_t)p * h2 + i] = (float)sin(a);
        }
    }
    qd_status st = dev_alloc((void **)&c->d_cos, sizeof(float) * nr, "RoPE cos");
    if (!st)
        st = dev_alloc((void **)&c->d_sin, sizeof(float) * nr, "RoPE sin");
    cudaError_t e = cudaSuccess;
    if (!st)
        e = cudaMemcpy(c->d_cos, cs, sizeof(float) * nr, cudaMemcpyHostToDevice);
    if (!st && e == cudaSuccess)
        e = cudaMemcpy(c->d_sin, sn, sizeof(float) * nr, cudaMemcpyHostToDevice);
    free(cs);
    free(sn);
    QD_CUDA_CHECK(e);
    return st;
}

/* Per layer, the device table of expert weight offsets (nexp, 3). */
static qd_status upload_expert_offsets(cuda_ctx *c, int l)
{
    const layer *ly = &c->layers[l];
    size_t n = (size_t)ly->nexp * 3, off[3 * 1024];
    if (n > sizeof off / sizeof off[0])
        return qd_error(QD_ERR_UNSUPPORTED, "cuda backend: %d experts > 1024", ly->nexp);
    for (size_t i = 0; i < n; i++)
        off[i] = c->lin[ly->mlp0 + (int)i].w;
    DEV_ALLOC(c->d_eoff[l], n, "expert offsets");
    QD_CUDA_CHECK(cudaMemcpy(c->d_eoff[l], off, sizeof(size_t) * n, cudaMemcpyHostToDevice));
    return QD_OK;
}

static qd_status alloc_model(cuda_ctx *c)
{
    DEV_ALLOC(c->d_params, c->nfloats, "master weights");
    QD_CUDA_CHECK(cudaMemset(c->d_params, 0, sizeof(float) * c->nfloats));
    if (c->opt.recipe == QD_RECIPE_FP32)
        c->d_wk = c->d_params;
    else {
        DEV_ALLOC(c->d_wk, c->nfloats, "working weights");
        QD_CUDA_CHECK(cudaMemset(c->d_wk, 0, sizeof(float) * c->nfloats));
    }
    for (int l = 0; l < c->cfg.num_hidden_layers; l++)
        QD_TRY(upload_expert_offsets(c, l));
    return upload_rope(c);
}

/* Only the FP32 and BF16 linear modes exist here yet (issue 6). */
static qd_status check_options(const qd_backend_options *opt)
{
    if ((unsigned)opt->recipe >= QD_RECIPE_COUNT || opt->rac_ratio < 0 || opt->rac_ratio > 1)
        return qd_error(QD_ERR_ARG, "cuda backend: bad recipe or rac_ratio");
    qd_linear_mode m = qd_recipe_linear_mode(opt->recipe, opt->role);
    if (m != QD_LINEAR_FP32 && m != QD_LINEAR_BF16)
        return qd_error(QD_ERR_UNSUPPORTED, "cuda backend: recipe '%s' (%s role) is not implemented on the GPU "
                        "yet (fp32 and bf16 are; issue 6)", qd_recipe_name(opt->recipe),
                        opt->role == QD_ROLE_ROLLOUT ? "rollout" : "trainer");
    if (opt->diagnostics)
        return qd_error(QD_ERR_UNSUPPORTED, "cuda backend: diagnostics are not implemented on the GPU yet (issue 6)");
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
    cuda_ctx *c = (cuda_ctx *)calloc(1, sizeof *c);
    if (!c) {
        qd_error(QD_ERR_NOMEM, "cuda backend: context");
        return NULL;
    }
    c->cfg = *cfg;
    c->opt = *opt;
    c->base.iface = &cuda_iface;
    c->base.context = c;
    if (init_impl(c)) {
        cuda_free(&c->base);
        return NULL;
    }
    return &c->base;
}
