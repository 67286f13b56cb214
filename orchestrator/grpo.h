/* The GRPO/DAPO math of one RL step as pure functions: group-normalized
 * advantages, the PPO-clip loss with asymmetric clip, KL to a reference,
 * rollout-trainer importance weights (TIS and masked TIS), dynamic sampling,
 * the overlong penalty, and the rollout-trainer gap metrics.
 *
 * The interface to the model: the loss reaches the backend as one coefficient
 * per token, coef = dL/dlogp (the log-prob of the sampled token under the
 * parameters being trained). Backward then runs with that as the upstream
 * gradient of each token's log-prob. Reductions run in double. */
#ifndef QD_GRPO_H
#define QD_GRPO_H
#include <stdint.h>
#include "orchestrator/rl_config.h"
#include "quant/status.h"

typedef enum { QD_ADV_GRPO, QD_ADV_DR_GRPO } qd_adv_kind;
typedef enum { QD_AGG_TOKEN_MEAN, QD_AGG_SEQ_MEAN_TOKEN_SUM, QD_AGG_SEQ_MEAN_TOKEN_MEAN } qd_loss_agg;
typedef enum { QD_KL_K1, QD_KL_K2, QD_KL_K3 } qd_kl_type;
typedef enum { QD_TIS_NONE, QD_TIS_TRUNC, QD_TIS_MASKED } qd_tis_kind;

/* Advantages of n_groups groups of G samples (G >= 2), rewards (n_groups, G)
 * -> adv (n_groups, G). GRPO: (r - mean) / (std + eps) with std the unbiased
 * (n - 1) sample std, as verl (torch.std's default); Dr.GRPO: r - mean.
 * A non-finite reward is QD_ERR_NONFINITE naming its index. */
qd_status qd_grpo_advantages(float *adv, const float *reward, int64_t n_groups, int64_t G, qd_adv_kind kind,
                             double eps);

typedef struct {
    int64_t B, T;              /* B = sequences, T = padded response length */
    const float *logp;         /* (B, T) trainer log-probs under the parameters being trained */
    const float *logp_old;     /* (B, T) trainer log-probs before this step's first update (PPO's old policy) */
    const float *logp_rollout; /* (B, T) rollout engine log-probs; read only when tis != NONE */
    const float *logp_ref;     /* (B, T) reference model log-probs; read only when kl_coef > 0 */
    const float *adv;          /* (B) advantage of each sequence, shared by its tokens */
    const uint8_t *mask;       /* (B, T) 1 for response tokens, 0 for padding */
} qd_grpo_batch;

typedef struct {
    double clip_low, clip_high; /* ratio clipped to [1 - clip_low, 1 + clip_high] */
    qd_loss_agg agg;
    double kl_coef;
    qd_kl_type kl_type;
    qd_tis_kind tis;
    double tis_cap;             /* C */
    /* The aggregation's denominator when a step is split into micro-batches: the
     * step's token count (token_mean) or sequence count (seq_*), so that the
     * micro-batch coefficients add up to the whole batch's. 0 = this batch's own. */
    double norm;
} qd_grpo_params;

typedef struct {
    double loss;            /* pg_loss + kl_coef * kl */
    double pg_loss;         /* aggregated (importance-weighted) clipped policy loss */
    double kl;              /* aggregated KL estimate (before kl_coef) */
    double clip_frac;       /* tokens whose gradient the clip removed / tokens */
    double clip_frac_low;   /* ... because ratio < 1 - clip_low with A < 0 */
    double clip_frac_high;  /* ... because ratio > 1 + clip_high with A > 0 */
    double ratio_mean, ratio_max;
    double tis_mean;        /* mean importance weight (1 when tis is NONE) */
    double tis_clipped_frac;/* tokens truncated (tis) or dropped (masked) at the cap / tokens */
    int64_t tokens;         /* response tokens in this batch */
} qd_grpo_stats;

/* Fills params from cfg's algo.* knobs (norm = 0). */
void qd_grpo_params_from_config(qd_grpo_params *p, const qd_config *cfg);

/* The loss of a batch and its per-token gradient coefficient coef (B, T) =
 * dL/dlogp (0 on padding; coef may be NULL). Per token, with r = exp(logp - logp_old):
 *   pg  = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))       (PPO-clip, DAPO clip-higher)
 *   w   = 1, or min(rho, C) (tis), or rho if rho <= C else 0 (masked),
 *         rho = exp(logp_old - logp_rollout), a constant (no gradient)
 *   kl  = k1: d, k2: d^2/2, k3: exp(-d) + d - 1, with d = logp - logp_ref
 *   l   = w pg + kl_coef kl
 * aggregated by p->agg: token_mean sum(l)/N; seq_mean_token_sum mean over
 * sequences of sum(l); seq_mean_token_mean mean over sequences of mean(l).
 * Masked tokens keep their place in the denominators. */
qd_status qd_grpo_loss(float *coef, qd_grpo_stats *stats, const qd_grpo_batch *b, const qd_grpo_params *p);

/* The KL estimator of one token, d = logp - logp_ref, and its derivative in logp. */
double qd_grpo_kl(qd_kl_type type, double d, double *grad);

/* DAPO dynamic sampling: keep (n_groups) = 1 for groups whose scores (n_groups, G)
 * are not all equal (a group all right or all wrong has zero advantage and no
 * gradient). Returns the number kept. */
int64_t qd_grpo_filter_groups(uint8_t *keep, const float *score, int64_t n_groups, int64_t G);

/* DAPO soft overlong punishment added to the reward of a response of len tokens
 * with limit max_len and window buffer: 0 up to max_len - buffer, then falling
 * linearly to -penalty at max_len, -penalty beyond. buffer <= 0: always 0. */
double qd_grpo_overlong_penalty(int64_t len, int64_t max_len, int64_t buffer, double penalty);

/* The rollout-trainer gap over the response tokens of a batch. */
typedef struct {
    double mean_abs;  /* mean |logp_trainer - logp_rollout| */
    double max_abs;   /* max  |logp_trainer - logp_rollout| */
    double k3_kl;     /* mean of r - 1 - log r, r = p_trainer / p_rollout: KL(rollout || trainer)
                         estimated on the rollout's own samples */
    double pearson;   /* Pearson correlation of p_trainer and p_rollout (NaN if either is constant) */
    double entropy;   /* mean per-token entropy (NaN when none is given) */
    int64_t tokens;
} qd_gap_stats;

/* logp_trainer, logp_rollout, entropy (may be NULL), mask: all (B, T). */
qd_status qd_grpo_gap(qd_gap_stats *g, const float *logp_trainer, const float *logp_rollout,
                      const float *entropy, const uint8_t *mask, int64_t B, int64_t T);

typedef enum { QD_LR_CONSTANT, QD_LR_COSINE, QD_LR_LINEAR } qd_lr_schedule;

/* The learning rate of optimizer step s (0-based) of total: linear warmup
 * peak * (s + 1) / warmup for s < warmup (the first step is not wasted on lr 0),
 * then with p = (s - warmup) / (total - warmup) in [0, 1]:
 * constant peak; linear peak (1 - (1 - m) p); cosine peak (m + (1 - m)(1 + cos(pi p))/2),
 * m = min_ratio. */
double qd_grpo_lr(qd_lr_schedule sched, double peak, double min_ratio, int64_t warmup, int64_t total, int64_t s);

/* Names of the enums as in the config ("grpo", "token_mean", "k3", "masked", ...);
 * -1 for an unknown name. */
int qd_grpo_adv_kind_parse(const char *s);
int qd_grpo_loss_agg_parse(const char *s);
int qd_grpo_kl_type_parse(const char *s);
int qd_grpo_tis_parse(const char *s);
int qd_grpo_lr_schedule_parse(const char *s);

#endif
