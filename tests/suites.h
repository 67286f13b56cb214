/* One Check suite per module; tests/main.c runs them all. */
#ifndef QD_TEST_SUITES_H
#define QD_TEST_SUITES_H
#include <check.h>
#include <jansson.h>
#include "models/model_config.h"

Suite *suite_status(void);
Suite *suite_quant(void);
Suite *suite_safetensors(void);
Suite *suite_tokenizer(void);
Suite *suite_rewards(void);
Suite *suite_eval(void);
Suite *suite_benchmarks(void);
Suite *suite_backend_cpu(void);
Suite *suite_ops(void);
Suite *suite_orchestrator(void);
Suite *suite_tiny(void);
Suite *suite_rl(void);
Suite *suite_sampling(void);
Suite *suite_models(void);
Suite *suite_dist(void);
Suite *suite_tb(void);
Suite *suite_sandbox(void);
Suite *suite_code(void);
Suite *suite_sync(void);
Suite *suite_report(void);

/* Path of a file under the source tree (QD_SRCDIR, set by make check). */
const char *qd_test_path(const char *rel);

/* Scratch directories: qd_test_mkdtemp makes a fresh /tmp/qd_TAG_XXXXXX in dir
 * (n bytes) and returns dir; qd_test_rm_tree removes a tree; qd_test_dir_entries
 * counts a directory's entries other than . and .. (a leftover temp file shows). */
char *qd_test_mkdtemp(char *dir, size_t n, const char *tag);
void qd_test_rm_tree(const char *dir);
int qd_test_dir_entries(const char *dir);
/* dir/name in a static buffer (the next call overwrites it). */
const char *qd_test_join(const char *dir, const char *name);

/* Small text files: qd_test_write_file writes text to path; qd_test_read_file
 * returns the whole file (up to 64 KiB) as a string in a static buffer (the
 * next call overwrites it). Both fail the test when the file cannot be opened. */
void qd_test_write_file(const char *path, const char *text);
const char *qd_test_read_file(const char *path);
/* Whether two files hold the same bytes (fails the test when one cannot be read). */
int qd_test_same_file(const char *a, const char *b);
/* Every line of a JSONL file as one JSON array (owned by the caller); fails the
 * test when the file cannot be opened or a line is not JSON. */
json_t *qd_test_load_jsonl(const char *path);

/* Runs `quads ARGS` from the build tree (QD_BUILDDIR; make builds it before
 * make check) with stdout+stderr into out (n bytes, NUL-terminated); returns
 * its exit status, -1 when it did not exit normally. */
int qd_test_run_quads(const char *args, char *out, size_t n);
/* The same with tests/rl_hooks (quads rl with the hooks of the environment's
 * QD_RL_TEST_KILL_STEP and QD_RL_TEST_NAN_STEP; args start with "rl"). */
int qd_test_run_rl_hooks(const char *args, char *out, size_t n);

/* A small Qwen3-MoE for tests (qd_sft_make_config's architecture): hidden 32,
 * 2 layers, 4 heads / 2 kv heads of 16, top-2 experts of width 16, every layer
 * MoE, untied head, norm_topk_prob; the vocabulary, expert count and context
 * length vary by test. */
qd_model_config qd_test_moe_config(int vocab, int experts, int max_positions);

#endif
