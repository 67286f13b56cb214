/* Grading one output against one gold answer in a named style. */
#include <stdlib.h>
#include <string.h>
#include "rewards/internal.h"
#include "rewards/rewards.h"

qd_status qd_rewards_style_parse(const char *name, qd_grade_style *style)
{
    static const char *const names[] = {"math", "gsm8k", "dapo"};
    for (int i = 0; i < 3; i++)
        if (!strcmp(name, names[i])) {
            *style = (qd_grade_style)i;
            return QD_OK;
        }
    return qd_error(QD_ERR_ARG, "grade style '%s': expected math, gsm8k or dapo", name);
}

/* A GSM8K number without "$", thousands commas or a trailing full stop;
 * NULL when out of memory. */
static char *clean_number(const char *s)
{
    char *a = qd_rw_replace(s, ",", "");
    qd_rw_replace_inplace(&a, "$", "");
    char *t = qd_rw_trim(a);
    free(a);
    if (!t)
        return NULL;
    size_t n = strlen(t);
    while (n && t[n - 1] == '.')
        t[--n] = '\0';
    return t;
}

static bool grade_gsm8k(const char *pred, const char *gold_text)
{
    char *gold = qd_rewards_extract(gold_text, QD_GRADE_GSM8K);
    if (!gold)
        return false;
    char *a = clean_number(gold), *b = clean_number(pred);
    bool ok = qd_rewards_equiv(a, b);
    free(a);
    free(b);
    free(gold);
    return ok;
}

/* DAPO compares Minerva-normalized strings; a boxed gold is unboxed first. */
static bool grade_dapo(const char *pred, const char *gold_text)
{
    char *boxed = qd_rewards_last_boxed(gold_text);
    char *g = qd_rewards_normalize_minerva(boxed ? boxed : gold_text);
    char *p = qd_rewards_normalize_minerva(pred);
    bool ok = g && p && !strcmp(g, p);
    free(boxed);
    free(g);
    free(p);
    return ok;
}

static bool grade_math(const char *pred, const char *gold_text)
{
    char *gold = qd_rewards_extract(gold_text, QD_GRADE_MATH);
    bool ok = gold && qd_rewards_equiv(gold, pred);
    free(gold);
    return ok;
}

static bool verdict(const char *pred, const char *gold_text, qd_grade_style style)
{
    switch (style) {
    case QD_GRADE_GSM8K:
        return grade_gsm8k(pred, gold_text);
    case QD_GRADE_DAPO:
        return grade_dapo(pred, gold_text);
    default:
        return grade_math(pred, gold_text);
    }
}

qd_status qd_rewards_grade(const char *output, const char *gold, qd_grade_style style,
                           qd_rewards_result *res)
{
    if (!output || !gold)
        return qd_error(QD_ERR_ARG, "grade: %s is missing", output ? "gold" : "output");
    unsigned long failures = qd_rw_alloc_failures();
    res->extracted = qd_rewards_extract(output, style);
    res->correct = res->extracted && verdict(res->extracted, gold, style);
    if (qd_rw_alloc_failures() != failures) { /* some step fell back: no verdict */
        qd_rewards_result_free(res);
        res->correct = false;
        return qd_error(QD_ERR_NOMEM, "grade: out of memory while grading an answer of %zu bytes",
                        strlen(output));
    }
    return QD_OK;
}

void qd_rewards_result_free(qd_rewards_result *res)
{
    free(res->extracted);
    res->extracted = NULL;
}
