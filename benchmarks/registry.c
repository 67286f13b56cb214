/* The benchmark registry and its cache (registry.h).
 *
 * Hub locations were chosen from the hub's file listings; the sha256 of
 * MATH-500 is that of OpenAI's prm800k math_splits/test.jsonl, which
 * HuggingFaceH4/MATH-500 republishes (same 446,564-byte file; see
 * tests/fixtures/benchmarks/SOURCES.md). Row counts come from the same
 * copies; the rows API reports its own total, which must agree. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>
#include "benchmarks/registry.h"
#include "benchmarks/sha256.h"
#include "quant/fileio.h"

#define ROWS_PAGE 100 /* the rows API's largest page */

/* LiveCodeBench's release_vN is test.jsonl .. testN.jsonl of
 * livecodebench/code_generation_lite (its loading script); the parts hold
 * 400, 111, 101, 101, 167 and 175 problems (release_v1 400 .. release_v6 1055
 * in LiveCodeBench's README). The files are large (test.jsonl 1.25 GB). */
static const char *const lcb_parts[] = {"test.jsonl", "test2.jsonl", "test3.jsonl",
                                        "test4.jsonl", "test5.jsonl", "test6.jsonl"};
static const size_t lcb_part_rows[] = {400, 111, 101, 101, 167, 175};
#define LCB_RELEASE(v, total)                                                                         \
    {.name = "lcb-v" #v, .title = "LiveCodeBench code generation, release_v" #v, .source = QD_SRC_FILE, \
     .repo = "livecodebench/code_generation_lite", .revision = "main", .parts = lcb_parts, .nparts = v, \
     .part_rows = lcb_part_rows, .rows = total, .max_bytes = (int64_t)2 << 30, .timeout_s = 6 * 3600,  \
     .resume = 1,                                                                                     \
     .fields = {"question_content", NULL, NULL, "question_id", QD_ANSWER_CODE}, .date_field = "contest_date", \
     .note = "code: rows kept whole for the code grader; private_test_cases decoded by benchmarks/lcb.h; " \
             "--from/--to pick problems by contest_date"}

static const qd_bench_info registry[] = {
    {.name = "gsm8k", .title = "GSM8K test (grade-school math)", .source = QD_SRC_ROWS,
     .repo = "openai/gsm8k", .config = "main", .split = "test", .rows = 1319,
     .fields = {"question", "answer", NULL, NULL, QD_ANSWER_GSM8K},
     .note = "parquet-only on the hub; answer is the text after '####', commas removed"},
    {.name = "math500", .title = "MATH-500 (PRM800K test split of Hendrycks MATH)", .source = QD_SRC_FILE,
     .repo = "HuggingFaceH4/MATH-500", .revision = "ff5b20257d8185524591543f8ff5993951537bb8",
     .path = "test.jsonl", .sha256 = "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132",
     .rows = 500, .fields = {"problem", "answer", "solution", "unique_id", QD_ANSWER_PLAIN},
     .note = "byte-identical to openai/prm800k math_splits/test.jsonl"},
    {.name = "aime24", .title = "AIME 2024 (I and II)", .source = QD_SRC_ROWS,
     .repo = "HuggingFaceH4/aime_2024", .config = "default", .split = "train", .rows = 30,
     .fields = {"problem", "answer", "solution", "id", QD_ANSWER_PLAIN},
     .note = "answers are zero-padded in some copies ('025')"},
    {.name = "aime25", .title = "AIME 2025 (I and II)", .source = QD_SRC_FILE,
     .repo = "math-ai/aime25", .revision = "main", .path = "test.jsonl", .rows = 30,
     .fields = {"problem", "answer", "solution", "id", QD_ANSWER_PLAIN},
     .note = "no pinned digest; recorded at first fetch"},
    {.name = "hmmt25", .title = "HMMT February 2025 (MathArena)", .source = QD_SRC_ROWS,
     .repo = "MathArena/hmmt_feb_2025", .config = "default", .split = "train", .rows = 30,
     .fields = {"problem", "answer", NULL, "problem_idx", QD_ANSWER_SET},
     .note = "parquet-only on the hub; LaTeX answers (fractions, radicals, 2^{25} \\cdot 26!); "
             "#10 lists two roots, read as a set"},
    {.name = "amc23", .title = "AMC 2023 (the 40 problems of Qwen2.5-Math's set)", .source = QD_SRC_ROWS,
     .repo = "math-ai/amc23", .config = "default", .split = "test", .rows = 40,
     .fields = {"question", "answer", NULL, "id", QD_ANSWER_PLAIN},
     .note = "answers stored as numbers (27.0) in some copies: read as '27'"},
    {.name = "minerva", .title = "Minerva Math (OCWCourses)", .source = QD_SRC_FILE,
     .repo = "math-ai/minervamath", .revision = "main", .path = "test.jsonl", .rows = 272,
     .fields = {"question", "answer", NULL, NULL, QD_ANSWER_PLAIN},
     .note = "other copies keep the answer only in the solution's \\boxed{} (style boxed) "
             "or as a list of accepted answers"},
    {.name = "olympiadbench", .title = "OlympiadBench (OE_TO_maths_en_COMP)", .source = QD_SRC_ROWS,
     .repo = "Hothan/OlympiadBench", .config = "OE_TO_maths_en_COMP", .split = "train", .rows = 675,
     .fields = {"question", "final_answer", "solution", "id", QD_ANSWER_PLAIN},
     .note = "final_answer is a list of '$...$' strings: first kept, '$' stripped"},
    {.name = "dapo-math-17k", .title = "DAPO-Math-17k, deduplicated (training set)", .source = QD_SRC_ROWS,
     .repo = "open-r1/DAPO-Math-17k-Processed", .config = "en", .split = "train",
     .fields = {"prompt", "solution", NULL, "extra_info.index", QD_ANSWER_PLAIN},
     .note = "the original BytedTsinghua-SIA copy repeats each prompt ~100 times (1.79M rows)"},
    LCB_RELEASE(1, 400), LCB_RELEASE(2, 511), LCB_RELEASE(3, 612), LCB_RELEASE(4, 713), LCB_RELEASE(5, 880),
    LCB_RELEASE(6, 1055),
    {.name = "arith1", .title = "synthetic: one operation (+ - *), operands 0..99", .source = QD_SRC_SYNTH,
     .synth_steps = 1, .synth_max = 99, .note = "held-out split by a hash of the problem text"},
    {.name = "arith3", .title = "synthetic: three operations, operands 0..20", .source = QD_SRC_SYNTH,
     .synth_steps = 3, .synth_max = 20, .note = "held-out split by a hash of the problem text"},
};

const qd_bench_info *qd_bench_registry(size_t *n)
{
    *n = sizeof registry / sizeof registry[0];
    return registry;
}

const qd_bench_info *qd_bench_find(const char *name)
{
    for (size_t i = 0; i < sizeof registry / sizeof registry[0]; i++)
        if (!strcmp(registry[i].name, name))
            return &registry[i];
    return NULL;
}

/* An environment URL without its trailing slashes. */
static void endpoint(const char *var, const char *dflt, char *out, size_t n)
{
    const char *v = getenv(var);
    snprintf(out, n, "%s", v && *v ? v : dflt);
    for (size_t k = strlen(out); k > 0 && out[k - 1] == '/'; k--)
        out[k - 1] = '\0';
}

static qd_status fit(int written, size_t n, const char *what)
{
    if (written < 0 || (size_t)written >= n)
        return qd_error(QD_ERR_ARG, "%s: path or URL too long", what);
    return QD_OK;
}

qd_status qd_bench_cache_dir(char *out, size_t n)
{
    const char *c = getenv("QUADS_CACHE"), *home = getenv("HOME");
    if (c && *c)
        return fit(snprintf(out, n, "%s", c), n, "QUADS_CACHE");
    if (!home || !*home)
        return qd_error(QD_ERR_ARG, "cache: neither QUADS_CACHE nor HOME is set");
    return fit(snprintf(out, n, "%s/.cache/quads", home), n, "HOME");
}

int qd_bench_nparts(const qd_bench_info *b) { return b->parts ? b->nparts : 1; }

static const char *part_name(const qd_bench_info *b, int k) { return b->parts ? b->parts[k] : b->path; }

qd_status qd_bench_cache_path(const qd_bench_info *b, char *out, size_t n) { return qd_bench_part_path(b, 0, out, n); }

qd_status qd_bench_part_path(const qd_bench_info *b, int k, char *out, size_t n)
{
    char dir[4096];
    qd_status st = qd_bench_cache_dir(dir, sizeof dir);
    if (st != QD_OK)
        return st;
    if (b->source == QD_SRC_FILE)
        return fit(snprintf(out, n, "%s/hub/datasets/%s/%s/%s", dir, b->repo, b->revision, part_name(b, k)), n, b->name);
    if (b->source == QD_SRC_ROWS)
        return fit(snprintf(out, n, "%s/rows/%s/%s/%s.jsonl", dir, b->repo, b->config, b->split), n, b->name);
    return qd_error(QD_ERR_ARG, "%s: synthetic benchmarks are generated, not cached", b->name);
}

qd_status qd_bench_file_url(const qd_bench_info *b, char *out, size_t n) { return qd_bench_part_url(b, 0, out, n); }

qd_status qd_bench_part_url(const qd_bench_info *b, int k, char *out, size_t n)
{
    char base[2048];
    endpoint("HF_ENDPOINT", "https://huggingface.co", base, sizeof base);
    return fit(snprintf(out, n, "%s/datasets/%s/resolve/%s/%s", base, b->repo, b->revision, part_name(b, k)), n, b->name);
}

/* 1: path holds a copy whose sha256 equals the pin, else the digest recorded
 * beside it at fetch time (path.sha256); 0: no usable copy. */
static int cached_ok(const char *path, const char *pin)
{
    char hex[65], side[4200], rec[80] = "";
    struct stat sb;
    if (stat(path, &sb) || qd_sha256_file(path, hex) != QD_OK)
        return 0;
    if (pin)
        return !strcasecmp(hex, pin);
    snprintf(side, sizeof side, "%s.sha256", path);
    FILE *f = fopen(side, "r");
    if (!f)
        return 0;
    int ok = fgets(rec, sizeof rec, f) && !strncmp(rec, hex, 64);
    fclose(f);
    return ok;
}

static qd_status record_digest(const char *path, const char *hex)
{
    char side[4200], line[66];
    snprintf(side, sizeof side, "%s.sha256", path);
    snprintf(line, sizeof line, "%s\n", hex);
    return qd_atomic_write(side, line, 65);
}

/* The fetch options for b: the entry's own size and time limits where it
 * has them (LiveCodeBench's files are far over the 256 MiB default), else
 * the caller's. */
static qd_fetch_opts limits_for(const qd_bench_info *b, const qd_fetch_opts *o)
{
    qd_fetch_opts l = *o;
    if (b->max_bytes)
        l.max_bytes = b->max_bytes;
    if (b->timeout_s)
        l.timeout_s = b->timeout_s;
    l.resume = b->resume;
    return l;
}

/* Re-raises the current error with everything outside printable ASCII
 * replaced: parser messages quote the server's bytes. */
static qd_status sanitized_error(qd_status st)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", qd_last_error());
    return qd_error(st, "%s", qd_fetch_sanitize(msg));
}

/* A download must parse with the entry's fields into the expected count. */
typedef struct {
    const char *name; /* the cached file's path: its suffix decides the format (.csv) */
    const qd_bench_fields *fields;
    size_t rows;      /* 0: any nonzero count */
    const char *date_field;
} parse_check;

static qd_status check_parses(const char *data, size_t len, const char *url, void *ctx)
{
    parse_check *c = ctx;
    qd_bench_set s;
    /* code rows are counted, not kept (they are large): an empty window */
    qd_bench_window none = {c->date_field, "9999", "0000"};
    qd_status st = qd_bench_parse_window(data, len, c->name, c->fields, c->date_field ? &none : NULL, &s);
    if (st != QD_OK)
        return sanitized_error(st);
    if (c->rows && s.read != c->rows)
        st = qd_error(QD_ERR_FORMAT, "%s: %zu records, the registry expects %zu", url, s.read, c->rows);
    qd_bench_set_free(&s);
    return st;
}

/* Every row of one rows-API page, as JSONL appended to out; *total gets num_rows_total. */
static qd_status rows_page(const char *url, const char *text, size_t len, size_t offset, size_t *total, FILE *out)
{
    json_error_t err;
    json_t *root = json_loadb(text, len, 0, &err);
    if (!root)
        return qd_error(QD_ERR_FORMAT, "%s: invalid JSON reply: %s", url, qd_fetch_sanitize(err.text));
    const json_t *rows = json_object_get(root, "rows"), *tot = json_object_get(root, "num_rows_total");
    qd_status st = QD_OK;
    if (!json_is_array(rows) || !json_is_integer(tot) || json_integer_value(tot) < 0)
        st = qd_error(QD_ERR_FORMAT, "%s: reply lacks field 'rows' (array) or 'num_rows_total' (integer)", url);
    else
        *total = (size_t)json_integer_value(tot);
    for (size_t i = 0; st == QD_OK && i < json_array_size(rows); i++) {
        const json_t *r = json_array_get(rows, i), *row = json_object_get(r, "row");
        const json_t *idx = json_object_get(r, "row_idx"), *cut = json_object_get(r, "truncated_cells");
        if (!json_is_object(row))
            st = qd_error(QD_ERR_FORMAT, "%s: rows[%zu]: field 'row' is not an object", url, i);
        else if (idx && (!json_is_integer(idx) || (size_t)json_integer_value(idx) != offset + i))
            st = qd_error(QD_ERR_FORMAT, "%s: rows[%zu]: field 'row_idx' is not %zu", url, i, offset + i);
        else if (json_array_size(cut) > 0)
            st = qd_error(QD_ERR_FORMAT, "%s: rows[%zu]: the server truncated cells of row %zu", url, i, offset + i);
        else {
            char *line = json_dumps(row, JSON_COMPACT);
            if (!line || fprintf(out, "%s\n", line) < 0)
                st = qd_error(QD_ERR_IO, "%s: cannot buffer rows", url);
            free(line);
        }
    }
    size_t want = *total > offset ? (*total - offset < ROWS_PAGE ? *total - offset : ROWS_PAGE) : 0;
    if (st == QD_OK && json_array_size(rows) != want)
        st = qd_error(QD_ERR_FORMAT, "%s: %zu rows at offset %zu of %zu, expected %zu", url,
                      json_array_size(rows), offset, *total, want);
    json_decref(root);
    return st;
}

/* The first page's num_rows_total bounds the paging: the registry's count
 * when it has one, else the entry's (or the global) maximum. */
static qd_status check_total(const qd_bench_info *b, size_t total)
{
    size_t most = b->max_rows ? b->max_rows : QD_BENCH_MAX_ROWS;
    if (b->rows && total != b->rows)
        return qd_error(QD_ERR_FORMAT, "%s: the rows API reports %zu rows, the registry expects %zu", b->name, total, b->rows);
    if (total > most)
        return qd_error(QD_ERR_FORMAT, "%s: the rows API claims %zu rows, more than the %zu this benchmark may have",
                        b->name, total, most);
    return QD_OK;
}

/* Pages through the rows API into memory, checks that the rows parse, then
 * writes the JSONL atomically. */
static qd_status fetch_rows(const qd_bench_info *b, const qd_fetch_opts *o, const char *path, char hex[65])
{
    char base[2048], url[4096];
    endpoint("HF_DATASETS_SERVER", "https://datasets-server.huggingface.co", base, sizeof base);
    char *all = NULL;
    size_t all_len = 0, total = 0, first_total = 0;
    FILE *out = open_memstream(&all, &all_len);
    if (!out)
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", b->name);
    qd_status st = QD_OK;
    for (size_t off = 0; st == QD_OK && (off == 0 || off < total); off += ROWS_PAGE) {
        snprintf(url, sizeof url, "%s/rows?dataset=%s&config=%s&split=%s&offset=%zu&length=%d",
                 base, b->repo, b->config, b->split, off, ROWS_PAGE);
        char *text;
        size_t len;
        st = qd_fetch_memory(url, o, &text, &len);
        if (st == QD_OK) {
            st = rows_page(url, text, len, off, &total, out);
            free(text);
        }
        if (st == QD_OK && off == 0) {
            first_total = total;
            st = check_total(b, total);
        }
        if (st == QD_OK && o->progress && isatty(STDERR_FILENO))
            fprintf(stderr, "\r%-28.28s rows %zu/%zu%s", b->name, off + ROWS_PAGE < total ? off + ROWS_PAGE : total,
                    total, off + ROWS_PAGE >= total ? "\n" : "");
        if (st == QD_OK && total != first_total)
            st = qd_error(QD_ERR_FORMAT, "%s: num_rows_total changed while paging (%zu, then %zu)", url, first_total, total);
        if (st == QD_OK && (fflush(out) || (o->max_bytes > 0 && (int64_t)all_len > o->max_bytes)))
            st = qd_error(QD_ERR_FORMAT, "%s: the rows are larger than the limit of %lld bytes", b->name,
                          (long long)o->max_bytes);
    }
    fclose(out);
    parse_check c = {path, &b->fields, b->rows, b->date_field};
    if (st == QD_OK)
        st = check_parses(all, all_len, b->name, &c);
    if (st == QD_OK)
        st = qd_atomic_write(path, all, all_len);
    if (st == QD_OK)
        qd_sha256_hex(all, all_len, hex);
    free(all);
    return st;
}

/* One part of an entry into the cache, under the directory lock. */
static qd_status fetch_part(const qd_bench_info *b, int k, const qd_fetch_opts *o, const char *path)
{
    const char *pin = b->parts ? NULL : b->sha256;
    int lock;
    qd_status st = qd_fetch_lock(path, &lock);
    if (st != QD_OK || cached_ok(path, pin)) { /* fetched by another process while we waited */
        qd_fetch_unlock(lock);
        return st;
    }
    char hex[65], url[4096];
    qd_fetch_opts l = limits_for(b, o);
    if (b->source == QD_SRC_ROWS) {
        st = fetch_rows(b, &l, path, hex);
    } else {
        parse_check c = {path, &b->fields, b->part_rows ? b->part_rows[k] : b->parts ? 0 : b->rows, b->date_field};
        st = qd_bench_part_url(b, k, url, sizeof url);
        if (st == QD_OK)
            st = qd_fetch_file_checked(url, path, pin, &l, check_parses, &c, hex);
    }
    if (st == QD_OK)
        st = record_digest(path, hex);
    qd_fetch_unlock(lock);
    return st;
}

qd_status qd_bench_fetch(const qd_bench_info *b, const qd_fetch_opts *o, char *path, size_t n)
{
    qd_status st = QD_OK;
    for (int k = qd_bench_nparts(b) - 1; k >= 0 && st == QD_OK; k--) {
        st = qd_bench_part_path(b, k, path, n); /* part 0 last: path ends as the first part's */
        if (st != QD_OK || cached_ok(path, b->parts ? NULL : b->sha256))
            continue;
        struct stat sb;
        if (o->offline)
            return qd_error(QD_ERR_NET, "%s: offline and %s %s", b->name, path,
                            stat(path, &sb) ? "is not in the cache" : "fails its sha256 check");
        st = fetch_part(b, k, o, path);
    }
    return st;
}

/* Appends the records of src to dst (src is emptied). */
static qd_status append_set(qd_bench_set *dst, qd_bench_set *src, const char *name)
{
    qd_bench_record *r = realloc(dst->rec, (dst->n + src->n + 1) * sizeof *r);
    if (!r)
        return qd_error(QD_ERR_NOMEM, "%s: out of memory", name);
    if (src->n)
        memcpy(r + dst->n, src->rec, src->n * sizeof *r);
    dst->rec = r;
    dst->n += src->n;
    dst->read += src->read;
    free(src->rec);
    memset(src, 0, sizeof *src);
    return QD_OK;
}

qd_status qd_bench_load(const qd_bench_info *b, const qd_fetch_opts *o, qd_bench_set *out)
{
    return qd_bench_load_window(b, o, NULL, NULL, out);
}

qd_status qd_bench_load_window(const qd_bench_info *b, const qd_fetch_opts *o, const char *from, const char *to,
                               qd_bench_set *out)
{
    char path[4096];
    memset(out, 0, sizeof *out);
    if ((from || to) && !b->date_field)
        return qd_error(QD_ERR_ARG, "%s: its records have no date to select by", b->name);
    qd_bench_window win = {b->date_field, from, to};
    qd_status st = qd_bench_fetch(b, o, path, sizeof path);
    for (int k = 0; st == QD_OK && k < qd_bench_nparts(b); k++) {
        qd_bench_set part;
        st = qd_bench_part_path(b, k, path, sizeof path);
        if (st == QD_OK)
            st = qd_bench_load_file_window(path, &b->fields, &win, &part);
        if (st == QD_OK && (st = append_set(out, &part, b->name)) != QD_OK)
            qd_bench_set_free(&part);
    }
    if (st == QD_OK && b->rows && out->read != b->rows)
        st = qd_error(QD_ERR_FORMAT, "%s: %zu records, the registry expects %zu", b->name, out->read, b->rows);
    if (st != QD_OK)
        qd_bench_set_free(out);
    return st;
}

qd_status qd_bench_load_url(const char *url, const qd_bench_fields *fields, const qd_fetch_opts *o,
                            qd_bench_set *out)
{
    /* Cached under a digest of the URL, keeping the file name (its .csv matters). */
    char dir[4096], path[4096], key[65], name[256];
    memset(out, 0, sizeof *out);
    qd_status st = qd_bench_cache_dir(dir, sizeof dir);
    if (st != QD_OK)
        return st;
    const char *q = strchr(url, '?'), *end = q ? q : url + strlen(url), *s = end;
    while (s > url && s[-1] != '/')
        s--;
    snprintf(name, sizeof name, "%.*s", (int)(end - s), s);
    qd_sha256_hex(url, strlen(url), key);
    st = fit(snprintf(path, sizeof path, "%s/urls/%.16s/%s", dir, key, *name ? name : "data"), sizeof path, url);
    int lock = -1;
    if (st == QD_OK && !cached_ok(path, NULL) && (st = qd_fetch_lock(path, &lock)) == QD_OK &&
        !cached_ok(path, NULL)) {
        char hex[65];
        parse_check c = {path, fields, 0, NULL};
        st = qd_fetch_file_checked(url, path, NULL, o, check_parses, &c, hex);
        if (st == QD_OK)
            st = record_digest(path, hex);
    }
    qd_fetch_unlock(lock);
    return st == QD_OK ? qd_bench_load_file(path, fields, out) : st;
}
