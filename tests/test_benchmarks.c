/* Check suite of the benchmarks module: sha256 against FIPS/NIST vectors and
 * the digests in tests/fixtures/benchmarks/SOURCES.md, parsing of every
 * third-party benchmark file there, the fetcher against a real HTTP server on
 * loopback (tests/http_server.py) that misbehaves on purpose, and the
 * synthetic splits. */
#define _GNU_SOURCE
#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <jansson.h>
#include <zlib.h>
#include "tests/suites.h"
#include "benchmarks/sha256.h"
#include "benchmarks/dataset.h"
#include "benchmarks/fetch.h"
#include "benchmarks/lcb.h"
#include "benchmarks/registry.h"
#include "benchmarks/synth.h"
#include "quant/fileio.h"

#define FX "tests/fixtures/benchmarks/"

static const char *fx(const char *name)
{
    static _Thread_local char p[4096];
    snprintf(p, sizeof p, "%s", qd_test_path(FX));
    strncat(p, name, sizeof p - strlen(p) - 1);
    return p;
}

static void load_ok(const char *name, const qd_bench_fields *f, qd_bench_set *s)
{
    qd_status st = qd_bench_load_file(fx(name), f, s);
    ck_assert_msg(st == QD_OK, "%s: %s", name, qd_last_error());
}

/* ---- sha256 ---------------------------------------------------------- */

START_TEST(test_sha256_vectors)
{
    /* FIPS 180-4 examples (csrc.nist.gov SHA256.pdf, SHA2_Additional.pdf). */
    static const struct { const char *msg, *hex; } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
         "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    };
    char hex[65];
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        qd_sha256_hex(v[i].msg, strlen(v[i].msg), hex);
        ck_assert_str_eq(hex, v[i].hex);
    }
    /* One million 'a', fed in uneven pieces that straddle block boundaries. */
    static char a[1000000];
    memset(a, 'a', sizeof a);
    qd_sha256_ctx c;
    uint8_t d[32];
    qd_sha256_init(&c);
    for (size_t off = 0, step = 1; off < sizeof a; off += step, step = step * 7 % 997 + 1)
        qd_sha256_update(&c, a + off, off + step > sizeof a ? sizeof a - off : step);
    qd_sha256_final(&c, d);
    qd_sha256_to_hex(d, hex);
    ck_assert_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    /* Lengths around the padding boundary (55, 56, 63, 64 bytes) agree piecewise and whole. */
    for (size_t n = 50; n < 70; n++) {
        char whole[65];
        qd_sha256_hex(a, n, whole);
        qd_sha256_init(&c);
        qd_sha256_update(&c, a, n / 3);
        qd_sha256_update(&c, a + n / 3, n - n / 3);
        qd_sha256_final(&c, d);
        qd_sha256_to_hex(d, hex);
        ck_assert_str_eq(hex, whole);
    }
}
END_TEST

/* Every data file's sha256 equals the one SOURCES.md gives for it. */
START_TEST(test_sha256_sources_md)
{
    FILE *f = fopen(fx("SOURCES.md"), "r");
    ck_assert_ptr_nonnull(f);
    char line[4096];
    int checked = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "| ", 2))
            continue;
        char name[256] = "", *last = NULL;
        sscanf(line + 2, "%255[^ |]", name);
        if (!strstr(name, ".json") && !strstr(name, ".csv"))
            continue;
        for (char *p = line; (p = strchr(p, '|')); p++) {
            size_t k = strspn(p + 1, " ");
            if (strspn(p + 1 + k, "0123456789abcdef") == 64)
                last = p + 1 + k;
        }
        ck_assert_msg(last != NULL, "%s: no sha256 in SOURCES.md", name);
        char hex[65];
        ck_assert_int_eq(qd_sha256_file(fx(name), hex), QD_OK);
        ck_assert_msg(!strncmp(hex, last, 64), "%s: sha256 %s", name, hex);
        checked++;
    }
    fclose(f);
    ck_assert_int_eq(checked, 29);
}
END_TEST

/* ---- LiveCodeBench tests ------------------------------------------- */

static unsigned char *unhex(const char *h, size_t *n)
{
    *n = strlen(h) / 2;
    unsigned char *b = malloc(*n);
    for (size_t i = 0; i < *n; i++)
        sscanf(h + 2 * i, "%2hhx", &b[i]);
    return b;
}

/* The real encoded private_test_cases gives its 4 tests, step by step as
 * LiveCodeBench's own decoder (lcb_private_tests_decode_vector.json). */
START_TEST(test_lcb_decode_vector)
{
    json_t *v = json_load_file(fx("lcb_private_tests_decode_vector.json"), 0, NULL);
    ck_assert_ptr_nonnull(v);
    const char *enc = json_string_value(json_object_get(v, "private_test_cases_encoded"));
    ck_assert_uint_eq(strlen(enc), 176);
    json_t *tests = NULL;
    ck_assert_msg(qd_lcb_decode_private_tests(enc, strlen(enc), "1873_A", &tests) == QD_OK, "%s", qd_last_error());
    ck_assert(json_equal(tests, json_object_get(v, "step4_json_loads")));
    ck_assert_uint_eq(json_array_size(tests), 4);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(tests, 2), "output")), "NO\nYES\nYES\nYES\nNO\n");
    json_decref(tests);
    /* step 3: the pickle (step 2's bytes) holds the JSON text */
    size_t pn, sn;
    unsigned char *pk = unhex(json_string_value(json_object_get(v, "step2_zlib_decompressed_hex")), &pn);
    ck_assert_uint_eq(pn, 378);
    char *s;
    ck_assert_int_eq(qd_lcb_unpickle_str(pk, pn, "vector", &s, &sn), QD_OK);
    ck_assert_str_eq(s, json_string_value(json_object_get(v, "step3_pickle_loads_value")));
    free(s);
    /* the plain-JSON form (LiveCodeBench tries json.loads first) */
    const char *pub = json_string_value(json_object_get(v, "public_test_cases"));
    ck_assert_int_eq(qd_lcb_decode_private_tests(pub, strlen(pub), "public", &tests), QD_OK);
    ck_assert_uint_eq(json_array_size(tests), 1);
    json_decref(tests);
    /* hostile pickles, each refused with its reason */
#define PK(bytes, why) {bytes, sizeof bytes - 1, why}
    static const struct {
        const char *bytes;
        size_t n;
        const char *why;
    } bad[] = {
        PK("\x80\x04\x63os\nsystem\n\x8c\x02id\x85R.", "opcode 0x63 at byte 2 refused"), /* GLOBAL os.system */
        PK("\x80\x04\x8c\x02[]\x94\x8c\x02[]\x2e", "more than one string"),
        PK("\x80\x04\x8c\x02[]\x94", "truncated at byte 7 (no STOP)"),
        PK("\x80\x04\x8c\x09[]", "string of 9 bytes at byte 2, only 2 follow"),
        PK("\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\x7f[]\x2e", "string of 9223372036854775807 bytes"),
        PK("\x80\x04\x58\xff\xff\xff\xff[].", "string of 4294967295 bytes"),
        PK("\x80\x04\x95\x00\x00\x01\x00\x00\x00\x00\x00\x8c\x02[]\x2e", "FRAME of 65536 bytes"),
        PK("\x80\x04\x8c\x02[]\x2e\x2e", "1 bytes after the pickle's STOP"),
        PK("\x80\x04\x2e", "STOP with an empty stack"),
        PK("\x80\x09\x8c\x02[]\x2e", "PROTO 9"),
        PK("\x8c\x02[]\x80\x04\x2e", "PROTO 4 at byte 4"),
        PK("\x80\x04\x94\x8c\x02[]\x2e", "MEMOIZE with an empty stack"),
        PK("\x80\x04\x8c\x02[]\x94q\x00\x2e", "opcode 0x71 at byte 7 refused"), /* BINPUT */
        PK("\x80\x04\x95\x01", "truncated in opcode 0x95"),
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(qd_lcb_unpickle_str((const unsigned char *)bad[i].bytes, bad[i].n, "row", &s, &sn) != QD_OK,
                      "hostile pickle %zu accepted", i);
        ck_assert_msg(strstr(qd_last_error(), bad[i].why), "pickle %zu: '%s' lacks '%s'", i, qd_last_error(), bad[i].why);
    }
#undef PK
    /* the same refusals through base64 and zlib */
    unsigned char z[256];
    uLongf zl = sizeof z;
    ck_assert_int_eq(compress(z, &zl, (const Bytef *)bad[0].bytes, bad[0].n), Z_OK);
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char enc2[512];
    size_t k = 0;
    for (size_t i = 0; i < zl; i += 3) {
        uint32_t w = (uint32_t)z[i] << 16 | (i + 1 < zl ? (uint32_t)z[i + 1] << 8 : 0) | (i + 2 < zl ? z[i + 2] : 0);
        for (int j = 0; j < 4; j++)
            enc2[k++] = (size_t)j <= (zl - i) ? b64[(w >> (18 - 6 * j)) & 63] : '=';
    }
    enc2[k] = '\0';
    ck_assert_int_ne(qd_lcb_decode_private_tests(enc2, k, "row 7", &tests), QD_OK);
    ck_assert_msg(strstr(qd_last_error(), "row 7: pickle opcode 0x63"), "%s", qd_last_error());
    /* a cut-off stream, trailing bytes, not base64 */
    ck_assert_int_ne(qd_lcb_decode_private_tests(enc, 100, "cut", &tests), QD_OK);
    ck_assert_msg(strstr(qd_last_error(), "cut: not zlib data, or truncated"), "%s", qd_last_error());
    ck_assert_int_ne(qd_lcb_decode_private_tests("eJw=", 4, "short", &tests), QD_OK);
    ck_assert_int_ne(qd_lcb_decode_private_tests("abcde", 5, "pad", &tests), QD_OK);
    ck_assert_msg(strstr(qd_last_error(), "not base64"), "%s", qd_last_error());
    /* a pickled string that is not a list of tests */
    ck_assert_int_ne(qd_lcb_decode_private_tests("[{\"input\": 1}]", 14, "shape", &tests), QD_OK);
    ck_assert_msg(strstr(qd_last_error(), "test 0: field 'input' is not a string"), "%s", qd_last_error());
    free(pk);
    json_decref(v);
}
END_TEST

/* The public tests of the 400 real release_v1 problems: 1,043 tests, 604
 * stdin and 439 functional (SOURCES.md). */
START_TEST(test_lcb_public_tests)
{
    json_t *rows = qd_test_load_jsonl(fx("livecodebench_release_v1_nopriv_mavencoder.jsonl"));
    ck_assert_uint_eq(json_array_size(rows), 400);
    size_t n = 0, stdin_n = 0, i;
    json_t *r;
    json_array_foreach(rows, i, r) {
        const char *pub = json_string_value(json_object_get(r, "public_test_cases"));
        json_t *t;
        ck_assert_msg(qd_lcb_parse_tests(pub, strlen(pub), "row", &t) == QD_OK, "row %zu: %s", i, qd_last_error());
        n += json_array_size(t);
        for (size_t k = 0; k < json_array_size(t); k++)
            stdin_n += !strcmp(json_string_value(json_object_get(json_array_get(t, k), "testtype")), "stdin");
        json_decref(t);
    }
    ck_assert_uint_eq(n, 1043);
    ck_assert_uint_eq(stdin_n, 604);
    json_decref(rows);
}
END_TEST

/* The code records of the real release_v1 problems: LiveCodeBench's prompt
 * (as its own function builds it: tests/ref/lcb_prompts.py), the fields
 * grading needs, and the graded form with the real private tests decoded;
 * a bad row is refused naming its line and field; math records have none. */
START_TEST(test_lcb_records)
{
    json_t *ref = json_load_file(qd_test_path("tests/fixtures/code/lcb_prompts.json"), 0, NULL);
    ck_assert_ptr_nonnull(ref);
    ck_assert_str_eq(QD_LCB_SYSTEM_PROMPT, json_string_value(json_object_get(ref, "system")));
    const qd_bench_fields *f = &qd_bench_find("lcb-v1")->fields;
    qd_bench_set s;
    ck_assert_int_eq(qd_bench_load_file(fx("livecodebench_release_v1_nopriv_mavencoder.jsonl"), f, &s), QD_OK);
    ck_assert_uint_eq(s.n, 400);
    const qd_bench_record *cf = NULL, *lc = NULL;
    size_t functional = 0, with_starter = 0;
    for (size_t i = 0; i < s.n; i++) {
        const qd_bench_code *c = s.rec[i].code;
        ck_assert_ptr_nonnull(c);
        ck_assert_ptr_null(c->private_tests); /* this copy has none */
        functional += c->func_name != NULL;
        with_starter += *c->starter_code != '\0';
        cf = !strcmp(s.rec[i].id, "1873_A") ? &s.rec[i] : cf;
        lc = !strcmp(s.rec[i].id, "2819") ? &s.rec[i] : lc;
    }
    ck_assert_uint_eq(functional, 181); /* every LeetCode row (SOURCES.md) */
    ck_assert_uint_eq(with_starter, 181);
    json_t *prompts = json_object_get(ref, "prompts");
    ck_assert_str_eq(cf->problem, json_string_value(json_object_get(prompts, "1873_A")));
    ck_assert_str_eq(lc->problem, json_string_value(json_object_get(prompts, "2819")));
    ck_assert_str_eq(cf->code->platform, "codeforces");
    ck_assert_ptr_null(cf->code->func_name);
    ck_assert(!strncmp(cf->code->question, "There are three cards", 21));
    ck_assert_str_eq(lc->code->platform, "leetcode");
    ck_assert_str_eq(lc->code->func_name, "removeTrailingZeros");
    ck_assert(!strncmp(lc->code->starter_code, "class Solution:", 15));
    qd_code_problem p;
    ck_assert_int_eq(qd_lcb_problem(lc->code, "2819", &p), QD_OK);
    ck_assert_int_eq(p.ntests, 2);
    ck_assert_str_eq(p.func_name, "removeTrailingZeros");
    qd_code_problem_free(&p);
    /* 1873_A with its real encoded private tests: public first, then the 4 decoded */
    json_t *vec = json_load_file(fx("lcb_private_tests_decode_vector.json"), 0, NULL), *row = json_object();
    ck_assert_ptr_nonnull(vec);
    json_object_set_new(row, "question_content", json_string(cf->code->question));
    json_object_set_new(row, "question_id", json_string("1873_A"));
    json_object_set(row, "public_test_cases", json_object_get(vec, "public_test_cases"));
    json_object_set(row, "private_test_cases", json_object_get(vec, "private_test_cases_encoded"));
    json_object_set_new(row, "metadata", json_string("{}"));
    char *text = json_dumps(row, JSON_COMPACT);
    qd_bench_set one;
    ck_assert_int_eq(qd_bench_parse(text, strlen(text), "one.jsonl", f, &one), QD_OK);
    ck_assert_str_eq(one.rec[0].problem, cf->problem);
    ck_assert_int_eq(qd_lcb_problem(one.rec[0].code, "1873_A", &p), QD_OK);
    ck_assert_int_eq(p.ntests, 5);
    json_t *priv = json_object_get(vec, "step4_json_loads");
    for (int i = 1; i < 5; i++) {
        ck_assert_str_eq(p.tests[i].input, json_string_value(json_object_get(json_array_get(priv, (size_t)i - 1), "input")));
        ck_assert_str_eq(p.tests[i].output, json_string_value(json_object_get(json_array_get(priv, (size_t)i - 1), "output")));
    }
    qd_code_problem_free(&p);
    /* a private field that is neither JSON nor its encoding fails at grading, naming the problem */
    free(one.rec[0].code->private_tests);
    one.rec[0].code->private_tests = strdup("not base64!");
    ck_assert_int_ne(qd_lcb_problem(one.rec[0].code, "lcb-v1 problem '1873_A'", &p), QD_OK);
    ck_assert_msg(strstr(qd_last_error(), "lcb-v1 problem '1873_A': private_test_cases: not base64"), "%s",
                  qd_last_error());
    qd_bench_set_free(&one);
    free(text);
    /* bad rows: the line and the field named */
    static const struct {
        const char *line, *why;
    } bad[] = {
        {"{\"question_content\": \"q\"}", "one.jsonl: line 1: field 'public_test_cases' missing"},
        {"{\"question_content\": \"q\", \"public_test_cases\": \"[{]\"}", "line 1: field 'public_test_cases': invalid JSON"},
        {"{\"question_content\": \"q\", \"public_test_cases\": [{\"input\": 1}]}", "field 'public_test_cases': test 0: field 'input'"},
        {"{\"question_content\": \"q\", \"public_test_cases\": \"[]\", \"metadata\": \"{\\\"func_name\\\": 3}\"}",
         "line 1: field 'metadata.func_name' is not a string"},
        {"{\"question_content\": \"q\", \"public_test_cases\": \"[]\", \"metadata\": \"oops\"}", "field 'metadata' is a string that"},
        {"{\"question_content\": \"q\", \"public_test_cases\": \"[]\", \"starter_code\": 7}", "field 'starter_code' is not a string"},
        {"{\"question_content\": 5, \"public_test_cases\": \"[]\"}", "field 'question_content' is not a string"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(qd_bench_parse(bad[i].line, strlen(bad[i].line), "one.jsonl", f, &one) != QD_OK, "row %zu", i);
        ck_assert_msg(strstr(qd_last_error(), bad[i].why), "row %zu: %s", i, qd_last_error());
    }
    /* the math benchmarks' records have no code */
    qd_bench_set m;
    ck_assert_int_eq(qd_bench_load_file(fx("aime24_qwen25math.jsonl"), &qd_bench_find("aime24")->fields, &m), QD_OK);
    ck_assert_ptr_null(m.rec[0].code);
    ck_assert_str_eq(m.rec[0].answer, "204");
    qd_bench_set_free(&m);
    json_decref(row);
    json_decref(vec);
    json_decref(ref);
    qd_bench_set_free(&s);
}
END_TEST

/* ---- parsing the fixtures ------------------------------------------- */

typedef struct {
    const char *file;
    qd_bench_fields f;
    size_t n;
    const char *first_answer; /* NULL: not checked */
} fixture_case;

static const fixture_case fixture_cases[] = {
    {"gsm8k_test.jsonl", {"question", "answer", NULL, NULL, QD_ANSWER_GSM8K}, 1319, "18"},
    {"gsm8k_example_model_solutions.jsonl", {"question", "ground_truth", NULL, NULL, QD_ANSWER_PLAIN}, 1319, NULL},
    {"math500_test.jsonl", {"problem", "answer", "solution", "unique_id", QD_ANSWER_PLAIN}, 500,
     "\\left( 3, \\frac{\\pi}{2} \\right)"},
    {"math500_ttrl_array.json", {"prompt", "answer", NULL, "id", QD_ANSWER_PLAIN}, 500,
     "\\left( 3, \\frac{\\pi}{2} \\right)"},
    {"aime24_qwen25math.jsonl", {"problem", "answer", "solution", "id", QD_ANSWER_PLAIN}, 30, "204"},
    {"aime24_evalchemy.json", {"problem", "expected_answer", "reference_solution", "id", QD_ANSWER_PLAIN}, 30, "73"},
    {"aime24_deepscaler.json", {"problem", "answer", "solution", NULL, QD_ANSWER_PLAIN}, 30, "204"},
    {"aime25_evalchemy.json", {"problem", "answer", "solution", "id", QD_ANSWER_PLAIN}, 30, "70"},
    {"amc23_qwen25math.jsonl", {"problem", "answer", NULL, "id", QD_ANSWER_PLAIN}, 40, "27"},
    {"amc23_evalchemy.json", {"question", "answer", NULL, "id", QD_ANSWER_PLAIN}, 40, "27"},
    {"amc22_23_deepscaler.json", {"problem", "answer", NULL, NULL, QD_ANSWER_PLAIN}, 83, "142"},
    {"minerva_math_qwen25math.jsonl", {"problem", "solution", "solution", "idx", QD_ANSWER_BOXED}, 272, "1.6"},
    {"minerva_deepscaler.json", {"problem", "answer", "solution", "idx", QD_ANSWER_PLAIN}, 272, "9.6"},
    {"olympiadbench_qwen25math.jsonl", {"question", "final_answer", "solution", "id", QD_ANSWER_PLAIN}, 675, "2"},
    {"math_test_number_theory.jsonl", {"problem", "solution", "solution", "idx", QD_ANSWER_BOXED}, 540, "\\frac{1}{11}"},
    {"math_test_counting_and_probability.jsonl", {"problem", "solution", "solution", "idx", QD_ANSWER_BOXED}, 474,
     "\\frac{10}{11}"},
    {"matharena_aime_2024_I_answers.csv", {NULL, "answer", NULL, "id", QD_ANSWER_PLAIN}, 15, "204"},
    {"matharena_aime_2024_II_answers.csv", {NULL, "answer", NULL, "id", QD_ANSWER_PLAIN}, 15, "073"},
    {"matharena_aime_2025_I_answers.csv", {NULL, "answer", NULL, "id", QD_ANSWER_PLAIN}, 15, "70"},
    {"matharena_aime_2025_II_answers.csv", {NULL, "answer", NULL, "id", QD_ANSWER_PLAIN}, 15, "468"},
    {"matharena_hmmt_feb_2025_answers.csv", {NULL, "answer", NULL, "id", QD_ANSWER_PLAIN}, 30, "103"},
    {"hmmt_feb_2025.jsonl", {"question", "answer", NULL, "id", QD_ANSWER_SET}, 30, "103"},
    {"hmmt_feb25_llmeval.jsonl", {"prompt", "answer", NULL, NULL, QD_ANSWER_PLAIN}, 30, "103"},
    {"hmmt_feb25_nov25_insightreplay.jsonl", {"question", "answer", NULL, "id", QD_ANSWER_PLAIN}, 60, "103"},
    {"grader_cases.jsonl", {"output", "gold", NULL, NULL, QD_ANSWER_PLAIN}, 276, NULL},
    {"normalizer_examples.jsonl", {"input", "hendrycks__strip_string", NULL, NULL, QD_ANSWER_PLAIN}, 45, "\\frac{1}{2}"},
    {"boxed_extraction_examples.jsonl", {"input", "input", NULL, NULL, QD_ANSWER_PLAIN}, 17, NULL},
};

START_TEST(test_parse_fixture)
{
    const fixture_case *c = &fixture_cases[_i];
    qd_bench_set s;
    load_ok(c->file, &c->f, &s);
    ck_assert_msg(s.n == c->n, "%s: %zu records, expected %zu", c->file, s.n, c->n);
    if (c->first_answer)
        ck_assert_str_eq(s.rec[0].answer, c->first_answer);
    for (size_t i = 0; i < s.n; i++) {
        ck_assert_ptr_nonnull(s.rec[i].id);
        ck_assert_ptr_nonnull(s.rec[i].problem);
        ck_assert_msg(s.rec[i].answer[0] != '\0' || !strcmp(c->file, "boxed_extraction_examples.jsonl") ||
                      !strcmp(c->file, "grader_cases.jsonl") || !strcmp(c->file, "normalizer_examples.jsonl"),
                      "%s: record %zu has an empty answer", c->file, i);
        ck_assert_msg(!strchr(" \n", s.rec[i].answer[0]) || !s.rec[i].answer[0], "%s: answer %zu not trimmed", c->file, i);
    }
    qd_bench_set_free(&s);
}
END_TEST

/* The same benchmark from copies with different layouts reads the same. */
static void answers_equal(const char *a_file, qd_bench_fields fa, const char *b_file, qd_bench_fields fb)
{
    qd_bench_set a, b;
    load_ok(a_file, &fa, &a);
    load_ok(b_file, &fb, &b);
    ck_assert_uint_eq(a.n, b.n);
    for (size_t i = 0; i < a.n; i++)
        ck_assert_msg(!strcmp(a.rec[i].answer, b.rec[i].answer), "%s vs %s, record %zu: '%s' != '%s'",
                      a_file, b_file, i, a.rec[i].answer, b.rec[i].answer);
    qd_bench_set_free(&a);
    qd_bench_set_free(&b);
}

/* Concatenates two answer keys (AIME I then II). */
static void answer_key(const char *f1, const char *f2, qd_bench_set *out)
{
    qd_bench_fields f = {NULL, "answer", NULL, "id", QD_ANSWER_PLAIN};
    qd_bench_set a, b;
    load_ok(f1, &f, &a);
    load_ok(f2, &f, &b);
    out->n = a.n + b.n;
    out->rec = malloc(out->n * sizeof *out->rec);
    memcpy(out->rec, a.rec, a.n * sizeof *a.rec);
    memcpy(out->rec + a.n, b.rec, b.n * sizeof *b.rec);
    free(a.rec);
    free(b.rec);
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

START_TEST(test_cross_source)
{
    /* AMC 2023: answers stored as 27.0 (Qwen) and 27 (evalchemy) read alike. */
    answers_equal("amc23_qwen25math.jsonl", (qd_bench_fields){"problem", "answer", NULL, NULL, QD_ANSWER_PLAIN},
                  "amc23_evalchemy.json", (qd_bench_fields){"question", "answer", NULL, NULL, QD_ANSWER_PLAIN});
    /* MATH-500 as JSONL and as the TTRL JSON array; ids too. */
    answers_equal("math500_test.jsonl", (qd_bench_fields){"problem", "answer", NULL, "unique_id", QD_ANSWER_PLAIN},
                  "math500_ttrl_array.json", (qd_bench_fields){"prompt", "answer", NULL, "id", QD_ANSWER_PLAIN});
    /* AIME 2025 (evalchemy JSONL in a .json) vs MathArena's answer keys. */
    qd_bench_set key, a25;
    answer_key("matharena_aime_2025_I_answers.csv", "matharena_aime_2025_II_answers.csv", &key);
    load_ok("aime25_evalchemy.json", &(qd_bench_fields){"problem", "answer", "solution", "id", QD_ANSWER_PLAIN}, &a25);
    ck_assert_uint_eq(key.n, 30);
    for (size_t i = 0; i < 30; i++)
        ck_assert_str_eq(a25.rec[i].answer, key.rec[i].answer);
    ck_assert_str_eq(a25.rec[15].id, "II-1");
    ck_assert_ptr_null(a25.rec[0].solution); /* "" there: no solution */
    qd_bench_set_free(&key);
    qd_bench_set_free(&a25);
    /* AIME 2024: Qwen vs MathArena, as integers (SOURCES.md). */
    qd_bench_set a24;
    answer_key("matharena_aime_2024_I_answers.csv", "matharena_aime_2024_II_answers.csv", &key);
    load_ok("aime24_qwen25math.jsonl", &(qd_bench_fields){"problem", "answer", NULL, "id", QD_ANSWER_PLAIN}, &a24);
    /* Qwen orders problems 1, 10, 11, ..., 2, ...: compare as sorted lists. */
    int x[30], y[30];
    for (size_t i = 0; i < 30; i++) {
        x[i] = atoi(a24.rec[i].answer);
        y[i] = atoi(key.rec[i].answer);
    }
    qsort(x, 30, sizeof x[0], cmp_int);
    qsort(y, 30, sizeof y[0], cmp_int);
    ck_assert_int_eq(memcmp(x, y, sizeof x), 0);
    ck_assert_str_eq(a24.rec[7].answer, "025"); /* zero padding kept */
    qd_bench_set_free(&key);
    qd_bench_set_free(&a24);
    /* HMMT February 2025: MathArena's quoted CSV, insight-replay's JSONL and
     * LLMEval's agree 30/30 (SOURCES.md); the set style wraps only #10's list. */
    qd_bench_fields csv = {NULL, "answer", NULL, "id", QD_ANSWER_PLAIN};
    answers_equal("matharena_hmmt_feb_2025_answers.csv", csv, "hmmt_feb_2025.jsonl",
                  (qd_bench_fields){"question", "answer", NULL, "id", QD_ANSWER_PLAIN});
    answers_equal("matharena_hmmt_feb_2025_answers.csv", csv, "hmmt_feb25_llmeval.jsonl",
                  (qd_bench_fields){"prompt", "answer", NULL, NULL, QD_ANSWER_PLAIN});
    qd_bench_set h;
    load_ok("matharena_hmmt_feb_2025_answers.csv", &csv, &h);
    ck_assert_str_eq(h.rec[9].answer, "\\frac{-1+\\sqrt{17}}{2}, \\frac{-1-\\sqrt{17}}{2}");
    ck_assert_str_eq(h.rec[16].answer, "2^{25} \\cdot 26!");
    qd_bench_set_free(&h);
    csv.style = QD_ANSWER_SET;
    load_ok("matharena_hmmt_feb_2025_answers.csv", &csv, &h);
    ck_assert_str_eq(h.rec[9].answer, "\\{\\frac{-1+\\sqrt{17}}{2}, \\frac{-1-\\sqrt{17}}{2}\\}");
    for (size_t i = 0; i < h.n; i++)
        ck_assert(i == 9 || h.rec[i].answer[0] != '\\' || h.rec[i].answer[1] != '{');
    qd_bench_set_free(&h);
}
END_TEST

START_TEST(test_gsm8k_answers)
{
    /* Our '####' extraction equals the 'A: N' line OpenAI wrote in the
     * companion file, for all 1319 problems; solution is the text before '####'. */
    qd_bench_set t, e;
    load_ok("gsm8k_test.jsonl", &(qd_bench_fields){"question", "answer", NULL, NULL, QD_ANSWER_GSM8K}, &t);
    load_ok("gsm8k_example_model_solutions.jsonl",
            &(qd_bench_fields){"question", "ground_truth", NULL, NULL, QD_ANSWER_PLAIN}, &e);
    size_t same = 0, commas = 0;
    for (size_t i = 0; i < t.n; i++) {
        const char *a = strrchr(e.rec[i].answer, ':');
        char want[64];
        size_t k = 0;
        for (a = a ? a + 1 : ""; *a && k < sizeof want - 1; a++)
            if (*a != ',' && *a != ' ')
                want[k++] = *a;
        want[k] = '\0';
        same += !strcmp(t.rec[i].answer, want);
        commas += strchr(t.rec[i].answer, ',') != NULL;
        ck_assert_str_eq(t.rec[i].problem, e.rec[i].problem);
        ck_assert_ptr_null(strstr(t.rec[i].solution, "####"));
    }
    ck_assert_uint_eq(same, 1319);
    ck_assert_uint_eq(commas, 0);
    ck_assert_str_eq(t.rec[0].solution, "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n"
                                        "She makes 9 * 2 = $<<9*2=18>>18 every day at the farmer\xe2\x80\x99s market.");
    qd_bench_set_free(&t);
    qd_bench_set_free(&e);
}
END_TEST

START_TEST(test_quirks)
{
    qd_bench_set s;
    /* OlympiadBench: final_answer is a list of '$...$' strings; solution a list. */
    load_ok("olympiadbench_qwen25math.jsonl",
            &(qd_bench_fields){"question", "final_answer", "solution", "id", QD_ANSWER_PLAIN}, &s);
    ck_assert_str_eq(s.rec[1].answer, "\\frac{1}{2 n+2}");
    ck_assert_str_eq(s.rec[0].id, "1606");
    ck_assert_ptr_nonnull(strstr(s.rec[0].solution, "2 but not fewer moves"));
    qd_bench_set_free(&s);
    /* Minerva (DeepScaleR copy): a list of accepted answers with trailing newlines. */
    load_ok("minerva_deepscaler.json", &(qd_bench_fields){"problem", "answer", NULL, NULL, QD_ANSWER_PLAIN}, &s);
    size_t multi = 0;
    for (size_t i = 0; i < s.n; i++) {
        multi += s.rec[i].n_alt > 0;
        if (!strcmp(s.rec[i].answer, "0.01") && s.rec[i].n_alt == 1)
            ck_assert_str_eq(s.rec[i].alt[0], "0.02");
    }
    ck_assert_uint_gt(multi, 0);
    /* The Qwen copy keeps the answer only in \boxed{}: the same 272 problems,
     * and the boxed answer is one of DeepScaleR's accepted answers for 146 of
     * them (the rest are written differently, e.g. 3.83e35 vs 3.83 \times 10^{35}). */
    qd_bench_set q;
    load_ok("minerva_math_qwen25math.jsonl", &(qd_bench_fields){"problem", "solution", NULL, NULL, QD_ANSWER_BOXED}, &q);
    size_t found = 0, agree = 0;
    for (size_t i = 0; i < q.n; i++)
        for (size_t j = 0; j < s.n; j++) {
            if (strcmp(q.rec[i].problem, s.rec[j].problem))
                continue;
            found++;
            int ok = !strcmp(q.rec[i].answer, s.rec[j].answer);
            for (size_t k = 0; k < s.rec[j].n_alt; k++)
                ok |= !strcmp(q.rec[i].answer, s.rec[j].alt[k]);
            agree += ok;
            break;
        }
    ck_assert_uint_eq(found, 272);
    ck_assert_uint_eq(agree, 146);
    qd_bench_set_free(&q);
    qd_bench_set_free(&s);
}
END_TEST

/* Our boxed extraction equals Hendrycks' reference output on every example. */
START_TEST(test_boxed_reference)
{
    FILE *f = fopen(fx("boxed_extraction_examples.jsonl"), "r");
    ck_assert_ptr_nonnull(f);
    char line[8192];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        json_error_t err;
        json_t *o = json_loads(line, 0, &err);
        ck_assert_ptr_nonnull(o);
        const char *in = json_string_value(json_object_get(o, "input"));
        const json_t *want = json_object_get(o, "hendrycks/deepscaler last_boxed_only_string+remove_boxed");
        char *got = qd_bench_last_boxed(in);
        if (json_is_null(want))
            ck_assert_msg(got == NULL, "input %s: got '%s', reference None", in, got);
        else
            ck_assert_msg(got && !strcmp(got, json_string_value(want)), "input %s: got '%s'", in, got ? got : "NULL");
        free(got);
        json_decref(o);
        n++;
    }
    fclose(f);
    ck_assert_int_eq(n, 17);
}
END_TEST

static void parse_fails(const char *text, const char *name, qd_bench_fields f, const char *needle)
{
    qd_bench_set s;
    qd_status st = qd_bench_parse(text, strlen(text), name, &f, &s);
    ck_assert_int_ne(st, QD_OK);
    ck_assert_msg(strstr(qd_last_error(), needle) && strstr(qd_last_error(), name),
                  "message '%s' lacks '%s'", qd_last_error(), needle);
    ck_assert_uint_eq(s.n, 0);
    ck_assert_ptr_null(s.rec);
}

START_TEST(test_parse_errors)
{
    qd_bench_fields f = {"problem", "answer", NULL, NULL, QD_ANSWER_PLAIN};
    parse_fails("{\"problem\":\"p\",\"answer\":\"1\"}\n\n{\"problem\":\"q\",\"answer\":2}\n{\"problem\": oops}\n",
                "a.jsonl", f, "line 4: invalid JSON");
    parse_fails("{\"problem\":\"p\"}\n", "b.jsonl", f, "line 1: field 'answer' missing");
    parse_fails("[{\"problem\":\"p\",\"answer\":\"1\"},{\"problem\":\"p\",\"answer\":null}]", "c.json", f,
                "record 1: field 'answer' is null");
    parse_fails("[{\"problem\":\"p\",\"answer\":true}]", "d.json", f, "is a boolean");
    parse_fails("[{\"problem\":\"p\",\"answer\":[]}]", "e.json", f, "empty array");
    parse_fails("[{\"problem\":7,\"answer\":\"1\"}]", "f.json", f, "field 'problem' is not a string");
    parse_fails("[{\"problem\":\"p\",\"answer\":\"1\"}", "g.json", f, "invalid JSON");
    parse_fails("[1]", "h.json", f, "not a JSON object");
    parse_fails("  \n", "i.jsonl", f, "no records");
    parse_fails("id,answer\n1,2,3\n", "j.csv", (qd_bench_fields){NULL, "answer", NULL, "id", QD_ANSWER_PLAIN},
                "line 2: 3 cells, header has 2");
    qd_bench_fields key = {NULL, "answer", NULL, "id", QD_ANSWER_PLAIN};
    parse_fails("id,answer\n1,\"\\frac{1}{2}\n", "m.csv", key, "line 2: unterminated quoted field");
    parse_fails("id,answer\n1,\"a\"b\n", "n.csv", key, "line 2: text after a quoted field");
    parse_fails("id,answer\n1,a\"b\n", "o.csv", key, "line 2: a quote inside an unquoted field");
    parse_fails("{\"problem\":\"p\",\"answer\":\"no marker\"}", "k.jsonl",
                (qd_bench_fields){"problem", "answer", NULL, NULL, QD_ANSWER_GSM8K}, "no '#### answer' line");
    parse_fails("{\"problem\":\"p\",\"answer\":\"\\\\boxed{1\"}", "l.jsonl",
                (qd_bench_fields){"problem", "answer", NULL, NULL, QD_ANSWER_BOXED}, "no \\boxed{} answer");
}
END_TEST

START_TEST(test_field_paths_and_numbers)
{
    /* DAPO-style nesting, a key containing '.', numbers of both JSON kinds. */
    const char *t =
        "{\"prompt\":[{\"role\":\"user\",\"content\":\"Q1\"}],\"reward_model\":{\"ground_truth\":\"34\"},\"a.b\":1}\n"
        "{\"prompt\":[{\"role\":\"user\",\"content\":\"Q2\"}],\"reward_model\":{\"ground_truth\":2.5},\"a.b\":2}\n"
        "{\"prompt\":[{\"role\":\"user\",\"content\":\"Q3\"}],\"reward_model\":{\"ground_truth\":-3.0},\"a.b\":3}\n"
        "{\"prompt\":[{\"role\":\"user\",\"content\":\"Q4\"}],\"reward_model\":{\"ground_truth\":0.1},\"a.b\":4}\n"
        "{\"prompt\":[{\"role\":\"user\",\"content\":\"Q5\"}],\"reward_model\":{\"ground_truth\":12345678901},\"a.b\":5}";
    qd_bench_fields f = {"prompt.0.content", "reward_model.ground_truth", NULL, "a.b", QD_ANSWER_PLAIN};
    qd_bench_set s;
    ck_assert_int_eq(qd_bench_parse(t, strlen(t), "dapo.jsonl", &f, &s), QD_OK);
    ck_assert_uint_eq(s.n, 5);
    qd_bench_set_free(&s);
    char bom[2048];
    snprintf(bom, sizeof bom, "\xef\xbb\xbf%s", t);
    ck_assert_int_eq(qd_bench_parse(bom, strlen(bom), "dapo.jsonl", &f, &s), QD_OK);
    ck_assert_uint_eq(s.n, 5);
    const char *want[] = {"34", "2.5", "-3", "0.1", "12345678901"};
    for (int i = 0; i < 5; i++)
        ck_assert_str_eq(s.rec[i].answer, want[i]);
    ck_assert_str_eq(s.rec[1].problem, "Q2");
    ck_assert_str_eq(s.rec[4].id, "5");
    ck_assert_ptr_null(s.rec[0].solution);
    qd_bench_set_free(&s);
    f.problem = "prompt.1.content";
    parse_fails(t, "dapo.jsonl", f, "field 'prompt.1.content' missing");
}
END_TEST

START_TEST(test_content_checks)
{
    const char lfs[] = "version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 1\n";
    ck_assert_int_eq(qd_fetch_check_content("x", lfs, sizeof lfs - 1), QD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "Git-LFS pointer"));
    const char html[] = "\xef\xbb\xbf  \n<HTML><body>Too Many Requests</body></html>";
    ck_assert_int_eq(qd_fetch_check_content("x", html, sizeof html - 1), QD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "HTML page"));
    const char ok[] = "{\"problem\": \"<html> in a problem is fine\"}";
    ck_assert_int_eq(qd_fetch_check_content("x", ok, sizeof ok - 1), QD_OK);
}
END_TEST

/* ---- synthetic tasks ------------------------------------------------- */

/* An independent evaluator for the generated text: + - * with parentheses. */
static long long eval_expr(const char **p);
static long long eval_atom(const char **p)
{
    while (**p == ' ')
        (*p)++;
    if (**p == '(') {
        (*p)++;
        long long v = eval_expr(p);
        while (**p == ' ')
            (*p)++;
        ck_assert_int_eq(**p, ')');
        (*p)++;
        return v;
    }
    char *end;
    long long v = strtoll(*p, &end, 10);
    ck_assert_ptr_ne(end, *p);
    *p = end;
    return v;
}
static long long eval_term(const char **p)
{
    long long v = eval_atom(p);
    for (;;) {
        while (**p == ' ')
            (*p)++;
        if (**p != '*')
            return v;
        (*p)++;
        v *= eval_atom(p);
    }
}
static long long eval_expr(const char **p)
{
    long long v = eval_term(p);
    for (;;) {
        while (**p == ' ')
            (*p)++;
        if (**p != '+' && **p != '-')
            return v;
        int op = *(*p)++;
        long long b = eval_term(p);
        v = op == '+' ? v + b : v - b;
    }
}

static void check_answers(const qd_bench_set *s)
{
    for (size_t i = 0; i < s->n; i++) {
        const char *p = s->rec[i].problem;
        ck_assert(!strncmp(p, "What is ", 8));
        p += 8;
        long long v = eval_expr(&p);
        ck_assert_str_eq(p, "?");
        ck_assert_msg(v == atoll(s->rec[i].answer), "%s -> %s, evaluated %lld", s->rec[i].problem, s->rec[i].answer, v);
    }
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

START_TEST(test_synth_splits)
{
    qd_synth_opts o = {.seed = 1, .steps = 1, .max_operand = 99};
    qd_bench_set train, test, test2, again;
    ck_assert_int_eq(qd_synth_generate(&o, QD_SPLIT_TRAIN, 20000, &train), QD_OK);
    ck_assert_int_eq(qd_synth_generate(&o, QD_SPLIT_TEST, 2000, &test), QD_OK);
    o.seed = 2;
    ck_assert_int_eq(qd_synth_generate(&o, QD_SPLIT_TEST, 2000, &test2), QD_OK);
    check_answers(&train);
    check_answers(&test);
    /* No held-out problem of either seed appears in train; sets have no repeats. */
    size_t n = train.n + test.n + test2.n;
    char **all = malloc(n * sizeof *all);
    for (size_t i = 0; i < train.n; i++)
        all[i] = train.rec[i].problem;
    for (size_t i = 0; i < test.n; i++)
        all[train.n + i] = test.rec[i].problem;
    for (size_t i = 0; i < test2.n; i++)
        all[train.n + test.n + i] = test2.rec[i].problem;
    qsort(all, n, sizeof *all, cmp_str);
    size_t shared = 0;
    for (size_t i = 1; i < n; i++)
        if (!strcmp(all[i], all[i - 1])) {
            ck_assert_int_eq(qd_synth_split_of(all[i]), QD_SPLIT_TEST); /* only the two test sets may overlap */
            shared++;
        }
    ck_assert_uint_gt(shared, 0); /* seeds 1 and 2 share test problems: the split is by text, not by seed */
    for (size_t i = 0; i < train.n; i++)
        ck_assert_int_eq(qd_synth_split_of(train.rec[i].problem), QD_SPLIT_TRAIN);
    for (size_t i = 0; i < test.n; i++)
        ck_assert_int_eq(qd_synth_split_of(test.rec[i].problem), QD_SPLIT_TEST);
    free(all);
    /* Deterministic: the same seed gives the same problems; another seed others. */
    o.seed = 1;
    ck_assert_int_eq(qd_synth_generate(&o, QD_SPLIT_TEST, 2000, &again), QD_OK);
    size_t differ = 0;
    for (size_t i = 0; i < again.n; i++) {
        ck_assert_str_eq(again.rec[i].problem, test.rec[i].problem);
        ck_assert_str_eq(again.rec[i].answer, test.rec[i].answer);
        differ += strcmp(test2.rec[i].problem, test.rec[i].problem) != 0;
    }
    ck_assert_uint_gt(differ, 1900);
    qd_bench_set_free(&train);
    qd_bench_set_free(&test);
    qd_bench_set_free(&test2);
    qd_bench_set_free(&again);
}
END_TEST

START_TEST(test_synth_multistep_and_limits)
{
    qd_synth_opts o = {.seed = 7, .steps = 3, .max_operand = 20};
    qd_bench_set s;
    ck_assert_int_eq(qd_synth_generate(&o, QD_SPLIT_TRAIN, 3000, &s), QD_OK);
    check_answers(&s);
    size_t parens = 0, negative = 0;
    for (size_t i = 0; i < s.n; i++) {
        parens += strchr(s.rec[i].problem, '(') != NULL;
        negative += s.rec[i].answer[0] == '-';
    }
    ck_assert_uint_gt(parens, 100);
    ck_assert_uint_gt(negative, 100);
    qd_bench_set_free(&s);
    /* Operands 0..1 with one operation: 12 problems in all, so 50 held-out ones cannot exist. */
    o = (qd_synth_opts){.seed = 1, .steps = 1, .max_operand = 1};
    ck_assert_int_eq(qd_synth_generate(&o, QD_SPLIT_TEST, 50, &s), QD_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "distinct held-out problems"));
    o.steps = 5;
    ck_assert_int_eq(qd_synth_generate(&o, QD_SPLIT_TRAIN, 1, &s), QD_ERR_ARG);
}
END_TEST

/* ---- the fetcher against a loopback server --------------------------- */

static pid_t server_pid = -1;
static int server_port;
static int server_stdin = -1;

static void server_start(void)
{
    int out[2], in[2];
    ck_assert_int_eq(pipe(out), 0);
    ck_assert_int_eq(pipe(in), 0);
    char script[4096], dir[4096];
    snprintf(script, sizeof script, "%s", qd_test_path("tests/http_server.py"));
    snprintf(dir, sizeof dir, "%s", qd_test_path(FX));
    server_pid = fork();
    if (server_pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[1]);
        close(out[0]);
        execlp("python3", "python3", script, dir, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    server_stdin = in[1];
    FILE *f = fdopen(out[0], "r");
    if (!f || fscanf(f, "%d", &server_port) != 1) {
        fprintf(stderr, "benchmarks: could not start tests/http_server.py\n");
        server_port = 0;
    }
    if (f)
        fclose(f);
}

static void server_stop(void)
{
    if (server_pid > 0) {
        close(server_stdin);
        kill(server_pid, SIGTERM);
        waitpid(server_pid, NULL, 0);
    }
    server_pid = -1;
}

static char cache[256];

static int n_files;
static int count_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    n_files += flag == FTW_F;
    return 0;
}

/* Regular files under the cache (0 when it does not exist). */
static int cache_files(void)
{
    n_files = 0;
    nftw(cache, count_entry, 16, FTW_PHYS);
    return n_files;
}

/* A fresh cache and the hub endpoints pointed at the loopback server. */
static void http_setup(void)
{
    ck_assert_msg(server_port > 0, "loopback server not running");
    snprintf(cache, sizeof cache, "/tmp/qd_bench_test_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(cache));
    char base[64];
    snprintf(base, sizeof base, "http://127.0.0.1:%d", server_port);
    setenv("QUADS_CACHE", cache, 1);
    setenv("HF_ENDPOINT", base, 1);
    setenv("HF_DATASETS_SERVER", base, 1);
    unsetenv("QUADS_OFFLINE");
}

static void http_teardown(void)
{
    qd_test_rm_tree(cache);
}

static void test_opts(qd_fetch_opts *o)
{
    qd_fetch_opts_default(o);
    o->connect_timeout_s = 2;
    o->low_speed_time_s = 1;
    o->low_speed_bytes = 1000; /* libcurl averages over seconds: a high floor trips at once */
    o->max_attempts = 3;
    o->backoff_ms = 10;
    o->max_backoff_ms = 40;
    o->progress = 0;
    o->offline = 0;
}

static char *url_of(const char *path)
{
    static _Thread_local char u[1100];
    snprintf(u, sizeof u, "http://127.0.0.1:%d%s", server_port, path);
    return u;
}

/* How many requests the server has seen for path. */
static int hits(const char *path)
{
    char q[1024], *buf;
    size_t len;
    qd_fetch_opts o;
    test_opts(&o);
    size_t k = (size_t)snprintf(q, sizeof q, "/hits?path=");
    for (const char *c = path; *c && k + 4 < sizeof q; c++)
        k += strchr("?&= ", *c) ? (size_t)sprintf(q + k, "%%%02X", *c) : (q[k] = *c, (size_t)1);
    q[k] = '\0';
    ck_assert_int_eq(qd_fetch_memory(url_of(q), &o, &buf, &len), QD_OK);
    int n = atoi(buf);
    free(buf);
    return n;
}

static const char *AIME24 = "aime24_qwen25math.jsonl";
static const char *AIME24_SHA = "af2b8bd2aa911b6333ad0df32f3ca05c7ae8ed10f1731f4372c8ae26990bf7ac";

/* Fetches /datasets/t/HOW/resolve/main/FILE into the cache with pin. */
static qd_status fetch_how(const char *how, const char *file, const char *pin, char *dest, size_t n)
{
    char path[512];
    qd_fetch_opts o;
    test_opts(&o);
    snprintf(path, sizeof path, "/datasets/t/%s/resolve/main/%s", how, file);
    snprintf(dest, n, "%s/%s/%s", cache, how, file);
    return qd_fetch_file(url_of(path), dest, pin, &o, NULL);
}

static void expect_failure(qd_status st, const char *needle)
{
    ck_assert_msg(st != QD_OK, "succeeded; expected a failure saying '%s'", needle);
    ck_assert_msg(strstr(qd_last_error(), needle), "message '%s' lacks '%s'", qd_last_error(), needle);
    ck_assert_msg(cache_files() == 0, "the cache holds %d file(s) after a failure", cache_files());
}

START_TEST(test_fetch_ok)
{
    char dest[512], hex[65];
    ck_assert_int_eq(fetch_how("ok", AIME24, AIME24_SHA, dest, sizeof dest), QD_OK);
    ck_assert_int_eq(qd_sha256_file(dest, hex), QD_OK);
    ck_assert_str_eq(hex, AIME24_SHA);
    ck_assert_int_eq(cache_files(), 1);
    qd_bench_set s;
    ck_assert_int_eq(qd_bench_load_file(dest, &(qd_bench_fields){"problem", "answer", NULL, "id", QD_ANSWER_PLAIN}, &s), QD_OK);
    ck_assert_uint_eq(s.n, 30);
    qd_bench_set_free(&s);
}
END_TEST

START_TEST(test_fetch_redirect)
{
    char dest[512];
    ck_assert_int_eq(fetch_how("redirect", AIME24, AIME24_SHA, dest, sizeof dest), QD_OK);
    ck_assert_int_eq(hits("/cdn/aime24_qwen25math.jsonl"), 1);
    ck_assert_int_eq(cache_files(), 1);
}
END_TEST

START_TEST(test_fetch_404)
{
    char dest[512];
    expect_failure(fetch_how("ok", "no_such_file.jsonl", NULL, dest, sizeof dest), "HTTP 404 (not found): Entry not found");
    ck_assert_int_eq(hits("/datasets/t/ok/resolve/main/no_such_file.jsonl"), 1); /* not retried */
}
END_TEST

START_TEST(test_fetch_retries)
{
    char dest[512];
    /* 500 then 200, 429 then 200, a connection cut mid-body then a whole reply. */
    ck_assert_int_eq(fetch_how("flaky500", AIME24, AIME24_SHA, dest, sizeof dest), QD_OK);
    ck_assert_int_eq(hits("/datasets/t/flaky500/resolve/main/aime24_qwen25math.jsonl"), 2);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_int_eq(fetch_how("flaky429", AIME24, AIME24_SHA, dest, sizeof dest), QD_OK);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ck_assert_int_ge(t1.tv_sec * 1000 + t1.tv_nsec / 1000000 - (t0.tv_sec * 1000 + t0.tv_nsec / 1000000), 990); /* Retry-After: 1 */
    ck_assert_int_eq(hits("/datasets/t/flaky429/resolve/main/aime24_qwen25math.jsonl"), 2);
    ck_assert_int_eq(fetch_how("cutonce", AIME24, AIME24_SHA, dest, sizeof dest), QD_OK);
    ck_assert_int_eq(hits("/datasets/t/cutonce/resolve/main/aime24_qwen25math.jsonl"), 2);
    char hex[65];
    ck_assert_int_eq(qd_sha256_file(dest, hex), QD_OK);
    ck_assert_str_eq(hex, AIME24_SHA);
    ck_assert_int_eq(cache_files(), 3);
}
END_TEST

START_TEST(test_fetch_server_errors)
{
    char dest[512];
    expect_failure(fetch_how("always503", AIME24, NULL, dest, sizeof dest), "HTTP 503 (server error) (gave up after 3 attempts)");
    ck_assert_int_eq(hits("/datasets/t/always503/resolve/main/aime24_qwen25math.jsonl"), 3);
    expect_failure(fetch_how("cut", AIME24, NULL, dest, sizeof dest), "connection cut mid-body after 78472 of 156944 bytes");
    ck_assert_int_eq(hits("/datasets/t/cut/resolve/main/aime24_qwen25math.jsonl"), 3);
}
END_TEST

START_TEST(test_fetch_timeout)
{
    char dest[512];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    expect_failure(fetch_how("slow", AIME24, NULL, dest, sizeof dest), "timed out after 10 bytes");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    /* 3 attempts of ~1 s each (the server would stall for 8 s). */
    ck_assert_msg(s > 2.0 && s < 7.0, "took %.2f s", s);
}
END_TEST

START_TEST(test_fetch_bad_content)
{
    char dest[512];
    expect_failure(fetch_how("ok", AIME24, "0000000000000000000000000000000000000000000000000000000000000000", dest, sizeof dest),
                   "sha256 mismatch: got af2b8bd2");
    expect_failure(fetch_how("corrupt", AIME24, AIME24_SHA, dest, sizeof dest), "sha256 mismatch");
    expect_failure(fetch_how("lfs", AIME24, NULL, dest, sizeof dest), "Git-LFS pointer");
    expect_failure(fetch_how("html", AIME24, NULL, dest, sizeof dest), "HTML page");
}
END_TEST

static double seconds_since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0->tv_nsec);
}

/* Fetches /datasets/t/HOW/resolve/main/AIME24 into the cache (pinned) with o. */
static qd_status fetch_how_opts(const char *how, const qd_fetch_opts *o, char *dest, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "/datasets/t/%s/resolve/main/%s", how, AIME24);
    snprintf(dest, n, "%s/%s/%s", cache, how, AIME24);
    return qd_fetch_file(url_of(path), dest, AIME24_SHA, o, NULL);
}

/* Like fetch_how with options of the caller's. */
static qd_status fetch_with(const char *how, const qd_fetch_opts *o)
{
    char path[512], dest[512];
    snprintf(path, sizeof path, "/datasets/t/%s/resolve/main/%s", how, AIME24);
    snprintf(dest, sizeof dest, "%s/%s/%s", cache, how, AIME24);
    return qd_fetch_file(url_of(path), dest, NULL, o, NULL);
}

/* The defaults bound every download: time, speed and size. */
START_TEST(test_fetch_default_limits)
{
    qd_fetch_opts o;
    qd_fetch_opts_default(&o);
    ck_assert_int_gt(o.timeout_s, 0);
    ck_assert_int_ge(o.low_speed_bytes, 1024);
    ck_assert_int_gt(o.max_bytes, 0);
}
END_TEST

/* An entry's own limits replace the caller's: LiveCodeBench's 1.25 GB
 * test.jsonl is over the 256 MiB default; a tiny entry limit stops a
 * download the defaults allow. */
START_TEST(test_entry_limits)
{
    ck_assert_int_gt(qd_bench_find("lcb-v1")->max_bytes, (int64_t)1300000000);
    qd_fetch_opts o;
    test_opts(&o);
    qd_bench_info b = {.name = "t", .source = QD_SRC_FILE, .repo = "t/ok", .revision = "main", .path = AIME24,
                       .max_bytes = 1000, .fields = {"problem", "answer", NULL, "id", QD_ANSWER_PLAIN}};
    qd_bench_set s;
    expect_failure(qd_bench_load(&b, &o, &s), "larger than the limit of 1000 bytes");
    b.max_bytes = 0;
    ck_assert_int_eq(qd_bench_load(&b, &o, &s), QD_OK);
    ck_assert_uint_eq(s.n, 30);
    qd_bench_set_free(&s);
}
END_TEST

/* An endless chunked body stops at the size limit, leaving nothing behind. */
START_TEST(test_fetch_endless_body)
{
    qd_fetch_opts o;
    test_opts(&o);
    o.max_bytes = 1 << 20;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    expect_failure(fetch_with("endless", &o), "larger than the limit of 1048576 bytes");
    ck_assert_double_lt(seconds_since(&t0), 5.0);
    ck_assert_int_eq(hits("/datasets/t/endless/resolve/main/aime24_qwen25math.jsonl"), 1); /* not retried */
}
END_TEST

/* Two bytes every half second beat a 1 B/s low-speed floor; the overall
 * timeout ends it anyway. */
START_TEST(test_fetch_drip)
{
    qd_fetch_opts o;
    test_opts(&o);
    o.low_speed_bytes = 1; /* the old default, which the drip stays above */
    o.low_speed_time_s = 1;
    o.timeout_s = 2;
    o.max_attempts = 1;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    expect_failure(fetch_with("drip", &o), "timed out");
    ck_assert_double_lt(seconds_since(&t0), 5.0);
}
END_TEST

/* A 64 MiB body gzipped into ~64 KB is cut at the limit on decoded bytes. */
START_TEST(test_fetch_gzip_bomb)
{
    qd_fetch_opts o;
    test_opts(&o);
    o.max_bytes = 1 << 20;
    expect_failure(fetch_with("gzipbomb", &o), "larger than the limit of 1048576 bytes (counted after decoding)");
}
END_TEST

/* Control characters of the server's messages never reach the terminal. */
START_TEST(test_fetch_sanitizes_server_text)
{
    qd_fetch_opts o;
    test_opts(&o);
    ck_assert_int_ne(fetch_with("evilmsg", &o), QD_OK);
    const char *m = qd_last_error();
    ck_assert_msg(strstr(m, "HTTP 403") && strstr(m, "gated"), "%s", m);
    for (const char *c = m; *c; c++)
        ck_assert_msg((unsigned char)*c >= 0x20 && (unsigned char)*c < 0x7f, "byte 0x%02x in '%s'", (unsigned char)*c, m);
    qd_bench_info b = {.name = "t", .source = QD_SRC_ROWS, .repo = "t/rows-evil", .config = "c", .split = "s",
                       .fields = {"problem", "answer", NULL, "id", QD_ANSWER_PLAIN}};
    qd_bench_set s;
    expect_failure(qd_bench_load(&b, &o, &s), "?[2Jbad? request");
}
END_TEST

/* Empty or unparsable 200 replies fail and leave nothing in the cache, so the
 * next fetch asks the server again. */
START_TEST(test_fetch_unparsable_not_cached)
{
    qd_fetch_opts o;
    test_opts(&o);
    qd_bench_set s;
    qd_bench_info b = {.name = "t", .source = QD_SRC_FILE, .revision = "main", .path = AIME24,
                       .fields = {"problem", "answer", NULL, "id", QD_ANSWER_PLAIN}};
    b.repo = "t/empty";
    expect_failure(qd_bench_load(&b, &o, &s), "no records");
    expect_failure(qd_bench_load(&b, &o, &s), "no records");
    ck_assert_int_eq(hits("/datasets/t/empty/resolve/main/aime24_qwen25math.jsonl"), 2);
    b.repo = "t/garbage";
    expect_failure(qd_bench_load(&b, &o, &s), "invalid JSON");
    b.repo = "t/ok";
    b.rows = 29; /* parses, but not into the expected count */
    expect_failure(qd_bench_load(&b, &o, &s), "30 records, the registry expects 29");
    qd_bench_info r = {.name = "t", .source = QD_SRC_ROWS, .repo = "t/rows-empty", .config = "c", .split = "s",
                       .fields = {"problem", "answer", NULL, "id", QD_ANSWER_PLAIN}};
    expect_failure(qd_bench_load(&r, &o, &s), "no records");
    char url[1100];
    snprintf(url, sizeof url, "%s", url_of("/datasets/t/garbage/resolve/main/aime24_qwen25math.jsonl"));
    expect_failure(qd_bench_load_url(url, &b.fields, &o, &s), "invalid JSON");
}
END_TEST

/* A temp file that a killed fetch left is removed by the next fetch. */
START_TEST(test_fetch_cleans_stale_temp)
{
    qd_fetch_opts o;
    test_opts(&o);
    const qd_bench_info *b = qd_bench_find("aime25");
    char path[4096], stale[4200], stale2[4200];
    ck_assert_int_eq(qd_bench_cache_path(b, path, sizeof path), QD_OK);
    ck_assert_int_eq(qd_mkdirs_parent(path), QD_OK);
    snprintf(stale, sizeof stale, "%s.tmp.Ab12Cd", path);
    snprintf(stale2, sizeof stale2, "%s.sha256.tmp.Xy34Zw", path);
    qd_test_write_file(stale, "half a download");
    qd_test_write_file(stale2, "");
    ck_assert_int_eq(cache_files(), 2);
    qd_bench_set s;
    ck_assert_int_eq(qd_bench_load(b, &o, &s), QD_OK);
    qd_bench_set_free(&s);
    ck_assert_int_ne(access(stale, F_OK), 0);
    ck_assert_int_ne(access(stale2, F_OK), 0);
    ck_assert_int_eq(cache_files(), 2); /* the file and its .sha256 */
}
END_TEST

/* A cut download resumes from its .part file with a Range request, in the
 * same run (retries) and in the next one; a server that ignores Range makes
 * the file start over. */
START_TEST(test_fetch_resume)
{
    qd_fetch_opts o;
    test_opts(&o);
    o.resume = 1;
    o.max_attempts = 1;
    char dest[512], part[600], hex[65];
    ck_assert_int_ne(fetch_how_opts("rangecut", &o, dest, sizeof dest), QD_OK);
    snprintf(part, sizeof part, "%s.part", dest);
    struct stat sb;
    ck_assert_int_eq(stat(part, &sb), 0);
    ck_assert_int_eq(sb.st_size, 78472); /* half of the 156,944 bytes, kept */
    ck_assert_int_eq(fetch_how_opts("rangecut", &o, dest, sizeof dest), QD_OK); /* the next run */
    ck_assert_int_eq(qd_sha256_file(dest, hex), QD_OK);
    ck_assert_str_eq(hex, AIME24_SHA);
    ck_assert_int_ne(access(part, F_OK), 0);
    ck_assert_int_eq(hits("range /datasets/t/rangecut/resolve/main/aime24_qwen25math.jsonl"), 1);
    ck_assert_int_eq(hits("/datasets/t/rangecut/resolve/main/aime24_qwen25math.jsonl"), 2);
    ck_assert_int_eq(cache_files(), 1);
    /* retries within one run: cut, then a Range the server ignores (200 whole:
     * libcurl refuses to append it), then from the start */
    o.max_attempts = 3;
    ck_assert_int_eq(fetch_how_opts("norange", &o, dest, sizeof dest), QD_OK);
    ck_assert_int_eq(qd_sha256_file(dest, hex), QD_OK);
    ck_assert_str_eq(hex, AIME24_SHA);
    ck_assert_int_eq(hits("/datasets/t/norange/resolve/main/aime24_qwen25math.jsonl"), 3);
    /* a part whose content fails the checks is not kept */
    qd_test_write_file(part, "<html>not data");
    ck_assert_int_ne(fetch_how_opts("rangecut", &o, dest, sizeof dest), QD_OK);
    ck_assert_int_ne(access(part, F_OK), 0);
}
END_TEST

/* LiveCodeBench releases: rows kept whole with their contest dates, selected
 * by an inclusive date window; each release file is checked for its own
 * count before it is cached. */
START_TEST(test_lcb_registry)
{
    qd_fetch_opts o;
    test_opts(&o);
    const qd_bench_info *b = qd_bench_find("lcb-v1");
    ck_assert_ptr_nonnull(b);
    qd_bench_set s;
    ck_assert_msg(qd_bench_load(b, &o, &s) == QD_OK, "%s", qd_last_error());
    ck_assert_uint_eq(s.n, 400);
    ck_assert_str_eq(s.rec[0].id, "1873_A");
    ck_assert_str_eq(s.rec[0].date, "2023-08-21T00:00:00");
    ck_assert_str_eq(s.rec[0].answer, "");
    ck_assert_ptr_nonnull(s.rec[0].code);
    ck_assert_ptr_nonnull(strstr(s.rec[0].code->public_tests, "\"input\": \"6\\nabc\\nacb"));
    ck_assert_ptr_nonnull(strstr(s.rec[0].problem, "There are three cards with letters"));
    qd_bench_set_free(&s);
    static const struct {
        const char *from, *to;
        size_t n;
    } win[] = {{"2023-09-01", "2023-09-30", 44}, {"2023-09-30", "2023-09-30", 8}, {"2024-01-01", NULL, 75},
               {NULL, "2023-05-07", 2}, {"2025-01-01", NULL, 0}};
    for (size_t i = 0; i < sizeof win / sizeof win[0]; i++) {
        ck_assert_int_eq(qd_bench_load_window(b, &o, win[i].from, win[i].to, &s), QD_OK);
        ck_assert_msg(s.n == win[i].n, "window %zu: %zu records", i, s.n);
        ck_assert_uint_eq(s.read, 400);
        for (size_t k = 0; k < s.n; k++)
            ck_assert(!win[i].from || strncmp(s.rec[k].date, win[i].from, 10) >= 0);
        qd_bench_set_free(&s);
    }
    ck_assert_int_eq(hits("/datasets/livecodebench/code_generation_lite/resolve/main/test.jsonl"), 1);
    ck_assert_int_ne(qd_bench_load_window(qd_bench_find("aime24"), &o, "2024-01-01", NULL, &s), QD_OK);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "no date"));
    /* release_v2 = test.jsonl (cached) + test2.jsonl; here the server's
     * test2.jsonl holds 400 problems, not 111: refused, not cached */
    ck_assert_int_ne(qd_bench_load(qd_bench_find("lcb-v2"), &o, &s), QD_OK);
    ck_assert_msg(strstr(qd_last_error(), "test2.jsonl: 400 records, the registry expects 111"), "%s", qd_last_error());
    ck_assert_int_eq(cache_files(), 2); /* test.jsonl and its .sha256 */
}
END_TEST

/* A rows reply claiming 10^12 rows is refused after one request. */
START_TEST(test_rows_huge_claim)
{
    qd_fetch_opts o;
    test_opts(&o);
    qd_bench_info b = {.name = "t", .source = QD_SRC_ROWS, .repo = "t/rows-huge", .config = "c", .split = "s",
                       .fields = {"problem", "answer", NULL, "id", QD_ANSWER_PLAIN}};
    qd_bench_set s;
    expect_failure(qd_bench_load(&b, &o, &s), "claims 1000000000000 rows, more than the 1000000 this benchmark may have");
    ck_assert_int_eq(hits("/rows?dataset=t/rows-huge&config=c&split=s&offset=100&length=100"), 0);
    b.rows = 30; /* a known count is checked on the first page too */
    expect_failure(qd_bench_load(&b, &o, &s), "the rows API reports 1000000000000 rows, the registry expects 30");
    b.rows = 0;
    b.max_rows = 250;
    expect_failure(qd_bench_load(&b, &o, &s), "more than the 250 this benchmark may have");
    ck_assert_int_eq(hits("/rows?dataset=t/rows-huge&config=c&split=s&offset=0&length=100"), 3);
    ck_assert_int_eq(hits("/rows?dataset=t/rows-huge&config=c&split=s&offset=100&length=100"), 0);
}
END_TEST

/* A registry entry and the cache: the rows API paged 100 at a time, then offline use. */
START_TEST(test_registry_rows_and_offline)
{
    qd_fetch_opts o;
    test_opts(&o);
    qd_bench_set s, ref;
    const qd_bench_info *b = qd_bench_find("gsm8k");
    ck_assert_ptr_nonnull(b);
    ck_assert_int_eq(qd_bench_load(b, &o, &s), QD_OK);
    ck_assert_uint_eq(s.n, 1319);
    load_ok("gsm8k_test.jsonl", &b->fields, &ref);
    for (size_t i = 0; i < s.n; i++) {
        ck_assert_str_eq(s.rec[i].problem, ref.rec[i].problem);
        ck_assert_str_eq(s.rec[i].answer, ref.rec[i].answer);
    }
    ck_assert_int_eq(hits("/rows?dataset=openai/gsm8k&config=main&split=test&offset=1300&length=100"), 1);
    ck_assert_int_eq(hits("/rows?dataset=openai/gsm8k&config=main&split=test&offset=1400&length=100"), 0);
    ck_assert_int_eq(cache_files(), 2); /* the JSONL and its recorded sha256 */
    qd_bench_set_free(&s);
    /* Offline: served from the cache, no request made. */
    o.offline = 1;
    ck_assert_int_eq(qd_bench_load(b, &o, &s), QD_OK);
    ck_assert_uint_eq(s.n, 1319);
    qd_bench_set_free(&s);
    ck_assert_int_eq(hits("/rows?dataset=openai/gsm8k&config=main&split=test&offset=0&length=100"), 1);
    /* A damaged cache file fails offline and is fetched again online. */
    char path[4096];
    ck_assert_int_eq(qd_bench_cache_path(b, path, sizeof path), QD_OK);
    FILE *f = fopen(path, "r+");
    fputc('X', f);
    fclose(f);
    ck_assert_int_ne(qd_bench_load(b, &o, &s), QD_OK);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "fails its sha256 check"));
    o.offline = 0;
    ck_assert_int_eq(qd_bench_load(b, &o, &s), QD_OK);
    ck_assert_str_eq(s.rec[0].answer, "18");
    ck_assert_int_eq(hits("/rows?dataset=openai/gsm8k&config=main&split=test&offset=0&length=100"), 2);
    qd_bench_set_free(&s);
    qd_bench_set_free(&ref);
    /* Offline with nothing cached. */
    o.offline = 1;
    ck_assert_int_ne(qd_bench_load(qd_bench_find("aime24"), &o, &s), QD_OK);
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "offline"));
    ck_assert_ptr_nonnull(strstr(qd_last_error(), "not in the cache"));
}
END_TEST

START_TEST(test_registry_entries)
{
    /* Entries whose hub layout the fixtures share, through HF_ENDPOINT /
     * HF_DATASETS_SERVER; math500 is checked against its pinned sha256. */
    static const struct { const char *name; size_t n; const char *first; } e[] = {
        {"math500", 500, "\\left( 3, \\frac{\\pi}{2} \\right)"}, {"aime25", 30, "70"},
        {"aime24", 30, "204"}, {"amc23", 40, "27"}, {"olympiadbench", 675, "2"}, {"hmmt25", 30, "103"},
    };
    qd_fetch_opts o;
    test_opts(&o);
    for (size_t i = 0; i < sizeof e / sizeof e[0]; i++) {
        qd_bench_set s;
        const qd_bench_info *b = qd_bench_find(e[i].name);
        ck_assert_ptr_nonnull(b);
        ck_assert_msg(qd_bench_load(b, &o, &s) == QD_OK, "%s: %s", e[i].name, qd_last_error());
        ck_assert_uint_eq(s.n, e[i].n);
        ck_assert_str_eq(s.rec[0].answer, e[i].first);
        qd_bench_set_free(&s);
    }
    char url[4096];
    ck_assert_int_eq(qd_bench_file_url(qd_bench_find("math500"), url, sizeof url), QD_OK);
    ck_assert_str_eq(url, url_of("/datasets/HuggingFaceH4/MATH-500/resolve/ff5b20257d8185524591543f8ff5993951537bb8/test.jsonl"));
    ck_assert_int_eq(cache_files(), 12);
}
END_TEST

START_TEST(test_rows_failures)
{
    qd_fetch_opts o;
    test_opts(&o);
    qd_bench_info b = {.name = "t", .source = QD_SRC_ROWS, .config = "c", .split = "s",
                       .fields = {"problem", "answer", NULL, "id", QD_ANSWER_PLAIN}};
    qd_bench_set s;
    b.repo = "t/rows-flaky"; /* 503 on the first page, once */
    ck_assert_int_eq(qd_bench_load(&b, &o, &s), QD_OK);
    ck_assert_uint_eq(s.n, 30);
    qd_bench_set_free(&s);
    qd_test_rm_tree(cache);
    b.repo = "t/rows-truncated";
    expect_failure(qd_bench_load(&b, &o, &s), "the server truncated cells of row 7");
    b.repo = "t/rows-shrink";
    expect_failure(qd_bench_load(&b, &o, &s), "num_rows_total changed while paging");
    b.repo = "t/rows-bad";
    expect_failure(qd_bench_load(&b, &o, &s), "reply lacks field 'rows'");
    b.repo = "t/no-such-dataset";
    expect_failure(qd_bench_load(&b, &o, &s), "HTTP 404 (not found): bad request");
    b.repo = "HuggingFaceH4/aime_2024"; /* the registry expects another count */
    b.rows = 31;
    expect_failure(qd_bench_load(&b, &o, &s), "the rows API reports 30 rows, the registry expects 31");
}
END_TEST

START_TEST(test_load_url)
{
    /* Any file by URL, parsed by name (.csv) with the fields named; cached once. */
    qd_fetch_opts o;
    test_opts(&o);
    qd_bench_set s;
    const char *p = "/datasets/t/ok/resolve/main/matharena_aime_2025_II_answers.csv";
    qd_bench_fields f = {NULL, "answer", NULL, "id", QD_ANSWER_PLAIN};
    ck_assert_int_eq(qd_bench_load_url(url_of(p), &f, &o, &s), QD_OK);
    ck_assert_uint_eq(s.n, 15);
    ck_assert_str_eq(s.rec[0].answer, "468");
    qd_bench_set_free(&s);
    o.offline = 1;
    ck_assert_int_eq(qd_bench_load_url(url_of(p), &f, &o, &s), QD_OK);
    qd_bench_set_free(&s);
    ck_assert_int_eq(hits(p), 1);
    ck_assert_int_eq(cache_files(), 2);
}
END_TEST

START_TEST(test_cli)
{
    char out[65536], want[1024];
    ck_assert_int_eq(qd_test_run_quads("bench fetch aime24 math500", out, sizeof out), 0);
    snprintf(want, sizeof want, "aime24\t%s/rows/HuggingFaceH4/aime_2024/default/train.jsonl\t30 records\n", cache);
    ck_assert_msg(strstr(out, want), "got: %s", out);
    ck_assert_ptr_nonnull(strstr(out, "math500\t"));
    ck_assert_ptr_nonnull(strstr(out, "\t500 records\n"));
    ck_assert_int_eq(qd_test_run_quads("bench list", out, sizeof out), 0);
    ck_assert_ptr_nonnull(strstr(out, "math500        file      500    pinned  yes"));
    ck_assert_int_eq(qd_test_run_quads("bench show --offline --limit 1 aime24", out, sizeof out), 0);
    ck_assert_ptr_nonnull(strstr(out, "\"answer\":\"204\""));
    ck_assert_int_eq(qd_test_run_quads("bench show arith1 --split test --count 3 --seed 5", out, sizeof out), 0);
    ck_assert_ptr_nonnull(strstr(out, "{\"id\":\"test-2\",\"problem\":\"What is "));
    char args[1024];
    snprintf(args, sizeof args, "bench show --file %s --field problem=question --style gsm8k --limit 2",
             fx("gsm8k_test.jsonl"));
    ck_assert_int_eq(qd_test_run_quads(args, out, sizeof out), 0);
    ck_assert_ptr_nonnull(strstr(out, "\"answer\":\"18\""));
    ck_assert_int_eq(qd_test_run_quads("bench fetch --offline minerva", out, sizeof out), 1);
    ck_assert_ptr_nonnull(strstr(out, "offline"));
    ck_assert_int_eq(qd_test_run_quads("bench fetch minerva", out, sizeof out), 1);
    ck_assert_ptr_nonnull(strstr(out, "HTTP 404 (not found): Entry not found"));
    ck_assert_int_eq(qd_test_run_quads("bench show --offline --from 2023-09-30 --to 2023-09-30 lcb-v1", out, sizeof out), 1);
    ck_assert_int_eq(qd_test_run_quads("bench fetch lcb-v1", out, sizeof out), 0);
    ck_assert_ptr_nonnull(strstr(out, "code_generation_lite/main/test.jsonl\t400 records\n"));
    ck_assert_int_eq(qd_test_run_quads("bench show --offline --from 2023-09-30 --to 2023-09-30 lcb-v1", out, sizeof out), 0);
    int lines = 0;
    for (const char *c = out; (c = strstr(c, "\"date\":\"2023-09-30T00:00:00\"")); c++)
        lines++;
    ck_assert_int_eq(lines, 8);
    ck_assert_int_eq(qd_test_run_quads("bench show --from 2023-9-30 lcb-v1", out, sizeof out), 2);
    ck_assert_int_eq(qd_test_run_quads("bench show --from 2023-09-30 aime24", out, sizeof out), 2);
    ck_assert_int_eq(qd_test_run_quads("bench list", out, sizeof out), 0);
    ck_assert_ptr_nonnull(strstr(out, "lcb-v6         file      1055"));
    ck_assert_int_eq(qd_test_run_quads("bench fetch nope", out, sizeof out), 2);
    ck_assert_int_eq(qd_test_run_quads("bench show --field answer x.json", out, sizeof out), 2);
}
END_TEST

Suite *suite_benchmarks(void)
{
    Suite *s = suite_create("benchmarks");
    TCase *tc = tcase_create("parse");
    tcase_add_test(tc, test_sha256_vectors);
    tcase_add_test(tc, test_sha256_sources_md);
    tcase_add_loop_test(tc, test_parse_fixture, 0, (int)(sizeof fixture_cases / sizeof fixture_cases[0]));
    tcase_add_test(tc, test_cross_source);
    tcase_add_test(tc, test_gsm8k_answers);
    tcase_add_test(tc, test_quirks);
    tcase_add_test(tc, test_boxed_reference);
    tcase_add_test(tc, test_parse_errors);
    tcase_add_test(tc, test_field_paths_and_numbers);
    tcase_add_test(tc, test_content_checks);
    tcase_add_test(tc, test_lcb_decode_vector);
    tcase_add_test(tc, test_lcb_public_tests);
    tcase_add_test(tc, test_lcb_records);
    suite_add_tcase(s, tc);

    tc = tcase_create("synth");
    tcase_add_test(tc, test_synth_splits);
    tcase_add_test(tc, test_synth_multistep_and_limits);
    suite_add_tcase(s, tc);

    tc = tcase_create("http");
    tcase_set_timeout(tc, 20);
    tcase_add_unchecked_fixture(tc, server_start, server_stop);
    tcase_add_checked_fixture(tc, http_setup, http_teardown);
    tcase_add_test(tc, test_fetch_ok);
    tcase_add_test(tc, test_fetch_redirect);
    tcase_add_test(tc, test_fetch_404);
    tcase_add_test(tc, test_fetch_retries);
    tcase_add_test(tc, test_fetch_server_errors);
    tcase_add_test(tc, test_fetch_timeout);
    tcase_add_test(tc, test_fetch_bad_content);
    tcase_add_test(tc, test_fetch_default_limits);
    tcase_add_test(tc, test_fetch_endless_body);
    tcase_add_test(tc, test_entry_limits);
    tcase_add_test(tc, test_fetch_drip);
    tcase_add_test(tc, test_fetch_gzip_bomb);
    tcase_add_test(tc, test_fetch_sanitizes_server_text);
    tcase_add_test(tc, test_fetch_unparsable_not_cached);
    tcase_add_test(tc, test_fetch_cleans_stale_temp);
    tcase_add_test(tc, test_rows_huge_claim);
    tcase_add_test(tc, test_fetch_resume);
    tcase_add_test(tc, test_lcb_registry);
    tcase_add_test(tc, test_registry_rows_and_offline);
    tcase_add_test(tc, test_registry_entries);
    tcase_add_test(tc, test_rows_failures);
    tcase_add_test(tc, test_load_url);
    tcase_add_test(tc, test_cli);
    suite_add_tcase(s, tc);
    return s;
}
