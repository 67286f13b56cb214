/* quads grade: JSONL {"output": ..., "gold": ...} on stdin -> JSONL
 * {"correct": ..., "extracted": ...} on stdout, one line per input line.
 * --style code: {"output": ..., "problem": <LiveCodeBench row>} -> {"correct",
 * "passed", "total", "verdict"}, the code run in the sandbox (rewards/code.h). */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "orchestrator/commands.h"
#include "rewards/code.h"
#include "rewards/rewards.h"
#include "rewards/sandbox.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: quads grade [--style math|gsm8k|dapo] < in.jsonl > out.jsonl\n"
               "       quads grade --style code [--jobs N] [--timeout S] [--problem-timeout S]\n"
               "                   [--memory-mb M] < in.jsonl > out.jsonl\n\n"
               "Each input line is {\"output\": STRING, \"gold\": STRING or NUMBER}; each output\n"
               "line is {\"correct\": BOOL, \"extracted\": STRING or null}. Default style: math.\n\n"
               "--style code: each input line is {\"output\": STRING, \"problem\": OBJECT}, a\n"
               "LiveCodeBench row (public_test_cases, private_test_cases as a JSON list or a string\n"
               "holding one, metadata); the last ``` block of the output runs in the sandbox\n"
               "(docs/sandbox.md) against every test. Each output line is {\"correct\": BOOL,\n"
               "\"passed\": INT, \"total\": INT, \"verdict\": accepted|wrong_answer|time_limit|\n"
               "memory_limit|runtime_error|no_code|sandbox_error, \"detail\": STRING (failures)}.\n"
               "--jobs N tests at once (1); --timeout S per test (6, LiveCodeBench's);\n"
               "--problem-timeout S per sample ((S+1)*tests+5); --memory-mb M per test (4096).\n");
}

/* The text of a string field; numbers (GSM8K golds are often numbers) as written. */
static const char *field_text(json_t *obj, const char *key, char *buf, size_t cap)
{
    json_t *v = json_object_get(obj, key);
    if (json_is_string(v))
        return json_string_value(v);
    if (json_is_integer(v)) {
        snprintf(buf, cap, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return buf;
    }
    if (json_is_real(v)) {
        snprintf(buf, cap, "%.17g", json_real_value(v));
        return buf;
    }
    return NULL;
}

/* Grades one line; prints the result or an error naming the line and field. */
static int grade_line(const char *line, long lineno, qd_grade_style style)
{
    json_error_t jerr;
    json_t *obj = json_loads(line, 0, &jerr);
    if (!obj || !json_is_object(obj)) {
        fprintf(stderr, "quads grade: stdin line %ld: %s\n", lineno,
                obj ? "not a JSON object" : jerr.text);
        json_decref(obj);
        return 1;
    }
    char gbuf[64], obuf[64];
    const char *output = field_text(obj, "output", obuf, sizeof obuf);
    const char *gold = field_text(obj, "gold", gbuf, sizeof gbuf);
    if (!output || !gold) {
        fprintf(stderr, "quads grade: stdin line %ld: field '%s' is missing or not a string\n",
                lineno, output ? "gold" : "output");
        json_decref(obj);
        return 1;
    }
    qd_rewards_result r;
    if (qd_rewards_grade(output, gold, style, &r)) {
        fprintf(stderr, "quads grade: stdin line %ld: %s\n", lineno, qd_last_error());
        json_decref(obj);
        return 1;
    }
    json_t *out = json_pack("{s:b, s:s?}", "correct", r.correct, "extracted", r.extracted);
    char *s = out ? json_dumps(out, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    bool ok = s != NULL;
    if (ok)
        printf("%s\n", s);
    else
        fprintf(stderr, "quads grade: stdin line %ld: field 'output': extracted answer is not valid UTF-8\n", lineno);
    free(s);
    json_decref(out);
    qd_rewards_result_free(&r);
    json_decref(obj);
    return ok ? 0 : 1;
}

static bool blank(const char *s)
{
    for (; *s; s++)
        if (!strchr(" \t\r\n", *s))
            return false;
    return true;
}

/* ---- --style code */

typedef struct {
    char *output;
    qd_code_problem problem;
} code_line;

static int code_parse_line(const char *line, long lineno, code_line *cl)
{
    json_error_t jerr;
    json_t *obj = json_loads(line, 0, &jerr);
    char where[64];
    snprintf(where, sizeof where, "stdin line %ld: field 'problem'", lineno);
    int rc = 1;
    if (!obj || !json_is_object(obj))
        fprintf(stderr, "quads grade: stdin line %ld: %s\n", lineno, obj ? "not a JSON object" : jerr.text);
    else if (!json_is_string(json_object_get(obj, "output")))
        fprintf(stderr, "quads grade: stdin line %ld: field 'output' is missing or not a string\n", lineno);
    else if (!json_is_object(json_object_get(obj, "problem")))
        fprintf(stderr, "quads grade: stdin line %ld: field 'problem' is missing or not an object\n", lineno);
    else if (qd_code_problem_from_json(json_object_get(obj, "problem"), where, &cl->problem))
        fprintf(stderr, "quads grade: %s\n", qd_last_error());
    else if (!(cl->output = strdup(json_string_value(json_object_get(obj, "output")))))
        fprintf(stderr, "quads grade: stdin line %ld: out of memory\n", lineno);
    else
        rc = 0;
    json_decref(obj);
    return rc;
}

/* Grades the lines read so far and prints their results in order. */
static int code_flush(const qd_code_opts *o, code_line *lines, int n)
{
    const char **outs = calloc((size_t)n + 1, sizeof *outs);
    const qd_code_problem **probs = calloc((size_t)n + 1, sizeof *probs);
    qd_code_result *res = calloc((size_t)n + 1, sizeof *res);
    int rc = 1;
    if (!outs || !probs || !res)
        fprintf(stderr, "quads grade: out of memory\n");
    else {
        for (int i = 0; i < n; i++) {
            outs[i] = lines[i].output;
            probs[i] = &lines[i].problem;
        }
        if (qd_code_grade(o, outs, probs, n, res))
            fprintf(stderr, "quads grade: %s\n", qd_last_error());
        else
            rc = 0;
    }
    for (int i = 0; i < n && !rc; i++) {
        json_t *j = json_pack("{s:b, s:i, s:i, s:s}", "correct", res[i].correct, "passed", res[i].passed,
                              "total", res[i].total, "verdict", qd_code_verdict_name(res[i].verdict));
        if (j && res[i].detail)
            json_object_set_new(j, "detail", json_stringn_nocheck(res[i].detail, strlen(res[i].detail)));
        char *s = j ? json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
        if (s)
            printf("%s\n", s);
        else {
            fprintf(stderr, "quads grade: cannot encode result %d\n", i + 1);
            rc = 1;
        }
        free(s);
        json_decref(j);
    }
    for (int i = 0; i < n; i++) {
        if (res)
            qd_code_result_free(&res[i]);
        free(lines[i].output);
        qd_code_problem_free(&lines[i].problem);
    }
    free(outs);
    free(probs);
    free(res);
    fflush(stdout);
    return rc;
}

/* Reads and grades in batches so that memory stays bounded and every worker
 * has tests from many samples to run. */
static int grade_code(const qd_code_opts *o)
{
    enum { BATCH = 256 };
    /* No interpreter or a bad QD_SANDBOX_LEVEL fails the command, rather
     * than every sample with sandbox_error. */
    if (qd_sandbox_isolation(NULL, NULL)) {
        fprintf(stderr, "quads grade: %s\n", qd_last_error());
        return 1;
    }
    code_line *lines = calloc(BATCH, sizeof *lines);
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0;
    int n = 0, rc = lines ? 0 : 1;
    while (!rc && getline(&line, &cap, stdin) >= 0) {
        lineno++;
        if (blank(line))
            continue;
        if ((rc = code_parse_line(line, lineno, &lines[n])))
            break;
        if (++n == BATCH) {
            rc = code_flush(o, lines, n);
            n = 0;
        }
    }
    if (lines)
        rc = code_flush(o, lines, n) || rc;
    free(line);
    free(lines);
    return rc;
}

/* A positive number argument (seconds, megabytes, jobs). */
static bool parse_pos(const char *flag, const char *s, double *out)
{
    char *end;
    *out = strtod(s, &end);
    if (end == s || *end || !(*out > 0) || *out > 1e9) {
        fprintf(stderr, "quads grade: %s '%s': expected a positive number\n", flag, s);
        return false;
    }
    return true;
}

int qd_cmd_grade(int argc, char **argv)
{
    qd_grade_style style = QD_GRADE_MATH;
    bool code = false, code_flags = false;
    qd_code_opts copts = qd_code_opts_default();
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--style") && i + 1 < argc && !strcmp(argv[i + 1], "code")) {
            code = true;
            i++;
            continue;
        }
        const char *const num_flags[] = {"--jobs", "--timeout", "--problem-timeout", "--memory-mb"};
        int k = 0;
        while (k < 4 && strcmp(argv[i], num_flags[k]))
            k++;
        if (k < 4 && i + 1 < argc) {
            double v;
            const char *flag = argv[i++];
            if (!parse_pos(flag, argv[i], &v))
                return 2;
            code_flags = true;
            if (k == 0 && (v != (int)v || v > 4096)) {
                fprintf(stderr, "quads grade: --jobs '%s': expected an integer from 1 to 4096\n", argv[i]);
                return 2;
            }
            if (k == 0)
                copts.jobs = (int)v;
            else if (k == 1)
                copts.test_s = v;
            else if (k == 2)
                copts.problem_s = v;
            else
                copts.mem_bytes = (size_t)(v * 1048576.0);
            continue;
        }
        if (!strcmp(argv[i], "--style") && i + 1 < argc) {
            if (qd_rewards_style_parse(argv[++i], &style)) {
                fprintf(stderr, "quads grade: %s\n", qd_last_error());
                return 2;
            }
            continue;
        }
        fprintf(stderr, "quads grade: unknown argument '%s'\n", argv[i]);
        usage(stderr);
        return 2;
    }
    if (code)
        return grade_code(&copts);
    if (code_flags) {
        fprintf(stderr, "quads grade: --jobs, --timeout, --problem-timeout and --memory-mb go with --style code\n");
        return 2;
    }
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0;
    int rc = 0;
    while (getline(&line, &cap, stdin) >= 0) {
        lineno++;
        if (blank(line))
            continue;
        if ((rc = grade_line(line, lineno, style)))
            break;
    }
    free(line);
    fflush(stdout);
    return rc;
}
