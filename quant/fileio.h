/* Crash-safe file writes, whole-file reads and path helpers: the one
 * implementation every module uses. It lives in quant/ beside status.h because
 * quant/ is the bottom layer that every other module already depends on.
 *
 * A reader sees either the old file or the whole new one, never a torn one:
 * the content goes to a temp file in the target's directory (same filesystem,
 * so rename is atomic), which is flushed, fsynced, made 0644, closed and
 * renamed over the target; then the directory is fsynced so the rename itself
 * survives a crash. On any failure the temp file is removed and the target is
 * left as it was. Missing parent directories are an error (QD_ERR_IO), not
 * created: call qd_mkdirs_parent first where that is wanted. */
#ifndef QD_FILEIO_H
#define QD_FILEIO_H
#include <stddef.h>
#include <stdio.h>
#include "quant/status.h"

/* Writes the content to f (open for writing at offset 0; fill may truncate and
 * rewrite it, e.g. to retry a download). Returns QD_OK or an error with its
 * message set; path is the target, for messages. Write errors that fill does
 * not report itself are caught afterwards from ferror(f). */
typedef qd_status (*qd_fill_fn)(FILE *f, const char *path, void *ctx);

/* Replaces path with what fill writes (streaming: nothing is buffered here). */
qd_status qd_atomic_write_with(const char *path, qd_fill_fn fill, void *ctx);
/* Replaces path with the n bytes of buf. */
qd_status qd_atomic_write(const char *path, const void *buf, size_t n);

/* Opens path for reading ("rb") when it is a regular file; anything else (a
 * FIFO, a device, a directory) is refused with QD_ERR_IO naming path, without
 * blocking: a FIFO with no writer would hang open(2) and every read. */
qd_status qd_fopen_regular(const char *path, FILE **f);

/* Reads the whole file (a regular file, as qd_fopen_regular) into a malloc'ed buffer *text with a NUL after the last
 * byte (*len excludes it; the file may itself hold NULs). */
qd_status qd_read_file(const char *path, char **text, size_t *len);

/* The directory part of path, malloc'ed: "." for a bare name, "/" for "/name";
 * NULL when out of memory. */
char *qd_path_dir(const char *path);
/* The last component of path (path itself when it has no '/'). */
const char *qd_path_base(const char *path);
/* 1 when s ends with suffix (every string ends with ""), else 0. */
int qd_str_ends_with(const char *s, const char *suffix);

/* fsync of a directory, so that entries created or renamed in it are durable
 * (a filesystem that cannot fsync directories counts as success). */
qd_status qd_fsync_dir(const char *dir);
/* mkdir -p (mode 0755); an existing directory is fine. */
qd_status qd_mkdirs(const char *path);
/* qd_mkdirs of the directory part of path ("." for a bare name). */
qd_status qd_mkdirs_parent(const char *path);

#endif
