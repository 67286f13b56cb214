/* RUN/metrics.jsonl: one JSON object a line, each with an integer "step",
 * appended and made durable per step; cut back to a checkpoint's step on
 * resume; read back as (step, value) series for plots. Also the progress
 * line of a run (a live line on a terminal, plain lines in logs). */
#ifndef QD_METRICS_H
#define QD_METRICS_H
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <jansson.h>
#include "quant/status.h"

typedef struct qd_metrics qd_metrics;

/* Opens path for appending (created if missing). On resume call
 * qd_metrics_truncate first: it also removes a line torn by a crash. */
qd_status qd_metrics_open(qd_metrics **m, const char *path);
/* Appends obj (it must hold an integer "step") as one compact line (reals
 * with 17 significant digits: they read back bit for bit), then
 * fflush and fsync, so a crash after return never loses the step. With
 * qd_metrics_tensorboard, the line's numbers also go to the event file. */
qd_status qd_metrics_append(qd_metrics *m, const json_t *obj);
void qd_metrics_close(qd_metrics *m);
/* Also writes every later line as a TensorBoard event (orchestrator/tb.h) to
 * a new event file in run_dir/tb/, starting with the config (run_dir/
 * config.json) as the text summary "config" at step and a restart marker at
 * step + 1 (the steps a resumed run writes again replace the old ones). */
qd_status qd_metrics_tensorboard(qd_metrics *m, const char *run_dir, int64_t step);

/* obj[key] = v, or null when v is NaN or Inf (JSON has no such numbers).
 * Returns 0 on success. */
int qd_metrics_set(json_t *obj, const char *key, double v);

/* Rewrites path atomically without the lines whose step is > step, and
 * without a final line torn by a crash (no newline, not valid JSON). A missing
 * file is fine. Any other malformed line is QD_ERR_FORMAT naming PATH:LINE. */
qd_status qd_metrics_truncate(const char *path, int64_t step);

/* The series of key: x = step, y = value, for the lines where key is a number
 * (lines without it or with null are skipped). key is looked up as a member
 * name first, then as a dotted path into nested objects ("gap.mean_abs").
 * *x and *y are malloc'ed (free both); *n gets the count. */
qd_status qd_metrics_read_series(const char *path, const char *key, double **x, double **y, int64_t *n);

/* The phases of an RL step, for the live progress line. */
typedef enum { QD_PHASE_NONE, QD_PHASE_ROLLOUT, QD_PHASE_TRAIN, QD_PHASE_SYNC, QD_PHASE_EVAL, QD_NPHASES } qd_phase;

typedef struct {
    int64_t step, steps;  /* the step just finished (1-based) and the run's last */
    int64_t steps_done;   /* steps finished by this process (a resumed run starts at 0) */
    double elapsed_s;     /* wall time of those steps */
    double reward;        /* reward mean of the step */
    double gap;           /* mean |logp_trainer - logp_rollout| */
    double tokens_per_s;
    qd_phase phase;       /* the phase of the step in progress (NONE between steps) */
    double phase_t0;      /* when it began (monotonic seconds) */
    double phase_s[QD_NPHASES]; /* how long each phase took last time (0: not yet run) */
} qd_progress;

/* "step 12/50  reward 0.412  gap 0.0031  1234 tok/s  ETA 0:03:10" into buf;
 * during a phase (the line is written as it starts), the step in progress and
 * the phase with its ETA (the time the phase took last time; "?" the first
 * time) first:
 * "step 13/50 train ETA 0:00:02  reward 0.412 ..." (the numbers are still
 * the last finished step's). Returns snprintf's count. */
int qd_progress_format(char *buf, size_t n, const qd_progress *p);
/* Ends the current phase (its time kept for the next ETA) and starts ph at
 * monotonic time now_s; QD_PHASE_NONE at the end of a step. */
void qd_progress_phase(qd_progress *p, qd_phase ph, double now_s);
/* On a terminal (tty): rewrites the current line ("\r", text, clear to end of
 * line), with a newline after the last step. Otherwise one plain line a step,
 * and nothing during a phase (logs get no phase lines). */
void qd_progress_write(FILE *f, bool tty, const qd_progress *p);
/* qd_progress_write to stderr, tty = isatty(stderr). */
void qd_progress_print(const qd_progress *p);

#endif
