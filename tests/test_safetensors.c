/* Check suite of models/safetensors and `quads quantize`. The reference files
 * under tests/fixtures/safetensors/ were written by the Python `safetensors`
 * package, with values from numpy/ml_dtypes (tests/ref/make_safetensors_fixtures.py). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "models/safetensors.h"
#include "quant/numerics.h"
#include "tests/suites.h"

#define FIX "tests/fixtures/safetensors/"
#define NPATTERNS_STRIDED 5042 /* ceil(65536 / 13) */

/* ---- helpers */

/* A fresh temporary directory in dir (256 bytes), removed by qd_test_rm_tree. */
static char *make_tmpdir_in(char *dir) { return qd_test_mkdtemp(dir, 256, "st_test"); }

static char *make_tmpdir(void)
{
    static _Thread_local char dir[256];
    return make_tmpdir_in(dir);
}

static uint8_t *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*len + 1);
    ck_assert_uint_eq(fread(b, 1, *len, f), *len);
    fclose(f);
    return b;
}

static void write_all(const char *path, const void *b, size_t len)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(b, 1, len, f), len);
    fclose(f);
}

/* A file with the given header length field, header text and data bytes (zeros). */
static void write_raw(const char *path, uint64_t hlen, const char *header, size_t data_len)
{
    size_t n = strlen(header);
    uint8_t *b = calloc(8 + n + data_len + 1, 1);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(b + 8, header, n);
    write_all(path, b, 8 + n + data_len);
    free(b);
}

static const qd_st_tensor *must_find(const qd_safetensors *f, const char *name)
{
    const qd_st_tensor *t = qd_safetensors_find(f, name);
    ck_assert_msg(t != NULL, "tensor %s not found", name);
    return t;
}

static qd_safetensors *must_open(const char *path)
{
    qd_safetensors *f = NULL;
    qd_status st = qd_safetensors_open(&f, path);
    ck_assert_msg(st == QD_OK, "open %s: %s", path, qd_last_error());
    return f;
}

static float *to_f32(const qd_st_tensor *t)
{
    float *v = malloc((size_t)(t->numel + 1) * sizeof *v);
    qd_status st = qd_safetensors_to_f32(v, t);
    ck_assert_msg(st == QD_OK, "%s", qd_last_error());
    return v;
}

/* Same bits, or both NaN (quieting of signalling NaNs may differ by CPU). */
static void assert_same_f32(const float *a, const float *b, int64_t n, const char *what)
{
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(qd_f32_bits(a[i]) == qd_f32_bits(b[i]) || (isnan(a[i]) && isnan(b[i])),
                      "%s[%lld]: %a != %a", what, (long long)i, a[i], b[i]);
}

/* ---- reading a file written by Python safetensors */

START_TEST(test_read_python_fixture)
{
    qd_safetensors *f = must_open(qd_test_path(FIX "python_ref.safetensors"));
    ck_assert_uint_eq(qd_safetensors_count(f), 13);
    for (size_t i = 1; i < qd_safetensors_count(f); i++)
        ck_assert_int_lt(strcmp(qd_safetensors_at(f, i - 1)->name, qd_safetensors_at(f, i)->name), 0);
    ck_assert_ptr_null(qd_safetensors_at(f, 13));
    ck_assert_ptr_null(qd_safetensors_find(f, "missing"));
    ck_assert_uint_eq(qd_safetensors_metadata_count(f), 2);
    ck_assert_str_eq(qd_safetensors_metadata_get(f, "format"), "pt");
    ck_assert_str_eq(qd_safetensors_metadata_key(f, 1), "source");
    ck_assert_str_eq(qd_safetensors_metadata_value(f, 1), "tests/ref/make_safetensors_fixtures.py");

    const qd_st_tensor *m = must_find(f, "f32.matrix");
    ck_assert_int_eq(m->dtype, QD_ST_F32);
    ck_assert_int_eq(m->ndim, 2);
    ck_assert_int_eq(m->shape[0], 3);
    ck_assert_int_eq(m->shape[1], 5);
    ck_assert_uint_eq(m->nbytes, 60);
    float *v = to_f32(m);
    for (int i = 0; i < 15; i++)
        ck_assert_float_eq(v[i], (float)i * 0.25f - 1.5f);
    free(v);

    const qd_st_tensor *s = must_find(f, "scalar");
    ck_assert_int_eq(s->ndim, 0);
    ck_assert_int_eq(s->numel, 1);
    v = to_f32(s);
    ck_assert_float_eq(v[0], 3.25f);
    free(v);

    const qd_st_tensor *e = must_find(f, "empty");
    ck_assert_int_eq(e->ndim, 2);
    ck_assert_int_eq(e->shape[0], 0);
    ck_assert_int_eq(e->shape[1], 4);
    ck_assert_int_eq(e->numel, 0);
    ck_assert_uint_eq(e->nbytes, 0);
    qd_safetensors_close(f);
}
END_TEST

/* F16/BF16/E4M3 decoding equals numpy's/ml_dtypes' float32 conversion, bit for bit. */
START_TEST(test_read_python_conversions)
{
    static const char *const pairs[][2] = {
        {"f16.patterns", "f16.patterns_as_f32"},
        {"bf16.patterns", "bf16.patterns_as_f32"},
        {"f8.e4m3", "f8.e4m3_as_f32"},
    };
    qd_safetensors *f = must_open(qd_test_path(FIX "python_ref.safetensors"));
    for (int k = 0; k < 3; k++) {
        const qd_st_tensor *a = must_find(f, pairs[k][0]), *b = must_find(f, pairs[k][1]);
        ck_assert_int_eq(a->numel, b->numel);
        ck_assert_int_eq(b->dtype, QD_ST_F32);
        float *va = to_f32(a), *vb = to_f32(b);
        assert_same_f32(va, vb, a->numel, pairs[k][0]);
        free(va);
        free(vb);
    }
    /* the 16-bit patterns sit where data_offsets say: pattern i is 13*i */
    const qd_st_tensor *h = must_find(f, "f16.patterns");
    ck_assert_int_eq(h->dtype, QD_ST_F16);
    ck_assert_int_eq(h->numel, NPATTERNS_STRIDED + 9);
    const uint8_t *p = h->data;
    for (int i = 0; i < NPATTERNS_STRIDED; i++)
        ck_assert_int_eq(p[2 * i] | p[2 * i + 1] << 8, 13 * i);
    ck_assert_int_eq(must_find(f, "bf16.patterns")->dtype, QD_ST_BF16);
    ck_assert_int_eq(must_find(f, "f8.e4m3")->dtype, QD_ST_F8_E4M3);
    qd_safetensors_close(f);
}
END_TEST

START_TEST(test_read_python_integers)
{
    qd_safetensors *f = must_open(qd_test_path(FIX "python_ref.safetensors"));
    const qd_st_tensor *u8 = must_find(f, "u8.bytes"), *i8 = must_find(f, "i8.values");
    const qd_st_tensor *i32 = must_find(f, "i32.values"), *i64 = must_find(f, "i64.values");
    ck_assert_int_eq(u8->dtype, QD_ST_U8);
    ck_assert_int_eq(i8->dtype, QD_ST_I8);
    ck_assert_int_eq(i32->dtype, QD_ST_I32);
    ck_assert_int_eq(i64->dtype, QD_ST_I64);
    ck_assert_mem_eq(u8->data, ((uint8_t[]){0, 1, 127, 128, 255}), 5);
    ck_assert_mem_eq(i8->data, ((int8_t[]){-128, -1, 127}), 3);
    ck_assert_mem_eq(i32->data, ((int32_t[]){-1, 0, INT32_MAX, INT32_MIN}), 16);
    ck_assert_mem_eq(i64->data, ((int64_t[]){INT64_MIN, INT64_MAX}), 16);
    float out[5];
    ck_assert_int_eq(qd_safetensors_to_f32(out, u8), QD_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "'dtype'"));
    qd_safetensors_close(f);
}
END_TEST

/* ---- sharded checkpoints */

static void assert_same_tensor_sets(const qd_safetensors *a, const qd_safetensors *b)
{
    ck_assert_uint_eq(qd_safetensors_count(a), qd_safetensors_count(b));
    for (size_t i = 0; i < qd_safetensors_count(a); i++) {
        const qd_st_tensor *x = qd_safetensors_at(a, i), *y = qd_safetensors_find(b, x->name);
        ck_assert_msg(y != NULL, "%s missing", x->name);
        ck_assert_int_eq(x->dtype, y->dtype);
        ck_assert_int_eq(x->ndim, y->ndim);
        ck_assert_mem_eq(x->shape, y->shape, (size_t)x->ndim * sizeof x->shape[0]);
        ck_assert_uint_eq(x->nbytes, y->nbytes);
        ck_assert(memcmp(x->data, y->data, x->nbytes) == 0);
    }
}

START_TEST(test_sharded_index)
{
    qd_safetensors *one = must_open(qd_test_path(FIX "tiny_moe.safetensors"));
    qd_safetensors *idx = must_open(qd_test_path(FIX "sharded/model.safetensors.index.json"));
    qd_safetensors *dir = must_open(qd_test_path(FIX "sharded"));
    assert_same_tensor_sets(one, idx);
    assert_same_tensor_sets(one, dir);
    /* both shards contribute */
    const char *f0 = qd_safetensors_at(idx, 0)->file;
    const char *fl = qd_safetensors_at(idx, qd_safetensors_count(idx) - 1)->file;
    ck_assert_str_ne(f0, fl);
    ck_assert_str_eq(qd_safetensors_metadata_get(idx, "format"), "pt");
    qd_safetensors_close(one);
    qd_safetensors_close(idx);
    qd_safetensors_close(dir);
}
END_TEST

/* An index whose weight_map misplaces or invents a tensor is refused. */
START_TEST(test_sharded_index_inconsistent)
{
    static const char *const bad[][2] = {
        {"{\"weight_map\": {\"x\": \"model-00001-of-00002.safetensors\"}}", "weight_map"},
        {"{\"weight_map\": {}}", "weight_map"},
        {"{\"weight_map\": {\"x\": \"../etc/passwd\"}}", "weight_map.x"},
        {"{\"weight_map\": {\"x\": 3}}", "weight_map.x"},
        {"[1, 2", "bad JSON"},
    };
    char *d = make_tmpdir();
    char src[512], dst[512];
    for (int i = 1; i <= 2; i++) {
        snprintf(src, sizeof src, FIX "sharded/model-0000%d-of-00002.safetensors", i);
        size_t n;
        uint8_t *b = read_all(qd_test_path(src), &n);
        snprintf(dst, sizeof dst, "%s/model-0000%d-of-00002.safetensors", d, i);
        write_all(dst, b, n);
        free(b);
    }
    snprintf(dst, sizeof dst, "%s/model.safetensors.index.json", d);
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        write_all(dst, bad[k][0], strlen(bad[k][0]));
        qd_safetensors *f = (qd_safetensors *)1;
        ck_assert_int_eq(qd_safetensors_open(&f, dst), QD_ERR_FORMAT);
        ck_assert_ptr_null(f);
        ck_assert_msg(strstr(qd_last_error(), bad[k][1]) && strstr(qd_last_error(), dst),
                      "case %zu: '%s'", k, qd_last_error());
    }
    qd_test_rm_tree(d);
}
END_TEST

/* ---- malformed single files: status and a message naming the file and field */

typedef struct {
    uint64_t hlen;          /* 0: the header's own length */
    const char *header;
    size_t data_len;
    const char *field;      /* must appear in the message */
    const char *detail;     /* and so must this */
} bad_file;

static const bad_file bad_files[] = {
    {0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,400]}}", 16,
     "field 'data_offsets'", "out of range"},
    {0, "{\"a\":{\"dtype\":\"Q4_K\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
     "field 'dtype'", "Q4_K"},
    {0, "{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "field 'dtype'", "missing"},
    {0, "{\"a\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "field 'dtype'", "tensor 'a'"},
    {0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 20,
     "field 'data_offsets'", "needs 24"},
    {0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1,4],\"data_offsets\":[0,16]}}", 16,
     "field 'shape'", "non-negative"},
    {0, "{\"a\":{\"dtype\":\"F32\",\"shape\":\"2\",\"data_offsets\":[0,8]}}", 8, "field 'shape'", "array"},
    {0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4,8]}}", 8,
     "field 'data_offsets'", "two"},
    {0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
     "field 'data_offsets'", "ends before"},
    {0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[2,6]}}", 6,
     "field 'data_offsets'", "overlaps"},
    {0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12,
     "field 'data_offsets'", "gap"},
    {0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 12,
     "field 'data_offsets'", "cover 4 bytes"},
    {0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a\":{}}", 4,
     "field 'header'", "bad JSON"},
    {0, "{\"a\": ", 0, "field 'header'", "bad JSON"},
    {0, "[1, 2, 3]", 0, "field 'header'", "not a JSON object"},
    {0, "{\"a\": [1]}", 0, "tensor 'a'", "not a JSON object"},
    {0, "{\"__metadata__\":{\"format\":1}}", 0, "field '__metadata__.format'", "not a string"},
    {UINT64_MAX, "{}", 0, "field 'header length'", "18446744073709551615"},
    {1u << 20, "{}", 0, "field 'header length'", "truncated"},
};

START_TEST(test_malformed)
{
    const bad_file *b = &bad_files[_i];
    char *d = make_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/bad.safetensors", d);
    write_raw(path, b->hlen ? b->hlen : strlen(b->header), b->header, b->data_len);
    qd_safetensors *f = (qd_safetensors *)1;
    ck_assert_int_eq(qd_safetensors_open(&f, path), QD_ERR_FORMAT);
    ck_assert_ptr_null(f);
    const char *msg = qd_last_error();
    ck_assert_msg(strstr(msg, path) && strstr(msg, b->field) && strstr(msg, b->detail),
                  "case %d: '%s' lacks '%s' / '%s'", _i, msg, b->field, b->detail);
    qd_test_rm_tree(d);
}
END_TEST

/* Every truncation of a real file is refused (never a crash or a partial read). */
START_TEST(test_truncated)
{
    size_t n;
    uint8_t *b = read_all(qd_test_path(FIX "tiny_moe.safetensors"), &n);
    char *d = make_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/cut.safetensors", d);
    static const size_t cuts[] = {0, 5, 8, 100, 1000, 20000};
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0] + 1; k++) {
        size_t len = k < sizeof cuts / sizeof cuts[0] ? cuts[k] : n - 1;
        write_all(path, b, len);
        qd_safetensors *f = NULL;
        ck_assert_int_eq(qd_safetensors_open(&f, path), QD_ERR_FORMAT);
        uint64_t hlen = 0;
        for (int i = 7; i >= 0; i--)
            hlen = hlen << 8 | b[i];
        const char *want = len < 8 + hlen ? "'header length'" : "'data_offsets'";
        ck_assert_msg(strstr(qd_last_error(), want) && strstr(qd_last_error(), path),
                      "cut at %zu: '%s'", len, qd_last_error());
    }
    write_all(path, b, n);
    qd_safetensors *f = must_open(path);
    qd_safetensors_close(f);
    free(b);
    qd_test_rm_tree(d);
}
END_TEST

START_TEST(test_missing_file)
{
    qd_safetensors *f = NULL;
    ck_assert_int_eq(qd_safetensors_open(&f, "/nonexistent/x.safetensors"), QD_ERR_IO);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "/nonexistent/x.safetensors"));
    ck_assert_int_eq(qd_safetensors_open(&f, "/nonexistent/model.safetensors.index.json"), QD_ERR_IO);
}
END_TEST

/* A header of {} is a valid file with no tensors: nothing to sort or search
 * (qsort and bsearch were handed NULL, which UBSan reports). */
START_TEST(test_empty_header)
{
    char *d = make_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/empty.safetensors", d);
    write_raw(path, 2, "{}", 0);
    qd_safetensors *f = must_open(path);
    ck_assert_uint_eq(qd_safetensors_count(f), 0);
    ck_assert_ptr_null(qd_safetensors_find(f, "a"));
    ck_assert_ptr_null(qd_safetensors_at(f, 0));
    ck_assert_ptr_null(qd_safetensors_metadata_get(f, "format"));
    qd_safetensors_close(f);
    qd_test_rm_tree(d);
}
END_TEST

/* A FIFO (no writer) as the file, as model.safetensors of a directory and as
 * the index is refused at once; open(2) used to block forever. */
START_TEST(test_fifo_refused)
{
    char *d = make_tmpdir();
    char path[512], idx[512];
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    qd_safetensors *f = NULL;
    ck_assert_int_eq(qd_safetensors_open(&f, path), QD_ERR_IO);
    ck_assert_msg(strstr(qd_last_error(), path) && strstr(qd_last_error(), "not a regular file"), "%s",
                  qd_last_error());
    ck_assert_int_eq(qd_safetensors_open(&f, d), QD_ERR_IO);
    ck_assert_msg(strstr(qd_last_error(), path), "%s", qd_last_error());
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", d);
    ck_assert_int_eq(mkfifo(idx, 0600), 0);
    ck_assert_int_eq(qd_safetensors_open(&f, d), QD_ERR_IO);
    ck_assert_msg(strstr(qd_last_error(), idx) && strstr(qd_last_error(), "not a regular file"), "%s",
                  qd_last_error());
    ck_assert_ptr_null(f);
    qd_test_rm_tree(d);
}
END_TEST

/* ---- writing */

START_TEST(test_write_round_trip)
{
    char *d = make_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    static const uint8_t u8[5] = {9, 8, 7, 6, 5};
    static const float f32[6] = {1.5f, -2.0f, 0.0f, -0.0f, 1e-40f, 3.0e38f};
    static const uint16_t bf16[3] = {0x3f80, 0xc000, 0x7f80};
    static const float scalar = 0.125f;
    qd_safetensors_writer *w = NULL;
    ck_assert_int_eq(qd_safetensors_writer_new(&w), QD_OK);
    ck_assert_int_eq(qd_safetensors_writer_add(w, "z.bytes", QD_ST_U8, 1, (int64_t[]){5}, u8), QD_OK);
    ck_assert_int_eq(qd_safetensors_writer_add(w, "a.f32", QD_ST_F32, 2, (int64_t[]){2, 3}, f32), QD_OK);
    uint16_t *own = malloc(sizeof bf16);
    memcpy(own, bf16, sizeof bf16);
    ck_assert_int_eq(qd_safetensors_writer_add_steal(w, "m.bf16", QD_ST_BF16, 1, (int64_t[]){3}, own), QD_OK);
    ck_assert_int_eq(qd_safetensors_writer_add(w, "s", QD_ST_F32, 0, NULL, &scalar), QD_OK);
    ck_assert_int_eq(qd_safetensors_writer_add(w, "e", QD_ST_F32, 2, (int64_t[]){0, 7}, NULL), QD_OK);
    ck_assert_int_eq(qd_safetensors_writer_set_metadata(w, "format", "np"), QD_OK);
    ck_assert_int_eq(qd_safetensors_writer_set_metadata(w, "format", "pt"), QD_OK);
    ck_assert_int_eq(qd_safetensors_writer_write(w, path), QD_OK);
    qd_safetensors_writer_free(w);
    ck_assert_int_eq(qd_test_dir_entries(d), 1);

    /* header: padded with spaces to a multiple of 8 */
    size_t n;
    uint8_t *raw = read_all(path, &n);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | raw[i];
    ck_assert_uint_eq(hlen % 8, 0);
    ck_assert_uint_eq(n, 8 + hlen + 5 + 24 + 6 + 4);
    ck_assert_int_eq(raw[8], '{');

    qd_safetensors *f = must_open(d);   /* a directory opens its model.safetensors */
    ck_assert_uint_eq(qd_safetensors_count(f), 5);
    ck_assert_str_eq(qd_safetensors_metadata_get(f, "format"), "pt");
    ck_assert_uint_eq(qd_safetensors_metadata_count(f), 1);
    const qd_st_tensor *a = must_find(f, "a.f32");
    ck_assert_int_eq(a->shape[1], 3);
    ck_assert_mem_eq(a->data, f32, sizeof f32);
    ck_assert_mem_eq(must_find(f, "z.bytes")->data, u8, 5);
    ck_assert_mem_eq(must_find(f, "m.bf16")->data, bf16, 6);
    ck_assert_int_eq(must_find(f, "s")->ndim, 0);
    ck_assert_int_eq(must_find(f, "e")->numel, 0);
    /* larger dtypes first: each tensor is aligned to its element size */
    const uint8_t *base = (const uint8_t *)a->data;
    for (size_t i = 0; i < qd_safetensors_count(f); i++) {
        const qd_st_tensor *t = qd_safetensors_at(f, i);
        ck_assert_uint_eq((size_t)((const uint8_t *)t->data - base + 8 + hlen) %
                          qd_st_dtype_size(t->dtype), 0);
    }
    qd_safetensors_close(f);
    free(raw);
    qd_test_rm_tree(d);
}
END_TEST

/* Reading the Python file and writing it back loses nothing. */
START_TEST(test_write_copy_of_python_file)
{
    qd_safetensors *in = must_open(qd_test_path(FIX "python_ref.safetensors"));
    qd_safetensors_writer *w = NULL;
    ck_assert_int_eq(qd_safetensors_writer_new(&w), QD_OK);
    for (size_t i = 0; i < qd_safetensors_count(in); i++) {
        const qd_st_tensor *t = qd_safetensors_at(in, i);
        ck_assert_int_eq(qd_safetensors_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data), QD_OK);
    }
    for (size_t i = 0; i < qd_safetensors_metadata_count(in); i++)
        qd_safetensors_writer_set_metadata(w, qd_safetensors_metadata_key(in, i),
                                           qd_safetensors_metadata_value(in, i));
    char *d = make_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/copy.safetensors", d);
    ck_assert_int_eq(qd_safetensors_writer_write(w, path), QD_OK);
    qd_safetensors_writer_free(w);
    qd_safetensors *out = must_open(path);
    assert_same_tensor_sets(in, out);
    ck_assert_str_eq(qd_safetensors_metadata_get(out, "source"),
                     "tests/ref/make_safetensors_fixtures.py");
    qd_safetensors_close(in);
    qd_safetensors_close(out);
    qd_test_rm_tree(d);
}
END_TEST

/* A failed write leaves the old file as it was and no temp file behind. */
START_TEST(test_write_atomic_failure)
{
    char *d = make_tmpdir();
    char path[512], blocked[512];
    snprintf(path, sizeof path, "%s/keep.safetensors", d);
    write_all(path, "old", 3);
    static const float x[2] = {1, 2};
    qd_safetensors_writer *w = NULL;
    ck_assert_int_eq(qd_safetensors_writer_new(&w), QD_OK);
    ck_assert_int_eq(qd_safetensors_writer_add(w, "x", QD_ST_F32, 1, (int64_t[]){2}, x), QD_OK);
    ck_assert_int_eq(qd_safetensors_writer_add(w, "x", QD_ST_F32, 1, (int64_t[]){2}, x), QD_OK);
    ck_assert_int_eq(qd_safetensors_writer_write(w, path), QD_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "'x' was added twice"));
    qd_safetensors_writer_free(w);
    size_t n;
    uint8_t *b = read_all(path, &n);
    ck_assert_uint_eq(n, 3);
    free(b);

    /* the rename fails: the target is a directory */
    snprintf(blocked, sizeof blocked, "%s/blocked", d);
    ck_assert_int_eq(mkdir(blocked, 0755), 0);
    ck_assert_int_eq(qd_safetensors_writer_new(&w), QD_OK);
    ck_assert_int_eq(qd_safetensors_writer_add(w, "x", QD_ST_F32, 1, (int64_t[]){2}, x), QD_OK);
    ck_assert_int_eq(qd_safetensors_writer_write(w, blocked), QD_ERR_IO);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), blocked));
    qd_safetensors_writer_free(w);
    ck_assert_int_eq(qd_test_dir_entries(d), 2);   /* keep.safetensors and blocked/ only */
    qd_test_rm_tree(d);
}
END_TEST

START_TEST(test_writer_rejects_bad_entries)
{
    qd_safetensors_writer *w = NULL;
    ck_assert_int_eq(qd_safetensors_writer_new(&w), QD_OK);
    ck_assert_int_eq(qd_safetensors_writer_add(w, "__metadata__", QD_ST_U8, 0, NULL, "x"), QD_ERR_ARG);
    ck_assert_int_eq(qd_safetensors_writer_add(w, "", QD_ST_U8, 0, NULL, "x"), QD_ERR_ARG);
    ck_assert_int_eq(qd_safetensors_writer_add(w, "n", QD_ST_U8, 1, (int64_t[]){-2}, "x"), QD_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "'shape'"));
    ck_assert_int_eq(qd_safetensors_writer_add(w, "n", QD_ST_NDTYPES, 0, NULL, "x"), QD_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "'dtype'"));
    qd_safetensors_writer_free(w);
}
END_TEST

/* ---- `quads quantize` end to end (runs the built program) */

typedef struct {
    char dir[256];        /* scratch: stdout, stderr, inputs */
    char out[512];        /* the --out directory (not created beforehand) */
    char stdout_[8192], stderr_[8192];
} cli;

static void slurp(char *buf, size_t len, const char *path)
{
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(buf, 1, len - 1, f) : 0;
    buf[n] = 0;
    if (f)
        fclose(f);
}

static void cli_init(cli *c)
{
    make_tmpdir_in(c->dir);
    snprintf(c->out, sizeof c->out, "%s/out", c->dir);
}

/* Runs `quads quantize ARGS` (ARGS may use %s for the --out directory). */
static int cli_run(cli *c, const char *args)
{
    const char *b = getenv("QD_BUILDDIR");
    char a[2048], cmd[4096];
    snprintf(a, sizeof a, args, c->out);
    snprintf(cmd, sizeof cmd, "'%s/quads' quantize %s >'%s/stdout' 2>'%s/stderr'", b ? b : ".", a,
             c->dir, c->dir);
    int rc = system(cmd);
    char p[512];
    snprintf(p, sizeof p, "%s/stdout", c->dir);
    slurp(c->stdout_, sizeof c->stdout_, p);
    snprintf(p, sizeof p, "%s/stderr", c->dir);
    slurp(c->stderr_, sizeof c->stderr_, p);
    ck_assert_msg(rc != -1 && WIFEXITED(rc), "quads did not run: %s", cmd);
    return WEXITSTATUS(rc);
}

static const char *out_file(const cli *c, const char *name)
{
    static _Thread_local char p[600];
    snprintf(p, sizeof p, "%s/%s", c->out, name);
    return p;
}

static json_t *load_json(const char *path)
{
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    ck_assert_msg(j != NULL, "%s: %s", path, e.text);
    return j;
}

START_TEST(test_cli_help)
{
    cli c;
    cli_init(&c);
    ck_assert_int_eq(cli_run(&c, "--help"), 0);
    static const char *const want[] = {"--in", "--out", "--format", "--all", "--report",
                                       "weight_scale_2", "F8_E4M3 [N, K/16]",
                                       "FP8_PER_CHANNEL_PER_TOKEN", "hf_quant_config.json"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        ck_assert_msg(strstr(c.stdout_, want[i]), "--help lacks '%s'", want[i]);
    qd_test_rm_tree(c.dir);
}
END_TEST

/* A small checkpoint written by our writer: one linear weight x (16, K). */
static void write_one_linear(const char *path, int64_t K, float poison)
{
    float *x = malloc((size_t)(16 * K) * sizeof *x);
    for (int64_t i = 0; i < 16 * K; i++)
        x[i] = (float)(i % 7) - 3.0f;
    x[5] = poison;
    qd_safetensors_writer *w = NULL;
    ck_assert_int_eq(qd_safetensors_writer_new(&w), QD_OK);
    ck_assert_int_eq(qd_safetensors_writer_add_steal(w, "model.layers.0.self_attn.q_proj.weight",
                                                     QD_ST_F32, 2, (int64_t[]){16, K}, x), QD_OK);
    ck_assert_int_eq(qd_safetensors_writer_write(w, path), QD_OK);
    qd_safetensors_writer_free(w);
}

typedef struct {
    const char *args;      /* %s: --out; IN: the tiny model; K24/NAN: made by the test */
    const char *err;       /* in stderr */
} cli_error_case;

static const cli_error_case cli_errors[] = {
    {"--in /nonexistent/m.safetensors --out %s", "/nonexistent/m.safetensors"},
    {"--in IN --out %s --format int4", "unknown format 'int4'"},
    {"--in IN --out %s --bogus", "unknown option '--bogus'"},
    {"--in IN --out %s --format", "needs a value"},
    {"--out %s", "--in and --out are required"},
    {"--in IN --out %s extra", "unexpected argument 'extra'"},
    {"--in K24 --out %s", "K = 24 is not a multiple of 16"},
    {"--in NAN --out %s", "q_proj.weight"},
    {"--in BAD --out %s", "field 'dtype'"},
    {"--in EMPTY --out %s", "no tensors"},
};

START_TEST(test_cli_errors)
{
    const cli_error_case *e = &cli_errors[_i];
    cli c;
    cli_init(&c);
    char in[300], k24[300], nan_[300], bad[300], empty[300];
    snprintf(in, sizeof in, "%s", qd_test_path(FIX "tiny_moe.safetensors"));
    snprintf(k24, sizeof k24, "%s/k24.safetensors", c.dir);
    snprintf(nan_, sizeof nan_, "%s/nan.safetensors", c.dir);
    snprintf(bad, sizeof bad, "%s/bad.safetensors", c.dir);
    write_one_linear(k24, 24, 1.0f);
    write_one_linear(nan_, 32, NAN);
    const char *hdr = "{\"a\":{\"dtype\":\"X9\",\"shape\":[1],\"data_offsets\":[0,1]}}";
    write_raw(bad, strlen(hdr), hdr, 1);
    snprintf(empty, sizeof empty, "%s/empty.safetensors", c.dir);
    write_raw(empty, 2, "{}", 0);
    char args[1024] = "";
    for (const char *p = e->args; *p;) {   /* substitute the placeholders */
        const char *sub = !strncmp(p, "IN ", 3) ? in : !strncmp(p, "K24 ", 4) ? k24
                        : !strncmp(p, "NAN ", 4) ? nan_ : !strncmp(p, "BAD ", 4) ? bad
                        : !strncmp(p, "EMPTY ", 6) ? empty : NULL;
        if (sub) {
            strcat(args, sub);
            p = strchr(p, ' ');
        } else {
            strncat(args, p++, 1);
        }
    }
    ck_assert_int_ne(cli_run(&c, args), 0);
    ck_assert_msg(strstr(c.stderr_, e->err), "case %d: stderr '%s' lacks '%s'", _i, c.stderr_, e->err);
    ck_assert_msg(access(out_file(&c, "model.safetensors"), F_OK) != 0, "case %d wrote output", _i);
    if (access(c.out, F_OK) == 0)
        ck_assert_int_eq(qd_test_dir_entries(c.out), 0);   /* no temp file left */
    qd_test_rm_tree(c.dir);
}
END_TEST

/* The tensors of ref (Python's NVFP4, docs/numerics.md §2) are in out bit for
 * bit; every other input tensor is copied unchanged; nothing else is there. */
static void assert_nvfp4_matches_reference(const char *out_path, const char *in_path)
{
    qd_safetensors *out = must_open(out_path), *in = must_open(in_path);
    qd_safetensors *ref = must_open(qd_test_path(FIX "tiny_moe_nvfp4_ref.safetensors"));
    size_t nref = qd_safetensors_count(ref), ncopied = 0;
    for (size_t i = 0; i < nref; i++) {
        const qd_st_tensor *r = qd_safetensors_at(ref, i), *o = must_find(out, r->name);
        ck_assert_int_eq(o->dtype, r->dtype);
        ck_assert_int_eq(o->ndim, r->ndim);
        ck_assert_mem_eq(o->shape, r->shape, (size_t)r->ndim * sizeof r->shape[0]);
        ck_assert_msg(!memcmp(o->data, r->data, r->nbytes), "%s differs from the reference", r->name);
    }
    for (size_t i = 0; i < qd_safetensors_count(in); i++) {
        const qd_st_tensor *t = qd_safetensors_at(in, i);
        char scale[300];
        snprintf(scale, sizeof scale, "%s_scale_2", t->name);
        if (qd_safetensors_find(ref, scale))
            continue;
        const qd_st_tensor *o = must_find(out, t->name);
        ck_assert_int_eq(o->dtype, t->dtype);
        ck_assert_msg(o->nbytes == t->nbytes && !memcmp(o->data, t->data, t->nbytes), "%s", t->name);
        ncopied++;
    }
    ck_assert_uint_eq(nref, 3 * 23);
    ck_assert_uint_eq(ncopied, 12);
    ck_assert_uint_eq(qd_safetensors_count(out), nref + ncopied);
    ck_assert_str_eq(qd_safetensors_metadata_get(out, "format"), "pt");
    qd_safetensors_close(out);
    qd_safetensors_close(in);
    qd_safetensors_close(ref);
}

START_TEST(test_cli_nvfp4_reference)
{
    cli c;
    cli_init(&c);
    char args[600];
    const char *in = qd_test_path(FIX "tiny_moe.safetensors");
    snprintf(args, sizeof args, "--in '%s' --out %%s", in);
    ck_assert_msg(cli_run(&c, args) == 0, "%s", c.stderr_);
    ck_assert_ptr_nonnull(strstr(c.stdout_, "quantized 23 tensors to NVFP4"));
    assert_nvfp4_matches_reference(out_file(&c, "model.safetensors"), in);
    json_t *cfg = load_json(out_file(&c, "hf_quant_config.json"));
    json_t *q = json_object_get(cfg, "quantization");
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(cfg, "producer"), "name")), "quads");
    ck_assert_str_eq(json_string_value(json_object_get(q, "quant_algo")), "NVFP4");
    ck_assert_int_eq(json_integer_value(json_object_get(q, "group_size")), 16);
    json_t *ex = json_object_get(q, "exclude_modules");
    ck_assert_uint_eq(json_array_size(ex), 3);
    ck_assert_str_eq(json_string_value(json_array_get(ex, 0)), "lm_head");
    ck_assert_str_eq(json_string_value(json_array_get(ex, 1)), "model.embed_tokens");
    ck_assert_str_eq(json_string_value(json_array_get(ex, 2)), "model.layers.0.mlp.gate");
    json_decref(cfg);
    ck_assert_int_eq(qd_test_dir_entries(c.out), 2);   /* no report, no temp files */
    qd_test_rm_tree(c.dir);
}
END_TEST

/* A sharded checkpoint gives the same bytes as the single file. */
START_TEST(test_cli_sharded_input)
{
    cli c, d;
    cli_init(&c);
    cli_init(&d);
    char args[600];
    snprintf(args, sizeof args, "--in '%s' --out %%s", qd_test_path(FIX "tiny_moe.safetensors"));
    ck_assert_msg(cli_run(&c, args) == 0, "%s", c.stderr_);
    snprintf(args, sizeof args, "--in '%s' --out %%s", qd_test_path(FIX "sharded"));
    ck_assert_msg(cli_run(&d, args) == 0, "%s", d.stderr_);
    size_t n1, n2;
    uint8_t *a = read_all(out_file(&c, "model.safetensors"), &n1);
    uint8_t *b = read_all(out_file(&d, "model.safetensors"), &n2);
    ck_assert_uint_eq(n1, n2);
    ck_assert(memcmp(a, b, n1) == 0);
    free(a);
    free(b);
    qd_test_rm_tree(c.dir);
    qd_test_rm_tree(d.dir);
}
END_TEST

/* Relative L2 error of the reference NVFP4 tensor `base` against the input. */
static double reference_rel_error(const qd_safetensors *in, const qd_safetensors *ref,
                                  const char *name, double *worst_block)
{
    char n2[300], n3[300];
    snprintf(n2, sizeof n2, "%s_scale", name);
    snprintf(n3, sizeof n3, "%s_scale_2", name);
    const qd_st_tensor *t = must_find(in, name), *codes = must_find(ref, name);
    const uint8_t *q = codes->data, *s = must_find(ref, n2)->data;
    float s_dec;
    memcpy(&s_dec, must_find(ref, n3)->data, 4);
    float *x = to_f32(t);
    int64_t N = t->shape[0], K = t->shape[1];
    double num = 0, den = 0;
    *worst_block = 0;
    for (int64_t r = 0; r < N; r++)
        for (int64_t b = 0; b < K / 16; b++) {
            double e = 0;
            for (int64_t i = b * 16; i < b * 16 + 16; i++) {
                uint8_t code = (uint8_t)(q[(r * K + i) / 2] >> (4 * (i & 1))) & 0xf;
                double d = (double)x[r * K + i] - qd_nvfp4_dequant1(code, s[r * K / 16 + b], s_dec);
                e += d * d;
                den += (double)x[r * K + i] * x[r * K + i];
            }
            num += e;
            *worst_block = fmax(*worst_block, sqrt(e));
        }
    free(x);
    return sqrt(num / den);
}

START_TEST(test_cli_report)
{
    cli c;
    cli_init(&c);
    char args[600];
    const char *in_path = qd_test_path(FIX "tiny_moe.safetensors");
    snprintf(args, sizeof args, "--report --in '%s' --out %%s", in_path);
    ck_assert_msg(cli_run(&c, args) == 0, "%s", c.stderr_);
    ck_assert_ptr_nonnull(strstr(c.stdout_, "model.layers.0.self_attn.q_proj.weight"));
    ck_assert_ptr_nonnull(strstr(c.stdout_, "overall rel_error"));
    json_t *rep = load_json(out_file(&c, "quant_report.json"));
    json_t *ts = json_object_get(rep, "tensors");
    ck_assert_uint_eq(json_array_size(ts), 23);
    qd_safetensors *in = must_open(in_path);
    qd_safetensors *ref = must_open(qd_test_path(FIX "tiny_moe_nvfp4_ref.safetensors"));
    for (size_t i = 0; i < json_array_size(ts); i++) {
        json_t *t = json_array_get(ts, i);
        const char *name = json_string_value(json_object_get(t, "name"));
        double worst, want = reference_rel_error(in, ref, name, &worst);
        double got = json_real_value(json_object_get(t, "rel_error"));
        ck_assert_msg(fabs(got - want) <= 1e-9 * want && want > 0.01 && want < 0.2,
                      "%s: rel_error %.9g, reference %.9g", name, got, want);
        json_t *wb = json_object_get(t, "worst_blocks");
        ck_assert_uint_eq(json_array_size(wb), 8);
        double top = json_real_value(json_object_get(json_array_get(wb, 0), "abs_error"));
        ck_assert_msg(fabs(top - worst) <= 1e-9 * worst, "%s: worst block %g vs %g", name, top, worst);
        for (size_t k = 1; k < 8; k++)
            ck_assert(json_real_value(json_object_get(json_array_get(wb, k), "abs_error")) <=
                      json_real_value(json_object_get(json_array_get(wb, k - 1), "abs_error")));
    }
    qd_safetensors_close(in);
    qd_safetensors_close(ref);
    json_decref(rep);
    qd_test_rm_tree(c.dir);
}
END_TEST

START_TEST(test_cli_all)
{
    cli c;
    cli_init(&c);
    char args[600];
    snprintf(args, sizeof args, "--all --in '%s' --out %%s", qd_test_path(FIX "tiny_moe.safetensors"));
    ck_assert_msg(cli_run(&c, args) == 0, "%s", c.stderr_);
    qd_safetensors *out = must_open(out_file(&c, "model.safetensors"));
    static const char *const extra[] = {"lm_head", "model.embed_tokens", "model.layers.0.mlp.gate"};
    for (int i = 0; i < 3; i++) {
        char n[200];
        snprintf(n, sizeof n, "%s.weight", extra[i]);
        ck_assert_int_eq(must_find(out, n)->dtype, QD_ST_U8);
        snprintf(n, sizeof n, "%s.weight_scale_2", extra[i]);
        must_find(out, n);
    }
    ck_assert_int_eq(must_find(out, "model.norm.weight")->dtype, QD_ST_BF16);
    ck_assert_uint_eq(qd_safetensors_count(out), 9 + 3 * 26);
    qd_safetensors_close(out);
    json_t *cfg = load_json(out_file(&c, "hf_quant_config.json"));
    ck_assert_uint_eq(json_array_size(json_object_get(json_object_get(cfg, "quantization"),
                                                      "exclude_modules")), 0);
    json_decref(cfg);
    qd_test_rm_tree(c.dir);
}
END_TEST

/* K = 24: refused for nvfp4 by default, copied with --all, fine for fp8. */
START_TEST(test_cli_k_not_multiple_of_16)
{
    cli c;
    cli_init(&c);
    char in[300], args[700];
    snprintf(in, sizeof in, "%s/k24.safetensors", c.dir);
    write_one_linear(in, 24, 1.0f);
    snprintf(args, sizeof args, "--all --in '%s' --out %%s", in);
    ck_assert_msg(cli_run(&c, args) == 0, "%s", c.stderr_);
    qd_safetensors *out = must_open(out_file(&c, "model.safetensors"));
    ck_assert_int_eq(must_find(out, "model.layers.0.self_attn.q_proj.weight")->dtype, QD_ST_F32);
    qd_safetensors_close(out);
    snprintf(args, sizeof args, "--format fp8 --in '%s' --out %%s", in);
    ck_assert_msg(cli_run(&c, args) == 0, "%s", c.stderr_);
    out = must_open(out_file(&c, "model.safetensors"));
    ck_assert_int_eq(must_find(out, "model.layers.0.self_attn.q_proj.weight")->dtype, QD_ST_F8_E4M3);
    qd_safetensors_close(out);
    qd_test_rm_tree(c.dir);
}
END_TEST

/* FP8: E4M3 codes [N, K] and F32 row scales [N]; the dequantized weight is
 * within E4M3's rounding of the input (half an ulp: 2^-4 relative for
 * normals, 2^-10 * scale for subnormals). */
START_TEST(test_cli_fp8)
{
    cli c;
    cli_init(&c);
    char args[600];
    const char *in_path = qd_test_path(FIX "tiny_moe.safetensors");
    snprintf(args, sizeof args, "--format fp8 --in '%s' --out %%s", in_path);
    ck_assert_msg(cli_run(&c, args) == 0, "%s", c.stderr_);
    qd_safetensors *out = must_open(out_file(&c, "model.safetensors")), *in = must_open(in_path);
    int nq = 0;
    for (size_t i = 0; i < qd_safetensors_count(out); i++) {
        const qd_st_tensor *q = qd_safetensors_at(out, i);
        if (q->dtype != QD_ST_F8_E4M3)
            continue;
        char sn[300];
        snprintf(sn, sizeof sn, "%s_scale", q->name);
        const qd_st_tensor *s = must_find(out, sn), *t = must_find(in, q->name);
        int64_t N = t->shape[0], K = t->shape[1];
        ck_assert_int_eq(q->shape[0], N);
        ck_assert_int_eq(q->shape[1], K);
        ck_assert_int_eq(s->dtype, QD_ST_F32);
        ck_assert_int_eq(s->ndim, 1);
        ck_assert_int_eq(s->shape[0], N);
        float *x = to_f32(t), *sc = to_f32(s);
        const uint8_t *code = q->data;
        for (int64_t r = 0; r < N; r++)
            for (int64_t k = 0; k < K; k++) {
                double v = x[r * K + k], d = (double)qd_e4m3_to_f32(code[r * K + k]) * sc[r];
                double tol = fmax(fabs(v) * 0x1p-4, 0x1p-10 * sc[r]) * 1.001;
                ck_assert_msg(fabs(v - d) <= tol, "%s[%lld,%lld]: %g vs %g", q->name,
                              (long long)r, (long long)k, v, d);
            }
        free(x);
        free(sc);
        nq++;
    }
    ck_assert_int_eq(nq, 23);
    qd_safetensors_close(out);
    qd_safetensors_close(in);
    json_t *cfg = load_json(out_file(&c, "hf_quant_config.json"));
    json_t *qc = json_object_get(cfg, "quantization");
    ck_assert_str_eq(json_string_value(json_object_get(qc, "quant_algo")), "FP8_PER_CHANNEL_PER_TOKEN");
    ck_assert_ptr_null(json_object_get(qc, "group_size"));
    json_decref(cfg);
    qd_test_rm_tree(c.dir);
}
END_TEST

Suite *suite_safetensors(void)
{
    Suite *s = suite_create("safetensors");
    TCase *r = tcase_create("read");
    tcase_add_test(r, test_read_python_fixture);
    tcase_add_test(r, test_read_python_conversions);
    tcase_add_test(r, test_read_python_integers);
    tcase_add_test(r, test_sharded_index);
    tcase_add_test(r, test_sharded_index_inconsistent);
    tcase_add_test(r, test_missing_file);
    tcase_add_test(r, test_empty_header);
    tcase_add_test(r, test_fifo_refused);
    suite_add_tcase(s, r);
    TCase *m = tcase_create("malformed");
    tcase_add_loop_test(m, test_malformed, 0, (int)(sizeof bad_files / sizeof bad_files[0]));
    tcase_add_test(m, test_truncated);
    suite_add_tcase(s, m);
    TCase *w = tcase_create("write");
    tcase_add_test(w, test_write_round_trip);
    tcase_add_test(w, test_write_copy_of_python_file);
    tcase_add_test(w, test_write_atomic_failure);
    tcase_add_test(w, test_writer_rejects_bad_entries);
    suite_add_tcase(s, w);
    TCase *c = tcase_create("cli");
    tcase_set_timeout(c, 30);
    tcase_add_test(c, test_cli_help);
    tcase_add_loop_test(c, test_cli_errors, 0, (int)(sizeof cli_errors / sizeof cli_errors[0]));
    tcase_add_test(c, test_cli_nvfp4_reference);
    tcase_add_test(c, test_cli_sharded_input);
    tcase_add_test(c, test_cli_report);
    tcase_add_test(c, test_cli_all);
    tcase_add_test(c, test_cli_k_not_multiple_of_16);
    tcase_add_test(c, test_cli_fp8);
    suite_add_tcase(s, c);
    return s;
}
