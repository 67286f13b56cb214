/* The checkpoints of an RL run: their files, written crash-safe and verified
 * on load, and the bookkeeping of a run directory (naming, finding the latest,
 * rotating old ones).
 *
 * RUN/step_XXXXXXXX holds model.safetensors + config.json (the trainer's
 * float32 master weights, HF layout; tokenizer.json copied), optimizer.bin
 * (AdamW m, v), rac.bin (the rollout's RAC state), state.json (step, data
 * position, optimizer step, seed, recipe) and, written last, SHA256SUMS: the
 * sha256 of every other file, in `sha256sum` format (so `sha256sum -c
 * SHA256SUMS` checks a checkpoint by hand). The files go into
 * step_XXXXXXXX.tmp, which is fsynced and renamed. A load verifies every
 * digest before it reads anything, so a flipped bit is named, never resumed. */
#ifndef QD_CKPT_H
#define QD_CKPT_H
#include <stddef.h>
#include <stdint.h>
#include "backends/backend.h"
#include "models/model_config.h"
#include "quant/status.h"

#define QD_CKPT_SUMS "SHA256SUMS"
/* Bounds of state.json: a data position beyond 2^48 problems (sequence ids
 * are data_pos x group_size in 64 bits) or an optimizer step beyond 2^30 (the
 * backends count them in an int; the config bounds run.steps x mini_batches
 * by 2^30 too)
 * is a damaged or hand-edited file, not a run. */
#define QD_CKPT_MAX_DATA_POS (INT64_C(1) << 48)
#define QD_CKPT_MAX_STEP 99999999
#define QD_CKPT_MAX_OPT_STEP (INT64_C(1) << 30)

/* The counters of a run at a checkpoint (state.json). */
typedef struct {
    int64_t step, data_pos, optimizer_step;
    uint64_t seed;
    char recipe[64];
} qd_ckpt_state;

/* The arrays of a checkpoint, in the caller's buffers: read on save, written
 * on load. */
typedef struct {
    const qd_model_config *mcfg;
    const qd_param_info *params; /* (n_params) the layout of w, m and v */
    int n_params;
    size_t nf;                   /* floats of each of w, m, v */
    float *w, *m, *v;            /* (nf) master weights, AdamW first and second moments */
    void *rac;                   /* (rac_bytes) the rollout's RAC state blob */
    size_t rac_bytes;
    const char *tokenizer;       /* save: a tokenizer.json copied in (NULL or unreadable: none) */
} qd_ckpt_data;

/* Writes checkpoint s->step of run dir (replacing one of that step from a run
 * that was cut back), then keeps the keep_last newest. Refuses non-finite
 * moments (naming optimizer.bin). */
qd_status qd_ckpt_save(const char *dir, const qd_ckpt_state *s, const qd_ckpt_data *d, int keep_last);
/* Loads the latest checkpoint of run dir into *s and d's buffers, after
 * verifying every file against SHA256SUMS. Errors name the file and field:
 * a missing run directory or no checkpoint, a digest mismatch, state.json
 * values out of range, a step other than its directory's, a recipe or seed
 * other than want's (a run keeps them), moments that are not finite or a
 * negative second moment, a blob of another size. */
qd_status qd_ckpt_load(const char *dir, const qd_ckpt_state *want, qd_ckpt_state *s, qd_ckpt_data *d);

/* Checkpoints live in RUN/step_XXXXXXXX (8 decimal digits, zero-padded).
 * Writes "dir/step_%08lld" into buf (QD_ERR_ARG if it does not fit or step < 0). */
qd_status qd_ckpt_path(char *buf, size_t n, const char *dir, int64_t step);
/* Highest step among dir's step_XXXXXXXX directories into *step, or -1 if none
 * (a missing dir counts as none). Names that are not exactly step_ + 8 digits
 * (e.g. a half-written "step_00000010.tmp") are ignored. */
qd_status qd_ckpt_latest(const char *dir, int64_t *step);
/* Keeps the keep_last (>= 1) highest step_XXXXXXXX directories of dir and removes
 * the older ones with their contents; *removed (may be NULL) gets their count. */
qd_status qd_ckpt_rotate(const char *dir, int keep_last, int *removed);

#endif
