/* LiveCodeBench grading (rewards/code.h) and quads grade --style code. */
#define _GNU_SOURCE
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "rewards/code.h"
#include "tests/suites.h"

#define LCB_FILE "tests/fixtures/benchmarks/livecodebench_release_v1_nopriv_mavencoder.jsonl"

START_TEST(test_code_extract)
{
    char *c = qd_code_extract("Plan:\n```python\nfirst()\n```\ntext\n```python\nx = 1\nprint(x)\n```\nbye");
    ck_assert_str_eq(c, "x = 1\nprint(x)");
    free(c);
    c = qd_code_extract("```\n```");
    ck_assert_str_eq(c, "");
    free(c);
    ck_assert_ptr_null(qd_code_extract("no code at all"));
    ck_assert_ptr_null(qd_code_extract("```python\nprint(1)\n"));
}
END_TEST

START_TEST(test_code_stdout_compare)
{
    /* LCB's rules (SOURCES.md, "LiveCodeBench grader" 3) */
    ck_assert(qd_code_stdout_equal("1.0\n", "1"));
    ck_assert(qd_code_stdout_equal("1e2", "100"));
    ck_assert(qd_code_stdout_equal("1   2", "1 2"));
    ck_assert(qd_code_stdout_equal("-0", "0"));
    ck_assert(qd_code_stdout_equal("1_000", "1000"));
    ck_assert(qd_code_stdout_equal("2 3  \n4\n\n\n", "2 3\n4"));
    ck_assert(qd_code_stdout_equal("a\r\nb\r\n", "a\nb\n"));
    ck_assert(qd_code_stdout_equal("NaN", "NaN")); /* equal strings, before any Decimal */
    ck_assert(!qd_code_stdout_equal("nan", "NaN"));
    ck_assert(!qd_code_stdout_equal("0.333333", "0.3333333"));
    ck_assert(!qd_code_stdout_equal("yes", "YES"));
    ck_assert(!qd_code_stdout_equal("1\n\n2", "1\n2"));
    ck_assert(!qd_code_stdout_equal("1 2", "1 2 3"));
    ck_assert(!qd_code_stdout_equal("", "0"));
    ck_assert(!qd_code_stdout_equal("1e", "1"));
    ck_assert(!qd_code_stdout_equal("0x10", "16"));
    ck_assert(qd_code_stdout_equal("Infinity", "inf"));
    ck_assert(qd_code_stdout_equal(".5", "0.50"));
    ck_assert(!qd_code_stdout_equal("1.", "1.1"));
}
END_TEST

static bool jeq(const char *a, const char *b)
{
    json_t *x = json_loads(a, JSON_DECODE_ANY, NULL), *y = json_loads(b, JSON_DECODE_ANY, NULL);
    ck_assert(x && y);
    bool r = qd_code_json_equal(x, y);
    json_decref(x);
    json_decref(y);
    return r;
}

/* Every case of a reference file (tests/ref/lcb_compare_cases.py): eq on
 * fields fa and fb must give "equal"; returns how many cases are equal. */
static int check_reference(const char *file, const char *fa, const char *fb, bool (*eq)(const char *, const char *))
{
    json_t *cases = qd_test_load_jsonl(qd_test_path(file));
    int bad = 0, equal = 0;
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *a = json_string_value(json_object_get(c, fa)), *b = json_string_value(json_object_get(c, fb));
        bool want = json_is_true(json_object_get(c, "equal"));
        equal += want;
        if (eq(a, b) != want && bad++ < 10)
            fprintf(stderr, "%s line %zu: '%s' vs '%s': want %d\n", file, i + 1, a, b, want);
    }
    ck_assert_int_eq(bad, 0);
    json_decref(cases);
    return equal;
}

START_TEST(test_code_stdout_compare_reference)
{
    /* 3,205 pairs (tokens x tokens, lines x lines) with the verdict of
     * LiveCodeBench's comparison as Python's decimal module gives it */
    ck_assert_int_eq(check_reference("tests/fixtures/code/compare_cases.jsonl", "got", "expected",
                                     qd_code_stdout_equal), 245);
}
END_TEST

START_TEST(test_code_json_equal_reference)
{
    /* 1,681 pairs of JSON values with Python's json.loads(a) == json.loads(b) */
    ck_assert_int_eq(check_reference("tests/fixtures/code/json_equal_cases.jsonl", "a", "b", jeq), 81);
}
END_TEST

START_TEST(test_code_json_equal)
{
    /* Python's == between the returned value and json.loads(expected) */
    ck_assert(jeq("2.0", "2"));
    ck_assert(jeq("true", "1"));
    ck_assert(jeq("[1, [2, \"a\"]]", "[1.0, [2, \"a\"]]"));
    ck_assert(jeq("{\"a\": 1, \"b\": [null]}", "{\"b\": [null], \"a\": 1.0}"));
    ck_assert(!jeq("0.30000000000000004", "0.3"));
    ck_assert(!jeq("\"1\"", "1"));
    ck_assert(!jeq("[1, 2]", "[2, 1]"));
    ck_assert(!jeq("{\"a\": 1}", "{\"a\": 1, \"b\": 2}"));
    ck_assert(!jeq("null", "0"));
    ck_assert(!jeq("2.5", "2"));
}
END_TEST

static json_t *row_with(const char *pub, const char *priv, const char *meta)
{
    json_t *row = json_object();
    if (pub)
        json_object_set_new(row, "public_test_cases", json_string(pub));
    if (priv)
        json_object_set_new(row, "private_test_cases", json_string(priv));
    if (meta)
        json_object_set_new(row, "metadata", json_string(meta));
    return row;
}

START_TEST(test_code_problem_parse)
{
    qd_code_problem p;
    json_t *row = row_with("[{\"input\": \"1\\n\", \"output\": \"2\\n\", \"testtype\": \"stdin\"}]",
                           "[{\"input\": \"3\\n\", \"output\": \"4\\n\", \"testtype\": \"stdin\"}]", "{}");
    ck_assert_int_eq(qd_code_problem_from_json(row, "x.jsonl:1", &p), QD_OK);
    ck_assert_int_eq(p.ntests, 2);
    ck_assert_str_eq(p.tests[1].input, "3\n"); /* public first, then private */
    ck_assert_ptr_null(p.func_name);
    qd_code_problem_free(&p);
    json_decref(row);
    /* private tests as a JSON list, metadata as an object */
    row = row_with("[{\"input\": \"[1]\", \"output\": \"1\"}]", NULL, NULL);
    json_object_set_new(row, "private_test_cases", json_loads("[{\"input\": \"[2]\", \"output\": \"2\"}]", 0, NULL));
    json_object_set_new(row, "metadata", json_loads("{\"func_name\": \"f\"}", 0, NULL));
    ck_assert_int_eq(qd_code_problem_from_json(row, "x.jsonl:2", &p), QD_OK);
    ck_assert_int_eq(p.ntests, 2);
    ck_assert_str_eq(p.func_name, "f");
    qd_code_problem_free(&p);
    json_decref(row);
    /* the hub's encoded private tests: a clear error naming the field */
    row = row_with("[]", "eJzNVE1v2zAMvedX", "{}");
    ck_assert_int_eq(qd_code_problem_from_json(row, "x.jsonl:3", &p), QD_ERR_FORMAT);
    ck_assert_msg(strstr(qd_last_error(), "x.jsonl:3") && strstr(qd_last_error(), "'private_test_cases' is encoded"),
                  "%s", qd_last_error());
    json_decref(row);
    row = row_with(NULL, NULL, "{}");
    ck_assert_int_eq(qd_code_problem_from_json(row, "x.jsonl:4", &p), QD_ERR_FORMAT);
    ck_assert_msg(strstr(qd_last_error(), "'public_test_cases' is missing"), "%s", qd_last_error());
    json_decref(row);
    row = row_with("[{\"input\": 1, \"output\": \"2\"}]", NULL, "{}");
    ck_assert_int_eq(qd_code_problem_from_json(row, "x.jsonl:5", &p), QD_ERR_FORMAT);
    ck_assert_msg(strstr(qd_last_error(), "'public_test_cases'[0]"), "%s", qd_last_error());
    json_decref(row);
}
END_TEST

/* The rows of the real LiveCodeBench file, by question_id. */
static json_t *lcb_rows(void)
{
    static json_t *rows;
    if (!rows) {
        json_t *arr = qd_test_load_jsonl(qd_test_path(LCB_FILE));
        rows = json_object();
        size_t i;
        json_t *r;
        json_array_foreach(arr, i, r) json_object_set(rows, json_string_value(json_object_get(r, "question_id")), r);
        json_decref(arr);
        ck_assert_int_eq(json_object_size(rows), 400);
    }
    return rows;
}

static char *fenced(const char *code)
{
    char *s = NULL;
    ck_assert_int_ge(asprintf(&s, "Here is my solution.\n```python\n%s```\n", code), 0);
    return s;
}

START_TEST(test_code_written_solutions)
{
    /* 24 real problems (4 Codeforces, 8 AtCoder stdin; 12 LeetCode
     * functional), each with a solution written here and a wrong variant:
     * every solution accepted, every variant not. */
    json_t *sols = qd_test_load_jsonl(qd_test_path("tests/fixtures/code/solutions.jsonl"));
    int n = (int)json_array_size(sols);
    ck_assert_int_ge(n, 20);
    qd_code_problem *probs = calloc((size_t)n, sizeof *probs);
    const qd_code_problem **pp = calloc(2 * (size_t)n, sizeof *pp);
    char **outs = calloc(2 * (size_t)n, sizeof *outs);
    int platform[3] = {0}, functional = 0;
    for (int i = 0; i < n; i++) {
        json_t *s = json_array_get(sols, (size_t)i);
        const char *qid = json_string_value(json_object_get(s, "question_id"));
        json_t *row = json_object_get(lcb_rows(), qid);
        ck_assert_msg(row != NULL, "%s not in %s", qid, LCB_FILE);
        ck_assert_int_eq(qd_code_problem_from_json(row, qid, &probs[i]), QD_OK);
        const char *plat = json_string_value(json_object_get(row, "platform"));
        platform[!strcmp(plat, "atcoder") ? 0 : !strcmp(plat, "leetcode") ? 1 : 2]++;
        functional += probs[i].func_name != NULL;
        pp[2 * i] = pp[2 * i + 1] = &probs[i];
        outs[2 * i] = fenced(json_string_value(json_object_get(s, "correct")));
        outs[2 * i + 1] = fenced(json_string_value(json_object_get(s, "wrong")));
    }
    ck_assert(platform[0] > 0 && platform[1] > 0 && platform[2] > 0);
    ck_assert(functional > 0 && functional < n);
    qd_code_opts o = qd_code_opts_default();
    o.jobs = 2;
    qd_code_result *res = calloc(2 * (size_t)n, sizeof *res);
    ck_assert_int_eq(qd_code_grade(&o, (const char *const *)outs, pp, 2 * n, res), QD_OK);
    for (int i = 0; i < n; i++) {
        const char *qid = json_string_value(json_object_get(json_array_get(sols, (size_t)i), "question_id"));
        ck_assert_msg(res[2 * i].correct && res[2 * i].passed == probs[i].ntests, "%s: correct solution %s: %s",
                      qid, qd_code_verdict_name(res[2 * i].verdict), res[2 * i].detail);
        ck_assert_msg(!res[2 * i + 1].correct && res[2 * i + 1].verdict == QD_CODE_WRONG_ANSWER,
                      "%s: wrong variant graded %s", qid, qd_code_verdict_name(res[2 * i + 1].verdict));
        ck_assert_int_lt(res[2 * i + 1].passed, probs[i].ntests);
    }
    for (int i = 0; i < 2 * n; i++) {
        qd_code_result_free(&res[i]);
        free(outs[i]);
    }
    for (int i = 0; i < n; i++)
        qd_code_problem_free(&probs[i]);
    free(res);
    free(outs);
    free(pp);
    free(probs);
    json_decref(sols);
}
END_TEST

START_TEST(test_code_private_vector)
{
    /* 1873_A with its 4 real private tests (the decoded list of the hub's
     * vector): a correct solution passes all 5, a wrong one fails. */
    json_t *vec = json_load_file(qd_test_path("tests/fixtures/benchmarks/lcb_private_tests_decode_vector.json"), 0, NULL);
    ck_assert_ptr_nonnull(vec);
    json_t *row = json_deep_copy(json_object_get(lcb_rows(), "1873_A"));
    json_object_set(row, "private_test_cases", json_object_get(vec, "step4_json_loads"));
    qd_code_problem p;
    ck_assert_int_eq(qd_code_problem_from_json(row, "1873_A", &p), QD_OK);
    ck_assert_int_eq(p.ntests, 5);
    json_t *sols = qd_test_load_jsonl(qd_test_path("tests/fixtures/code/solutions.jsonl"));
    json_t *s = json_array_get(sols, 0);
    ck_assert_str_eq(json_string_value(json_object_get(s, "question_id")), "1873_A");
    char *outs[2] = {fenced(json_string_value(json_object_get(s, "correct"))),
                     fenced(json_string_value(json_object_get(s, "wrong")))};
    const qd_code_problem *pp[2] = {&p, &p};
    qd_code_opts o = qd_code_opts_default();
    qd_code_result r[2];
    ck_assert_int_eq(qd_code_grade(&o, (const char *const *)outs, pp, 2, r), QD_OK);
    ck_assert(r[0].correct);
    ck_assert_int_eq(r[0].passed, 5);
    ck_assert(!r[1].correct);
    ck_assert_str_eq(qd_code_verdict_name(r[1].verdict), "wrong_answer");
    for (int i = 0; i < 2; i++) {
        qd_code_result_free(&r[i]);
        free(outs[i]);
    }
    qd_code_problem_free(&p);
    json_decref(sols);
    json_decref(row);
    json_decref(vec);
}
END_TEST

START_TEST(test_code_verdicts)
{
    /* one functional problem with three tests: f(x) = 2x */
    qd_code_test t[3] = {{"1", "2"}, {"2", "4"}, {"3", "6"}};
    qd_code_problem p = {.func_name = "f", .tests = t, .ntests = 3};
    const char *codes[] = {
        "```python\nclass Solution:\n    def f(self, x):\n        return 2 * x\n```",          /* accepted */
        "```python\nclass Solution:\n    def f(self, x):\n        return 5 if x == 2 else 2 * x\n```",
        "```python\nclass Solution:\n    def f(self, x):\n        raise ValueError(x)\n```",
        "```python\nclass Solution:\n    def f(self, x)\n        return x\n```",                 /* syntax */
        "```python\nclass Solution:\n    def g(self, x):\n        return 2 * x\n```",          /* no f */
        "```python\nclass Solution:\n    def f(self, x):\n        return {2 * x}\n```",        /* a set */
        "```python\nclass Solution:\n    def f(self, x):\n        return 2.0 * x\n```",        /* 2.0 == 2 */
        "```python\ndef f(x):\n    return x + x\n```",                                            /* no class */
        "I would write it in Python.",
    };
    const char *want[] = {"accepted", "wrong_answer", "runtime_error", "runtime_error", "runtime_error",
                          "wrong_answer", "accepted", "accepted", "no_code"};
    int want_passed[] = {3, 1, 0, 0, 0, 0, 3, 3, 0};
    int n = sizeof codes / sizeof codes[0];
    const qd_code_problem *pp[16];
    for (int i = 0; i < n; i++)
        pp[i] = &p;
    for (int jobs = 1; jobs <= 3; jobs += 2) { /* the same results at any parallelism */
        qd_code_opts o = qd_code_opts_default();
        o.jobs = jobs;
        qd_code_result r[16];
        ck_assert_int_eq(qd_code_grade(&o, codes, pp, n, r), QD_OK);
        for (int i = 0; i < n; i++) {
            ck_assert_msg(!strcmp(qd_code_verdict_name(r[i].verdict), want[i]), "code %d (jobs %d): %s, want %s: %s",
                          i, jobs, qd_code_verdict_name(r[i].verdict), want[i], r[i].detail ? r[i].detail : "");
            ck_assert_int_eq(r[i].passed, want_passed[i]);
            ck_assert_int_eq(r[i].total, 3);
            ck_assert(r[i].correct == !strcmp(want[i], "accepted"));
            qd_code_result_free(&r[i]);
        }
    }
}
END_TEST

START_TEST(test_code_stdin_program_semantics)
{
    /* exit() after a correct answer is fine (LCB swallows SystemExit); an
     * exception after it is not; LCB's prelude names work without imports;
     * a __main__ guard runs. */
    qd_code_test t = {"3 4\n", "7\n"};
    qd_code_problem p = {.func_name = NULL, .tests = &t, .ntests = 1};
    const char *codes[] = {
        "```python\na, b = map(int, input().split())\nprint(a + b)\nexit(3)\n```",
        "```python\na, b = map(int, input().split())\nprint(a + b)\nraise KeyError\n```",
        "```python\nprint(sum(map(int, stdin.read().split())))\n```",
        "```python\ndef main():\n    print(7)\nif __name__ == '__main__':\n    main()\n```",
        "```python\nprint(7.0)\n```",
        "```python\nprint(8)\n```",
    };
    const char *want[] = {"accepted", "runtime_error", "accepted", "accepted", "accepted", "wrong_answer"};
    const qd_code_problem *pp[6] = {&p, &p, &p, &p, &p, &p};
    qd_code_opts o = qd_code_opts_default();
    qd_code_result r[6];
    ck_assert_int_eq(qd_code_grade(&o, codes, pp, 6, r), QD_OK);
    for (int i = 0; i < 6; i++) {
        ck_assert_msg(!strcmp(qd_code_verdict_name(r[i].verdict), want[i]), "code %d: %s: %s", i,
                      qd_code_verdict_name(r[i].verdict), r[i].detail ? r[i].detail : "");
        qd_code_result_free(&r[i]);
    }
}
END_TEST

START_TEST(test_code_problem_time_limit)
{
    /* each test takes about 1 s; a sample may use 1.5 s in all: the third
     * test is not run and fails with time_limit */
    qd_code_test t[3] = {{"", "ok\n"}, {"", "ok\n"}, {"", "ok\n"}};
    qd_code_problem p = {.func_name = NULL, .tests = t, .ntests = 3};
    const qd_code_problem *pp = &p;
    const char *code = "```python\nimport time\ntime.sleep(1)\nprint('ok')\n```";
    qd_code_opts o = qd_code_opts_default();
    o.test_s = 5;
    o.problem_s = 1.5;
    qd_code_result r;
    ck_assert_int_eq(qd_code_grade(&o, &code, &pp, 1, &r), QD_OK);
    ck_assert_str_eq(qd_code_verdict_name(r.verdict), "time_limit");
    ck_assert_msg(strstr(r.detail, "the problem's time limit (1.5 s) is used up"), "%s", r.detail);
    ck_assert_int_ge(r.passed, 1);
    ck_assert_int_le(r.passed, 2);
    qd_code_result_free(&r);
}
END_TEST

/* Known stdin tests whose expected output equals their input (after LCB's
 * stripping): an echo program passes exactly these. */
static const char *const echo_tests[] = {"abc304_b#2", "abc304_b#3", "abc305_a#3", "abc315_a#2", "abc326_b#2"};

START_TEST(test_code_wrong_program_sweep)
{
    /* Every public test of the real problems, each graded alone, against a
     * trivially wrong program: stdin echoes its input, functional returns
     * None. All fail but the echo tests listed above. make check runs every
     * 10th problem; QD_LCB_SWEEP=all runs the 400 (1,043 tests). */
    const char *env = getenv("QD_LCB_SWEEP");
    int step = env && !strcmp(env, "all") ? 1 : 10;
    json_t *arr = qd_test_load_jsonl(qd_test_path(LCB_FILE));
    int cap = 1100, n = 0;
    qd_code_problem *probs = calloc((size_t)cap, sizeof *probs);
    qd_code_test *tests = calloc((size_t)cap, sizeof *tests);
    const qd_code_problem **pp = calloc((size_t)cap, sizeof *pp);
    const char **outs = calloc((size_t)cap, sizeof *outs);
    char (*names)[32] = calloc((size_t)cap, sizeof *names);
    static const char echo[] = "```python\nimport sys\nsys.stdout.write(sys.stdin.read())\n```";
    static const char none[] = "```python\nclass Solution:\n    def __getattr__(self, name):\n        return lambda *args: None\n```";
    qd_code_problem all[400];
    for (size_t i = 0; i < json_array_size(arr); i += (size_t)step) {
        json_t *row = json_array_get(arr, i);
        qd_code_problem *whole = &all[i];
        ck_assert_int_eq(qd_code_problem_from_json(row, LCB_FILE, whole), QD_OK);
        for (int j = 0; j < whole->ntests; j++, n++) {
            ck_assert_int_lt(n, cap);
            tests[n] = whole->tests[j];
            probs[n] = (qd_code_problem){.func_name = whole->func_name, .tests = &tests[n], .ntests = 1};
            pp[n] = &probs[n];
            outs[n] = whole->func_name ? none : echo;
            snprintf(names[n], sizeof names[n], "%s#%d", json_string_value(json_object_get(row, "question_id")), j + 1);
        }
    }
    qd_code_opts o = qd_code_opts_default();
    o.jobs = 2;
    qd_code_result *res = calloc((size_t)n, sizeof *res);
    ck_assert_int_eq(qd_code_grade(&o, outs, pp, n, res), QD_OK);
    int passed = 0;
    for (int k = 0; k < n; k++) {
        bool listed = false;
        for (size_t e = 0; e < sizeof echo_tests / sizeof echo_tests[0]; e++)
            listed |= !strcmp(names[k], echo_tests[e]);
        ck_assert_msg(res[k].verdict != QD_CODE_SANDBOX_ERROR, "%s: %s", names[k], res[k].detail);
        ck_assert_msg(res[k].correct == listed, "%s: the wrong program was graded %s", names[k],
                      qd_code_verdict_name(res[k].verdict));
        passed += res[k].correct;
        qd_code_result_free(&res[k]);
    }
    if (step == 1) {
        ck_assert_int_eq(n, 1043);
        ck_assert_int_eq(passed, 5);
    }
    fprintf(stderr, "code: wrong-program sweep: %d tests, %d passed (the echo tests)\n", n, passed);
    for (size_t i = 0; i < json_array_size(arr); i += (size_t)step)
        qd_code_problem_free(&all[i]);
    free(res);
    free(names);
    free(outs);
    free(pp);
    free(tests);
    free(probs);
    json_decref(arr);
}
END_TEST

START_TEST(test_code_cli)
{
    char dir[64], out[8192], args[512];
    qd_test_mkdtemp(dir, sizeof dir, "codecli");
    json_t *row = json_object_get(lcb_rows(), "abc336_a");
    json_t *line = json_pack("{s:s, s:O}", "output", "```python\nprint('L' + 'o' * int(input()) + 'ng')\n```", "problem", row);
    char *l1 = json_dumps(line, JSON_COMPACT);
    json_object_set_new(line, "output", json_string("```python\nprint('Long')\n```"));
    char *l2 = json_dumps(line, JSON_COMPACT);
    char *text = NULL;
    ck_assert_int_ge(asprintf(&text, "%s\n\n%s\n", l1, l2), 0);
    qd_test_write_file(qd_test_join(dir, "in.jsonl"), text);
    snprintf(args, sizeof args, "grade --style code --jobs 2 < %s/in.jsonl", dir);
    ck_assert_int_eq(qd_test_run_quads(args, out, sizeof out), 0);
    ck_assert_msg(strstr(out, "{\"correct\":true,\"passed\":2,\"total\":2,\"verdict\":\"accepted\"}\n"
                              "{\"correct\":false,\"passed\":0,\"total\":2,\"verdict\":\"wrong_answer\""),
                  "%s", out);
    /* bad input: the line and the field are named, exit non-zero */
    qd_test_write_file(qd_test_join(dir, "bad.jsonl"), "{\"output\": \"x\", \"problem\": {\"public_test_cases\": \"[1\"}}\n");
    snprintf(args, sizeof args, "grade --style code < %s/bad.jsonl", dir);
    ck_assert_int_ne(qd_test_run_quads(args, out, sizeof out), 0);
    ck_assert_msg(strstr(out, "stdin line 1: field 'problem': field 'public_test_cases' is not JSON"), "%s", out);
    snprintf(args, sizeof args, "grade --style code --jobs 0 < %s/bad.jsonl", dir);
    ck_assert_int_eq(qd_test_run_quads(args, out, sizeof out), 2);
    snprintf(args, sizeof args, "grade --style code --jobs 1.5 < %s/bad.jsonl", dir);
    ck_assert_int_eq(qd_test_run_quads(args, out, sizeof out), 2);
    snprintf(args, sizeof args, "grade --style math --timeout 3 < %s/bad.jsonl", dir);
    ck_assert_int_eq(qd_test_run_quads(args, out, sizeof out), 2);
    ck_assert_msg(strstr(out, "go with --style code"), "%s", out);
    free(text);
    free(l1);
    free(l2);
    json_decref(line);
    qd_test_rm_tree(dir);
}
END_TEST

START_TEST(test_code_cli_weaker_levels)
{
    /* QD_SANDBOX_LEVEL=uid and =rlimits run the fallbacks (and say so on
     * stderr); a bad value is a clear error. */
    char dir[64], out[8192], args[512];
    qd_test_mkdtemp(dir, sizeof dir, "codelvl");
    chmod(dir, 0755); /* the uid level's nobody needs to reach nothing here, but TMPDIR below */
    json_t *line = json_pack("{s:s, s:O}", "output", "```python\nprint('L' + 'o' * int(input()) + 'ng')\n```",
                             "problem", json_object_get(lcb_rows(), "abc336_a"));
    char *l1 = json_dumps(line, JSON_COMPACT);
    qd_test_write_file(qd_test_join(dir, "in.jsonl"), l1);
    setenv("TMPDIR", "/tmp", 1);
    const char *levels[] = {"uid", "rlimits"};
    for (int i = 0; i < (geteuid() == 0 ? 2 : 1); i++) {
        const char *lv = geteuid() == 0 ? levels[i] : "rlimits";
        setenv("QD_SANDBOX_LEVEL", lv, 1);
        snprintf(args, sizeof args, "grade --style code < %s/in.jsonl", dir);
        ck_assert_int_eq(qd_test_run_quads(args, out, sizeof out), 0);
        ck_assert_msg(strstr(out, "warning:") && strstr(out, "\"correct\":true,\"passed\":2"), "%s: %s", lv, out);
    }
    if (geteuid() == 0) {
        /* an interpreter nobody cannot reach comes first on PATH (as under
         * /root/.pyenv): the uid level picks the next one */
        char priv[64], cmd[512];
        qd_test_mkdtemp(priv, sizeof priv, "privpy");
        chmod(priv, 0700);
        snprintf(cmd, sizeof cmd, "cp \"$(readlink -f /usr/bin/python3)\" %s/python3", priv);
        ck_assert_int_eq(system(cmd), 0);
        char *path = NULL;
        ck_assert_int_ge(asprintf(&path, "%s:%s", priv, getenv("PATH")), 0);
        setenv("PATH", path, 1);
        setenv("QD_SANDBOX_LEVEL", "uid", 1);
        ck_assert_int_eq(qd_test_run_quads(args, out, sizeof out), 0);
        ck_assert_msg(strstr(out, "\"correct\":true,\"passed\":2"), "%s", out);
        qd_test_rm_tree(priv);
        free(path);
    }
    setenv("QD_SANDBOX_LEVEL", "vm", 1);
    ck_assert_int_ne(qd_test_run_quads(args, out, sizeof out), 0);
    ck_assert_msg(strstr(out, "QD_SANDBOX_LEVEL 'vm': expected jail, uid or rlimits"), "%s", out);
    unsetenv("QD_SANDBOX_LEVEL");
    free(l1);
    json_decref(line);
    qd_test_rm_tree(dir);
}
END_TEST

Suite *suite_code(void)
{
    Suite *s = suite_create("code");
    TCase *tc = tcase_create("lcb");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_code_extract);
    tcase_add_test(tc, test_code_stdout_compare);
    tcase_add_test(tc, test_code_stdout_compare_reference);
    tcase_add_test(tc, test_code_json_equal);
    tcase_add_test(tc, test_code_json_equal_reference);
    tcase_add_test(tc, test_code_problem_parse);
    tcase_add_test(tc, test_code_written_solutions);
    tcase_add_test(tc, test_code_private_vector);
    tcase_add_test(tc, test_code_verdicts);
    tcase_add_test(tc, test_code_stdin_program_semantics);
    tcase_add_test(tc, test_code_problem_time_limit);
    tcase_add_test(tc, test_code_wrong_program_sweep);
    tcase_add_test(tc, test_code_cli);
    tcase_add_test(tc, test_code_cli_weaker_levels);
    suite_add_tcase(s, tc);
    return s;
}
