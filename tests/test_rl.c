/* Suite "rl": the RL loop end to end on a very small random model: every
 * recipe runs and writes finite metrics; a run killed in the middle of a step
 * and resumed equals the uninterrupted run bit for bit (metrics without
 * timings, weights, optimizer and RAC state); a NaN stops the step with a
 * message and no checkpoint of it; config errors through `quads rl`;
 * `quads compare` and the report. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <jansson.h>
#include "tests/suites.h"
#include "backends/backend.h"
#include "benchmarks/sha256.h"
#include "models/checkpoint.h"
#include "orchestrator/ckpt.h"
#include "orchestrator/metrics.h"
#include "orchestrator/rl.h"
#include "orchestrator/sft.h"
#include "orchestrator/task.h"
#include "quant/fileio.h"
#include "orchestrator/dp.h"
#include "tests/dist_ranks.h"
#include "tests/rl_hooks.h"
#include <stdarg.h>

/* snprintf into a path buffer, failing the test on truncation. */
static void pathf(char *buf, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    ck_assert_msg(w >= 0 && (size_t)w < n, "path too long: %s", buf);
}

/* A scratch directory, on tmpfs when there is one: the runs fsync every
 * metrics line and checkpoint file, which a busy disk makes slow. */
static void scratch_dir(char *dir, size_t n)
{
    pathf(dir, n, "/dev/shm/qd_rl_XXXXXX");
    if (!mkdtemp(dir))
        qd_test_mkdtemp(dir, n, "rl");
}

/* A random Qwen3-MoE (2 layers, 4 experts top-2, hidden 32) with the tiny
 * tokenizer in dir/model. Its end-token row of lm_head is scaled up so that
 * completions end at varied lengths: with the overlong penalty the rewards of
 * a group then differ and the updates are not zero. */
static void make_model_positions(const char *dir, int positions)
{
    char p[512];
    pathf(p, sizeof p, "%s/model", dir);
    ck_assert_int_eq(qd_mkdirs(p), QD_OK);
    qd_sft_dims d = {.hidden = 32, .layers = 2, .heads = 2, .kv_heads = 1, .head_dim = 16, .experts = 4,
                     .top_k = 2, .moe_intermediate = 16, .vocab = QD_SFT_TOK_VOCAB};
    qd_model_config cfg;
    ck_assert_int_eq(qd_sft_make_config(&d, &cfg), QD_OK);
    if (positions) /* room for LiveCodeBench's prompts */
        cfg.max_position_embeddings = positions;
    qd_backend_options opt = {.num_threads = 1};
    qd_backend *b = qd_backend_cpu_init(&cfg, &opt);
    ck_assert_ptr_nonnull(b);
    int np;
    const qd_param_info *pi = qd_backend_params(b, &np);
    size_t nf = qd_backend_num_floats(b);
    float *w = malloc(sizeof(float) * nf);
    qd_sft_init_weights(pi, np, 11, w);
    int head = qd_backend_find_param(b, "lm_head.weight");
    ck_assert_int_ge(head, 0);
    char tp[1024];
    pathf(tp, sizeof tp, "%s/tokenizer.json", p);
    ck_assert_int_eq(qd_sft_write_tokenizer(tp), QD_OK);
    qd_tokenizer *tok;
    int32_t end;
    ck_assert_int_eq(qd_tokenizer_load(tp, &tok), QD_OK);
    ck_assert_int_eq(qd_task_end_id(tok, &end), QD_OK);
    qd_tokenizer_free(tok);
    for (int64_t c = 0; c < pi[head].cols; c++)
        w[pi[head].offset + (size_t)end * pi[head].cols + c] *= 5.0f;
    ck_assert_int_eq(qd_checkpoint_save(p, &cfg, pi, np, w, QD_ST_F32), QD_OK);
    free(w);
    qd_backend_free(b);
}

static void make_model(const char *dir) { make_model_positions(dir, 0); }

/* The small config of these tests, run directory dir/name. */
static qd_config *small_config(const char *dir, const char *name, const char *recipe, int steps)
{
    qd_config *c = qd_config_new();
    char v[1024];
    pathf(v, sizeof v, "%s/model", dir);
    ck_assert_int_eq(qd_config_set_str(c, "model.path", v, "test"), QD_OK);
    pathf(v, sizeof v, "%s/%s", dir, name);
    ck_assert_int_eq(qd_config_set_str(c, "run.dir", v, "test"), QD_OK);
    ck_assert_int_eq(qd_config_set_str(c, "rollout.recipe", recipe, "test"), QD_OK);
    pathf(v, sizeof v, "%d", steps);
    ck_assert_int_eq(qd_config_set_str(c, "run.steps", v, "test"), QD_OK);
    static const char *const sets[] = {
        "run.threads=1", "rollout.backend=cpu", "rollout.group_size=4", "rollout.prompts_per_step=2",
        "rollout.max_tokens=6", "algo.overlong_buffer_len=5", "trainer.micro_batch=4", "trainer.lr=3e-3",
        "eval.every=2", "eval.limit=4", "checkpoint.every=2", "checkpoint.keep_last=3", "rac.ratio=0.5"};
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++)
        ck_assert_int_eq(qd_config_set(c, sets[i]), QD_OK);
    return c;
}

static qd_status run(const qd_config *c, const char *resume)
{
    qd_rl_options o = {.resume_dir = resume};
    return qd_rl_run(c, &o, NULL, 0);
}

/* The trainer's first log-prob of step *(int64_t *)ctx becomes NaN. */
static void nan_at_step(void *ctx, int64_t step, int first, float *logp, int n, int M)
{
    (void)n, (void)M;
    if (step == *(const int64_t *)ctx && first == 0)
        logp[0] = NAN;
}

/* The lines of dir/metrics.jsonl as a JSON array, "time" removed. */
static json_t *metrics_without_time(const char *dir)
{
    char p[1024], line[1 << 16];
    pathf(p, sizeof p, "%s/metrics.jsonl", dir);
    FILE *f = fopen(p, "r");
    ck_assert_ptr_nonnull(f);
    json_t *a = json_array();
    while (fgets(line, sizeof line, f)) {
        json_error_t e;
        json_t *o = json_loads(line, 0, &e);
        ck_assert_msg(o != NULL, "%s: %s", p, e.text);
        ck_assert_int_eq(json_object_del(o, "time"), 0);
        json_array_append_new(a, o);
    }
    fclose(f);
    return a;
}

static double num(const json_t *o, const char *a, const char *b)
{
    const json_t *v = json_object_get(o, a);
    if (b)
        v = json_object_get(v, b);
    ck_assert_msg(json_is_number(v), "metric %s%s%s missing or not a number", a, b ? "." : "", b ? b : "");
    return json_number_value(v);
}

static int exists(const char *dir, const char *name)
{
    char p[2048];
    pathf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

static const char *const recipes[] = {"bf16", "fp8", "nvfp4", "nvfp4-aqat", "nvfp4-rac", "quads", "nvfp4-sym-qat",
                                      "nvfp4-replay", "quads-replay"};
enum { NRECIPES = sizeof recipes / sizeof *recipes };

/* Each recipe: 2 steps, every metric present and finite; BF16 on both sides
 * has no gap at all (the rollout's KV-cache log-probs equal the forward's),
 * and neither have nvfp4-replay and quads-replay (their trainers replay the
 * rollout's W4A4 products, RAC channel sets included), while NVFP4 rollouts
 * with other trainers do; the weights moved. */
START_TEST(test_rl_every_recipe)
{
    char dir[256];
    scratch_dir(dir, sizeof dir);
    make_model(dir);
    static const char *const scalars[] = {"reward_mean", "pass1_train", "response_len", "entropy", "clip_frac",
                                          "grad_norm", "lr", "loss"};
    double grad_sum = 0;
    for (size_t r = 0; r < sizeof recipes / sizeof *recipes; r++) {
        qd_config *c = small_config(dir, recipes[r], recipes[r], 2);
        qd_status st = run(c, NULL);
        ck_assert_msg(st == QD_OK, "%s: %s", recipes[r], qd_last_error());
        qd_config_free(c);
        char rd[1024];
        pathf(rd, sizeof rd, "%s/%s", dir, recipes[r]);
        json_t *m = metrics_without_time(rd);
        ck_assert_int_eq(json_array_size(m), 3); /* step 0 (eval) + 2 steps */
        ck_assert(num(json_array_get(m, 0), "eval", "pass1") >= 0);
        ck_assert(num(json_array_get(m, 2), "eval", "pass1") >= 0);
        for (int s = 1; s <= 2; s++) {
            const json_t *o = json_array_get(m, s);
            ck_assert_int_eq(num(o, "step", NULL), s);
            for (size_t k = 0; k < sizeof scalars / sizeof *scalars; k++)
                ck_assert(isfinite(num(o, scalars[k], NULL)));
            static const char *const nested[][2] = {{"gap", "mean_abs"}, {"gap", "max_abs"}, {"gap", "k3_kl"},
                                                    {"quant", "act_err_mean"}, {"quant", "weight_err_mean"},
                                                    {"router", "agree_mean"}};
            for (size_t k = 0; k < sizeof nested / sizeof *nested; k++)
                ck_assert(isfinite(num(o, nested[k][0], nested[k][1])));
            ck_assert_int_eq(json_array_size(json_object_get(json_object_get(o, "quant"), "act_err")), 32);
            ck_assert_int_eq(json_array_size(json_object_get(json_object_get(o, "router"), "agree")), 2);
            grad_sum += num(o, "grad_norm", NULL);
            if (!strcmp(recipes[r], "bf16") || strstr(recipes[r], "-replay")) {
                ck_assert(num(o, "gap", "mean_abs") == 0.0 && num(o, "gap", "max_abs") == 0.0);
                ck_assert(num(o, "gap", "k3_kl") == 0.0);
                ck_assert(num(o, "gap", "tokens") > 0);
                ck_assert(num(o, "router", "agree_mean") == 1.0);
            }
            if (!strcmp(recipes[r], "nvfp4"))
                ck_assert(num(o, "gap", "mean_abs") > 1e-4);
        }
        json_decref(m);
        ck_assert(exists(rd, "step_00000002/model.safetensors"));
        ck_assert(exists(rd, "config.json"));
        char lj[2048];
        pathf(lj, sizeof lj, "%s/layers.json", rd);
        json_t *layers = json_load_file(lj, 0, NULL);
        ck_assert_ptr_nonnull(layers);
        ck_assert_int_eq(json_array_size(json_object_get(layers, "quant")), 32);
        ck_assert_str_eq(json_string_value(json_array_get(json_object_get(layers, "quant"), 0)),
                         "model.layers.0.self_attn.q_proj.weight");
        ck_assert_int_eq(json_array_size(json_object_get(layers, "router")), 2);
        json_decref(layers);
        char t[2048];
        pathf(t, sizeof t, "%s/step_00000002", rd);
        /* config, weights, optimizer, rac, state, tokenizer and their digests */
        ck_assert_int_eq(qd_test_dir_entries(t), 7);
    }
    ck_assert(grad_sum > 0);
    /* the report over the runs */
    const char *runs[NRECIPES];
    char rb[NRECIPES][2048], out[1024];
    for (int i = 0; i < NRECIPES; i++) {
        pathf(rb[i], sizeof rb[i], "%s/%s", dir, recipes[i]);
        runs[i] = rb[i];
    }
    pathf(out, sizeof out, "%s/report", dir);
    ck_assert_int_eq(qd_rl_report(runs, NULL, NRECIPES, out), QD_OK);
    char *md;
    size_t len;
    pathf(rb[0], sizeof rb[0], "%s/report.md", out);
    ck_assert_int_eq(qd_read_file(rb[0], &md, &len), QD_OK);
    ck_assert_ptr_nonnull(strstr(md, "| nvfp4-sym-qat | nvfp4-sym-qat / 1 of 1 |"));
    ck_assert_ptr_nonnull(strstr(md, "| bf16 | bf16 / 1 of 1 |"));
    ck_assert_ptr_nonnull(strstr(md, "| nvfp4-replay | nvfp4-replay / 1 of 1 |"));
    ck_assert_ptr_nonnull(strstr(md, "(seed 1, 2 of 2, ok)"));
    free(md);
    ck_assert(exists(out, "reward.svg") && exists(out, "pass1.svg") && exists(out, "gap.svg"));
    qd_test_rm_tree(dir);
}
END_TEST

/* tests/check_tensorboard.py: RUN/tb/ read back with the tensorboard package
 * equals RUN/metrics.jsonl value for value (and RUN/config.json). Skipped,
 * with the script's note on stderr, where the package is not installed. */
static void check_tensorboard(const char *a, const char *b)
{
    char cmd[4096], out[8192];
    pathf(cmd, sizeof cmd, "python3 %s %s %s 2>&1", qd_test_path("tests/check_tensorboard.py"), a, b);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t k = fread(out, 1, sizeof out - 1, p);
    out[k] = '\0';
    int st = pclose(p);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77) { /* no tensorboard package: say so, pass */
        fprintf(stderr, "%s", out);
        return;
    }
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: %s", cmd, out);
}

/* Kill in the middle of step 4 (checkpoint 2 written, metrics of step 3 too),
 * resume: the metrics (without timings) and the final checkpoint equal the
 * uninterrupted run's byte for byte. sets: extra knobs of both runs. */
static void kill_and_resume(const char *recipe, const char *const *sets, int nsets, json_t **metrics)
{
    char dir[256], a[1024], b[1024];
    scratch_dir(dir, sizeof dir);
    make_model(dir);
    qd_config *ca = small_config(dir, "a", recipe, 5), *cb = small_config(dir, "b", recipe, 5);
    for (int i = 0; i < nsets; i++) {
        ck_assert_int_eq(qd_config_set(ca, sets[i]), QD_OK);
        ck_assert_int_eq(qd_config_set(cb, sets[i]), QD_OK);
    }
    ck_assert_msg(run(ca, NULL) == QD_OK, "%s", qd_last_error());
    /* the killed run is a quads process of its own (libgomp does not survive a fork) */
    char cfgp[1024], args[1200], out[8192];
    pathf(cfgp, sizeof cfgp, "%s/b.json", dir);
    ck_assert_int_eq(qd_config_save(cb, cfgp), QD_OK);
    pathf(args, sizeof args, "rl --quiet --config %s", cfgp);
    setenv("QD_RL_TEST_KILL_STEP", "4", 1);
    ck_assert_int_eq(qd_test_run_rl_hooks(args, out, sizeof out), QD_TEST_KILL_EXIT);
    unsetenv("QD_RL_TEST_KILL_STEP");
    pathf(a, sizeof a, "%s/a", dir);
    pathf(b, sizeof b, "%s/b", dir);
    ck_assert(exists(b, "step_00000002") && !exists(b, "step_00000004"));
    json_t *killed = metrics_without_time(b);
    ck_assert_int_eq(json_array_size(killed), 4); /* steps 0..3: step 3 will be cut */
    json_decref(killed);
    /* a new run into the same directory is refused */
    ck_assert_int_eq(run(cb, NULL), QD_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "--resume"));
    ck_assert_msg(run(cb, b) == QD_OK, "%s", qd_last_error());
    json_t *ma = metrics_without_time(a), *mb = metrics_without_time(b);
    ck_assert_int_eq(json_array_size(ma), 6);
    char *ta = json_dumps(ma, JSON_COMPACT), *tb = json_dumps(mb, JSON_COMPACT);
    ck_assert_msg(strcmp(ta, tb) == 0, "metrics differ after resume");
    free(ta), free(tb);
    json_decref(mb);
    *metrics = ma;
    /* the resumed run's event files: its restart marker drops the killed
     * run's step 3, which it wrote again */
    check_tensorboard(a, b);
    static const char *const files[] = {"model.safetensors", "optimizer.bin", "rac.bin", "state.json"};
    for (int i = 0; i < 4; i++) {
        char fa[2048], fb[2048];
        pathf(fa, sizeof fa, "%s/step_00000005/%s", a, files[i]);
        pathf(fb, sizeof fb, "%s/step_00000005/%s", b, files[i]);
        ck_assert_msg(qd_test_same_file(fa, fb), "%s differs after resume", files[i]);
    }
    /* a resume under another recipe is refused and leaves config.json alone */
    ck_assert_int_eq(qd_config_set(cb, "rollout.recipe=bf16"), QD_OK);
    ck_assert_int_eq(run(cb, b), QD_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "a run keeps its recipe"));
    qd_config *back = qd_config_new();
    pathf(cfgp, sizeof cfgp, "%s/config.json", b);
    ck_assert_int_eq(qd_config_load_file(back, cfgp), QD_OK);
    ck_assert_str_eq(qd_config_knobs(back)->rollout.recipe, recipe);
    qd_config_free(back);
    /* keep_last 2: checkpoint 2 rotated out */
    ck_assert(!exists(a, "step_00000002") && exists(a, "step_00000004"));
    /* the weights did move from the initial model */
    char f0[2048], f5[2048];
    pathf(f0, sizeof f0, "%s/model/model.safetensors", dir);
    pathf(f5, sizeof f5, "%s/step_00000005/model.safetensors", a);
    ck_assert(!qd_test_same_file(f0, f5));
    qd_config_free(ca), qd_config_free(cb);
    qd_test_rm_tree(dir);
}

/* quads; channels re-picked every 3 syncs, so checkpoint 2 holds the RAC
 * errors gathered since step 1's pick and the resume depends on them. */
START_TEST(test_rl_kill_and_resume)
{
    static const char *const sets[] = {"rac.refresh=3", "checkpoint.keep_last=2"};
    json_t *m;
    kill_and_resume("quads", sets, 2, &m);
    ck_assert(num(json_array_get(m, 4), "grad_norm", NULL) > 0);
    json_decref(m);
}
END_TEST

/* quads-replay, channels re-picked at every sync: the resumed trainer takes
 * the checkpoint's channel sets too (else its gap would not be 0 and the
 * metrics would differ from the uninterrupted run's). */
START_TEST(test_rl_kill_and_resume_replay)
{
    static const char *const sets[] = {"rac.refresh=1", "checkpoint.keep_last=2"};
    json_t *m;
    kill_and_resume("quads-replay", sets, 2, &m);
    for (int s = 1; s <= 5; s++)
        ck_assert(num(json_array_get(m, (size_t)s), "gap", "max_abs") == 0.0);
    json_decref(m);
}
END_TEST

/* The general PPO path: two updates a step (the second mini-batch's ratio is
 * not 1), micro-batches that do not divide the batch, dynamic sampling (the
 * data position then depends on the rollouts), masked TIS, a k3 KL to the
 * reference, Dr.GRPO with seq-mean-token-sum. */
START_TEST(test_rl_kill_and_resume_variants)
{
    static const char *const sets[] = {"checkpoint.keep_last=2", "trainer.mini_batches=2", "trainer.micro_batch=3",
                                       "algo.dynamic_sampling=true", "algo.max_gen_batches=3", "algo.tis=masked",
                                       "algo.kl_coef=0.05", "algo.advantage=dr_grpo",
                                       "algo.loss_agg=seq_mean_token_sum"};
    json_t *m;
    kill_and_resume("nvfp4-rac", sets, 9, &m);
    double ratio = 1, kl = 0;
    for (int s = 1; s <= 5; s++) {
        const json_t *o = json_array_get(m, s);
        ratio = fmax(ratio, num(o, "ratio_max", NULL));
        kl = fmax(kl, num(o, "kl", NULL));
        ck_assert_int_le(num(o, "groups_kept", NULL), 2);
        /* one update per mini-batch with a group in it */
        ck_assert(num(o, "optimizer_step", NULL) <= 2 * s && num(o, "data_pos", NULL) >= 2 * s);
    }
    ck_assert(ratio > 1.0 && kl > 0.0);
    json_decref(m);
}
END_TEST

/* The loop learns: with the overlong penalty as the only reward signal (the
 * random model never answers right), GRPO must shorten the completions. A
 * wrong sign anywhere from the advantages to the optimizer makes them longer. */
START_TEST(test_rl_learns_the_reward)
{
    char dir[256], b[1024];
    scratch_dir(dir, sizeof dir);
    make_model(dir);
    qd_config *c = small_config(dir, "l", "quads", 8);
    ck_assert_int_eq(qd_config_set(c, "rollout.group_size=8"), QD_OK);
    ck_assert_int_eq(qd_config_set(c, "trainer.micro_batch=16"), QD_OK);
    ck_assert_int_eq(qd_config_set(c, "eval.every=0"), QD_OK);
    ck_assert_msg(run(c, NULL) == QD_OK, "%s", qd_last_error());
    pathf(b, sizeof b, "%s/l", dir);
    json_t *m = metrics_without_time(b);
    ck_assert_int_eq(json_array_size(m), 8);
    double r1 = num(json_array_get(m, 0), "reward_mean", NULL), r8 = num(json_array_get(m, 7), "reward_mean", NULL);
    double l1 = num(json_array_get(m, 0), "response_len", NULL), l8 = num(json_array_get(m, 7), "response_len", NULL);
    ck_assert_msg(r1 < -0.5 && r8 > r1 + 0.5 && l8 < l1 - 2, "reward %g -> %g, length %g -> %g", r1, r8, l1, l8);
    json_decref(m);
    qd_config_free(c);
    qd_test_rm_tree(dir);
}
END_TEST

/* A NaN in the trainer's log-probs of step 2 stops the run there with a
 * message naming the step and the place; checkpoint 1 stays, none of step 2. */
START_TEST(test_rl_nan_stops)
{
    char dir[256], b[1024];
    scratch_dir(dir, sizeof dir);
    make_model(dir);
    qd_config *c = small_config(dir, "n", "nvfp4", 3);
    ck_assert_int_eq(qd_config_set(c, "checkpoint.every=1"), QD_OK);
    int64_t nan_step = 2;
    qd_rl_hooks h = {.ctx = &nan_step, .trainer_logp = nan_at_step};
    qd_rl_options o = {.hooks = &h};
    ck_assert_int_eq(qd_rl_run(c, &o, NULL, 0), QD_ERR_NONFINITE);
    ck_assert_msg(strstr(qd_last_error(), "step 2: ") != NULL, "%s", qd_last_error());
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "trainer log-prob of sample 0 token 0 is nan"));
    pathf(b, sizeof b, "%s/n", dir);
    ck_assert(exists(b, "step_00000001"));
    ck_assert(!exists(b, "step_00000002") && !exists(b, "step_00000002.tmp"));
    json_t *m = metrics_without_time(b);
    ck_assert_int_eq(json_array_size(m), 2);
    json_decref(m);
    qd_config_free(c);
    qd_test_rm_tree(dir);
}
END_TEST

/* ---- checkpoint integrity (issue 14) */

static const char *const ckpt_files[] = {"config.json", "model.safetensors", "optimizer.bin", "rac.bin",
                                         "state.json", "tokenizer.json"};

/* Rewrites ck/SHA256SUMS for the files as they are now (a tampering that
 * also fixes the digests, so that the loader's range checks are reached). */
static void rehash(const char *ck)
{
    char text[2048] = "", p[1024], hex[65];
    for (int i = 0; i < 6; i++) {
        pathf(p, sizeof p, "%s/%s", ck, ckpt_files[i]);
        ck_assert_int_eq(qd_sha256_file(p, hex), QD_OK);
        snprintf(text + strlen(text), sizeof text - strlen(text), "%s  %s\n", hex, ckpt_files[i]);
    }
    pathf(p, sizeof p, "%s/%s", ck, QD_CKPT_SUMS);
    ck_assert_int_eq(qd_atomic_write(p, text, strlen(text)), QD_OK);
}

static char *read_all(const char *path, size_t *n)
{
    char *t;
    ck_assert_int_eq(qd_read_file(path, &t, n), QD_OK);
    return t;
}

/* Resuming run b from its damaged checkpoint fails with want, a message
 * holding both strings (b2 may be NULL) and not naming wrong (may be NULL). */
static void expect_resume_error(const qd_config *c, const char *b, qd_status want, const char *b1, const char *b2,
                                const char *wrong)
{
    qd_status st = run(c, b);
    ck_assert_msg(st == want, "status %d, not %d: %s", st, want, qd_last_error());
    ck_assert_msg(strstr(qd_last_error(), b1) != NULL, "'%s' not in: %s", b1, qd_last_error());
    ck_assert_msg(!b2 || strstr(qd_last_error(), b2) != NULL, "'%s' not in: %s", b2, qd_last_error());
    ck_assert_msg(!wrong || strstr(qd_last_error(), wrong) == NULL, "'%s' in: %s", wrong, qd_last_error());
}

/* Every checkpoint file carries its sha256 (SHA256SUMS, written last); a
 * flipped bit, a missing digest file, state.json values out of range (a
 * data position near 2^63, an optimizer step of 2^31 - 1) or of another
 * step, and a negative second moment are refused on resume naming the file
 * and the field, and leave the run as it was; a missing run directory says
 * so; a resume with another run.dir stays in and records its directory. */
START_TEST(test_rl_checkpoint_verified)
{
    char dir[256], b[1024], ck[1100], p[1200], sv[1200];
    scratch_dir(dir, sizeof dir);
    make_model(dir);
    qd_config *c = small_config(dir, "b", "quads", 2);
    ck_assert_int_eq(qd_config_set(c, "eval.every=0"), QD_OK);
    ck_assert_msg(run(c, NULL) == QD_OK, "%s", qd_last_error());
    ck_assert_int_eq(qd_config_set(c, "run.steps=3"), QD_OK);
    pathf(b, sizeof b, "%s/b", dir);
    pathf(ck, sizeof ck, "%s/step_00000002", b);
    /* SHA256SUMS lists every file in sha256sum's format */
    size_t n;
    pathf(p, sizeof p, "%s/%s", ck, QD_CKPT_SUMS);
    char *sums = read_all(p, &n), hex[65];
    pathf(sv, sizeof sv, "%s/state.json", ck);
    ck_assert_int_eq(qd_sha256_file(sv, hex), QD_OK);
    pathf(p, sizeof p, "%s  state.json\n", hex);
    ck_assert_ptr_nonnull(strstr(sums, p));
    int lines = 0;
    for (size_t i = 0; i < n; i++)
        lines += sums[i] == '\n';
    ck_assert_int_eq(lines, 6);
    free(sums);
    /* a flipped bit in the weights or in the moments */
    static const char *const flip[] = {"model.safetensors", "optimizer.bin", "rac.bin"};
    for (int i = 0; i < 3; i++) {
        pathf(p, sizeof p, "%s/%s", ck, flip[i]);
        char *t = read_all(p, &n);
        t[n - 1] ^= 1;
        ck_assert_int_eq(qd_atomic_write(p, t, n), QD_OK);
        char want[64];
        pathf(want, sizeof want, "%s: sha256 ", flip[i]);
        expect_resume_error(c, b, QD_ERR_FORMAT, want, "the file changed after it was written", NULL);
        t[n - 1] ^= 1;
        ck_assert_int_eq(qd_atomic_write(p, t, n), QD_OK);
        free(t);
    }
    /* a listed file gone, or a FIFO in its place (read, it would block) */
    pathf(p, sizeof p, "%s/rac.bin", ck);
    pathf(sv, sizeof sv, "%s/rac.bak", dir);
    ck_assert_int_eq(rename(p, sv), 0);
    expect_resume_error(c, b, QD_ERR_FORMAT, "rac.bin: listed in SHA256SUMS but missing", NULL, NULL);
    ck_assert_int_eq(mkfifo(p, 0600), 0);
    expect_resume_error(c, b, QD_ERR_FORMAT, "rac.bin: listed in SHA256SUMS but not a regular file", NULL, NULL);
    ck_assert_int_eq(unlink(p), 0);
    ck_assert_int_eq(rename(sv, p), 0);
    /* no digests at all */
    pathf(p, sizeof p, "%s/%s", ck, QD_CKPT_SUMS);
    pathf(sv, sizeof sv, "%s/sums.bak", dir);
    ck_assert_int_eq(rename(p, sv), 0);
    expect_resume_error(c, b, QD_ERR_FORMAT, "SHA256SUMS: missing", NULL, NULL);
    ck_assert_int_eq(rename(sv, p), 0);
    /* state.json out of range or of another step, digests fixed up */
    pathf(sv, sizeof sv, "%s/state.json", ck);
    char *state = read_all(sv, &n);
    const struct { const char *json, *m1, *m2; } bad[] = {
        {"{\"step\": 2, \"data_pos\": 9223372036854775000, \"optimizer_step\": 2, \"seed\": 1, "
         "\"recipe\": \"quads\"}", "state.json: data_pos: 9223372036854775000 is out of range [0, 281474976710656]",
         NULL},
        {"{\"step\": 2, \"data_pos\": 4, \"optimizer_step\": 2147483647, \"seed\": 1, \"recipe\": \"quads\"}",
         "state.json: optimizer_step: 2147483647 is out of range", NULL},
        {"{\"step\": 7, \"data_pos\": 4, \"optimizer_step\": 2, \"seed\": 1, \"recipe\": \"quads\"}",
         "step_00000002/state.json: step: 7 in a directory named for step 2", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ck_assert_int_eq(qd_atomic_write(sv, bad[i].json, strlen(bad[i].json)), QD_OK);
        rehash(ck);
        expect_resume_error(c, b, QD_ERR_FORMAT, bad[i].m1, bad[i].m2, "rac.bin");
    }
    ck_assert_int_eq(qd_atomic_write(sv, state, n), QD_OK);
    free(state);
    /* a negative second moment: named in optimizer.bin, not at the weight sync */
    pathf(p, sizeof p, "%s/optimizer.bin", ck);
    char *opt = read_all(p, &n);
    float neg = -1.0f, old;
    size_t at = 16 + (n - 16) / 2; /* v[0]: after the magic, the length and m */
    memcpy(&old, opt + at, sizeof old);
    memcpy(opt + at, &neg, sizeof neg);
    ck_assert_int_eq(qd_atomic_write(p, opt, n), QD_OK);
    rehash(ck);
    expect_resume_error(c, b, QD_ERR_NONFINITE, "optimizer.bin: second moment v[0] is -1", NULL, "weight sync");
    memcpy(opt + at, &old, sizeof old);
    ck_assert_int_eq(qd_atomic_write(p, opt, n), QD_OK);
    free(opt);
    rehash(ck);
    /* a missing run directory */
    pathf(p, sizeof p, "%s/none", dir);
    expect_resume_error(c, p, QD_ERR_IO, "none: the run directory is missing", NULL, "JSON");
    /* the failures left the run as it was: metrics of steps 1 and 2 */
    json_t *m = metrics_without_time(b);
    ck_assert_int_eq(json_array_size(m), 2);
    json_decref(m);
    /* --resume b with run.dir elsewhere: the run continues in b and records b */
    pathf(p, sizeof p, "run.dir=%s/elsewhere", dir);
    ck_assert_int_eq(qd_config_set(c, p), QD_OK);
    ck_assert_msg(run(c, b) == QD_OK, "%s", qd_last_error());
    ck_assert(exists(b, "step_00000003") && !exists(dir, "elsewhere"));
    qd_config *back = qd_config_new();
    pathf(p, sizeof p, "%s/config.json", b);
    ck_assert_int_eq(qd_config_load_file(back, p), QD_OK);
    ck_assert_str_eq(qd_config_knobs(back)->run.dir, b);
    qd_config_free(back);
    qd_config_free(c);
    qd_test_rm_tree(dir);
}
END_TEST

/* data.task names a benchmark: quads rl trains on it (here GSM8K from the
 * cache, offline: the fixture is the test split the registry fetches), its
 * problems whose prompts fit data.max_prompt_tokens split into training and
 * eval.limit held-out ones; without the cache it fails saying so. */
START_TEST(test_rl_benchmark_task)
{
    char dir[256], out[1 << 15], args[2048], p[1024], hex[65];
    scratch_dir(dir, sizeof dir);
    make_model(dir);
    pathf(p, sizeof p, "%s/cache/rows/openai/gsm8k/main", dir);
    ck_assert_int_eq(qd_mkdirs(p), QD_OK);
    size_t n;
    char *text = read_all(qd_test_path("tests/fixtures/benchmarks/gsm8k_test.jsonl"), &n);
    pathf(p, sizeof p, "%s/cache/rows/openai/gsm8k/main/test.jsonl", dir);
    ck_assert_int_eq(qd_atomic_write(p, text, n), QD_OK);
    free(text);
    ck_assert_int_eq(qd_sha256_file(p, hex), QD_OK);
    pathf(p, sizeof p, "%s/cache/rows/openai/gsm8k/main/test.jsonl.sha256", dir);
    ck_assert_int_eq(qd_atomic_write(p, hex, 64), QD_OK);
    pathf(p, sizeof p, "%s/cache", dir);
    setenv("QUADS_CACHE", p, 1);
    setenv("QUADS_OFFLINE", "1", 1);
    static const char *const sets = "--set data.task=gsm8k --set data.max_prompt_tokens=100 --set run.steps=1 "
                                    "--set eval.limit=4 --set eval.every=1 --set rollout.backend=cpu "
                                    "--set run.threads=1 --set rollout.prompts_per_step=2 --set rollout.group_size=2 "
                                    "--set rollout.max_tokens=4";
    pathf(args, sizeof args, "rl --quiet --set model.path=%s/model --set run.dir=%s/g %s", dir, dir, sets);
    int rc = qd_test_run_quads(args, out, sizeof out);
    ck_assert_msg(rc == 0, "%s", out);
    ck_assert_msg(strstr(out, "data: gsm8k, 21 training problems, 4 held out (1294 of 1319 over "
                              "data.max_prompt_tokens skipped)"), "%s", out);
    /* the summary's time line: one step, the evals of steps 0 and 1, the final checkpoint */
    ck_assert_msg(strstr(out, " s in all; steps: 1 in ") && strstr(out, "; evals: 2 in ") &&
                  strstr(out, "; checkpoints: 1 in ") && strstr(out, "the rest (start, data, metrics, end): "),
                  "%s", out);
    pathf(p, sizeof p, "%s/g", dir);
    json_t *m = metrics_without_time(p);
    ck_assert_int_eq(json_array_size(m), 2);
    ck_assert_int_eq(num(json_array_get(m, 1), "eval", "problems"), 4);
    ck_assert_int_eq(num(json_array_get(m, 1), "samples", NULL), 4);
    json_decref(m);
    pathf(p, sizeof p, "%s/empty", dir);
    setenv("QUADS_CACHE", p, 1);
    pathf(args, sizeof args, "rl --quiet --set model.path=%s/model --set run.dir=%s/h %s", dir, dir, sets);
    rc = qd_test_run_quads(args, out, sizeof out);
    unsetenv("QUADS_CACHE"), unsetenv("QUADS_OFFLINE");
    ck_assert_int_eq(rc, 1);
    ck_assert_msg(strstr(out, "quads rl: config: data.task: gsm8k: offline and ") && strstr(out, "is not in the cache"),
                  "%s", out);
    qd_test_rm_tree(dir);
}
END_TEST

/* Programs for two real LiveCodeBench problems (tests/fixtures/code/ has
 * others); the hook gives every other completion it sees the right one and
 * the rest a wrong one, each in a ``` block. */
typedef struct {
    int calls, right;
} code_hook_ctx;

static void code_hook(void *ctx, const char *id, char **text)
{
    static const struct {
        const char *id, *code;
    } sol[] = {{"abc333_a", "n = input().strip()\nprint(n * int(n))\n"},
               {"abc341_a", "n = int(input())\nprint(\"10\" * n + \"1\")\n"}};
    code_hook_ctx *h = ctx;
    const char *code = "print(0)\n";
    for (size_t i = 0; i < sizeof sol / sizeof sol[0]; i++)
        if (!strcmp(sol[i].id, id) && h->calls % 2 == 0)
            code = sol[i].code, h->right++;
    h->calls++;
    free(*text);
    ck_assert_int_ge(asprintf(text, "Here:\n```python\n%s```\n", code), 0);
}

static int64_t verdict(const json_t *line, const char *obj, const char *name)
{
    const json_t *c = json_object_get(obj ? json_object_get(line, obj) : line, "code");
    ck_assert_msg(json_is_object(c) && json_object_size(c) == 7, "no verdict counts");
    return json_integer_value(json_object_get(c, name));
}

/* data.task a LiveCodeBench release (lcb-v1 from the cache, offline): its
 * problems of data.from onwards whose prompts fit (2: one trains, one is held
 * out) are graded by running the completions in the sandbox. Through the
 * code_text hook half the completions are right programs: the rewards,
 * train pass@1, held-out pass@1 and verdict counts follow from the sandbox's
 * verdicts. Through the program, the random model writes no code: every
 * sample is no_code. Windows and tasks without dates are refused. */
START_TEST(test_rl_code_task)
{
    char dir[256], out[1 << 15], args[2048], p[1024], hex[65];
    scratch_dir(dir, sizeof dir);
    make_model_positions(dir, 1024);
    pathf(p, sizeof p, "%s/cache/hub/datasets/livecodebench/code_generation_lite/main", dir);
    ck_assert_int_eq(qd_mkdirs(p), QD_OK);
    size_t n;
    char *text = read_all(qd_test_path("tests/fixtures/benchmarks/livecodebench_release_v1_nopriv_mavencoder.jsonl"), &n);
    pathf(p, sizeof p, "%s/cache/hub/datasets/livecodebench/code_generation_lite/main/test.jsonl", dir);
    ck_assert_int_eq(qd_atomic_write(p, text, n), QD_OK);
    free(text);
    ck_assert_int_eq(qd_sha256_file(p, hex), QD_OK);
    pathf(p, sizeof p, "%s/cache/hub/datasets/livecodebench/code_generation_lite/main/test.jsonl.sha256", dir);
    ck_assert_int_eq(qd_atomic_write(p, hex, 64), QD_OK);
    pathf(p, sizeof p, "%s/cache", dir);
    setenv("QUADS_CACHE", p, 1);
    setenv("QUADS_OFFLINE", "1", 1);
    static const char *const sets[] = {
        "data.task=lcb-v1", "data.from=2023-12-01", "data.max_prompt_tokens=820", "rollout.prompts_per_step=1",
        "algo.overlong_buffer_len=0", "rollout.max_tokens=4", "eval.limit=1", "eval.samples=2",
        "reward.code_jobs=2", "reward.code_timeout_s=5"};
    qd_config *c = small_config(dir, "code", "bf16", 2);
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++)
        ck_assert_int_eq(qd_config_set(c, sets[i]), QD_OK);
    code_hook_ctx h = {0};
    qd_rl_hooks hooks = {.ctx = &h, .code_text = code_hook};
    qd_rl_options o = {.hooks = &hooks};
    ck_assert_msg(qd_rl_run(c, &o, NULL, 0) == QD_OK, "%s", qd_last_error());
    ck_assert_int_eq(h.calls, 2 * 4 + 2 * 2); /* 2 steps of 4 samples, evals at steps 0 and 2 of 2 samples */
    ck_assert_int_eq(h.right, h.calls / 2);
    pathf(p, sizeof p, "%s/code", dir);
    json_t *m = metrics_without_time(p);
    ck_assert_int_eq(json_array_size(m), 3);
    for (size_t i = 0; i < 3; i += 2) { /* evals: the held-out problem, one right sample of 2 */
        const json_t *l = json_array_get(m, i);
        ck_assert_int_eq(num(l, "eval", "problems"), 1);
        ck_assert_double_eq(num(l, "eval", "pass1"), 0.5);
        ck_assert_int_eq(verdict(l, "eval", "accepted"), 1);
        ck_assert_int_eq(verdict(l, "eval", "wrong_answer"), 1);
    }
    for (size_t i = 1; i < 3; i++) {
        const json_t *l = json_array_get(m, i);
        ck_assert_int_eq(num(l, "samples", NULL), 4);
        ck_assert_int_eq(verdict(l, NULL, "accepted"), 2);
        ck_assert_int_eq(verdict(l, NULL, "wrong_answer"), 2);
        ck_assert_int_eq(verdict(l, NULL, "no_code") + verdict(l, NULL, "sandbox_error"), 0);
        ck_assert_double_eq(num(l, "reward_mean", NULL), 0.5);
        ck_assert_double_eq(num(l, "pass1_train", NULL), 0.5);
        ck_assert_int_eq(num(l, "updates", NULL), 1);
    }
    json_decref(m);
    qd_config_free(c);
    /* the program: the random model's 4 tokens hold no ``` block */
    pathf(args, sizeof args, "rl --quiet --set model.path=%s/model --set run.dir=%s/cli --set data.task=lcb-v1 "
          "--set data.from=2023-12-01 --set data.max_prompt_tokens=820 --set run.steps=1 --set eval.limit=1 "
          "--set eval.every=1 --set rollout.backend=cpu --set rollout.recipe=bf16 --set run.threads=1 "
          "--set rollout.prompts_per_step=1 --set rollout.group_size=2 --set rollout.max_tokens=4 "
          "--set reward.code_jobs=1", dir, dir);
    int rc = qd_test_run_quads(args, out, sizeof out);
    ck_assert_msg(rc == 0, "%s", out);
    ck_assert_msg(strstr(out, "data: lcb-v1, 1 training problems, 1 held out (") &&
                  strstr(out, "code rewards: each sample's last ``` block against its problem's tests in the sandbox"),
                  "%s", out);
    pathf(p, sizeof p, "%s/cli", dir);
    m = metrics_without_time(p);
    ck_assert_int_eq(json_array_size(m), 2);
    ck_assert_int_eq(verdict(json_array_get(m, 1), NULL, "no_code"), 2);
    ck_assert_int_eq(verdict(json_array_get(m, 1), "eval", "no_code"), 1);
    ck_assert_double_eq(num(json_array_get(m, 1), "reward_mean", NULL), 0);
    json_decref(m);
    static const struct {
        const char *set, *msg;
    } bad[] = {
        {"--set data.from=2030-01-01", "quads rl: config: data.from, data.to: none of the 400 problems of lcb-v1 is "
                                       "dated in [2030-01-01, -]"},
        {"--set data.from=2023-9-01", "data.from: '2023-9-01': expected a date YYYY-MM-DD or empty"},
        {"--set data.from=2024-01-02 --set data.to=2024-01-01", "data.from: 2024-01-02 is after data.to 2024-01-01"},
        {"--set data.task=arith --set data.to=2024-01-01", "the synthetic task arith has no dates"},
        {"--set data.task=gsm8k --set data.to=2024-01-01", "gsm8k: its records have no date to select by"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pathf(args, sizeof args, "rl --quiet --set model.path=%s/model --set run.dir=%s/bad%zu --set data.task=lcb-v1 "
              "--set rollout.backend=cpu --set run.threads=1 %s", dir, dir, i, bad[i].set);
        rc = qd_test_run_quads(args, out, sizeof out);
        ck_assert_msg(rc != 0 && strstr(out, bad[i].msg), "%s: %s", bad[i].set, out);
    }
    unsetenv("QUADS_CACHE"), unsetenv("QUADS_OFFLINE");
    qd_test_rm_tree(dir);
}
END_TEST

START_TEST(test_rl_cli_config_errors)
{
    char out[8192], dir[256], args[1024], p[1024];
    scratch_dir(dir, sizeof dir);
    ck_assert_int_eq(qd_test_run_quads("rl --set trainer.lrr=1", out, sizeof out), 2);
    ck_assert_ptr_nonnull(strstr(out, "--set: trainer.lrr: unknown key (did you mean trainer.lr?)"));
    ck_assert_int_eq(qd_test_run_quads("rl --set trainer.lr=fast", out, sizeof out), 2);
    ck_assert_ptr_nonnull(strstr(out, "trainer.lr: expected a number, got 'fast'"));
    ck_assert_int_eq(qd_test_run_quads("rl --set rollout.group_size=1", out, sizeof out), 2);
    ck_assert_ptr_nonnull(strstr(out, "rollout.group_size: 1 is out of range"));
    pathf(p, sizeof p, "%s/bad.json", dir);
    const char *bad = "{\"trainer\": {\"lr\": \"high\"}}";
    ck_assert_int_eq(qd_atomic_write(p, bad, strlen(bad)), QD_OK);
    pathf(args, sizeof args, "rl --config %s", p);
    ck_assert_int_eq(qd_test_run_quads(args, out, sizeof out), 2);
    ck_assert_ptr_nonnull(strstr(out, "bad.json: trainer.lr: expected a number, got a string"));
    pathf(args, sizeof args, "rl --resume %s/none", dir);
    ck_assert_int_eq(qd_test_run_quads(args, out, sizeof out), 2);
    ck_assert_msg(strstr(out, "/none: the run directory is missing") && !strstr(out, "JSON"), "%s", out);
    pathf(args, sizeof args, "rl --resume %s", dir); /* a directory, but no run */
    ck_assert_int_eq(qd_test_run_quads(args, out, sizeof out), 2);
    ck_assert_msg(strstr(out, "not a run directory (no config.json)"), "%s", out);
    ck_assert_int_eq(qd_test_run_quads("rl --set run.name=../escaped", out, sizeof out), 2);
    ck_assert_msg(strstr(out, "--set: run.name: '../escaped' is not a plain name"), "%s", out);
    ck_assert_int_eq(qd_test_run_quads("rl --set trainer.beta1=1", out, sizeof out), 2);
    ck_assert_msg(strstr(out, "--set: trainer.beta1: 1 is out of range [0, 1)"), "%s", out);
    ck_assert_int_eq(qd_test_run_quads("rl --set rollout.prompts_per_step=1000000000", out, sizeof out), 2);
    ck_assert_msg(strstr(out, "config: rollout.prompts_per_step 1000000000 x"), "%s", out);
    /* data.task: a typo gets one clean message (the old one repeated itself: issue 14) */
    make_model(dir);
    pathf(args, sizeof args, "rl --quiet --set model.path=%s/model --set rollout.backend=cpu --set run.dir=%s/t "
          "--set data.task=arith9", dir, dir);
    ck_assert_int_eq(qd_test_run_quads(args, out, sizeof out), 1);
    ck_assert_msg(strstr(out, "quads rl: config: data.task: task 'arith9': expected arith, arith1..arith4") &&
                  !strstr(out, "data.task: config"), "%s", out);
    ck_assert_int_eq(qd_test_run_quads("rl --config a.json --resume b", out, sizeof out), 2);
    ck_assert_ptr_nonnull(strstr(out, "exclude each other"));
    ck_assert_int_eq(qd_test_run_quads("compare --recipes bf16,bf16", out, sizeof out), 2);
    ck_assert_ptr_nonnull(strstr(out, "named twice"));
    ck_assert_int_eq(qd_test_run_quads("compare --recipes bf16,int3", out, sizeof out), 2);
    ck_assert_ptr_nonnull(strstr(out, "rollout.recipe: 'int3' is not one of"));
    ck_assert_int_eq(qd_test_run_quads("report", out, sizeof out), 2);
    qd_test_rm_tree(dir);
}
END_TEST

/* quads compare end to end: two recipes, one step each, report and plots;
 * the resolved config and the derived batch numbers are printed. */
START_TEST(test_rl_cli_compare)
{
    char out[1 << 15], dir[256], args[2048], p[2048];
    scratch_dir(dir, sizeof dir);
    make_model(dir);
    pathf(args, sizeof args,
             "compare --recipes bf16,quads --out %s/cmp --quiet --set model.path=%s/model --set run.steps=1 "
             "--set rollout.group_size=2 --set rollout.prompts_per_step=2 --set rollout.max_tokens=4 "
             "--set eval.limit=2 --set run.threads=1 --set rollout.backend=cpu",
             dir, dir);
    ck_assert_int_eq(qd_test_run_quads(args, out, sizeof out), 0);
    ck_assert_ptr_nonnull(strstr(out, "a step: 2 prompts x 2 = 4 samples"));
    ck_assert_ptr_nonnull(strstr(out, "held-out pass@1"));
    pathf(p, sizeof p, "%s/cmp", dir);
    ck_assert(exists(p, "report.md") && exists(p, "gap.svg") && exists(p, "bf16/metrics.jsonl") &&
              exists(p, "quads/step_00000001/model.safetensors"));
    pathf(args, sizeof args, "report %s/cmp/bf16 %s/cmp/quads --out %s/rep", dir, dir, dir);
    ck_assert_int_eq(qd_test_run_quads(args, out, sizeof out), 0);
    pathf(p, sizeof p, "%s/rep", dir);
    ck_assert(exists(p, "report.md") && exists(p, "reward.svg"));
    qd_test_rm_tree(dir);
}
END_TEST

/* The object of metrics line step (an array of metrics_without_time). */
static json_t *line_of(json_t *m, int64_t step)
{
    size_t i;
    json_t *o;
    json_array_foreach(m, i, o) {
        if (json_integer_value(json_object_get(o, "step")) == step)
            return o;
    }
    ck_abort_msg("no metrics line of step %lld", (long long)step);
    return NULL;
}

/* eval.bf16: the first and the last eval also run with the bf16 recipe's
 * rollout. For the bf16 recipe it equals the rollout's eval; for nvfp4 its
 * step-0 eval equals the bf16 run's (same weights, bf16 forward), not the
 * nvfp4 rollout's; the knob changes no other number of the run, and the
 * report takes its columns from it. */
START_TEST(test_rl_eval_bf16)
{
    char dir[256], rd[3][1024];
    scratch_dir(dir, sizeof dir);
    make_model(dir);
    static const char *const names[3] = {"bf16", "nvfp4-on", "nvfp4-off"};
    for (int i = 0; i < 3; i++) {
        qd_config *c = small_config(dir, names[i], i ? "nvfp4" : "bf16", 3);
        ck_assert_int_eq(qd_config_set(c, i == 2 ? "eval.bf16=false" : "eval.bf16=true"), QD_OK);
        ck_assert_int_eq(qd_config_set(c, "eval.limit=8"), QD_OK);
        qd_status st = run(c, NULL);
        ck_assert_msg(st == QD_OK, "%s: %s", names[i], qd_last_error());
        qd_config_free(c);
        pathf(rd[i], sizeof rd[i], "%s/%s", dir, names[i]);
    }
    json_t *m[3];
    for (int i = 0; i < 3; i++)
        m[i] = metrics_without_time(rd[i]);
    static const char *const fields[] = {"pass1", "mean_len", "format_rate", "problems"};
    for (int step = 0; step <= 3; step += 3) {
        const json_t *e = json_object_get(line_of(m[0], step), "eval"), *b = json_object_get(e, "bf16");
        for (size_t f = 0; f < sizeof fields / sizeof *fields; f++)
            ck_assert(num(e, fields[f], NULL) == num(b, fields[f], NULL));
    }
    ck_assert_ptr_null(json_object_get(json_object_get(line_of(m[0], 2), "eval"), "bf16")); /* first and last only */
    const json_t *e0 = json_object_get(line_of(m[0], 0), "eval"), *n0 = json_object_get(line_of(m[1], 0), "eval");
    ck_assert_msg(num(n0, "mean_len", NULL) != num(e0, "mean_len", NULL), "the test model cannot tell nvfp4 from bf16");
    for (size_t f = 0; f < sizeof fields / sizeof *fields; f++)
        ck_assert(num(json_object_get(n0, "bf16"), fields[f], NULL) == num(e0, fields[f], NULL));
    for (int step = 0; step <= 3; step += 3) /* on = off + eval.bf16 */
        ck_assert_int_eq(json_object_del(json_object_get(line_of(m[1], step), "eval"), "bf16"), 0);
    ck_assert(json_equal(m[1], m[2]));
    char a[2048], b[2048];
    pathf(a, sizeof a, "%s/step_00000003/model.safetensors", rd[1]);
    pathf(b, sizeof b, "%s/step_00000003/model.safetensors", rd[2]);
    ck_assert(qd_test_same_file(a, b));
    /* the report's two columns */
    const char *runs[2] = {rd[0], rd[1]};
    char out[1024], p[1100];
    pathf(out, sizeof out, "%s/report", dir);
    ck_assert_int_eq(qd_rl_report(runs, NULL, 2, out), QD_OK);
    pathf(p, sizeof p, "%s/report.json", out);
    json_t *rep = json_load_file(p, 0, NULL);
    ck_assert_ptr_nonnull(rep);
    json_decref(m[1]);
    m[1] = metrics_without_time(rd[1]);
    for (int i = 0; i < 2; i++) {
        const json_t *r = json_array_get(json_object_get(rep, "runs"), (size_t)i);
        const json_t *last = json_object_get(line_of(m[i], 3), "eval");
        ck_assert_str_eq(json_string_value(json_object_get(r, "status")), "ok");
        ck_assert(fabs(num(r, "pass1_final", NULL) - num(last, "pass1", NULL)) < 1e-9);
        ck_assert(fabs(num(r, "pass1_bf16_final", NULL) - num(json_object_get(last, "bf16"), "pass1", NULL)) < 1e-9);
        ck_assert(fabs(num(r, "pass1_bf16_first", NULL) -
                       num(json_object_get(json_object_get(line_of(m[i], 0), "eval"), "bf16"), "pass1", NULL)) < 1e-9);
    }
    json_decref(rep);
    for (int i = 0; i < 3; i++)
        json_decref(m[i]);
    qd_test_rm_tree(dir);
}
END_TEST

/* The compare tests' model in a scratch dir and the --set arguments of
 * their two-step runs (checkpoint.every: ckpt). */
static void compare_setup(char *dir, size_t dn, char *sets, size_t sn, int ckpt)
{
    scratch_dir(dir, dn);
    make_model(dir);
    pathf(sets, sn,
          "--quiet --set model.path=%s/model --set run.steps=2 --set rollout.group_size=2 "
          "--set rollout.prompts_per_step=2 --set rollout.max_tokens=4 --set eval.limit=2 --set run.threads=1 "
          "--set rollout.backend=cpu --set checkpoint.every=%d --set checkpoint.keep_last=5", dir, ckpt);
}

/* compare --recipes bf16 --seeds 1,2 (and extra) into dir/f where seed 2's
 * directory is a file: exit 1, the report counts seed 1 and lists seed 2
 * as failed; out gets the output. */
static void compare_one_fails(const char *dir, const char *sets, const char *extra, char *out, size_t on)
{
    char p[2048], args[4096];
    pathf(p, sizeof p, "%s/f/bf16", dir);
    ck_assert_int_eq(qd_mkdirs(p), QD_OK);
    qd_test_write_file(qd_test_join(p, "seed-2"), "not a directory");
    pathf(args, sizeof args, "compare --recipes bf16 --seeds 1,2 %s --out %s/f %s", extra, dir, sets);
    ck_assert_int_eq(qd_test_run_quads(args, out, on), 1);
    ck_assert_msg(strstr(out, "runs failed: listed there, not averaged"), "%s", out);
    pathf(p, sizeof p, "%s/f/report.json", dir);
    json_t *rep = json_load_file(p, 0, NULL);
    const json_t *row = json_array_get(json_object_get(rep, "rows"), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(row, "complete")), 1);
    const json_t *ex = json_array_get(json_object_get(row, "excluded"), 0);
    ck_assert_str_eq(json_string_value(json_object_get(ex, "status")), "failed");
    ck_assert(json_is_null(json_object_get(ex, "seed")));
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(row, "pass1_final"), "n")), 1);
    json_decref(rep);
}

/* quads compare --seeds: a run per recipe and seed in DIR/RECIPE/seed-S, the
 * report's row over them; --continue keeps a finished run, resumes a cut
 * one to the same numbers and refuses a run of another config; a run that
 * fails is reported, not averaged, and the others still run (exit 1). */
START_TEST(test_rl_cli_compare_seeds)
{
    char out[1 << 16], dir[256], args[4096], sets[1024], p[2048];
    compare_setup(dir, sizeof dir, sets, sizeof sets, 1);
    pathf(args, sizeof args, "compare --recipes bf16 --seeds 3,4 --out %s/cmp %s", dir, sets);
    ck_assert_msg(qd_test_run_quads(args, out, sizeof out) == 0, "%s", out);
    pathf(p, sizeof p, "%s/cmp", dir);
    ck_assert(exists(p, "bf16/seed-3/metrics.jsonl") && exists(p, "bf16/seed-4/metrics.jsonl"));
    ck_assert(exists(p, "report.md") && exists(p, "report.json") && exists(p, "pass1.svg"));
    pathf(p, sizeof p, "%s/cmp/report.json", dir);
    json_t *rep = json_load_file(p, 0, NULL);
    const json_t *row = json_array_get(json_object_get(rep, "rows"), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(row, "complete")), 2);
    ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(row, "seeds"), 1)), 4);
    ck_assert_ptr_nonnull(strstr(json_string_value(json_object_get(rep, "command")), "--seeds 3,4"));
    json_decref(rep);
    pathf(p, sizeof p, "%s/cmp/bf16/seed-4", dir);
    json_t *before = metrics_without_time(p);
    /* cut seed 4 back to step 1 */
    char m[2200], ck[2200];
    pathf(m, sizeof m, "%s/metrics.jsonl", p);
    ck_assert_int_eq(qd_metrics_truncate(m, 1), QD_OK);
    pathf(ck, sizeof ck, "%s/step_00000002", p);
    qd_test_rm_tree(ck);
    pathf(args, sizeof args, "compare --recipes bf16 --seeds 3,4 --continue --out %s/cmp %s", dir, sets);
    ck_assert_msg(qd_test_run_quads(args, out, sizeof out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "seed-3: finished before, kept ==") && strstr(out, "seed-4: resumed =="), "%s", out);
    json_t *after = metrics_without_time(p);
    ck_assert(json_equal(before, after));
    json_decref(before), json_decref(after);
    /* a finished run moved elsewhere (its config.json names the old run.dir) is still kept */
    pathf(args, sizeof args, "mkdir -p %s/moved/bf16 && cp -r %s/cmp/bf16/seed-3 %s/moved/bf16/", dir, dir, dir);
    ck_assert_int_eq(system(args), 0);
    pathf(args, sizeof args, "compare --recipes bf16 --seeds 3 --continue --out %s/moved %s", dir, sets);
    ck_assert_msg(qd_test_run_quads(args, out, sizeof out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "moved/bf16/seed-3: finished before, kept =="), "%s", out);
    /* --report-only runs nothing: quads was never run, so both its seeds are missing */
    pathf(args, sizeof args, "compare --recipes bf16,quads --seeds 3,4 --report-only --out %s/cmp %s", dir, sets);
    ck_assert_msg(qd_test_run_quads(args, out, sizeof out) == 0, "%s", out);
    pathf(p, sizeof p, "%s/cmp/report.md", dir);
    const char *md = qd_test_read_file(p);
    ck_assert_msg(strstr(md, "| bf16 | bf16 / 2 of 2 |") && strstr(md, "| quads | ? / 0 of 2 |") &&
                  strstr(md, "- quads, seed ? (") && strstr(md, "quads/seed-4): missing: no config.json"), "%s", md);
    pathf(p, sizeof p, "%s/cmp", dir);
    ck_assert(!exists(p, "quads"));
    /* another config in the same directory */
    pathf(args, sizeof args, "compare --recipes bf16 --seeds 3 --continue --out %s/cmp %s --set trainer.lr=1e-3", dir,
          sets);
    ck_assert_int_eq(qd_test_run_quads(args, out, sizeof out), 1);
    ck_assert_msg(strstr(out, "seed-3/config.json holds a run of another config"), "%s", out);
    /* seed 2 cannot run (its directory is a file): seed 1 still does */
    compare_one_fails(dir, sets, "", out, sizeof out);
    qd_test_rm_tree(dir);
}
END_TEST

/* quads compare --jobs: the runs in processes of their own, at most N at a
 * time, each run's output in RUNDIR.log; every run's metrics (timings aside)
 * the same as one at a time; with --continue, kept and refused runs start no
 * process; a run that fails in its process (its directory
 * a file) is reported as such, the others still run (exit 1); --jobs 0 is
 * refused before anything runs. */
START_TEST(test_rl_cli_compare_jobs)
{
    char out[1 << 16], dir[256], args[4096], sets[1024], p[2048];
    compare_setup(dir, sizeof dir, sets, sizeof sets, 0);
    pathf(args, sizeof args, "compare --recipes bf16,nvfp4 --seeds 3,4 --out %s/one %s", dir, sets);
    ck_assert_msg(qd_test_run_quads(args, out, sizeof out) == 0, "%s", out);
    pathf(args, sizeof args, "compare --recipes bf16,nvfp4 --seeds 3,4 --jobs 3 --out %s/par %s", dir, sets);
    ck_assert_msg(qd_test_run_quads(args, out, sizeof out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "par/nvfp4/seed-4: started (its output in ") && strstr(out, "par/bf16/seed-3: done =="),
                  "%s", out);
    static const char *const runs[4] = {"bf16/seed-3", "bf16/seed-4", "nvfp4/seed-3", "nvfp4/seed-4"};
    for (int i = 0; i < 4; i++) {
        char a[2048], b[2048];
        pathf(a, sizeof a, "%s/one/%s", dir, runs[i]);
        pathf(b, sizeof b, "%s/par/%s", dir, runs[i]);
        json_t *ma = metrics_without_time(a), *mb = metrics_without_time(b);
        ck_assert_msg(json_equal(ma, mb), "%s: the metrics differ under --jobs", runs[i]);
        json_decref(ma), json_decref(mb);
        pathf(p, sizeof p, "%s.log", b);
        const char *log = qd_test_read_file(p);
        ck_assert_msg(log && strstr(log, "held-out pass@1"), "%s: %s", p, log ? log : "(none)");
    }
    pathf(p, sizeof p, "%s/par/report.json", dir);
    json_t *rep = json_load_file(p, 0, NULL);
    ck_assert_ptr_nonnull(rep);
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(
            json_integer_value(json_object_get(json_array_get(json_object_get(rep, "rows"), (size_t)i), "complete")),
            2);
    /* seed by seed: nvfp4's final pass@1 minus bf16's on the same seed; its
     * gap over naive NVFP4's (its own) 1, bf16's 0 */
    const json_t *pr = json_object_get(rep, "paired"), *runs_j = json_object_get(rep, "runs");
    ck_assert_str_eq(json_string_value(json_object_get(pr, "pass1_against")), "bf16");
    ck_assert_str_eq(json_string_value(json_object_get(pr, "gap_against")), "nvfp4");
    for (int k = 0; k < 2; k++) {
        const json_t *rows_j = json_object_get(pr, "rows");
        double b = json_number_value(json_object_get(json_array_get(runs_j, (size_t)k), "pass1_final"));
        double n = json_number_value(json_object_get(json_array_get(runs_j, (size_t)k + 2), "pass1_final"));
        const json_t *d = json_object_get(json_object_get(json_array_get(rows_j, 1), "d_pass1_final"), "values");
        ck_assert_double_eq_tol(json_number_value(json_array_get(d, (size_t)k)), n - b, 1e-12);
        for (int r = 0; r < 2; r++)
            ck_assert_double_eq(json_number_value(json_array_get(
                                    json_object_get(json_object_get(json_array_get(rows_j, (size_t)r), "gap_ratio"),
                                                    "values"),
                                    (size_t)k)),
                                r);
    }
    json_decref(rep);
    pathf(p, sizeof p, "%s/par/report.md", dir);
    const char *md = qd_test_read_file(p);
    ck_assert_msg(md && strstr(md, "## Seed by seed") && strstr(md, "| nvfp4 | 2 |"), "%s", md ? md : "(none)");
    /* --continue --jobs: finished runs kept by this process (no run started
     * for them), a run of another config refused without a process */
    pathf(args, sizeof args, "compare --recipes bf16,nvfp4 --seeds 3,4 --jobs 3 --continue --out %s/par %s", dir, sets);
    ck_assert_msg(qd_test_run_quads(args, out, sizeof out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "par/nvfp4/seed-4: finished before, kept ==") && !strstr(out, "started"), "%s", out);
    pathf(args, sizeof args, "compare --recipes bf16 --seeds 3,4 --jobs 2 --continue --out %s/par %s --set run.steps=3",
          dir, sets);
    ck_assert_int_eq(qd_test_run_quads(args, out, sizeof out), 1);
    ck_assert_msg(strstr(out, "par/bf16/seed-3: another config's run there ==") &&
                      strstr(out, "par/bf16/seed-4: another config's run there ==") && !strstr(out, "started"),
                  "%s", out);
    /* seed 2 cannot run (its directory is a file) in its process: seed 1 still does */
    compare_one_fails(dir, sets, "--jobs 2", out, sizeof out);
    ck_assert_msg(strstr(out, "f/bf16/seed-2: failed ==") && strstr(out, "f/bf16/seed-1: done =="), "%s", out);
    pathf(args, sizeof args, "compare --recipes bf16 --seeds 1 --jobs 0 --out %s/z %s", dir, sets);
    ck_assert_int_eq(qd_test_run_quads(args, out, sizeof out), 2);
    ck_assert_msg(strstr(out, "--jobs: '0': a whole number from 1 to 64"), "%s", out);
    pathf(p, sizeof p, "%s", dir);
    ck_assert(!exists(p, "z"));
    qd_test_rm_tree(dir);
}
END_TEST

/* model.path empty: the embedded tiny model (models/tiny under QD_SRCDIR). */
START_TEST(test_rl_default_model)
{
    char dir[256], b[1024];
    scratch_dir(dir, sizeof dir);
    qd_config *c = small_config(dir, "d", "quads", 1);
    ck_assert_int_eq(qd_config_set(c, "model.path="), QD_OK);
    ck_assert_int_eq(qd_config_set(c, "eval.every=0"), QD_OK);
    ck_assert_msg(run(c, NULL) == QD_OK, "%s", qd_last_error());
    pathf(b, sizeof b, "%s/d", dir);
    ck_assert(exists(b, "step_00000001/model.safetensors") && exists(b, "step_00000001/tokenizer.json"));
    qd_config_free(c);
    /* bf16 on both sides: the eval on the rollout and on the trainer agree;
     * nvfp4: the rollout's NVFP4 numerics change the greedy answers */
    double pass[4];
    static const char *const rec[4] = {"bf16", "bf16", "nvfp4", "nvfp4"};
    for (int i = 0; i < 4; i++) {
        char name[16];
        pathf(name, sizeof name, "e%d", i);
        c = small_config(dir, name, rec[i], 1);
        ck_assert_int_eq(qd_config_set(c, "model.path="), QD_OK);
        ck_assert_int_eq(qd_config_set(c, "eval.limit=64"), QD_OK);
        ck_assert_int_eq(qd_config_set(c, i % 2 ? "eval.precision=trainer" : "eval.precision=rollout"), QD_OK);
        ck_assert_msg(run(c, NULL) == QD_OK, "%s", qd_last_error());
        pathf(b, sizeof b, "%s/%s", dir, name);
        json_t *m = metrics_without_time(b);
        pass[i] = num(json_array_get(m, 0), "eval", "pass1");
        json_decref(m);
        qd_config_free(c);
    }
    ck_assert(pass[0] == pass[1] && pass[1] == pass[3] && pass[2] != pass[3]);
    qd_test_rm_tree(dir);
}
END_TEST

/* An out-of-tree build (issue 16): run from a folder without models/tiny,
 * without $QD_SRCDIR and with no models/tiny beside the test program, the
 * embedded model is still found (the source tree is compiled in). And
 * log.tensorboard=false writes no RUN/tb. */
START_TEST(test_rl_default_model_out_of_tree)
{
    char dir[256], b[1024];
    scratch_dir(dir, sizeof dir);
    ck_assert_int_eq(chdir(dir), 0);
    unsetenv("QD_SRCDIR");
    qd_config *c = small_config(dir, "o", "bf16", 1);
    ck_assert_int_eq(qd_config_set(c, "model.path="), QD_OK);
    ck_assert_int_eq(qd_config_set(c, "eval.every=0"), QD_OK);
    ck_assert_int_eq(qd_config_set(c, "log.tensorboard=false"), QD_OK);
    ck_assert_msg(run(c, NULL) == QD_OK, "%s", qd_last_error());
    qd_config_free(c);
    pathf(b, sizeof b, "%s/o", dir);
    ck_assert(exists(b, "step_00000001/model.safetensors") && exists(b, "metrics.jsonl") && !exists(b, "tb"));
    qd_test_rm_tree(dir);
}
END_TEST

/* BF16 on both sides at rollout.temperature 0.7: the trainer's forward is at
 * the rollout's temperature, so the gap is still exactly 0 (it was the
 * difference of log_softmax(x / 0.7) and log_softmax(x) before). */
START_TEST(test_rl_temperature_no_gap)
{
    char dir[256], rd[1024];
    scratch_dir(dir, sizeof dir);
    make_model(dir);
    qd_config *c = small_config(dir, "t07", "bf16", 2);
    ck_assert_int_eq(qd_config_set(c, "rollout.temperature=0.7"), QD_OK);
    ck_assert_int_eq(qd_config_set(c, "eval.every=0"), QD_OK);
    ck_assert_msg(run(c, NULL) == QD_OK, "%s", qd_last_error());
    qd_config_free(c);
    pathf(rd, sizeof rd, "%s/t07", dir);
    json_t *m = metrics_without_time(rd);
    ck_assert_int_eq(json_array_size(m), 2);
    for (int s = 0; s < 2; s++) {
        const json_t *o = json_array_get(m, s);
        ck_assert_int_eq(num(o, "step", NULL), s + 1);
        ck_assert(num(o, "gap", "max_abs") == 0.0);
        ck_assert(num(o, "gap", "mean_abs") == 0.0);
        ck_assert(num(o, "grad_norm", NULL) > 0);
    }
    json_decref(m);
    qd_test_rm_tree(dir);
}
END_TEST

/* nvfp4-replay on the shipped tiny model at rollout.temperature 0.7: the
 * trainer replays the rollout's W4A4 products, so the gap of every step is
 * exactly 0 (mean, max, k3 KL) where nvfp4's BF16 trainer has one, and the
 * held-out eval on the replay trainer equals nvfp4's on its rollout. */
START_TEST(test_rl_replay_no_gap)
{
    char dir[256], rd[1024];
    scratch_dir(dir, sizeof dir);
    static const char *const rec[2] = {"nvfp4-replay", "nvfp4"};
    double pass[2], grad = 0;
    for (int i = 0; i < 2; i++) {
        qd_config *c = small_config(dir, rec[i], rec[i], 2);
        ck_assert_int_eq(qd_config_set(c, "model.path="), QD_OK);
        ck_assert_int_eq(qd_config_set(c, "rollout.temperature=0.7"), QD_OK);
        ck_assert_int_eq(qd_config_set(c, "eval.every=100"), QD_OK); /* step 0 only */
        ck_assert_int_eq(qd_config_set(c, "eval.limit=32"), QD_OK);
        ck_assert_int_eq(qd_config_set(c, i ? "eval.precision=rollout" : "eval.precision=trainer"), QD_OK);
        ck_assert_msg(run(c, NULL) == QD_OK, "%s: %s", rec[i], qd_last_error());
        qd_config_free(c);
        pathf(rd, sizeof rd, "%s/%s", dir, rec[i]);
        json_t *m = metrics_without_time(rd);
        ck_assert_int_eq(json_array_size(m), 3);
        pass[i] = num(json_array_get(m, 0), "eval", "pass1");
        for (int s = 1; s <= 2; s++) {
            const json_t *o = json_array_get(m, s);
            ck_assert(num(o, "gap", "tokens") > 0);
            grad += i == 0 ? num(o, "grad_norm", NULL) : 0;
            double mean = num(o, "gap", "mean_abs"), mx = num(o, "gap", "max_abs"), kl = num(o, "gap", "k3_kl");
            if (i == 0)
                ck_assert_msg(mean == 0.0 && mx == 0.0 && kl == 0.0, "nvfp4-replay step %d: gap %g, max %g, k3 %g",
                              s, mean, mx, kl);
            else
                ck_assert_msg(mean > 1e-3 && mx > 0, "nvfp4 step %d: gap %g", s, mean);
        }
        json_decref(m);
    }
    ck_assert(pass[0] > 0 && pass[0] == pass[1] && grad > 0);
    qd_test_rm_tree(dir);
}
END_TEST

/* ---- data parallel: every rank a quads process started by a fork()ed child
 * (tests/dist_ranks.h), meeting the others on 127.0.0.1 through the torchrun
 * variables. */

static struct {
    char args[2048];        /* quads arguments of every rank */
    const char *rank1_args; /* appended for rank 1 (NULL: none) */
    const char *env;        /* a variable set for rank env_rank only ("NAME=value"; NULL: none) */
    int env_rank;
} dp_job;

/* One rank: res->st = the exit status, res->msg = the output's tail,
 * res->data = the output's length (int). */
static void dp_rank(qd_rdzv_opts *o, qd_rank_result *res)
{
    char v[64], args[4096], out[1 << 15];
    snprintf(v, sizeof v, "%d", o->rank);
    setenv("RANK", v, 1);
    snprintf(v, sizeof v, "%d", o->world_size);
    setenv("WORLD_SIZE", v, 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    snprintf(v, sizeof v, "%d", o->port);
    setenv("MASTER_PORT", v, 1);
    unsetenv("TORCHELASTIC_USE_AGENT_STORE"), unsetenv("QUADS_RDZV_PORT");
    if (o->rank == dp_job.env_rank && dp_job.env) {
        snprintf(v, sizeof v, "%s", dp_job.env);
        char *eq = strchr(v, '=');
        *eq = '\0';
        setenv(v, eq + 1, 1);
    }
    snprintf(args, sizeof args, "%s %s", dp_job.args, o->rank == 1 && dp_job.rank1_args ? dp_job.rank1_args : "");
    double t0 = qd_test_now();
    res->st = dp_job.env ? qd_test_run_rl_hooks(args, out, sizeof out) : qd_test_run_quads(args, out, sizeof out);
    res->elapsed = qd_test_now() - t0;
    size_t n = strlen(out);
    snprintf(res->msg, sizeof res->msg, "%s", out + (n > 600 ? n - 600 : 0));
    memcpy(res->data, &(int){(int)n}, sizeof(int));
}

/* quads rl as 2 ranks with args (a printf format); results in res. */
static void dp_run(qd_rank_result *res, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(dp_job.args, sizeof dp_job.args, fmt, ap);
    va_end(ap);
    ck_assert(w > 0 && (size_t)w < sizeof dp_job.args);
    qd_test_run_ranks(2, dp_rank, res, 5, 5);
}

/* a and b (the same metric of two runs) agree: numbers within rel (relative,
 * floor 1), the rest equal; path names it in messages. */
static void json_close(const json_t *a, const json_t *b, double rel, const char *path)
{
    if (json_is_number(a) && json_is_number(b)) {
        double x = json_number_value(a), y = json_number_value(b);
        ck_assert_msg(fabs(x - y) <= rel * fmax(1.0, fabs(x)), "%s: %.17g vs %.17g", path, x, y);
    } else if (json_is_array(a)) {
        ck_assert_msg(json_is_array(b) && json_array_size(a) == json_array_size(b), "%s: arrays differ", path);
        for (size_t i = 0; i < json_array_size(a); i++)
            json_close(json_array_get(a, i), json_array_get(b, i), rel, path);
    } else
        ck_assert_msg(json_equal(a, b), "%s differs", path);
}

/* Metrics of the same steps: the exact keys equal, every other number within
 * 1e-5 relative (the order of the float sums over ranks), router agreement
 * (measured on each rank's first micro-batch) not compared. */
static void metrics_close(const json_t *a, const json_t *b)
{
    static const char *const exact[] = {"step", "reward_mean", "pass1_train", "response_len", "samples",
                                        "groups_kept", "gen_batches", "data_pos", "optimizer_step", "updates", "lr"};
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)a, key, v) {
        if (!strcmp(key, "router"))
            continue;
        bool ex = false;
        for (size_t i = 0; i < sizeof exact / sizeof *exact; i++)
            ex |= !strcmp(key, exact[i]);
        const json_t *w = json_object_get(b, key);
        ck_assert_msg(w != NULL, "step %g: %s missing", num(a, "step", NULL), key);
        if (ex)
            ck_assert_msg(json_equal(v, w), "step %g: %s differs", num(a, "step", NULL), key);
        else if (json_is_object(v)) {
            const char *k2;
            json_t *v2;
            json_object_foreach(v, k2, v2) {
                ck_assert_ptr_nonnull(json_object_get(w, k2));
                json_close(v2, json_object_get(w, k2), 1e-5, k2);
            }
        } else
            json_close(v, w, 1e-5, key);
    }
}

/* The master weights of checkpoint dir (param order) into a new buffer. */
static float *ckpt_weights(const char *model, const char *dir, size_t *nf)
{
    qd_model_config cfg;
    ck_assert_int_eq(qd_checkpoint_read_config(model, &cfg), QD_OK);
    qd_backend_options opt = {.num_threads = 1};
    qd_backend *b = qd_backend_cpu_init(&cfg, &opt);
    ck_assert_ptr_nonnull(b);
    int np;
    const qd_param_info *pi = qd_backend_params(b, &np);
    *nf = qd_backend_num_floats(b);
    float *w = malloc(sizeof(float) * *nf);
    ck_assert_msg(qd_checkpoint_load(dir, pi, np, w) == QD_OK, "%s", qd_last_error());
    qd_backend_free(b);
    return w;
}

/* max |a - b| / max(1, |a|) over the weights of two checkpoints. */
static double weights_diff(const char *model, const char *da, const char *db)
{
    size_t n, m;
    float *a = ckpt_weights(model, da, &n), *b = ckpt_weights(model, db, &m);
    ck_assert_uint_eq(n, m);
    double d = 0;
    for (size_t i = 0; i < n; i++)
        d = fmax(d, fabs((double)a[i] - b[i]) / fmax(1.0, fabs((double)a[i])));
    free(a), free(b);
    return d;
}

/* trainer.recompute: the trainer holds one layer's activations and recomputes
 * each layer in the backward; the run is the same, metric for metric (the
 * gap, the losses, the gradient norms, evals) and weight for weight. quads:
 * RAC statistics and diagnostics are gathered once. */
START_TEST(test_rl_recompute_same)
{
    char dir[256], ra[1024], rb[1024], model[1024], fa[2048], fb[2048];
    scratch_dir(dir, sizeof dir);
    make_model(dir);
    for (int k = 0; k < 2; k++) {
        qd_config *c = small_config(dir, k ? "rc" : "plain", "quads", 2);
        if (k)
            ck_assert_int_eq(qd_config_set(c, "trainer.recompute=true"), QD_OK);
        ck_assert_msg(run(c, NULL) == QD_OK, "%s", qd_last_error());
        qd_config_free(c);
    }
    pathf(ra, sizeof ra, "%s/plain", dir);
    pathf(rb, sizeof rb, "%s/rc", dir);
    json_t *ma = metrics_without_time(ra), *mb = metrics_without_time(rb);
    ck_assert_int_eq(json_array_size(ma), 3); /* the eval at step 0, steps 1 and 2 */
    ck_assert_msg(json_equal(ma, mb), "metrics differ with trainer.recompute");
    pathf(model, sizeof model, "%s/model", dir);
    pathf(fa, sizeof fa, "%s/step_00000002", ra);
    pathf(fb, sizeof fb, "%s/step_00000002", rb);
    ck_assert(weights_diff(model, fa, fb) == 0.0);
    json_decref(ma), json_decref(mb);
    qd_test_rm_tree(dir);
}
END_TEST

/* The DP test config: 3 steps, 4 prompts x 4, two updates a step over
 * micro-batches of 3 (groups split across them), dynamic sampling, a KL
 * term, evals at steps 0, 2 and 3, the checksum every step; saved in
 * dir/NAME.json with run.dir dir/NAME. */
static void dp_config(const char *dir, const char *name, const char *recipe)
{
    qd_config *c = small_config(dir, name, recipe, 3);
    static const char *const sets[] = {"rollout.prompts_per_step=4", "trainer.mini_batches=2",
                                       "trainer.micro_batch=3", "algo.dynamic_sampling=true",
                                       "algo.max_gen_batches=2", "algo.kl_coef=0.05", "dist.checksum_every=1",
                                       "dist.timeout_s=5"};
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++)
        ck_assert_int_eq(qd_config_set(c, sets[i]), QD_OK);
    char p[1024];
    pathf(p, sizeof p, "%s/%s.json", dir, name);
    ck_assert_int_eq(qd_config_save(c, p), QD_OK);
    qd_config_free(c);
}

/* 2 ranks against 1 on the same global batch: the rollouts are the same
 * (sequence ids are global), so rewards, lengths and kept groups are equal;
 * losses, KL, clip fractions, gap and grad norm within 1e-5 relative; the
 * final weights within 1e-5; the checksum of every step is the final
 * weights' FNV-1a; only rank 0 writes (the directory holds what the 1-rank
 * run's does; rank 1 prints nothing). */
static void check_dp_equals_one_rank(const char *recipe)
{
    char dir[256], one[1024], two[1024], args[2048], out[1 << 15], model[1024];
    scratch_dir(dir, sizeof dir);
    make_model(dir);
    dp_config(dir, "one", recipe);
    pathf(args, sizeof args, "rl --quiet --config %s/one.json", dir);
    ck_assert_msg(qd_test_run_quads(args, out, sizeof out) == 0, "%s", out);
    qd_rank_result res[2];
    dp_run(res, "rl --quiet --config %s/one.json --set run.dir=%s/two", dir, dir);
    for (int r = 0; r < 2; r++)
        ck_assert_msg(res[r].st == 0, "rank %d: %d %s", r, res[r].st, res[r].msg);
    int len1;
    memcpy(&len1, res[1].data, sizeof len1);
    ck_assert_msg(len1 == 0, "rank 1 printed: %s", res[1].msg);
    ck_assert_ptr_nonnull(strstr(res[0].msg, "run directory:"));
    pathf(one, sizeof one, "%s/one", dir);
    pathf(two, sizeof two, "%s/two", dir);
    ck_assert_int_eq(qd_test_dir_entries(two), qd_test_dir_entries(one));
    ck_assert(exists(two, "step_00000002") && exists(two, "step_00000003") && exists(two, "layers.json"));
    json_t *ma = metrics_without_time(one), *mb = metrics_without_time(two);
    ck_assert_int_eq(json_array_size(ma), 4);
    ck_assert_int_eq(json_array_size(mb), 4);
    double gn = 0;
    for (size_t i = 0; i < 4; i++) {
        json_t *a = json_array_get(ma, i), *b = json_array_get(mb, i);
        if (i > 0) { /* world_size and the checksum are in the 2-rank metrics only */
            ck_assert_int_eq(num(b, "world_size", NULL), 2);
            ck_assert_int_eq(strlen(json_string_value(json_object_get(b, "weights_checksum"))), 16);
            gn += num(a, "grad_norm", NULL);
        }
        metrics_close(a, b);
    }
    ck_assert(gn > 0);
    pathf(model, sizeof model, "%s/model", dir);
    char fa[2048], fb[2048];
    pathf(fa, sizeof fa, "%s/step_00000003", one);
    pathf(fb, sizeof fb, "%s/step_00000003", two);
    double d = weights_diff(model, fa, fb);
    ck_assert_msg(d <= 1e-5, "weights differ by %g", d);
    size_t nf;
    float *w = ckpt_weights(model, fb, &nf);
    char hex[20];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)qd_dp_fnv1a(w, sizeof(float) * nf));
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(mb, 3), "weights_checksum")), hex);
    free(w);
    json_decref(ma), json_decref(mb);
    qd_test_rm_tree(dir);
}

/* nvfp4, and quads: its RAC channels are picked from the activation errors
 * of every rank's rollouts (summed over ranks before each pick), so the
 * 2-rank run quantizes as the 1-rank run does and its rollouts are the same. */
START_TEST(test_rl_dp_equals_one_rank)
{
    check_dp_equals_one_rank("nvfp4");
    check_dp_equals_one_rank("quads");
}
END_TEST

/* Checkpoints hold nothing of a rank: a 2-rank run stopped at step 2 and
 * resumed by 1 rank, and a 1-rank run resumed by 2 ranks, end where the
 * 1-rank run of 3 steps does (step 3's metrics and the weights within 1e-5). */
static void check_dp_resume_other_world(const char *recipe)
{
    char dir[256], args[2048], out[1 << 15], p[1024], model[1024], fa[2048], fb[2048];
    scratch_dir(dir, sizeof dir);
    make_model(dir);
    pathf(model, sizeof model, "%s/model", dir);
    dp_config(dir, "one", recipe);
    pathf(args, sizeof args, "rl --quiet --config %s/one.json", dir);
    ck_assert_msg(qd_test_run_quads(args, out, sizeof out) == 0, "%s", out);
    qd_rank_result res[2];
    /* 2 ranks to step 2, then 1 rank to step 3 */
    dp_run(res, "rl --quiet --config %s/one.json --set run.dir=%s/a --set run.steps=2", dir, dir);
    ck_assert_msg(res[0].st == 0 && res[1].st == 0, "%s / %s", res[0].msg, res[1].msg);
    pathf(args, sizeof args, "rl --quiet --resume %s/a --set run.steps=3", dir);
    ck_assert_msg(qd_test_run_quads(args, out, sizeof out) == 0, "%s", out);
    /* 1 rank to step 2, then 2 ranks to step 3 */
    pathf(args, sizeof args, "rl --quiet --config %s/one.json --set run.dir=%s/b --set run.steps=2", dir, dir);
    ck_assert_msg(qd_test_run_quads(args, out, sizeof out) == 0, "%s", out);
    dp_run(res, "rl --quiet --resume %s/b --set run.steps=3", dir);
    ck_assert_msg(res[0].st == 0 && res[1].st == 0, "%s / %s", res[0].msg, res[1].msg);
    ck_assert_ptr_nonnull(strstr(res[0].msg, "run directory:"));
    pathf(p, sizeof p, "%s/one", dir);
    json_t *ref = metrics_without_time(p);
    pathf(fa, sizeof fa, "%s/one/step_00000003", dir);
    for (int k = 0; k < 2; k++) {
        pathf(p, sizeof p, "%s/%s", dir, k ? "b" : "a");
        json_t *m = metrics_without_time(p);
        ck_assert_int_eq(json_array_size(m), 4);
        for (size_t i = 0; i < 4; i++)
            metrics_close(json_array_get(ref, i), json_array_get(m, i));
        json_decref(m);
        pathf(fb, sizeof fb, "%s/step_00000003", p);
        double d = weights_diff(model, fa, fb);
        ck_assert_msg(d <= 1e-5, "%s: weights differ by %g", p, d);
    }
    json_decref(ref);
    qd_test_rm_tree(dir);
}

/* nvfp4, and quads: the checkpoint holds the job's RAC statistics (summed
 * over ranks), which a resumed rank 0 takes and the other ranks do not. */
START_TEST(test_rl_dp_resume_other_world)
{
    check_dp_resume_other_world("nvfp4");
    check_dp_resume_other_world("quads");
}
END_TEST

/* Failures end every rank, named, within the timeout (dist.timeout_s 5):
 * rank 1, then rank 0, dies in step 2; rank 1 hits a NaN (it aborts with the reason);
 * rank 1 runs another config (refused by the run id); fewer prompts than ranks. */
START_TEST(test_rl_dp_failures)
{
    char dir[256];
    scratch_dir(dir, sizeof dir);
    make_model(dir);
    dp_config(dir, "f", "nvfp4");
    qd_rank_result res[2];
    for (int dead = 0; dead < 2; dead++) {
        dp_job.env = "QD_RL_TEST_KILL_STEP=2", dp_job.env_rank = dead;
        dp_run(res, "rl --quiet --config %s/f.json --set run.dir=%s/kill%d", dir, dir, dead);
        ck_assert_int_eq(res[dead].st, QD_TEST_KILL_EXIT);
        char want[64];
        snprintf(want, sizeof want, "rank %d closed its connection", dead);
        const qd_rank_result *live = &res[1 - dead];
        ck_assert_msg(live->st == 1 && strstr(live->msg, "step 2: ") && strstr(live->msg, want), "rank %d: %d %s",
                      1 - dead, live->st, live->msg);
        ck_assert_msg(live->elapsed < 5, "rank %d took %.1f s", 1 - dead, live->elapsed);
    }
    dp_job.env = "QD_RL_TEST_NAN_STEP=2", dp_job.env_rank = 1;
    dp_run(res, "rl --quiet --config %s/f.json --set run.dir=%s/nan", dir, dir);
    ck_assert_msg(res[1].st == 1 && strstr(res[1].msg, "trainer log-prob of sample 0 token 0 is nan"), "%s",
                  res[1].msg);
    ck_assert_msg(res[0].st == 1 && strstr(res[0].msg, "rank 1 aborted: step 2: trainer log-prob"), "%s",
                  res[0].msg);
    ck_assert(res[0].elapsed < 5);
    dp_job.env = NULL;
    dp_job.rank1_args = "--set trainer.lr=1e-3 --set dist.timeout_s=2";
    dp_run(res, "rl --quiet --config %s/f.json --set run.dir=%s/other --set dist.timeout_s=2", dir, dir);
    dp_job.rank1_args = NULL;
    for (int r = 0; r < 2; r++)
        ck_assert_msg(res[r].st == 1 && strstr(res[r].msg, "run id") && strstr(res[r].msg, "rank 1"), "rank %d: %s",
                      r, res[r].msg);
    dp_run(res, "rl --quiet --config %s/f.json --set run.dir=%s/few --set rollout.prompts_per_step=1 --set trainer.mini_batches=1", dir, dir);
    for (int r = 0; r < 2; r++)
        ck_assert_msg(res[r].st == 1 && strstr(res[r].msg, "rollout.prompts_per_step: 1, below the world size 2"),
                      "rank %d: %s", r, res[r].msg);
    qd_test_rm_tree(dir);
}
END_TEST

/* orchestrator/dp.h's collectives, 3 ranks: a float sum of 2.5 M values
 * (two 8 MiB chunks and a rest) equal on every rank to the exact sum, a double
 * sum, a maximum, a gather of blobs of different sizes in rank order; FNV-1a
 * against its published vectors. */
static void dp_collectives_rank(qd_rdzv_opts *o, qd_rank_result *res)
{
    qd_dist_env env = {.rank = o->rank, .world_size = o->world_size, .local_rank = o->rank, .rdzv_port = o->port};
    snprintf(env.master_addr, sizeof env.master_addr, "127.0.0.1");
    qd_dp dp;
    double t0 = qd_test_now();
    size_t n = 2500007;
    float *x = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(i % 1000) * (float)(o->rank + 1);
    double d[2] = {0.25 * o->rank, -1.0 * o->rank}, mx[2] = {(double)o->rank, -(double)o->rank};
    uint8_t blob[3] = {(uint8_t)(10 + o->rank), 7, 7}, *all = NULL;
    size_t off[4];
    qd_status st = qd_dp_open(&dp, &env, 42, 5);
    if (!st)
        st = qd_dp_sum_f32(&dp, x, n);
    if (!st)
        st = qd_dp_sum_f64(&dp, d, 2);
    if (!st)
        st = qd_dp_max_f64(&dp, mx, 2);
    if (!st)
        st = qd_dp_gatherv(&dp, blob, (size_t)o->rank + 1, &all, off); /* rank r sends r + 1 bytes */
    if (!st)
        st = qd_dp_finish(&dp);
    int bad = 0;
    for (size_t i = 0; !st && i < n; i++)
        bad += x[i] != (float)(i % 1000) * 6.0f;
    res->data[0] = (uint8_t)(bad != 0);
    res->data[1] = d[0] == 0.75 && d[1] == -3.0 && mx[0] == 2.0 && mx[1] == 0.0;
    res->data[2] = !st && off[3] == 6 && all[0] == 10 && all[1] == 11 && all[2] == 7 && all[3] == 12 && all[5] == 7;
    free(x), free(all);
    qd_test_note(res, st, t0);
}

START_TEST(test_rl_dp_collectives)
{
    ck_assert_uint_eq(qd_dp_fnv1a("", 0), 0xcbf29ce484222325ull);
    ck_assert_uint_eq(qd_dp_fnv1a("a", 1), 0xaf63dc4c8601ec8cull);
    ck_assert_uint_eq(qd_dp_fnv1a("foobar", 6), 0x85944171f73967e8ull);
    qd_rank_result res[3];
    qd_test_run_ranks(3, dp_collectives_rank, res, 5, 5);
    for (int r = 0; r < 3; r++) {
        ck_assert_msg(res[r].st == 0, "rank %d: %s", r, res[r].msg);
        ck_assert_msg(res[r].data[0] == 0 && res[r].data[1] == 1 && res[r].data[2] == 1, "rank %d: %d %d %d", r,
                      res[r].data[0], res[r].data[1], res[r].data[2]);
    }
}
END_TEST

static void add_case(Suite *s, const char *name, const TTest *t)
{
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, t);
    suite_add_tcase(s, tc);
}

Suite *suite_rl(void)
{
    Suite *s = suite_create("rl");
    add_case(s, "recipes", test_rl_every_recipe);
    add_case(s, "resume", test_rl_kill_and_resume);
    add_case(s, "resume_replay", test_rl_kill_and_resume_replay);
    add_case(s, "resume_variants", test_rl_kill_and_resume_variants);
    add_case(s, "learns", test_rl_learns_the_reward);
    add_case(s, "nan", test_rl_nan_stops);
    add_case(s, "recompute", test_rl_recompute_same);
    add_case(s, "checkpoint_verified", test_rl_checkpoint_verified);
    add_case(s, "benchmark_task", test_rl_benchmark_task);
    add_case(s, "code_task", test_rl_code_task);
    add_case(s, "cli_errors", test_rl_cli_config_errors);
    add_case(s, "cli_compare", test_rl_cli_compare);
    add_case(s, "cli_compare_seeds", test_rl_cli_compare_seeds);
    add_case(s, "cli_compare_jobs", test_rl_cli_compare_jobs);
    add_case(s, "eval_bf16", test_rl_eval_bf16);
    add_case(s, "default_model", test_rl_default_model);
    add_case(s, "default_model_out_of_tree", test_rl_default_model_out_of_tree);
    add_case(s, "temperature", test_rl_temperature_no_gap);
    add_case(s, "replay", test_rl_replay_no_gap);
    add_case(s, "dp_collectives", test_rl_dp_collectives);
    add_case(s, "dp_equals_one_rank", test_rl_dp_equals_one_rank);
    add_case(s, "dp_resume_other_world", test_rl_dp_resume_other_world);
    add_case(s, "dp_failures", test_rl_dp_failures);
    return s;
}
