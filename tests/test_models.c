/* Check suite "models": Hugging Face checkpoints end to end.
 *
 * - The five transformers fixtures (tests/fixtures/hf_models/, made by
 *   tests/ref/qwen3moe_reference.py): our fp32 CPU forward against
 *   transformers' float32 logits and log-probs, the router's top-k choices,
 *   and the gradients of sum(coef * logprobs) against PyTorch autograd.
 * - qd_checkpoint_save -> qd_checkpoint_load round trips (F32 bit-exact,
 *   BF16 = round-to-nearest-even of the master weights).
 * - Malformed checkpoints refused with the file, tensor and field named.
 * - The quads forward and quads generate programs ($QD_BUILDDIR/quads).
 * - quads eval --model: the report, determinism, independence of --batch and
 *   --threads, the samples equal to quads generate's (orchestrator/generation.h:
 *   problem i, sample k is stream i*K + k), --outputs replayed to the same report. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
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
    qd_batch batch = {.B = r->B, .T = r->T, .tokens = r->ids, .lengths = r->lengths, .temperature = 1.0f};
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
    /* the file itself instead of the folder */
    char file[128];
    float *again = calloc(nf, sizeof(float));
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    ck_assert_int_eq(qd_checkpoint_load(file, p, np, again), QD_OK);
    ck_assert(!memcmp(again, got, nf * sizeof(float)));
    free(again);
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
    const char *base;     /* the fixture (default BASE) */
    int f16;              /* every tensor written as F16 (the compiler's _Float16 rounding) */
    long long experts;    /* config.json's num_local_experts, when not 0 */
} variant;

static const char *base_of(const variant *v) { return v->base ? v->base : BASE; }

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
    if (v->f16) {
        _Float16 *h = malloc(sizeof *h * (size_t)t->numel);
        for (int64_t i = 0; i < t->numel; i++)
            h[i] = (_Float16)copy[i];
        free(copy);
        copy = (float *)h;
        dt = QD_ST_F16;
    }
    ck_assert_int_eq(qd_safetensors_writer_add_steal(w, t->name, dt, t->ndim, shape, copy), QD_OK);
}

/* Writes the base fixture's tensors (changed as v says) into dir: one file or shards. */
static void write_variant(const char *dir, const variant *v)
{
    char path[256];
    qd_safetensors *f;
    snprintf(path, sizeof path, "%s/model.safetensors", fixture_dir(base_of(v)));
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
    char config[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(config, sizeof config, "%s/config.json", fixture_dir(base_of(v)));
    copy_file(config, path);
    if (v->experts) {
        json_t *c = json_load_file(path, 0, NULL);
        ck_assert_int_eq(json_object_set_new(c, "num_local_experts", json_integer(v->experts)), 0);
        ck_assert_int_eq(json_dump_file(c, path, 0), 0);
        json_decref(c);
    }
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
        qd_backend *ref = open_fixture(base_of(v), 0);
        float *a = backend_weights(b), *r = backend_weights(ref);
        for (size_t i = 0; v->f16 && i < qd_backend_num_floats(b); i++)
            r[i] = (float)(_Float16)r[i];
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
    check_variant(&(variant){.base = "qwen3moe_mha_tied_nonorm", .extra = "lm_head.weight"},
                  (const char *[]){"lm_head.weight", "unexpected", NULL});
    check_variant(&(variant){.nan = UP}, (const char *[]){"model.safetensors", UP, "element 0", "finite", NULL});
    /* in range alone, but 3 x 715827883 expert tensors overflowed the parameter table's int counts
     * (a heap overflow in backends/layout.c; quads forward segfaulted) */
    check_variant(&(variant){.experts = 715827883}, (const char *[]){"config.json", "num_local_experts", NULL});
    /* accepted: a rotary buffer, and two shards with an index */
    check_variant(&(variant){.extra = "model.layers.0.self_attn.rotary_emb.inv_freq"}, (const char *[]){NULL});
    check_variant(&(variant){.shards = 2}, (const char *[]){NULL});
    check_variant(&(variant){.f16 = 1}, (const char *[]){NULL});
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

/* ---- the quads forward and generate programs */

/* Runs "$QD_BUILDDIR/quads ARGS" with stdout to out_path and stderr to err_path; the exit status. */
static int run_quads(const char *args, const char *out_path, const char *err_path)
{
    const char *bd = getenv("QD_BUILDDIR");
    char cmd[8192];
    /* passive: spinning OpenMP workers crawl on a loaded machine */
    snprintf(cmd, sizeof cmd, "OMP_WAIT_POLICY=passive '%s/quads' %s >'%s' 2>'%s'", bd ? bd : ".", args,
             out_path, err_path);
    int rc = system(cmd);
    ck_assert_msg(WIFEXITED(rc), "%s: did not exit", cmd);
    return WEXITSTATUS(rc);
}

static char *slurp(const char *path, size_t *len)
{
    char *text;
    size_t n;
    ck_assert_int_eq(qd_read_file(path, &text, &n), QD_OK);
    if (len)
        *len = n;
    return text;
}

static void assert_file_has(const char *path, const char *word)
{
    char *text = slurp(path, NULL);
    ck_assert_msg(strstr(text, word), "'%s' not in %s: %s", word, path, text);
    free(text);
}

START_TEST(test_cli_forward)
{
    static const int32_t ids[] = {5, 17, 3, 60, 1, 44, 44, 9, 0, 63};
    enum { T = 10 };
    char dir[64], out[128], err[128], dump[128], args[2048];
    qd_test_mkdtemp(dir, sizeof dir, "fwd");
    snprintf(out, sizeof out, "%s/out.json", dir);
    snprintf(err, sizeof err, "%s/err.txt", dir);
    snprintf(dump, sizeof dump, "%s/logits.bin", dir);
    const char *model = fixture_dir(BASE);
    snprintf(args, sizeof args, "forward --model '%s' --ids 5,17,3,60,1,44,44,9,0,63 --precision %s "
             "--backend cpu --threads 1 --dump-logits '%s'", model, "bf16", dump);
    ck_assert_int_eq(run_quads(args, out, err), 0);

    /* the library: the same checkpoint under bf16, rollout role */
    qd_backend_options o = {.recipe = QD_RECIPE_BF16, .role = QD_ROLE_ROLLOUT, .rac_ratio = 0.1, .num_threads = 1};
    qd_backend *b = qd_checkpoint_open_backend(model, "cpu", &o);
    ck_assert_ptr_nonnull(b);
    int32_t len = T;
    float logp[T], logits[T * 64];
    qd_batch batch = {.B = 1, .T = T, .tokens = ids, .lengths = &len, .temperature = 1.0f};
    ck_assert_int_eq(qd_backend_forward(b, &batch, logp, logits), QD_OK);
    size_t n;
    char *bytes = slurp(dump, &n);
    ck_assert_uint_eq(n, sizeof logits);
    ck_assert_msg(!memcmp(bytes, logits, sizeof logits), "dumped logits differ from the library's");
    free(bytes);

    json_t *j = json_load_file(out, 0, NULL), *jl = json_object_get(j, "logprobs");
    ck_assert_ptr_nonnull(j);
    ck_assert_str_eq(json_string_value(json_object_get(j, "precision")), "bf16");
    ck_assert_uint_eq(json_array_size(jl), T - 1);
    for (int t = 0; t < T - 1; t++) /* printed with 9 digits: the float comes back exactly */
        ck_assert_float_eq((float)json_real_value(json_array_get(jl, (size_t)t)), logp[t]);
    json_decref(j);
    qd_backend_free(b);

    /* errors: exit 1 with the reason, 2 on usage */
    snprintf(args, sizeof args, "forward --model '%s' --ids 1,64", model);
    ck_assert_int_eq(run_quads(args, out, err), 1);
    assert_file_has(err, "id 64 out of range [0, 64)");
    snprintf(args, sizeof args, "forward --model '%s' --ids 1,x", model);
    ck_assert_int_eq(run_quads(args, out, err), 1);
    assert_file_has(err, "--ids: element 1");
    snprintf(args, sizeof args, "forward --model '%s/none' --ids 1", dir);
    ck_assert_int_eq(run_quads(args, out, err), 1);
    assert_file_has(err, "none/config.json");
    snprintf(args, sizeof args, "forward --model '%s' --ids 1 --precision fp3", model);
    ck_assert_int_eq(run_quads(args, out, err), 2);
    assert_file_has(err, "fp3");
    qd_test_rm_tree(dir);
}
END_TEST

/* quads ablate on the shipped tiny model: one row for all layers and one per
 * layer, each variant's gap finite and ordered (max >= mean >= 0), the
 * all-layer gaps of activation-only and weight-only quantization non-zero;
 * usage errors exit 2 naming the option, a missing model 1. */
START_TEST(test_cli_ablate)
{
    char dir[64], out[128], err[128], js[128], model[4096], args[8192];
    qd_test_mkdtemp(dir, sizeof dir, "abl");
    snprintf(out, sizeof out, "%s/out.md", dir);
    snprintf(err, sizeof err, "%s/err.txt", dir);
    snprintf(js, sizeof js, "%s/ablate.json", dir);
    snprintf(model, sizeof model, "%s", qd_test_path("models/tiny"));
    snprintf(args, sizeof args, "ablate --model '%s' --problems 8 --samples 2 --backend cpu --threads 1 --out '%s'",
             model, js);
    ck_assert_int_eq(run_quads(args, out, err), 0);
    assert_file_has(out, "| layers | W16A4 mean");
    assert_file_has(out, "| all |");
    json_t *j = json_load_file(js, 0, NULL), *rows = json_object_get(j, "rows");
    ck_assert_ptr_nonnull(j);
    ck_assert_int_gt(json_integer_value(json_object_get(j, "tokens")), 0);
    ck_assert_uint_eq(json_array_size(rows), 3);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(rows, 0), "layer")), "all");
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(rows, 2), "layer")), 1);
    static const char *const vars[] = {"nvfp4-w16a4", "nvfp4-w4a16", "nvfp4"};
    for (size_t r = 0; r < 3; r++)
        for (int v = 0; v < 3; v++) {
            const json_t *g = json_object_get(json_array_get(rows, r), vars[v]);
            double mean = json_real_value(json_object_get(g, "mean_abs"));
            double mx = json_real_value(json_object_get(g, "max_abs")), kl = json_real_value(json_object_get(g, "k3_kl"));
            ck_assert_msg(isfinite(mean) && mean >= 0 && mx >= mean && isfinite(kl) && kl >= 0, "row %zu %s", r,
                          vars[v]);
            if (r == 0 && v < 2)
                ck_assert(mean > 0);
        }
    json_decref(j);
    ck_assert_int_eq(run_quads("ablate --problems 8", out, err), 2);
    snprintf(args, sizeof args, "ablate --model '%s' --samples 0", model);
    ck_assert_int_eq(run_quads(args, out, err), 2);
    assert_file_has(err, "--samples");
    snprintf(args, sizeof args, "ablate --model '%s/none'", dir);
    ck_assert_int_eq(run_quads(args, out, err), 1);
    assert_file_has(err, "none/config.json");
    snprintf(args, sizeof args, "ablate --model '%s' --task arith9", model);
    ck_assert_int_eq(run_quads(args, out, err), 1);
    assert_file_has(err, "arith9");
    qd_test_rm_tree(dir);
}
END_TEST

/* A MoE model wide enough for the qwen2_bpe tokenizer (1507 ids), random
 * weights, saved with qd_checkpoint_save into dir with the tokenizer. */
static void make_chat_model(const char *dir)
{
    qd_model_config c = qd_test_moe_config(1536, 4, 256);
    qd_backend_options o = {.recipe = QD_RECIPE_FP32};
    qd_backend *b = qd_backend_cpu_init(&c, &o);
    ck_assert_ptr_nonnull(b);
    int np;
    const qd_param_info *p = qd_backend_params(b, &np);
    float *w = malloc(sizeof(float) * qd_backend_num_floats(b));
    uint64_t s = 12345;
    for (int i = 0; i < np; i++) {
        int norm = p[i].rows == 1;
        double a = norm ? 0.1 : 2.0 / sqrt((double)p[i].cols);
        for (int64_t k = 0; k < p[i].rows * p[i].cols; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            double u = (double)(s >> 11) * 0x1.0p-53 * 2.0 - 1.0;
            w[p[i].offset + (size_t)k] = (float)((norm ? 1.0 : 0.0) + a * u);
        }
    }
    ck_assert_msg(qd_checkpoint_save(dir, &c, p, np, w, QD_ST_F32) == QD_OK, "%s", qd_last_error());
    char path[256];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    copy_file(qd_test_path("tests/fixtures/tokenizer/qwen2_bpe.json"), path);
    free(w);
    qd_backend_free(b);
}

/* The JSON lines of a generate run: token arrays and texts. */
static int read_samples(const char *path, json_t **lines, int max)
{
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char buf[1 << 16];
    int n = 0;
    while (n < max && fgets(buf, sizeof buf, f)) {
        lines[n] = json_loads(buf, 0, NULL);
        ck_assert_msg(lines[n] != NULL, "%s: line %d is not JSON", path, n + 1);
        n++;
    }
    fclose(f);
    return n;
}

/* The library's own run of the CLI's generation (ChatML prompt, seed 7,
 * stream 0, top-p 0.95) gives the tokens the CLI printed. */
static void check_library_generate(const char *dir, const json_t *toks)
{
    char path[256], *text;
    qd_tokenizer *tok;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    ck_assert_int_eq(qd_tokenizer_load(path, &tok), QD_OK);
    qd_chat_message msg = {"user", "Hello, world! 123"};
    ck_assert_int_eq(qd_tokenizer_chat_format(&qd_chat_chatml, &msg, 1, 1, &text), QD_OK);
    int32_t *ids, out[12], len, stop[2] = {qd_tokenizer_token_id(tok, "<|im_end|>"),
                                             qd_tokenizer_token_id(tok, "<|endoftext|>")};
    size_t n;
    ck_assert_int_eq(qd_tokenizer_encode(tok, text, strlen(text), &ids, &n), QD_OK);
    ck_assert_int_ge(stop[0], 0);
    ck_assert_int_ge(stop[1], 0);
    qd_backend_options o = {.recipe = QD_RECIPE_FP32, .role = QD_ROLE_ROLLOUT, .num_threads = 1};
    qd_backend *b = qd_checkpoint_open_backend(dir, "cpu", &o);
    ck_assert_ptr_nonnull(b);
    int32_t plen = (int32_t)n;
    uint64_t sid = 0;
    float logp[12];
    qd_generate_request rq = {.B = 1, .Tp = (int)n, .prompt = ids, .prompt_len = &plen, .seq_id = &sid, .seed = 7,
                              .max_new_tokens = 12, .temperature = 1.0f, .top_p = 0.95f, .stop = stop,
                              .num_stop = 2};
    qd_generate_result res = {.tokens = out, .logp = logp, .lengths = &len};
    ck_assert_int_eq(qd_backend_generate(b, &rq, &res), QD_OK);
    ck_assert_int_eq(len, (int)json_array_size(toks));
    for (int i = 0; i < len; i++)
        ck_assert_int_eq(out[i], json_integer_value(json_array_get(toks, (size_t)i)));
    qd_backend_free(b);
    qd_tokenizer_free(tok);
    free(ids);
    free(text);
}

/* With generation_config.json naming the sample's token k as eos (k: the
 * first position past 2 whose token did not occur before), the same run
 * stops right after it. */
static void check_eos_stop(const char *dir, const char *common, const json_t *toks)
{
    size_t k = 3, n = json_array_size(toks);
    for (int seen = 1; k < n && seen; k += seen) {
        seen = 0;
        for (size_t i = 0; i < k; i++)
            seen |= json_equal(json_array_get(toks, i), json_array_get(toks, k));
    }
    ck_assert_msg(k < n, "no fresh token to stop at");
    char path[256], out[128], err[128], args[2048], gc[128];
    snprintf(gc, sizeof gc, "{\"eos_token_id\": [999999, %lld]}", json_integer_value(json_array_get(toks, k)));
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    ck_assert_int_eq(qd_atomic_write(path, gc, strlen(gc)), QD_OK);
    snprintf(out, sizeof out, "%s/eos.txt", dir);
    snprintf(err, sizeof err, "%s/eos_err.txt", dir);
    snprintf(args, sizeof args, "generate --model '%s' %s --json --threads 1", dir, common);
    ck_assert_int_eq(run_quads(args, out, err), 0);
    json_t *line[1];
    ck_assert_int_eq(read_samples(out, line, 1), 1);
    const json_t *got = json_object_get(line[0], "tokens");
    ck_assert_uint_eq(json_array_size(got), k + 1);
    for (size_t i = 0; i <= k; i++)
        ck_assert(json_equal(json_array_get(got, i), json_array_get(toks, i)));
    ck_assert_str_eq(json_string_value(json_object_get(line[0], "finish")), "stop");
    json_decref(line[0]);
    ck_assert_int_eq(remove(path), 0);
    /* a generation_config.json that is a FIFO is refused, not waited on; one
     * that is not JSON is refused naming it */
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    ck_assert_int_eq(run_quads(args, out, err), 1);
    char *msg = slurp(err, NULL);
    ck_assert_msg(strstr(msg, "generation_config.json: not a regular file"), "%s", msg);
    free(msg);
    ck_assert_int_eq(remove(path), 0);
    ck_assert_int_eq(qd_atomic_write(path, "{\"eos_token_id\": [1,", 20), QD_OK);
    ck_assert_int_eq(run_quads(args, out, err), 1);
    msg = slurp(err, NULL);
    ck_assert_msg(strstr(msg, "generation_config.json: line 1: invalid JSON"), "%s", msg);
    free(msg);
    ck_assert_int_eq(remove(path), 0);
}

START_TEST(test_cli_generate)
{
    char dir[64], out[128], err[128], args[2048];
    qd_test_mkdtemp(dir, sizeof dir, "gen");
    snprintf(out, sizeof out, "%s/out.txt", dir);
    snprintf(err, sizeof err, "%s/err.txt", dir);
    make_chat_model(dir);
    const char *common = "--prompt 'Hello, world! 123' --chat --seed 7 --temperature 1 --top-p 0.95 "
                         "--max-tokens 12 --backend cpu";
    json_t *one[1], *again[1], *four[4];
    snprintf(args, sizeof args, "generate --model '%s' %s --json --samples 1 --threads 1", dir, common);
    ck_assert_msg(run_quads(args, out, err) == 0, "%s", slurp(err, NULL));
    ck_assert_int_eq(read_samples(out, one, 1), 1);
    ck_assert_int_eq(run_quads(args, out, err), 0);
    ck_assert_int_eq(read_samples(out, again, 1), 1);
    snprintf(args, sizeof args, "generate --model '%s' %s --json --samples 4 --threads 2", dir, common);
    ck_assert_int_eq(run_quads(args, out, err), 0);
    ck_assert_int_eq(read_samples(out, four, 4), 4);

    ck_assert_msg(json_equal(one[0], again[0]), "the same seed gave different samples");
    ck_assert_msg(json_equal(one[0], four[0]), "sample 0 of --samples 4 differs from --samples 1");
    const json_t *toks = json_object_get(one[0], "tokens");
    ck_assert_uint_ge(json_array_size(toks), 1);
    ck_assert(json_is_string(json_object_get(one[0], "text")));
    int differ = 0;
    for (int i = 1; i < 4; i++)
        differ += !json_equal(json_object_get(four[i], "tokens"), toks);
    ck_assert_msg(differ > 0, "all four sampling streams gave the same tokens");
    check_library_generate(dir, toks);
    check_eos_stop(dir, common, toks);

    /* without --json: the text alone, the same as the JSON line's */
    snprintf(args, sizeof args, "generate --model '%s' %s --samples 1 --threads 1", dir, common);
    ck_assert_int_eq(run_quads(args, out, err), 0);
    char *text = slurp(out, NULL), want[4096];
    snprintf(want, sizeof want, "%s\n", json_string_value(json_object_get(one[0], "text")));
    ck_assert_str_eq(text, want);
    free(text);
    for (int i = 0; i < 4; i++)
        json_decref(four[i]);
    json_decref(one[0]);
    json_decref(again[0]);

    /* missing tokenizer: the message suggests --tokenizer */
    char tokpath[128];
    snprintf(tokpath, sizeof tokpath, "%s/tokenizer.json", dir);
    ck_assert_int_eq(remove(tokpath), 0);
    snprintf(args, sizeof args, "generate --model '%s' --prompt hi", dir);
    ck_assert_int_eq(run_quads(args, out, err), 1);
    assert_file_has(err, "--tokenizer FILE");
    snprintf(args, sizeof args, "generate --model '%s' --prompt hi --max-tokens 3 --temperature 0 --tokenizer '%s'",
             dir, qd_test_path("tests/fixtures/tokenizer/qwen2_bpe.json"));
    ck_assert_int_eq(run_quads(args, out, err), 0);
    qd_test_rm_tree(dir);
}
END_TEST

/* ---- quads eval --model */

#define EVAL_PROBLEMS "What is 2 + 3?", "Name a prime number.", "Compute 7 * 6.", "Unused: past --limit."
#define EVAL_SAMPLING "--seed 7 --temperature 1 --top-p 0.95 --max-tokens 8 --backend cpu"

/* The eval's report.json without its timing field. */
static json_t *report_sans_time(const char *dir, const char *sub)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s/report.json", dir, sub);
    json_t *j = json_load_file(path, 0, NULL);
    ck_assert_msg(j != NULL, "%s: not JSON", path);
    ck_assert(json_is_real(json_object_get(j, "seconds")));
    json_object_del(j, "seconds");
    return j;
}

/* A four-problem JSONL benchmark at path. */
static void write_small_bench(const char *path)
{
    static const char *const problems[] = {EVAL_PROBLEMS};
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 4; i++)
        fprintf(f, "{\"problem\": \"%s\", \"answer\": \"%d\"}\n", problems[i], 5 + i);
    ck_assert_int_eq(fclose(f), 0);
}

/* Problem i's K=2 samples in the --outputs lines equal streams 2i and 2i+1
 * of quads generate on the same prompt (the default Qwen math template). */
static void check_eval_matches_generate(const char *dir, json_t *const *lines)
{
    static const char *const problems[] = {EVAL_PROBLEMS};
    char out[128], err[128], args[4096];
    snprintf(out, sizeof out, "%s/gen.txt", dir);
    snprintf(err, sizeof err, "%s/gen_err.txt", dir);
    for (int i = 0; i < 3; i++) {
        snprintf(args, sizeof args, "generate --model '%s' --prompt '%s\nPlease reason step by step, and put your "
                 "final answer within \\boxed{}.' " EVAL_SAMPLING " --json --threads 1 --samples %d",
                 dir, problems[i], 2 * i + 2);
        ck_assert_msg(run_quads(args, out, err) == 0, "%s", slurp(err, NULL));
        json_t *g[6];
        ck_assert_int_eq(read_samples(out, g, 6), 2 * i + 2);
        for (int k = 0; k < 2; k++) {
            const json_t *e = lines[2 * i + k], *s = g[2 * i + k];
            ck_assert_int_eq(json_integer_value(json_object_get(e, "sample")), k);
            ck_assert_str_eq(json_string_value(json_object_get(e, "output")),
                             json_string_value(json_object_get(s, "text")));
            ck_assert_int_eq(json_integer_value(json_object_get(e, "tokens")),
                             (json_int_t)json_array_size(json_object_get(s, "tokens")));
            ck_assert_str_eq(json_string_value(json_object_get(e, "finish")),
                             json_string_value(json_object_get(s, "finish")));
        }
        for (int k = 0; k < 2 * i + 2; k++)
            json_decref(g[k]);
    }
}

/* The report's counts and mean length against the --outputs lines (6 samples). */
static void check_eval_report(const json_t *rep, json_t *const *lines)
{
    const json_t *b = json_array_get(json_object_get(rep, "benchmarks"), 0);
    ck_assert_uint_eq(json_array_size(json_object_get(rep, "benchmarks")), 1);
    ck_assert_int_eq(json_integer_value(json_object_get(b, "problems")), 3);
    ck_assert_int_eq(json_integer_value(json_object_get(b, "samples")), 2);
    ck_assert_str_eq(json_string_value(json_object_get(rep, "precision")), "fp32");
    double tokens = 0;
    int different = 0;
    for (int i = 0; i < 6; i++) {
        json_int_t n = json_integer_value(json_object_get(lines[i], "tokens"));
        ck_assert(n >= 1 && n <= 8);
        tokens += (double)n;
        different += i && !json_equal(json_object_get(lines[i], "output"), json_object_get(lines[0], "output"));
        char id[2] = {(char)('0' + i / 2), 0}; /* the file's records have no id: their index */
        ck_assert_str_eq(json_string_value(json_object_get(lines[i], "id")), id);
    }
    ck_assert_msg(different > 0, "every sample gave the same text");
    ck_assert_double_eq_tol(json_real_value(json_object_get(b, "mean_tokens")), tokens / 6, 1e-12);
    json_int_t right = json_integer_value(json_object_get(b, "correct_samples"));
    ck_assert_double_eq_tol(json_real_value(json_object_get(b, "pass@1")), (double)right / 6, 1e-12);
}

START_TEST(test_cli_eval)
{
    char dir[64], out[128], err[128], args[4096], path[128];
    qd_test_mkdtemp(dir, sizeof dir, "evalgen");
    snprintf(out, sizeof out, "%s/out.txt", dir);
    snprintf(err, sizeof err, "%s/err.txt", dir);
    snprintf(path, sizeof path, "%s/small.jsonl", dir);
    make_chat_model(dir);
    write_small_bench(path);
    /* batches of 2: problem 2 comes alone in a second call */
    snprintf(args, sizeof args, "eval --model '%s' --file '%s' --samples 2 --limit 3 " EVAL_SAMPLING
             " --threads 1 --batch 2 --out '%s/r1' --outputs '%s/o1.jsonl'", dir, path, dir, dir);
    ck_assert_msg(run_quads(args, out, err) == 0, "%s", slurp(err, NULL));
    assert_file_has(out, "small.jsonl        3 problems x 2");
    snprintf(args, sizeof args, "%s/r1/report.md", dir);
    assert_file_has(args, "small.jsonl");
    snprintf(args, sizeof args, "eval --model '%s' --file '%s' --samples 2 --limit 3 " EVAL_SAMPLING
             " --threads 2 --batch 3 --out '%s/r2' --outputs '%s/o2.jsonl'", dir, path, dir, dir);
    ck_assert_msg(run_quads(args, out, err) == 0, "%s", slurp(err, NULL));

    json_t *r1 = report_sans_time(dir, "r1"), *r2 = report_sans_time(dir, "r2"), *lines[7];
    ck_assert_msg(json_equal(r1, r2), "the same seed gave different reports (other --batch, --threads)");
    char o1[128], o2[128];
    snprintf(o1, sizeof o1, "%s/o1.jsonl", dir);
    snprintf(o2, sizeof o2, "%s/o2.jsonl", dir);
    char *t1 = slurp(o1, NULL), *t2 = slurp(o2, NULL);
    ck_assert_str_eq(t1, t2);
    free(t1);
    free(t2);
    ck_assert_int_eq(read_samples(o1, lines, 7), 6);
    check_eval_report(r1, lines);
    check_eval_matches_generate(dir, lines);

    /* the saved outputs replayed give the same report */
    snprintf(args, sizeof args, "eval --model '%s' --precision fp32 --file '%s' --samples 2 --limit 3 "
             "--replay '%s' --out '%s/r3'", dir, path, o1, dir);
    ck_assert_msg(run_quads(args, out, err) == 0, "%s", slurp(err, NULL));
    json_t *r3 = report_sans_time(dir, "r3");
    ck_assert_msg(json_equal(r1, r3), "the replayed --outputs gave another report");
    for (int i = 0; i < 6; i++)
        json_decref(lines[i]);
    json_decref(r1);
    json_decref(r2);
    json_decref(r3);

    /* --chat: the prompt is ChatML-formatted as generate --chat does it */
    snprintf(args, sizeof args, "eval --model '%s' --file '%s' --limit 1 --chat --system 'Be brief.' "
             EVAL_SAMPLING " --threads 1 --out '%s/r6' --outputs '%s/o6.jsonl' --prompt 'Q: {problem}'", dir, path,
             dir, dir);
    ck_assert_msg(run_quads(args, out, err) == 0, "%s", slurp(err, NULL));
    snprintf(o1, sizeof o1, "%s/o6.jsonl", dir);
    ck_assert_int_eq(read_samples(o1, lines, 2), 1);
    snprintf(args, sizeof args, "generate --model '%s' --prompt 'Q: What is 2 + 3?' --chat --system 'Be brief.' "
             EVAL_SAMPLING " --json --threads 1", dir);
    snprintf(o2, sizeof o2, "%s/gen6.jsonl", dir);
    ck_assert_int_eq(run_quads(args, o2, err), 0);
    ck_assert_int_eq(read_samples(o2, lines + 1, 1), 1);
    ck_assert_str_eq(json_string_value(json_object_get(lines[0], "output")),
                     json_string_value(json_object_get(lines[1], "text")));
    json_decref(lines[0]);
    json_decref(lines[1]);

    /* a synthetic task: its own prompt; mixed with a real one, --prompt is needed */
    snprintf(args, sizeof args, "eval --model '%s' --benchmark arith1 --limit 2 --max-tokens 3 --backend cpu "
             "--threads 1 --out '%s/r4'", dir, dir);
    ck_assert_msg(run_quads(args, out, err) == 0, "%s", slurp(err, NULL));
    json_t *r4 = report_sans_time(dir, "r4");
    ck_assert_str_eq(json_string_value(json_object_get(r4, "prompt_template")), "Q: {problem}\nA: ");
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(json_object_get(r4, "benchmarks"), 0),
                                                        "problems")), 2);
    json_decref(r4);
    snprintf(args, sizeof args, "eval --model '%s' --benchmark arith1 --file '%s'", dir, path);
    ck_assert_int_eq(run_quads(args, out, err), 2);
    assert_file_has(err, "give --prompt");

    /* no tokenizer.json: the file is named, with the way out */
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    ck_assert_int_eq(remove(path), 0);
    snprintf(args, sizeof args, "eval --model '%s' --benchmark arith1 --out '%s/r5'", dir, dir);
    ck_assert_int_eq(run_quads(args, out, err), 1);
    assert_file_has(err, "tokenizer.json: No such file or directory (pass --tokenizer FILE)");
    qd_test_rm_tree(dir);
}
END_TEST

/* qd_checkpoint_load converts pieces of the tensors in parallel (issue 16):
 * a BF16 tensor of several pieces (150,000 elements; a piece is 65,536) and an
 * F32 and an F16 tensor load exactly as the serial conversion does, and the
 * first non-finite element in tensor order is the one named, wherever it is. */
START_TEST(test_load_parallel_pieces)
{
    char dir[256], path[512];
    qd_test_mkdtemp(dir, sizeof dir, "load");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    enum { R = 3, C = 50000, N = R * C };
    qd_param_info p[3] = {{"a.weight", R, C, 0}, {"b.weight", 2, 4, N}, {"model.norm.weight", 1, 8, N + 8}};
    uint16_t *a = malloc(N * sizeof *a), h[8];
    float b[8], *out = malloc((N + 16) * sizeof *out);
    for (int i = 0; i < N; i++)
        a[i] = qd_bf16_from_f32((float)((i * 7919) % 1000 - 500) * 1e-3f);
    for (int i = 0; i < 8; i++)
        b[i] = (float)i * 0.25f - 1.0f, h[i] = (uint16_t)(0x3c00 + i); /* F16 1.0, 1 + 2^-10, ... */
    int64_t sa[2] = {R, C}, sb[2] = {2, 4}, sn[1] = {8};
    for (int round = 0; round < 3; round++) {
        if (round == 1)
            a[140000] = 0x7fc0; /* a NaN in the third piece of a */
        if (round == 2)
            b[5] = INFINITY, a[140000] = qd_bf16_from_f32(1.0f), a[7] = 0xff80; /* -Inf early in a */
        qd_safetensors_writer *w;
        ck_assert_int_eq(qd_safetensors_writer_new(&w), QD_OK);
        ck_assert_int_eq(qd_safetensors_writer_add(w, "a.weight", QD_ST_BF16, 2, sa, a), QD_OK);
        ck_assert_int_eq(qd_safetensors_writer_add(w, "b.weight", QD_ST_F32, 2, sb, b), QD_OK);
        ck_assert_int_eq(qd_safetensors_writer_add(w, "model.norm.weight", QD_ST_F16, 1, sn, h), QD_OK);
        ck_assert_int_eq(qd_safetensors_writer_write(w, path), QD_OK);
        qd_safetensors_writer_free(w);
        qd_status st = qd_checkpoint_load(dir, p, 3, out);
        if (round == 0) {
            ck_assert_msg(st == QD_OK, "%s", qd_last_error());
            for (int i = 0; i < N; i++)
                ck_assert_msg(out[i] == qd_bf16_to_f32(a[i]), "element %d", i);
            ck_assert_int_eq(memcmp(out + N, b, sizeof b), 0);
            ck_assert(out[N + 8] == 1.0f && out[N + 9] == 1.0f + 0x1p-10f && out[N + 15] == 1.0f + 7 * 0x1p-10f);
        } else {
            ck_assert_int_eq(st, QD_ERR_NONFINITE);
            ck_assert_ptr_nonnull(strstr(qd_last_error(), round == 1 ? "tensor 'a.weight': element 140000 is not finite"
                                                                     : "tensor 'a.weight': element 7 is not finite"));
            ck_assert_ptr_nonnull(strstr(qd_last_error(), "model.safetensors"));
        }
    }
    free(a), free(out);
    qd_test_rm_tree(dir);
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
    tcase_add_test(tc, test_load_parallel_pieces);
    suite_add_tcase(s, tc);
    tc = tcase_create("cli");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_cli_forward);
    tcase_add_test(tc, test_cli_ablate);
    tcase_add_test(tc, test_cli_generate);
    tcase_add_test(tc, test_cli_eval);
    suite_add_tcase(s, tc);
    return s;
}
