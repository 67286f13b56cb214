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
    QD_ANSWER_CODE,  /* code problems (LiveCodeBench rows): no answer field (answer ""); the
                        problem becomes LiveCodeBench's prompt and the tests go to code */
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

/* Records by date: field holds an ISO 8601 date ("2023-05-07T00:00:00"),
 * kept in the record; only records whose YYYY-MM-DD lies in [from, to] are
 * kept, both inclusive as LiveCodeBench's --start_date/--end_date (NULL:
 * unbounded; a record without the field is dropped when a bound is set). */
typedef struct {
    const char *field, *from, *to;
} qd_bench_window;

/* 1 when s is a date YYYY-MM-DD (digits and dashes in place). */
int qd_bench_date_ok(const char *s);

/* A code problem (QD_ANSWER_CODE), from the fields of a
 * livecodebench/code_generation_lite row. The tests stay as the row holds
 * them (text): the private ones are large and compressed, and are decoded
 * only to grade (benchmarks/lcb.h qd_lcb_problem). */
typedef struct {
    char *question;      /* question_content (the problem field), without the prompt around it */
    char *starter_code;  /* starter_code; "" when none (stdin/stdout problems) */
    char *func_name;     /* metadata's func_name: the method of Solution() the tests call; NULL: stdin/stdout */
    char *platform;      /* platform ("atcoder", "codeforces", "leetcode"); "" when absent */
    char *public_tests;  /* public_test_cases: the JSON text of a list of {input, output, testtype} */
    char *private_tests; /* private_test_cases as stored: JSON text, or base64 of zlib of a pickle of it
                            (lcb.h); NULL when absent or empty */
} qd_bench_code;

typedef struct {
    char *id;
    char *problem;  /* QD_ANSWER_CODE: LiveCodeBench's prompt around the question (qd_lcb_prompt) */
    char *answer;   /* never NULL */
    char *solution; /* NULL when the file has none */
    char **alt;     /* further accepted answers (array-valued answer fields), n_alt of them */
    size_t n_alt;
    char *date;     /* the date field's text, NULL when none */
    qd_bench_code *code; /* QD_ANSWER_CODE: the tests and what the prompt needs; else NULL */
} qd_bench_record;

/* Owns its records and their strings. */
typedef struct {
    qd_bench_record *rec;
    size_t n;
    size_t read;    /* records in the file, before the date window */
} qd_bench_set;

/* Parses text (JSON array, JSONL, or CSV with a header when name ends in .csv);
 * name is used in error messages. A text without records is an error; one
 * whose records all fall outside the date window is not (out->n == 0,
 * out->read > 0). On error out is empty. */
qd_status qd_bench_parse(const char *text, size_t len, const char *name,
                         const qd_bench_fields *fields, qd_bench_set *out);
/* The same within a date window (win may be NULL). */
qd_status qd_bench_parse_window(const char *text, size_t len, const char *name, const qd_bench_fields *fields,
                                const qd_bench_window *win, qd_bench_set *out);
/* Parses a file (mapped, not read: LiveCodeBench's are over a gigabyte). */
qd_status qd_bench_load_file(const char *path, const qd_bench_fields *fields, qd_bench_set *out);
qd_status qd_bench_load_file_window(const char *path, const qd_bench_fields *fields, const qd_bench_window *win,
                                    qd_bench_set *out);
void qd_bench_set_free(qd_bench_set *s);

/* Parses "plain", "gsm8k", "boxed", "set" or "code". */
qd_status qd_bench_style_parse(const char *s, qd_answer_style *out);
const char *qd_bench_style_name(qd_answer_style s);

/* Content of the last \boxed{...} (or \fbox{...}) with nested braces, as in
 * Hendrycks' last_boxed_only_string + remove_boxed: NULL when there is none.
 * Returns a malloc'd string. */
char *qd_bench_last_boxed(const char *text);

#endif
