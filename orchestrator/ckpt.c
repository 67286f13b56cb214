/* The checkpoint directory helpers of a run (ckpt.h). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "orchestrator/ckpt.h"
#include "quant/fileio.h"

qd_status qd_ckpt_path(char *buf, size_t n, const char *dir, int64_t step)
{
    if (step < 0 || step > 99999999)
        return qd_error(QD_ERR_ARG, "checkpoint step %lld outside [0, 99999999]", (long long)step);
    if (snprintf(buf, n, "%s/step_%08lld", dir, (long long)step) >= (int)n)
        return qd_error(QD_ERR_ARG, "%s: checkpoint path too long", dir);
    return QD_OK;
}

/* The step of a name "step_" + exactly 8 digits, else -1. */
static int64_t step_of_name(const char *name)
{
    if (strncmp(name, "step_", 5) != 0 || strlen(name) != 13)
        return -1;
    int64_t s = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        s = s * 10 + (*p - '0');
    }
    return s;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The steps of dir's checkpoint directories, ascending, malloc'ed into *steps. */
static qd_status list_steps(const char *dir, int64_t **steps, int *count)
{
    *steps = NULL;
    *count = 0;
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? QD_OK : qd_error(QD_ERR_IO, "%s: opendir: %s", dir, strerror(errno));
    int cap = 0;
    qd_status st = QD_OK;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        int64_t s = step_of_name(e->d_name);
        char path[4096];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (s < 0 || lstat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
            continue;
        if (*count == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *grown = realloc(*steps, (size_t)cap * sizeof **steps);
            if (!grown) {
                st = qd_error(QD_ERR_NOMEM, "%s: listing checkpoints", dir);
                break;
            }
            *steps = grown;
        }
        (*steps)[(*count)++] = s;
    }
    closedir(d);
    if (st == QD_OK && *count > 0)
        qsort(*steps, (size_t)*count, sizeof **steps, cmp_i64);
    return st;
}

qd_status qd_ckpt_latest(const char *dir, int64_t *step)
{
    int64_t *steps;
    int n;
    qd_status st = list_steps(dir, &steps, &n);
    *step = (st == QD_OK && n > 0) ? steps[n - 1] : -1;
    free(steps);
    return st;
}

static int remove_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    return remove(path);
}

qd_status qd_ckpt_rotate(const char *dir, int keep_last, int *removed)
{
    if (removed)
        *removed = 0;
    if (keep_last < 1)
        return qd_error(QD_ERR_ARG, "checkpoint.keep_last: %d, must be >= 1", keep_last);
    int64_t *steps;
    int n;
    qd_status st = list_steps(dir, &steps, &n);
    for (int i = 0; st == QD_OK && i < n - keep_last; i++) {
        char path[4096];
        st = qd_ckpt_path(path, sizeof path, dir, steps[i]);
        if (st == QD_OK && nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
            st = qd_error(QD_ERR_IO, "%s: remove: %s", path, strerror(errno));
        if (st == QD_OK && removed)
            (*removed)++;
    }
    free(steps);
    return st == QD_OK && n > keep_last ? qd_fsync_dir(dir) : st;
}
