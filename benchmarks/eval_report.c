/* report.json and report.md of an evaluation, written atomically. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "benchmarks/eval.h"
#include "quant/fileio.h"

/* Markdown shows at most this many bytes of a model output; report.json has all. */
#define MD_OUTPUT_MAX 2000

/* ---- UTF-8 -------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s (RFC 3629: no overlongs, no
 * surrogates, nothing above U+10FFFF), 0 when it is not one. */
static int utf8_seq(const unsigned char *s)
{
    if (s[0] < 0x80)
        return 1;
    int n = s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC2 ? 2 : 0;
    if (!n || s[0] > 0xF4)
        return 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    if ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] > 0x9F) ||
        (s[0] == 0xF0 && s[1] < 0x90) || (s[0] == 0xF4 && s[1] > 0x8F))
        return 0;
    return n;
}

/* A copy with every invalid byte replaced by U+FFFD: generation can stop in
 * the middle of a character, and JSON needs valid text. */
static char *utf8_clean(const char *s)
{
    size_t n = strlen(s);
    char *out = malloc(3 * n + 1), *w = out;
    if (!out)
        return NULL;
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int k = utf8_seq(p);
        if (k) {
            memcpy(w, p, (size_t)k);
            w += k, p += k;
        } else {
            memcpy(w, "\xEF\xBF\xBD", 3);
            w += 3, p++;
        }
    }
    *w = '\0';
    return out;
}

static json_t *jstr(const char *s)
{
    if (!s)
        return json_null();
    char *c = utf8_clean(s);
    json_t *v = c ? json_string(c) : NULL;
    free(c);
    return v;
}

/* NaN (unknown) as null: JSON has no NaN. */
static json_t *jreal(double x)
{
    return isfinite(x) ? json_real(x) : json_null();
}

/* ---- report.json -------------------------------------------------------- */

static json_t *example_json(const qd_eval_example *e)
{
    json_t *o = json_pack("{s:o, s:i, s:o, s:o, s:o, s:o, s:o}", "id", jstr(e->id), "sample", e->sample,
                          "problem", jstr(e->problem), "gold", jstr(e->gold), "extracted", jstr(e->extracted),
                          "output", jstr(e->output), "tokens", e->tokens >= 0 ? json_integer(e->tokens) : json_null());
    if (o && e->verdict && (json_object_set_new(o, "verdict", json_string(e->verdict)) ||
                            json_object_set_new(o, "detail", jstr(e->detail)))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *examples_json(const qd_eval_example *e, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, example_json(&e[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static const char *grader_name(const qd_eval_result *b)
{
    return b->code ? "code" : b->style == QD_GRADE_GSM8K ? "gsm8k" : b->style == QD_GRADE_DAPO ? "dapo" : "math";
}

/* Code: {"accepted": n, "wrong_answer": n, ...}, every verdict. */
static json_t *verdicts_json(const qd_eval_result *b)
{
    json_t *v = json_object();
    for (int i = 0; v && i < QD_CODE_N_VERDICTS; i++)
        if (json_object_set_new(v, qd_code_verdict_name((qd_code_verdict)i), json_integer((json_int_t)b->verdicts[i]))) {
            json_decref(v);
            return NULL;
        }
    return v;
}

static json_t *bench_json(const qd_eval_result *b)
{
    json_t *pass = json_object();
    for (int i = 0; pass && i < b->n_pass; i++) {
        char key[16];
        snprintf(key, sizeof key, "%d", b->pass[i].k);
        json_object_set_new(pass, key, json_real(b->pass[i].value));
    }
    json_t *o = json_pack("{s:o, s:s, s:I, s:i, s:I, s:I, s:f, s:[f,f], s:o, s:o, s:f, s:o, s:f, s:{s:o, s:o}}",
                          "name", jstr(b->name), "grader", grader_name(b), "problems", (json_int_t)b->n_problems,
                          "samples", b->k, "correct_samples", (json_int_t)b->n_correct,
                          "no_answer_samples", (json_int_t)b->n_no_answer, "pass@1", b->pass1,
                          "pass@1_ci95", b->pass1_lo, b->pass1_hi, "pass@k", pass, "maj@k", jreal(b->maj_k),
                          "mean@k", b->mean_k, "mean_tokens", jreal(b->mean_tokens), "mean_chars", b->mean_chars,
                          "examples", "right", examples_json(b->right, b->n_right), "wrong",
                          examples_json(b->wrong, b->n_wrong));
    if (o && ((b->code && json_object_set_new(o, "verdicts", verdicts_json(b))) ||
              (b->prompt_template && json_object_set_new(o, "prompt_template", jstr(b->prompt_template))))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

char *qd_eval_report_json(const qd_eval_report *r)
{
    json_t *benches = json_array();
    for (size_t i = 0; benches && i < r->n_bench; i++)
        if (json_array_append_new(benches, bench_json(&r->bench[i]))) {
            json_decref(benches);
            benches = NULL;
        }
    json_t *root = json_pack("{s:o, s:o, s:o, s:i, s:f, s:o}", "model", jstr(r->model), "precision",
                             jstr(r->precision), "prompt_template", jstr(r->prompt_template), "samples", r->k,
                             "seconds", r->seconds, "benchmarks", benches);
    char *s = root ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!s)
        return NULL;
    /* A trailing newline, as text files have. */
    size_t n = strlen(s);
    char *t = realloc(s, n + 2);
    if (!t) {
        free(s);
        return NULL;
    }
    memcpy(t + n, "\n", 2);
    return t;
}

/* ---- report.md ---------------------------------------------------------- */

/* Longest run of backticks in s: a fence or code span must be longer. */
static int backtick_run(const char *s)
{
    int best = 0, run = 0;
    for (; *s; s++) {
        run = *s == '`' ? run + 1 : 0;
        best = run > best ? run : best;
    }
    return best;
}

static void ticks(FILE *f, int n)
{
    while (n-- > 0)
        fputc('`', f);
}

/* An inline code span that shows s (newlines as spaces) literally. */
static void md_code(FILE *f, const char *s)
{
    if (!s) {
        fputs("(none)", f);
        return;
    }
    int n = backtick_run(s) + 1;
    const char *pad = s[0] == '`' || (*s && s[strlen(s) - 1] == '`') ? " " : "";
    ticks(f, n);
    fputs(pad, f);
    for (const char *p = s; *p; p++)
        fputc(*p == '\n' || *p == '\r' ? ' ' : *p, f);
    fputs(pad, f);
    ticks(f, n);
}

/* A fenced block of at most max bytes of s, cut at a character boundary. */
static void md_block(FILE *f, const char *s, size_t max)
{
    int n = backtick_run(s) + 1;
    n = n < 3 ? 3 : n;
    size_t len = strlen(s), cut = len <= max ? len : max;
    while (cut < len && ((unsigned char)s[cut] & 0xC0) == 0x80)
        cut--;
    ticks(f, n);
    fprintf(f, "text\n%.*s", (int)cut, s);
    if (cut < len)
        fprintf(f, "\n[... %zu more bytes; the whole output is in report.json]", len - cut);
    fputc('\n', f);
    ticks(f, n);
    fputs("\n\n", f);
}

static void md_examples(FILE *f, const char *title, const qd_eval_example *e, int n)
{
    fprintf(f, "### %s (%d shown)\n\n", title, n);
    for (int i = 0; i < n; i++) {
        fprintf(f, "**Problem ");
        md_code(f, e[i].id);
        fprintf(f, ", sample %d**: ", e[i].sample);
        if (e[i].verdict) { /* code: the verdict and why; the code is in the output */
            fprintf(f, "%s", e[i].verdict);
            if (e[i].detail) {
                fprintf(f, " (");
                md_code(f, e[i].detail);
                fprintf(f, ")");
            }
        } else {
            fprintf(f, "extracted ");
            md_code(f, e[i].extracted);
            fprintf(f, ", gold ");
            md_code(f, e[i].gold);
        }
        if (e[i].tokens >= 0)
            fprintf(f, ", %d tokens", e[i].tokens);
        fprintf(f, "\n\nProblem:\n\n");
        md_block(f, e[i].problem, MD_OUTPUT_MAX);
        fprintf(f, "Output:\n\n");
        md_block(f, e[i].output, MD_OUTPUT_MAX);
    }
}

/* A number with `digits` decimals, "n/a" when it is NaN (unknown or not defined). */
static void md_real(FILE *f, double t, int digits)
{
    if (isfinite(t))
        fprintf(f, "%.*f", digits, t);
    else
        fputs("n/a", f);
}

static void md_tokens(FILE *f, double t)
{
    md_real(f, t, 1);
}

/* Text in a table cell: '|' escaped, line breaks as spaces. */
static void md_cell(FILE *f, const char *s)
{
    for (; *s; s++)
        if (*s == '|')
            fputs("\\|", f);
        else
            fputc(*s == '\n' || *s == '\r' ? ' ' : *s, f);
}

static void md_summary(FILE *f, const qd_eval_report *r)
{
    fprintf(f, "| benchmark | problems | pass@1 | 95%% CI | pass@%d | maj@%d | mean tokens | mean chars |\n"
               "|---|---:|---:|---|---:|---:|---:|---:|\n", r->k, r->k);
    for (size_t i = 0; i < r->n_bench; i++) {
        const qd_eval_result *b = &r->bench[i];
        fputs("| ", f);
        md_cell(f, b->name);
        fprintf(f, " | %zu | %.4f | %.4f–%.4f | %.4f | ", b->n_problems, b->pass1, b->pass1_lo, b->pass1_hi,
                b->pass[b->n_pass - 1].value);
        md_real(f, b->maj_k, 4);
        fputs(" | ", f);
        md_tokens(f, b->mean_tokens);
        fprintf(f, " | %.1f |\n", b->mean_chars);
    }
    fprintf(f, "\n");
}

static void md_bench(FILE *f, const qd_eval_result *b)
{
    double ns = (double)b->n_problems * b->k;
    fprintf(f, "## %s\n\nGrader `%s`; %zu problems x %d samples; %zu correct samples (%.2f%%), "
               "%zu without %s.\n\n", b->name, grader_name(b), b->n_problems, b->k, b->n_correct,
            100.0 * (double)b->n_correct / ns, b->n_no_answer, b->code ? "a ``` code block" : "an extractable answer");
    if (b->code) {
        fprintf(f, "Samples by verdict (all tests run in the sandbox; the first failing test decides):");
        for (int i = 0; i < QD_CODE_N_VERDICTS; i++)
            fprintf(f, "%s %s %zu", i ? "," : "", qd_code_verdict_name((qd_code_verdict)i), b->verdicts[i]);
        fprintf(f, ".\n\n");
    }
    if (b->prompt_template) {
        fprintf(f, "Prompt template of this benchmark:\n\n");
        md_block(f, b->prompt_template, (size_t)-1);
    }
    fprintf(f, "| metric | value |\n|---|---:|\n| pass@1 | %.4f (95%% CI %.4f–%.4f) |\n", b->pass1, b->pass1_lo,
            b->pass1_hi);
    for (int i = 1; i < b->n_pass; i++)
        fprintf(f, "| pass@%d | %.4f |\n", b->pass[i].k, b->pass[i].value);
    fprintf(f, "| maj@%d | ", b->k);
    md_real(f, b->maj_k, 4);
    fprintf(f, " |\n| mean@%d | %.4f |\n| mean response tokens | ", b->k, b->mean_k);
    md_tokens(f, b->mean_tokens);
    fprintf(f, " |\n| mean response characters | %.1f |\n\n", b->mean_chars);
    md_examples(f, "Right answers", b->right, b->n_right);
    md_examples(f, "Wrong answers", b->wrong, b->n_wrong);
}

char *qd_eval_report_markdown(const qd_eval_report *r)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    fprintf(f, "# Evaluation report\n\n- model: ");
    md_code(f, r->model ? r->model : "(none: replayed outputs)");
    fprintf(f, "\n- precision: %s\n- samples per problem (K): %d\n- wall time: %.1f s\n- prompt template:\n\n",
            r->precision ? r->precision : "n/a", r->k, r->seconds);
    md_block(f, r->prompt_template, (size_t)-1);
    fprintf(f, "pass@1 is the mean over problems of c/K (c: correct samples of K), which is also mean@K; "
               "pass@k is the unbiased estimator of Chen et al. (2021) from the K samples; maj@K grades "
               "the answer most samples agree on; the CI is a percentile bootstrap over problems.\n\n");
    md_summary(f, r);
    for (size_t i = 0; i < r->n_bench; i++)
        md_bench(f, &r->bench[i]);
    if (fclose(f)) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* ---- files -------------------------------------------------------------- */

static qd_status write_text(const char *dir, const char *name, char *text)
{
    if (!text)
        return qd_error(QD_ERR_NOMEM, "%s/%s: building the report", dir, name);
    char path[4096];
    qd_status st = snprintf(path, sizeof path, "%s/%s", dir, name) < (int)sizeof path
                       ? qd_atomic_write(path, text, strlen(text))
                       : qd_error(QD_ERR_ARG, "%s: path too long", dir);
    free(text);
    return st;
}

qd_status qd_eval_write(const qd_eval_report *r, const char *dir)
{
    qd_status st = qd_mkdirs(dir);
    if (!st)
        st = write_text(dir, "report.json", qd_eval_report_json(r));
    if (!st)
        st = write_text(dir, "report.md", qd_eval_report_markdown(r));
    return st;
}
