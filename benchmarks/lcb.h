/* LiveCodeBench (code generation) rows: the tests of a problem, decoded as
 * LiveCodeBench's own loader decodes them
 * (lcb_runner/benchmarks/code_generation.py, CodeGenerationProblem). */
#ifndef QD_BENCH_LCB_H
#define QD_BENCH_LCB_H
#include <stddef.h>
#include <jansson.h>
#include "benchmarks/dataset.h"
#include "rewards/code.h"
#include "quant/status.h"

/* Largest decoded test text accepted (the zlib output and the pickled string). */
#define QD_LCB_MAX_TESTS_BYTES ((size_t)1 << 30)

/* The private_test_cases field of a row: JSON text, or else base64 of zlib of
 * a pickle of JSON text. The pickle comes from the network and is never run:
 * only the opcodes of a pickled str are read (PROTO, FRAME,
 * SHORT_BINUNICODE / BINUNICODE / BINUNICODE8, MEMOIZE, STOP), anything else
 * is refused. On success *tests is a new JSON array of objects
 * {"input": str, "output": str, "testtype": "stdin" | "functional"}
 * (owned by the caller). name is for messages. */
qd_status qd_lcb_decode_private_tests(const char *field, size_t len, const char *name, json_t **tests);

/* The JSON text of a public_test_cases field (or a decoded private one) as a
 * checked array of tests, as above. */
qd_status qd_lcb_parse_tests(const char *text, size_t len, const char *name, json_t **tests);

/* The string a pickle holds (protocol 2-5, one str, nothing else); *out is
 * malloc'd and NUL-terminated, *out_len excludes the NUL. */
qd_status qd_lcb_unpickle_str(const unsigned char *p, size_t n, const char *name, char **out, size_t *out_len);

/* LiveCodeBench's system message of the chat styles
 * (lcb_runner/prompts/code_generation.py @28fef95, SYSTEM_MESSAGE_GENERIC). */
#define QD_LCB_SYSTEM_PROMPT                                                                              \
    "You are an expert Python programmer. You will be given a question (problem specification) and will " \
    "generate a correct Python program that matches the specification and passes all tests."

/* LiveCodeBench's prompt of a problem (the same file,
 * get_generic_question_template_answer): "### Question:", the question,
 * "### Format:" with the starter code in a ```python block (or, without
 * starter code, the stdin/stdout instruction and a "# YOUR CODE HERE" block),
 * "### Answer: (use the provided format with backticks)". starter_code NULL
 * or "" means none. Returns a malloc'd string, NULL when out of memory. */
char *qd_lcb_prompt(const char *question, const char *starter_code);

/* The graded form of a code record: its public tests, then its private ones
 * decoded (qd_lcb_decode_private_tests), and its func_name. name prefixes
 * messages (e.g. "lcb-v1 problem '1873_A'"). Free with qd_code_problem_free. */
qd_status qd_lcb_problem(const qd_bench_code *c, const char *name, qd_code_problem *p);

#endif
