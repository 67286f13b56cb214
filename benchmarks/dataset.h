/* Benchmark records: problem/answer pairs normalized at load time from the
 * differing layouts real benchmark files use (JSON arrays, JSONL even under a
 * .json name, CSV answer keys; answers as strings, numbers or arrays). */
#ifndef QD_BENCH_DATASET_H
#define QD_BENCH_DATASET_H
#include <stddef.h>
#include "quant/status.h"

/* How the gold answer is read from its field. */
typedef enum {
    QD_ANSWER_PLAIN, /* the value itself: strings trimmed, 27.0 -> "27", arrays -> first + alternatives */
    QD_ANSWER_GSM8K, /* the text after the last "####", commas removed (GSM8K's own dataset.py) */
    QD_ANSWER_BOXED, /* the last \boxed{...} of the text (Hendrycks MATH, Minerva solutions) */
    QD_ANSWER_SET,   /* as plain, and a top-level comma list "a, b" becomes the set "\{a, b\}":
                        answers listed in any order (HMMT's "list of two expressions") */
} qd_answer_style;

/* Field paths: a key, or keys and array indexes joined by '.' ("prompt.0.content");
 * a key that itself contains '.' is matched whole first. */
typedef struct {
    const char *problem;  /* NULL for answer-key files (problem left "") */
    const char *answer;   /* required */
    const char *solution; /* optional: NULL, or absent in a record, gives solution NULL */
    const char *id;       /* optional: the record's index ("0", "1", ...) when NULL or absent */
    qd_answer_style style;
} qd_bench_fields;

typedef struct {
    char *id;
    char *problem;
    char *answer;   /* never NULL */
    char *solution; /* NULL when the file has none */
    char **alt;     /* further accepted answers (array-valued answer fields), n_alt of them */
    size_t n_alt;
} qd_bench_record;

/* Owns its records and their strings. */
typedef struct {
    qd_bench_record *rec;
    size_t n;
} qd_bench_set;

/* Parses text (JSON array, JSONL, or CSV with a header when name ends in .csv);
 * name is used in error messages. On error out is empty. */
qd_status qd_bench_parse(const char *text, size_t len, const char *name,
                         const qd_bench_fields *fields, qd_bench_set *out);
qd_status qd_bench_load_file(const char *path, const qd_bench_fields *fields, qd_bench_set *out);
void qd_bench_set_free(qd_bench_set *s);

/* Parses "plain", "gsm8k", "boxed" or "set". */
qd_status qd_bench_style_parse(const char *s, qd_answer_style *out);
const char *qd_bench_style_name(qd_answer_style s);

/* Content of the last \boxed{...} (or \fbox{...}) with nested braces, as in
 * Hendrycks' last_boxed_only_string + remove_boxed: NULL when there is none.
 * Returns a malloc'd string. */
char *qd_bench_last_boxed(const char *text);

#endif
