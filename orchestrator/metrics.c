/* metrics.jsonl writing, truncation on resume, series reading, progress lines. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "orchestrator/metrics.h"
#include "orchestrator/tb.h"
#include "quant/fileio.h"

struct qd_metrics {
    FILE *f;
    char *path;
    qd_tb *tb;       /* RUN/tb/'s event file, or NULL */
    char *run_dir;   /* with tb: where layers.json names the per-layer arrays */
    json_t *layers;  /* RUN/layers.json once it exists, or NULL */
};

qd_status qd_metrics_open(qd_metrics **m, const char *path)
{
    *m = calloc(1, sizeof **m);
    if (!*m || !((*m)->path = strdup(path))) {
        free(*m);
        *m = NULL;
        return qd_error(QD_ERR_NOMEM, "%s: opening metrics", path);
    }
    (*m)->f = fopen(path, "a");
    if (!(*m)->f) {
        qd_status st = qd_error(QD_ERR_IO, "%s: open for append: %s", path, strerror(errno));
        qd_metrics_close(*m);
        *m = NULL;
        return st;
    }
    return QD_OK;
}

void qd_metrics_close(qd_metrics *m)
{
    if (!m)
        return;
    if (m->f)
        fclose(m->f);
    qd_tb_close(m->tb);
    json_decref(m->layers);
    free(m->run_dir);
    free(m->path);
    free(m);
}

/* text as a Markdown code block (four spaces a line: TensorBoard's text
 * plugin renders Markdown, and the JSON stays as it is); malloc'ed. */
static char *code_block(const char *text)
{
    size_t lines = 1;
    for (const char *c = text; *c; c++)
        lines += *c == '\n';
    char *md = malloc(strlen(text) + 4 * lines + 1), *o = md;
    for (const char *c = text; md && *c; c++) {
        if (c == text || c[-1] == '\n')
            o = (char *)memcpy(o, "    ", 4) + 4;
        *o++ = *c;
    }
    if (md)
        *o = '\0';
    return md;
}

/* run_dir/config.json as indented JSON in a code block (malloc'ed). */
qd_status qd_json_load_regular(const char *path, size_t flags, json_t **out)
{
    *out = NULL;
    char *text;
    size_t len;
    QD_TRY(qd_read_file(path, &text, &len));
    json_error_t err;
    *out = json_loadb(text, len, flags, &err);
    free(text);
    return *out ? QD_OK : qd_error(QD_ERR_FORMAT, "%s:%d: %s", path, err.line, err.text);
}

static qd_status config_text(const char *run_dir, char **md)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/config.json", run_dir);
    json_t *cfg;
    QD_TRY(qd_json_load_regular(p, 0, &cfg));
    char *text = json_dumps(cfg, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(cfg);
    *md = text ? code_block(text) : NULL;
    free(text);
    return *md ? QD_OK : qd_error(QD_ERR_NOMEM, "%s: as text", p);
}

qd_status qd_metrics_tensorboard(qd_metrics *m, const char *run_dir, int64_t step)
{
    char p[4400], *md = NULL;
    snprintf(p, sizeof p, "%s/tb", run_dir);
    if (!(m->run_dir = strdup(run_dir)))
        return qd_error(QD_ERR_NOMEM, "%s: opening the event file", p);
    qd_status st = config_text(run_dir, &md);
    if (!st)
        st = qd_tb_open(&m->tb, p, step + 1);
    if (!st)
        st = qd_tb_text(m->tb, "config", step, md);
    if (!st)
        st = qd_tb_flush(m->tb);
    free(md);
    return st;
}

/* The event of one metrics line; the per-layer arrays are named by
 * RUN/layers.json, read once it exists (the first step writes it). */
static qd_status append_tb(qd_metrics *m, const json_t *obj)
{
    if (!m->layers) {
        char p[4400];
        snprintf(p, sizeof p, "%s/layers.json", m->run_dir);
        if (access(p, F_OK) == 0)
            (void)qd_json_load_regular(p, 0, &m->layers); /* optional: without it, no per-layer tags */
    }
    qd_status st = qd_tb_json(m->tb, json_integer_value(json_object_get(obj, "step")), obj, m->layers);
    return st ? st : qd_tb_flush(m->tb);
}

qd_status qd_metrics_append(qd_metrics *m, const json_t *obj)
{
    if (!json_is_integer(json_object_get(obj, "step")))
        return qd_error(QD_ERR_ARG, "%s: metrics line without an integer \"step\"", m->path);
    char *line = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    if (!line)
        return qd_error(QD_ERR_NOMEM, "%s: serializing metrics", m->path);
    int bad = fputs(line, m->f) == EOF || fputc('\n', m->f) == EOF || fflush(m->f) != 0 ||
              fsync(fileno(m->f)) != 0;
    free(line);
    if (bad)
        return qd_error(QD_ERR_IO, "%s: append: %s", m->path, strerror(errno));
    return m->tb ? append_tb(m, obj) : QD_OK;
}

int qd_metrics_set(json_t *obj, const char *key, double v)
{
    return json_object_set_new(obj, key, isfinite(v) ? json_real(v) : json_null());
}

/* One line (start, len) as JSON: *obj gets a new reference, or NULL when the
 * line is the torn last line (no newline at the end and not JSON). */
static qd_status parse_line(json_t **obj, const char *path, int lineno, const char *start, size_t len,
                            bool last_unterminated)
{
    json_error_t err;
    *obj = json_loadb(start, len, 0, &err);
    if (!*obj && last_unterminated)
        return QD_OK;
    if (!*obj)
        return qd_error(QD_ERR_FORMAT, "%s:%d: malformed JSON: %s", path, lineno, err.text);
    if (!json_is_integer(json_object_get(*obj, "step"))) {
        json_decref(*obj);
        *obj = NULL;
        return qd_error(QD_ERR_FORMAT, "%s:%d: field \"step\": missing or not an integer", path, lineno);
    }
    return QD_OK;
}

/* Calls fn(obj, start, len, ctx) for every complete line of the file. */
typedef qd_status (*line_fn)(const json_t *obj, const char *start, size_t len, void *ctx);

static qd_status for_each_line(const char *path, line_fn fn, void *ctx)
{
    char *text;
    size_t len;
    qd_status st = qd_read_file(path, &text, &len);
    int lineno = 0;
    for (size_t pos = 0; st == QD_OK && pos < len;) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - text) : len;
        lineno++;
        json_t *obj = NULL;
        if (end > pos)
            st = parse_line(&obj, path, lineno, text + pos, end - pos, nl == NULL);
        if (st == QD_OK && obj)
            st = fn(obj, text + pos, end - pos, ctx);
        json_decref(obj);
        pos = end + 1;
    }
    free(text);
    return st;
}

typedef struct {
    int64_t step;
    char *out;
    size_t len, cap;
} keep_ctx;

static qd_status keep_line(const json_t *obj, const char *start, size_t len, void *vctx)
{
    keep_ctx *c = vctx;
    if (json_integer_value(json_object_get(obj, "step")) > c->step)
        return QD_OK;
    if (c->len + len + 1 > c->cap) {
        size_t cap = 2 * (c->len + len + 1);
        char *grown = realloc(c->out, cap);
        if (!grown)
            return qd_error(QD_ERR_NOMEM, "metrics truncate");
        c->out = grown;
        c->cap = cap;
    }
    memcpy(c->out + c->len, start, len);
    c->out[c->len + len] = '\n';
    c->len += len + 1;
    return QD_OK;
}

qd_status qd_metrics_truncate(const char *path, int64_t step)
{
    if (access(path, F_OK) != 0)
        return QD_OK;
    keep_ctx c = {.step = step};
    qd_status st = for_each_line(path, keep_line, &c);
    if (st == QD_OK)
        st = qd_atomic_write(path, c.out ? c.out : "", c.len);
    free(c.out);
    return st;
}

typedef struct {
    const char *key;
    double *x, *y;
    int64_t n, cap;
} series_ctx;

/* The member named key, else the dotted path into nested objects. */
static const json_t *lookup(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    if (v)
        return v;
    const char *dot = strchr(key, '.');
    if (!dot)
        return NULL;
    json_t *sub = json_object_getn(obj, key, (size_t)(dot - key));
    return json_is_object(sub) ? lookup(sub, dot + 1) : NULL;
}

static qd_status add_point(const json_t *obj, const char *start, size_t len, void *vctx)
{
    series_ctx *c = vctx;
    const json_t *v = lookup(obj, c->key);
    if (!json_is_number(v))
        return QD_OK;
    if (c->n == c->cap) {
        int64_t cap = c->cap ? 2 * c->cap : 64;
        double *x = realloc(c->x, (size_t)cap * sizeof *x);
        if (x)
            c->x = x;
        double *y = x ? realloc(c->y, (size_t)cap * sizeof *y) : NULL;
        if (!y)
            return qd_error(QD_ERR_NOMEM, "metrics series %s", c->key);
        c->y = y;
        c->cap = cap;
    }
    c->x[c->n] = (double)json_integer_value(json_object_get(obj, "step"));
    c->y[c->n++] = json_number_value(v);
    return QD_OK;
}

qd_status qd_metrics_read_series(const char *path, const char *key, double **x, double **y, int64_t *n)
{
    series_ctx c = {.key = key};
    qd_status st = access(path, F_OK) == 0 ? for_each_line(path, add_point, &c)
                                           : qd_error(QD_ERR_IO, "%s: no such file", path);
    if (st != QD_OK) {
        free(c.x);
        free(c.y);
        c.x = c.y = NULL;
        c.n = 0;
    }
    *x = c.x;
    *y = c.y;
    *n = c.n;
    return st;
}

/* h:mm:ss of a non-negative number of seconds ("?" if unknown). */
static void hms(char *buf, size_t n, double s)
{
    if (!isfinite(s) || s < 0) {
        snprintf(buf, n, "?");
        return;
    }
    long t = lround(s);
    snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
}

static const char *const phase_names[QD_NPHASES] = {"", "rollout", "train", "sync", "eval"};

int qd_progress_format(char *buf, size_t n, const qd_progress *p)
{
    char eta[32], now[128] = "";
    double per_step = p->steps_done > 0 ? p->elapsed_s / (double)p->steps_done : NAN;
    hms(eta, sizeof eta, per_step * (double)(p->steps - p->step));
    if (p->phase != QD_PHASE_NONE) {
        char pe[32];
        double last = p->phase_s[p->phase];
        hms(pe, sizeof pe, last > 0 ? last : NAN);
        snprintf(now, sizeof now, "step %lld/%lld %s ETA %s  ", (long long)p->step + 1, (long long)p->steps,
                 phase_names[p->phase], pe);
    }
    if (*now)
        return snprintf(buf, n, "%sreward %.3f  gap %.4f  %.0f tok/s  ETA %s", now, p->reward, p->gap,
                        p->tokens_per_s, eta);
    return snprintf(buf, n, "step %lld/%lld  reward %.3f  gap %.4f  %.0f tok/s  ETA %s", (long long)p->step,
                    (long long)p->steps, p->reward, p->gap, p->tokens_per_s, eta);
}

void qd_progress_phase(qd_progress *p, qd_phase ph, double now_s)
{
    if (p->phase != QD_PHASE_NONE)
        p->phase_s[p->phase] = now_s - p->phase_t0;
    p->phase = ph;
    p->phase_t0 = now_s;
}

void qd_progress_write(FILE *f, bool tty, const qd_progress *p)
{
    char line[256];
    if (!tty && p->phase != QD_PHASE_NONE)
        return;
    qd_progress_format(line, sizeof line, p);
    if (tty)
        fprintf(f, "\r%s\033[K%s", line, p->step >= p->steps ? "\n" : "");
    else
        fprintf(f, "%s\n", line);
    fflush(f);
}

void qd_progress_print(const qd_progress *p)
{
    qd_progress_write(stderr, isatty(fileno(stderr)), p);
}

/* ---- the measurements of an RL step */

void qd_train_stats_add(qd_train_stats *ts, const qd_grpo_stats *g)
{
    double w = (double)g->tokens;
    ts->loss += g->loss;
    ts->kl += g->kl;
    ts->clip_frac += g->clip_frac * w;
    ts->clip_low += g->clip_frac_low * w;
    ts->clip_high += g->clip_frac_high * w;
    ts->tis_mean += g->tis_mean * w;
    ts->tis_clipped += g->tis_clipped_frac * w;
    if (g->ratio_max > ts->ratio_max)
        ts->ratio_max = g->ratio_max;
    ts->tokens += g->tokens;
}

qd_status qd_layer_stats_zero(qd_layer_stats *ls, int nlin)
{
    free(ls->act_err), free(ls->weight_err), free(ls->act_sq), free(ls->act_norm);
    ls->nlin = nlin;
    size_t n = (size_t)nlin + 1;
    ls->act_err = calloc(n, sizeof(double)), ls->weight_err = calloc(n, sizeof(double));
    ls->act_sq = calloc(n, sizeof(double)), ls->act_norm = calloc(n, sizeof(double));
    if (!ls->act_err || !ls->weight_err || !ls->act_sq || !ls->act_norm)
        return qd_error(QD_ERR_NOMEM, "diagnostics");
    return QD_OK;
}

qd_status qd_layer_stats_quant(qd_layer_stats *ls, const qd_diagnostics *d)
{
    QD_TRY(qd_layer_stats_zero(ls, d->num_linear));
    for (int i = 0; i < d->num_linear; i++) {
        ls->act_sq[i] = d->act_err[i], ls->act_norm[i] = d->act_norm[i];
        ls->weight_err[i] = d->weight_err[i];
    }
    return QD_OK;
}

qd_status qd_layer_stats_router(qd_layer_stats *ls, int nmoe)
{
    free(ls->agree), free(ls->hits), free(ls->picks);
    ls->nmoe = nmoe;
    ls->agree = calloc((size_t)nmoe + 1, sizeof(double));
    ls->hits = calloc((size_t)nmoe + 1, sizeof(double)), ls->picks = calloc((size_t)nmoe + 1, sizeof(double));
    if (!ls->agree || !ls->hits || !ls->picks)
        return qd_error(QD_ERR_NOMEM, "router agreement");
    return QD_OK;
}

void qd_layer_stats_agree(qd_layer_stats *ls, const int32_t *a, const int32_t *b, int N, int K)
{
    for (int l = 0; l < ls->nmoe; l++) {
        int64_t hit = 0;
        for (int t = 0; t < N; t++) {
            const int32_t *x = a + ((size_t)l * N + t) * K, *y = b + ((size_t)l * N + t) * K;
            for (int i = 0; i < K; i++)
                for (int j = 0; j < K; j++)
                    hit += x[i] == y[j];
        }
        ls->hits[l] = (double)hit, ls->picks[l] = (double)N * K;
    }
}

void qd_layer_stats_ratios(qd_layer_stats *ls)
{
    for (int i = 0; i < ls->nlin; i++)
        ls->act_err[i] = ls->act_norm[i] > 0 ? ls->act_sq[i] / ls->act_norm[i] : 0.0;
    for (int l = 0; l < ls->nmoe; l++)
        ls->agree[l] = ls->picks[l] > 0 ? ls->hits[l] / ls->picks[l] : 1.0;
}

void qd_layer_stats_free(qd_layer_stats *ls)
{
    free(ls->act_err), free(ls->weight_err), free(ls->act_sq), free(ls->act_norm);
    free(ls->agree), free(ls->hits), free(ls->picks);
}

qd_status qd_metrics_write_layers(const char *path, const qd_diagnostics *d, const qd_model_config *m)
{
    if (access(path, F_OK) == 0)
        return QD_OK;
    json_t *o = json_object(), *lin = json_array(), *moe = json_array();
    for (int i = 0; i < d->num_linear; i++)
        json_array_append_new(lin, json_string(d->names[i]));
    for (int l = 0; l < m->num_hidden_layers; l++)
        if (qd_model_config_is_moe_layer(m, l))
            json_array_append_new(moe, json_integer(l));
    json_object_set_new(o, "quant", lin);
    json_object_set_new(o, "router", moe);
    char *text = json_dumps(o, JSON_INDENT(2));
    json_decref(o);
    qd_status st = text ? qd_atomic_write(path, text, strlen(text)) : qd_error(QD_ERR_NOMEM, "%s", path);
    free(text);
    return st;
}

qd_status qd_metrics_gap(qd_gap_stats *g, const float *lp_old, const float *lp_ro, const int *rlen, int S, int M)
{
    float *ent = malloc(sizeof(float) * (size_t)S * M + 1);
    uint8_t *mask = malloc((size_t)S * M + 1);
    if (!ent || !mask) {
        free(ent), free(mask);
        return qd_error(QD_ERR_NOMEM, "gap");
    }
    for (size_t i = 0; i < (size_t)S * M; i++) {
        mask[i] = (int)(i % M) < rlen[i / M];
        ent[i] = mask[i] ? -lp_ro[i] : 0.0f;
    }
    qd_status st = qd_grpo_gap(g, lp_old, lp_ro, ent, mask, S, M);
    free(ent), free(mask);
    return st;
}

static json_t *array_of(const double *x, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        json_array_append_new(a, isfinite(x[i]) ? json_real(x[i]) : json_null());
    return a;
}

static double mean_of(const double *x, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += x[i];
    return n ? s / n : NAN;
}

/* obj.code = {"accepted": n, ...}, every verdict, when any sample was
 * graded as code (math tasks' lines stay as they were). */
static void put_verdicts(json_t *obj, const int64_t *v)
{
    int64_t sum = 0;
    for (int i = 0; i < QD_CODE_N_VERDICTS; i++)
        sum += v[i];
    if (!sum)
        return;
    json_t *c = json_object();
    for (int i = 0; i < QD_CODE_N_VERDICTS; i++)
        json_object_set_new(c, qd_code_verdict_name((qd_code_verdict)i), json_integer(v[i]));
    json_object_set_new(obj, "code", c);
}

static json_t *eval_json(const qd_task_eval_result *ev)
{
    json_t *e = json_object();
    qd_metrics_set(e, "pass1", ev->pass1);
    qd_metrics_set(e, "mean_len", ev->mean_len);
    qd_metrics_set(e, "format_rate", ev->format_rate);
    json_object_set_new(e, "problems", json_integer(ev->problems));
    put_verdicts(e, ev->verdicts);
    return e;
}

void qd_metrics_put_eval(json_t *o, json_t *time, const qd_task_eval_result *ev, double secs)
{
    json_object_set_new(o, "eval", eval_json(ev));
    qd_metrics_set(time, "eval_s", secs);
}

void qd_metrics_put_eval_as(json_t *o, json_t *time, const char *precision, const qd_task_eval_result *ev,
                            double secs)
{
    char key[64];
    json_object_set_new(json_object_get(o, "eval"), precision, eval_json(ev));
    snprintf(key, sizeof key, "eval_%s_s", precision);
    qd_metrics_set(time, key, secs);
}

/* The gap, per-layer and timing objects of a step line. */
static void put_layers(json_t *o, const qd_step_metrics *m)
{
    const qd_train_stats *ts = m->train;
    const qd_layer_stats *ls = m->layers;
    json_t *gap = json_object(), *q = json_object(), *rt = json_object(), *tm = json_object();
    qd_metrics_set(gap, "mean_abs", ts->gap.mean_abs);
    qd_metrics_set(gap, "max_abs", ts->gap.max_abs);
    qd_metrics_set(gap, "k3_kl", ts->gap.k3_kl);
    qd_metrics_set(gap, "pearson", ts->gap.pearson);
    json_object_set_new(gap, "tokens", json_integer(ts->gap.tokens));
    json_object_set_new(o, "gap", gap);
    json_object_set_new(q, "act_err", array_of(ls->act_err, ls->nlin));
    json_object_set_new(q, "weight_err", array_of(ls->weight_err, ls->nlin));
    qd_metrics_set(q, "act_err_mean", mean_of(ls->act_err, ls->nlin));
    qd_metrics_set(q, "weight_err_mean", mean_of(ls->weight_err, ls->nlin));
    json_object_set_new(o, "quant", q);
    json_object_set_new(rt, "agree", array_of(ls->agree, ls->nmoe));
    qd_metrics_set(rt, "agree_mean", mean_of(ls->agree, ls->nmoe));
    json_object_set_new(o, "router", rt);
    qd_metrics_set(tm, "rollout_s", m->t[0]);
    qd_metrics_set(tm, "train_s", m->t[1]);
    qd_metrics_set(tm, "logprob_s", m->t[4]);
    qd_metrics_set(tm, "sync_s", m->t[2]);
    qd_metrics_set(tm, "step_s", m->t[3]);
    qd_metrics_set(tm, "tokens_per_s", m->t[3] > 0 ? (double)m->rollout->tokens / m->t[3] : 0);
    if (json_object_get(o, "code"))
        qd_metrics_set(tm, "grade_s", m->rollout->grade_s);
    json_object_set_new(o, "time", tm);
}

json_t *qd_metrics_step_json(const qd_step_metrics *m)
{
    const qd_rollout_stats *rs = m->rollout;
    const qd_train_stats *ts = m->train;
    json_t *o = json_object();
    if (!o)
        return NULL;
    json_object_set_new(o, "step", json_integer(m->step));
    double g = (double)(rs->generated ? rs->generated : 1), tok = (double)(ts->tokens ? ts->tokens : 1);
    double u = (double)(ts->updates ? ts->updates : 1);
    qd_metrics_set(o, "reward_mean", rs->reward_sum / g);
    qd_metrics_set(o, "pass1_train", rs->score_sum / g);
    qd_metrics_set(o, "response_len", rs->len_sum / g);
    qd_metrics_set(o, "entropy", ts->gap.entropy);
    qd_metrics_set(o, "loss", ts->loss / u);
    qd_metrics_set(o, "kl", ts->kl / u);
    qd_metrics_set(o, "clip_frac", ts->clip_frac / tok);
    qd_metrics_set(o, "clip_frac_low", ts->clip_low / tok);
    qd_metrics_set(o, "clip_frac_high", ts->clip_high / tok);
    qd_metrics_set(o, "ratio_max", ts->ratio_max);
    qd_metrics_set(o, "tis_mean", ts->tis_mean / tok);
    qd_metrics_set(o, "tis_clipped_frac", ts->tis_clipped / tok);
    qd_metrics_set(o, "grad_norm", ts->grad_norm / u);
    json_object_set_new(o, "updates", json_integer(ts->updates));
    qd_metrics_set(o, "lr", ts->lr);
    json_object_set_new(o, "samples", json_integer(rs->generated));
    json_object_set_new(o, "groups_kept", json_integer(m->groups_kept));
    json_object_set_new(o, "gen_batches", json_integer(rs->gen_batches));
    json_object_set_new(o, "data_pos", json_integer(m->data_pos));
    json_object_set_new(o, "optimizer_step", json_integer(m->optimizer_step));
    put_verdicts(o, rs->verdicts);
    put_layers(o, m);
    return o;
}
