/* models/safetensors: the mmap reader, the sharded-index reader and the
 * atomic writer (see safetensors.h for the format). */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "models/safetensors.h"
#include "quant/fileio.h"
#include "quant/numerics.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader assumes a little-endian host"
#endif

/* The reference implementation refuses headers above 100 MB; so do we. */
#define MAX_HEADER ((uint64_t)100000000)

static const struct {
    const char *name;
    size_t size;
} dtypes[QD_ST_NDTYPES] = {
    [QD_ST_BOOL] = {"BOOL", 1},       [QD_ST_U8] = {"U8", 1},
    [QD_ST_I8] = {"I8", 1},           [QD_ST_F8_E4M3] = {"F8_E4M3", 1},
    [QD_ST_F8_E5M2] = {"F8_E5M2", 1}, [QD_ST_U16] = {"U16", 2},
    [QD_ST_I16] = {"I16", 2},         [QD_ST_F16] = {"F16", 2},
    [QD_ST_BF16] = {"BF16", 2},       [QD_ST_U32] = {"U32", 4},
    [QD_ST_I32] = {"I32", 4},         [QD_ST_F32] = {"F32", 4},
    [QD_ST_U64] = {"U64", 8},         [QD_ST_I64] = {"I64", 8},
    [QD_ST_F64] = {"F64", 8},
};

const char *qd_st_dtype_name(qd_st_dtype dt)
{
    return (unsigned)dt < QD_ST_NDTYPES ? dtypes[dt].name : "?";
}

size_t qd_st_dtype_size(qd_st_dtype dt)
{
    return (unsigned)dt < QD_ST_NDTYPES ? dtypes[dt].size : 0;
}

int qd_st_dtype_parse(const char *name)
{
    for (int i = 0; i < QD_ST_NDTYPES; i++)
        if (!strcmp(name, dtypes[i].name))
            return i;
    return -1;
}

typedef struct {
    char *path;
    void *map;
    size_t size;
} shard;

typedef struct {
    char *key, *value;
} meta_kv;

struct qd_safetensors {
    shard *shards;
    int nshards;
    qd_st_tensor *t;   /* (n) sorted by name once open */
    size_t n, cap;
    meta_kv *meta;     /* (nmeta) sorted by key */
    size_t nmeta;
};

/* ---- small helpers */

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const qd_st_tensor *)a)->name, ((const qd_st_tensor *)b)->name);
}

/* A file may hold no tensors (its header is {}): f->t is then NULL, which
 * qsort and bsearch must not see. */
static void sort_tensors(qd_safetensors *f)
{
    if (f->n)
        qsort(f->t, f->n, sizeof *f->t, cmp_tensor_name);
}

static const qd_st_tensor *find_tensor(const qd_safetensors *f, const char *name)
{
    qd_st_tensor key = {.name = name};
    return f->n ? bsearch(&key, f->t, f->n, sizeof key, cmp_tensor_name) : NULL;
}

static int cmp_meta_key(const void *a, const void *b)
{
    return strcmp(((const meta_kv *)a)->key, ((const meta_kv *)b)->key);
}

static void format_shape(char *buf, size_t len, int ndim, const int64_t *shape)
{
    size_t used = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, i ? ", %lld" : "%lld",
                                 (long long)shape[i]);
    if (used < len)
        snprintf(buf + used, len - used, "]");
}

static qd_status grow_tensors(qd_safetensors *f)
{
    if (f->n < f->cap)
        return QD_OK;
    size_t cap = f->cap ? 2 * f->cap : 64;
    qd_st_tensor *t = realloc(f->t, cap * sizeof *t);
    if (!t)
        return qd_error(QD_ERR_NOMEM, "safetensors: out of memory for %zu tensors", cap);
    f->t = t;
    f->cap = cap;
    return QD_OK;
}

/* ---- mapping one file */

static qd_status map_file(qd_safetensors *f, const char *path)
{
    shard *s = realloc(f->shards, (size_t)(f->nshards + 1) * sizeof *s);
    if (!s)
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", path);
    f->shards = s;
    s = &f->shards[f->nshards];
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO must not block */
    if (fd < 0)
        return qd_error(QD_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return qd_error(QD_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size < 8) {
        close(fd);
        return qd_error(QD_ERR_FORMAT, "%s: field 'header length': file is truncated "
                        "(%lld bytes, the length alone takes 8)", path, (long long)st.st_size);
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return qd_error(QD_ERR_IO, "%s: cannot mmap: %s", path, strerror(errno));
    s->path = strdup(path);
    s->map = m;
    s->size = (size_t)st.st_size;
    f->nshards++;
    if (!s->path)
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", path);
    return QD_OK;
}

/* ---- header fields */

static qd_status parse_shape(qd_st_tensor *t, const char *file, json_t *js)
{
    if (!json_is_array(js))
        return qd_error(QD_ERR_FORMAT, "%s: tensor '%s': field 'shape' is missing or not an array",
                        file, t->name);
    if (json_array_size(js) > QD_ST_MAX_DIMS)
        return qd_error(QD_ERR_FORMAT, "%s: tensor '%s': field 'shape' has %zu dimensions (max %d)",
                        file, t->name, json_array_size(js), QD_ST_MAX_DIMS);
    t->ndim = (int)json_array_size(js);
    t->numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        json_t *d = json_array_get(js, (size_t)i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return qd_error(QD_ERR_FORMAT, "%s: tensor '%s': field 'shape' dimension %d is not "
                            "a non-negative integer", file, t->name, i);
        t->shape[i] = json_integer_value(d);
        if (t->shape[i] && t->numel > INT64_MAX / t->shape[i])
            return qd_error(QD_ERR_FORMAT, "%s: tensor '%s': field 'shape' overflows 64 bits",
                            file, t->name);
        t->numel *= t->shape[i];
    }
    size_t es = qd_st_dtype_size(t->dtype);
    if (t->numel > (int64_t)(SIZE_MAX / 2) / (int64_t)es)
        return qd_error(QD_ERR_FORMAT, "%s: tensor '%s': field 'shape' is too large", file, t->name);
    t->nbytes = (size_t)t->numel * es;
    return QD_OK;
}

static qd_status parse_offsets(qd_st_tensor *t, const char *file, json_t *jo,
                               const uint8_t *data, size_t dsize)
{
    json_t *jb = json_array_get(jo, 0), *je = json_array_get(jo, 1);
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(jb) ||
        !json_is_integer(je) || json_integer_value(jb) < 0 || json_integer_value(je) < 0)
        return qd_error(QD_ERR_FORMAT, "%s: tensor '%s': field 'data_offsets' is missing or "
                        "not two non-negative integers", file, t->name);
    long long b = json_integer_value(jb), e = json_integer_value(je);
    if (b > e)
        return qd_error(QD_ERR_FORMAT, "%s: tensor '%s': field 'data_offsets' [%lld, %lld] "
                        "ends before it begins", file, t->name, b, e);
    if ((unsigned long long)e > dsize)
        return qd_error(QD_ERR_FORMAT, "%s: tensor '%s': field 'data_offsets' [%lld, %lld] is "
                        "out of range: the data section has %zu bytes (truncated file?)",
                        file, t->name, b, e, dsize);
    if ((size_t)(e - b) != t->nbytes) {
        char sh[160];
        format_shape(sh, sizeof sh, t->ndim, t->shape);
        return qd_error(QD_ERR_FORMAT, "%s: tensor '%s': field 'data_offsets' [%lld, %lld] "
                        "spans %lld bytes but shape %s of %s needs %zu", file, t->name, b, e,
                        e - b, sh, qd_st_dtype_name(t->dtype), t->nbytes);
    }
    t->data = data + b;
    return QD_OK;
}

static qd_status parse_tensor(qd_st_tensor *t, const char *file, json_t *v,
                              const uint8_t *data, size_t dsize)
{
    if (!json_is_object(v))
        return qd_error(QD_ERR_FORMAT, "%s: tensor '%s': entry is not a JSON object", file, t->name);
    json_t *jd = json_object_get(v, "dtype");
    if (!json_is_string(jd))
        return qd_error(QD_ERR_FORMAT, "%s: tensor '%s': field 'dtype' is missing or not a string",
                        file, t->name);
    int dt = qd_st_dtype_parse(json_string_value(jd));
    if (dt < 0)
        return qd_error(QD_ERR_FORMAT, "%s: tensor '%s': field 'dtype': unknown dtype '%s'",
                        file, t->name, json_string_value(jd));
    t->dtype = (qd_st_dtype)dt;
    qd_status st = parse_shape(t, file, json_object_get(v, "shape"));
    if (st != QD_OK)
        return st;
    return parse_offsets(t, file, json_object_get(v, "data_offsets"), data, dsize);
}

static qd_status parse_metadata(qd_safetensors *f, const char *file, json_t *jm, int keep)
{
    if (!json_is_object(jm))
        return qd_error(QD_ERR_FORMAT, "%s: field '__metadata__' is not a JSON object", file);
    const char *k;
    json_t *v;
    json_object_foreach(jm, k, v) {
        if (!json_is_string(v))
            return qd_error(QD_ERR_FORMAT, "%s: field '__metadata__.%s' is not a string", file, k);
    }
    if (!keep)
        return QD_OK;
    f->meta = calloc(json_object_size(jm) + 1, sizeof *f->meta);
    if (!f->meta)
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", file);
    json_object_foreach(jm, k, v) {
        meta_kv *m = &f->meta[f->nmeta++];
        m->key = strdup(k);
        m->value = strdup(json_string_value(v));
        if (!m->key || !m->value)
            return qd_error(QD_ERR_NOMEM, "%s: out of memory", file);
    }
    qsort(f->meta, f->nmeta, sizeof *f->meta, cmp_meta_key);
    return QD_OK;
}

/* ---- the data section must be tiled exactly, as the reference requires */

typedef struct {
    size_t b, e;
    const char *name;
} span;

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->b != y->b)
        return x->b < y->b ? -1 : 1;
    return x->e < y->e ? -1 : (x->e > y->e);
}

static qd_status check_spans(span *sp, size_t n, const char *file, size_t dsize)
{
    qsort(sp, n, sizeof *sp, cmp_span);
    size_t end = 0;
    for (size_t i = 0; i < n; i++) {
        if (sp[i].b < end)
            return qd_error(QD_ERR_FORMAT, "%s: tensor '%s': field 'data_offsets' [%zu, %zu] "
                            "overlaps tensor '%s' [%zu, %zu]", file, sp[i].name, sp[i].b,
                            sp[i].e, sp[i - 1].name, sp[i - 1].b, sp[i - 1].e);
        if (sp[i].b > end)
            return qd_error(QD_ERR_FORMAT, "%s: tensor '%s': field 'data_offsets' [%zu, %zu] "
                            "leaves a gap of unused bytes [%zu, %zu)", file, sp[i].name,
                            sp[i].b, sp[i].e, end, sp[i].b);
        end = sp[i].e;
    }
    if (end != dsize)
        return qd_error(QD_ERR_FORMAT, "%s: field 'data_offsets': the tensors cover %zu bytes "
                        "but the data section has %zu", file, end, dsize);
    return QD_OK;
}

static qd_status check_tiling(const qd_safetensors *f, size_t first, const char *file,
                              const uint8_t *data, size_t dsize)
{
    size_t n = f->n - first;
    span *sp = malloc((n + 1) * sizeof *sp);
    if (!sp)
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", file);
    for (size_t i = 0; i < n; i++) {
        const qd_st_tensor *t = &f->t[first + i];
        sp[i].b = (size_t)((const uint8_t *)t->data - data);
        sp[i].e = sp[i].b + t->nbytes;
        sp[i].name = t->name;
    }
    qd_status st = check_spans(sp, n, file, dsize);
    free(sp);
    return st;
}

/* ---- one file's header */

static qd_status load_header(json_t **root, const shard *s, uint64_t *hlen)
{
    const uint8_t *p = s->map;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | p[i];
    if (n > s->size - 8)
        return qd_error(QD_ERR_FORMAT, "%s: field 'header length': %llu bytes, but only %zu "
                        "follow it (truncated or not a safetensors file)", s->path,
                        (unsigned long long)n, s->size - 8);
    if (n > MAX_HEADER)
        return qd_error(QD_ERR_FORMAT, "%s: field 'header length': %llu bytes is above the "
                        "100 MB limit", s->path, (unsigned long long)n);
    json_error_t je;
    *root = json_loadb((const char *)p + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!*root)
        return qd_error(QD_ERR_FORMAT, "%s: field 'header': bad JSON at line %d column %d: %s",
                        s->path, je.line, je.column, je.text);
    if (!json_is_object(*root))
        return qd_error(QD_ERR_FORMAT, "%s: field 'header': not a JSON object", s->path);
    *hlen = n;
    return QD_OK;
}

static qd_status parse_entries(qd_safetensors *f, const shard *s, json_t *root, int keep_meta,
                               const uint8_t *data, size_t dsize)
{
    const char *k;
    json_t *v;
    json_object_foreach(root, k, v) {
        qd_status st;
        if (!strcmp(k, "__metadata__")) {
            st = parse_metadata(f, s->path, v, keep_meta);
        } else if ((st = grow_tensors(f)) == QD_OK) {
            qd_st_tensor *t = &f->t[f->n];
            memset(t, 0, sizeof *t);
            t->file = s->path;
            if (!(t->name = strdup(k)))
                return qd_error(QD_ERR_NOMEM, "%s: out of memory", s->path);
            f->n++;
            st = parse_tensor(t, s->path, v, data, dsize);
        }
        if (st != QD_OK)
            return st;
    }
    return QD_OK;
}

static qd_status parse_file(qd_safetensors *f, const char *path)
{
    qd_status st = map_file(f, path);
    if (st != QD_OK)
        return st;
    const shard *s = &f->shards[f->nshards - 1];
    json_t *root = NULL;
    uint64_t hlen = 0;
    size_t first = f->n;
    st = load_header(&root, s, &hlen);
    const uint8_t *data = (const uint8_t *)s->map + 8 + hlen;
    size_t dsize = s->size - 8 - (size_t)hlen;
    if (st == QD_OK)
        st = parse_entries(f, s, root, f->nshards == 1, data, dsize);
    if (st == QD_OK)
        st = check_tiling(f, first, s->path, data, dsize);
    json_decref(root);
    return st;
}

/* ---- sharded checkpoints */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Unique shard file names of the weight map, sorted, into *names (n). */
static qd_status shard_names(const char ***names, size_t *n, json_t *wm, const char *path)
{
    const char **v = malloc((json_object_size(wm) + 1) * sizeof *v);
    if (!v)
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", path);
    size_t k = 0;
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        const char *s = json_string_value(val);
        if (!s || !*s || strchr(s, '/') || !strcmp(s, ".") || !strcmp(s, "..")) {
            free(v);
            return qd_error(QD_ERR_FORMAT, "%s: field 'weight_map.%s' is not a file name in "
                            "the index's directory", path, key);
        }
        v[k++] = s;
    }
    qsort(v, k, sizeof *v, cmp_str);
    size_t u = 0;
    for (size_t i = 0; i < k; i++)
        if (!u || strcmp(v[u - 1], v[i]))
            v[u++] = v[i];
    *names = v;
    *n = u;
    return QD_OK;
}

/* Every tensor must be where the weight map says, and nowhere else. */
static qd_status check_weight_map(const qd_safetensors *f, json_t *wm, const char *path)
{
    for (size_t i = 0; i < f->n; i++) {
        if (i && !strcmp(f->t[i - 1].name, f->t[i].name))
            return qd_error(QD_ERR_FORMAT, "%s: tensor '%s' is in two shards (%s and %s)", path,
                            f->t[i].name, f->t[i - 1].file, f->t[i].file);
        const char *where = json_string_value(json_object_get(wm, f->t[i].name));
        if (!where)
            return qd_error(QD_ERR_FORMAT, "%s: field 'weight_map' does not list tensor '%s' "
                            "of %s", path, f->t[i].name, f->t[i].file);
        if (strcmp(where, qd_path_base(f->t[i].file)))
            return qd_error(QD_ERR_FORMAT, "%s: field 'weight_map.%s' says %s but the tensor "
                            "is in %s", path, f->t[i].name, where, f->t[i].file);
    }
    if (json_object_size(wm) != f->n) {
        const char *k;
        json_t *v;
        json_object_foreach(wm, k, v) {
            if (!find_tensor(f, k))
                return qd_error(QD_ERR_FORMAT, "%s: field 'weight_map.%s': tensor not found in %s",
                                path, k, json_string_value(v));
        }
    }
    return QD_OK;
}

static qd_status open_shards(qd_safetensors *f, const char **names, size_t n, const char *path)
{
    char *dir = qd_path_dir(path);
    qd_status st = dir ? QD_OK : qd_error(QD_ERR_NOMEM, "%s: out of memory", path);
    for (size_t i = 0; st == QD_OK && i < n; i++) {
        size_t len = strlen(dir) + strlen(names[i]) + 2;
        char *p = malloc(len);
        if (!p) {
            st = qd_error(QD_ERR_NOMEM, "%s: out of memory", path);
            break;
        }
        snprintf(p, len, "%s/%s", dir, names[i]);
        st = parse_file(f, p);
        free(p);
    }
    free(dir);
    return st;
}

static qd_status open_index(qd_safetensors *f, const char *path)
{
    FILE *fp;
    qd_status st = qd_fopen_regular(path, &fp);
    if (st)
        return st;
    json_error_t je;
    json_t *root = json_loadf(fp, JSON_REJECT_DUPLICATES, &je);
    fclose(fp);
    if (!root)
        return qd_error(QD_ERR_FORMAT, "%s: bad JSON at line %d column %d: %s", path, je.line,
                        je.column, je.text);
    json_t *wm = json_object_get(root, "weight_map");
    const char **names = NULL;
    size_t n = 0;
    if (!json_is_object(wm) || !json_object_size(wm))
        st = qd_error(QD_ERR_FORMAT, "%s: field 'weight_map' is missing or not a non-empty "
                      "object", path);
    if (st == QD_OK)
        st = shard_names(&names, &n, wm, path);
    if (st == QD_OK)
        st = open_shards(f, names, n, path);
    if (st == QD_OK) {
        sort_tensors(f);
        st = check_weight_map(f, wm, path);
    }
    free(names);
    json_decref(root);
    return st;
}

/* ---- open / close */

static qd_status open_dir(qd_safetensors *f, const char *dir)
{
    size_t len = strlen(dir) + 64;
    char *p = malloc(len);
    if (!p)
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", dir);
    snprintf(p, len, "%s/model.safetensors.index.json", dir);
    qd_status st;
    if (access(p, F_OK) == 0) {
        st = open_index(f, p);
    } else {
        snprintf(p, len, "%s/model.safetensors", dir);
        st = parse_file(f, p);
    }
    free(p);
    return st;
}

qd_status qd_safetensors_open(qd_safetensors **out, const char *path)
{
    *out = NULL;
    qd_safetensors *f = calloc(1, sizeof *f);
    if (!f)
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", path);
    struct stat st;
    qd_status s;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        s = open_dir(f, path);
    else if (qd_str_ends_with(path, ".json"))
        s = open_index(f, path);
    else
        s = parse_file(f, path);
    if (s != QD_OK) {
        qd_safetensors_close(f);
        return s;
    }
    sort_tensors(f);
    for (size_t i = 1; i < f->n; i++)   /* JSON_REJECT_DUPLICATES already covers one file */
        if (!strcmp(f->t[i - 1].name, f->t[i].name)) {
            s = qd_error(QD_ERR_FORMAT, "%s: tensor '%s' appears twice", path, f->t[i].name);
            qd_safetensors_close(f);
            return s;
        }
    *out = f;
    return QD_OK;
}

void qd_safetensors_close(qd_safetensors *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->n; i++)
        free((char *)f->t[i].name);
    for (int i = 0; i < f->nshards; i++) {
        munmap(f->shards[i].map, f->shards[i].size);
        free(f->shards[i].path);
    }
    for (size_t i = 0; i < f->nmeta; i++) {
        free(f->meta[i].key);
        free(f->meta[i].value);
    }
    free(f->meta);
    free(f->shards);
    free(f->t);
    free(f);
}

/* ---- accessors */

size_t qd_safetensors_count(const qd_safetensors *f) { return f->n; }

const qd_st_tensor *qd_safetensors_at(const qd_safetensors *f, size_t i)
{
    return i < f->n ? &f->t[i] : NULL;
}

const qd_st_tensor *qd_safetensors_find(const qd_safetensors *f, const char *name)
{
    return find_tensor(f, name);
}

size_t qd_safetensors_metadata_count(const qd_safetensors *f) { return f->nmeta; }

const char *qd_safetensors_metadata_key(const qd_safetensors *f, size_t i)
{
    return i < f->nmeta ? f->meta[i].key : NULL;
}

const char *qd_safetensors_metadata_value(const qd_safetensors *f, size_t i)
{
    return i < f->nmeta ? f->meta[i].value : NULL;
}

const char *qd_safetensors_metadata_get(const qd_safetensors *f, const char *key)
{
    meta_kv k = {.key = (char *)key};
    const meta_kv *m = f->nmeta ? bsearch(&k, f->meta, f->nmeta, sizeof k, cmp_meta_key) : NULL;
    return m ? m->value : NULL;
}

/* ---- conversion to float32 */

/* IEEE binary16 to float32, exact: subnormals become normal floats, Inf and
 * NaN (payload kept) map to their float32 counterparts. */
static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        float v = (float)m * 0x1p-24f;   /* m * 2^-24 is exact */
        return sign ? -v : v;
    }
    if (e == 31)
        return qd_bits_f32(sign | 0x7f800000u | (m << 13));
    return qd_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

static uint16_t load_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* BF16 is the top half of a float32: a shift (omp simd: -O2 alone leaves
 * this loop scalar, at half the speed). */
static void bf16_to_f32(float *out, const uint8_t *p, int64_t n)
{
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)load_u16(p + 2 * i) << 16;
        memcpy(out + i, &u, 4);
    }
}

qd_status qd_safetensors_to_f32_range(float *out, const qd_st_tensor *t, int64_t begin, int64_t n)
{
    const uint8_t *p = (const uint8_t *)t->data + (size_t)begin * qd_st_dtype_size(t->dtype);
    switch (t->dtype) {
    case QD_ST_F32:
        memcpy(out, p, (size_t)n * 4);
        return QD_OK;
    case QD_ST_BF16:
        bf16_to_f32(out, p, n);
        return QD_OK;
    case QD_ST_F16:
        for (int64_t i = 0; i < n; i++)
            out[i] = f16_to_f32(load_u16(p + 2 * i));
        return QD_OK;
    case QD_ST_F8_E4M3:
        for (int64_t i = 0; i < n; i++)
            out[i] = qd_e4m3_to_f32(p[i]);
        return QD_OK;
    default:
        return qd_error(QD_ERR_UNSUPPORTED, "%s: tensor '%s': field 'dtype': %s cannot be "
                        "converted to F32", t->file, t->name, qd_st_dtype_name(t->dtype));
    }
}

qd_status qd_safetensors_to_f32(float *out, const qd_st_tensor *t)
{
    return qd_safetensors_to_f32_range(out, t, 0, t->numel);
}

/* ---- writer */

typedef struct {
    char *name;
    qd_st_dtype dtype;
    int ndim;
    int64_t shape[QD_ST_MAX_DIMS];
    size_t nbytes;
    const void *data;
    void *owned;        /* data when the writer owns it */
} wentry;

struct qd_safetensors_writer {
    wentry *e;
    size_t n, cap;
    meta_kv *meta;
    size_t nmeta;
};

qd_status qd_safetensors_writer_new(qd_safetensors_writer **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? QD_OK : qd_error(QD_ERR_NOMEM, "safetensors writer: out of memory");
}

void qd_safetensors_writer_free(qd_safetensors_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n; i++) {
        free(w->e[i].name);
        free(w->e[i].owned);
    }
    for (size_t i = 0; i < w->nmeta; i++) {
        free(w->meta[i].key);
        free(w->meta[i].value);
    }
    free(w->e);
    free(w->meta);
    free(w);
}

static qd_status check_entry(const char *name, qd_st_dtype dt, int ndim, const int64_t *shape,
                             size_t *nbytes)
{
    if (!name || !*name || !strcmp(name, "__metadata__"))
        return qd_error(QD_ERR_ARG, "safetensors writer: field 'name': '%s' is not a tensor name",
                        name ? name : "(null)");
    if ((unsigned)dt >= QD_ST_NDTYPES)
        return qd_error(QD_ERR_ARG, "safetensors writer: tensor '%s': field 'dtype' is invalid", name);
    if (ndim < 0 || ndim > QD_ST_MAX_DIMS)
        return qd_error(QD_ERR_ARG, "safetensors writer: tensor '%s': field 'shape' has %d "
                        "dimensions", name, ndim);
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || (shape[i] && numel > INT64_MAX / 16 / shape[i]))
            return qd_error(QD_ERR_ARG, "safetensors writer: tensor '%s': field 'shape' "
                            "dimension %d is invalid", name, i);
        numel *= shape[i];
    }
    *nbytes = (size_t)numel * qd_st_dtype_size(dt);
    return QD_OK;
}

qd_status qd_safetensors_writer_add_steal(qd_safetensors_writer *w, const char *name,
                                          qd_st_dtype dt, int ndim, const int64_t *shape,
                                          void *data)
{
    size_t nbytes = 0;
    qd_status st = check_entry(name, dt, ndim, shape, &nbytes);
    if (st == QD_OK && w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 64;
        wentry *e = realloc(w->e, cap * sizeof *e);
        if (e) {
            w->e = e;
            w->cap = cap;
        } else {
            st = qd_error(QD_ERR_NOMEM, "safetensors writer: out of memory");
        }
    }
    char *copy = st == QD_OK ? strdup(name) : NULL;
    if (st == QD_OK && !copy)
        st = qd_error(QD_ERR_NOMEM, "safetensors writer: out of memory");
    if (st != QD_OK) {
        free(data);
        return st;
    }
    wentry *e = &w->e[w->n++];
    memset(e, 0, sizeof *e);
    e->name = copy;
    e->dtype = dt;
    e->ndim = ndim;
    if (ndim)
        memcpy(e->shape, shape, (size_t)ndim * sizeof *shape);
    e->nbytes = nbytes;
    e->data = data;
    e->owned = data;
    return QD_OK;
}

qd_status qd_safetensors_writer_add(qd_safetensors_writer *w, const char *name, qd_st_dtype dt,
                                    int ndim, const int64_t *shape, const void *data)
{
    qd_status st = qd_safetensors_writer_add_steal(w, name, dt, ndim, shape, NULL);
    if (st == QD_OK)
        w->e[w->n - 1].data = data;
    return st;
}

qd_status qd_safetensors_writer_set_metadata(qd_safetensors_writer *w, const char *key,
                                             const char *value)
{
    for (size_t i = 0; i < w->nmeta; i++)
        if (!strcmp(w->meta[i].key, key)) {
            char *v = strdup(value);
            if (!v)
                return qd_error(QD_ERR_NOMEM, "safetensors writer: out of memory");
            free(w->meta[i].value);
            w->meta[i].value = v;
            return QD_OK;
        }
    meta_kv *m = realloc(w->meta, (w->nmeta + 1) * sizeof *m);
    if (!m)
        return qd_error(QD_ERR_NOMEM, "safetensors writer: out of memory");
    w->meta = m;
    m[w->nmeta].key = strdup(key);
    m[w->nmeta].value = strdup(value);
    w->nmeta++;
    if (!m[w->nmeta - 1].key || !m[w->nmeta - 1].value)
        return qd_error(QD_ERR_NOMEM, "safetensors writer: out of memory");
    return QD_OK;
}

/* Data order of the reference writer: larger dtypes first (keeps every tensor
 * aligned to its element size), then by name. */
static int cmp_wentry_data(const void *a, const void *b)
{
    const wentry *x = *(const wentry *const *)a, *y = *(const wentry *const *)b;
    size_t sx = qd_st_dtype_size(x->dtype), sy = qd_st_dtype_size(y->dtype);
    if (sx != sy)
        return sx > sy ? -1 : 1;
    return strcmp(x->name, y->name);
}

static json_t *entry_json(const wentry *e, size_t off)
{
    json_t *shape = json_array();
    for (int i = 0; i < e->ndim; i++)
        json_array_append_new(shape, json_integer(e->shape[i]));
    return json_pack("{s:s, s:o, s:[I, I]}", "dtype", qd_st_dtype_name(e->dtype), "shape", shape,
                     "data_offsets", (json_int_t)off, (json_int_t)(off + e->nbytes));
}

/* The JSON header, padded with spaces to a multiple of 8. */
static char *build_header(const qd_safetensors_writer *w, const wentry **order, size_t *len)
{
    json_t *root = json_object();
    if (w->nmeta) {
        json_t *m = json_object();
        for (size_t i = 0; i < w->nmeta; i++)
            json_object_set_new(m, w->meta[i].key, json_string(w->meta[i].value));
        json_object_set_new(root, "__metadata__", m);
    }
    size_t off = 0;
    for (size_t i = 0; i < w->n; i++) {
        json_object_set_new(root, order[i]->name, entry_json(order[i], off));
        off += order[i]->nbytes;
    }
    char *s = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(root);
    if (!s)
        return NULL;
    size_t n = strlen(s), padded = (n + 7) / 8 * 8;
    char *h = realloc(s, padded + 1);
    if (!h) {
        free(s);
        return NULL;
    }
    memset(h + n, ' ', padded - n);
    h[padded] = 0;
    *len = padded;
    return h;
}

typedef struct {
    const wentry **order;
    size_t n;
    const char *header;
    size_t hlen;
} write_ctx;

static qd_status fill_safetensors(FILE *fp, const char *path, void *vctx)
{
    const write_ctx *c = vctx;
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)((uint64_t)c->hlen >> (8 * i));
    int ok = fwrite(len, 1, 8, fp) == 8 && fwrite(c->header, 1, c->hlen, fp) == c->hlen;
    for (size_t i = 0; ok && i < c->n; i++)
        ok = !c->order[i]->nbytes ||
             fwrite(c->order[i]->data, 1, c->order[i]->nbytes, fp) == c->order[i]->nbytes;
    return ok ? QD_OK : qd_error(QD_ERR_IO, "%s: write failed: %s", path, strerror(errno));
}

static int cmp_wentry_name(const void *a, const void *b)
{
    return strcmp((*(const wentry *const *)a)->name, (*(const wentry *const *)b)->name);
}

static qd_status check_writer(const qd_safetensors_writer *w, const wentry **order,
                              const char *path)
{
    qsort(order, w->n, sizeof *order, cmp_wentry_name);
    for (size_t i = 0; i < w->n; i++) {
        if (i && !strcmp(order[i - 1]->name, order[i]->name))
            return qd_error(QD_ERR_ARG, "%s: tensor '%s' was added twice", path, order[i]->name);
        if (order[i]->nbytes && !order[i]->data)
            return qd_error(QD_ERR_ARG, "%s: tensor '%s': field 'data' is NULL", path,
                            order[i]->name);
    }
    qsort(order, w->n, sizeof *order, cmp_wentry_data);
    return QD_OK;
}

qd_status qd_safetensors_writer_write(const qd_safetensors_writer *w, const char *path)
{
    const wentry **order = malloc((w->n + 1) * sizeof *order);
    if (!order)
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", path);
    for (size_t i = 0; i < w->n; i++)
        order[i] = &w->e[i];
    qd_status st = check_writer(w, order, path);
    write_ctx c = {.order = order, .n = w->n};
    char *header = st == QD_OK ? build_header(w, order, &c.hlen) : NULL;
    if (st == QD_OK && !header)
        st = qd_error(QD_ERR_NOMEM, "%s: cannot build the JSON header", path);
    c.header = header;
    if (st == QD_OK)
        st = qd_atomic_write_with(path, fill_safetensors, &c);
    free(header);
    free(order);
    return st;
}
