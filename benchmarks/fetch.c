/* libcurl downloads with retries, atomic writes (quant/fileio.h) and content checks (fetch.h). */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <curl/curl.h>
#include <jansson.h>
#include "config.h"
#include "benchmarks/fetch.h"
#include "benchmarks/sha256.h"
#include "quant/fileio.h"

/* Where the bytes of one transfer go, and what we learn on the way. */
typedef struct {
    FILE *f;                 /* file sink, or NULL for memory */
    char *buf;               /* memory sink */
    size_t len, cap;
    int64_t max_bytes;       /* 0: no limit */
    int too_big;             /* the body went past max_bytes */
    qd_sha256_ctx sha;
    char head[512];          /* first bytes, for the content checks */
    size_t nhead;
    char server_msg[256];    /* the hub's X-Error-Message header, if any */
    long retry_after_s;      /* Retry-After (seconds form) of the last response, -1 if none */
    const char *label;       /* progress bar label */
    int show_progress;
    int drawn;               /* a progress line is on screen */
    curl_off_t last_drawn;
    int resume;              /* f is a .part file that attempts extend (HTTP Range) */
    curl_off_t base;         /* bytes the file held when this attempt started */
    long status;             /* HTTP status of the response being received */
} sink;

/* Nothing received yet. */
static void sink_clear(sink *s)
{
    s->len = 0;
    s->too_big = 0;
    s->nhead = 0;
    s->server_msg[0] = '\0';
    s->retry_after_s = -1;
    qd_sha256_init(&s->sha);
}

/* A resumed transfer starts from what f already holds: its length, digest
 * and first bytes. */
static qd_status sink_resume(sink *s)
{
    sink_clear(s);
    char buf[1 << 16];
    size_t n;
    if (fflush(s->f) || fseek(s->f, 0, SEEK_SET))
        return qd_error(QD_ERR_IO, "%s: cannot read the partial download: %s", s->label, strerror(errno));
    while ((n = fread(buf, 1, sizeof buf, s->f)) > 0) {
        size_t keep = sizeof s->head - s->nhead < n ? sizeof s->head - s->nhead : n;
        memcpy(s->head + s->nhead, buf, keep);
        s->nhead += keep;
        qd_sha256_update(&s->sha, buf, n);
        s->len += n;
    }
    if (ferror(s->f) || fseek(s->f, 0, SEEK_END))
        return qd_error(QD_ERR_IO, "%s: cannot read the partial download: %s", s->label, strerror(errno));
    return QD_OK;
}

static qd_status sink_reset(sink *s)
{
    if (s->resume)
        return sink_resume(s);
    sink_clear(s);
    if (s->f && (fflush(s->f) || ftruncate(fileno(s->f), 0) || fseek(s->f, 0, SEEK_SET)))
        return qd_error(QD_ERR_IO, "%s: cannot truncate temporary file: %s", s->label, strerror(errno));
    return QD_OK;
}

static size_t on_data(char *p, size_t size, size_t nmemb, void *userp)
{
    sink *s = userp;
    size_t n = size * nmemb;
    if (s->resume && s->status != 200 && s->status != 206)
        return n; /* an error page must not be appended to a partial download */
    /* Counted here, after decoding: a reply without a length (chunked) or a
     * small compressed one (a gzip bomb) is stopped as soon as it is too big. */
    if (s->max_bytes > 0 && (int64_t)(s->len + n) > s->max_bytes) {
        s->too_big = 1;
        return 0;
    }
    if (s->f) {
        if (fwrite(p, 1, n, s->f) != n)
            return 0;
    } else {
        if (s->len + n + 1 > s->cap) {
            size_t nc = s->cap ? s->cap : 1 << 16;
            while (nc < s->len + n + 1)
                nc *= 2;
            char *nb = realloc(s->buf, nc);
            if (!nb)
                return 0;
            s->buf = nb;
            s->cap = nc;
        }
        memcpy(s->buf + s->len, p, n);
        s->buf[s->len + n] = '\0';
    }
    s->len += n;
    size_t keep = sizeof s->head - s->nhead < n ? sizeof s->head - s->nhead : n;
    memcpy(s->head + s->nhead, p, keep);
    s->nhead += keep;
    qd_sha256_update(&s->sha, p, n);
    return n;
}

/* Keeps the hub's X-Error-Message ("Entry not found", ...) of the last response. */
static size_t on_header(char *p, size_t size, size_t nmemb, void *userp)
{
    sink *s = userp;
    size_t n = size * nmemb;
    static const char key[] = "x-error-message:", retry[] = "retry-after:";
    if (n >= 5 && !strncmp(p, "HTTP/", 5)) {
        s->server_msg[0] = '\0';
        s->retry_after_s = -1;
        const char *sp = memchr(p, ' ', n);
        s->status = sp ? strtol(sp + 1, NULL, 10) : 0;
    }
    if (n > sizeof retry - 1 && !strncasecmp(p, retry, sizeof retry - 1)) {
        char *end;
        long v = strtol(p + sizeof retry - 1, &end, 10);
        if (end != p + sizeof retry - 1 && v >= 0)
            s->retry_after_s = v;
    }
    if (n > sizeof key - 1 && !strncasecmp(p, key, sizeof key - 1)) {
        const char *v = p + sizeof key - 1;
        size_t m = n - (sizeof key - 1);
        while (m && isspace((unsigned char)*v))
            v++, m--;
        while (m && isspace((unsigned char)v[m - 1]))
            m--;
        if (m >= sizeof s->server_msg)
            m = sizeof s->server_msg - 1;
        memcpy(s->server_msg, v, m);
        s->server_msg[m] = '\0';
        qd_fetch_sanitize(s->server_msg);
    }
    return n;
}

static int on_progress(void *userp, curl_off_t total, curl_off_t now, curl_off_t ut, curl_off_t un)
{
    sink *s = userp;
    if (!s->show_progress || now == 0 || now - s->last_drawn < (total > 0 ? total / 100 + 1 : 1 << 18))
        return 0;
    s->last_drawn = now;
    s->drawn = 1;
    now += s->base; /* a resumed download counts what it already had */
    total += total > 0 ? s->base : 0;
    if (total > 0) {
        int width = 30, done = (int)(width * now / total);
        fprintf(stderr, "\r%-28.28s [%.*s%*s] %3d%% %.1f/%.1f MB", s->label, done,
                "##############################", width - done, "", (int)(100 * now / total),
                now / 1e6, total / 1e6);
    } else {
        fprintf(stderr, "\r%-28.28s %.1f MB", s->label, now / 1e6);
    }
    return 0;
}

/* The rows API explains failures in a JSON body {"error": "..."}: keep it
 * when the hub sent no X-Error-Message. */
static void body_error(sink *s)
{
    if (s->f || !s->buf || s->server_msg[0])
        return;
    json_t *j = json_loadb(s->buf, s->len, 0, NULL);
    const char *e = json_string_value(json_object_get(j, "error"));
    if (e)
        qd_fetch_sanitize((snprintf(s->server_msg, sizeof s->server_msg, "%s", e), s->server_msg));
    json_decref(j);
}

static int retryable(CURLcode rc, long code)
{
    if (rc == CURLE_OK)
        return code == 429 || code >= 500;
    switch (rc) {
    case CURLE_COULDNT_CONNECT: case CURLE_PARTIAL_FILE: case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR: case CURLE_GOT_NOTHING: case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SSL_CONNECT_ERROR: case CURLE_HTTP2: case CURLE_HTTP2_STREAM:
        return 1;
    default:
        return 0;
    }
}

static const char *http_reason(long code)
{
    if (code == 404) return "not found";
    if (code == 401 || code == 403) return "access denied (gated or private dataset?)";
    if (code == 429) return "rate limited";
    if (code >= 500) return "server error";
    return "unexpected status";
}

/* One line saying what went wrong with an attempt. */
static void describe(char *out, size_t n, CURL *h, CURLcode rc, long code, const sink *s, const char *errbuf)
{
    curl_off_t expected = -1;
    curl_easy_getinfo(h, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &expected);
    const char *detail = errbuf[0] ? errbuf : curl_easy_strerror(rc);
    if (s->too_big || rc == CURLE_FILESIZE_EXCEEDED)
        snprintf(out, n, "the reply is larger than the limit of %lld bytes%s", (long long)s->max_bytes,
                 s->too_big ? " (counted after decoding)" : " (by its Content-Length)");
    else if (rc == CURLE_OK)
        snprintf(out, n, "HTTP %ld (%s)%s%s", code, http_reason(code), s->server_msg[0] ? ": " : "", s->server_msg);
    else if (rc == CURLE_PARTIAL_FILE)
        snprintf(out, n, "connection cut mid-body after %zu of %lld bytes", s->len, (long long)expected);
    else if (rc == CURLE_RECV_ERROR || rc == CURLE_SEND_ERROR || rc == CURLE_GOT_NOTHING)
        snprintf(out, n, "connection broken after %zu bytes (%s)", s->len, detail);
    else if (rc == CURLE_OPERATION_TIMEDOUT)
        snprintf(out, n, "timed out after %zu bytes (%s)", s->len, detail);
    else if (rc == CURLE_COULDNT_CONNECT)
        snprintf(out, n, "cannot connect (%s)", detail);
    else
        snprintf(out, n, "%s", detail);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) && errno == EINTR)
        ;
}

static void setup(CURL *h, const char *url, const qd_fetch_opts *o, sink *s, char *errbuf)
{
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(h, CURLOPT_MAXREDIRS, 10L);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#endif
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, o->connect_timeout_s);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, o->low_speed_bytes);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, o->low_speed_time_s);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, o->timeout_s > 0 ? o->timeout_s : 0L);
    if (o->max_bytes > 0)
        curl_easy_setopt(h, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)o->max_bytes);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "quads/" PACKAGE_VERSION);
    curl_easy_setopt(h, CURLOPT_ACCEPT_ENCODING, "");
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, s);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, s);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, s->show_progress ? 0L : 1L);
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void init_curl(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

static qd_status offline_error(const char *url)
{
    return qd_error(QD_ERR_NET, "%s: offline (QUADS_OFFLINE=1 or --offline) and not in the cache", url);
}

/* Runs the transfer until it succeeds (HTTP 200), fails for good, or runs out of attempts. */
static qd_status transfer(const char *url, const qd_fetch_opts *o, sink *s)
{
    if (o->offline)
        return offline_error(url);
    pthread_once(&curl_once, init_curl);
    CURL *h = curl_easy_init();
    if (!h)
        return qd_error(QD_ERR_NOMEM, "%s: curl_easy_init failed", url);
    char errbuf[CURL_ERROR_SIZE], what[512];
    s->max_bytes = o->max_bytes;
    setup(h, url, o, s, errbuf);
    qd_status st = QD_ERR_NET;
    long delay = o->backoff_ms;
    int attempts = o->max_attempts > 0 ? o->max_attempts : 1;
    for (int a = 1; a <= attempts; a++) {
        errbuf[0] = '\0';
        if ((st = sink_reset(s)) != QD_OK)
            break;
        s->status = 0;
        s->base = s->resume ? (curl_off_t)s->len : 0;
        if (s->resume) /* Range: bytes=LEN- (none when LEN is 0) */
            curl_easy_setopt(h, CURLOPT_RESUME_FROM_LARGE, (curl_off_t)s->len);
        CURLcode rc = curl_easy_perform(h);
        long code = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
        if (s->drawn)
            fputc('\n', stderr);
        s->drawn = 0;
        s->last_drawn = 0;
        /* 206: the rest of a resumed file; 200 with nothing after a complete one */
        if (rc == CURLE_OK && (code == 200 || (code == 206 && s->resume))) {
            st = QD_OK;
            break;
        }
        if (s->resume && (rc == CURLE_RANGE_ERROR || code == 416)) {
            /* the server cannot resume from here: start the file over */
            if (fflush(s->f) || ftruncate(fileno(s->f), 0)) {
                st = qd_error(QD_ERR_IO, "%s: cannot truncate the partial download: %s", s->label, strerror(errno));
                break;
            }
            st = qd_error(QD_ERR_NET, "%s: the server does not resume this download (gave up after %d attempts)", url, a);
            continue;
        }
        if (rc == CURLE_OK)
            body_error(s);
        describe(what, sizeof what, h, rc, code, s, errbuf);
        if (!retryable(rc, code) || s->too_big) {
            st = qd_error(QD_ERR_NET, "%s: %s", url, what);
            break;
        }
        st = qd_error(QD_ERR_NET, "%s: %s (gave up after %d attempts)", url, what, a);
        if (a < attempts) {
            /* A server that says when to come back (429/503) is obeyed, up to a minute. */
            long wait = s->retry_after_s > 0 ? (s->retry_after_s < 60 ? s->retry_after_s : 60) * 1000 : 0;
            sleep_ms(wait > delay ? wait : delay);
            delay = delay * 2 < o->max_backoff_ms ? delay * 2 : o->max_backoff_ms;
        }
    }
    curl_easy_cleanup(h);
    return st;
}

void qd_fetch_opts_default(qd_fetch_opts *o)
{
    o->connect_timeout_s = 15;
    o->low_speed_time_s = 30;
    o->low_speed_bytes = 1024; /* a drip of a few bytes a second is a stalled server */
    o->timeout_s = 1800;
    o->max_bytes = (int64_t)256 << 20;
    o->max_attempts = 5;
    o->backoff_ms = 1000;
    o->max_backoff_ms = 30000;
    o->progress = 1;
    o->resume = 0;
    const char *off = getenv("QUADS_OFFLINE");
    o->offline = off && *off && strcmp(off, "0") != 0;
}

qd_status qd_fetch_check_content(const char *name, const char *head, size_t n)
{
    static const char lfs[] = "version https://git-lfs.github.com/spec/";
    if (n >= sizeof lfs - 1 && !memcmp(head, lfs, sizeof lfs - 1))
        return qd_error(QD_ERR_FORMAT, "%s: got a Git-LFS pointer file, not the data "
                        "(the server sent the pointer instead of resolving it)", name);
    size_t i = 0;
    if (n >= 3 && !memcmp(head, "\xef\xbb\xbf", 3))
        i = 3;
    while (i < n && isspace((unsigned char)head[i]))
        i++;
    if ((n - i >= 14 && !strncasecmp(head + i, "<!doctype html", 14)) ||
        (n - i >= 5 && !strncasecmp(head + i, "<html", 5)))
        return qd_error(QD_ERR_FORMAT, "%s: got an HTML page, not data (an error or login page?)", name);
    return QD_OK;
}

/* One download into the temp file of qd_atomic_write_with. */
typedef struct {
    const char *url, *sha256_pin;
    const qd_fetch_opts *o;
    sink *s;
    qd_fetch_check_fn check;
    void *check_ctx;
    int transferred;         /* the transfer itself succeeded (any failure is the content's) */
    char hex[65];
} download;

/* Reads the finished temp file back for the caller's check. */
static qd_status check_download(FILE *f, download *d)
{
    char *buf = malloc(d->s->len + 1);
    if (!buf)
        return qd_error(QD_ERR_NOMEM, "%s: out of memory checking %zu bytes", d->url, d->s->len);
    qd_status st = QD_OK;
    if (fflush(f) || pread(fileno(f), buf, d->s->len, 0) != (ssize_t)d->s->len)
        st = qd_error(QD_ERR_IO, "%s: cannot read back the download: %s", d->url, strerror(errno));
    buf[d->s->len] = '\0';
    if (st == QD_OK)
        st = d->check(buf, d->s->len, d->url, d->check_ctx);
    free(buf);
    return st;
}

/* Fills the temp file with the transfer (sink_reset truncates it before each
 * attempt) and fails unless every content check passes, so a bad download
 * never replaces the target. */
static qd_status fill_download(FILE *f, const char *path, void *ctx)
{
    download *d = ctx;
    d->s->f = f;
    qd_status st = transfer(d->url, d->o, d->s);
    d->transferred = st == QD_OK;
    if (st == QD_OK)
        st = qd_fetch_check_content(d->url, d->s->head, d->s->nhead);
    if (st != QD_OK)
        return st;
    uint8_t digest[32];
    qd_sha256_final(&d->s->sha, digest);
    qd_sha256_to_hex(digest, d->hex);
    if (d->sha256_pin && strcasecmp(d->hex, d->sha256_pin))
        return qd_error(QD_ERR_FORMAT, "%s: sha256 mismatch: got %s, expected %s "
                        "(corrupt download, or the file changed upstream)", d->url, d->hex, d->sha256_pin);
    return d->check ? check_download(f, d) : QD_OK;
}

/* DEST.part, kept across attempts and runs, becomes dest once every check
 * passed (made durable first, as quant/fileio.c does); a part whose content
 * fails a check is deleted, one cut short by the network is kept. */
static qd_status fetch_resumable(const char *dest, download *d)
{
    char part[4200];
    snprintf(part, sizeof part, "%s.part", dest);
    FILE *f = fopen(part, "a+b");
    if (!f)
        return qd_error(QD_ERR_IO, "%s: %s", part, strerror(errno));
    d->s->resume = 1;
    qd_status st = fill_download(f, part, d);
    int keep = st != QD_OK && !d->transferred && !d->s->too_big;
    if (st == QD_OK && (fflush(f) || fsync(fileno(f)) || fchmod(fileno(f), 0644)))
        st = qd_error(QD_ERR_IO, "%s: %s", part, strerror(errno));
    if (fclose(f) && st == QD_OK)
        st = qd_error(QD_ERR_IO, "%s: close: %s", part, strerror(errno));
    if (st == QD_OK && rename(part, dest))
        st = qd_error(QD_ERR_IO, "%s: rename to %s: %s", part, dest, strerror(errno));
    char *dir = qd_path_dir(dest);
    if (st == QD_OK && dir)
        st = qd_fsync_dir(dir);
    free(dir);
    if (st != QD_OK && !keep)
        unlink(part);
    return st;
}

qd_status qd_fetch_file_checked(const char *url, const char *dest, const char *sha256_pin,
                                const qd_fetch_opts *o, qd_fetch_check_fn check, void *check_ctx,
                                char sha256_out[65])
{
    if (o->offline)
        return offline_error(url);
    qd_status st = qd_mkdirs_parent(dest);
    if (st != QD_OK)
        return st;
    sink s = {.label = qd_path_base(dest), .show_progress = o->progress && isatty(STDERR_FILENO)};
    download d = {.url = url, .sha256_pin = sha256_pin, .o = o, .s = &s, .check = check, .check_ctx = check_ctx};
    st = o->resume ? fetch_resumable(dest, &d) : qd_atomic_write_with(dest, fill_download, &d);
    if (st == QD_OK && sha256_out)
        memcpy(sha256_out, d.hex, 65);
    return st;
}

qd_status qd_fetch_file(const char *url, const char *dest, const char *sha256_pin,
                        const qd_fetch_opts *o, char sha256_out[65])
{
    return qd_fetch_file_checked(url, dest, sha256_pin, o, NULL, NULL, sha256_out);
}

qd_status qd_fetch_memory(const char *url, const qd_fetch_opts *o, char **buf, size_t *len)
{
    sink s = {.label = url, .show_progress = 0};
    *buf = NULL;
    *len = 0;
    qd_status st = transfer(url, o, &s);
    if (st == QD_OK)
        st = qd_fetch_check_content(url, s.head, s.nhead);
    if (st == QD_OK && !s.buf)
        s.buf = calloc(1, 1);
    if (st != QD_OK) {
        free(s.buf);
        return st;
    }
    *buf = s.buf;
    *len = s.len;
    return QD_OK;
}

/* name is PREFIX.tmp.XXXXXX, the temp-file form of quant/fileio.c. */
static int is_temp_of(const char *name, const char *prefix)
{
    size_t n = strlen(prefix);
    return !strncmp(name, prefix, n) && !strncmp(name + n, ".tmp.", 5) && strlen(name + n + 5) == 6;
}

qd_status qd_fetch_lock(const char *dest, int *fd)
{
    *fd = -1;
    qd_status st = qd_mkdirs_parent(dest);
    char *dir = qd_path_dir(dest), side[1024];
    if (st != QD_OK || !dir) {
        free(dir);
        return st != QD_OK ? st : qd_error(QD_ERR_NOMEM, "%s: out of memory", dest);
    }
    int d = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), locked;
    if (d < 0) {
        st = qd_error(QD_ERR_IO, "%s: cannot open the cache directory: %s", dir, strerror(errno));
        free(dir);
        return st;
    }
    while ((locked = !flock(d, LOCK_EX)) == 0 && errno == EINTR)
        ;
    if (!locked) { /* a filesystem without flock: fetch unlocked, and leave temp files be */
        free(dir);
        *fd = d;
        return QD_OK;
    }
    const char *base = qd_path_base(dest);
    snprintf(side, sizeof side, "%s.sha256", base);
    DIR *dh = fdopendir(dup(d));
    for (struct dirent *e; dh && (e = readdir(dh));)
        if (is_temp_of(e->d_name, base) || is_temp_of(e->d_name, side))
            unlinkat(d, e->d_name, 0);
    if (dh)
        closedir(dh);
    free(dir);
    *fd = d;
    return QD_OK;
}

void qd_fetch_unlock(int fd)
{
    if (fd >= 0)
        close(fd); /* closing the last descriptor releases the flock */
}

char *qd_fetch_sanitize(char *s)
{
    for (unsigned char *p = (unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p > 0x7e)
            *p = '?';
    return s;
}
