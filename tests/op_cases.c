/* The op cases of tests/op_cases.h: each draws its inputs from a seed,
 * uploads them through the ops table, runs one slot and downloads its
 * outputs. Shapes avoid tile multiples on purpose (37 rows, 45 outputs, an
 * empty expert group) so edges are exercised. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/op_cases.h"
#include "backends/layout.h"
#include "quant/splitmix64.h"

typedef struct {
    const qd_ops *ops;
    void *dev;
    uint64_t rng;
    void *mem[96];
    int nmem;
    qd_op_result *res;
    qd_status st;          /* the first failure of a helper */
} oc;

static float unif(oc *c, float lo, float hi)
{
    return lo + (hi - lo) * (float)qd_splitmix64_unit(&c->rng);
}

static int irand(oc *c, int n) { return (int)(qd_splitmix64_next(&c->rng) % (uint64_t)n); }

static void *dalloc(oc *c, size_t bytes)
{
    void *p = NULL;
    if (c->st || c->nmem == (int)(sizeof c->mem / sizeof c->mem[0]))
        return c->st ? NULL : (c->st = qd_error(QD_ERR_NOMEM, "op case: too many buffers"), NULL);
    c->st = c->ops->alloc(c->dev, &p, bytes, "op case");
    if (!c->st)
        c->mem[c->nmem++] = p;
    return p;
}

/* A dev copy of n host bytes. */
static void *up(oc *c, const void *host, size_t bytes)
{
    void *p = dalloc(c, bytes);
    if (p && !c->st)
        c->st = c->ops->to_dev(c->dev, p, host, bytes);
    return p;
}

/* n random floats in [lo, hi) on the device (host copy in *h if asked, caller frees). */
static float *F(oc *c, size_t n, float lo, float hi)
{
    float *h = malloc(sizeof(float) * (n ? n : 1));
    if (!h) {
        c->st = qd_error(QD_ERR_NOMEM, "op case");
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        h[i] = unif(c, lo, hi);
    float *d = up(c, h, sizeof(float) * n);
    free(h);
    return d;
}

static int32_t *I(oc *c, const int32_t *host, size_t n) { return up(c, host, sizeof(int32_t) * n); }

static void *Z(oc *c, size_t bytes) { return dalloc(c, bytes); }

/* Registers a dev (or host, when host is set) output. */
static void out_(oc *c, const char *name, char kind, const void *p, size_t bytes, int host)
{
    if (c->st)
        return;
    if (c->res->nout == (int)(sizeof c->res->out / sizeof c->res->out[0])) {
        c->st = qd_error(QD_ERR_ARG, "op case: too many outputs (at %s)", name);
        return;
    }
    qd_op_output *o = &c->res->out[c->res->nout++];
    snprintf(o->name, sizeof o->name, "%s", name);
    o->kind = kind;
    o->bytes = bytes;
    o->data = malloc(bytes ? bytes : 1);
    if (!o->data)
        c->st = qd_error(QD_ERR_NOMEM, "op case");
    else if (host)
        memcpy(o->data, p, bytes);
    else
        c->st = c->ops->to_host(c->dev, o->data, p, bytes);
}

#define OUT(c, name, kind, p, bytes) out_((c), (name), (kind), (p), (bytes), 0)
#define OUT_HOST(c, name, kind, p, bytes) out_((c), (name), (kind), (p), (bytes), 1)
#define RUN(c, call) do { if (!(c)->st) (c)->st = (call); } while (0)

/* A dev NVFP4 matrix. */
static qd_nvfp4 nv(oc *c, int64_t rows, int64_t cols, qd_scale_kind scale)
{
    qd_nvfp4 q = {.rows = rows, .cols = cols, .per_row = scale};
    q.codes = Z(c, (size_t)(rows * cols / 2));
    q.scales = Z(c, (size_t)(rows * cols / 16));
    q.s_dec = Z(c, sizeof(float) * (size_t)(scale == QD_SCALE_PER_ROW ? rows : 1));
    return q;
}

static void out_nv(oc *c, const char *name, const qd_nvfp4 *q)
{
    char n[32];
    snprintf(n, sizeof n, "%s.codes", name);
    OUT(c, n, 'b', q->codes, (size_t)(q->rows * q->cols / 2));
    snprintf(n, sizeof n, "%s.scales", name);
    OUT(c, n, 'b', q->scales, (size_t)(q->rows * q->cols / 16));
    snprintf(n, sizeof n, "%s.s_dec", name);
    OUT(c, n, 'f', q->s_dec, sizeof(float) * (size_t)(q->per_row ? q->rows : 1));
}

/* n distinct ascending values of [0, K) (a RAC channel set) as int64. */
static int64_t *channels(oc *c, int K, int n)
{
    int64_t h[4096];
    int take = 0;
    for (int k = 0; k < K && take < n; k++)
        if (irand(c, K - k) < n - take)
            h[take++] = k;
    return up(c, h, sizeof(int64_t) * (size_t)n);
}

/* Each token's K distinct experts of E (rank order) and positive weights. */
static void routing(oc *c, int32_t *topk, float *topw, int N, int E, int K)
{
    for (int n = 0; n < N; n++)
        for (int j = 0; j < K; j++) {
            int e, dup;
            do {
                e = irand(c, E);
                dup = 0;
                for (int i = 0; i < j; i++)
                    dup |= topk[n * K + i] == e;
            } while (dup);
            topk[n * K + j] = e;
            topw[n * K + j] = unif(c, 0.05f, 1.0f);
        }
}

/* The rows of N tokens x K grouped as qd_moe_group lays them out (host);
 * with row_tok non-NULL (N * K) each row's token too. */
static void rows_of(int32_t *tok_rows, int32_t *row_rank, int32_t *exp_off, const int32_t *topk, const float *topw,
                    int N, int E, int K, int32_t *row_tok)
{
    int32_t *rt = row_tok ? row_tok : malloc(sizeof(int32_t) * N * K), *cnt = malloc(sizeof(int32_t) * E);
    float *row_w = malloc(sizeof(float) * N * K);
    if (rt && cnt && row_w)
        qd_moe_group(exp_off, rt, row_w, row_rank, tok_rows, cnt, topk, topw, N, E, K);
    if (!row_tok)
        free(rt);
    free(cnt);
    free(row_w);
}

/* ------------------------------------------------------------------------ */
/* the cases                                                                 */

static void c_round_bf16(oc *c)
{
    size_t n = 1001;
    float *x = F(c, n, -3e5f, 3e5f), *y = Z(c, sizeof(float) * n);
    RUN(c, c->ops->round_bf16(c->dev, y, x, n));
    OUT(c, "y", 'f', y, sizeof(float) * n);
}

static void c_add(oc *c)
{
    size_t n = 777;
    float *a = F(c, n, -2, 2), *b = F(c, n, -2, 2), *y = Z(c, sizeof(float) * n);
    RUN(c, c->ops->add(c->dev, y, a, b, n));
    OUT(c, "y", 'f', y, sizeof(float) * n);
}

static void c_embed_shape(oc *c, int V, int C, int N)
{
    int32_t tok[1024];
    if (N > 1024)
        N = 1024;
    for (int n = 0; n < N; n++)
        tok[n] = n == 3 ? tok[1] : irand(c, V); /* a repeated token */
    float *emb = F(c, (size_t)V * C, -1, 1), *x = Z(c, sizeof(float) * N * C), *g = F(c, (size_t)V * C, -1, 1);
    float *dres = F(c, (size_t)N * C, -1, 1);
    int32_t *dt = I(c, tok, N);
    RUN(c, c->ops->embed(c->dev, x, emb, dt, N, C));
    RUN(c, c->ops->embed_backward(c->dev, g, dres, dt, N, C));
    OUT(c, "x", 'f', x, sizeof(float) * N * C);
    OUT(c, "gemb", 'f', g, sizeof(float) * V * C);
}

static void c_embed(oc *c) { c_embed_shape(c, 50, 64, 9); }
/* few distinct tokens over many rows: repeats within and across CUDA's
 * batches of 16 tokens, a ragged last batch */
static void c_embed_repeats(oc *c) { c_embed_shape(c, 5, 72, 77); }
/* past QDK_EMBED_SORT_MIN rows, where CUDA sorts the tokens first: runs of a
 * token longer than its batches of loads, a width past a multiple of 128; and
 * many tokens of short runs */
static void c_embed_sorted(oc *c) { c_embed_shape(c, 9, 200, 700); }
static void c_embed_sorted_many(oc *c) { c_embed_shape(c, 500, 136, 600); }

/* flags QD_BWD_DX_SET: dx, random on entry, is overwritten (as adding into zeros) */
static void c_rmsnorm_shape_f(oc *c, int rows, int C, int flags)
{
    float *x = F(c, (size_t)rows * C, -2, 2), *w = F(c, C, 0.5f, 1.5f), *y = Z(c, sizeof(float) * rows * C);
    float *r = Z(c, sizeof(float) * rows), *dy = F(c, (size_t)rows * C, -1, 1);
    float *dx = F(c, (size_t)rows * C, -1, 1), *dw = F(c, C, -1, 1);
    RUN(c, c->ops->rmsnorm(c->dev, y, r, x, w, rows, C, 1e-6f));
    RUN(c, c->ops->rmsnorm_backward(c->dev, dx, dw, dy, x, w, r, rows, C, flags));
    OUT(c, "y", 'f', y, sizeof(float) * rows * C);
    OUT(c, "rstd", 'f', r, sizeof(float) * rows);
    OUT(c, "dx", 'f', dx, sizeof(float) * rows * C);
    OUT(c, "dw", 'f', dw, sizeof(float) * C);
}

static void c_rmsnorm_shape(oc *c, int rows, int C) { c_rmsnorm_shape_f(c, rows, C, 0); }
/* fast mode's chunked dw (more than QDK_RMSNORM_CHUNK rows) with dx set */
static void c_rmsnorm_set(oc *c) { c_rmsnorm_shape_f(c, 700, 136, QD_BWD_DX_SET); }

static void c_rmsnorm(oc *c) { c_rmsnorm_shape(c, 9, 80); }
/* a row width not a multiple of 4 (CUDA stages the squares after the row,
 * from the next 16-byte boundary) */
static void c_rmsnorm_odd(oc *c) { c_rmsnorm_shape(c, 3, 2050); }
/* Enough rows for several of CUDA's stages of dw (1024 rows) and of fast
 * mode's chunks (512 rows), ragged at the end: the q/k norms' width, and a
 * width past a multiple of 32. */
static void c_rmsnorm_tall(oc *c) { c_rmsnorm_shape(c, 3000, 128); }
static void c_rmsnorm_wide(oc *c) { c_rmsnorm_shape(c, 700, 2050); }
/* CUDA's rows kernel (C <= 256, 32 rows a block) at its widest, a width not
 * a multiple of 32 and a ragged last block */
static void c_rmsnorm_rows(oc *c) { c_rmsnorm_shape(c, 77, 250); }

static void c_rope_shape(oc *c, int N, int nh, int D)
{
    enum { P = 12 };
    int32_t pos[64];
    for (int n = 0; n < N && n < 64; n++)
        pos[n] = (n * 7 + 3) % P;
    float *cs = F(c, (size_t)P * D / 2, -1, 1), *sn = F(c, (size_t)P * D / 2, -1, 1);
    float *x = F(c, (size_t)N * nh * D, -2, 2), *g = F(c, (size_t)N * nh * D, -2, 2);
    int32_t *dp = I(c, pos, N);
    RUN(c, c->ops->rope(c->dev, x, dp, cs, sn, N, nh, D, QD_ROPE_FORWARD));
    RUN(c, c->ops->rope(c->dev, g, dp, cs, sn, N, nh, D, QD_ROPE_INVERSE));
    OUT(c, "forward", 'f', x, sizeof(float) * N * nh * D);
    OUT(c, "inverse", 'f', g, sizeof(float) * N * nh * D);
}

static void c_rope(oc *c) { c_rope_shape(c, 5, 3, 16); }
/* a head of 128 (64 pairs: two passes of a warp's lanes in CUDA's rows
 * kernel) over 9 x 5 rows (a ragged last block of 8 rows) */
static void c_rope_wide(oc *c) { c_rope_shape(c, 9, 5, 128); }

/* The fused rows ops (ops.h), their outputs against the CPU's (which runs the
 * ops they stand for): add_rmsnorm; combine_add_rmsnorm over a valid routing
 * of N tokens to E experts; qk_norm_rope with the caches (Tc positions of 3
 * rows) or without. */
/* quant: the normalized rows quantized too (C a multiple of 16) */
static void c_add_rmsnorm_shape(oc *c, int rows, int C, int quant)
{
    float *a = F(c, (size_t)rows * C, -2, 2), *b = F(c, (size_t)rows * C, -2, 2), *w = F(c, C, 0.5f, 1.5f);
    float *sum = Z(c, sizeof(float) * rows * C), *y = Z(c, sizeof(float) * rows * C), *r = Z(c, sizeof(float) * rows);
    qd_nvfp4 q = quant ? nv(c, rows, C, QD_SCALE_PER_ROW) : (qd_nvfp4){0};
    RUN(c, c->ops->add_rmsnorm(c->dev, sum, y, r, a, b, w, rows, C, 1e-6f, quant ? &q : NULL));
    OUT(c, "sum", 'f', sum, sizeof(float) * rows * C);
    OUT(c, "y", 'f', y, sizeof(float) * rows * C);
    OUT(c, "rstd", 'f', r, sizeof(float) * rows);
    if (quant)
        out_nv(c, "q", &q);
}

static void c_add_rmsnorm(oc *c) { c_add_rmsnorm_shape(c, 9, 80, 0); }
static void c_add_rmsnorm_wide(oc *c) { c_add_rmsnorm_shape(c, 5, 2050, 0); }
/* with the quantizer: 200 rows (more CTAs than an H100's SMs: qk_rows_kernel's
 * other thread count) of a3b's 2048 */
static void c_add_rmsnorm_q(oc *c) { c_add_rmsnorm_shape(c, 200, 2048, 1); }

/* swiglu_nvfp4 over rows of I (decode's down-projection input) */
static void c_swiglu_nvfp4_shape(oc *c, int rows, int I)
{
    float *g = F(c, (size_t)rows * I, -4, 4), *u = F(c, (size_t)rows * I, -2, 2), *h = Z(c, sizeof(float) * rows * I);
    qd_nvfp4 q = nv(c, rows, I, QD_SCALE_PER_ROW);
    RUN(c, c->ops->swiglu_nvfp4(c->dev, &q, h, g, u, rows, I));
    OUT(c, "h", 'f', h, sizeof(float) * rows * I);
    out_nv(c, "q", &q);
}

static void c_swiglu_nvfp4(oc *c) { c_swiglu_nvfp4_shape(c, 7, 48); }
static void c_swiglu_nvfp4_wide(oc *c) { c_swiglu_nvfp4_shape(c, 300, 768); }

/* gather_nvfp4: the experts' gate/up input of one valid routing of N tokens,
 * gathered and quantized; keep 0: xe not compared (a backend may leave it
 * unwritten), only the codes */
static void c_gather_nvfp4_keep(oc *c, int N, int E, int K, int C, int keep)
{
    int R = N * K;
    int32_t topk[N * K], tok_rows[R], row_rank[R], exp_off[E + 1], row_tok[R];
    float topw[N * K];
    routing(c, topk, topw, N, E, K);
    rows_of(tok_rows, row_rank, exp_off, topk, topw, N, E, K, row_tok);
    float *x = F(c, (size_t)N * C, -3, 3), *xe = Z(c, sizeof(float) * R * C);
    qd_nvfp4 q = nv(c, R, C, QD_SCALE_PER_ROW);
    RUN(c, c->ops->gather_nvfp4(c->dev, &q, xe, x, I(c, row_tok, R), R, C, keep));
    if (keep)
        OUT(c, "xe", 'f', xe, sizeof(float) * R * C);
    out_nv(c, "q", &q);
}

static void c_gather_nvfp4_shape(oc *c, int N, int E, int K, int C) { c_gather_nvfp4_keep(c, N, E, K, C, 1); }

static void c_gather_nvfp4(oc *c) { c_gather_nvfp4_shape(c, 9, 6, 2, 80); }
/* a decode's 64 tokens, 8 of a3b's 128 experts each */
static void c_gather_nvfp4_b64(oc *c) { c_gather_nvfp4_shape(c, 64, 128, 8, 2048); }
/* the same rows only quantized (a generate's step: CUDA by default from each
 * token's row directly, no float copy; QUADS_GATHER_DROP=0 writes it) */
static void c_gather_nvfp4_drop(oc *c) { c_gather_nvfp4_keep(c, 64, 128, 8, 2048, 0); }
static void c_gather_nvfp4_drop80(oc *c) { c_gather_nvfp4_keep(c, 9, 6, 2, 80, 0); }

static void c_combine_norm_shape(oc *c, int N, int E, int K, int C, int quant)
{
    int R = N * K;
    int32_t topk[N * K], tok_rows[R], row_rank[R], exp_off[E + 1];
    float topw[N * K];
    routing(c, topk, topw, N, E, K);
    rows_of(tok_rows, row_rank, exp_off, topk, topw, N, E, K, NULL);
    float *y = F(c, (size_t)R * C, -2, 2), *rw = F(c, R, 0.1f, 1), *res = F(c, (size_t)N * C, -2, 2);
    float *w = F(c, C, 0.5f, 1.5f), *sum = Z(c, sizeof(float) * N * C), *out = Z(c, sizeof(float) * N * C);
    float *r = Z(c, sizeof(float) * N);
    qd_nvfp4 q = quant ? nv(c, N, C, QD_SCALE_PER_ROW) : (qd_nvfp4){0};
    RUN(c, c->ops->combine_add_rmsnorm(c->dev, sum, out, r, res, y, rw, I(c, tok_rows, R), N, K, C, w, 1e-6f,
                                       quant ? &q : NULL));
    OUT(c, "sum", 'f', sum, sizeof(float) * N * C);
    OUT(c, "y", 'f', out, sizeof(float) * N * C);
    OUT(c, "rstd", 'f', r, sizeof(float) * N);
    if (quant)
        out_nv(c, "q", &q);
}

static void c_combine_norm(oc *c) { c_combine_norm_shape(c, 9, 6, 2, 80, 1); }
/* a3b's 8 of 128 experts a token over a width not a multiple of 4 */
static void c_combine_norm_wide(oc *c) { c_combine_norm_shape(c, 5, 128, 8, 2050, 0); }
/* and over its width, quantized: a decode's 64 rows */
static void c_combine_norm_q(oc *c) { c_combine_norm_shape(c, 64, 128, 8, 2048, 1); }
/* moe8's 4 of 32 experts a token at its width (the fused sums' K 4 form) */
static void c_combine_norm_k4(oc *c) { c_combine_norm_shape(c, 300, 32, 4, 1024, 0); }

static void c_qk_norm_rope_shape(oc *c, int N, int H, int KV, int D, int cache)
{
    enum { Tc = 12 };
    int32_t pos[64], row[64];
    for (int n = 0; n < N && n < 64; n++) {
        pos[n] = (n * 7 + 3) % Tc;
        row[n] = n % 3;
    }
    size_t nq = (size_t)N * H * D, nk = (size_t)N * KV * D, cz = (size_t)3 * Tc * KV * D;
    qd_qk_args a = {0};
    a.q = F(c, nq, -2, 2), a.k = F(c, nk, -2, 2), a.v = F(c, nk, -2, 2);
    a.wq = F(c, D, 0.5f, 1.5f), a.wk = F(c, D, 0.5f, 1.5f);
    a.cosb = F(c, (size_t)Tc * D / 2, -1, 1), a.sinb = F(c, (size_t)Tc * D / 2, -1, 1);
    a.qr = Z(c, sizeof(float) * nq), a.kr = Z(c, sizeof(float) * nk);
    a.rstd_q = Z(c, sizeof(float) * N * H), a.rstd_k = Z(c, sizeof(float) * N * KV);
    a.pos = I(c, pos, N), a.row = I(c, row, N);
    a.N = N, a.H = H, a.KV = KV, a.D = D, a.eps = 1e-6f, a.Tc = Tc;
    if (cache) {
        a.kc = Z(c, sizeof(float) * cz);
        a.vc = Z(c, sizeof(float) * cz);
    }
    RUN(c, c->ops->qk_norm_rope(c->dev, &a));
    OUT(c, "qr", 'f', a.qr, sizeof(float) * nq);
    OUT(c, "kr", 'f', a.kr, sizeof(float) * nk);
    OUT(c, "rstd_q", 'f', a.rstd_q, sizeof(float) * N * H);
    OUT(c, "rstd_k", 'f', a.rstd_k, sizeof(float) * N * KV);
    if (cache) {
        OUT(c, "kc", 'f', a.kc, sizeof(float) * cz);
        OUT(c, "vc", 'f', a.vc, sizeof(float) * cz);
    }
}

static void c_qk_norm_rope(oc *c) { c_qk_norm_rope_shape(c, 5, 4, 2, 16, 1); }
/* a3b's heads (32 / 4 of 128) for 3 tokens (a ragged last block of 8 rows) */
static void c_qk_norm_rope_wide(oc *c) { c_qk_norm_rope_shape(c, 3, 32, 4, 128, 1); }
/* a prefill's rows (no cache), heads of 64 */
static void c_qk_norm_rope_nocache(oc *c) { c_qk_norm_rope_shape(c, 40, 3, 1, 64, 0); }

static void c_matmul_shape(oc *c, qd_prec prec, int N, int IC, int OC, float range)
{
    float *x = F(c, (size_t)N * IC, -range, range), *w = F(c, (size_t)OC * IC, -range, range);
    float *y = Z(c, sizeof(float) * N * OC);
    if (prec == QD_PREC_BF16) {  /* operands that are BF16 values, as the recipe makes them */
        RUN(c, c->ops->round_bf16(c->dev, x, x, (size_t)N * IC));
        RUN(c, c->ops->round_bf16(c->dev, w, w, (size_t)OC * IC));
    }
    RUN(c, c->ops->matmul(c->dev, y, x, w, N, IC, OC, prec));
    OUT(c, "y", 'f', y, sizeof(float) * N * OC);
}

static void c_matmul_f32(oc *c) { c_matmul_shape(c, QD_PREC_F32, 37, 72, 45, 1.0f); }
static void c_matmul_bf16(oc *c) { c_matmul_shape(c, QD_PREC_BF16, 37, 72, 45, 1.0f); }
/* In-features not a multiple of 8: CUDA's exact path is then qdk_matmul (QDK_NT). */
static void c_matmul_f32_odd(oc *c) { c_matmul_shape(c, QD_PREC_F32, 37, 36, 45, 1.0f); }
/* Tiles of every size at once: rows over 64, columns over 128, K not a
 * multiple of 32 (CUDA's qdk_matmul_wt and its fused multiply-add path). */
static void c_matmul_bf16_wide(oc *c) { c_matmul_shape(c, QD_PREC_BF16, 70, 136, 300, 1.0f); }
/* BF16 operands near 2^-70: their products fall below float32's normal range
 * and round, so a fused multiply-add would give other bits; CUDA must see it. */
static void c_matmul_bf16_tiny(oc *c) { c_matmul_shape(c, QD_PREC_BF16, 9, 64, 140, 1e-21f); }
/* The MoE router's shape at batch 64 (CUDA: the thin tiles, 32 outputs a CTA) */
static void c_matmul_router(oc *c) { c_matmul_shape(c, QD_PREC_BF16, 64, 2048, 128, 1.0f); }
/* float32 operands (no fused multiply-add), K not a multiple of 32, ragged tiles */
static void c_matmul_f32_thin(oc *c) { c_matmul_shape(c, QD_PREC_F32, 33, 520, 70, 1.0f); }
/* one and three rows over many outputs (the lm_head at batch 1): the thin tiles, ragged N */
static void c_matmul_bf16_row1(oc *c) { c_matmul_shape(c, QD_PREC_BF16, 1, 256, 2085, 1.0f); }
static void c_matmul_f32_row3(oc *c) { c_matmul_shape(c, QD_PREC_F32, 3, 136, 1100, 1.0f); }
/* the router at batch 1 (CUDA: 32-row CTAs, 512-byte chunks) and two rows over
 * outputs enough for 128-row CTAs, K ragged against both chunk sizes */
static void c_matmul_bf16_router1(oc *c) { c_matmul_shape(c, QD_PREC_BF16, 1, 2048, 128, 1.0f); }
/* one row over few outputs, ragged against CUDA's 4-row chain CTAs
 * (k_matvec_chain): float32 and BF16 weights */
static void c_matmul_f32_row1_chain(oc *c) { c_matmul_shape(c, QD_PREC_F32, 1, 264, 70, 1.0f); }
static void c_matmul_bf16_row1_chain(oc *c) { c_matmul_shape(c, QD_PREC_BF16, 1, 776, 37, 1.0f); }
static void c_matmul_bf16_row2_wide(oc *c) { c_matmul_shape(c, QD_PREC_BF16, 2, 264, 4500, 1.0f); }

/* dx and dw random on entry: added to (flags 0) or dx overwritten (QD_BWD_DX_SET) */
static void c_matmul_backward_f(oc *c, int flags)
{
    int N = 37, IC = 72, OC = 45;
    float *x = F(c, (size_t)N * IC, -1, 1), *w = F(c, (size_t)OC * IC, -1, 1), *dy = F(c, (size_t)N * OC, -1, 1);
    float *dx = F(c, (size_t)N * IC, -1, 1), *dw = F(c, (size_t)OC * IC, -1, 1);
    RUN(c, c->ops->matmul_backward(c->dev, dx, dw, dy, x, w, N, IC, OC, flags));
    OUT(c, "dx", 'f', dx, sizeof(float) * N * IC);
    OUT(c, "dw", 'f', dw, sizeof(float) * OC * IC);
}

static void c_matmul_backward(oc *c) { c_matmul_backward_f(c, 0); }
static void c_matmul_backward_set(oc *c) { c_matmul_backward_f(c, QD_BWD_DX_SET); }

/* every dimension a multiple of 8: fast mode's BF16 backward (the CUDA
 * backend's dy a block of columns at a time; run_all.sh makes the blocks 8
 * columns wide once with QUADS_DY16_BYTES: the first block sets dx, the
 * others add) */
static void c_matmul_backward8_f(oc *c, int flags)
{
    int N = 40, IC = 72, OC = 48;
    float *x = F(c, (size_t)N * IC, -1, 1), *w = F(c, (size_t)OC * IC, -1, 1), *dy = F(c, (size_t)N * OC, -1, 1);
    float *dx = F(c, (size_t)N * IC, -1, 1), *dw = F(c, (size_t)OC * IC, -1, 1);
    RUN(c, c->ops->round_bf16(c->dev, x, x, (size_t)N * IC)); /* x and w BF16 values, as the recipes make them */
    RUN(c, c->ops->round_bf16(c->dev, w, w, (size_t)OC * IC));
    RUN(c, c->ops->matmul_backward(c->dev, dx, dw, dy, x, w, N, IC, OC, flags));
    OUT(c, "dx", 'f', dx, sizeof(float) * N * IC);
    OUT(c, "dw", 'f', dw, sizeof(float) * OC * IC);
}

static void c_matmul_backward8(oc *c) { c_matmul_backward8_f(c, 0); }
static void c_matmul_backward8_set(oc *c) { c_matmul_backward8_f(c, QD_BWD_DX_SET); }

enum { GE = 4 };
static const int32_t goff[GE + 1] = {0, 5, 5, 17, 20}; /* expert 1 has no rows */

/* The experts' products and their backward over the rows goff (scaled by
 * rows_x). Under QD_PREC_BF16 x and w are BF16 values, as the recipe makes
 * them; dy stays float32 (CUDA's fast mode reads it as TF32 under BF16
 * recipes). */
static void c_matmul_grouped_shape(oc *c, qd_prec prec, int rows_x, int IC, int OC)
{
    int32_t off[GE + 1];
    for (int e = 0; e <= GE; e++)
        off[e] = goff[e] * rows_x;
    int R = off[GE];
    const float *w[GE];
    float *dw[GE];
    for (int e = 0; e < GE; e++) {
        float *we = F(c, (size_t)OC * IC, -1, 1);
        if (prec == QD_PREC_BF16)
            RUN(c, c->ops->round_bf16(c->dev, we, we, (size_t)OC * IC));
        w[e] = we;
        dw[e] = F(c, (size_t)OC * IC, -1, 1);
    }
    float *x = F(c, (size_t)R * IC, -1, 1), *y = Z(c, sizeof(float) * R * OC), *dy = F(c, (size_t)R * OC, -1, 1);
    float *dx = F(c, (size_t)R * IC, -1, 1);
    if (prec == QD_PREC_BF16)
        RUN(c, c->ops->round_bf16(c->dev, x, x, (size_t)R * IC));
    RUN(c, c->ops->matmul_grouped(c->dev, y, x, w, off, GE, IC, OC, prec));
    RUN(c, c->ops->matmul_grouped_backward(c->dev, dx, dw, dy, x, w, off, GE, IC, OC));
    OUT(c, "y", 'f', y, sizeof(float) * R * OC);
    OUT(c, "dx", 'f', dx, sizeof(float) * R * IC);
    for (int e = 0; e < GE; e++)
        OUT(c, e == 0 ? "dw0" : e == 1 ? "dw1" : e == 2 ? "dw2" : "dw3", 'f', dw[e], sizeof(float) * OC * IC);
}

static void c_matmul_grouped(oc *c) { c_matmul_grouped_shape(c, QD_PREC_F32, 1, 48, 40); }
static void c_matmul_grouped_bf16(oc *c) { c_matmul_grouped_shape(c, QD_PREC_BF16, 1, 48, 40); }
/* tensor-core tiles: 100, 0, 240 and 60 rows an expert; K 256 forward, 200 in dx, the rows in dw */
static void c_matmul_grouped_wide(oc *c) { c_matmul_grouped_shape(c, QD_PREC_BF16, 20, 256, 200); }

/* The experts on BF16 activations (ops.h's experts16 slots) where a backend
 * has them, else the float32 route they stand for: gather then round_bf16,
 * the grouped product and its backward, swiglu then round_bf16. Outputs: y,
 * dx, dw, and the SwiGLU's BF16 bits (from the host's float32 copy where the
 * route is float32). tok picks rows of x out of order, as routing does. */
static void c_experts16(oc *c)
{
    int N = 9, IC = 48, OC = 40, R = goff[GE] * 2;
    int32_t off[GE + 1], tok[64];
    for (int e = 0; e <= GE; e++)
        off[e] = goff[e] * 2;
    for (int r = 0; r < R; r++)
        tok[r] = (r * 5 + 3) % N;
    const float *w[GE];
    float *dw[GE];
    for (int e = 0; e < GE; e++) {
        float *we = F(c, (size_t)OC * IC, -1, 1);
        RUN(c, c->ops->round_bf16(c->dev, we, we, (size_t)OC * IC));
        w[e] = we;
        dw[e] = F(c, (size_t)OC * IC, -1, 1);
    }
    float *x = F(c, (size_t)N * IC, -2, 2), *xe = Z(c, sizeof(float) * R * IC), *y = Z(c, sizeof(float) * R * OC);
    float *dy = F(c, (size_t)R * OC, -1, 1), *dx = F(c, (size_t)R * IC, -1, 1);
    float *g = F(c, (size_t)R * OC, -4, 4), *u = F(c, (size_t)R * OC, -2, 2), *h = Z(c, sizeof(float) * R * OC);
    int32_t *dt = I(c, tok, (size_t)R);
    uint16_t *hb = malloc(sizeof(uint16_t) * (size_t)R * OC);
    float *hf = malloc(sizeof(float) * (size_t)R * OC);
    if (!hb || !hf) {
        c->st = c->st ? c->st : qd_error(QD_ERR_NOMEM, "op case");
        free(hb), free(hf);
        return;
    }
    if (c->ops->gather16 && c->ops->swiglu16 && c->ops->matmul_grouped16 && c->ops->matmul_grouped_backward16) {
        RUN(c, c->ops->gather16(c->dev, (uint16_t *)xe, x, dt, R, IC));
        RUN(c, c->ops->matmul_grouped16(c->dev, y, (const uint16_t *)xe, w, off, GE, IC, OC, QD_PREC_BF16));
        RUN(c, c->ops->matmul_grouped_backward16(c->dev, dx, dw, dy, (const uint16_t *)xe, w, off, GE, IC, OC));
        RUN(c, c->ops->swiglu16(c->dev, (uint16_t *)h, g, u, (size_t)R * OC));
        if (!c->st)
            c->st = c->ops->to_host(c->dev, hb, h, sizeof(uint16_t) * (size_t)R * OC);
    } else {
        RUN(c, c->ops->gather(c->dev, xe, x, dt, R, IC));
        RUN(c, c->ops->round_bf16(c->dev, xe, xe, (size_t)R * IC));
        RUN(c, c->ops->matmul_grouped(c->dev, y, xe, w, off, GE, IC, OC, QD_PREC_BF16));
        RUN(c, c->ops->matmul_grouped_backward(c->dev, dx, dw, dy, xe, w, off, GE, IC, OC));
        RUN(c, c->ops->swiglu(c->dev, h, g, u, (size_t)R * OC));
        RUN(c, c->ops->round_bf16(c->dev, h, h, (size_t)R * OC));
        if (!c->st)
            c->st = c->ops->to_host(c->dev, hf, h, sizeof(float) * (size_t)R * OC);
        for (int i = 0; i < R * OC && !c->st; i++) {
            uint32_t b;
            memcpy(&b, &hf[i], sizeof b);
            hb[i] = (uint16_t)(b >> 16); /* a BF16 value: its top half is its bits */
        }
    }
    OUT(c, "y", 'f', y, sizeof(float) * R * OC);
    OUT(c, "dx", 'f', dx, sizeof(float) * R * IC);
    for (int e = 0; e < GE; e++)
        OUT(c, e == 0 ? "dw0" : e == 1 ? "dw1" : e == 2 ? "dw2" : "dw3", 'f', dw[e], sizeof(float) * OC * IC);
    OUT_HOST(c, "h bits", 'b', hb, sizeof(uint16_t) * (size_t)R * OC);
    free(hb), free(hf);
}

static void c_fp8(oc *c)
{
    int M = 6, N = 20, K = 48;
    float *x = F(c, (size_t)M * K, -3, 3), *w = F(c, (size_t)N * K, -1, 1), *y = Z(c, sizeof(float) * M * N);
    uint8_t *qa = Z(c, (size_t)M * K), *qw = Z(c, (size_t)N * K);
    float *sa = Z(c, sizeof(float) * M), *sw = Z(c, sizeof(float) * N);
    RUN(c, c->ops->fp8_quantize_rows(c->dev, qa, sa, x, M, K));
    RUN(c, c->ops->fp8_quantize_rows(c->dev, qw, sw, w, N, K));
    RUN(c, c->ops->fp8_gemm(c->dev, y, qa, sa, qw, sw, M, N, K));
    OUT(c, "qa", 'b', qa, (size_t)M * K);
    OUT(c, "sa", 'f', sa, sizeof(float) * M);
    OUT(c, "y", 'f', y, sizeof(float) * M * N);
}

/* fp8_gemm_grouped of E experts (N, K) over the rows off (E + 1 entries) */
static void fp8_grouped_case(oc *c, const int32_t *off, int E, int N, int K)
{
    const uint8_t *qw[8];
    const float *sw[8];
    int R = off[E];
    for (int e = 0; e < E; e++) {
        float *w = F(c, (size_t)N * K, -1, 1);
        uint8_t *q = Z(c, (size_t)N * K);
        float *s = Z(c, sizeof(float) * N);
        RUN(c, c->ops->fp8_quantize_rows(c->dev, q, s, w, N, K));
        qw[e] = q;
        sw[e] = s;
    }
    float *x = F(c, (size_t)R * K, -2, 2), *y = Z(c, sizeof(float) * R * N), *sa = Z(c, sizeof(float) * R);
    uint8_t *qa = Z(c, (size_t)R * K);
    RUN(c, c->ops->fp8_quantize_rows(c->dev, qa, sa, x, R, K));
    RUN(c, c->ops->fp8_gemm_grouped(c->dev, y, qa, sa, qw, sw, off, E, N, K));
    OUT(c, "y", 'f', y, sizeof(float) * R * N);
}

static void c_fp8_grouped(oc *c) { fp8_grouped_case(c, goff, GE, 24, 32); }

/* The shapes of the tensor-core kernel's edges (fast mode, QUADS_FP8_GROUPED=1):
 * an empty expert, 1 to 70 rows (one to eight row tiles, two row blocks), N
 * past a 64-row tile, K = 2 * 128 + 16 (a last stage of one 16-byte copy). */
static void c_fp8_grouped_wide(oc *c)
{
    static const int32_t off[6] = {0, 3, 3, 13, 83, 84};
    fp8_grouped_case(c, off, 5, 80, 272);
}

static void c_nvfp4(oc *c)
{
    int rows = 7, cols = 96;
    float *x = F(c, (size_t)rows * cols, -4, 4), *xh = Z(c, sizeof(float) * rows * cols);
    float *wh = Z(c, sizeof(float) * rows * cols);
    qd_nvfp4 a = nv(c, rows, cols, QD_SCALE_PER_ROW), w = nv(c, rows, cols, QD_SCALE_PER_TENSOR);
    RUN(c, c->ops->nvfp4_quantize(c->dev, &a, x));
    RUN(c, c->ops->nvfp4_quantize(c->dev, &w, x));
    RUN(c, c->ops->nvfp4_fake_quant(c->dev, xh, x, rows, cols, QD_SCALE_PER_ROW));
    RUN(c, c->ops->nvfp4_fake_quant(c->dev, wh, x, rows, cols, QD_SCALE_PER_TENSOR));
    if (c->ops->finish)
        RUN(c, c->ops->finish(c->dev));
    out_nv(c, "per_row", &a);
    out_nv(c, "per_tensor", &w);
    OUT(c, "fake_row", 'f', xh, sizeof(float) * rows * cols);
    OUT(c, "fake_tensor", 'f', wh, sizeof(float) * rows * cols);
}

/* y (M, N) = the W4A4 product of x (M, K) and W (N, K). */
static void w4a4_case(oc *c, int M, int N, int K)
{
    float *x = F(c, (size_t)M * K, -3, 3), *w = F(c, (size_t)N * K, -1, 1), *y = Z(c, sizeof(float) * M * N);
    qd_nvfp4 a = nv(c, M, K, QD_SCALE_PER_ROW), q = nv(c, N, K, QD_SCALE_PER_TENSOR);
    RUN(c, c->ops->nvfp4_quantize(c->dev, &a, x));
    RUN(c, c->ops->nvfp4_quantize(c->dev, &q, w));
    RUN(c, c->ops->w4a4_gemm(c->dev, y, &a, &q));
    OUT(c, "y", 'f', y, sizeof(float) * M * N);
}

/* w4a4_gemm_multi: count products of M rows of K against weights of N[i]
 * rows, each its own activation (RAC's q, k, v) or one shared (plain W4A4). */
static void w4a4_multi_case(oc *c, int M, const int *N, int K, int count, int shared)
{
    qd_nvfp4 a[QD_RAC_MULTI], q[QD_RAC_MULTI];
    const qd_nvfp4 *ap[QD_RAC_MULTI], *wp[QD_RAC_MULTI];
    float *y[QD_RAC_MULTI];
    for (int i = 0; i < count; i++) {
        float *w = F(c, (size_t)N[i] * K, -1, 1);
        q[i] = nv(c, N[i], K, QD_SCALE_PER_TENSOR);
        RUN(c, c->ops->nvfp4_quantize(c->dev, &q[i], w));
        if (i == 0 || !shared) {
            float *x = F(c, (size_t)M * K, -3, 3);
            a[i] = nv(c, M, K, QD_SCALE_PER_ROW);
            RUN(c, c->ops->nvfp4_quantize(c->dev, &a[i], x));
        }
        ap[i] = shared ? &a[0] : &a[i];
        wp[i] = &q[i];
        y[i] = Z(c, sizeof(float) * M * N[i]);
    }
    RUN(c, c->ops->w4a4_gemm_multi(c->dev, y, ap, wp, count));
    static const char *const yn[] = {"y0", "y1", "y2", "y3"};
    for (int i = 0; i < count; i++)
        OUT(c, yn[i], 'f', y[i], sizeof(float) * M * N[i]);
}

/* a3b's q, k, v at one row (the decode kernel in one launch), activations apart */
static void c_w4a4_multi_qkv(oc *c)
{
    static const int N[3] = {96, 16, 24};
    w4a4_multi_case(c, 1, N, 2048, 3, 0);
}

/* 3 rows of the tiny model's RAC width (K not a multiple of 64), one activation */
static void c_w4a4_multi_tiny(oc *c)
{
    static const int N[3] = {70, 24, 24};
    w4a4_multi_case(c, 3, N, 80, 3, 1);
}

/* 9 rows: past the decode kernel, one product after the other */
static void c_w4a4_multi_rows9(oc *c)
{
    static const int N[2] = {40, 8};
    w4a4_multi_case(c, 9, N, 64, 2, 0);
}

/* K % 512 == 0: the tensor-core kernel's path */
static void c_w4a4(oc *c) { w4a4_case(c, 9, 40, 512); }

/* decode at batch 50 of one weight (o's shape, small): 7 tiles of 8 rows, the last of 2, N past
 * a 64-row tile (CUDA: QUADS_W4A4_STREAM=1 takes it, 16 chunks a warp) */
static void c_w4a4_rows50(oc *c) { w4a4_case(c, 50, 72, 4096); }

/* q, k and v at batch 40 (QUADS_W4A4_STREAM=1: one product after the other on its kernel, not the
 * FP16-activation kernel) */
static void c_w4a4_multi_rows40(oc *c)
{
    static const int N[3] = {96, 16, 16};
    w4a4_multi_case(c, 40, N, 512, 3, 0);
}

/* y = the grouped W4A4 product of E experts (N, K) over rows off (E + 1);
 * dev: through w4a4_gemm_grouped_dev, off uploaded, maxrows its largest
 * expert's rows. */
static void w4a4_grouped_run(oc *c, const int32_t *off, int E, int N, int K, int dev)
{
    int R = off[E];
    qd_nvfp4 q[8];
    const qd_nvfp4 *wq[8];
    for (int e = 0; e < E; e++) {
        float *w = F(c, (size_t)N * K, -1, 1);
        q[e] = nv(c, N, K, QD_SCALE_PER_TENSOR);
        RUN(c, c->ops->nvfp4_quantize(c->dev, &q[e], w));
        wq[e] = &q[e];
    }
    float *x = F(c, (size_t)R * K, -2, 2), *y = Z(c, sizeof(float) * R * N);
    qd_nvfp4 a = nv(c, R, K, QD_SCALE_PER_ROW);
    RUN(c, c->ops->nvfp4_quantize(c->dev, &a, x));
    int maxrows = 0;
    for (int e = 0; e < E; e++)
        maxrows = off[e + 1] - off[e] > maxrows ? off[e + 1] - off[e] : maxrows;
    if (dev)
        RUN(c, c->ops->w4a4_gemm_grouped_dev(c->dev, y, &a, wq, I(c, off, (size_t)E + 1), E, maxrows));
    else
        RUN(c, c->ops->w4a4_gemm_grouped(c->dev, y, &a, wq, off, E));
    if (c->ops->finish)
        RUN(c, c->ops->finish(c->dev));
    OUT(c, "y", 'f', y, sizeof(float) * R * N);
}

static void w4a4_grouped_case(oc *c, const int32_t *off, int E, int N, int K)
{
    w4a4_grouped_run(c, off, E, N, K, 0);
}

static void c_w4a4_grouped(oc *c) { w4a4_grouped_case(c, goff, GE, 24, 64); }

/* The decode experts below with their offsets on the device (CUDA: compacted
 * there, one decode-kernel launch over min(E, R) groups) */
static void c_w4a4_grouped_dev(oc *c)
{
    static const int32_t off[7] = {0, 1, 1, 4, 12, 14, 19};
    w4a4_grouped_run(c, off, 6, 40, 2112, 1);
}

/* an expert of 9 rows: past the decode kernel (CUDA: the MMA kernel over the
 * row tiles listed on the device, 8 rows a tile: two for that expert) */
static void c_w4a4_grouped_dev9(oc *c)
{
    static const int32_t off[4] = {0, 9, 9, 12};
    w4a4_grouped_run(c, off, 3, 24, 64, 1);
}

/* 100 routed decode rows over 6 experts (CUDA: 17 rows a group on average,
 * tiles of 32 rows: two for the 40-row expert), N ragged against 64-row CTAs */
static void c_w4a4_grouped_dev40(oc *c)
{
    static const int32_t off[7] = {0, 17, 17, 57, 58, 77, 100};
    w4a4_grouped_run(c, off, 6, 72, 256, 1);
}

/* Experts of 3, 6, 11, 0 and 30 rows, K = 768 (three whole chunks of 16
 * blocks), N = 456 ragged against 64-row CTAs (CUDA: too many CTAs for the
 * split-K kernel; the MMA kernel two blocks an
 * MMA, its 4-row column groups one, two and three to eight of them, rows of a
 * group past the expert's; QUADS_W4A4_PAIR=0 one block an MMA) */
static void c_w4a4_grouped_pair(oc *c)
{
    static const int32_t off[6] = {0, 3, 9, 20, 20, 50};
    w4a4_grouped_case(c, off, 5, 456, 768);
}

/* Decode at batch 64's row counts: 1 to 16 rows an expert (one or two 8-row
 * tiles, 1-4 and 5-8 rows in a tile), an expert without rows, N = 100 ragged
 * against 64-row CTAs (a warp's 16 rows all past N), K = 1024 (4 chunks of
 * 16 blocks). CUDA: the two-blocks-an-MMA kernel by default, the streaming
 * kernel with QUADS_W4A4_STREAM=1. */
static void c_w4a4_grouped_b64(oc *c)
{
    static const int32_t off[8] = {0, 1, 5, 10, 18, 27, 43, 43};
    w4a4_grouped_case(c, off, 7, 100, 1024);
}

/* Batch 256's row counts (17-32 rows an expert: the streaming kernel's
 * 16-row tiles, 32-block stages with QUADS_W4A4_STREAM_CFG=2), K = 1024 */
static void c_w4a4_grouped_b256(oc *c)
{
    static const int32_t off[5] = {0, 20, 20, 45, 46};
    w4a4_grouped_case(c, off, 4, 72, 1024);
}

/* the same with the offsets on the device (CUDA: the MMA kernel over 8-row
 * tiles listed there, or with QUADS_W4A4_STREAM=1 the streaming kernel over
 * them) */
static void c_w4a4_grouped_dev_b64(oc *c)
{
    static const int32_t off[8] = {0, 1, 5, 10, 18, 27, 43, 43};
    w4a4_grouped_run(c, off, 7, 100, 1024, 1);
}

/* Batch 64's decode rows at the QUADS recipe's down projection width: 768 +
 * 192 RAC channels (ratio 0.25), K = 960, 60 blocks: three chunks of 16 and a
 * short one of 12, scale rows not on 16 bytes. CUDA: the streaming kernel's
 * PART twin by default (host offsets), with QUADS_W4A4_STREAM=1 on the device
 * offsets too; the MMA kernel before 2026-12-07d. */
static void c_w4a4_grouped_b64_rac(oc *c)
{
    static const int32_t off[8] = {0, 1, 5, 10, 18, 27, 43, 43};
    w4a4_grouped_case(c, off, 7, 100, 960);
}

static void c_w4a4_grouped_dev_b64_rac(oc *c)
{
    static const int32_t off[8] = {0, 1, 5, 10, 18, 27, 43, 43};
    w4a4_grouped_run(c, off, 7, 100, 960, 1);
}

/* A prefill's experts of 150, 0 and 70 rows at K = 960 (seven chunks of 8
 * blocks and one of 4). CUDA with QUADS_W4A4_H16=1: the wgmma kernel's PART
 * twin (the mma.sync FP16 kernel before 2026-12-07d: K not a multiple of 128). */
static void c_w4a4_grouped_prefill960(oc *c)
{
    static const int32_t off[4] = {0, 150, 150, 220};
    w4a4_grouped_case(c, off, 3, 200, 960);
}

/* A prefill's experts: 130 and 70 rows, N = 5650 ragged against 128-row CTAs,
 * K = 48 (3 blocks, less than a chunk). CUDA: enough CTAs for the FP16 kernel
 * by default (two and three 64-row tiles, the last of 2 and 6 rows). */
static void c_w4a4_grouped_prefill(oc *c)
{
    static const int32_t off[3] = {0, 130, 200};
    w4a4_grouped_case(c, off, 2, 5650, 48);
}

/* A prefill's experts of 150, 0 and 70 rows, N = 200 ragged against 128-row
 * CTAs, K = 384 (three chunks of 8 blocks). CUDA with QUADS_W4A4_H16=1: the
 * FP16 kernel (and with QUADS_W4A4_HWG=1 its wgmma twin: three 64-row tiles
 * and two, the last of 22 and 6 rows; two and one of 128) */
static void c_w4a4_grouped_prefill384(oc *c)
{
    static const int32_t off[4] = {0, 150, 150, 220};
    w4a4_grouped_case(c, off, 3, 200, 384);
}

/* a batch-1 decode's experts: 8 rows in 8 of 8 experts of K 768 (a3b's down) */
static void c_w4a4_grouped_dev1(oc *c)
{
    static const int32_t off[9] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    w4a4_grouped_run(c, off, 8, 48, 768, 1);
}

/* Decode-shaped experts: at most 8 rows each (CUDA: the split-K kernel, K in
 * 16-block chunks over 4 warps, rounds of 64 blocks), K = 2048 + 64 (a RAC
 * width: a last round of one chunk of 4 blocks), N ragged against 16-row CTAs. */
static void c_w4a4_grouped_decode(oc *c)
{
    static const int32_t off[7] = {0, 1, 1, 4, 12, 14, 19};
    w4a4_grouped_case(c, off, 6, 40, 2112);
}

/* One row through one matrix of K = 768 (an expert's down projection at batch 1:
 * three chunks, one round of the split-K kernel with a warp idle). */
static void c_w4a4_row1(oc *c) { w4a4_case(c, 1, 72, 768); }

/* K not a multiple of 64 (RAC's width of a 4096-wide input at ratio 0.1: 281
 * blocks): CUDA's decode kernel reads such rows block by block, its last
 * thread a row with one block; one row (an odd count of blocks in its
 * shared-memory arrays). */
static void c_w4a4_rac_width(oc *c) { w4a4_case(c, 1, 37, 4496); }

/* The tiny model's RAC width (64 + 16: 5 blocks, a row a thread and 51 rows a
 * CTA in CUDA's decode kernel) at 3 rows. */
static void c_w4a4_tiny_rac(oc *c) { w4a4_case(c, 3, 70, 80); }

/* 5 rows of K = 1072 (67 blocks) against 45 weight rows: a decode tile of 8 rows
 * with 3 empty, rows of the CTA past N. */
static void c_w4a4_rows5(oc *c) { w4a4_case(c, 5, 45, 1072); }

/* RAC's augmented activation of rows x K with n channels (CUDA: one launch a
 * row, main blocks, residuals, their blocks) and a weight of N rows. */
static void rac_case(oc *c, int rows, int K, int n, int N)
{
    float *x = F(c, (size_t)rows * K, -3, 3), *w = F(c, (size_t)N * K, -1, 1);
    double *err = Z(c, sizeof(double) * K);
    int64_t *ch = channels(c, K, n);
    qd_nvfp4 a = nv(c, rows, K + n, QD_SCALE_PER_ROW), q = nv(c, N, K + n, QD_SCALE_PER_TENSOR);
    RUN(c, c->ops->rac_error(c->dev, err, x, rows, K));
    RUN(c, c->ops->rac_error(c->dev, err, w, rows, K));  /* accumulates */
    RUN(c, c->ops->rac_augment_act(c->dev, &a, x, rows, K, ch, n));
    RUN(c, c->ops->rac_augment_weight(c->dev, &q, w, N, K, ch, n));
    if (c->ops->finish)
        RUN(c, c->ops->finish(c->dev));
    OUT(c, "err", 'd', err, sizeof(double) * K);
    out_nv(c, "act", &a);
    out_nv(c, "weight", &q);
}

static void c_rac(oc *c) { rac_case(c, 6, 64, 16, 10); }

/* decode's shapes: a3b's q/k/v input at ratio 0.1 (12 of 128 blocks) one row,
 * and its o input (25 of 256 blocks) three rows */
static void c_rac_decode(oc *c) { rac_case(c, 1, 2048, 192, 20); }
static void c_rac_decode_o(oc *c) { rac_case(c, 3, 4096, 400, 12); }

/* A weight sync's codes a shape at a time: T tensors (70 and 67: more than one launch
 * of the CUDA kernel takes), each of its own magnitude, one all zeros, with n
 * RAC channels each (n = 0: plain quantize); outputs codes, scales, s_dec,
 * then "ref.*" the same by the per-tensor ops (nvfp4_quantize,
 * rac_augment_weight), which must be the same bytes. Buffers are slices of
 * one. */
static void weights_case(oc *c, int T, int N, int K, int n)
{
    size_t nw = (size_t)N * K, nq = (size_t)N * (K + n);
    float *h = malloc(sizeof(float) * nw * T);
    int64_t *hc = malloc(sizeof(int64_t) * (size_t)(n ? n : 1) * T);
    qd_nvfp4 *q = malloc(sizeof *q * T), **qp = malloc(sizeof *qp * T);
    const float **xp = malloc(sizeof *xp * T);
    const int64_t **cp = malloc(sizeof *cp * T);
    if (!h || !hc || !q || !qp || !xp || !cp) {
        c->st = qd_error(QD_ERR_NOMEM, "op case");
        goto done;
    }
    for (int t = 0; t < T; t++) {
        float mag = t == 5 ? 0.0f : ldexpf(1.0f, t % 9 - 4);
        for (size_t i = 0; i < nw; i++)
            h[(size_t)t * nw + i] = mag * unif(c, -1, 1);
        for (int k = 0, take = 0; k < K && take < n; k++)
            if (irand(c, K - k) < n - take)
                hc[(size_t)t * n + take++] = k;
    }
    float *x = up(c, h, sizeof(float) * nw * T);
    int64_t *ch = n ? up(c, hc, sizeof(int64_t) * (size_t)n * T) : NULL;
    uint8_t *codes = Z(c, nq / 2 * T * 2), *scales = Z(c, nq / 16 * T * 2);
    float *s_dec = Z(c, sizeof(float) * T * 2);
    for (int pass = 0; pass < 2 && !c->st; pass++) {
        size_t o = pass * (size_t)T;
        for (int t = 0; t < T; t++) {
            q[t] = (qd_nvfp4){.rows = N, .cols = K + n, .per_row = QD_SCALE_PER_TENSOR,
                              .codes = codes + nq / 2 * (o + t), .scales = scales + nq / 16 * (o + t),
                              .s_dec = s_dec + o + t};
            qp[t] = &q[t];
            xp[t] = x + nw * t;
            cp[t] = n ? ch + (size_t)n * t : NULL;
            if (pass == 1)
                RUN(c, n ? c->ops->rac_augment_weight(c->dev, &q[t], xp[t], N, K, cp[t], n)
                         : c->ops->nvfp4_quantize(c->dev, &q[t], xp[t]));
        }
        if (pass == 0)
            RUN(c, c->ops->nvfp4_quantize_weights(c->dev, qp, xp, cp, T, N, K, n));
    }
    if (c->ops->finish)
        RUN(c, c->ops->finish(c->dev));
    OUT(c, "codes", 'b', codes, nq / 2 * T);
    OUT(c, "scales", 'b', scales, nq / 16 * T);
    OUT(c, "s_dec", 'b', s_dec, sizeof(float) * T);
    OUT(c, "ref.codes", 'b', codes + nq / 2 * T, nq / 2 * T);
    OUT(c, "ref.scales", 'b', scales + nq / 16 * T, nq / 16 * T);
    OUT(c, "ref.s_dec", 'b', s_dec + T, sizeof(float) * T);
done:
    free(h), free(hc), free(q), free(qp), free(xp), free(cp);
}

static void c_quantize_weights(oc *c) { weights_case(c, 70, 24, 96, 0); }

static void c_quantize_weights_rac(oc *c) { weights_case(c, 67, 10, 64, 16); }

/* RAC copies over many warps' chunks of 32 blocks, chunks across rows (12 copied blocks a row) */
static void c_quantize_weights_rac_wide(oc *c) { weights_case(c, 6, 100, 768, 192); }

/* count per-tensor fake-quants of one shape (N, K): the ops'
 * nvfp4_fake_quant_weights (more tensors than one CUDA launch takes), where a
 * backend has it, else nvfp4_fake_quant per tensor; the outputs "out", then
 * "ref" (nvfp4_fake_quant per tensor): the same bytes. Every fourth tensor is
 * scaled up a decade so their global scales differ. */
static void c_fake_quant_weights(oc *c)
{
    int count = 70, N = 24, K = 96;
    size_t per = (size_t)N * K, all = per * (size_t)count;
    float *x = F(c, all, -1, 1), *out = Z(c, sizeof(float) * all), *ref = Z(c, sizeof(float) * all);
    float **op = malloc(sizeof(float *) * (size_t)count), **xp = malloc(sizeof(float *) * (size_t)count);
    float *h = malloc(sizeof(float) * per);
    if (!op || !xp || !h) {
        c->st = c->st ? c->st : qd_error(QD_ERR_NOMEM, "op case");
        free(op), free(xp), free(h);
        return;
    }
    for (int i = 0; i < count && x; i++) {
        op[i] = out + per * (size_t)i;
        xp[i] = x + per * (size_t)i;
        if (i % 4 == 3 && !c->st) {
            c->st = c->ops->to_host(c->dev, h, xp[i], sizeof(float) * per);
            for (size_t j = 0; j < per && !c->st; j++)
                h[j] *= 10.0f;
            RUN(c, c->ops->to_dev(c->dev, xp[i], h, sizeof(float) * per));
        }
    }
    qd_status st = QD_ERR_UNSUPPORTED;
    if (!c->st && c->ops->nvfp4_fake_quant_weights)
        st = c->ops->nvfp4_fake_quant_weights(c->dev, op, (const float *const *)xp, count, N, K);
    for (int i = 0; i < count && st == QD_ERR_UNSUPPORTED; i++)
        RUN(c, c->ops->nvfp4_fake_quant(c->dev, op[i], xp[i], N, K, QD_SCALE_PER_TENSOR));
    if (st != QD_ERR_UNSUPPORTED && !c->st)
        c->st = st;
    for (int i = 0; i < count; i++)
        RUN(c, c->ops->nvfp4_fake_quant(c->dev, ref + per * (size_t)i, xp[i], N, K, QD_SCALE_PER_TENSOR));
    OUT(c, "out", 'f', out, sizeof(float) * all);
    OUT(c, "ref", 'f', ref, sizeof(float) * all);
    free(op), free(xp), free(h);
}

/* The host arrays of a rac_select case over NL linears of widths K: off (NL)
 * their offsets, *e their errors (the caller fills them), *h the channel
 * arrays' sentinels (-7 - k, kept where a set does not fill them). Returns
 * the total width, 0 with c->st set when out of memory (nothing held). */
static size_t rac_sets(oc *c, const int *K, int NL, size_t *off, double **e, int64_t **h)
{
    size_t total = 0;
    for (int i = 0; i < NL; i++) {
        off[i] = total;
        total += (size_t)K[i];
    }
    *e = malloc(sizeof(double) * total);
    *h = malloc(sizeof(int64_t) * total);
    if (!*e || !*h) {
        c->st = qd_error(QD_ERR_NOMEM, "op case");
        free(*e), free(*h);
        return 0;
    }
    for (size_t k = 0; k < total; k++)
        (*h)[k] = -7 - (int64_t)k;
    return total;
}

/* RAC channel sets of 205 linears (more than one CUDA launch takes): widths
 * over one 256-channel tile and under, one of 16 (no channel at 0.25), errors
 * from a few values (ties, broken by the lower channel) or all distinct; the
 * entries a set does not fill keep their sentinels. */
static void c_rac_select(oc *c)
{
    enum { NL = 205 };
    int K[NL];
    size_t off[NL];
    for (int i = 0; i < NL; i++)
        K[i] = i < 5 ? (int[]){64, 1040, 16, 288, 32}[i] : 32 + 16 * (i % 3);
    double *e;
    int64_t *h;
    size_t total = rac_sets(c, K, NL, off, &e, &h);
    if (!total)
        return;
    for (size_t k = 0; k < total; k++)
        e[k] = k >= off[3] && k < off[4] ? (double)unif(c, 0, 1) : 0.5 * irand(c, 4);
    double *err = up(c, e, sizeof(double) * total);
    int64_t *ch = up(c, h, sizeof(int64_t) * total);
    RUN(c, c->ops->rac_select(c->dev, ch, err, off, K, NL, 0.25));
    if (c->ops->finish)
        RUN(c, c->ops->finish(c->dev));
    OUT(c, "ch", 'b', ch, sizeof(int64_t) * total);
    free(e), free(h);
}

/* RAC channel sets at the edges of the CUDA pick: widths not a multiple of its
 * 256-channel tile, over a3b's widest (4096) and its shared-memory keys'
 * limit (5120, then 5136 and 16400 from global memory), one of 16 (no channel
 * at 0.25); errors all equal (zero, as at a sync with no statistics, and
 * 0.75), a few values whose ties straddle the cut and the tiles (ties to the
 * lower channel), +0 against -0 (equal) with subnormals and negatives, huge
 * magnitudes, all distinct. Ratios 0.25, 0.29 (the count's tolerance), 1 (n =
 * K) and 0 (n = 0: every entry keeps its sentinel), each into its own array. */
static void c_rac_select_edges(oc *c)
{
    enum { NL = 14, NR = 4 };
    static const int K[NL] = {4112, 5120, 5136, 16400, 784, 16, 1040, 2048, 272, 768, 4096, 48, 1296, 2064};
    static const double ratio[NR] = {0.25, 0.29, 1.0, 0.0};
    static const char *const name[NR] = {"ch 0.25", "ch 0.29", "ch 1", "ch 0"};
    size_t off[NL];
    double *e;
    int64_t *h;
    size_t total = rac_sets(c, K, NL, off, &e, &h);
    if (!total)
        return;
    for (int i = 0; i < NL; i++)
        for (int k = 0; k < K[i]; k++) {
            double u = unif(c, 0, 1), *v = e + off[i] + k;
            switch (i % 7) {
            case 0: *v = 0.0; break;
            case 1: *v = irand(c, 10) == 0 ? 2.0 : irand(c, 2) ? 1.0 : 0.0; break; /* the cut inside the 1s */
            case 2: *v = 0.5 * irand(c, 4); break;
            case 3: *v = irand(c, 3) ? (irand(c, 2) ? -0.0 : 0.0) : irand(c, 2) ? 4.9e-324 : -4.9e-324; break;
            case 4: *v = irand(c, 50) == 0 ? 1e300 * u : irand(c, 50) == 0 ? -1e300 * u : 1e-310 * u; break;
            case 5: *v = 0.75; break;
            default: *v = u; break;
            }
        }
    double *err = up(c, e, sizeof(double) * total);
    for (int r = 0; r < NR; r++) {
        int64_t *ch = up(c, h, sizeof(int64_t) * total);
        RUN(c, c->ops->rac_select(c->dev, ch, err, off, K, NL, ratio[r]));
        if (c->ops->finish)
            RUN(c, c->ops->finish(c->dev));
        OUT(c, name[r], 'b', ch, sizeof(int64_t) * total);
    }
    free(e), free(h);
}

/* the replay trainer's RAC input: x_hat plus the residuals on the channels */
static void c_rac_fake_quant(oc *c)
{
    int rows = 7, K = 64, n = 32;
    float *x = F(c, (size_t)rows * K, -3, 3), *y = Z(c, sizeof(float) * rows * K);
    float *y0 = Z(c, sizeof(float) * rows * K);
    int64_t *ch = channels(c, K, n);
    RUN(c, c->ops->rac_fake_quant(c->dev, y, x, rows, K, ch, n));
    RUN(c, c->ops->rac_fake_quant(c->dev, y0, x, rows, K, ch, 0));
    if (c->ops->finish)
        RUN(c, c->ops->finish(c->dev));
    OUT(c, "y", 'f', y, sizeof(float) * rows * K);
    OUT(c, "y_n0", 'f', y0, sizeof(float) * rows * K);
}

/* RAC over 4 experts (one without rows), each its own channel set */
static void c_rac_grouped(oc *c)
{
    int R = goff[GE], K = 64, n = 16;
    double *err[GE];
    const int64_t *ch[GE];
    for (int e = 0; e < GE; e++) {
        err[e] = Z(c, sizeof(double) * K);
        ch[e] = channels(c, K, n);
    }
    float *x = F(c, (size_t)R * K, -3, 3);
    qd_nvfp4 a = nv(c, R, K + n, QD_SCALE_PER_ROW);
    RUN(c, c->ops->rac_grouped(c->dev, &a, err, ch, goff, GE, x, K, n));
    RUN(c, c->ops->rac_grouped(c->dev, &a, err, ch, goff, GE, x, K, n));  /* the statistics accumulate */
    if (c->ops->finish)
        RUN(c, c->ops->finish(c->dev));
    out_nv(c, "act", &a);
    for (int e = 0; e < GE; e++)
        OUT(c, e == 0 ? "err0" : e == 1 ? "err1" : e == 2 ? "err2" : "err3", 'd', err[e], sizeof(double) * K);
}

/* rac_multi: count linears of one input x (off[E] rows, K) with channel
 * counts n[i] (per expert channel sets), the statistics gathered twice (they
 * accumulate) when stats. */
static void rac_multi_run(oc *c, const int32_t *off, int E, int K, const int64_t *n, int count, int stats, int dev)
{
    int R = off[E];
    double *errs[QD_RAC_MULTI][GE];
    double *const *err[QD_RAC_MULTI];
    const int64_t *chs[QD_RAC_MULTI][GE];
    const int64_t *const *ch[QD_RAC_MULTI];
    qd_nvfp4 a[QD_RAC_MULTI], *ap[QD_RAC_MULTI];
    for (int i = 0; i < count; i++) {
        for (int e = 0; e < E; e++) {
            errs[i][e] = Z(c, sizeof(double) * K);
            chs[i][e] = channels(c, K, n[i] ? (int)n[i] : 1); /* n = 0: never read */
        }
        err[i] = errs[i];
        ch[i] = chs[i];
        a[i] = nv(c, R, K + n[i], QD_SCALE_PER_ROW);
        ap[i] = &a[i];
    }
    float *x = F(c, (size_t)R * K, -3, 3);
    int32_t *d_off = dev ? I(c, off, (size_t)E + 1) : NULL;
    for (int k = 0; k < (stats ? 2 : 1); k++) {
        double *const *const *e = stats ? err : NULL;
        if (dev)
            RUN(c, c->ops->rac_multi_dev(c->dev, ap, e, ch, n, count, d_off, E, R, x, K));
        else
            RUN(c, c->ops->rac_multi(c->dev, ap, e, ch, n, count, off, E, x, K));
    }
    if (c->ops->finish)
        RUN(c, c->ops->finish(c->dev));
    static const char *const act[] = {"act0", "act1", "act2", "act3"};
    static const char *const en[] = {"err00", "err01", "err02", "err03", "err10", "err11", "err12", "err13",
                                     "err20", "err21", "err22", "err23", "err30", "err31", "err32", "err33"};
    for (int i = 0; i < count; i++) {
        out_nv(c, act[i], &a[i]);
        for (int e = 0; stats && e < E; e++)
            OUT(c, en[4 * i + e], 'd', errs[i][e], sizeof(double) * K);
    }
}

static void rac_multi_case(oc *c, const int32_t *off, int E, int K, const int64_t *n, int count, int stats)
{
    rac_multi_run(c, off, E, K, n, count, stats, 0);
}

/* gate and up over 4 experts (one without rows), the offsets on the device, statistics gathered */
static void c_rac_multi_dev(oc *c)
{
    static const int64_t n[2] = {16, 16};
    rac_multi_run(c, goff, GE, 64, n, 2, 1, 1);
}

/* q, k and v of 3 rows (one with no channels), statistics gathered */
static void c_rac_multi_qkv(oc *c)
{
    static const int32_t off[2] = {0, 3};
    static const int64_t n[3] = {16, 32, 0};
    rac_multi_case(c, off, 1, 64, n, 3, 1);
}

/* one decode row of a3b's q/k/v input, three channel sets of 192, no statistics */
static void c_rac_multi_decode(oc *c)
{
    static const int32_t off[2] = {0, 1};
    static const int64_t n[3] = {192, 192, 192};
    rac_multi_case(c, off, 1, 2048, n, 3, 0);
}

/* gate and up over 4 experts (one without rows), statistics gathered */
static void c_rac_multi_experts(oc *c)
{
    static const int64_t n[2] = {16, 16};
    rac_multi_case(c, goff, GE, 64, n, 2, 1);
}

static void sqerr_rows_case(oc *c, int rows, int cols)
{
    float *x = F(c, (size_t)rows * cols, -2, 2), *xh = F(c, (size_t)rows * cols, -2, 2);
    double *e = Z(c, sizeof(double) * rows), *r = Z(c, sizeof(double) * rows);
    RUN(c, c->ops->sqerr_rows(c->dev, e, r, x, xh, rows, cols));
    OUT(c, "err", 'd', e, sizeof(double) * rows);
    OUT(c, "norm", 'd', r, sizeof(double) * rows);
}

static void c_sqerr_rows(oc *c) { sqerr_rows_case(c, 11, 70); }

/* three blocks of 128 rows, the last partial; 6 tiles of 32 columns and a tail */
static void c_sqerr_rows_tiles(oc *c) { sqerr_rows_case(c, 300, 200); }

/* diag_add: 5 segments of 23 rows (one empty) into 6 pairs of a random
 * start, off on the host; then 3 segments with off on the device, from 0.0;
 * then 2 sets of one segment of 300 rows (past a 256-row chunk) */
static void c_diag_add(oc *c)
{
    enum { ROWS = 23, PAIRS = 6 };
    static const int32_t off[6] = {0, 4, 4, 11, 20, 23}, slot[5] = {5, 0, 2, 3, 1};
    static const int32_t off2[4] = {2, 9, 10, 23}, slot2[3] = {1, 4, 0};
    static const int32_t off3[2] = {0, 300}, slot3[2] = {3, 2};
    double h[2 * ROWS > 2 * PAIRS ? 2 * ROWS : 2 * PAIRS];
    for (int i = 0; i < 2 * ROWS; i++)
        h[i] = (double)unif(c, 0, 3) * (double)unif(c, 0, 1e-3f) + (double)unif(c, 0, 1);
    double *e = up(c, h, sizeof(double) * 2 * ROWS);
    for (int i = 0; i < 2 * PAIRS; i++)
        h[i] = (double)unif(c, 0, 100);
    double *acc = up(c, h, sizeof(double) * 2 * PAIRS);
    RUN(c, c->ops->diag_add(c->dev, acc, e, ROWS, off, NULL, slot, 5, 1, 0));
    OUT(c, "acc", 'd', acc, sizeof(double) * 2 * PAIRS);
    RUN(c, c->ops->diag_add(c->dev, acc, e, ROWS, NULL, I(c, off2, 4), slot2, 3, 1, QD_DIAG_SET));
    OUT(c, "acc set", 'd', acc, sizeof(double) * 2 * PAIRS);
    double *h3 = malloc(sizeof(double) * 600);
    if (!h3) {
        c->st = qd_error(QD_ERR_NOMEM, "op case");
        return;
    }
    for (int i = 0; i < 600; i++)
        h3[i] = (double)unif(c, 0, 2) * (double)unif(c, 0, 1e-2f);
    double *e3 = up(c, h3, sizeof(double) * 600);
    free(h3);
    RUN(c, c->ops->diag_add(c->dev, acc, e3, 300, off3, NULL, slot3, 1, 2, 0));
    OUT(c, "acc sets", 'd', acc, sizeof(double) * 2 * PAIRS);
}

/* sqerr_weights: 3 weights of 150 x 80 (two blocks of rows, a last tile of
 * 16 columns) against their codes (the middle one RAC-augmented by 16
 * channels: its first 80 columns), then against their fake-quants */
static void c_sqerr_weights(oc *c)
{
    enum { CNT = 3, N = 150, K = 80, NR = 16 };
    const float *x[CNT], *xh[CNT];
    qd_nvfp4 q[CNT];
    const qd_nvfp4 *qp[CNT];
    int64_t *ch = channels(c, K, NR);
    for (int i = 0; i < CNT; i++) {
        float *w = F(c, (size_t)N * K, -1.5f + 0.5f * (float)i, 1);
        float *h = Z(c, sizeof(float) * N * K);
        x[i] = w, xh[i] = h, qp[i] = &q[i];
        q[i] = nv(c, N, K + (i == 1 ? NR : 0), QD_SCALE_PER_TENSOR);
        RUN(c, i == 1 ? c->ops->rac_augment_weight(c->dev, &q[i], w, N, K, ch, NR)
                      : c->ops->nvfp4_quantize(c->dev, &q[i], w));
        RUN(c, c->ops->nvfp4_fake_quant(c->dev, h, w, N, K, QD_SCALE_PER_TENSOR));
    }
    double *e = Z(c, sizeof(double) * 2 * CNT * N), *e2 = Z(c, sizeof(double) * 2 * CNT * N);
    RUN(c, c->ops->sqerr_weights(c->dev, e, x, NULL, qp, CNT, N, K));
    RUN(c, c->ops->sqerr_weights(c->dev, e2, x, xh, NULL, CNT, N, K));
    OUT(c, "e codes", 'd', e, sizeof(double) * 2 * CNT * N);
    OUT(c, "e fake-quant", 'd', e2, sizeof(double) * 2 * CNT * N);
}

/* two sequences of 5 and 3 tokens (prefill layout) */
static const int32_t a_kbase[8] = {0, 0, 0, 0, 0, 5, 5, 5}, a_pos[8] = {0, 1, 2, 3, 4, 0, 1, 2},
                     a_slen[8] = {5, 5, 5, 5, 5, 3, 3, 3}, a_seq[3] = {0, 5, 8};

static void c_attend(oc *c)
{
    int N = 8, H = 4, KV = 2, D = 16, Tm = 5;
    float *q = F(c, (size_t)N * H * D, -1, 1), *k = F(c, (size_t)N * KV * D, -1, 1);
    float *v = F(c, (size_t)N * KV * D, -1, 1), *o = Z(c, sizeof(float) * N * H * D);
    float *att = Z(c, sizeof(float) * N * H * Tm);
    RUN(c, c->ops->attend(c->dev, o, att, q, k, v, I(c, a_kbase, N), I(c, a_pos, N), N, H, KV, D, Tm,
                          a_seq, 2));
    OUT(c, "out", 'f', o, sizeof(float) * N * H * D);
    OUT(c, "att", 'f', att, sizeof(float) * N * H * Tm);
}

/* three cache rows of 6 slots, one query each (decode layout) */
static void c_attend_decode(oc *c)
{
    int N = 3, H = 4, KV = 1, D = 32, Tc = 6, Tm = 6;
    int32_t kbase[3] = {0, Tc, 2 * Tc}, pos[3] = {4, 0, 5};
    float *q = F(c, (size_t)N * H * D, -1, 1), *kc = F(c, (size_t)3 * Tc * KV * D, -1, 1);
    float *vc = F(c, (size_t)3 * Tc * KV * D, -1, 1), *o = Z(c, sizeof(float) * N * H * D);
    float *att = Z(c, sizeof(float) * N * H * Tm);
    RUN(c, c->ops->attend(c->dev, o, att, q, kc, vc, I(c, kbase, N), I(c, pos, N), N, H, KV, D, Tm,
                          NULL, 0));
    OUT(c, "out", 'f', o, sizeof(float) * N * H * D);
}

/* N decode queries at positions pos, query n over cache row n of Tc slots. */
static void attend_decode_case(oc *c, int N, int H, int KV, int D, int Tc, const int32_t *pos)
{
    int Tm = Tc;
    int32_t kbase[8];
    for (int n = 0; n < N; n++)
        kbase[n] = n * Tc;
    float *q = F(c, (size_t)N * H * D, -1, 1), *kc = F(c, (size_t)N * Tc * KV * D, -1, 1);
    float *vc = F(c, (size_t)N * Tc * KV * D, -1, 1), *o = Z(c, sizeof(float) * N * H * D);
    float *att = Z(c, sizeof(float) * N * H * Tm);
    RUN(c, c->ops->attend(c->dev, o, att, q, kc, vc, I(c, kbase, N), I(c, pos, N), N, H, KV, D, Tm,
                          NULL, 0));
    OUT(c, "out", 'f', o, sizeof(float) * N * H * D);
    OUT(c, "att", 'f', att, sizeof(float) * N * H * Tm);
}

/* Qwen3-30B-A3B's heads (32 / 4 of 128) over cache rows of 80 slots: the
 * grouped-query heads share each key and value (CUDA), positions on and across
 * the edges of the value ring's 32-position stages. */
static void c_attend_gqa(oc *c)
{
    static const int32_t pos[5] = {0, 31, 32, 70, 79};
    attend_decode_case(c, 5, 32, 4, 128, 80, pos);
}

/* One decode query at position 299 of a 300-slot row, a3b heads: CUDA splits
 * each group's 8 heads over 8 blocks (few rows) and stages the sum of 300
 * exponentials in two parts. */
static void c_attend_gqa_long(oc *c)
{
    static const int32_t pos[1] = {299};
    attend_decode_case(c, 1, 32, 4, 128, 300, pos);
}

/* Groups of 4 heads of 64 over cache rows of 300 (CUDA: 4 threads a value
 * column, each one head's chain), positions 0 .. 299. */
static void c_attend_gqa4(oc *c)
{
    static const int32_t pos[6] = {0, 1, 63, 255, 256, 299};
    attend_decode_case(c, 6, 16, 4, 64, 300, pos);
}

static void c_attend_backward(oc *c)
{
    int N = 8, H = 4, KV = 2, D = 16, Tm = 5;
    float *q = F(c, (size_t)N * H * D, -1, 1), *k = F(c, (size_t)N * KV * D, -1, 1);
    float *v = F(c, (size_t)N * KV * D, -1, 1), *o = Z(c, sizeof(float) * N * H * D);
    float *att = Z(c, sizeof(float) * N * H * Tm), *dout = F(c, (size_t)N * H * D, -1, 1);
    float *dq = Z(c, sizeof(float) * N * H * D), *dk = Z(c, sizeof(float) * N * KV * D);
    float *dv = Z(c, sizeof(float) * N * KV * D), *ds = Z(c, sizeof(float) * N * H * Tm);
    int32_t *pos = I(c, a_pos, N);
    RUN(c, c->ops->attend(c->dev, o, att, q, k, v, I(c, a_kbase, N), pos, N, H, KV, D, Tm, a_seq, 2));
    RUN(c, c->ops->attend_backward(c->dev, dq, dk, dv, ds, dout, o, att, q, k, v, pos, I(c, a_slen, N), N, H, KV, D,
                                   Tm, a_seq, 2, 0));
    OUT(c, "dq", 'f', dq, sizeof(float) * N * H * D);
    OUT(c, "dk", 'f', dk, sizeof(float) * N * KV * D);
    OUT(c, "dv", 'f', dv, sizeof(float) * N * KV * D);
}

/* Sequences seq[b] .. seq[b + 1] - 1 (NS of them, at most 256 rows) in a
 * prefill's packing, H / KV heads of D, Tm; forward and backward (flags
 * QD_BWD_DX_SET: dq, dk, dv random on entry and overwritten, else zeros added to). */
static void prefill_case_f(oc *c, const int32_t *seq, int NS, int H, int KV, int D, int Tm, int flags)
{
    int N = seq[NS];
    int32_t kbase[256], pos[256], slen[256];
    for (int b = 0; b < NS; b++)
        for (int n = seq[b]; n < seq[b + 1]; n++)
            kbase[n] = seq[b], pos[n] = n - seq[b], slen[n] = seq[b + 1] - seq[b];
    float *q = F(c, (size_t)N * H * D, -1, 1), *k = F(c, (size_t)N * KV * D, -1, 1);
    float *v = F(c, (size_t)N * KV * D, -1, 1), *o = Z(c, sizeof(float) * N * H * D);
    float *att = Z(c, sizeof(float) * N * H * Tm), *dout = F(c, (size_t)N * H * D, -1, 1);
    int set = (flags & QD_BWD_DX_SET) != 0;
    float *dq = set ? F(c, (size_t)N * H * D, -9, 9) : Z(c, sizeof(float) * N * H * D);
    float *dk = set ? F(c, (size_t)N * KV * D, -9, 9) : Z(c, sizeof(float) * N * KV * D);
    float *dv = set ? F(c, (size_t)N * KV * D, -9, 9) : Z(c, sizeof(float) * N * KV * D);
    float *ds = Z(c, sizeof(float) * N * H * Tm);
    int32_t *dpos = I(c, pos, N);
    RUN(c, c->ops->attend(c->dev, o, att, q, k, v, I(c, kbase, N), dpos, N, H, KV, D, Tm, seq, NS));
    RUN(c, c->ops->attend_backward(c->dev, dq, dk, dv, ds, dout, o, att, q, k, v, dpos, I(c, slen, N), N, H, KV, D,
                                   Tm, seq, NS, flags));
    OUT(c, "out", 'f', o, sizeof(float) * N * H * D);
    OUT(c, "att", 'f', att, sizeof(float) * N * H * Tm);
    OUT(c, "dq", 'f', dq, sizeof(float) * N * H * D);
    OUT(c, "dk", 'f', dk, sizeof(float) * N * KV * D);
    OUT(c, "dv", 'f', dv, sizeof(float) * N * KV * D);
}

static void prefill_case(oc *c, const int32_t *seq, int NS, int H, int KV, int D, int Tm)
{
    prefill_case_f(c, seq, NS, H, KV, D, Tm, 0);
}

/* a3b's heads (32 / 4 of 128) over three sequences of 37, 20 and 37 tokens
 * (two lengths: CUDA's fast prefill batches each length apart, the heads of
 * a group summed into dk, dv), Tm 40 past the longest. */
static void c_attend_gqa_prefill(oc *c)
{
    static const int32_t seq[4] = {0, 37, 57, 94};
    prefill_case(c, seq, 3, 32, 4, 128, 40);
}

/* a3b's heads over sequences of 150, 5 and 71 tokens, Tm 160: CUDA's exact
 * prefill kernel (QUADS_ATT_PREFILL=1) takes tiles of 16 queries x 8 heads
 * and stages 64 positions: a sequence over three stages with a last tile
 * of 6 queries, a tile of 5, one of 7 past four full ones (fast mode's BF16
 * recipes: the fused kernels, att theirs). */
static void c_attend_gqa_prefill_long(oc *c)
{
    static const int32_t seq[4] = {0, 150, 155, 226};
    prefill_case(c, seq, 3, 32, 4, 128, 160);
}

/* Sequences of 65, 1 and 130 tokens, 8 / 2 heads of 64, Tm 131: CUDA's fused
 * fast prefill (BF16 recipes) runs them in tiles of 64 queries and keys, so
 * these cross its tile edges (a query tile over three key tiles, a lone
 * query, a last tile of 1 and of 2 rows). */
static void c_attend_tiles(oc *c)
{
    static const int32_t seq[4] = {0, 65, 66, 196};
    prefill_case(c, seq, 3, 8, 2, 64, 131);
}

/* Sequences of 130, 1 and 69 tokens, 4 / 2 heads of 128, Tm 200 (room for
 * the fused route's scratch): a3b's head width through the fused kernels,
 * whose wgmma variant (QUADS_FLASH_WG=1) takes tiles of 128 rows (64 a
 * warpgroup): a tile of 2 rows past 128, a lone query, a second warpgroup
 * with 5 rows. */
static void c_attend_tiles128(oc *c)
{
    static const int32_t seq[4] = {0, 130, 131, 200};
    prefill_case(c, seq, 3, 4, 2, 128, 200);
}

/* The two cases above with dq, dk, dv set (QD_BWD_DX_SET, the driver's
 * attention backward): the fused kernels write every row once, the other
 * routes add into zeros */
static void c_attend_tiles128_set(oc *c)
{
    static const int32_t seq[4] = {0, 130, 131, 200};
    prefill_case_f(c, seq, 3, 4, 2, 128, 200, QD_BWD_DX_SET);
}

static void c_attend_tiles_set(oc *c)
{
    static const int32_t seq[4] = {0, 65, 66, 196};
    prefill_case_f(c, seq, 3, 8, 2, 64, 131, QD_BWD_DX_SET);
}

static void c_store_kv(oc *c)
{
    int N = 4, Tc = 5, KD = 24;
    int32_t row[4] = {1, 0, 1, 2}, pos[4] = {0, 3, 4, 1};
    float *kr = F(c, (size_t)N * KD, -1, 1), *v = F(c, (size_t)N * KD, -1, 1);
    float *kc = Z(c, sizeof(float) * 3 * Tc * KD), *vc = Z(c, sizeof(float) * 3 * Tc * KD);
    RUN(c, c->ops->store_kv(c->dev, kc, vc, kr, v, I(c, row, N), I(c, pos, N), N, Tc, KD));
    OUT(c, "kc", 'f', kc, sizeof(float) * 3 * Tc * KD);
    OUT(c, "vc", 'f', vc, sizeof(float) * 3 * Tc * KD);
}

static void c_route(oc *c, qd_topk_norm norm)
{
    int N = 13, E = 16, K = 4;
    float *p = F(c, (size_t)N * E, -3, 3), *tw = Z(c, sizeof(float) * N * K);
    int32_t *tk = Z(c, sizeof(int32_t) * N * K);
    RUN(c, c->ops->route(c->dev, tk, tw, p, N, E, K, norm));
    OUT(c, "probs", 'f', p, sizeof(float) * N * E);
    OUT(c, "topk", 'i', tk, sizeof(int32_t) * N * K);
    OUT(c, "topw", 'f', tw, sizeof(float) * N * K);
}

/* The a3b router (128 experts, top 8) over 70 tokens: rows with tied logits,
 * a row with -inf logits (probabilities 0), a row where one logit dominates
 * (the others underflow to 0: ties at zero go to the lower index) and a row of
 * one value. (NaN is left out: its bits differ between CPU and GPU.) */
static void c_route_a3b(oc *c)
{
    enum { N = 70, E = 128, K = 8 };
    float *h = malloc(sizeof(float) * N * E);
    if (!h) {
        c->st = qd_error(QD_ERR_NOMEM, "op case");
        return;
    }
    for (int i = 0; i < N * E; i++)
        h[i] = unif(c, -4, 4);
    for (int n = 0; n < 10; n++)  /* ties: pairs of equal logits */
        for (int e = 0; e + 1 < E; e += 2)
            h[n * E + e + 1] = h[n * E + e];
    for (int e = 0; e < E; e += 3)
        h[11 * E + e] = -INFINITY;
    h[13 * E + 77] = 120.0f;
    for (int e = 0; e < E; e++)
        h[12 * E + e] = 0.5f;
    float *p = up(c, h, sizeof(float) * N * E), *tw = Z(c, sizeof(float) * N * K);
    free(h);
    int32_t *tk = Z(c, sizeof(int32_t) * N * K);
    RUN(c, c->ops->route(c->dev, tk, tw, p, N, E, K, QD_TOPK_RENORM));
    OUT(c, "probs", 'f', p, sizeof(float) * N * E);
    OUT(c, "topk", 'i', tk, sizeof(int32_t) * N * K);
    OUT(c, "topw", 'f', tw, sizeof(float) * N * K);
}

static void c_route_norm(oc *c) { c_route(c, QD_TOPK_RENORM); }
static void c_route_raw(oc *c) { c_route(c, QD_TOPK_PROBS); }

/* moe_group of N tokens x K of E experts; dev: moe_group_dev, the same rows
 * with the offsets left in device memory */
static void moe_group_of(oc *c, int N, int E, int K, int dev)
{
    int32_t *topk = malloc(sizeof(int32_t) * N * K), *exp_off = malloc(sizeof(int32_t) * (E + 1));
    float *topw = malloc(sizeof(float) * N * K);
    if (!topk || !exp_off || !topw) {
        free(topk);
        free(exp_off);
        free(topw);
        c->st = qd_error(QD_ERR_NOMEM, "op case");
        return;
    }
    routing(c, topk, topw, N, E, K);
    int32_t *rt = Z(c, sizeof(int32_t) * N * K), *rr = Z(c, sizeof(int32_t) * N * K);
    int32_t *tr = Z(c, sizeof(int32_t) * N * K), *d_off = dev ? Z(c, sizeof(int32_t) * (E + 1)) : NULL;
    float *rw = Z(c, sizeof(float) * N * K);
    const int32_t *dk = I(c, topk, N * K);
    const float *dw = up(c, topw, sizeof(float) * N * K);
    if (dev) {
        RUN(c, c->ops->moe_group_dev(c->dev, d_off, rt, rw, rr, tr, dk, dw, N, E, K));
        OUT(c, "exp_off", 'i', d_off, sizeof(int32_t) * (E + 1));
    } else {
        RUN(c, c->ops->moe_group(c->dev, exp_off, rt, rw, rr, tr, dk, dw, N, E, K));
        OUT_HOST(c, "exp_off", 'i', exp_off, sizeof(int32_t) * (E + 1));
    }
    OUT(c, "row_tok", 'i', rt, sizeof(int32_t) * N * K);
    OUT(c, "row_w", 'f', rw, sizeof(float) * N * K);
    OUT(c, "row_rank", 'i', rr, sizeof(int32_t) * N * K);
    OUT(c, "tok_rows", 'i', tr, sizeof(int32_t) * N * K);
    free(topk);
    free(exp_off);
    free(topw);
}

static void c_moe_group_dev(oc *c) { moe_group_of(c, 11, 8, 3, 1); }
static void c_moe_group(oc *c) { moe_group_of(c, 11, 8, 3, 0); }
/* a3b's decode at batch 64 (128 experts, top-8), and 300 tokens (masks of 10
 * words an expert, more entries than threads in QUADS_MOE_GROUP1's block) */
static void c_moe_group_dev_a3b(oc *c) { moe_group_of(c, 64, 128, 8, 1); }
static void c_moe_group_300(oc *c) { moe_group_of(c, 300, 16, 4, 0); }

/* gather, swiglu and its backward, combine, moe_dy, unroute, router_backward
 * over one valid routing of N tokens */
static void c_moe_rows_shape(oc *c, int N, int E, int K, int C)
{
    int R = N * K;
    int32_t topk[N * K], tok_rows[R], row_rank[R], exp_off[E + 1], row_tok[R];
    float topw[N * K];
    routing(c, topk, topw, N, E, K);
    rows_of(tok_rows, row_rank, exp_off, topk, topw, N, E, K, row_tok);
    float *x = F(c, (size_t)N * C, -1, 1), *xe = Z(c, sizeof(float) * R * C);
    float *g = F(c, (size_t)R * C, -4, 4), *u = F(c, (size_t)R * C, -2, 2), *h = Z(c, sizeof(float) * R * C);
    float *dh = F(c, (size_t)R * C, -1, 1), *dg = Z(c, sizeof(float) * R * C), *du = Z(c, sizeof(float) * R * C);
    float *rw = F(c, R, 0.1f, 1), *out = Z(c, sizeof(float) * N * C), *dout = F(c, (size_t)N * C, -1, 1);
    float *dy = Z(c, sizeof(float) * R * C), *dwt = Z(c, sizeof(float) * N * K), *dinp = F(c, (size_t)N * C, -1, 1);
    float *probs = F(c, (size_t)N * E, 0.01f, 0.3f), *dlog = Z(c, sizeof(float) * N * E);
    int32_t *dtr = I(c, tok_rows, R), *drr = I(c, row_rank, R), *dtk = I(c, topk, N * K);
    float *dtw = up(c, topw, sizeof topw);
    RUN(c, c->ops->gather(c->dev, xe, x, I(c, row_tok, R), R, C));
    RUN(c, c->ops->swiglu(c->dev, h, g, u, (size_t)R * C));
    RUN(c, c->ops->swiglu_backward(c->dev, dg, du, dh, g, u, (size_t)R * C));
    RUN(c, c->ops->combine(c->dev, out, h, rw, dtr, N, K, C));
    RUN(c, c->ops->moe_dy(c->dev, dy, dwt, dout, h, rw, drr, dtr, N, K, C));
    RUN(c, c->ops->unroute(c->dev, dinp, dy, dtr, N, K, C));
    RUN(c, c->ops->router_backward(c->dev, dlog, dwt, probs, dtk, dtw, N, E, K, QD_TOPK_RENORM));
    OUT(c, "gather", 'f', xe, sizeof(float) * R * C);
    OUT(c, "swiglu", 'f', h, sizeof(float) * R * C);
    OUT(c, "dg", 'f', dg, sizeof(float) * R * C);
    OUT(c, "du", 'f', du, sizeof(float) * R * C);
    OUT(c, "combine", 'f', out, sizeof(float) * N * C);
    OUT(c, "moe_dy", 'f', dy, sizeof(float) * R * C);
    OUT(c, "dwt", 'f', dwt, sizeof(float) * N * K);
    OUT(c, "unroute", 'f', dinp, sizeof(float) * N * C);
}

static void c_moe_rows(oc *c) { c_moe_rows_shape(c, 9, 6, 2, 40); }
/* CUDA's moe_dy takes 32 rows and 128 columns a block: 111 rows, 300 columns */
static void c_moe_rows_wide(oc *c) { c_moe_rows_shape(c, 37, 8, 3, 300); }

/* The experts' backward on BF16 operands (moe_dy16, swiglu_backward16,
 * matmul_grouped_backward16b: CUDA, where experts16 is) against moe_dy,
 * swiglu_backward and matmul_grouped_backward on the same values with their
 * outputs rounded to BF16 (to_bf16: the CPU, which leaves the three NULL),
 * the grouped product once adding to dx and once overwriting (add 0) another:
 * 37 tokens top-3 of 8 experts, rows of 304 (moe_dy's blocks of 32 rows and
 * 128 columns crossed), the down product's shapes (rows x 304 into 48).
 * Then gate's and up's backward as one product (the driver's gate_up_fused):
 * swiglu_backward16 writing [dg | du] rows (ld 2 x 304), and the grouped
 * product of 608 rows (gate's weights then up's) over them, against the CPU's
 * matmul_grouped_backward over the same [dg | du] values (one sum over all
 * 608: the bits of exact mode, whose order is oc ascending), its dw
 * overwritten (QD_BWD_DW_SET, the lazy zero_grad's) for the experts with rows. */
static void c_moe16_backward(oc *c)
{
    enum { N = 37, E = 8, K = 3, C = 304, IC = 48, R = N * K };
    int32_t topk[N * K], tok_rows[R], row_rank[R], exp_off[E + 1];
    float topw[N * K];
    routing(c, topk, topw, N, E, K);
    for (int n = 0; n < N; n++) /* expert E-1 without rows: another expert of none of the token's */
        for (int j = 0; j < K; j++)
            if (topk[n * K + j] == E - 1) {
                int e = 0;
                for (int again = 1; again;) {
                    again = 0;
                    for (int i = 0; i < K; i++)
                        if (topk[n * K + i] == e)
                            again = 1;
                    e += again;
                }
                topk[n * K + j] = e;
            }
    rows_of(tok_rows, row_rank, exp_off, topk, topw, N, E, K, NULL);
    float *y = F(c, (size_t)R * C, -1, 1), *rw = F(c, R, 0.1f, 1), *dout = F(c, (size_t)N * C, -1, 1);
    float *g = F(c, (size_t)R * C, -4, 4), *u = F(c, (size_t)R * C, -2, 2), *dh = F(c, (size_t)R * C, -1, 1);
    float *x = F(c, (size_t)R * IC, -2, 2), *dx = F(c, (size_t)R * IC, -1, 1), *dwt = Z(c, sizeof(float) * N * K);
    float *dx0 = F(c, (size_t)R * IC, -1, 1); /* overwritten (add 0): its values must not count */
    float *dyf = Z(c, sizeof(float) * R * C), *dgf = Z(c, sizeof(float) * R * C), *duf = Z(c, sizeof(float) * R * C);
    uint16_t *dy = Z(c, sizeof(uint16_t) * R * C), *dg = Z(c, sizeof(uint16_t) * R * C);
    uint16_t *du = Z(c, sizeof(uint16_t) * R * C), *xb = Z(c, sizeof(uint16_t) * R * IC);
    const float *w[E];
    float *dw[E];
    for (int e = 0; e < E; e++) {
        float *we = F(c, (size_t)C * IC, -1, 1);
        RUN(c, c->ops->round_bf16(c->dev, we, we, (size_t)C * IC));
        w[e] = we;
        dw[e] = F(c, (size_t)C * IC, -1, 1);
    }
    int32_t *dtr = I(c, tok_rows, R), *drr = I(c, row_rank, R);
    RUN(c, c->ops->round_bf16(c->dev, x, x, (size_t)R * IC)); /* the experts' inputs: BF16 values */
    RUN(c, c->ops->to_bf16(c->dev, xb, x, (size_t)R * IC));
    uint16_t *dgu = Z(c, sizeof(uint16_t) * R * 2 * C);
    float *dxgu = F(c, (size_t)R * IC, -1, 1); /* overwritten */
    const float *wgu[E];
    float *dwgu[E];
    for (int e = 0; e < E; e++) { /* gate's C x IC, then up's */
        float *we = F(c, (size_t)2 * C * IC, -1, 1);
        RUN(c, c->ops->round_bf16(c->dev, we, we, (size_t)2 * C * IC));
        wgu[e] = we;
        dwgu[e] = F(c, (size_t)2 * C * IC, -1, 1);
    }
    if (c->ops->moe_dy16 && c->ops->swiglu_backward16 && c->ops->matmul_grouped_backward16b) {
        RUN(c, c->ops->moe_dy16(c->dev, dy, dwt, dout, y, rw, drr, dtr, N, K, C));
        RUN(c, c->ops->swiglu_backward16(c->dev, dg, du, dh, g, u, (size_t)R, C, C));
        RUN(c, c->ops->matmul_grouped_backward16b(c->dev, dx, dw, dy, xb, w, exp_off, E, IC, C, QD_BWD_DX_ADD));
        RUN(c, c->ops->matmul_grouped_backward16b(c->dev, dx0, dw, dy, xb, w, exp_off, E, IC, C, 0));
        RUN(c, c->ops->swiglu_backward16(c->dev, dgu, dgu + C, dh, g, u, (size_t)R, C, 2 * C));
        RUN(c, c->ops->matmul_grouped_backward16b(c->dev, dxgu, dwgu, dgu, xb, wgu, exp_off, E, IC, 2 * C,
                                                  QD_BWD_DW_SET));
    } else {
        RUN(c, c->ops->moe_dy(c->dev, dyf, dwt, dout, y, rw, drr, dtr, N, K, C));
        RUN(c, c->ops->swiglu_backward(c->dev, dgf, duf, dh, g, u, (size_t)R * C));
        RUN(c, c->ops->to_bf16(c->dev, dy, dyf, (size_t)R * C));
        RUN(c, c->ops->to_bf16(c->dev, dg, dgf, (size_t)R * C));
        RUN(c, c->ops->to_bf16(c->dev, du, duf, (size_t)R * C));
        RUN(c, c->ops->round_bf16(c->dev, dyf, dyf, (size_t)R * C)); /* what the bits hold */
        RUN(c, c->ops->matmul_grouped_backward(c->dev, dx, dw, dyf, x, w, exp_off, E, IC, C));
        RUN(c, c->ops->zero(c->dev, dx0, sizeof(float) * R * IC));
        RUN(c, c->ops->matmul_grouped_backward(c->dev, dx0, dw, dyf, x, w, exp_off, E, IC, C));
        float *dguf = Z(c, sizeof(float) * R * 2 * C); /* the [dg | du] rows' values */
        for (int r = 0; r < R; r++) { /* [dg | du] rows: bits and values */
            RUN(c, c->ops->to_bf16(c->dev, dgu + (size_t)r * 2 * C, dgf + (size_t)r * C, C));
            RUN(c, c->ops->to_bf16(c->dev, dgu + (size_t)r * 2 * C + C, duf + (size_t)r * C, C));
            RUN(c, c->ops->round_bf16(c->dev, dguf + (size_t)r * 2 * C, dgf + (size_t)r * C, C));
            RUN(c, c->ops->round_bf16(c->dev, dguf + (size_t)r * 2 * C + C, duf + (size_t)r * C, C));
        }
        RUN(c, c->ops->zero(c->dev, dxgu, sizeof(float) * R * IC));
        for (int e = 0; e < E; e++) /* QD_BWD_DW_SET: every expert's dw overwritten (no rows: zeros) */
            RUN(c, c->ops->zero(c->dev, dwgu[e], sizeof(float) * 2 * C * IC));
        RUN(c, c->ops->matmul_grouped_backward(c->dev, dxgu, dwgu, dguf, x, wgu, exp_off, E, IC, 2 * C));
    }
    OUT(c, "dy bits", 'b', dy, sizeof(uint16_t) * R * C);
    OUT(c, "dwt", 'f', dwt, sizeof(float) * N * K);
    OUT(c, "dg bits", 'b', dg, sizeof(uint16_t) * R * C);
    OUT(c, "du bits", 'b', du, sizeof(uint16_t) * R * C);
    OUT(c, "dx", 'f', dx, sizeof(float) * R * IC);
    OUT(c, "dx (add 0)", 'f', dx0, sizeof(float) * R * IC);
    for (int e = 0; e < E; e++) {
        char name[8];
        snprintf(name, sizeof name, "dw%d", e);
        OUT(c, name, 'f', dw[e], sizeof(float) * C * IC);
    }
    OUT(c, "[dg | du] bits", 'b', dgu, sizeof(uint16_t) * R * 2 * C);
    OUT(c, "dx gate|up", 'f', dxgu, sizeof(float) * R * IC);
    for (int e = 0; e < E; e++) {
        char name[16];
        snprintf(name, sizeof name, "dw gate|up %d", e);
        OUT(c, name, 'f', dwgu[e], sizeof(float) * 2 * C * IC);
    }
}

static void c_router_backward(oc *c, qd_topk_norm norm)
{
    enum { N = 7, E = 10, K = 3 };
    int32_t topk[N * K];
    float topw[N * K], p[N * E];
    routing(c, topk, topw, N, E, K);
    for (int n = 0; n < N; n++) {  /* a softmax row */
        float s = 0;
        for (int e = 0; e < E; e++)
            s += p[n * E + e] = unif(c, 0.1f, 1);
        for (int e = 0; e < E; e++)
            p[n * E + e] /= s;
    }
    float *dlog = Z(c, sizeof(float) * N * E), *dwt = F(c, N * K, -1, 1);
    RUN(c, c->ops->router_backward(c->dev, dlog, dwt, up(c, p, sizeof p), I(c, topk, N * K), up(c, topw, sizeof topw),
                                   N, E, K, norm));
    OUT(c, "dlog", 'f', dlog, sizeof(float) * N * E);
}

static void c_router_backward_renorm(oc *c) { c_router_backward(c, QD_TOPK_RENORM); }
static void c_router_backward_raw(oc *c) { c_router_backward(c, QD_TOPK_PROBS); }

static void c_logprob(oc *c, float T)
{
    int N = 6, V = 300;
    int32_t tgt[6] = {5, -1, 299, 0, 17, -1};
    float *l = F(c, (size_t)N * V, -8, 8), *lp = Z(c, sizeof(float) * N), *lse = Z(c, sizeof(float) * N);
    float *dl = Z(c, sizeof(float) * N * V), *dlp = F(c, N, -1, 1);
    int32_t *dt = I(c, tgt, N);
    RUN(c, c->ops->logprob(c->dev, lp, lse, l, dt, N, V, T));
    RUN(c, c->ops->logprob_backward(c->dev, dl, dlp, l, lse, dt, N, V, T));
    OUT(c, "logp", 'f', lp, sizeof(float) * N);
    OUT(c, "lse", 'f', lse, sizeof(float) * N);
    OUT(c, "dlogits", 'f', dl, sizeof(float) * N * V);
}

static void c_logprob_t1(oc *c) { c_logprob(c, 1.0f); }
static void c_logprob_t07(oc *c) { c_logprob(c, 0.7f); }

static void c_sample(oc *c, int V, qd_sample_params sp)
{
    enum { B = 5 };
    uint64_t sid[B] = {1, 2, 3, 2, 99};
    uint32_t pos[B] = {4, 4, 9, 5, 0};
    float *l = F(c, (size_t)B * V, -6, 6);
    qd_sample_result r[B];
    RUN(c, c->ops->sample(c->dev, r, l, B, V, &sp, sid, pos));
    OUT_HOST(c, "results", 'b', r, sizeof r);
}

static void c_sample_cut(oc *c)
{
    c_sample(c, 300, (qd_sample_params){.temperature = 0.8f, .top_k = 50, .top_p = 0.9f, .seed = 7});
}

static void c_sample_full(oc *c)
{
    c_sample(c, 5000, (qd_sample_params){.temperature = 1.0f, .top_p = 1.0f, .seed = 11});
}

static void c_sample_hot(oc *c)
{
    c_sample(c, 300, (qd_sample_params){.temperature = 1.3f, .top_p = 1.0f, .seed = 12});
}

/* more tokens than one block of CUDA's k_sample_max takes (2,048), V not a
 * multiple of it, and lanes of 39 tokens */
static void c_sample_wide(oc *c)
{
    c_sample(c, 40000, (qd_sample_params){.temperature = 0.9f, .top_p = 1.0f, .seed = 14});
}

static void c_sample_wide_greedy(oc *c)
{
    c_sample(c, 40000, (qd_sample_params){.temperature = 0.0f, .top_p = 1.0f, .seed = 15});
}

static void c_sample_greedy(oc *c)
{
    c_sample(c, 2100, (qd_sample_params){.temperature = 0.0f, .top_k = 5, .top_p = 0.5f, .seed = 13});
}

/* The lm_head's backward from the log-probs: the ops' head_backward where it
 * fuses (the CUDA fast mode: dlogits' BF16 bits a block of columns at a time,
 * never stored), else logprob_backward then matmul_backward, as the driver;
 * then again with its dw overwritten (QD_BWD_DW_SET: the driver zeroes it
 * first where the op does not fuse). */
static void c_head_backward(oc *c)
{
    int N = 37, IC = 72, V = 304;
    float T = 0.7f;
    int32_t tgt[37];
    for (int n = 0; n < N; n++)
        tgt[n] = n % 9 == 4 ? -1 : irand(c, V);
    float *l = F(c, (size_t)N * V, -8, 8), *lp = Z(c, sizeof(float) * N), *lse = Z(c, sizeof(float) * N);
    float *dlp = F(c, N, -1, 1), *x = F(c, (size_t)N * IC, -1, 1), *w = F(c, (size_t)V * IC, -1, 1);
    float *dx = F(c, (size_t)N * IC, -1, 1), *dw = F(c, (size_t)V * IC, -1, 1);
    int32_t *dt = I(c, tgt, N);
    RUN(c, c->ops->round_bf16(c->dev, x, x, (size_t)N * IC)); /* BF16 values, as the recipes make them */
    RUN(c, c->ops->round_bf16(c->dev, w, w, (size_t)V * IC));
    RUN(c, c->ops->logprob(c->dev, lp, lse, l, dt, N, V, T));
    float *dw2 = F(c, (size_t)V * IC, -1, 1); /* overwritten (QD_BWD_DW_SET): its values must not count */
    for (int k = 0; k < 2; k++) {
        float *g = k ? dw2 : dw;
        qd_status st = QD_ERR_UNSUPPORTED;
        if (!c->st && c->ops->head_backward)
            st = c->ops->head_backward(c->dev, dx, g, dlp, l, lse, dt, x, w, N, IC, V, T, k ? QD_BWD_DW_SET : 0);
        if (st == QD_ERR_UNSUPPORTED) {
            float *dl = Z(c, sizeof(float) * (size_t)N * V);
            if (k)
                RUN(c, c->ops->zero(c->dev, g, sizeof(float) * (size_t)V * IC));
            RUN(c, c->ops->logprob_backward(c->dev, dl, dlp, l, lse, dt, N, V, T));
            RUN(c, c->ops->matmul_backward(c->dev, dx, g, dl, x, w, N, IC, V, 0));
        } else if (!c->st) {
            c->st = st;
        }
    }
    OUT(c, "dx", 'f', dx, sizeof(float) * N * IC); /* added to twice */
    OUT(c, "dw", 'f', dw, sizeof(float) * V * IC);
    OUT(c, "dw_set", 'f', dw2, sizeof(float) * V * IC);
}

/* AdamW over a length that is not a multiple of 4, from an address off 16
 * bytes, and from one on them (the CUDA kernel's 4-wide path and its tail) */
static void c_adamw_ragged(oc *c)
{
    size_t n = 10003;
    float *g = F(c, n + 1, -1, 1), *p = F(c, n + 1, -1, 1), *m = F(c, n + 1, -0.1f, 0.1f), *v = F(c, n + 1, 0, 0.01f);
    qd_adamw o = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1};
    RUN(c, c->ops->adamw(c->dev, p, g, m, v, n, &o, 0.1f, 0.5f, 0.1f, 0.0975f));
    RUN(c, c->ops->adamw(c->dev, p + 1, g + 1, m + 1, v + 1, n, &o, 0.0f, 0.25f, 0.19f, 0.0975f));
    OUT(c, "p", 'f', p, sizeof(float) * (n + 1));
    OUT(c, "m", 'f', m, sizeof(float) * (n + 1));
    OUT(c, "v", 'f', v, sizeof(float) * (n + 1));
}

/* adamw_round where the backend has it, else adamw then round_bf16: the
 * master, the moments and the BF16 working copy (ragged length, 4-wide body) */
static void c_adamw_round(oc *c)
{
    size_t n = 10003;
    float *g = F(c, n, -1, 1), *p = F(c, n, -1, 1), *m = F(c, n, -0.1f, 0.1f), *v = F(c, n, 0, 0.01f);
    float *wk = Z(c, sizeof(float) * n);
    qd_adamw o = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1};
    if (c->ops->adamw_round) {
        RUN(c, c->ops->adamw_round(c->dev, p, g, m, v, wk, n, &o, 0.1f, 0.5f, 0.1f, 0.0975f));
    } else {
        RUN(c, c->ops->adamw(c->dev, p, g, m, v, n, &o, 0.1f, 0.5f, 0.1f, 0.0975f));
        RUN(c, c->ops->round_bf16(c->dev, wk, p, n));
    }
    OUT(c, "p", 'f', p, sizeof(float) * n);
    OUT(c, "m", 'f', m, sizeof(float) * n);
    OUT(c, "v", 'f', v, sizeof(float) * n);
    OUT(c, "wk", 'f', wk, sizeof(float) * n);
}

static void c_sumsq_adamw(oc *c)
{
    size_t n = 10000, nch = (n + 4095) / 4096;
    float *g = F(c, n, -1, 1), *p = F(c, n, -1, 1), *m = F(c, n, -0.1f, 0.1f), *v = F(c, n, 0, 0.01f);
    double *part = Z(c, sizeof(double) * nch);
    qd_adamw o = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1};
    RUN(c, c->ops->sumsq_chunks(c->dev, part, g, n));
    RUN(c, c->ops->adamw(c->dev, p, g, m, v, n, &o, 0.1f, 0.5f, 0.1f, 0.0975f));
    OUT(c, "chunks", 'd', part, sizeof(double) * nch);
    OUT(c, "p", 'f', p, sizeof(float) * n);
    OUT(c, "m", 'f', m, sizeof(float) * n);
    OUT(c, "v", 'f', v, sizeof(float) * n);
}

/* more chunks than one CUDA block's 128, the last one ragged */
static void c_sumsq_long(oc *c)
{
    size_t n = 2 * 128 * 4096 + 1000, nch = (n + 4095) / 4096;
    float *g = F(c, n, -1, 1);
    double *part = Z(c, sizeof(double) * nch);
    RUN(c, c->ops->sumsq_chunks(c->dev, part, g, n));
    OUT(c, "chunks", 'd', part, sizeof(double) * nch);
}

/* dev to dev: the input's bytes (a weight sync between instances) */
static void c_copy(oc *c)
{
    float *x = F(c, 1001, -3.0f, 3.0f), *y = Z(c, sizeof(float) * 1001);
    RUN(c, c->ops->copy(c->dev, y, x, sizeof(float) * 1001));
    OUT(c, "y", 'f', y, sizeof(float) * 1001);
    OUT(c, "x", 'f', x, sizeof(float) * 1001);
}

/* The BF16-weight twins (a lean rollout's embedding, router, lm_head): the
 * weights rounded to BF16 as float32 (w) and as bits (to_bf16); outputs "y"
 * of the twin and "ref" of the float op on the same values, which must be
 * the same bytes (suite ops). */
static uint16_t *w16_of(oc *c, float *w, size_t n)
{
    uint16_t *w16 = Z(c, sizeof(uint16_t) * n);
    RUN(c, c->ops->round_bf16(c->dev, w, w, n));
    RUN(c, c->ops->to_bf16(c->dev, w16, w, n));
    return w16;
}

static void c_embed_w16(oc *c)
{
    int V = 50, C = 64, N = 9;
    int32_t tok[9];
    for (int n = 0; n < N; n++)
        tok[n] = n == 3 ? tok[1] : irand(c, V);
    float *emb = F(c, (size_t)V * C, -3e5f, 3e5f), *x = Z(c, sizeof(float) * N * C), *r = Z(c, sizeof(float) * N * C);
    uint16_t *e16 = w16_of(c, emb, (size_t)V * C);
    int32_t *dt = I(c, tok, N);
    RUN(c, c->ops->embed_w16(c->dev, x, e16, dt, N, C));
    RUN(c, c->ops->embed(c->dev, r, emb, dt, N, C));
    OUT(c, "y", 'f', x, sizeof(float) * N * C);
    OUT(c, "ref", 'f', r, sizeof(float) * N * C);
    OUT(c, "bits", 'b', e16, sizeof(uint16_t) * V * C);
}

static void c_matmul_w16_shape(oc *c, qd_prec prec, int N, int IC, int OC)
{
    float *x = F(c, (size_t)N * IC, -1, 1), *w = F(c, (size_t)OC * IC, -1, 1);
    float *y = Z(c, sizeof(float) * N * OC), *r = Z(c, sizeof(float) * N * OC);
    if (prec == QD_PREC_BF16)
        RUN(c, c->ops->round_bf16(c->dev, x, x, (size_t)N * IC));
    uint16_t *w16 = w16_of(c, w, (size_t)OC * IC);
    RUN(c, c->ops->matmul_w16(c->dev, y, x, w16, N, IC, OC, prec));
    RUN(c, c->ops->matmul(c->dev, r, x, w, N, IC, OC, prec));
    OUT(c, "y", 'f', y, sizeof(float) * N * OC);
    OUT(c, "ref", 'f', r, sizeof(float) * N * OC);
}

static void c_matmul_w16_bf16(oc *c) { c_matmul_w16_shape(c, QD_PREC_BF16, 70, 136, 300); }
/* the router's shape at batch 64 (CUDA: the thin tiles) */
static void c_matmul_w16_router(oc *c) { c_matmul_w16_shape(c, QD_PREC_BF16, 64, 2048, 128); }
/* float32 inputs (nvfp4-w16a4's fake-quantized activations) */
static void c_matmul_w16_f32(oc *c) { c_matmul_w16_shape(c, QD_PREC_F32, 37, 72, 45); }
/* Batch-1 and few-row decode shapes (CUDA's k_matvec_wt for at most 8 rows):
 * the lm_head's K with ragged outputs, 4 rows, and 5 rows (the 8-row variant
 * with 3 idle). */
static void c_matmul_w16_row1(oc *c) { c_matmul_w16_shape(c, QD_PREC_F32, 1, 2048, 1100); }
static void c_matmul_w16_row4(oc *c) { c_matmul_w16_shape(c, QD_PREC_BF16, 4, 520, 300); }
static void c_matmul_f32_row5(oc *c) { c_matmul_shape(c, QD_PREC_F32, 5, 136, 260, 1.0f); }

/* The row block-floating-point product's cases: host x (N, IC) and BF16
 * weights (OC, IC) (both NULL, the case failed, when out of memory). */
static int bfp_host(oc *c, int N, int IC, int OC, float **xh, uint16_t **wh)
{
    *xh = malloc(sizeof(float) * (size_t)N * IC);
    *wh = malloc(sizeof(uint16_t) * (size_t)OC * IC);
    if (*xh && *wh)
        return 1;
    free(*xh), free(*wh);
    c->st = qd_error(QD_ERR_NOMEM, "op case");
    return 0;
}

/* ... uploaded (and freed), bfp_weights and matmul_bfp run; outputs the
 * weights' layout (bytes), with floats also the layout bfp_weights makes from
 * the same weights as floats (a seventh of them not BF16 values: rounded
 * first), and y. */
static void bfp_run(oc *c, float *xh, uint16_t *wh, int N, int IC, int OC, int floats)
{
    float *wfh = floats ? malloc(sizeof(float) * (size_t)OC * IC) : NULL;
    for (size_t i = 0; wfh && i < (size_t)OC * IC; i++)
        wfh[i] = i % 7 ? qd_bf16_to_f32(wh[i]) : qd_bits_f32(((uint32_t)wh[i] << 16) | (i % 3 ? 0x7fffu : 0x8000u));
    float *x = up(c, xh, sizeof(float) * (size_t)N * IC);
    uint16_t *w = up(c, wh, sizeof(uint16_t) * (size_t)OC * IC);
    float *wf = wfh ? up(c, wfh, sizeof(float) * (size_t)OC * IC) : NULL;
    free(xh), free(wh), free(wfh);
    if (floats && !wf && !c->st)
        c->st = qd_error(QD_ERR_NOMEM, "op case");
    void *wq = Z(c, qd_bfp_bytes(OC, IC)), *wq2 = floats ? Z(c, qd_bfp_bytes(OC, IC)) : NULL;
    float *y = Z(c, sizeof(float) * (size_t)N * OC);
    if (!c->ops->bfp_weights || !c->ops->matmul_bfp) {
        c->st = c->st ? c->st : qd_error(QD_ERR_UNSUPPORTED, "op case: no matmul_bfp");
        return;
    }
    RUN(c, c->ops->bfp_weights(c->dev, wq, w, NULL, OC, IC));
    if (floats)
        RUN(c, c->ops->bfp_weights(c->dev, wq2, NULL, wf, OC, IC));
    RUN(c, c->ops->matmul_bfp(c->dev, y, x, wq, N, IC, OC));
    OUT(c, "wq", 'b', wq, qd_bfp_bytes(OC, IC));
    if (floats)
        OUT(c, "wq of floats", 'b', wq2, qd_bfp_bytes(OC, IC));
    OUT(c, "y", 'f', y, sizeof(float) * (size_t)N * OC);
}

/* Rows of x over a wide range (kinds first, first + 1, ...: 0 zeros, 1 with
 * an infinity, 2 subnormal, the others scaled by 2^k, k per element in a
 * row's window of 24 binades), BF16 weights down to 2^-12 of their rows'
 * largest (the small ones' low bits rounded), weight row 3 with a NaN, row 4
 * zeros; the weights also as floats. */
static void c_matmul_bfp_rows(oc *c, int N, int IC, int OC, int first)
{
    float *xh;
    uint16_t *wh;
    if (!bfp_host(c, N, IC, OC, &xh, &wh))
        return;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < IC; i++) {
            float v = unif(c, -1, 1);
            int kind = n + first;
            if (kind == 0)
                v = 0.0f;
            else if (kind == 1 && i == 5)
                v = INFINITY;
            else if (kind == 2)
                v *= 1e-39f;
            else
                v = ldexpf(v, irand(c, 24) + (kind % 7) * 9 - 40);
            xh[(size_t)n * IC + i] = v;
        }
    for (int o = 0; o < OC; o++)
        for (int i = 0; i < IC; i++) {
            float v = o == 4 ? 0.0f : ldexpf(unif(c, -1, 1), -irand(c, 12) + (o % 5) * 3 - 6);
            wh[(size_t)o * IC + i] = o == 3 && i == 7 ? 0x7fc1 : qd_bf16_from_f32(v);
        }
    bfp_run(c, xh, wh, N, IC, OC, 1);
}

/* CUDA's three tile shapes (at most 16 rows, 32, more), K past a stage's 64
 * (208: a partial last stage) and the lm_head's 2048, ragged outputs; at most
 * 4 rows its dp4a kernel (k_matvec_bfp; QUADS_BFP_MATVEC=0 leaves it out) */
static void c_matmul_bfp_row1(oc *c) { c_matmul_bfp_rows(c, 1, 2048, 300, 3); }
static void c_matmul_bfp_row2(oc *c) { c_matmul_bfp_rows(c, 2, 208, 133, 5); }
static void c_matmul_bfp_row3(oc *c) { c_matmul_bfp_rows(c, 3, 16, 70, 1); }
static void c_matmul_bfp_row4(oc *c) { c_matmul_bfp_rows(c, 4, 2064, 41, 0); }
static void c_matmul_bfp_few(oc *c) { c_matmul_bfp_rows(c, 5, 64, 40, 0); }
static void c_matmul_bfp_lm(oc *c) { c_matmul_bfp_rows(c, 27, 2048, 300, 0); }
static void c_matmul_bfp_tall(oc *c) { c_matmul_bfp_rows(c, 70, 208, 133, 0); }
/* decode at batch 64: one 64-row tile of x on the wgmma kernel (QUADS_BFP_WGMMA=1), vocabulary
 * rows past a 128-row tile */
static void c_matmul_bfp_b64(oc *c) { c_matmul_bfp_rows(c, 64, 2048, 260, 0); }
static void c_matmul_bfp_k16(oc *c) { c_matmul_bfp_rows(c, 130, 16, 70, 0); }

/* The widest rows (IC 16384) at the mantissas' extremes: x = +-(2 - 2^-23) 2^k
 * (X = +-2^22 after rounding up), w = +-1.9921875 2^j (W = +-32640), signs
 * matched so that |S| and every int32 sum of the CUDA kernel are largest;
 * a second row of x with all its low bytes 255 (X = 2^22 - 1 - 65536 a). */
static void c_matmul_bfp_edge(oc *c)
{
    const int N = 3, IC = 16384, OC = 24;
    float *xh;
    uint16_t *wh;
    if (!bfp_host(c, N, IC, OC, &xh, &wh))
        return;
    for (int i = 0; i < IC; i++) {
        float sg = (i * 2654435761u) >> 31 ? -1.0f : 1.0f;
        xh[i] = sg * qd_bits_f32(0x3fffffffu);                        /* E 0, X = +-2^22 */
        xh[IC + i] = sg * (float)(4194303 - 65536 * (i % 64)) / 2097152.0f; /* xm = xl = 255 */
        xh[2 * IC + i] = ldexpf(xh[IC + i], -(i % 40));
    }
    for (int o = 0; o < OC; o++)
        for (int i = 0; i < IC; i++) {
            float sg = ((i * 2654435761u) >> 31) ^ (o & 1) ? -1.0f : 1.0f;
            float v = o < 8 ? 1.9921875f : o < 16 ? ldexpf(1.0f + (float)((o * 31 + i) % 128) / 128.0f, -(i % 8))
                                                  : ldexpf(1.9921875f, -(i % 16));
            wh[(size_t)o * IC + i] = qd_bf16_from_f32(sg * v);
        }
    bfp_run(c, xh, wh, N, IC, OC, 0);
}

typedef struct {
    qd_op_case_info info;
    void (*run)(oc *c);
} op_case;

static const op_case cases[] = {
    {{"round_bf16 1001", "round_bf16", 0, 0}, c_round_bf16},
    {{"add 777", "add", 0, 0}, c_add},
    {{"embed+backward 9x64 V50", "embed", 0, 0}, c_embed},
    {{"embed+backward 77x72 V5", "embed", 0, 0}, c_embed_repeats},
    {{"embed+backward 700x200 V9", "embed_backward", 0, 0}, c_embed_sorted},
    {{"embed+backward 600x136 V500", "embed_backward", 0, 0}, c_embed_sorted_many},
    {{"rmsnorm+backward 9x80", "rmsnorm", 0, 0}, c_rmsnorm},
    {{"rmsnorm+backward 3x2050", "rmsnorm", 0, 0}, c_rmsnorm_odd},
    {{"rmsnorm+backward 3000x128", "rmsnorm_backward", 1, 0}, c_rmsnorm_tall},
    {{"rmsnorm+backward 700x2050", "rmsnorm_backward", 1, 0}, c_rmsnorm_wide},
    {{"rmsnorm+backward 77x250", "rmsnorm", 0, 0}, c_rmsnorm_rows},
    {{"rmsnorm+backward 700x136 set", "rmsnorm_backward", 1, 0}, c_rmsnorm_set},
    {{"rope fwd+inverse 5x3x16", "rope", 0, 0}, c_rope},
    {{"rope fwd+inverse 9x5x128", "rope", 0, 0}, c_rope_wide},
    {{"add_rmsnorm 9x80", "add_rmsnorm", 0, 0}, c_add_rmsnorm},
    {{"add_rmsnorm 5x2050", "add_rmsnorm", 0, 0}, c_add_rmsnorm_wide},
    {{"combine_add_rmsnorm 9x80 k2 q", "combine_add_rmsnorm", 0, 0}, c_combine_norm},
    {{"combine_add_rmsnorm 5x2050 k8", "combine_add_rmsnorm", 0, 0}, c_combine_norm_wide},
    {{"combine_add_rmsnorm 300x1024 k4", "combine_add_rmsnorm", 0, 0}, c_combine_norm_k4},
    {{"combine_add_rmsnorm 64x2048 k8 q", "combine_add_rmsnorm", 0, 0}, c_combine_norm_q},
    {{"add_rmsnorm 200x2048 q", "add_rmsnorm", 0, 0}, c_add_rmsnorm_q},
    {{"swiglu_nvfp4 7x48", "swiglu_nvfp4", 0, 0}, c_swiglu_nvfp4},
    {{"swiglu_nvfp4 300x768", "swiglu_nvfp4", 0, 0}, c_swiglu_nvfp4_wide},
    {{"gather_nvfp4 9 tokens x2 of 6 experts, 80", "gather_nvfp4", 0, 0}, c_gather_nvfp4},
    {{"gather_nvfp4 64 tokens x8 of 128 experts, 2048", "gather_nvfp4", 0, 0}, c_gather_nvfp4_b64},
    {{"gather_nvfp4 keep 0 64 tokens x8, 2048", "gather_nvfp4", 0, 0}, c_gather_nvfp4_drop},
    {{"gather_nvfp4 keep 0 9 tokens x2, 80", "gather_nvfp4", 0, 0}, c_gather_nvfp4_drop80},
    {{"qk_norm_rope 5x4/2x16", "qk_norm_rope", 0, 0}, c_qk_norm_rope},
    {{"qk_norm_rope 3x32/4x128", "qk_norm_rope", 0, 0}, c_qk_norm_rope_wide},
    {{"qk_norm_rope 40x3/1x64 no cache", "qk_norm_rope", 0, 0}, c_qk_norm_rope_nocache},
    {{"matmul f32 37x72x45", "matmul", 1, 0}, c_matmul_f32},
    {{"matmul bf16 37x72x45", "matmul", 1, 0}, c_matmul_bf16},
    {{"matmul f32 37x36x45", "matmul", 1, 0}, c_matmul_f32_odd},
    {{"matmul bf16 70x136x300", "matmul", 1, 0}, c_matmul_bf16_wide},
    {{"matmul bf16 tiny products 9x64x140", "matmul", 1, 0}, c_matmul_bf16_tiny},
    {{"matmul bf16 router 64x2048x128", "matmul", 1, 0}, c_matmul_router},
    {{"matmul f32 33x520x70", "matmul", 1, 0}, c_matmul_f32_thin},
    {{"matmul bf16 1x256x2085", "matmul", 1, 0}, c_matmul_bf16_row1},
    {{"matmul f32 3x136x1100", "matmul", 1, 0}, c_matmul_f32_row3},
    {{"matmul bf16 router 1x2048x128", "matmul", 1, 0}, c_matmul_bf16_router1},
    {{"matmul f32 1x264x70", "matmul", 1, 0}, c_matmul_f32_row1_chain},
    {{"matmul bf16 1x776x37", "matmul", 1, 0}, c_matmul_bf16_row1_chain},
    {{"matmul bf16 2x264x4500", "matmul", 1, 0}, c_matmul_bf16_row2_wide},
    {{"matmul f32 5x136x260", "matmul", 1, 0}, c_matmul_f32_row5},
    {{"matmul_backward 37x72x45", "matmul_backward", 1, 0}, c_matmul_backward},
    {{"matmul_backward 40x72x48", "matmul_backward", 1, 0}, c_matmul_backward8},
    {{"matmul_backward 37x72x45 set", "matmul_backward", 1, 0}, c_matmul_backward_set},
    {{"matmul_backward 40x72x48 set", "matmul_backward", 1, 0}, c_matmul_backward8_set},
    {{"matmul_grouped+bwd 4 experts", "matmul_grouped", 1, 0}, c_matmul_grouped},
    {{"matmul_grouped+bwd bf16 4 experts", "matmul_grouped", 1, 0}, c_matmul_grouped_bf16},
    {{"matmul_grouped bf16 400x256x200", "matmul_grouped", 1, 0}, c_matmul_grouped_wide},
    {{"experts16 4 experts 48x40", "matmul_grouped", 1, 0}, c_experts16},
    {{"moe16 backward 37x3 of 8, 304x48", "matmul_grouped", 1, 0}, c_moe16_backward},
    {{"fp8 quantize+gemm 6x20x48", "fp8_gemm", 1, 0}, c_fp8},
    {{"fp8_gemm_grouped 4 experts", "fp8_gemm_grouped", 1, 0}, c_fp8_grouped},
    {{"fp8_gemm_grouped 5 experts 0-70 rows 80x272", "fp8_gemm_grouped", 1, 0}, c_fp8_grouped_wide},
    {{"nvfp4 quantize+fake 7x96", "nvfp4_quantize", 0, 0}, c_nvfp4},
    {{"w4a4_gemm 9x40x512", "w4a4_gemm", 1, 0}, c_w4a4},
    {{"w4a4_gemm_grouped 4 experts", "w4a4_gemm_grouped", 0, 0}, c_w4a4_grouped},
    {{"w4a4_gemm_grouped decode 6 experts 40x2112", "w4a4_gemm_grouped", 0, 0}, c_w4a4_grouped_decode},
    {{"w4a4_grouped_dev 6 experts 40x2112", "w4a4_gemm_grouped_dev", 0, 0}, c_w4a4_grouped_dev},
    {{"w4a4_grouped_dev 9 rows", "w4a4_gemm_grouped_dev", 0, 0}, c_w4a4_grouped_dev9},
    {{"w4a4_grouped_dev 6 experts 100 rows", "w4a4_gemm_grouped_dev", 0, 0}, c_w4a4_grouped_dev40},
    {{"w4a4_gemm_grouped 5 experts 456x768 pairs", "w4a4_gemm_grouped", 0, 0}, c_w4a4_grouped_pair},
    {{"w4a4_gemm_grouped decode 7 experts 0-16 rows 100x1024", "w4a4_gemm_grouped", 0, 0}, c_w4a4_grouped_b64},
    {{"w4a4_grouped_dev 7 experts 0-16 rows 100x1024", "w4a4_gemm_grouped_dev", 0, 0}, c_w4a4_grouped_dev_b64},
    {{"w4a4_gemm_grouped 4 experts 0-25 rows 72x1024", "w4a4_gemm_grouped", 0, 0}, c_w4a4_grouped_b256},
    {{"w4a4_grouped_dev batch 1 8x48x768", "w4a4_gemm_grouped_dev", 0, 0}, c_w4a4_grouped_dev1},
    {{"w4a4_gemm_grouped prefill 130+70 x 5650x48", "w4a4_gemm_grouped", 0, 0}, c_w4a4_grouped_prefill},
    {{"w4a4_gemm_grouped prefill 150+0+70 x 200x384", "w4a4_gemm_grouped", 0, 0}, c_w4a4_grouped_prefill384},
    {{"w4a4_gemm_grouped decode 7 experts 0-16 rows 100x960", "w4a4_gemm_grouped", 0, 0}, c_w4a4_grouped_b64_rac},
    {{"w4a4_grouped_dev 7 experts 0-16 rows 100x960", "w4a4_gemm_grouped_dev", 0, 0}, c_w4a4_grouped_dev_b64_rac},
    {{"w4a4_gemm_grouped prefill 150+0+70 x 200x960", "w4a4_gemm_grouped", 0, 0}, c_w4a4_grouped_prefill960},
    {{"w4a4_gemm 1x72x768", "w4a4_gemm", 1, 0}, c_w4a4_row1},
    {{"w4a4_gemm 1x37x4496", "w4a4_gemm", 1, 0}, c_w4a4_rac_width},
    {{"w4a4_gemm 3x70x80", "w4a4_gemm", 1, 0}, c_w4a4_tiny_rac},
    {{"w4a4_gemm 5x45x1072", "w4a4_gemm", 1, 0}, c_w4a4_rows5},
    {{"w4a4_gemm_multi 1x2048 x 96/16/24", "w4a4_gemm_multi", 1, 0}, c_w4a4_multi_qkv},
    {{"w4a4_gemm_multi 3x80 x 70/24/24", "w4a4_gemm_multi", 1, 0}, c_w4a4_multi_tiny},
    {{"w4a4_gemm_multi 9x64 x 40/8", "w4a4_gemm_multi", 1, 0}, c_w4a4_multi_rows9},
    {{"w4a4_gemm 50x72x4096", "w4a4_gemm", 1, 0}, c_w4a4_rows50},
    {{"w4a4_gemm_multi 40x512 x 96/16/16", "w4a4_gemm_multi", 1, 0}, c_w4a4_multi_rows40},
    {{"nvfp4_quantize_weights 70 x 24x96", "nvfp4_quantize_weights", 0, 0}, c_quantize_weights},
    {{"nvfp4_quantize_weights 67 x 10x64+16", "nvfp4_quantize_weights", 0, 0}, c_quantize_weights_rac},
    {{"nvfp4_quantize_weights 6 x 100x768+192", "nvfp4_quantize_weights", 0, 0}, c_quantize_weights_rac_wide},
    {{"nvfp4_fake_quant_weights 70 x 24x96", "nvfp4_fake_quant_weights", 0, 0}, c_fake_quant_weights},
    {{"rac error+augment 6x64+16", "rac_augment_act", 0, 0}, c_rac},
    {{"rac error+augment 1x2048+192", "rac_augment_act", 0, 0}, c_rac_decode},
    {{"rac error+augment 3x4096+400", "rac_augment_act", 0, 0}, c_rac_decode_o},
    {{"rac_select 205 linears", "rac_select", 0, 0}, c_rac_select},
    {{"rac_select 14 edges x 4 ratios", "rac_select", 0, 0}, c_rac_select_edges},
    {{"rac_grouped 4 experts 64+16", "rac_grouped", 0, 0}, c_rac_grouped},
    {{"rac_multi q/k/v 3x64+16/32/0", "rac_multi", 0, 0}, c_rac_multi_qkv},
    {{"rac_multi q/k/v 1x2048+192", "rac_multi", 0, 0}, c_rac_multi_decode},
    {{"rac_multi gate/up 4 experts 64+16", "rac_multi", 0, 0}, c_rac_multi_experts},
    {{"rac_multi_dev gate/up 4 experts", "rac_multi_dev", 0, 0}, c_rac_multi_dev},
    {{"rac_fake_quant 7x64+32", "rac_fake_quant", 0, 0}, c_rac_fake_quant},
    {{"sqerr_rows 11x70", "sqerr_rows", 0, 0}, c_sqerr_rows},
    {{"sqerr_rows 300x200", "sqerr_rows", 0, 0}, c_sqerr_rows_tiles},
    {{"diag_add 23 rows 5+3 segments", "diag_add", 0, 0}, c_diag_add},
    {{"sqerr_weights 3x150x80", "sqerr_weights", 0, 0}, c_sqerr_weights},
    {{"attend prefill 2 seqs", "attend", 1, 0}, c_attend},
    {{"attend decode 3 rows", "attend", 1, 0}, c_attend_decode},
    {{"attend decode gqa 32/4x128", "attend", 1, 0}, c_attend_gqa},
    {{"attend decode gqa 1 query at 299", "attend", 1, 0}, c_attend_gqa_long},
    {{"attend decode gqa 16/4x64 to 299", "attend", 1, 0}, c_attend_gqa4},
    {{"attend_backward 2 seqs", "attend_backward", 1, 0}, c_attend_backward},
    {{"attend+bwd gqa prefill 37,20,37", "attend_backward", 1, 0}, c_attend_gqa_prefill},
    {{"attend+bwd gqa prefill 150,5,71", "attend_backward", 1, 1}, c_attend_gqa_prefill_long},
    {{"attend+bwd tiles 65,1,130 8/2x64", "attend_backward", 1, 1}, c_attend_tiles},
    {{"attend+bwd tiles 130,1,69 4/2x128", "attend_backward", 1, 1}, c_attend_tiles128},
    {{"attend+bwd tiles 130,1,69 set", "attend_backward", 1, 1}, c_attend_tiles128_set},
    {{"attend+bwd tiles 65,1,130 set", "attend_backward", 1, 1}, c_attend_tiles_set},
    {{"store_kv 4 tokens", "store_kv", 0, 0}, c_store_kv},
    {{"route renorm 13x16 k4", "route", 0, 0}, c_route_norm},
    {{"route raw 13x16 k4", "route", 0, 0}, c_route_raw},
    {{"route a3b 70x128 k8 ties nan", "route", 0, 0}, c_route_a3b},
    {{"moe_group 11x8 k3", "moe_group", 0, 0}, c_moe_group},
    {{"moe_group_dev 11x3 of 8", "moe_group_dev", 0, 0}, c_moe_group_dev},
    {{"moe_group_dev 64x8 of 128", "moe_group_dev", 0, 0}, c_moe_group_dev_a3b},
    {{"moe_group 300x4 of 16", "moe_group", 0, 0}, c_moe_group_300},
    {{"moe rows 9x6 k2", "combine", 0, 0}, c_moe_rows},
    {{"moe rows 37x8 k3 C300", "combine", 0, 0}, c_moe_rows_wide},
    {{"embed_w16 9x64 V50", "embed_w16", 0, 0}, c_embed_w16},
    {{"matmul_w16 bf16 70x136x300", "matmul_w16", 1, 0}, c_matmul_w16_bf16},
    {{"matmul_w16 bf16 router 64x2048x128", "matmul_w16", 1, 0}, c_matmul_w16_router},
    {{"matmul_w16 f32 37x72x45", "matmul_w16", 1, 0}, c_matmul_w16_f32},
    {{"matmul_w16 f32 1x2048x1100", "matmul_w16", 1, 0}, c_matmul_w16_row1},
    {{"matmul_w16 bf16 4x520x300", "matmul_w16", 1, 0}, c_matmul_w16_row4},
    {{"router_backward renorm", "router_backward", 0, 0}, c_router_backward_renorm},
    {{"router_backward raw", "router_backward", 0, 0}, c_router_backward_raw},
    {{"logprob+bwd T=1", "logprob", 1, 0}, c_logprob_t1},
    {{"logprob+bwd T=0.7", "logprob", 1, 0}, c_logprob_t07},
    {{"sample top-k/top-p 5x300", "sample", 0, 0}, c_sample_cut},
    {{"sample full 5x5000 T=1", "sample", 0, 0}, c_sample_full},
    {{"sample full 5x300 T=1.3", "sample", 0, 0}, c_sample_hot},
    {{"sample greedy 5x2100", "sample", 0, 0}, c_sample_greedy},
    {{"sample full 5x40000 T=0.9", "sample", 0, 0}, c_sample_wide},
    {{"sample greedy 5x40000", "sample", 0, 0}, c_sample_wide_greedy},
    {{"head_backward 37x72 V304 T=0.7", "head_backward", 1, 0}, c_head_backward},
    {{"sumsq_chunks+adamw 10000", "adamw", 0, 0}, c_sumsq_adamw},
    {{"adamw 10003 ragged, off 16 bytes", "adamw", 0, 0}, c_adamw_ragged},
    {{"adamw_round 10003", "adamw", 0, 0}, c_adamw_round},
    {{"sumsq_chunks 1049576", "sumsq_chunks", 0, 0}, c_sumsq_long},
    {{"copy 1001", "copy", 0, 0}, c_copy},
    {{"matmul_bfp 5x64x40", "matmul_bfp", 0, 0}, c_matmul_bfp_few},
    {{"matmul_bfp 27x2048x300", "matmul_bfp", 0, 0}, c_matmul_bfp_lm},
    {{"matmul_bfp 70x208x133", "matmul_bfp", 0, 0}, c_matmul_bfp_tall},
    {{"matmul_bfp 64x2048x260", "matmul_bfp", 0, 0}, c_matmul_bfp_b64},
    {{"matmul_bfp 130x16x70", "matmul_bfp", 0, 0}, c_matmul_bfp_k16},
    {{"matmul_bfp 3x16384x24 extremes", "matmul_bfp", 0, 0}, c_matmul_bfp_edge},
    {{"matmul_bfp 1x2048x300", "matmul_bfp", 0, 0}, c_matmul_bfp_row1},
    {{"matmul_bfp 2x208x133", "matmul_bfp", 0, 0}, c_matmul_bfp_row2},
    {{"matmul_bfp 3x16x70", "matmul_bfp", 0, 0}, c_matmul_bfp_row3},
    {{"matmul_bfp 4x2064x41", "matmul_bfp", 0, 0}, c_matmul_bfp_row4},
};

int qd_op_case_count(void) { return (int)(sizeof cases / sizeof cases[0]); }

qd_op_case_info qd_op_case(int i) { return cases[i].info; }

qd_status qd_op_case_run(int i, const qd_ops *ops, void *dev, uint64_t seed, qd_op_result *res)
{
    oc c = {.ops = ops, .dev = dev, .rng = seed * 0x9e3779b97f4a7c15ULL + (uint64_t)i, .res = res};
    memset(res, 0, sizeof *res);
    cases[i].run(&c);
    if (!c.st && ops->finish)
        c.st = ops->finish(dev);
    for (int k = 0; k < c.nmem; k++)
        ops->release(dev, c.mem[k]);
    return c.st;
}

void qd_op_result_free(qd_op_result *res)
{
    for (int k = 0; k < res->nout; k++)
        free(res->out[k].data);
    res->nout = 0;
}

/* max |a - b| / max(max |b|, 1e-30) over one float or double output */
static double rel_err(const qd_op_output *a, const qd_op_output *b)
{
    size_t n = a->bytes / (a->kind == 'd' ? sizeof(double) : sizeof(float));
    double mx = 0, ref = 0;
    for (size_t i = 0; i < n; i++) {
        double x = a->kind == 'd' ? ((const double *)a->data)[i] : ((const float *)a->data)[i];
        double y = b->kind == 'd' ? ((const double *)b->data)[i] : ((const float *)b->data)[i];
        if (!(fabs(x - y) <= mx))
            mx = isnan(x - y) ? INFINITY : fabs(x - y);
        if (fabs(y) > ref)
            ref = fabs(y);
    }
    return mx / (ref > 1e-30 ? ref : 1e-30);
}

int qd_op_result_compare(const qd_op_result *a, const qd_op_result *b, double bound, double *err, char *what)
{
    *err = 0;
    what[0] = 0;
    if (a->nout != b->nout) {
        snprintf(what, 64, "output count %d vs %d", a->nout, b->nout);
        return 0;
    }
    int ok = 1;
    for (int k = 0; k < a->nout; k++) {
        const qd_op_output *x = &a->out[k], *y = &b->out[k];
        int same = x->bytes == y->bytes && memcmp(x->data, y->data, x->bytes) == 0;
        double e = 0;
        if (!same && x->bytes == y->bytes && (x->kind == 'f' || x->kind == 'd'))
            e = rel_err(x, y);
        else if (!same)
            e = INFINITY;
        if (e > *err)
            *err = e;
        int pass = same || (bound >= 0 && e <= bound);
        if (!pass && ok)
            snprintf(what, 64, "%s", x->name);
        ok &= pass;
    }
    return ok;
}
