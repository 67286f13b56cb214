/* On the GPU machine: the CUDA backend against the CPU backend in exact mode
 * (NUMERICS.md §6), every operation of the backend interface, every recipe,
 * both roles. For each checkpoint folder (the arguments; default the five
 * test checkpoints and models/tiny) and each recipe:
 * - rollout role: forward (batches of 3 and 1 sequences, temperature 1 and
 *   0.7: log-probs and logits), diagnostics (NVFP4 errors, router choices),
 *   generate (sampled with top-p, and greedy: tokens, log-probs, lengths),
 *   and for RAC recipes the channel sets re-picked at the next sync (the RAC
 *   state blob) and a forward through them;
 * - trainer role: forward, backward (gradients), AdamW step (norm, weights,
 *   moments) and a forward after it; the gradients of a CUDA trainer that
 *   recomputes each layer's activations in the backward (options.recompute)
 *   against a plain CPU trainer's; then the weight sync on the device: a
 *   CUDA rollout takes the stepped CUDA trainer's weights by
 *   qd_backend_sync_from (no host copy), a CPU rollout the CPU trainer's by
 *   set_weights, and their RAC state and forwards must be equal.
 * Last, the memory plan: the tiny model's plan equals the driver's
 * allocations kind by kind, and an absurd generate is refused at init.
 * Then fast mode (NUMERICS.md §7) against the CPU's exact numbers: forward
 * logits (rollout role) and gradients (trainer role), L2-relative error within
 * the bounds stated at fast_bound(); the fused attention's rows (check_flash)
 * read both trainers' router choices, and where a near-tied top-k choice went
 * the other way (a routing flip) judge the gradients of the log-probs before
 * each sequence's first flip (both trainers run again with dlogp zeroed from
 * there), saying how many flipped and the whole batch's error.
 * One table row per (model, op, recipe, role, mode): exact rows give the max
 * abs difference and whether every bit is equal, fast rows the relative error. Exit 0 when all are, 1 on a mismatch, 2 on an
 * error (no device, bad file).
 *     tests/gpu/check_backend [MODEL_DIR ...]      run from the source root */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
extern "C" {
#include "backends/backend.h"
#include "backends/ops.h" /* qd_model_share_prefill */
#include "models/checkpoint.h"
#include "quant/status.h"
}

static const char *default_dirs[] = {
    "tests/fixtures/hf_models/qwen3_dense",       "tests/fixtures/hf_models/qwen3moe_gqa_untied",
    "tests/fixtures/hf_models/qwen3moe_mha_tied_nonorm", "tests/fixtures/hf_models/qwen3moe_mlponly0",
    "tests/fixtures/hf_models/qwen3moe_mqa_sparse2", "models/tiny",
};

typedef struct {
    double maxabs;
    int equal;
} cmp;

static void cmp_init(cmp *c)
{
    c->maxabs = 0.0;
    c->equal = 1;
}

static void cmp_f32(cmp *c, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (e > c->maxabs || e != e)
            c->maxabs = e;
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            c->equal = 0;
    }
}

static void cmp_f64(cmp *c, const double *a, const double *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double e = fabs(a[i] - b[i]);
        if (e > c->maxabs || e != e)
            c->maxabs = e;
        if (memcmp(&a[i], &b[i], sizeof(double)) != 0)
            c->equal = 0;
    }
}

static void cmp_i32(cmp *c, const int32_t *a, const int32_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) {
            c->equal = 0;
            double e = fabs((double)a[i] - (double)b[i]);
            c->maxabs = e > c->maxabs ? e : c->maxabs;
        }
}

static int g_worst, g_rows, g_equal, g_fast_ok;

static void row(const char *model, const char *op, qd_recipe r, qd_role role, const cmp *c)
{
    printf("%-26s %-18s %-13s %-7s %-5s %12.3g   %s\n", model, op, qd_recipe_name(r),
           role == QD_ROLE_ROLLOUT ? "rollout" : "trainer", "exact", c->maxabs, c->equal ? "yes" : "NO");
    g_rows++;
    g_equal += c->equal;
    if (!c->equal && g_worst < 1)
        g_worst = 1;
}

/* Deterministic tokens and values from an LCG. */
static uint32_t lcg(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

typedef struct {
    const char *model;
    qd_model_config cfg;
    qd_recipe recipe;
    qd_role role;
    qd_exec_mode mode;   /* of the CUDA backend; the CPU is the exact reference */
    qd_backend *b[2];    /* cpu, cuda */
    const float *w;      /* master weights */
    size_t n;
    int no_diag;         /* a rollout pair without diagnostics (a shared prefill's) */
    int diag_train;      /* a trainer pair with diagnostics (its router choices: check_flash) */
} pair;

/* The forward checks' lengths: 3 sequences of Tm - 4, Tm and Tm / 2 tokens,
 * Tm = min(13, max_position_embeddings) (len3), and one of Tm (len1). */
static void forward_lengths(const pair *p, int32_t len3[3], int32_t len1[1])
{
    int Tm = p->cfg.max_position_embeddings < 13 ? p->cfg.max_position_embeddings : 13;
    len3[0] = Tm - 4 > 0 ? Tm - 4 : 1, len3[1] = Tm, len3[2] = Tm / 2 > 0 ? Tm / 2 : 1;
    len1[0] = Tm;
}

/* Forward of B sequences of lengths len (tokens from an LCG) at temp on both
 * backends: *lp (2, B*T) log-probs and *lg (2, B*T*V) logits, malloc'ed; *nl
 * receives B*T*V. */
static qd_status fwd_both(pair *p, int B, const int32_t *len, float temp, float **lp, float **lg, size_t *nl)
{
    int T = 0, V = p->cfg.vocab_size;
    for (int b = 0; b < B; b++)
        T = len[b] > T ? len[b] : T;
    *nl = (size_t)B * T * V;
    int32_t *tok = (int32_t *)calloc((size_t)B * T, sizeof(int32_t));
    *lp = (float *)malloc(sizeof(float) * 2 * B * T);
    *lg = (float *)malloc(sizeof(float) * 2 * *nl);
    qd_status st = tok && *lp && *lg ? QD_OK : qd_error(QD_ERR_NOMEM, "check_backend: batch");
    uint32_t s = 12345u;
    for (int i = 0; !st && i < B * T; i++)
        tok[i] = (int32_t)(lcg(&s) % (uint32_t)V);
    qd_batch bt = {.B = B, .T = T, .tokens = tok, .lengths = len, .temperature = temp, .rac_stats = 1};
    for (int k = 0; k < 2 && !st; k++)
        st = qd_backend_forward(p->b[k], &bt, *lp + (size_t)k * B * T, *lg + k * *nl);
    free(tok);
    return st;
}

/* fwd_both, then every log-prob and logit bit compared into c. */
static qd_status fwd_case(pair *p, cmp *c, int B, const int32_t *len, float temp)
{
    float *lp, *lg;
    size_t nl;
    qd_status st = fwd_both(p, B, len, temp, &lp, &lg, &nl);
    if (!st) {
        cmp_f32(c, lp, lp + nl / p->cfg.vocab_size, nl / p->cfg.vocab_size);
        cmp_f32(c, lg, lg + nl, nl);
    }
    free(lp);
    free(lg);
    return st;
}

static qd_status check_forward(pair *p, const char *op)
{
    int32_t len3[3], len1[1];
    forward_lengths(p, len3, len1);
    cmp c;
    cmp_init(&c);
    qd_status st = fwd_case(p, &c, 3, len3, 0.0f);
    if (!st)
        st = fwd_case(p, &c, 1, len1, 0.0f);
    if (!st)
        st = fwd_case(p, &c, 3, len3, 0.7f);
    if (!st)
        row(p->model, op, p->recipe, p->role, &c);
    return st;
}

static qd_status check_diag(pair *p, const char *op = "diagnostics")
{
    qd_diagnostics d[2];
    for (int k = 0; k < 2; k++)
        QD_TRY(qd_backend_diagnostics(p->b[k], &d[k]));
    cmp c;
    cmp_init(&c);
    if (d[0].num_linear != d[1].num_linear || d[0].num_tokens != d[1].num_tokens ||
        d[0].num_moe_layers != d[1].num_moe_layers)
        c.equal = 0;
    else {
        cmp_f64(&c, d[0].act_err, d[1].act_err, (size_t)d[0].num_linear);
        cmp_f64(&c, d[0].act_norm, d[1].act_norm, (size_t)d[0].num_linear);
        cmp_f64(&c, d[0].weight_err, d[1].weight_err, (size_t)d[0].num_linear);
        cmp_i32(&c, d[0].router_topk, d[1].router_topk, (size_t)d[0].num_moe_layers * d[0].num_tokens * d[0].top_k);
    }
    row(p->model, op, p->recipe, p->role, &c);
    return QD_OK;
}

/* Rollouts of 3 prompts: sampled (T = 1, top-p 0.9) and greedy; with nodiag,
 * as `quads rl` asks for them (RAC statistics gathered, diagnostics paused:
 * the steps a CUDA graph may replay). */
static qd_status check_generate(pair *p, float temp, const char *op, int nodiag = 0)
{
    enum { B = 3, TP = 7, M = 6 };
    int V = p->cfg.vocab_size;
    int32_t prompt[B * TP], plen[B] = {5, 3, 7}, tok[2][B * M], lens[2][B];
    uint64_t sid[B] = {11, 12, 13};
    float lp[2][B * M];
    uint32_t s = 777u;
    for (int i = 0; i < B * TP; i++)
        prompt[i] = (int32_t)(lcg(&s) % (uint32_t)V);
    int32_t stop = (int32_t)(V > 3 ? 3 : 0);
    qd_generate_request rq = {.B = B, .Tp = TP, .prompt = prompt, .prompt_len = plen, .seq_id = sid, .seed = 99u,
                              .max_new_tokens = M, .temperature = temp, .top_k = 0, .top_p = temp > 0 ? 0.9f : 1.0f,
                              .stop = &stop, .num_stop = 1, .rac_stats = 1, .no_diagnostics = nodiag};
    for (int k = 0; k < 2; k++) {
        qd_generate_result res = {.tokens = tok[k], .logp = lp[k], .lengths = lens[k]};
        QD_TRY(qd_backend_generate(p->b[k], &rq, &res));
    }
    cmp c;
    cmp_init(&c);
    cmp_i32(&c, tok[0], tok[1], B * M);
    cmp_i32(&c, lens[0], lens[1], B);
    cmp_f32(&c, lp[0], lp[1], B * M);
    row(p->model, op, p->recipe, p->role, &c);
    return QD_OK;
}

static qd_status open_pair(pair *p);

/* Rollouts of 5 rows of 2 prompts (rows 0, 2, 3 one prompt, rows 1, 4
 * another: a group's samples) on a pair without diagnostics and without RAC
 * statistics, so the rows of one prompt share its prefill: CUDA against the
 * CPU, and CUDA's shared prefill against every row's own (one row each). */
static qd_status check_shared_prefill(pair *p)
{
    enum { B = 5, TP = 7, M = 6 };
    pair q = *p;
    q.no_diag = 1;
    q.b[0] = q.b[1] = NULL;
    int V = p->cfg.vocab_size;
    int32_t prompt[B * TP], plen[B] = {6, 4, 6, 6, 4}, tok[3][B * M], lens[3][B];
    uint64_t sid[B] = {21, 22, 23, 24, 25};
    float lp[3][B * M];
    uint32_t s = 4242u;
    for (int i = 0; i < 2 * TP; i++)
        prompt[i] = (int32_t)(lcg(&s) % (uint32_t)V);
    memcpy(prompt + 2 * TP, prompt, sizeof(int32_t) * TP);
    memcpy(prompt + 3 * TP, prompt, sizeof(int32_t) * TP);
    memcpy(prompt + 4 * TP, prompt + TP, sizeof(int32_t) * TP);
    qd_generate_request rq = {.B = B, .Tp = TP, .prompt = prompt, .prompt_len = plen, .seq_id = sid, .seed = 7u,
                              .max_new_tokens = M, .temperature = 1.0f, .top_k = 0, .top_p = 0.9f, .stop = NULL,
                              .num_stop = 0, .rac_stats = 0};
    qd_status st = open_pair(&q); /* weights set */
    for (int k = 0; k < 3 && !st; k++) {
        qd_generate_result res = {.tokens = tok[k], .logp = lp[k], .lengths = lens[k]};
        qd_model_share_prefill = k != 2;
        st = qd_backend_generate(q.b[k ? 1 : 0], &rq, &res);
        qd_model_share_prefill = 1;
    }
    for (int k = 0; k < 2; k++)
        qd_backend_free(q.b[k]);
    QD_TRY(st);
    for (int j = 1; j < 3; j++) {
        cmp c;
        cmp_init(&c);
        cmp_i32(&c, tok[j - 1], tok[j], B * M);
        cmp_i32(&c, lens[j - 1], lens[j], B);
        cmp_f32(&c, lp[j - 1], lp[j], B * M);
        row(p->model, j == 1 ? "generate(shared prompts)" : "generate(shared = own prefill, cuda)", p->recipe,
            p->role, &c);
    }
    return QD_OK;
}

/* The RAC state blobs of both backends, one row (none without RAC). */
static qd_status rac_row(pair *p, const char *op)
{
    size_t n = qd_backend_rac_state_size(p->b[0]);
    if (n == 0 || n != qd_backend_rac_state_size(p->b[1]))
        return n == 0 ? QD_OK : qd_error(QD_ERR_FORMAT, "RAC state sizes differ");
    char *blob = (char *)malloc(2 * n);
    if (!blob)
        return qd_error(QD_ERR_NOMEM, "check_backend: RAC state");
    qd_status st = qd_backend_get_rac_state(p->b[0], blob, n);
    if (!st)
        st = qd_backend_get_rac_state(p->b[1], blob + n, n);
    cmp c;
    cmp_init(&c);
    c.equal = !st && memcmp(blob, blob + n, n) == 0;
    free(blob);
    if (st)
        return st;
    row(p->model, op, p->recipe, p->role, &c);
    return QD_OK;
}

/* RAC: the next sync re-picks channels from the statistics the forwards and
 * generates above gathered (they ask for them: rac_stats = 1). */
static qd_status check_rac(pair *p)
{
    if (qd_backend_rac_state_size(p->b[0]) == 0)
        return QD_OK;
    for (int k = 0; k < 2; k++)
        QD_TRY(qd_backend_set_weights(p->b[k], p->w, p->n));
    QD_TRY(rac_row(p, "rac_state"));
    return check_forward(p, "forward(rac sync)");
}

/* The trainer checks' batch: 3 sequences of Tm, Tm - 3 and Tm / 2 tokens
 * (Tm = min(11, max_position_embeddings)), tokens and dL/dlogp in [-1, 1]
 * from an LCG, temperature 0.8. */
typedef struct {
    int32_t len[3], tok[3 * 11];
    float lp[3 * 11], dlp[3 * 11];
    qd_batch bt;
} train_batch;

static void train_batch_init(train_batch *t, const pair *p)
{
    int Tm = p->cfg.max_position_embeddings < 11 ? p->cfg.max_position_embeddings : 11, V = p->cfg.vocab_size;
    t->len[0] = Tm, t->len[1] = Tm - 3 > 0 ? Tm - 3 : 1, t->len[2] = Tm / 2 > 0 ? Tm / 2 : 1;
    uint32_t s = 4242u;
    for (int i = 0; i < 3 * Tm; i++) {
        t->tok[i] = (int32_t)(lcg(&s) % (uint32_t)V);
        t->dlp[i] = ((float)(lcg(&s) % 2001u) - 1000.0f) / 1000.0f;
    }
    t->bt = (qd_batch){.B = 3, .T = Tm, .tokens = t->tok, .lengths = t->len, .temperature = 0.8f};
}

/* zero_grad, forward, backward of backend k on t; its gradients into g (n). */
static qd_status grads_of(pair *p, int k, train_batch *t, float *g)
{
    qd_backend_zero_grad(p->b[k]);
    qd_status st = qd_backend_forward(p->b[k], &t->bt, t->lp, NULL);
    if (!st)
        st = qd_backend_backward(p->b[k], t->dlp);
    return st ? st : qd_backend_get_grads(p->b[k], g, p->n);
}

/* Trainer: forward, backward, gradients, AdamW step, forward again. */
static qd_status check_train(pair *p)
{
    train_batch t;
    train_batch_init(&t, p);
    size_t n = p->n;
    float *buf = (float *)malloc(sizeof(float) * 6 * n);
    if (!buf)
        return qd_error(QD_ERR_NOMEM, "check_backend: %zu gradients", n);
    qd_adamw opt = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f,
                    .grad_clip = 1.0f};
    float norm[2];
    qd_status st = QD_OK;
    for (int k = 0; k < 2 && !st; k++) {
        st = grads_of(p, k, &t, buf + k * n);
        if (!st)
            st = qd_backend_optimizer_step(p->b[k], &opt, 1, &norm[k]);
        if (!st)
            st = qd_backend_get_adam(p->b[k], buf + (2 + k) * n, buf + (4 + k) * n, n);
    }
    cmp c;
    if (!st) {
        cmp_init(&c);
        cmp_f32(&c, buf, buf + n, n);
        row(p->model, "backward(grads)", p->recipe, p->role, &c);
        cmp_init(&c);
        cmp_f32(&c, &norm[0], &norm[1], 1);
        cmp_f32(&c, buf + 2 * n, buf + 3 * n, n);
        cmp_f32(&c, buf + 4 * n, buf + 5 * n, n);
        for (int k = 0; k < 2 && !st; k++)
            st = qd_backend_get_weights(p->b[k], buf + k * n, n);
        if (!st)
            cmp_f32(&c, buf, buf + n, n);
        if (!st)
            row(p->model, "adamw(w,m,v,norm)", p->recipe, p->role, &c);
    }
    free(buf);
    return st ? st : check_forward(p, "forward(after step)");
}

/* The weight sync on the device (qd_backend_sync_from): after the step, a
 * CUDA rollout that gathered RAC statistics takes the CUDA trainer's weights
 * device to device, a CPU rollout the CPU trainer's by set_weights; the two
 * rollouts must then hold the same RAC channels and compute the same bits,
 * diagnostics too (the CUDA sync measures its weight errors a shape at a
 * time, the CPU's from the host a linear at a time). */
static qd_status check_sync_from(pair *p)
{
    pair q = *p;
    q.role = QD_ROLE_ROLLOUT;
    q.b[0] = q.b[1] = NULL;
    float *w = (float *)malloc(sizeof(float) * p->n);
    int direct = 0;
    qd_status st = w ? open_pair(&q) : qd_error(QD_ERR_NOMEM, "check_backend: weights");
    if (!st)
        st = check_generate(&q, 1.0f, "generate(pre-sync)");
    if (!st)
        st = qd_backend_get_weights(p->b[0], w, p->n);
    if (!st)
        st = qd_backend_set_weights(q.b[0], w, p->n);
    if (!st)
        st = qd_backend_sync_from(q.b[1], p->b[1], &direct);
    if (!st && !direct)
        st = qd_error(QD_ERR_DEVICE, "sync_from: the CUDA instances synced through the host");
    if (!st)
        st = rac_row(&q, "rac_state(sync_from)");
    if (!st)
        st = check_forward(&q, "forward(sync_from)");
    if (!st)
        st = check_diag(&q, "diagnostics(sync_from)");
    for (int k = 0; k < 2; k++)
        qd_backend_free(q.b[k]);
    free(w);
    return st;
}

static qd_status open_pair(pair *p)
{
    qd_backend_options opt;
    memset(&opt, 0, sizeof opt);
    opt.recipe = p->recipe;
    opt.role = p->role;
    opt.rac_ratio = 0.5;
    opt.diagnostics = (p->role == QD_ROLE_ROLLOUT && !p->no_diag) || (p->role == QD_ROLE_TRAINER && p->diag_train);
    p->b[0] = qd_backend_cpu_init(&p->cfg, &opt);
    if (!p->b[0])
        return QD_ERR_ARG;
    opt.mode = p->mode;
    p->b[1] = qd_backend_cuda_init(&p->cfg, &opt);  /* a direct reference: links the CUDA backend in */
    if (!p->b[1])
        return QD_ERR_DEVICE;
    int na = 0, nb = 0;
    const qd_param_info *pa = qd_backend_params(p->b[0], &na), *pb = qd_backend_params(p->b[1], &nb);
    if (na != nb || qd_backend_num_floats(p->b[0]) != qd_backend_num_floats(p->b[1]))
        return qd_error(QD_ERR_FORMAT, "%s: the CUDA parameter table differs from the CPU's", p->model);
    for (int i = 0; i < na; i++)
        if (strcmp(pa[i].name, pb[i].name) || pa[i].offset != pb[i].offset)
            return qd_error(QD_ERR_FORMAT, "%s: parameter %d differs", p->model, i);
    for (int k = 0; k < 2; k++)
        QD_TRY(qd_backend_set_weights(p->b[k], p->w, p->n));
    return QD_OK;
}

/* ---- fast mode: relative error against the CPU's exact numbers */

/* Bounds of fast mode (NUMERICS.md §7) on the L2 norm of the difference over
 * the exact result's norm (logits of the rollout forward, gradients of the
 * trainer). Fast mode reorders sums (cuBLASLt, the fused attention kernel
 * with a hardware exp): about 1e-6 relative per product (tests/gpu/check_blas).
 * Where a recipe rounds activations (BF16 at every linear input, FP8 or NVFP4
 * codes), a 1-ulp change can flip a rounding or a near-tied top-k expert, and
 * a flip moves single logits by far more than the reordering: the max over all
 * logits is printed for information (H200, 2026-12-02: up to 3e-3 of the
 * largest logit under bf16, 0.26 under fp8 on one fixture) and the bound is
 * on the norm: 1e-5 for fp32, 1e-3 for the NVFP4 recipes (their W4A4 product
 * is the exact one on Hopper), 1e-2 for bf16 and 1e-1 for fp8 (an E4M3 code
 * has 3 mantissa bits: one flipped code moves its element by up to 1/8;
 * measured up to 5.7e-2 on the hidden-48 fixture). Gradients:
 * 1e-5 under fp32; under every BF16 recipe 1e-2, since the backward products
 * read dy (and the fake-quant weights) as BF16 there (docs/numerics.md §7b: a
 * relative change of up to 2^-9 an element, about 2e-3 of a gradient), or
 * 1e-3 with QUADS_FAST_BF16=0 (TF32: H200 2026-12-03, up to 8.9e-4). The
 * ablation recipe nvfp4-w4a16 rounds every linear's input to BF16 as bf16 does
 * (BF16 activations, fake-quant weights): bf16's 1e-2 (H200 2026-12-03: 1.4e-3). */
static double fast_bound(const pair *p, int grads)
{
    if (p->recipe == QD_RECIPE_FP32)
        return 1e-5;
    if (grads) {
        const char *fb = getenv("QUADS_FAST_BF16");
        return fb && !strcmp(fb, "0") ? 1e-3 : 1e-2;
    }
    if (p->recipe == QD_RECIPE_BF16 || p->recipe == QD_RECIPE_NVFP4_W4A16)
        return 1e-2;
    return p->recipe == QD_RECIPE_FP8 ? 1e-1 : 1e-3;
}

static void row_fast(const pair *p, const char *op, double rel, double rmax, double bound)
{
    int ok = rel <= bound;
    printf("%-26s %-18s %-13s %-7s %-5s %12.6g   %s (L2 rel, bound %.0e; max rel %.4g)\n", p->model, op,
           qd_recipe_name(p->recipe), p->role == QD_ROLE_ROLLOUT ? "rollout" : "trainer", "fast", rel,
           ok ? "within" : "EXCEEDS", bound, rmax);
    g_rows++;
    g_fast_ok += ok;
    if (!ok && g_worst < 1)
        g_worst = 1;
}

/* max |a - b| / max |a| over n floats. */
static double rel_max(const float *a, const float *b, size_t n)
{
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        d = e > d || e != e ? e : d;
        m = fabs((double)a[i]) > m ? fabs((double)a[i]) : m;
    }
    return m > 0 ? d / m : d;
}

/* *d += ||a - b||^2, *m += ||a||^2 over n floats, in order. */
static void sq_sums(const float *a, const float *b, size_t n, double *d, double *m)
{
    for (size_t i = 0; i < n; i++) {
        *d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        *m += (double)a[i] * a[i];
    }
}

static double rel_of(double d, double m) { return m > 0 ? sqrt(d / m) : sqrt(d); }

/* ||a - b|| / ||a|| over n floats. */
static double rel_l2(const float *a, const float *b, size_t n)
{
    double d = 0, m = 0;
    sq_sums(a, b, n, &d, &m);
    return rel_of(d, m);
}

/* Where a gradient row exceeds its bound: the 4 tensors of the largest L2
 * relative error (a against b, rel_l2's) and each one's share of the difference. */
static void worst_tensors(const float *a, const float *b, const qd_param_info *pi, int np)
{
    int top[4] = {-1, -1, -1, -1};
    double rel[4] = {0, 0, 0, 0}, sq[4] = {0, 0, 0, 0}, total = 0;
    for (int t = 0; t < np; t++) {
        double d = 0, m = 0;
        sq_sums(a + pi[t].offset, b + pi[t].offset, (size_t)(pi[t].rows * pi[t].cols), &d, &m);
        double r = rel_of(d, m);
        total += d;
        for (int k = 0; k < 4; k++)
            if (top[k] < 0 || r > rel[k]) {
                for (int j = 3; j > k; j--)
                    top[j] = top[j - 1], rel[j] = rel[j - 1], sq[j] = sq[j - 1];
                top[k] = t, rel[k] = r, sq[k] = d;
                break;
            }
    }
    for (int k = 0; k < 4 && top[k] >= 0; k++)
        printf("    %-40s L2 rel %.3g, %.1f%% of the squared difference\n", pi[top[k]].name, rel[k],
               total > 0 ? 100.0 * sq[k] / total : 0.0);
}

static qd_status fast_forward(pair *p)
{
    int32_t len3[3], len1[1];
    forward_lengths(p, len3, len1);
    float *lp, *lg;
    size_t nl;
    qd_status st = fwd_both(p, 3, len3, 0.0f, &lp, &lg, &nl);
    if (!st)
        row_fast(p, "forward(logits)", rel_l2(lg, lg + nl, nl), rel_max(lg, lg + nl, nl), fast_bound(p, 0));
    free(lp);
    free(lg);
    return st;
}

static qd_status fast_train(pair *p)
{
    train_batch t;
    train_batch_init(&t, p);
    float *g = (float *)malloc(sizeof(float) * 2 * p->n);
    if (!g)
        return qd_error(QD_ERR_NOMEM, "check_backend: gradients");
    qd_status st = QD_OK;
    for (int k = 0; k < 2 && !st; k++)
        st = grads_of(p, k, &t, g + k * p->n);
    if (!st)
        row_fast(p, "backward(grads)", rel_l2(g, g + p->n, p->n), rel_max(g, g + p->n, p->n), fast_bound(p, 1));
    free(g);
    return st;
}

/* options.recompute on the CUDA trainer (each layer's activations recomputed
 * in the backward): its gradients against a plain CPU trainer's from the same
 * weights, bit for bit. */
static qd_status check_recompute(pair *p)
{
    pair q = *p;
    qd_backend_options opt;
    memset(&opt, 0, sizeof opt);
    opt.recipe = p->recipe;
    opt.role = p->role;
    opt.rac_ratio = 0.5;
    q.b[0] = qd_backend_cpu_init(&p->cfg, &opt);
    opt.mode = p->mode;
    opt.recompute = 1;
    q.b[1] = q.b[0] ? qd_backend_cuda_init(&p->cfg, &opt) : NULL;
    qd_status st = q.b[0] && q.b[1] ? QD_OK : QD_ERR_DEVICE;
    float *g = (float *)malloc(sizeof(float) * 2 * p->n);
    if (!st && !g)
        st = qd_error(QD_ERR_NOMEM, "check_backend: %zu gradients", p->n);
    train_batch t;
    train_batch_init(&t, p);
    for (int k = 0; k < 2 && !st; k++) {
        st = qd_backend_set_weights(q.b[k], p->w, p->n);
        if (!st)
            st = grads_of(&q, k, &t, g + k * p->n);
    }
    if (!st) {
        cmp c;
        cmp_init(&c);
        cmp_f32(&c, g, g + p->n, p->n);
        row(p->model, "backward(recompute)", p->recipe, p->role, &c);
    }
    free(g);
    for (int k = 0; k < 2; k++)
        if (q.b[k])
            qd_backend_free(q.b[k]);
    return st;
}

static qd_status check_pair(pair *p)
{
    if (p->mode == QD_MODE_FAST) {
        QD_TRY(open_pair(p));
        return p->role == QD_ROLE_TRAINER ? fast_train(p) : fast_forward(p);
    }
    QD_TRY(open_pair(p));
    if (p->role == QD_ROLE_TRAINER) {
        QD_TRY(check_train(p));
        QD_TRY(check_recompute(p));
        return check_sync_from(p);
    }
    QD_TRY(check_forward(p, "forward"));
    QD_TRY(check_diag(p));
    QD_TRY(check_generate(p, 1.0f, "generate(top-p)"));
    QD_TRY(check_generate(p, 0.0f, "generate(greedy)"));
    QD_TRY(check_generate(p, 1.0f, "generate(rl: no diagnostics)", 1));
    QD_TRY(check_shared_prefill(p));
    return check_rac(p);
}

/* Routing flips of a fast trainer pair (check_flash): the (MoE layer, token)
 * slots whose top-k expert set differs between the CPU's forward (topk[0])
 * and the CUDA backend's (topk[1]): a near-tied router choice going the other
 * way under fast mode's BF16 rounding sends the token's rows to another
 * expert (NUMERICS section 7), and through attention every later position of
 * its sequence then differs by more than the products' precision. tflip[t]
 * is set for every token (packed in batch order) flipped in some MoE layer;
 * returns the flipped slots. */
static int routing_flips(const int32_t *const topk[2], int nmoe, int N, int K, unsigned char *tflip)
{
    int n = 0;
    memset(tflip, 0, (size_t)N);
    for (int m = 0; m < nmoe; m++)
        for (int t = 0; t < N; t++) {
            const int32_t *a = topk[0] + ((size_t)m * N + t) * K, *b = topk[1] + ((size_t)m * N + t) * K;
            int same = 1;
            for (int i = 0; i < K; i++) {
                int in = 0;
                for (int j = 0; j < K; j++)
                    in |= a[i] == b[j];
                same &= in;
            }
            if (!same) {
                n++;
                tflip[t] = 1;
            }
        }
    return n;
}

/* dlogp (B, T) zeroed from each sequence's first flipped position on: the
 * log-prob at position t reads the states of positions 0..t only (causal
 * attention), so the positions before a sequence's first flip are the same
 * computation on both sides and the gradients of what is left carry no
 * flip. Returns the positions of the B sequences' len[b] - 1 log-probs kept. */
static int mask_from_flips(float *dlp, const unsigned char *tflip, const int32_t *len, int B, int T)
{
    int kept = 0, t0 = 0;
    for (int b = 0; b < B; b++) {
        int first = len[b];
        for (int t = 0; t < len[b]; t++)
            if (tflip[t0 + t]) {
                first = t;
                break;
            }
        for (int t = first; t < T; t++)
            dlp[(size_t)b * T + t] = 0.0f;
        kept += (first < len[b] - 1 ? first : len[b] - 1);
        t0 += len[b];
    }
    return kept;
}

/* One fast trainer pair's gradients (CPU exact into g, CUDA into g + n) for
 * dlp (log-probs into lp, B x T), with the router's choices of each forward into topk[b] when asked
 * (malloc'd; NULL where the diagnostics could not be read). */
static qd_status pair_grads(pair *p, const qd_batch *bt, float *lp, const float *dlp, float *g, int32_t **topk,
                            qd_diagnostics *dg)
{
    qd_status st = QD_OK;
    for (int b = 0; b < 2 && !st; b++) {
        qd_backend_zero_grad(p->b[b]);
        st = qd_backend_forward(p->b[b], bt, lp, NULL);
        if (!st && topk) {
            st = qd_backend_diagnostics(p->b[b], dg);
            size_t nk = (size_t)dg->num_moe_layers * dg->num_tokens * dg->top_k;
            if (!st && (topk[b] = (int32_t *)malloc(sizeof(int32_t) * (nk + 1))) != NULL)
                memcpy(topk[b], dg->router_topk, sizeof(int32_t) * nk);
        }
        if (!st)
            st = qd_backend_backward(p->b[b], dlp);
        if (!st)
            st = qd_backend_get_grads(p->b[b], g + b * p->n, p->n);
    }
    return st;
}

/* Fast mode's fused prefill attention (backends/cuda/cuda_flash.cu: heads of
 * 64 or 128 and Tm past D + D KV / H; the fixtures' heads of 16 and their 13
 * tokens never take it) on whole models: qwen3moe_gqa_untied's config with
 * heads of 64 (4 / 2), random weights (uniform in [-0.1, 0.1], norms 1 + that),
 * sequences of 130, 97 and 64 tokens (tiles of 64 crossed), the bf16 and
 * quads trainers' gradients and the bf16 rollout's logits against the CPU's
 * exact numbers within fast mode's bounds (fast_bound). */
static void check_flash(void)
{
    enum { FB = 3, FT = 130 };
    static const int32_t len[FB] = {130, 97, 64};
    pair p;
    memset(&p, 0, sizeof p);
    p.model = "gqa_untied(head 64)";
    if (qd_checkpoint_read_config("tests/fixtures/hf_models/qwen3moe_gqa_untied", &p.cfg)) {
        fprintf(stderr, "check_backend: flash: %s\n", qd_last_error());
        g_worst = 2;
        return;
    }
    p.cfg.head_dim = 64;
    p.cfg.max_position_embeddings = 256;
    qd_backend_options o;
    memset(&o, 0, sizeof o);
    qd_backend *probe = qd_backend_cpu_init(&p.cfg, &o);
    if (!probe) {
        fprintf(stderr, "check_backend: flash: %s\n", qd_last_error());
        g_worst = 2;
        return;
    }
    int np = 0;
    const qd_param_info *pi = qd_backend_params(probe, &np);
    p.n = qd_backend_num_floats(probe);
    float *w = (float *)malloc(sizeof(float) * p.n), *g = (float *)malloc(sizeof(float) * 2 * p.n);
    int32_t tok[FB * FT];
    float lp[FB * FT], dlp[FB * FT];
    uint32_t s = 9090u;
    for (size_t i = 0; w && i < p.n; i++)
        w[i] = ((float)(lcg(&s) % 2001u) - 1000.0f) / 10000.0f;
    for (int i = 0; w && i < np; i++)
        if (strstr(pi[i].name, "norm"))
            for (int64_t j = 0; j < pi[i].rows * pi[i].cols; j++)
                w[pi[i].offset + (size_t)j] += 1.0f;
    for (int i = 0; i < FB * FT; i++) {
        tok[i] = (int32_t)(lcg(&s) % (uint32_t)p.cfg.vocab_size);
        dlp[i] = ((float)(lcg(&s) % 2001u) - 1000.0f) / 1000.0f;
    }
    qd_batch bt = {.B = FB, .T = FT, .tokens = tok, .lengths = len, .temperature = 0.8f};
    p.w = w;
    p.mode = QD_MODE_FAST;
    static const struct {
        qd_recipe r;
        qd_role role;
    } runs[] = {{QD_RECIPE_BF16, QD_ROLE_TRAINER}, {QD_RECIPE_QUADS, QD_ROLE_TRAINER}, {QD_RECIPE_BF16, QD_ROLE_ROLLOUT}};
    for (size_t k = 0; w && g && k < sizeof runs / sizeof runs[0]; k++) {
        p.recipe = runs[k].r;
        p.role = runs[k].role;
        p.b[0] = p.b[1] = NULL;
        p.no_diag = 1;
        p.diag_train = p.role == QD_ROLE_TRAINER;
        qd_status st = open_pair(&p);
        if (!st && p.role == QD_ROLE_TRAINER) {
            int32_t *topk[2] = {NULL, NULL};
            qd_diagnostics dg = {0};
            st = pair_grads(&p, &bt, lp, dlp, g, topk, &dg);
            unsigned char tflip[FB * FT];
            int flips = 0;
            if (!st && topk[0] && topk[1] && dg.num_tokens <= FB * FT)
                flips = routing_flips((const int32_t *const *)topk, dg.num_moe_layers, dg.num_tokens, dg.top_k, tflip);
            if (!st) {
                /* with routing flips, judged on the log-probs no flip reaches (both trainers run
                 * again), or on the whole batch where too few positions precede the flips */
                double all = rel_l2(g, g + p.n, p.n), rel = all, bound = fast_bound(&p, 1);
                char what[192] = "flash backward";
                if (flips) {
                    float dlm[FB * FT];
                    memcpy(dlm, dlp, sizeof dlm);
                    int kept = mask_from_flips(dlm, tflip, len, FB, FT), total = 0, few = kept < 16;
                    for (int b = 0; b < FB; b++)
                        total += len[b] - 1;
                    if (!few && !(st = pair_grads(&p, &bt, lp, dlm, g, NULL, &dg)))
                        rel = rel_l2(g, g + p.n, p.n);
                    snprintf(what, sizeof what,
                             "flash backward (%d routing flips: dlogp kept at the %d of %d positions before each "
                             "sequence's first%s; all: L2 rel %.3g)",
                             flips, kept, total, few ? ", too few: judged on all" : "", all);
                }
                if (!st) {
                    row_fast(&p, what, rel, rel_max(g, g + p.n, p.n), bound);
                    if (rel > bound)
                        worst_tensors(g, g + p.n, pi, np);
                }
            }
            free(topk[0]);
            free(topk[1]);
        } else if (!st) {
            float *flp = NULL, *lg = NULL;
            size_t nl = 0;
            st = fwd_both(&p, FB, len, 0.0f, &flp, &lg, &nl);
            if (!st)
                row_fast(&p, "flash forward", rel_l2(lg, lg + nl, nl), rel_max(lg, lg + nl, nl), fast_bound(&p, 0));
            free(flp);
            free(lg);
        }
        if (st) {
            fprintf(stderr, "check_backend: flash %s: %s\n", qd_recipe_name(p.recipe), qd_last_error());
            g_worst = 2;
        }
        for (int b = 0; b < 2; b++)
            qd_backend_free(p.b[b]);
    }
    free(w);
    free(g);
    qd_backend_free(probe);
}

static void check_model(const char *dir)
{
    pair p;
    memset(&p, 0, sizeof p);
    p.model = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
    if (qd_checkpoint_read_config(dir, &p.cfg)) {
        fprintf(stderr, "check_backend: %s\n", qd_last_error());
        g_worst = 2;
        return;
    }
    for (int mode = 0; mode < 2; mode++)
    for (int r = 0; r < QD_RECIPE_COUNT; r++)
        for (int role = 0; role < 2; role++) {
            p.recipe = (qd_recipe)r;
            p.role = (qd_role)role;
            p.mode = (qd_exec_mode)mode;
            p.b[0] = p.b[1] = NULL;
            float *w = NULL;
            qd_status st = QD_OK;
            qd_backend_options o;
            memset(&o, 0, sizeof o);
            qd_backend *probe = qd_backend_cpu_init(&p.cfg, &o);
            if (!probe) {
                st = QD_ERR_ARG;
            } else {
                int np = 0;
                const qd_param_info *pi = qd_backend_params(probe, &np);
                p.n = qd_backend_num_floats(probe);
                w = (float *)malloc(sizeof(float) * p.n);
                st = w ? qd_checkpoint_load(dir, pi, np, w) : qd_error(QD_ERR_NOMEM, "weights");
                qd_backend_free(probe);
            }
            p.w = w;
            if (!st)
                st = check_pair(&p);
            if (st) {
                fprintf(stderr, "check_backend: %s %s %s: %s\n", p.model, qd_recipe_name(p.recipe),
                        role ? "trainer" : "rollout", qd_last_error());
                g_worst = 2;
            }
            for (int k = 0; k < 2; k++)
                qd_backend_free(p.b[k]);
            free(w);
        }
}

/* Out of GPU memory: a model far larger than the device must fail at init with
 * QD_ERR_NOMEM and a message giving the bytes asked for and free. */
static void check_oom(void)
{
    qd_model_config cfg;
    if (qd_checkpoint_read_config("models/tiny", &cfg)) {
        g_worst = 2;
        return;
    }
    cfg.vocab_size = 1 << 24;
    cfg.hidden_size = 1 << 14;  /* a 2^38-float (1 TiB) embedding */
    qd_backend_options opt;
    memset(&opt, 0, sizeof opt);
    opt.recipe = QD_RECIPE_BF16;
    qd_backend *b = qd_backend_cuda_init(&cfg, &opt);
    const char *msg = qd_last_error();
    int ok = !b && strstr(msg, "out of GPU memory") && strstr(msg, "asked for") && strstr(msg, "free");
    printf("out-of-memory message: %s: %s\n", ok ? "yes" : "NO", msg);
    if (b)
        qd_backend_free(b);
    if (!ok && g_worst < 1)
        g_worst = 1;
}

/* The planned calls of check_plan: a forward of w->fwd_B full sequences
 * (backward and AdamW when w->train), a generate of w->gen_B full prompts for
 * w->gen_M tokens without a stop token. */
static qd_status run_planned(qd_backend *b, const qd_workload *w, int V)
{
    int n = w->fwd_B * w->fwd_T, G = w->gen_B, M = w->gen_M;
    int32_t *tok = (int32_t *)calloc((size_t)n + G * w->gen_Tp + 2 * G + G * M, sizeof(int32_t));
    float *lp = (float *)calloc((size_t)n + G * M, sizeof(float));
    uint64_t *sid = (uint64_t *)calloc((size_t)G, sizeof(uint64_t));
    if (!tok || !lp || !sid) {
        free(tok), free(lp), free(sid);
        return qd_error(QD_ERR_NOMEM, "check_plan");
    }
    int32_t *len = tok + n + G * w->gen_Tp, *plen = len + G, *out = plen + G, flen[64];
    uint32_t s = 99u;
    for (int i = 0; i < n + G * w->gen_Tp; i++)
        tok[i] = (int32_t)(lcg(&s) % (uint32_t)V);
    for (int i = 0; i < w->fwd_B && i < 64; i++)
        flen[i] = w->fwd_T;
    for (int i = 0; i < G; i++)
        plen[i] = w->gen_Tp, sid[i] = (uint64_t)i;
    qd_batch bt = {.B = w->fwd_B, .T = w->fwd_T, .tokens = tok, .lengths = flen, .temperature = 1.0f, .rac_stats = 1};
    qd_adamw opt = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    qd_generate_request rq = {.B = G, .Tp = w->gen_Tp, .prompt = tok + n, .prompt_len = plen, .seq_id = sid,
                              .seed = 5u, .max_new_tokens = M, .temperature = 1.0f, .top_p = 1.0f, .rac_stats = 1};
    qd_generate_result res = {.tokens = out, .logp = lp + n, .lengths = len};
    qd_status st = qd_backend_forward(b, &bt, lp, NULL);
    if (!st && w->train)
        st = qd_backend_backward(b, lp);
    if (!st && w->train)
        st = qd_backend_optimizer_step(b, &opt, 1, NULL);
    if (!st)
        st = qd_backend_generate(b, &rq, &res);
    free(tok), free(lp), free(sid);
    return st;
}

/* The memory plan on the device: for the tiny model (quads, both roles, both
 * modes) the plan equals what the driver allocated at most, kind by kind,
 * after the planned calls; an absurd generate is refused at init naming the
 * plan and the bytes free (cudaMemGetInfo). */
static void check_plan(void)
{
    qd_model_config cfg;
    if (qd_checkpoint_read_config("models/tiny", &cfg)) {
        g_worst = 2;
        return;
    }
    for (int mode = 0; mode < 2; mode++)
        for (int role = 0; role < 2; role++) {
            qd_backend_options opt;
            memset(&opt, 0, sizeof opt);
            opt.recipe = QD_RECIPE_QUADS, opt.role = (qd_role)role, opt.mode = (qd_exec_mode)mode;
            opt.rac_ratio = 0.25, opt.diagnostics = 1;
            opt.workload = (qd_workload){.fwd_B = 3, .fwd_T = 11, .gen_B = 4, .gen_Tp = 6, .gen_M = 5,
                                         .train = role == QD_ROLE_TRAINER};
            qd_backend *b = qd_backend_cuda_init(&cfg, &opt);
            qd_memory m;
            memset(&m, 0, sizeof m);
            qd_status st = b ? run_planned(b, &opt.workload, cfg.vocab_size) : QD_ERR_DEVICE;
            if (!st)
                st = qd_backend_memory(b, &m);
            int ok = !st && m.plan.total > 0 && m.free_at_init > 0;
            for (int k = 0; k < QD_MEM_COUNT && ok; k++)
                ok = m.plan.bytes[k] == m.peak.bytes[k];
            printf("memory plan %s %s = bytes allocated: %s (plan %zu, peak %zu)%s%s\n",
                   mode ? "fast" : "exact", role ? "trainer" : "rollout", ok ? "yes" : "NO", m.plan.total,
                   m.peak.total, st ? ": " : "", st ? qd_last_error() : "");
            qd_backend_free(b);
            if (!ok && g_worst < 1)
                g_worst = 1;
        }
    qd_backend_options opt;
    memset(&opt, 0, sizeof opt);
    opt.recipe = QD_RECIPE_QUADS;
    opt.workload = (qd_workload){.gen_B = 1 << 20, .gen_Tp = 500, .gen_M = 12};
    qd_backend *b = qd_backend_cuda_init(&cfg, &opt);
    const char *msg = qd_last_error();
    int ok = !b && strstr(msg, "memory plan needs") && strstr(msg, " free of ") && strstr(msg, "the largest");
    printf("memory plan refusal: %s: %s\n", ok ? "yes" : "NO", msg);
    qd_backend_free(b);
    if (!ok && g_worst < 1)
        g_worst = 1;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? argc - 1 : (int)(sizeof default_dirs / sizeof default_dirs[0]);
    printf("%-26s %-18s %-13s %-7s %-5s %12s   %s\n", "model", "op", "recipe", "role", "mode", "max abs err",
           "bits equal");
    for (int i = 0; i < n; i++)
        check_model(argc > 1 ? argv[i + 1] : default_dirs[i]);
    if (argc <= 1)
        check_flash();
    check_oom();
    check_plan();
    printf("check_backend: %d rows: %d exact bit-identical, %d fast within bounds: %s\n", g_rows, g_equal, g_fast_ok,
           g_worst == 0 ? "PASS" : g_worst == 1 ? "FAIL (bits differ)" : "ERROR");
    return g_worst;
}
