/* Suite "tiny": the synthetic task's format and reward, the generated
 * tokenizer, `quads sft`'s determinism, and the shipped tiny model. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include "tests/suites.h"
#include "models/checkpoint.h"
#include "orchestrator/task.h"
#include "orchestrator/sft.h"
#include "quant/fileio.h"

static qd_tokenizer *tiny_tokenizer(void)
{
    char *json;
    size_t len;
    qd_tokenizer *tok;
    ck_assert_int_eq(qd_sft_tokenizer_json(&json, &len), QD_OK);
    ck_assert_int_eq(qd_tokenizer_load_string(json, len, "tiny tokenizer.json", &tok), QD_OK);
    free(json);
    return tok;
}

/* ids of text (n of them) */
static int32_t *encode(const qd_tokenizer *tok, const char *text, size_t *n)
{
    int32_t *ids;
    ck_assert_int_eq(qd_tokenizer_encode(tok, text, strlen(text), &ids, n), QD_OK);
    return ids;
}

START_TEST(test_task_prompt_format)
{
    char *p;
    ck_assert_int_eq(qd_task_prompt_text("What is 35 + 79?", &p), QD_OK);
    ck_assert_str_eq(p, "Q: What is 35 + 79?\nA: ");
    free(p);
}
END_TEST

START_TEST(test_task_parse)
{
    qd_synth_opts o = {.seed = 7};
    ck_assert_int_eq(qd_task_parse("arith", &o), QD_OK);
    ck_assert_int_eq(o.steps, QD_TASK_DEFAULT_STEPS);
    ck_assert_int_eq(o.max_operand, QD_TASK_DEFAULT_MAX_OPERAND);
    ck_assert_int_eq(qd_task_parse("arith3:50", &o), QD_OK);
    ck_assert_int_eq(o.steps, 3);
    ck_assert_int_eq(o.max_operand, 50);
    ck_assert_int_eq(o.seed, 7);
    ck_assert_int_eq(qd_task_parse("arith5", &o), QD_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "arith5"));
    ck_assert_int_eq(qd_task_parse("arith1:0", &o), QD_ERR_ARG);
    ck_assert_int_eq(qd_task_parse("arith1:", &o), QD_ERR_ARG);
    ck_assert_int_eq(qd_task_parse("gsm8k", &o), QD_ERR_ARG);
}
END_TEST

/* Prompt ids are the ids of the prompt text; the target adds the answer's ids
 * and the end token, which equals tokenizing the whole text (digits never merge). */
START_TEST(test_task_encode)
{
    qd_tokenizer *tok = tiny_tokenizer();
    int32_t *ids, *want, end;
    size_t n, np, nw;
    ck_assert_int_eq(qd_task_end_id(tok, &end), QD_OK);
    ck_assert_int_eq(end, 269);
    ck_assert_int_eq(qd_task_encode(tok, "What is 35 + 79?", "114", &ids, &n, &np), QD_OK);
    want = encode(tok, "Q: What is 35 + 79?\nA: 114<|endoftext|>", &nw);
    ck_assert_uint_eq(n, nw);
    ck_assert_mem_eq(ids, want, n * sizeof *ids);
    ck_assert_int_eq(ids[n - 1], end);
    ck_assert_uint_eq(np, n - 4); /* "1", "1", "4", end */
    free(want);
    want = encode(tok, "Q: What is 35 + 79?\nA: ", &nw);
    ck_assert_uint_eq(np, nw);
    ck_assert_mem_eq(ids, want, np * sizeof *ids);
    free(want);
    free(ids);
    ck_assert_int_eq(qd_task_encode(tok, "What is 35 + 79?", NULL, &ids, &n, &np), QD_OK);
    ck_assert_uint_eq(n, np);
    ck_assert_uint_eq(n, nw);
    free(ids);
    qd_tokenizer_free(tok);
}
END_TEST

/* The reward of the completion text (with "<|endoftext|>" spelled inside it). */
static float reward_of(const qd_tokenizer *tok, const char *completion, const char *gold, int *fmt)
{
    size_t n;
    int32_t *ids = encode(tok, completion, &n);
    float r = -1;
    ck_assert_int_eq(qd_task_reward(tok, ids, n, gold, &r, fmt), QD_OK);
    free(ids);
    return r;
}

START_TEST(test_task_reward)
{
    qd_tokenizer *tok = tiny_tokenizer();
    int fmt;
    ck_assert_float_eq(reward_of(tok, "114<|endoftext|>", "114", &fmt), 1.0f);
    ck_assert_int_eq(fmt, 1);
    ck_assert_float_eq(reward_of(tok, " 114 \n<|endoftext|>", "114", &fmt), 1.0f); /* trimmed */
    ck_assert_float_eq(reward_of(tok, "114<|endoftext|>7", "114", &fmt), 1.0f);   /* after the end: ignored */
    ck_assert_float_eq(reward_of(tok, "114", "114", &fmt), 1.0f);                 /* no end token */
    ck_assert_int_eq(fmt, 0);
    ck_assert_float_eq(reward_of(tok, "1147<|endoftext|>", "114", &fmt), 0.0f);
    ck_assert_int_eq(fmt, 1);
    ck_assert_float_eq(reward_of(tok, "-114<|endoftext|>", "114", &fmt), 0.0f);
    ck_assert_float_eq(reward_of(tok, "11<|endoftext|>4", "114", &fmt), 0.0f);
    ck_assert_float_eq(reward_of(tok, "1 14<|endoftext|>", "114", &fmt), 0.0f);
    ck_assert_float_eq(reward_of(tok, "114<|im_end|>", "114", &fmt), 0.0f); /* another special is text */
    ck_assert_float_eq(reward_of(tok, "<|endoftext|>", "114", &fmt), 0.0f);
    ck_assert_int_eq(fmt, 1);
    ck_assert_float_eq(reward_of(tok, "-5<|endoftext|>", "-5", &fmt), 1.0f);
    /* ids that name no token: wrong, not an error */
    int32_t bad[] = {49, 49, 52, 100000, 269};
    float r = -1;
    ck_assert_int_eq(qd_task_reward(tok, bad, 5, "114", &r, &fmt), QD_OK);
    ck_assert_float_eq(r, 0.0f);
    ck_assert_int_eq(fmt, 1);
    qd_tokenizer_free(tok);
}
END_TEST

/* The generated tokenizer: 272 ids, specials where the task expects them,
 * and text round-trips. (tests/ref/check_tiny_tokenizer.py checks the ids
 * against Hugging Face tokenizers.) */
START_TEST(test_tokenizer_generated)
{
    qd_tokenizer *tok = tiny_tokenizer();
    ck_assert_int_eq(qd_tokenizer_n_ids(tok), QD_SFT_TOK_VOCAB);
    ck_assert_int_eq(QD_SFT_TOK_VOCAB % 16, 0);
    ck_assert_int_eq(qd_tokenizer_token_id(tok, "<|endoftext|>"), 269);
    ck_assert_int_eq(qd_tokenizer_token_id(tok, "<|im_start|>"), 270);
    ck_assert_int_eq(qd_tokenizer_token_id(tok, "<|im_end|>"), 271);
    ck_assert(qd_tokenizer_is_special(tok, 269));
    ck_assert_int_eq(qd_tokenizer_token_id(tok, "\xc4\xa0What"), 259); /* "ĠWhat" */
    /* "Q: What is 35 + 79?\nA: " = Q : ĠWhat Ġis Ġ 3 5 Ġ+ Ġ 7 9 ? Ċ A : Ġ */
    static const int32_t want[] = {'Q', ':', 259, 261, 32, '3', '5', 262, 32, '7', '9', '?', 10, 'A', ':', 32};
    size_t n;
    int32_t *ids = encode(tok, "Q: What is 35 + 79?\nA: ", &n);
    ck_assert_uint_eq(n, sizeof want / sizeof want[0]);
    ck_assert_mem_eq(ids, want, sizeof want);
    free(ids);
    const char *text = "caf\xc3\xa9 \x01\x7f-ish the (1 * 2)<|im_end|>";
    ids = encode(tok, text, &n);
    char *back;
    size_t blen;
    ck_assert_int_eq(qd_tokenizer_decode(tok, ids, n, 0, &back, &blen), QD_OK);
    ck_assert_str_eq(back, text);
    free(back);
    free(ids);
    for (int32_t i = 0; i < QD_SFT_TOK_VOCAB; i++) { /* every id of the model decodes */
        ck_assert_int_eq(qd_tokenizer_decode(tok, &i, 1, 0, &back, &blen), QD_OK);
        free(back);
    }
    qd_tokenizer_free(tok);
}
END_TEST

/* The seeded init: a pure function of (seed, tensor, element); norms 1 and
 * matrices ~ N(0, 1/fan_in). */
START_TEST(test_init_weights)
{
    qd_param_info info[2] = {{"w", 64, 256, 0}, {"model.norm.weight", 1, 64, 64 * 256}};
    size_t nf = 64 * 256 + 64;
    float *a = malloc(nf * sizeof *a), *b = malloc(nf * sizeof *b);
    qd_sft_init_weights(info, 2, 5, a);
    qd_sft_init_weights(info, 2, 5, b);
    ck_assert_mem_eq(a, b, nf * sizeof *a);
    double sum = 0, sq = 0;
    for (size_t i = 0; i < 64 * 256; i++) {
        sum += a[i];
        sq += (double)a[i] * a[i];
    }
    double mean = sum / (64 * 256), var = sq / (64 * 256) - mean * mean;
    ck_assert_double_lt(fabs(mean), 0.005);
    ck_assert_double_lt(fabs(var * 256 - 1.0), 0.05); /* std 1/sqrt(256) */
    for (size_t i = 64 * 256; i < nf; i++)
        ck_assert_float_eq(a[i], 1.0f);
    qd_sft_init_weights(info, 2, 6, b);
    ck_assert(memcmp(a, b, 64 * 256 * sizeof *a) != 0);
    free(a);
    free(b);
}
END_TEST

static void record_loss(int step, int steps, double loss, double lr, void *ctx)
{
    ((double *)ctx)[step - 1] = loss;
}

/* A short sft at `threads` threads: the trained weights (malloc'd, *nf floats)
 * and the losses of its steps. */
static float *short_sft(int threads, int steps, double *losses, size_t *nf)
{
    qd_model_config cfg;
    ck_assert_int_eq(qd_sft_make_config(&qd_sft_default_dims, &cfg), QD_OK);
    qd_backend_options bo = {.recipe = QD_RECIPE_FP32, .role = QD_ROLE_TRAINER, .num_threads = threads};
    qd_backend *b = qd_backend_cpu_init(&cfg, &bo);
    ck_assert_ptr_nonnull(b);
    int n;
    const qd_param_info *info = qd_backend_params(b, &n);
    *nf = qd_backend_num_floats(b);
    float *w = malloc(*nf * sizeof *w);
    qd_sft_init_weights(info, n, 3, w);
    ck_assert_int_eq(qd_backend_set_weights(b, w, *nf), QD_OK);
    qd_sft_options o;
    qd_sft_default_options(&o);
    o.seed = 3;
    o.steps = steps;
    o.batch = 8;
    o.warmup = 2;
    o.train_problems = 200;
    o.progress = record_loss;
    o.ctx = losses;
    qd_tokenizer *tok = tiny_tokenizer();
    double final;
    ck_assert_int_eq(qd_sft_train(b, tok, &o, &final), QD_OK);
    ck_assert_double_eq(final, losses[steps - 1]);
    ck_assert_int_eq(qd_backend_get_weights(b, w, *nf), QD_OK);
    qd_tokenizer_free(tok);
    qd_backend_free(b);
    return w;
}

/* Same bytes at 1 and 2 threads and on a second run (one 2-thread run: under
 * load OpenMP barriers make it the slow one); the loss starts near
 * ln(vocab) and falls. */
START_TEST(test_sft_deterministic)
{
    enum { STEPS = 12 };
    double l1[STEPS], l2[STEPS], l3[STEPS];
    size_t n1, n2, n3;
    float *w1 = short_sft(1, STEPS, l1, &n1), *w2 = short_sft(2, STEPS, l2, &n2), *w3 = short_sft(1, STEPS, l3, &n3);
    ck_assert_uint_eq(n1, n2);
    ck_assert_mem_eq(w1, w2, n1 * sizeof *w1);
    ck_assert_mem_eq(w2, w3, n1 * sizeof *w1);
    ck_assert_mem_eq(l1, l2, sizeof l1);
    ck_assert_double_lt(fabs(l1[0] - log(QD_SFT_TOK_VOCAB)), 1.5);
    ck_assert_double_lt(l1[STEPS - 1], l1[0] - 1.0);
    free(w1);
    free(w2);
    free(w3);
}
END_TEST

/* quads sft --eval-every: the held-out eval every N steps (with the
 * --eval-precision recipe's rollout); --stop-at ends the training at the
 * first eval that reaches it and saves that step's weights; the options
 * that do not fit together are refused. */
START_TEST(test_sft_eval_every_and_stop)
{
    char dir[256], args[1024], out[1 << 14];
    qd_test_mkdtemp(dir, sizeof dir, "sft");
    const char *common = "--steps 20 --batch 4 --train-problems 100 --eval 8 --eval-samples 1 --eval-temperature 0 "
                         "--threads 1 --hidden 32 --layers 1 --heads 2 --kv-heads 1 --head-dim 16 --experts 4 "
                         "--top-k 2 --moe-intermediate 16 --eval-every 5";
    snprintf(args, sizeof args, "sft --out %s/a %s --eval-precision bf16", dir, common);
    ck_assert_msg(qd_test_run_quads(args, out, sizeof out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "step 5: held-out pass@1 ") && strstr(out, "step 15: held-out pass@1 ") &&
                  !strstr(out, "step 20: held-out") && strstr(out, "trained 20 steps in") &&
                  strstr(out, "temperature 0, bf16, seed 1"), "%s", out);
    snprintf(args, sizeof args, "sft --out %s/b %s --stop-at 0", dir, common);
    ck_assert_msg(qd_test_run_quads(args, out, sizeof out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "step 5: held-out pass@1 ") && !strstr(out, "step 10:") &&
                  strstr(out, "trained 5 steps in") && strstr(out, "(stopped early: --stop-at reached)") &&
                  strstr(out, "temperature 0, fp32, seed 1"), "%s", out);
    ck_assert(access(qd_test_join(dir, "b/model.safetensors"), F_OK) == 0);
    /* --recompute: the same weights (the backward recomputes each layer's activations) */
    snprintf(args, sizeof args, "sft --out %s/r %s --stop-at 0 --recompute", dir, common);
    ck_assert_msg(qd_test_run_quads(args, out, sizeof out) == 0, "%s", out);
    char wb[1024];
    snprintf(wb, sizeof wb, "%s", qd_test_join(dir, "b/model.safetensors"));
    ck_assert(qd_test_same_file(wb, qd_test_join(dir, "r/model.safetensors")));
    static const char *const bad[][2] = {
        {"--stop-at 0.5 --eval-every 0", "--stop-at needs --eval-every N"},
        {"--stop-at 1.5 --eval-every 5", "--stop-at: a pass@1 in 0..1"},
        {"--eval-precision int4", "--eval-precision: expected fp32, bf16"},
        {"--backend gpu", "--backend: unknown value 'gpu'"},
        {"--mode fast --backend cpu", "the cpu backend runs exact mode only"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(args, sizeof args, "sft --out %s/c %s", dir, bad[i][0]);
        ck_assert_int_eq(qd_test_run_quads(args, out, sizeof out), 2);
        ck_assert_msg(strstr(out, bad[i][1]), "%s: %s", bad[i][0], out);
    }
    qd_test_rm_tree(dir);
}
END_TEST

/* The shipped model: the required shape, size, and a held-out pass@1 at the
 * rollout temperature that leaves RL room. */
START_TEST(test_shipped_model)
{
    char dir[4096]; /* qd_test_path's buffer is reused by the next call */
    snprintf(dir, sizeof dir, "%s", qd_test_path("models/tiny"));
    qd_model_config c;
    ck_assert_int_eq(qd_checkpoint_read_config(dir, &c), QD_OK);
    ck_assert_int_eq(c.arch, QD_ARCH_QWEN3_MOE);
    int dims[] = {c.vocab_size, c.hidden_size, c.moe_intermediate_size, c.head_dim,
                  c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        ck_assert_int_eq(dims[i] % 16, 0);
    ck_assert_int_ge(c.num_experts, 8);
    ck_assert_int_eq(c.num_experts_per_tok, 2);
    ck_assert_int_ge(c.num_hidden_layers, 2);
    for (int l = 0; l < c.num_hidden_layers; l++)
        ck_assert(qd_model_config_is_moe_layer(&c, l));
    struct stat sb;
    ck_assert_int_eq(stat(qd_test_path("models/tiny/model.safetensors"), &sb), 0);
    ck_assert_int_le(sb.st_size, 8 << 20);

    /* the shipped tokenizer is the generated one, byte for byte */
    char *shipped, *gen;
    size_t ns, ng;
    ck_assert_int_eq(qd_read_file(qd_test_path("models/tiny/tokenizer.json"), &shipped, &ns), QD_OK);
    ck_assert_int_eq(qd_sft_tokenizer_json(&gen, &ng), QD_OK);
    ck_assert_uint_eq(ns, ng + 1);
    ck_assert_mem_eq(shipped, gen, ng);
    free(shipped);
    free(gen);

    qd_tokenizer *tok;
    ck_assert_int_eq(qd_tokenizer_load(qd_test_path("models/tiny/tokenizer.json"), &tok), QD_OK);
    ck_assert_int_eq(qd_tokenizer_n_ids(tok), c.vocab_size);
    qd_backend *b = qd_checkpoint_open_backend(dir, "cpu", NULL);
    ck_assert_msg(b != NULL, "%s", qd_last_error());
    qd_synth_opts so = {.seed = 1};
    ck_assert_int_eq(qd_task_parse("arith", &so), QD_OK);
    qd_bench_set set;
    ck_assert_int_eq(qd_synth_generate(&so, QD_SPLIT_TEST, 100, &set), QD_OK);
    qd_task_eval_result r, r2;
    ck_assert_int_eq(qd_task_eval(b, tok, &set, 0, 4, 1.0f, 1, 0, NULL, &r), QD_OK);
    ck_assert_int_eq(r.problems, 100);
    ck_assert_int_eq(r.completions, 400);
    ck_assert_double_ge(r.pass1, 0.2);
    ck_assert_double_le(r.pass1, 0.7);
    ck_assert_double_gt(r.format_rate, 0.9);
    /* the same seed gives the same samples; limit takes the first problems */
    ck_assert_int_eq(qd_task_eval(b, tok, &set, 10, 4, 1.0f, 1, 0, NULL, &r2), QD_OK);
    ck_assert_int_eq(r2.problems, 10);
    qd_task_eval_result r3;
    ck_assert_int_eq(qd_task_eval(b, tok, &set, 10, 4, 1.0f, 1, 0, NULL, &r3), QD_OK);
    ck_assert_double_eq(r2.pass1, r3.pass1);
    ck_assert_double_eq(r2.mean_len, r3.mean_len);
    qd_bench_set_free(&set);
    qd_backend_free(b);
    qd_tokenizer_free(tok);
}
END_TEST

/* Greedy completions of the shipped model equal those of an independent numpy
 * forward written from transformers' Qwen3-MoE semantics
 * (tests/ref/check_tiny_model.py): the files mean what the HF layout says. */
START_TEST(test_shipped_matches_numpy_reference)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", qd_test_path("models/tiny"));
    json_error_t err;
    json_t *root = json_load_file(qd_test_path("tests/fixtures/tiny/greedy.json"), 0, &err);
    ck_assert_msg(root != NULL, "%s", err.text);
    qd_tokenizer *tok;
    ck_assert_int_eq(qd_tokenizer_load(qd_test_path("models/tiny/tokenizer.json"), &tok), QD_OK);
    qd_backend *b = qd_checkpoint_open_backend(dir, "cpu", NULL);
    ck_assert_ptr_nonnull(b);
    int32_t end;
    ck_assert_int_eq(qd_task_end_id(tok, &end), QD_OK);
    size_t i, compared = 0;
    json_t *rec;
    json_array_foreach(root, i, rec) {
        if (json_real_value(json_object_get(rec, "min_margin")) < 1e-3)
            continue; /* a near tie: float32 and float64 may pick differently */
        int32_t *ids;
        size_t n;
        ck_assert_int_eq(qd_task_encode(tok, json_string_value(json_object_get(rec, "problem")), NULL, &ids, &n, NULL),
                         QD_OK);
        int32_t out[12], olen, plen = (int32_t)n;
        float logp[12];
        uint64_t sid = 0;
        qd_generate_request req = {.B = 1, .Tp = (int)n, .prompt = ids, .prompt_len = &plen, .seq_id = &sid,
                                   .seed = 1, .max_new_tokens = 12, .temperature = 0, .top_p = 1.0f,
                                   .stop = &end, .num_stop = 1};
        qd_generate_result res = {.tokens = out, .logp = logp, .lengths = &olen};
        ck_assert_int_eq(qd_backend_generate(b, &req, &res), QD_OK);
        const json_t *want = json_object_get(rec, "completion");
        ck_assert_int_eq(olen, (int)json_array_size(want));
        for (int k = 0; k < olen; k++)
            ck_assert_int_eq(out[k], json_integer_value(json_array_get(want, (size_t)k)));
        free(ids);
        compared++;
    }
    ck_assert_uint_ge(compared, 30);
    json_decref(root);
    qd_backend_free(b);
    qd_tokenizer_free(tok);
}
END_TEST

Suite *suite_tiny(void)
{
    Suite *s = suite_create("tiny");
    TCase *tc = tcase_create("task");
    tcase_add_test(tc, test_task_prompt_format);
    tcase_add_test(tc, test_task_parse);
    tcase_add_test(tc, test_task_encode);
    tcase_add_test(tc, test_task_reward);
    suite_add_tcase(s, tc);
    tc = tcase_create("sft");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_tokenizer_generated);
    tcase_add_test(tc, test_init_weights);
    tcase_add_test(tc, test_sft_deterministic);
    tcase_add_test(tc, test_sft_eval_every_and_stop);
    suite_add_tcase(s, tc);
    tc = tcase_create("shipped");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_shipped_model);
    tcase_add_test(tc, test_shipped_matches_numpy_reference);
    suite_add_tcase(s, tc);
    return s;
}
