/* LiveCodeBench (code generation) rows: the tests of a problem, decoded as
 * LiveCodeBench's own loader decodes them
 * (lcb_runner/benchmarks/code_generation.py, CodeGenerationProblem). */
#ifndef QD_BENCH_LCB_H
#define QD_BENCH_LCB_H
#include <stddef.h>
#include <jansson.h>
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

#endif
