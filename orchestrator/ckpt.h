/* Checkpoint-directory bookkeeping for a run directory: naming, finding the
 * latest, rotating old ones. The crash-safe writes of their files are
 * quant/fileio.h's. */
#ifndef QD_CKPT_H
#define QD_CKPT_H
#include <stddef.h>
#include <stdint.h>
#include "quant/status.h"

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
