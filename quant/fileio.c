/* Atomic file replacement, whole-file reads and directory helpers (fileio.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "quant/fileio.h"

char *qd_path_dir(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return strdup(".");
    return strndup(path, (size_t)(slash - path) + (slash == path));
}

const char *qd_path_base(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

int qd_str_ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

qd_status qd_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return qd_error(QD_ERR_IO, "%s: open directory: %s", dir, strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    /* Some filesystems refuse fsync on directories: nothing to make durable then. */
    if (rc != 0 && err != EINVAL && err != ENOTSUP)
        return qd_error(QD_ERR_IO, "%s: fsync directory: %s", dir, strerror(err));
    return QD_OK;
}

/* Runs fill on the open temp file, then makes its content durable and closes
 * it (f is closed on return whatever happened). */
static qd_status fill_and_close(FILE *f, const char *tmp, const char *path, qd_fill_fn fill, void *ctx)
{
    qd_status st = fill(f, path, ctx);
    /* A fill that ignored a failed fwrite leaves the error flag set. */
    if (st == QD_OK && (fflush(f) != 0 || ferror(f)))
        st = qd_error(QD_ERR_IO, "%s: write: %s", tmp, strerror(errno));
    if (st == QD_OK && fsync(fileno(f)) != 0)
        st = qd_error(QD_ERR_IO, "%s: fsync: %s", tmp, strerror(errno));
    /* mkstemp makes 0600; what we write (configs, checkpoints, data) is meant to be shared. */
    if (st == QD_OK && fchmod(fileno(f), 0644) != 0)
        st = qd_error(QD_ERR_IO, "%s: chmod: %s", tmp, strerror(errno));
    if (fclose(f) != 0 && st == QD_OK)
        st = qd_error(QD_ERR_IO, "%s: close: %s", tmp, strerror(errno));
    return st;
}

/* Renames the finished temp file over path (removing it if that fails) and
 * fsyncs the directory. */
static qd_status commit(const char *tmp, const char *path)
{
    if (rename(tmp, path) != 0) {
        qd_status st = qd_error(QD_ERR_IO, "%s: rename to %s: %s", tmp, path, strerror(errno));
        unlink(tmp);
        return st;
    }
    char *dir = qd_path_dir(path);
    qd_status st = dir ? qd_fsync_dir(dir) : qd_error(QD_ERR_NOMEM, "%s: out of memory", path);
    free(dir);
    return st;
}

qd_status qd_atomic_write_with(const char *path, qd_fill_fn fill, void *ctx)
{
    char *tmp = NULL;
    if (asprintf(&tmp, "%s.tmp.XXXXXX", path) < 0)
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        qd_status st = qd_error(QD_ERR_IO, "%s: create temp file: %s", path, strerror(errno));
        free(tmp);
        return st;
    }
    FILE *f = fdopen(fd, "wb");
    qd_status st = f ? fill_and_close(f, tmp, path, fill, ctx)
                     : qd_error(QD_ERR_IO, "%s: fdopen: %s", tmp, strerror(errno));
    if (!f)
        close(fd);
    if (st == QD_OK)
        st = commit(tmp, path);
    else
        unlink(tmp);
    free(tmp);
    return st;
}

typedef struct {
    const void *buf;
    size_t n;
} buffer;

static qd_status fill_buffer(FILE *f, const char *path, void *ctx)
{
    const buffer *b = ctx;
    if (b->n > 0 && fwrite(b->buf, 1, b->n, f) != b->n)
        return qd_error(QD_ERR_IO, "%s: write: %s", path, strerror(errno));
    return QD_OK;
}

qd_status qd_atomic_write(const char *path, const void *buf, size_t n)
{
    buffer b = {buf, n};
    return qd_atomic_write_with(path, fill_buffer, &b);
}

qd_status qd_fopen_regular(const char *path, FILE **f)
{
    *f = NULL;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return qd_error(QD_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return qd_error(QD_ERR_IO, "%s: not a regular file", path);
    }
    /* regular files ignore O_NONBLOCK, but stdio should not see it */
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0 || !(*f = fdopen(fd, "rb"))) {
        qd_status st2 = qd_error(QD_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
        return st2;
    }
    return QD_OK;
}

qd_status qd_read_file(const char *path, char **text, size_t *len)
{
    *text = NULL;
    *len = 0;
    FILE *f;
    qd_status st = qd_fopen_regular(path, &f);
    if (st)
        return st;
    size_t n = 0, cap = 1 << 16;
    char *buf = malloc(cap);
    /* Always one byte spare for the NUL. */
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
        n += got;
        if (n + 1 == cap) {
            char *grown = realloc(buf, cap *= 2);
            if (!grown)
                free(buf);
            buf = grown;
        }
    }
    int err = ferror(f);
    fclose(f);
    if (!buf)
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", path);
    if (err) {
        free(buf);
        return qd_error(QD_ERR_IO, "%s: read error", path);
    }
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return QD_OK;
}

qd_status qd_mkdirs(const char *path)
{
    if (*path == '\0')
        return qd_error(QD_ERR_ARG, "mkdir: empty path");
    char *buf = strdup(path);
    if (!buf)
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", path);
    qd_status st = QD_OK;
    /* Each prefix ending at a '/' (and the whole path) in turn. */
    for (char *p = buf + 1; st == QD_OK; p++) {
        char c = *p;
        if (c != '/' && c != '\0')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            st = qd_error(QD_ERR_IO, "%s: mkdir: %s", buf, strerror(errno));
        *p = c;
        if (c == '\0')
            break;
    }
    free(buf);
    struct stat sb;
    if (st == QD_OK && (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)))
        st = qd_error(QD_ERR_IO, "%s: not a directory", path);
    return st;
}

qd_status qd_mkdirs_parent(const char *path)
{
    char *dir = qd_path_dir(path);
    qd_status st = dir ? qd_mkdirs(dir) : qd_error(QD_ERR_NOMEM, "%s: out of memory", path);
    free(dir);
    return st;
}
