/* Crash-safe file writes and checkpoint-directory bookkeeping for a run
 * directory. A reader sees either the old file or the whole new one, never a
 * torn one: write a temp file in the same directory, fsync it, rename it over
 * the target, fsync the directory (so the rename itself survives a crash). */
#ifndef QD_ATOMIC_H
#define QD_ATOMIC_H
#include <stddef.h>
#include <stdint.h>
#include "quant/status.h"

/* Replaces path with the n bytes of buf (mode 0644). On failure path is left
 * as it was and no temp file remains. */
qd_status qd_atomic_write(const char *path, const void *buf, size_t n);
/* fsync of a directory, so that entries created or renamed in it are durable. */
qd_status qd_fsync_dir(const char *dir);
/* mkdir -p (mode 0755); an existing directory is fine. */
qd_status qd_mkdirs(const char *path);

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
