/* The report of RL runs (quads compare, quads report): one row a group of
 * runs (a recipe's seeds, or one run), each number of a row the mean over the
 * group's complete runs with its spread, min-max in the table and the sample
 * standard deviation too in report.json; runs that failed, stopped early or
 * are missing are listed with the reason, never averaged. Plots: one line a
 * group (the mean at each step) with a band from the min to the max over its
 * runs. */
#ifndef QD_REPORT_H
#define QD_REPORT_H
#include <stdint.h>
#include "quant/status.h"

typedef enum {
    QD_RUN_OK,         /* reached run.steps */
    QD_RUN_FAILED,     /* the caller saw it fail (qd_report_run.failure) */
    QD_RUN_INCOMPLETE, /* its metrics stop before run.steps */
    QD_RUN_MISSING,    /* no config.json or metrics.jsonl */
} qd_run_status;

/* The numbers of a run (NaN: not measured). pass@1 is held-out; "first" is
 * the first eval (step 0), "final" the last; BF16_*: the same checkpoints
 * evaluated with the bf16 recipe's rollout (eval.bf16), final only when
 * taken at run.steps. Gap, KL, agreement and tokens/s are means over the
 * steps (GAP_MAX: the largest of any step). */
enum {
    QD_COL_PASS_FIRST,
    QD_COL_PASS_FINAL,
    QD_COL_BF16_FIRST,
    QD_COL_BF16_FINAL,
    QD_COL_GAP_MEAN,
    QD_COL_GAP_MAX,
    QD_COL_KL,
    QD_COL_AGREE,
    QD_COL_TPS,
    QD_NCOLS
};

/* The key of column c in report.json ("pass1_final", ...). */
const char *qd_report_col_key(int c);

typedef struct {
    qd_run_status status;
    char reason[512];    /* why the status is not OK ("" when it is) */
    char recipe[64];     /* rollout.recipe of config.json ("?" when missing) */
    int64_t seed;        /* run.seed (-1 when missing) */
    int64_t steps;       /* the last step of metrics.jsonl (0 when none) */
    int64_t steps_planned; /* run.steps */
    double v[QD_NCOLS];
} qd_run_summary;

/* Mean, sample standard deviation (n - 1; 0 for one value), min and max of
 * the finite values among v[0..count); n is how many there were. All NaN
 * when none is. */
typedef struct {
    double mean, std, min, max;
    int n;
} qd_seed_stat;
qd_seed_stat qd_seed_stat_of(const double *v, int count);

/* Run directory dir (config.json, metrics.jsonl) into *s. failure (may be
 * NULL) is the message of a run that failed: status FAILED whatever its files
 * say. A missing file is a status (MISSING), not an error; a file that does
 * not parse is an error naming it (and the field: run.seed, run.steps,
 * rollout.recipe). */
qd_status qd_run_summarize(const char *dir, const char *failure, qd_run_summary *s);

/* A row: its number of runs, of complete (OK) runs, and a statistic per
 * column over the complete runs. */
typedef struct {
    int runs, complete;
    qd_seed_stat col[QD_NCOLS];
} qd_group_stats;
void qd_group_aggregate(const qd_run_summary *runs, int n, qd_group_stats *g);

typedef struct {
    const char *dir;
    const char *failure; /* NULL, or why the run failed */
} qd_report_run;

typedef struct {
    const char *name; /* the row's label */
    const qd_report_run *runs;
    int n;
} qd_report_group;

/* out_dir/report.md (the rows; every run with its status; command, when not
 * NULL, as the command that made them), out_dir/report.json (the same
 * numbers: rows with mean, std, min, max, n and the values of each column;
 * runs with their status and reason) and out_dir/{reward,pass1,gap}.svg.
 * out_dir is made if missing. The complete runs of a row must have the same
 * config but for run.seed, run.dir, run.name and run.threads, and distinct
 * seeds: QD_ERR_ARG naming the two runs and the key otherwise. */
qd_status qd_report_write(const qd_report_group *groups, int n_groups, const char *out_dir, const char *command);

#endif
