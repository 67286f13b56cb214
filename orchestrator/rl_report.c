/* quads compare / quads report: the table and plots of RL runs (rl.h). */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <jansson.h>
#include "orchestrator/metrics.h"
#include "orchestrator/rl.h"
#include "orchestrator/svg.h"
#include "quant/fileio.h"

typedef struct {
    double first_pass, final_pass, gap_mean, gap_max, kl, agree, tps;
    int64_t steps;
    char recipe[64];
} run_summary;

/* Mean, max and last y of a metrics series (NaN when absent). */
static qd_status series_stats(const char *path, const char *key, double *mean, double *max, double *first,
                              double *last, int skip_step0)
{
    double *x, *y;
    int64_t n, used = 0;
    qd_status st = qd_metrics_read_series(path, key, &x, &y, &n);
    if (st)
        return st;
    double s = 0, mx = -INFINITY;
    *first = *last = NAN;
    for (int64_t i = 0; i < n; i++) {
        if (i == 0)
            *first = y[i];
        *last = y[i];
        if (skip_step0 && x[i] == 0)
            continue;
        s += y[i], used++;
        if (y[i] > mx)
            mx = y[i];
    }
    *mean = used ? s / (double)used : NAN;
    *max = used ? mx : NAN;
    free(x), free(y);
    return QD_OK;
}

static qd_status summarize(const char *run, run_summary *r)
{
    char m[4400], c[4400];
    double d0, d1, d2;
    snprintf(m, sizeof m, "%s/metrics.jsonl", run);
    snprintf(c, sizeof c, "%s/config.json", run);
    if (access(c, R_OK) != 0 || access(m, R_OK) != 0)
        return qd_error(QD_ERR_IO, "%s: not a run directory (config.json and metrics.jsonl expected)", run);
    json_error_t err;
    json_t *cfg = json_load_file(c, 0, &err);
    const char *rec = cfg ? json_string_value(json_object_get(json_object_get(cfg, "rollout"), "recipe")) : NULL;
    snprintf(r->recipe, sizeof r->recipe, "%s", rec ? rec : "?");
    json_decref(cfg);
    if (!cfg)
        return qd_error(QD_ERR_FORMAT, "%s:%d: %s", c, err.line, err.text);
    qd_status st = series_stats(m, "eval.pass1", &d0, &d1, &r->first_pass, &r->final_pass, 0);
    double steps = 0;
    if (!st)
        st = series_stats(m, "gap.mean_abs", &r->gap_mean, &d0, &d1, &d2, 1);
    if (!st)
        st = series_stats(m, "gap.max_abs", &d0, &r->gap_max, &d1, &d2, 1);
    if (!st)
        st = series_stats(m, "gap.k3_kl", &r->kl, &d0, &d1, &d2, 1);
    if (!st)
        st = series_stats(m, "router.agree_mean", &r->agree, &d0, &d1, &d2, 1);
    if (!st)
        st = series_stats(m, "time.tokens_per_s", &r->tps, &d0, &d1, &d2, 1);
    if (!st)
        st = series_stats(m, "step", &d0, &steps, &d1, &d2, 0);
    r->steps = isfinite(steps) ? (int64_t)steps : 0;
    return st;
}

static void cell(FILE *f, const char *fmt, double v)
{
    if (isfinite(v))
        fprintf(f, fmt, v);
    else
        fputs(" — |", f);
}

typedef struct {
    const char *const *names;
    const run_summary *s;
    int n;
} table_ctx;

static qd_status write_md(FILE *f, const char *path, void *vctx)
{
    const table_ctx *t = vctx;
    fprintf(f, "# RL runs\n\n"
               "| run | recipe | steps | pass@1 first | pass@1 final | mean \\|Δlogp\\| | max \\|Δlogp\\| "
               "| mismatch KL (k3) | router agreement | tokens/s |\n"
               "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < t->n; i++) {
        const run_summary *s = &t->s[i];
        fprintf(f, "| %s | %s | %lld |", t->names[i], s->recipe, (long long)s->steps);
        cell(f, " %.4f |", s->first_pass);
        cell(f, " %.4f |", s->final_pass);
        cell(f, " %.3g |", s->gap_mean);
        cell(f, " %.3g |", s->gap_max);
        cell(f, " %.3g |", s->kl);
        cell(f, " %.4f |", s->agree);
        cell(f, " %.0f |", s->tps);
        fputc('\n', f);
    }
    fprintf(f, "\npass@1: held-out, first and last eval. Gap: trainer vs rollout log-probs of the sampled\n"
               "tokens, mean over steps (max: the largest of any token). Router agreement: top-k experts the\n"
               "rollout and the trainer share on the same tokens. tokens/s: generated tokens / step time.\n\n"
               "![reward](reward.svg)\n\n![held-out pass@1](pass1.svg)\n\n![log-prob gap](gap.svg)\n");
    return QD_OK;
}

qd_status qd_rl_report(const char *const *runs, const char *const *names, int n, const char *out_dir)
{
    run_summary *s = calloc((size_t)n + 1, sizeof *s);
    const char **nm = calloc((size_t)n + 1, sizeof *nm), **met = calloc((size_t)n + 1, sizeof *met);
    char *buf = malloc((size_t)(n + 1) * 4400);
    qd_status st = !s || !nm || !met || !buf ? qd_error(QD_ERR_NOMEM, "report") : qd_mkdirs(out_dir);
    for (int i = 0; i < n && !st; i++) {
        nm[i] = names && names[i] ? names[i] : qd_path_base(runs[i]);
        snprintf(buf + (size_t)i * 4400, 4400, "%s/metrics.jsonl", runs[i]);
        met[i] = buf + (size_t)i * 4400;
        st = summarize(runs[i], &s[i]);
    }
    char p[4400];
    static const char *const keys[3][4] = {{"reward.svg", "reward_mean", "reward (train)", "mean reward"},
                                           {"pass1.svg", "eval.pass1", "held-out pass@1", "pass@1"},
                                           {"gap.svg", "gap.mean_abs", "rollout-trainer log-prob gap",
                                            "mean |logp_trainer - logp_rollout|"}};
    for (int k = 0; k < 3 && !st; k++) {
        qd_svg_plot plot = {.title = keys[k][2], .xlabel = "step", .ylabel = keys[k][3]};
        snprintf(p, sizeof p, "%s/%s", out_dir, keys[k][0]);
        st = qd_svg_write_metric(p, &plot, keys[k][1], met, nm, n);
        if (st == QD_ERR_ARG) /* no finite point (e.g. evals off): an empty plot is no error */
            st = QD_OK;
    }
    table_ctx t = {nm, s, n};
    snprintf(p, sizeof p, "%s/report.md", out_dir);
    if (!st)
        st = qd_atomic_write_with(p, write_md, &t);
    free(s), free(nm), free(met), free(buf);
    return st;
}
