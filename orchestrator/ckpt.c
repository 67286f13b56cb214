/* The checkpoint files of a run and its checkpoint directories (ckpt.h). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>
#include "orchestrator/ckpt.h"
#include "orchestrator/metrics.h"
#include "benchmarks/sha256.h"
#include "models/checkpoint.h"
#include "quant/fileio.h"

#define ADAM_MAGIC "QDADAMW1"
#define RAC_MAGIC "QDRAC001"
#define PATH_N 4500

/* dir/name into out (PATH_N bytes); run directories are below 4096 bytes
 * (rl.c) and names short, so nothing is cut. */
static void file_in(char *out, const char *dir, const char *name)
{
    snprintf(out, PATH_N, "%.4200s/%.255s", dir, name);
}

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

/* ---- blobs: 8 magic bytes, the payload length (u64), the payload */

static qd_status write_blob(const char *path, const char *magic, const void *a, size_t na, const void *b, size_t nb)
{
    size_t n = 16 + na + nb;
    char *buf = malloc(n);
    if (!buf)
        return qd_error(QD_ERR_NOMEM, "%s", path);
    uint64_t len = na + nb;
    memcpy(buf, magic, 8);
    memcpy(buf + 8, &len, 8);
    if (na)
        memcpy(buf + 16, a, na);
    if (nb)
        memcpy(buf + 16 + na, b, nb);
    qd_status st = qd_atomic_write(path, buf, n);
    free(buf);
    return st;
}

/* The payload of a blob file into a (na bytes) then b (nb), checked against
 * magic and size. */
static qd_status read_blob(const char *path, const char *magic, void *a, size_t na, void *b, size_t nb)
{
    char *text;
    size_t len, n = na + nb;
    qd_status st = qd_read_file(path, &text, &len);
    if (st)
        return st;
    uint64_t want = 0;
    if (len >= 16)
        memcpy(&want, text + 8, 8);
    if (len < 16 || memcmp(text, magic, 8) != 0 || want != n || len != 16 + n)
        st = qd_error(QD_ERR_FORMAT, "%s: not a %.8s file of %zu bytes for this model and recipe", path, magic, n);
    if (!st && na)
        memcpy(a, text + 16, na);
    if (!st && nb)
        memcpy(b, text + 16 + na, nb);
    free(text);
    return st;
}

/* AdamW moments must be finite and the second moment non-negative: anything
 * else turns into NaN weights at the next update, far from its cause. */
static qd_status check_moments(const char *path, const float *m, const float *v, size_t nf)
{
    for (size_t i = 0; i < nf; i++) {
        if (!isfinite(m[i]))
            return qd_error(QD_ERR_NONFINITE, "%s: first moment m[%zu] is %g", path, i, m[i]);
        if (!isfinite(v[i]) || v[i] < 0)
            return qd_error(QD_ERR_NONFINITE, "%s: second moment v[%zu] is %g (must be finite and >= 0)", path, i,
                            v[i]);
    }
    return QD_OK;
}

/* ---- state.json */

static qd_status write_state(const char *path, const qd_ckpt_state *s)
{
    json_t *j = json_pack("{s:I, s:I, s:I, s:I, s:s}", "step", (json_int_t)s->step, "data_pos",
                          (json_int_t)s->data_pos, "optimizer_step", (json_int_t)s->optimizer_step, "seed",
                          (json_int_t)s->seed, "recipe", s->recipe);
    char *text = j ? json_dumps(j, JSON_INDENT(2)) : NULL;
    json_decref(j);
    if (!text)
        return qd_error(QD_ERR_NOMEM, "%s", path);
    qd_status st = qd_atomic_write(path, text, strlen(text));
    free(text);
    return st;
}

/* One integer member of state.json within [0, max]. */
static qd_status state_int(const char *path, const json_t *j, const char *key, int64_t max, int64_t *out)
{
    const json_t *v = json_object_get(j, key);
    if (!json_is_integer(v))
        return qd_error(QD_ERR_FORMAT, "%s: %s: expected an integer", path, key);
    json_int_t x = json_integer_value(v);
    if (x < 0 || x > max)
        return qd_error(QD_ERR_FORMAT, "%s: %s: %lld is out of range [0, %lld]", path, key, (long long)x,
                        (long long)max);
    *out = x;
    return QD_OK;
}

static qd_status read_state(const char *path, qd_ckpt_state *s)
{
    json_t *j;
    QD_TRY(qd_json_load_regular(path, JSON_REJECT_DUPLICATES, &j));
    int64_t seed = 0;
    qd_status st = json_is_object(j) ? QD_OK : qd_error(QD_ERR_FORMAT, "%s: expected a JSON object", path);
    if (!st)
        st = state_int(path, j, "step", QD_CKPT_MAX_STEP, &s->step);
    if (!st)
        st = state_int(path, j, "data_pos", QD_CKPT_MAX_DATA_POS, &s->data_pos);
    if (!st)
        st = state_int(path, j, "optimizer_step", QD_CKPT_MAX_OPT_STEP, &s->optimizer_step);
    if (!st)
        st = state_int(path, j, "seed", INT64_MAX, &seed);
    const char *recipe = json_string_value(json_object_get(j, "recipe"));
    if (!st && (!recipe || strlen(recipe) >= sizeof s->recipe))
        st = qd_error(QD_ERR_FORMAT, "%s: recipe: expected a recipe name", path);
    if (!st) {
        s->seed = (uint64_t)seed;
        snprintf(s->recipe, sizeof s->recipe, "%s", recipe);
    }
    json_decref(j);
    return st;
}

/* ---- SHA256SUMS */

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The regular files of a flat directory but SHA256SUMS, sorted (malloc'ed names). */
static qd_status list_files(const char *dir, char ***names, int *n)
{
    *names = NULL, *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return qd_error(QD_ERR_IO, "%s: opendir: %s", dir, strerror(errno));
    qd_status st = QD_OK;
    for (struct dirent *e; !st && (e = readdir(d));) {
        char p[PATH_N];
        struct stat sb;
        file_in(p, dir, e->d_name);
        if (!strcmp(e->d_name, QD_CKPT_SUMS) || lstat(p, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue;
        char **grown = realloc(*names, sizeof(char *) * (size_t)(*n + 1));
        char *name = strdup(e->d_name);
        if (grown)
            *names = grown;
        if (!grown || !name) {
            free(name);
            st = qd_error(QD_ERR_NOMEM, "%s", dir);
        } else
            (*names)[(*n)++] = name;
    }
    closedir(d);
    if (!st && *n > 1)
        qsort(*names, (size_t)*n, sizeof(char *), cmp_str);
    return st;
}

/* dir/SHA256SUMS: "HEX  NAME" a line for every other file of dir. */
static qd_status write_sums(const char *dir)
{
    char **names, p[PATH_N], hex[65];
    int n;
    qd_status st = list_files(dir, &names, &n);
    size_t cap = (size_t)n * (64 + 2 + 256 + 1) + 1, len = 0;
    char *text = st ? NULL : malloc(cap);
    if (!st && !text)
        st = qd_error(QD_ERR_NOMEM, "%s", dir);
    for (int i = 0; i < n && !st; i++) {
        file_in(p, dir, names[i]);
        st = qd_sha256_file(p, hex);
        if (!st)
            len += (size_t)snprintf(text + len, cap - len, "%s  %.256s\n", hex, names[i]);
    }
    file_in(p, dir, QD_CKPT_SUMS);
    if (!st)
        st = qd_atomic_write(p, text, len);
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names), free(text);
    return st;
}

/* Is c a lowercase hex digit? */
static int is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

/* Checks every file SHA256SUMS lists, and that it lists each of need. */
static qd_status verify_sums(const char *dir, const char *const *need, int n_need)
{
    char p[PATH_N], *text;
    size_t len;
    file_in(p, dir, QD_CKPT_SUMS);
    if (access(p, F_OK) != 0)
        return qd_error(QD_ERR_FORMAT, "%s: missing: a checkpoint without digests is not resumed (it was "
                                       "not written whole, or by a quads without them)", p);
    qd_status st = qd_read_file(p, &text, &len);
    if (st)
        return st;
    int found = 0, line = 0;
    for (char *s = text, *nl; !st && s < text + len; s = nl + 1) {
        line++;
        nl = memchr(s, '\n', (size_t)(text + len - s));
        if (!nl) {
            st = qd_error(QD_ERR_FORMAT, "%s:%d: no newline at the end", p, line);
            break;
        }
        *nl = '\0';
        const char *name = s + 66;
        bool ok = nl - s > 66 && s[64] == ' ' && s[65] == ' ' && !strchr(name, '/') && strcmp(name, ".") &&
                  strcmp(name, "..");
        for (int i = 0; ok && i < 64; i++)
            ok = is_hex(s[i]);
        if (!ok) {
            st = qd_error(QD_ERR_FORMAT, "%s:%d: expected 64 hex digits, two spaces and a file name", p, line);
            break;
        }
        char f[PATH_N], hex[65];
        struct stat sb;
        file_in(f, dir, name);
        bool missing = lstat(f, &sb) != 0;
        if (missing || !S_ISREG(sb.st_mode)) { /* a FIFO would block the read */
            st = qd_error(QD_ERR_FORMAT, "%s: listed in %s but %s", f, QD_CKPT_SUMS,
                          missing ? "missing" : "not a regular file");
            break;
        }
        st = qd_sha256_file(f, hex);
        if (!st && memcmp(hex, s, 64) != 0)
            st = qd_error(QD_ERR_FORMAT, "%s: sha256 %s, but %s records %.64s: the file changed after it was written",
                          f, hex, QD_CKPT_SUMS, s);
        for (int i = 0; i < n_need; i++)
            found |= !strcmp(name, need[i]) << i;
    }
    for (int i = 0; !st && i < n_need; i++)
        if (!(found >> i & 1))
            st = qd_error(QD_ERR_FORMAT, "%s: %s is not listed", p, need[i]);
    free(text);
    return st;
}

/* ---- save and load */

/* Removes a flat directory (a stale step_XXXXXXXX.tmp) and its files. */
static void remove_flat_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char p[PATH_N];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            file_in(p, dir, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(dir);
}

static qd_status copy_file(const char *from, const char *to)
{
    char *text;
    size_t len;
    qd_status st = qd_read_file(from, &text, &len);
    if (!st) {
        st = qd_atomic_write(to, text, len);
        free(text);
    }
    return st;
}

/* Every file of a checkpoint into tmp, SHA256SUMS last. */
static qd_status write_files(const char *tmp, const qd_ckpt_state *s, const qd_ckpt_data *d)
{
    char p[PATH_N];
    qd_status st = qd_checkpoint_save(tmp, d->mcfg, d->params, d->n_params, d->w, QD_ST_F32);
    file_in(p, tmp, "optimizer.bin");
    if (!st)
        st = check_moments(p, d->m, d->v, d->nf);
    if (!st)
        st = write_blob(p, ADAM_MAGIC, d->m, sizeof(float) * d->nf, d->v, sizeof(float) * d->nf);
    file_in(p, tmp, "rac.bin");
    if (!st)
        st = write_blob(p, RAC_MAGIC, d->rac, d->rac_bytes, NULL, 0);
    file_in(p, tmp, "state.json");
    if (!st)
        st = write_state(p, s);
    file_in(p, tmp, "tokenizer.json");
    if (!st && d->tokenizer && access(d->tokenizer, R_OK) == 0)
        st = copy_file(d->tokenizer, p);
    return st ? st : write_sums(tmp);
}

qd_status qd_ckpt_save(const char *dir, const qd_ckpt_state *s, const qd_ckpt_data *d, int keep_last)
{
    char fin[PATH_N - 16], tmp[PATH_N];
    qd_status st = qd_ckpt_path(fin, sizeof fin, dir, s->step);
    if (st)
        return st;
    snprintf(tmp, sizeof tmp, "%s.tmp", fin);
    remove_flat_dir(tmp);
    st = qd_mkdirs(tmp);
    if (!st)
        st = write_files(tmp, s, d);
    if (!st)
        st = qd_fsync_dir(tmp);
    if (!st) {
        remove_flat_dir(fin); /* a checkpoint of this step from a run that was cut back */
        if (rename(tmp, fin) != 0)
            st = qd_error(QD_ERR_IO, "%s: rename to %s: %s", tmp, fin, strerror(errno));
    }
    if (!st)
        st = qd_fsync_dir(dir);
    if (!st)
        st = qd_ckpt_rotate(dir, keep_last, NULL);
    if (st)
        remove_flat_dir(tmp);
    return st;
}

/* A run keeps its recipe and seed: the checkpoint's against the config's. */
static qd_status check_run(const char *path, const qd_ckpt_state *s, const qd_ckpt_state *want)
{
    if (strcmp(s->recipe, want->recipe) != 0)
        return qd_error(QD_ERR_ARG, "%s: recipe: '%s', but the config says '%s' (a run keeps its recipe)", path,
                        s->recipe, want->recipe);
    if (s->seed != want->seed)
        return qd_error(QD_ERR_ARG, "%s: seed: %llu, but the run's config says %llu", path,
                        (unsigned long long)s->seed, (unsigned long long)want->seed);
    return QD_OK;
}

qd_status qd_ckpt_load(const char *dir, const qd_ckpt_state *want, qd_ckpt_state *s, qd_ckpt_data *d)
{
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return qd_error(QD_ERR_IO, "%s: the run directory is missing: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return qd_error(QD_ERR_IO, "%s: not a run directory (not a directory)", dir);
    int64_t k;
    qd_status st = qd_ckpt_latest(dir, &k);
    if (st)
        return st;
    if (k < 0)
        return qd_error(QD_ERR_IO, "%s: no checkpoint (step_XXXXXXXX) to resume from", dir);
    char c[4200], p[PATH_N];
    qd_ckpt_path(c, sizeof c, dir, k);
    static const char *const need[] = {"config.json", "model.safetensors", "optimizer.bin", "rac.bin", "state.json"};
    st = verify_sums(c, need, 5);
    file_in(p, c, "state.json");
    if (!st)
        st = read_state(p, s);
    if (!st && s->step != k)
        st = qd_error(QD_ERR_FORMAT, "%s: step: %lld in a directory named for step %lld", p, (long long)s->step,
                      (long long)k);
    if (!st)
        st = check_run(p, s, want);
    if (!st) /* its messages name the file */
        st = qd_checkpoint_load(c, d->params, d->n_params, d->w);
    file_in(p, c, "optimizer.bin");
    if (!st)
        st = read_blob(p, ADAM_MAGIC, d->m, sizeof(float) * d->nf, d->v, sizeof(float) * d->nf);
    if (!st)
        st = check_moments(p, d->m, d->v, d->nf);
    file_in(p, c, "rac.bin");
    if (!st)
        st = read_blob(p, RAC_MAGIC, d->rac, d->rac_bytes, NULL, 0);
    return st;
}
