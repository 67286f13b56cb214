/* Data parallelism of `quads rl` (issue 7): the collectives the RL loop needs,
 * over dist/rendezvous (TCP through rank 0), deterministic and identical on
 * every rank. One process per device; world size 1 makes every call a no-op
 * and opens no socket.
 *
 * Sums are an allgather followed by a sum in rank order (in double), so every
 * rank computes the same bits and the result does not depend on timing. The
 * gradient all-reduce (qd_dp_sum_f32) is the seam for NCCL: a CUDA build can
 * route it to qd_nccl_all_reduce_sum_f32 on device buffers (not wired: the
 * backends' get_grads/set_grads are host copies, and NCCL's ring sum is not in
 * rank order). */
#ifndef QD_DP_H
#define QD_DP_H
#include <stddef.h>
#include <stdint.h>
#include "backends/backend.h"
#include "dist/launch.h"
#include "dist/rendezvous.h"
#include "models/model_config.h"
#include "orchestrator/metrics.h"
#include "quant/status.h"

typedef struct {
    int rank, world, local_rank;
    qd_rdzv *rz; /* NULL at world size 1 */
} qd_dp;

/* Joins the job env describes (world size 1: nothing to join). run_id: equal
 * on every rank of one job (a job with another config is refused);
 * timeout_s bounds every collective (it must exceed the longest imbalance
 * between ranks: rank 0's eval, a slow rollout). */
qd_status qd_dp_open(qd_dp *dp, const qd_dist_env *env, uint64_t run_id, double timeout_s);
/* A last barrier (so that no rank leaves while rank 0 still writes), then
 * closes. Call only on success; on failure qd_dp_fail. */
qd_status qd_dp_finish(qd_dp *dp);
/* This rank failed with st: tells the others why (they fail naming this
 * rank), closes; returns st with the current message (qd_last_error) kept. */
qd_status qd_dp_fail(qd_dp *dp, qd_status st);

/* x (n) = the sum over ranks of x, in rank order in double (chunked). */
qd_status qd_dp_sum_f32(qd_dp *dp, float *x, size_t n);
qd_status qd_dp_sum_f64(qd_dp *dp, double *x, size_t n);
/* x (n) = the element-wise maximum over ranks (NaN-free inputs). */
qd_status qd_dp_max_f64(qd_dp *dp, double *x, size_t n);
/* Every rank's blob (n bytes, n may differ per rank): *all (malloc'ed) holds
 * them in rank order, off (world + 1) their offsets. */
qd_status qd_dp_gatherv(qd_dp *dp, const void *mine, size_t n, uint8_t **all, size_t *off);
/* Every rank's u64 into all (world), in rank order. */
qd_status qd_dp_gather_u64(qd_dp *dp, uint64_t mine, uint64_t *all);
qd_status qd_dp_bcast(qd_dp *dp, void *buf, size_t n);
qd_status qd_dp_barrier(qd_dp *dp, const char *name);

/* FNV-1a 64 of n bytes (the weight checksum). */
uint64_t qd_dp_fnv1a(const void *p, size_t n);

/* ---- the RL loop's exchanges (rl.h describes the scheme) */

/* keep (P) = the dynamic-sampling flags of every group of a generation batch,
 * from this rank's lkeep (its groups rank, rank + W, ..., in order). */
qd_status qd_dp_keep_flags(qd_dp *dp, const uint8_t *lkeep, uint8_t *keep, int P);
/* The trainer's gradients (nf) summed over ranks, in place. */
qd_status qd_dp_sum_grads(qd_dp *dp, qd_backend *trainer, size_t nf);
/* rac (rb bytes, this rank's RAC state) gets, in place of its activation-
 * error statistics, their sum over ranks: the statistics of every rollout
 * of the job since the last pick, so every rank picks the same channels. */
qd_status qd_dp_sum_rac(qd_dp *dp, const qd_model_config *mcfg, void *rac, size_t rb);
/* Zeroes the statistics of a RAC state blob: a resumed rank other than 0
 * (the checkpoint holds the job's sums, and the next pick adds every rank's). */
qd_status qd_dp_zero_rac(const qd_model_config *mcfg, void *rac, size_t rb);

/* n rows of two (M) float arrays a and b, with a place in [0, S) and a length each. */
typedef struct {
    int n, M;
    const int32_t *place; /* (n) gather: where each row goes */
    int32_t *rlen;        /* (n) */
    float *a, *b;         /* (n, M) */
} qd_dp_rows;
/* Every rank's rows into all (S rows, row i at place i): the gap's samples
 * in the 1-rank order. A place outside [0, S) is QD_ERR_FORMAT. */
qd_status qd_dp_gather_rows(qd_dp *dp, const qd_dp_rows *mine, qd_dp_rows *all, int S);
/* This rank's sums of a step -> those of all ranks (maxima for ratio_max;
 * the router counts of the ranks that measured them). */
qd_status qd_dp_reduce_stats(qd_dp *dp, qd_rollout_stats *rs, qd_train_stats *ts, qd_layer_stats *ls);
/* *sum = the FNV-1a of w (nf, this rank's master weights); a rank whose sum
 * differs from rank 0's fails the step, named. */
qd_status qd_dp_check_weights(qd_dp *dp, const float *w, size_t nf, int64_t step, uint64_t *sum);

#endif
