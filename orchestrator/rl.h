/* The RL loop (issue 5): GRPO/DAPO with a rollout and a trainer backend of one
 * precision recipe, the weight sync at the end of each step, metrics per step
 * in RUN/metrics.jsonl, held-out evals, atomic checkpoints and bit-exact resume.
 *
 * One step: prompts_per_step problems of the training split (the data
 * position advances deterministically; under dynamic sampling further batches
 * until enough groups carry signal) -> the rollout generates G completions
 * each (sampling seed from run.seed and the step, sequence ids from the data
 * position, so unique over the run) -> rewards (exact answer match, or for a
 * code task the sample's program run against its problem's tests in the
 * sandbox, plus the optional overlong penalty) -> group advantages -> for each of
 * trainer.mini_batches updates: the trainer's log-probs of prompt+completion
 * per micro-batch, the PPO-clip coefficients (logp_old = the trainer's
 * log-probs before the step's first update), backward, AdamW -> weight sync
 * (trainer master weights -> rollout set_weights: quantize(W) once; the
 * rollout's RAC channel sets are re-picked there from the activation errors
 * of the step's rollouts).
 *
 * Checkpoint RUN/step_XXXXXXXX (orchestrator/ckpt.h): the trainer's master
 * weights and AdamW moments, the rollout's RAC state, the counters of the run
 * and the sha256 of each file, verified on resume. Held-out evals and the router measurement leave the rollout's RAC
 * statistics as they found them, so what is saved determines the rest of the
 * run: a resumed run reproduces the uninterrupted one bit for bit (CPU).
 *
 * RUN/layers.json names the entries of the per-layer arrays of the metrics.
 * metrics.jsonl: one object a step (step 0 holds the first eval). Timings,
 * which differ run to run, are all under "time"; everything else is
 * deterministic. Fields: reward_mean, pass1_train (exact-match rate of the
 * step's samples), response_len, entropy (estimated as the mean -log p of the
 * sampled tokens under the rollout), loss, kl, clip_frac(_low, _high),
 * ratio_max, tis_mean, tis_clipped_frac, grad_norm (before clipping), lr
 * (loss, kl, grad_norm: means over the step's updates), samples, groups_kept,
 * gen_batches, updates, data_pos, optimizer_step; gap.{mean_abs, max_abs,
 * k3_kl, pearson, tokens} (trainer log-probs before the step's first update
 * vs the rollout's, over the trained samples); quant.{act_err, weight_err}
 * (per quantized linear, in parameter order: the rollout's relative squared
 * NVFP4 error of its inputs over the step's generation and of its weights at
 * the last sync) with their means; router.agree (per MoE layer: the share of
 * the trainer's top-k experts the rollout also picks, on the first
 * micro-batch's tokens) and agree_mean; eval.{pass1, mean_len, format_rate,
 * problems} on eval steps, and with eval.bf16 on step 0 and the last step
 * eval.bf16.{the same} (the same weights in a bf16-recipe rollout made for
 * the eval); time.{rollout_s, train_s, logprob_s (the log-prob forwards of
 * the trainer, reference and router check within train_s), sync_s, step_s,
 * tokens_per_s (generated tokens / step time), eval_s, eval_bf16_s}. Code tasks add
 * code.{accepted, wrong_answer, time_limit, memory_limit, runtime_error,
 * no_code, sandbox_error} (the step's samples by verdict), eval.code (the
 * same for the eval) and time.grade_s.
 *
 * Data parallel (docs/multi-gpu.md): under a launcher's environment
 * (dist/launch.h) with world size W > 1 every rank runs this loop on its own
 * backend (CUDA: device LOCAL_RANK) and the ranks meet over dist/rendezvous
 * (orchestrator/dp.h; run id = hash of the resolved config). Group g of each
 * generation batch (g < prompts_per_step, data position data_pos + g) is
 * generated, graded and trained on rank g mod W, whole, so its advantages are
 * local; sequence ids and sampling seeds are global, so the samples are those
 * of one rank. Dynamic sampling keeps the first groups with signal in the
 * global order (the keep flags are gathered). Mini-batch j is groups
 * [j n / J, (j + 1) n / J) of the kept n, wherever they live; its loss is
 * normalized by the whole mini-batch's tokens (summed over ranks) or
 * sequences, the gradients are summed over ranks in rank order, then every
 * rank takes the same AdamW step. The metrics are of the whole batch (sums,
 * maxima and the gap's arrays gathered); router.agree is measured on every
 * rank's first micro-batch. Before each RAC channel pick the rollouts' activation
 * errors are summed over ranks, so every rank picks the same channels from all
 * the rollouts; checkpoints hold those sums (rank 0 takes them on resume).
 * Rank 0 alone writes the run directory (metrics, layers.json, checkpoints
 * after a barrier) and runs the evals (the others wait); every
 * dist.checksum_every steps the ranks compare an FNV-1a of their master
 * weights (metrics: weights_checksum, world_size; at W > 1 only). A rank that
 * fails tells the others, which stop naming it. At world size 1 nothing of
 * this runs and the run is the same, bit for bit. */
#ifndef QD_RL_H
#define QD_RL_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "orchestrator/rl_config.h"
#include "quant/status.h"

/* Calls into the loop for tests (a crash in the middle of a step, a NaN);
 * NULL members are skipped. Normal runs set none. */
typedef struct {
    void *ctx;
    /* after step's rollouts and their diagnostics, before its training */
    void (*after_rollout)(void *ctx, int64_t step);
    /* the trainer's response log-probs of samples [first, first + n) of
     * step, (n, M), before they are checked for NaN */
    void (*trainer_logp)(void *ctx, int64_t step, int first, float *logp, int n, int M);
    /* code tasks: the text of each completion before it is graded (rollouts
     * and evals; id: its problem's), which the hook may replace (*text
     * malloc'd, freed by the grader) */
    void (*code_text)(void *ctx, const char *id, char **text);
} qd_rl_hooks;

typedef struct {
    const char *resume_dir;   /* continue this run from its latest checkpoint (NULL: new run) */
    FILE *log;                /* start lines, evals, the final summary; NULL = quiet */
    bool progress;            /* the progress line on stderr (live on a terminal) */
    const qd_rl_hooks *hooks; /* NULL: none */
} qd_rl_options;

/* The run directory a config names: run.dir, else ./runs/<run.name> (a
 * run.name of "" gives a timestamp). Into buf. A resumed run stays in the
 * directory it resumes and records it as run.dir in its config.json. */
qd_status qd_rl_run_dir(const qd_config *cfg, char *buf, size_t n);

/* Runs (or resumes) the loop until run.steps. run_dir (n bytes, may be NULL)
 * receives the run directory. Errors name where they arose (e.g. "step 3:
 * trainer log-prob of sample 2 token 5 is NaN"). */
qd_status qd_rl_run(const qd_config *cfg, const qd_rl_options *o, char *run_dir, size_t n);

/* The report of finished (or running) runs, one row a run
 * (orchestrator/report.h, qd_report_write, has rows of several seeds):
 * out_dir/report.md and report.json (recipe, held-out pass@1 first and final
 * at the rollout's precision and in bf16, mean and max |logp gap|, k3
 * mismatch KL, router agreement, tokens/s; the run's status: a run short of
 * run.steps is marked incomplete) and out_dir/{reward,pass1,gap}.svg, one
 * series per run. names[i] (NULL: the run directory's last component) labels
 * run i. out_dir is made if missing. */
qd_status qd_rl_report(const char *const *runs, const char *const *names, int n, const char *out_dir);

#endif
