/* HTTP(S) downloads for benchmark data: redirects, timeouts, retries with
 * exponential backoff, atomic writes, sha256 checks, and rejection of
 * Git-LFS pointers and HTML error pages served in place of data. */
#ifndef QD_BENCH_FETCH_H
#define QD_BENCH_FETCH_H
#include <stddef.h>
#include <stdint.h>
#include "quant/status.h"

typedef struct {
    long connect_timeout_s; /* TCP/TLS connect */
    long low_speed_time_s;  /* abort a transfer slower than low_speed_bytes/s for this long */
    long low_speed_bytes;
    long timeout_s;         /* a whole attempt, connect to last byte (0: no limit) */
    int64_t max_bytes;      /* largest body, counted after content decoding (0: no limit) */
    int max_attempts;       /* retries on 429, 5xx, cut connections and timeouts */
    long backoff_ms;        /* delay before the 2nd attempt; doubled each time */
    long max_backoff_ms;
    int progress;           /* progress bar on stderr, only when stderr is a terminal */
    int offline;            /* never touch the network: cache only */
    int resume;             /* qd_fetch_file: keep an interrupted download in DEST.part and go on
                               from its end (HTTP Range) on the next attempt or run */
} qd_fetch_opts;

/* Defaults (15 s connect, 30 s below 1 KB/s, 30 min an attempt, 256 MiB,
 * 5 attempts from 1 s backoff, progress on); offline from QUADS_OFFLINE=1. */
void qd_fetch_opts_default(qd_fetch_opts *o);

/* Judges a complete download before it may replace the target (a parser, so
 * that nothing unparsable is ever cached); name is for messages. */
typedef qd_status (*qd_fetch_check_fn)(const char *data, size_t len, const char *name, void *ctx);

/* Downloads url into dest (creating its folder) through qd_atomic_write_with:
 * dest is replaced only after every check passed; on any failure dest is
 * untouched and no partial file remains. sha256_pin (64 hex) is checked when
 * not NULL; check (may be NULL) judges the content; sha256_out (may be NULL)
 * receives the digest. Callers sharing a cache hold qd_fetch_lock. */
qd_status qd_fetch_file_checked(const char *url, const char *dest, const char *sha256_pin,
                                const qd_fetch_opts *o, qd_fetch_check_fn check, void *check_ctx,
                                char sha256_out[65]);
qd_status qd_fetch_file(const char *url, const char *dest, const char *sha256_pin,
                        const qd_fetch_opts *o, char sha256_out[65]);

/* Takes the lock of dest's directory (blocking; creates the directory) and,
 * holding it, removes the temp files a killed fetch of dest or of its .sha256
 * left behind: no live writer can own them. Where the filesystem has no
 * flock, nothing is locked or removed. *fd is released by qd_fetch_unlock. */
qd_status qd_fetch_lock(const char *dest, int *fd);
void qd_fetch_unlock(int fd);

/* Replaces every byte outside printable ASCII with '?', in place: text from
 * a server (error messages, parser excerpts of its replies) must not reach a
 * terminal as escape sequences. Returns s. */
char *qd_fetch_sanitize(char *s);

/* Downloads url into a malloc'd buffer (NUL-terminated; *len excludes the NUL). */
qd_status qd_fetch_memory(const char *url, const qd_fetch_opts *o, char **buf, size_t *len);

/* Rejects data that is a Git-LFS pointer or an HTML page; name is for messages. */
qd_status qd_fetch_check_content(const char *name, const char *head, size_t n);

#endif
