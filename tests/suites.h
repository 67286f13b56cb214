/* One Check suite per module; tests/main.c runs them all. */
#ifndef QD_TEST_SUITES_H
#define QD_TEST_SUITES_H
#include <check.h>

Suite *suite_status(void);
Suite *suite_quant(void);
Suite *suite_safetensors(void);
Suite *suite_tokenizer(void);
Suite *suite_rewards(void);
Suite *suite_benchmarks(void);
Suite *suite_backend_cpu(void);

/* Path of a file under the source tree (QD_SRCDIR, set by make check). */
const char *qd_test_path(const char *rel);

#endif
