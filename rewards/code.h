/* rewards/code: grading model-written Python as LiveCodeBench grades it
 * (LiveCodeBench/LiveCodeBench@28fef95 lcb_runner/evaluation/testing_util.py;
 * the rules with their sources are in data/benchmarks SOURCES.md, "LiveCodeBench
 * grader"). Each test runs in its own sandbox process (sandbox.h); the
 * expected outputs stay in this process, which compares. */
#ifndef QD_CODE_H
#define QD_CODE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include "quant/status.h"

typedef enum {
    QD_CODE_ACCEPTED,
    QD_CODE_WRONG_ANSWER,
    QD_CODE_TIME_LIMIT,
    QD_CODE_MEMORY_LIMIT,
    QD_CODE_RUNTIME_ERROR, /* an exception, a crash, a compile error, or output past the cap */
    QD_CODE_NO_CODE,       /* fewer than two ``` lines in the output */
    QD_CODE_SANDBOX_ERROR, /* the sandbox could not run it: the grader's fault, not the sample's */
} qd_code_verdict;

/* How many verdicts there are (for tables of counts indexed by verdict). */
#define QD_CODE_N_VERDICTS (QD_CODE_SANDBOX_ERROR + 1)

const char *qd_code_verdict_name(qd_code_verdict v);

typedef struct {
    char *input;  /* stdin text, or one JSON argument per line (functional) */
    char *output; /* expected stdout, or one JSON value (functional) */
} qd_code_test;

typedef struct {
    char *func_name;    /* the method of Solution() to call; NULL for stdin/stdout */
    qd_code_test *tests; /* public first, then private (LCB's order) */
    int ntests;
} qd_code_problem;

/* A LiveCodeBench row (fields as in livecodebench/code_generation_lite):
 * public_test_cases and private_test_cases each a JSON list or a string
 * holding one (private may be absent; its base64/zlib/pickle form is refused
 * with an error saying to decode it first); metadata an object or a string
 * holding one, whose func_name makes the problem functional. Errors name the
 * field; `where` prefixes them (a file and line). */
qd_status qd_code_problem_from_json(const json_t *row, const char *where, qd_code_problem *p);
void qd_code_problem_free(qd_code_problem *p);

/* The code of a model output: the lines between the last two lines that
 * contain "```" (LCB extract_code); NULL when there are fewer than two. */
char *qd_code_extract(const char *output);

/* LCB's stdout comparison: both sides stripped and split into lines, each
 * line stripped; equal line counts; per line equal strings, or else equal
 * lists of Python Decimals (1.0 = 1, 1e2 = 100; no tolerance). */
bool qd_code_stdout_equal(const char *got, const char *expected);
/* Python's == on two JSON values (1 == 1.0, True == 1, dicts by keys). */
bool qd_code_json_equal(const json_t *a, const json_t *b);

typedef struct {
    double test_s;         /* per-test wall and CPU limit (LCB: 6) */
    double problem_s;      /* wall time a sample's tests may use in all; 0: LCB's (test_s + 1) * ntests + 5 */
    size_t mem_bytes;      /* address-space limit of each test (default 4 GiB) */
    int jobs;              /* tests run at once (>= 1) */
} qd_code_opts;

qd_code_opts qd_code_opts_default(void);

typedef struct {
    bool correct;            /* every test passed */
    int passed;              /* tests passed before the first failure (all of them when correct) */
    int total;               /* the problem's tests */
    qd_code_verdict verdict; /* ACCEPTED, or the first failing test's */
    char *detail;            /* owned: why the first failing test failed; NULL when correct */
} qd_code_result;

/* Grades n samples (outputs[i] answering problems[i]); tests of all samples
 * share opts->jobs workers. A sample stops at its first failing test, as
 * LCB's does; results do not depend on jobs. Non-OK only for bad arguments
 * or no memory; a sandbox failure is the verdict SANDBOX_ERROR. */
qd_status qd_code_grade(const qd_code_opts *opts, const char *const *outputs,
                        const qd_code_problem *const *problems, int n, qd_code_result *res);
void qd_code_result_free(qd_code_result *r);

#endif
