/* Check suite of the evaluation harness (benchmarks/eval*.c, quads eval) and
 * of the quads grade program end to end.
 *
 * The reference for grading is nobody's code here: OpenAI's
 * grade-school-math example_model_solutions.jsonl holds real outputs of four
 * GPT-3 models on the GSM8K test set, each with its own is_correct label.
 * pass@k on a constructed case is checked against exact fractions
 * (1 - C(n-c,k)/C(n,k) worked out by hand). */
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
#include "benchmarks/dataset.h"
#include "benchmarks/eval.h"
#include "benchmarks/registry.h"
#include "benchmarks/sha256.h"
#include "benchmarks/synth.h"
#include "quant/fileio.h"

#define FX "tests/fixtures/benchmarks/"
#define EPS 1e-12

static const char *const gpt3_keys[] = {"6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification"};

/* ---- temporary directories and files ---------------------------------- */

/* The whole file as a malloc'd string ("" when absent). */
static char *read_all(const char *path)
{
    char *text;
    size_t len;
    return qd_read_file(path, &text, &len) == QD_OK ? text : strdup("");
}

/* ---- GSM8K: real model outputs against their correctness labels --------- */

typedef struct {
    json_t *rows; /* example_model_solutions.jsonl, one object a line */
    int first_key; /* sample j comes from gpt3_keys[first_key + j] */
    size_t next;   /* the row of the next prompt */
    double tokens, chars;
} label_gen;

static int words(const char *s)
{
    int n = 0;
    for (const char *p = s; *p; p++)
        n += !strchr(" \n\t", *p) && (p == s || strchr(" \n\t", p[-1]));
    return n;
}

static size_t code_points(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* Serves the GPT-3 solutions; "tokens" are word counts, to check the means. */
static qd_status gen_labels(void *ctx, const char *const *prompts, int n, int k, char **out, int *tokens)
{
    label_gen *g = ctx;
    for (int i = 0; i < n; i++, g->next++) {
        json_t *row = json_array_get(g->rows, g->next);
        ck_assert_str_eq(prompts[i], json_string_value(json_object_get(row, "question")));
        for (int j = 0; j < k; j++) {
            json_t *m = json_object_get(row, gpt3_keys[g->first_key + j]);
            const char *sol = json_string_value(json_object_get(m, "solution"));
            out[i * k + j] = strdup(sol);
            tokens[i * k + j] = words(sol);
            g->tokens += words(sol);
            g->chars += (double)code_points(sol);
        }
    }
    return QD_OK;
}

static void load_gsm8k(qd_bench_set *s)
{
    qd_bench_fields f = {"question", "answer", NULL, NULL, QD_ANSWER_GSM8K};
    ck_assert_int_eq(qd_bench_load_file(qd_test_path(FX "gsm8k_test.jsonl"), &f, s), QD_OK);
    ck_assert_uint_eq(s->n, 1319);
}

/* Correct samples per problem according to the labels of keys [first, first+k). */
static int label_count(json_t *row, int first, int k)
{
    int c = 0;
    for (int j = 0; j < k; j++)
        c += json_is_true(json_object_get(json_object_get(row, gpt3_keys[first + j]), "is_correct"));
    return c;
}

START_TEST(test_gsm8k_pass1_matches_labels)
{
    /* Each GPT-3 model alone (K = 1): pass@1 * 1319 is its number of is_correct labels. */
    qd_bench_set s;
    load_gsm8k(&s);
    label_gen g = {.rows = qd_test_load_jsonl(qd_test_path(FX "gsm8k_example_model_solutions.jsonl")), .first_key = _i};
    size_t labels = 0;
    for (size_t i = 0; i < json_array_size(g.rows); i++)
        labels += (size_t)label_count(json_array_get(g.rows, i), _i, 1);
    static const size_t known[] = {286, 515, 458, 742}; /* counted once with Python from the same file */
    ck_assert_uint_eq(labels, known[_i]);
    qd_eval_opts o;
    qd_eval_opts_default(&o);
    o.prompt_template = "{problem}";
    o.batch = 100; /* 1319 = 13 * 100 + 19: a short last batch */
    o.progress = 0;
    qd_eval_bench b = {.name = "gsm8k", .set = &s, .style = QD_GRADE_GSM8K};
    qd_eval_report r;
    ck_assert_msg(qd_eval_run(&b, 1, &o, gen_labels, &g, &r) == QD_OK, "%s", qd_last_error());
    ck_assert_uint_eq(g.next, 1319);
    const qd_eval_result *e = &r.bench[0];
    ck_assert_uint_eq(e->n_correct, labels);
    ck_assert_double_eq_tol(e->pass1, (double)labels / 1319.0, EPS);
    ck_assert_double_eq_tol(e->maj_k, e->pass1, EPS); /* K = 1: the vote is the sample */
    ck_assert_int_eq(e->n_pass, 1);
    ck_assert_double_eq_tol(e->mean_tokens, g.tokens / 1319.0, 1e-9);
    ck_assert_double_eq_tol(e->mean_chars, g.chars / 1319.0, 1e-9);
    ck_assert(e->pass1_lo < e->pass1 && e->pass1 < e->pass1_hi);
    /* The normal approximation's half width sqrt(p(1-p)/n) * 1.96, within 15%. */
    double half = 1.96 * sqrt(e->pass1 * (1 - e->pass1) / 1319.0);
    ck_assert_double_eq_tol(e->pass1_hi - e->pass1_lo, 2 * half, 0.3 * half);
    qd_eval_report_free(&r);
    json_decref(g.rows);
    qd_bench_set_free(&s);
}
END_TEST

/* 1 - C(4-c,k)/C(4,k): the exact pass@k of 4 samples, from a table of binomials. */
static double pass_of_4(int c, int k)
{
    static const double C[5][5] = {{1}, {1, 1}, {1, 2, 1}, {1, 3, 3, 1}, {1, 4, 6, 4, 1}};
    return 1.0 - (k <= 4 - c ? C[4 - c][k] : 0.0) / C[4][k];
}

START_TEST(test_gsm8k_four_models_as_samples)
{
    /* The four models as K = 4 samples of each problem: 286+515+458+742 = 2001
     * correct samples; pass@2 and pass@4 from the labels' per-problem counts. */
    qd_bench_set s;
    load_gsm8k(&s);
    label_gen g = {.rows = qd_test_load_jsonl(qd_test_path(FX "gsm8k_example_model_solutions.jsonl"))};
    double want2 = 0, want4 = 0;
    for (size_t i = 0; i < 1319; i++) {
        int c = label_count(json_array_get(g.rows, i), 0, 4);
        want2 += pass_of_4(c, 2) / 1319.0;
        want4 += pass_of_4(c, 4) / 1319.0;
    }
    qd_eval_opts o;
    qd_eval_opts_default(&o);
    o.prompt_template = "{problem}";
    o.samples = 4;
    o.batch = 7;
    o.progress = 0;
    qd_eval_bench b = {.name = "gsm8k", .set = &s, .style = QD_GRADE_GSM8K};
    qd_eval_report r;
    ck_assert_msg(qd_eval_run(&b, 1, &o, gen_labels, &g, &r) == QD_OK, "%s", qd_last_error());
    const qd_eval_result *e = &r.bench[0];
    ck_assert_uint_eq(e->n_correct, 2001);
    ck_assert_double_eq_tol(e->pass1, 2001.0 / 5276.0, EPS);
    ck_assert_double_eq_tol(e->mean_k, e->pass1, EPS);
    ck_assert_int_eq(e->n_pass, 3);
    ck_assert_int_eq(e->pass[1].k, 2);
    ck_assert_int_eq(e->pass[2].k, 4);
    ck_assert_double_eq_tol(e->pass[1].value, want2, 1e-12);
    ck_assert_double_eq_tol(e->pass[2].value, want4, 1e-12);
    /* A majority needs a right answer among the samples, so pass@4 bounds maj@4. */
    ck_assert(e->maj_k <= e->pass[2].value && e->maj_k > 0.3);
    qd_eval_report_free(&r);
    json_decref(g.rows);
    qd_bench_set_free(&s);
}
END_TEST

/* ---- a constructed case with exact fractions ---------------------------- */

#define NP 5
#define K 16

/* Problem i's gold is golds[i]; its 16 samples are built by make_samples. */
static const char *const golds[NP] = {"1", "2", "3", "4", "10"};

static const char *sample_text(int i, int j)
{
    switch (i) {
    case 0: /* 4 right, 3 x 7, 3 x 8, 6 without an answer: the right cluster wins 4 to 3 */
        return j < 4 ? "so \\boxed{1}" : j < 7 ? "\\boxed{7}" : j < 10 ? "\\boxed{8}" : "no idea";
    case 1: /* none right; invalid UTF-8 and a code fence, for the report */
        return "```\nwrong \xff\xfe \\boxed{5}\n```";
    case 2: /* all right */
        return "The answer is $\\boxed{3}$.";
    case 3: /* 8 wrong first, then 8 right: the tie goes to the earlier cluster (wrong) */
        return j < 8 ? "\\boxed{9}" : "\\boxed{4}";
    default: /* right through the alternative answer 12 */
        return "\\boxed{12}";
    }
}

typedef struct {
    int next;
} fixed_gen;

static qd_status gen_fixed(void *ctx, const char *const *prompts, int n, int k, char **out, int *tokens)
{
    fixed_gen *g = ctx;
    for (int i = 0; i < n; i++, g->next++) {
        char want[64];
        snprintf(want, sizeof want, "Q%d?", g->next);
        ck_assert_str_eq(prompts[i], want);
        for (int j = 0; j < k; j++) {
            out[i * k + j] = strdup(sample_text(g->next, j));
            tokens[i * k + j] = 10 * (g->next + 1);
        }
    }
    return QD_OK;
}

/* The five problems; problem 4 also accepts "12". */
static void constructed_set(qd_bench_set *s)
{
    s->n = NP;
    s->rec = calloc(NP, sizeof *s->rec);
    for (int i = 0; i < NP; i++) {
        char buf[32];
        snprintf(buf, sizeof buf, "p%d", i);
        s->rec[i].id = strdup(buf);
        snprintf(buf, sizeof buf, "Q%d", i);
        s->rec[i].problem = strdup(buf);
        s->rec[i].answer = strdup(golds[i]);
    }
    s->rec[4].alt = malloc(sizeof(char *));
    s->rec[4].alt[0] = strdup("12");
    s->rec[4].n_alt = 1;
}

static void run_constructed(qd_eval_report *r, uint64_t seed)
{
    static qd_bench_set s;
    if (!s.n)
        constructed_set(&s);
    qd_eval_opts o;
    qd_eval_opts_default(&o);
    o.prompt_template = "{problem}?";
    o.samples = K;
    o.batch = 2;
    o.n_examples = 2;
    o.progress = 0;
    o.seed = seed;
    o.model = "models/tiny";
    o.precision = "nvfp4";
    fixed_gen g = {0};
    qd_eval_bench b = {.name = "constructed", .set = &s, .style = QD_GRADE_MATH};
    ck_assert_msg(qd_eval_run(&b, 1, &o, gen_fixed, &g, r) == QD_OK, "%s", qd_last_error());
    ck_assert_int_eq(g.next, NP);
}

START_TEST(test_constructed_exact)
{
    qd_eval_report r;
    run_constructed(&r, 0);
    const qd_eval_result *e = &r.bench[0];
    /* c = 4, 0, 16, 8, 16 of n = 16. */
    ck_assert_uint_eq(e->n_correct, 44);
    ck_assert_uint_eq(e->n_no_answer, 6);
    ck_assert_double_eq_tol(e->pass1, (4 / 16.0 + 0 + 1 + 8 / 16.0 + 1) / NP, EPS);
    ck_assert_double_eq_tol(e->mean_k, e->pass1, EPS);
    /* pass@k = 1 - C(16-c,k)/C(16,k):
     *   c=4: k=2 1-66/120 = 9/20; k=4 1-495/1820 = 265/364; k=8 1-495/12870 = 25/26
     *   c=8: k=2 1-28/120 = 23/30; k=4 1-70/1820 = 25/26;  k=8 1-1/12870 = 12869/12870 */
    static const int ks[] = {1, 2, 4, 8, 16};
    const double want[] = {e->pass1, (9 / 20.0 + 0 + 1 + 23 / 30.0 + 1) / NP,
                           (265 / 364.0 + 0 + 1 + 25 / 26.0 + 1) / NP,
                           (25 / 26.0 + 0 + 1 + 12869 / 12870.0 + 1) / NP, (1 + 0 + 1 + 1 + 1) / 5.0};
    ck_assert_int_eq(e->n_pass, 5);
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(e->pass[i].k, ks[i]);
        ck_assert_double_eq_tol(e->pass[i].value, want[i], EPS);
    }
    /* Majority right on problems 0, 2 and 4; wrong on 1 and on the 8:8 tie of 3. */
    ck_assert_double_eq_tol(e->maj_k, 3 / 5.0, EPS);
    ck_assert_double_eq_tol(e->mean_tokens, 30.0, EPS); /* 10, 20, ..., 50 */
    /* Two examples each, from different problems, in order. */
    ck_assert_int_eq(e->n_right, 2);
    ck_assert_int_eq(e->n_wrong, 2);
    ck_assert_str_eq(e->right[0].id, "p0");
    ck_assert_str_eq(e->right[1].id, "p2");
    ck_assert_str_eq(e->wrong[0].id, "p0");
    ck_assert_int_eq(e->wrong[0].sample, 4);
    ck_assert_str_eq(e->wrong[0].extracted, "7");
    ck_assert_str_eq(e->wrong[1].id, "p1");
    /* The bootstrap CI is deterministic in the seed and holds the estimate. */
    ck_assert(e->pass1_lo <= e->pass1 && e->pass1 <= e->pass1_hi && e->pass1_lo >= 0 && e->pass1_hi <= 1);
    qd_eval_report r2;
    run_constructed(&r2, 0);
    ck_assert_double_eq(r2.bench[0].pass1_lo, e->pass1_lo);
    ck_assert_double_eq(r2.bench[0].pass1_hi, e->pass1_hi);
    qd_eval_report_free(&r2);
    qd_eval_report_free(&r);
}
END_TEST

START_TEST(test_report_files)
{
    qd_eval_report r;
    run_constructed(&r, 0);
    char dir[64], sub[128], path[192];
    qd_test_mkdtemp(dir, sizeof dir, "eval");
    snprintf(sub, sizeof sub, "%s/a/b", dir); /* created on the way */
    ck_assert_msg(qd_eval_write(&r, sub) == QD_OK, "%s", qd_last_error());
    snprintf(path, sizeof path, "%s/report.json", sub);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    ck_assert_msg(j != NULL, "report.json: %s", je.text);
    ck_assert_str_eq(json_string_value(json_object_get(j, "model")), "models/tiny");
    ck_assert_str_eq(json_string_value(json_object_get(j, "precision")), "nvfp4");
    ck_assert_str_eq(json_string_value(json_object_get(j, "prompt_template")), "{problem}?");
    ck_assert_int_eq(json_integer_value(json_object_get(j, "samples")), K);
    json_t *b = json_array_get(json_object_get(j, "benchmarks"), 0);
    ck_assert_uint_eq(json_array_size(json_object_get(j, "benchmarks")), 1);
    ck_assert_str_eq(json_string_value(json_object_get(b, "name")), "constructed");
    ck_assert_str_eq(json_string_value(json_object_get(b, "grader")), "math");
    ck_assert_int_eq(json_integer_value(json_object_get(b, "problems")), NP);
    ck_assert_int_eq(json_integer_value(json_object_get(b, "correct_samples")), 44);
    ck_assert_int_eq(json_integer_value(json_object_get(b, "no_answer_samples")), 6);
    ck_assert_double_eq(json_real_value(json_object_get(b, "pass@1")), r.bench[0].pass1);
    json_t *ci = json_object_get(b, "pass@1_ci95");
    ck_assert_double_eq(json_real_value(json_array_get(ci, 0)), r.bench[0].pass1_lo);
    ck_assert_double_eq(json_real_value(json_array_get(ci, 1)), r.bench[0].pass1_hi);
    json_t *pk = json_object_get(b, "pass@k");
    ck_assert_uint_eq(json_object_size(pk), 5);
    ck_assert_double_eq_tol(json_real_value(json_object_get(pk, "4")), (265 / 364.0 + 0 + 1 + 25 / 26.0 + 1) / NP, EPS);
    ck_assert_double_eq_tol(json_real_value(json_object_get(b, "maj@k")), 0.6, EPS);
    ck_assert_double_eq_tol(json_real_value(json_object_get(b, "mean_tokens")), 30.0, EPS);
    json_t *wrong = json_object_get(json_object_get(b, "examples"), "wrong");
    ck_assert_uint_eq(json_array_size(wrong), 2);
    json_t *w1 = json_array_get(wrong, 1);
    ck_assert_str_eq(json_string_value(json_object_get(w1, "id")), "p1");
    ck_assert_str_eq(json_string_value(json_object_get(w1, "gold")), "2");
    ck_assert_str_eq(json_string_value(json_object_get(w1, "extracted")), "5");
    /* The invalid bytes came out as U+FFFD each. */
    ck_assert_str_eq(json_string_value(json_object_get(w1, "output")),
                     "```\nwrong \xEF\xBF\xBD\xEF\xBF\xBD \\boxed{5}\n```");
    json_decref(j);
    snprintf(path, sizeof path, "%s/report.md", sub);
    char *md = read_all(path);
    ck_assert_ptr_nonnull(strstr(md, "# Evaluation report"));
    ck_assert_ptr_nonnull(strstr(md, "| constructed | 5 | 0.5500 |"));
    ck_assert_ptr_nonnull(strstr(md, "## constructed\n"));
    ck_assert_ptr_nonnull(strstr(md, "| pass@4 | 0.7379 |")); /* (265/364 + 1 + 25/26 + 1) / 5 */
    ck_assert_ptr_nonnull(strstr(md, "| maj@16 | 0.6000 |"));
    ck_assert_ptr_nonnull(strstr(md, "| mean response tokens | 30.0 |"));
    ck_assert_ptr_nonnull(strstr(md, "### Right answers (2 shown)"));
    ck_assert_ptr_nonnull(strstr(md, "### Wrong answers (2 shown)"));
    ck_assert_ptr_nonnull(strstr(md, "**Problem `p1`, sample 0**: extracted `5`, gold `2`"));
    /* An output holding ``` sits in a longer fence, so it cannot end the block early. */
    ck_assert_ptr_nonnull(strstr(md, "````text\n```\nwrong "));
    free(md);
    /* Only the two reports: no temporary file left behind. */
    ck_assert_int_eq(qd_test_dir_entries(sub), 2);
    qd_eval_report_free(&r);
    qd_test_rm_tree(dir);
}
END_TEST

START_TEST(test_markdown_long_output)
{
    /* "x" + 1040 x "é" (2 bytes each): the 2000-byte cut falls inside a character
     * and must move back to its start; the rest is announced, not dropped silently. */
    char out[2100];
    size_t n = 0;
    out[n++] = 'x';
    for (int i = 0; i < 1040; i++)
        out[n++] = (char)0xC3, out[n++] = (char)0xA9;
    out[n] = '\0';
    qd_eval_pass pass = {1, 0.0};
    qd_eval_example ex = {.id = "7", .problem = "P | Q", .gold = "1", .output = out, .tokens = -1};
    qd_eval_result b = {.name = "a|b", .n_problems = 1, .k = 1, .pass = &pass, .n_pass = 1,
                        .mean_tokens = NAN, .wrong = &ex, .n_wrong = 1};
    qd_eval_report r = {.bench = &b, .n_bench = 1, .k = 1, .prompt_template = "{problem}"};
    char *md = qd_eval_report_markdown(&r);
    ck_assert_ptr_nonnull(md);
    ck_assert_ptr_nonnull(strstr(md, "| a\\|b | 1 | 0.0000 |"));            /* '|' escaped in the table */
    ck_assert_ptr_nonnull(strstr(md, "extracted (none), gold `1`"));
    ck_assert_ptr_nonnull(strstr(md, "| mean response tokens | n/a |"));
    const char *body = strstr(md, "```text\nx\xC3\xA9");
    ck_assert_ptr_nonnull(body);
    body += strlen("```text\n");
    const char *end = strstr(body, "\n[... 82 more bytes; the whole output is in report.json]\n```\n");
    ck_assert_ptr_nonnull(end);
    ck_assert_int_eq(end - body, 1999); /* "x" + 999 whole characters */
    free(md);
    char *js = qd_eval_report_json(&r);
    json_t *j = json_loads(js, 0, NULL);
    json_t *w = json_array_get(json_object_get(json_object_get(json_array_get(json_object_get(j, "benchmarks"), 0),
                                                               "examples"), "wrong"), 0);
    ck_assert_str_eq(json_string_value(json_object_get(w, "output")), out); /* whole */
    ck_assert(json_is_null(json_object_get(w, "extracted")));
    ck_assert(json_is_null(json_object_get(w, "tokens")));
    json_decref(j);
    free(js);
}
END_TEST

START_TEST(test_prompt_template)
{
    char *p = qd_eval_prompt(QD_EVAL_QWEN_MATH_PROMPT, "What is 1+1?");
    ck_assert_str_eq(p, "What is 1+1?\nPlease reason step by step, and put your final answer within \\boxed{}.");
    free(p);
    p = qd_eval_prompt("A {problem} B {problem}{problem}", "x{problem}");
    ck_assert_str_eq(p, "A x{problem} B x{problem}x{problem}");
    free(p);
    p = qd_eval_prompt("no slot", "x");
    ck_assert_str_eq(p, "no slot");
    free(p);
}
END_TEST

/* Fails on its second call; leaves sample 3 of problem p1 empty on its first. */
static qd_status gen_faulty(void *ctx, const char *const *prompts, int n, int k, char **out, int *tokens)
{
    int *calls = ctx;
    if ((*calls)++)
        return qd_error(QD_ERR_DEVICE, "fake: device lost");
    for (int i = 0; i < n * k; i++)
        out[i] = i == k + 3 ? NULL : strdup("\\boxed{1}");
    return QD_OK;
}

START_TEST(test_bad_options)
{
    qd_bench_set s = {0};
    constructed_set(&s);
    qd_eval_bench b = {.name = "constructed", .set = &s, .style = QD_GRADE_MATH};
    qd_eval_opts o;
    qd_eval_opts_default(&o);
    o.progress = 0;
    fixed_gen g = {0};
    qd_eval_report r;
    o.samples = 0;
    ck_assert_int_eq(qd_eval_run(&b, 1, &o, gen_fixed, &g, &r), QD_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "samples 0"));
    o.samples = 1;
    qd_bench_set empty = {0};
    qd_eval_bench e = {.name = "empty", .set = &empty, .style = QD_GRADE_MATH};
    ck_assert_int_eq(qd_eval_run(&e, 1, &o, gen_fixed, &g, &r), QD_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "empty: no problems"));
    ck_assert_ptr_null(r.bench);
    /* Generator failures come back with their message; nothing leaks (valgrind). */
    o.samples = 4;
    o.batch = 2;
    int calls = 0;
    ck_assert_int_eq(qd_eval_run(&b, 1, &o, gen_faulty, &calls, &r), QD_ERR_FORMAT);
    ck_assert_str_eq(qd_last_error(), "constructed: generator gave no output for problem 'p1' sample 3");
    o.batch = 1;
    calls = 0;
    ck_assert_int_eq(qd_eval_run(&b, 1, &o, gen_faulty, &calls, &r), QD_ERR_DEVICE);
    ck_assert_str_eq(qd_last_error(), "fake: device lost");
    ck_assert_ptr_null(r.bench);
    qd_bench_set_free(&s);
}
END_TEST

/* ---- --replay files ----------------------------------------------------- */

/* Loads text as a replay file for the constructed set; returns the status. */
static qd_status replay_text(const char *text, int n_bench, qd_eval_replay **rp)
{
    static qd_bench_set s;
    if (!s.n)
        constructed_set(&s);
    static qd_eval_bench b[2];
    b[0] = (qd_eval_bench){.name = "constructed", .set = &s, .style = QD_GRADE_MATH};
    b[1] = (qd_eval_bench){.name = "other", .set = &s, .style = QD_GRADE_MATH};
    char dir[64], path[128];
    qd_test_mkdtemp(dir, sizeof dir, "eval");
    snprintf(path, sizeof path, "%s/outputs.jsonl", dir);
    qd_test_write_file(path, text);
    qd_status st = qd_eval_replay_load(path, b, (size_t)n_bench, 0, "{problem}?", rp);
    qd_test_rm_tree(dir);
    return st;
}

START_TEST(test_replay_errors)
{
    static const struct { const char *text; const char *msg; } bad[] = {
        {"{\"id\":\"p0\",\"output\":\"a\"}\n{\"id\": \"p1\", \"output\": }\n", "outputs.jsonl line 2: invalid JSON"},
        {"\n\n[1, 2]\n", "outputs.jsonl line 3: not a JSON object"},
        {"{\"id\":\"p0\",\"output\":\"a\"}\n{\"output\":\"b\"}\n", "line 2: field 'id' is missing"},
        {"{\"id\":1.5,\"output\":\"b\"}\n", "line 1: field 'id' is missing or not a string or integer"},
        {"{\"id\":\"p0\",\"output\":7}\n", "line 1: field 'output' is missing or not a string"},
        {"{\"id\":\"p0\",\"output\":\"a\",\"tokens\":-1}\n", "line 1: field 'tokens'"},
        {"{\"id\":\"p0\",\"output\":\"a\",\"tokens\":\"12\"}\n", "line 1: field 'tokens'"},
        {"{\"id\":\"p0\",\"output\":\"a\",\"benchmark\":3}\n", "line 1: field 'benchmark' is not a string"},
        {"{\"id\":\"p0\",\"output\":\"a\",\"id\":\"p1\"}\n", "line 1: invalid JSON: duplicate object key"},
        {"\n  \n", "outputs.jsonl: no outputs in the file"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        qd_eval_replay *rp = NULL;
        ck_assert_int_eq(replay_text(bad[i].text, 1, &rp), QD_ERR_FORMAT);
        ck_assert_msg(strstr(qd_last_error(), bad[i].msg), "case %zu: '%s'", i, qd_last_error());
        ck_assert_ptr_null(rp);
    }
    qd_eval_replay *rp = NULL;
    ck_assert_int_eq(replay_text("{\"id\":\"p0\",\"output\":\"a\"}\n", 2, &rp), QD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "line 1: field 'benchmark' is missing"));
    qd_eval_bench none = {0};
    ck_assert_int_eq(qd_eval_replay_load("/nonexistent/x.jsonl", &none, 1, 0, NULL, &rp), QD_ERR_IO);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "/nonexistent/x.jsonl"));
}
END_TEST

START_TEST(test_replay_serves_samples)
{
    /* Ids as strings or integers ("p0".."p4" here), samples in file order,
     * interleaved ids, lines for a benchmark that is not run are ignored. */
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    for (int j = 0; j < 3; j++)
        for (int i = 0; i < NP; i++)
            fprintf(m, "{\"id\": \"p%d\", \"output\": \"\\\\boxed{%s}\", \"tokens\": %d}\n", i,
                    j == 1 ? "0" : golds[i], i + j);
    fprintf(m, "{\"id\": \"p9\", \"benchmark\": \"elsewhere\", \"output\": \"x\"}\n");
    fprintf(m, "{\"id\": \"p0\", \"output\": \"\\\\boxed{1}\"}\n");
    fclose(m);
    qd_eval_replay *rp = NULL;
    ck_assert_msg(replay_text(text, 1, &rp) == QD_OK, "%s", qd_last_error());
    free(text);
    int k = 0;
    ck_assert_int_eq(qd_eval_replay_min_samples(rp, &k), QD_OK);
    ck_assert_int_eq(k, 3); /* p0 has 4, the others 3 */
    static qd_bench_set s;
    constructed_set(&s);
    qd_eval_bench b = {.name = "constructed", .set = &s, .style = QD_GRADE_MATH};
    qd_eval_opts o;
    qd_eval_opts_default(&o);
    o.prompt_template = "{problem}?";
    o.samples = 3;
    o.batch = 2;
    o.progress = 0;
    qd_eval_report r;
    ck_assert_msg(qd_eval_run(&b, 1, &o, qd_eval_replay_generate, rp, &r) == QD_OK, "%s", qd_last_error());
    /* Samples 0 and 2 are right, sample 1 is wrong; the 4th line of p0 is not used. */
    ck_assert_uint_eq(r.bench[0].n_correct, 2 * NP);
    ck_assert_double_eq_tol(r.bench[0].pass1, 2 / 3.0, EPS);
    ck_assert_double_eq_tol(r.bench[0].mean_tokens, (0 + 1 + 2 + 3 + 4) / 5.0 + 1.0, EPS);
    qd_eval_report_free(&r);
    /* The cursor is at the end now: one more prompt is an error, not a crash. */
    char *out[1] = {NULL};
    int tok[1];
    const char *p[1] = {"Q0?"};
    ck_assert_int_eq(qd_eval_replay_generate(rp, p, 1, 1, out, tok), QD_ERR_ARG);
    ck_assert_ptr_null(out[0]);
    qd_eval_replay_free(rp);
    qd_bench_set_free(&s);
}
END_TEST

START_TEST(test_replay_too_few_samples)
{
    qd_eval_replay *rp = NULL;
    ck_assert_int_eq(replay_text("{\"id\":\"p0\",\"output\":\"\\\\boxed{1}\"}\n{\"id\":\"p1\",\"output\":\"x\"}\n"
                                 "{\"id\":\"p0\",\"output\":\"y\"}\n", 1, &rp), QD_OK);
    int k;
    ck_assert_int_eq(qd_eval_replay_min_samples(rp, &k), QD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "no output for benchmark 'constructed' problem 'p2'"));
    static qd_bench_set s;
    constructed_set(&s);
    qd_eval_bench b = {.name = "constructed", .set = &s, .style = QD_GRADE_MATH};
    qd_eval_opts o;
    qd_eval_opts_default(&o);
    o.prompt_template = "{problem}?";
    o.samples = 2;
    o.limit = 2;
    o.progress = 0;
    qd_eval_report r;
    ck_assert_int_eq(qd_eval_run(&b, 1, &o, qd_eval_replay_generate, rp, &r), QD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "problem 'p1' has 1 outputs, 2 samples were asked for"));
    qd_eval_replay_free(rp);
    qd_bench_set_free(&s);
}
END_TEST

/* ---- the programs end to end -------------------------------------------- */

typedef struct {
    int rc;
    char *out, *err;
} run_result;

/* Runs `quads ARGS < stdin_text` through the shell; args are trusted test text. */
static run_result quads(const char *dir, const char *args, const char *stdin_text)
{
    const char *bin = getenv("QD_BUILDDIR");
    char in[256], out[256], err[256], cmd[4096];
    snprintf(in, sizeof in, "%s/stdin", dir);
    snprintf(out, sizeof out, "%s/stdout", dir);
    snprintf(err, sizeof err, "%s/stderr", dir);
    qd_test_write_file(in, stdin_text);
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s/quads' %s < '%s' > '%s' 2> '%s'", dir, bin ? bin : ".", args, in,
             out, err);
    int st = system(cmd);
    run_result r = {WIFEXITED(st) ? WEXITSTATUS(st) : -1, read_all(out), read_all(err)};
    return r;
}

static void run_free(run_result *r)
{
    free(r->out);
    free(r->err);
}

START_TEST(test_grade_program)
{
    char dir[64];
    qd_test_mkdtemp(dir, sizeof dir, "eval");
    run_result r = quads(dir, "grade",
                         "{\"output\": \"The answer is \\\\boxed{\\\\frac{1}{2}}\", \"gold\": \"0.5\"}\n"
                         "\n"
                         "{\"output\": \"no idea\", \"gold\": 3}\n"
                         "{\"output\": \"\\\\boxed{(1,2]}\", \"gold\": \"\\\\left(1, 2\\\\right]\"}\n");
    ck_assert_int_eq(r.rc, 0);
    ck_assert_str_eq(r.out, "{\"correct\":true,\"extracted\":\"\\\\frac{1}{2}\"}\n"
                            "{\"correct\":false,\"extracted\":null}\n"
                            "{\"correct\":true,\"extracted\":\"(1,2]\"}\n");
    ck_assert_str_eq(r.err, "");
    run_free(&r);
    r = quads(dir, "grade --style gsm8k", "{\"output\": \"so #### 1,234\", \"gold\": 1234}\n"
                                          "{\"output\": \"A: 7.\", \"gold\": \"8\"}\n");
    ck_assert_int_eq(r.rc, 0);
    ck_assert_str_eq(r.out, "{\"correct\":true,\"extracted\":\"1,234\"}\n{\"correct\":false,\"extracted\":\"7\"}\n");
    run_free(&r);
    /* A malformed line stops the run with exit 1, after the lines before it. */
    r = quads(dir, "grade", "{\"output\": \"\\\\boxed{1}\", \"gold\": \"1\"}\n{\"gold\": \"1\"}\n{\"output\": \"x\"}\n");
    ck_assert_int_eq(r.rc, 1);
    ck_assert_str_eq(r.out, "{\"correct\":true,\"extracted\":\"1\"}\n");
    ck_assert_str_eq(r.err, "quads grade: stdin line 2: field 'output' is missing or not a string\n");
    run_free(&r);
    r = quads(dir, "grade", "{\"output\": \"x\", \"gold\": null}\n");
    ck_assert_int_eq(r.rc, 1);
    ck_assert_str_eq(r.err, "quads grade: stdin line 1: field 'gold' is missing or not a string\n");
    run_free(&r);
    r = quads(dir, "grade", "{\"output\": \"1\", \"gold\": \"1\"}\n{\"output\": \"a\", gold\n");
    ck_assert_int_eq(r.rc, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "quads grade: stdin line 2: "));
    run_free(&r);
    r = quads(dir, "grade", "[1]\n");
    ck_assert_int_eq(r.rc, 1);
    ck_assert_str_eq(r.err, "quads grade: stdin line 1: not a JSON object\n");
    run_free(&r);
    /* Bad options: exit 2, nothing graded. */
    r = quads(dir, "grade --style foo", "{\"output\": \"1\", \"gold\": \"1\"}\n");
    ck_assert_int_eq(r.rc, 2);
    ck_assert_str_eq(r.out, "");
    ck_assert_ptr_nonnull(strstr(r.err, "grade style 'foo'"));
    run_free(&r);
    r = quads(dir, "grade --bogus", "");
    ck_assert_int_eq(r.rc, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "unknown argument '--bogus'"));
    run_free(&r);
    r = quads(dir, "grade --style", "");
    ck_assert_int_eq(r.rc, 2);
    run_free(&r);
    qd_test_rm_tree(dir);
}
END_TEST

/* The GPT-3 175B-verification outputs as a replay file for gsm8k_test.jsonl. */
static void write_gsm8k_replay(const char *path, int first_key, int k)
{
    json_t *rows = qd_test_load_jsonl(qd_test_path(FX "gsm8k_example_model_solutions.jsonl"));
    FILE *f = fopen(path, "w");
    for (size_t i = 0; i < json_array_size(rows); i++)
        for (int j = 0; j < k; j++) {
            json_t *m = json_object_get(json_array_get(rows, i), gpt3_keys[first_key + j]);
            json_t *line = json_pack("{s:I, s:O}", "id", (json_int_t)i, "output", json_object_get(m, "solution"));
            char *s = json_dumps(line, JSON_COMPACT);
            fprintf(f, "%s\n", s);
            free(s);
            json_decref(line);
        }
    fclose(f);
    json_decref(rows);
}

START_TEST(test_eval_program_replay)
{
    char dir[64], args[1024];
    qd_test_mkdtemp(dir, sizeof dir, "eval");
    char replay[128];
    snprintf(replay, sizeof replay, "%s/gpt3.jsonl", dir);
    write_gsm8k_replay(replay, 3, 1);
    snprintf(args, sizeof args, "eval --file '%s' --field problem=question --style gsm8k --grader gsm8k "
             "--replay gpt3.jsonl --out rep --precision bf16", qd_test_path(FX "gsm8k_test.jsonl"));
    run_result r = quads(dir, args, "");
    ck_assert_msg(r.rc == 0, "rc %d: %s", r.rc, r.err);
    /* 742 of 1319 labelled correct; K = 1 taken from the file. */
    ck_assert_ptr_nonnull(strstr(r.out, "gsm8k_test.jsonl  1319 problems x 1  pass@1 0.5625"));
    ck_assert_ptr_nonnull(strstr(r.out, "report: rep/report.md, rep/report.json"));
    run_free(&r);
    char path[192];
    snprintf(path, sizeof path, "%s/rep/report.json", dir);
    json_t *j = json_load_file(path, 0, NULL);
    ck_assert_ptr_nonnull(j);
    json_t *b = json_array_get(json_object_get(j, "benchmarks"), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(b, "correct_samples")), 742);
    ck_assert(json_is_null(json_object_get(b, "mean_tokens"))); /* the file gave no token counts */
    ck_assert(json_is_null(json_object_get(j, "model")));
    ck_assert_str_eq(json_string_value(json_object_get(j, "precision")), "bf16");
    json_decref(j);
    /* --limit and --samples beyond what the file has. */
    snprintf(args, sizeof args, "eval --file '%s' --field problem=question --style gsm8k --replay gpt3.jsonl "
             "--out rep --limit 3 --samples 2", qd_test_path(FX "gsm8k_test.jsonl"));
    r = quads(dir, args, "");
    ck_assert_int_eq(r.rc, 1);
    ck_assert_str_eq(r.err, "quads eval: gpt3.jsonl: benchmark 'gsm8k_test.jsonl' problem '0' has 1 outputs, "
                            "2 samples were asked for\n");
    run_free(&r);
    qd_test_rm_tree(dir);
}
END_TEST

START_TEST(test_eval_program_two_benchmarks)
{
    /* The synthetic arith1 (its first 4 held-out problems, as quads eval makes
     * them) and a GSM8K file, one replay file whose lines name their benchmark. */
    const qd_bench_info *info = qd_bench_find("arith1");
    qd_synth_opts so = {.seed = 0, .steps = info->synth_steps, .max_operand = info->synth_max};
    qd_bench_set s;
    ck_assert_int_eq(qd_synth_generate(&so, QD_SPLIT_TEST, 4, &s), QD_OK);
    char dir[64], path[128], args[1024];
    qd_test_mkdtemp(dir, sizeof dir, "eval");
    snprintf(path, sizeof path, "%s/two.jsonl", dir);
    FILE *f = fopen(path, "w");
    for (size_t i = 0; i < s.n; i++)
        fprintf(f, "{\"benchmark\": \"arith1\", \"id\": \"%s\", \"output\": \"\\\\boxed{%s}\", \"tokens\": 5}\n"
                   "{\"benchmark\": \"arith1\", \"id\": \"%s\", \"output\": \"\\\\boxed{0.5}\", \"tokens\": 7}\n",
                s.rec[i].id, s.rec[i].answer, s.rec[i].id);
    for (int i = 0; i < 4; i++) /* golds 18 and 3: each of problems 0 and 1 gets one right */
        fprintf(f, "{\"benchmark\": \"gsm8k_test.jsonl\", \"id\": %d, \"output\": \"A: 18\"}\n"
                   "{\"benchmark\": \"gsm8k_test.jsonl\", \"id\": %d, \"output\": \"so A: 3\"}\n", i, i);
    fclose(f);
    qd_bench_set_free(&s);
    snprintf(args, sizeof args, "eval --benchmark arith1 --file '%s' --field problem=question --style gsm8k "
             "--replay two.jsonl --limit 4 --out rep", qd_test_path(FX "gsm8k_test.jsonl"));
    run_result r = quads(dir, args, "");
    ck_assert_msg(r.rc == 0, "rc %d: %s", r.rc, r.err);
    ck_assert_ptr_nonnull(strstr(r.out, "arith1             4 problems x 2  pass@1 0.5000"));
    ck_assert_ptr_nonnull(strstr(r.out, "gsm8k_test.jsonl     4 problems x 2  pass@1 0.2500"));
    run_free(&r);
    snprintf(path, sizeof path, "%s/rep/report.json", dir);
    json_t *j = json_load_file(path, 0, NULL), *b = json_object_get(j, "benchmarks");
    ck_assert_uint_eq(json_array_size(b), 2);
    json_t *a = json_array_get(b, 0), *g = json_array_get(b, 1);
    ck_assert_str_eq(json_string_value(json_object_get(a, "grader")), "math");
    ck_assert_double_eq_tol(json_real_value(json_object_get(a, "mean_tokens")), 6.0, EPS);
    ck_assert_double_eq_tol(json_real_value(json_object_get(a, "maj@k")), 1.0, EPS);
    /* --style gsm8k makes the file's grader gsm8k; the 1:1 ties go to the first answer, 18. */
    ck_assert_str_eq(json_string_value(json_object_get(g, "grader")), "gsm8k");
    ck_assert_double_eq_tol(json_real_value(json_object_get(g, "maj@k")), 0.25, EPS);
    ck_assert_double_eq_tol(json_real_value(json_object_get(json_object_get(g, "pass@k"), "2")), 0.5, EPS);
    json_decref(j);
    qd_test_rm_tree(dir);
}
END_TEST

/* The real release_v1 file as the cached lcb-v1 (the registry's test.jsonl)
 * under dir/cache; returns the cache directory. */
static const char *lcb_cache(const char *dir)
{
    static char cache[256];
    char p[512], hex[65];
    snprintf(cache, sizeof cache, "%s/cache", dir);
    snprintf(p, sizeof p, "%s/hub/datasets/livecodebench/code_generation_lite/main", cache);
    ck_assert_int_eq(qd_mkdirs(p), QD_OK);
    char *text = read_all(qd_test_path(FX "livecodebench_release_v1_nopriv_mavencoder.jsonl"));
    snprintf(p, sizeof p, "%s/hub/datasets/livecodebench/code_generation_lite/main/test.jsonl", cache);
    ck_assert_int_eq(qd_atomic_write(p, text, strlen(text)), QD_OK);
    free(text);
    ck_assert_int_eq(qd_sha256_file(p, hex), QD_OK);
    strcat(p, ".sha256");
    ck_assert_int_eq(qd_atomic_write(p, hex, 64), QD_OK);
    return cache;
}

/* A replay line: problem id, a program in a ``` block (NULL: an answer without code). */
static void replay_line(FILE *f, const char *id, const char *code)
{
    char *out = NULL;
    ck_assert_int_ge(asprintf(&out, code ? "My solution:\n```python\n%s```\n" : "I cannot solve it.", code), 0);
    json_t *l = json_pack("{s:s, s:s}", "id", id, "output", out);
    char *t = json_dumps(l, JSON_COMPACT);
    fprintf(f, "%s\n", t);
    free(t), free(out);
    json_decref(l);
}

/* quads eval on LiveCodeBench: lcb-v1 from the cache, the problems of one
 * contest day (--from/--to: 7 of the 400), two replayed samples each; the
 * programs run in the sandbox and the report counts their verdicts and
 * gives pass@1 and pass@2 exactly. The same problems as a --file with
 * --style code give the same numbers. */
START_TEST(test_eval_program_lcb)
{
    char dir[64], args[1024], path[192];
    qd_test_mkdtemp(dir, sizeof dir, "eval");
    setenv("QUADS_CACHE", lcb_cache(dir), 1);
    json_t *sols = qd_test_load_jsonl(qd_test_path("tests/fixtures/code/solutions.jsonl"));
    const char *right = NULL;
    for (size_t i = 0; i < json_array_size(sols); i++)
        if (!strcmp(json_string_value(json_object_get(json_array_get(sols, i), "question_id")), "abc318_a"))
            right = json_string_value(json_object_get(json_array_get(sols, i), "correct"));
    ck_assert_ptr_nonnull(right);
    snprintf(path, sizeof path, "%s/out.jsonl", dir);
    FILE *f = fopen(path, "w");
    replay_line(f, "abc318_a", right);            /* accepted */
    replay_line(f, "abc318_a", "print(0)\n");     /* wrong_answer */
    replay_line(f, "abc318_b", "print(0)\n");     /* wrong_answer */
    replay_line(f, "abc318_b", NULL);             /* no_code */
    replay_line(f, "abc318_c", "raise ValueError('no')\n"); /* runtime_error */
    replay_line(f, "abc318_c", NULL);
    replay_line(f, "2954", "class Solution:\n    def other(self):\n        return 0\n"); /* no such method */
    replay_line(f, "2954", NULL);
    static const char *const none[] = {"2999", "abc318_d", "abc318_e"};
    for (int i = 0; i < 3; i++)
        replay_line(f, none[i], NULL), replay_line(f, none[i], NULL);
    fclose(f);
    static const char *const how[2] = {"--benchmark lcb-v1 --offline", "--file '%s' --style code"};
    for (int v = 0; v < 2; v++) {
        char src[512];
        snprintf(src, sizeof src, how[v], qd_test_path(FX "livecodebench_release_v1_nopriv_mavencoder.jsonl"));
        snprintf(args, sizeof args, "eval %s --from 2023-09-02 --to 2023-09-02 --replay out.jsonl --out rep%d "
                 "--jobs 2", src, v);
        run_result r = quads(dir, args, "");
        ck_assert_msg(r.rc == 0, "rc %d: %s", r.rc, r.err);
        ck_assert_msg(strstr(r.out, "7 problems x 2  pass@1 0.0714 [0.0000, 0.2143]  pass@2 0.1429  accepted 1  "
                                    "wrong_answer 2  runtime_error 2  no_code 9\n"), "%s", r.out);
        run_free(&r);
        snprintf(path, sizeof path, "%s/rep%d/report.json", dir, v);
        json_t *j = json_load_file(path, 0, NULL);
        ck_assert_ptr_nonnull(j);
        json_t *b = json_array_get(json_object_get(j, "benchmarks"), 0);
        ck_assert_str_eq(json_string_value(json_object_get(b, "grader")), "code");
        ck_assert_str_eq(json_string_value(json_object_get(b, "prompt_template")), "{problem}");
        ck_assert_int_eq(json_integer_value(json_object_get(b, "problems")), 7);
        ck_assert_int_eq(json_integer_value(json_object_get(b, "samples")), 2);
        ck_assert_int_eq(json_integer_value(json_object_get(b, "correct_samples")), 1);
        ck_assert_int_eq(json_integer_value(json_object_get(b, "no_answer_samples")), 9);
        json_t *pk = json_object_get(b, "pass@k");
        ck_assert_double_eq_tol(json_real_value(json_object_get(pk, "1")), 1.0 / 14, 1e-15);
        ck_assert_double_eq_tol(json_real_value(json_object_get(pk, "2")), 1.0 / 7, 1e-15);
        ck_assert(json_is_null(json_object_get(b, "maj@k")));
        json_t *vd = json_object_get(b, "verdicts");
        static const struct {
            const char *name;
            int n;
        } want[] = {{"accepted", 1}, {"wrong_answer", 2}, {"time_limit", 0}, {"memory_limit", 0},
                    {"runtime_error", 2}, {"no_code", 9}, {"sandbox_error", 0}};
        ck_assert_int_eq(json_object_size(vd), 7);
        for (int i = 0; i < 7; i++)
            ck_assert_msg(json_integer_value(json_object_get(vd, want[i].name)) == want[i].n, "%s", want[i].name);
        json_t *ex = json_array_get(json_object_get(json_object_get(b, "examples"), "right"), 0);
        ck_assert_str_eq(json_string_value(json_object_get(ex, "id")), "abc318_a");
        ck_assert_str_eq(json_string_value(json_object_get(ex, "verdict")), "accepted");
        const char *code = json_string_value(json_object_get(ex, "extracted")); /* the block, its last newline not */
        ck_assert(strlen(code) + 1 == strlen(right) && !strncmp(code, right, strlen(code)));
        ck_assert(!strncmp(json_string_value(json_object_get(ex, "problem")), "### Question:\nTakahashi likes full moons.", 41));
        /* one wrong example a problem, in file order: 2954, 2999, abc318_a */
        json_t *wrong = json_object_get(json_object_get(b, "examples"), "wrong");
        ck_assert_int_eq(json_array_size(wrong), 3);
        ex = json_array_get(wrong, 0);
        ck_assert_str_eq(json_string_value(json_object_get(ex, "verdict")), "runtime_error");
        ck_assert_ptr_nonnull(strstr(json_string_value(json_object_get(ex, "detail")), "AttributeError"));
        ck_assert_str_eq(json_string_value(json_object_get(json_array_get(wrong, 1), "verdict")), "no_code");
        ex = json_array_get(wrong, 2);
        ck_assert_str_eq(json_string_value(json_object_get(ex, "id")), "abc318_a");
        ck_assert_str_eq(json_string_value(json_object_get(ex, "verdict")), "wrong_answer");
        ck_assert_str_eq(json_string_value(json_object_get(ex, "detail")), "test 1: wrong answer");
        json_decref(j);
        snprintf(path, sizeof path, "%s/rep%d/report.md", dir, v);
        char *md = read_all(path);
        ck_assert_msg(strstr(md, "Samples by verdict (all tests run in the sandbox; the first failing test decides): "
                                 "accepted 1, wrong_answer 2, time_limit 0, memory_limit 0, runtime_error 2, "
                                 "no_code 9, sandbox_error 0."), "%s", md);
        free(md);
    }
    /* errors: a benchmark without dates, code options without code, bad dates */
    static const struct {
        const char *args, *msg;
        int rc;
    } bad[] = {
        {"eval --replay out.jsonl --benchmark aime24 --from 2024-01-01", "aime24: its records have no date", 1},
        {"eval --replay out.jsonl --benchmark aime24 --jobs 2", "--jobs, --timeout and --memory-mb go with code", 2},
        {"eval --replay out.jsonl --benchmark lcb-v1 --from 2023-9-1", "--from/--to: expected a date YYYY-MM-DD", 2},
        {"eval --replay out.jsonl --benchmark lcb-v1 --from 2024-01-02 --to 2024-01-01", "--from: the date is after --to", 2},
        {"eval --replay out.jsonl --benchmark lcb-v1 --offline --from 2030-01-01", "lcb-v1: none of its 400 problems is dated in [2030-01-01, -]", 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        run_result r = quads(dir, bad[i].args, "");
        ck_assert_msg(r.rc == bad[i].rc && strstr(r.err, bad[i].msg), "%s: rc %d: %s", bad[i].args, r.rc, r.err);
        run_free(&r);
    }
    unsetenv("QUADS_CACHE");
    json_decref(sols);
    qd_test_rm_tree(dir);
}
END_TEST

START_TEST(test_eval_program_errors)
{
    char dir[64], args[1024];
    qd_test_mkdtemp(dir, sizeof dir, "eval");
    char bad[128];
    snprintf(bad, sizeof bad, "%s/bad.jsonl", dir);
    qd_test_write_file(bad, "{\"id\": 0, \"output\": \"A: 18\"}\n{\"id\": 1, \"output\": [\"A: 3\"]}\n");
    snprintf(args, sizeof args, "eval --file '%s' --field problem=question --style gsm8k --replay bad.jsonl",
             qd_test_path(FX "gsm8k_test.jsonl"));
    run_result r = quads(dir, args, "");
    ck_assert_int_eq(r.rc, 1);
    ck_assert_str_eq(r.err, "quads eval: bad.jsonl line 2: field 'output' is missing or not a string\n");
    run_free(&r);
    /* No model in the folder: a clear message, exit 1, after the options were checked. */
    r = quads(dir, "eval --model . --benchmark gsm8k,math500 --samples 4", "");
    ck_assert_int_eq(r.rc, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "config.json"));
    run_free(&r);
    static const struct { const char *args, *msg; } usage_errors[] = {
        {"eval --model . --benchmark nope", "unknown benchmark 'nope'"},
        {"eval --model /nonexistent --benchmark gsm8k", "--model /nonexistent: not a directory"},
        {"eval --benchmark gsm8k", "--model DIR is needed"},
        {"eval --model .", "--benchmark or --file is needed"},
        {"eval --model . --benchmark gsm8k --samples 0", "--samples 0: expected"},
        {"eval --model . --benchmark gsm8k --limit x", "--limit x: expected"},
        {"eval --model . --benchmark gsm8k --precision fp4", "--precision: expected"},
        {"eval --model . --benchmark gsm8k --grader hendrycks", "grade style 'hendrycks'"},
        {"eval --model . --benchmark gsm8k --prompt 'no slot'", "--prompt: the template has no {problem}"},
        {"eval --model . --benchmark gsm8k --field question", "--field question: expected"},
        {"eval --model . --benchmark gsm8k --bogus 1", "unknown option '--bogus'"},
        {"eval --model . --benchmark", "missing value after '--benchmark'"},
        {"eval --model . --benchmark gsm8k,math500,gsm8k", "twice the benchmark 'gsm8k'"},
        {"eval --model . --benchmark ,", "--benchmark: no benchmark named"},
    };
    for (size_t i = 0; i < sizeof usage_errors / sizeof usage_errors[0]; i++) {
        r = quads(dir, usage_errors[i].args, "");
        ck_assert_msg(r.rc == 2, "%s: rc %d", usage_errors[i].args, r.rc);
        ck_assert_msg(strstr(r.err, usage_errors[i].msg), "%s: %s", usage_errors[i].args, r.err);
        run_free(&r);
    }
    r = quads(dir, "eval --help", "");
    ck_assert_int_eq(r.rc, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "--replay FILE.jsonl"));
    run_free(&r);
    qd_test_rm_tree(dir);
}
END_TEST

Suite *suite_eval(void)
{
    Suite *s = suite_create("eval");
    TCase *tc = tcase_create("harness");
    tcase_add_loop_test(tc, test_gsm8k_pass1_matches_labels, 0, 4);
    tcase_add_test(tc, test_gsm8k_four_models_as_samples);
    tcase_add_test(tc, test_constructed_exact);
    tcase_add_test(tc, test_report_files);
    tcase_add_test(tc, test_markdown_long_output);
    tcase_add_test(tc, test_prompt_template);
    tcase_add_test(tc, test_bad_options);
    suite_add_tcase(s, tc);
    tc = tcase_create("replay");
    tcase_add_test(tc, test_replay_errors);
    tcase_add_test(tc, test_replay_serves_samples);
    tcase_add_test(tc, test_replay_too_few_samples);
    suite_add_tcase(s, tc);
    tc = tcase_create("programs");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_grade_program);
    tcase_add_test(tc, test_eval_program_replay);
    tcase_add_test(tc, test_eval_program_two_benchmarks);
    tcase_add_test(tc, test_eval_program_errors);
    tcase_add_test(tc, test_eval_program_lcb);
    suite_add_tcase(s, tc);
    return s;
}
