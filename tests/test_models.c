/* Check suite "models": Hugging Face checkpoints end to end.
 *
 * - The five transformers fixtures (tests/fixtures/hf_models/, made by
 *   tests/ref/qwen3moe_reference.py): our fp32 CPU forward against
 *   transformers' float32 logits and log-probs, the router's top-k choices,
 *   and the gradients of sum(coef * logprobs) against PyTorch autograd.
 * - qd_checkpoint_save -> qd_checkpoint_load round trips (F32 bit-exact,
 *   BF16 = round-to-nearest-even of the master weights).
 * - Malformed checkpoints refused with the file, tensor and field named.
 * - The quads forward and quads generate programs ($QD_BUILDDIR/quads). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/suites.h"
#include "backends/backend.h"
#include "models/checkpoint.h"
#include "models/safetensors.h"
#include "models/tokenizer.h"
#include "quant/fileio.h"
#include "quant/numerics.h"

#define REL_TOL 1e-4

static const char *const fixtures[] = {
    "qwen3moe_gqa_untied", "qwen3moe_mha_tied_nonorm", "qwen3moe_mqa_sparse2",
    "qwen3moe_mlponly0",   "qwen3_dense",
};
#define NFIX ((int)(sizeof fixtures / sizeof *fixtures))

static const char *fixture_dir(const char *name)
{
    static _Thread_local char buf[4096];
    snprintf(buf, sizeof buf, "%s", qd_test_path("tests/fixtures/hf_models/"));
    strncat(buf, name, sizeof buf - strlen(buf) - 1);
    return buf;
}

/* ---- helpers */

static qd_backend *open_fixture(const char *name, int diagnostics)
{
    qd_backend_options o = {.recipe = QD_RECIPE_FP32, .role = QD_ROLE_TRAINER, .num_threads = 1,
                            .diagnostics = diagnostics};
    qd_backend *b = qd_checkpoint_open_backend(fixture_dir(name), "cpu", &o);
    ck_assert_msg(b != NULL, "%s: %s", name, qd_last_error());
    return b;
}

/* A reference tensor as a malloc'd copy (float32 or int32, by its dtype). */
static void *ref_tensor(const qd_safetensors *f, const char *name, qd_st_dtype dt, int64_t *numel)
{
    const qd_st_tensor *t = qd_safetensors_find(f, name);
    ck_assert_msg(t != NULL, "reference tensor %s missing", name);
    ck_assert_int_eq(t->dtype, dt);
    void *p = malloc(t->nbytes + 1);
    memcpy(p, t->data, t->nbytes);
    if (numel)
        *numel = t->numel;
    return p;
}

/* max |a - b| / max |b| over n elements with stride 1. */
static double rel_err(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num = fmax(num, fabs((double)a[i] - b[i]));
        den = fmax(den, fabs((double)b[i]));
    }
    return den > 0 ? num / den : num;
}

/* ---- the transformers fixtures */

typedef struct {
    int B, T, V;
    int32_t *ids, *lengths;
    float *logits, *logprobs, *coef;
} reference;

static void read_reference(const qd_safetensors *f, reference *r, int V)
{
    const qd_st_tensor *ids = qd_safetensors_find(f, "ids");
    ck_assert_ptr_nonnull(ids);
    r->B = (int)ids->shape[0];
    r->T = (int)ids->shape[1];
    r->V = V;
    r->ids = ref_tensor(f, "ids", QD_ST_I32, NULL);
    r->lengths = ref_tensor(f, "lengths", QD_ST_I32, NULL);
    r->logits = ref_tensor(f, "logits", QD_ST_F32, NULL);
    r->logprobs = ref_tensor(f, "logprobs", QD_ST_F32, NULL);
    r->coef = ref_tensor(f, "coef", QD_ST_F32, NULL);
}

static void free_reference(reference *r)
{
    free(r->ids);
    free(r->lengths);
    free(r->logits);
    free(r->logprobs);
    free(r->coef);
}

/* Router choices of the last forward against router_topk [L_moe, B*T, k] (-1 at padding). */
static void check_router(qd_backend *b, const qd_safetensors *f, const reference *r, const char *name)
{
    qd_diagnostics d;
    ck_assert_int_eq(qd_backend_diagnostics(b, &d), QD_OK);
    if (!qd_safetensors_find(f, "router_topk")) {
        ck_assert_int_eq(d.num_moe_layers, 0);
        return;
    }
    int64_t n;
    int32_t *want = ref_tensor(f, "router_topk", QD_ST_I32, &n);
    ck_assert_int_eq(n, (int64_t)d.num_moe_layers * r->B * r->T * d.top_k);
    for (int l = 0; l < d.num_moe_layers; l++)
        for (int bb = 0, packed = 0; bb < r->B; bb++)
            for (int t = 0; t < r->lengths[bb]; t++, packed++)
                for (int k = 0; k < d.top_k; k++)
                    ck_assert_msg(d.router_topk[((size_t)l * d.num_tokens + packed) * d.top_k + k] ==
                                      want[(((size_t)l * r->B + bb) * r->T + t) * d.top_k + k],
                                  "%s: moe layer %d seq %d token %d rank %d", name, l, bb, t, k);
    free(want);
}

/* Forward: logits and log-probs per sequence; returns the worst relative errors. */
static void check_forward(qd_backend *b, const reference *r, float *logp, double *e_logits, double *e_logp)
{
    size_t V = (size_t)r->V, T = (size_t)r->T;
    float *logits = malloc(sizeof(float) * (size_t)r->B * T * V);
    qd_batch batch = {r->B, r->T, r->ids, r->lengths};
    ck_assert_msg(qd_backend_forward(b, &batch, logp, logits) == QD_OK, "%s", qd_last_error());
    *e_logits = *e_logp = 0;
    for (int bb = 0; bb < r->B; bb++) {
        size_t n = (size_t)r->lengths[bb];
        *e_logits = fmax(*e_logits, rel_err(logits + bb * T * V, r->logits + bb * T * V, n * V));
        *e_logp = fmax(*e_logp, rel_err(logp + bb * T, r->logprobs + bb * (T - 1), n - 1));
    }
    free(logits);
}

/* Backward of sum(coef * logprobs); the worst relative error over the tensors. */
static double check_gradients(qd_backend *b, const qd_safetensors *f, const reference *r)
{
    size_t T = (size_t)r->T, nf = qd_backend_num_floats(b);
    float *dlogp = calloc((size_t)r->B * T, sizeof(float)), *g = malloc(sizeof(float) * nf);
    for (int bb = 0; bb < r->B; bb++)
        memcpy(dlogp + bb * T, r->coef + bb * (T - 1), sizeof(float) * (T - 1));
    qd_backend_zero_grad(b);
    ck_assert_msg(qd_backend_backward(b, dlogp) == QD_OK, "%s", qd_last_error());
    ck_assert_int_eq(qd_backend_get_grads(b, g, nf), QD_OK);
    int np;
    const qd_param_info *p = qd_backend_params(b, &np);
    double worst = 0;
    for (int i = 0; i < np; i++) {
        char name[128];
        int64_t n;
        snprintf(name, sizeof name, "grad.%s", p[i].name);
        float *want = ref_tensor(f, name, QD_ST_F32, &n);
        ck_assert_int_eq(n, p[i].rows * p[i].cols);
        double e = rel_err(g + p[i].offset, want, (size_t)n);
        ck_assert_msg(e <= REL_TOL, "%s: relative error %.3g", name, e);
        worst = fmax(worst, e);
        free(want);
    }
    free(dlogp);
    free(g);
    return worst;
}

static void check_fixture(const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/reference.safetensors", fixture_dir(name));
    qd_safetensors *f;
    ck_assert_msg(qd_safetensors_open(&f, path) == QD_OK, "%s", qd_last_error());
    qd_model_config cfg;
    ck_assert_int_eq(qd_checkpoint_read_config(fixture_dir(name), &cfg), QD_OK);
    reference r;
    read_reference(f, &r, cfg.vocab_size);
    qd_backend *b = open_fixture(name, 1);
    float *logp = malloc(sizeof(float) * (size_t)r.B * r.T);
    double e_logits, e_logp;
    check_forward(b, &r, logp, &e_logits, &e_logp);
    ck_assert_msg(e_logits <= REL_TOL, "%s: logits relative error %.3g", name, e_logits);
    ck_assert_msg(e_logp <= REL_TOL, "%s: logprobs relative error %.3g", name, e_logp);
    check_router(b, f, &r, name);
    double e_grad = check_gradients(b, f, &r);
    fprintf(stderr, "models: %-26s logits %.2e  logprobs %.2e  grads %.2e (max relative error)\n", name,
            e_logits, e_logp, e_grad);
    free(logp);
    qd_backend_free(b);
    free_reference(&r);
    qd_safetensors_close(f);
}

START_TEST(test_transformers_reference) { check_fixture(fixtures[_i]); }
END_TEST

Suite *suite_models(void)
{
    Suite *s = suite_create("models");
    TCase *tc = tcase_create("reference");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_transformers_reference, 0, NFIX);
    suite_add_tcase(s, tc);
    return s;
}
