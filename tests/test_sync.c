/* Check suite "sync": the weight sync from one backend instance to another
 * (qd_backend_sync_from) gives, device to device and through the host, the
 * bits of set_weights(get_weights) in every recipe, the RAC channels picked
 * from the rollout's own statistics; the memory plan of an instance equals
 * the bytes its driver allocates (the tiny model, every recipe and role), and
 * a workload that cannot fit is refused at init, and by quads rl before its
 * run directory exists. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/suites.h"
#include "backends/backend.h"
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
 * generate, the master weights and the RAC state, as bytes. */
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
    ck_assert_int_eq(qd_backend_get_weights(b, o->w, qd_backend_num_floats(b)), QD_OK);
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
    ck_assert_msg(memcmp(a->w, b->w, sizeof(float) * nf) == 0, "%s: master weights differ", what);
    ck_assert_msg(a->rac_bytes == b->rac_bytes && memcmp(a->rac, b->rac, a->rac_bytes) == 0, "%s: RAC state", what);
    ck_assert_msg(memcmp(a->logp, b->logp, sizeof a->logp) == 0, "%s: forward log-probs differ", what);
    ck_assert_msg(memcmp(a->logits, b->logits, sizeof a->logits) == 0, "%s: logits differ", what);
    ck_assert_msg(memcmp(a->gtok, b->gtok, sizeof a->gtok) == 0, "%s: generated tokens differ", what);
    ck_assert_msg(memcmp(a->glogp, b->glogp, sizeof a->glogp) == 0, "%s: generate log-probs differ", what);
}

/* Three rollouts that gathered the same RAC statistics take the trained
 * weights: through the host by hand (the reference), by sync_from device to
 * device, and by sync_from from another kind (the fallback). All equal. A
 * rollout that gathered nothing picks other RAC channels: the pick is the
 * rollout's own statistics'. */
static void check_sync(qd_recipe r)
{
    qd_model_config c = tiny_cfg();
    int V = c.vocab_size, rac = r == QD_RECIPE_NVFP4_RAC || r == QD_RECIPE_QUADS || r == QD_RECIPE_QUADS_REPLAY;
    qd_backend *tr = make(&c, r, QD_ROLE_TRAINER), *ref = make(&c, r, QD_ROLE_ROLLOUT);
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
    ck_assert_uint_eq(m.plan.bytes[QD_MEM_MASTER], nb);
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
    ck_assert_uint_eq(m.peak.bytes[QD_MEM_MASTER], sizeof(float) * qd_backend_num_floats(b));
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
    tcase_add_loop_test(tc, test_plan_matches_allocations, 0, QD_RECIPE_COUNT);
    tcase_add_test(tc, test_plan_without_workload);
    tcase_add_test(tc, test_plan_refused);
    tcase_add_test(tc, test_rl_plan_refused);
    suite_add_tcase(s, tc);
    return s;
}
