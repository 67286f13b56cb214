/* Host-side pieces both backends run identically (the CPU reference and the
 * CUDA backend, which mirrors it): one definition, so they cannot drift. */
#ifndef QD_BACKENDS_SHARED_H
#define QD_BACKENDS_SHARED_H

#include <stddef.h>
#include <stdint.h>
#include "backends/backend.h"

/* RoPE tables cos, sin (max_position_embeddings, head_dim/2): HF's inv_freq is
 * float32 theta^(-2i/D); the angle pos * inv_freq and its cos/sin in double,
 * then rounded to float. */
void qd_rope_tables(float *cosb, float *sinb, const qd_model_config *cfg);

/* Packs a right-padded batch as the forward consumes it: token n of row b at
 * seq_off[b] + t, with tok (N), tgt (N, the next token or -1), pos (N), row (N),
 * src (N, b*T + t) and seq_off (B + 1). QD_ERR_ARG names a token outside the
 * vocabulary. */
qd_status qd_pack_batch(int32_t *tok, int32_t *tgt, int32_t *pos, int32_t *row, int32_t *src, int32_t *seq_off,
                        const qd_batch *bt, int vocab);

/* A decode step's batch: active row i of the generation (batch row idx[i],
 * its tokens seq[b*Tmax ..], len[b] of them) feeds its last token at position
 * len[b] - 1: tok, pos, row, tgt (-1), src (i) for i < na, seq_off (na + 1). */
void qd_decode_pack(int32_t *tok, int32_t *pos, int32_t *row, int32_t *tgt, int32_t *src, int32_t *seq_off,
                    const int32_t *seq, const int32_t *len, const int32_t *idx, int na, int Tmax);

/* The start of a generation: seq (B, Tmax) holds the prompts, len (B) their
 * lengths, done (B) set when max_new_tokens is 0; res cleared (tokens -1,
 * log-probs 0, lengths 0). */
void qd_generate_begin(int32_t *seq, int32_t *len, int *done, const qd_generate_request *rq,
                       qd_generate_result *res, int Tmax);

/* The backward's dlogp (N) from the caller's (B, T) at the packed tokens'
 * places src (N); QD_ERR_NONFINITE names the first non-finite place. */
qd_status qd_gather_dlogp(float *d, const float *dlogp, const int32_t *src, int N);

/* 1 - beta^step by repeated multiplication in double (no pow: the same bits everywhere). */
float qd_adamw_bias_correction(float beta, int step);
/* One AdamW step's scalars: the clipping factor of the gradients (grad_clip /
 * norm when clipping, else 1) and both bias corrections. */
void qd_adamw_scalars(const qd_adamw *o, int step, double norm, float *gscale, float *bc1, float *bc2);
/* The weight decay of one tensor: matrices only, not norm weights. */
float qd_adamw_decay(const qd_adamw *o, const qd_param_info *pi);

/* 1 when tok is one of the request's stop tokens. */
int qd_generate_is_stop(const qd_generate_request *rq, int32_t tok);

/* The RAC state blob of one linear with in features: int64 nrac, int64
 * channels[in] (the first nrac used), double err[in]. */
size_t qd_rac_state_bytes(int in);
/* A saved channel set: nrac in [0, in], channels ascending in [0, in);
 * QD_ERR_FORMAT naming the layer otherwise. */
qd_status qd_rac_check_channels(const char *name, int in, int64_t nrac, const int64_t *ch);

/* Which way qd_rac_state_errors copies: out of the blob, or into it. */
typedef enum { QD_RAC_ERRORS_GET, QD_RAC_ERRORS_PUT } qd_rac_errors_dir;

/* The activation-error statistics inside a RAC state blob of cfg's model (the
 * bytes of qd_backend_get_rac_state: per RAC linear, which are the layout's
 * quantized linears in order, int64 nrac, int64 channels[in], double err[in]).
 * QD_RAC_ERRORS_GET copies every err array into err (in order), ..._PUT copies
 * err back into the blob; err may be NULL to only count. *count receives the
 * number of doubles. QD_ERR_FORMAT when n is not the size of such a blob. */
qd_status qd_rac_state_errors(void *blob, size_t n, const qd_model_config *cfg, double *err, size_t *count,
                              qd_rac_errors_dir dir);

#endif
