/* Seeded arithmetic problems (synth.h). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "benchmarks/synth.h"
#include "quant/splitmix64.h"

static int draw(uint64_t *s, int n) { return (int)(qd_splitmix64_next(s) % (uint64_t)n); }

/* FNV-1a 64 of the text. */
static uint64_t text_hash(const char *t)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *t; t++)
        h = (h ^ (unsigned char)*t) * 0x100000001b3ULL;
    return h;
}

qd_split qd_synth_split_of(const char *problem)
{
    return text_hash(problem) % 10 == 0 ? QD_SPLIT_TEST : QD_SPLIT_TRAIN;
}

/* One expression, left to right; a sum is parenthesized before it is
 * multiplied so that the text reads with the usual precedence. */
static void make_problem(uint64_t *rng, const qd_synth_opts *o, char *text, size_t n, int64_t *value)
{
    char expr[256]; /* at most 4 operations on 4-digit operands: well under 100 bytes */
    int64_t v = draw(rng, o->max_operand + 1);
    int last = '*';
    size_t len = (size_t)snprintf(expr, sizeof expr, "%" PRId64, v);
    for (int i = 0; i < o->steps; i++) {
        static const char ops[] = "+-*";
        int op = ops[draw(rng, 3)];
        int b = draw(rng, o->max_operand + 1);
        if (op == '*' && last != '*') {
            memmove(expr + 1, expr, len);
            expr[0] = '(';
            expr[len + 1] = ')';
            len += 2;
        }
        len += (size_t)snprintf(expr + len, sizeof expr - len, " %c %d", op, b);
        v = op == '+' ? v + b : op == '-' ? v - b : v * b;
        last = op;
    }
    snprintf(text, n, "What is %s?", expr);
    *value = v;
}

/* Open-addressing set of problem texts already taken (indexes into the set). */
typedef struct {
    size_t *slot; /* index + 1, 0 = empty */
    size_t cap;
} seen_set;

static int seen_add(seen_set *h, const qd_bench_set *s, size_t idx)
{
    size_t i = text_hash(s->rec[idx].problem) & (h->cap - 1);
    for (; h->slot[i]; i = (i + 1) & (h->cap - 1))
        if (!strcmp(s->rec[h->slot[i] - 1].problem, s->rec[idx].problem))
            return 0;
    h->slot[i] = idx + 1;
    return 1;
}

static qd_status check_opts(const qd_synth_opts *o)
{
    if (o->steps < 1 || o->steps > 4)
        return qd_error(QD_ERR_ARG, "synthetic: steps %d not in 1..4", o->steps);
    if (o->max_operand < 1 || o->max_operand > 1000)
        return qd_error(QD_ERR_ARG, "synthetic: max_operand %d not in 1..1000", o->max_operand);
    return QD_OK;
}

static qd_status fill(const qd_synth_opts *o, qd_split split, size_t n, qd_bench_set *out, seen_set *seen)
{
    /* Mix the split into the stream so train and test draw differently. */
    uint64_t rng = o->seed ^ (split == QD_SPLIT_TEST ? 0x5deece66dULL : 0);
    size_t draws = 0, limit = 200 * n + 100000;
    while (out->n < n) {
        if (++draws > limit)
            return qd_error(QD_ERR_ARG, "synthetic: only %zu distinct %s problems after %zu draws "
                            "(steps %d, operands 0..%d); ask for fewer", out->n,
                            split == QD_SPLIT_TEST ? "held-out" : "train", limit, o->steps, o->max_operand);
        char text[320], ans[32], id[48];
        int64_t v;
        make_problem(&rng, o, text, sizeof text, &v);
        if (qd_synth_split_of(text) != split)
            continue;
        qd_bench_record *r = &out->rec[out->n];
        memset(r, 0, sizeof *r);
        snprintf(ans, sizeof ans, "%" PRId64, v);
        snprintf(id, sizeof id, "%s-%zu", split == QD_SPLIT_TEST ? "test" : "train", out->n);
        r->problem = strdup(text);
        if (!r->problem)
            return qd_error(QD_ERR_NOMEM, "synthetic: out of memory");
        if (!seen_add(seen, out, out->n)) {
            free(r->problem);
            continue;
        }
        r->answer = strdup(ans);
        r->id = strdup(id);
        out->n++;
        if (!r->answer || !r->id)
            return qd_error(QD_ERR_NOMEM, "synthetic: out of memory");
    }
    return QD_OK;
}

qd_status qd_synth_generate(const qd_synth_opts *o, qd_split split, size_t n, qd_bench_set *out)
{
    memset(out, 0, sizeof *out);
    qd_status st = check_opts(o);
    if (st != QD_OK)
        return st;
    seen_set seen = {0};
    for (seen.cap = 16; seen.cap < 2 * n + 2; seen.cap *= 2)
        ;
    seen.slot = calloc(seen.cap, sizeof *seen.slot);
    out->rec = calloc(n ? n : 1, sizeof *out->rec);
    st = seen.slot && out->rec ? fill(o, split, n, out, &seen) : qd_error(QD_ERR_NOMEM, "synthetic: out of memory");
    free(seen.slot);
    if (st != QD_OK)
        qd_bench_set_free(out);
    return st;
}

qd_status qd_synth_split_parse(const char *s, qd_split *out)
{
    if (!strcmp(s, "train"))
        *out = QD_SPLIT_TRAIN;
    else if (!strcmp(s, "test") || !strcmp(s, "heldout"))
        *out = QD_SPLIT_TEST;
    else
        return qd_error(QD_ERR_ARG, "split '%s': expected train or test", s);
    return QD_OK;
}
