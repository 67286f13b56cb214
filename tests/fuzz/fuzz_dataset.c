/* libFuzzer: benchmark files through the dataset parser, as JSON/JSONL and as
 * CSV, with the field layouts of the registry's benchmarks. */
#include "benchmarks/dataset.h"
#include "tests/fuzz/fuzz.h"

static const qd_bench_fields layouts[] = {
    {"question", "answer", NULL, NULL, QD_ANSWER_GSM8K},                /* GSM8K */
    {"problem", "answer", "solution", "unique_id", QD_ANSWER_PLAIN},    /* MATH-500 */
    {"problem", "solution", NULL, NULL, QD_ANSWER_BOXED},               /* Hendrycks MATH */
    {"question", "final_answer", "solution", "id", QD_ANSWER_PLAIN},    /* OlympiadBench */
    {"prompt.0.content", "reward_model.ground_truth", NULL, "extra_info.index", QD_ANSWER_PLAIN},
    {NULL, "answer", NULL, "id", QD_ANSWER_PLAIN},                      /* an answer key */
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const names[] = {"test.jsonl", "answers.csv"};
    for (size_t n = 0; n < 2; n++)
        for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
            qd_bench_set set = {0};
            if (qd_bench_parse((const char *)data, size, names[n], &layouts[i], &set) == QD_OK)
                for (size_t r = 0; r < set.n; r++)
                    if (!set.rec[r].answer)
                        abort(); /* documented: never NULL */
            qd_bench_set_free(&set);
        }
    return 0;
}
