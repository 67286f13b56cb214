/* libFuzzer: the grader through its public API. The input is a model output
 * and a gold answer separated by the first NUL (or newline); both go through
 * extraction and grading in every style and through the equivalence test. */
#include "benchmarks/dataset.h"
#include "rewards/rewards.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = qd_fuzz_cstr(data, size);
    size_t cut = strlen(s);
    if (cut == size)
        cut = strcspn(s, "\n");
    const char *gold = cut < size ? s + cut + 1 : "";
    s[cut] = '\0';
    for (int style = QD_GRADE_MATH; style <= QD_GRADE_DAPO; style++) {
        qd_rewards_result r = {0};
        if (qd_rewards_grade(s, gold, (qd_grade_style)style, &r) == QD_OK)
            qd_rewards_result_free(&r);
        free(qd_rewards_extract(s, (qd_grade_style)style));
    }
    (void)qd_rewards_equiv(gold, s);
    free(qd_rewards_last_boxed(s));
    free(qd_bench_last_boxed(s));
    free(s);
    return 0;
}
