/* The evaluation harness of `quads eval`, independent of any model: prompts
 * from benchmark records, samples from a generator callback, grading by
 * rewards/, per-benchmark metrics (pass@1 with a bootstrap CI, unbiased
 * pass@k, maj@k, mean@k, response lengths) and examples of right and wrong
 * answers, written as report.json and report.md. */
#ifndef QD_BENCH_EVAL_H
#define QD_BENCH_EVAL_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "benchmarks/dataset.h"
#include "rewards/code.h"
#include "rewards/rewards.h"
#include "quant/status.h"

/* Qwen2.5-Math's chain-of-thought prompt; "{problem}" is replaced by the problem. */
#define QD_EVAL_QWEN_MATH_PROMPT \
    "{problem}\nPlease reason step by step, and put your final answer within \\boxed{}."

/* Generates k samples for each of n_prompts prompts: outputs[i*k + j] receives
 * sample j of prompt i (malloc'd, NUL-terminated UTF-8; the caller frees it)
 * and out_tokens[i*k + j] its length in tokens, or -1 when unknown. Both
 * arrays have n_prompts*k slots. qd_eval_run calls it with the prompts of
 * the benchmarks' records in order (benchmark by benchmark, record by record,
 * consecutive batches), so a generator may also follow that order. On error
 * it frees what it allocated and sets the slots to NULL. */
typedef qd_status (*qd_eval_generate_fn)(void *ctx, const char *const *prompts, int n_prompts, int k,
                                         char **outputs, int *out_tokens);

/* One benchmark to evaluate (borrowed: set, prompt_template and code must
 * outlive the run). */
typedef struct {
    const char *name;
    const qd_bench_set *set;
    qd_grade_style style;
    const char *prompt_template; /* this benchmark's "{problem}" template; NULL: the run's */
    const qd_code_opts *code;    /* non-NULL: code records (QD_ANSWER_CODE) run against their tests in the
                                    sandbox with these options (rewards/code.h); style is unused */
} qd_eval_bench;

typedef struct {
    const char *prompt_template; /* "{problem}" is substituted; NULL: QD_EVAL_QWEN_MATH_PROMPT */
    int samples;                 /* K >= 1 samples per problem */
    size_t limit;                /* the first N problems of each benchmark; 0: all */
    int batch;                   /* prompts per generator call, >= 1 */
    int n_examples;              /* right and wrong examples kept per benchmark */
    int bootstrap_reps;          /* resamples of the pass@1 CI */
    uint64_t seed;               /* of the bootstrap */
    const char *model;           /* for the report (may be NULL) */
    const char *precision;       /* for the report (may be NULL) */
    int progress;                /* progress line on stderr, only when stderr is a terminal */
} qd_eval_opts;

/* K = 1, all problems, batches of 64, 3 examples, 1000 resamples, seed 0,
 * the Qwen math prompt, progress on. */
void qd_eval_opts_default(qd_eval_opts *o);

/* One graded sample kept as an example (strings owned). */
typedef struct {
    char *id, *problem, *gold, *output;
    char *extracted; /* NULL: no answer found (code: the code of the last ``` block) */
    int sample;      /* which of the K samples */
    int tokens;      /* -1: unknown */
    const char *verdict; /* code: the verdict's name (static); NULL for the other graders */
    char *detail;    /* code: why the sample failed; NULL otherwise */
} qd_eval_example;

/* pass@k of one k (k is 1, 2, 4, ... up to K, and K itself). */
typedef struct {
    int k;
    double value;
} qd_eval_pass;

typedef struct {
    char *name;
    qd_grade_style style;
    size_t n_problems;   /* after the limit */
    int k;               /* samples per problem */
    size_t n_correct;    /* correct samples, of n_problems * k */
    size_t n_no_answer;  /* samples with no extractable answer (code: no ``` block) */
    bool code;           /* graded as code (qd_eval_bench.code) */
    size_t verdicts[QD_CODE_N_VERDICTS]; /* code: samples by verdict (qd_code_verdict) */
    char *prompt_template; /* the benchmark's own template, NULL when it used the run's */
    double pass1;        /* mean over problems of c/k */
    double pass1_lo, pass1_hi; /* percentile bootstrap 95% CI of pass1 */
    qd_eval_pass *pass;  /* unbiased pass@k (Chen et al. 2021), n_pass of them */
    int n_pass;
    double maj_k;        /* majority vote of the K samples is right (NaN for code: no answer to vote on) */
    double mean_k;       /* mean@K: mean of per-problem accuracies over K samples */
    double mean_tokens;  /* NaN when the generator gave no token counts */
    double mean_chars;   /* Unicode code points per response */
    qd_eval_example *right, *wrong;
    int n_right, n_wrong;
} qd_eval_result;

typedef struct {
    qd_eval_result *bench;
    size_t n_bench;
    int k;
    char *model, *precision, *prompt_template; /* owned; model/precision may be NULL */
    double seconds;                            /* wall time of the run */
} qd_eval_report;

/* The prompt for one problem: every "{problem}" of tmpl replaced (malloc'd). */
char *qd_eval_prompt(const char *tmpl, const char *problem);

/* Runs the benchmarks through gen and grades every sample against the
 * record's answer and its alternatives. On error out is empty. */
qd_status qd_eval_run(const qd_eval_bench *benches, size_t n_bench, const qd_eval_opts *o,
                      qd_eval_generate_fn gen, void *ctx, qd_eval_report *out);

/* report.json (UTF-8, malloc'd) and report.md text (malloc'd). */
char *qd_eval_report_json(const qd_eval_report *r);
char *qd_eval_report_markdown(const qd_eval_report *r);
/* Writes dir/report.json and dir/report.md atomically, creating dir. */
qd_status qd_eval_write(const qd_eval_report *r, const char *dir);
void qd_eval_report_free(qd_eval_report *r);

/* ---- replayed outputs (eval_replay.c): a generator that serves outputs
 * generated elsewhere (e.g. by vLLM), read from JSONL lines
 * {"id": STRING or INTEGER, "output": STRING, "tokens": INTEGER (optional),
 *  "benchmark": NAME (optional; required when several benchmarks are run)};
 * the lines of one id are its samples, in file order. */
typedef struct qd_eval_replay qd_eval_replay;

/* Reads path for the given benchmarks (borrowed: they must outlive *out),
 * the first `limit` records of each (0: all) and the run's prompt template
 * (NULL: QD_EVAL_QWEN_MATH_PROMPT). Errors name the line and field. */
qd_status qd_eval_replay_load(const char *path, const qd_eval_bench *benches, size_t n_bench, size_t limit,
                              const char *prompt_template, qd_eval_replay **out);
/* The fewest outputs any evaluated record has (>= 1), or an error naming a
 * record with none. */
qd_status qd_eval_replay_min_samples(const qd_eval_replay *r, int *k);
/* The qd_eval_generate_fn (ctx: the qd_eval_replay): the first k outputs of
 * each record, following qd_eval_run's record order (each prompt is checked
 * against its record's). */
qd_status qd_eval_replay_generate(void *ctx, const char *const *prompts, int n_prompts, int k,
                                  char **outputs, int *out_tokens);
void qd_eval_replay_free(qd_eval_replay *r);

#endif
