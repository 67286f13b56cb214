/* Check suite "sync": the weight sync from one backend instance to another
 * (qd_backend_sync_from) gives, device to device and through the host, the
 * bits of set_weights(get_weights) in every recipe, the RAC channels picked
 * from the rollout's own statistics; the memory plan of an instance equals
 * the bytes its driver allocates (the tiny model, every recipe and role), and
 * a workload that cannot fit is refused at init, and by quads rl before its
 * run directory exists. A lean rollout (no float32 master) computes the bits
 * of one that keeps its master, in every recipe, and refuses what needs the
 * master by name; the 48-layer Qwen3-30B-A3B shape fits one H200 as a rollout
 * (the plan-only entry point). The W4A4 codes made a shape at a time at a
 * sync give the bytes of the per-tensor path, and so do diagnostics' weight
 * errors measured a shape at a time (every recipe). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/suites.h"
#include "backends/backend.h"
#include "bench/bench_a3b.h"
#include "backends/ops.h"
#include "models/checkpoint.h"
#include "quant/splitmix64.h"

static qd_model_config tiny_cfg(void)
{
    qd_model_config c;
    ck_assert_int_eq(qd_checkpoint_read_config(qd_test_path("models/tiny"), &c), QD_OK);
    return c;
}

static qd_backend_options options(qd_recipe r, qd_role role)
{
    return (qd_backend_options){.recipe = r, .role = role, .rac_ratio = 0.25, .num_threads = 1, .diagnostics = 1};
}

static qd_backend *make(const qd_model_config *c, qd_recipe r, qd_role role)
{
    qd_backend_options o = options(r, role);
    qd_backend *b = qd_backend_cpu_init(c, &o);
    ck_assert_msg(b != NULL, "init: %s", qd_last_error());
    return b;
}

/* A rollout that keeps its float32 master weights (the layout before lean
 * rollouts): the reference a lean one must equal bit for bit. */
static qd_backend *make_keep(const qd_model_config *c, qd_recipe r)
{
    qd_backend_options o = options(r, QD_ROLE_ROLLOUT);
    o.keep_master = 1;
    qd_backend *b = qd_backend_cpu_init(c, &o);
    ck_assert_msg(b != NULL, "init: %s", qd_last_error());
    return b;
}

/* A CPU instance over a copy of the CPU's ops table: another kind of backend
 * to the dispatcher, so a sync to or from it goes through the host. */
static qd_ops other_ops;

static qd_backend *make_other(const qd_model_config *c, qd_recipe r, qd_role role)
{
    qd_backend_options o = options(r, role);
    other_ops = *qd_cpu_ops();
    qd_backend *b = qd_model_backend_new(c, &o, &other_ops, qd_cpu_dev_new(1), free);
    ck_assert_msg(b != NULL, "init: %s", qd_last_error());
    return b;
}

/* The tiny model's weights (models/tiny/model.safetensors). */
static float *tiny_weights(qd_backend *b)
{
    int np;
    const qd_param_info *pi = qd_backend_params(b, &np);
    float *w = malloc(sizeof(float) * qd_backend_num_floats(b));
    ck_assert_ptr_nonnull(w);
    ck_assert_int_eq(qd_checkpoint_load(qd_test_path("models/tiny"), pi, np, w), QD_OK);
    return w;
}

static void set_weights(qd_backend *b, const float *w)
{
    ck_assert_msg(qd_backend_set_weights(b, w, qd_backend_num_floats(b)) == QD_OK, "%s", qd_last_error());
}

/* B sequences of T random tokens (all full), vocabulary V. */
static int32_t *random_tokens(int B, int T, int V, uint64_t seed)
{
    int32_t *t = malloc(sizeof(int32_t) * (size_t)B * T);
    ck_assert_ptr_nonnull(t);
    for (int i = 0; i < B * T; i++)
        t[i] = (int32_t)(qd_splitmix64_unit(&seed) * V);
    return t;
}

/* One AdamW step of the trainer on a random batch, so its weights move away
 * from the rollouts'. */
static void train_once(qd_backend *tr, int V)
{
    enum { B = 2, T = 9 };
    int32_t *tok = random_tokens(B, T, V, 11), len[B] = {T, 6};
    float logp[B * T], dlogp[B * T];
    for (int i = 0; i < B * T; i++)
        dlogp[i] = (i % 3 ? 0.5f : -1.0f) / (B * T);
    qd_batch bt = {.B = B, .T = T, .tokens = tok, .lengths = len, .temperature = 1.0f};
    ck_assert_int_eq(qd_backend_forward(tr, &bt, logp, NULL), QD_OK);
    ck_assert_int_eq(qd_backend_backward(tr, dlogp), QD_OK);
    qd_adamw o = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f, .grad_clip = 1.0f};
    ck_assert_int_eq(qd_backend_optimizer_step(tr, &o, 1, NULL), QD_OK);
    free(tok);
}

enum { GB = 3, GP = 5, GM = 6 };

/* A rollout's generate (rac_stats: gather the RAC statistics) into tok, logp. */
static void generate(qd_backend *b, int V, int rac_stats, int32_t *tok, float *logp)
{
    int32_t *prompt = random_tokens(GB, GP, V, 23), plen[GB] = {5, 3, 4}, len[GB];
    uint64_t sid[GB] = {4, 9, 1};
    qd_generate_request rq = {.B = GB, .Tp = GP, .prompt = prompt, .prompt_len = plen, .seq_id = sid, .seed = 7,
                              .max_new_tokens = GM, .temperature = 1.0f, .top_p = 1.0f, .rac_stats = rac_stats};
    qd_generate_result res = {.tokens = tok, .logp = logp, .lengths = len};
    ck_assert_msg(qd_backend_generate(b, &rq, &res) == QD_OK, "generate: %s", qd_last_error());
    free(prompt);
}

/* What a rollout computes after a sync: forward log-probs and logits, a
 * generate, the master weights (NULL where a lean rollout refuses them,
 * naming its role) and the RAC state, as bytes. */
typedef struct {
    float logp[2 * 8], logits[2 * 8 * 272], glogp[GB * GM], *w;
    int32_t gtok[GB * GM];
    char *rac;
    size_t rac_bytes;
} outputs;

static void outputs_of(qd_backend *b, int V, outputs *o)
{
    ck_assert_int_le(V, 272);
    int32_t *tok = random_tokens(2, 8, V, 31), len[2] = {8, 5};
    qd_batch bt = {.B = 2, .T = 8, .tokens = tok, .lengths = len, .temperature = 1.0f};
    memset(o, 0, sizeof *o);
    o->rac_bytes = qd_backend_rac_state_size(b);
    o->rac = malloc(o->rac_bytes + 1);
    o->w = malloc(sizeof(float) * qd_backend_num_floats(b));
    ck_assert(o->rac && o->w);
    ck_assert_int_eq(qd_backend_get_rac_state(b, o->rac, o->rac_bytes), QD_OK);
    qd_status st = qd_backend_get_weights(b, o->w, qd_backend_num_floats(b));
    if (st == QD_ERR_UNSUPPORTED) {
        ck_assert_msg(strstr(qd_last_error(), "rollout role") != NULL, "%s", qd_last_error());
        free(o->w);
        o->w = NULL;
    } else {
        ck_assert_int_eq(st, QD_OK);
    }
    ck_assert_int_eq(qd_backend_forward(b, &bt, o->logp, o->logits), QD_OK);
    generate(b, V, 0, o->gtok, o->glogp);
    free(tok);
}

static void outputs_free(outputs *o)
{
    free(o->rac);
    free(o->w);
}

static void assert_same(const outputs *a, const outputs *b, size_t nf, const char *what)
{
    ck_assert_msg(!a->w || !b->w || memcmp(a->w, b->w, sizeof(float) * nf) == 0, "%s: master weights differ", what);
    ck_assert_msg(a->rac_bytes == b->rac_bytes && memcmp(a->rac, b->rac, a->rac_bytes) == 0, "%s: RAC state", what);
    ck_assert_msg(memcmp(a->logp, b->logp, sizeof a->logp) == 0, "%s: forward log-probs differ", what);
    ck_assert_msg(memcmp(a->logits, b->logits, sizeof a->logits) == 0, "%s: logits differ", what);
    ck_assert_msg(memcmp(a->gtok, b->gtok, sizeof a->gtok) == 0, "%s: generated tokens differ", what);
    ck_assert_msg(memcmp(a->glogp, b->glogp, sizeof a->glogp) == 0, "%s: generate log-probs differ", what);
}

/* Three rollouts that gathered the same RAC statistics take the trained
 * weights: through the host by hand (the reference, one that keeps its
 * master weights), by sync_from device to device, and by sync_from from
 * another kind (the fallback), both lean. All equal. A
 * rollout that gathered nothing picks other RAC channels: the pick is the
 * rollout's own statistics'. */
static void check_sync(qd_recipe r)
{
    qd_model_config c = tiny_cfg();
    int V = c.vocab_size, rac = r == QD_RECIPE_NVFP4_RAC || r == QD_RECIPE_QUADS || r == QD_RECIPE_QUADS_REPLAY;
    qd_backend *tr = make(&c, r, QD_ROLE_TRAINER), *ref = make_keep(&c, r);
    qd_backend *dev = make(&c, r, QD_ROLE_ROLLOUT), *host = make_other(&c, r, QD_ROLE_ROLLOUT);
    qd_backend *fresh = make(&c, r, QD_ROLE_ROLLOUT);
    size_t nf = qd_backend_num_floats(tr);
    float *w0 = tiny_weights(tr), *w = malloc(sizeof(float) * nf), glogp[GB * GM];
    int32_t gtok[GB * GM];
    qd_backend *rollouts[4] = {ref, dev, host, fresh};
    for (int i = 0; i < 4; i++)
        set_weights(rollouts[i], w0);
    set_weights(tr, w0);
    train_once(tr, V);
    for (int i = 0; i < 3; i++)
        generate(rollouts[i], V, 1, gtok, glogp);
    ck_assert_int_eq(qd_backend_get_weights(tr, w, nf), QD_OK);
    ck_assert(memcmp(w, w0, sizeof(float) * nf) != 0);
    set_weights(ref, w);
    int direct = -1;
    ck_assert_msg(qd_backend_sync_from(dev, tr, &direct) == QD_OK, "%s", qd_last_error());
    ck_assert_int_eq(direct, 1);
    ck_assert_msg(qd_backend_sync_from(host, tr, &direct) == QD_OK, "%s", qd_last_error());
    ck_assert_int_eq(direct, 0);
    ck_assert_int_eq(qd_backend_sync_from(fresh, tr, &direct), QD_OK);
    outputs a, b, h, f;
    outputs_of(ref, V, &a);
    outputs_of(dev, V, &b);
    outputs_of(host, V, &h);
    outputs_of(fresh, V, &f);
    assert_same(&a, &b, nf, "device to device");
    assert_same(&a, &h, nf, "through the host");
    ck_assert(memcmp(a.w, w, sizeof(float) * nf) == 0);
    if (rac) /* the same weights, other channels: no statistics gathered */
        ck_assert_msg(a.rac_bytes > 0 && memcmp(a.rac, f.rac, a.rac_bytes) != 0, "RAC picked without statistics");
    else
        assert_same(&a, &f, nf, "no RAC: statistics play no part");
    outputs_free(&a), outputs_free(&b), outputs_free(&h), outputs_free(&f);
    free(w0), free(w);
    qd_backend_free(tr);
    for (int i = 0; i < 4; i++)
        qd_backend_free(rollouts[i]);
}

START_TEST(test_sync_from_recipes)
{
    check_sync((qd_recipe)_i);
}
END_TEST

/* The CPU's ops with nvfp4_quantize_weights counting its calls and their
 * largest group, or removed (the driver then quantizes tensor by tensor). */
static qd_ops grouped_ops, per_tensor_ops;
static int grouped_calls, grouped_max;

static qd_status counting_quantize_weights(void *dev, qd_nvfp4 *const *q, const float *const *x,
                                           const int64_t *const *ch, int count, int N, int K, int64_t n)
{
    grouped_calls++;
    grouped_max = count > grouped_max ? count : grouped_max;
    return qd_cpu_ops()->nvfp4_quantize_weights(dev, q, x, ch, count, N, K, n);
}

static qd_backend *make_on(const qd_ops *ops, const qd_model_config *c, qd_recipe r, qd_role role)
{
    qd_backend_options o = options(r, role);
    qd_backend *b = qd_model_backend_new(c, &o, ops, qd_cpu_dev_new(1), free);
    ck_assert_msg(b != NULL, "init: %s", qd_last_error());
    return b;
}

/* A lean rollout synced from its trainer (device to device) with the W4A4
 * codes a shape at a time gives the bytes of the per-tensor path (the ops
 * without nvfp4_quantize_weights): forward log-probs and logits, a
 * generate, the RAC state (channels picked from statistics gathered first).
 * Where the recipe has W4A4 codes the grouped op ran with every expert of
 * a projection in one call. */
static void check_grouped(qd_recipe r)
{
    qd_model_config c = tiny_cfg();
    int V = c.vocab_size;
    grouped_ops = *qd_cpu_ops();
    grouped_ops.nvfp4_quantize_weights = counting_quantize_weights;
    per_tensor_ops = *qd_cpu_ops();
    per_tensor_ops.nvfp4_quantize_weights = NULL;
    const qd_ops *ops[2] = {&grouped_ops, &per_tensor_ops};
    outputs out[2];
    float glogp[GB * GM];
    int32_t gtok[GB * GM];
    grouped_calls = grouped_max = 0;
    for (int k = 0; k < 2; k++) {
        qd_backend *tr = make_on(ops[k], &c, r, QD_ROLE_TRAINER), *ro = make_on(ops[k], &c, r, QD_ROLE_ROLLOUT);
        float *w0 = tiny_weights(tr);
        set_weights(tr, w0);
        set_weights(ro, w0);
        generate(ro, V, 1, gtok, glogp);
        train_once(tr, V);
        int direct = -1;
        ck_assert_msg(qd_backend_sync_from(ro, tr, &direct) == QD_OK, "%s", qd_last_error());
        ck_assert_int_eq(direct, 1);
        outputs_of(ro, V, &out[k]);
        free(w0);
        qd_backend_free(tr);
        qd_backend_free(ro);
    }
    assert_same(&out[0], &out[1], 0, qd_recipe_name(r));
    qd_linear_mode m = qd_recipe_linear_mode(r, QD_ROLE_ROLLOUT);
    if (m == QD_LINEAR_W4A4 || m == QD_LINEAR_W4A4_RAC) {
        ck_assert_int_gt(grouped_calls, 0);
        ck_assert_int_ge(grouped_max, c.num_experts);
    }
    outputs_free(&out[0]), outputs_free(&out[1]);
}

START_TEST(test_sync_grouped_bits)
{
    check_grouped((qd_recipe)_i);
}
END_TEST

/* Diagnostics' weight errors of a rollout synced from its trainer (device to
 * device) a shape at a time, where its linears have no W4A4 codes (bf16, fp8:
 * measure_uncoded quantizes a projection's experts into scratch and measures
 * them in one call) or from their codes (the W4A4 recipes), against the ops
 * without diag_add (every linear measured alone, its sums on the host): the
 * same bytes, after two syncs (each sync's errors from zero). The grouped
 * calls took every expert of a projection at once. */
static void assert_same_diag(qd_backend *a, qd_backend *b, const char *what);
static qd_ops hostdiag_ops, sqerr_count_ops;
static int sqerr_calls, sqerr_max;

static qd_status counting_sqerr(void *dev, double *e, const float *const *x, const float *const *xh,
                                const qd_nvfp4 *const *q, int count, int N, int K)
{
    sqerr_calls++;
    sqerr_max = count > sqerr_max ? count : sqerr_max;
    return qd_cpu_ops()->sqerr_weights(dev, e, x, xh, q, count, N, K);
}

static void check_diag_grouped(qd_recipe r)
{
    qd_model_config c = tiny_cfg();
    int V = c.vocab_size;
    sqerr_count_ops = *qd_cpu_ops();
    sqerr_count_ops.sqerr_weights = counting_sqerr;
    hostdiag_ops = *qd_cpu_ops();
    hostdiag_ops.diag_add = NULL;
    const qd_ops *ops[2] = {&sqerr_count_ops, &hostdiag_ops};
    qd_backend *tr[2], *ro[2];
    float *w0 = NULL;
    for (int k = 0; k < 2; k++) {
        /* with a workload, so the plan bounds the grouped scratch */
        qd_backend_options o = options(r, QD_ROLE_TRAINER);
        o.workload = (qd_workload){.fwd_B = 2, .fwd_T = 8, .train = 1};
        tr[k] = qd_model_backend_new(&c, &o, ops[k], qd_cpu_dev_new(1), free);
        o = options(r, QD_ROLE_ROLLOUT);
        o.workload = (qd_workload){.fwd_B = 2, .fwd_T = 8, .gen_B = GB, .gen_Tp = GP, .gen_M = GM};
        ro[k] = qd_model_backend_new(&c, &o, ops[k], qd_cpu_dev_new(1), free);
        ck_assert_msg(tr[k] && ro[k], "init: %s", qd_last_error());
        if (!w0)
            w0 = tiny_weights(tr[0]);
        set_weights(tr[k], w0);
    }
    sqerr_calls = sqerr_max = 0;
    int32_t *tok = random_tokens(2, 8, V, 31), len[2] = {8, 5};
    qd_batch bt = {.B = 2, .T = 8, .tokens = tok, .lengths = len, .temperature = 1.0f};
    float logp[2][2 * 8];
    int measured = 0, calls = 0, most = 0;
    for (int s = 0; s < 2; s++) {
        for (int k = 0; k < 2; k++) {
            if (s)
                train_once(tr[k], V);
            int direct = -1, before = sqerr_calls;
            sqerr_max = k ? sqerr_max : 0; /* the rollout's sync alone (the trainer's syncs call it too) */
            ck_assert_msg(qd_backend_sync_from(ro[k], tr[k], &direct) == QD_OK, "%s", qd_last_error());
            ck_assert_int_eq(direct, 1);
            if (!k)
                calls += sqerr_calls - before, most = sqerr_max > most ? sqerr_max : most;
            ck_assert_msg(qd_backend_forward(ro[k], &bt, logp[k], NULL) == QD_OK, "%s", qd_last_error());
        }
        ck_assert(memcmp(logp[0], logp[1], sizeof logp[0]) == 0);
        char what[64];
        snprintf(what, sizeof what, "%s rollout, sync %d", qd_recipe_name(r), s);
        assert_same_diag(ro[0], ro[1], what);
        qd_diagnostics d;
        ck_assert_int_eq(qd_backend_diagnostics(ro[0], &d), QD_OK);
        int wm = 0;
        for (int i = 0; i < d.num_linear; i++)
            wm += d.weight_err[i] > 0;
        ck_assert_msg(wm > 0, "%s: no weight measured", what);
        measured = wm;
    }
    /* grouped: fewer calls than weights measured, some of several weights (the
     * tiny model's chunks: as many weights as the plan's S_DIAG holds, 2) */
    ck_assert_msg(calls > 0 && calls < 2 * measured && most >= 2,
                  "%s: %d grouped calls for %d weights, at most %d a call", qd_recipe_name(r), calls, 2 * measured,
                  most);
    free(tok), free(w0);
    for (int k = 0; k < 2; k++)
        qd_backend_free(tr[k]), qd_backend_free(ro[k]);
}

START_TEST(test_sync_diag_grouped)
{
    check_diag_grouped((qd_recipe)_i);
}
END_TEST

/* Another model is refused naming both, and nothing changes. */
START_TEST(test_sync_from_other_model)
{
    qd_model_config c = tiny_cfg(), c2 = c;
    c2.vocab_size = c.vocab_size + 16;
    qd_backend *a = make(&c, QD_RECIPE_QUADS, QD_ROLE_ROLLOUT), *b = make(&c2, QD_RECIPE_QUADS, QD_ROLE_TRAINER);
    int direct = -1;
    ck_assert_int_eq(qd_backend_sync_from(a, b, &direct), QD_ERR_SHAPE);
    ck_assert_int_eq(direct, 0);
    ck_assert_msg(strstr(qd_last_error(), "models differ") != NULL, "%s", qd_last_error());
    qd_backend_free(a);
    qd_backend_free(b);
}
END_TEST

/* ---- lean rollouts */

/* Diagnostics of the last call, compared byte for byte. */
static void assert_same_diag(qd_backend *a, qd_backend *b, const char *what)
{
    qd_diagnostics da, db;
    ck_assert_msg(qd_backend_diagnostics(a, &da) == QD_OK, "%s", qd_last_error());
    ck_assert_msg(qd_backend_diagnostics(b, &db) == QD_OK, "%s", qd_last_error());
    ck_assert_int_eq(da.num_linear, db.num_linear);
    ck_assert_int_eq(da.num_tokens, db.num_tokens);
    size_t nl = sizeof(double) * (size_t)da.num_linear;
    ck_assert_msg(memcmp(da.weight_err, db.weight_err, nl) == 0, "%s: weight errors differ", what);
    ck_assert_msg(memcmp(da.act_err, db.act_err, nl) == 0, "%s: activation errors differ", what);
    ck_assert_msg(memcmp(da.act_norm, db.act_norm, nl) == 0, "%s: activation norms differ", what);
    ck_assert_msg(memcmp(da.router_topk, db.router_topk, sizeof(int32_t) * (size_t)da.num_moe_layers *
                         da.num_tokens * da.top_k) == 0, "%s: router choices differ", what);
}

/* A lean rollout and one that keeps its master take the tiny model's
 * weights, gather RAC statistics in a generate, sync again (RAC picks from
 * them): forward log-probs and logits, a generate's tokens and log-probs,
 * the RAC state and the diagnostics are the same bytes. Where the trainer
 * runs the rollout's products (fp32, bf16) the trainer's are the same too. */
static void check_lean(qd_recipe r)
{
    qd_model_config c = tiny_cfg();
    int V = c.vocab_size;
    qd_backend *keep = make_keep(&c, r), *lean = make(&c, r, QD_ROLE_ROLLOUT), *tr = make(&c, r, QD_ROLE_TRAINER);
    size_t nf = qd_backend_num_floats(keep);
    float *w = tiny_weights(keep), glogp[GB * GM];
    int32_t gtok[GB * GM];
    qd_backend *all[3] = {keep, lean, tr};
    for (int i = 0; i < 3; i++) {
        set_weights(all[i], w);
        generate(all[i], V, 1, gtok, glogp);
        set_weights(all[i], w);
    }
    outputs a, b, t;
    outputs_of(keep, V, &a);
    outputs_of(lean, V, &b);
    ck_assert_msg(r == QD_RECIPE_FP32 || b.w == NULL, "a lean rollout handed out master weights");
    assert_same(&a, &b, nf, "lean rollout");
    assert_same_diag(keep, lean, "lean rollout");
    if (qd_recipe_linear_mode(r, QD_ROLE_TRAINER) == qd_recipe_linear_mode(r, QD_ROLE_ROLLOUT)) {
        outputs_of(tr, V, &t);
        assert_same(&a, &t, nf, "trainer");
        assert_same_diag(keep, tr, "trainer");
        outputs_free(&t);
    }
    outputs_free(&a), outputs_free(&b);
    free(w);
    for (int i = 0; i < 3; i++)
        qd_backend_free(all[i]);
}

START_TEST(test_lean_rollout_bits)
{
    check_lean((qd_recipe)_i);
}
END_TEST

/* What needs the master weights is refused naming the role; a RAC state
 * installed (set_rac_state) waits for the next sync, which builds the
 * copies with its sets (no pick), as in an instance that keeps its master. */
START_TEST(test_lean_refusals)
{
    qd_model_config c = tiny_cfg();
    int V = c.vocab_size;
    qd_backend *lean = make(&c, QD_RECIPE_QUADS, QD_ROLE_ROLLOUT), *keep = make_keep(&c, QD_RECIPE_QUADS);
    size_t nf = qd_backend_num_floats(lean);
    float *w = tiny_weights(lean), *g = calloc(nf, sizeof(float)), glogp[GB * GM], gn;
    int32_t gtok[GB * GM];
    set_weights(lean, w);
    ck_assert_int_eq(qd_backend_get_weights(lean, g, nf), QD_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(qd_last_error(), "get_weights") && strstr(qd_last_error(), "rollout role"), "%s",
                  qd_last_error());
    int32_t *tok = random_tokens(1, 6, V, 3), len[1] = {6};
    float logp[6];
    qd_batch bt = {.B = 1, .T = 6, .tokens = tok, .lengths = len};
    ck_assert_int_eq(qd_backend_forward(lean, &bt, logp, NULL), QD_OK);
    ck_assert_int_eq(qd_backend_backward(lean, logp), QD_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(qd_last_error(), "backward") && strstr(qd_last_error(), "rollout role"), "%s",
                  qd_last_error());
    qd_adamw o = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    ck_assert_int_eq(qd_backend_optimizer_step(lean, &o, 1, &gn), QD_ERR_UNSUPPORTED);
    ck_assert_int_eq(qd_backend_set_grads(lean, g, nf), QD_ERR_UNSUPPORTED);
    /* a state saved after one generate's statistics, installed into both */
    set_weights(keep, w);
    generate(keep, V, 1, gtok, glogp);
    set_weights(keep, w);
    size_t rb = qd_backend_rac_state_size(keep);
    char *blob = malloc(rb);
    ck_assert_int_eq(qd_backend_get_rac_state(keep, blob, rb), QD_OK);
    ck_assert_int_eq(qd_backend_set_rac_state(lean, blob, rb), QD_OK);
    ck_assert_int_eq(qd_backend_forward(lean, &bt, logp, NULL), QD_ERR_ARG);
    ck_assert_msg(strstr(qd_last_error(), "next weight sync"), "%s", qd_last_error());
    ck_assert_int_eq(qd_backend_set_rac_state(keep, blob, rb), QD_OK);
    set_weights(lean, w);
    set_weights(keep, w);
    outputs a, b;
    outputs_of(keep, V, &a);
    outputs_of(lean, V, &b);
    ck_assert(memcmp(a.rac, blob, rb) == 0); /* kept: channels and statistics */
    assert_same(&a, &b, nf, "RAC state installed");
    outputs_free(&a), outputs_free(&b);
    free(blob), free(tok), free(w), free(g);
    qd_backend_free(lean);
    qd_backend_free(keep);
}
END_TEST

/* A fill of the tiny model's weights, tensor by tensor; bad_tensor >= 0
 * writes a NaN into that tensor. */
typedef struct {
    const float *w;
    const qd_param_info *info;
    int bad_tensor, calls;
} tiny_fill;

static qd_status fill_tiny(void *user, int t, float *dst, size_t n)
{
    tiny_fill *f = user;
    ck_assert_uint_eq(n, (size_t)(f->info[t].rows * f->info[t].cols));
    memcpy(dst, f->w + f->info[t].offset, sizeof(float) * n);
    if (t == f->bad_tensor)
        dst[n / 2] = NAN;
    f->calls++;
    return QD_OK;
}

/* set_weights_fill gives set_weights' bits (a lean rollout, one that keeps
 * its master, a trainer: quads), asking for each tensor once; a non-finite
 * value is refused naming the tensor. */
START_TEST(test_set_weights_fill)
{
    qd_model_config c = tiny_cfg();
    int V = c.vocab_size, np;
    for (int k = 0; k < 3; k++) {
        qd_backend *a = k == 0 ? make(&c, QD_RECIPE_QUADS, QD_ROLE_ROLLOUT)
                        : k == 1 ? make_keep(&c, QD_RECIPE_QUADS) : make(&c, QD_RECIPE_QUADS, QD_ROLE_TRAINER);
        qd_backend *b = k == 0 ? make(&c, QD_RECIPE_QUADS, QD_ROLE_ROLLOUT)
                        : k == 1 ? make_keep(&c, QD_RECIPE_QUADS) : make(&c, QD_RECIPE_QUADS, QD_ROLE_TRAINER);
        size_t nf = qd_backend_num_floats(a);
        float *w = tiny_weights(a);
        tiny_fill f = {.w = w, .info = qd_backend_params(b, &np), .bad_tensor = -1};
        set_weights(a, w);
        ck_assert_msg(qd_backend_set_weights_fill(b, fill_tiny, &f) == QD_OK, "%s", qd_last_error());
        ck_assert_int_eq(f.calls, np);
        outputs x, y;
        outputs_of(a, V, &x);
        outputs_of(b, V, &y);
        assert_same(&x, &y, nf, "set_weights_fill");
        f.bad_tensor = np / 2;
        ck_assert_int_eq(qd_backend_set_weights_fill(b, fill_tiny, &f), QD_ERR_NONFINITE);
        ck_assert_msg(strstr(qd_last_error(), f.info[np / 2].name) != NULL, "%s", qd_last_error());
        outputs_free(&x), outputs_free(&y);
        free(w);
        qd_backend_free(a);
        qd_backend_free(b);
    }
}
END_TEST

/* The claim (issue 12): Qwen3-30B-A3B's shape with all 48 layers, as
 * a rollout instance in the nvfp4 and quads recipes (RAC at the default
 * ratio 0.25), generating 8192 tokens after prompts of 128 for a batch of 64
 * with a float32 KV cache, fits one H200 (139 GiB) with a margin of 6 GiB
 * for what the plan does not count (the CUDA context and libraries, the CUDA
 * ops' own scratch, allocator slack). The breakdown is printed. */
START_TEST(test_plan_a3b_48_fits_h200)
{
    const size_t gib = (size_t)1 << 30, limit = 139 * gib, margin = 6 * gib;
    qd_model_config c;
    qd_bench_a3b_config(&c, 48);
    const qd_recipe rs[2] = {QD_RECIPE_NVFP4, QD_RECIPE_QUADS};
    for (int i = 0; i < 2; i++) {
        qd_backend_options o = {.recipe = rs[i], .role = QD_ROLE_ROLLOUT, .rac_ratio = 0.25,
                                .workload = {.gen_B = 64, .gen_Tp = 128, .gen_M = 8192}};
        qd_mem_plan p;
        ck_assert_msg(qd_backend_plan(&c, &o, &p) == QD_OK, "%s", qd_last_error());
        char b[32];
        qd_format_bytes(p.total, b, sizeof b);
        printf("a3b 48 layers, %s rollout, B 64, prompt 128, 8192 new tokens: %s\n", qd_recipe_name(rs[i]), b);
        for (int k = 0; k < QD_MEM_COUNT; k++) {
            qd_format_bytes(p.bytes[k], b, sizeof b);
            printf("  %-18s %s\n", qd_mem_kind_name(k), b);
        }
        ck_assert_uint_eq(p.bytes[QD_MEM_MASTER], 0);
        ck_assert_msg(p.total <= limit - margin, "%s: %zu bytes planned", qd_recipe_name(rs[i]), p.total);
        /* the trainer's layout (a float32 master and working copy) would not */
        o.keep_master = 1;
        ck_assert_int_eq(qd_backend_plan(&c, &o, &p), QD_OK);
        ck_assert(p.total > limit);
    }
}
END_TEST

/* ---- the memory plan */

/* Runs exactly the workload's largest calls: a forward of fwd_B full
 * sequences (backward and AdamW when train) and a generate of gen_B full
 * prompts for gen_M tokens with no stop token. */
static void run_workload(qd_backend *b, const qd_workload *w, int V)
{
    int B = w->fwd_B, T = w->fwd_T;
    int32_t *tok = random_tokens(B, T, V, 5), *len = malloc(sizeof(int32_t) * B);
    float *logp = malloc(sizeof(float) * B * T);
    for (int i = 0; i < B; i++)
        len[i] = T;
    qd_batch bt = {.B = B, .T = T, .tokens = tok, .lengths = len, .temperature = 1.0f, .rac_stats = 1};
    ck_assert_msg(qd_backend_forward(b, &bt, logp, NULL) == QD_OK, "%s", qd_last_error());
    if (w->train) {
        for (int i = 0; i < B * T; i++)
            logp[i] = 1e-3f;
        ck_assert_int_eq(qd_backend_backward(b, logp), QD_OK);
        qd_adamw o = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
        ck_assert_int_eq(qd_backend_optimizer_step(b, &o, 1, NULL), QD_OK);
    }
    int G = w->gen_B, M = w->gen_M;
    int32_t *prompt = random_tokens(G, w->gen_Tp, V, 6), *plen = malloc(sizeof(int32_t) * G);
    int32_t *out = malloc(sizeof(int32_t) * G * M), *olen = malloc(sizeof(int32_t) * G);
    uint64_t *sid = malloc(sizeof(uint64_t) * G);
    float *olp = malloc(sizeof(float) * G * M);
    for (int i = 0; i < G; i++)
        plen[i] = w->gen_Tp, sid[i] = (uint64_t)i;
    qd_generate_request rq = {.B = G, .Tp = w->gen_Tp, .prompt = prompt, .prompt_len = plen, .seq_id = sid,
                              .seed = 3, .max_new_tokens = M, .temperature = 1.0f, .top_p = 1.0f, .rac_stats = 1};
    qd_generate_result res = {.tokens = out, .logp = olp, .lengths = olen};
    ck_assert_msg(qd_backend_generate(b, &rq, &res) == QD_OK, "%s", qd_last_error());
    for (int i = 0; i < G; i++)
        ck_assert_int_eq(olen[i], M);
    free(tok), free(len), free(logp), free(prompt), free(plen), free(out), free(olen), free(sid), free(olp);
}

/* Plan = what the driver allocated at most, kind by kind. */
static void check_plan_exact(qd_recipe r, qd_role role)
{
    qd_model_config c = tiny_cfg();
    qd_backend_options o = options(r, role);
    o.workload = (qd_workload){.fwd_B = 3, .fwd_T = 11, .gen_B = 4, .gen_Tp = 6, .gen_M = 5,
                               .train = role == QD_ROLE_TRAINER};
    qd_backend *b = qd_backend_cpu_init(&c, &o);
    ck_assert_msg(b != NULL, "%s", qd_last_error());
    float *w = tiny_weights(b);
    set_weights(b, w);
    run_workload(b, &o.workload, c.vocab_size);
    qd_memory m;
    ck_assert_int_eq(qd_backend_memory(b, &m), QD_OK);
    size_t sum = 0, nb = sizeof(float) * qd_backend_num_floats(b);
    /* quads-replay's trainer gets its RAC columns with the rollout's channel sets
     * (set_rac_state, which this workload never calls): planned at the default
     * width (weights and the activation codes), so the plan is an upper bound there */
    int upper = r == QD_RECIPE_QUADS_REPLAY && role == QD_ROLE_TRAINER;
    for (int k = 0; k < QD_MEM_COUNT; k++) {
        int ok = upper && (k == QD_MEM_QUANT || k == QD_MEM_SCRATCH) ? m.plan.bytes[k] >= m.peak.bytes[k] : m.plan.bytes[k] == m.peak.bytes[k];
        ck_assert_msg(ok, "%s %s: %s planned %zu bytes, allocated %zu",
                      qd_recipe_name(r), role == QD_ROLE_ROLLOUT ? "rollout" : "trainer", qd_mem_kind_name(k),
                      m.plan.bytes[k], m.peak.bytes[k]);
        sum += m.plan.bytes[k];
    }
    ck_assert_uint_eq(m.plan.total, sum);
    if (upper)
        ck_assert(m.peak.total <= sum);
    else
        ck_assert_uint_eq(m.peak.total, sum);
    /* a rollout keeps no master (lean) but under fp32, whose working copy it is */
    int lean = role == QD_ROLE_ROLLOUT && r != QD_RECIPE_FP32;
    ck_assert_uint_eq(m.plan.bytes[QD_MEM_MASTER], lean ? 0 : nb);
    qd_linear_mode qm = qd_recipe_linear_mode(r, role);
    if (lean && (qm == QD_LINEAR_FP8 || qm == QD_LINEAR_W4A4 || qm == QD_LINEAR_W4A4_RAC))
        ck_assert_uint_lt(m.plan.bytes[QD_MEM_WORKING], nb / 2); /* the quantized linears' floats dropped */
    qd_mem_plan p; /* the plan-only entry point: the same plan, nothing made */
    ck_assert_msg(qd_backend_plan(&c, &o, &p) == QD_OK, "%s", qd_last_error());
    for (int k = 0; k < QD_MEM_COUNT; k++)
        ck_assert_msg(p.bytes[k] == m.plan.bytes[k], "%s: qd_backend_plan %zu bytes, the instance's %zu",
                      qd_mem_kind_name(k), p.bytes[k], m.plan.bytes[k]);
    ck_assert_uint_eq(p.total, m.plan.total);
    ck_assert_uint_eq(m.plan.bytes[QD_MEM_ADAM], role == QD_ROLE_TRAINER ? 2 * nb : 0);
    ck_assert_uint_eq(m.plan.bytes[QD_MEM_KV], 2 * sizeof(float) * c.num_hidden_layers * 4 * (6 + 5) *
                                                   c.num_key_value_heads * c.head_dim);
    ck_assert(m.plan.bytes[QD_MEM_ACTS] > 0 && m.plan.bytes[QD_MEM_SCRATCH] > 0);
    ck_assert(m.free_at_init > 0 && m.device_total >= m.free_at_init);
    free(w);
    qd_backend_free(b);
}

START_TEST(test_plan_matches_allocations)
{
    check_plan_exact((qd_recipe)_i, QD_ROLE_ROLLOUT);
    check_plan_exact((qd_recipe)_i, QD_ROLE_TRAINER);
}
END_TEST

/* No workload: no plan, but the bytes are still counted. */
START_TEST(test_plan_without_workload)
{
    qd_model_config c = tiny_cfg();
    qd_backend *b = make(&c, QD_RECIPE_QUADS, QD_ROLE_ROLLOUT);
    qd_memory m;
    ck_assert_int_eq(qd_backend_memory(b, &m), QD_OK);
    ck_assert_uint_eq(m.plan.total, 0);
    ck_assert_uint_eq(m.peak.bytes[QD_MEM_MASTER], 0); /* lean: the working floats and the codes only */
    ck_assert(m.peak.bytes[QD_MEM_WORKING] > 0 &&
              m.peak.bytes[QD_MEM_WORKING] < sizeof(float) * qd_backend_num_floats(b));
    ck_assert(m.peak.bytes[QD_MEM_QUANT] > 0);
    ck_assert_uint_eq(m.peak.bytes[QD_MEM_KV], 0);
    qd_backend_free(b);
}
END_TEST

/* An absurd generate is refused at init, naming the plan, the bytes free and
 * the largest kinds; so is one that fits only without the memory other
 * instances planned, and counts past the driver's int. */
START_TEST(test_plan_refused)
{
    qd_model_config c = tiny_cfg();
    qd_backend_options o = options(QD_RECIPE_QUADS, QD_ROLE_ROLLOUT);
    o.workload = (qd_workload){.gen_B = 1 << 20, .gen_Tp = 500, .gen_M = 12};
    ck_assert_ptr_null(qd_backend_cpu_init(&c, &o));
    const char *e = qd_last_error();
    ck_assert_msg(strstr(e, "memory plan needs") && strstr(e, " free of ") && strstr(e, "the largest: activations") &&
                  strstr(e, "KV cache") && strstr(e, "rollout role"), "%s", e);
    o.workload = (qd_workload){.fwd_B = 2, .fwd_T = 8};
    qd_backend *b = qd_backend_cpu_init(&c, &o);
    ck_assert_ptr_nonnull(b);
    qd_backend_free(b);
    o.mem_reserved = (size_t)1 << 62;
    ck_assert_ptr_null(qd_backend_cpu_init(&c, &o));
    ck_assert_msg(strstr(qd_last_error(), "planned by the other instances"), "%s", qd_last_error());
    o.mem_reserved = 0;
    o.workload = (qd_workload){.gen_B = 1 << 20, .gen_Tp = 2048, .gen_M = 1};
    ck_assert_ptr_null(qd_backend_cpu_init(&c, &o));
    ck_assert_msg(strstr(qd_last_error(), "workload out of range"), "%s", qd_last_error());
}
END_TEST

/* quads rl with a generation batch no machine here holds: exit 1 with the
 * plan's message before the run directory is made. */
START_TEST(test_rl_plan_refused)
{
    char dir[256], args[1024], out[8192];
    qd_test_mkdtemp(dir, sizeof dir, "plan");
    snprintf(args, sizeof args, "rl --quiet --set run.dir=%s/run --set rollout.prompts_per_step=1024 "
             "--set rollout.group_size=4096", dir);
    int rc = qd_test_run_quads(args, out, sizeof out);
    ck_assert_msg(rc == 1, "exit %d: %s", rc, out);
    ck_assert_msg(strstr(out, "memory plan needs") && strstr(out, "rollout.group_size"), "%s", out);
    ck_assert_int_eq(qd_test_dir_entries(dir), 0);
    qd_test_rm_tree(dir);
}
END_TEST

Suite *suite_sync(void)
{
    Suite *s = suite_create("sync");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_sync_from_recipes, 0, QD_RECIPE_COUNT);
    tcase_add_test(tc, test_sync_from_other_model);
    tcase_add_loop_test(tc, test_sync_grouped_bits, 0, QD_RECIPE_COUNT);
    tcase_add_loop_test(tc, test_sync_diag_grouped, 0, QD_RECIPE_COUNT);
    tcase_add_loop_test(tc, test_plan_matches_allocations, 0, QD_RECIPE_COUNT);
    tcase_add_test(tc, test_plan_without_workload);
    tcase_add_loop_test(tc, test_lean_rollout_bits, 0, QD_RECIPE_COUNT);
    tcase_add_test(tc, test_lean_refusals);
    tcase_add_test(tc, test_set_weights_fill);
    tcase_add_test(tc, test_plan_a3b_48_fits_h200);
    tcase_add_test(tc, test_plan_refused);
    tcase_add_test(tc, test_rl_plan_refused);
    suite_add_tcase(s, tc);
    return s;
}
