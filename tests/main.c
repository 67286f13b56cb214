/* The Check runner: one suite per module, and helpers they share. */
#define _GNU_SOURCE /* nftw */
#include <dirent.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include "tests/suites.h"
#include "quant/status.h"
#include "quant/fileio.h"
#include "orchestrator/sft.h"

const char *qd_test_path(const char *rel)
{
    static _Thread_local char buf[4096];
    const char *src = getenv("QD_SRCDIR");
    snprintf(buf, sizeof buf, "%s/%s", src ? src : ".", rel);
    return buf;
}

char *qd_test_mkdtemp(char *dir, size_t n, const char *tag)
{
    snprintf(dir, n, "/tmp/qd_%s_XXXXXX", tag);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    return dir;
}

static int rm_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    return remove(path);
}

void qd_test_rm_tree(const char *dir) { nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

int qd_test_dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

START_TEST(test_status_message)
{
    ck_assert_int_eq(qd_error(QD_ERR_FORMAT, "%s: field '%s'", "a.json", "x"), QD_ERR_FORMAT);
    ck_assert_str_eq(qd_last_error(), "a.json: field 'x'");
    ck_assert_str_eq(qd_status_str(QD_ERR_NONFINITE), "non-finite value");
}
END_TEST

Suite *suite_status(void)
{
    Suite *s = suite_create("status");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_status_message);
    suite_add_tcase(s, tc);
    return s;
}

const char *qd_test_join(const char *dir, const char *name)
{
    static char buf[256];
    snprintf(buf, sizeof buf, "%s/%s", dir, name);
    return buf;
}

void qd_test_write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

const char *qd_test_read_file(const char *path)
{
    static char buf[1 << 16];
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

int qd_test_same_file(const char *a, const char *b)
{
    char *ta, *tb;
    size_t la, lb;
    ck_assert_msg(qd_read_file(a, &ta, &la) == QD_OK, "cannot read %s", a);
    ck_assert_msg(qd_read_file(b, &tb, &lb) == QD_OK, "cannot read %s", b);
    int same = la == lb && memcmp(ta, tb, la) == 0;
    free(ta), free(tb);
    return same;
}

json_t *qd_test_load_jsonl(const char *path)
{
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    json_t *arr = json_array();
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) >= 0) {
        json_error_t err;
        json_t *o = json_loads(line, 0, &err);
        ck_assert_msg(o != NULL, "%s: %s", path, err.text);
        json_array_append_new(arr, o);
    }
    free(line);
    fclose(f);
    return arr;
}

/* The build tree's program prog with args; its output into out, its exit status returned. */
static int run_program(const char *prog, const char *args, char *out, size_t n)
{
    const char *bd = getenv("QD_BUILDDIR");
    char cmd[4096];
    int w = snprintf(cmd, sizeof cmd, "%s/%s %s 2>&1", bd ? bd : ".", prog, args);
    ck_assert_msg(w >= 0 && (size_t)w < sizeof cmd, "command too long: %s", cmd);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t k = fread(out, 1, n - 1, p);
    out[k] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int qd_test_run_quads(const char *args, char *out, size_t n) { return run_program("quads", args, out, n); }

int qd_test_run_rl_hooks(const char *args, char *out, size_t n) { return run_program("tests/rl_hooks", args, out, n); }

qd_model_config qd_test_moe_config(int vocab, int experts, int max_positions)
{
    const qd_sft_dims d = {
        .hidden = 32, .layers = 2, .heads = 4, .kv_heads = 2, .head_dim = 16,
        .experts = experts, .top_k = 2, .moe_intermediate = 16, .vocab = vocab,
    };
    qd_model_config c;
    ck_assert_int_eq(qd_sft_make_config(&d, &c), QD_OK);
    c.max_position_embeddings = max_positions;
    return c;
}

int main(void)
{
    SRunner *sr = srunner_create(suite_status());
    srunner_add_suite(sr, suite_quant());
    srunner_add_suite(sr, suite_safetensors());
    srunner_add_suite(sr, suite_tokenizer());
    srunner_add_suite(sr, suite_rewards());
    srunner_add_suite(sr, suite_eval());
    srunner_add_suite(sr, suite_benchmarks());
    srunner_add_suite(sr, suite_backend_cpu());
    srunner_add_suite(sr, suite_ops());
    srunner_add_suite(sr, suite_orchestrator());
    srunner_add_suite(sr, suite_tiny());
    srunner_add_suite(sr, suite_rl());
    srunner_add_suite(sr, suite_sampling());
    srunner_add_suite(sr, suite_models());
    srunner_add_suite(sr, suite_dist());
    srunner_add_suite(sr, suite_tb());
    srunner_add_suite(sr, suite_sandbox());
    srunner_add_suite(sr, suite_code());
    srunner_add_suite(sr, suite_sync());
    srunner_add_suite(sr, suite_report());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
