/* Check suite of the CPU backend: exact_math accuracy against libm in double,
 * the recipe table, a tiny random Qwen3-MoE (gradients by central finite
 * differences, padding/batch/thread independence of the bits, every precision
 * recipe's error against fp32), AdamW against the formula in double, and the
 * driver's fallbacks where the optional grouped ops and sample are NULL (the
 * same bits). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/suites.h"
#include "backends/backend.h"
#include "backends/layout.h"
#include "backends/ops.h"
#include "backends/shared.h"
#include "backends/exact_math.h"
#include "models/checkpoint.h"
#include "quant/quant.h"
#include "quant/splitmix64.h"

/* ---- helpers */

static uint64_t rng_state;

static double urand(void) { return qd_splitmix64_unit(&rng_state); } /* [0, 1) */

static double sym(void) { return 2.0 * urand() - 1.0; }

/* Error of y in units of the ulp of the float nearest ref (normal range). */
static double ulp_err(float y, double ref)
{
    int ex;
    frexp(ref, &ex);
    return fabs((double)y - ref) / ldexp(1.0, ex - 24);
}

/* 2 layers (0 dense, 1 MoE), hidden 32, 4 heads / 2 kv heads of 16, 8 experts top-2, vocab 64. */
static qd_model_config tiny_config(int tied, int norm_topk)
{
    qd_model_config c = qd_test_moe_config(64, 8, 64);
    c.norm_topk_prob = norm_topk;
    c.n_mlp_only_layers = 1;
    c.mlp_only_layers[0] = 0;
    c.tie_word_embeddings = tied;
    return c;
}

static qd_backend *make(const qd_model_config *cfg, qd_recipe r, qd_role role, double ratio, int threads)
{
    qd_backend_options o = {.recipe = r, .role = role, .rac_ratio = ratio, .num_threads = threads};
    qd_backend *b = qd_backend_cpu_init(cfg, &o);
    ck_assert_msg(b != NULL, "init: %s", qd_last_error());
    return b;
}

/* Random master weights: norms 1 +- 0.2, embedding +-1, matrices with unit-variance outputs. */
static float *random_weights(qd_backend *b, uint64_t seed)
{
    int np;
    const qd_param_info *p = qd_backend_params(b, &np);
    float *w = malloc(sizeof(float) * qd_backend_num_floats(b));
    rng_state = seed;
    for (int i = 0; i < np; i++) {
        int norm = p[i].rows == 1, emb = strstr(p[i].name, "embed") != NULL;
        double a = norm ? 0.2 : emb ? 1.0 : sqrt(3.0 / (double)p[i].cols);
        for (int64_t k = 0; k < p[i].rows * p[i].cols; k++)
            w[p[i].offset + k] = (float)((norm ? 1.0 : 0.0) + a * sym());
    }
    return w;
}

static qd_backend *make_loaded(const qd_model_config *cfg, qd_recipe r, qd_role role, double ratio,
                               int threads, const float *w)
{
    qd_backend *b = make(cfg, r, role, ratio, threads);
    ck_assert_int_eq(qd_backend_set_weights(b, w, qd_backend_num_floats(b)), QD_OK);
    return b;
}

enum { TB = 3, TT = 7 };
enum { GB = 3, GP = 5, GM = 8 }; /* generation: prompts, prompt width, new tokens */
static const int32_t gplen[GB] = {5, 2, 3};
static const uint64_t gsid[GB] = {100, 7, 42};
static const int32_t tlen[TB] = {7, 4, 6};

/* Random tokens; padding holds an invalid id that must never be read. */
static void tiny_batch(int32_t *tok, uint64_t seed)
{
    rng_state = seed;
    for (int b = 0; b < TB; b++)
        for (int t = 0; t < TT; t++)
            tok[b * TT + t] = t < tlen[b] ? (int32_t)(urand() * 64) : 9999;
}

static void forward_ok(qd_backend *b, const int32_t *tok, const int32_t *len, int B, int T, float *logp,
                       float *logits)
{
    qd_batch bt = {.B = B, .T = T, .tokens = tok, .lengths = len, .temperature = 1.0f};
    qd_status st = qd_backend_forward(b, &bt, logp, logits);
    ck_assert_msg(st == QD_OK, "forward: %s", qd_last_error());
}

/* ---- exact_math */

START_TEST(test_exact_math_accuracy)
{
    double me = 0, ml = 0, ms = 0, msi = 0;
    rng_state = 1;
    for (int i = 0; i < 400000; i++) {
        float x = (float)(-87.0 + 175.0 * urand());
        if (i % 2)
            x = (float)(sym() * 2.0);  /* dense near 0 */
        me = fmax(me, ulp_err(qd_expf(x), exp((double)x)));
        double s = 1.0 / (1.0 + exp(-(double)x));
        if (x > -80.0f)
            ms = fmax(ms, ulp_err(qd_sigmoidf(x), s));
        if (x > -80.0f && fabs((double)x * s) > 1e-30)
            msi = fmax(msi, ulp_err(qd_siluf(x), (double)x * s));
        uint32_t u = 0x00800000u + (uint32_t)(urand() * (double)(0x7f000000u));
        float y = qd_bits_f32(u);
        ml = fmax(ml, ulp_err(qd_logf(y), log((double)y)));
    }
    fprintf(stderr, "exact_math max ulp: exp %.3f log %.3f sigmoid %.3f silu %.3f\n", me, ml, ms, msi);
    ck_assert(me <= 1.05);
    ck_assert(ml <= 1.0);
    ck_assert(ms <= 2.5);
    ck_assert(msi <= 2.5);
}
END_TEST

START_TEST(test_exact_math_special_and_monotonic)
{
    ck_assert(qd_expf(0.0f) == 1.0f);
    ck_assert(qd_logf(1.0f) == 0.0f);
    ck_assert(isinf(qd_expf(100.0f)) && qd_expf(-200.0f) == 0.0f);
    ck_assert(isnan(qd_expf(NAN)) && isnan(qd_logf(-1.0f)) && isnan(qd_logf(NAN)));
    ck_assert(isinf(qd_logf(0.0f)) && qd_logf(0.0f) < 0 && isinf(qd_logf(INFINITY)));
    ck_assert(fabs(qd_logf(1e-40f) - log(1e-40)) < 1e-5);       /* subnormal input */
    ck_assert(qd_expf(-100.0f) > 0.0f && qd_expf(-100.0f) < 1e-43f); /* subnormal output */
    ck_assert(qd_siluf(-200.0f) == 0.0f && qd_sigmoidf(200.0f) == 1.0f);
    ck_assert(qd_rsqrtf(4.0f) == 0.5f);
    /* monotonic over consecutive floats around range-reduction boundaries */
    const float starts[] = {-0.3466f, 0.3465f, 1.0397f, -20.1f, 0.9999f, 1.4142f};
    for (int s = 0; s < 6; s++) {
        float x = starts[s], pe = qd_expf(x), pl = qd_logf(fabsf(x)), ps = qd_sigmoidf(x);
        for (int i = 0; i < 20000; i++) {
            x = nextafterf(x, INFINITY);
            float e = qd_expf(x), sg = qd_sigmoidf(x), lg = qd_logf(fabsf(x));
            ck_assert(e >= pe && sg >= ps);
            ck_assert(x > 0 ? lg >= pl : lg <= pl);
            pe = e;
            ps = sg;
            pl = lg;
        }
    }
}
END_TEST

/* ---- recipes, config, parameter table */

START_TEST(test_recipes)
{
    for (int r = 0; r < QD_RECIPE_COUNT; r++) {
        qd_recipe back;
        ck_assert_int_eq(qd_recipe_parse(&back, qd_recipe_name((qd_recipe)r)), QD_OK);
        ck_assert_int_eq(back, r);
    }
    qd_recipe r;
    ck_assert_int_eq(qd_recipe_parse(&r, "nvfp5"), QD_ERR_ARG);
    ck_assert(strstr(qd_last_error(), "nvfp5") != NULL);
    ck_assert_int_eq(qd_recipe_linear_mode(QD_RECIPE_QUADS, QD_ROLE_ROLLOUT), QD_LINEAR_W4A4_RAC);
    ck_assert_int_eq(qd_recipe_linear_mode(QD_RECIPE_QUADS, QD_ROLE_TRAINER), QD_LINEAR_AQAT);
    ck_assert_int_eq(qd_recipe_linear_mode(QD_RECIPE_NVFP4_RAC, QD_ROLE_TRAINER), QD_LINEAR_BF16);
    ck_assert_int_eq(qd_recipe_linear_mode(QD_RECIPE_NVFP4_SYM_QAT, QD_ROLE_TRAINER), QD_LINEAR_SYM_QAT);
    ck_assert_int_eq(qd_recipe_linear_mode(QD_RECIPE_NVFP4_REPLAY, QD_ROLE_ROLLOUT), QD_LINEAR_W4A4);
    ck_assert_int_eq(qd_recipe_linear_mode(QD_RECIPE_NVFP4_REPLAY, QD_ROLE_TRAINER), QD_LINEAR_W4A4_STE);
    ck_assert_int_eq(qd_recipe_linear_mode(QD_RECIPE_QUADS_REPLAY, QD_ROLE_ROLLOUT), QD_LINEAR_W4A4_RAC);
    ck_assert_int_eq(qd_recipe_linear_mode(QD_RECIPE_QUADS_REPLAY, QD_ROLE_TRAINER), QD_LINEAR_W4A4_RAC_STE);
    ck_assert_int_eq(qd_recipe_linear_mode(QD_RECIPE_FP8, QD_ROLE_ROLLOUT), QD_LINEAR_FP8);
    ck_assert_int_eq(qd_recipe_dense_mode(QD_RECIPE_NVFP4), QD_LINEAR_BF16);
    ck_assert_int_eq(qd_recipe_dense_mode(QD_RECIPE_FP32), QD_LINEAR_FP32);
}
END_TEST

START_TEST(test_config_and_params)
{
    qd_model_config c = tiny_config(0, 1);
    ck_assert(!qd_model_config_is_moe_layer(&c, 0) && qd_model_config_is_moe_layer(&c, 1));
    c.decoder_sparse_step = 2;
    ck_assert(!qd_model_config_is_moe_layer(&c, 0) && qd_model_config_is_moe_layer(&c, 1));
    c.num_key_value_heads = 3;
    ck_assert_int_eq(qd_model_config_check(&c), QD_ERR_ARG);
    ck_assert(strstr(qd_last_error(), "num_key_value_heads") != NULL);
    ck_assert(qd_backend_init_best(&c, &(qd_backend_options){0}) == NULL);

    c = tiny_config(0, 1);
    qd_backend *b = qd_backend_init_by_name("auto", &c, &(qd_backend_options){0});
    ck_assert_str_eq(qd_backend_name(b), "cpu");
    int np;
    const qd_param_info *p = qd_backend_params(b, &np);
    /* embed, 2 x (4 norms + 4 attn), dense 3, router 1 + 8 x 3, norm, lm_head */
    ck_assert_int_eq(np, 1 + 16 + 3 + 25 + 2);
    int i = qd_backend_find_param(b, "model.layers.1.mlp.experts.7.down_proj.weight");
    ck_assert(i >= 0 && p[i].rows == 32 && p[i].cols == 16);
    i = qd_backend_find_param(b, "model.layers.0.mlp.up_proj.weight");
    ck_assert(i >= 0 && p[i].rows == 32 && p[i].cols == 32);
    i = qd_backend_find_param(b, "model.layers.1.self_attn.k_proj.weight");
    ck_assert(i >= 0 && p[i].rows == 32 && p[i].cols == 32);
    ck_assert(qd_backend_find_param(b, "lm_head.weight") >= 0);
    ck_assert(p[np - 1].offset + (size_t)(p[np - 1].rows * p[np - 1].cols) == qd_backend_num_floats(b));
    qd_backend_free(b);
    c.tie_word_embeddings = 1;
    b = qd_backend_init_by_name("cpu", &c, &(qd_backend_options){0});
    ck_assert(qd_backend_find_param(b, "lm_head.weight") < 0);
    ck_assert(qd_backend_init_by_name("cuda", &c, &(qd_backend_options){0}) == NULL);
    ck_assert(qd_backend_init_by_name("tpu", &c, &(qd_backend_options){0}) == NULL);
    qd_backend_free(b);
}
END_TEST

/* ---- forward */

/* log-probs agree with the logits (in double) and padding is zero. */
/* The exact lm_head multiplies by the row block-floating-point product
 * (docs/numerics.md §3b) in every recipe but fp32, whose float32 weights keep
 * the float32 chain: with every layer's output projections zero (o_proj,
 * down_proj: each layer adds +0), the logits are the lm_head of the final
 * norm of the embedding rows, which the ops compute here. Trainer and lean
 * rollout alike (the rollout's from BF16 bits, the trainer's from floats). */
START_TEST(test_lm_head_bfp)
{
    qd_model_config c = tiny_config(0, 1);
    const int C = c.hidden_size, V = c.vocab_size;
    const qd_ops *O = qd_cpu_ops();
    void *dev = qd_cpu_dev_new(1);
    int32_t tok[TB * TT];
    tiny_batch(tok, 5);
    for (int k = 0; k < 3; k++) {
        qd_recipe r = k == 2 ? QD_RECIPE_FP32 : QD_RECIPE_BF16;
        qd_backend *b = make(&c, r, k == 1 ? QD_ROLE_ROLLOUT : QD_ROLE_TRAINER, 0, 0);
        int np;
        const qd_param_info *p = qd_backend_params(b, &np);
        float *w = random_weights(b, 17);
        const float *emb = NULL, *nw = NULL, *head = NULL;
        for (int i = 0; i < np; i++) {
            if (strstr(p[i].name, "o_proj") || strstr(p[i].name, "down_proj"))
                memset(w + p[i].offset, 0, sizeof(float) * (size_t)(p[i].rows * p[i].cols));
            if (!strcmp(p[i].name, "model.embed_tokens.weight"))
                emb = w + p[i].offset;
            if (!strcmp(p[i].name, "model.norm.weight"))
                nw = w + p[i].offset;
            if (!strcmp(p[i].name, "lm_head.weight"))
                head = w + p[i].offset;
        }
        ck_assert(emb && nw && head);
        ck_assert_int_eq(qd_backend_set_weights(b, w, qd_backend_num_floats(b)), QD_OK);
        float *logits = malloc(sizeof(float) * TB * TT * V), logp[TB * TT];
        forward_ok(b, tok, tlen, TB, TT, logp, logits);
        /* the reference: embedding rows, final norm, the lm_head's product */
        float *h = malloc(sizeof(float) * TB * TT * C), *ln = malloc(sizeof(float) * TB * TT * C);
        float *rstd = malloc(sizeof(float) * TB * TT), *ref = malloc(sizeof(float) * TB * TT * V);
        float *chain = malloc(sizeof(float) * TB * TT * V), *nr = malloc(sizeof(float) * C);
        uint16_t *h16 = malloc(sizeof(uint16_t) * V * C);
        void *wq = malloc(qd_bfp_bytes(V, C));
        int N = 0;
        int32_t at[TB * TT];
        for (int bb = 0; bb < TB; bb++)
            for (int t = 0; t < tlen[bb]; t++, N++) {
                at[N] = bb * TT + t;
                for (int j = 0; j < C; j++) {
                    float e = emb[(size_t)tok[bb * TT + t] * C + j];
                    h[N * C + j] = r == QD_RECIPE_FP32 ? e : qd_round_bf16(e);
                }
            }
        for (int j = 0; j < C; j++)
            nr[j] = r == QD_RECIPE_FP32 ? nw[j] : qd_round_bf16(nw[j]);
        ck_assert_int_eq(O->rmsnorm(dev, ln, rstd, h, nr, N, C, (float)c.rms_norm_eps), QD_OK);
        for (int i = 0; i < V * C; i++)
            h16[i] = qd_bf16_from_f32(head[i]);
        if (r == QD_RECIPE_FP32) {
            ck_assert_int_eq(O->matmul(dev, ref, ln, head, N, C, V, QD_PREC_F32), QD_OK);
        } else {
            for (int i = 0; i < N * C; i++)
                ln[i] = qd_round_bf16(ln[i]);
            ck_assert_int_eq(O->bfp_weights(dev, wq, h16, NULL, V, C), QD_OK);
            ck_assert_int_eq(O->matmul_bfp(dev, ref, ln, wq, N, C, V), QD_OK);
            ck_assert_int_eq(O->matmul_w16(dev, chain, ln, h16, N, C, V, QD_PREC_BF16), QD_OK);
            ck_assert_msg(memcmp(ref, chain, sizeof(float) * N * V) != 0, "the chain's bits: no case told apart");
        }
        for (int n = 0; n < N; n++)
            ck_assert_msg(memcmp(logits + (size_t)at[n] * V, ref + (size_t)n * V, sizeof(float) * V) == 0,
                          "%s %s: logits of token %d are not the lm_head's %s product", qd_recipe_name(r),
                          k == 1 ? "rollout" : "trainer", n, r == QD_RECIPE_FP32 ? "float32" : "row BFP");
        free(logits), free(h), free(ln), free(rstd), free(ref), free(chain), free(nr), free(h16), free(wq), free(w);
        qd_backend_free(b);
    }
    free(dev);
}
END_TEST

START_TEST(test_forward_logits_consistent)
{
    qd_model_config c = tiny_config(0, 1);
    qd_backend *b = make(&c, QD_RECIPE_FP32, QD_ROLE_TRAINER, 0, 0);
    float *w = random_weights(b, 7);
    ck_assert_int_eq(qd_backend_set_weights(b, w, qd_backend_num_floats(b)), QD_OK);
    int32_t tok[TB * TT];
    float logp[TB * TT], logits[TB * TT * 64];
    tiny_batch(tok, 3);
    forward_ok(b, tok, tlen, TB, TT, logp, logits);
    for (int bb = 0; bb < TB; bb++)
        for (int t = 0; t < TT; t++) {
            const float *l = logits + (bb * TT + t) * 64;
            if (t >= tlen[bb] - 1) {
                ck_assert(logp[bb * TT + t] == 0.0f);
                if (t >= tlen[bb])
                    ck_assert(l[0] == 0.0f && l[63] == 0.0f);
                continue;
            }
            double s = 0;
            for (int j = 0; j < 64; j++)
                s += exp((double)l[j]);
            double ref = (double)l[tok[bb * TT + t + 1]] - log(s);
            ck_assert_msg(fabs(logp[bb * TT + t] - ref) < 2e-6, "logp %g vs %g", logp[bb * TT + t], ref);
            ck_assert(logp[bb * TT + t] < 0.0f);
        }
    free(w);
    qd_backend_free(b);
}
END_TEST

/* The fp32 forward against tests/ref/qwen3moe_tiny_ref.py (numpy, float64,
 * written from HF's modeling_qwen3_moe.py): same weights and tokens from the
 * same splitmix64 stream; bound max |diff| < 1e-5 * max |logit|. */
static void check_reference(int tied, int norm_topk, uint64_t seed)
{
    char rel[64];
    snprintf(rel, sizeof rel, "tests/fixtures/qwen3moe_tiny_tied%d.bin", tied);
    FILE *f = fopen(qd_test_path(rel), "rb");
    ck_assert_msg(f != NULL, "missing %s", rel);
    float ref[17 * 64], logits[TB * TT * 64], logp[TB * TT];
    ck_assert_int_eq(fread(ref, sizeof(float), 17 * 64, f), 17 * 64);
    fclose(f);
    qd_model_config c = tiny_config(tied, norm_topk);
    qd_backend *b = make(&c, QD_RECIPE_FP32, QD_ROLE_TRAINER, 0, 0);
    float *w = random_weights(b, seed);
    ck_assert_int_eq(qd_backend_set_weights(b, w, qd_backend_num_floats(b)), QD_OK);
    int32_t tok[TB * TT];
    tiny_batch(tok, seed + 1);
    forward_ok(b, tok, tlen, TB, TT, logp, logits);
    double dmax = 0, rmax = 0;
    for (int bb = 0, n = 0; bb < TB; bb++)
        for (int t = 0; t < tlen[bb]; t++, n++)
            for (int j = 0; j < 64; j++) {
                dmax = fmax(dmax, fabs((double)logits[(bb * TT + t) * 64 + j] - ref[n * 64 + j]));
                rmax = fmax(rmax, fabs((double)ref[n * 64 + j]));
            }
    fprintf(stderr, "reference (tied %d): max |logit - numpy float64| = %.2e, max |logit| = %.2f\n", tied,
            dmax, rmax);
    ck_assert(dmax < 1e-5 * rmax);
    free(w);
    qd_backend_free(b);
}

START_TEST(test_forward_reference)
{
    check_reference(0, 1, 81);
    check_reference(1, 0, 91);
}
END_TEST

/* Each sequence alone (no padding, B = 1) gives the same bits as in the batch. */
static void check_batch_independence(qd_recipe r, qd_role role, double ratio)
{
    qd_model_config c = tiny_config(0, 1);
    qd_backend *b = make(&c, r, role, ratio, 0);
    float *w = random_weights(b, 11);
    ck_assert_int_eq(qd_backend_set_weights(b, w, qd_backend_num_floats(b)), QD_OK);
    int32_t tok[TB * TT];
    float logp[TB * TT], one[TT];
    tiny_batch(tok, 5);
    forward_ok(b, tok, tlen, TB, TT, logp, NULL);
    for (int bb = 0; bb < TB; bb++) {
        forward_ok(b, tok + bb * TT, &tlen[bb], 1, tlen[bb], one, NULL);
        ck_assert_msg(memcmp(one, logp + bb * TT, sizeof(float) * tlen[bb]) == 0, "recipe %s row %d",
                      qd_recipe_name(r), bb);
    }
    free(w);
    qd_backend_free(b);
}

START_TEST(test_batch_independence)
{
    check_batch_independence(QD_RECIPE_FP32, QD_ROLE_TRAINER, 0);
    check_batch_independence(QD_RECIPE_QUADS, QD_ROLE_TRAINER, 0);
    check_batch_independence(QD_RECIPE_NVFP4_SYM_QAT, QD_ROLE_TRAINER, 0);
    check_batch_independence(QD_RECIPE_FP8, QD_ROLE_ROLLOUT, 0);
    check_batch_independence(QD_RECIPE_QUADS, QD_ROLE_ROLLOUT, 0.25);
}
END_TEST

/* Loss sum c . logp, in double. */
static double loss_of(qd_backend *b, const int32_t *tok, const float *coef)
{
    float logp[TB * TT];
    forward_ok(b, tok, tlen, TB, TT, logp, NULL);
    double L = 0;
    for (int i = 0; i < TB * TT; i++)
        L += (double)coef[i] * logp[i];
    return L;
}

static void random_coef(float *coef, uint64_t seed)
{
    rng_state = seed;
    for (int i = 0; i < TB * TT; i++)
        coef[i] = (float)sym();
}

/* 1 and 2 OpenMP threads give the same log-probs and gradients, bit for bit. */
static void check_threads(qd_recipe r, qd_role role, double ratio)
{
    qd_model_config c = tiny_config(0, 1);
    float *lp[2], *g[2], coef[TB * TT];
    int32_t tok[TB * TT];
    tiny_batch(tok, 9);
    random_coef(coef, 4);
    size_t n = 0;
    for (int k = 0; k < 2; k++) {
        qd_backend *b = make(&c, r, role, ratio, k + 1);
        float *w = random_weights(b, 13);
        ck_assert_int_eq(qd_backend_set_weights(b, w, qd_backend_num_floats(b)), QD_OK);
        n = qd_backend_num_floats(b);
        lp[k] = malloc(sizeof(float) * TB * TT);
        g[k] = calloc(n, sizeof(float));
        forward_ok(b, tok, tlen, TB, TT, lp[k], NULL);
        if (role == QD_ROLE_TRAINER) {
            ck_assert_int_eq(qd_backend_backward(b, coef), QD_OK);
            ck_assert_int_eq(qd_backend_get_grads(b, g[k], n), QD_OK);
        }
        free(w);
        qd_backend_free(b);
    }
    ck_assert(memcmp(lp[0], lp[1], sizeof(float) * TB * TT) == 0);
    ck_assert(memcmp(g[0], g[1], sizeof(float) * n) == 0);
    for (int k = 0; k < 2; k++) {
        free(lp[k]);
        free(g[k]);
    }
}

START_TEST(test_thread_independence)
{
    check_threads(QD_RECIPE_FP32, QD_ROLE_TRAINER, 0);
    check_threads(QD_RECIPE_QUADS, QD_ROLE_TRAINER, 0);
    check_threads(QD_RECIPE_NVFP4_RAC, QD_ROLE_ROLLOUT, 0.25);
    check_threads(QD_RECIPE_FP8, QD_ROLE_ROLLOUT, 0);
}
END_TEST

/* ---- gradients by central finite differences (fp32 recipe) */

/* For every tensor: the derivative along a random unit direction d (whole
 * tensor) and along its 2 largest-gradient elements, against Richardson-
 * extrapolated central differences (4 D(h/2) - D(h)) / 3 of the loss summed in
 * double, h = 0.03 (0.01 for the router, so that no top-k choice flips: a flip
 * is a jump of the loss). The float32 forward's rounding noise is about 3e-4
 * after the division by h, so the bound is |num - an| < 2e-3 (|an| + 0.25);
 * measured worst: 4e-4 absolute. */
static void check_gradients(int tied, int norm_topk, uint64_t seed)
{
    qd_model_config c = tiny_config(tied, norm_topk);
    qd_backend *b = make(&c, QD_RECIPE_FP32, QD_ROLE_TRAINER, 0, 0);
    size_t n = qd_backend_num_floats(b);
    float *w = random_weights(b, seed), *g = malloc(sizeof(float) * n), *wp = malloc(sizeof(float) * n);
    double *d = malloc(sizeof(double) * n);
    int32_t tok[TB * TT];
    float coef[TB * TT], logp[TB * TT];
    tiny_batch(tok, seed + 1);
    random_coef(coef, seed + 2);
    ck_assert_int_eq(qd_backend_set_weights(b, w, n), QD_OK);
    qd_backend_zero_grad(b);
    forward_ok(b, tok, tlen, TB, TT, logp, NULL);
    ck_assert_int_eq(qd_backend_backward(b, coef), QD_OK);
    ck_assert_int_eq(qd_backend_get_grads(b, g, n), QD_OK);
    int np;
    const qd_param_info *p = qd_backend_params(b, &np);
    double worst_dir = 0, worst_el = 0;
    for (int i = 0; i < np; i++) {
        size_t off = p[i].offset, m = (size_t)(p[i].rows * p[i].cols);
        for (int mode = 0; mode < 3; mode++) {
            memset(d, 0, sizeof(double) * n);
            double an = 0;
            if (mode == 0) {  /* unit L2 norm, so that h is the step length */
                double nn = 0;
                for (size_t k = 0; k < m; k++) {
                    d[off + k] = sym();
                    nn += d[off + k] * d[off + k];
                }
                for (size_t k = 0; k < m; k++)
                    d[off + k] /= sqrt(nn);
            } else {  /* the mode-th largest |g| of the tensor */
                size_t best = off, second = off;
                for (size_t k = off; k < off + m; k++)
                    if (fabsf(g[k]) > fabsf(g[best])) {
                        second = best;
                        best = k;
                    } else if (k != best && fabsf(g[k]) > fabsf(g[second]))
                        second = k;
                size_t k = mode == 1 ? best : second;
                if (fabsf(g[k]) < 1e-3f)
                    continue;
                d[k] = 1.0;
            }
            for (size_t k = off; k < off + m; k++)
                an += d[k] * g[k];
            /* Richardson: (4 D(h/2) - D(h)) / 3 cancels the h^2 term of D(h) */
            double h = strstr(p[i].name, "mlp.gate.weight") ? 1e-2 : 3e-2, fd[4];
            for (int s = 0; s < 4; s++) {
                double hs = (s & 1 ? -h : h) / (s < 2 ? 1 : 2);
                for (size_t k = 0; k < n; k++)
                    wp[k] = (float)(w[k] + hs * d[k]);
                ck_assert_int_eq(qd_backend_set_weights(b, wp, n), QD_OK);
                fd[s] = loss_of(b, tok, coef);
            }
            double num = (4 * (fd[2] - fd[3]) / h - (fd[0] - fd[1]) / (2 * h)) / 3;
            double rel = fabs(num - an) / (fabs(an) + 0.25);
            ck_assert_msg(rel < 2e-3, "%s mode %d: analytic %g numeric %g", p[i].name, mode, an, num);
            if (mode == 0)
                worst_dir = fmax(worst_dir, rel);
            else
                worst_el = fmax(worst_el, rel);
        }
    }
    fprintf(stderr, "gradients (tied %d, norm_topk %d): %d tensors, worst |num - an| / (|an| + 0.25): direction %.2e, "
            "element %.2e\n", tied, norm_topk, np, worst_dir, worst_el);
    free(w);
    free(g);
    free(wp);
    free(d);
    qd_backend_free(b);
}

START_TEST(test_gradients_untied) { check_gradients(0, 1, 21); }
END_TEST

START_TEST(test_gradients_tied) { check_gradients(1, 0, 31); }
END_TEST

/* ---- precision recipes against fp32 */

/* Relative RMS difference of the logits of valid positions. */
static double logit_err(const float *a, const float *ref)
{
    double num = 0, den = 0;
    for (int bb = 0; bb < TB; bb++)
        for (int t = 0; t < tlen[bb]; t++)
            for (int j = 0; j < 64; j++) {
                double x = a[(bb * TT + t) * 64 + j], r = ref[(bb * TT + t) * 64 + j];
                num += (x - r) * (x - r);
                den += r * r;
            }
    return sqrt(num / den);
}

static float *recipe_logits(qd_recipe r, qd_role role, const float *w, const int32_t *tok)
{
    qd_model_config c = tiny_config(0, 1);
    qd_backend *b = make_loaded(&c, r, role, 0, 0, w);
    float logp[TB * TT], *logits = malloc(sizeof(float) * TB * TT * 64);
    forward_ok(b, tok, tlen, TB, TT, logp, logits);
    qd_backend_free(b);
    return logits;
}

static double recipe_err(qd_recipe r, qd_role role, double ratio, const float *w, const float *ref,
                         const int32_t *tok, int calibrate)
{
    qd_model_config c = tiny_config(0, 1);
    qd_backend *b = make_loaded(&c, r, role, ratio, 0, w);
    float logp[TB * TT], *logits = malloc(sizeof(float) * TB * TT * 64);
    if (calibrate) {  /* one rollout measures activation errors; the next sync picks RAC channels */
        forward_ok(b, tok, tlen, TB, TT, logp, logits);
        ck_assert_int_eq(qd_backend_set_weights(b, w, qd_backend_num_floats(b)), QD_OK);
    }
    forward_ok(b, tok, tlen, TB, TT, logp, logits);
    double e = logit_err(logits, ref);
    fprintf(stderr, "recipe %-14s %-7s ratio %.2f: logit relative RMS error %.3e\n", qd_recipe_name(r),
            role == QD_ROLE_ROLLOUT ? "rollout" : "trainer", ratio, e);
    free(logits);
    qd_backend_free(b);
    return e;
}

START_TEST(test_recipes_error)
{
    qd_model_config c = tiny_config(0, 1);
    qd_backend *b = make(&c, QD_RECIPE_FP32, QD_ROLE_TRAINER, 0, 0);
    float *w = random_weights(b, 41), logp[TB * TT], *ref = malloc(sizeof(float) * TB * TT * 64);
    ck_assert_int_eq(qd_backend_set_weights(b, w, qd_backend_num_floats(b)), QD_OK);
    int32_t tok[TB * TT];
    tiny_batch(tok, 43);
    forward_ok(b, tok, tlen, TB, TT, logp, ref);
    qd_backend_free(b);
    const qd_role RO = QD_ROLE_ROLLOUT, TR = QD_ROLE_TRAINER;
    double bf16 = recipe_err(QD_RECIPE_BF16, RO, 0, w, ref, tok, 0);
    double fp8 = recipe_err(QD_RECIPE_FP8, RO, 0, w, ref, tok, 0);
    double nv = recipe_err(QD_RECIPE_NVFP4, RO, 0, w, ref, tok, 0);
    double rac0 = recipe_err(QD_RECIPE_NVFP4_RAC, RO, 0, w, ref, tok, 1);
    double rac = recipe_err(QD_RECIPE_NVFP4_RAC, RO, 0.25, w, ref, tok, 1);
    double quads = recipe_err(QD_RECIPE_QUADS, RO, 0.5, w, ref, tok, 1);
    double aqat = recipe_err(QD_RECIPE_NVFP4_AQAT, TR, 0, w, ref, tok, 0);
    double sym = recipe_err(QD_RECIPE_NVFP4_SYM_QAT, TR, 0, w, ref, tok, 0);
    double bf16t = recipe_err(QD_RECIPE_NVFP4, TR, 0, w, ref, tok, 0);
    /* W4A4 rollout vs sym-QAT trainer: the same codes of the one quantize
     * function on both sides; only the float32 rounding of the sums differs */
    float *lr = recipe_logits(QD_RECIPE_NVFP4, RO, w, tok), *lt = recipe_logits(QD_RECIPE_NVFP4_SYM_QAT, TR, w, tok);
    double same = logit_err(lr, lt);
    fprintf(stderr, "nvfp4 rollout vs nvfp4-sym-qat trainer: logit relative RMS difference %.3e\n", same);
    ck_assert(same < 1e-4);
    free(lr);
    free(lt);
    ck_assert(bf16 > 0 && bf16 < 2e-2);
    ck_assert(fp8 > bf16 && fp8 < 0.1);
    ck_assert(nv > fp8 && nv < 0.5);
    ck_assert(rac0 == nv);          /* ratio 0 is naive NVFP4, bit for bit */
    ck_assert(rac < nv && quads < rac);
    ck_assert(aqat > bf16 && aqat < nv); /* weight error only */
    ck_assert(sym > aqat);
    ck_assert(bf16t == bf16);       /* every recipe's trainer without QAT is BF16 */
    free(w);
    free(ref);
}
END_TEST

/* Gradients (n floats, caller frees) of the loss coef . logp under recipe r, trainer role. */
static float *trainer_grads(qd_recipe r, const float *w, const int32_t *tok, const float *coef, size_t n)
{
    qd_model_config c = tiny_config(0, 1);
    qd_backend *b = make_loaded(&c, r, QD_ROLE_TRAINER, 0, 0, w);
    float logp[TB * TT], *g = malloc(sizeof(float) * n);
    forward_ok(b, tok, tlen, TB, TT, logp, NULL);
    ck_assert_int_eq(qd_backend_backward(b, coef), QD_OK);
    ck_assert_int_eq(qd_backend_get_grads(b, g, n), QD_OK);
    qd_backend_free(b);
    for (size_t i = 0; i < n; i++)
        ck_assert(isfinite(g[i]));
    return g;
}

/* |g - ref| / |ref| in double. */
static double rel_l2(const float *g, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)g[i] - ref[i]) * ((double)g[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / den);
}

static double grad_dist(qd_recipe r, const float *w, const int32_t *tok, const float *coef, const float *ref,
                        size_t n)
{
    float *g = trainer_grads(r, w, tok, coef, n);
    double d = rel_l2(g, ref, n);
    fprintf(stderr, "recipe %-14s trainer: gradient relative L2 distance to fp32 %.3e\n", qd_recipe_name(r), d);
    free(g);
    return d;
}

/* Replay vs sym-QAT gradients: measured 3.1e-7 on this data (the forwards'
 * summation orders differ by float32 rounding; an NVFP4 code flip downstream
 * would move more); replay vs AQAT measured 0.37. */
#define REPLAY_SYM_BOUND 1e-4

/* Trainer recipes' gradients (straight-through) stay near fp32's: the
 * relative L2 distance is non-zero and ordered like the forward errors. */
START_TEST(test_trainer_gradients)
{
    qd_model_config c = tiny_config(0, 1);
    qd_backend *b = make(&c, QD_RECIPE_FP32, QD_ROLE_TRAINER, 0, 0);
    size_t n = qd_backend_num_floats(b);
    float *w = random_weights(b, 45), coef[TB * TT];
    qd_backend_free(b);
    int32_t tok[TB * TT];
    tiny_batch(tok, 46);
    random_coef(coef, 47);
    float *ref = trainer_grads(QD_RECIPE_FP32, w, tok, coef, n);
    double bf16 = grad_dist(QD_RECIPE_BF16, w, tok, coef, ref, n);
    double aqat = grad_dist(QD_RECIPE_QUADS, w, tok, coef, ref, n);
    double sym = grad_dist(QD_RECIPE_NVFP4_SYM_QAT, w, tok, coef, ref, n);
    ck_assert(bf16 > 0 && bf16 < 0.05);
    ck_assert(aqat > bf16 && aqat < 1.0);
    ck_assert(sym > bf16 && sym < 1.5);
    /* the replay trainer's backward is sym-QAT's (dinp through dequant(quantize(W)),
     * dW against the dequantized NVFP4 input the forward multiplied,
     * docs/numerics.md §5): its gradient differs from sym-QAT's only through the
     * forward's summation order, and from AQAT's (dW against the unquantized
     * input) by the activation quantization error */
    float *gs = trainer_grads(QD_RECIPE_NVFP4_SYM_QAT, w, tok, coef, n);
    float *gr = trainer_grads(QD_RECIPE_NVFP4_REPLAY, w, tok, coef, n);
    float *ga = trainer_grads(QD_RECIPE_QUADS, w, tok, coef, n);
    double rs = rel_l2(gr, gs, n), ra = rel_l2(gr, ga, n);
    fprintf(stderr, "nvfp4-replay trainer gradient: relative L2 distance to nvfp4-sym-qat's %.3e, to quads' "
            "(AQAT) %.3e\n", rs, ra);
    ck_assert(rs > 0 && rs < REPLAY_SYM_BOUND);
    ck_assert(ra > 10 * REPLAY_SYM_BOUND);
    /* quads-replay's trainer before it has channel sets is nvfp4-replay's, bit for bit */
    float *gq = trainer_grads(QD_RECIPE_QUADS_REPLAY, w, tok, coef, n);
    ck_assert(memcmp(gq, gr, sizeof(float) * n) == 0);
    free(gq);
    free(gs);
    free(gr);
    free(ga);
    free(ref);
    free(w);
}
END_TEST

/* ---- the replay recipe: no rollout-trainer gap */

enum { RB = 4, RP = 6, RM = 10 }; /* prompts, prompt width, new tokens */

/* Rollout ro samples (temperature 1) from RB random prompts; the trainer tr
 * and the rollout then run the forward of prompt + completion. *max_gap =
 * the largest |trainer - rollout| log-prob of a sampled token (the gap that
 * `quads rl` measures); returns 1 when both forwards' logits are the same
 * bytes. Writes the batch into seq, len (RB, RP + RM) for a later backward. */
static int replay_gap(qd_backend *ro, qd_backend *tr, int V, uint64_t seed, double *max_gap, int32_t *seq,
                      int32_t *len)
{
    enum { T = RP + RM };
    int32_t prompt[RB * RP], plen[RB], tok[RB * RM], glen[RB];
    uint64_t sid[RB];
    float glp[RB * RM], lpt[RB * T], lpr[RB * T];
    rng_state = seed;
    for (int b = 0; b < RB; b++) {
        plen[b] = 3 + b % 4;
        sid[b] = 500 + (uint64_t)b;
        for (int t = 0; t < RP; t++)
            prompt[b * RP + t] = t < plen[b] ? (int32_t)(urand() * V) : 0;
    }
    qd_generate_request rq = {.B = RB, .Tp = RP, .prompt = prompt, .prompt_len = plen, .seq_id = sid,
                              .seed = seed, .max_new_tokens = RM, .temperature = 1.0f, .top_p = 1.0f};
    qd_generate_result res = {.tokens = tok, .logp = glp, .lengths = glen};
    ck_assert_msg(qd_backend_generate(ro, &rq, &res) == QD_OK, "generate: %s", qd_last_error());
    for (int b = 0; b < RB; b++) {
        memcpy(seq + b * T, prompt + b * RP, sizeof(int32_t) * plen[b]);
        memcpy(seq + b * T + plen[b], tok + b * RM, sizeof(int32_t) * glen[b]);
        len[b] = plen[b] + glen[b];
    }
    float *lgt = malloc(sizeof(float) * RB * T * V), *lgr = malloc(sizeof(float) * RB * T * V);
    forward_ok(ro, seq, len, RB, T, lpr, lgr);
    forward_ok(tr, seq, len, RB, T, lpt, lgt);
    *max_gap = 0;
    int n = 0;
    for (int b = 0; b < RB; b++)
        for (int i = 0; i < glen[b]; i++, n++) {
            int t = b * T + plen[b] - 1 + i;
            ck_assert(lpr[t] == glp[b * RM + i]); /* generate and forward agree on one instance */
            *max_gap = fmax(*max_gap, fabs((double)lpt[t] - glp[b * RM + i]));
        }
    ck_assert_int_eq(n, RB * RM);
    int same = memcmp(lgt, lgr, sizeof(float) * RB * T * V) == 0;
    free(lgt);
    free(lgr);
    return same;
}

/* quads-replay: the rollout's RAC state (channel sets) into the trainer, as
 * quads rl copies it after each sync. */
static void copy_rac(qd_backend *ro, qd_backend *tr)
{
    size_t n = qd_backend_rac_state_size(ro);
    ck_assert(n > 0 && n == qd_backend_rac_state_size(tr));
    void *blob = malloc(n);
    ck_assert_int_eq(qd_backend_get_rac_state(ro, blob, n), QD_OK);
    ck_assert_int_eq(qd_backend_set_rac_state(tr, blob, n), QD_OK);
    free(blob);
}

/* quads-replay: a forward that gathers RAC statistics, then the sync that
 * picks channels from them; the trainer, whose sets are still empty, now
 * computes other numbers than the rollout, until it takes the rollout's. */
static void rac_calibrate(qd_backend *ro, qd_backend *tr, const float *w, int V, const char *what)
{
    int32_t tok[TB * TT], seq[RB * (RP + RM)], len[RB];
    float logp[TB * TT];
    tiny_batch(tok, 151);
    for (int i = 0; i < TB * TT; i++)
        tok[i] = tok[i] % V;
    qd_batch bt = {.B = TB, .T = TT, .tokens = tok, .lengths = tlen, .temperature = 1.0f, .rac_stats = 1};
    ck_assert_int_eq(qd_backend_forward(ro, &bt, logp, NULL), QD_OK);
    ck_assert_int_eq(qd_backend_set_weights(ro, w, qd_backend_num_floats(ro)), QD_OK);
    double gap;
    ck_assert_msg(!replay_gap(ro, tr, V, 5, &gap, seq, len) && gap > 0, "%s: channels not yet copied", what);
    copy_rac(ro, tr);
}

/* On model c with master weights w: the replay trainer's log-probs of the
 * rollout's samples are the rollout's, bit for bit, before and after an
 * update of the trainer (backward, AdamW, weight sync); with differ, the
 * nvfp4-sym-qat trainer (the same codes, float32 sums in another order) is
 * not (on the shipped tiny model, whose 64-wide rows are four blocks, its
 * float32 sums are exact or all but exact: 1.1e-7 apart before its
 * regeneration of 2026-12-06, equal after, so there it is only printed). */
static void check_replay(const qd_model_config *c, const float *w, qd_recipe r, const char *what, int differ)
{
    enum { T = RP + RM };
    int V = c->vocab_size, rac = r == QD_RECIPE_QUADS_REPLAY;
    qd_backend *ro = make_loaded(c, r, QD_ROLE_ROLLOUT, 0.5, 0, w);
    qd_backend *tr = make_loaded(c, r, QD_ROLE_TRAINER, 0.5, 0, w);
    qd_backend *sq = make_loaded(c, QD_RECIPE_NVFP4_SYM_QAT, QD_ROLE_TRAINER, 0, 0, w);
    size_t n = qd_backend_num_floats(tr);
    int32_t seq[RB * T], len[RB];
    double gap, sgap;
    if (rac)
        rac_calibrate(ro, tr, w, V, what);
    ck_assert_msg(replay_gap(ro, tr, V, 7, &gap, seq, len) && gap == 0.0, "%s: replay gap %g", what, gap);
    int same = replay_gap(ro, sq, V, 7, &sgap, seq, len);
    fprintf(stderr, "%s: %s trainer max |dlogp| %g; nvfp4-sym-qat trainer %g (logits %s)\n", what,
            qd_recipe_name(r), gap, sgap, same ? "equal" : "differ");
    ck_assert(!differ || !same);
    /* one update of the trainer through the straight-through backward, then the sync */
    float coef[RB * T], lp[RB * T], gn;
    rng_state = 9;
    for (int i = 0; i < RB * T; i++)
        coef[i] = (float)sym();
    qd_backend_zero_grad(tr);
    forward_ok(tr, seq, len, RB, T, lp, NULL);
    ck_assert_int_eq(qd_backend_backward(tr, coef), QD_OK);
    qd_adamw o = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.0f, .grad_clip = 1.0f};
    ck_assert_int_eq(qd_backend_optimizer_step(tr, &o, 1, &gn), QD_OK);
    ck_assert(gn > 0 && isfinite(gn));
    float *w2 = malloc(sizeof(float) * n);
    ck_assert_int_eq(qd_backend_get_weights(tr, w2, n), QD_OK);
    ck_assert(memcmp(w2, w, sizeof(float) * n) != 0);
    ck_assert_int_eq(qd_backend_set_weights(ro, w2, n), QD_OK);
    if (rac)
        copy_rac(ro, tr);
    ck_assert_msg(replay_gap(ro, tr, V, 8, &gap, seq, len) && gap == 0.0, "%s after an update: gap %g", what, gap);
    free(w2);
    qd_backend_free(ro);
    qd_backend_free(tr);
    qd_backend_free(sq);
}

/* _i = 0: nvfp4-replay, 1: quads-replay */
START_TEST(test_replay_no_gap)
{
    qd_recipe r = _i ? QD_RECIPE_QUADS_REPLAY : QD_RECIPE_NVFP4_REPLAY;
    /* the MoE fixture (a dense layer, then 8 experts top-2), random weights */
    qd_model_config c = tiny_config(0, 1);
    qd_backend *b = make(&c, QD_RECIPE_FP32, QD_ROLE_TRAINER, 0, 0);
    float *w = random_weights(b, 131);
    qd_backend_free(b);
    check_replay(&c, w, r, "MoE fixture", 1);
    free(w);
    /* the shipped tiny model */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", qd_test_path("models/tiny"));
    ck_assert_int_eq(qd_checkpoint_read_config(dir, &c), QD_OK);
    b = make(&c, QD_RECIPE_FP32, QD_ROLE_TRAINER, 0, 0);
    int np;
    const qd_param_info *pi = qd_backend_params(b, &np);
    w = malloc(sizeof(float) * qd_backend_num_floats(b));
    ck_assert_msg(qd_checkpoint_load(dir, pi, np, w) == QD_OK, "%s", qd_last_error());
    qd_backend_free(b);
    check_replay(&c, w, r, "models/tiny", 0);
    free(w);
}
END_TEST

/* ---- the ablation recipes and options.quant_layers */

static float *logits_of(const qd_model_config *c, qd_recipe r, qd_role role, uint64_t layers, const float *w,
                        const int32_t *tok)
{
    qd_backend_options o = {.recipe = r, .role = role, .quant_layers = layers};
    qd_backend *b = qd_backend_cpu_init(c, &o);
    ck_assert_msg(b != NULL, "init: %s", qd_last_error());
    ck_assert_int_eq(qd_backend_set_weights(b, w, qd_backend_num_floats(b)), QD_OK);
    float logp[TB * TT], *logits = malloc(sizeof(float) * TB * TT * 64);
    forward_ok(b, tok, tlen, TB, TT, logp, logits);
    qd_backend_free(b);
    return logits;
}

static int same_logits(const float *a, const float *b) { return memcmp(a, b, sizeof(float) * TB * TT * 64) == 0; }

/* Weights whose quantized linears are exact both in NVFP4 and in BF16: each
 * tensor scaled to amax 2688 / 4096 (so S_enc = 4096 and S_dec = 2^-12
 * exactly), then fake-quantized on the host (quant/): every value is an E2M1
 * value times an E4M3 scale times 2^-12, at most 6 significant bits. */
static float *representable_weights(qd_backend *b, uint64_t seed)
{
    int np;
    const qd_param_info *p = qd_backend_params(b, &np);
    float *w = random_weights(b, seed);
    for (int i = 0; i < np; i++) {
        if (!strstr(p[i].name, "_proj."))
            continue;
        float *t = w + p[i].offset, amax = 0;
        size_t n = (size_t)(p[i].rows * p[i].cols), at = 0;
        for (size_t k = 0; k < n; k++)
            if (fabsf(t[k]) > amax)
                amax = fabsf(t[k]), at = k;
        for (size_t k = 0; k < n; k++)
            t[k] = k == at ? copysignf(0.65625f, t[k]) : t[k] * (0.65625f / amax) * 0.999f;
        ck_assert_int_eq(qd_nvfp4_fake_quant(t, t, p[i].rows, p[i].cols, QD_SCALE_PER_TENSOR), QD_OK);
    }
    return w;
}

/* nvfp4-w16a4 quantizes only the activations and nvfp4-w4a16 only the
 * weights: on weights exact in NVFP4 and BF16, w4a16 is bf16 bit for bit and
 * w16a4 is sym-QAT (both quantized) bit for bit, while on random weights each
 * differs from both; quant_layers picks the layers, every bit set being the
 * whole recipe and a bit past the last layer an error. */
START_TEST(test_ablation_recipes)
{
    qd_model_config c = tiny_config(0, 1);
    qd_backend *b = make(&c, QD_RECIPE_FP32, QD_ROLE_TRAINER, 0, 0);
    float *we = representable_weights(b, 141), *w = random_weights(b, 142);
    qd_backend_free(b);
    int32_t tok[TB * TT];
    tiny_batch(tok, 143);
    const qd_role RO = QD_ROLE_ROLLOUT, TR = QD_ROLE_TRAINER;
    float *bf = logits_of(&c, QD_RECIPE_BF16, RO, 0, we, tok), *sq = logits_of(&c, QD_RECIPE_NVFP4_SYM_QAT, TR, 0, we, tok);
    float *a4 = logits_of(&c, QD_RECIPE_NVFP4_W16A4, RO, 0, we, tok), *w4 = logits_of(&c, QD_RECIPE_NVFP4_W4A16, RO, 0, we, tok);
    ck_assert(same_logits(w4, bf) && same_logits(a4, sq) && !same_logits(a4, bf));
    free(bf), free(sq), free(a4), free(w4);
    bf = logits_of(&c, QD_RECIPE_BF16, RO, 0, w, tok);
    sq = logits_of(&c, QD_RECIPE_NVFP4_SYM_QAT, TR, 0, w, tok);
    a4 = logits_of(&c, QD_RECIPE_NVFP4_W16A4, RO, 0, w, tok);
    w4 = logits_of(&c, QD_RECIPE_NVFP4_W4A16, RO, 0, w, tok);
    ck_assert(!same_logits(w4, bf) && !same_logits(a4, bf) && !same_logits(a4, sq) && !same_logits(w4, sq));
    /* layers: both bits = every layer; one bit = between BF16 and the whole recipe */
    float *nv = logits_of(&c, QD_RECIPE_NVFP4, RO, 0, w, tok), *nv3 = logits_of(&c, QD_RECIPE_NVFP4, RO, 3, w, tok);
    float *nv1 = logits_of(&c, QD_RECIPE_NVFP4, RO, 1, w, tok), *nv2 = logits_of(&c, QD_RECIPE_NVFP4, RO, 2, w, tok);
    ck_assert(same_logits(nv, nv3));
    double e1 = logit_err(nv1, bf), e2 = logit_err(nv2, bf), e = logit_err(nv, bf);
    fprintf(stderr, "nvfp4 rollout vs bf16: logit relative RMS %.3e (layer 0 only %.3e, layer 1 only %.3e)\n", e,
            e1, e2);
    ck_assert(e1 > 0 && e2 > 0 && e1 < e && e2 < e && !same_logits(nv1, nv2));
    float *a41 = logits_of(&c, QD_RECIPE_NVFP4_W16A4, RO, 1, w, tok);
    ck_assert(logit_err(a41, bf) > 0 && logit_err(a41, bf) < logit_err(a4, bf));
    free(bf), free(sq), free(a4), free(w4), free(nv), free(nv1), free(nv2), free(nv3), free(a41);
    qd_backend_options o = {.recipe = QD_RECIPE_NVFP4, .quant_layers = 4};
    ck_assert_ptr_null(qd_backend_cpu_init(&c, &o));
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "quant_layers"));
    free(we);
    free(w);
}
END_TEST

/* ---- AdamW against the formula in double */

START_TEST(test_adamw)
{
    qd_model_config c = tiny_config(0, 1);
    qd_backend *b = make(&c, QD_RECIPE_FP32, QD_ROLE_TRAINER, 0, 0);
    size_t n = qd_backend_num_floats(b);
    float *w = random_weights(b, 51), *g = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    double *m = calloc(n, sizeof(double)), *v = calloc(n, sizeof(double)), *p = malloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++)
        p[i] = w[i];
    ck_assert_int_eq(qd_backend_set_weights(b, w, n), QD_OK);
    int32_t tok[TB * TT];
    float coef[TB * TT], logp[TB * TT];
    tiny_batch(tok, 52);
    random_coef(coef, 53);
    qd_adamw o = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 0.5f};
    int np;
    const qd_param_info *pi = qd_backend_params(b, &np);
    for (int step = 1; step <= 2; step++) {
        qd_backend_zero_grad(b);
        forward_ok(b, tok, tlen, TB, TT, logp, NULL);
        ck_assert_int_eq(qd_backend_backward(b, coef), QD_OK);
        ck_assert_int_eq(qd_backend_get_grads(b, g, n), QD_OK);
        double norm = 0;
        for (size_t i = 0; i < n; i++)
            norm += (double)g[i] * g[i];
        norm = sqrt(norm);
        ck_assert(norm > 0.5);  /* so that clipping is exercised */
        float reported;
        ck_assert_int_eq(qd_backend_optimizer_step(b, &o, step, &reported), QD_OK);
        ck_assert(fabs(reported - norm) < 1e-5 * norm);
        double sc = 0.5 / norm;
        for (int t = 0; t < np; t++) {
            double wd = pi[t].rows > 1 ? 0.1 : 0.0;
            for (size_t i = pi[t].offset; i < pi[t].offset + (size_t)(pi[t].rows * pi[t].cols); i++) {
                double gi = g[i] * sc;
                m[i] = 0.9 * m[i] + 0.1 * gi;
                v[i] = 0.95 * v[i] + 0.05 * gi * gi;
                double mh = m[i] / (1 - pow(0.9, step)), vh = v[i] / (1 - pow(0.95, step));
                p[i] -= 1e-2 * (mh / (sqrt(vh) + 1e-8) + wd * p[i]);
            }
        }
        ck_assert_int_eq(qd_backend_get_weights(b, got, n), QD_OK);
        double worst = 0;
        for (size_t i = 0; i < n; i++)
            worst = fmax(worst, fabs(got[i] - p[i]));
        ck_assert_msg(worst < 2e-6, "step %d: max |w - w_ref| = %g", step, worst);
    }
    free(w);
    free(g);
    free(got);
    free(m);
    free(v);
    free(p);
    qd_backend_free(b);
}
END_TEST

/* set_grads (data parallel): writing back the gradients a backward produced
 * leaves the optimizer step unchanged bit for bit; doubled gradients change
 * it; a NaN is refused naming its index and leaves the buffer as it was; an
 * infinite AdamW moment is refused by set_adam. */
START_TEST(test_set_grads)
{
    qd_model_config c = tiny_config(0, 1);
    qd_backend *b[2] = {make(&c, QD_RECIPE_BF16, QD_ROLE_TRAINER, 0, 0), make(&c, QD_RECIPE_BF16, QD_ROLE_TRAINER, 0, 0)};
    size_t n = qd_backend_num_floats(b[0]);
    float *w = random_weights(b[0], 61), *g = malloc(sizeof(float) * n), *w2 = malloc(sizeof(float) * 2 * n);
    int32_t tok[TB * TT];
    float coef[TB * TT], logp[TB * TT], norm[2];
    tiny_batch(tok, 62);
    random_coef(coef, 63);
    qd_adamw o = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 0.0f};
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(qd_backend_set_weights(b[k], w, n), QD_OK);
        qd_backend_zero_grad(b[k]);
        forward_ok(b[k], tok, tlen, TB, TT, logp, NULL);
        ck_assert_int_eq(qd_backend_backward(b[k], coef), QD_OK);
    }
    ck_assert_int_eq(qd_backend_get_grads(b[1], g, n), QD_OK);
    float keep = g[5];
    g[5] = NAN;
    ck_assert_int_eq(qd_backend_set_grads(b[1], g, n), QD_ERR_NONFINITE);
    ck_assert(strstr(qd_last_error(), "gradient 5") != NULL);
    g[5] = keep;
    ck_assert_int_eq(qd_backend_set_grads(b[1], g, n), QD_OK);
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(qd_backend_optimizer_step(b[k], &o, 1, &norm[k]), QD_OK);
        ck_assert_int_eq(qd_backend_get_weights(b[k], w2 + k * n, n), QD_OK);
    }
    ck_assert(memcmp(w2, w2 + n, sizeof(float) * n) == 0 && norm[0] == norm[1]);
    for (size_t i = 0; i < n; i++)
        g[i] *= 2.0f;
    ck_assert_int_eq(qd_backend_set_grads(b[1], g, n), QD_OK);
    ck_assert_int_eq(qd_backend_optimizer_step(b[1], &o, 2, &norm[1]), QD_OK);
    ck_assert(fabsf(norm[1] - 2.0f * norm[0]) <= 1e-6f * norm[1]);
    float *mv = calloc(2 * n, sizeof(float));  /* a non-finite AdamW moment is refused too */
    mv[n + 3] = INFINITY;
    ck_assert_int_eq(qd_backend_set_adam(b[1], mv, mv + n, n), QD_ERR_NONFINITE);
    ck_assert(strstr(qd_last_error(), "set_adam") != NULL);
    free(mv);
    free(w);
    free(g);
    free(w2);
    qd_backend_free(b[0]);
    qd_backend_free(b[1]);
}
END_TEST

/* qd_moe_group (shared by both backends): rows grouped by expert, ascending
 * expert, tokens ascending within an expert, against a reference written here
 * from the definition; and the dense case (every token to expert 0, weight 1). */
START_TEST(test_moe_group)
{
    enum { N = 37, E = 8, K = 3 };
    int32_t topk[N * K], exp_off[E + 1], row_tok[N * K], row_rank[N * K], tok_rows[N * K], cnt[E];
    float topw[N * K], row_w[N * K];
    rng_state = 71;
    for (int n = 0; n < N; n++)
        for (int j = 0; j < K; j++) {
            int e, dup;
            do {  /* K distinct experts in random rank order */
                e = (int)(urand() * E);
                dup = 0;
                for (int i = 0; i < j; i++)
                    dup |= topk[n * K + i] == e;
            } while (dup);
            topk[n * K + j] = e;
            topw[n * K + j] = (float)urand();
        }
    qd_moe_group(exp_off, row_tok, row_w, row_rank, tok_rows, cnt, topk, topw, N, E, K);
    int r = 0;
    for (int e = 0; e < E; e++) {
        ck_assert_int_eq(exp_off[e], r);
        for (int n = 0; n < N; n++)
            for (int j = 0; j < K; j++)
                if (topk[n * K + j] == e) {
                    ck_assert_int_eq(row_tok[r], n);
                    ck_assert_int_eq(row_rank[r], j);
                    ck_assert(row_w[r] == topw[n * K + j]);
                    r++;
                }
    }
    ck_assert_int_eq(exp_off[E], N * K);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < K; j++) {
            int rr = tok_rows[n * K + j];
            ck_assert_int_eq(row_tok[rr], n);
            if (j)  /* a token's rows in ascending expert order */
                ck_assert_int_lt(topk[n * K + row_rank[tok_rows[n * K + j - 1]]], topk[n * K + row_rank[rr]]);
        }
    qd_moe_group(exp_off, row_tok, row_w, row_rank, tok_rows, cnt, NULL, NULL, N, 1, 1);
    ck_assert_int_eq(exp_off[0], 0);
    ck_assert_int_eq(exp_off[1], N);
    for (int n = 0; n < N; n++) {
        ck_assert_int_eq(row_tok[n], n);
        ck_assert_int_eq(tok_rows[n], n);
        ck_assert_int_eq(row_rank[n], 0);
        ck_assert(row_w[n] == 1.0f);
    }
}
END_TEST

/* qd_rac_state_errors (data-parallel RAC): after a forward the statistics in
 * the blob are the per-channel sums of every quantized linear (count = the
 * sum of their in-features, some non-zero); writing doubled statistics back
 * and installing the blob is what get_rac_state returns; a wrong size is
 * refused. */
START_TEST(test_rac_state_errors)
{
    qd_model_config c = tiny_config(0, 1);
    qd_backend *b = make(&c, QD_RECIPE_QUADS, QD_ROLE_ROLLOUT, 0.25, 0);
    float *w = random_weights(b, 81);
    ck_assert_int_eq(qd_backend_set_weights(b, w, qd_backend_num_floats(b)), QD_OK);
    int32_t tok[TB * TT];
    float logp[TB * TT];
    tiny_batch(tok, 82);
    qd_batch bt = {.B = TB, .T = TT, .tokens = tok, .lengths = tlen, .temperature = 1.0f, .rac_stats = 1};
    ck_assert_int_eq(qd_backend_forward(b, &bt, logp, NULL), QD_OK);
    size_t rb = qd_backend_rac_state_size(b), ne = 0, want = 0;
    char *blob = malloc(rb), *again = malloc(rb);
    ck_assert_int_eq(qd_backend_get_rac_state(b, blob, rb), QD_OK);
    qd_model_layout m;
    ck_assert_int_eq(qd_model_layout_init(&m, &c), QD_OK);
    for (int i = 0; i < m.nlin; i++)
        want += m.lin[i].quantized ? (size_t)m.lin[i].in : 0;
    qd_model_layout_free(&m);
    ck_assert_int_eq(qd_rac_state_errors(blob, rb, &c, NULL, &ne, QD_RAC_ERRORS_GET), QD_OK);
    ck_assert_uint_eq(ne, want);
    double *e = malloc(sizeof(double) * ne), sum = 0;
    ck_assert_int_eq(qd_rac_state_errors(blob, rb, &c, e, &ne, QD_RAC_ERRORS_GET), QD_OK);
    for (size_t i = 0; i < ne; i++) {
        ck_assert(e[i] >= 0);
        sum += e[i];
        e[i] *= 2;
    }
    ck_assert(sum > 0);
    ck_assert_int_eq(qd_rac_state_errors(blob, rb, &c, e, &ne, QD_RAC_ERRORS_PUT), QD_OK);
    ck_assert_int_eq(qd_backend_set_rac_state(b, blob, rb), QD_OK);
    ck_assert_int_eq(qd_backend_get_rac_state(b, again, rb), QD_OK);
    ck_assert(memcmp(blob, again, rb) == 0);
    ck_assert_int_eq(qd_rac_state_errors(blob, rb - 8, &c, NULL, &ne, QD_RAC_ERRORS_GET), QD_ERR_FORMAT);
    free(blob), free(again), free(e), free(w);
    qd_backend_free(b);
}
END_TEST

/* RAC statistics are gathered only by calls that ask (rac_stats = 1), and the
 * named slots read and write them alone: the channel sets stay, a bad value
 * or count is refused. */
START_TEST(test_rac_stats_explicit)
{
    qd_model_config c = tiny_config(0, 1);
    qd_backend *b = make(&c, QD_RECIPE_QUADS, QD_ROLE_ROLLOUT, 0.25, 0);
    float *w = random_weights(b, 83);
    ck_assert_int_eq(qd_backend_set_weights(b, w, qd_backend_num_floats(b)), QD_OK);
    size_t n = qd_backend_rac_stats_count(b), rb = qd_backend_rac_state_size(b);
    ck_assert_uint_gt(n, 0);
    double *a = malloc(sizeof(double) * n), *z = calloc(n, sizeof(double));
    char *blob = malloc(rb), *blob2 = malloc(rb);
    int32_t tok[TB * TT], gt[2 * 4], gl[2];
    float logp[TB * TT], glp[2 * 4];
    tiny_batch(tok, 84);
    qd_batch bt = {.B = TB, .T = TT, .tokens = tok, .lengths = tlen, .temperature = 1.0f};
    forward_ok(b, tok, tlen, TB, TT, logp, NULL);  /* asks nothing: statistics stay zero */
    ck_assert_int_eq(qd_backend_get_rac_stats(b, a, n), QD_OK);
    ck_assert_mem_eq(a, z, sizeof(double) * n);
    uint64_t sid[2] = {1, 2};
    qd_generate_request rq = {.B = 2, .Tp = TT, .prompt = tok, .prompt_len = tlen, .seq_id = sid, .seed = 1,
                              .max_new_tokens = 4, .temperature = 1.0f, .top_p = 1.0f};
    qd_generate_result res = {.tokens = gt, .logp = glp, .lengths = gl};
    ck_assert_int_eq(qd_backend_generate(b, &rq, &res), QD_OK);
    ck_assert_int_eq(qd_backend_get_rac_stats(b, a, n), QD_OK);
    ck_assert_mem_eq(a, z, sizeof(double) * n);
    rq.rac_stats = 1;  /* a rollout: gathers */
    ck_assert_int_eq(qd_backend_generate(b, &rq, &res), QD_OK);
    ck_assert_int_eq(qd_backend_get_rac_stats(b, a, n), QD_OK);
    double s1 = 0;
    for (size_t i = 0; i < n; i++)
        s1 += a[i];
    ck_assert(s1 > 0);
    bt.rac_stats = 1;  /* a forward that asks adds to them */
    ck_assert_int_eq(qd_backend_forward(b, &bt, logp, NULL), QD_OK);
    ck_assert_int_eq(qd_backend_get_rac_stats(b, a, n), QD_OK);
    double s2 = 0;
    for (size_t i = 0; i < n; i++)
        s2 += a[i];
    ck_assert(s2 > s1);
    /* set_rac_stats: only the statistics change (the blob's channel sets stay) */
    ck_assert_int_eq(qd_backend_get_rac_state(b, blob, rb), QD_OK);
    for (size_t i = 0; i < n; i++)
        a[i] = (double)i;
    ck_assert_int_eq(qd_backend_set_rac_stats(b, a, n), QD_OK);
    ck_assert_int_eq(qd_backend_get_rac_stats(b, z, n), QD_OK);
    ck_assert_mem_eq(a, z, sizeof(double) * n);
    ck_assert_int_eq(qd_backend_get_rac_state(b, blob2, rb), QD_OK);
    size_t ne = n;
    /* the old blob with the new stats */
    ck_assert_int_eq(qd_rac_state_errors(blob, rb, &c, a, &ne, QD_RAC_ERRORS_PUT), QD_OK);
    ck_assert_mem_eq(blob, blob2, rb);
    a[3] = NAN;
    ck_assert_int_eq(qd_backend_set_rac_stats(b, a, n), QD_ERR_NONFINITE);
    a[3] = -1;
    ck_assert_int_eq(qd_backend_set_rac_stats(b, a, n), QD_ERR_ARG);
    ck_assert(strstr(qd_last_error(), "statistic 3") != NULL);
    ck_assert_int_eq(qd_backend_set_rac_stats(b, a, n - 1), QD_ERR_SHAPE);
    ck_assert_int_eq(qd_backend_get_rac_stats(b, a, n), QD_OK);  /* nothing changed by the refusals */
    ck_assert_mem_eq(a, z, sizeof(double) * n);
    free(a), free(z), free(blob), free(blob2), free(w);
    qd_backend_free(b);
}
END_TEST

/* ---- diagnostics */

static qd_backend *make_diag(qd_recipe r, qd_role role, const float *w)
{
    qd_model_config c = tiny_config(0, 1);
    qd_backend_options o = {.recipe = r, .role = role, .diagnostics = 1};
    qd_backend *b = qd_backend_cpu_init(&c, &o);
    ck_assert_int_eq(qd_backend_set_weights(b, w, qd_backend_num_floats(b)), QD_OK);
    return b;
}

START_TEST(test_diagnostics)
{
    qd_model_config c = tiny_config(0, 1);
    qd_backend *ref = make(&c, QD_RECIPE_FP32, QD_ROLE_TRAINER, 0, 0);
    float *w = random_weights(ref, 71), logp[TB * TT];
    int32_t tok[TB * TT];
    tiny_batch(tok, 72);
    qd_diagnostics d[2];
    ck_assert_int_eq(qd_backend_diagnostics(ref, &d[0]), QD_ERR_ARG); /* not enabled */
    qd_backend *b[2] = {make_diag(QD_RECIPE_QUADS, QD_ROLE_ROLLOUT, w),
                        make_diag(QD_RECIPE_QUADS, QD_ROLE_TRAINER, w)};
    for (int k = 0; k < 2; k++) {
        forward_ok(b[k], tok, tlen, TB, TT, logp, NULL);
        ck_assert_int_eq(qd_backend_diagnostics(b[k], &d[k]), QD_OK);
        /* q, k, v, o of 2 layers, dense gate/up/down, 8 experts x 3 */
        ck_assert_int_eq(d[k].num_linear, 8 + 3 + 24);
        ck_assert_str_eq(d[k].names[0], "model.layers.0.self_attn.q_proj.weight");
        ck_assert_int_eq(d[k].num_tokens, 17);
        ck_assert(d[k].num_moe_layers == 1 && d[k].top_k == 2);
        for (int i = 0; i < d[k].num_linear; i++) {
            ck_assert(d[k].weight_err[i] > 0 && d[k].weight_err[i] < 0.05);
            ck_assert(d[k].act_norm[i] >= 0 && d[k].act_err[i] <= 0.05 * d[k].act_norm[i]);
        }
        ck_assert(d[k].act_err[0] > 1e-4 * d[k].act_norm[0]);
        /* linears of one input have its sums (q, k, v; each expert's gate and up) */
        for (int i = 0; i < d[k].num_linear; i++) {
            const char *nm = d[k].names[i], *at = strstr(nm, "q_proj");
            const char *other[2] = {"k_proj", "v_proj"};
            int n = 2;
            if (!at && (at = strstr(nm, "gate_proj")))
                other[0] = "up_proj", n = 1;
            for (int j = 0; at && j < n; j++) {
                char want[128];
                snprintf(want, sizeof want, "%.*s%s%s", (int)(at - nm), nm, other[j],
                         at + (other[0][0] == 'u' ? 9 : 6));
                int found = 0;
                for (int t = 0; t < d[k].num_linear; t++)
                    if (!strcmp(d[k].names[t], want)) {
                        ck_assert_msg(d[k].act_err[t] == d[k].act_err[i] && d[k].act_norm[t] == d[k].act_norm[i],
                                      "%s vs %s", want, nm);
                        found = 1;
                    }
                ck_assert_msg(found, "%s not found", want);
            }
        }
        for (int n = 0; n < 17; n++) {
            const int32_t *t = d[k].router_topk + n * 2;
            ck_assert(t[0] >= 0 && t[0] < 8 && t[1] >= 0 && t[1] < 8 && t[0] != t[1]);
        }
    }
    /* same weight error on both sides (one quantize function), same first-layer input */
    ck_assert(memcmp(d[0].weight_err, d[1].weight_err, sizeof(double) * 35) == 0);
    ck_assert(d[0].act_err[0] == d[1].act_err[0]);
    int agree = 0;
    for (int n = 0; n < 17 * 2; n++)
        agree += d[0].router_topk[n] == d[1].router_topk[n];
    fprintf(stderr, "diagnostics: rollout/trainer router top-k agreement %d/34, q_proj.0 act err %.3e, "
            "weight err %.3e\n", agree, d[0].act_err[0] / d[0].act_norm[0], d[0].weight_err[0]);
    ck_assert(agree >= 17);
    /* after a generate: errors summed over its steps (more tokens than one forward) */
    int32_t gt[GB * 4], gl[GB];
    float glp[GB * 4];
    int32_t prompt[GB * GP] = {0};
    qd_generate_request rq = {.B = GB, .Tp = GP, .prompt = prompt, .prompt_len = gplen, .seq_id = gsid, .seed = 3,
                              .max_new_tokens = 4, .temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .stop = NULL,
                              .num_stop = 0};
    qd_generate_result res = {.tokens = gt, .logp = glp, .lengths = gl};
    ck_assert_int_eq(qd_backend_generate(b[0], &rq, &res), QD_OK);
    qd_diagnostics dg;
    ck_assert_int_eq(qd_backend_diagnostics(b[0], &dg), QD_OK);
    ck_assert(dg.num_tokens == GB && dg.act_norm[0] > 0 && dg.act_err[0] > 0);
    /* a generate with no_diagnostics: the same tokens and log-probs, nothing
     * measured (no diagnostics until the next forward) */
    int32_t gt2[GB * 4], gl2[GB];
    float glp2[GB * 4];
    qd_generate_request rq2 = rq;
    rq2.no_diagnostics = 1;
    qd_generate_result res2 = {.tokens = gt2, .logp = glp2, .lengths = gl2};
    ck_assert_int_eq(qd_backend_generate(b[0], &rq2, &res2), QD_OK);
    ck_assert(memcmp(gl, gl2, sizeof gl) == 0);
    for (int i = 0; i < GB; i++) {
        ck_assert(memcmp(gt + i * 4, gt2 + i * 4, sizeof(int32_t) * gl[i]) == 0);
        ck_assert(memcmp(glp + i * 4, glp2 + i * 4, sizeof(float) * gl[i]) == 0);
    }
    ck_assert_int_eq(qd_backend_diagnostics(b[0], &dg), QD_ERR_ARG);
    forward_ok(b[0], tok, tlen, TB, TT, logp, NULL);
    ck_assert_int_eq(qd_backend_diagnostics(b[0], &dg), QD_OK);
    ck_assert(dg.num_tokens == 17 && dg.act_err[0] == d[0].act_err[0]); /* the first forward's sums again */
    for (int k = 0; k < 2; k++)
        qd_backend_free(b[k]);
    qd_backend_free(ref);
    free(w);
}
END_TEST

/* Diagnostics' sums on the device (the ops' diag_add) against the host's
 * (an ops table without it): the same bits after forwards, a generate whose
 * decode keeps its expert offsets on the device (only diag_add reads them
 * there), and two syncs (each sync's weight error from zero); and with a
 * grouped fake-quant at the sync (CUDA's nvfp4_fake_quant_weights, here the
 * CPU's op a tensor), whose fake-quant working weights the weight error
 * then reads instead of making its own. */
static qd_ops hostdiag_ops, fqgroup_ops;

static qd_status fq_weights_loop(void *dev, float *const *out, const float *const *x, int count, int N, int K)
{
    for (int i = 0; i < count; i++)
        QD_TRY(qd_cpu_ops()->nvfp4_fake_quant(dev, out[i], x[i], N, K, QD_SCALE_PER_TENSOR));
    return QD_OK;
}

static void diag_equal(qd_backend *const *b, const char *what)
{
    qd_diagnostics d[2];
    for (int k = 0; k < 2; k++)
        ck_assert_msg(qd_backend_diagnostics(b[k], &d[k]) == QD_OK, "%s: %s", what, qd_last_error());
    ck_assert_int_eq(d[0].num_linear, d[1].num_linear);
    ck_assert_int_eq(d[0].num_tokens, d[1].num_tokens);
    size_t nl = (size_t)d[0].num_linear;
    ck_assert_msg(!memcmp(d[0].act_err, d[1].act_err, sizeof(double) * nl), "%s: act_err", what);
    ck_assert_msg(!memcmp(d[0].act_norm, d[1].act_norm, sizeof(double) * nl), "%s: act_norm", what);
    ck_assert_msg(!memcmp(d[0].weight_err, d[1].weight_err, sizeof(double) * nl), "%s: weight_err", what);
    ck_assert_msg(!memcmp(d[0].router_topk, d[1].router_topk,
                          sizeof(int32_t) * (size_t)d[0].num_moe_layers * d[0].num_tokens * d[0].top_k),
                  "%s: router top-k", what);
    int wm = 0, am = 0; /* every weight measured; an expert no token chose has no activation error */
    for (size_t i = 0; i < nl; i++)
        wm += d[0].weight_err[i] > 0, am += d[0].act_err[i] > 0;
    ck_assert_msg(wm == (int)nl && 2 * am > (int)nl, "%s: %d / %d of %zu linears measured", what, wm, am, nl);
}

START_TEST(test_diag_dev)
{
    qd_model_config c = tiny_config(0, 1);
    hostdiag_ops = *qd_cpu_ops();
    hostdiag_ops.diag_add = NULL;
    fqgroup_ops = *qd_cpu_ops();
    fqgroup_ops.nvfp4_fake_quant_weights = fq_weights_loop;
    const qd_recipe rs[] = {QD_RECIPE_NVFP4, QD_RECIPE_QUADS, QD_RECIPE_QUADS, QD_RECIPE_QUADS_REPLAY};
    const qd_role ro[] = {QD_ROLE_ROLLOUT, QD_ROLE_ROLLOUT, QD_ROLE_TRAINER, QD_ROLE_TRAINER};
    int32_t tok[TB * TT];
    tiny_batch(tok, 81);
    qd_model_moe_dev_off = 1;
    for (int i = 0; i < 4; i++) {
        qd_backend *b[3];
        float *w[2] = {NULL, NULL};
        for (int k = 0; k < 3; k++) {
            qd_backend_options o = {.recipe = rs[i], .role = ro[i], .rac_ratio = 0.25, .num_threads = 1,
                                    .diagnostics = 1};
            b[k] = k ? qd_model_backend_new(&c, &o, k == 1 ? &hostdiag_ops : &fqgroup_ops, qd_cpu_dev_new(1), free)
                     : qd_backend_cpu_init(&c, &o);
            ck_assert_msg(b[k] != NULL, "init: %s", qd_last_error());
        }
        size_t n = qd_backend_num_floats(b[0]);
        w[0] = random_weights(b[0], 82 + i);
        w[1] = random_weights(b[0], 92 + i);
        char what[64];
        for (int s = 0; s < 2; s++) {
            float lp[3][TB * TT];
            for (int k = 0; k < 3; k++) {
                ck_assert_int_eq(qd_backend_set_weights(b[k], w[s], n), QD_OK);
                forward_ok(b[k], tok, tlen, TB, TT, lp[k], NULL);
            }
            ck_assert(!memcmp(lp[0], lp[2], sizeof lp[0]));
            snprintf(what, sizeof what, "%s %s, sync %d, forward", qd_recipe_name(rs[i]),
                     ro[i] == QD_ROLE_TRAINER ? "trainer" : "rollout", s);
            diag_equal(b, what);
            qd_backend *bg[2] = {b[0], b[2]};
            diag_equal(bg, what);
            int32_t gt[2][GB * GM], gl[2][GB], prompt[GB * GP];
            float glp[2][GB * GM];
            for (int j = 0; j < GB * GP; j++)
                prompt[j] = (j * 7 + 3) % 40;
            for (int k = 0; k < 2; k++) {
                qd_generate_request rq = {.B = GB, .Tp = GP, .prompt = prompt, .prompt_len = gplen, .seq_id = gsid,
                                          .seed = 3, .max_new_tokens = GM, .temperature = 1.0f, .top_p = 1.0f};
                qd_generate_result res = {.tokens = gt[k], .logp = glp[k], .lengths = gl[k]};
                ck_assert_msg(qd_backend_generate(b[k], &rq, &res) == QD_OK, "generate: %s", qd_last_error());
            }
            ck_assert(!memcmp(gt[0], gt[1], sizeof gt[0]) && !memcmp(glp[0], glp[1], sizeof glp[0]));
            snprintf(what, sizeof what, "%s %s, sync %d, generate", qd_recipe_name(rs[i]),
                     ro[i] == QD_ROLE_TRAINER ? "trainer" : "rollout", s);
            diag_equal(b, what);
        }
        if (ro[i] == QD_ROLE_ROLLOUT) { /* a sync from a trainer's master on the device: the
                                         * weight errors a shape at a time from the codes */
            qd_backend *t = make_loaded(&c, rs[i], QD_ROLE_TRAINER, 0.25, 1, w[0]);
            float lp[2][TB * TT];
            for (int k = 0; k < 2; k++) {
                int direct = -1;
                ck_assert_msg(qd_backend_sync_from(b[k], t, &direct) == QD_OK, "sync: %s", qd_last_error());
                ck_assert_int_eq(direct, k == 0); /* the other ops table: through the host */
                forward_ok(b[k], tok, tlen, TB, TT, lp[k], NULL);
            }
            ck_assert(!memcmp(lp[0], lp[1], sizeof lp[0]));
            snprintf(what, sizeof what, "%s rollout, synced from a trainer", qd_recipe_name(rs[i]));
            diag_equal(b, what);
            qd_backend_free(t);
        }
        for (int k = 0; k < 3; k++)
            qd_backend_free(b[k]);
        free(w[0]);
        free(w[1]);
    }
}
END_TEST

/* ---- options.recompute: the backward recomputes each layer from its input */

static qd_backend *make_recompute(const qd_model_config *c, qd_recipe r, int recompute, const float *w)
{
    qd_backend_options o = {.recipe = r, .role = QD_ROLE_TRAINER, .diagnostics = 1, .recompute = recompute,
                            .workload = {.fwd_B = TB, .fwd_T = TT, .train = 1}};
    qd_backend *b = qd_backend_cpu_init(c, &o);
    ck_assert_msg(b != NULL, "init: %s", qd_last_error());
    ck_assert_int_eq(qd_backend_set_weights(b, w, qd_backend_num_floats(b)), QD_OK);
    return b;
}

/* The same log-probs, gradients, diagnostics (counted once: the recomputed
 * layers measure nothing) and weights after a step, with and without; a
 * smaller plan for the activations; three layers (dense, MoE, MoE) so that
 * layers share the recomputed set and the widest shapes it. */
START_TEST(test_recompute)
{
    qd_model_config c = tiny_config(0, 1);
    c.num_hidden_layers = 3;
    const qd_recipe rs[3] = {QD_RECIPE_BF16, QD_RECIPE_QUADS, QD_RECIPE_NVFP4_REPLAY};
    int32_t tok[TB * TT];
    tiny_batch(tok, 91);
    for (int ri = 0; ri < 3; ri++) {
        qd_backend *b[2];
        float *w = NULL;
        size_t n = 0;
        float lp[2][TB * TT], dlp[TB * TT], gn[2];
        float *g[2], *wt[2];
        qd_diagnostics d[2];
        qd_memory m[2];
        for (int k = 0; k < 2; k++) {
            if (!w) {
                qd_backend *t = make(&c, rs[ri], QD_ROLE_TRAINER, 0, 0);
                w = random_weights(t, 92 + ri);
                n = qd_backend_num_floats(t);
                qd_backend_free(t);
            }
            b[k] = make_recompute(&c, rs[ri], k, w);
            forward_ok(b[k], tok, tlen, TB, TT, lp[k], NULL);
            for (int i = 0; i < TB * TT; i++)
                dlp[i] = (float)((i % 7) - 3) * 0.25f;
            ck_assert_int_eq(qd_backend_backward(b[k], dlp), QD_OK);
            ck_assert_int_eq(qd_backend_diagnostics(b[k], &d[k]), QD_OK); /* after the backward's recompute */
            g[k] = malloc(sizeof(float) * n);
            wt[k] = malloc(sizeof(float) * n);
            ck_assert_int_eq(qd_backend_get_grads(b[k], g[k], n), QD_OK);
            qd_adamw o = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                          .grad_clip = 1.0f};
            ck_assert_int_eq(qd_backend_optimizer_step(b[k], &o, 1, &gn[k]), QD_OK);
            ck_assert_int_eq(qd_backend_get_weights(b[k], wt[k], n), QD_OK);
            ck_assert_int_eq(qd_backend_memory(b[k], &m[k]), QD_OK);
        }
        ck_assert_mem_eq(lp[0], lp[1], sizeof lp[0]);
        ck_assert_mem_eq(g[0], g[1], sizeof(float) * n);
        ck_assert(gn[0] == gn[1] && gn[0] > 0);
        ck_assert_mem_eq(wt[0], wt[1], sizeof(float) * n);
        ck_assert_int_eq(d[0].num_linear, d[1].num_linear);
        ck_assert_mem_eq(d[0].act_err, d[1].act_err, sizeof(double) * d[0].num_linear);
        ck_assert_mem_eq(d[0].act_norm, d[1].act_norm, sizeof(double) * d[0].num_linear);
        ck_assert_mem_eq(d[0].router_topk, d[1].router_topk, sizeof(int32_t) * d[0].num_moe_layers * 17 * 2);
        /* one set for the three layers, each layer's input and choices besides */
        ck_assert(m[1].plan.bytes[QD_MEM_ACTS] < m[0].plan.bytes[QD_MEM_ACTS]);
        ck_assert(m[1].peak.bytes[QD_MEM_ACTS] <= m[1].plan.bytes[QD_MEM_ACTS]);
        fprintf(stderr, "recompute (%s): activations %zu -> %zu bytes\n", qd_recipe_name(rs[ri]),
                m[0].plan.bytes[QD_MEM_ACTS], m[1].plan.bytes[QD_MEM_ACTS]);
        for (int k = 0; k < 2; k++) {
            free(g[k]);
            free(wt[k]);
            qd_backend_free(b[k]);
        }
        free(w);
    }
}
END_TEST

/* A head_backward that does not fuse (as the CUDA exact mode's): the lazy
 * zero_grad leaves the lm_head's gradient to it, and the driver must zero it
 * before its own two ops add to it. */
static qd_ops nofuse_ops;

static qd_status head_nofuse(void *dev, float *dinp, float *dw, const float *dlogp, const float *logits,
                             const float *lse, const int32_t *tgt, const float *x, const float *w, int N, int IC, int V,
                             float T, int flags)
{
    (void)dev, (void)dinp, (void)dw, (void)dlogp, (void)logits, (void)lse, (void)tgt, (void)x, (void)w, (void)N;
    (void)IC, (void)V, (void)T, (void)flags;
    return QD_ERR_UNSUPPORTED;
}

/* ---- the lazy zero_grad (QUADS_LAZY_ZERO=1, read at init): zero_grad only
 * marks the gradients; the next backward, get_grads or optimizer step zeroes
 * them (on the CPU all of them: its experts' products never overwrite). Three
 * steps of two micro-batches give the eager instance's gradients, norm and
 * weights, also over ops whose head_backward does not fuse (the lm_head's
 * gradient left to it, then zeroed by the driver); get_grads right after
 * zero_grad reads zeros; set_grads clears the mark (its values stay). */
START_TEST(test_lazy_zero)
{
    qd_model_config c = tiny_config(0, 1);
    int32_t tok[TB * TT];
    tiny_batch(tok, 93);
    qd_backend *b[3];
    float *w = NULL, *g[3], *wt[3], gn[3], lp[TB * TT], dlp[TB * TT];
    size_t n = 0;
    for (int i = 0; i < TB * TT; i++)
        dlp[i] = (float)((i % 5) - 2) * 0.3f;
    nofuse_ops = *qd_cpu_ops();
    nofuse_ops.head_backward = head_nofuse;
    for (int k = 0; k < 3; k++) {
        if (k)
            setenv("QUADS_LAZY_ZERO", "1", 1);
        if (!w) {
            qd_backend *t = make(&c, QD_RECIPE_BF16, QD_ROLE_TRAINER, 0, 0);
            w = random_weights(t, 94);
            n = qd_backend_num_floats(t);
            qd_backend_free(t);
        }
        if (k < 2) {
            b[k] = make_recompute(&c, QD_RECIPE_BF16, 0, w);
        } else {
            qd_backend_options o = {.recipe = QD_RECIPE_BF16, .role = QD_ROLE_TRAINER, .num_threads = 1};
            b[k] = qd_model_backend_new(&c, &o, &nofuse_ops, qd_cpu_dev_new(1), free);
            ck_assert_msg(b[k] != NULL, "init: %s", qd_last_error());
            ck_assert_int_eq(qd_backend_set_weights(b[k], w, n), QD_OK);
        }
        unsetenv("QUADS_LAZY_ZERO");
        g[k] = malloc(sizeof(float) * n);
        wt[k] = malloc(sizeof(float) * n);
        for (int step = 1; step <= 3; step++) {
            qd_backend_zero_grad(b[k]);
            if (step == 3) { /* the last step's gradients are still there: zeros read (at step 2 the
                              * backward zeroes them itself) */
                ck_assert_int_eq(qd_backend_get_grads(b[k], g[k], n), QD_OK);
                for (size_t i = 0; i < n; i++)
                    ck_assert_msg(g[k][i] == 0.0f, "gradient %zu after zero_grad: %g", i, g[k][i]);
                qd_backend_zero_grad(b[k]);
            }
            for (int mb = 0; mb < 2; mb++) {
                forward_ok(b[k], tok, tlen, TB, TT, lp, NULL);
                ck_assert_int_eq(qd_backend_backward(b[k], dlp), QD_OK);
            }
            qd_adamw o = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                          .grad_clip = 1.0f};
            ck_assert_int_eq(qd_backend_get_grads(b[k], g[k], n), QD_OK);
            ck_assert_int_eq(qd_backend_optimizer_step(b[k], &o, step, &gn[k]), QD_OK);
        }
        ck_assert_int_eq(qd_backend_get_weights(b[k], wt[k], n), QD_OK);
    }
    for (int k = 1; k < 3; k++) {
        ck_assert_mem_eq(g[0], g[k], sizeof(float) * n);
        ck_assert(gn[0] == gn[k] && gn[0] > 0);
        ck_assert_mem_eq(wt[0], wt[k], sizeof(float) * n);
    }
    /* set_grads after zero_grad: its values, not zeros */
    qd_backend_zero_grad(b[1]);
    ck_assert_int_eq(qd_backend_set_grads(b[1], g[0], n), QD_OK);
    ck_assert_int_eq(qd_backend_get_grads(b[1], g[1], n), QD_OK);
    ck_assert_mem_eq(g[0], g[1], sizeof(float) * n);
    for (int k = 0; k < 3; k++) {
        free(g[k]);
        free(wt[k]);
        qd_backend_free(b[k]);
    }
    free(w);
}
END_TEST

/* ---- generation */

/* Generates from rows [first, first + B) of a fixed prompt batch. */
static void generate_rows(qd_backend *b, int first, int B, float temperature, int top_k, float top_p,
                          uint64_t seed, const int32_t *stop, int nstop, int32_t *tok, float *logp,
                          int32_t *len)
{
    int32_t prompt[GB * GP];
    rng_state = 77;
    for (int i = 0; i < GB * GP; i++)
        prompt[i] = (int32_t)(urand() * 64);
    qd_generate_request rq = {.B = B, .Tp = GP, .prompt = prompt + first * GP, .prompt_len = gplen + first,
                              .seq_id = gsid + first, .seed = seed, .max_new_tokens = GM, .temperature = temperature,
                              .top_k = top_k, .top_p = top_p, .stop = stop, .num_stop = nstop};
    qd_generate_result res = {.tokens = tok, .logp = logp, .lengths = len};
    qd_status st = qd_backend_generate(b, &rq, &res);
    ck_assert_msg(st == QD_OK, "generate: %s", qd_last_error());
}

/* The generated tokens' log-probs equal the forward's of the whole sequence
 * (temperature 1), bit for bit; greedy tokens are the forward's argmax. */
static void check_against_forward(qd_backend *b, int row, const int32_t *tok, const float *logp, int n,
                                  int greedy)
{
    int32_t prompt[GB * GP], seq[GP + GM], L = gplen[row] + n;
    float lp[GP + GM], logits[(GP + GM) * 64];
    rng_state = 77;
    for (int i = 0; i < GB * GP; i++)
        prompt[i] = (int32_t)(urand() * 64);
    memcpy(seq, prompt + row * GP, sizeof(int32_t) * gplen[row]);
    memcpy(seq + gplen[row], tok, sizeof(int32_t) * n);
    forward_ok(b, seq, &L, 1, L, lp, logits);
    for (int i = 0; i < n; i++) {
        int t = gplen[row] - 1 + i;
        ck_assert_msg(lp[t] == logp[i], "row %d token %d: logp %g vs forward %g", row, i, logp[i], lp[t]);
        if (greedy)
            for (int j = 0; j < 64; j++)
                ck_assert(logits[t * 64 + j] <= logits[t * 64 + tok[i]]);
    }
}

START_TEST(test_generate)
{
    qd_model_config c = tiny_config(0, 1);
    qd_backend *b = make(&c, QD_RECIPE_FP32, QD_ROLE_ROLLOUT, 0, 0);
    float *w = random_weights(b, 101);
    ck_assert_int_eq(qd_backend_set_weights(b, w, qd_backend_num_floats(b)), QD_OK);
    int32_t tok[GB * GM], len[GB], tok1[GM], len1, gtok[GB * GM], glen[GB];
    float logp[GB * GM], logp1[GM], glogp[GB * GM];
    /* greedy */
    generate_rows(b, 0, GB, 0.0f, 0, 1.0f, 1, NULL, 0, gtok, glogp, glen);
    for (int r = 0; r < GB; r++) {
        ck_assert_int_eq(glen[r], GM);
        check_against_forward(b, r, gtok + r * GM, glogp + r * GM, GM, 1);
    }
    /* sampling: same tokens alone and in the batch; log-probs are the forward's */
    generate_rows(b, 0, GB, 1.0f, 20, 0.9f, 5, NULL, 0, tok, logp, len);
    for (int r = 0; r < GB; r++) {
        generate_rows(b, r, 1, 1.0f, 20, 0.9f, 5, NULL, 0, tok1, logp1, &len1);
        ck_assert(len1 == GM && memcmp(tok1, tok + r * GM, sizeof tok1) == 0);
        ck_assert(memcmp(logp1, logp + r * GM, sizeof logp1) == 0);
        check_against_forward(b, r, tok + r * GM, logp + r * GM, GM, 0);
    }
    ck_assert(memcmp(tok, gtok, sizeof tok) != 0);   /* sampling is not greedy here */
    /* top_k = 1 is greedy; another seed gives other tokens */
    generate_rows(b, 0, GB, 1.0f, 1, 1.0f, 5, NULL, 0, tok, logp, len);
    ck_assert(memcmp(tok, gtok, sizeof tok) == 0);
    generate_rows(b, 0, GB, 1.0f, 0, 1.0f, 5, NULL, 0, tok, logp, len);
    generate_rows(b, 0, GB, 1.0f, 0, 1.0f, 6, NULL, 0, gtok, glogp, glen);
    ck_assert(memcmp(tok, gtok, sizeof tok) != 0);
    /* a stop token ends a sequence after it; the others go on */
    int32_t stop = tok[2];
    generate_rows(b, 0, GB, 1.0f, 0, 1.0f, 5, &stop, 1, gtok, glogp, glen);
    ck_assert_int_eq(glen[0], 3);
    ck_assert(gtok[2] == stop && gtok[3] == -1 && glogp[3] == 0.0f);
    for (int r = 1; r < GB; r++) {
        int k = 0;
        while (k < GM && tok[r * GM + k] != stop)
            k++;
        ck_assert_int_eq(glen[r], k < GM ? k + 1 : GM);
        ck_assert(memcmp(gtok + r * GM, tok + r * GM, sizeof(int32_t) * glen[r]) == 0);
    }
    free(w);
    qd_backend_free(b);
}
END_TEST

/* NVFP4 + RAC rollout: the same tokens at 1 and 2 threads and alone or batched. */
START_TEST(test_generate_rollout_recipe)
{
    qd_model_config c = tiny_config(0, 1);
    int32_t tok[2][GB * GM], len[GB], tok1[GM], len1;
    float logp[2][GB * GM], logp1[GM];
    float *w = NULL;
    for (int k = 0; k < 2; k++) {
        qd_backend *b = make(&c, QD_RECIPE_QUADS, QD_ROLE_ROLLOUT, 0.25, k + 1);
        if (!w)
            w = random_weights(b, 111);
        ck_assert_int_eq(qd_backend_set_weights(b, w, qd_backend_num_floats(b)), QD_OK);
        generate_rows(b, 0, GB, 0.8f, 0, 0.95f, 9, NULL, 0, tok[k], logp[k], len);
        if (k == 1)
            for (int r = 0; r < GB; r++) {
                generate_rows(b, r, 1, 0.8f, 0, 0.95f, 9, NULL, 0, tok1, logp1, &len1);
                ck_assert(memcmp(tok1, tok[k] + r * GM, sizeof tok1) == 0);
                ck_assert(memcmp(logp1, logp[k] + r * GM, sizeof logp1) == 0);
            }
        qd_backend_free(b);
    }
    ck_assert(memcmp(tok[0], tok[1], sizeof tok[0]) == 0 && memcmp(logp[0], logp[1], sizeof logp[0]) == 0);
    free(w);
}
END_TEST

/* The seed contract of NUMERICS.md §6 at a realistic batch: 16 prompts of
 * the 16 lengths 1..16 with distinct sequence ids give the same tokens,
 * log-probs and lengths (bytes) in one batch of 16 and one by one, at 1 and 2
 * threads (temperature 1, top_p 0.9). */
enum { SB = 16, SP = 16, SM = 10 };

static void seed_generate(qd_backend *b, int first, int B, uint64_t seed, int32_t *tok, float *logp,
                          int32_t *len)
{
    int32_t prompt[SB * SP], plen[SB];
    uint64_t sid[SB];
    rng_state = 5150;
    for (int i = 0; i < SB; i++) {
        plen[i] = 1 + (i * 5) % SP;           /* 1, 6, 11, 16, 5, 10, ...: all distinct */
        sid[i] = 1000 + 37 * (uint64_t)i;
        for (int t = 0; t < SP; t++)
            prompt[i * SP + t] = t < plen[i] ? (int32_t)(urand() * 64) : 9999;
    }
    qd_generate_request rq = {.B = B, .Tp = SP, .prompt = prompt + first * SP, .prompt_len = plen + first,
                              .seq_id = sid + first, .seed = seed, .max_new_tokens = SM, .temperature = 1.0f,
                              .top_k = 0, .top_p = 0.9f, .stop = NULL, .num_stop = 0};
    qd_generate_result res = {.tokens = tok, .logp = logp, .lengths = len};
    qd_status st = qd_backend_generate(b, &rq, &res);
    ck_assert_msg(st == QD_OK, "generate: %s", qd_last_error());
}

static void check_seed_contract(qd_recipe r, double ratio)
{
    qd_model_config c = tiny_config(0, 1);
    int32_t ref_tok[SB * SM], ref_len[SB], tok[SB * SM], len[SB];
    float ref_logp[SB * SM], logp[SB * SM];
    float *w = NULL;
    for (int threads = 1; threads <= 2; threads++) {
        qd_backend *b = make(&c, r, QD_ROLE_ROLLOUT, ratio, threads);
        if (!w)
            w = random_weights(b, 2024);
        ck_assert_int_eq(qd_backend_set_weights(b, w, qd_backend_num_floats(b)), QD_OK);
        seed_generate(b, 0, SB, 31, tok, logp, len);
        if (threads == 1) {
            memcpy(ref_tok, tok, sizeof tok);
            memcpy(ref_logp, logp, sizeof logp);
            memcpy(ref_len, len, sizeof len);
        }
        ck_assert_msg(memcmp(tok, ref_tok, sizeof tok) == 0 && memcmp(logp, ref_logp, sizeof logp) == 0 &&
                      memcmp(len, ref_len, sizeof len) == 0, "%s: batch 16 at %d threads", qd_recipe_name(r),
                      threads);
        /* every sequence alone at 1 thread; 4 of them at 2 (2-thread regions are slow
           on a loaded 2-core machine, and the batch of 16 already covers them all) */
        for (int i = 0; i < SB; i += threads == 1 ? 1 : 5) {
            seed_generate(b, i, 1, 31, tok, logp, len);
            ck_assert_msg(memcmp(tok, ref_tok + i * SM, sizeof(int32_t) * SM) == 0 &&
                          memcmp(logp, ref_logp + i * SM, sizeof(float) * SM) == 0 && len[0] == ref_len[i],
                          "%s: sequence %d alone at %d threads", qd_recipe_name(r), i, threads);
        }
        qd_backend_free(b);
    }
    /* the rows are real samples: full length, finite log-probs, not all alike */
    int differ = 0;
    for (int i = 0; i < SB; i++) {
        ck_assert_int_eq(ref_len[i], SM);
        for (int k = 0; k < SM; k++)
            ck_assert(ref_tok[i * SM + k] >= 0 && ref_tok[i * SM + k] < 64 && ref_logp[i * SM + k] <= 0.0f &&
                      isfinite(ref_logp[i * SM + k]));
        differ += i > 0 && memcmp(ref_tok + i * SM, ref_tok, sizeof(int32_t) * SM) != 0;
    }
    ck_assert_int_ge(differ, SB - 2);
    free(w);
}

START_TEST(test_generate_seed_contract)
{
    check_seed_contract(QD_RECIPE_FP32, 0);
    check_seed_contract(QD_RECIPE_QUADS, 0.25);
}
END_TEST

/* Rows with one prompt (a group's samples, each its own sampling stream)
 * share its prefill: tokens, log-probs and lengths equal those of every
 * row's own prefill bit for bit, in every rollout recipe, with a stop token
 * and top-p; and with RAC statistics gathered (no sharing) too. */
/* QUADS_MOE_DEV_ROWS=64: a decode of 12 rows keeps its expert offsets on
 * the device (an expert with more than 8 rows among them): the tokens,
 * log-probs and diagnostics of the host offsets' decode (nvfp4, quads). */
START_TEST(test_moe_dev_rows)
{
    enum { DB = 12, DP = 4, DM = 8 };
    setenv("QUADS_MOE_DEV_ROWS", "64", 1);
    qd_model_config c = tiny_config(0, 1);
    int32_t prompt[DB * DP], plen[DB];
    uint64_t sid[DB];
    for (int b = 0; b < DB; b++) {
        plen[b] = 1 + b % DP;
        sid[b] = 500 + (uint64_t)b;
        for (int t = 0; t < DP; t++)
            prompt[b * DP + t] = (7 * b + 3 * t + 1) % 50;
    }
    const qd_recipe rs[] = {QD_RECIPE_NVFP4, QD_RECIPE_QUADS};
    for (int i = 0; i < 2; i++) {
        qd_backend_options o = {.recipe = rs[i], .role = QD_ROLE_ROLLOUT, .rac_ratio = 0.25, .num_threads = 1,
                                .diagnostics = 1};
        qd_backend *b = qd_backend_cpu_init(&c, &o);
        ck_assert_msg(b != NULL, "init: %s", qd_last_error());
        float *w = random_weights(b, 700 + i);
        ck_assert_int_eq(qd_backend_set_weights(b, w, qd_backend_num_floats(b)), QD_OK);
        int32_t tok[2][DB * DM], len[2][DB];
        float lp[2][DB * DM];
        qd_diagnostics d[2];
        double err[2][64];
        for (int k = 0; k < 2; k++) {
            qd_model_moe_dev_off = k == 0;
            qd_generate_request rq = {.B = DB, .Tp = DP, .prompt = prompt, .prompt_len = plen, .seq_id = sid,
                                      .seed = 9, .max_new_tokens = DM, .temperature = 1.0f, .top_p = 1.0f};
            qd_generate_result res = {.tokens = tok[k], .logp = lp[k], .lengths = len[k]};
            ck_assert_msg(qd_backend_generate(b, &rq, &res) == QD_OK, "generate: %s", qd_last_error());
            ck_assert_int_eq(qd_backend_diagnostics(b, &d[k]), QD_OK);
            ck_assert(d[k].num_linear <= 64);
            memcpy(err[k], d[k].act_err, sizeof(double) * (size_t)d[k].num_linear);
        }
        qd_model_moe_dev_off = 1;
        ck_assert(!memcmp(tok[0], tok[1], sizeof tok[0]) && !memcmp(lp[0], lp[1], sizeof lp[0]));
        ck_assert(!memcmp(len[0], len[1], sizeof len[0]));
        ck_assert(!memcmp(err[0], err[1], sizeof(double) * (size_t)d[0].num_linear));
        qd_backend_free(b);
        free(w);
    }
    unsetenv("QUADS_MOE_DEV_ROWS");
}
END_TEST

/* The fused rows ops (qd_model_fused_rows: norms with the residual adds and
 * the MoE combine, the activation quantized by the op before its product,
 * q/k norms with RoPE and the KV store, the experts' gather with its
 * quantization) against the ops they stand for: the
 * same tokens, log-probs and RAC statistics in every recipe. */
START_TEST(test_fused_rows)
{
    enum { FB = 5, FP = 6, FM = 5 };
    qd_model_config c = tiny_config(0, 1);
    int32_t prompt[FB * FP], plen[FB];
    uint64_t sid[FB];
    for (int b = 0; b < FB; b++) {
        plen[b] = 2 + b % (FP - 1);
        sid[b] = 77 + (uint64_t)b;
        for (int t = 0; t < FP; t++)
            prompt[b * FP + t] = (11 * b + 5 * t + 2) % 50;
    }
    const qd_recipe rs[] = {QD_RECIPE_BF16, QD_RECIPE_FP8, QD_RECIPE_NVFP4, QD_RECIPE_QUADS};
    for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++) {
        qd_backend *b = make(&c, rs[i], QD_ROLE_ROLLOUT, 0.25, 1);
        float *w = random_weights(b, 910 + i);
        ck_assert_int_eq(qd_backend_set_weights(b, w, qd_backend_num_floats(b)), QD_OK);
        int32_t tok[2][FB * FM], len[2][FB];
        float lp[2][FB * FM];
        size_t ns = 0;
        double *st[2] = {NULL, NULL};
        for (int k = 0; k < 2; k++) {
            qd_model_fused_rows = k == 0;
            qd_generate_request rq = {.B = FB, .Tp = FP, .prompt = prompt, .prompt_len = plen, .seq_id = sid,
                                      .seed = 3, .max_new_tokens = FM, .temperature = 1.0f, .top_p = 1.0f,
                                      .rac_stats = 1};
            qd_generate_result res = {.tokens = tok[k], .logp = lp[k], .lengths = len[k]};
            ck_assert_msg(qd_backend_generate(b, &rq, &res) == QD_OK, "generate: %s", qd_last_error());
            ns = qd_backend_rac_stats_count(b);
            st[k] = calloc(ns + 1, sizeof(double));
            ck_assert_int_eq(qd_backend_get_rac_stats(b, st[k], ns), QD_OK);
            double *zero = calloc(ns + 1, sizeof(double)); /* the next run's sums from zero */
            ck_assert_int_eq(qd_backend_set_rac_stats(b, zero, ns), QD_OK);
            free(zero);
        }
        qd_model_fused_rows = 1;
        const char *what = qd_recipe_name(rs[i]);
        ck_assert_msg(memcmp(tok[0], tok[1], sizeof tok[0]) == 0, "%s: tokens differ", what);
        ck_assert_msg(memcmp(len[0], len[1], sizeof len[0]) == 0, "%s: lengths differ", what);
        ck_assert_msg(memcmp(lp[0], lp[1], sizeof lp[0]) == 0, "%s: log-probs differ", what);
        ck_assert_msg(memcmp(st[0], st[1], sizeof(double) * ns) == 0, "%s: RAC statistics differ", what);
        free(st[0]);
        free(st[1]);
        qd_backend_free(b);
        free(w);
    }
}
END_TEST

START_TEST(test_shared_prefill)
{
    enum { SB = 7, SP = 6, SM = 6 };
    static const int32_t slen[SB] = {6, 3, 6, 6, 4, 3, 6};
    static const int32_t pa[SP] = {5, 17, 33, 2, 60, 9}, pb[SP] = {40, 1, 22}, pc[SP] = {8, 8, 50, 13};
    const int32_t *rows[SB] = {pa, pb, pa, pa, pc, pb, pa};
    int32_t prompt[SB * SP] = {0}, stop = 3;
    uint64_t sid[SB];
    for (int b = 0; b < SB; b++) {
        memcpy(prompt + b * SP, rows[b], sizeof(int32_t) * (size_t)slen[b]);
        sid[b] = 1000 + (uint64_t)b;
    }
    prompt[6 * SP + 5] = 61; /* row 6: pa but its last token */
    qd_model_config c = tiny_config(0, 1);
    const qd_recipe rs[] = {QD_RECIPE_BF16, QD_RECIPE_FP8, QD_RECIPE_NVFP4, QD_RECIPE_QUADS};
    for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++) {
        qd_backend *b = make(&c, rs[i], QD_ROLE_ROLLOUT, 0.25, 1);
        float *w = random_weights(b, 300 + i);
        ck_assert_int_eq(qd_backend_set_weights(b, w, qd_backend_num_floats(b)), QD_OK);
        int32_t tok[4][SB * SM], len[4][SB];
        float lp[4][SB * SM];
        for (int k = 0; k < 4; k++) { /* k 3: the decode's expert offsets on the host (nvfp4, quads) */
            qd_model_share_prefill = k != 1;
            qd_model_moe_dev_off = k != 3;
            qd_generate_request rq = {.B = SB, .Tp = SP, .prompt = prompt, .prompt_len = slen, .seq_id = sid,
                                      .seed = 5, .max_new_tokens = SM, .temperature = 1.0f, .top_p = 0.9f,
                                      .stop = &stop, .num_stop = 1, .rac_stats = k == 2};
            qd_generate_result res = {.tokens = tok[k], .logp = lp[k], .lengths = len[k]};
            ck_assert_msg(qd_backend_generate(b, &rq, &res) == QD_OK, "generate: %s", qd_last_error());
        }
        qd_model_share_prefill = 1;
        qd_model_moe_dev_off = 1;
        const char *what = qd_recipe_name(rs[i]);
        for (int k = 1; k < 4; k++) {
            ck_assert_msg(memcmp(tok[0], tok[k], sizeof tok[0]) == 0, "%s: tokens differ (%d)", what, k);
            ck_assert_msg(memcmp(len[0], len[k], sizeof len[0]) == 0, "%s: lengths differ (%d)", what, k);
            ck_assert_msg(memcmp(lp[0], lp[k], sizeof lp[0]) == 0, "%s: log-probs differ (%d)", what, k);
        }
        /* rows 0, 2, 3 share a prompt, not their streams; their first tokens'
         * log-probs come from one set of logits */
        ck_assert(memcmp(tok[0], tok[0] + 2 * SM, sizeof(int32_t) * SM) != 0 ||
                  memcmp(tok[0], tok[0] + 3 * SM, sizeof(int32_t) * SM) != 0);
        qd_backend_free(b);
        free(w);
    }
}
END_TEST

/* ---- the driver's fallbacks for optional ops (backends/ops.h) */

/* The CPU's ops without the grouped ops, the multi ops and sample: the driver then runs the
 * plain op per expert and samples on the host. */
static qd_ops bare_ops;

static qd_backend *make_bare(const qd_model_config *cfg, qd_recipe r, qd_role role, double ratio)
{
    bare_ops = *qd_cpu_ops();
    bare_ops.matmul_grouped = NULL;
    bare_ops.matmul_grouped_backward = NULL;
    bare_ops.fp8_gemm_grouped = NULL;
    bare_ops.w4a4_gemm_grouped = NULL;
    bare_ops.rac_grouped = NULL;
    bare_ops.rac_multi = NULL;
    bare_ops.w4a4_gemm_multi = NULL;
    bare_ops.moe_group_dev = NULL;
    bare_ops.w4a4_gemm_grouped_dev = NULL;
    bare_ops.rac_multi_dev = NULL;
    bare_ops.sample = NULL;
    qd_backend_options o = {.recipe = r, .role = role, .rac_ratio = ratio, .num_threads = 1};
    qd_backend *b = qd_model_backend_new(cfg, &o, &bare_ops, qd_cpu_dev_new(1), free);
    ck_assert_msg(b != NULL, "init: %s", qd_last_error());
    return b;
}

/* What one instance computes: a forward's log-probs and logits; a rollout's
 * generate (gathering RAC statistics), its RAC state, and a forward after
 * the next sync (channels picked from those statistics); a trainer's
 * gradients and its weights after an AdamW step. */
typedef struct {
    float logp[TB * TT], logits[TB * TT * 64], logp2[TB * TT], logits2[TB * TT * 64], glogp[GB * GM];
    int32_t gtok[GB * GM], glen[GB];
    size_t n;                 /* floats of grads, weights */
    float *grads, *weights;
    char *rac;
    size_t rac_bytes;
} fallback_out;

static void fallback_run(qd_backend *b, qd_role role, const float *w, const void *rac_in, size_t rac_in_bytes,
                         fallback_out *o)
{
    size_t n = o->n = qd_backend_num_floats(b);
    int32_t tok[TB * TT], prompt[GB * GP];
    float coef[TB * TT];
    tiny_batch(tok, 61);
    random_coef(coef, 62);
    for (int i = 0; i < GB * GP; i++)
        prompt[i] = (tok[i % (TB * TT)] + i) % 64;
    ck_assert_int_eq(qd_backend_set_weights(b, w, n), QD_OK);
    if (rac_in)
        ck_assert_msg(qd_backend_set_rac_state(b, rac_in, rac_in_bytes) == QD_OK, "%s", qd_last_error());
    int rollout = role == QD_ROLE_ROLLOUT;
    qd_batch bt = {.B = TB, .T = TT, .tokens = tok, .lengths = tlen, .temperature = 1.0f, .rac_stats = rollout};
    ck_assert_msg(qd_backend_forward(b, &bt, o->logp, o->logits) == QD_OK, "forward: %s", qd_last_error());
    o->grads = o->weights = NULL;
    o->rac = NULL;
    if (rollout) {
        qd_generate_request rq = {.B = GB, .Tp = GP, .prompt = prompt, .prompt_len = gplen, .seq_id = gsid,
                                  .seed = 19, .max_new_tokens = GM, .temperature = 1.0f, .top_p = 0.9f,
                                  .rac_stats = 1};
        qd_generate_result res = {.tokens = o->gtok, .logp = o->glogp, .lengths = o->glen};
        ck_assert_msg(qd_backend_generate(b, &rq, &res) == QD_OK, "generate: %s", qd_last_error());
        o->rac_bytes = qd_backend_rac_state_size(b);
        o->rac = malloc(o->rac_bytes + 1);
        ck_assert_int_eq(qd_backend_get_rac_state(b, o->rac, o->rac_bytes), QD_OK);
        ck_assert_int_eq(qd_backend_set_weights(b, w, n), QD_OK);
        bt.rac_stats = 0;
        ck_assert_int_eq(qd_backend_forward(b, &bt, o->logp2, o->logits2), QD_OK);
        return;
    }
    o->grads = malloc(sizeof(float) * n);
    o->weights = malloc(sizeof(float) * n);
    ck_assert_int_eq(qd_backend_backward(b, coef), QD_OK);
    ck_assert_int_eq(qd_backend_get_grads(b, o->grads, n), QD_OK);
    qd_adamw opt = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f,
                    .grad_clip = 1.0f};
    ck_assert_int_eq(qd_backend_optimizer_step(b, &opt, 1, NULL), QD_OK);
    ck_assert_int_eq(qd_backend_get_weights(b, o->weights, n), QD_OK);
}

static void fallback_out_free(fallback_out *o)
{
    free(o->grads);
    free(o->weights);
    free(o->rac);
}

/* The recipe on the CPU backend and on the bare ops: the same bytes. *rac
 * (when not NULL): a rollout's RAC state out, a replay trainer's in. */
static void check_fallback(const qd_model_config *c, const float *w, qd_recipe r, qd_role role, double ratio,
                           char **rac, size_t *rac_bytes)
{
    const char *what = qd_recipe_name(r);
    int rollout = role == QD_ROLE_ROLLOUT;
    const void *rac_in = !rollout && rac ? *rac : NULL;
    size_t rac_in_bytes = rac_in ? *rac_bytes : 0;
    fallback_out *o = calloc(2, sizeof *o);
    ck_assert_ptr_nonnull(o);
    for (int k = 0; k < 2; k++) {
        qd_backend *b = k ? make_bare(c, r, role, ratio) : make(c, r, role, ratio, 1);
        fallback_run(b, role, w, rac_in, rac_in_bytes, &o[k]);
        qd_backend_free(b);
    }
    size_t n = 0;
    for (int i = 0; i < TB * TT * 64; i++)
        n += o[0].logits[i] != 0.0f && isfinite(o[0].logits[i]);
    ck_assert_msg(n > TB * TT * 32, "%s: logits", what);
    ck_assert_msg(memcmp(o[0].logp, o[1].logp, sizeof o[0].logp) == 0, "%s: log-probs differ", what);
    ck_assert_msg(memcmp(o[0].logits, o[1].logits, sizeof o[0].logits) == 0, "%s: logits differ", what);
    if (rollout) {
        ck_assert_msg(memcmp(o[0].gtok, o[1].gtok, sizeof o[0].gtok) == 0 &&
                      memcmp(o[0].glen, o[1].glen, sizeof o[0].glen) == 0, "%s: generated tokens differ", what);
        ck_assert_msg(memcmp(o[0].glogp, o[1].glogp, sizeof o[0].glogp) == 0, "%s: generate log-probs differ",
                      what);
        ck_assert(o[0].rac_bytes == o[1].rac_bytes);
        ck_assert_msg(memcmp(o[0].rac, o[1].rac, o[0].rac_bytes) == 0, "%s: RAC state differs", what);
        ck_assert_msg(memcmp(o[0].logp2, o[1].logp2, sizeof o[0].logp2) == 0 &&
                      memcmp(o[0].logits2, o[1].logits2, sizeof o[0].logits2) == 0, "%s: logits after the sync "
                      "differ", what);
        if (rac && o[0].rac_bytes) {
            *rac = o[0].rac;
            *rac_bytes = o[0].rac_bytes;
            o[0].rac = NULL;
        }
    } else {
        size_t nf = o[0].n, moved = 0;
        ck_assert_msg(memcmp(o[0].grads, o[1].grads, sizeof(float) * nf) == 0, "%s: gradients differ", what);
        ck_assert_msg(memcmp(o[0].weights, o[1].weights, sizeof(float) * nf) == 0, "%s: weights after AdamW "
                      "differ", what);
        for (size_t i = 0; i < nf; i++)
            moved += o[0].weights[i] != w[i];
        ck_assert_msg(moved > nf / 2, "%s: AdamW moved %zu of %zu weights", what, moved, nf);
    }
    fallback_out_free(&o[0]);
    fallback_out_free(&o[1]);
    free(o);
}

/* Every optional op the driver can do without (the grouped products of the
 * experts, the grouped RAC quantization, sampling) left NULL: forward logits,
 * generate tokens and log-probs, the RAC statistics, gradients and an AdamW
 * step are the CPU backend's bit for bit, in every kind of expert product. */
START_TEST(test_null_ops_fallback)
{
    qd_model_config c = tiny_config(0, 1);
    qd_backend *b = make(&c, QD_RECIPE_FP32, QD_ROLE_TRAINER, 0, 1);
    float *w = random_weights(b, 171);
    qd_backend_free(b);
    char *rac = NULL;
    size_t rac_bytes = 0;
    check_fallback(&c, w, QD_RECIPE_BF16, QD_ROLE_ROLLOUT, 0, NULL, NULL);      /* matmul, sample */
    check_fallback(&c, w, QD_RECIPE_FP8, QD_ROLE_ROLLOUT, 0, NULL, NULL);       /* fp8_gemm */
    check_fallback(&c, w, QD_RECIPE_NVFP4, QD_ROLE_ROLLOUT, 0, NULL, NULL);     /* w4a4_gemm */
    check_fallback(&c, w, QD_RECIPE_QUADS, QD_ROLE_ROLLOUT, 0.5, &rac, &rac_bytes); /* rac_error, rac_augment_act */
    ck_assert_ptr_nonnull(rac);
    check_fallback(&c, w, QD_RECIPE_FP32, QD_ROLE_TRAINER, 0, NULL, NULL);      /* matmul(_backward) */
    check_fallback(&c, w, QD_RECIPE_QUADS, QD_ROLE_TRAINER, 0, NULL, NULL);     /* fake-quant weights */
    check_fallback(&c, w, QD_RECIPE_QUADS_REPLAY, QD_ROLE_TRAINER, 0, &rac, &rac_bytes); /* RAC, no statistics */
    free(rac);
    free(w);
}
END_TEST

/* ---- errors */

START_TEST(test_errors)
{
    qd_model_config c = tiny_config(0, 1);
    qd_backend *b = make(&c, QD_RECIPE_NVFP4, QD_ROLE_ROLLOUT, 0, 0);
    size_t n = qd_backend_num_floats(b);
    float *w = random_weights(b, 61), logp[TB * TT];
    int32_t tok[TB * TT], len[TB] = {7, 8, 1};
    ck_assert_int_eq(qd_backend_backward(b, logp), QD_ERR_ARG);   /* no forward yet */
    ck_assert_int_eq(qd_backend_set_weights(b, w, n), QD_OK);
    tiny_batch(tok, 62);
    qd_batch bt = {.B = TB, .T = TT, .tokens = tok, .lengths = len, .temperature = 1.0f};
    ck_assert_int_eq(qd_backend_forward(b, &bt, logp, NULL), QD_ERR_SHAPE);
    ck_assert(strstr(qd_last_error(), "lengths[1]") != NULL);
    bt.lengths = tlen;
    tok[3] = 64;
    ck_assert_int_eq(qd_backend_forward(b, &bt, logp, NULL), QD_ERR_ARG);
    ck_assert(strstr(qd_last_error(), "tokens[0][3]") != NULL);
    tok[3] = 0;
    ck_assert_int_eq(qd_backend_forward(b, &bt, logp, NULL), QD_OK);
    ck_assert_int_eq(qd_backend_backward(b, logp), QD_ERR_UNSUPPORTED); /* rollout W4A4 */
    int32_t gt[2 * 64], gl[2];
    float glp[2 * 64];
    uint64_t sid[2] = {0, 1};
    qd_generate_request rq = {.B = 2, .Tp = 7, .prompt = tok, .prompt_len = tlen, .seq_id = sid, .seed = 1,
                              .max_new_tokens = 58, .temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .stop = NULL,
                              .num_stop = 0};
    qd_generate_result res = {.tokens = gt, .logp = glp, .lengths = gl};
    ck_assert_int_eq(qd_backend_generate(b, &rq, &res), QD_ERR_SHAPE); /* 7 + 58 > 64 positions */
    rq.max_new_tokens = 0;
    ck_assert_int_eq(qd_backend_generate(b, &rq, &res), QD_OK);
    ck_assert(gl[0] == 0 && gl[1] == 0);
    rq.top_p = 0.0f;
    ck_assert_int_eq(qd_backend_generate(b, &rq, &res), QD_ERR_ARG);
    rq.top_p = 1.0f;
    rq.temperature = NAN;
    ck_assert_int_eq(qd_backend_generate(b, &rq, &res), QD_ERR_ARG);
    w[5] = NAN;
    ck_assert_int_eq(qd_backend_set_weights(b, w, n), QD_ERR_NONFINITE);
    ck_assert_int_eq(qd_backend_set_weights(b, w, n - 1), QD_ERR_SHAPE);
    free(w);
    qd_backend_free(b);
}
END_TEST

/* The generate's on_step callback: once a step, steps done 1, 2, ... with
 * max_new_tokens, on the caller's thread; a stop token ends the calls with the
 * generate; the tokens and log-probs the same with it as without it. */
typedef struct {
    int calls, last, steps, bad;
} step_log;

static void log_step(int done, int steps, void *ctx)
{
    step_log *l = ctx;
    l->bad |= done != l->last + 1 || (l->steps && steps != l->steps);
    l->calls++;
    l->last = done;
    l->steps = steps;
}

START_TEST(test_generate_on_step)
{
    qd_model_config c = tiny_config(0, 1);
    qd_backend *b = make(&c, QD_RECIPE_NVFP4, QD_ROLE_ROLLOUT, 0.25, 0);
    float *w = random_weights(b, 91);
    ck_assert_int_eq(qd_backend_set_weights(b, w, qd_backend_num_floats(b)), QD_OK);
    int32_t tok[TB * TT], gt[2][2 * 9], gl[2][2];
    float glp[2][2 * 9];
    tiny_batch(tok, 92);
    uint64_t sid[2] = {5, 6};
    step_log lg = {0};
    qd_generate_request rq = {.B = 2, .Tp = TT, .prompt = tok, .prompt_len = tlen, .seq_id = sid, .seed = 3,
                              .max_new_tokens = 9, .temperature = 1.0f, .top_p = 1.0f};
    qd_generate_result r0 = {.tokens = gt[0], .logp = glp[0], .lengths = gl[0]};
    qd_generate_result r1 = {.tokens = gt[1], .logp = glp[1], .lengths = gl[1]};
    ck_assert_int_eq(qd_backend_generate(b, &rq, &r0), QD_OK);
    rq.on_step = log_step;
    rq.on_step_ctx = &lg;
    ck_assert_int_eq(qd_backend_generate(b, &rq, &r1), QD_OK);
    ck_assert_int_eq(lg.bad, 0);
    ck_assert_int_eq(lg.calls, 9);
    ck_assert_int_eq(lg.last, 9);
    ck_assert_int_eq(lg.steps, 9);
    ck_assert_mem_eq(gt[0], gt[1], sizeof gt[0]);
    ck_assert_mem_eq(glp[0], glp[1], sizeof glp[0]);
    /* both rows stop at step 1 (their first tokens as stop tokens): one call */
    int32_t stop[2] = {gt[0][0], gt[0][9]};
    rq.stop = stop;
    rq.num_stop = 2;
    lg = (step_log){0};
    ck_assert_int_eq(qd_backend_generate(b, &rq, &r1), QD_OK);
    ck_assert(gl[1][0] == 1 && gl[1][1] == 1);
    ck_assert_int_eq(lg.bad, 0);
    ck_assert_int_eq(lg.calls, 1);
    free(w);
    qd_backend_free(b);
}
END_TEST

/* ---- the forward at a temperature */

static void forward_temp(qd_backend *b, const int32_t *tok, const int32_t *len, int B, int T, float temp,
                         float *logp, float *logits)
{
    qd_batch bt = {.B = B, .T = T, .tokens = tok, .lengths = len, .temperature = temp};
    qd_status st = qd_backend_forward(b, &bt, logp, logits);
    ck_assert_msg(st == QD_OK, "forward at %g: %s", (double)temp, qd_last_error());
}

static double loss_temp(qd_backend *b, const int32_t *tok, const float *coef, float temp)
{
    float logp[TB * TT];
    forward_temp(b, tok, tlen, TB, TT, temp, logp, NULL);
    double L = 0;
    for (int i = 0; i < TB * TT; i++)
        L += (double)coef[i] * logp[i];
    return L;
}

/* Tokens sampled at temperature 0.7 (fp32): their rollout log-probs equal the
 * forward's at 0.7 bit for bit (and differ from the forward's at 1, which
 * temperature 0 also means); the logits output stays raw. */
static void check_generate_at_temperature(const float *w, const qd_model_config *c)
{
    qd_backend *b = make_loaded(c, QD_RECIPE_FP32, QD_ROLE_ROLLOUT, 0, 0, w);
    int32_t tok[GB * GM], len[GB], prompt[GB * GP], seq[GP + GM];
    float glogp[GB * GM], lp[GP + GM], lp1[GP + GM], lp0[GP + GM];
    float *lg = malloc(sizeof(float) * (GP + GM) * 64), *lg1 = malloc(sizeof(float) * (GP + GM) * 64);
    generate_rows(b, 0, GB, 0.7f, 0, 1.0f, 3, NULL, 0, tok, glogp, len);
    rng_state = 77;   /* generate_rows' prompts */
    for (int i = 0; i < GB * GP; i++)
        prompt[i] = (int32_t)(urand() * 64);
    int differ = 0;
    for (int r = 0; r < GB; r++) {
        int32_t L = gplen[r] + len[r];
        memcpy(seq, prompt + r * GP, sizeof(int32_t) * gplen[r]);
        memcpy(seq + gplen[r], tok + r * GM, sizeof(int32_t) * len[r]);
        forward_temp(b, seq, &L, 1, L, 0.7f, lp, lg);
        forward_temp(b, seq, &L, 1, L, 1.0f, lp1, lg1);
        forward_temp(b, seq, &L, 1, L, 0.0f, lp0, NULL);
        ck_assert(memcmp(lg, lg1, sizeof(float) * L * 64) == 0);
        ck_assert(memcmp(lp0, lp1, sizeof(float) * L) == 0);
        for (int i = 0; i < len[r]; i++) {
            int t = gplen[r] - 1 + i;
            ck_assert_msg(lp[t] == glogp[r * GM + i], "row %d token %d: rollout %.9g forward at 0.7 %.9g", r, i,
                          glogp[r * GM + i], lp[t]);
            differ += fabsf(lp1[t] - lp[t]) > 1e-3f;
        }
    }
    ck_assert(differ > GB * GM / 2);
    free(lg);
    free(lg1);
    qd_backend_free(b);
}

/* The gradient of sum coef * logp at temperature 0.7 (the 1/T factor
 * included) against Richardson central differences as in check_gradients,
 * along the largest-gradient element of a few tensors and a random unit
 * direction in each; it also differs from the gradient at temperature 1. */
static void check_gradients_at_temperature(const float *w, const qd_model_config *c)
{
    static const char *const names[] = {"lm_head.weight", "model.norm.weight",
                                        "model.layers.1.self_attn.q_proj.weight", "model.embed_tokens.weight"};
    qd_backend *b = make_loaded(c, QD_RECIPE_FP32, QD_ROLE_TRAINER, 0, 0, w);
    size_t n = qd_backend_num_floats(b);
    float *g = malloc(sizeof(float) * n), *g1 = malloc(sizeof(float) * n), *wp = malloc(sizeof(float) * n);
    double *d = malloc(sizeof(double) * n), worst = 0;
    int32_t tok[TB * TT];
    float coef[TB * TT], logp[TB * TT];
    tiny_batch(tok, 202);
    random_coef(coef, 203);
    float temps[2] = {1.0f, 0.7f}, *gs[2] = {g1, g};
    for (int k = 0; k < 2; k++) {
        qd_backend_zero_grad(b);
        forward_temp(b, tok, tlen, TB, TT, temps[k], logp, NULL);
        ck_assert_int_eq(qd_backend_backward(b, coef), QD_OK);
        ck_assert_int_eq(qd_backend_get_grads(b, gs[k], n), QD_OK);
    }
    int np;
    const qd_param_info *p = qd_backend_params(b, &np);
    for (size_t q = 0; q < sizeof names / sizeof *names; q++) {
        int i = qd_backend_find_param(b, names[q]);
        ck_assert_msg(i >= 0, "%s", names[q]);
        size_t off = p[i].offset, m = (size_t)(p[i].rows * p[i].cols), best = off;
        double dg = 0;
        for (size_t k = off; k < off + m; k++) {
            dg = fmax(dg, fabs((double)g[k] - g1[k]));
            if (fabsf(g[k]) > fabsf(g[best]))
                best = k;
        }
        ck_assert_msg(dg > 1e-3, "%s: the gradient at 0.7 is the one at 1", names[q]);
        for (int mode = 0; mode < 2; mode++) {
            memset(d, 0, sizeof(double) * n);
            if (mode == 0) {
                d[best] = 1.0;
            } else {
                double nn = 0;
                for (size_t k = off; k < off + m; k++) {
                    d[k] = sym();
                    nn += d[k] * d[k];
                }
                for (size_t k = off; k < off + m; k++)
                    d[k] /= sqrt(nn);
            }
            double an = 0, h = 3e-2, fd[4];
            for (size_t k = off; k < off + m; k++)
                an += d[k] * g[k];
            for (int s = 0; s < 4; s++) {
                double hs = (s & 1 ? -h : h) / (s < 2 ? 1 : 2);
                for (size_t k = 0; k < n; k++)
                    wp[k] = (float)(w[k] + hs * d[k]);
                ck_assert_int_eq(qd_backend_set_weights(b, wp, n), QD_OK);
                fd[s] = loss_temp(b, tok, coef, 0.7f);
            }
            double num = (4 * (fd[2] - fd[3]) / h - (fd[0] - fd[1]) / (2 * h)) / 3;
            double rel = fabs(num - an) / (fabs(an) + 0.25);
            ck_assert_msg(rel < 2e-3, "%s mode %d: analytic %g numeric %g", names[q], mode, an, num);
            worst = fmax(worst, rel);
        }
    }
    fprintf(stderr, "gradients at temperature 0.7: worst |num - an| / (|an| + 0.25) %.2e\n", worst);
    free(g);
    free(g1);
    free(wp);
    free(d);
    qd_backend_free(b);
}

START_TEST(test_forward_temperature)
{
    qd_model_config c = tiny_config(0, 1);
    qd_backend *b = make(&c, QD_RECIPE_FP32, QD_ROLE_TRAINER, 0, 0);
    float *w = random_weights(b, 201), logp[TB * TT];
    int32_t tok[TB * TT];
    tiny_batch(tok, 204);
    ck_assert_int_eq(qd_backend_set_weights(b, w, qd_backend_num_floats(b)), QD_OK);
    qd_batch bt = {.B = TB, .T = TT, .tokens = tok, .lengths = tlen, .temperature = NAN};
    ck_assert_int_eq(qd_backend_forward(b, &bt, logp, NULL), QD_ERR_ARG);
    ck_assert(strstr(qd_last_error(), "temperature") != NULL);
    bt.temperature = -1.0f;
    ck_assert_int_eq(qd_backend_forward(b, &bt, logp, NULL), QD_ERR_ARG);
    qd_backend_free(b);
    check_generate_at_temperature(w, &c);
    check_gradients_at_temperature(w, &c);
    free(w);
}
END_TEST

Suite *suite_backend_cpu(void)
{
    Suite *s = suite_create("backend_cpu");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_exact_math_accuracy);
    tcase_add_test(tc, test_exact_math_special_and_monotonic);
    tcase_add_test(tc, test_recipes);
    tcase_add_test(tc, test_config_and_params);
    tcase_add_test(tc, test_forward_logits_consistent);
    tcase_add_test(tc, test_lm_head_bfp);
    tcase_add_test(tc, test_forward_reference);
    tcase_add_test(tc, test_batch_independence);
    tcase_add_test(tc, test_thread_independence);
    tcase_add_test(tc, test_set_grads);
    tcase_add_test(tc, test_moe_group);
    tcase_add_test(tc, test_rac_state_errors);
    tcase_add_test(tc, test_rac_stats_explicit);
    tcase_add_test(tc, test_gradients_untied);
    tcase_add_test(tc, test_gradients_tied);
    tcase_add_test(tc, test_recipes_error);
    tcase_add_test(tc, test_trainer_gradients);
    tcase_add_loop_test(tc, test_replay_no_gap, 0, 2);
    tcase_add_test(tc, test_ablation_recipes);
    tcase_add_test(tc, test_adamw);
    tcase_add_test(tc, test_diagnostics);
    tcase_add_test(tc, test_diag_dev);
    tcase_add_test(tc, test_moe_dev_rows);
    tcase_add_test(tc, test_generate);
    tcase_add_test(tc, test_generate_rollout_recipe);
    tcase_add_test(tc, test_generate_seed_contract);
    tcase_add_test(tc, test_null_ops_fallback);
    tcase_add_test(tc, test_shared_prefill);
    tcase_add_test(tc, test_fused_rows);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_generate_on_step);
    tcase_add_test(tc, test_forward_temperature);
    tcase_add_test(tc, test_recompute);
    tcase_add_test(tc, test_lazy_zero);
    suite_add_tcase(s, tc);
    return s;
}
