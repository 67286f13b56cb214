/* qd_eval_run: prompts -> generator -> grading -> per-benchmark metrics. */
#define _GNU_SOURCE
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "benchmarks/eval.h"
#include "benchmarks/lcb.h"

void qd_eval_opts_default(qd_eval_opts *o)
{
    *o = (qd_eval_opts){.prompt_template = QD_EVAL_QWEN_MATH_PROMPT, .samples = 1, .batch = 64,
                        .n_examples = 3, .bootstrap_reps = 1000, .progress = 1};
}

char *qd_eval_prompt(const char *tmpl, const char *problem)
{
    static const char key[] = "{problem}";
    const size_t klen = sizeof key - 1, plen = strlen(problem);
    size_t n = 0;
    for (const char *p = strstr(tmpl, key); p; p = strstr(p + klen, key))
        n++;
    char *out = malloc(strlen(tmpl) + n * plen + 1 - n * klen);
    if (!out)
        return NULL;
    char *w = out;
    for (const char *p = tmpl, *q; *p; p = q + klen) {
        q = strstr(p, key);
        if (!q) {
            strcpy(w, p);
            return out;
        }
        memcpy(w, p, (size_t)(q - p));
        w += q - p;
        memcpy(w, problem, plen);
        w += plen;
    }
    *w = '\0';
    return out;
}

/* ---- grading ------------------------------------------------------------ */

/* A sample is right when it matches the answer or any alternative; the
 * extracted answer is the same for every gold, so the first one is kept. */
static qd_status grade_sample(const char *output, const qd_bench_record *r, qd_grade_style style,
                              bool *correct, char **extracted)
{
    qd_rewards_result res;
    qd_status st = qd_rewards_grade(output, r->answer, style, &res);
    if (st)
        return st;
    *correct = res.correct;
    *extracted = res.extracted;
    for (size_t a = 0; a < r->n_alt && !*correct && *extracted; a++) {
        qd_rewards_result alt;
        if ((st = qd_rewards_grade(output, r->alt[a], style, &alt))) {
            free(*extracted);
            return st;
        }
        *correct = alt.correct;
        qd_rewards_result_free(&alt);
    }
    return QD_OK;
}

/* Code points of UTF-8 text (continuation bytes are not counted). */
static size_t utf8_length(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

/* The last error with "what: " in front (copied first: qd_error writes the
 * buffer qd_last_error reads). */
static qd_status prefix_error(qd_status st, const char *what)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", qd_last_error());
    return qd_error(st, "%s: %s", what, msg);
}

/* Running sums of one benchmark while its batches come in. */
typedef struct {
    const qd_eval_bench *b;
    const qd_eval_opts *o;
    size_t n;             /* problems after the limit */
    int *c;               /* (n) correct samples per problem */
    double mean_k_sum;    /* sum of mean@K per problem */
    size_t maj;           /* problems whose majority answer is right */
    double tokens, chars; /* sums over samples */
    bool tokens_known;
    bool *ok;             /* (K) scratch: correctness of one problem's samples */
    char **ext;           /* (K) scratch: their extracted answers */
    qd_eval_result *res;
} bench_acc;

static void example_free(qd_eval_example *e)
{
    free(e->id);
    free(e->problem);
    free(e->gold);
    free(e->output);
    free(e->extracted);
    free(e->detail);
}

/* Keeps sample j of record r as an example; code: cr is its code result. */
static void keep_example(bench_acc *a, const qd_bench_record *r, int j, const char *output,
                         const char *extracted, bool correct, int tokens, const qd_code_result *cr)
{
    qd_eval_result *res = a->res;
    int *count = correct ? &res->n_right : &res->n_wrong;
    qd_eval_example *e = &(correct ? res->right : res->wrong)[*count];
    /* One example per problem: more variety than the K samples of the first. */
    if (*count >= a->o->n_examples || (*count && !strcmp(e[-1].id, r->id)))
        return;
    *e = (qd_eval_example){.id = strdup(r->id), .problem = strdup(r->problem), .gold = strdup(r->answer),
                           .output = strdup(output), .extracted = dup_or_null(extracted), .sample = j,
                           .tokens = tokens, .verdict = cr ? qd_code_verdict_name(cr->verdict) : NULL,
                           .detail = cr ? dup_or_null(cr->detail) : NULL};
    if (e->id && e->problem && e->gold && e->output && (e->extracted || !extracted) &&
        (e->detail || !cr || !cr->detail))
        (*count)++;
    else /* out of memory: an example fewer */
        example_free(e);
}

/* The running sums of sample j of problem i, whatever its grader. */
static void count_sample(bench_acc *a, size_t i, bool correct, bool answered, const char *output, int tokens)
{
    a->c[i] += correct;
    a->res->n_correct += correct;
    a->res->n_no_answer += !answered;
    a->chars += (double)utf8_length(output);
    a->tokens += tokens;
    a->tokens_known = a->tokens_known && tokens >= 0;
}

/* Grades the k samples of problem i (outputs and tokens: (k)). */
static qd_status grade_problem(bench_acc *a, size_t i, char *const *outputs, const int *tokens)
{
    const qd_bench_record *r = &a->b->set->rec[i];
    const int k = a->o->samples;
    bool *ok = a->ok;
    char **ext = a->ext;
    qd_status st = QD_OK;
    int done;
    for (done = 0; done < k; done++) {
        if ((st = grade_sample(outputs[done], r, a->b->style, &ok[done], &ext[done])))
            break;
        count_sample(a, i, ok[done], ext[done] != NULL, outputs[done], tokens[done]);
        keep_example(a, r, done, outputs[done], ext[done], ok[done], tokens[done], NULL);
    }
    if (!st) {
        int m = qd_rewards_majority(ext, k);
        a->maj += m >= 0 && ok[m];
        a->mean_k_sum += qd_rewards_mean_at_k(ok, k);
    }
    for (int j = 0; j < done; j++)
        free(ext[j]);
    if (st) {
        char what[512];
        snprintf(what, sizeof what, "%s: problem '%s'", a->b->name, r->id);
        return prefix_error(st, what);
    }
    return QD_OK;
}

/* Grades the k samples of each of problems [first, first + nb) as code:
 * their tests decoded, every sample of the batch run at once (the workers of
 * b->code share them all), then counted as the other graders count. */
static qd_status grade_code_batch(bench_acc *a, size_t first, int nb, char *const *outputs, const int *tokens)
{
    const int k = a->o->samples, ns = nb * k;
    qd_code_problem *probs = calloc((size_t)nb, sizeof *probs);
    const qd_code_problem **pp = calloc((size_t)ns, sizeof *pp);
    qd_code_result *res = calloc((size_t)ns, sizeof *res);
    qd_status st = probs && pp && res ? QD_OK : qd_error(QD_ERR_NOMEM, "%s: batch of %d", a->b->name, nb);
    int made = 0;
    for (; !st && made < nb; made++) {
        const qd_bench_record *r = &a->b->set->rec[first + (size_t)made];
        char name[512];
        snprintf(name, sizeof name, "%s problem '%s'", a->b->name, r->id);
        st = r->code ? qd_lcb_problem(r->code, name, &probs[made])
                     : qd_error(QD_ERR_ARG, "%s: not a code problem (the benchmark's style is not code)", name);
        for (int j = 0; !st && j < k; j++)
            pp[made * k + j] = &probs[made];
    }
    if (!st)
        st = qd_code_grade(a->b->code, (const char *const *)outputs, pp, ns, res);
    for (int s = 0; !st && s < ns; s++) {
        size_t i = first + (size_t)(s / k);
        char *code = qd_code_extract(outputs[s]);
        a->res->verdicts[res[s].verdict]++;
        count_sample(a, i, res[s].correct, res[s].verdict != QD_CODE_NO_CODE, outputs[s], tokens[s]);
        keep_example(a, &a->b->set->rec[i], s % k, outputs[s], code, res[s].correct, tokens[s], &res[s]);
        free(code);
        a->ok[s % k] = res[s].correct;
        if (s % k == k - 1)
            a->mean_k_sum += qd_rewards_mean_at_k(a->ok, k);
    }
    for (int s = 0; res && s < ns; s++)
        qd_code_result_free(&res[s]);
    for (int i = 0; i < made && probs; i++)
        qd_code_problem_free(&probs[i]);
    free(probs), free(pp), free(res);
    return st;
}

/* ---- generation in batches ---------------------------------------------- */

static void free_outputs(char **outputs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(outputs[i]);
        outputs[i] = NULL;
    }
}

static qd_status build_prompts(const bench_acc *a, size_t first, int nb, char **prompts)
{
    for (int i = 0; i < nb; i++) {
        const char *tmpl = a->b->prompt_template ? a->b->prompt_template : a->o->prompt_template;
        prompts[i] = qd_eval_prompt(tmpl, a->b->set->rec[first + (size_t)i].problem);
        if (!prompts[i])
            return qd_error(QD_ERR_NOMEM, "%s: prompt of problem %zu", a->b->name, first + (size_t)i);
    }
    return QD_OK;
}

static qd_status check_outputs(const bench_acc *a, size_t first, int nb, char *const *outputs)
{
    const int k = a->o->samples;
    for (int i = 0; i < nb * k; i++)
        if (!outputs[i])
            return qd_error(QD_ERR_FORMAT, "%s: generator gave no output for problem '%s' sample %d",
                            a->b->name, a->b->set->rec[first + (size_t)(i / k)].id, i % k);
    return QD_OK;
}

/* Problems [first, first + nb): generate, then grade. */
static qd_status run_batch(bench_acc *a, size_t first, int nb, qd_eval_generate_fn gen, void *ctx)
{
    const int k = a->o->samples;
    const size_t ns = (size_t)nb * (size_t)k;
    char **prompts = calloc((size_t)nb, sizeof *prompts);
    char **outputs = calloc(ns, sizeof *outputs);
    int *tokens = malloc(ns * sizeof *tokens);
    qd_status st = prompts && outputs && tokens ? QD_OK : qd_error(QD_ERR_NOMEM, "%s: batch of %d", a->b->name, nb);
    for (size_t i = 0; !st && i < ns; i++)
        tokens[i] = -1;
    if (!st)
        st = build_prompts(a, first, nb, prompts);
    if (!st)
        st = gen(ctx, (const char *const *)prompts, nb, k, outputs, tokens);
    if (!st)
        st = check_outputs(a, first, nb, outputs);
    if (!st && a->b->code)
        st = grade_code_batch(a, first, nb, outputs, tokens);
    for (int i = 0; !st && !a->b->code && i < nb; i++)
        st = grade_problem(a, first + (size_t)i, outputs + (size_t)i * k, tokens + (size_t)i * k);
    if (outputs)
        free_outputs(outputs, ns);
    for (int i = 0; prompts && i < nb; i++)
        free(prompts[i]);
    free(prompts);
    free(outputs);
    free(tokens);
    return st;
}

static void progress(const bench_acc *a, size_t done)
{
    if (!a->o->progress || !isatty(STDERR_FILENO))
        return;
    double p1 = (double)a->res->n_correct / ((double)done * a->o->samples);
    fprintf(stderr, "\r%s: %zu/%zu problems, pass@1 so far %.4f%s", a->b->name, done, a->n, p1,
            done == a->n ? "\n" : "");
}

/* ---- metrics ------------------------------------------------------------ */

/* pass@k for k = 1, 2, 4, ... below K, and K. */
static qd_status pass_at_ks(bench_acc *a)
{
    const int k = a->o->samples;
    qd_eval_result *res = a->res;
    res->pass = calloc(34, sizeof *res->pass);
    if (!res->pass)
        return qd_error(QD_ERR_NOMEM, "%s: pass@k", a->b->name);
    for (int kk = 1;; kk = kk * 2 < k ? kk * 2 : k) {
        double sum = 0, v;
        for (size_t i = 0; i < a->n; i++) {
            qd_status st = qd_rewards_pass_at_k(k, a->c[i], kk, &v);
            if (st)
                return st;
            sum += v;
        }
        res->pass[res->n_pass++] = (qd_eval_pass){kk, sum / (double)a->n};
        if (kk == k)
            return QD_OK;
    }
}

static qd_status finish_bench(bench_acc *a)
{
    const int k = a->o->samples;
    qd_eval_result *res = a->res;
    double *x = malloc(a->n * sizeof *x), sum = 0;
    if (!x)
        return qd_error(QD_ERR_NOMEM, "%s: bootstrap", a->b->name);
    for (size_t i = 0; i < a->n; i++)
        sum += x[i] = (double)a->c[i] / k;
    res->pass1 = sum / (double)a->n;
    qd_status st = qd_rewards_bootstrap_ci(x, (int)a->n, a->o->bootstrap_reps, 0.95, a->o->seed,
                                           &res->pass1_lo, &res->pass1_hi);
    free(x);
    if (st)
        return prefix_error(st, a->b->name);
    double ns = (double)a->n * k;
    res->maj_k = a->b->code ? NAN : (double)a->maj / (double)a->n;
    res->mean_k = a->mean_k_sum / (double)a->n;
    res->mean_chars = a->chars / ns;
    res->mean_tokens = a->tokens_known ? a->tokens / ns : NAN;
    return pass_at_ks(a);
}

static qd_status eval_bench(const qd_eval_bench *b, const qd_eval_opts *o, qd_eval_generate_fn gen,
                            void *ctx, qd_eval_result *res)
{
    size_t n = o->limit && o->limit < b->set->n ? o->limit : b->set->n;
    if (!n)
        return qd_error(QD_ERR_ARG, "%s: no problems to evaluate", b->name);
    bench_acc a = {.b = b, .o = o, .n = n, .c = calloc(n, sizeof(int)), .tokens_known = true, .res = res,
                   .ok = malloc((size_t)o->samples * sizeof(bool)),
                   .ext = malloc((size_t)o->samples * sizeof(char *))};
    *res = (qd_eval_result){.name = strdup(b->name), .style = b->style, .n_problems = n, .k = o->samples,
                            .code = b->code != NULL, .prompt_template = dup_or_null(b->prompt_template),
                            .right = calloc((size_t)o->n_examples + 1, sizeof *res->right),
                            .wrong = calloc((size_t)o->n_examples + 1, sizeof *res->wrong)};
    qd_status st = a.c && a.ok && a.ext && res->name && res->right && res->wrong &&
                   (res->prompt_template || !b->prompt_template) ? QD_OK : qd_error(QD_ERR_NOMEM, "%s", b->name);
    for (size_t first = 0; !st && first < n; first += (size_t)o->batch) {
        int nb = n - first < (size_t)o->batch ? (int)(n - first) : o->batch;
        st = run_batch(&a, first, nb, gen, ctx);
        if (!st)
            progress(&a, first + (size_t)nb);
    }
    if (!st)
        st = finish_bench(&a);
    free(a.c);
    free(a.ok);
    free(a.ext);
    return st;
}

static qd_status check_opts(const qd_eval_opts *o)
{
    if (o->samples < 1 || o->samples > 1 << 20)
        return qd_error(QD_ERR_ARG, "eval: samples %d: expected 1..1048576", o->samples);
    if (o->batch < 1 || o->n_examples < 0 || o->bootstrap_reps < 2)
        return qd_error(QD_ERR_ARG, "eval: batch %d, examples %d, bootstrap resamples %d: expected >= 1, >= 0, >= 2",
                        o->batch, o->n_examples, o->bootstrap_reps);
    if ((size_t)o->batch * (size_t)o->samples > (size_t)1 << 28)
        return qd_error(QD_ERR_ARG, "eval: batch %d x samples %d is too large", o->batch, o->samples);
    return QD_OK;
}

qd_status qd_eval_run(const qd_eval_bench *benches, size_t n_bench, const qd_eval_opts *o,
                      qd_eval_generate_fn gen, void *ctx, qd_eval_report *out)
{
    memset(out, 0, sizeof *out);
    qd_status st = check_opts(o);
    if (st)
        return st;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const char *tmpl = o->prompt_template ? o->prompt_template : QD_EVAL_QWEN_MATH_PROMPT;
    qd_eval_opts oo = *o;
    oo.prompt_template = tmpl;
    *out = (qd_eval_report){.bench = calloc(n_bench + 1, sizeof *out->bench), .k = o->samples,
                            .model = dup_or_null(o->model), .precision = dup_or_null(o->precision),
                            .prompt_template = strdup(tmpl)};
    if (!out->bench || !out->prompt_template)
        st = qd_error(QD_ERR_NOMEM, "eval: report");
    for (size_t i = 0; !st && i < n_bench; i++, out->n_bench++)
        st = eval_bench(&benches[i], &oo, gen, ctx, &out->bench[i]);
    if (st) { /* n_bench counts the failed benchmark too: its partial result is freed */
        qd_eval_report_free(out);
        return st;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    out->seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    return QD_OK;
}

void qd_eval_report_free(qd_eval_report *r)
{
    for (size_t i = 0; r->bench && i < r->n_bench; i++) {
        qd_eval_result *b = &r->bench[i];
        for (int j = 0; j < b->n_right; j++)
            example_free(&b->right[j]);
        for (int j = 0; j < b->n_wrong; j++)
            example_free(&b->wrong[j]);
        free(b->right);
        free(b->wrong);
        free(b->pass);
        free(b->name);
        free(b->prompt_template);
    }
    free(r->bench);
    free(r->model);
    free(r->precision);
    free(r->prompt_template);
    memset(r, 0, sizeof *r);
}
