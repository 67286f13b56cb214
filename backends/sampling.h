/* Token sampling of the exact mode (NUMERICS.md §6; the rule is written out
 * step by step in sampling.c and docs/numerics.md): a pure function of
 * (logits, temperature, top-k, top-p, seed, sequence id, position) that gives
 * the same token and log-probs, bit for bit, at any batch size, thread count
 * or backend. Stop tokens and length limits belong to the generate loop. */
#ifndef QD_SAMPLING_H
#define QD_SAMPLING_H

#include <stdint.h>
#include "quant/status.h"

/* Lanes of the fixed-shape sum over the vocabulary: token i goes to lane
 * i % QD_SAMPLE_LANES, then a pairwise tree over the lanes (sampling.c). */
#define QD_SAMPLE_LANES 1024

typedef struct {
    float temperature; /* > 0: softmax(logits / temperature); 0: greedy (argmax) */
    int top_k;         /* keep the top_k highest-ranked tokens; <= 0 or >= V: all */
    float top_p;       /* nucleus mass in (0, 1]; 1: no nucleus cut */
    uint64_t seed;     /* Philox key (backends/philox.h) */
} qd_sample_params;

typedef struct {
    int32_t token;
    float logprob;      /* log_softmax(logits / T)[token] over the full vocabulary;
                         * T = 1 when greedy. This is the rollout log-prob. */
    float logprob_kept; /* log of the token's probability in the truncated,
                         * renormalized distribution it was drawn from; 0 when greedy */
} qd_sample_result;

/* Scratch for one row of V tokens (16 bytes per token + 8 KiB); one per thread. */
typedef struct qd_sample_ws qd_sample_ws;

/* NULL when out of memory or V < 1. Free with qd_sample_ws_free (NULL is fine). */
qd_sample_ws *qd_sample_ws_new(int V);
void qd_sample_ws_free(qd_sample_ws *ws);

/* Samples one row: logits (V), drawn with Philox at (p->seed, seq_id,
 * position). seq_id must differ between all sequences sampled under one seed
 * (two samples of one prompt in a GRPO group included: equal ids give equal
 * draws); position is the index in its sequence of the token being drawn
 * (prompt length + tokens generated so far). ws must come from
 * qd_sample_ws_new with at least V tokens.
 * QD_ERR_NONFINITE names the token of a NaN/Inf logit (or of a logit that
 * overflows when divided by the temperature); QD_ERR_ARG a bad parameter. */
qd_status qd_sample_row(qd_sample_result *out, qd_sample_ws *ws, const float *logits, int V,
                        const qd_sample_params *p, uint64_t seq_id, uint32_t position);

/* The log-normalizer of one row shared by the sampler and every forward's
 * log_softmax, so rollout and trainer log-probs of the same logits have the
 * same bits: *m = max s_i (+0), *logz = qd_logf(Z) with Z the lane-tree sum
 * (steps 2-5 in sampling.c) of qd_expf(s_i - m); log p_t = (s_t - m) - logz. */
void qd_softmax_lognorm(float *m, float *logz, const float *s, int V);

/* Samples every row of logits (B, V) with row b keyed by (seq_ids[b],
 * positions[b]); OpenMP over rows. out (B). On error, the message names the
 * lowest failing row and its token; out is then unspecified. */
qd_status qd_sample_batch(qd_sample_result *out, const float *logits, int B, int V,
                          const qd_sample_params *p, const uint64_t *seq_ids,
                          const uint32_t *positions);

#endif /* QD_SAMPLING_H */
