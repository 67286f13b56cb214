/* quads compare / quads report: the table, JSON and plots of RL runs grouped
 * into rows (report.h), and qd_rl_report, one row a run (rl.h). */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <jansson.h>
#include "orchestrator/metrics.h"
#include "orchestrator/report.h"
#include "orchestrator/rl.h"
#include "orchestrator/svg.h"
#include "quant/fileio.h"

#define PATH_N 4400

/* a column of report.md and report.json: its JSON key, its title, its format */
typedef struct {
    const char *key, *title, *fmt;
} col_def;

static const col_def cols[QD_NCOLS] = {
    [QD_COL_PASS_FIRST] = {"pass1_first", "pass@1 first", "%.4f"},
    [QD_COL_PASS_FINAL] = {"pass1_final", "pass@1 final", "%.4f"},
    [QD_COL_BF16_FIRST] = {"pass1_bf16_first", "bf16 pass@1 first", "%.4f"},
    [QD_COL_BF16_FINAL] = {"pass1_bf16_final", "bf16 pass@1 final", "%.4f"},
    [QD_COL_GAP_MEAN] = {"gap_mean", "mean \\|Δlogp\\|", "%.3g"},
    [QD_COL_GAP_MAX] = {"gap_max", "max \\|Δlogp\\|", "%.3g"},
    [QD_COL_KL] = {"k3_kl", "mismatch KL (k3)", "%.3g"},
    [QD_COL_AGREE] = {"router_agree", "router agreement", "%.4f"},
    [QD_COL_TPS] = {"tokens_per_s", "tokens/s", "%.0f"},
};

static const char *const status_names[] = {"ok", "failed", "incomplete", "missing"};

const char *qd_report_col_key(int c) { return c >= 0 && c < QD_NCOLS ? cols[c].key : NULL; }

qd_seed_stat qd_seed_stat_of(const double *v, int count)
{
    qd_seed_stat s = {.mean = NAN, .std = NAN, .min = NAN, .max = NAN, .n = 0};
    double sum = 0;
    for (int i = 0; i < count; i++) {
        if (!isfinite(v[i]))
            continue;
        if (s.n == 0 || v[i] < s.min)
            s.min = v[i];
        if (s.n == 0 || v[i] > s.max)
            s.max = v[i];
        sum += v[i], s.n++;
    }
    if (s.n == 0)
        return s;
    s.mean = sum / s.n;
    double ss = 0;
    for (int i = 0; i < count; i++)
        if (isfinite(v[i]))
            ss += (v[i] - s.mean) * (v[i] - s.mean);
    s.std = s.n > 1 ? sqrt(ss / (s.n - 1)) : 0;
    return s;
}

void qd_group_aggregate(const qd_run_summary *runs, int n, qd_group_stats *g)
{
    double *v = malloc(sizeof(double) * (n > 0 ? (size_t)n : 1));
    g->runs = n, g->complete = 0;
    for (int i = 0; i < n; i++)
        g->complete += runs[i].status == QD_RUN_OK;
    for (int c = 0; c < QD_NCOLS; c++) {
        int k = 0;
        for (int i = 0; v && i < n; i++)
            if (runs[i].status == QD_RUN_OK)
                v[k++] = runs[i].v[c];
        g->col[c] = qd_seed_stat_of(v, k);
    }
    free(v);
}

/* ---- one run */

/* Mean and max over the points past step 0 (step 0 holds only the first
 * eval), and the first and last point with their steps; NaN when absent. */
typedef struct {
    double mean, max, first, last, first_x, last_x;
} series_sum;

static qd_status series_of(const char *path, const char *key, series_sum *r)
{
    double *x, *y;
    int64_t n, used = 0;
    qd_status st = qd_metrics_read_series(path, key, &x, &y, &n);
    if (st)
        return st;
    double s = 0, mx = -INFINITY;
    *r = (series_sum){.mean = NAN, .max = NAN, .first = NAN, .last = NAN, .first_x = NAN, .last_x = NAN};
    if (n > 0)
        r->first = y[0], r->first_x = x[0], r->last = y[n - 1], r->last_x = x[n - 1];
    for (int64_t i = 0; i < n; i++) {
        if (x[i] == 0)
            continue;
        s += y[i], used++;
        mx = y[i] > mx ? y[i] : mx;
    }
    r->mean = used ? s / (double)used : NAN;
    r->max = used ? mx : NAN;
    free(x), free(y);
    return QD_OK;
}

static int64_t int_at(json_t *cfg, const char *sec, const char *key)
{
    json_t *v = json_object_get(json_object_get(cfg, sec), key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
}

/* recipe, seed and steps of RUN/config.json. */
static qd_status read_config(const char *path, qd_run_summary *s)
{
    json_t *cfg;
    QD_TRY(qd_json_load_regular(path, JSON_REJECT_DUPLICATES, &cfg));
    const char *rec = json_string_value(json_object_get(json_object_get(cfg, "rollout"), "recipe"));
    s->seed = int_at(cfg, "run", "seed");
    s->steps_planned = int_at(cfg, "run", "steps");
    snprintf(s->recipe, sizeof s->recipe, "%s", rec ? rec : "?");
    json_decref(cfg);
    const char *bad = !rec ? "rollout.recipe" : s->seed < 0 ? "run.seed" : s->steps_planned < 1 ? "run.steps" : NULL;
    if (bad)
        return qd_error(QD_ERR_FORMAT, "%s: %s: missing or not valid", path, bad);
    return QD_OK;
}

/* The columns of metrics file m. */
static qd_status read_columns(const char *m, qd_run_summary *s)
{
    static const struct {
        const char *key;
        int col;
    } means[] = {{"gap.mean_abs", QD_COL_GAP_MEAN}, {"gap.k3_kl", QD_COL_KL},
                 {"router.agree_mean", QD_COL_AGREE}, {"time.tokens_per_s", QD_COL_TPS}};
    series_sum r;
    QD_TRY(series_of(m, "step", &r));
    s->steps = isfinite(r.last_x) ? (int64_t)r.last_x : 0;
    QD_TRY(series_of(m, "eval.pass1", &r));
    s->v[QD_COL_PASS_FIRST] = r.first, s->v[QD_COL_PASS_FINAL] = r.last;
    QD_TRY(series_of(m, "eval.bf16.pass1", &r));
    s->v[QD_COL_BF16_FIRST] = r.first_x == 0 ? r.first : NAN;
    s->v[QD_COL_BF16_FINAL] = r.last_x == (double)s->steps_planned ? r.last : NAN;
    QD_TRY(series_of(m, "gap.max_abs", &r));
    s->v[QD_COL_GAP_MAX] = r.max;
    for (size_t i = 0; i < sizeof means / sizeof *means; i++) {
        QD_TRY(series_of(m, means[i].key, &r));
        s->v[means[i].col] = r.mean;
    }
    return QD_OK;
}

qd_status qd_run_summarize(const char *dir, const char *failure, qd_run_summary *s)
{
    char c[PATH_N], m[PATH_N];
    *s = (qd_run_summary){.status = QD_RUN_OK, .seed = -1, .recipe = "?"};
    for (int i = 0; i < QD_NCOLS; i++)
        s->v[i] = NAN;
    snprintf(c, sizeof c, "%s/config.json", dir);
    snprintf(m, sizeof m, "%s/metrics.jsonl", dir);
    const char *absent = access(c, R_OK) != 0 ? "no config.json" : access(m, R_OK) != 0 ? "no metrics.jsonl" : NULL;
    qd_status st = absent ? QD_OK : read_config(c, s);
    if (!st && !absent)
        st = read_columns(m, s);
    if (failure) /* whatever its files hold, the run did not finish */
        s->status = QD_RUN_FAILED, snprintf(s->reason, sizeof s->reason, "%s", failure);
    else if (absent)
        s->status = QD_RUN_MISSING, snprintf(s->reason, sizeof s->reason, "%s", absent);
    else if (!st && s->steps < s->steps_planned)
        s->status = QD_RUN_INCOMPLETE, snprintf(s->reason, sizeof s->reason, "stopped at step %lld of %lld",
                                                (long long)s->steps, (long long)s->steps_planned);
    return failure ? QD_OK : st; /* a failed run's files may be torn: its reason says enough */
}

/* ---- rows: one config but the seed */

/* config.json of dir without the keys that may differ between the seeds of a row. */
static json_t *row_config(const char *dir)
{
    char c[PATH_N];
    snprintf(c, sizeof c, "%s/config.json", dir);
    json_t *cfg;
    (void)qd_json_load_regular(c, JSON_REJECT_DUPLICATES, &cfg); /* NULL: no config to compare */
    json_t *run = json_object_get(cfg, "run");
    static const char *const free_keys[] = {"seed", "dir", "name", "threads"};
    for (size_t i = 0; i < sizeof free_keys / sizeof *free_keys; i++)
        json_object_del(run, free_keys[i]);
    return cfg;
}

/* The first "section.key" where a and b differ into key. */
static void first_difference(json_t *a, json_t *b, char *key, size_t n)
{
    const char *sec, *k;
    json_t *sa, *v;
    snprintf(key, n, "?");
    json_object_foreach(a, sec, sa) {
        json_t *sb = json_object_get(b, sec);
        json_object_foreach(sa, k, v) {
            if (!json_equal(v, json_object_get(sb, k))) {
                snprintf(key, n, "%s.%s", sec, k);
                return;
            }
        }
        if (json_object_size(sa) != json_object_size(sb)) {
            snprintf(key, n, "%s (a key only one has)", sec);
            return;
        }
    }
}

static qd_status check_row(const qd_report_group *g, const qd_run_summary *s)
{
    int first = -1;
    json_t *ref = NULL;
    qd_status st = QD_OK;
    for (int i = 0; i < g->n && !st; i++) {
        if (s[i].status != QD_RUN_OK)
            continue;
        for (int j = first < 0 ? i : first; j < i && !st; j++)
            if (s[j].status == QD_RUN_OK && s[j].seed == s[i].seed)
                st = qd_error(QD_ERR_ARG, "report: row %s: runs %s and %s have the same run.seed %lld (a seed "
                              "counts once)", g->name, g->runs[j].dir, g->runs[i].dir, (long long)s[i].seed);
        json_t *cfg = st ? NULL : row_config(g->runs[i].dir);
        if (!st && first < 0)
            first = i, ref = cfg, cfg = NULL;
        else if (!st && !json_equal(ref, cfg)) {
            char key[256];
            first_difference(ref, cfg, key, sizeof key);
            st = qd_error(QD_ERR_ARG, "report: row %s: runs %s and %s differ in %s (only run.seed, run.dir, "
                          "run.name and run.threads may differ within a row)", g->name, g->runs[first].dir,
                          g->runs[i].dir, key);
        }
        json_decref(cfg);
    }
    json_decref(ref);
    return st;
}

/* ---- report.md */

enum { PAIR_PASS, PAIR_BF16, PAIR_GAP, NPAIR };

/* A row seed by seed against the bf16 row (PAIR_PASS, PAIR_BF16) and the
 * nvfp4 row (PAIR_GAP): per column its values (one a paired seed, NaN where
 * one side has none) and their spread. */
typedef struct {
    double *v[NPAIR];
    int k[NPAIR];
    qd_seed_stat st[NPAIR];
} pair_row;

typedef struct {
    const qd_report_group *g;
    const qd_run_summary *const *s; /* (n_groups) each group's runs */
    const qd_group_stats *stats;
    int ng;
    const char *command;
    int base[NPAIR];       /* the row each column is against, -1: none */
    const pair_row *pairs; /* (n_groups) */
} report_ctx;

static void put_num(FILE *f, const char *fmt, double v)
{
    if (isfinite(v))
        fprintf(f, fmt, v);
    else
        fputs("—", f);
}

/* A row's cell: the mean, and (min, to, max) over more than one run. */
static void stat_cell(FILE *f, const char *fmt, const qd_seed_stat *s, const char *to)
{
    fputc(' ', f);
    put_num(f, fmt, s->mean);
    if (s->n > 1) {
        fputs(" (", f);
        put_num(f, fmt, s->min);
        fputs(to, f);
        put_num(f, fmt, s->max);
        fputc(')', f);
    }
    fputs(" |", f);
}

/* A run's seed as text: "?" when its config is missing. */
static const char *seed_text(int64_t seed, char *buf, size_t n)
{
    if (seed < 0)
        return "?";
    snprintf(buf, n, "%lld", (long long)seed);
    return buf;
}

static void header(FILE *f, const char *first)
{
    fprintf(f, "| %s |", first);
    for (int c = 0; c < QD_NCOLS; c++)
        fprintf(f, " %s |", cols[c].title);
    fputs("\n|---|---|", f);
    for (int c = 0; c < QD_NCOLS; c++)
        fputs("---:|", f);
    fputc('\n', f);
}

static void rows_md(FILE *f, const report_ctx *t)
{
    header(f, "row | recipe / complete runs");
    for (int i = 0; i < t->ng; i++) {
        const qd_group_stats *g = &t->stats[i];
        fprintf(f, "| %s | %s / %d of %d |", t->g[i].name, t->g[i].n ? t->s[i][0].recipe : "?", g->complete,
                g->runs);
        for (int c = 0; c < QD_NCOLS; c++)
            stat_cell(f, cols[c].fmt, &g->col[c], "–");
        fputc('\n', f);
    }
}

static void runs_md(FILE *f, const report_ctx *t)
{
    header(f, "row | run (seed, steps, status)");
    for (int i = 0; i < t->ng; i++)
        for (int j = 0; j < t->g[i].n; j++) {
            const qd_run_summary *s = &t->s[i][j];
            char sd[24];
            fprintf(f, "| %s | %s (seed %s, %lld of %lld, %s) |", t->g[i].name, t->g[i].runs[j].dir,
                    seed_text(s->seed, sd, sizeof sd), (long long)s->steps, (long long)s->steps_planned,
                    status_names[s->status]);
            for (int c = 0; c < QD_NCOLS; c++) {
                fputc(' ', f);
                put_num(f, cols[c].fmt, s->v[c]);
                fputs(" |", f);
            }
            fputc('\n', f);
        }
}

/* ---- seed by seed: each row against the bf16 row (pass@1) and the nvfp4 row (gap) */

static const col_def pair_cols[NPAIR] = {
    [PAIR_PASS] = {"d_pass1_final", "Δ pass@1 final", "%+.4f"},
    [PAIR_BF16] = {"d_pass1_bf16_final", "Δ bf16 pass@1 final", "%+.4f"},
    [PAIR_GAP] = {"gap_ratio", "mean \\|Δlogp\\| / nvfp4's", "%.3f"},
};

/* The first row whose runs are of recipe rec, -1 when none. */
static int row_of_recipe(const report_ctx *t, const char *rec)
{
    for (int i = 0; i < t->ng; i++)
        for (int j = 0; j < t->g[i].n; j++)
            if (strcmp(t->s[i][j].recipe, "?")) {
                if (!strcmp(t->s[i][j].recipe, rec))
                    return i;
                break;
            }
    return -1;
}

/* The config of row i's first complete run without what may differ between
 * rows of one study (the seed's keys, the recipe); NULL when it has none. */
static json_t *study_config(const report_ctx *t, int i)
{
    for (int j = 0; j < t->g[i].n; j++)
        if (t->s[i][j].status == QD_RUN_OK) {
            json_t *cfg = row_config(t->g[i].runs[j].dir);
            json_object_del(json_object_get(cfg, "rollout"), "recipe");
            return cfg;
        }
    return NULL;
}

/* Row i's column c against row base, seed by seed over the seeds where both
 * finished, when both are runs of one study (cfg: each row's study_config;
 * the same but the recipe): v gets the values (one a seed, at most row i's
 * run count). */
static int pair_values(const report_ctx *t, json_t *const *cfg, int i, int base, int c, double *v)
{
    int k = 0;
    if (base < 0 || !cfg[i] || !cfg[base] || !json_equal(cfg[i], cfg[base]))
        return 0;
    for (int j = 0; j < t->g[i].n; j++) {
        const qd_run_summary *a = &t->s[i][j], *b = NULL;
        for (int m = 0; a->status == QD_RUN_OK && m < t->g[base].n && !b; m++)
            if (t->s[base][m].status == QD_RUN_OK && t->s[base][m].seed == a->seed)
                b = &t->s[base][m];
        if (!b)
            continue;
        v[k++] = c == PAIR_PASS   ? a->v[QD_COL_PASS_FINAL] - b->v[QD_COL_PASS_FINAL]
                 : c == PAIR_BF16 ? a->v[QD_COL_BF16_FINAL] - b->v[QD_COL_BF16_FINAL]
                 : b->v[QD_COL_GAP_MEAN] > 0 ? a->v[QD_COL_GAP_MEAN] / b->v[QD_COL_GAP_MEAN]
                                             : NAN;
    }
    return k;
}

/* Every row seed by seed (t->base, t->pairs; pairs: ng rows, freed by
 * pairs_free), each row's config read once. */
static qd_status pairs_make(report_ctx *t, pair_row *pairs)
{
    qd_status st = QD_OK;
    json_t **cfg = calloc((size_t)t->ng + 1, sizeof *cfg);
    if (!cfg)
        return qd_error(QD_ERR_NOMEM, "report");
    for (int i = 0; i < t->ng; i++)
        cfg[i] = study_config(t, i);
    for (int c = 0; c < NPAIR; c++)
        t->base[c] = row_of_recipe(t, c == PAIR_GAP ? "nvfp4" : "bf16");
    for (int i = 0; !st && i < t->ng; i++)
        for (int c = 0; !st && c < NPAIR; c++) {
            pair_row *p = &pairs[i];
            if (!(p->v[c] = malloc(sizeof(double) * ((size_t)t->g[i].n + 1)))) {
                st = qd_error(QD_ERR_NOMEM, "report");
                break;
            }
            p->k[c] = pair_values(t, cfg, i, t->base[c], c, p->v[c]);
            p->st[c] = qd_seed_stat_of(p->v[c], p->k[c]);
        }
    for (int i = 0; i < t->ng; i++)
        json_decref(cfg[i]);
    free(cfg);
    if (!st)
        t->pairs = pairs;
    return st;
}

static void pairs_free(pair_row *pairs, int ng)
{
    for (int i = 0; pairs && i < ng; i++)
        for (int c = 0; c < NPAIR; c++)
            free(pairs[i].v[c]);
    free(pairs);
}

static void paired_md(FILE *f, const report_ctx *t)
{
    if (t->ng < 2 || (t->base[PAIR_PASS] < 0 && t->base[PAIR_GAP] < 0))
        return;
    fputs("## Seed by seed\n\nEach row against the bf16 row (its final pass@1 minus bf16's on the same seed, at the\n"
          "rollout's precision and in bf16) and against the nvfp4 row (its mean |Δlogp| over naive NVFP4's\n"
          "on the same seed): the mean over the seeds both rows finished, with (min to max) over several;\n"
          "seeds: the most pairs of any column. Only rows of one config but the recipe are compared.\n\n"
          "| row | seeds |",
          f);
    for (int c = 0; c < NPAIR; c++)
        fprintf(f, " %s |", pair_cols[c].title);
    fputs("\n|---|---:|---:|---:|---:|\n", f);
    for (int i = 0; i < t->ng; i++) {
        const qd_seed_stat *st = t->pairs[i].st;
        int n = 0;
        for (int c = 0; c < NPAIR; c++)
            n = st[c].n > n ? st[c].n : n;
        fprintf(f, "| %s | %d |", t->g[i].name, n);
        for (int c = 0; c < NPAIR; c++)
            stat_cell(f, pair_cols[c].fmt, &st[c], " to "); /* signed values */
        fputc('\n', f);
    }
    fputc('\n', f);
}

static qd_status write_md(FILE *f, const char *path, void *vctx)
{
    const report_ctx *t = vctx;
    fputs("# RL runs\n\n", f);
    if (t->command)
        fprintf(f, "Command: `%s`\n\n", t->command);
    rows_md(f, t);
    fputs("\nA row: the mean over its complete runs (the seeds of a recipe), with (min–max) when there are\n"
          "several; runs that failed, stopped early or are missing are listed below and not averaged.\n"
          "pass@1: held-out, first and last eval, with the rollout's precision; bf16 pass@1: the same\n"
          "weights evaluated with the bf16 recipe's rollout (eval.bf16). Gap: trainer vs rollout log-probs\n"
          "of the sampled tokens, mean over steps (max: the largest of any token). Router agreement: top-k\n"
          "experts the rollout and the trainer share on the same tokens. tokens/s: generated tokens / step\n"
          "time. report.json has the same numbers with the standard deviation (n - 1) and every value.\n\n",
          f);
    paired_md(f, t);
    int bad = 0;
    for (int i = 0; i < t->ng; i++)
        for (int j = 0; j < t->g[i].n; j++)
            if (t->s[i][j].status != QD_RUN_OK) {
                char sd[24];
                if (!bad++)
                    fputs("Not averaged:\n\n", f);
                fprintf(f, "- %s, seed %s (%s): %s: %s\n", t->g[i].name, seed_text(t->s[i][j].seed, sd, sizeof sd),
                        t->g[i].runs[j].dir, status_names[t->s[i][j].status], t->s[i][j].reason);
            }
    fputs(bad ? "\n## Every run\n\n" : "## Every run\n\n", f);
    runs_md(f, t);
    fputs("\n![reward](reward.svg)\n\n![held-out pass@1](pass1.svg)\n\n![log-prob gap](gap.svg)\n", f);
    return QD_OK;
}

/* ---- report.json */

static json_t *num_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *seed_json(int64_t seed) { return seed < 0 ? json_null() : json_integer(seed); }

/* A spread as JSON with its values (vals: taken). */
static json_t *spread_json(const qd_seed_stat *st, json_t *vals)
{
    return json_pack("{s:o,s:o,s:o,s:o,s:i,s:o}", "mean", num_or_null(st->mean), "std", num_or_null(st->std), "min",
                     num_or_null(st->min), "max", num_or_null(st->max), "n", st->n, "values", vals);
}

static json_t *stat_json(const qd_seed_stat *st, const qd_run_summary *s, int n, int c)
{
    json_t *vals = json_array();
    for (int i = 0; i < n; i++)
        if (s[i].status == QD_RUN_OK)
            json_array_append_new(vals, num_or_null(s[i].v[c]));
    return spread_json(st, vals);
}

static json_t *run_json(const char *row, const char *dir, const qd_run_summary *s)
{
    json_t *o = json_pack("{s:s,s:s,s:s,s:o,s:s,s:I,s:I}", "row", row, "dir", dir, "recipe", s->recipe, "seed",
                          seed_json(s->seed), "status", status_names[s->status], "steps", (json_int_t)s->steps,
                          "steps_planned", (json_int_t)s->steps_planned);
    json_object_set_new(o, "reason", s->status == QD_RUN_OK ? json_null() : json_string(s->reason));
    for (int c = 0; c < QD_NCOLS; c++)
        json_object_set_new(o, cols[c].key, num_or_null(s->v[c]));
    return o;
}

/* The seed-by-seed comparisons: the rows they are against and each row's values. */
static json_t *paired_json(const report_ctx *t)
{
    json_t *rows = json_array();
    for (int i = 0; i < t->ng; i++) {
        json_t *row = json_pack("{s:s}", "name", t->g[i].name);
        for (int c = 0; c < NPAIR; c++) {
            const pair_row *p = &t->pairs[i];
            json_t *vals = json_array();
            for (int j = 0; j < p->k[c]; j++)
                json_array_append_new(vals, num_or_null(p->v[c][j]));
            json_object_set_new(row, pair_cols[c].key, spread_json(&p->st[c], vals));
        }
        json_array_append_new(rows, row);
    }
    int acc = t->base[PAIR_PASS], gap = t->base[PAIR_GAP];
    return json_pack("{s:o,s:o,s:s,s:o}", "pass1_against", acc >= 0 ? json_string(t->g[acc].name) : json_null(),
                     "gap_against", gap >= 0 ? json_string(t->g[gap].name) : json_null(), "how",
                     "seed by seed over the seeds both rows finished: differences of final pass@1, ratio of mean "
                     "|dlogp|",
                     "rows", rows);
}

static json_t *report_json(const report_ctx *t)
{
    json_t *rows = json_array(), *runs = json_array();
    for (int i = 0; i < t->ng; i++) {
        const qd_report_group *g = &t->g[i];
        json_t *row = json_pack("{s:s,s:s,s:i,s:i}", "name", g->name, "recipe", g->n ? t->s[i][0].recipe : "?",
                                "runs", g->n, "complete", t->stats[i].complete);
        json_t *seeds = json_array(), *excluded = json_array();
        for (int j = 0; j < g->n; j++) {
            const qd_run_summary *s = &t->s[i][j];
            if (s->status == QD_RUN_OK)
                json_array_append_new(seeds, json_integer(s->seed));
            else
                json_array_append_new(excluded, json_pack("{s:s,s:o,s:s,s:s}", "dir", g->runs[j].dir, "seed",
                                                          seed_json(s->seed), "status", status_names[s->status],
                                                          "reason", s->reason));
            json_array_append_new(runs, run_json(g->name, g->runs[j].dir, s));
        }
        json_object_set_new(row, "seeds", seeds);
        json_object_set_new(row, "excluded", excluded);
        for (int c = 0; c < QD_NCOLS; c++)
            json_object_set_new(row, cols[c].key, stat_json(&t->stats[i].col[c], t->s[i], g->n, c));
        json_array_append_new(rows, row);
    }
    return json_pack("{s:o,s:s,s:o,s:o,s:o}", "command", t->command ? json_string(t->command) : json_null(),
                     "spread", "over the complete runs of a row: min, max, and std the sample standard deviation (n - 1)",
                     "rows", rows, "runs", runs, "paired", paired_json(t));
}

static qd_status write_json(FILE *f, const char *path, void *vctx)
{
    json_t *j = report_json(vctx);
    int rc = j ? json_dumpf(j, f, JSON_INDENT(1) | JSON_REAL_PRECISION(10)) : -1;
    json_decref(j);
    if (rc)
        return qd_error(QD_ERR_NOMEM, "%s", path);
    fputc('\n', f);
    return QD_OK;
}

/* ---- plots: a row's mean with a band from min to max at each step */

typedef struct {
    double *x, *y;
    int64_t n;
} series;

/* The value of s at step x (s is in step order), NaN when it has none. */
static double at_step(const series *s, double x)
{
    int64_t lo = 0, hi = s->n;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (s->x[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < s->n && s->x[lo] == x ? s->y[lo] : NAN;
}

/* Row i's line of key into out (x, y and, over several runs, lo and hi;
 * malloc'd): the complete runs, or every run that has metrics when none is
 * complete. At a step some run lacks, the line breaks. */
static qd_status row_series(const report_ctx *t, int i, const char *key, qd_svg_series *out, char *label, size_t ln)
{
    const qd_report_group *g = &t->g[i];
    int use_all = t->stats[i].complete == 0, k = 0;
    series *s = calloc((size_t)g->n + 1, sizeof *s);
    qd_status st = s ? QD_OK : qd_error(QD_ERR_NOMEM, "report plots");
    for (int j = 0; j < g->n && !st; j++) {
        qd_run_status rs = t->s[i][j].status;
        if (rs == QD_RUN_MISSING || (rs != QD_RUN_OK && !use_all))
            continue;
        char m[PATH_N];
        snprintf(m, sizeof m, "%s/metrics.jsonl", g->runs[j].dir);
        st = qd_metrics_read_series(m, key, &s[k].x, &s[k].y, &s[k].n);
        k += !st;
    }
    int64_t n = k ? s[0].n : 0;
    double *x = malloc(sizeof(double) * (size_t)(n + 1)), *y = malloc(sizeof(double) * (size_t)(n + 1));
    double *lo = k > 1 ? malloc(sizeof(double) * (size_t)(n + 1)) : NULL, *hi = k > 1 ? malloc(sizeof(double) * (size_t)(n + 1)) : NULL;
    if (!st && (!x || !y || (k > 1 && (!lo || !hi))))
        st = qd_error(QD_ERR_NOMEM, "report plots");
    for (int64_t p = 0; !st && p < n; p++) {
        double v[k], sum = 0;
        for (int r = 0; r < k; r++)
            v[r] = at_step(&s[r], s[0].x[p]), sum += v[r];
        qd_seed_stat ss = qd_seed_stat_of(v, k);
        x[p] = s[0].x[p], y[p] = ss.n == k ? sum / k : NAN;
        if (lo)
            lo[p] = ss.n == k ? ss.min : NAN, hi[p] = ss.n == k ? ss.max : NAN;
    }
    for (int r = 0; s && r < k; r++)
        free(s[r].x), free(s[r].y);
    free(s);
    if (k > 1 && !use_all)
        snprintf(label, ln, "%s (%d seeds)", g->name, k);
    else
        snprintf(label, ln, "%s%s", g->name, use_all && k ? " (incomplete)" : k ? "" : " (no run)");
    *out = (qd_svg_series){.name = label, .x = x, .y = y, .n = st ? 0 : n, .lo = lo, .hi = hi};
    return st;
}

static qd_status plot(const report_ctx *t, const char *out_dir, const char *file, const char *key, const char *title,
                      const char *ylabel)
{
    qd_svg_series *s = calloc((size_t)t->ng + 1, sizeof *s);
    char(*labels)[160] = calloc((size_t)t->ng + 1, sizeof *labels), p[PATH_N];
    qd_status st = s && labels ? QD_OK : qd_error(QD_ERR_NOMEM, "report plots");
    int bands = 0;
    for (int i = 0; i < t->ng && !st; i++) {
        st = row_series(t, i, key, &s[i], labels[i], sizeof labels[i]);
        bands |= s[i].lo != NULL;
    }
    char full[256];
    snprintf(full, sizeof full, "%s%s", title, bands ? " (mean over seeds; band: min to max)" : "");
    qd_svg_plot pl = {.title = full, .xlabel = "step", .ylabel = ylabel};
    snprintf(p, sizeof p, "%s/%s", out_dir, file);
    if (!st && (st = qd_svg_write(p, &pl, s, t->ng)) == QD_ERR_ARG)
        st = QD_OK; /* no finite point (e.g. evals off): an empty plot is no error */
    for (int i = 0; s && i < t->ng; i++)
        free((double *)s[i].x), free((double *)s[i].y), free((double *)s[i].lo), free((double *)s[i].hi);
    free(s), free(labels);
    return st;
}

/* ---- the report */

qd_status qd_report_write(const qd_report_group *groups, int ng, const char *out_dir, const char *command)
{
    qd_run_summary **s = calloc((size_t)ng + 1, sizeof *s);
    qd_group_stats *stats = calloc((size_t)ng + 1, sizeof *stats);
    qd_status st = s && stats ? qd_mkdirs(out_dir) : qd_error(QD_ERR_NOMEM, "report");
    for (int i = 0; i < ng && !st; i++) {
        s[i] = calloc((size_t)groups[i].n + 1, sizeof **s);
        st = s[i] ? QD_OK : qd_error(QD_ERR_NOMEM, "report");
        for (int j = 0; j < groups[i].n && !st; j++)
            st = qd_run_summarize(groups[i].runs[j].dir, groups[i].runs[j].failure, &s[i][j]);
        if (!st)
            st = check_row(&groups[i], s[i]);
        if (!st)
            qd_group_aggregate(s[i], groups[i].n, &stats[i]);
    }
    report_ctx t = {.g = groups, .s = (const qd_run_summary *const *)s, .stats = stats, .ng = ng, .command = command};
    pair_row *pairs = calloc((size_t)ng + 1, sizeof *pairs);
    if (!st)
        st = pairs ? pairs_make(&t, pairs) : qd_error(QD_ERR_NOMEM, "report");
    static const char *const plots[3][4] = {
        {"reward.svg", "reward_mean", "reward (train)", "mean reward"},
        {"pass1.svg", "eval.pass1", "held-out pass@1", "pass@1"},
        {"gap.svg", "gap.mean_abs", "rollout-trainer log-prob gap", "mean |logp_trainer - logp_rollout|"}};
    for (int k = 0; k < 3 && !st; k++)
        st = plot(&t, out_dir, plots[k][0], plots[k][1], plots[k][2], plots[k][3]);
    char p[PATH_N];
    snprintf(p, sizeof p, "%s/report.json", out_dir);
    if (!st)
        st = qd_atomic_write_with(p, write_json, &t);
    snprintf(p, sizeof p, "%s/report.md", out_dir);
    if (!st)
        st = qd_atomic_write_with(p, write_md, &t);
    for (int i = 0; s && i < ng; i++)
        free(s[i]);
    free(s), free(stats);
    pairs_free(pairs, ng);
    return st;
}

qd_status qd_rl_report(const char *const *runs, const char *const *names, int n, const char *out_dir)
{
    qd_report_run *r = calloc((size_t)n + 1, sizeof *r);
    qd_report_group *g = calloc((size_t)n + 1, sizeof *g);
    qd_status st = r && g ? QD_OK : qd_error(QD_ERR_NOMEM, "report");
    for (int i = 0; i < n && !st; i++) {
        r[i] = (qd_report_run){.dir = runs[i]};
        g[i] = (qd_report_group){.name = names && names[i] ? names[i] : qd_path_base(runs[i]), .runs = &r[i], .n = 1};
    }
    if (!st)
        st = qd_report_write(g, n, out_dir, NULL);
    free(r), free(g);
    return st;
}
