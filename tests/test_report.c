/* Suite "report": the seed aggregation of quads compare / quads report on
 * known inputs. Mean, standard deviation (n - 1), min and max of a column;
 * rows average only their complete runs, and runs that failed, stopped
 * early or are missing are listed with their reason in report.md and
 * report.json, never averaged; the bf16 eval columns come from eval.bf16;
 * the plots draw a band over the seeds; a row whose runs differ in more
 * than the seed is refused. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "tests/suites.h"
#include "orchestrator/report.h"
#include "orchestrator/rl_config.h"
#include <sys/stat.h>
#include <unistd.h>
#include "quant/fileio.h"

static void close_to(double got, double want)
{
    ck_assert_msg(fabs(got - want) <= 1e-12 * fmax(1, fabs(want)), "got %.17g, want %.17g", got, want);
}

START_TEST(test_seed_stat)
{
    const double v[] = {0.5, 0.6, 0.7};
    qd_seed_stat s = qd_seed_stat_of(v, 3);
    ck_assert_int_eq(s.n, 3);
    close_to(s.mean, 0.6);
    close_to(s.std, 0.1); /* sample std: sqrt((0.01 + 0 + 0.01) / 2) */
    ck_assert(s.min == 0.5 && s.max == 0.7);
    const double w[] = {1, NAN, 3, INFINITY}; /* not measured: left out and counted out */
    s = qd_seed_stat_of(w, 4);
    ck_assert_int_eq(s.n, 2);
    close_to(s.mean, 2);
    close_to(s.std, sqrt(2));
    ck_assert(s.min == 1 && s.max == 3);
    s = qd_seed_stat_of(v + 1, 1);
    ck_assert(s.n == 1 && s.mean == 0.6 && s.std == 0 && s.min == 0.6 && s.max == 0.6);
    s = qd_seed_stat_of(w + 1, 1);
    ck_assert(s.n == 0 && isnan(s.mean) && isnan(s.std) && isnan(s.min) && isnan(s.max));
}
END_TEST

/* Only the OK runs count: a failed or incomplete run's numbers would move the mean. */
START_TEST(test_group_aggregate)
{
    qd_run_summary r[4];
    const qd_run_status st[4] = {QD_RUN_OK, QD_RUN_FAILED, QD_RUN_OK, QD_RUN_INCOMPLETE};
    const double final[4] = {0.25, 0.0, 0.75, 0.1};
    for (int i = 0; i < 4; i++) {
        r[i] = (qd_run_summary){.status = st[i], .seed = i + 1};
        for (int c = 0; c < QD_NCOLS; c++)
            r[i].v[c] = NAN;
        r[i].v[QD_COL_PASS_FINAL] = final[i];
        r[i].v[QD_COL_GAP_MEAN] = 0.1 * (i + 1);
    }
    r[2].v[QD_COL_BF16_FINAL] = 0.5; /* one of the two complete runs has the bf16 column */
    qd_group_stats g;
    qd_group_aggregate(r, 4, &g);
    ck_assert_int_eq(g.runs, 4);
    ck_assert_int_eq(g.complete, 2);
    close_to(g.col[QD_COL_PASS_FINAL].mean, 0.5);
    close_to(g.col[QD_COL_PASS_FINAL].std, sqrt(0.125));
    ck_assert(g.col[QD_COL_PASS_FINAL].min == 0.25 && g.col[QD_COL_PASS_FINAL].max == 0.75);
    close_to(g.col[QD_COL_GAP_MEAN].mean, 0.2);
    ck_assert_int_eq(g.col[QD_COL_BF16_FINAL].n, 1); /* the count says it is one value, not two */
    ck_assert(g.col[QD_COL_BF16_FINAL].mean == 0.5);
    ck_assert_int_eq(g.col[QD_COL_KL].n, 0);
    ck_assert(isnan(g.col[QD_COL_KL].mean));
    ck_assert_str_eq(qd_report_col_key(QD_COL_BF16_FINAL), "pass1_bf16_final");
}
END_TEST

/* ---- run directories written by hand */

/* dir/config.json of recipe, seed and steps (the rest defaults), with one more
 * knob set when extra is not NULL. */
static void write_config(const char *dir, const char *recipe, int seed, int steps, const char *extra)
{
    qd_config *c = qd_config_new();
    char v[64];
    ck_assert_int_eq(qd_config_set_str(c, "rollout.recipe", recipe, "test"), QD_OK);
    snprintf(v, sizeof v, "%d", seed);
    ck_assert_int_eq(qd_config_set_str(c, "run.seed", v, "test"), QD_OK);
    snprintf(v, sizeof v, "%d", steps);
    ck_assert_int_eq(qd_config_set_str(c, "run.steps", v, "test"), QD_OK);
    ck_assert_int_eq(qd_config_set_str(c, "run.dir", dir, "test"), QD_OK);
    if (extra)
        ck_assert_int_eq(qd_config_set(c, extra), QD_OK);
    ck_assert_int_eq(qd_mkdirs(dir), QD_OK);
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", dir);
    ck_assert_int_eq(qd_config_save(c, p), QD_OK);
    qd_config_free(c);
}

/* dir/metrics.jsonl of steps 0..last: eval at 0 and at last (with its bf16
 * twin), a gap of gap * step and max gap 10 * gap at step s, pass@1 p0 then
 * p1, reward 0.1 * step + seed. */
static void write_metrics(const char *dir, int last, double p0, double p1, double b0, double b1, double gap, int seed)
{
    char p[512], line[1024];
    snprintf(p, sizeof p, "%s/metrics.jsonl", dir);
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "{\"step\":0,\"eval\":{\"pass1\":%.17g,\"bf16\":{\"pass1\":%.17g}},\"time\":{}}\n", p0, b0);
    for (int s = 1; s <= last; s++) {
        snprintf(line, sizeof line,
                 "{\"step\":%d,\"reward_mean\":%.17g,\"gap\":{\"mean_abs\":%.17g,\"max_abs\":%.17g,\"k3_kl\":0.5},"
                 "\"router\":{\"agree_mean\":1},\"time\":{\"tokens_per_s\":%d}", s, 0.1 * s + seed, gap * s,
                 10 * gap * s, 100 * seed);
        fputs(line, f);
        if (s == last)
            fprintf(f, ",\"eval\":{\"pass1\":%.17g,\"bf16\":{\"pass1\":%.17g}}", p1, b1);
        fputs("}\n", f);
    }
    fclose(f);
}

static const json_t *row_col(const json_t *row, const char *col, const char *what)
{
    const json_t *v = json_object_get(json_object_get(row, col), what);
    ck_assert_msg(v != NULL, "%s.%s missing", col, what);
    return v;
}

/* A number of report.json (written with 10 significant digits). */
static double row_num(const json_t *row, const char *col, const char *what)
{
    return json_number_value(row_col(row, col, what));
}

static void json_close_to(double got, double want)
{
    ck_assert_msg(fabs(got - want) <= 1e-9 * fmax(1, fabs(want)), "got %.17g, want %.17g", got, want);
}

/* Five seeds of one recipe: 1 and 2 complete, 3 stopped at step 2 of 4, 4
 * missing, 5 failed (its files complete: the caller's word counts). */
START_TEST(test_report_seeds)
{
    char dir[256], d[6][512], out[512];
    qd_test_mkdtemp(dir, sizeof dir, "report");
    for (int s = 1; s <= 5; s++)
        snprintf(d[s], sizeof d[s], "%s/quads/seed-%d", dir, s);
    write_config(d[1], "quads", 1, 4, NULL);
    write_metrics(d[1], 4, 0.4, 0.5, 0.6, 0.62, 0.1, 1);
    write_config(d[2], "quads", 2, 4, NULL);
    write_metrics(d[2], 4, 0.4, 0.7, 0.6, 0.66, 0.3, 2);
    write_config(d[3], "quads", 3, 4, NULL);
    write_metrics(d[3], 2, 0.4, 0.9, 0.6, 0.9, 0.2, 3);
    write_config(d[5], "quads", 5, 4, NULL);
    write_metrics(d[5], 4, 0.4, 0.0, 0.6, 0.0, 5.0, 5);
    /* a one-run row of another recipe */
    char b[512];
    snprintf(b, sizeof b, "%s/bf16/seed-1", dir);
    write_config(b, "bf16", 1, 4, NULL);
    write_metrics(b, 4, 0.6, 0.6, 0.6, 0.6, 0, 1);
    qd_report_run runs[5] = {{.dir = d[1]}, {.dir = d[2]}, {.dir = d[3]}, {.dir = d[4]},
                             {.dir = d[5], .failure = "step 3: NaN in the loss"}};
    qd_report_run brun = {.dir = b};
    qd_report_group g[2] = {{.name = "quads", .runs = runs, .n = 5}, {.name = "bf16", .runs = &brun, .n = 1}};
    snprintf(out, sizeof out, "%s/rep", dir);
    ck_assert_int_eq(qd_report_write(g, 2, out, "quads compare --seeds 1,2,3,4,5"), QD_OK);

    char p[600];
    snprintf(p, sizeof p, "%s/report.json", out);
    json_t *j = json_load_file(p, 0, NULL);
    ck_assert_ptr_nonnull(j);
    const json_t *row = json_array_get(json_object_get(j, "rows"), 0);
    ck_assert_str_eq(json_string_value(json_object_get(row, "name")), "quads");
    ck_assert_int_eq(json_integer_value(json_object_get(row, "runs")), 5);
    ck_assert_int_eq(json_integer_value(json_object_get(row, "complete")), 2);
    ck_assert_int_eq(json_array_size(json_object_get(row, "seeds")), 2);
    /* final pass@1 of seeds 1 and 2 only: 0.5 and 0.7 */
    json_close_to(row_num(row, "pass1_final", "mean"), 0.6);
    json_close_to(row_num(row, "pass1_final", "std"), sqrt(0.02));
    ck_assert(row_num(row, "pass1_final", "min") == 0.5 && row_num(row, "pass1_final", "max") == 0.7);
    ck_assert_int_eq(json_integer_value(row_col(row, "pass1_final", "n")), 2);
    ck_assert_int_eq(json_array_size(row_col(row, "pass1_final", "values")), 2);
    /* the bf16 twins: 0.62 and 0.66 at the last step, 0.6 at step 0 */
    json_close_to(row_num(row, "pass1_bf16_final", "mean"), 0.64);
    json_close_to(row_num(row, "pass1_bf16_first", "mean"), 0.6);
    /* gap: mean over steps 1..4 of g*s = 2.5 g -> 0.25 and 0.75; max 40 g -> 4 and 12 */
    json_close_to(row_num(row, "gap_mean", "mean"), 0.5);
    json_close_to(row_num(row, "gap_max", "mean"), 8);
    ck_assert(row_num(row, "gap_max", "max") == 12);
    json_close_to(row_num(row, "tokens_per_s", "mean"), 150);
    const json_t *ex = json_object_get(row, "excluded");
    ck_assert_int_eq(json_array_size(ex), 3);
    static const char *const want[3][3] = {{"3", "incomplete", "stopped at step 2 of 4"},
                                           {"?", "missing", "no config.json"},
                                           {"5", "failed", "step 3: NaN in the loss"}};
    for (int i = 0; i < 3; i++) {
        const json_t *e = json_array_get(ex, (size_t)i);
        const json_t *seed = json_object_get(e, "seed");
        ck_assert(i == 1 ? json_is_null(seed) : json_integer_value(seed) == atoi(want[i][0]));
        ck_assert_str_eq(json_string_value(json_object_get(e, "status")), want[i][1]);
        ck_assert_str_eq(json_string_value(json_object_get(e, "reason")), want[i][2]);
    }
    ck_assert_int_eq(json_array_size(json_object_get(j, "runs")), 6);
    const json_t *r3 = json_array_get(json_object_get(j, "runs"), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(r3, "steps")), 2); /* shown, not averaged */
    ck_assert(json_number_value(json_object_get(r3, "pass1_final")) == 0.9);
    ck_assert(json_is_null(json_object_get(r3, "pass1_bf16_final"))); /* not at run.steps: no final */
    const json_t *brow = json_array_get(json_object_get(j, "rows"), 1);
    ck_assert(row_num(brow, "pass1_final", "std") == 0 && row_num(brow, "pass1_final", "mean") == 0.6);
    json_decref(j);

    snprintf(p, sizeof p, "%s/report.md", out);
    const char *md = qd_test_read_file(p);
    ck_assert_msg(strstr(md, "Command: `quads compare --seeds 1,2,3,4,5`"), "%s", md);
    ck_assert_msg(strstr(md, "| quads | quads / 2 of 5 | 0.4000 (0.4000–0.4000) | 0.6000 (0.5000–0.7000) | "
                             "0.6000 (0.6000–0.6000) | 0.6400 (0.6200–0.6600) |"), "%s", md);
    ck_assert_msg(strstr(md, "| bf16 | bf16 / 1 of 1 | 0.6000 | 0.6000 |"), "%s", md);
    ck_assert_ptr_nonnull(strstr(md, "- quads, seed 3 ("));
    ck_assert_ptr_nonnull(strstr(md, "- quads, seed ? ("));
    ck_assert_ptr_nonnull(strstr(md, "): incomplete: stopped at step 2 of 4"));
    ck_assert_ptr_nonnull(strstr(md, "): missing: no config.json"));
    ck_assert_ptr_nonnull(strstr(md, "): failed: step 3: NaN in the loss"));
    /* the plots: a band for the row of two seeds (from seed 1's to seed 2's
     * reward), none for the one-run row; the legend says how many seeds */
    snprintf(p, sizeof p, "%s/reward.svg", out);
    const char *svg = qd_test_read_file(p);
    ck_assert_ptr_nonnull(strstr(svg, "quads (2 seeds)"));
    const char *band = strstr(svg, "<polygon class=\"band\"");
    ck_assert_ptr_nonnull(band);
    ck_assert_ptr_null(strstr(band + 1, "<polygon class=\"band\""));
    qd_test_rm_tree(dir);
}
END_TEST

/* Seed by seed: each row against the bf16 row's final pass@1 and the nvfp4
 * row's gap, found by recipe wherever they stand (the bf16 row's first run
 * missing), over the seeds both rows finished (an incomplete or missing run
 * pairs with nothing); a row of another config pairs with no row. */
START_TEST(test_report_paired)
{
    char dir[256], d[3][4][512], out[512];
    qd_test_mkdtemp(dir, sizeof dir, "report");
    static const char *const rec[3] = {"quads", "nvfp4", "bf16"}, *const name[3] = {"q", "naive", "base"};
    for (int r = 0; r < 3; r++)
        for (int s = 1; s <= 3; s++)
            snprintf(d[r][s], sizeof d[r][s], "%s/%s/seed-%d", dir, rec[r], s);
    /* quads: seed 1 missing; seeds 2 and 3 at 0.45 / 0.62 (bf16 0.48 / 0.69), gap 0.1 / 0.2 */
    write_config(d[0][2], "quads", 2, 4, NULL), write_metrics(d[0][2], 4, 0.4, 0.45, 0.6, 0.48, 0.1, 2);
    write_config(d[0][3], "quads", 3, 4, NULL), write_metrics(d[0][3], 4, 0.4, 0.62, 0.6, 0.69, 0.2, 3);
    /* nvfp4: 0.40 / 0.35 (bf16 0.55 / 0.45), gap 0.2 / 0.4; seed 3 stopped at step 2 */
    write_config(d[1][1], "nvfp4", 1, 4, NULL), write_metrics(d[1][1], 4, 0.4, 0.40, 0.6, 0.55, 0.2, 1);
    write_config(d[1][2], "nvfp4", 2, 4, NULL), write_metrics(d[1][2], 4, 0.4, 0.35, 0.6, 0.45, 0.4, 2);
    write_config(d[1][3], "nvfp4", 3, 4, NULL), write_metrics(d[1][3], 2, 0.4, 0.9, 0.6, 0.9, 0.3, 3);
    /* bf16: 0.60 / 0.50 / 0.70, the same in bf16, no gap */
    static const double bp[4] = {0, 0.6, 0.5, 0.7};
    for (int s = 1; s <= 3; s++)
        write_config(d[2][s], "bf16", s, 4, NULL), write_metrics(d[2][s], 4, 0.6, bp[s], 0.6, bp[s], 0, s);
    /* quads at another learning rate, seed 2 */
    char other[512], gone[512];
    snprintf(other, sizeof other, "%s/quads-lr/seed-2", dir);
    write_config(other, "quads", 2, 4, "trainer.lr=0.5"), write_metrics(other, 4, 0.4, 0.45, 0.6, 0.48, 0.1, 2);
    snprintf(gone, sizeof gone, "%s/bf16/seed-0", dir);
    qd_report_run runs[3][4], orun = {.dir = other};
    qd_report_group g[4];
    for (int r = 0; r < 3; r++) {
        int k = 0;
        if (r == 2)
            runs[r][k++] = (qd_report_run){.dir = gone};
        for (int s = 1; s <= 3; s++)
            runs[r][k++] = (qd_report_run){.dir = d[r][s]};
        g[r] = (qd_report_group){.name = name[r], .runs = runs[r], .n = k};
    }
    g[3] = (qd_report_group){.name = "q-lr", .runs = &orun, .n = 1};
    snprintf(out, sizeof out, "%s/rep", dir);
    ck_assert_int_eq(qd_report_write(g, 4, out, NULL), QD_OK);

    char p[600];
    snprintf(p, sizeof p, "%s/report.json", out);
    json_t *j = json_load_file(p, 0, NULL);
    ck_assert_ptr_nonnull(j);
    const json_t *pr = json_object_get(j, "paired");
    ck_assert_str_eq(json_string_value(json_object_get(pr, "pass1_against")), "base");
    ck_assert_str_eq(json_string_value(json_object_get(pr, "gap_against")), "naive");
    const json_t *q = json_array_get(json_object_get(pr, "rows"), 0), *nv = json_array_get(json_object_get(pr, "rows"), 1),
                 *bf = json_array_get(json_object_get(pr, "rows"), 2);
    /* quads - bf16 on seeds 2 and 3: -0.05 and -0.08; in bf16 -0.02 and -0.01 */
    ck_assert_int_eq(json_integer_value(row_col(q, "d_pass1_final", "n")), 2);
    json_close_to(row_num(q, "d_pass1_final", "mean"), -0.065);
    json_close_to(row_num(q, "d_pass1_final", "min"), -0.08);
    json_close_to(row_num(q, "d_pass1_final", "max"), -0.05);
    json_close_to(row_num(q, "d_pass1_bf16_final", "mean"), -0.015);
    /* its gap over nvfp4's: seed 2 only (nvfp4's seed 3 did not finish): 0.1 / 0.4 */
    ck_assert_int_eq(json_integer_value(row_col(q, "gap_ratio", "n")), 1);
    json_close_to(row_num(q, "gap_ratio", "mean"), 0.25);
    /* nvfp4 - bf16 on seeds 1 and 2: -0.20, -0.15; its own gap ratio 1; bf16's 0 */
    json_close_to(row_num(nv, "d_pass1_final", "mean"), -0.175);
    json_close_to(row_num(nv, "d_pass1_bf16_final", "mean"), -0.05);
    ck_assert(row_num(nv, "gap_ratio", "min") == 1 && row_num(nv, "gap_ratio", "max") == 1);
    ck_assert_int_eq(json_integer_value(row_col(bf, "d_pass1_final", "n")), 3);
    ck_assert(row_num(bf, "d_pass1_final", "max") == 0 && row_num(bf, "gap_ratio", "max") == 0);
    const json_t *ql = json_array_get(json_object_get(pr, "rows"), 3);
    for (int c = 0; c < 3; c++)
        ck_assert_int_eq(json_integer_value(row_col(ql, (const char *[]){"d_pass1_final", "d_pass1_bf16_final",
                                                                           "gap_ratio"}[c], "n")), 0);
    json_decref(j);
    snprintf(p, sizeof p, "%s/report.md", out);
    const char *md = qd_test_read_file(p);
    ck_assert_msg(strstr(md, "## Seed by seed") &&
                      strstr(md, "| q | 2 | -0.0650 (-0.0800 to -0.0500) | -0.0150 (-0.0200 to -0.0100) | 0.250 |") &&
                      strstr(md, "| q-lr | 0 | — | — | — |"),
                  "%s", md);
    qd_test_rm_tree(dir);
}
END_TEST

/* A row's runs must share their config but for the seed; a seed counts once. */
START_TEST(test_report_row_mismatch)
{
    char dir[256], a[512], b[512], out[512];
    qd_test_mkdtemp(dir, sizeof dir, "report");
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    snprintf(out, sizeof out, "%s/rep", dir);
    write_config(a, "quads", 1, 2, NULL);
    write_metrics(a, 2, 0.4, 0.5, 0.6, 0.6, 0.1, 1);
    write_config(b, "quads", 2, 2, "trainer.lr=2e-4");
    write_metrics(b, 2, 0.4, 0.5, 0.6, 0.6, 0.1, 2);
    qd_report_run runs[2] = {{.dir = a}, {.dir = b}};
    qd_report_group g = {.name = "quads", .runs = runs, .n = 2};
    ck_assert_int_eq(qd_report_write(&g, 1, out, NULL), QD_ERR_ARG);
    ck_assert_msg(strstr(qd_last_error(), "differ in trainer.lr"), "%s", qd_last_error());
    write_config(b, "quads", 1, 2, NULL); /* now the same config, and the same seed */
    ck_assert_int_eq(qd_report_write(&g, 1, out, NULL), QD_ERR_ARG);
    ck_assert_msg(strstr(qd_last_error(), "the same run.seed 1"), "%s", qd_last_error());
    write_config(b, "quads", 2, 2, "run.threads=3"); /* threads may differ */
    ck_assert_int_eq(qd_report_write(&g, 1, out, NULL), QD_OK);
    qd_test_write_file(qd_test_join(a, "config.json"), "{\"run\": {\"seed\": 1}"); /* torn */
    ck_assert_int_eq(qd_report_write(&g, 1, out, NULL), QD_ERR_FORMAT);
    ck_assert_msg(strstr(qd_last_error(), "/a/config.json:"), "%s", qd_last_error());
    qd_test_write_file(qd_test_join(a, "config.json"), "{\"run\": {\"seed\": 1, \"steps\": 2}}");
    ck_assert_int_eq(qd_report_write(&g, 1, out, NULL), QD_ERR_FORMAT);
    ck_assert_msg(strstr(qd_last_error(), "config.json: rollout.recipe: missing"), "%s", qd_last_error());
    qd_test_rm_tree(dir);
}
END_TEST

/* A run whose config.json is a FIFO is refused with an error naming the file,
 * not read: a FIFO with no writer would block the reader forever. */
START_TEST(test_summarize_fifo)
{
    char dir[] = "/tmp/qd_report_fifo_XXXXXX", c[128], m[128];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(c, sizeof c, "%s/config.json", dir);
    snprintf(m, sizeof m, "%s/metrics.jsonl", dir);
    ck_assert_int_eq(mkfifo(c, 0600), 0);
    FILE *f = fopen(m, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    qd_run_summary r;
    ck_assert_int_eq(qd_run_summarize(dir, NULL, &r), QD_ERR_IO);
    ck_assert_msg(strstr(qd_last_error(), "config.json: not a regular file") != NULL, "%s", qd_last_error());
    unlink(c);
    unlink(m);
    rmdir(dir);
}
END_TEST

Suite *suite_report(void)
{
    Suite *s = suite_create("report");
    TCase *tc = tcase_create("aggregate");
    tcase_add_test(tc, test_seed_stat);
    tcase_add_test(tc, test_group_aggregate);
    tcase_add_test(tc, test_report_seeds);
    tcase_add_test(tc, test_report_paired);
    tcase_add_test(tc, test_report_row_mismatch);
    tcase_add_test(tc, test_summarize_fifo);
    suite_add_tcase(s, tc);
    return s;
}
