/* Check suite of the rewards module: extraction, normalization and
 * equivalence against third-party reference outputs (tests/fixtures/benchmarks),
 * agreement with the grader test suites, rewards and metrics. */
#include <jansson.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "benchmarks/dataset.h"
#include "rewards/internal.h"
#include "rewards/rewards.h"
#include "tests/suites.h"

/* Every line of a JSONL fixture as one array (owned by the caller). */
static json_t *load_jsonl(const char *rel) { return qd_test_load_jsonl(qd_test_path(rel)); }

static const char *str(json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

/* ---- normalization: every reference output of normalizer_examples.jsonl */

START_TEST(test_normalizers_match_references)
{
    json_t *rows = load_jsonl("tests/fixtures/benchmarks/normalizer_examples.jsonl");
    ck_assert_int_eq(json_array_size(rows), 45);
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r) {
        const char *in = str(r, "input");
        char *h = qd_rewards_strip_hendrycks(in);
        char *m = qd_rewards_normalize_minerva(in);
        ck_assert_msg(h && !strcmp(h, str(r, "hendrycks__strip_string")), "hendrycks row %zu: [%s] -> [%s]",
                      i, in, h ? h : "(raises)");
        ck_assert_msg(!strcmp(m, str(r, "verl_math_dapo.normalize_final_answer(minerva)")),
                      "minerva row %zu: [%s] -> [%s]", i, in, m);
        free(h);
        free(m);
    }
    json_decref(rows);
}
END_TEST

/* ---- extraction: boxed_extraction_examples.jsonl, one reference column per row */

#define COL_HENDRYCKS "hendrycks/deepscaler last_boxed_only_string+remove_boxed"
#define COL_VERL "verl math_reward last_boxed_only_string+remove_boxed"
#define COL_QWEN "qwen25math extract_answer(s,\"math\") (includes strip_string)"
#define COL_L2S "latex2sympy2_extended extract_boxed_content(mode=\"last\")"
#define COL_DAPO "verl math_dapo Answer: regex (last match, before normalization)"

START_TEST(test_boxed_extraction)
{
    /* Which reference extractor our last-box extraction agrees with on each row. */
    static const char *const box_col[17] = {
        COL_HENDRYCKS, COL_HENDRYCKS, COL_HENDRYCKS, COL_HENDRYCKS,
        COL_VERL, /* "\boxed 5$." -> 5 */
        COL_QWEN, /* "\boxed 5." -> 5: the full stop ends the sentence */
        COL_QWEN, /* \fbox{7} */
        COL_L2S,  /* "\boxed{ 12 }" -> 12 */
        COL_L2S,  /* "\boxed {12}" -> 12 */
        COL_HENDRYCKS, COL_HENDRYCKS,
        COL_HENDRYCKS, /* unterminated box: none */
        COL_HENDRYCKS, COL_HENDRYCKS, COL_HENDRYCKS, COL_HENDRYCKS, COL_HENDRYCKS,
    };
    json_t *rows = load_jsonl("tests/fixtures/benchmarks/boxed_extraction_examples.jsonl");
    ck_assert_int_eq(json_array_size(rows), 17);
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r) {
        const char *in = str(r, "input");
        char *got = qd_rewards_last_boxed(in);
        json_t *want = json_object_get(r, box_col[i]);
        if (json_is_null(want))
            ck_assert_msg(got == NULL, "row %zu: expected no box, got [%s]", i, got);
        else
            ck_assert_msg(got && !strcmp(got, json_string_value(want)), "row %zu: [%s] vs [%s]", i,
                          got ? got : "(none)", json_string_value(want));
        free(got);
        /* the DAPO extractor: "Answer:" lines only, as verl's regex */
        char *d = qd_rewards_extract(in, QD_GRADE_DAPO);
        const char *dw = str(r, COL_DAPO);
        ck_assert_msg(!strcmp(dw, "[INVALID]") ? d == NULL : (d && !strcmp(d, "18")), "dapo row %zu", i);
        free(d);
    }
    /* full math extraction: the answer set of two listed boxes (latex2sympy's "1,2"),
     * the final-number and "Answer:" fallbacks (qwen), the text after </think> */
    static const struct {
        size_t row;
        const char *want;
    } math[] = {{3, "\\{1,2\\}"}, {12, "42"}, {15, "18"}, {16, "2"}, {7, "12"}};
    for (size_t k = 0; k < sizeof math / sizeof math[0]; k++) {
        char *got = qd_rewards_extract(str(json_array_get(rows, math[k].row), "input"), QD_GRADE_MATH);
        ck_assert_msg(got && !strcmp(got, math[k].want), "math row %zu: [%s]", math[k].row, got);
        free(got);
    }
    json_decref(rows);
}
END_TEST

/* 64,000 nested boxes (a 576 KB line) are unwrapped in linear time. */
START_TEST(test_boxed_deep_nesting)
{
    const int depth = 64000;
    size_t n = (size_t)depth * 8 + 2;
    char *s = malloc(n);
    ck_assert_ptr_nonnull(s);
    size_t k = 0;
    for (int i = 0; i < depth; i++)
        k += (size_t)sprintf(s + k, "\\boxed{");
    s[k++] = '7';
    for (int i = 0; i < depth; i++)
        s[k++] = '}';
    s[k] = '\0';
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char *got = qd_rewards_last_boxed(s);
    char *ext = qd_rewards_extract(s, QD_GRADE_MATH);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ck_assert_str_eq(got, "7");
    ck_assert_str_eq(ext, "7");
    ck_assert_double_lt((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec), 0.5);
    free(got);
    free(ext);
    free(s);
}
END_TEST

/* A box inside a box that does not span it: the content is kept whole, and
 * nothing leaks (it lost 64 bytes a call). */
START_TEST(test_boxed_partial_nesting_no_leak)
{
    char *got = qd_rewards_last_boxed("\\boxed{a\\boxed{1}}");
    ck_assert_str_eq(got, "a\\boxed{1}");
    free(got);
    got = qd_rewards_last_boxed("\\boxed{\\boxed 5}");
    ck_assert_str_eq(got, "5");
    free(got);
    size_t before = mallinfo2().uordblks;
    for (int i = 0; i < 2000; i++)
        free(qd_rewards_last_boxed("x \\boxed{ \\boxed{a\\boxed{1}} }"));
    ck_assert_uint_lt(mallinfo2().uordblks, before + 4096);
}
END_TEST

START_TEST(test_extraction_styles)
{
    static const struct {
        const char *text;
        qd_grade_style style;
        const char *want; /* NULL: no answer */
    } cases[] = {
        {"so 3 + 4 = 7\n#### 1,234", QD_GRADE_GSM8K, "1,234"},
        {"She makes $18.\nA: 18", QD_GRADE_GSM8K, "18"},
        {"<think>maybe \\boxed{3}</think>The answer is \\boxed{\\frac{a}{b^{2}}}.", QD_GRADE_MATH, "\\frac{a}{b^{2}}"},
        {"<think>\\boxed{1}</think> no answer here", QD_GRADE_MATH, NULL},
        {"Thus $x = \\boxed{2-2p}$.", QD_GRADE_MATH, "2-2p"},
        {"Final Answer: The final answer is $28 \\%$. I hope it is correct.", QD_GRADE_MATH, "28 \\%"},
        {"\\boxed{1}, \\boxed{2} and \\boxed{3}", QD_GRADE_MATH, "\\{1,2,3\\}"},
        {"first \\boxed{1} then \\boxed{2}", QD_GRADE_MATH, "2"},
        {"the total is 1,000.99 dollars", QD_GRADE_MATH, "1,000.99"},
        {"Answer: \\frac{1}{2}\nmore text", QD_GRADE_DAPO, "\\frac{1}{2}"},
        {"no answer line", QD_GRADE_DAPO, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *got = qd_rewards_extract(cases[i].text, cases[i].style);
        if (!cases[i].want)
            ck_assert_msg(got == NULL, "case %zu: got [%s]", i, got);
        else
            ck_assert_msg(got && !strcmp(got, cases[i].want), "case %zu: [%s] want [%s]", i,
                          got ? got : "(none)", cases[i].want);
        free(got);
    }
}
END_TEST

/* ---- equivalence, by hand */

START_TEST(test_equivalence_cases)
{
    static const struct {
        const char *gold, *pred;
        bool same;
    } cases[] = {
        {"25", "025", true},                          /* AIME zero padding */
        {"\\frac{1}{2}", "0.5", true},
        {"\\frac12", "\\dfrac{1}{2}", true},
        {"1/2", "\\tfrac{1}{2}", true},
        {"1000", "1,000", true},
        {"1000", "1{,}000", true},
        {"1500", "1.5e3", true},                      /* scientific notation */
        {"1500", "1.5 \\times 10^{3}", true},
        {"0.0002", "2E-4", true},
        {"3.50", "3.5", true},                        /* trailing zeros */
        {"10", "10\\%", true},                        /* percent sign dropped */
        {"5", "\\$5.00", true},
        {"10", "10\\text{ cm}", true},                /* units */
        {"90", "90^\\circ", true},
        {"2\\sqrt{2}", "\\sqrt{8}", true},            /* evaluated, not matched */
        {"\\frac{\\sqrt{3}}{2}", "\\sqrt3/2", true},
        {"1024", "2^{10}", true},
        {"\\frac{x+2}{7}", "\\frac{x}{7}+\\frac{2}{7}", true},
        {"5", "x = 5", true},
        {"(1,2]", "(1,2)", false},                    /* intervals keep their brackets */
        {"(1,2)", "(2,1)", false},                    /* tuples are ordered */
        {"\\{1,2\\}", "\\{2,1\\}", true},             /* sets are not */
        {"[0,1) \\cup (2,3]", "(2,3] \\cup [0,1)", true},
        {"\\pm 3", "\\{3,-3\\}", true},
        {"\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", true},
        {"\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", "\\begin{pmatrix}1&2\\\\3&5\\end{pmatrix}", false},
        {"x > 1", "1 < x", true},
        {"x \\ge 1", "x > 1", false},
        {"\\text{Evelyn}", "Evelyn", true},
        {"\\frac{1}{3}", "0.33", true},               /* rounded to the digits given */
        {"\\frac{1}{3}", "0.3", false},               /* one digit is too coarse */
        {"3", "3.01", false},
        {"7", "8", false},
        {"\\frac{1}{2}", "\\frac{1}{3}", false},
        {"x^2", "x^3", false},
        {"\\sec^2 x", "1+\\tan^2 x", true},        /* checked at many points */
        {"\\sqrt{x-3}", "(x-3)^{1/2}", true},       /* points outside the domain skipped */
        {"\\sqrt{x^2}", "x", false},                 /* negative x tells them apart */
        {"\\sqrt[3]{x}^2", "x^{2/3}", true},         /* real odd roots of negatives */
        {"\\frac{639}{40}", "15\\frac{39}{40}", true}, /* mixed number */
        {"-2.25", "-2\\frac14", true},
        {"1.22", "1,22", true},                       /* decimal comma... */
        {"\\{69,84\\}", "69,84", true},            /* ...or a list, whichever matches */
        {"7425000", "7,425,000", true},
        {"3", "\\{3, 3\\}", true},                   /* the same answer boxed twice */
        {"2x+4y-3=0", "y=-\\frac{1}{2}x+\\frac{3}{4}", true}, /* equations up to a factor */
        {"0", "5x - 7y + 11z + 4 = 0", false},        /* an equation is not its rhs */
        {"11", "x = 5+5+1 = 11", true},               /* the last value of a chain */
        {"-2 \\le x \\le 7", "x \\in [-2,7]", true},
        {"(3,2)", "(p,q)=(3,2)", true},
        {"[-2,-1) \\cup (1,2]", "1 < |x| \\le 2", true},
        {"(5,2),(7,2)", "p=5,q=2; p=7,q=2", true},  /* ';' groups assignments */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        ck_assert_msg(qd_rewards_equiv(cases[i].gold, cases[i].pred) == cases[i].same,
                      "case %zu: [%s] vs [%s] should be %s", i, cases[i].gold, cases[i].pred,
                      cases[i].same ? "equal" : "different");
}
END_TEST

/* Values beyond double range or 64-bit integers compare exactly, never
 * equal because both overflowed; undefined values equal nothing. */
START_TEST(test_equivalence_big_and_undefined)
{
    static const struct {
        const char *gold, *pred;
        bool same;
    } cases[] = {
        {"10000000000000000000001", "10000000000000000000000", false},
        {"10000000000000000000001", "10^{22}+1", true},
        {"1e999999", "1e999998", false},
        {"1e999999", "10^{999999}", true},
        {"10^{400}", "10^{401}", false},
        {"10^{400}", "100^{200}", true},
        {"10^{400}", "\\infty", false},
        {"-\\infty", "-\\infty", true},
        {"\\frac{1}{0}", "\\frac{2}{0}", false},
        {"\\frac{1}{0}", "\\frac{1}{0}", false},
        {"0/0", "0/0", false},
        {"0^{-1}", "0^{-2}", false},
        {"100000!", "99999!", false},
        {"100000!", "100000 \\cdot 99999!", true},
        {"2^{25} \\cdot 26!", "2^{25} \\cdot 26! + 1", false},
        {"10^{10^{9}}", "10^{10^{9}+1}", false}, /* too large to be exact: unequal */
        {"10^{10^{9}}", "10^{10^{9}}", true},    /* but the same text is the same number */
        {"x^{10000}", "x^{10002}", false},       /* overflowing at every sample point */
    };
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        ck_assert_msg(qd_rewards_equiv(cases[i].gold, cases[i].pred) == cases[i].same,
                      "case %zu: [%s] vs [%s] should be %s", i, cases[i].gold, cases[i].pred,
                      cases[i].same ? "equal" : "different");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ck_assert_double_lt((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec), 2.0);
}
END_TEST

/* A factorial chain spends the exact-arithmetic budget, not seconds. */
START_TEST(test_equivalence_bounded_work)
{
    char big[4000] = "";
    for (int i = 0; i < 300; i++)
        snprintf(big + strlen(big), sizeof big - strlen(big), "%s200000!", i ? "+" : "");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert(!qd_rewards_equiv(big, "1"));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ck_assert_double_lt((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec), 1.0);
}
END_TEST

/* ---- HMMT February 2025: the 30 gold answers of MathArena's answer key */

static const struct {
    int id;
    const char *same[5]; /* the answer as a model writes it */
    const char *miss[4]; /* near misses */
} hmmt_forms[30] = {
    {1, {"103", "103."}, {"104", "130"}},
    {2, {"3375", "3,375", "15^3"}, {"3376", "3357"}},
    {3, {"\\dfrac{1}{576}", "1/576", "\\frac1{576}", "\\frac{1}{24^2}"}, {"\\frac{1}{575}", "576"}},
    {4, {"-984", "- 984"}, {"984", "-948"}},
    {5, {"890"}, {"980", "891"}},
    {6, {"\\dfrac{1311}{2017}", "1311/2017"}, {"\\frac{1311}{2016}", "\\frac{2017}{1311}"}},
    {7, {"\\frac{9\\sqrt{23}}{23}", "\\dfrac{9}{\\sqrt{23}}", "\\frac{9}{23}\\sqrt{23}", "9/\\sqrt{23}"},
     {"\\frac{9\\sqrt{23}}{22}", "\\frac{8\\sqrt{23}}{23}", "\\frac{9\\sqrt{21}}{23}", "\\frac{9}{23}"}},
    {8, {"1 - \\dfrac{2}{\\pi}", "\\frac{\\pi-2}{\\pi}", "1-2/\\pi", "\\dfrac{\\pi - 2}{\\pi}"},
     {"1-\\frac{1}{\\pi}", "1+\\frac{2}{\\pi}", "1-\\frac{2}{\\pi^2}", "\\frac{2}{\\pi}"}},
    {9, {"1037"}, {"1036", "1073"}},
    {10, {"\\frac{-1-\\sqrt{17}}{2}, \\frac{-1+\\sqrt{17}}{2}", "\\dfrac{-1+\\sqrt{17}}{2}, \\dfrac{-1-\\sqrt{17}}{2}",
          "\\frac{\\sqrt{17}-1}{2}, -\\frac{1+\\sqrt{17}}{2}", "\\frac{-1 \\pm \\sqrt{17}}{2}"},
     {"\\frac{-1+\\sqrt{17}}{2}", "\\frac{1+\\sqrt{17}}{2}, \\frac{1-\\sqrt{17}}{2}",
      "\\frac{-1+\\sqrt{17}}{2}, \\frac{-1+\\sqrt{17}}{2}", "\\frac{-1+\\sqrt{13}}{2}, \\frac{-1-\\sqrt{13}}{2}"}},
    {11, {"56"}, {"65"}},
    {12, {"29"}, {"28"}},
    {13, {"105"}, {"150"}},
    {14, {"2304", "2{,}304", "48^2"}, {"2305"}},
    {15, {"200"}, {"20"}},
    {16, {"6300", "6,300"}, {"6030"}},
    {17, {"2^{25}\\cdot 26!", "26! \\cdot 2^{25}", "2^{25} \\times 26!", "13532215908553332190020108288000000",
          "33554432 \\cdot 26!"},
     {"2^{24} \\cdot 26!", "2^{25} \\cdot 25!", "13532215908553332190020108288000001", "2^{26} \\cdot 26!"}},
    {18, {"2025/101", "\\dfrac{2025}{101}", "20\\frac{5}{101}"}, {"\\frac{2024}{101}", "\\frac{2025}{100}"}},
    {19, {"4/9", "\\dfrac49"}, {"\\frac{4}{7}", "0.45"}},
    {20, {"448/3", "149\\frac{1}{3}"}, {"\\frac{448}{9}", "149"}},
    {21, {"26"}, {"27"}},
    {22, {"63"}, {"36"}},
    {23, {"8 \\sqrt{10}", "\\sqrt{640}", "8\\cdot\\sqrt{10}"}, {"8\\sqrt{11}", "\\sqrt{630}", "80"}},
    {24, {"20"}, {"21"}},
    {25, {"-2\\sqrt{3}+\\sqrt{23}", "\\sqrt{23}-\\sqrt{12}", "\\sqrt{23} - 2\\sqrt3"},
     {"\\sqrt{23}+2\\sqrt{3}", "\\sqrt{23}-2\\sqrt{2}", "2\\sqrt{3}-\\sqrt{23}"}},
    {26, {"9 \\sqrt{15}", "\\sqrt{1215}"}, {"9\\sqrt{14}", "3\\sqrt{15}"}},
    {27, {"7/18", "\\dfrac{7}{18}"}, {"\\frac{7}{17}"}},
    {28, {"\\sqrt 6", "6^{1/2}", "\\sqrt{6}"}, {"\\sqrt{5}", "6"}},
    {29, {"4\\sqrt{37}+14", "2(7+2\\sqrt{37})", "14 + 4 \\sqrt{37}"}, {"14-4\\sqrt{37}", "14+4\\sqrt{36}", "18\\sqrt{37}"}},
    {30, {"\\frac{\\sqrt{95}}{\\sqrt{24}}", "\\frac{\\sqrt{570}}{12}", "\\dfrac{\\sqrt{570}}{12}", "\\sqrt{95/24}"},
     {"\\frac{\\sqrt{570}}{24}", "\\sqrt{\\frac{95}{23}}", "\\frac{95}{24}"}},
};

/* Every gold answer equals itself as a model writes it, boxed in a model
 * output and graded end to end, and differs from near misses. */
START_TEST(test_hmmt25_gold_answers)
{
    qd_bench_set key; /* read as the hmmt25 registry entry reads it: #10's two roots as a set */
    ck_assert_int_eq(qd_bench_load_file(qd_test_path("tests/fixtures/benchmarks/matharena_hmmt_feb_2025_answers.csv"),
                                        &(qd_bench_fields){NULL, "answer", NULL, "id", QD_ANSWER_SET}, &key),
                     QD_OK);
    ck_assert_uint_eq(key.n, 30);
    int same = 0, miss = 0;
    for (size_t i = 0; i < 30; i++) {
        const char *gold = key.rec[i].answer;
        ck_assert_int_eq(atoi(key.rec[i].id), hmmt_forms[i].id);
        ck_assert_msg(qd_rewards_equiv(gold, gold), "#%d: [%s] vs itself", hmmt_forms[i].id, gold);
        for (int k = 0; k < 5 && hmmt_forms[i].same[k]; k++) {
            const char *f = hmmt_forms[i].same[k];
            char out[512];
            snprintf(out, sizeof out, "<think>so...</think>Therefore the answer is $\\boxed{%s}$.", f);
            qd_rewards_result r;
            ck_assert_int_eq(qd_rewards_grade(out, gold, QD_GRADE_MATH, &r), QD_OK);
            ck_assert_msg(r.correct, "#%d: [%s] should equal [%s] (extracted [%s])", hmmt_forms[i].id, f, gold,
                          r.extracted);
            qd_rewards_result_free(&r);
            same++;
        }
        for (int k = 0; k < 4 && hmmt_forms[i].miss[k]; k++) {
            const char *f = hmmt_forms[i].miss[k];
            ck_assert_msg(!qd_rewards_equiv(gold, f), "#%d: [%s] should differ from [%s]", hmmt_forms[i].id, f, gold);
            miss++;
        }
    }
    ck_assert_int_eq(same, 71);
    ck_assert_int_eq(miss, 62);
    qd_bench_set_free(&key);
    /* Without the set style a bare list keeps its order (Hendrycks' test_order). */
    ck_assert(!qd_rewards_equiv("\\frac{-1+\\sqrt{17}}{2}, \\frac{-1-\\sqrt{17}}{2}",
                                "\\frac{-1-\\sqrt{17}}{2}, \\frac{-1+\\sqrt{17}}{2}"));
}
END_TEST

/* ---- agreement with the grader suites (grader_cases.jsonl) */

static qd_grade_style style_of(const char *source)
{
    return strstr(source, "grade-school-math") ? QD_GRADE_GSM8K : QD_GRADE_MATH;
}

/* Lists longer than the comparison buffer are never compared by a prefix. */
START_TEST(test_long_lists)
{
    char a[2048] = "", b[2048] = "";
    for (int i = 0; i < 200; i++) {
        snprintf(a + strlen(a), sizeof a - strlen(a), "%s%d", i ? "," : "", i);
        snprintf(b + strlen(b), sizeof b - strlen(b), "%s%d", i ? "," : "", i == 150 ? 7 : i);
    }
    ck_assert(!qd_rewards_equiv(a, b));
}
END_TEST

START_TEST(test_agreement_with_suites)
{
    json_t *cases = load_jsonl("tests/fixtures/benchmarks/grader_cases.jsonl");
    json_t *known = load_jsonl("tests/fixtures/rewards/known_disagreements.jsonl");
    ck_assert_int_eq(json_array_size(cases), 276);
    static const char *const groups[] = {"hendrycks/math@", "huggingface/Math-Verify@", "openai/grade-school-math@"};
    int total[3] = {0}, agree[3] = {0};
    size_t nknown = json_array_size(known), matched = 0;
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *src = str(c, "source");
        int g = 0;
        while (g < 3 && strncmp(src, groups[g], strlen(groups[g])))
            g++;
        ck_assert_msg(g < 3, "case %zu: unknown source %s", i, src);
        qd_rewards_result r;
        ck_assert_int_eq(qd_rewards_grade(str(c, "output"), str(c, "gold"), style_of(src), &r), QD_OK);
        bool ok = r.correct == json_is_true(json_object_get(c, "expected"));
        qd_rewards_result_free(&r);
        total[g]++;
        agree[g] += ok;
        if (ok)
            continue;
        /* every disagreement must be a listed one, for the same case */
        bool listed = false;
        for (size_t k = 0; k < nknown && !listed; k++) {
            json_t *d = json_array_get(known, k);
            listed = (size_t)json_integer_value(json_object_get(d, "index")) == i &&
                     !strcmp(str(d, "source"), src);
        }
        ck_assert_msg(listed, "case %zu (%s) disagrees and is not in known_disagreements.jsonl", i, src);
        matched++;
    }
    /* ...and every listed one must still disagree (an improvement is noticed too) */
    ck_assert_msg(matched == nknown, "%zu listed disagreements, %zu found", nknown, matched);
    printf("rewards agreement: hendrycks %d/%d, Math-Verify %d/%d, GSM8K %d/%d\n", agree[0], total[0],
           agree[1], total[1], agree[2], total[2]);
    ck_assert_int_eq(agree[0], total[0]);
    ck_assert_int_eq(agree[2], total[2]);
    ck_assert_int_eq(total[1], 240);
    ck_assert_msg(agree[1] * 100 >= 95 * total[1], "Math-Verify agreement %d/%d < 95%%", agree[1], total[1]);
    json_decref(known);
    json_decref(cases);
}
END_TEST

/* Hendrycks is_equiv and verl's DAPO grader, against their computed verdicts. */
START_TEST(test_reference_graders_reproduced)
{
    json_t *cases = load_jsonl("tests/fixtures/benchmarks/grader_cases.jsonl");
    size_t i;
    json_t *c;
    int dapo_true = 0;
    json_array_foreach(cases, i, c) {
        json_t *computed = json_object_get(c, "computed");
        const char *out = str(c, "output"), *gold = str(c, "gold");
        bool h = json_is_true(json_object_get(computed, "hendrycks_is_equiv_raw"));
        ck_assert_msg(qd_rewards_equiv_hendrycks(out, gold) == h, "hendrycks case %zu", i);
        qd_rewards_result r;
        ck_assert_int_eq(qd_rewards_grade(out, gold, QD_GRADE_DAPO, &r), QD_OK);
        bool d = json_is_true(json_object_get(computed, "verl_math_dapo"));
        ck_assert_msg(r.correct == d, "dapo case %zu", i);
        dapo_true += d;
        qd_rewards_result_free(&r);
    }
    ck_assert_int_eq(dapo_true, 4);
    json_decref(cases);
}
END_TEST

/* All 4 x 1319 labelled GSM8K model solutions (OpenAI's is_correct). */
START_TEST(test_gsm8k_labels)
{
    json_t *sols = load_jsonl("tests/fixtures/benchmarks/gsm8k_example_model_solutions.jsonl");
    json_t *test = load_jsonl("tests/fixtures/benchmarks/gsm8k_test.jsonl");
    static const char *const models[] = {"6b_finetuning", "6b_verification", "175b_finetuning", "175b_verification"};
    ck_assert_int_eq(json_array_size(sols), 1319);
    int n = 0, agree = 0;
    for (size_t i = 0; i < json_array_size(sols); i++) {
        const char *gold = str(json_array_get(test, i), "answer");
        for (int m = 0; m < 4; m++) {
            json_t *s = json_object_get(json_array_get(sols, i), models[m]);
            qd_rewards_result r;
            ck_assert_int_eq(qd_rewards_grade(str(s, "solution"), gold, QD_GRADE_GSM8K, &r), QD_OK);
            agree += r.correct == json_is_true(json_object_get(s, "is_correct"));
            n++;
            qd_rewards_result_free(&r);
        }
    }
    ck_assert_int_eq(n, 5276);
    ck_assert_int_eq(agree, n);
    json_decref(sols);
    json_decref(test);
}
END_TEST

/* MATH-500: the `answer` field (PRM800K) against the boxed answer of the
 * `solution` field (Hendrycks), two independent writings of each answer;
 * and every Hendrycks/Minerva solution against its own last box. */
START_TEST(test_gold_answers_match_solutions)
{
    json_t *rows = load_jsonl("tests/fixtures/benchmarks/math500_test.jsonl");
    ck_assert_int_eq(json_array_size(rows), 500);
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r) {
        qd_rewards_result g;
        ck_assert_int_eq(qd_rewards_grade(str(r, "solution"), str(r, "answer"), QD_GRADE_MATH, &g), QD_OK);
        ck_assert_msg(g.correct, "MATH-500 row %zu: answer [%s], extracted [%s]", i, str(r, "answer"), g.extracted);
        qd_rewards_result_free(&g);
    }
    json_decref(rows);
    static const char *const files[] = {"tests/fixtures/benchmarks/math_test_number_theory.jsonl",
                                        "tests/fixtures/benchmarks/math_test_counting_and_probability.jsonl",
                                        "tests/fixtures/benchmarks/minerva_math_qwen25math.jsonl"};
    int n = 0;
    for (int f = 0; f < 3; f++) {
        rows = load_jsonl(files[f]);
        json_array_foreach(rows, i, r) {
            char *box = qd_rewards_last_boxed(str(r, "solution"));
            ck_assert_msg(box != NULL, "%s row %zu has no box", files[f], i);
            char out[4096];
            snprintf(out, sizeof out, "So the final answer is $\\boxed{%s}$.", box);
            qd_rewards_result g;
            ck_assert_int_eq(qd_rewards_grade(out, str(r, "solution"), QD_GRADE_MATH, &g), QD_OK);
            ck_assert_msg(g.correct, "%s row %zu: [%s]", files[f], i, box);
            qd_rewards_result_free(&g);
            free(box);
            n++;
        }
        json_decref(rows);
    }
    ck_assert_int_eq(n, 540 + 474 + 272);
}
END_TEST

/* Every prefix of every case (cut at any point: unbalanced braces, lone
 * backslashes, open delimiters) grades without crashing, in every style. */
START_TEST(test_truncated_inputs)
{
    json_t *cases = load_jsonl("tests/fixtures/benchmarks/grader_cases.jsonl");
    size_t i;
    json_t *c;
    long graded = 0;
    json_array_foreach(cases, i, c) {
        const char *texts[2] = {str(c, "output"), str(c, "gold")};
        for (int t = 0; t < 2; t++) {
            size_t n = strlen(texts[t]);
            for (size_t cut = 0; cut <= n && cut <= 400; cut += 2) {
                char *pre = strndup(texts[t], cut);
                for (int st = 0; st < 3; st++) {
                    qd_rewards_result r;
                    ck_assert_int_eq(qd_rewards_grade(pre, texts[1 - t], (qd_grade_style)st, &r), QD_OK);
                    qd_rewards_result_free(&r);
                    graded++;
                }
                free(pre);
            }
        }
    }
    ck_assert_int_gt(graded, 50000);
    json_decref(cases);
}
END_TEST

/* Grades with the n-th allocation failing (n < 0: none); *made receives
 * the number of allocations the call made. */
static qd_status grade_failing(const char *output, const char *gold, qd_grade_style st, long n,
                               qd_rewards_result *r, long *made)
{
    qd_rw_test_fail_after(n);
    qd_status s = qd_rewards_grade(output, gold, st, r);
    *made = qd_rw_test_fail_after(-1);
    return s;
}

/* Out of memory at each allocation of one grading call in turn: the call
 * fails with QD_ERR_NOMEM and no verdict (no abort, no leak: the ASan build
 * checks), and the same call without the failure grades as before. Returns
 * the number of allocations of the call. */
static long grade_under_oom(const char *output, const char *gold, qd_grade_style st)
{
    qd_rewards_result base, r;
    long made, m;
    ck_assert_int_eq(grade_failing(output, gold, st, -1, &base, &made), QD_OK);
    for (long n = 0; n < made; n++) {
        ck_assert_int_eq(grade_failing(output, gold, st, n, &r, &m), QD_ERR_NOMEM);
        ck_assert(!r.correct && r.extracted == NULL);
        ck_assert(strstr(qd_last_error(), "out of memory") != NULL);
    }
    ck_assert_int_eq(grade_failing(output, gold, st, made, &r, &m), QD_OK);
    ck_assert_int_eq(m, made);
    ck_assert_int_eq(r.correct, base.correct);
    ck_assert((r.extracted == NULL) == (base.extracted == NULL));
    if (r.extracted)
        ck_assert_str_eq(r.extracted, base.extracted);
    qd_rewards_result_free(&r);
    qd_rewards_result_free(&base);
    return made;
}

/* Every grader case in every style, and whole worked solutions (MATH-500,
 * GSM8K model solutions) as the outputs of an RL rollout are. */
START_TEST(test_grade_out_of_memory)
{
    json_t *cases = load_jsonl("tests/fixtures/benchmarks/grader_cases.jsonl");
    json_t *math = load_jsonl("tests/fixtures/benchmarks/math500_test.jsonl");
    json_t *gsm = load_jsonl("tests/fixtures/benchmarks/gsm8k_example_model_solutions.jsonl");
    size_t i;
    json_t *c;
    long calls = 0, injected = 0, most = 0;
    json_array_foreach(cases, i, c) {
        for (int st = 0; st < 3; st++) {
            long made = grade_under_oom(str(c, "output"), str(c, "gold"), (qd_grade_style)st);
            injected += made;
            most = made > most ? made : most;
            calls++;
        }
    }
    for (i = 0; i < 20; i++) {
        json_t *m = json_array_get(math, i), *g = json_array_get(gsm, i);
        const char *sol = json_string_value(json_object_get(json_object_get(g, "6b_finetuning"), "solution"));
        long made[2] = {grade_under_oom(str(m, "solution"), str(m, "answer"), QD_GRADE_MATH),
                        grade_under_oom(sol, str(g, "ground_truth"), QD_GRADE_GSM8K)};
        for (int k = 0; k < 2; k++) {
            injected += made[k];
            most = made[k] > most ? made[k] : most;
            calls++;
        }
    }
    printf("rewards out of memory: %ld grading calls, %ld failed allocations injected, up to %ld a call\n",
           calls, injected, most);
    ck_assert_int_gt(most, 100); /* the injection reached deep into some calls */
    json_decref(cases);
    json_decref(math);
    json_decref(gsm);
}
END_TEST

/* ---- rewards and metrics */

START_TEST(test_pass_at_k)
{
    uint64_t num, den;
    ck_assert_int_eq(qd_rewards_pass_at_k_exact(16, 4, 4, &num, &den), QD_OK);
    ck_assert_uint_eq(num, 265); /* 1 - C(12,4)/C(16,4) = 1 - 495/1820 */
    ck_assert_uint_eq(den, 364);
    double p;
    ck_assert_int_eq(qd_rewards_pass_at_k(16, 4, 4, &p), QD_OK);
    ck_assert_double_eq_tol(p, 265.0 / 364.0, 1e-15);
    /* every (n, c, k) up to n = 20: the product form equals the binomial ratio */
    for (int n = 1; n <= 20; n++)
        for (int c = 0; c <= n; c++)
            for (int k = 1; k <= n; k++) {
                ck_assert_int_eq(qd_rewards_pass_at_k_exact(n, c, k, &num, &den), QD_OK);
                ck_assert_int_eq(qd_rewards_pass_at_k(n, c, k, &p), QD_OK);
                double direct = n - c < k ? 1.0 : 1.0 - exp(lgamma(n - c + 1) - lgamma(k + 1) - lgamma(n - c - k + 1) -
                                                             (lgamma(n + 1) - lgamma(k + 1) - lgamma(n - k + 1)));
                ck_assert_double_eq_tol(p, direct, 1e-12);
                ck_assert_double_eq_tol((double)num / (double)den, p, 1e-12);
            }
    for (int c = 0; c <= 16; c++) { /* pass@1 is the fraction correct */
        ck_assert_int_eq(qd_rewards_pass_at_k_exact(16, c, 1, &num, &den), QD_OK);
        ck_assert_uint_eq(num * 16, (uint64_t)c * den);
    }
    ck_assert_int_eq(qd_rewards_pass_at_k_exact(4, 0, 2, &num, &den), QD_OK);
    ck_assert_uint_eq(num, 0);
    ck_assert_int_eq(qd_rewards_pass_at_k(4, 5, 2, &p), QD_ERR_ARG);
    ck_assert_int_eq(qd_rewards_pass_at_k(4, 1, 0, &p), QD_ERR_ARG);
    bool flags[4] = {true, false, true, true};
    ck_assert_double_eq(qd_rewards_mean_at_k(flags, 4), 0.75);
    ck_assert_double_eq(qd_rewards_mean_at_k(flags, 2), 0.5);
}
END_TEST

START_TEST(test_overlong_and_score)
{
    /* DAPO eq. 13 with L_max = 100, L_cache = 20: zero up to 80, linear to -1 at 100 */
    ck_assert_double_eq(qd_rewards_overlong(50, 100, 20), 0.0);
    ck_assert_double_eq(qd_rewards_overlong(80, 100, 20), 0.0);
    ck_assert_double_eq(qd_rewards_overlong(81, 100, 20), -0.05);
    ck_assert_double_eq(qd_rewards_overlong(90, 100, 20), -0.5);
    ck_assert_double_eq(qd_rewards_overlong(100, 100, 20), -1.0);
    ck_assert_double_eq(qd_rewards_overlong(150, 100, 20), -1.0);
    qd_rewards_config cfg = qd_rewards_config_default();
    ck_assert_double_eq(qd_rewards_score(&cfg, true, true, 10), 1.0);
    ck_assert_double_eq(qd_rewards_score(&cfg, true, false, 10), 0.0);
    cfg = (qd_rewards_config){.correct = 1, .incorrect = -1, .format_penalty = -1.5,
                             .overlong_max = 100, .overlong_cache = 20};
    ck_assert_double_eq(qd_rewards_score(&cfg, false, false, 10), -1.5);
    ck_assert_double_eq(qd_rewards_score(&cfg, true, true, 90), 0.5);
    ck_assert_double_eq(qd_rewards_score(&cfg, true, false, 100), -2.0);
}
END_TEST

START_TEST(test_majority_vote)
{
    char *answers[] = {"3", "\\frac12", "0.5", NULL, "1/2", "3"};
    int m = qd_rewards_majority(answers, 6);
    ck_assert_int_eq(m, 1); /* three ways of writing 1/2 beat two 3s */
    ck_assert(qd_rewards_maj_at_k(answers, 6, "\\dfrac{1}{2}"));
    ck_assert(!qd_rewards_maj_at_k(answers, 6, "3"));
    ck_assert_int_eq(qd_rewards_majority(answers, 1), 0); /* maj@1 is the first answer */
    char *none[] = {NULL, NULL};
    ck_assert_int_eq(qd_rewards_majority(none, 2), -1);
    ck_assert(!qd_rewards_maj_at_k(none, 2, "1"));
}
END_TEST

START_TEST(test_bootstrap_deterministic)
{
    double x[40];
    for (int i = 0; i < 40; i++)
        x[i] = (i * 7) % 3 == 0 ? 1.0 : 0.0; /* mean 14/40 */
    double lo1, hi1, lo2, hi2, lo3, hi3;
    ck_assert_int_eq(qd_rewards_bootstrap_ci(x, 40, 2000, 0.95, 42, &lo1, &hi1), QD_OK);
    ck_assert_int_eq(qd_rewards_bootstrap_ci(x, 40, 2000, 0.95, 42, &lo2, &hi2), QD_OK);
    ck_assert(lo1 == lo2 && hi1 == hi2); /* same seed, bit-identical interval */
    ck_assert(lo1 < 0.35 && 0.35 < hi1);
    /* normal approximation: half width ~ 1.96 * sqrt(p(1-p)/n) = 0.148 */
    ck_assert_double_eq_tol(hi1 - lo1, 2 * 0.148, 0.05);
    ck_assert_int_eq(qd_rewards_bootstrap_ci(x, 40, 2000, 0.95, 7, &lo3, &hi3), QD_OK);
    ck_assert(lo3 != lo1 || hi3 != hi1);
    double ones[5] = {1, 1, 1, 1, 1};
    ck_assert_int_eq(qd_rewards_bootstrap_ci(ones, 5, 100, 0.9, 1, &lo3, &hi3), QD_OK);
    ck_assert(lo3 == 1.0 && hi3 == 1.0);
    ck_assert_int_eq(qd_rewards_bootstrap_ci(x, 0, 100, 0.9, 1, &lo3, &hi3), QD_ERR_ARG);
}
END_TEST

START_TEST(test_grade_styles)
{
    qd_rewards_result r;
    ck_assert_int_eq(qd_rewards_grade("so \\boxed{\\frac{3}{4}}", "0.75", QD_GRADE_MATH, &r), QD_OK);
    ck_assert(r.correct);
    ck_assert_str_eq(r.extracted, "\\frac{3}{4}");
    qd_rewards_result_free(&r);
    ck_assert_int_eq(qd_rewards_grade("I do not know", "5", QD_GRADE_MATH, &r), QD_OK);
    ck_assert(!r.correct && r.extracted == NULL); /* the format penalty case */
    ck_assert_int_eq(qd_rewards_grade("x\n#### $1,000", "#### 1000", QD_GRADE_GSM8K, &r), QD_OK);
    ck_assert(r.correct);
    qd_rewards_result_free(&r);
    ck_assert_int_eq(qd_rewards_grade("Answer: 0.5", "\\frac{1}{2}", QD_GRADE_DAPO, &r), QD_OK);
    ck_assert(!r.correct); /* DAPO compares normalized strings only */
    qd_rewards_result_free(&r);
    ck_assert_int_eq(qd_rewards_grade("Answer: \\frac12", "\\boxed{\\frac{1}{2}}", QD_GRADE_DAPO, &r), QD_OK);
    ck_assert(r.correct);
    qd_rewards_result_free(&r);
    qd_grade_style st;
    ck_assert_int_eq(qd_rewards_style_parse("gsm8k", &st), QD_OK);
    ck_assert_int_eq(st, QD_GRADE_GSM8K);
    ck_assert_int_eq(qd_rewards_style_parse("maths", &st), QD_ERR_ARG);
    ck_assert(strstr(qd_last_error(), "maths") != NULL);
}
END_TEST

Suite *suite_rewards(void)
{
    Suite *s = suite_create("rewards");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_normalizers_match_references);
    tcase_add_test(tc, test_boxed_extraction);
    tcase_add_test(tc, test_boxed_deep_nesting);
    tcase_add_test(tc, test_boxed_partial_nesting_no_leak);
    tcase_add_test(tc, test_extraction_styles);
    tcase_add_test(tc, test_equivalence_cases);
    tcase_add_test(tc, test_equivalence_big_and_undefined);
    tcase_add_test(tc, test_equivalence_bounded_work);
    tcase_add_test(tc, test_hmmt25_gold_answers);
    tcase_add_test(tc, test_long_lists);
    tcase_add_test(tc, test_agreement_with_suites);
    tcase_add_test(tc, test_reference_graders_reproduced);
    tcase_add_test(tc, test_gsm8k_labels);
    tcase_add_test(tc, test_gold_answers_match_solutions);
    tcase_add_test(tc, test_truncated_inputs);
    tcase_add_test(tc, test_grade_out_of_memory);
    tcase_add_test(tc, test_pass_at_k);
    tcase_add_test(tc, test_overlong_and_score);
    tcase_add_test(tc, test_majority_vote);
    tcase_add_test(tc, test_bootstrap_deterministic);
    tcase_add_test(tc, test_grade_styles);
    suite_add_tcase(s, tc);
    return s;
}
