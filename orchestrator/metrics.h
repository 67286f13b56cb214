/* RUN/metrics.jsonl: one JSON object a line, each with an integer "step",
 * appended and made durable per step; cut back to a checkpoint's step on
 * resume; read back as (step, value) series for plots. The measurements of
 * an RL step that go into it (rollout, training, per-layer quantization
 * errors and router agreement, the rollout-trainer gap) and its JSON (the
 * fields are listed in rl.h). Also the progress line of a run (a live line on
 * a terminal, plain lines in logs). */
#ifndef QD_METRICS_H
#define QD_METRICS_H
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <jansson.h>
#include "backends/backend.h"
#include "models/model_config.h"
#include "orchestrator/grpo.h"
#include "orchestrator/task.h"
#include "quant/status.h"
#include "rewards/code.h"

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

/* ---- the measurements of an RL step (sums over this rank until reduced) */

typedef struct {
    double reward_sum, score_sum, len_sum;
    int64_t generated, tokens, gen_batches;
    int64_t verdicts[QD_CODE_N_VERDICTS]; /* code tasks: samples by verdict (rewards/code.h) */
    double grade_s;                       /* code tasks: wall time of the grading (the slowest rank's) */
} qd_rollout_stats;

typedef struct {
    double loss, kl, clip_frac, clip_low, clip_high, ratio_max, tis_mean, tis_clipped;
    double grad_norm, lr; /* grad_norm, loss, kl: sums over the updates */
    int64_t tokens, updates;
    qd_gap_stats gap;
} qd_train_stats;

/* Adds a micro-batch's loss statistics (ratios weighted by its tokens). */
void qd_train_stats_add(qd_train_stats *ts, const qd_grpo_stats *g);

/* Per-layer measurements of the step (rollout vs trainer). */
typedef struct {
    int nlin, nmoe;
    double *act_err, *weight_err; /* (nlin) relative NVFP4 errors of the rollout */
    double *act_sq, *act_norm;    /* (nlin) their sums (this rank's until reduced) */
    double *agree;                /* (nmoe) router top-k agreement */
    double *hits, *picks;         /* (nmoe) its counts: experts both picked, tokens x top_k */
} qd_layer_stats;

/* (Re)allocates the quantization errors of nlin linears, zeroed. */
qd_status qd_layer_stats_zero(qd_layer_stats *ls, int nlin);
/* The rollout's quantization errors of d (its diagnostics) into ls. */
qd_status qd_layer_stats_quant(qd_layer_stats *ls, const qd_diagnostics *d);
/* (Re)allocates the router counts of nmoe MoE layers, zeroed. */
qd_status qd_layer_stats_router(qd_layer_stats *ls, int nmoe);
/* Router agreement counts: for each of ls->nmoe layers, the experts of a
 * (N tokens x K, the trainer's) that b (the rollout's) also picked. */
void qd_layer_stats_agree(qd_layer_stats *ls, const int32_t *a, const int32_t *b, int N, int K);
/* The ratios of the per-layer sums (after they are reduced over ranks). */
void qd_layer_stats_ratios(qd_layer_stats *ls);
void qd_layer_stats_free(qd_layer_stats *ls);

/* path (RUN/layers.json), unless it exists: what the per-layer arrays of
 * the metrics index (quant: the quantized linears' weight names of d;
 * router: the MoE layers of m). */
qd_status qd_metrics_write_layers(const char *path, const qd_diagnostics *d, const qd_model_config *m);

/* The gap over S samples (M tokens each, rlen[i] of them real): the
 * trainer's log-probs lp_old, the rollout's lp_ro (whose -log p of the
 * sampled token is the entropy estimate). */
qd_status qd_metrics_gap(qd_gap_stats *g, const float *lp_old, const float *lp_ro, const int *rlen, int S, int M);

/* The metrics line of a step (new reference, NULL on out of memory):
 * counters, rollout, training, gap, per-layer and timing (t: rollout,
 * train, sync, whole step, in seconds) fields. */
typedef struct {
    int64_t step, data_pos, optimizer_step;
    int groups_kept;
    const qd_rollout_stats *rollout;
    const qd_train_stats *train;
    const qd_layer_stats *layers;
    double t[5]; /* seconds: rollout, train, sync, the step, the log-prob forwards within train */
} qd_step_metrics;
json_t *qd_metrics_step_json(const qd_step_metrics *m);
/* o.eval = the held-out eval's fields; time.eval_s = secs. */
void qd_metrics_put_eval(json_t *o, json_t *time, const qd_task_eval_result *ev, double secs);
/* After qd_metrics_put_eval: o.eval.PRECISION = the fields of the same eval
 * run at another precision (eval.bf16: "bf16"); time.eval_PRECISION_s = secs. */
void qd_metrics_put_eval_as(json_t *o, json_t *time, const char *precision, const qd_task_eval_result *ev,
                            double secs);

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

/* *out = the JSON document in path, a regular file only (a FIFO, a device or a
 * directory is refused without blocking: qd_read_file); parse errors name
 * path:line. *out is NULL on any error. */
qd_status qd_json_load_regular(const char *path, size_t flags, json_t **out);

#endif
