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
#include <jansson.h>
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

/* ---- save and load */

static float *backend_weights(qd_backend *b)
{
    size_t nf = qd_backend_num_floats(b);
    float *w = malloc(sizeof(float) * nf);
    ck_assert_int_eq(qd_backend_get_weights(b, w, nf), QD_OK);
    return w;
}

/* Save in dtype, reload: the weights come back as saved (BF16: rounded), config equal. */
static void check_round_trip(const char *name, qd_st_dtype dtype)
{
    char dir[64];
    qd_test_mkdtemp(dir, sizeof dir, "ckpt");
    qd_backend *b = open_fixture(name, 0);
    qd_model_config cfg, back;
    ck_assert_int_eq(qd_checkpoint_read_config(fixture_dir(name), &cfg), QD_OK);
    int np;
    const qd_param_info *p = qd_backend_params(b, &np);
    size_t nf = qd_backend_num_floats(b);
    float *w = backend_weights(b);
    ck_assert_msg(qd_checkpoint_save(dir, &cfg, p, np, w, dtype) == QD_OK, "%s", qd_last_error());
    ck_assert_int_eq(qd_test_dir_entries(dir), 2); /* config.json, model.safetensors; no temp file */
    ck_assert_int_eq(qd_checkpoint_read_config(dir, &back), QD_OK);
    ck_assert_str_eq(back.torch_dtype, dtype == QD_ST_BF16 ? "bfloat16" : "float32");
    snprintf(back.torch_dtype, sizeof back.torch_dtype, "%s", cfg.torch_dtype);
    ck_assert_msg(!memcmp(&cfg, &back, sizeof cfg), "%s: config.json does not round-trip", name);
    float *got = calloc(nf, sizeof(float));
    ck_assert_msg(qd_checkpoint_load(dir, p, np, got) == QD_OK, "%s", qd_last_error());
    for (size_t i = 0; i < nf; i++) {
        float want = dtype == QD_ST_BF16 ? qd_round_bf16(w[i]) : w[i];
        ck_assert_msg(!memcmp(&got[i], &want, sizeof want), "%s: float %zu: %a != %a", name, i, got[i], want);
    }
    free(got);
    free(w);
    qd_backend_free(b);
    qd_test_rm_tree(dir);
}

START_TEST(test_round_trip_f32) { check_round_trip(fixtures[_i], QD_ST_F32); }
END_TEST

START_TEST(test_round_trip_bf16) { check_round_trip(fixtures[_i], QD_ST_BF16); }
END_TEST

/* ---- malformed checkpoints */

#define BASE "qwen3moe_gqa_untied"

typedef struct {
    const char *skip;     /* tensor left out */
    const char *reshape;  /* tensor written with its two dims swapped */
    const char *as_i32;   /* tensor written as I32 (same bytes) */
    const char *extra;    /* a tensor added ([2] F32) */
    const char *nan;      /* tensor whose first element becomes NaN */
    int shards;           /* 2: written as two shards and an index */
} variant;

static void copy_file(const char *from, const char *to)
{
    char *text;
    size_t len;
    ck_assert_int_eq(qd_read_file(from, &text, &len), QD_OK);
    ck_assert_int_eq(qd_atomic_write(to, text, len), QD_OK);
    free(text);
}

static void add_variant_tensor(qd_safetensors_writer *w, const qd_st_tensor *t, const variant *v)
{
    int64_t shape[QD_ST_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    if (v->reshape && !strcmp(t->name, v->reshape)) {
        shape[0] = t->shape[1];
        shape[1] = t->shape[0];
    }
    qd_st_dtype dt = v->as_i32 && !strcmp(t->name, v->as_i32) ? QD_ST_I32 : t->dtype;
    float *copy = malloc(t->nbytes);
    memcpy(copy, t->data, t->nbytes);
    if (v->nan && !strcmp(t->name, v->nan))
        copy[0] = NAN;
    ck_assert_int_eq(qd_safetensors_writer_add_steal(w, t->name, dt, t->ndim, shape, copy), QD_OK);
}

/* Writes BASE's tensors (changed as v says) into dir/NAME, NAME one file or shards. */
static void write_variant(const char *dir, const variant *v)
{
    char path[256];
    qd_safetensors *f;
    snprintf(path, sizeof path, "%s/model.safetensors", fixture_dir(BASE));
    ck_assert_int_eq(qd_safetensors_open(&f, path), QD_OK);
    size_t n = qd_safetensors_count(f);
    json_t *map = json_object();
    for (int s = 0; s < (v->shards ? v->shards : 1); s++) {
        qd_safetensors_writer *w;
        ck_assert_int_eq(qd_safetensors_writer_new(&w), QD_OK);
        char shard[64];
        snprintf(shard, sizeof shard, v->shards ? "model-%05d-of-%05d.safetensors" : "model.safetensors",
                 s + 1, v->shards);
        for (size_t i = 0; i < n; i++) {
            const qd_st_tensor *t = qd_safetensors_at(f, i);
            if ((v->skip && !strcmp(t->name, v->skip)) || (v->shards && (int)(i % v->shards) != s))
                continue;
            add_variant_tensor(w, t, v);
            json_object_set_new(map, t->name, json_string(shard));
        }
        float two[2] = {1, 2};
        int64_t shape2 = 2;
        if (v->extra && s == 0)
            ck_assert_int_eq(qd_safetensors_writer_add(w, v->extra, QD_ST_F32, 1, &shape2, two), QD_OK);
        snprintf(path, sizeof path, "%s/%s", dir, shard);
        ck_assert_int_eq(qd_safetensors_writer_write(w, path), QD_OK);
        qd_safetensors_writer_free(w);
    }
    if (v->shards) {
        json_t *index = json_pack("{s:{},s:o}", "metadata", "weight_map", map);
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        ck_assert_int_eq(json_dump_file(index, path, 0), 0);
        json_decref(index);
    } else
        json_decref(map);
    qd_safetensors_close(f);
    snprintf(path, sizeof path, "%s/config.json", dir);
    copy_file(qd_test_path("tests/fixtures/hf_models/" BASE "/config.json"), path);
}

/* Opens a backend on the variant: NULL expected when any of the words is given
 * (each must be in the message), the fixture's weights otherwise. */
static void check_variant(const variant *v, const char *const *words)
{
    char dir[64];
    qd_test_mkdtemp(dir, sizeof dir, "ckpt");
    write_variant(dir, v);
    qd_backend *b = qd_checkpoint_open_backend(dir, "cpu", NULL);
    if (!words[0]) {
        ck_assert_msg(b != NULL, "%s", qd_last_error());
        qd_backend *ref = open_fixture(BASE, 0);
        float *a = backend_weights(b), *r = backend_weights(ref);
        ck_assert(!memcmp(a, r, sizeof(float) * qd_backend_num_floats(b)));
        free(a);
        free(r);
        qd_backend_free(ref);
        qd_backend_free(b);
    } else {
        ck_assert_ptr_null(b);
        for (int i = 0; words[i]; i++)
            ck_assert_msg(strstr(qd_last_error(), words[i]), "'%s' not in: %s", words[i], qd_last_error());
    }
    qd_test_rm_tree(dir);
}

#define Q "model.layers.0.self_attn.q_proj.weight"
#define UP "model.layers.1.mlp.experts.3.up_proj.weight"

START_TEST(test_malformed_checkpoints)
{
    check_variant(&(variant){.skip = UP}, (const char *[]){"/tmp/qd_ckpt_", UP, "missing", NULL});
    check_variant(&(variant){.reshape = Q},
                  (const char *[]){"model.safetensors", Q, "shape", "[32, 64]", "expected [64, 32]", NULL});
    check_variant(&(variant){.as_i32 = "model.norm.weight"},
                  (const char *[]){"model.safetensors", "model.norm.weight", "dtype", "I32", NULL});
    check_variant(&(variant){.extra = "model.layers.0.mlp.bogus.weight"},
                  (const char *[]){"model.safetensors", "model.layers.0.mlp.bogus.weight", "unexpected", NULL});
    check_variant(&(variant){.nan = UP}, (const char *[]){"model.safetensors", UP, "element 0", "finite", NULL});
    /* accepted: a rotary buffer, and two shards with an index */
    check_variant(&(variant){.extra = "model.layers.0.self_attn.rotary_emb.inv_freq"}, (const char *[]){NULL});
    check_variant(&(variant){.shards = 2}, (const char *[]){NULL});
    check_variant(&(variant){.shards = 2, .skip = UP}, (const char *[]){UP, "missing", NULL});
}
END_TEST

START_TEST(test_missing_files)
{
    char dir[64], path[128];
    qd_test_mkdtemp(dir, sizeof dir, "ckpt");
    ck_assert_ptr_null(qd_checkpoint_open_backend(dir, "cpu", NULL));
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "config.json"));
    snprintf(path, sizeof path, "%s/config.json", dir);
    copy_file(qd_test_path("tests/fixtures/hf_models/" BASE "/config.json"), path);
    ck_assert_ptr_null(qd_checkpoint_open_backend(dir, "cpu", NULL));
    ck_assert_ptr_nonnull(strstr(qd_last_error(), dir));
    qd_test_rm_tree(dir);
    ck_assert_ptr_null(qd_checkpoint_open_backend("/nonexistent/model", "cpu", NULL));
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "/nonexistent/model/config.json"));
}
END_TEST

static void check_save_refused(const float *w, const qd_param_info *p, int np, qd_model_config *cfg,
                               qd_st_dtype dt, const char *word)
{
    char dir[64];
    qd_test_mkdtemp(dir, sizeof dir, "ckpt");
    ck_assert_int_ne(qd_checkpoint_save(dir, cfg, p, np, w, dt), QD_OK);
    ck_assert_msg(strstr(qd_last_error(), word), "'%s' not in: %s", word, qd_last_error());
    ck_assert_int_eq(qd_test_dir_entries(dir), 0);
    qd_test_rm_tree(dir);
}

START_TEST(test_save_refuses)
{
    qd_backend *b = open_fixture(BASE, 0);
    qd_model_config cfg;
    ck_assert_int_eq(qd_checkpoint_read_config(fixture_dir(BASE), &cfg), QD_OK);
    int np;
    const qd_param_info *p = qd_backend_params(b, &np);
    float *w = backend_weights(b);
    check_save_refused(w, p, np, &cfg, QD_ST_I32, "dtype");
    w[p[3].offset + 5] = INFINITY;
    check_save_refused(w, p, np, &cfg, QD_ST_F32, p[3].name);
    free(w);
    qd_backend_free(b);
}
END_TEST

Suite *suite_models(void)
{
    Suite *s = suite_create("models");
    TCase *tc = tcase_create("reference");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_transformers_reference, 0, NFIX);
    suite_add_tcase(s, tc);
    tc = tcase_create("checkpoint");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_round_trip_f32, 0, NFIX);
    tcase_add_loop_test(tc, test_round_trip_bf16, 0, NFIX);
    tcase_add_test(tc, test_malformed_checkpoints);
    tcase_add_test(tc, test_missing_files);
    tcase_add_test(tc, test_save_refuses);
    suite_add_tcase(s, tc);
    return s;
}
