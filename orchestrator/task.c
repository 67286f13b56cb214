/* The synthetic task's format, reward and held-out eval (task.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "orchestrator/task.h"
#include "benchmarks/lcb.h"

qd_status qd_task_parse(const char *name, qd_synth_opts *o)
{
    int steps = QD_TASK_DEFAULT_STEPS, max_operand = QD_TASK_DEFAULT_MAX_OPERAND;
    const char *p = name;
    if (strncmp(p, "arith", 5))
        return qd_error(QD_ERR_ARG, "task '%s': expected arith, arith1..arith4, optionally with :MAX_OPERAND", name);
    p += 5;
    if (*p >= '1' && *p <= '4')
        steps = *p++ - '0';
    if (*p == ':') {
        char *end;
        long v = strtol(p + 1, &end, 10);
        if (end == p + 1 || *end || v < 1 || v > 1000)
            return qd_error(QD_ERR_ARG, "task '%s': the operand bound after ':' must be 1..1000", name);
        max_operand = (int)v;
        p = end;
    }
    if (*p)
        return qd_error(QD_ERR_ARG, "task '%s': expected arith, arith1..arith4, optionally with :MAX_OPERAND", name);
    o->steps = steps;
    o->max_operand = max_operand;
    return QD_OK;
}

qd_status qd_task_prompt_text(const char *problem, char **out)
{
    size_t n = strlen(QD_TASK_PROMPT_PREFIX) + strlen(problem) + strlen(QD_TASK_PROMPT_SUFFIX) + 1;
    *out = malloc(n);
    if (!*out)
        return qd_error(QD_ERR_NOMEM, "task: out of memory");
    snprintf(*out, n, "%s%s%s", QD_TASK_PROMPT_PREFIX, problem, QD_TASK_PROMPT_SUFFIX);
    return QD_OK;
}

qd_status qd_task_end_id(const qd_tokenizer *tok, int32_t *id)
{
    *id = qd_tokenizer_token_id(tok, QD_TASK_END_TOKEN);
    if (*id < 0)
        return qd_error(QD_ERR_FORMAT, "tokenizer: no %s token (the task's end token)", QD_TASK_END_TOKEN);
    return QD_OK;
}

/* Appends the ids of text to *ids (n used, cap allocated). */
static qd_status append_text(const qd_tokenizer *tok, const char *text, int32_t **ids, size_t *n)
{
    int32_t *part;
    size_t np;
    qd_status st = qd_tokenizer_encode(tok, text, strlen(text), &part, &np);
    if (st)
        return st;
    int32_t *grown = realloc(*ids, (*n + np + 1) * sizeof *grown); /* +1: room for the end token */
    if (!grown) {
        free(part);
        return qd_error(QD_ERR_NOMEM, "task: out of memory");
    }
    if (np)
        memcpy(grown + *n, part, np * sizeof *part);
    free(part);
    *ids = grown;
    *n += np;
    return QD_OK;
}

qd_status qd_task_encode(const qd_tokenizer *tok, const char *problem, const char *answer,
                         int32_t **ids, size_t *n_ids, size_t *n_prompt)
{
    *ids = NULL;
    *n_ids = 0;
    int32_t end = -1;
    char *prompt = NULL;
    qd_status st = answer ? qd_task_end_id(tok, &end) : QD_OK;
    if (!st)
        st = qd_task_prompt_text(problem, &prompt);
    if (!st)
        st = append_text(tok, prompt, ids, n_ids);
    free(prompt);
    if (n_prompt)
        *n_prompt = *n_ids;
    if (!st && answer) {
        st = append_text(tok, answer, ids, n_ids);
        if (!st)
            (*ids)[(*n_ids)++] = end; /* append_text left room */
    }
    if (st) {
        free(*ids);
        *ids = NULL;
        *n_ids = 0;
    }
    return st;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

qd_status qd_task_completion_text(const qd_tokenizer *tok, const int32_t *completion, size_t n, char **text,
                                  size_t *text_len, int *format_ok)
{
    int32_t end;
    *text = NULL;
    qd_status st = qd_task_end_id(tok, &end);
    if (st)
        return st;
    size_t len = 0, tlen = 0;
    while (len < n && completion[len] != end)
        len++;
    if (format_ok)
        *format_ok = len < n;
    int32_t n_ids = qd_tokenizer_n_ids(tok);
    for (size_t i = 0; i < len; i++)
        if (completion[i] < 0 || completion[i] >= n_ids)
            return QD_OK; /* names no token: wrong, not an error */
    if (qd_tokenizer_decode(tok, completion, len, 0, text, &tlen))
        *text = NULL; /* not decodable: wrong, not an error */
    if (text_len)
        *text_len = tlen;
    return QD_OK;
}

qd_status qd_task_reward(const qd_tokenizer *tok, const int32_t *completion, size_t n, const char *gold,
                         float *reward, int *format_ok)
{
    char *text;
    size_t tlen;
    *reward = 0.0f;
    qd_status st = qd_task_completion_text(tok, completion, n, &text, &tlen, format_ok);
    if (st || !text)
        return st;
    size_t a = 0, b = tlen;
    while (a < b && is_space(text[a]))
        a++;
    while (b > a && is_space(text[b - 1]))
        b--;
    *reward = b - a == strlen(gold) && !memcmp(text + a, gold, b - a) ? 1.0f : 0.0f;
    free(text);
    return QD_OK;
}

/* ---- grading */

/* The problem of record r, among the *nd decoded so far (seen[d] -> probs[d]),
 * decoded when new. A batch holds each problem's samples together, so the
 * search from the last one is short. */
static qd_status code_problem(const qd_bench_record *r, const qd_bench_record **seen, qd_code_problem *probs,
                              int *nd, const qd_code_problem **out)
{
    for (int d = *nd - 1; d >= 0; d--)
        if (seen[d] == r) {
            *out = &probs[d];
            return QD_OK;
        }
    char name[512];
    snprintf(name, sizeof name, "problem '%s'", r->id);
    if (!r->code)
        return qd_error(QD_ERR_ARG, "%s: not a code problem", name);
    qd_status st = qd_lcb_problem(r->code, name, &probs[*nd]);
    if (st)
        return st;
    seen[*nd] = r;
    *out = &probs[(*nd)++];
    return QD_OK;
}

static qd_status grade_code(const qd_task_grader *g, const qd_tokenizer *tok, const int32_t *ids, size_t stride,
                            const int32_t *len, const qd_bench_record *const *recs, int n, float *score,
                            int *format_ok, int64_t *verdicts)
{
    char **texts = calloc((size_t)n + 1, sizeof *texts);
    const qd_bench_record **seen = calloc((size_t)n + 1, sizeof *seen);
    qd_code_problem *probs = calloc((size_t)n + 1, sizeof *probs);
    const qd_code_problem **pp = calloc((size_t)n + 1, sizeof *pp);
    qd_code_result *res = calloc((size_t)n + 1, sizeof *res);
    qd_status st = texts && seen && probs && pp && res ? QD_OK : qd_error(QD_ERR_NOMEM, "code grading: %d samples", n);
    int nd = 0;
    for (int i = 0; !st && i < n; i++) {
        int fmt;
        st = qd_task_completion_text(tok, ids + (size_t)i * stride, (size_t)len[i], &texts[i], NULL, &fmt);
        if (format_ok)
            format_ok[i] = fmt;
        if (!st && g->edit)
            g->edit(g->edit_ctx, recs[i]->id, &texts[i]);
        if (!st && !texts[i] && !(texts[i] = strdup(""))) /* no text: no code */
            st = qd_error(QD_ERR_NOMEM, "code grading");
        if (!st)
            st = code_problem(recs[i], seen, probs, &nd, &pp[i]);
    }
    if (!st)
        st = qd_code_grade(g->code, (const char *const *)texts, pp, n, res);
    for (int i = 0; !st && i < n; i++) {
        score[i] = res[i].correct ? 1.0f : 0.0f;
        if (verdicts)
            verdicts[res[i].verdict]++;
        qd_code_result_free(&res[i]);
    }
    for (int i = 0; texts && i < n; i++)
        free(texts[i]);
    for (int d = 0; d < nd; d++)
        qd_code_problem_free(&probs[d]);
    free(texts), free(seen), free(probs), free(pp), free(res);
    return st;
}

qd_status qd_task_grade(const qd_task_grader *g, const qd_tokenizer *tok, const int32_t *ids, size_t stride,
                        const int32_t *len, const qd_bench_record *const *recs, int n, float *score, int *format_ok,
                        int64_t *verdicts)
{
    if (g && g->code)
        return grade_code(g, tok, ids, stride, len, recs, n, score, format_ok, verdicts);
    for (int i = 0; i < n; i++) {
        qd_status st = qd_task_reward(tok, ids + (size_t)i * stride, (size_t)len[i], recs[i]->answer, &score[i],
                                      format_ok ? &format_ok[i] : NULL);
        if (st)
            return st;
    }
    return QD_OK;
}

/* The prompt ids of each problem of the eval. */
typedef struct {
    int32_t **ids;     /* (problems) prompt ids */
    size_t *len;       /* (problems) */
} prompt_table;

/* What one eval chunk needs besides its range. */
typedef struct {
    qd_backend *b;
    const qd_tokenizer *tok;
    const qd_bench_set *set;
    const prompt_table *pt;
    const qd_task_grader *g;
    int samples, max_new;
    float temperature;
    uint64_t seed;
    int32_t end;
} eval_ctx;

static qd_status eval_chunk(const eval_ctx *e, int first, int B, qd_task_eval_result *acc, double *correct)
{
    const prompt_table *pt = e->pt;
    int samples = e->samples, max_new = e->max_new;
    int Tp = 1;
    for (int k = 0; k < B; k++)
        if ((int)pt->len[(first + k) / samples] > Tp)
            Tp = (int)pt->len[(first + k) / samples];
    int32_t *prompt = calloc((size_t)B * Tp, sizeof *prompt), *plen = calloc((size_t)B, sizeof *plen);
    uint64_t *sid = calloc((size_t)B, sizeof *sid);
    int32_t *out = calloc((size_t)B * max_new, sizeof *out), *olen = calloc((size_t)B, sizeof *olen);
    float *logp = calloc((size_t)B * max_new, sizeof *logp), *score = calloc((size_t)B, sizeof *score);
    int *fmt = calloc((size_t)B, sizeof *fmt);
    const qd_bench_record **recs = calloc((size_t)B, sizeof *recs);
    qd_status st = prompt && plen && sid && out && olen && logp && score && fmt && recs
                       ? QD_OK : qd_error(QD_ERR_NOMEM, "task eval: out of memory");
    for (int k = 0; !st && k < B; k++) {
        int p = (first + k) / samples;
        memcpy(prompt + (size_t)k * Tp, pt->ids[p], pt->len[p] * sizeof(int32_t));
        plen[k] = (int32_t)pt->len[p];
        sid[k] = (uint64_t)(first + k); /* = problem * samples + sample */
        recs[k] = &e->set->rec[p];
    }
    if (!st) {
        qd_generate_request req = {.B = B, .Tp = Tp, .prompt = prompt, .prompt_len = plen, .seq_id = sid,
                                   .seed = e->seed, .max_new_tokens = max_new, .temperature = e->temperature,
                                   .top_k = 0, .top_p = 1.0f, .stop = &e->end, .num_stop = 1};
        qd_generate_result res = {.tokens = out, .logp = logp, .lengths = olen};
        st = qd_backend_generate(e->b, &req, &res);
    }
    if (!st)
        st = qd_task_grade(e->g, e->tok, out, (size_t)max_new, olen, recs, B, score, fmt, acc->verdicts);
    for (int k = 0; !st && k < B; k++) {
        correct[(first + k) / samples] += score[k];
        acc->mean_len += olen[k];
        acc->format_rate += fmt[k];
    }
    free(score), free(fmt), free(recs);
    free(prompt);
    free(plen);
    free(sid);
    free(out);
    free(olen);
    free(logp);
    return st;
}

qd_status qd_task_eval(qd_backend *b, const qd_tokenizer *tok, const qd_bench_set *set, int limit,
                       int samples, float temperature, uint64_t seed, int max_new_tokens,
                       const qd_task_grader *g, qd_task_eval_result *out)
{
    memset(out, 0, sizeof *out);
    if (samples < 1 || limit < 0 || temperature < 0)
        return qd_error(QD_ERR_ARG, "task eval: samples %d, limit %d, temperature %g out of range",
                        samples, limit, temperature);
    int np = limit == 0 || (size_t)limit > set->n ? (int)set->n : limit;
    int max_new = max_new_tokens > 0 ? max_new_tokens : QD_TASK_MAX_NEW_TOKENS;
    int32_t end;
    qd_status st = qd_task_end_id(tok, &end);
    if (st || np == 0)
        return st;
    prompt_table pt = {calloc((size_t)np, sizeof *pt.ids), calloc((size_t)np, sizeof *pt.len)};
    double *correct = calloc((size_t)np, sizeof *correct);
    if (!pt.ids || !pt.len || !correct)
        st = qd_error(QD_ERR_NOMEM, "task eval: out of memory");
    for (int i = 0; !st && i < np; i++)
        st = qd_task_encode(tok, set->rec[i].problem, NULL, &pt.ids[i], &pt.len[i], NULL);
    int total = np * samples;
    eval_ctx e = {.b = b, .tok = tok, .set = set, .pt = &pt, .g = g, .samples = samples, .max_new = max_new,
                  .temperature = temperature, .seed = seed, .end = end};
    for (int first = 0; !st && first < total; first += QD_TASK_EVAL_CHUNK)
        st = eval_chunk(&e, first, total - first < QD_TASK_EVAL_CHUNK ? total - first : QD_TASK_EVAL_CHUNK, out,
                        correct);
    if (!st) {
        for (int i = 0; i < np; i++)
            out->pass1 += correct[i] / samples;
        out->pass1 /= np;
        out->mean_len /= total;
        out->format_rate /= total;
        out->problems = np;
        out->completions = total;
    }
    for (int i = 0; pt.ids && i < np; i++)
        free(pt.ids[i]);
    free(pt.ids);
    free(pt.len);
    free(correct);
    if (st)
        memset(out, 0, sizeof *out);
    return st;
}
