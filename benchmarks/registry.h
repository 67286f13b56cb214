/* The benchmark registry: where each benchmark lives on the Hugging Face hub,
 * how its fields map to qd_bench_record, and the local cache that holds it. */
#ifndef QD_BENCH_REGISTRY_H
#define QD_BENCH_REGISTRY_H
#include <stddef.h>
#include "benchmarks/dataset.h"
#include "benchmarks/fetch.h"

typedef enum {
    QD_SRC_FILE,  /* one file: $HF_ENDPOINT/datasets/REPO/resolve/REVISION/PATH */
    QD_SRC_ROWS,  /* parquet-only datasets: the dataset viewer's JSON rows API, 100 rows a request */
    QD_SRC_SYNTH, /* generated here (synth.h) */
} qd_bench_source;

typedef struct {
    const char *name;
    const char *title;
    qd_bench_source source;
    const char *repo;     /* "owner/name" on the hub */
    const char *revision; /* FILE: a commit or "main" */
    const char *path;     /* FILE: path in the repo */
    const char *const *parts; /* FILE: instead of path, nparts files read as one benchmark */
    int nparts;
    const size_t *part_rows;  /* records in each part (checked before a part is cached), or NULL */
    int resume;           /* FILE: an interrupted download resumes (HTTP Range) from its .part file */
    const char *config;   /* ROWS */
    const char *split;    /* ROWS */
    const char *sha256;   /* FILE: pinned digest, or NULL when not known */
    size_t rows;          /* expected record count, 0 when not known */
    size_t max_rows;      /* ROWS without a known count: the most a reply may claim (0: QD_BENCH_MAX_ROWS) */
    int64_t max_bytes;    /* largest download, in place of the fetch options' (0: theirs) */
    long timeout_s;       /* longest attempt, in place of the fetch options' (0: theirs) */
    qd_bench_fields fields;
    const char *date_field; /* records' date, for a date window (qd_bench_load_window), or NULL */
    int synth_steps;      /* SYNTH: operations per problem */
    int synth_max;        /* SYNTH: largest operand */
    const char *note;     /* provenance and quirks */
} qd_bench_info;

/* Rows a rows-API benchmark of unknown size may have: a reply claiming more
 * is refused before any further request. */
#define QD_BENCH_MAX_ROWS 1000000

/* The table (static storage); *n gets its length. */
const qd_bench_info *qd_bench_registry(size_t *n);
/* NULL when no entry has that name. */
const qd_bench_info *qd_bench_find(const char *name);

/* $QUADS_CACHE, else ~/.cache/quads. */
qd_status qd_bench_cache_dir(char *out, size_t n);
/* Where the cached copy of a FILE or ROWS entry lives (whether or not it
 * exists); of its first part when it has several. */
qd_status qd_bench_cache_path(const qd_bench_info *b, char *out, size_t n);
/* The URL a FILE entry (its first part) is fetched from ($HF_ENDPOINT, default https://huggingface.co). */
qd_status qd_bench_file_url(const qd_bench_info *b, char *out, size_t n);
/* Files of an entry: 1, or nparts; the cache path and URL of part k. */
int qd_bench_nparts(const qd_bench_info *b);
qd_status qd_bench_part_path(const qd_bench_info *b, int k, char *out, size_t n);
qd_status qd_bench_part_url(const qd_bench_info *b, int k, char *out, size_t n);

/* Makes sure the entry is in the cache and passes its sha256 check (the pinned
 * digest, else the one recorded when it was fetched), fetching it unless
 * offline; path receives the cached file. A download is cached only once it
 * parses with the entry's fields into the expected number of records, within
 * the entry's limits (its own where it has them, else those of o). */
qd_status qd_bench_fetch(const qd_bench_info *b, const qd_fetch_opts *o, char *path, size_t n);
/* Fetches (or finds in the cache) and parses a FILE or ROWS entry, every
 * part in order. */
qd_status qd_bench_load(const qd_bench_info *b, const qd_fetch_opts *o, qd_bench_set *out);
/* The same, keeping the records dated in [from, to] (YYYY-MM-DD, inclusive;
 * NULL: unbounded) of an entry with a date_field. */
qd_status qd_bench_load_window(const qd_bench_info *b, const qd_fetch_opts *o, const char *from, const char *to,
                               qd_bench_set *out);
/* Any file at a URL, cached under $QUADS_CACHE/urls/, parsed with fields. */
qd_status qd_bench_load_url(const char *url, const qd_bench_fields *fields, const qd_fetch_opts *o,
                            qd_bench_set *out);

#endif
