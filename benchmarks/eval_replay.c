/* A generator that replays outputs generated elsewhere, from a JSONL file. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "benchmarks/eval.h"
#include "quant/fileio.h"

typedef struct {
    char *output;
    int tokens; /* -1: not given */
} sample;

struct qd_eval_replay {
    char *path;
    sample *s; /* (n) in file order */
    size_t n, cap;
    json_t *index; /* "benchmark\nid" -> array of indexes into s */
    const qd_eval_bench *benches;
    size_t n_bench, limit;
    char *tmpl;
    size_t bench, rec; /* the record the next prompt belongs to */
};

static size_t bench_size(const qd_eval_replay *r, size_t b)
{
    size_t n = r->benches[b].set->n;
    return r->limit && r->limit < n ? r->limit : n;
}

static json_t *lookup(const qd_eval_replay *r, const char *bench, const char *id)
{
    char *key;
    if (asprintf(&key, "%s\n%s", bench, id) < 0)
        return NULL;
    json_t *a = json_object_get(r->index, key);
    free(key);
    return a;
}

/* ---- loading ------------------------------------------------------------ */

/* The id as text: strings as they are, integers in decimal. */
static int id_text(json_t *v, char *buf, size_t cap, const char **out)
{
    if (json_is_string(v))
        *out = json_string_value(v);
    else if (json_is_integer(v))
        snprintf(buf, cap, "%" JSON_INTEGER_FORMAT, json_integer_value(v)), *out = buf;
    else
        return 0;
    return 1;
}

/* Which benchmark a line belongs to: its "benchmark" field, or the only one. */
static qd_status line_bench(const qd_eval_replay *r, json_t *o, long line, const char **name)
{
    json_t *b = json_object_get(o, "benchmark");
    if (b && !json_is_string(b))
        return qd_error(QD_ERR_FORMAT, "%s line %ld: field 'benchmark' is not a string", r->path, line);
    if (!b && r->n_bench > 1)
        return qd_error(QD_ERR_FORMAT, "%s line %ld: field 'benchmark' is missing (needed when several "
                        "benchmarks are evaluated)", r->path, line);
    *name = b ? json_string_value(b) : r->benches[0].name;
    return QD_OK;
}

static qd_status add_sample(qd_eval_replay *r, const char *bench, const char *id, const char *output, int tokens)
{
    if (r->n == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 256;
        sample *s = realloc(r->s, cap * sizeof *s);
        if (!s)
            return qd_error(QD_ERR_NOMEM, "%s: %zu outputs", r->path, cap);
        r->s = s, r->cap = cap;
    }
    char *key = NULL;
    json_t *a = NULL;
    if (asprintf(&key, "%s\n%s", bench, id) < 0 || !(r->s[r->n].output = strdup(output)))
        return free(key), qd_error(QD_ERR_NOMEM, "%s: outputs", r->path);
    r->s[r->n].tokens = tokens;
    if (!(a = json_object_get(r->index, key)))
        json_object_set_new_nocheck(r->index, key, a = json_array());
    free(key);
    if (!a || json_array_append_new(a, json_integer((json_int_t)r->n)))
        return free(r->s[r->n].output), qd_error(QD_ERR_NOMEM, "%s: outputs", r->path);
    r->n++;
    return QD_OK;
}

static qd_status parse_fields(qd_eval_replay *r, json_t *o, long line)
{
    char buf[32];
    const char *id, *bench = NULL;
    json_t *out = json_object_get(o, "output"), *tok = json_object_get(o, "tokens");
    if (!id_text(json_object_get(o, "id"), buf, sizeof buf, &id))
        return qd_error(QD_ERR_FORMAT, "%s line %ld: field 'id' is missing or not a string or integer", r->path, line);
    if (!json_is_string(out))
        return qd_error(QD_ERR_FORMAT, "%s line %ld: field 'output' is missing or not a string", r->path, line);
    if (tok && (!json_is_integer(tok) || json_integer_value(tok) < 0 || json_integer_value(tok) > 1 << 30))
        return qd_error(QD_ERR_FORMAT, "%s line %ld: field 'tokens' is not an integer in 0..2^30", r->path, line);
    qd_status st = line_bench(r, o, line, &bench);
    return st ? st : add_sample(r, bench, id, json_string_value(out), tok ? (int)json_integer_value(tok) : -1);
}

static qd_status parse_line(qd_eval_replay *r, const char *text, long line)
{
    json_error_t jerr;
    json_t *o = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    qd_status st = !o ? qd_error(QD_ERR_FORMAT, "%s line %ld: invalid JSON: %s", r->path, line, jerr.text)
                 : !json_is_object(o) ? qd_error(QD_ERR_FORMAT, "%s line %ld: not a JSON object", r->path, line)
                 : parse_fields(r, o, line);
    json_decref(o);
    return st;
}

static int blank(const char *s)
{
    return s[strspn(s, " \t\r\n")] == '\0';
}

static qd_status read_file(qd_eval_replay *r)
{
    FILE *f;
    qd_status st = qd_fopen_regular(r->path, &f); /* a FIFO must not hang the eval */
    if (st)
        return st;
    char *text = NULL;
    size_t cap = 0;
    long line = 0;
    while (!st && getline(&text, &cap, f) >= 0)
        if (++line, !blank(text))
            st = parse_line(r, text, line);
    if (!st && ferror(f))
        st = qd_error(QD_ERR_IO, "%s: read error after line %ld", r->path, line);
    if (!st && !r->n)
        st = qd_error(QD_ERR_FORMAT, "%s: no outputs in the file", r->path);
    free(text);
    fclose(f);
    return st;
}

qd_status qd_eval_replay_load(const char *path, const qd_eval_bench *benches, size_t n_bench, size_t limit,
                              const char *prompt_template, qd_eval_replay **out)
{
    *out = NULL;
    if (!n_bench)
        return qd_error(QD_ERR_ARG, "%s: no benchmark to replay", path);
    qd_eval_replay *r = calloc(1, sizeof *r);
    if (!r)
        return qd_error(QD_ERR_NOMEM, "%s", path);
    *r = (qd_eval_replay){.path = strdup(path), .index = json_object(), .benches = benches, .n_bench = n_bench,
                          .limit = limit,
                          .tmpl = strdup(prompt_template ? prompt_template : QD_EVAL_QWEN_MATH_PROMPT)};
    qd_status st = r->path && r->index && r->tmpl ? read_file(r) : qd_error(QD_ERR_NOMEM, "%s", path);
    if (st) {
        qd_eval_replay_free(r);
        return st;
    }
    *out = r;
    return QD_OK;
}

qd_status qd_eval_replay_min_samples(const qd_eval_replay *r, int *k)
{
    size_t best = (size_t)-1;
    for (size_t b = 0; b < r->n_bench; b++)
        for (size_t i = 0; i < bench_size(r, b); i++) {
            const char *name = r->benches[b].name, *id = r->benches[b].set->rec[i].id;
            size_t have = json_array_size(lookup(r, name, id));
            if (!have)
                return qd_error(QD_ERR_FORMAT, "%s: no output for benchmark '%s' problem '%s'", r->path, name, id);
            best = have < best ? have : best;
        }
    if (best == (size_t)-1)
        return qd_error(QD_ERR_ARG, "%s: the benchmarks have no problems", r->path);
    *k = best > 1 << 20 ? 1 << 20 : (int)best;
    return QD_OK;
}

/* ---- generation --------------------------------------------------------- */

/* The record the next prompt belongs to; advances the cursor. */
static qd_status next_record(qd_eval_replay *r, const char *prompt, const qd_eval_bench **b,
                             const qd_bench_record **rec)
{
    while (r->bench < r->n_bench && r->rec >= bench_size(r, r->bench))
        r->bench++, r->rec = 0;
    if (r->bench == r->n_bench)
        return qd_error(QD_ERR_ARG, "%s: more prompts than evaluated problems", r->path);
    *b = &r->benches[r->bench];
    *rec = &(*b)->set->rec[r->rec++];
    char *want = qd_eval_prompt((*b)->prompt_template ? (*b)->prompt_template : r->tmpl, (*rec)->problem);
    int same = want && !strcmp(want, prompt);
    free(want);
    return same ? QD_OK : qd_error(QD_ERR_ARG, "%s: prompt does not belong to benchmark '%s' problem '%s' "
                                   "(prompts out of order)", r->path, (*b)->name, (*rec)->id);
}

static qd_status serve(qd_eval_replay *r, const char *prompt, int k, char **outputs, int *tokens)
{
    const qd_eval_bench *b = NULL;
    const qd_bench_record *rec = NULL;
    qd_status st = next_record(r, prompt, &b, &rec);
    if (st)
        return st;
    json_t *a = lookup(r, b->name, rec->id);
    if (json_array_size(a) < (size_t)k)
        return qd_error(QD_ERR_FORMAT, "%s: benchmark '%s' problem '%s' has %zu outputs, %d samples were asked for",
                        r->path, b->name, rec->id, json_array_size(a), k);
    for (int j = 0; j < k; j++) {
        const sample *s = &r->s[json_integer_value(json_array_get(a, (size_t)j))];
        if (!(outputs[j] = strdup(s->output)))
            return qd_error(QD_ERR_NOMEM, "%s: output", r->path);
        tokens[j] = s->tokens;
    }
    return QD_OK;
}

qd_status qd_eval_replay_generate(void *ctx, const char *const *prompts, int n_prompts, int k,
                                  char **outputs, int *out_tokens)
{
    qd_status st = QD_OK;
    for (int i = 0; i < n_prompts && !st; i++)
        st = serve(ctx, prompts[i], k, outputs + (size_t)i * k, out_tokens + (size_t)i * k);
    for (size_t i = 0; st && i < (size_t)n_prompts * k; i++) {
        free(outputs[i]);
        outputs[i] = NULL;
    }
    return st;
}

void qd_eval_replay_free(qd_eval_replay *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n; i++)
        free(r->s[i].output);
    free(r->s);
    json_decref(r->index);
    free(r->path);
    free(r->tmpl);
    free(r);
}
