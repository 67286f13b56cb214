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
static qd_status config_text(const char *run_dir, char **md)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/config.json", run_dir);
    json_error_t err;
    json_t *cfg = json_load_file(p, 0, &err);
    if (!cfg)
        return qd_error(QD_ERR_FORMAT, "%s:%d: %s", p, err.line, err.text);
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
            m->layers = json_load_file(p, 0, NULL);
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
    keep_ctx c = {step, NULL, 0, 0};
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
    series_ctx c = {key, NULL, NULL, 0, 0};
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
