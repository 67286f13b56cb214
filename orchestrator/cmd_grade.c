/* quads grade: JSONL {"output": ..., "gold": ...} on stdin -> JSONL
 * {"correct": ..., "extracted": ...} on stdout, one line per input line. */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "orchestrator/commands.h"
#include "rewards/rewards.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: quads grade [--style math|gsm8k|dapo] < in.jsonl > out.jsonl\n\n"
               "Each input line is {\"output\": STRING, \"gold\": STRING or NUMBER}; each output\n"
               "line is {\"correct\": BOOL, \"extracted\": STRING or null}. Default style: math.\n");
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

int qd_cmd_grade(int argc, char **argv)
{
    qd_grade_style style = QD_GRADE_MATH;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
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
