/* The CPU backend: Qwen3-MoE forward, backward and AdamW in float32, the
 * readable reference that defines the numbers (NUMERICS.md §6), with every
 * precision recipe of ARCHITECTURE.md applied in one place, linear_forward.
 *
 * The math is Hugging Face's modeling_qwen3_moe.py: RMSNorm
 * w * (x * rsqrt(mean(x^2) + eps)); attention with per-head q/k RMSNorm, RoPE
 * in the rotate_half convention, GQA, causal softmax, scale head_dim^-0.5
 * applied after the dot product; the sparse block's router softmax in float32,
 * top-k, optional renormalization, SwiGLU experts summed in ascending expert
 * index; dense SwiGLU MLP layers where decoder_sparse_step/mlp_only_layers say.
 *
 * Letters: N = tokens of the batch (sequences packed, padding dropped),
 * C = hidden, H / KV = query / key-value heads, D = head_dim, E = experts,
 * K = experts per token, I = a layer's FFN width, V = vocab, R = routed rows.
 *
 * Reduction orders (the exact mode's definition):
 * - a dot product or matrix product output: acc = 0, acc += a_k * b_k for k
 *   ascending; a gradient is computed the same way into a fresh accumulator,
 *   then added to the gradient buffer (gradients always accumulate with +=);
 * - RMSNorm: sum of squares ascending, then / C; softmax and log-softmax: max
 *   ascending, sum of exp(x - max) ascending, then a division;
 * - MoE output: per token, expert outputs times weights summed in ascending
 *   expert index (as HF's loop over experts); renormalization sums the top-k
 *   weights in rank order;
 * - global gradient norm: double partial sums over fixed 4096-float chunks,
 *   chunks added in ascending order.
 * OpenMP splits rows/outputs only, so the bits do not depend on thread count,
 * and every op but attention works row by row, so a sequence's numbers do not
 * depend on the other sequences of its batch (generation relies on both).
 *
 * BF16 (every recipe but fp32): embedding rows, norm weights, router and
 * lm_head weights are BF16-rounded copies of the float32 master weights; a
 * BF16 linear rounds its input to BF16 and accumulates in float32; all other
 * activations stay float32. Backward is float32 with the straight-through
 * rule: a rounded or fake-quantized copy passes the gradient unchanged to the
 * master weight (NUMERICS.md §5).
 *
 * Generation: a prefill of the prompts, then decode steps of one token per
 * unfinished sequence against a KV cache, both through attend(), so rollout
 * log-probs equal the forward's bit for bit; sampling as NUMERICS.md §6
 * (Philox4x32-10 of exact_math.h keyed by seed, sequence id and position). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "backends/backend.h"
#include "backends/exact_math.h"
#include "backends/layout.h"
#include "backends/router.h"
#include "backends/sampling.h"
#include "backends/shared.h"
#include "quant/quant.h"

/* ------------------------------------------------------------------------ */
/* parameters and the linear layers                                          */

typedef struct {
    size_t w;              /* offset of the weight (out, in) in the flat buffers */
    int out, in;
    qd_linear_mode mode;
    int quantized;         /* one of the layers a recipe quantizes (not router, lm_head) */
    const char *name;      /* the weight's HF name */
    /* rollout copies, rebuilt at every sync */
    qd_nvfp4 wq;           /* W4A4: (out, in); RAC: (out, in + nrac) */
    uint8_t *w8;           /* FP8: (out, in) E4M3 codes */
    float *w8_inv;         /* FP8: (out) decode scales */
    int64_t *rac_ch;       /* RAC: (in) capacity, nrac used, ascending */
    int64_t nrac;
    double *rac_err;       /* RAC: (in) squared activation error since the last sync */
    /* diagnostics (options.diagnostics) */
    double act_err, act_norm; /* sum of squared NVFP4 activation error and of x^2, last forward */
    double weight_err;     /* sum (W - dequant(quantize(W)))^2 / sum W^2, last sync */
} linear;

typedef qd_layout_layer layer; /* backends/layout.h */

/* Activations of one layer kept for backward. */
typedef struct {
    float *x;        /* (N, C) residual stream entering the layer */
    float *ln1;      /* (N, C) */
    float *rstd1;    /* (N) */
    float *q, *k, *v;        /* (N, H*D), (N, KV*D), (N, KV*D) projections */
    float *rstd_q, *rstd_k;  /* (N, H), (N, KV) */
    float *qr, *kr;          /* (N, H*D), (N, KV*D) after norm and RoPE */
    float *att;              /* (N, H, Tm) softmax probabilities */
    float *ao;               /* (N, H*D) attention output */
    float *xmid;             /* (N, C) residual after attention */
    float *ln2, *rstd2;      /* (N, C), (N) */
    float *probs;            /* (N, E) router softmax (MoE) */
    int32_t *topk;           /* (N, K) experts chosen, rank order (MoE) */
    float *topw;             /* (N, K) their weights after renormalization (MoE) */
    int32_t *row_tok;        /* (R) token of each routed row; rows grouped by expert */
    float *row_w;            /* (R) routing weight of each row */
    int32_t *row_rank;       /* (R) top-k rank of each row (0 when dense) */
    int32_t *tok_rows;       /* (N, K) rows of each token in ascending expert order */
    int32_t *exp_off;        /* (nexp + 1) first row of each expert */
    float *xe, *g, *u, *h, *y; /* (R, C), (R, I), (R, I), (R, I), (R, C) */
} layer_acts;

typedef struct {
    qd_model_config cfg;
    qd_backend_options opt;
    qd_backend base;
    qd_param_info *info;
    int ninfo;
    size_t nfloats;
    float *params, *grads, *m, *v; /* (nfloats) each: master, grad, AdamW moments */
    float *wk;                     /* (nfloats) working copy the forward reads */
    layer *layers;
    linear *lin;
    int nlin;
    size_t embed, final_norm;      /* offsets: (V, C), (C) */
    int lm_head;                   /* linear index (tied: points at the embedding) */
    float *rope_cos, *rope_sin;    /* (max_position_embeddings, D/2) */
    /* the last forward */
    int N, Tm, B;                  /* tokens, longest sequence, sequences */
    int32_t *tok, *tgt, *pos, *src; /* (N): token, next token or -1, position, b*T+t */
    int32_t *row;                  /* (N): the batch row (KV-cache row) of each token */
    int32_t *seq_off;              /* (B + 1) first packed token of each sequence */
    layer_acts *acts;              /* (L) */
    float *xf, *lnf, *rstdf, *logits, *lse; /* (N, C), (N, C), (N), (N, V), (N) */
    float temp;                    /* log-probs are log_softmax(logits / temp) */
    void *arena;                   /* the forward's activations, one allocation */
    /* KV cache of a generation: NULL outside one */
    float *kc, *vc;                /* (L, rows, Tc, KV*D) keys after norm and RoPE, values */
    int cache_rows, Tc;
    int decode;                    /* 1: the batch is one new token per row, attend to the cache */
    int have_forward;
    int have_diag;                 /* a forward or generate has run */
    /* what diagnostics hands out */
    const char **dg_names;         /* (quantized linears) */
    double *dg_act_err, *dg_act_norm, *dg_weight_err;
    int32_t *dg_topk;              /* (moe layers, N, K) */
} cpu_ctx;

#define P(c, off) ((c)->wk + (off))

static cpu_ctx *ctx_of(qd_backend *b) { return (cpu_ctx *)b->context; }

static int nthreads(const cpu_ctx *c)
{
#ifdef _OPENMP
    return c->opt.num_threads > 0 ? c->opt.num_threads : omp_get_max_threads();
#else
    (void)c;
    return 1;
#endif
}

/* ------------------------------------------------------------------------ */
/* layer functions: outputs first, then inputs and weights, then shapes       */

#define QD_ROWS 32 /* rows per tile of matmul_forward */

/* out (N, OC) = inp (N, IC) . w (OC, IC)^T, ascending ic. Rows are taken in
 * tiles of QD_ROWS, transposed, so that the innermost loop runs over the
 * tile's rows: each output still sums over ic in ascending order (the bits
 * are those of the plain triple loop) and the compiler can vectorize it. */
static void matmul_forward(float *out, const float *inp, const float *w, int N, int IC, int OC, int nt)
{
    int tiles = (N + QD_ROWS - 1) / QD_ROWS;
    float *xt = malloc(sizeof(float) * (size_t)tiles * QD_ROWS * IC); /* (tiles, IC, QD_ROWS) */
    for (int n = 0; n < tiles * QD_ROWS; n++)
        for (int i = 0; i < IC; i++)
            xt[((size_t)(n / QD_ROWS) * IC + i) * QD_ROWS + n % QD_ROWS] = n < N ? inp[(size_t)n * IC + i] : 0.0f;
#pragma omp parallel for collapse(2) num_threads(nt) schedule(static)
    for (int t = 0; t < tiles; t++)
        for (int o = 0; o < OC; o++) {
            float acc[QD_ROWS] = {0.0f};
            const float *wr = w + (size_t)o * IC, *x = xt + (size_t)t * IC * QD_ROWS;
            int rows = N - t * QD_ROWS < QD_ROWS ? N - t * QD_ROWS : QD_ROWS;
            for (int i = 0; i < IC; i++)
                for (int r = 0; r < rows; r++)
                    acc[r] += x[(size_t)i * QD_ROWS + r] * wr[i];
            for (int r = 0; r < rows; r++)
                out[(size_t)(t * QD_ROWS + r) * OC + o] = acc[r];
        }
    free(xt);
}

/* dinp (N, IC) += dout . w (ascending oc); dw (OC, IC) += dout^T . inp (ascending n).
 * Either output may be NULL. */
static void matmul_backward(float *dinp, float *dw, const float *dout, const float *inp,
                            const float *w, int N, int IC, int OC, int nt)
{
    if (dinp) {
#pragma omp parallel num_threads(nt)
        {
            float *acc = malloc(sizeof(float) * (size_t)IC);
#pragma omp for schedule(static)
            for (int n = 0; n < N; n++) {
                memset(acc, 0, sizeof(float) * (size_t)IC);
                for (int o = 0; o < OC; o++) {
                    float d = dout[(size_t)n * OC + o];
                    const float *wr = w + (size_t)o * IC;
                    for (int i = 0; i < IC; i++)
                        acc[i] += d * wr[i];
                }
                for (int i = 0; i < IC; i++)
                    dinp[(size_t)n * IC + i] += acc[i];
            }
            free(acc);
        }
    }
    if (dw) {
#pragma omp parallel num_threads(nt)
        {
            float *acc = malloc(sizeof(float) * (size_t)IC);
#pragma omp for schedule(static)
            for (int o = 0; o < OC; o++) {
                memset(acc, 0, sizeof(float) * (size_t)IC);
                for (int n = 0; n < N; n++) {
                    float d = dout[(size_t)n * OC + o];
                    const float *x = inp + (size_t)n * IC;
                    for (int i = 0; i < IC; i++)
                        acc[i] += d * x[i];
                }
                for (int i = 0; i < IC; i++)
                    dw[(size_t)o * IC + i] += acc[i];
            }
            free(acc);
        }
    }
}

/* out (N, C) = w * (x * rstd), rstd = 1/sqrt(sum(x^2)/C + eps); rstd saved (N). */
static void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                            float eps, int nt)
{
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float ss = 0.0f;
        for (int i = 0; i < C; i++)
            ss += x[i] * x[i];
        float r = qd_rsqrtf(ss / (float)C + eps);
        for (int i = 0; i < C; i++)
            out[(size_t)n * C + i] = w[i] * (x[i] * r);
        rstd[n] = r;
    }
}

/* y_i = w_i x_i r: dw_i += dy_i x_i r; dx_i += r (w_i dy_i) - x_i r^3 / C sum_j (w_j dy_j x_j).
 * dw is accumulated over rows in ascending n (one thread). */
static void rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
                             const float *w, const float *rstd, int N, int C, int nt)
{
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
        float r = rstd[n], dot = 0.0f;
        for (int i = 0; i < C; i++)
            dot += (w[i] * dy[i]) * x[i];
        float k = ((r * r) * r) * (dot / (float)C);
        for (int i = 0; i < C; i++)
            dinp[(size_t)n * C + i] += r * (w[i] * dy[i]) - x[i] * k;
    }
    for (int i = 0; i < C; i++) {
        float acc = 0.0f;
        for (int n = 0; n < N; n++)
            acc += dout[(size_t)n * C + i] * (inp[(size_t)n * C + i] * rstd[n]);
        dw[i] += acc;
    }
}

/* RoPE, HF rotate_half: out[i] = x[i] cos - x[i+D/2] sin, out[i+D/2] = x[i+D/2] cos + x[i] sin,
 * angle pos * inv_freq[i]. x, out: (N, nh, D), in place allowed. */
static void rope_forward(float *out, const float *inp, const int32_t *pos, const float *cosb,
                         const float *sinb, int N, int nh, int D)
{
    int h2 = D / 2;
    for (int n = 0; n < N; n++)
        for (int h = 0; h < nh; h++) {
            const float *x = inp + ((size_t)n * nh + h) * D;
            float *y = out + ((size_t)n * nh + h) * D;
            const float *cs = cosb + (size_t)pos[n] * h2, *sn = sinb + (size_t)pos[n] * h2;
            for (int i = 0; i < h2; i++) {
                float a = x[i], b = x[i + h2];
                y[i] = a * cs[i] - b * sn[i];
                y[i + h2] = b * cs[i] + a * sn[i];
            }
        }
}

/* The transpose rotation; dinp may alias dout. */
static void rope_backward(float *dinp, const float *dout, const int32_t *pos, const float *cosb,
                          const float *sinb, int N, int nh, int D)
{
    int h2 = D / 2;
    for (int n = 0; n < N; n++)
        for (int h = 0; h < nh; h++) {
            const float *dy = dout + ((size_t)n * nh + h) * D;
            float *dx = dinp + ((size_t)n * nh + h) * D;
            const float *cs = cosb + (size_t)pos[n] * h2, *sn = sinb + (size_t)pos[n] * h2;
            for (int i = 0; i < h2; i++) {
                float a = dy[i], b = dy[i + h2];
                dx[i] = a * cs[i] + b * sn[i];
                dx[i + h2] = b * cs[i] - a * sn[i];
            }
        }
}

/* One query qv (D) over keys and values s = 0..t at kb + s*stride, vb + s*stride:
 * p (t+1) = softmax(q.k * scale), out (D) = sum_s p[s] v[s], ascending s.
 * The prefill and the KV-cache decode both call this, so they agree bit for bit. */
static void attend(float *out, float *p, const float *qv, const float *kb, const float *vb, size_t stride,
                   int t, int D, float scale)
{
    float mx = -INFINITY, sum = 0.0f;
    for (int s = 0; s <= t; s++) {
        const float *kv = kb + (size_t)s * stride;
        float dot = 0.0f;
        for (int i = 0; i < D; i++)
            dot += qv[i] * kv[i];
        p[s] = dot * scale;
        mx = fmaxf(mx, p[s]);
    }
    for (int s = 0; s <= t; s++) {
        p[s] = qd_expf(p[s] - mx);
        sum += p[s];
    }
    for (int s = 0; s <= t; s++)
        p[s] = p[s] / sum;
    for (int i = 0; i < D; i++) {
        float acc = 0.0f;
        for (int s = 0; s <= t; s++)
            acc += p[s] * vb[(size_t)s * stride + i];
        out[i] = acc;
    }
}

/* Causal GQA attention over packed sequences (seq_off, B + 1 entries).
 * att (N, H, Tm): probabilities of query t over keys s <= t of its sequence;
 * out (N, H*D). Query head h reads kv head h / (H/KV) (HF's repeat_kv). */
static void attention_forward(float *out, float *att, const float *q, const float *k, const float *v,
                              const int32_t *seq_off, int B, int Tm, int H, int KV, int D, int nt)
{
    float scale = (float)(1.0 / sqrt((double)D));
    int HD = H * D, KD = KV * D, grp = H / KV;
#pragma omp parallel for collapse(2) num_threads(nt) schedule(dynamic)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            int off = seq_off[b], len = seq_off[b + 1] - off, kh = h / grp;
            for (int t = 0; t < len; t++)
                attend(out + (size_t)(off + t) * HD + h * D, att + ((size_t)(off + t) * H + h) * Tm,
                       q + (size_t)(off + t) * HD + h * D, k + (size_t)off * KD + kh * D,
                       v + (size_t)off * KD + kh * D, (size_t)KD, t, D, scale);
        }
}

/* Decode: query n (at position pos[n] of cache row row[n]) over the cached
 * keys and values kc, vc (rows, Tc, KV*D), positions 0..pos[n]. */
static void attention_decode(float *out, float *att, const float *q, const float *kc, const float *vc,
                             const int32_t *row, const int32_t *pos, int N, int Tm, int Tc, int H, int KV,
                             int D, int nt)
{
    float scale = (float)(1.0 / sqrt((double)D));
    int HD = H * D, KD = KV * D, grp = H / KV;
#pragma omp parallel for collapse(2) num_threads(nt) schedule(dynamic)
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++) {
            size_t base = (size_t)row[n] * Tc * KD + (size_t)(h / grp) * D;
            attend(out + (size_t)n * HD + h * D, att + ((size_t)n * H + h) * Tm, q + (size_t)n * HD + h * D,
                   kc + base, vc + base, (size_t)KD, pos[n], D, scale);
        }
}

/* Backward of attention_forward; dq, dk, dv += (each thread owns one
 * (sequence, kv head), so the order over t and the group's heads is fixed). */
static void attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *att,
                               const float *q, const float *k, const float *v, const int32_t *seq_off,
                               int B, int Tm, int H, int KV, int D, int nt)
{
    float scale = (float)(1.0 / sqrt((double)D));
    int HD = H * D, KD = KV * D, grp = H / KV;
#pragma omp parallel num_threads(nt)
    {
        float *dp = malloc(sizeof(float) * (size_t)Tm);
#pragma omp for collapse(2) schedule(dynamic)
        for (int b = 0; b < B; b++)
            for (int kh = 0; kh < KV; kh++) {
                int off = seq_off[b], len = seq_off[b + 1] - off;
                for (int h = kh * grp; h < (kh + 1) * grp; h++)
                    for (int t = 0; t < len; t++) {
                        const float *p = att + ((size_t)(off + t) * H + h) * Tm;
                        const float *dy = dout + (size_t)(off + t) * HD + h * D;
                        const float *qv = q + (size_t)(off + t) * HD + h * D;
                        float *dqv = dq + (size_t)(off + t) * HD + h * D;
                        float pdp = 0.0f;
                        for (int s = 0; s <= t; s++) {
                            const float *vv = v + (size_t)(off + s) * KD + kh * D;
                            float acc = 0.0f;
                            for (int i = 0; i < D; i++)
                                acc += dy[i] * vv[i];
                            dp[s] = acc;
                            pdp += p[s] * acc;
                        }
                        for (int s = 0; s <= t; s++) {
                            float ds = (p[s] * (dp[s] - pdp)) * scale; /* d(q.k) */
                            const float *kv = k + (size_t)(off + s) * KD + kh * D;
                            float *dkv = dk + (size_t)(off + s) * KD + kh * D;
                            float *dvv = dv + (size_t)(off + s) * KD + kh * D;
                            for (int i = 0; i < D; i++) {
                                dqv[i] += ds * kv[i];
                                dkv[i] += ds * qv[i];
                                dvv[i] += p[s] * dy[i];
                            }
                        }
                    }
            }
        free(dp);
    }
}

/* h (R, I) = silu(g) * u. */
static void swiglu_forward(float *h, const float *g, const float *u, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h[i] = qd_siluf(g[i]) * u[i];
}

/* dg, du = dh * u * silu'(g), dh * silu(g); silu'(g) = s (1 + g (1 - s)). Overwrites. */
static void swiglu_backward(float *dg, float *du, const float *dh, const float *g, const float *u, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float s = qd_sigmoidf(g[i]);
        dg[i] = (dh[i] * u[i]) * (s * (1.0f + g[i] * (1.0f - s)));
        du[i] = dh[i] * qd_siluf(g[i]);
    }
}

/* ------------------------------------------------------------------------ */
/* the linear layer of every precision recipe                                */

static qd_status fwd_w4a4(float *out, const float *inp, linear *L, int N)
{
    qd_nvfp4 a;
    int64_t K = L->in + (L->mode == QD_LINEAR_W4A4_RAC ? L->nrac : 0);
    qd_status st = qd_nvfp4_alloc(&a, N, K, 1);
    if (st)
        return st;
    if (L->mode == QD_LINEAR_W4A4_RAC) {
        st = qd_rac_error_accumulate(L->rac_err, inp, N, L->in);
        if (!st)
            st = qd_rac_augment_act(&a, inp, N, L->in, L->rac_ch, L->nrac);
    } else {
        st = qd_nvfp4_quantize(&a, inp);
    }
    if (!st)
        st = qd_w4a4_gemm(out, &a, &L->wq);
    qd_nvfp4_free(&a);
    return st;
}

static qd_status fwd_fp8(float *out, const float *inp, const linear *L, int N)
{
    uint8_t *qa = malloc((size_t)N * L->in);
    float *sa = malloc(sizeof(float) * (size_t)N);
    qd_status st = qa && sa ? QD_OK : qd_error(QD_ERR_NOMEM, "cpu backend: fp8 activations");
    if (!st)
        st = qd_fp8_quantize_rows(qa, sa, inp, N, L->in);
    if (!st)
        qd_fp8_gemm(out, qa, sa, L->w8, L->w8_inv, N, L->out, L->in);
    free(qa);
    free(sa);
    return st;
}

/* The input a BF16/QAT linear really multiplies: x rounded to BF16, or
 * fake-quantized to NVFP4 with one global scale per row (sym-QAT). Returns a
 * new buffer (N, in), or NULL when the mode uses x itself. */
static qd_status effective_input(float **xe, const float *inp, const linear *L, int N)
{
    size_t n = (size_t)N * L->in;
    *xe = NULL;
    if (L->mode == QD_LINEAR_FP32)
        return QD_OK;
    *xe = malloc(sizeof(float) * (n ? n : 1));
    if (!*xe)
        return qd_error(QD_ERR_NOMEM, "cpu backend: linear input");
    if (L->mode == QD_LINEAR_SYM_QAT)
        return qd_nvfp4_fake_quant(*xe, inp, N, L->in, 1);
    for (size_t i = 0; i < n; i++)
        (*xe)[i] = qd_round_bf16(inp[i]);
    return QD_OK;
}

/* Diagnostics: NVFP4 error of this input (one global scale per row, §4),
 * squared and summed in double: per row ascending, then the row sums added in
 * row order (the CUDA backend sums each row in one thread, the same order). */
static qd_status measure_act_error(linear *L, const float *inp, int N)
{
    size_t n = (size_t)N * L->in;
    float *xh = malloc(sizeof(float) * n);
    if (!xh)
        return qd_error(QD_ERR_NOMEM, "cpu backend: diagnostics");
    qd_status st = qd_nvfp4_fake_quant(xh, inp, N, L->in, 1);
    for (int r = 0; r < N && !st; r++) {
        double e = 0.0, x2 = 0.0;
        for (size_t i = (size_t)r * L->in; i < (size_t)(r + 1) * L->in; i++) {
            double d = (double)inp[i] - (double)xh[i];
            e += d * d;
            x2 += (double)inp[i] * (double)inp[i];
        }
        L->act_err += e;
        L->act_norm += x2;
    }
    free(xh);
    return st;
}

/* out (N, out) = x (N, in) . W^T under the layer's mode. */
static qd_status linear_forward(cpu_ctx *c, float *out, const float *inp, linear *L, int N)
{
    if (N == 0)
        return QD_OK;
    if (c->opt.diagnostics && L->quantized && L->in % QD_NVFP4_BLOCK == 0) {
        qd_status st = measure_act_error(L, inp, N);
        if (st)
            return st;
    }
    if (L->mode == QD_LINEAR_W4A4 || L->mode == QD_LINEAR_W4A4_RAC)
        return fwd_w4a4(out, inp, L, N);
    if (L->mode == QD_LINEAR_FP8)
        return fwd_fp8(out, inp, L, N);
    float *xe;
    qd_status st = effective_input(&xe, inp, L, N);
    if (!st)
        matmul_forward(out, xe ? xe : inp, P(c, L->w), N, L->in, L->out, nthreads(c));
    free(xe);
    return st;
}

/* dinp += dout . W_eff; grad(W) += dout^T . x_eff (straight-through). */
static qd_status linear_backward(cpu_ctx *c, float *dinp, const float *dout, const float *inp,
                                 const linear *L, int N)
{
    if (N == 0)
        return QD_OK;
    float *xe;
    qd_status st = effective_input(&xe, inp, L, N);
    if (!st)
        matmul_backward(dinp, c->grads + L->w, dout, xe ? xe : inp, P(c, L->w), N, L->in, L->out,
                        nthreads(c));
    free(xe);
    return st;
}

/* ------------------------------------------------------------------------ */
/* the parameter table                                                       */

/* Takes over the shared table (backends/layout.h); each linear layer gets the
 * mode the recipe gives it. */
static qd_status build_params(cpu_ctx *c)
{
    qd_model_layout m;
    qd_status st = qd_model_layout_init(&m, &c->cfg);
    if (st)
        return st;
    qd_linear_mode qm = qd_recipe_linear_mode(c->opt.recipe, c->opt.role);
    qd_linear_mode dm = qd_recipe_dense_mode(c->opt.recipe);
    c->lin = calloc((size_t)m.nlin, sizeof *c->lin);
    if (!c->lin) {
        qd_model_layout_free(&m);
        return qd_error(QD_ERR_NOMEM, "cpu backend: parameter table");
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

/* ------------------------------------------------------------------------ */
/* weight sync                                                               */

static int is_rollout_quant(qd_linear_mode m)
{
    return m == QD_LINEAR_FP8 || m == QD_LINEAR_W4A4 || m == QD_LINEAR_W4A4_RAC;
}

/* The rollout copies of one quantized linear from its master weight. */
static qd_status sync_rollout_linear(cpu_ctx *c, linear *L)
{
    const float *w = c->params + L->w;
    if (L->mode == QD_LINEAR_FP8)
        return qd_fp8_quantize_rows(L->w8, L->w8_inv, w, L->out, L->in);
    qd_nvfp4_free(&L->wq);
    if (L->mode == QD_LINEAR_W4A4) {
        qd_status st = qd_nvfp4_alloc(&L->wq, L->out, L->in, 0);
        return st ? st : qd_nvfp4_quantize(&L->wq, w);
    }
    /* RAC: channels of largest activation error since the last sync */
    L->nrac = qd_rac_select(L->rac_ch, L->rac_err, L->in, c->opt.rac_ratio);
    if (L->nrac < 0)
        return QD_ERR_ARG;
    memset(L->rac_err, 0, sizeof(double) * (size_t)L->in);
    qd_status st = qd_nvfp4_alloc(&L->wq, L->out, L->in + L->nrac, 0);
    return st ? st : qd_rac_augment_weight(&L->wq, w, L->out, L->in, L->rac_ch, L->nrac);
}

/* Diagnostics: relative squared NVFP4 error of the master weight; sums in
 * double per row ascending, rows added in order (as measure_act_error). */
static qd_status measure_weight_error(cpu_ctx *c, linear *L)
{
    size_t n = (size_t)L->out * L->in;
    float *wh = malloc(sizeof(float) * n);
    if (!wh)
        return qd_error(QD_ERR_NOMEM, "cpu backend: diagnostics");
    const float *w = c->params + L->w;
    qd_status st = qd_nvfp4_fake_quant(wh, w, L->out, L->in, 0);
    double num = 0, den = 0;
    for (int r = 0; r < L->out && !st; r++) {
        double e = 0.0, w2 = 0.0;
        for (size_t i = (size_t)r * L->in; i < (size_t)(r + 1) * L->in; i++) {
            double d = (double)w[i] - (double)wh[i];
            e += d * d;
            w2 += (double)w[i] * (double)w[i];
        }
        num += e;
        den += w2;
    }
    L->weight_err = den > 0 ? num / den : 0.0;
    free(wh);
    return st;
}

/* The working copy of a linear's weight that the forward multiplies. */
static qd_status sync_linear(cpu_ctx *c, linear *L)
{
    size_t n = (size_t)L->out * L->in;
    if (c->opt.diagnostics && L->quantized && L->in % QD_NVFP4_BLOCK == 0) {
        qd_status st = measure_weight_error(c, L);
        if (st)
            return st;
    }
    if (is_rollout_quant(L->mode))
        return sync_rollout_linear(c, L);
    if (L->mode == QD_LINEAR_AQAT || L->mode == QD_LINEAR_SYM_QAT)
        return qd_nvfp4_fake_quant(c->wk + L->w, c->params + L->w, L->out, L->in, 0);
    if (L->mode == QD_LINEAR_BF16)
        for (size_t i = 0; i < n; i++)
            c->wk[L->w + i] = qd_round_bf16(c->params[L->w + i]);
    return QD_OK;
}

/* Rebuild every working copy from the master weights (NUMERICS.md §5). */
static qd_status sync_weights(cpu_ctx *c)
{
    int bf16 = c->opt.recipe != QD_RECIPE_FP32;
    for (size_t i = 0; i < c->nfloats; i++)
        c->wk[i] = bf16 ? qd_round_bf16(c->params[i]) : c->params[i];
    for (int i = 0; i < c->nlin; i++) {
        qd_status st = sync_linear(c, &c->lin[i]);
        if (st)
            return st;
    }
    return QD_OK;
}

/* ------------------------------------------------------------------------ */
/* forward                                                                   */

/* Bump allocator: a first pass with base NULL only counts bytes. */
typedef struct {
    char *base;
    size_t used;
} arena;

static void *take(arena *a, size_t bytes)
{
    void *p = a->base ? a->base + a->used : NULL;
    a->used += (bytes + 63) & ~(size_t)63;
    return p;
}

#define TAKE_F(a, n) ((float *)take((a), sizeof(float) * (size_t)(n)))
#define TAKE_I(a, n) ((int32_t *)take((a), sizeof(int32_t) * (size_t)(n)))

static void layout_layer(arena *a, layer_acts *s, const cpu_ctx *c, const layer *ly)
{
    const qd_model_config *g = &c->cfg;
    int N = c->N, C = g->hidden_size, H = g->num_attention_heads, KV = g->num_key_value_heads;
    int D = g->head_dim, R = N * (ly->moe ? g->num_experts_per_tok : 1), K = g->num_experts_per_tok;
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
    s->probs = ly->moe ? TAKE_F(a, N * ly->nexp) : NULL;
    s->topk = ly->moe ? TAKE_I(a, N * K) : NULL;
    s->topw = ly->moe ? TAKE_F(a, N * K) : NULL;
    s->row_tok = TAKE_I(a, R);
    s->row_w = TAKE_F(a, R);
    s->row_rank = TAKE_I(a, R);
    s->tok_rows = TAKE_I(a, R);
    s->exp_off = TAKE_I(a, ly->nexp + 1);
    s->xe = TAKE_F(a, (size_t)R * C);
    s->g = TAKE_F(a, (size_t)R * ly->ffn);
    s->u = TAKE_F(a, (size_t)R * ly->ffn);
    s->h = TAKE_F(a, (size_t)R * ly->ffn);
    s->y = TAKE_F(a, (size_t)R * C);
}

static void layout_acts(arena *a, cpu_ctx *c)
{
    int N = c->N, C = c->cfg.hidden_size;
    c->tok = TAKE_I(a, N);
    c->tgt = TAKE_I(a, N);
    c->pos = TAKE_I(a, N);
    c->src = TAKE_I(a, N);
    c->row = TAKE_I(a, N);
    c->seq_off = TAKE_I(a, c->B + 1);
    for (int l = 0; l < c->cfg.num_hidden_layers; l++)
        layout_layer(a, &c->acts[l], c, &c->layers[l]);
    c->xf = TAKE_F(a, N * C);
    c->lnf = TAKE_F(a, N * C);
    c->rstdf = TAKE_F(a, N);
    c->logits = TAKE_F(a, (size_t)N * c->cfg.vocab_size);
    c->lse = TAKE_F(a, N);
}

/* The activations of a batch of c->N tokens, c->B sequences, longest c->Tm. */
static qd_status alloc_acts(cpu_ctx *c)
{
    free(c->arena);
    arena a = {NULL, 0};
    layout_acts(&a, c);
    c->arena = a.base = malloc(a.used);
    if (!c->arena)
        return qd_error(QD_ERR_NOMEM, "cpu backend: %zu bytes of activations", a.used);
    a.used = 0;
    layout_acts(&a, c);
    return QD_OK;
}

/* Pack the batch: tokens of row b at seq_off[b] .. seq_off[b+1]-1. */
static qd_status pack_batch(cpu_ctx *c, const qd_batch *bt)
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
    qd_status st = alloc_acts(c);
    return st ? st : qd_pack_batch(c->tok, c->tgt, c->pos, c->row, c->src, c->seq_off, bt, c->cfg.vocab_size);
}

/* Route tokens: router softmax, top-k, weights; rows grouped by expert in
 * ascending token order. A dense layer routes every token to "expert 0" with
 * weight 1 (exact: 0 + 1 * y = y). */
static void route(cpu_ctx *c, layer_acts *s, const layer *ly)
{
    int N = c->N, E = ly->nexp, K = ly->moe ? c->cfg.num_experts_per_tok : 1;
    for (int n = 0; ly->moe && n < N; n++)
        qd_router_select(s->topk + (size_t)n * K, s->topw + (size_t)n * K, s->probs + (size_t)n * E, E, K,
                         c->cfg.norm_topk_prob);
    int32_t *cnt = malloc(sizeof(int32_t) * (size_t)E);
    qd_moe_group(s->exp_off, s->row_tok, s->row_w, s->row_rank, s->tok_rows, cnt, ly->moe ? s->topk : NULL,
                 s->topw, N, E, K);
    free(cnt);
}

static linear *expert_lin(cpu_ctx *c, const layer *ly, int e, int which)
{
    return &c->lin[ly->mlp0 + 3 * e + which];
}

/* out (N, C) = MoE block or dense MLP of inp = ln2 (N, C). */
static qd_status mlp_forward(cpu_ctx *c, float *out, layer_acts *s, const layer *ly)
{
    int N = c->N, C = c->cfg.hidden_size, I = ly->ffn, K = ly->moe ? c->cfg.num_experts_per_tok : 1;
    qd_status st = QD_OK;
    if (ly->moe) {
        st = linear_forward(c, s->probs, s->ln2, &c->lin[ly->router], N);
        if (st)
            return st;
        for (int n = 0; n < N; n++)
            qd_router_softmax(s->probs + (size_t)n * ly->nexp, ly->nexp);
    }
    route(c, s, ly);
    int R = s->exp_off[ly->nexp];
    for (int r = 0; r < R; r++)
        memcpy(s->xe + (size_t)r * C, s->ln2 + (size_t)s->row_tok[r] * C, sizeof(float) * C);
    for (int e = 0; e < ly->nexp && !st; e++) {
        int r0 = s->exp_off[e], m = s->exp_off[e + 1] - r0;
        st = linear_forward(c, s->g + (size_t)r0 * I, s->xe + (size_t)r0 * C, expert_lin(c, ly, e, 0), m);
        if (!st)
            st = linear_forward(c, s->u + (size_t)r0 * I, s->xe + (size_t)r0 * C, expert_lin(c, ly, e, 1), m);
        if (!st) {
            swiglu_forward(s->h + (size_t)r0 * I, s->g + (size_t)r0 * I, s->u + (size_t)r0 * I, (size_t)m * I);
            st = linear_forward(c, s->y + (size_t)r0 * C, s->h + (size_t)r0 * I, expert_lin(c, ly, e, 2), m);
        }
    }
    for (int n = 0; n < N && !st; n++)
        for (int i = 0; i < C; i++) {
            float acc = 0.0f;
            for (int j = 0; j < K; j++) {
                int r = s->tok_rows[n * K + j];
                acc += s->y[(size_t)r * C + i] * s->row_w[r];
            }
            out[(size_t)n * C + i] = acc;
        }
    return st;
}

/* Keys and values of this batch into the KV cache of layer l. */
static void store_kv(cpu_ctx *c, int l, const layer_acts *s)
{
    int KD = c->cfg.num_key_value_heads * c->cfg.head_dim;
    size_t lsz = (size_t)c->cache_rows * c->Tc * KD;
    for (int n = 0; n < c->N; n++) {
        size_t at = (size_t)l * lsz + ((size_t)c->row[n] * c->Tc + c->pos[n]) * KD;
        memcpy(c->kc + at, s->kr + (size_t)n * KD, sizeof(float) * KD);
        memcpy(c->vc + at, s->v + (size_t)n * KD, sizeof(float) * KD);
    }
}

static qd_status attn_forward(cpu_ctx *c, float *out, layer_acts *s, const layer *ly, int l)
{
    const qd_model_config *g = &c->cfg;
    int N = c->N, H = g->num_attention_heads, KV = g->num_key_value_heads, D = g->head_dim;
    float eps = (float)g->rms_norm_eps;
    int nt = nthreads(c);
    qd_status st = linear_forward(c, s->q, s->ln1, &c->lin[ly->q], N);
    if (!st)
        st = linear_forward(c, s->k, s->ln1, &c->lin[ly->k], N);
    if (!st)
        st = linear_forward(c, s->v, s->ln1, &c->lin[ly->v], N);
    if (st)
        return st;
    rmsnorm_forward(s->qr, s->rstd_q, s->q, P(c, ly->q_norm), N * H, D, eps, nt);
    rmsnorm_forward(s->kr, s->rstd_k, s->k, P(c, ly->k_norm), N * KV, D, eps, nt);
    rope_forward(s->qr, s->qr, c->pos, c->rope_cos, c->rope_sin, N, H, D);
    rope_forward(s->kr, s->kr, c->pos, c->rope_cos, c->rope_sin, N, KV, D);
    if (c->kc)
        store_kv(c, l, s);
    if (c->decode) {
        size_t lsz = (size_t)c->cache_rows * c->Tc * KV * D;
        attention_decode(s->ao, s->att, s->qr, c->kc + l * lsz, c->vc + l * lsz, c->row, c->pos, N, c->Tm,
                         c->Tc, H, KV, D, nt);
    } else {
        attention_forward(s->ao, s->att, s->qr, s->kr, s->v, c->seq_off, c->B, c->Tm, H, KV, D, nt);
    }
    return linear_forward(c, out, s->ao, &c->lin[ly->o], N);
}

/* logp (N): log_softmax(logits / T)[next token] computed as the sampler does
 * (s_i = x_i / T, then its normalizer, backends/sampling.h), so rollout and
 * forward log-probs agree bit for bit at any temperature; lse (N) saved is
 * m + logz of s. s is scratch (V), unused when T = 1. */
static qd_status logprob_forward(float *logp, float *lse, float *s, const float *logits, const int32_t *tgt,
                                 int N, int V, float T)
{
    for (int n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * V;
        if (T != 1.0f) {
            for (int i = 0; i < V; i++) {
                s[i] = l[i] / T;
                if (!isfinite(s[i]) && isfinite(l[i]))
                    return qd_error(QD_ERR_NONFINITE, "forward: token %d: logits[%d] / temperature %g overflows",
                                    n, i, (double)T);
            }
            l = s;
        }
        float mx, logz;
        qd_softmax_lognorm(&mx, &logz, l, V);
        lse[n] = mx + logz;
        logp[n] = tgt[n] >= 0 ? (l[tgt[n]] - mx) - logz : 0.0f;
    }
    return QD_OK;
}

static void residual_forward(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

static qd_status model_forward(cpu_ctx *c, float *logp_packed)
{
    const qd_model_config *g = &c->cfg;
    int N = c->N, C = g->hidden_size, L = g->num_hidden_layers, nt = nthreads(c);
    float eps = (float)g->rms_norm_eps;
    qd_status st = QD_OK;
    for (int n = 0; n < N; n++)
        memcpy(c->acts[0].x + (size_t)n * C, P(c, c->embed) + (size_t)c->tok[n] * C, sizeof(float) * C);
    for (int l = 0; l < L && !st; l++) {
        layer_acts *s = &c->acts[l];
        const layer *ly = &c->layers[l];
        float *next = l + 1 < L ? c->acts[l + 1].x : c->xf;
        rmsnorm_forward(s->ln1, s->rstd1, s->x, P(c, ly->in_norm), N, C, eps, nt);
        st = attn_forward(c, next, s, ly, l);              /* next used as scratch (N, C) */
        if (st)
            break;
        residual_forward(s->xmid, s->x, next, (size_t)N * C);
        rmsnorm_forward(s->ln2, s->rstd2, s->xmid, P(c, ly->post_norm), N, C, eps, nt);
        st = mlp_forward(c, next, s, ly);
        if (!st)
            residual_forward(next, s->xmid, next, (size_t)N * C);
    }
    if (st)
        return st;
    rmsnorm_forward(c->lnf, c->rstdf, c->xf, P(c, c->final_norm), N, C, eps, nt);
    st = linear_forward(c, c->logits, c->lnf, &c->lin[c->lm_head], N);
    float *scratch = st || c->temp == 1.0f ? NULL : malloc(sizeof(float) * g->vocab_size);
    if (!st && c->temp != 1.0f && !scratch)
        st = qd_error(QD_ERR_NOMEM, "cpu backend: log-probs");
    if (!st)
        st = logprob_forward(logp_packed, c->lse, scratch, c->logits, c->tgt, N, g->vocab_size, c->temp);
    free(scratch);
    return st;
}

/* ------------------------------------------------------------------------ */
/* backward (the forward in reverse; gradients accumulate with +=)            */

/* dlogits (N, V) = dlogp * (onehot(tgt) - softmax(logits / T)) / T, the
 * softmax from the forward's lse of the scaled logits. */
static void logprob_backward(float *dlogits, const float *dlogp, const float *logits, const float *lse,
                             const int32_t *tgt, int N, int V, float T)
{
    for (int n = 0; n < N; n++) {
        float d = tgt[n] >= 0 ? dlogp[n] / T : 0.0f;
        for (int j = 0; j < V; j++) {
            float p = qd_expf(logits[(size_t)n * V + j] / T - lse[n]);
            dlogits[(size_t)n * V + j] = d * ((j == tgt[n] ? 1.0f : 0.0f) - p);
        }
    }
}

/* Router gradient: dprobs of the chosen experts from dL/dweight, through the
 * optional renormalization w_j = p_j / S, then the softmax backward into
 * dlogits (N, E) (overwritten). */
static void router_backward(float *dlogits, const float *dw, const layer_acts *s, int N, int E, int K,
                            int renorm)
{
    for (int n = 0; n < N; n++) {
        float *dl = dlogits + (size_t)n * E;
        const float *p = s->probs + (size_t)n * E;
        const int32_t *ix = s->topk + (size_t)n * K;
        memset(dl, 0, sizeof(float) * E);                    /* dl holds dprobs first */
        float sum = 0.0f, wdw = 0.0f;
        for (int j = 0; j < K; j++) {
            sum += p[ix[j]];
            wdw += dw[n * K + j] * s->topw[n * K + j];
        }
        for (int j = 0; j < K; j++)
            dl[ix[j]] = renorm ? (dw[n * K + j] - wdw) / sum : dw[n * K + j];
        float pdp = 0.0f;
        for (int e = 0; e < E; e++)
            pdp += p[e] * dl[e];
        for (int e = 0; e < E; e++)
            dl[e] = p[e] * (dl[e] - pdp);
    }
}

/* dinp (N, C) += gradient of mlp_forward's input, given dout (N, C). */
static qd_status mlp_backward(cpu_ctx *c, float *dinp, const float *dout, const layer_acts *s,
                              const layer *ly)
{
    int N = c->N, C = c->cfg.hidden_size, I = ly->ffn, K = ly->moe ? c->cfg.num_experts_per_tok : 1;
    int R = s->exp_off[ly->nexp];
    size_t nbuf = (size_t)R * C * 2 + (size_t)R * I * 3 + (size_t)N * K + (size_t)N * ly->nexp;
    float *buf = calloc(nbuf ? nbuf : 1, sizeof(float));
    if (!buf)
        return qd_error(QD_ERR_NOMEM, "cpu backend: MoE backward");
    float *dy = buf, *dxe = dy + (size_t)R * C, *dh = dxe + (size_t)R * C, *dg = dh + (size_t)R * I;
    float *du = dg + (size_t)R * I, *dw = du + (size_t)R * I, *dlog = dw + (size_t)N * K;
    for (int n = 0; n < N; n++)
        for (int j = 0; j < K; j++) {
            int r = s->tok_rows[n * K + j];
            const float *yr = s->y + (size_t)r * C, *d = dout + (size_t)n * C;
            float acc = 0.0f;
            for (int i = 0; i < C; i++) {
                dy[(size_t)r * C + i] = d[i] * s->row_w[r];
                acc += d[i] * yr[i];
            }
            dw[n * K + s->row_rank[r]] = acc;              /* dL/dweight, rank order */
        }
    qd_status st = QD_OK;
    for (int e = 0; e < ly->nexp && !st; e++) {
        int r0 = s->exp_off[e], m = s->exp_off[e + 1] - r0;
        size_t oi = (size_t)r0 * I, oc = (size_t)r0 * C;
        st = linear_backward(c, dh + oi, dy + oc, s->h + oi, expert_lin(c, ly, e, 2), m);
        if (st)
            break;
        swiglu_backward(dg + oi, du + oi, dh + oi, s->g + oi, s->u + oi, (size_t)m * I);
        st = linear_backward(c, dxe + oc, dg + oi, s->xe + oc, expert_lin(c, ly, e, 0), m);
        if (!st)
            st = linear_backward(c, dxe + oc, du + oi, s->xe + oc, expert_lin(c, ly, e, 1), m);
    }
    for (int n = 0; n < N && !st; n++)
        for (int j = 0; j < K; j++) {
            const float *d = dxe + (size_t)s->tok_rows[n * K + j] * C;
            for (int i = 0; i < C; i++)
                dinp[(size_t)n * C + i] += d[i];
        }
    if (!st && ly->moe) {
        router_backward(dlog, dw, s, N, ly->nexp, K, c->cfg.norm_topk_prob);
        st = linear_backward(c, dinp, dlog, s->ln2, &c->lin[ly->router], N);
    }
    free(buf);
    return st;
}

/* dx (N, C) += gradient of the attention branch's input x, given dout (N, C). */
static qd_status attn_backward(cpu_ctx *c, float *dx, const float *dout, const layer_acts *s,
                               const layer *ly)
{
    const qd_model_config *g = &c->cfg;
    int N = c->N, C = g->hidden_size, H = g->num_attention_heads, KV = g->num_key_value_heads;
    int D = g->head_dim, nt = nthreads(c);
    size_t nq = (size_t)N * H * D, nk = (size_t)N * KV * D;
    float *buf = calloc(3 * nq + 3 * nk + (size_t)N * C, sizeof(float));
    if (!buf)
        return qd_error(QD_ERR_NOMEM, "cpu backend: attention backward");
    float *dao = buf, *dqr = dao + nq, *dq = dqr + nq;     /* (N, H*D) each */
    float *dkr = dq + nq, *dk = dkr + nk, *dv = dk + nk;   /* (N, KV*D) each */
    float *dln = dv + nk;                                  /* (N, C) */
    qd_status st = linear_backward(c, dao, dout, s->ao, &c->lin[ly->o], N);
    if (st)
        goto out;
    attention_backward(dqr, dkr, dv, dao, s->att, s->qr, s->kr, s->v, c->seq_off, c->B, c->Tm, H, KV,
                       D, nt);
    rope_backward(dqr, dqr, c->pos, c->rope_cos, c->rope_sin, N, H, D);
    rope_backward(dkr, dkr, c->pos, c->rope_cos, c->rope_sin, N, KV, D);
    rmsnorm_backward(dq, c->grads + ly->q_norm, dqr, s->q, P(c, ly->q_norm), s->rstd_q, N * H, D, nt);
    rmsnorm_backward(dk, c->grads + ly->k_norm, dkr, s->k, P(c, ly->k_norm), s->rstd_k, N * KV, D, nt);
    st = linear_backward(c, dln, dq, s->ln1, &c->lin[ly->q], N);
    if (!st)
        st = linear_backward(c, dln, dk, s->ln1, &c->lin[ly->k], N);
    if (!st)
        st = linear_backward(c, dln, dv, s->ln1, &c->lin[ly->v], N);
    if (!st)
        rmsnorm_backward(dx, c->grads + ly->in_norm, dln, s->x, P(c, ly->in_norm), s->rstd1, N, C, nt);
out:
    free(buf);
    return st;
}

static qd_status model_backward(cpu_ctx *c, const float *dlogp_packed)
{
    const qd_model_config *g = &c->cfg;
    int N = c->N, C = g->hidden_size, V = g->vocab_size, nt = nthreads(c);
    float *dlogits = malloc(sizeof(float) * (size_t)N * V);
    float *dres = calloc((size_t)N * C, sizeof(float));   /* dL/d residual stream */
    float *dln = calloc((size_t)N * C, sizeof(float));
    qd_status st = dlogits && dres && dln ? QD_OK : qd_error(QD_ERR_NOMEM, "cpu backend: backward");
    if (!st) {
        logprob_backward(dlogits, dlogp_packed, c->logits, c->lse, c->tgt, N, V, c->temp);
        st = linear_backward(c, dln, dlogits, c->lnf, &c->lin[c->lm_head], N);
    }
    if (!st)
        rmsnorm_backward(dres, c->grads + c->final_norm, dln, c->xf, P(c, c->final_norm), c->rstdf, N, C, nt);
    for (int l = g->num_hidden_layers - 1; l >= 0 && !st; l--) {
        const layer_acts *s = &c->acts[l];
        const layer *ly = &c->layers[l];
        memset(dln, 0, sizeof(float) * (size_t)N * C);
        st = mlp_backward(c, dln, dres, s, ly);            /* reads dres, then dres += */
        if (!st)
            rmsnorm_backward(dres, c->grads + ly->post_norm, dln, s->xmid, P(c, ly->post_norm), s->rstd2,
                             N, C, nt);
        if (!st)
            st = attn_backward(c, dres, dres, s, ly);
    }
    for (int n = 0; n < N && !st; n++)                     /* embedding rows, ascending n */
        for (int i = 0; i < C; i++)
            c->grads[c->embed + (size_t)c->tok[n] * C + i] += dres[(size_t)n * C + i];
    free(dlogits);
    free(dres);
    free(dln);
    return st;
}

/* Diagnostics start from zero at each forward and each generate. */
static void reset_diag(cpu_ctx *c)
{
    c->have_diag = 0;
    for (int i = 0; i < c->nlin; i++)
        c->lin[i].act_err = c->lin[i].act_norm = 0.0;
}

/* ------------------------------------------------------------------------ */
/* generation: prefill, then decode with a KV cache; every op is the        */
/* forward's, so the rollout log-probs equal the forward's, bit for bit      */

typedef struct {
    int32_t *seq, *len, *idx;      /* (B, Tmax) prompt + generated, (B) their lengths, (B) active rows */
    float *lp;                     /* (B * Tmax) log-probs of the forward (unused) */
    qd_sample_ws *ws;              /* the sampler's scratch (V) */
    int *done;                     /* (B) */
    int Tmax;
} gen_state;


/* Decode: the last token of each of the na active rows, at its position,
 * attending to the KV cache. */
static qd_status decode_forward(cpu_ctx *c, gen_state *g, int na)
{
    c->N = c->B = na;
    c->Tm = 0;
    for (int i = 0; i < na; i++)
        if (g->len[g->idx[i]] > c->Tm)
            c->Tm = g->len[g->idx[i]];
    qd_status st = alloc_acts(c);
    if (st)
        return st;
    qd_decode_pack(c->tok, c->pos, c->row, c->tgt, c->src, c->seq_off, g->seq, g->len, g->idx, na, g->Tmax);
    c->decode = 1;
    st = model_forward(c, g->lp);
    c->decode = 0;
    return st;
}

/* One token for every unfinished row: the prompts' forward (prefill, which
 * fills the KV cache) at step 0, a decode step after; *active = rows that ran. */
static qd_status gen_step(cpu_ctx *c, gen_state *g, const qd_generate_request *rq, qd_generate_result *res,
                          int step, int *active)
{
    int na = 0, V = c->cfg.vocab_size, M = rq->max_new_tokens;
    for (int b = 0; b < rq->B; b++)
        if (!g->done[b])
            g->idx[na++] = b;
    *active = na;
    if (na == 0)
        return QD_OK;
    qd_status st;
    if (step == 0) {
        qd_batch bt = {rq->B, rq->Tp, rq->prompt, rq->prompt_len, 1.0f}; /* the prefill's log-probs are not used */
        st = pack_batch(c, &bt);
        if (!st)
            st = model_forward(c, g->lp);
    } else {
        st = decode_forward(c, g, na);
    }
    for (int i = 0; i < na && !st; i++) {
        int b = g->idx[i], r = step == 0 ? b : i;  /* the prefill ran every row */
        const float *l = c->logits + (size_t)(c->seq_off[r + 1] - 1) * V;
        qd_sample_params sp = {rq->temperature, rq->top_k, rq->top_p < 1.0f ? rq->top_p : 1.0f, rq->seed};
        qd_sample_result r1;
        st = qd_sample_row(&r1, g->ws, l, V, &sp, rq->seq_id[b], (uint32_t)g->len[b]);
        if (st)
            break;
        int32_t tok = r1.token;
        float lp = r1.logprob;
        g->seq[(size_t)b * g->Tmax + g->len[b]++] = tok;
        res->tokens[(size_t)b * M + step] = tok;
        res->logp[(size_t)b * M + step] = lp;
        res->lengths[b]++;
        g->done[b] = qd_generate_is_stop(rq, tok) || step + 1 == M;
    }
    return st;
}

static void gen_free(cpu_ctx *c, gen_state *g, int M)
{
    free(g->seq);
    free(g->len);
    free(g->idx);
    free(g->lp);
    qd_sample_ws_free(g->ws);
    free(g->done);
    free(c->kc);
    free(c->vc);
    c->kc = c->vc = NULL;
    c->have_forward = 0;  /* the activations are the last step's, not a batch's */
    c->have_diag = M > 0;
}

static qd_status generate_impl(qd_backend *bk, const qd_generate_request *rq, qd_generate_result *res)
{
    cpu_ctx *c = ctx_of(bk);
    int B = rq->B, M = rq->max_new_tokens, Tmax = rq->Tp + M;
    if (Tmax > c->cfg.max_position_embeddings)
        return qd_error(QD_ERR_SHAPE, "generate: prompt + max_new_tokens = %d > max_position_embeddings %d",
                        Tmax, c->cfg.max_position_embeddings);
    size_t ncache = (size_t)c->cfg.num_hidden_layers * B * Tmax * c->cfg.num_key_value_heads * c->cfg.head_dim;
    gen_state g = {calloc((size_t)B * Tmax, sizeof(int32_t)), calloc((size_t)B, sizeof(int32_t)),
                   calloc((size_t)B, sizeof(int32_t)), calloc((size_t)B * Tmax, sizeof(float)),
                   qd_sample_ws_new(c->cfg.vocab_size), calloc((size_t)B, sizeof(int)), Tmax};
    c->kc = malloc(sizeof(float) * ncache);
    c->vc = malloc(sizeof(float) * ncache);
    c->cache_rows = B;
    c->Tc = Tmax;
    qd_status st = g.seq && g.len && g.idx && g.lp && g.ws && g.done && c->kc && c->vc
                       ? QD_OK : qd_error(QD_ERR_NOMEM, "cpu backend: generate (KV cache %zu floats)", ncache);
    if (!st)
        qd_generate_begin(g.seq, g.len, g.done, rq, res, Tmax);
    reset_diag(c);
    int active = 1;
    for (int step = 0; step < M && active && !st; step++)
        st = gen_step(c, &g, rq, res, step, &active);
    gen_free(c, &g, M);
    return st;
}

/* ------------------------------------------------------------------------ */
/* AdamW                                                                     */

/* Global L2 norm of the gradients: fixed 4096-float chunks, each summed in
 * double ascending, chunks added ascending (thread count independent). */
static double grad_norm(const cpu_ctx *c)
{
    size_t nch = (c->nfloats + 4095) / 4096;
    double *part = calloc(nch ? nch : 1, sizeof(double)), total = 0.0;
#pragma omp parallel for num_threads(nthreads(c)) schedule(static)
    for (size_t k = 0; k < nch; k++) {
        size_t end = (k + 1) * 4096 < c->nfloats ? (k + 1) * 4096 : c->nfloats;
        double s = 0.0;
        for (size_t i = k * 4096; i < end; i++)
            s += (double)c->grads[i] * (double)c->grads[i];
        part[k] = s;
    }
    for (size_t k = 0; k < nch; k++)
        total += part[k];
    free(part);
    return sqrt(total);
}


static void adamw_tensor(cpu_ctx *c, const qd_param_info *pi, const qd_adamw *o, float gscale,
                         float bc1, float bc2)
{
    float wd = qd_adamw_decay(o, pi);
    size_t n = (size_t)(pi->rows * pi->cols);
#pragma omp parallel for num_threads(nthreads(c)) schedule(static)
    for (size_t i = pi->offset; i < pi->offset + n; i++) {
        float g = c->grads[i] * gscale;
        c->m[i] = o->beta1 * c->m[i] + (1.0f - o->beta1) * g;
        c->v[i] = o->beta2 * c->v[i] + (1.0f - o->beta2) * (g * g);
        float mh = c->m[i] / bc1, vh = c->v[i] / bc2;
        c->params[i] -= o->lr * (mh / (sqrtf(vh) + o->eps) + wd * c->params[i]);
    }
}

/* ------------------------------------------------------------------------ */
/* the vtable                                                                */

/* quant/'s OpenMP regions follow the runtime's default: set it to the
 * backend's thread count for the duration of one call. */
static int threads_push(const cpu_ctx *c)
{
#ifdef _OPENMP
    int saved = omp_get_max_threads();
    if (c->opt.num_threads > 0)
        omp_set_num_threads(c->opt.num_threads);
    return saved;
#else
    (void)c;
    return 1;
#endif
}

static void threads_pop(int saved)
{
#ifdef _OPENMP
    omp_set_num_threads(saved);
#else
    (void)saved;
#endif
}

static const char *cpu_get_name(qd_backend *b)
{
    (void)b;
    return "cpu";
}

static void free_linear(linear *L)
{
    qd_nvfp4_free(&L->wq);
    free(L->w8);
    free(L->w8_inv);
    free(L->rac_ch);
    free(L->rac_err);
}

static void cpu_free(qd_backend *b)
{
    cpu_ctx *c = ctx_of(b);
    for (int i = 0; i < c->nlin; i++)
        free_linear(&c->lin[i]);
    free(c->lin);
    free(c->layers);
    free(c->acts);
    free(c->info);
    free(c->params);
    free(c->grads);
    free(c->m);
    free(c->v);
    free(c->wk);
    free(c->rope_cos);
    free(c->rope_sin);
    free(c->arena);
    free(c->dg_names);
    free(c->dg_act_err);
    free(c->dg_act_norm);
    free(c->dg_weight_err);
    free(c->dg_topk);
    free(c);
}

static qd_status set_weights_impl(qd_backend *b, const float *params, size_t n)
{
    cpu_ctx *c = ctx_of(b);
    memcpy(c->params, params, sizeof(float) * n);
    c->have_forward = 0;
    return sync_weights(c);
}

static qd_status cpu_set_weights(qd_backend *b, const float *params, size_t n)
{
    int saved = threads_push(ctx_of(b));
    qd_status st = set_weights_impl(b, params, n);
    threads_pop(saved);
    return st;
}

static qd_status cpu_get_weights(qd_backend *b, float *params, size_t n)
{
    memcpy(params, ctx_of(b)->params, sizeof(float) * n);
    return QD_OK;
}

static qd_status forward_impl(qd_backend *b, const qd_batch *bt, float *logp, float *logits)
{
    cpu_ctx *c = ctx_of(b);
    int V = c->cfg.vocab_size;
    c->have_forward = 0;
    reset_diag(c);
    qd_status st = pack_batch(c, bt);
    float *lp = st ? NULL : malloc(sizeof(float) * (size_t)(c->N ? c->N : 1));
    if (!st && !lp)
        st = qd_error(QD_ERR_NOMEM, "cpu backend: log-probs");
    if (!st)
        st = model_forward(c, lp);
    if (st) {
        free(lp);
        return st;
    }
    memset(logp, 0, sizeof(float) * (size_t)bt->B * bt->T);
    if (logits)
        memset(logits, 0, sizeof(float) * (size_t)bt->B * bt->T * V);
    for (int n = 0; n < c->N; n++) {
        logp[c->src[n]] = lp[n];
        if (logits)
            memcpy(logits + (size_t)c->src[n] * V, c->logits + (size_t)n * V, sizeof(float) * V);
    }
    free(lp);
    c->have_forward = c->have_diag = 1;
    return QD_OK;
}

static qd_status cpu_forward(qd_backend *b, const qd_batch *bt, float *logp, float *logits)
{
    int saved = threads_push(ctx_of(b));
    qd_status st = forward_impl(b, bt, logp, logits);
    threads_pop(saved);
    return st;
}

static qd_status backward_impl(qd_backend *b, const float *dlogp)
{
    cpu_ctx *c = ctx_of(b);
    if (!c->have_forward)
        return qd_error(QD_ERR_ARG, "backward: no forward since the last weight change");
    for (int i = 0; i < c->nlin; i++)
        if (is_rollout_quant(c->lin[i].mode))
            return qd_error(QD_ERR_UNSUPPORTED, "backward: recipe %s has no backward in the rollout role",
                            qd_recipe_name(c->opt.recipe));
    float *d = malloc(sizeof(float) * (size_t)(c->N ? c->N : 1));
    if (!d)
        return qd_error(QD_ERR_NOMEM, "cpu backend: dlogp");
    qd_status st = qd_gather_dlogp(d, dlogp, c->src, c->N);
    if (!st)
        st = model_backward(c, d);
    free(d);
    return st;
}

static qd_status cpu_backward(qd_backend *b, const float *dlogp)
{
    int saved = threads_push(ctx_of(b));
    qd_status st = backward_impl(b, dlogp);
    threads_pop(saved);
    return st;
}

static void cpu_zero_grad(qd_backend *b)
{
    cpu_ctx *c = ctx_of(b);
    memset(c->grads, 0, sizeof(float) * c->nfloats);
}

static qd_status cpu_get_grads(qd_backend *b, float *grads, size_t n)
{
    memcpy(grads, ctx_of(b)->grads, sizeof(float) * n);
    return QD_OK;
}

static qd_status cpu_set_grads(qd_backend *b, const float *grads, size_t n)
{
    memcpy(ctx_of(b)->grads, grads, sizeof(float) * n);
    return QD_OK;
}

static qd_status optimizer_step_impl(qd_backend *b, const qd_adamw *o, int step, float *norm_out)
{
    cpu_ctx *c = ctx_of(b);
    double norm = grad_norm(c);
    if (!isfinite(norm))
        return qd_error(QD_ERR_NONFINITE, "optimizer: gradient norm is not finite");
    *norm_out = (float)norm;
    float gscale, bc1, bc2;
    qd_adamw_scalars(o, step, norm, &gscale, &bc1, &bc2);
    for (int t = 0; t < c->ninfo; t++)
        adamw_tensor(c, &c->info[t], o, gscale, bc1, bc2);
    c->have_forward = 0;
    return sync_weights(c);
}

static qd_status cpu_optimizer_step(qd_backend *b, const qd_adamw *o, int step, float *norm_out)
{
    int saved = threads_push(ctx_of(b));
    qd_status st = optimizer_step_impl(b, o, step, norm_out);
    threads_pop(saved);
    return st;
}

static qd_status cpu_diagnostics(qd_backend *b, qd_diagnostics *out)
{
    cpu_ctx *c = ctx_of(b);
    if (!c->opt.diagnostics || !c->have_diag)
        return qd_error(QD_ERR_ARG, "diagnostics: %s", c->opt.diagnostics ? "no forward yet"
                        : "not enabled in the backend options");
    int nq = 0, nmoe = 0, K = c->cfg.num_experts_per_tok;
    for (int l = 0; l < c->cfg.num_hidden_layers; l++)
        nmoe += c->layers[l].moe;
    free(c->dg_topk);
    c->dg_topk = malloc(sizeof(int32_t) * ((size_t)nmoe * c->N * K + 1));
    if (!c->dg_topk)
        return qd_error(QD_ERR_NOMEM, "cpu backend: diagnostics");
    for (int l = 0, m = 0; l < c->cfg.num_hidden_layers; l++)
        if (c->layers[l].moe)
            memcpy(c->dg_topk + (size_t)(m++) * c->N * K, c->acts[l].topk, sizeof(int32_t) * c->N * K);
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

static qd_status cpu_generate(qd_backend *b, const qd_generate_request *rq, qd_generate_result *res)
{
    int saved = threads_push(ctx_of(b));
    qd_status st = generate_impl(b, rq, res);
    threads_pop(saved);
    return st;
}

static qd_status cpu_get_adam(qd_backend *b, float *m, float *v, size_t n)
{
    memcpy(m, ctx_of(b)->m, sizeof(float) * n);
    memcpy(v, ctx_of(b)->v, sizeof(float) * n);
    return QD_OK;
}

static qd_status cpu_set_adam(qd_backend *b, const float *m, const float *v, size_t n)
{
    memcpy(ctx_of(b)->m, m, sizeof(float) * n);
    memcpy(ctx_of(b)->v, v, sizeof(float) * n);
    return QD_OK;
}

/* RAC state blob: for each RAC linear in order, int64 nrac, int64 rac_ch[in]
 * (the first nrac used), double rac_err[in]. */
static size_t cpu_rac_state_size(qd_backend *b)
{
    cpu_ctx *c = ctx_of(b);
    size_t n = 0;
    for (int i = 0; i < c->nlin; i++)
        if (c->lin[i].mode == QD_LINEAR_W4A4_RAC)
            n += qd_rac_state_bytes(c->lin[i].in);
    return n;
}

static qd_status cpu_get_rac_state(qd_backend *b, void *buf, size_t n)
{
    cpu_ctx *c = ctx_of(b);
    char *p = buf;
    for (int i = 0; i < c->nlin; i++) {
        const linear *L = &c->lin[i];
        if (L->mode != QD_LINEAR_W4A4_RAC)
            continue;
        memcpy(p, &L->nrac, sizeof(int64_t));
        memcpy(p + sizeof(int64_t), L->rac_ch, sizeof(int64_t) * (size_t)L->in);
        p += sizeof(int64_t) * (1 + (size_t)L->in);
        memcpy(p, L->rac_err, sizeof(double) * (size_t)L->in);
        p += sizeof(double) * (size_t)L->in;
    }
    return QD_OK;
}


static qd_status set_rac_impl(cpu_ctx *c, const char *p)
{
    for (int i = 0; i < c->nlin; i++) {
        linear *L = &c->lin[i];
        if (L->mode != QD_LINEAR_W4A4_RAC)
            continue;
        int64_t nrac;
        memcpy(&nrac, p, sizeof nrac);
        const char *ch = p + sizeof(int64_t);
        /* copied out first: the blob need not be aligned, and a bad set must not half-apply */
        int64_t *tmp = malloc(sizeof(int64_t) * (size_t)L->in);
        if (!tmp)
            return qd_error(QD_ERR_NOMEM, "set_rac_state");
        memcpy(tmp, ch, sizeof(int64_t) * (size_t)L->in);
        qd_status st = qd_rac_check_channels(L->name, L->in, nrac, tmp);
        if (st) {
            free(tmp);
            return st;
        }
        memcpy(L->rac_ch, tmp, sizeof(int64_t) * (size_t)L->in);
        free(tmp);
        L->nrac = nrac;
        p += sizeof(int64_t) * (1 + (size_t)L->in);
        memcpy(L->rac_err, p, sizeof(double) * (size_t)L->in);
        p += sizeof(double) * (size_t)L->in;
        qd_nvfp4_free(&L->wq);
        st = qd_nvfp4_alloc(&L->wq, L->out, L->in + L->nrac, 0);
        if (!st)
            st = qd_rac_augment_weight(&L->wq, c->params + L->w, L->out, L->in, L->rac_ch, L->nrac);
        if (st)
            return st;
    }
    c->have_forward = 0;
    return QD_OK;
}

static qd_status cpu_set_rac_state(qd_backend *b, const void *buf, size_t n)
{
    int saved = threads_push(ctx_of(b));
    qd_status st = set_rac_impl(ctx_of(b), buf);
    threads_pop(saved);
    return st;
}

static const struct qd_backend_i cpu_iface = {
    .get_name = cpu_get_name,
    .free = cpu_free,
    .set_weights = cpu_set_weights,
    .get_weights = cpu_get_weights,
    .forward = cpu_forward,
    .backward = cpu_backward,
    .zero_grad = cpu_zero_grad,
    .get_grads = cpu_get_grads,
    .optimizer_step = cpu_optimizer_step,
    .generate = cpu_generate,
    .diagnostics = cpu_diagnostics,
    .get_adam = cpu_get_adam,
    .set_adam = cpu_set_adam,
    .rac_state_size = cpu_rac_state_size,
    .get_rac_state = cpu_get_rac_state,
    .set_rac_state = cpu_set_rac_state,
    .set_grads = cpu_set_grads,
};

/* ------------------------------------------------------------------------ */
/* init                                                                      */

static qd_status alloc_linear(linear *L)
{
    if (L->mode == QD_LINEAR_FP8) {
        L->w8 = malloc((size_t)L->out * L->in);
        L->w8_inv = malloc(sizeof(float) * (size_t)L->out);
        if (!L->w8 || !L->w8_inv)
            return qd_error(QD_ERR_NOMEM, "cpu backend: fp8 weights");
    }
    if ((L->mode == QD_LINEAR_W4A4 || L->mode == QD_LINEAR_W4A4_RAC) && L->in % QD_NVFP4_BLOCK)
        return qd_error(QD_ERR_SHAPE, "cpu backend: NVFP4 needs in-features %% 16 == 0, got %d", L->in);
    if (L->mode == QD_LINEAR_W4A4_RAC) {
        L->rac_ch = calloc((size_t)L->in, sizeof(int64_t));
        L->rac_err = calloc((size_t)L->in, sizeof(double));
        if (!L->rac_ch || !L->rac_err)
            return qd_error(QD_ERR_NOMEM, "cpu backend: RAC state");
    }
    return QD_OK;
}

static qd_status alloc_model(cpu_ctx *c)
{
    size_t n = c->nfloats, nr = (size_t)c->cfg.max_position_embeddings * (c->cfg.head_dim / 2);
    c->params = calloc(n, sizeof(float));
    c->grads = calloc(n, sizeof(float));
    c->m = calloc(n, sizeof(float));
    c->v = calloc(n, sizeof(float));
    c->wk = calloc(n, sizeof(float));
    c->rope_cos = malloc(sizeof(float) * nr);
    c->rope_sin = malloc(sizeof(float) * nr);
    c->dg_names = calloc((size_t)c->nlin, sizeof(char *));
    c->dg_act_err = calloc((size_t)c->nlin, sizeof(double));
    c->dg_act_norm = calloc((size_t)c->nlin, sizeof(double));
    c->dg_weight_err = calloc((size_t)c->nlin, sizeof(double));
    if (!c->params || !c->grads || !c->m || !c->v || !c->wk || !c->rope_cos || !c->rope_sin ||
        !c->dg_names || !c->dg_act_err || !c->dg_act_norm || !c->dg_weight_err)
        return qd_error(QD_ERR_NOMEM, "cpu backend: %zu parameters", n);
    for (int i = 0; i < c->nlin; i++) {
        qd_status st = alloc_linear(&c->lin[i]);
        if (st)
            return st;
    }
    qd_rope_tables(c->rope_cos, c->rope_sin, &c->cfg);
    return sync_weights(c);
}

qd_backend *qd_backend_cpu_init(const qd_model_config *cfg, const qd_backend_options *opt)
{
    if (qd_model_config_check(cfg))
        return NULL;
    if ((unsigned)opt->recipe >= QD_RECIPE_COUNT || opt->rac_ratio < 0 || opt->rac_ratio > 1) {
        qd_error(QD_ERR_ARG, "cpu backend: bad recipe or rac_ratio");
        return NULL;
    }
    if (opt->mode != QD_MODE_EXACT) {
        qd_error(QD_ERR_UNSUPPORTED, "cpu backend: mode '%s': the CPU runs exact mode only (fast mode "
                 "is the CUDA backend's)", qd_mode_name(opt->mode) ? qd_mode_name(opt->mode) : "?");
        return NULL;
    }
    cpu_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        qd_error(QD_ERR_NOMEM, "cpu backend: context");
        return NULL;
    }
    c->cfg = *cfg;
    c->opt = *opt;
    c->acts = calloc((size_t)cfg->num_hidden_layers, sizeof(layer_acts));
    c->base.iface = &cpu_iface;
    c->base.context = c;
    if (!c->acts) {
        qd_error(QD_ERR_NOMEM, "cpu backend: layers");
        cpu_free(&c->base);
        return NULL;
    }
    if (build_params(c)) {
        cpu_free(&c->base);
        return NULL;
    }
    c->base.params = c->info;
    c->base.num_params = c->ninfo;
    c->base.num_floats = c->nfloats;
    if (alloc_model(c)) {
        cpu_free(&c->base);
        return NULL;
    }
    return &c->base;
}
